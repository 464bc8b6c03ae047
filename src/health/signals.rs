//! Reading a device's signals on the host: its nodes and driver (the device plugin's old
//! rule), and in sysfs under the profile's driver root its PCI function's presence, the first
//! word of its config space, its AER counters and its amdgpu RAS counters.
//!
//! Every sysfs file is read by [`crate::discovery::open_in_root`]'s rule: resolved inside
//! the root as if it were `/` (no link leads out of it), opened only once `fstat` says it is a
//! regular file, and read with a limit. Of `config` only the first 4 bytes are read: each
//! word read is a config cycle on the bus.
//!
//! Ref: Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats (`aer_dev_fatal`,
//! `aer_dev_nonfatal`: `NAME count` lines, `TOTAL_ERR_FATAL` / `TOTAL_ERR_NONFATAL` last);
//! Documentation/ABI/testing/sysfs-bus-pci (`config`); amdgpu's `ras/<block>_err_count`
//! (`ue: N` and `ce: N` lines, drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::discovery::{is_bdf, open_in_root, read_in_root, read_link_in_root, sorted_names_in};
use crate::inroot::{Root, Scope};
use crate::profile::Profile;
use crate::topology::{normalize_bdf, Node};

use super::decide::{Counters, Pci};
use super::reason::{Kind, Problem};
use super::wing::DrmHealth;

const PCI_DEVICES: &str = "sys/bus/pci/devices";

/// A counter file is a few dozen short lines.
const MAX_COUNTER_FILE: u64 = 4096;

/// More RAS blocks than amdgpu has (about 20): the rest are not read.
const MAX_RAS_BLOCKS: usize = 64;

/// Why the device's nodes or its driver cannot serve it now; `None` when the driver is loaded
/// (the profile's version file exists, where it names one) and every node is a character
/// device with the major it had at discovery.
///
/// The node's host path is a lexical join under dev-root looked at with `lstat`, never
/// opened: a link there is not a character device, so nothing outside the root is reached.
pub fn nodes_problem(profile: &Profile, nodes: &[Node], host_nodes: &[PathBuf]) -> Option<Problem> {
    if let Some(v) = profile.version_file.as_deref() {
        let path = Profile::under(&profile.driver_root, v);
        if !path.exists() {
            return Some(Problem::new(
                Kind::DriverNotLoaded,
                format!(
                    "the driver is not loaded (its version file {} is gone)",
                    path.display()
                ),
            ));
        }
    }
    let node = |text: String| Some(Problem::new(Kind::DeviceNode, text));
    for (n, host) in nodes.iter().zip(host_nodes) {
        let m = match std::fs::symlink_metadata(host) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return node(format!("{}: does not exist", host.display()))
            }
            Err(e) => return node(format!("{}: cannot be read: {e}", host.display())),
        };
        if !m.file_type().is_char_device() {
            return node(format!("{}: is not a character device", host.display()));
        }
        let major = nix::sys::stat::major(m.rdev());
        if let Some(want) = n.major.filter(|w| *w != major) {
            return node(format!(
                "{}: has major {major}, the driver's is {want}",
                host.display()
            ));
        }
    }
    None
}

/// What sysfs says of PCI function `bdf` under `root`: whether it is there and answers, and
/// its error counts. [`Pci::Unknown`] and no counts when `bdf` is not a bus id or its
/// directory cannot be looked at for another reason than its absence.
pub fn read_pci(root: &Root, bdf: &str) -> (Pci, Counters) {
    let bdf = normalize_bdf(bdf);
    if !is_bdf(&bdf) {
        return (Pci::Unknown, Counters::default());
    }
    let dir = Path::new(PCI_DEVICES).join(&bdf);
    match root.open_at(&dir, OFlags::PATH | OFlags::DIRECTORY, Scope::InRoot) {
        Ok(_) => {}
        Err(Errno::NOENT | Errno::NOTDIR) => return (Pci::Gone, Counters::default()),
        Err(_) => return (Pci::Unknown, Counters::default()),
    }
    let pci = if config_all_ones(root, &dir.join("config")) {
        Pci::AllOnes
    } else {
        Pci::Present
    };
    let counters = Counters {
        aer_fatal: total(root, &dir.join("aer_dev_fatal"), "TOTAL_ERR_FATAL"),
        aer_nonfatal: total(root, &dir.join("aer_dev_nonfatal"), "TOTAL_ERR_NONFATAL"),
        ras_ue: ras(root, &dir.join("ras")),
    };
    (pci, counters)
}

/// What the kernel driver says of PCI function `bdf` under `root`, as `cfg` asks: bound to
/// none of `cfg.drivers` (unbound, or rebound to `vfio-pci`), or put by xe in survivability
/// mode (its firmware failed: the device is wedged until it is flashed). States, not counts:
/// nothing to baseline. Nothing when the function is not there (its absence is
/// [`read_pci`]'s signal) or cannot be looked at.
///
/// Ref: Documentation/ABI/testing/sysfs-bus-pci (`driver`, a link to the bound driver);
/// drivers/gpu/drm/xe/xe_survivability_mode.c (`survivability_mode`, on the PCI device only
/// while in that mode, reading `Boot` or `Runtime`).
pub fn read_drm(root: &Root, bdf: &str, cfg: &DrmHealth) -> Vec<Problem> {
    let bdf = normalize_bdf(bdf);
    let mut out = Vec::new();
    if !is_bdf(&bdf) {
        return out;
    }
    let dir = Path::new(PCI_DEVICES).join(&bdf);
    if root
        .open_at(&dir, OFlags::PATH | OFlags::DIRECTORY, Scope::InRoot)
        .is_err()
    {
        return out;
    }
    if !cfg.drivers.is_empty() {
        let wanted = cfg.drivers.join(", ");
        match read_link_in_root(root, &dir.join("driver")) {
            Ok(target) => {
                let name = target
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !cfg.drivers.contains(&name) {
                    let shown: String = name.chars().filter(|c| !c.is_control()).take(40).collect();
                    out.push(Problem::new(
                        Kind::DriverUnbound,
                        format!("PCI function {bdf} is bound to {shown:?}, not {wanted}"),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => out.push(Problem::new(
                Kind::DriverUnbound,
                format!("PCI function {bdf} is bound to no driver (the profile's: {wanted})"),
            )),
            Err(_) => {}
        }
    }
    if cfg.survivability_mode {
        let rel = dir.join("survivability_mode");
        if open_in_root(root, &rel).is_ok() {
            let mode = read_in_root(root, &rel, 64)
                .ok()
                .map(|b| {
                    String::from_utf8_lossy(&b)
                        .trim()
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(20)
                        .collect::<String>()
                })
                .filter(|m| !m.is_empty());
            let mode = mode.map(|m| format!(" ({m})")).unwrap_or_default();
            out.push(Problem::new(
                Kind::SurvivabilityMode,
                format!(
                    "PCI function {bdf} is in survivability mode{mode}: its firmware needs \
                     flashing"
                ),
            ));
        }
    }
    out
}

/// The first word of config space is the vendor and device ID; a function that no longer
/// answers reads `0xffffffff` there. A file that cannot be read says nothing.
fn config_all_ones(root: &Root, rel: &Path) -> bool {
    let Ok((file, _)) = open_in_root(root, rel) else {
        return false;
    };
    let mut first = Vec::with_capacity(4);
    match file.take(4).read_to_end(&mut first) {
        Ok(4) => first == [0xff; 4],
        _ => false,
    }
}

/// The count on the line `NAME count` whose name is `key`.
pub fn parse_total(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()? == key).then(|| w.next()?.parse().ok())?
    })
}

/// An amdgpu RAS counter file's uncorrectable count (`ue: N`).
pub fn parse_ue(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "ue").then(|| v.trim().parse().ok())?
    })
}

fn total(root: &Root, rel: &Path, key: &str) -> Option<u64> {
    let data = read_in_root(root, rel, MAX_COUNTER_FILE).ok()?;
    parse_total(std::str::from_utf8(&data).ok()?, key)
}

/// Each `<block>_err_count` of the function's `ras` directory, by block.
fn ras(root: &Root, rel: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for name in sorted_names_in(root, rel).into_iter().take(MAX_RAS_BLOCKS) {
        let Some(block) = name.strip_suffix("_err_count").filter(|b| !b.is_empty()) else {
            continue;
        };
        let Ok(data) = read_in_root(root, &rel.join(&name), MAX_COUNTER_FILE) else {
            continue;
        };
        if let Some(n) = std::str::from_utf8(&data).ok().and_then(parse_ue) {
            out.insert(block.to_string(), n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const BDF: &str = "0000:11:00.0";

    /// A simulated sysfs: the function's directory under `sys/devices`, linked from
    /// `sys/bus/pci/devices` as the kernel does.
    fn function(root: &Path) -> PathBuf {
        let real = root.join("sys/devices/pci0000:00/0000:00:01.0").join(BDF);
        std::fs::create_dir_all(&real).unwrap();
        std::fs::create_dir_all(root.join(PCI_DEVICES)).unwrap();
        symlink(
            format!("../../../devices/pci0000:00/0000:00:01.0/{BDF}"),
            root.join(PCI_DEVICES).join(BDF),
        )
        .unwrap();
        real
    }

    fn aer(dir: &Path, fatal: u64, nonfatal: u64) {
        std::fs::write(
            dir.join("aer_dev_fatal"),
            format!(
                "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nTOTAL_ERR_FATAL {fatal}\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("aer_dev_nonfatal"),
            format!("Undefined 0\nTLP 0\nTOTAL_ERR_NONFATAL {nonfatal}\n"),
        )
        .unwrap();
    }

    #[test]
    fn counters_config_and_ras_read_from_a_simulated_sysfs() {
        let t = tempfile::tempdir().unwrap();
        let dir = function(t.path());
        aer(&dir, 2, 5);
        std::fs::write(dir.join("config"), [0x02, 0x10, 0xa1, 0x74, 0, 0, 0, 0]).unwrap();
        std::fs::create_dir(dir.join("ras")).unwrap();
        std::fs::write(dir.join("ras/umc_err_count"), "ue: 3\nce: 12\n").unwrap();
        std::fs::write(dir.join("ras/gfx_err_count"), "ue: 0\nce: 0\n").unwrap();
        std::fs::write(dir.join("ras/features"), "feature mask: 0x3fbb\n").unwrap();
        let root = Root::open(t.path()).unwrap();
        let (pci, c) = read_pci(&root, BDF);
        assert_eq!(pci, Pci::Present);
        assert_eq!(c.aer_fatal, Some(2));
        assert_eq!(c.aer_nonfatal, Some(5));
        assert_eq!(
            c.ras_ue.into_iter().collect::<Vec<_>>(),
            [("gfx".to_string(), 0), ("umc".to_string(), 3)]
        );
        // NVIDIA's way of writing the same function.
        assert_eq!(read_pci(&root, "00000000:11:00.0").0, Pci::Present);

        std::fs::write(dir.join("config"), [0xff; 256]).unwrap();
        assert_eq!(read_pci(&root, BDF).0, Pci::AllOnes);
        // A short or empty config says nothing.
        std::fs::write(dir.join("config"), [0xff; 2]).unwrap();
        assert_eq!(read_pci(&root, BDF).0, Pci::Present);

        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read_pci(&root, BDF), (Pci::Gone, Counters::default()));
        assert_eq!(read_pci(&root, "not a bdf").0, Pci::Unknown);
    }

    /// Files absent: no counts (not zero); a counter that is not a regular file (a FIFO: it
    /// would block) or is endless is not read; a link out of the root reads inside it.
    #[test]
    fn what_is_not_a_counter_gives_no_count() {
        let t = tempfile::tempdir().unwrap();
        let dir = function(t.path());
        let root = Root::open(t.path()).unwrap();
        assert_eq!(read_pci(&root, BDF), (Pci::Present, Counters::default()));

        nix::unistd::mkfifo(&dir.join("aer_dev_fatal"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::write(
            dir.join("aer_dev_nonfatal"),
            "TOTAL_ERR_NONFATAL 1\n".repeat(1000),
        )
        .unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("umc_err_count"), "ue: 9\n").unwrap();
        std::fs::create_dir(dir.join("ras")).unwrap();
        symlink(
            outside.path().join("umc_err_count"),
            dir.join("ras/umc_err_count"),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let (_, c) = read_pci(&root, BDF);
        assert_eq!(c, Counters::default());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// The kernel driver's signals on a simulated sysfs: bound to the profile's driver, clear;
    /// to another, or to none, unhealthy naming it; xe's survivability mode, unhealthy with the
    /// mode; a `survivability_mode` that is not a regular file, or a function gone, nothing.
    #[test]
    fn the_kernel_drivers_binding_and_survivability_mode() {
        let t = tempfile::tempdir().unwrap();
        let dir = function(t.path());
        let root = Root::open(t.path()).unwrap();
        let cfg = DrmHealth {
            drivers: vec!["xe".into()],
            survivability_mode: true,
        };
        let bind = |to: &str| {
            let _ = std::fs::remove_file(dir.join("driver"));
            symlink(
                format!("../../../../bus/pci/drivers/{to}"),
                dir.join("driver"),
            )
            .unwrap();
        };
        let read = || read_drm(&root, BDF, &cfg);
        bind("xe");
        assert_eq!(read(), []);
        bind("vfio-pci");
        assert_eq!(
            read(),
            [Problem::new(
                Kind::DriverUnbound,
                "PCI function 0000:11:00.0 is bound to \"vfio-pci\", not xe"
            )]
        );
        std::fs::remove_file(dir.join("driver")).unwrap();
        assert_eq!(
            read(),
            [Problem::new(
                Kind::DriverUnbound,
                "PCI function 0000:11:00.0 is bound to no driver (the profile's: xe)"
            )]
        );
        // Not asked: not read.
        let only_mode = DrmHealth {
            drivers: Vec::new(),
            survivability_mode: true,
        };
        assert_eq!(read_drm(&root, BDF, &only_mode), []);

        bind("xe");
        std::fs::write(dir.join("survivability_mode"), "Runtime\n").unwrap();
        assert_eq!(
            read(),
            [Problem::new(
                Kind::SurvivabilityMode,
                "PCI function 0000:11:00.0 is in survivability mode (Runtime): its firmware \
                 needs flashing"
            )]
        );
        let off = DrmHealth {
            survivability_mode: false,
            ..cfg.clone()
        };
        assert_eq!(read_drm(&root, BDF, &off), []);
        std::fs::remove_file(dir.join("survivability_mode")).unwrap();
        nix::unistd::mkfifo(
            &dir.join("survivability_mode"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        assert_eq!(read(), [], "a FIFO is no signal (and never blocks)");

        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read(), [], "gone is read_pci's signal");
    }

    #[test]
    fn parsers() {
        assert_eq!(
            parse_total("DLP 1\nTOTAL_ERR_FATAL 12\n", "TOTAL_ERR_FATAL"),
            Some(12)
        );
        assert_eq!(
            parse_total("TOTAL_ERR_FATALX 12\n", "TOTAL_ERR_FATAL"),
            None
        );
        assert_eq!(parse_total("TOTAL_ERR_FATAL -1\n", "TOTAL_ERR_FATAL"), None);
        assert_eq!(parse_ue("ue: 4\nce: 7\n"), Some(4));
        assert_eq!(parse_ue("ce: 7\n"), None);
        assert_eq!(parse_ue("ue: x\n"), None);
    }

    #[test]
    fn nodes_problem_names_the_node() {
        let t = tempfile::tempdir().unwrap();
        let profile = crate::config::Config::builtin()
            .profile("enflame")
            .unwrap()
            .clone();
        let host = t.path().join("gcu1");
        let nodes = [Node {
            path: PathBuf::from("/dev/gcu1"),
            major: Some(240),
            minor: Some(1),
        }];
        let hosts = [host.clone()];
        let mut p = profile.clone();
        p.version_file = None;
        let why = nodes_problem(&p, &nodes, &hosts).unwrap();
        assert_eq!(why.text, format!("{}: does not exist", host.display()));
        assert_eq!(why.kind, Kind::DeviceNode);
        std::fs::write(&host, "").unwrap();
        let why = nodes_problem(&p, &nodes, &hosts).unwrap().text;
        assert!(why.ends_with("is not a character device"), "{why}");
        p.version_file = Some("/proc/driver/nowhere/version".into());
        let why = nodes_problem(&p, &nodes, &hosts).unwrap();
        assert_eq!(why.kind, Kind::DriverNotLoaded, "{why:?}");
    }
}
