//! The device IDs kubelet knows a profile's devices by, through the device plugin: each
//! device of the node's table ([`super::inventory`]) with its ID from the profile's
//! `device-plugin-id` (`GPU-<uuid>`, `GCU-3`, a PCI bus id). The device plugin lists them; the
//! exporter maps the IDs kubelet's PodResources reports back to devices with them.

use crate::discovery::DiscoveryError;
use crate::profile::Profile;

use super::inventory::{self, NodeDevice};

#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    #[error("profile {vendor}: no resource-name, so there is nothing to register")]
    NoResource { vendor: String },
    #[error("profile {vendor}: no device-plugin-id, so devices cannot be named to kubelet")]
    NoIdTemplate { vendor: String },
    #[error("profile {vendor}: device-plugin-id {template:?} names a device by {{index}}, its position in discovery's order here; kubelet keeps IDs across restarts, so use {{uuid}}, {{bus}} or {{minor}}")]
    PositionalId { vendor: String, template: String },
    #[error("profile {vendor}: device ID {id:?} is longer than kubelet's 63 characters")]
    IdTooLong { vendor: String, id: String },
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
}

/// One device as the plugin lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginDevice {
    /// What kubelet sees (`GPU-<uuid>`, `GCU-0`).
    pub id: String,
    pub dev: NodeDevice,
}

/// The profile's devices with their IDs, ordered by index.
pub fn discover(profile: &Profile) -> Result<Vec<PluginDevice>, DevicesError> {
    let vendor = || profile.name.clone();
    if profile.resource_name.is_none() {
        return Err(DevicesError::NoResource { vendor: vendor() });
    }
    let template = profile
        .device_plugin_id
        .as_deref()
        .ok_or_else(|| DevicesError::NoIdTemplate { vendor: vendor() })?;
    // `{index}` is the device node's own number only where devices are found by their nodes;
    // elsewhere it is a position, and kubelet's checkpoint would give a restarted container
    // whatever device comes to stand there.
    if template.contains("{index}")
        && !matches!(
            profile.discovery,
            crate::profile::Discovery::DeviceNodes { .. }
        )
    {
        return Err(DevicesError::PositionalId {
            vendor: vendor(),
            template: template.to_string(),
        });
    }
    let mut out: Vec<PluginDevice> = Vec::new();
    for dev in inventory::discover(profile)? {
        let found = crate::discovery::Device {
            index: dev.index,
            nodes: Vec::new(),
            uuid: dev.uuid.clone(),
            pci_bus_id: dev.pci_bus_id.clone(),
            minor: dev.minor,
            aliases: Vec::new(),
            model: None,
            duplicate_uuid: None,
        };
        // A device the template cannot name (its UUID not unique on the node, say) is left
        // out, not the profile: the others are still offered.
        let Some(id) = found.plugin_id(template) else {
            said_once(
                profile,
                &format!("{} (no ID for {template:?}; not offered)", dev.name),
            );
            continue;
        };
        if id.len() > 63 {
            return Err(DevicesError::IdTooLong {
                vendor: vendor(),
                id,
            });
        }
        out.push(PluginDevice { id, dev });
    }
    // An ID two devices get would hand out one for the other: neither is offered.
    let mut ids: Vec<&str> = out.iter().map(|d| d.id.as_str()).collect();
    ids.sort_unstable();
    let twice: Vec<String> = ids
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0].to_string())
        .collect();
    if !twice.is_empty() {
        out.retain(|d| {
            let dup = twice.contains(&d.id);
            if dup {
                said_once(
                    profile,
                    &format!(
                        "{} (ID {:?} shared with another device; not offered)",
                        d.dev.name, d.id
                    ),
                );
            }
            !dup
        });
    }
    Ok(out)
}

/// Logs that a device is not offered, once per process for each device and reason (the
/// plugin discovers again every poll).
fn said_once(profile: &Profile, what: &str) {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static SAID: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.insert((profile.name.clone(), what.to_string())) {
        log::warn!("{}: device {what}", profile.name);
    }
}
