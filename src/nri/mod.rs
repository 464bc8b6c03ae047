//! `accel-nri-plugin`: an NRI plugin (Node Resource Interface: containerd 2, CRI-O) that does
//! on the runtime's CreateContainer what the shim does on `create`, so a node needs no
//! runtime replaced. On the daemons' floor beside [`crate::plugin`], with the `plugin`
//! feature only (it uses prost and tokio, which the runtime binary never links).
//!
//! Floors: `proto` (NRI's messages and ttrpc's envelope, compiled from `proto/`), `mux` (NRI's
//! connection multiplexing: frames on the one socket, pure) and `ttrpc` (ttrpc's message
//! framing, pure) → `adjust` (an NRI container as the create path's [`crate::spec::View`],
//! and the create's edits as a `ContainerAdjustment`, pure) → `session` (dial, register,
//! serve, reconnect; the decision through [`crate::create::decide`]), `check` (the
//! `createRuntime` hook that refuses a container the plugin did not adjust: the same
//! decision on the final config.json).
//!
//! Ref: github.com/containerd/nri (pkg/api/api.proto, pkg/net/multiplex, pkg/stub),
//! github.com/containerd/ttrpc (channel.go, request.proto).

pub mod adjust;
pub mod check;
pub mod mux;
pub mod proto;
pub mod session;
pub mod ttrpc;
