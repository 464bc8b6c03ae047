//! What the device plugin, the DRA driver, the exporter and `accel-ctk pods` share of kubelet,
//! one floor below them: the node's device table (`inventory`), the IDs and names kubelet's
//! two device APIs know each device by (`ids`, `names`), a profile's `[sharing]` (`sharing`), where the host's paths are seen
//! from a pod (`host_root`) and one socket's identity (`socket::FileId`), all pure; and with
//! the `plugin` feature kubelet's protocols compiled from `proto/` (`proto`), a client
//! channel to a socket (`client`), serving on a socket (`socket`) with old kubelets'
//! `:authority` rewritten (`authority`), what both daemons' `main` share (`daemon`), and the
//! metrics endpoint with both daemons' own families (`metrics`).
//!
//! Ref: k8s.io/kubelet/pkg/apis (deviceplugin/v1beta1, pluginregistration/v1, dra/v1 and
//! v1beta1, dra-health, podresources/v1).

pub mod host_root;
pub mod ids;
pub mod inventory;
pub mod names;
pub mod sharing;
pub mod socket;

#[cfg(feature = "plugin")]
pub mod authority;
#[cfg(feature = "plugin")]
pub mod client;
#[cfg(feature = "plugin")]
pub mod daemon;
#[cfg(feature = "plugin")]
pub mod metrics;
#[cfg(feature = "plugin")]
pub mod proto;
#[cfg(all(test, feature = "plugin"))]
mod wire;
