//! `accel-dra-driver`: a Dynamic Resource Allocation driver for every vendor profile.
//!
//! Floors, on [`crate::kubelet`] (the device table, the protocols, sockets): `names` (driver,
//! device and CDI names: pure) and `table` (the devices of one profile with their slice
//! names) → `slices` (the ResourceSlices a table is published as: pure) and `claims` (prepare
//! and unprepare: the node check, the per-claim CDI spec and the on-disk record) → `publish`
//! (slices to the API server with the pool generation rules) → `server` (the gRPC services,
//! sockets, the loop).
//!
//! Ref: KEP-4381 (structured parameters), k8s.io/api/resource/v1 (types.go).

// accel-exporter (feature `exporter`) uses `names` alone.
#[cfg(feature = "dra")]
pub mod claims;
pub mod names;
#[cfg(feature = "dra")]
pub mod publish;
#[cfg(feature = "dra")]
pub mod server;
#[cfg(feature = "dra")]
pub mod slices;
#[cfg(feature = "dra")]
pub mod table;
