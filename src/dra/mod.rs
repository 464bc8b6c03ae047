//! `accel-dra-driver`: a Dynamic Resource Allocation driver for every vendor profile.
//!
//! Floors: `names` (driver, device and CDI names: pure) and `table` (the devices of one
//! profile, from the library's discovery and topology, with the device plugin's health rule)
//! → `slices` (the ResourceSlices a table is published as: pure) and `claims` (prepare and
//! unprepare: the node check, the per-claim CDI spec and the on-disk record) → `publish`
//! (slices to the API server with the pool generation rules) and `api` (kubelet's DRA and
//! plugin registration messages) → `grpc` (service glue) → `server` (sockets, the loop).
//!
//! Ref: KEP-4381 (structured parameters), k8s.io/kubelet/pkg/apis/dra/v1 and
//! pluginregistration/v1 (api.proto), k8s.io/api/resource/v1 (types.go).

pub mod api;
pub mod claims;
pub mod grpc;
pub mod names;
pub mod publish;
pub mod server;
pub mod slices;
pub mod table;
