//! The node's device table: the devices of one profile as kubelet's two device APIs hand them
//! out (the device plugin, the DRA driver), built from the library's discovery and topology
//! so the runtime, `accel-ctk` and both see the same node. Each device with where it sits
//! (NUMA node, PCI bridges, the PCIe switch it shares with another of the profile's devices)
//! and, checked afresh each time, whether it is healthy.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::discovery::{DiscoveryError, Key};
use crate::profile::Profile;
use crate::topology::{discover_located, shared_switches, Node, PciLocation};

/// Where a device sits, as far as choosing well-connected devices is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Place {
    pub numa: Option<u32>,
    /// Host bridge (`pci0000:00`).
    pub root: Option<String>,
    /// Bridges from the root port down to the device.
    pub bridges: Vec<String>,
}

/// One device of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevice {
    /// The device's index, as the runtime's variable names it: for NVIDIA and DRM-class
    /// devices a position in discovery's order, never a name that outlives the moment.
    pub index: u32,
    /// What it keeps while it is on the node ([`Key`]); the DRA driver's names come from it.
    pub key: Key,
    /// What Allocate's answers and the CDI spec name it by
    /// ([`crate::discovery::Device::stable_name`]: its UUID, else its node's number or PCI bus
    /// id), a name the runtime resolves to this device whatever else leaves the node.
    pub name: String,
    pub uuid: Option<String>,
    /// See [`crate::discovery::Device`].
    pub pci_bus_id: Option<String>,
    pub minor: Option<u32>,
    /// See [`crate::discovery::Device::model`].
    pub model: Option<String>,
    /// Device memory in bytes, where discovery can read it
    /// ([`crate::discovery::drm::memory_of`]).
    pub memory: Option<u64>,
    pub pci: Option<PciLocation>,
    /// The bridge (the switch's upstream port) this device shares with another of the
    /// profile's devices; `None` when it sits alone under its bridges.
    pub switch: Option<String>,
    pub place: Place,
    /// Device nodes: container path, and the major seen at discovery (the expected one).
    pub nodes: Vec<Node>,
    /// Host path of each node (under the profile's dev root).
    pub host_nodes: Vec<PathBuf>,
}

impl NodeDevice {
    /// A device known by its node's number only, `index` both (how a device-node profile's
    /// devices are found): tables for tests and benchmarks start from it.
    pub fn numbered(index: u32) -> NodeDevice {
        NodeDevice {
            index,
            key: Key::Number(index),
            name: index.to_string(),
            uuid: None,
            pci_bus_id: None,
            minor: None,
            model: None,
            memory: None,
            pci: None,
            switch: None,
            place: Place::default(),
            nodes: Vec::new(),
            host_nodes: Vec::new(),
        }
    }
}

/// The profile's devices, ordered by index; none when the driver's nodes are absent.
pub fn discover(profile: &Profile) -> Result<Vec<NodeDevice>, DiscoveryError> {
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
    let mut out: Vec<NodeDevice> = located
        .into_iter()
        .zip(switches)
        .map(|(l, switch)| {
            let d = l.device;
            let memory = crate::discovery::drm::memory_of(profile, &d);
            NodeDevice {
                memory,
                index: d.index,
                key: d.key(&profile.discovery),
                name: d.stable_name(&profile.discovery),
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
                uuid: d.uuid,
                pci_bus_id: d.pci_bus_id,
                minor: d.minor,
                model: d.model,
                pci: l.pci,
                switch,
            }
        })
        .collect();
    out.sort_by_key(|d| d.index);
    Ok(out)
}

/// The device plugin's first rule, now one signal of [`crate::health`]: the driver is loaded
/// (the profile's version file exists, where it names one) and every node of the device is a
/// character device with the major it had at discovery
/// ([`crate::health::signals::nodes_problem`]). The daemons ask a
/// [`crate::health::Monitor`], which reads the device's sysfs signals as well.
pub fn healthy(profile: &Profile, dev: &NodeDevice) -> bool {
    crate::health::signals::nodes_problem(profile, &dev.nodes, &dev.host_nodes).is_none()
}

impl NodeDevice {
    /// The device as the health engine is shown it.
    pub fn subject(&self) -> crate::health::Subject<'_> {
        crate::health::Subject {
            name: &self.name,
            pci_bus_id: self
                .pci
                .as_ref()
                .map(|p| p.bus_id.as_str())
                .or(self.pci_bus_id.as_deref()),
            nodes: &self.nodes,
            host_nodes: &self.host_nodes,
        }
    }
}

/// Why `dev`'s nodes cannot be handed to a container now, in one line naming the node; `None`
/// when each resolves beneath dev-root to a character device with the major discovery saw (and
/// one of the profile's `device-majors`, where it lists them): the runtime's own rule
/// ([`crate::discovery::DevRoot`]).
pub fn node_problem(profile: &Profile, dev: &NodeDevice) -> Option<String> {
    let root = crate::discovery::DevRoot::new(profile);
    for n in &dev.nodes {
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
/// empty). `host` is a path a CDI spec generated from the profile names, already resolved in
/// dev-root by the generator; it is looked at with `lstat`, never opened or followed.
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

/// Host paths whose directories show a change of the profile's devices: the driver's version
/// file, where the profile's device nodes appear (the first node template), and every node of
/// the devices known.
pub fn watched_paths<'a>(
    profile: &Profile,
    table: impl IntoIterator<Item = &'a NodeDevice>,
) -> Vec<PathBuf> {
    let template = profile.discovery.node_template();
    let version = profile.version_file.as_deref();
    version
        .map(|v| Profile::under(&profile.driver_root, v))
        .into_iter()
        .chain(template.map(|t| Profile::under(profile.dev_root(), Path::new(t))))
        .chain(table.into_iter().flat_map(|d| d.host_nodes.iter().cloned()))
        .collect()
}
