//! The devices one profile offers the cluster, from the library's discovery and topology (the
//! runtime, `accel-ctk` and the device plugin see the same node), each with its slice name,
//! PCI place and the PCIe switch it shares with another device, and its health by the device
//! plugin's rule (`plugin::devices::healthy`).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::discovery::DiscoveryError;
use crate::plugin::devices::PluginDevice;
use crate::plugin::preferred::Place;
use crate::profile::Profile;
use crate::topology::{discover_located, shared_switches, PciLocation};

use super::names;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    /// The device's name in the slice (`gcu-3`).
    pub name: String,
    pub index: u32,
    pub uuid: Option<String>,
    /// See [`crate::discovery::Device::model`].
    pub model: Option<String>,
    pub pci: Option<PciLocation>,
    /// The bridge (the switch's upstream port) this device shares with another of the
    /// profile's devices; `None` when it sits alone under its bridges.
    pub switch: Option<String>,
    /// Nodes, host paths and the majors seen at discovery, as the device plugin keeps them.
    pub dev: PluginDevice,
}

/// The profile's devices, ordered by index; none when the driver's nodes are absent.
pub fn discover(profile: &Profile) -> Result<Vec<DraDevice>, DiscoveryError> {
    let located = match discover_located(profile) {
        Ok(l) => l,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e),
    };
    let paths: Vec<Option<&[String]>> = located
        .iter()
        .map(|l| l.pci.as_ref().map(|p| p.bridges.as_slice()))
        .collect();
    let switches = shared_switches(&paths);
    let mut out: Vec<DraDevice> = located
        .into_iter()
        .zip(switches)
        .map(|(l, switch)| {
            let d = l.device;
            let name = names::device_name(profile, d.index);
            DraDevice {
                dev: PluginDevice {
                    index: d.index,
                    id: name.clone(),
                    name: d.uuid.clone().unwrap_or_else(|| d.index.to_string()),
                    host_nodes: l
                        .nodes
                        .iter()
                        .map(|n| Profile::under(profile.dev_root(), &n.path))
                        .collect(),
                    nodes: l.nodes,
                    place: l
                        .pci
                        .as_ref()
                        .map(|p| Place {
                            numa: p.numa_node,
                            root: p.root.clone(),
                            bridges: p.bridges.clone(),
                        })
                        .unwrap_or_default(),
                },
                name,
                index: d.index,
                uuid: d.uuid,
                model: d.model,
                pci: l.pci,
                switch,
            }
        })
        .collect();
    out.sort_by_key(|d| d.index);
    Ok(out)
}

/// The device plugin's health rule: the driver is loaded and every node is a character
/// device with the major it had at discovery.
pub fn healthy(profile: &Profile, dev: &DraDevice) -> bool {
    crate::plugin::devices::healthy(profile, &dev.dev)
}

/// Why `dev`'s nodes cannot be handed to a container now, in one line naming the node; `None`
/// when each resolves beneath dev-root to a character device with the major discovery saw (and
/// one of the profile's `device-majors`, where it lists them): the runtime's own rule
/// ([`crate::discovery::DevRoot`]).
pub fn node_problem(profile: &Profile, dev: &DraDevice) -> Option<String> {
    let root = crate::discovery::DevRoot::new(profile);
    for n in &dev.dev.nodes {
        let shown = Profile::under(profile.dev_root(), &n.path);
        let st = match root.host_node(&n.path, true) {
            Ok((_, st)) => st,
            Err(e) if e.is_not_found() => {
                return Some(format!("{}: does not exist", shown.display()))
            }
            Err(e) => return Some(e.to_string()),
        };
        let major = u64::from(rustix::fs::major(st.st_rdev));
        if let Some(w) = n.major.filter(|w| *w != major) {
            return Some(format!(
                "{}: has major {major}, the driver's is {w}",
                shown.display()
            ));
        }
    }
    None
}

/// Why `host` is not a character device of major `want` (and one of `allowed`, when not
/// empty).
pub fn char_problem(host: &Path, want: Option<u64>, allowed: &[u64]) -> Option<String> {
    let m = match std::fs::symlink_metadata(host) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some("does not exist".into()),
        Err(e) => return Some(format!("cannot be read: {e}")),
    };
    if !m.file_type().is_char_device() {
        return Some("is not a character device".into());
    }
    let major = nix::sys::stat::major(m.rdev());
    if let Some(w) = want.filter(|w| *w != major) {
        return Some(format!("has major {major}, the driver's is {w}"));
    }
    if !allowed.is_empty() && !allowed.contains(&major) {
        return Some(format!(
            "has major {major}, not one of the profile's device-majors {allowed:?}"
        ));
    }
    None
}
