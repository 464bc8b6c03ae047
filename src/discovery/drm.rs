//! DRM-class accelerators (AMD, Intel, Hygon, MetaX): devices are PCI functions with a DRM
//! render node, told apart from any other GPU on the node (a BMC's or an iGPU's display
//! controller) by PCI vendor id and bound kernel driver, both read from sysfs.
//!
//! Everything is read under the profile's `driver-root`. A `/sys/class/drm/<node>` entry is a
//! symlink into `/sys/devices/pci…/<bdf>/drm/<node>`; its target is read as text and
//! resolved lexically under `<driver-root>/sys`, never followed, so a link can neither lead
//! out of the root nor make one function's files stand for another's. The function's own
//! directory (`vendor`, the `driver` link) is then a plain directory of that tree.
//!
//! Ref: Documentation/ABI/testing/sysfs-class-drm, sysfs-bus-pci (`vendor`, `driver`);
//! KFD topology: drivers/gpu/drm/amd/amdkfd/kfd_topology.c (`drm_render_minor`,
//! `unique_id` in each node's `properties`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{is_bdf, is_device_node, read_dir_names, Device, DiscoveryError};
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
    /// `<root>/sys/devices/…/<bdf>`, lexically resolved.
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
/// host directory. The entry is resolved by [`crate::inroot`] as if `driver-root` were `/`, so
/// no link leads out of the root; `None` when it resolves nowhere or passes no PCI function.
fn function_of(root: &Root, name: &str) -> Option<(String, PathBuf)> {
    let entry = Path::new("/").join(CLASS_DRM).join(name);
    let host = root.lookup(&entry, Scope::InRoot).ok()?.host;
    // Only the part under the root may name the function: a driver root that itself sits
    // under a directory named like a PCI address does not make one.
    let rel = root.rel_of(&host)?;
    let up = rel
        .ancestors()
        .position(|a| a.file_name().and_then(|n| n.to_str()).is_some_and(is_bdf))?;
    let dir = host.ancestors().nth(up)?;
    Some((dir.file_name()?.to_str()?.to_string(), dir.to_path_buf()))
}

fn attr(path: &Path) -> Option<String> {
    crate::bounded::read_text(path, MAX_ATTR)
        .ok()
        .map(|t| t.trim().to_string())
}

/// The kernel driver bound to the function in `dir`: the last name of its `driver` link.
fn bound_driver(dir: &Path) -> Option<String> {
    let target = std::fs::read_link(dir.join("driver")).ok()?;
    target.file_name()?.to_str().map(str::to_string)
}

/// KFD topology: each GPU node's render minor, with its node number and unique id.
fn kfd_nodes(dir: &Path) -> Result<BTreeMap<u32, (u32, Option<u64>)>, DiscoveryError> {
    let mut out = BTreeMap::new();
    for name in read_dir_names(dir)? {
        let Ok(node) = name.parse::<u32>() else {
            continue;
        };
        let path = dir.join(&name).join("properties");
        let text = match crate::bounded::read_text(&path, MAX_PROPERTIES) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(DiscoveryError::Read { path, source }),
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
    let root = &profile.driver_root;
    let class = root.join(CLASS_DRM);
    let Ok(opened) = Root::open(root) else {
        return Ok(Vec::new());
    };
    let mut functions: BTreeMap<String, Function> = BTreeMap::new();
    for name in read_dir_names(&class)? {
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
        Some(dir) => kfd_nodes(&Profile::under(root, dir))?,
        None => BTreeMap::new(),
    };
    let mut found: Vec<(String, Function)> = functions
        .into_iter()
        .filter(|(_, f)| f.render.is_some())
        .filter(|(_, f)| {
            attr(&f.dir.join("vendor")).is_some_and(|v| {
                filter
                    .pci_vendors
                    .iter()
                    .any(|w| w.eq_ignore_ascii_case(&v))
            })
        })
        .filter(|(_, f)| {
            filter.drivers.is_empty()
                || bound_driver(&f.dir).is_some_and(|d| filter.drivers.contains(&d))
        })
        .collect();
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
                model: pci_id(&f.dir),
            }
        })
        .collect())
}

/// The PCI vendor and device id of function `bdf` as `1002-74a1` (lspci's `1002:74a1` in
/// characters a node label value allows): the model, as far as sysfs names it. Read through
/// the function's DRM class entries, so only a function with DRM nodes has one.
pub fn pci_model(profile: &Profile, bdf: &str) -> Option<String> {
    if !is_bdf(bdf) {
        return None;
    }
    let class = profile.driver_root.join(CLASS_DRM);
    let root = Root::open(&profile.driver_root).ok()?;
    read_dir_names(&class).ok()?.iter().find_map(|name| {
        node_name(name)?;
        let (b, dir) = function_of(&root, name)?;
        if b != bdf {
            return None;
        }
        pci_id(&dir)
    })
}

/// `vendor-device` of the PCI function whose sysfs directory is `dir` (`1002-74a1`).
fn pci_id(dir: &Path) -> Option<String> {
    let id = |f: &str| {
        let v = attr(&dir.join(f))?;
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
        let canon = r.canonicalize().unwrap();
        let (bdf, dir) = function_of(&root, "renderD128").unwrap();
        assert_eq!(bdf, "0000:03:00.0");
        assert_eq!(
            dir,
            canon.join("sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0")
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
