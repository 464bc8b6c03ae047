//! `accel-device-plugin`: kubelet's device plugin for every vendor profile, on
//! [`crate::kubelet`] (the device table, the protocols, sockets).
//!
//! Floors: `devices` (the table with kubelet's IDs, and the offers it is listed under) →
//! `preferred` (pure topology choice) and `allocate` (pure answer); `registration` (when to
//! register: a pure state machine). With the `plugin` feature, `watch` (inotify tasks) →
//! `service` (the `Plugin` kubelet calls: ListAndWatch, GetPreferredAllocation,
//! Allocate) → `server` (sockets, the registration loop, `run`).

pub mod allocate;
pub mod devices;
pub mod preferred;
pub mod registration;

#[cfg(feature = "plugin")]
pub mod server;
#[cfg(feature = "plugin")]
pub mod service;
#[cfg(feature = "plugin")]
pub mod watch;
