//! Each vendor profile's driver and device nodes.

use super::Finding;
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::Status;

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
}
