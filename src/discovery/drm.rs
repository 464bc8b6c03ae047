//! DRM-class accelerators (AMD, Intel, Hygon, MetaX): devices are PCI functions with a DRM
//! render node, told apart from any other GPU on the node (a BMC's or an iGPU's display
//! controller) by PCI vendor id and bound kernel driver, both read from sysfs.
//!
//! Everything is read under the profile's `driver-root`, resolved by [`crate::inroot`] as if
//! it were `/`. A `/sys/class/drm/<node>` entry is a symlink into
//! `/sys/devices/pci…/<bdf>/drm/<node>`; the function is the PCI address on the path it
//! resolves to, so a link can neither lead out of the root nor make one function's files
//! stand for another's. The function's attributes (`vendor`, `device`, KFD's `properties`)
//! are read by [`super::open_in_root`]'s rule and its `driver` link read, not followed
//! (issue 32, class 6). `vendor` is read once, for the filter; `device` only for the model
//! ([`model_of`]), which a create never needs.
//!
//! Ref: Documentation/ABI/testing/sysfs-class-drm, sysfs-bus-pci (`vendor`, `driver`);
//! KFD topology: drivers/gpu/drm/amd/amdkfd/kfd_topology.c (`drm_render_minor`,
//! `unique_id` in each node's `properties`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{
    dir_names_in, is_bdf, is_device_node, read_in_root, read_link_in_root, Device, DiscoveryError,
};
use crate::inroot::{Root, Scope};
use crate::profile::{DrmOrder, Profile};

const CLASS_DRM: &str = "sys/class/drm";

/// A sysfs attribute holds a few bytes; its reported size is 4096 whatever it holds.
const MAX_ATTR: u64 = 4096;
/// A KFD node's `properties` is a few dozen `key value` lines.
const MAX_PROPERTIES: u64 = 64 << 10;

/// The DRM-class discovery's data from the profile.
pub struct Filter<'a> {
    pub pci_vendors: &'a [String],
    pub drivers: &'a [String],
    pub order: DrmOrder,
    pub kfd_topology: Option<&'a Path>,
}

#[derive(Debug, Default)]
struct Function {
    render: Option<u32>,
    card: Option<u32>,
    /// `/sys/devices/…/<bdf>`: its directory, as a path under the root.
    dir: PathBuf,
}

/// `renderD128` → (true, 128), `card1` → (false, 1); connectors (`card0-DP-1`) and anything
/// else → `None`.
fn node_name(name: &str) -> Option<(bool, u32)> {
    let (render, num) = match name.strip_prefix("renderD") {
        Some(n) => (true, n),
        None => (false, name.strip_prefix("card")?),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((render, num.parse().ok()?))
}

/// The PCI function a class entry (`sys/class/drm/<name>`) belongs to: its bus address and its
/// directory as a path under the root. The entry is resolved by [`crate::inroot`] as if
/// `driver-root` were `/`, so no link leads out of the root; `None` when it resolves nowhere
/// or passes no PCI function.
fn function_of(root: &Root, name: &str) -> Option<(String, PathBuf)> {
    let entry = Path::new("/").join(CLASS_DRM).join(name);
    let host = root.lookup(&entry, Scope::InRoot).ok()?.host;
    // Only the part under the root may name the function: a driver root that itself sits
    // under a directory named like a PCI address does not make one.
    let rel = root.rel_of(&host)?;
    let dir = rel
        .ancestors()
        .find(|a| a.file_name().and_then(|n| n.to_str()).is_some_and(is_bdf))?;
    Some((dir.file_name()?.to_str()?.to_string(), dir.to_path_buf()))
}

/// Attribute `name` of the function in `dir`, trimmed; `None` when it does not exist. Any
/// other failure (not a regular file, over the limit, not text) names the file.
fn attr(root: &Root, dir: &Path, name: &str) -> Result<Option<String>, DiscoveryError> {
    let rel = dir.join(name);
    match read_in_root(root, &rel, MAX_ATTR).and_then(crate::bounded::text) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DiscoveryError::Read {
            path: root.display(&rel),
            source,
        }),
    }
}

/// The kernel driver bound to the function in `dir`: the last name of its `driver` link.
fn bound_driver(root: &Root, dir: &Path) -> Option<String> {
    let target = read_link_in_root(root, &dir.join("driver")).ok()?;
    target.file_name()?.to_str().map(str::to_string)
}

/// KFD topology (directory `dir` under the root): each GPU node's render minor, with its
/// node number and unique id.
fn kfd_nodes(root: &Root, dir: &Path) -> Result<BTreeMap<u32, (u32, Option<u64>)>, DiscoveryError> {
    let mut out = BTreeMap::new();
    for name in dir_names_in(root, dir)? {
        let Ok(node) = name.parse::<u32>() else {
            continue;
        };
        let rel = dir.join(&name).join("properties");
        let text = match read_in_root(root, &rel, MAX_PROPERTIES).and_then(crate::bounded::text) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(DiscoveryError::Read {
                    path: root.display(&rel),
                    source,
                })
            }
        };
        let (mut minor, mut unique) = (None, None);
        for (k, v) in text.lines().filter_map(|l| l.split_once(' ')) {
            match k {
                "drm_render_minor" => minor = v.trim().parse::<u32>().ok(),
                "unique_id" => unique = v.trim().parse::<u64>().ok(),
                _ => {}
            }
        }
        // CPU nodes report no render minor (or 0): render minors start at 128.
        if let Some(m) = minor.filter(|m| *m >= 128) {
            out.insert(m, (node, unique.filter(|u| *u != 0)));
        }
    }
    Ok(out)
}

pub fn discover(profile: &Profile, filter: &Filter<'_>) -> Result<Vec<Device>, DiscoveryError> {
    let Ok(opened) = Root::open(&profile.driver_root) else {
        return Ok(Vec::new());
    };
    let mut functions: BTreeMap<String, Function> = BTreeMap::new();
    for name in dir_names_in(&opened, Path::new(CLASS_DRM))? {
        let Some((render, num)) = node_name(&name) else {
            continue;
        };
        let Some((bdf, dir)) = function_of(&opened, &name) else {
            continue;
        };
        let f = functions.entry(bdf).or_default();
        f.dir = dir;
        let slot = if render { &mut f.render } else { &mut f.card };
        // Two of a kind under one function cannot be told apart: the lowest is kept.
        *slot = Some(slot.map_or(num, |s| s.min(num)));
    }
    let kfd = match filter.kfd_topology {
        Some(dir) => kfd_nodes(&opened, dir)?,
        None => BTreeMap::new(),
    };
    let mut found: Vec<(String, Function)> = Vec::new();
    for (bdf, f) in functions {
        if f.render.is_none() {
            continue;
        }
        // A function without a `vendor` is no vendor's; one whose `vendor` cannot be read
        // could be any vendor's, so that is an error, naming the file.
        let ours = attr(&opened, &f.dir, "vendor")?.is_some_and(|v| {
            filter
                .pci_vendors
                .iter()
                .any(|w| w.eq_ignore_ascii_case(&v))
        });
        if !ours {
            continue;
        }
        if filter.drivers.is_empty()
            || bound_driver(&opened, &f.dir).is_some_and(|d| filter.drivers.contains(&d))
        {
            found.push((bdf, f));
        }
    }
    let kfd_of = |f: &Function| f.render.and_then(|r| kfd.get(&r));
    match filter.order {
        // Already in PCI address order (the map's key).
        DrmOrder::PciBus => {}
        DrmOrder::Card => found.sort_by_key(|(_, f)| (f.card.is_none(), f.card)),
        DrmOrder::Kfd => found.sort_by_key(|(_, f)| {
            let node = kfd_of(f).map(|(n, _)| *n);
            (node.is_none(), node)
        }),
    }
    Ok(found
        .iter()
        .enumerate()
        .map(|(i, (bdf, f))| {
            let render = f.render.unwrap_or_default();
            let mut nodes = vec![PathBuf::from(format!("/dev/dri/renderD{render}"))];
            if let Some(card) = f.card {
                let node = PathBuf::from(format!("/dev/dri/card{card}"));
                if is_device_node(&Profile::under(profile.dev_root(), &node)) {
                    nodes.push(node);
                }
            }
            Device {
                index: i as u32,
                nodes,
                uuid: kfd_of(f).and_then(|(_, u)| *u).map(|u| format!("0x{u:x}")),
                pci_bus_id: Some(bdf.clone()),
                minor: f.card,
                aliases: Vec::new(),
                model: None,
                duplicate_uuid: None,
            }
        })
        .collect())
}

/// The model of a device a DRM-class profile found: its PCI vendor and device id as
/// `1002-74a1` ([`pci_model`]), read through the class entry of its render node (its first
/// node). `None` for other profiles' devices, and where sysfs does not say.
pub fn model_of(profile: &Profile, device: &Device) -> Option<String> {
    let root = Root::open(&profile.driver_root).ok()?;
    model_in(&root, profile, device)
}

/// [`model_of`] with the driver root already open.
pub(crate) fn model_in(root: &Root, profile: &Profile, device: &Device) -> Option<String> {
    if !matches!(profile.discovery, crate::profile::Discovery::Drm { .. }) {
        return None;
    }
    let name = device.nodes.first()?.file_name()?.to_str()?;
    let (bdf, dir) = function_of(root, name)?;
    if device.pci_bus_id.as_deref() != Some(bdf.as_str()) {
        return None;
    }
    pci_id(root, &dir)
}

/// The device memory of a device a DRM-class profile found, in bytes, where its kernel driver
/// reports it in sysfs (amdgpu and Hygon's DCU: `mem_info_vram_total` in the PCI function's
/// directory; Documentation/gpu/amdgpu/driver-misc.rst). `None` for other profiles' devices
/// and drivers that do not say. Read as discovery reads every driver file: in the root, a
/// regular file only, bounded.
pub fn memory_of(profile: &Profile, device: &Device) -> Option<u64> {
    if !matches!(profile.discovery, crate::profile::Discovery::Drm { .. }) {
        return None;
    }
    let root = Root::open(&profile.driver_root).ok()?;
    let name = device.nodes.first()?.file_name()?.to_str()?;
    let (bdf, dir) = function_of(&root, name)?;
    if device.pci_bus_id.as_deref() != Some(bdf.as_str()) {
        return None;
    }
    attr(&root, &dir, "mem_info_vram_total")
        .ok()??
        .parse::<u64>()
        .ok()
        .filter(|b| *b > 0)
}

/// The PCI vendor and device id of function `bdf` as `1002-74a1` (lspci's `1002:74a1` in
/// characters a node label value allows): the model, as far as sysfs names it. Read through
/// the function's DRM class entries, so only a function with DRM nodes has one.
pub fn pci_model(profile: &Profile, bdf: &str) -> Option<String> {
    if !is_bdf(bdf) {
        return None;
    }
    let root = Root::open(&profile.driver_root).ok()?;
    dir_names_in(&root, Path::new(CLASS_DRM))
        .ok()?
        .iter()
        .find_map(|name| {
            node_name(name)?;
            let (b, dir) = function_of(&root, name)?;
            if b != bdf {
                return None;
            }
            pci_id(&root, &dir)
        })
}

/// `vendor-device` of the PCI function whose sysfs directory is `dir` (`1002-74a1`).
fn pci_id(root: &Root, dir: &Path) -> Option<String> {
    let id = |f: &str| {
        let v = attr(root, dir, f).ok()??;
        let hex = v.strip_prefix("0x")?.to_ascii_lowercase();
        (hex.len() == 4 && hex.bytes().all(|c| c.is_ascii_hexdigit())).then_some(hex)
    };
    Some(format!("{}-{}", id("vendor")?, id("device")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert_eq!(node_name("renderD128"), Some((true, 128)));
        assert_eq!(node_name("card0"), Some((false, 0)));
        assert_eq!(node_name("card0-DP-1"), None);
        assert_eq!(node_name("renderD"), None);
        assert_eq!(node_name("version"), None);
    }

    /// Class entries resolve inside the driver root, relative and absolute links alike; one
    /// that leads above the root or to a host path stays inside and finds nothing there.
    #[test]
    fn class_links_resolve_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        let class = r.join("sys/class/drm");
        std::fs::create_dir_all(&class).unwrap();
        for d in [
            "sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0/drm/renderD128",
            "sys/devices/pci0000:00/0000:04:00.0/drm/renderD129",
            "sys/devices/platform/simple-framebuffer.0/drm/card9",
        ] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        // On the host, where the escaping links point.
        std::fs::create_dir_all(t.path().join("0000:05:00.0/drm/renderD130")).unwrap();
        let link = |name: &str, target: &Path| {
            std::os::unix::fs::symlink(target, class.join(name)).unwrap();
        };
        link(
            "renderD128",
            Path::new("../../devices/pci0000:00/0000:00:01.0/0000:03:00.0/drm/renderD128"),
        );
        link(
            "renderD129",
            Path::new("/sys/devices/pci0000:00/0000:04:00.0/drm/renderD129"),
        );
        link(
            "renderD130",
            Path::new("../../../../../0000:05:00.0/drm/renderD130"),
        );
        link("renderD131", &t.path().join("0000:05:00.0/drm/renderD130"));
        link(
            "card9",
            Path::new("../../devices/platform/simple-framebuffer.0/drm/card9"),
        );
        let root = Root::open(&r).unwrap();
        let (bdf, dir) = function_of(&root, "renderD128").unwrap();
        assert_eq!(bdf, "0000:03:00.0");
        assert_eq!(
            dir,
            Path::new("/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0")
        );
        assert_eq!(function_of(&root, "renderD129").unwrap().0, "0000:04:00.0");
        assert_eq!(function_of(&root, "renderD130"), None);
        assert_eq!(function_of(&root, "renderD131"), None);
        assert_eq!(function_of(&root, "card9"), None);
    }

    /// A function under `sys/devices/pci0000:00/<bdf>` with class links for its nodes.
    fn function(root: &Path, bdf: &str, vendor: &str, driver: &str, card: u32, render: u32) {
        let rel = format!("pci0000:00/{bdf}");
        let dir = root.join("sys/devices").join(&rel);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(dir.join("device"), "0x74A1\n").unwrap();
        std::os::unix::fs::symlink(
            format!("../../../bus/pci/drivers/{driver}"),
            dir.join("driver"),
        )
        .unwrap();
        let class = root.join(CLASS_DRM);
        std::fs::create_dir_all(&class).unwrap();
        for name in [format!("card{card}"), format!("renderD{render}")] {
            std::fs::create_dir_all(dir.join("drm").join(&name)).unwrap();
            std::os::unix::fs::symlink(
                format!("../../devices/{rel}/drm/{name}"),
                class.join(&name),
            )
            .unwrap();
        }
    }

    fn kfd(root: &Path, node: u32, render: u32, unique: u64) {
        let d = root.join(format!("sys/class/kfd/kfd/topology/nodes/{node}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("properties"),
            format!("simd_count 304\ndrm_render_minor {render}\nunique_id {unique}\n"),
        )
        .unwrap();
    }

    fn found(root: &Path, vendors: &[&str], drivers: &[&str], order: DrmOrder) -> Vec<Device> {
        let mut p = crate::config::Config::parse("", None)
            .unwrap()
            .profile("enflame")
            .unwrap()
            .clone();
        p.driver_root = root.to_path_buf();
        let vendors: Vec<String> = vendors.iter().map(|s| s.to_string()).collect();
        let drivers: Vec<String> = drivers.iter().map(|s| s.to_string()).collect();
        let kfd_dir = PathBuf::from("/sys/class/kfd/kfd/topology/nodes");
        discover(
            &p,
            &Filter {
                pci_vendors: &vendors,
                drivers: &drivers,
                order,
                kfd_topology: Some(&kfd_dir),
            },
        )
        .unwrap()
    }

    fn buses(devs: &[Device]) -> Vec<&str> {
        devs.iter()
            .map(|d| d.pci_bus_id.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn vendor_driver_filter_and_each_order() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        // Probe order (card numbers) differs from PCI order and from KFD's node order.
        function(r, "0000:00:1f.0", "0x1a03", "ast", 0, 128);
        function(r, "0000:c3:00.0", "0x1002", "amdgpu", 1, 129);
        function(r, "0000:43:00.0", "0x1002", "amdgpu", 2, 130);
        function(r, "0000:23:00.0", "0x1002", "amdgpu", 3, 131);
        function(r, "0000:63:00.0", "0x1002", "vfio-pci", 4, 132);
        kfd(r, 0, 0, 0);
        kfd(r, 1, 130, 0xabc);
        kfd(r, 2, 129, 0xdef);
        let pci = found(r, &["0x1002"], &["amdgpu"], DrmOrder::PciBus);
        assert_eq!(
            buses(&pci),
            ["0000:23:00.0", "0000:43:00.0", "0000:c3:00.0"]
        );
        assert_eq!(pci[0].nodes, [PathBuf::from("/dev/dri/renderD131")]);
        assert_eq!(pci[0].minor, Some(3));
        assert_eq!(pci[0].uuid, None, "not in KFD's topology");
        assert_eq!(pci[1].uuid.as_deref(), Some("0xabc"));
        // The model is read only when asked for: a create never needs it.
        assert_eq!(pci[1].model, None);
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/profiles/amd.toml"
        ))
        .unwrap();
        let (mut p, _) = Profile::from_table(toml::from_str(&text).unwrap(), "amd").unwrap();
        p.driver_root = r.to_path_buf();
        assert_eq!(model_of(&p, &pci[1]).as_deref(), Some("1002-74a1"));
        assert_eq!(pci_model(&p, "0000:43:00.0").as_deref(), Some("1002-74a1"));
        let mut elsewhere = pci[1].clone();
        elsewhere.pci_bus_id = Some("0000:c3:00.0".into());
        assert_eq!(model_of(&p, &elsewhere), None, "not that function's");
        let card = found(r, &["0x1002"], &["amdgpu"], DrmOrder::Card);
        assert_eq!(
            buses(&card),
            ["0000:c3:00.0", "0000:43:00.0", "0000:23:00.0"]
        );
        let by_kfd = found(r, &["0x1002"], &["amdgpu"], DrmOrder::Kfd);
        assert_eq!(
            buses(&by_kfd),
            ["0000:43:00.0", "0000:c3:00.0", "0000:23:00.0"]
        );
        // No driver list: any bound driver of the vendor; vendor ids compare without case.
        let any = found(r, &["0X1002"], &[], DrmOrder::PciBus);
        assert_eq!(any.len(), 4);
        assert!(found(r, &["0x10de"], &[], DrmOrder::PciBus).is_empty());
        let none = tempfile::tempdir().unwrap();
        assert!(found(none.path(), &["0x1002"], &[], DrmOrder::PciBus).is_empty());
    }
}
