//! The devices one profile offers kubelet: their IDs (`device-plugin-id`), where they sit
//! (NUMA node, PCI bridges) and whether they are healthy, all from the shared discovery and
//! topology code so the plugin and the runtime see the same node.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::discovery::DiscoveryError;
pub use crate::profile::replica_id;
use crate::profile::Profile;
pub use crate::request::split_replica;
use crate::topology::{discover_located, Node};

use super::preferred::Place;

#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    #[error("profile {vendor}: no resource-name, so there is nothing to register")]
    NoResource { vendor: String },
    #[error("profile {vendor}: no device-plugin-id, so devices cannot be named to kubelet")]
    NoIdTemplate { vendor: String },
    #[error("profile {vendor}: device {index} has no ID for template {template:?} (e.g. no UUID)")]
    NoId {
        vendor: String,
        index: u32,
        template: String,
    },
    #[error("profile {vendor}: device ID {id:?} is longer than kubelet's 63 characters")]
    IdTooLong { vendor: String, id: String },
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
}

/// One device as the plugin describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginDevice {
    /// The device's index, as the runtime's variable names it.
    pub index: u32,
    /// What kubelet sees (`GPU-<uuid>`, `GCU-0`).
    pub id: String,
    /// What our runtime and the CDI spec name it by: the UUID where there is one, else the
    /// index (both are names `accel-ctk cdi generate` writes and the runtime resolves).
    pub name: String,
    /// Device nodes: container path, and the major seen at discovery (the expected one).
    pub nodes: Vec<Node>,
    /// Host path of each node (under the profile's dev root).
    pub host_nodes: Vec<PathBuf>,
    pub place: Place,
}

/// The profile's devices, ordered by index.
pub fn discover(profile: &Profile) -> Result<Vec<PluginDevice>, DevicesError> {
    let vendor = || profile.name.clone();
    if profile.resource_name.is_none() {
        return Err(DevicesError::NoResource { vendor: vendor() });
    }
    let template = profile
        .device_plugin_id
        .as_deref()
        .ok_or_else(|| DevicesError::NoIdTemplate { vendor: vendor() })?;
    let mut out = Vec::new();
    for located in discover_located(profile)? {
        let d = &located.device;
        let id = d.plugin_id(template).ok_or_else(|| DevicesError::NoId {
            vendor: vendor(),
            index: d.index,
            template: template.to_string(),
        })?;
        if id.len() > 63 {
            return Err(DevicesError::IdTooLong {
                vendor: vendor(),
                id,
            });
        }
        let place = located
            .pci
            .as_ref()
            .map(|p| Place {
                numa: p.numa_node,
                root: p.root.clone(),
                bridges: p.bridges.clone(),
            })
            .unwrap_or_default();
        out.push(PluginDevice {
            index: d.index,
            id,
            name: d.uuid.clone().unwrap_or_else(|| d.index.to_string()),
            host_nodes: located
                .nodes
                .iter()
                .map(|n| Profile::under(profile.dev_root(), &n.path))
                .collect(),
            nodes: located.nodes,
            place,
        });
    }
    Ok(out)
}

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
            .filter(|d| self.admits(profile, d.index))
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

/// Healthy: the driver is loaded (the profile's version file exists, where it names one)
/// and every node of the device is a character device with the major it had at discovery.
/// Checked afresh each time, so a device that comes back is healthy again.
pub fn healthy(profile: &Profile, dev: &PluginDevice) -> bool {
    if let Some(v) = profile.version_file.as_deref() {
        if !Profile::under(&profile.driver_root, v).exists() {
            return false;
        }
    }
    dev.nodes.iter().zip(&dev.host_nodes).all(|(n, host)| {
        std::fs::symlink_metadata(host).is_ok_and(|m| {
            m.file_type().is_char_device()
                && n.major
                    .is_none_or(|want| nix::sys::stat::major(m.rdev()) == want)
        })
    })
}

/// Host paths whose directories show a change of the profile's devices: the driver's version
/// file, where the profile's device nodes appear (the first node template), and every node of
/// the devices known.
pub fn watched_paths(profile: &Profile, table: &[PluginDevice]) -> Vec<PathBuf> {
    let template = profile.discovery.node_template();
    let version = profile.version_file.as_deref();
    version
        .map(|v| Profile::under(&profile.driver_root, v))
        .into_iter()
        .chain(template.map(|t| Profile::under(profile.dev_root(), Path::new(t))))
        .chain(table.iter().flat_map(|d| d.host_nodes.iter().cloned()))
        .collect()
}
