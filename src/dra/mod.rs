//! `accel-dra-driver`: a Dynamic Resource Allocation driver for every vendor profile.
//!
//! Floors, on [`crate::kubelet`] (the device table and the driver's and devices' names, the
//! protocols, sockets): `names` (the per-claim CDI names: pure) and `table` (the devices of one profile with their slice
//! names) → `offers` (what each device is offered as: whole, shared by capacity, in
//! partitions; pure) and `taints` (the taint an unhealthy device gets, by severity: pure) →
//! `slices` (the ResourceSlices a table is published as: pure) and
//! `decide` (what a claim's allocation gives it, or why not: pure) → `claims` (prepare and
//! unprepare: the host's facts, the lock, the on-disk records, the per-claim CDI spec) →
//! `publish` (slices to the API server with the pool generation rules) → `server` (the gRPC
//! services, sockets, the loop). Beside them, on nothing of the crate: `token` (the Node-bound
//! credential of a driver run outside a pod, renewed by the driver itself).
//!
//! Ref: KEP-4381 (structured parameters), k8s.io/api/resource/v1 (types.go).

pub mod claims;
pub mod decide;
pub mod names;
pub mod offers;
pub mod publish;
pub mod server;
pub mod slices;
pub mod table;
pub mod taints;
pub mod token;
