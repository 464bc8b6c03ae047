//! `accel-device-plugin`: kubelet's device plugin for every vendor profile.
//!
//! Floors: `preferred` (pure topology choice) and `allocate` (pure answer) stand on
//! `devices` (discovery + health of one profile, over the library's discovery and topology);
//! with the `plugin` feature, `api` (v1beta1 messages) → `grpc` (service glue) → `server`
//! (sockets, registration, health watch), with `authority` (old kubelets' `:authority`)
//! under `server`.

pub mod allocate;
pub mod devices;
pub mod preferred;

#[cfg(feature = "plugin")]
pub mod api;
#[cfg(feature = "plugin")]
pub mod authority;
#[cfg(feature = "plugin")]
pub mod grpc;
#[cfg(feature = "plugin")]
pub mod server;
