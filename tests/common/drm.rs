//! Simulated DRM-class hosts (AMD, Intel, Hygon): the sysfs the kernel would show for each PCI
//! function (`vendor`, `device`, `numa_node`, the `driver` link, `drm/card<N>` and
//! `drm/renderD<M>`), the `/sys/class/drm` and `/sys/bus/pci/devices` links into it, KFD
//! topology for AMD/Hygon, and the device nodes made with mknod: DRM's real major 226 for
//! card/render nodes and a free dynamic major for `/dev/kfd` (as kfd's is dynamic).
//!
//! Built into an existing [`SimRoot`] (`SimRoot::builder().build()`), so [`Runc`] and the
//! rest of the harness work unchanged; [`install_profiles`] adds the profile files to a
//! `Runc`'s config.
//!
//! - [`amd_node`]: 8 AMD MI300X-like GPUs (0x1002:0x74a1, amdgpu) behind two PCIe switches
//!   (four each, NUMA 0 and 1), card/render numbers deliberately not in PCI order, plus an
//!   onboard ASPEED display GPU (0x1a03, ast) given card0 *and* renderD128 so only the vendor
//!   filter keeps it out, and an AMD function bound to vfio-pci (no DRM nodes).
//! - [`intel_node`]: two i915 GPUs and one xe GPU.
//! - [`hygon_node`]: two Hygon DCUs (0x1d94) with `/dev/kfd` and `/dev/mkfd`.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::{mknod, Runc, SimRoot};

/// The DRM major (Documentation/admin-guide/devices.txt).
pub const DRM_MAJOR: u32 = 226;

/// One PCI function with DRM nodes.
#[derive(Debug, Clone)]
pub struct Func {
    pub bdf: String,
    /// Bridges from the root port down, e.g. root port, switch upstream, downstream port.
    pub bridges: Vec<String>,
    pub vendor: &'static str,
    pub device: &'static str,
    pub driver: &'static str,
    pub numa: i32,
    pub card: Option<u32>,
    pub render: Option<u32>,
    /// KFD node number and unique id.
    pub kfd: Option<(u32, u64)>,
}

impl Func {
    pub fn render_node(&self) -> String {
        format!("/dev/dri/renderD{}", self.render.unwrap())
    }
    pub fn card_node(&self) -> String {
        format!("/dev/dri/card{}", self.card.unwrap())
    }
}

/// What was built: the functions and the dynamic major of `/dev/kfd`.
#[derive(Debug, Clone)]
pub struct DrmHost {
    pub funcs: Vec<Func>,
    pub kfd_major: Option<u32>,
}

impl DrmHost {
    /// The functions of `vendor` bound to `driver` with a render node, in PCI order.
    pub fn offered(&self, vendor: &str, driver: &str) -> Vec<&Func> {
        let mut v: Vec<&Func> = self
            .funcs
            .iter()
            .filter(|f| f.vendor == vendor && f.driver == driver && f.render.is_some())
            .collect();
        v.sort_by(|a, b| a.bdf.cmp(&b.bdf));
        v
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `link` -> `target` (relative text), parents made.
fn link(target: &str, link: &Path) {
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    symlink(target, link).unwrap();
}

/// `pci<domain>:<bus>/<bridges>/<bdf>`: where `f` sits under `sys/devices`.
fn rel_dir(f: &Func) -> PathBuf {
    let mut rel = PathBuf::from(format!("pci{}", &f.bdf[..7]));
    for b in &f.bridges {
        rel.push(b);
    }
    rel.push(&f.bdf);
    rel
}

/// The sysfs directory of `f` under `root` (its `vendor`, `device`, `numa_node`, `driver`).
pub fn sysfs_dir(root: &Path, f: &Func) -> PathBuf {
    root.join("sys/devices").join(rel_dir(f))
}

/// Lays out `funcs` under `root` as sysfs does, and makes their nodes under `root/dev`.
pub fn build(root: &Path, funcs: Vec<Func>, kfd: bool, extra_kfd_nodes: &[&str]) -> DrmHost {
    for f in &funcs {
        let rel = rel_dir(f);
        let dir = root.join("sys/devices").join(&rel);
        write(&dir.join("vendor"), &format!("{}\n", f.vendor));
        write(&dir.join("device"), &format!("{}\n", f.device));
        write(&dir.join("numa_node"), &format!("{}\n", f.numa));
        std::fs::create_dir_all(root.join("sys/bus/pci/drivers").join(f.driver)).unwrap();
        let depth = rel.components().count() + 1;
        link(
            &format!("{}bus/pci/drivers/{}", "../".repeat(depth), f.driver),
            &dir.join("driver"),
        );
        link(
            &format!("../../../devices/{}", rel.display()),
            &root.join("sys/bus/pci/devices").join(&f.bdf),
        );
        for (name, minor) in [
            (f.card.map(|c| format!("card{c}")), f.card),
            (f.render.map(|r| format!("renderD{r}")), f.render),
        ] {
            let (Some(name), Some(minor)) = (name, minor) else {
                continue;
            };
            write(
                &dir.join("drm").join(&name).join("dev"),
                &format!("{DRM_MAJOR}:{minor}\n"),
            );
            link(
                &format!("../../devices/{}/drm/{name}", rel.display()),
                &root.join("sys/class/drm").join(&name),
            );
            link(
                &format!("../../devices/{}/drm/{name}", rel.display()),
                &root.join(format!("sys/dev/char/{DRM_MAJOR}:{minor}")),
            );
            mknod(&root.join("dev/dri").join(&name), DRM_MAJOR, minor, 0o666);
        }
    }
    // A connector entry, as the kernel lists them beside the cards: never a device.
    if let Some(f) = funcs.iter().find(|f| f.card.is_some()) {
        let mut rel = PathBuf::from(format!("pci{}", &f.bdf[..7]));
        for b in &f.bridges {
            rel.push(b);
        }
        let name = format!("card{}-HDMI-A-1", f.card.unwrap());
        link(
            &format!(
                "../../devices/{}/{}/drm/card{}/{name}",
                rel.display(),
                f.bdf,
                f.card.unwrap()
            ),
            &root.join("sys/class/drm").join(name),
        );
    }
    write(&root.join("sys/class/drm/version"), "drm 1.1.0 20060810\n");
    let mut kfd_major = None;
    if kfd {
        let major = super::free_majors(1)[0];
        mknod(&root.join("dev/kfd"), major, 0, 0o666);
        for extra in extra_kfd_nodes {
            mknod(&root.join("dev").join(extra), major, 1, 0o666);
        }
        kfd_major = Some(major);
        let nodes = root.join("sys/class/kfd/kfd/topology/nodes");
        // CPU node 0 first, as KFD lists them.
        write(
            &nodes.join("0/properties"),
            "cpu_cores_count 64\nsimd_count 0\ndrm_render_minor 0\nunique_id 0\n",
        );
        for f in &funcs {
            if let (Some((node, unique)), Some(render)) = (f.kfd, f.render) {
                write(
                    &nodes.join(format!("{node}/properties")),
                    &format!(
                        "cpu_cores_count 0\nsimd_count 1216\nlocation_id 1\ndrm_render_minor {render}\nunique_id {unique}\n"
                    ),
                );
            }
        }
    }
    DrmHost { funcs, kfd_major }
}

fn amd(bdf: &str, bridges: &[&str], numa: i32, card: u32, render: u32, kfd_node: u32) -> Func {
    Func {
        bdf: bdf.into(),
        bridges: bridges.iter().map(|s| s.to_string()).collect(),
        vendor: "0x1002",
        device: "0x74a1",
        driver: "amdgpu",
        numa,
        card: Some(card),
        render: Some(render),
        kfd: Some((kfd_node, 0x5a3c_0000_0000_1000 + u64::from(card))),
    }
}

/// The 8-GPU AMD node (see the module doc). PCI order of the GPUs: 03, 04, 05, 06 (switch
/// 0000:01:00.0, NUMA 0), 83, 84, 85, 86 (switch 0000:81:00.0, NUMA 1); the second switch's
/// GPUs were probed in reverse, so their card/render numbers run backwards.
pub fn amd_node(sim: &SimRoot) -> DrmHost {
    build(sim.path(), amd_funcs(), true, &[])
}

/// The functions [`amd_node`] lays out, for a test to change before [`build`].
pub fn amd_funcs() -> Vec<Func> {
    let mut funcs = Vec::new();
    for (i, bus) in ["03", "04", "05", "06"].iter().enumerate() {
        let i = i as u32;
        funcs.push(amd(
            &format!("0000:{bus}:00.0"),
            &["0000:00:01.0", "0000:01:00.0", &format!("0000:02:0{i}.0")],
            0,
            1 + i,
            129 + i,
            1 + i,
        ));
    }
    for (i, bus) in ["83", "84", "85", "86"].iter().enumerate() {
        let i = i as u32;
        funcs.push(amd(
            &format!("0000:{bus}:00.0"),
            &["0000:80:01.0", "0000:81:00.0", &format!("0000:82:0{i}.0")],
            1,
            8 - i,
            136 - i,
            8 - i,
        ));
    }
    // The BMC's display controller on the root complex, probed first.
    funcs.push(Func {
        bdf: "0000:00:1f.0".into(),
        bridges: vec![],
        vendor: "0x1a03",
        device: "0x2000",
        driver: "ast",
        numa: 0,
        card: Some(0),
        render: Some(128),
        kfd: None,
    });
    // An AMD GPU passed to a VM: vfio-pci, no DRM nodes.
    funcs.push(Func {
        bdf: "0000:c1:00.0".into(),
        bridges: vec!["0000:c0:01.0".into()],
        vendor: "0x1002",
        device: "0x74a1",
        driver: "vfio-pci",
        numa: 1,
        card: None,
        render: None,
        kfd: None,
    });
    funcs
}

/// Two i915 GPUs (one integrated on the root complex, one discrete) and one xe GPU.
pub fn intel_node(sim: &SimRoot) -> DrmHost {
    let f = |bdf: &str, bridges: &[&str], device, driver, card, render| Func {
        bdf: bdf.to_string(),
        bridges: bridges.iter().map(|s| s.to_string()).collect(),
        vendor: "0x8086",
        device,
        driver,
        numa: 0,
        card: Some(card),
        render: Some(render),
        kfd: None,
    };
    let funcs = vec![
        f("0000:00:02.0", &[], "0xa780", "i915", 0, 128),
        f("0000:03:00.0", &["0000:00:01.0"], "0x56c0", "i915", 2, 130),
        f("0000:04:00.0", &["0000:00:1c.0"], "0xe20b", "xe", 1, 129),
    ];
    build(sim.path(), funcs, false, &[])
}

/// Two Hygon DCUs with KFD topology, `/dev/kfd` and `/dev/mkfd`.
pub fn hygon_node(sim: &SimRoot) -> DrmHost {
    let f = |bdf: &str, card, render, node| Func {
        bdf: bdf.to_string(),
        bridges: vec!["0000:40:01.0".into()],
        vendor: "0x1d94",
        device: "0x6320",
        driver: "hydcu",
        numa: 0,
        card: Some(card),
        render: Some(render),
        kfd: Some((node, 0x1d94_0000_0000 + u64::from(card))),
    };
    let funcs = vec![f("0000:41:00.0", 0, 128, 1), f("0000:42:00.0", 1, 129, 2)];
    build(sim.path(), funcs, true, &["mkfd"])
}

/// Installs `config/profiles/<name>.toml` for each name into `runc`'s profiles-dir, with its
/// driver-root pointed at `sim`.
pub fn install_profiles(runc: &Runc, sim: &SimRoot, names: &[&str]) {
    let dir = runc.config_path().parent().unwrap().join("profiles.d");
    let mut extra = String::new();
    for name in names {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("config/profiles/{name}.toml")),
            dir.join(format!("{name}.toml")),
        )
        .unwrap();
        extra.push_str(&format!(
            "[profiles.{name:?}]\ndriver-root = \"{}\"\n",
            sim.path().display()
        ));
    }
    let mut text = std::fs::read_to_string(runc.config_path()).unwrap();
    text.push_str(&extra);
    std::fs::write(runc.config_path(), text).unwrap();
}

/// Whether this host's kernel has a DRM driver (then a fake 226 node opens to ENODEV, not
/// ENXIO).
pub fn host_has_drm() -> bool {
    std::fs::read_to_string("/proc/devices")
        .unwrap()
        .lines()
        .take_while(|l| !l.starts_with("Block"))
        .any(|l| l.split_whitespace().next() == Some("226"))
}
