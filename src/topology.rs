//! Where a device sits on the host: its nodes' major:minor, its PCI function, the NUMA node
//! and the PCIe bridges above it, all read from sysfs under the profile's `driver-root`.
//!
//! Only host paths are read (the PCI bus id comes from the driver's procfs or from
//! `/sys/dev/char`, never from a container), each resolved inside the root as if it were `/`
//! ([`crate::inroot`]). Every sysfs link is parsed as text rather than followed, so a fake
//! tree made of directories and relative symlinks describes a machine completely and a link
//! can never lead outside the root; `numa_node` is read by
//! [`crate::discovery::open_in_root`]'s rule (a regular file, bounded; issue 32, class 6).
//!
//! Ref: Documentation/ABI/stable/sysfs-bus-pci (`numa_node`), sysfs-dev (`/sys/dev/char`).

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::OFlags;
use serde::Serialize;

use crate::discovery::{discover, read_in_root, read_link_in_root, Device, DiscoveryError};
use crate::inroot::{Root, Scope};
use crate::profile::Profile;

const PCI_DEVICES: &str = "sys/bus/pci/devices";

/// One device node of a device, as seen on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    /// Container-side path (`/dev/nvidia0`), the same on a plain host.
    pub path: PathBuf,
    /// `None` when the host node is missing or not a device node.
    pub major: Option<u64>,
    pub minor: Option<u64>,
}

/// A device's place in the PCI hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PciLocation {
    pub bus_id: String,
    /// `None` when the kernel reports -1 (no NUMA affinity) or the file is absent.
    pub numa_node: Option<u32>,
    /// The host bridge (`pci0000:00`), i.e. the root complex.
    pub root: Option<String>,
    /// Bridges between the root complex and the device, nearest to the root first.
    pub bridges: Vec<String>,
}

/// Everything `list` and `checkpoint` need about one discovered device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub device: Device,
    pub nodes: Vec<Node>,
    pub pci: Option<PciLocation>,
}

use crate::discovery::is_bdf;

/// NVIDIA writes `00000000:3b:00.0` in some places and `0000:3b:00.0` in sysfs.
pub fn normalize_bdf(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    match s.split_once(':') {
        Some((dom, rest)) if dom.len() == 8 && dom.starts_with("0000") => {
            format!("{}:{rest}", &dom[4..])
        }
        _ => s,
    }
}

/// Reads a sysfs link (`link`, under the root) as text and keeps its target's normal
/// components, so `../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0` becomes those names.
fn link_components(root: &Root, link: &Path) -> Option<Vec<String>> {
    let target = read_link_in_root(root, link).ok()?;
    Some(
        target
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => n.to_str().map(str::to_string),
                _ => None,
            })
            .collect(),
    )
}

/// The PCI location of function `bdf`: `sys/bus/pci/devices/<bdf>` is a symlink into
/// `sys/devices/pci<dom>:<bus>/<bridge>/.../<bdf>`; its components are the path from the root
/// complex down. `None` when sysfs does not know the function.
pub fn pci_location(root: &Root, bdf: &str) -> Option<PciLocation> {
    let bdf = normalize_bdf(bdf);
    if !is_bdf(&bdf) {
        return None;
    }
    let dev = Path::new(PCI_DEVICES).join(&bdf);
    // A sysfs file reports its size as 4096 whatever it holds; a number needs a few bytes.
    let numa_node = read_in_root(root, &dev.join("numa_node"), 4096)
        .ok()
        .and_then(|t| std::str::from_utf8(&t).ok()?.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let is_dir = || {
        root.open_at(&dev, OFlags::PATH | OFlags::DIRECTORY, Scope::InRoot)
            .is_ok()
    };
    let (pci_root, bridges) = match link_components(root, &dev) {
        Some(parts) => {
            let pos = parts.iter().rposition(|p| *p == bdf)?;
            let above = &parts[..pos];
            let pci_root = above.iter().find(|p| p.starts_with("pci")).cloned();
            let bridges = above.iter().filter(|p| is_bdf(p)).cloned().collect();
            (pci_root, bridges)
        }
        // A plain directory (some containers' sysfs): the function exists, the path is unknown.
        None if is_dir() => (None, Vec::new()),
        None => return None,
    };
    Some(PciLocation {
        bus_id: bdf,
        numa_node,
        root: pci_root,
        bridges,
    })
}

/// The PCI function that owns char device `major:minor`: `/sys/dev/char/M:m` links to the
/// device's class directory, which sits under its PCI function (Enflame:
/// `.../<bdf>/enflame/gcu0`). Vendor-neutral, so profiles need no sysfs knowledge.
pub fn bdf_of_char_device(root: &Root, major: u64, minor: u64) -> Option<String> {
    let link = PathBuf::from(format!("sys/dev/char/{major}:{minor}"));
    link_components(root, &link)?
        .into_iter()
        .rev()
        .find(|p| is_bdf(p))
}

/// Where the device that owns char device `major:minor` sits in sysfs: `/sys/dev/char/M:m`
/// links to its class device, `<device>/<class>/<name>`, and this is the device's path from
/// `devices` on, without the class device, whose name a probe hands out (`card0` today,
/// `card2` after a reboot). `None` without a link, or for a device with no parent
/// (`devices/virtual/...`).
pub fn sysfs_path_of_char_device(root: &Root, major: u64, minor: u64) -> Option<String> {
    let link = PathBuf::from(format!("sys/dev/char/{major}:{minor}"));
    let parts = link_components(root, &link)?;
    let parts = &parts[parts.iter().position(|p| p == "devices")?..];
    if parts.len() < 4 || parts[1] == "virtual" {
        return None;
    }
    Some(parts[..parts.len() - 2].join("/"))
}

fn stat_node(host: &Path) -> (Option<u64>, Option<u64>) {
    match std::fs::metadata(host) {
        Ok(m) if m.file_type().is_char_device() || m.file_type().is_block_device() => {
            let rdev = m.rdev();
            (
                Some(nix::sys::stat::major(rdev)),
                Some(nix::sys::stat::minor(rdev)),
            )
        }
        _ => (None, None),
    }
}

/// Adds host facts to a discovered device: node numbers, the PCI location (filling in the
/// bus id for vendors whose discovery has none) and a DRM-class device's model.
pub fn locate(profile: &Profile, device: Device) -> Located {
    let root = Root::open(&profile.driver_root).ok();
    locate_in(root.as_ref(), profile, device)
}

/// [`locate`] with the driver root opened once for all devices (`None`: it cannot be).
fn locate_in(root: Option<&Root>, profile: &Profile, device: Device) -> Located {
    let nodes: Vec<Node> = device
        .nodes
        .iter()
        .map(|p| {
            let (major, minor) = stat_node(&Profile::under(profile.dev_root(), p));
            Node {
                path: p.clone(),
                major,
                minor,
            }
        })
        .collect();
    let mut device = device;
    let Some(root) = root else {
        return Located {
            device,
            nodes,
            pci: None,
        };
    };
    if device.pci_bus_id.is_none() {
        device.pci_bus_id = nodes
            .first()
            .and_then(|n| bdf_of_char_device(root, n.major?, n.minor?));
    }
    if device.model.is_none() {
        device.model = crate::discovery::drm::model_in(root, profile, &device);
    }
    let pci = device
        .pci_bus_id
        .as_deref()
        .and_then(|b| pci_location(root, b));
    Located { device, nodes, pci }
}

/// Every device the profile finds (shared discovery), with its host facts.
pub fn discover_located(profile: &Profile) -> Result<Vec<Located>, DiscoveryError> {
    let found = discover(profile)?;
    let root = Root::open(&profile.driver_root).ok();
    Ok(found
        .into_iter()
        .map(|d| locate_in(root.as_ref(), profile, d))
        .collect())
}

/// For each device, the nearest bridge above it that is also above another device of the
/// set: the PCIe switch (its upstream port) they share. Devices alone under their bridges
/// get `None`; so does a device without a known PCI path.
pub fn shared_switches(paths: &[Option<&[String]>]) -> Vec<Option<String>> {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for bridges in paths.iter().flatten() {
        for b in bridges.iter() {
            *count.entry(b).or_default() += 1;
        }
    }
    paths
        .iter()
        .map(|p| {
            p.and_then(|bridges| {
                bridges
                    .iter()
                    .rev()
                    .find(|b| count.get(b.as_str()).copied().unwrap_or(0) > 1)
                    .cloned()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Builds `sys/devices/<chain>/<bdf>` and the `sys/bus/pci/devices/<bdf>` link to it, as
    /// the kernel lays them out (relative link).
    fn fake_pci(root: &Path, chain: &[&str], bdf: &str, numa: i32) {
        let mut rel = PathBuf::from("../../../devices");
        for c in chain {
            rel.push(c);
        }
        rel.push(bdf);
        let real = root.join("sys/bus/pci/devices").join(&rel);
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("numa_node"), format!("{numa}\n")).unwrap();
        std::fs::create_dir_all(root.join(PCI_DEVICES)).unwrap();
        symlink(&rel, root.join(PCI_DEVICES).join(bdf)).unwrap();
    }

    #[test]
    fn bdf_shapes() {
        assert!(is_bdf("0000:3b:00.0"));
        assert!(!is_bdf("0000:3B:00.0"));
        assert!(!is_bdf("pci0000:00"));
        assert!(!is_bdf("0000:3b:00.8"));
        assert!(!is_bdf("../../etc/x.0"));
        assert_eq!(normalize_bdf("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(normalize_bdf("0000:3b:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn location_from_symlink_and_numa() {
        let root = tempfile::tempdir().unwrap();
        fake_pci(
            root.path(),
            &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0"],
            "0000:03:00.0",
            1,
        );
        fake_pci(
            root.path(),
            &["pci0000:80", "0000:80:02.0"],
            "0000:81:00.0",
            -1,
        );
        let root = Root::open(root.path()).unwrap();
        let loc = pci_location(&root, "00000000:03:00.0").unwrap();
        assert_eq!(loc.bus_id, "0000:03:00.0");
        assert_eq!(loc.numa_node, Some(1));
        assert_eq!(loc.root.as_deref(), Some("pci0000:00"));
        assert_eq!(
            loc.bridges,
            ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]
        );
        let loc = pci_location(&root, "0000:81:00.0").unwrap();
        assert_eq!(loc.numa_node, None, "-1 means no affinity");
        assert_eq!(pci_location(&root, "0000:99:00.0"), None);
        assert_eq!(pci_location(&root, "../../../etc"), None);
    }

    #[test]
    fn switch_is_nearest_shared_bridge() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // Two GPUs under one switch (upstream 01:00.0, downstream ports 02:08/02:10), a third
        // under another root port, a fourth with no PCI path.
        let a = s(&["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]);
        let b = s(&["0000:00:01.0", "0000:01:00.0", "0000:02:10.0"]);
        let c = s(&["0000:00:03.0"]);
        let got = shared_switches(&[Some(&a), Some(&b), Some(&c), None]);
        assert_eq!(
            got,
            [
                Some("0000:01:00.0".to_string()),
                Some("0000:01:00.0".to_string()),
                None,
                None
            ]
        );
    }

    #[test]
    fn char_device_to_bdf() {
        let root = tempfile::tempdir().unwrap();
        let class = root
            .path()
            .join("sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0/enflame/gcu0");
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join("dev"), "240:0\n").unwrap();
        std::fs::create_dir_all(root.path().join("sys/dev/char")).unwrap();
        symlink(
            "../../devices/pci0000:00/0000:00:02.0/0000:05:00.0/enflame/gcu0",
            root.path().join("sys/dev/char/240:0"),
        )
        .unwrap();
        let root = Root::open(root.path()).unwrap();
        assert_eq!(
            bdf_of_char_device(&root, 240, 0).as_deref(),
            Some("0000:05:00.0")
        );
        assert_eq!(bdf_of_char_device(&root, 240, 1), None);
        assert_eq!(
            sysfs_path_of_char_device(&root, 240, 0).as_deref(),
            Some("devices/pci0000:00/0000:00:02.0/0000:05:00.0")
        );
        assert_eq!(sysfs_path_of_char_device(&root, 240, 1), None);
    }

    #[test]
    fn a_char_device_without_a_parent_has_no_sysfs_path() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("sys/dev/char")).unwrap();
        for (link, to) in [
            ("10:200", "../../devices/virtual/misc/tun"),
            ("240:0", "../../devices/platform/gcu.0/enflame/gcu0"),
            ("240:1", "gcu1"),
        ] {
            symlink(to, root.path().join("sys/dev/char").join(link)).unwrap();
        }
        let root = Root::open(root.path()).unwrap();
        assert_eq!(sysfs_path_of_char_device(&root, 10, 200), None);
        assert_eq!(
            sysfs_path_of_char_device(&root, 240, 0).as_deref(),
            Some("devices/platform/gcu.0")
        );
        assert_eq!(sysfs_path_of_char_device(&root, 240, 1), None);
    }
}
