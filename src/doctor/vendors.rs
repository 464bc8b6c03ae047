//! Each vendor profile's driver, device nodes, and the nodes' `/dev/char/MAJOR:MINOR` links.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::system::{Exposure, CREATE_LINKS};
use super::{Ctx, Finding, Status};
use crate::discovery::{discover, driver_version};
use crate::profile::{Discovery, Profile};
use crate::topology::locate;

/// The kernel module a profile's version file belongs to (`/sys/module/<m>/version`).
fn module_name(p: &Profile) -> String {
    p.version_file
        .as_deref()
        .and_then(|v| v.strip_prefix("/sys/module").ok())
        .and_then(|rest| rest.iter().next())
        .and_then(|m| m.to_str())
        .unwrap_or(&p.name)
        .to_string()
}

/// Driver loaded and device nodes present. A vendor with no trace at all (no version file,
/// no control node, no device) is not on this node: info, not a failure. A partial trace is.
pub fn check_driver(profile: &Profile) -> Finding {
    let check = format!("driver/{}", profile.name);
    let c = check.as_str();
    let devices = match discover(profile) {
        Ok(d) => d,
        Err(e) => return Finding::fail(c, e.to_string(), "reload the driver: check `dmesg`"),
    };
    let version = driver_version(profile);
    let version_file = profile
        .version_file
        .as_ref()
        .map(|v| (v, Profile::under(&profile.driver_root, v).exists()));
    let control = profile
        .control_nodes
        .iter()
        .any(|n| Profile::under(profile.dev_root(), n).exists());
    let module = module_name(profile);
    let loaded = version_file.is_none_or(|(_, exists)| exists);
    if devices.is_empty() {
        if !control && !version_file.is_some_and(|(_, e)| e) {
            return Finding::info(
                c,
                format!(
                    "not present (no driver, no devices under {})",
                    profile.driver_root.display()
                ),
            );
        }
        let detail = match version_file {
            Some((v, true)) => format!("the driver is loaded ({} exists)", v.display()),
            Some((v, false)) => format!("{} is missing but control nodes exist", v.display()),
            None => "control nodes exist".into(),
        };
        let fix = match &profile.discovery {
            Discovery::NvidiaProcfs { .. } if loaded => {
                "dmesg | grep -i nvrm   (the driver bound no GPU: see why)".to_string()
            }
            _ if loaded => "udevadm trigger --action=add && udevadm settle".to_string(),
            _ => format!("modprobe {module}"),
        };
        return Finding::fail(c, format!("{detail} but no device was found"), fix);
    }
    let located: Vec<_> = devices.into_iter().map(|d| locate(profile, d)).collect();
    let missing: Vec<_> = located
        .iter()
        .flat_map(|d| d.nodes.iter().take(1).map(move |n| (d, n)))
        .filter(|(_, n)| n.major.is_none())
        .collect();
    if let Some((d, n)) = missing.first() {
        let names: Vec<String> = missing
            .iter()
            .map(|(_, n)| n.path.display().to_string())
            .collect();
        let fix = match (&profile.discovery, d.device.minor) {
            (Discovery::NvidiaProcfs { .. }, Some(minor)) => {
                format!("nvidia-modprobe -u -c {minor}")
            }
            _ => format!(
                "udevadm trigger --action=add && udevadm settle   (creates {})",
                n.path.display()
            ),
        };
        return Finding::fail(
            c,
            format!(
                "{} device(s) known to the driver but node(s) missing: {}",
                located.len(),
                names.join(", ")
            ),
            fix,
        );
    }
    if let Some((v, false)) = version_file {
        return Finding::fail(
            c,
            format!(
                "{} device node(s) exist but {} is missing: the kernel module is not loaded (stale nodes?)",
                located.len(),
                v.display()
            ),
            format!("modprobe {module}"),
        );
    }
    Finding::ok(
        c,
        format!(
            "{} device(s), driver {}",
            located.len(),
            version.as_deref().unwrap_or("version unknown")
        ),
    )
}
/// What `/dev/char/MAJOR:MINOR` is for one device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// A link that resolves to a character device of this number.
    Ok,
    Missing,
    /// Something else: a link to another device or to nothing, or not a link (what it is).
    Wrong(String),
}

/// Reads `/dev/char/MAJOR:MINOR` under `root` with readlink and compares what it resolves to
/// (under `root` as well) with the node's device number. Not `devchar::state`: that one is
/// for the host the links are made on and follows an absolute target there, where the
/// doctor's `--root` may be another node's tree whose `/dev/nvidia1` is under that root.
fn dev_char_link_state(root: &Path, major: u64, minor: u64) -> LinkState {
    let host_dir = Path::new("/dev/char");
    let link = Profile::under(root, &host_dir.join(format!("{major}:{minor}")));
    let target = match std::fs::read_link(&link) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return LinkState::Missing,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            return LinkState::Wrong("not a symlink".into())
        }
        Err(e) => return LinkState::Wrong(format!("unreadable: {e}")),
    };
    // An absolute target is a host path; a relative one is relative to /dev/char.
    let resolved = Profile::under(root, &host_dir.join(&target));
    let want = nix::sys::stat::makedev(major, minor);
    match std::fs::metadata(&resolved) {
        Ok(m) if m.file_type().is_char_device() && m.rdev() == want => LinkState::Ok,
        Ok(m) if m.file_type().is_char_device() => LinkState::Wrong(format!(
            "points at {} ({}:{})",
            target.display(),
            nix::sys::stat::major(m.rdev()),
            nix::sys::stat::minor(m.rdev())
        )),
        Ok(_) => LinkState::Wrong(format!(
            "points at {}, not a character device",
            target.display()
        )),
        Err(_) => LinkState::Wrong(format!(
            "points at {}, which does not exist",
            target.display()
        )),
    }
}

/// One profile's character device nodes on this node and their links.
#[derive(Debug, Clone)]
pub struct Links {
    pub profile: String,
    /// (container path, major, minor, state), every present character node of the profile:
    /// its devices' nodes, control nodes and capability nodes.
    pub nodes: Vec<(PathBuf, u64, u64, LinkState)>,
}

impl Links {
    pub fn missing(&self) -> usize {
        self.nodes
            .iter()
            .filter(|(.., s)| *s != LinkState::Ok)
            .count()
    }
}

/// The links of every character node `profile` knows and the host has.
pub fn dev_char_links(ctx: &Ctx, profile: &Profile) -> Links {
    let mut paths: Vec<PathBuf> = discover(profile)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|d| d.nodes)
        .collect();
    paths.extend(profile.control_nodes.iter().cloned());
    paths.extend(
        profile
            .capabilities
            .values()
            .flat_map(|c| c.nodes.iter().cloned()),
    );
    let mut nodes = Vec::new();
    for p in paths {
        let Ok(m) = std::fs::metadata(Profile::under(profile.dev_root(), &p)) else {
            continue;
        };
        if !m.file_type().is_char_device() {
            continue;
        }
        let (major, minor) = (
            nix::sys::stat::major(m.rdev()),
            nix::sys::stat::minor(m.rdev()),
        );
        if nodes.iter().any(|(_, a, b, _)| (*a, *b) == (major, minor)) {
            continue;
        }
        let state = dev_char_link_state(&ctx.root, major, minor);
        nodes.push((p, major, minor, state));
    }
    Links {
        profile: profile.name.clone(),
        nodes,
    }
}

/// Missing or wrong `/dev/char` links, graded by whether this node needs them now: a
/// failure where the systemd cgroup driver and this runc/systemd drop rules without them,
/// information elsewhere (they cost nothing and protect a later switch to systemd).
pub fn check_dev_char_links(links: &Links, x: &Exposure) -> Option<Finding> {
    let check = format!("dev-char/{}", links.profile);
    if links.nodes.is_empty() {
        return None;
    }
    let bad: Vec<String> = links
        .nodes
        .iter()
        .filter_map(|(p, a, b, s)| match s {
            LinkState::Ok => None,
            LinkState::Missing => Some(format!("/dev/char/{a}:{b} (for {})", p.display())),
            LinkState::Wrong(why) => Some(format!("/dev/char/{a}:{b} {why} (for {})", p.display())),
        })
        .collect();
    if bad.is_empty() {
        return Some(Finding::ok(
            &check,
            format!(
                "{} device node(s), each with its /dev/char link",
                links.nodes.len()
            ),
        ));
    }
    let msg = format!(
        "{} of {} device node(s) have no /dev/char/MAJOR:MINOR link: {}",
        bad.len(),
        links.nodes.len(),
        bad.join(", ")
    );
    let (status, msg) = if x.links_needed() {
        (
            Status::Fail,
            format!("{msg}; with the systemd cgroup driver here ({}), `systemctl daemon-reload` takes these devices from running containers", x.describe_drivers()),
        )
    } else if x.systemd_driver() {
        (
            Status::Info,
            format!("{msg}; this runc and systemd keep device rules without them, but older ones and other tools do not"),
        )
    } else {
        (
            Status::Info,
            format!("{msg}; not needed with the cgroupfs driver used here, only if an engine moves to the systemd driver"),
        )
    };
    Some(Finding::new(
        &check,
        status,
        msg,
        Some(CREATE_LINKS.to_string()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::{CgroupDriver, CgroupVersion, Status, System};

    #[test]
    fn driver_states() {
        let t = Tree::new();
        let f = check_driver(&t.profile("nvidia"));
        assert_eq!(f.status, Status::Info, "{f:?}");
        let mut bare = t.profile("enflame");
        bare.version_file = None;
        assert_eq!(check_driver(&bare).status, Status::Info);
        // A control node alone is a partial trace.
        t.node("/dev/gcuctl", 240, 255);
        assert_eq!(check_driver(&bare).status, Status::Fail);
        std::fs::remove_file(t.ctx().path("/dev/gcuctl")).unwrap();

        // Module loaded, no GPU bound.
        t.write(
            "/proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Kernel Module  550.54.14\n",
        );
        assert_eq!(check_driver(&t.profile("nvidia")).status, Status::Fail);

        // GPU known to the driver, node missing.
        t.nvidia_gpu("0000:3b:00.0", 3, "GPU-a");
        let f = check_driver(&t.profile("nvidia"));
        assert_eq!(f.status, Status::Fail);
        assert!(f.message.contains("/dev/nvidia3"), "{f:?}");
        assert_eq!(f.fix.as_deref(), Some("nvidia-modprobe -u -c 3"));

        t.node("/dev/nvidia3", 195, 3);
        let f = check_driver(&t.profile("nvidia"));
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.message.contains("550.54.14"));

        // Enflame: a node but no module.
        t.node("/dev/gcu0", 240, 0);
        let f = check_driver(&t.profile("enflame"));
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert_eq!(f.fix.as_deref(), Some("modprobe enflame"));
        t.write("/sys/module/enflame/version", "1.0.0\n");
        assert_eq!(check_driver(&t.profile("enflame")).status, Status::Ok);
    }

    fn exposure(driver: CgroupDriver, runc: (u64, u64, u64)) -> Exposure {
        Exposure {
            system: System {
                cgroup: CgroupVersion::V2,
                systemd_init: true,
                systemd_version: Some(252),
            },
            drivers: vec![("docker", driver, "test".into())],
            runc: Some(runc),
        }
    }

    #[test]
    fn dev_char_links_missing_wrong_and_present() {
        let t = Tree::new();
        t.nvidia_gpu("0000:3b:00.0", 0, "GPU-a");
        t.nvidia_gpu("0000:af:00.0", 1, "GPU-b");
        t.node("/dev/nvidia0", 195, 0);
        t.node("/dev/nvidia1", 195, 1);
        t.node("/dev/nvidiactl", 195, 255);
        let p = t.profile("nvidia");
        let links = dev_char_links(&t.ctx(), &p);
        assert_eq!(links.nodes.len(), 3, "{links:?}");
        assert_eq!(links.missing(), 3);
        let bug = exposure(CgroupDriver::Systemd, (1, 1, 5));
        let f = check_dev_char_links(&links, &bug).unwrap();
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(
            f.message.contains("/dev/char/195:0 (for /dev/nvidia0)"),
            "{f:?}"
        );
        assert_eq!(f.fix.as_deref(), Some(CREATE_LINKS));
        // The same node on cgroupfs: information only.
        let f = check_dev_char_links(&links, &exposure(CgroupDriver::Cgroupfs, (1, 1, 5))).unwrap();
        assert_eq!(f.status, Status::Info, "{f:?}");

        let dir = t.ctx().path("/dev/char");
        std::fs::create_dir_all(&dir).unwrap();
        // udev's relative form, an absolute one, and one pointing at the wrong device.
        std::os::unix::fs::symlink("../nvidia0", dir.join("195:0")).unwrap();
        std::os::unix::fs::symlink("/dev/nvidia1", dir.join("195:1")).unwrap();
        std::os::unix::fs::symlink("../nvidia0", dir.join("195:255")).unwrap();
        let links = dev_char_links(&t.ctx(), &p);
        assert_eq!(links.missing(), 1, "{links:?}");
        let f = check_dev_char_links(&links, &bug).unwrap();
        assert!(
            f.message.contains("195:255 points at ../nvidia0 (195:0)"),
            "{f:?}"
        );
        std::fs::remove_file(dir.join("195:255")).unwrap();
        std::os::unix::fs::symlink("../nvidiactl", dir.join("195:255")).unwrap();
        let f = check_dev_char_links(&dev_char_links(&t.ctx(), &p), &bug).unwrap();
        assert_eq!(f.status, Status::Ok, "{f:?}");
        // A vendor with no nodes on this node says nothing.
        let none = dev_char_links(&t.ctx(), &t.profile("enflame"));
        assert!(check_dev_char_links(&none, &bug).is_none());
    }
}
