//! kubelet: the CPU manager policy, the device checkpoint and device-plugin sockets.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use super::{Ctx, Finding, RUNTIME_BIN};
use crate::checkpoint::{self, compare, expected_ids, Checkpoint, Verdict};
use crate::config::Config;

/// Far above any kubelet config.yaml (a few KB); a bigger or endless file is a failed check
/// naming it, never read whole (issue 14, class 5).
const MAX_KUBELET_CONFIG: u64 = 16 << 20;
/// kubelet's CPU manager `static` policy rewrites containers' cgroups; devices that were
/// never in the OCI spec (a device plugin that sets only a variable, no device specs) are
/// lost then. Containers started through this runtime have them in the spec. Whether the
/// plugins pass device specs is read from the allocations in kubelet's checkpoint when there
/// are any; otherwise it can only be a warning.
pub fn check_cpu_manager(ctx: &Ctx, runtime_is_default: bool) -> Finding {
    const C: &str = "kubelet-cpu-manager";
    let file = ctx.path("/var/lib/kubelet/config.yaml");
    let text = match crate::bounded::read_text(&file, MAX_KUBELET_CONFIG) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Finding::info(C, "no kubelet config: not a Kubernetes node")
        }
        Err(e) => {
            return Finding::fail(
                C,
                format!("cannot read {}: {e}", file.display()),
                super::unreadable_fix(&file, &e, MAX_KUBELET_CONFIG),
            )
        }
    };
    let v: serde_yaml_ng::Value = match serde_yaml_ng::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return Finding::fail(
                C,
                format!("{} is not valid YAML: {e}", file.display()),
                format!("correct {}", file.display()),
            )
        }
    };
    let policy = v
        .get("cpuManagerPolicy")
        .and_then(|p| p.as_str())
        .unwrap_or("none");
    if policy != "static" {
        return Finding::ok(C, format!("cpuManagerPolicy {policy:?}"));
    }
    if runtime_is_default {
        return Finding::ok(C, format!("cpuManagerPolicy \"static\"; {RUNTIME_BIN} is containerd's default, so every container has its devices in its spec and keeps them when the CPU manager updates its cgroup"));
    }
    let entries: Vec<_> = Checkpoint::load(&ctx.path(checkpoint::DEFAULT_PATH))
        .map(|cp| cp.data.pod_device_entries.unwrap_or_default())
        .unwrap_or_default();
    let resources = |want: bool| -> std::collections::BTreeSet<String> {
        entries
            .iter()
            .filter(|e| e.passes_device_specs() == Some(want))
            .map(|e| e.resource_name.clone())
            .collect()
    };
    let (without, with) = (resources(false), resources(true));
    let fix = "run the device plugin with device specs (NVIDIA: PASS_DEVICE_SPECS=true / --pass-device-specs), or make the runtime the default: accel-ctk runtime configure --runtime containerd --set-as-default";
    if !without.is_empty() {
        let list: Vec<_> = without.into_iter().collect();
        return Finding::warn(
            C,
            format!("cpuManagerPolicy \"static\" and the device plugin(s) for {} pass no device specs (their allocations in kubelet's checkpoint carry none): containers started through {RUNTIME_BIN} are safe (it puts the devices in the OCI spec), containers started by another runtime lose device access at the CPU manager's next cgroup update", list.join(", ")),
            fix,
        );
    }
    if !with.is_empty() {
        return Finding::ok(C, "cpuManagerPolicy \"static\"; the device plugins pass device specs (kubelet's checkpoint), so containers keep their devices on cgroup updates");
    }
    Finding::warn(
        C,
        format!("cpuManagerPolicy \"static\": containers started through {RUNTIME_BIN} are safe (their devices are in the OCI spec, so cgroup updates keep them); containers started by another runtime from a device plugin that does not pass device specs lose device access at the CPU manager's next update (no allocation in kubelet's checkpoint to tell which kind this node's plugins are)"),
        fix,
    )
}

/// kubelet's device checkpoint names only devices this node has.
pub fn check_checkpoint(ctx: &Ctx, config: &Config) -> Finding {
    const C: &str = "kubelet-checkpoint";
    let file = ctx.path(checkpoint::DEFAULT_PATH);
    if !file.exists() {
        return Finding::ok(C, "no device checkpoint");
    }
    let fix = checkpoint::repair_advice(
        ctx.path("/").as_path(),
        (!ctx.is_real_root()).then_some(file.as_path()),
    );
    let cp = match Checkpoint::load(&file) {
        Ok(c) => c,
        Err(e) => {
            return Finding::fail(
                C,
                e.to_string(),
                format!(
                    "mv {} {}.bak && systemctl restart kubelet",
                    file.display(),
                    file.display()
                ),
            )
        }
    };
    let expected = match expected_ids(&config.profiles, &[]) {
        Ok(e) => e,
        Err(e) => {
            return Finding::warn(
                C,
                format!("cannot list this node's devices: {e}"),
                "accel-ctk list",
            )
        }
    };
    let found = expected.into_iter().map(|(r, (_, ids))| (r, ids)).collect();
    let reports = compare(&cp, &found);
    let stale: Vec<String> = reports
        .iter()
        .filter(|r| r.verdict == Verdict::Stale)
        .map(|r| {
            format!(
                "{} ({})",
                r.resource,
                r.unknown_registered
                    .iter()
                    .chain(&r.unknown_allocated)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    if !stale.is_empty() {
        return Finding::fail(
            C,
            format!(
                "{} names devices this node does not have: {}; pods using them fail to start",
                file.display(),
                stale.join("; ")
            ),
            fix,
        );
    }
    if let Some(r) = reports
        .iter()
        .find(|r| r.verdict == Verdict::NoDevicesFound)
    {
        return Finding::warn(
            C,
            format!(
                "{} names {} devices but none were found on this node",
                file.display(),
                r.resource
            ),
            "load the driver, then: accel-ctk checkpoint check",
        );
    }
    Finding::ok(C, format!("{} matches this node's devices", file.display()))
}

/// Sockets in kubelet's device-plugin dir that nobody listens on: a plugin restarting on the
/// same name fails with `bind: address already in use`.
pub fn check_plugin_sockets(ctx: &Ctx) -> Vec<Finding> {
    const C: &str = "device-plugin-sockets";
    let dir = ctx.path("/var/lib/kubelet/device-plugins");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut socks: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .collect();
    socks.sort();
    let mut out = Vec::new();
    let mut live = 0;
    for s in socks {
        match std::os::unix::net::UnixStream::connect(&s) {
            Ok(_) => live += 1,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => out.push(Finding::fail(
                C,
                format!("{} is left over with nothing listening: a plugin starting on it fails with `bind: address already in use`", s.display()),
                format!("rm {}", s.display()),
            )),
            Err(e) => out.push(Finding::warn(C, format!("{}: cannot connect: {e}", s.display()), format!("ls -l {}", s.display()))),
        }
    }
    if out.is_empty() && live > 0 {
        out.push(Finding::ok(C, format!("{live} socket(s), all listening")));
    }
    out
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::{load_config, Status};

    #[test]
    fn cpu_manager_policy() {
        let t = Tree::new();
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Info);
        let cfg = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n";
        t.write("/var/lib/kubelet/config.yaml", cfg);
        let f = check_cpu_manager(&t.ctx(), false);
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.message.contains("safe") && f.message.contains("device specs"),
            "{f:?}"
        );
        assert_eq!(check_cpu_manager(&t.ctx(), true).status, Status::Ok);
        // Allocations in the checkpoint tell which kind of plugin this is.
        let cp = |resp: &str| {
            format!(
                r#"{{"Data":{{"PodDeviceEntries":[{{"PodUID":"p","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":["GPU-a"],"AllocResp":"{resp}"}}]}},"Checksum":1}}"#
            )
        };
        t.write(checkpoint::DEFAULT_PATH, &cp("CgA="));
        let f = check_cpu_manager(&t.ctx(), false);
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.message.contains("nvidia.com/gpu pass no device specs"),
            "{f:?}"
        );
        t.write(checkpoint::DEFAULT_PATH, &cp("GgsKAS8SAS8aA3J3bQ=="));
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Ok);
        std::fs::remove_file(t.ctx().path(checkpoint::DEFAULT_PATH)).unwrap();
        t.write(
            "/var/lib/kubelet/config.yaml",
            &cfg.replace("static", "none"),
        );
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Ok);
        t.write(
            "/var/lib/kubelet/config.yaml",
            "cpuManagerPolicy: [static\n",
        );
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Fail);
    }

    #[test]
    fn stale_checkpoint() {
        let t = Tree::new();
        let (_, config) = load_config(&t.ctx());
        assert_eq!(check_checkpoint(&t.ctx(), &config).status, Status::Ok);
        t.nvidia_gpu("0000:3b:00.0", 0, "GPU-new");
        t.node("/dev/nvidia0", 195, 0);
        let cp = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-old"]}},"Checksum":1}"#;
        t.write(checkpoint::DEFAULT_PATH, cp);
        let f = check_checkpoint(&t.ctx(), &config);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.message.contains("GPU-old"));
        assert!(f
            .fix
            .unwrap()
            .starts_with("accel-ctk checkpoint check --fix"));
        t.write(checkpoint::DEFAULT_PATH, &cp.replace("GPU-old", "GPU-new"));
        assert_eq!(check_checkpoint(&t.ctx(), &config).status, Status::Ok);
        t.write(checkpoint::DEFAULT_PATH, "{");
        assert_eq!(check_checkpoint(&t.ctx(), &config).status, Status::Fail);
    }

    #[test]
    fn leftover_socket() {
        let t = Tree::new();
        let dir = t.ctx().path("/var/lib/kubelet/device-plugins");
        std::fs::create_dir_all(&dir).unwrap();
        let live = std::os::unix::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
        let f = check_plugin_sockets(&t.ctx());
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Ok);
        drop(std::os::unix::net::UnixListener::bind(dir.join("nvidia-gpu.sock")).unwrap());
        let f = check_plugin_sockets(&t.ctx());
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0].message.contains("nvidia-gpu.sock"));
        assert_eq!(
            f[0].fix.as_deref(),
            Some(format!("rm {}", dir.join("nvidia-gpu.sock").display()).as_str())
        );
        drop(live);
    }
}
