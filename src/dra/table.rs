//! The devices one profile offers the cluster through DRA: the node's device table
//! ([`crate::kubelet::inventory`], as the runtime, `accel-ctk` and the device plugin see the
//! node), each device with its name in the ResourceSlice.

use crate::discovery::DiscoveryError;
use crate::kubelet::inventory::{self, NodeDevice};
use crate::profile::Profile;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    /// The device's name in the slice (`gcu-3`, `gpu-0000-c3-00-0`): from what it keeps.
    pub name: String,
    pub dev: NodeDevice,
}

/// The profile's devices, ordered by index; none when the driver's nodes are absent.
pub fn discover(profile: &Profile) -> Result<Vec<DraDevice>, DiscoveryError> {
    Ok(inventory::discover(profile)?
        .into_iter()
        .map(|dev| DraDevice {
            name: crate::kubelet::names::device_name(profile, &dev.key),
            dev,
        })
        .collect())
}
