//! The resources (offers) a profile's devices are listed under to kubelet, whole or as
//! replicas, over the node's device table with kubelet's IDs ([`crate::kubelet::ids`]).

pub use crate::kubelet::ids::{DevicesError, PluginDevice};
pub use crate::profile::replica_id;
use crate::profile::Profile;
pub use crate::request::split_replica;

/// One resource a profile's devices are offered under: `resource-name`, and with
/// `shared-resource-name` a second one for the shared devices, each its own plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub resource: String,
    /// Times each device is offered (1: whole devices, under their own IDs).
    pub replicas: u32,
    /// Which devices: the shared ones (`Some(true)`), the others (`Some(false)`), all (`None`).
    pub shared: Option<bool>,
}

impl Offer {
    /// The offer of a profile without replicas, or whose every device is shared under its
    /// own resource name.
    pub fn all(profile: &Profile) -> Offer {
        Offer {
            resource: profile.resource_name.clone().unwrap_or_default(),
            replicas: profile.replicas,
            shared: None,
        }
    }

    pub fn admits(&self, profile: &Profile, index: u32) -> bool {
        self.shared.is_none_or(|s| profile.shares(index) == s)
    }

    /// The devices of `table` this offer holds; an error when a replica ID would be longer
    /// than kubelet allows.
    pub fn select(
        &self,
        profile: &Profile,
        table: Vec<PluginDevice>,
    ) -> Result<Vec<PluginDevice>, DevicesError> {
        let table: Vec<PluginDevice> = table
            .into_iter()
            .filter(|d| self.admits(profile, d.dev.index))
            .collect();
        if self.replicas > 1 {
            if let Some(d) = table
                .iter()
                .find(|d| replica_id(&d.id, self.replicas - 1).len() > 63)
            {
                return Err(DevicesError::IdTooLong {
                    vendor: profile.name.clone(),
                    id: replica_id(&d.id, self.replicas - 1),
                });
            }
        }
        Ok(table)
    }
}

/// The resources `profile`'s devices are offered under. With `shared-resource-name` but no
/// `shared-devices` every device is shared, and `resource-name` is not offered at all (it
/// could never hold a device).
pub fn offers(profile: &Profile) -> Vec<Offer> {
    let Some(resource) = profile.resource_name.clone() else {
        return Vec::new();
    };
    let Some(shared) = profile.shared_resource_name.clone() else {
        return vec![Offer::all(profile)];
    };
    let mut out = Vec::new();
    if profile.shared_devices.is_some() {
        out.push(Offer {
            resource,
            replicas: 1,
            shared: Some(false),
        });
    }
    out.push(Offer {
        resource: shared,
        replicas: profile.replicas,
        shared: Some(true),
    });
    out
}

/// What kubelet is told of `dev` when each device is listed `replicas` times: its own ID
/// once, or its replicas.
pub fn listed_ids(dev: &PluginDevice, replicas: u32) -> Vec<String> {
    if replicas <= 1 {
        return vec![dev.id.clone()];
    }
    (0..replicas).map(|k| replica_id(&dev.id, k)).collect()
}
