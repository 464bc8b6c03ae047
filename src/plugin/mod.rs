//! `accel-device-plugin`: kubelet's device plugin for every vendor profile.
//!
//! Floors: `preferred` (pure topology choice) and `allocate` (pure answer) stand on
//! `devices` (discovery + health of one profile, over the library's discovery and topology);
//! `registration` (when to register: a pure state machine) and `host_root` (paths as the
//! host names them) are pure too. With the `plugin` feature, `api` (v1beta1 messages) →
//! `grpc` (service glue) and `watch` (inotify tasks) → `server` (the plugin's device table,
//! sockets, the registration loop) and `calls` (GetPreferredAllocation and Allocate answered
//! from that table), with `authority` (old kubelets' `:authority`) under `server`.

pub mod allocate;
pub mod devices;
pub mod host_root;
pub mod preferred;
pub mod registration;

#[cfg(feature = "plugin")]
pub mod api;
#[cfg(feature = "plugin")]
pub mod authority;
#[cfg(feature = "plugin")]
pub mod calls;
#[cfg(feature = "plugin")]
pub mod grpc;
#[cfg(feature = "plugin")]
pub mod server;
#[cfg(feature = "plugin")]
pub mod watch;
