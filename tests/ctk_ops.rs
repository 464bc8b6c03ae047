//! The operator subcommands (`list`, `doctor`, `checkpoint check`), run as the real
//! `accel-ctk` binary against a simulated node: a temp dir with NVIDIA's procfs files, device
//! nodes made with mknod (real majors), a sysfs PCI tree of directories and relative symlinks,
//! and a config.toml pointing every profile's driver-root at it.
//!
//! Needs root for mknod; CI runs as root and a non-root run fails loudly.

mod common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use common::{mknod, CTK};

const UUID1: &str = "GPU-8e5b1f3a-0000-4000-8000-000000000001";
const UUID2: &str = "GPU-8e5b1f3a-0000-4000-8000-000000000002";
const UUID3: &str = "GPU-8e5b1f3a-0000-4000-8000-000000000003";
const UUID4: &str = "GPU-8e5b1f3a-0000-4000-8000-000000000004";

struct Node {
    dir: tempfile::TempDir,
}

/// `sys/devices/<chain>/<bdf>` plus the `sys/bus/pci/devices/<bdf>` link, as the kernel has them.
fn pci(root: &Path, chain: &[&str], bdf: &str, numa: i32) -> PathBuf {
    let mut rel = PathBuf::from("../../../devices");
    rel.extend(chain);
    rel.push(bdf);
    let links = root.join("sys/bus/pci/devices");
    let real = links.join(&rel);
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("numa_node"), format!("{numa}\n")).unwrap();
    symlink(&rel, links.join(bdf)).unwrap();
    real
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let n = Node { dir };
        std::fs::create_dir_all(n.root().join("sys/bus/pci/devices")).unwrap();
        let cfg = format!(
            "profiles-dir = \"{r}/etc/accel-container-runtime/profiles.d\"\nhost-dev-dir = \"{r}/dev\"\n\
             [profiles.nvidia]\ndriver-root = \"{r}\"\n\
             [profiles.enflame]\ndriver-root = \"{r}\"\n",
            r = n.root().display()
        );
        let etc = n.root().join("etc/accel-container-runtime");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("config.toml"), cfg).unwrap();
        n
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self) -> PathBuf {
        self.root().join("etc/accel-container-runtime/config.toml")
    }

    fn nvidia(&self, bus: &str, minor: u32, uuid: &str, chain: &[&str], numa: i32) {
        let d = self.root().join("proc/driver/nvidia/gpus").join(bus);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("information"),
            format!("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t\t {uuid}\nVideo BIOS: \t\t 96.00.74.00.0d\nBus Type: \t\t PCIe\nDMA Size: \t\t 52 bits\nBus Location: \t\t {bus}\nDevice Minor: \t\t {minor}\n"),
        )
        .unwrap();
        std::fs::write(
            self.root().join("proc/driver/nvidia/version"),
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n",
        )
        .unwrap();
        mknod(
            &self.root().join(format!("dev/nvidia{minor}")),
            195,
            minor,
            0o666,
        );
        pci(self.root(), chain, bus, numa);
    }

    /// An Enflame GCU: its node, and its class device under the PCI function as the driver
    /// registers it, reachable from `/sys/dev/char/<major>:<minor>`.
    fn enflame(&self, index: u32, bdf: &str, chain: &[&str], numa: i32) {
        mknod(
            &self.root().join(format!("dev/gcu{index}")),
            240,
            index,
            0o666,
        );
        let real = pci(self.root(), chain, bdf, numa);
        let class = real.join(format!("enflame/gcu{index}"));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join("dev"), format!("240:{index}\n")).unwrap();
        let chardir = self.root().join("sys/dev/char");
        std::fs::create_dir_all(&chardir).unwrap();
        let mut rel = PathBuf::from("../../devices");
        rel.extend(chain);
        rel.push(bdf);
        rel.push(format!("enflame/gcu{index}"));
        symlink(rel, chardir.join(format!("240:{index}"))).unwrap();
        let module = self.root().join("sys/module/enflame");
        std::fs::create_dir_all(&module).unwrap();
        std::fs::write(module.join("version"), "1.2.3\n").unwrap();
    }

    /// Two GPUs behind one PCIe switch on NUMA 0, one GCU on its own root port on NUMA 1.
    fn standard(uuids: [&str; 2]) -> Node {
        let n = Node::new();
        let sw = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"];
        n.nvidia(
            "0000:03:00.0",
            0,
            uuids[0],
            &[&sw[..], &["0000:02:08.0"]].concat(),
            0,
        );
        n.nvidia(
            "0000:04:00.0",
            1,
            uuids[1],
            &[&sw[..], &["0000:02:10.0"]].concat(),
            0,
        );
        n.enflame(0, "0000:81:00.0", &["pci0000:80", "0000:80:02.0"], 1);
        n
    }

    fn ctk(&self, args: &[&str]) -> Output {
        self.ctk_env(args, &[])
    }

    fn ctk_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let out = std::process::Command::new(&*CTK)
            .args(args)
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", self.config())
            .envs(env.iter().copied())
            .output()
            .unwrap();
        eprintln!(
            "accel-ctk {args:?} -> {:?}\n--- stdout\n{}--- stderr\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `accel-ctk checkpoint check <flags> --checkpoint <cp>`.
    fn check(&self, cp: &Path, flags: &[&str]) -> Output {
        self.check_env(cp, flags, &[])
    }

    fn check_env(&self, cp: &Path, flags: &[&str], env: &[(&str, &str)]) -> Output {
        let mut args = vec!["checkpoint", "check"];
        args.extend_from_slice(flags);
        args.extend(["--checkpoint", cp.to_str().unwrap()]);
        self.ctk_env(&args, env)
    }

    /// `accel-ctk doctor --root <node> <flags>`, with the config path as seen under `--root`.
    fn doctor(&self, flags: &[&str]) -> Output {
        let mut args = vec!["doctor", "--root", self.root().to_str().unwrap()];
        args.extend_from_slice(flags);
        self.ctk_env(
            &args,
            &[(
                "ACCEL_CONTAINER_RUNTIME_CONFIG",
                "/etc/accel-container-runtime/config.toml",
            )],
        )
    }

    /// Copies a fixture checkpoint into the node's kubelet dir.
    fn checkpoint(&self, fixture: &str) -> PathBuf {
        let dir = self.root().join("var/lib/kubelet/device-plugins");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubelet_internal_checkpoint");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/checkpoint")
                .join(fixture),
            &path,
        )
        .unwrap();
        path
    }
}

fn backups(cp: &Path) -> Vec<PathBuf> {
    let name = cp.file_name().unwrap().to_str().unwrap().to_string();
    let mut v: Vec<PathBuf> = std::fs::read_dir(cp.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&format!("{name}.bak-"))
        })
        .collect();
    v.sort();
    v
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

#[test]
fn list_json_has_nodes_numa_and_shared_switch() {
    let n = Node::standard([UUID1, UUID2]);
    let out = n.ctk(&["list", "--json"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 3, "{v:#}");
    let gpu1 = &devs[1];
    assert_eq!(gpu1["vendor"], "nvidia");
    assert_eq!(gpu1["index"], 1);
    assert_eq!(gpu1["uuid"], UUID2);
    assert_eq!(gpu1["pci_bus_id"], "0000:04:00.0");
    assert_eq!(gpu1["numa_node"], 0);
    assert_eq!(gpu1["pci_root"], "pci0000:00");
    assert_eq!(gpu1["switch"], "0000:01:00.0");
    assert_eq!(gpu1["driver_version"], "550.54.14");
    assert_eq!(
        gpu1["nodes"],
        serde_json::json!([{"path": "/dev/nvidia1", "major": 195, "minor": 1}])
    );
    assert_eq!(devs[0]["switch"], "0000:01:00.0");
    let gcu = &devs[2];
    assert_eq!(gcu["vendor"], "enflame");
    assert_eq!(
        gcu["pci_bus_id"], "0000:81:00.0",
        "bus id from /sys/dev/char/240:0"
    );
    assert_eq!(gcu["numa_node"], 1);
    assert_eq!(gcu["switch"], Value::Null, "alone under its root port");
    assert_eq!(gcu["uuid"], Value::Null);
    assert_eq!(gcu["driver_version"], "1.2.3");
    // Stable names: the DRA name from the node's number, what answers and CDI name it by.
    assert_eq!(gcu["name"], "gcu-0");
    assert_eq!(gcu["stable_id"], "0");
    assert_eq!(gpu1["name"], "gpu-1");
    assert_eq!(gpu1["stable_id"], UUID2);
    assert_eq!(v["errors"], serde_json::json!([]));
}

/// Issue 41: each device's health from the health engine at this one look: a GPU whose PCI
/// function's config space reads all ones (fallen off the bus) is unhealthy with why (the
/// line, its severity and short name), in the JSON and the table; the others healthy.
#[test]
fn list_shows_a_gpu_whose_config_space_reads_all_ones_unhealthy() {
    let n = Node::standard([UUID1, UUID2]);
    let out = n.ctk(&["list", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devs = v["devices"].as_array().unwrap();
    assert!(
        devs.iter()
            .all(|d| d["healthy"] == true && d["health_reason"].is_null()),
        "{v:#}"
    );

    std::fs::write(
        n.root().join("sys/bus/pci/devices/0000:04:00.0/config"),
        [0xff; 64],
    )
    .unwrap();
    let out = n.ctk(&["list", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devs = v["devices"].as_array().unwrap();
    let why = "PCI function 0000:04:00.0 reads all ones (fallen off the bus)";
    assert_eq!(devs[1]["name"], "gpu-1");
    assert_eq!(devs[1]["healthy"], false, "{v:#}");
    assert_eq!(devs[1]["health_reason"], why);
    assert_eq!(devs[1]["health_severity"], "gone", "{v:#}");
    assert_eq!(devs[1]["health_label"], "fallen-off-the-bus", "{v:#}");
    assert!(devs[0]["health_label"].is_null(), "{v:#}");
    let since = devs[1]["unhealthy_since"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(since <= now && since + 60 > now, "{since} {now}");
    assert!(devs[0]["unhealthy_since"].is_null(), "{v:#}");
    assert!(
        devs[0]["healthy"] == true && devs[2]["healthy"] == true,
        "{v:#}"
    );
    let out = n.ctk(&["list"]);
    let t = String::from_utf8(out.stdout).unwrap();
    assert!(
        t.contains("unhealthy since 20") && t.contains(&format!("Z: {why}")),
        "{t}"
    );
    assert_eq!(t.matches("  healthy\n").count(), 2, "{t}");
}

#[test]
fn list_table_groups_by_switch_and_numa() {
    let n = Node::standard([UUID1, UUID2]);
    let out = n.ctk(&["list"]);
    assert!(out.status.success());
    let t = String::from_utf8(out.stdout).unwrap();
    assert!(t.starts_with("VENDOR"), "{t}");
    assert!(t.contains("/dev/nvidia0 (195:0)"), "{t}");
    assert!(t.contains("/dev/gcu0 (240:0)"), "{t}");
    // Devices by their stable names: NVIDIA's by minor, Enflame's by node number.
    assert!(t.contains("S1 = 0000:01:00.0: gpu-0, gpu-1"), "{t}");
    assert!(t.contains("  0: gpu-0, gpu-1\n  1: gcu-0"), "{t}");
}

#[test]
fn checkpoint_consistent_changes_nothing() {
    let n = Node::standard([UUID1, UUID2]);
    for fixture in ["list-form.json", "numa-form-several.json"] {
        let cp = n.checkpoint(fixture);
        let before = std::fs::read(&cp).unwrap();
        let out = n.check(&cp, &["--fix"]);
        assert_eq!(out.status.code(), Some(0), "{fixture}");
        assert_eq!(
            std::fs::read(&cp).unwrap(),
            before,
            "{fixture}: bytes changed"
        );
        assert!(backups(&cp).is_empty(), "{fixture}: backup made");
        let lines = json_lines(&out);
        let last = lines.last().unwrap();
        assert_eq!(last["verdict"], "consistent", "{fixture}");
        assert!(lines.iter().any(|l| l["step"] == "found"
            && l["resource"] == "nvidia.com/gpu"
            && l["ids"] == serde_json::json!([UUID1, UUID2])));
    }
}

#[test]
fn checkpoint_changed_uuids_fixed_with_backup() {
    // The board was swapped: the node's GPUs now have new UUIDs.
    let n = Node::standard([UUID3, UUID4]);
    let cp = n.checkpoint("list-form.json");
    let before = std::fs::read(&cp).unwrap();

    // Without --fix: reported, exit 1, untouched.
    let out = n.check(&cp, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&cp).unwrap(), before);
    assert!(backups(&cp).is_empty());
    let lines = json_lines(&out);
    assert!(lines.iter().any(|l| l["step"] == "allocated"
        && l["pod_uid"] == "6b3f2a9e-1c4d-4e8f-9a0b-1c2d3e4f5a6b"
        && l["ids"] == serde_json::json!([UUID1])));
    assert!(lines
        .iter()
        .any(|l| l["verdict"] == "stale" && l["resource"] == "nvidia.com/gpu"));

    let out = n.check(&cp, &["--fix"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!cp.exists(), "stale checkpoint still in place");
    let b = backups(&cp);
    assert_eq!(b.len(), 1);
    assert_eq!(std::fs::read(&b[0]).unwrap(), before);
    let last = json_lines(&out).pop().unwrap();
    assert_eq!(last["verdict"], "repaired");
    assert_eq!(last["backup"], b[0].to_str().unwrap());
}

/// kubelet v1.34.2's own file after a board swap (tests/fixtures/kubelet-checkpoints): --fix
/// drops exactly the pod entry naming the old GPU, keeps the registered resource, and writes
/// the checksum kubelet computes; a second check finds it consistent.
#[test]
fn checkpoint_fix_keeps_kubelet_file_with_its_checksum() {
    use accel_container_runtime::checkpoint::{kubelet_checksum, Checkpoint};
    let new = [
        "GPU-99999999-2222-3333-4444-555555555555",
        "GPU-bbbbbbbb-bbbb-cccc-dddd-ffffffffffff",
    ];
    let n = Node::standard(new);
    let cp = n.checkpoint("../kubelet-checkpoints/stale-after-uuid-change.json");
    let before = std::fs::read(&cp).unwrap();
    let out = n.check(&cp, &["--fix"]);
    assert_eq!(out.status.code(), Some(0));
    let last = json_lines(&out).pop().unwrap();
    assert_eq!(last["verdict"], "repaired");
    assert_eq!(
        last["removed"][0]["ids"],
        serde_json::json!(["GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"])
    );
    let b = backups(&cp);
    assert_eq!(b.len(), 1);
    assert_eq!(std::fs::read(&b[0]).unwrap(), before);
    let fixed = Checkpoint::load(&cp).unwrap();
    assert_eq!(
        fixed.data.pod_device_entries.as_deref().map(<[_]>::len),
        Some(0)
    );
    assert_eq!(fixed.registered("nvidia.com/gpu"), new);
    assert_eq!(fixed.checksum, kubelet_checksum(&fixed.data).map(u64::from));
    let out = n.check(&cp, &[]);
    assert_eq!(out.status.code(), Some(0), "consistent after the repair");
}

#[test]
fn checkpoint_numa_form_several_resources() {
    let n = Node::standard([UUID3, UUID4]);
    let cp = n.checkpoint("numa-form-several.json");
    let before = std::fs::read(&cp).unwrap();
    // enflame.com/gcu alone is consistent (GCU-0 is still there) ...
    let out = n.check(&cp, &["--fix", "--resource", "enflame.com/gcu"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(std::fs::read(&cp).unwrap(), before);
    // ... but all resources together are not: the NUMA-keyed GPU allocation is stale.
    let out = n.check(&cp, &[]);
    assert_eq!(out.status.code(), Some(1));
    let lines = json_lines(&out);
    let verdict = |r: &str| {
        lines
            .iter()
            .find(|l| l["step"] == "verdict" && l["resource"] == r)
            .map(|l| l["verdict"].clone())
    };
    assert_eq!(verdict("nvidia.com/gpu"), Some("stale".into()));
    assert_eq!(verdict("enflame.com/gcu"), Some("consistent".into()));
    assert_eq!(verdict("rdma/hca_shared_devices_a"), None, "not ours");
    assert!(lines.iter().any(|l| l["step"] == "allocated"
        && l["container"] == "infer"
        && l["ids"] == serde_json::json!([UUID2])));
    assert_eq!(std::fs::read(&cp).unwrap(), before);
}

#[test]
fn checkpoint_fix_restarts_kubelet_through_systemctl() {
    let n = Node::standard([UUID3, UUID4]);
    let cp = n.checkpoint("list-form.json");
    // A stand-in systemctl first on PATH records its arguments.
    let bin = n.root().join("fakebin");
    let record = n.root().join("systemctl.args");
    put(
        n.root(),
        "/fakebin/systemctl",
        &format!("#!/bin/sh\necho \"$@\" > {}\n", record.display()),
        0o755,
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = n.check_env(&cp, &["--fix", "--restart-kubelet"], &[("PATH", &path)]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(record).unwrap(),
        "restart kubelet\n"
    );
    assert!(!cp.exists());
}

#[test]
fn checkpoint_malformed_is_error_and_untouched() {
    let n = Node::standard([UUID3, UUID4]);
    let cp = n.checkpoint("malformed.json");
    let before = std::fs::read(&cp).unwrap();
    let out = n.check(&cp, &["--fix"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(cp.to_str().unwrap()) && err.contains("untouched"),
        "{err}"
    );
    assert_eq!(std::fs::read(&cp).unwrap(), before);
    assert!(backups(&cp).is_empty());
}

#[test]
fn checkpoint_unknown_resource_is_error() {
    let n = Node::standard([UUID1, UUID2]);
    let cp = n.checkpoint("list-form.json");
    let out = n.check(&cp, &["--resource", "example.com/fpga"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("example.com/fpga"));
}

/// A healthy node under `--root`: every check passes; then two typical breakages each fail
/// their check and the exit status.
#[test]
fn doctor_root_healthy_then_broken() {
    let n = Node::standard([UUID1, UUID2]);
    let root = n.root();
    // Under --root the config uses the node's own paths: driver-root "/" is the root.
    put(
        root,
        "/etc/accel-container-runtime/config.toml",
        "log-level = \"info\"\n",
        0o644,
    );
    put(root, "/usr/bin/accel-container-runtime", "", 0o755);
    put(
        root,
        "/usr/sbin/runc",
        "#!/bin/sh\necho 'runc version 1.1.12'\necho 'spec: 1.0.2-dev'\n",
        0o755,
    );
    put(
        root,
        "/etc/docker/daemon.json",
        r#"{"default-runtime":"accel","runtimes":{"accel":{"path":"/usr/bin/accel-container-runtime"}},"log-driver":"json-file"}"#,
        0o644,
    );
    put(
        root,
        "/etc/containerd/config.toml",
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\ndefault_runtime_name = \"accel\"\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.accel]\nruntime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.accel.options]\nBinaryName = \"/usr/bin/accel-container-runtime\"\n",
        0o644,
    );
    put(
        root,
        "/var/lib/kubelet/config.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\n",
        0o644,
    );
    n.checkpoint("numa-form-several.json");
    let plugins = root.join("var/lib/kubelet/device-plugins");
    let _kubelet = std::os::unix::net::UnixListener::bind(plugins.join("kubelet.sock")).unwrap();

    let status_of = |v: &Value, check: &str| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|f| f["check"] == check)
            .map(|f| f["status"].as_str().unwrap().to_string())
            .collect()
    };
    let out = n.doctor(&["--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for f in v.as_array().unwrap() {
        // Facts (cgroup layout, links that cgroupfs does not need) are information.
        assert!(
            f["status"] == "ok" || f["status"] == "info",
            "healthy node, yet {}: {} ({})",
            f["check"],
            f["status"],
            f["message"]
        );
    }
    for check in [
        "config",
        "driver/nvidia",
        "driver/enflame",
        "runtime-binary",
        "low-level-runtime",
        "docker",
        "containerd",
        "kubelet-cpu-manager",
        "kubelet-checkpoint",
        "device-plugin-sockets",
    ] {
        assert_eq!(status_of(&v, check), ["ok"], "{check}");
    }
    for check in ["cgroups", "systemd", "dev-char/nvidia", "dev-char/enflame"] {
        assert_eq!(status_of(&v, check), ["info"], "{check}");
    }
    assert_eq!(out.status.code(), Some(0));

    // The node comes back with other GPUs, and a plugin died leaving its socket.
    std::fs::write(
        root.join("proc/driver/nvidia/gpus/0000:03:00.0/information"),
        format!("GPU UUID: {UUID3}\nBus Location: 0000:03:00.0\nDevice Minor: 0\n"),
    )
    .unwrap();
    drop(std::os::unix::net::UnixListener::bind(plugins.join("nvidia-gpu.sock")).unwrap());
    let out = n.doctor(&["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status_of(&v, "kubelet-checkpoint"), ["fail"]);
    assert_eq!(status_of(&v, "device-plugin-sockets"), ["fail"]);
    assert_eq!(status_of(&v, "docker"), ["ok"]);

    // The plain-text form names the fix; `--restart-kubelet` only where kubelet is a systemd
    // unit (issue 22, 10: the advice was given on nodes whose kubelet systemd does not run).
    let out = n.doctor(&[]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("fix: accel-ctk checkpoint check --fix --checkpoint ")
            && text.contains(
                ", then restart kubelet the way this node runs it (no kubelet.service unit)"
            )
            && !text.contains("--restart-kubelet"),
        "{text}"
    );
    std::fs::create_dir_all(root.join("run/systemd/system")).unwrap();
    put(
        root,
        "/lib/systemd/system/kubelet.service",
        "[Service]\n",
        0o644,
    );
    let out = n.doctor(&[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("fix: accel-ctk checkpoint check --fix --restart-kubelet --checkpoint "),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fix: rm {}",
            plugins.join("nvidia-gpu.sock").display()
        )),
        "{text}"
    );
    assert!(text.contains("2 problem(s)"), "{text}");
}

/// The boot unit runs the repair before kubelet without restarting it, and the DaemonSet
/// ships exactly that unit, installs the binary from its image onto the host and enables the
/// unit without a daemon-reload.
#[test]
fn packaging_unit_and_daemonset() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging");
    let unit = std::fs::read_to_string(dir.join("systemd/accel-ctk-checkpoint.service")).unwrap();
    let key = |k: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(String::from)
            .collect()
    };
    assert_eq!(key("Type"), ["oneshot"]);
    assert_eq!(key("Before"), ["kubelet.service"]);
    assert_eq!(
        key("ExecStart"),
        ["/usr/bin/accel-ctk checkpoint check --fix"]
    );
    assert_eq!(key("WantedBy"), ["multi-user.target kubelet.service"]);

    let text = std::fs::read_to_string(
        dir.join("kubernetes/components/checkpoint/accel-ctk-checkpoint.yaml"),
    )
    .unwrap();
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 2);
    let cm = &docs[0];
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(
        cm["data"]["accel-ctk-checkpoint.service"].as_str().unwrap(),
        unit,
        "the DaemonSet's copy of the unit drifted from packaging/systemd"
    );
    let ds = &docs[1];
    assert_eq!(ds["kind"], "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let init = &pod["initContainers"][0];
    assert_eq!(init["securityContext"]["privileged"], true);
    let script = init["args"][0].as_str().unwrap();
    assert!(script.contains("/host/usr/local/bin/accel-ctk"), "{script}");
    assert!(
        script.contains("chroot /host systemctl --no-reload enable accel-ctk-checkpoint.service")
    );
    assert!(!script.contains("daemon-reload"));
    let host = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "host")
        .unwrap();
    assert_eq!(host["hostPath"]["path"], "/");
    let cm_vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "unit")
        .unwrap();
    assert_eq!(cm_vol["configMap"]["name"], cm["metadata"]["name"]);
}

/// Issue 13: `accel-ctk system create-dev-char-symlinks` links every node of every profile
/// (device nodes of each GPU and GCU, the control nodes present), says what it did, is
/// idempotent, and never replaces an entry that resolves to another device (exit 1).
#[test]
fn system_create_dev_char_symlinks_links_every_node_once() {
    let n = Node::standard([
        "GPU-aaaaaaaa-0000-0000-0000-000000000000",
        "GPU-bbbbbbbb-0000-0000-0000-000000000000",
    ]);
    mknod(&n.root().join("dev/nvidiactl"), 195, 255, 0o666);
    let dev = n.root().join("hostdev");
    let dev_s = dev.to_str().unwrap();

    let dry = n.ctk(&[
        "system",
        "create-dev-char-symlinks",
        "--dev-dir",
        dev_s,
        "--dry-run",
    ]);
    assert_eq!(dry.status.code(), Some(0));
    let text = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(text.contains("dev/nvidia0: missing"), "{text}");
    assert!(!dev.exists(), "--dry-run made {}", dev.display());

    let out = n.ctk(&["system", "create-dev-char-symlinks", "--dev-dir", dev_s]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for (link, node) in [
        ("char/195:0", "dev/nvidia0"),
        ("char/195:1", "dev/nvidia1"),
        ("char/195:255", "dev/nvidiactl"),
        ("char/240:0", "dev/gcu0"),
    ] {
        assert_eq!(
            std::fs::read_link(dev.join(link)).unwrap(),
            n.root().join(node),
            "{text}"
        );
        assert!(text.contains(&format!("{node}: created")), "{text}");
    }

    let again = n.ctk(&["system", "create-dev-char-symlinks", "--dev-dir", dev_s]);
    assert_eq!(again.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&again.stdout).contains("created"));

    std::fs::remove_file(dev.join("char/195:1")).unwrap();
    symlink("/dev/null", dev.join("char/195:1")).unwrap();
    let wrong = n.ctk(&["system", "create-dev-char-symlinks", "--dev-dir", dev_s]);
    assert_eq!(wrong.status.code(), Some(1));
    let text = String::from_utf8_lossy(&wrong.stdout).into_owned();
    assert!(
        text.contains("dev/nvidia1: ERROR: ") && text.contains("is a link to /dev/null"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_link(dev.join("char/195:1")).unwrap(),
        std::path::Path::new("/dev/null")
    );
}

/// Writes `text` at the host path `host` under `root`, with `mode`.
fn put(root: &Path, host: &str, text: &str, mode: u32) {
    let p = root.join(host.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

fn doctor_json(n: &Node) -> (Option<i32>, Vec<Value>, String) {
    let out = n.doctor(&["--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        out.status.code(),
        v.as_array().unwrap().clone(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn finding<'v>(v: &'v [Value], check: &str) -> &'v Value {
    v.iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} finding in {v:#?}"))
}

/// Issue 16 item 4: the README's own platform (Debian 12: runc 1.1.5, no systemd as PID 1,
/// cgroup v1, docker and containerd on cgroupfs) after a package install (registered, not
/// the default) passes, with runc's bug and the default runtime each said once as
/// information. The same runc on a systemd + cgroup v2 node whose containerd uses the systemd
/// driver fails with the command that creates the links; once they exist it only warns.
#[test]
fn doctor_grades_runc_by_cgroup_driver_and_links() {
    let n = Node::standard([UUID1, UUID2]);
    let root = n.root();
    put(root, "/etc/accel-container-runtime/config.toml", "", 0o644);
    put(root, "/usr/bin/accel-container-runtime", "", 0o755);
    put(root, "/usr/bin/dockerd", "", 0o755);
    put(
        root,
        "/usr/sbin/runc",
        "#!/bin/sh\necho 'runc version 1.1.5+ds1'\necho 'commit: 1.1.5+ds1-1+deb12u1'\n",
        0o755,
    );
    std::fs::create_dir_all(root.join("sys/fs/cgroup/devices")).unwrap();
    // What the package's postinst leaves: registered, the default untouched.
    put(
        root,
        "/etc/docker/daemon.json",
        r#"{"runtimes":{"accel":{"path":"/usr/bin/accel-container-runtime"}}}"#,
        0o644,
    );
    let containerd = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\nruntime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.accel]\nruntime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.accel.options]\nBinaryName = \"/usr/bin/accel-container-runtime\"\n";
    put(root, "/etc/containerd/config.toml", containerd, 0o644);

    let (code, v, _) = doctor_json(&n);
    assert_eq!(code, Some(0), "{v:#?}");
    for f in &v {
        assert!(f["status"] == "ok" || f["status"] == "info", "{f}");
    }
    let runc = finding(&v, "low-level-runtime");
    assert_eq!(runc["status"], "info");
    assert!(
        runc["message"].as_str().unwrap().contains("does not apply"),
        "{runc}"
    );
    let defaults: Vec<_> = v
        .iter()
        .filter(|f| f["message"].as_str().unwrap().contains("not the default"))
        .collect();
    assert_eq!(defaults.len(), 1, "said once: {v:#?}");
    assert_eq!(defaults[0]["status"], "info");
    let fix = defaults[0]["fix"].as_str().unwrap();
    assert!(
        fix.contains("--runtime docker --runtime-name accel --set-as-default")
            && fix.contains("--runtime containerd --runtime-name accel --set-as-default"),
        "{fix}"
    );
    let cg = finding(&v, "cgroups")["message"].as_str().unwrap();
    assert!(
        cg.contains("cgroup v1") && cg.contains("docker: cgroupfs"),
        "{cg}"
    );

    // systemd as PID 1 with cgroup v2, containerd's runtime on the systemd driver.
    std::fs::create_dir_all(root.join("run/systemd/system")).unwrap();
    put(
        root,
        "/sys/fs/cgroup/cgroup.controllers",
        "cpu io memory pids\n",
        0o644,
    );
    put(
        root,
        "/usr/bin/systemctl",
        "#!/bin/sh\necho 'systemd 252 (252.22-1~deb12u1)'\n",
        0o755,
    );
    put(
        root,
        "/etc/containerd/config.toml",
        &format!("{containerd}SystemdCgroup = true\n"),
        0o644,
    );
    let (code, v, _) = doctor_json(&n);
    assert_eq!(code, Some(1), "{v:#?}");
    let runc = finding(&v, "low-level-runtime");
    assert_eq!(runc["status"], "fail", "{runc}");
    assert!(runc["fix"]
        .as_str()
        .unwrap()
        .starts_with("accel-ctk system create-dev-char-symlinks"));
    let links = finding(&v, "dev-char/nvidia");
    assert_eq!(links["status"], "fail", "{links}");
    assert!(
        links["message"]
            .as_str()
            .unwrap()
            .contains("/dev/char/195:0 (for /dev/nvidia0)"),
        "{links}"
    );
    assert_eq!(finding(&v, "systemd")["status"], "ok");

    // The links the command makes (udev's relative form): safe now, upgrading still advised.
    let dir = root.join("dev/char");
    std::fs::create_dir_all(&dir).unwrap();
    for (link, node) in [
        ("195:0", "nvidia0"),
        ("195:1", "nvidia1"),
        ("240:0", "gcu0"),
    ] {
        symlink(format!("../{node}"), dir.join(link)).unwrap();
    }
    let (code, v, _) = doctor_json(&n);
    assert_eq!(code, Some(0), "{v:#?}");
    assert_eq!(finding(&v, "low-level-runtime")["status"], "warn");
    assert_eq!(finding(&v, "dev-char/nvidia")["status"], "ok");
    assert_eq!(finding(&v, "dev-char/enflame")["status"], "ok");
}

/// Issue 16 item 3: a --root that does not exist is an error, not a report of an empty node.
#[test]
fn doctor_missing_root_is_an_error() {
    let n = Node::new();
    let missing = n.root().join("nonexistent");
    let out = n.ctk(&["doctor", "--root", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err,
        format!(
            "accel-ctk: --root {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// Issue 16 item 1: each cause once. A broken config.toml's TOML error block and a
/// checkpoint's JSON error each appear once in the one error line.
#[test]
fn errors_name_each_cause_once() {
    let n = Node::new();
    std::fs::write(n.config(), "log-level = [\n").unwrap();
    let out = n.ctk(&["list"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.matches("TOML parse error").count(), 1, "{err}");
    assert!(
        err.starts_with("accel-ctk: loading the runtime's config: "),
        "{err}"
    );

    let n = Node::new();
    let cp = n.root().join("checkpoint");
    std::fs::write(&cp, "{x").unwrap();
    let out = n.check(&cp, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.matches("at line 1 column 2").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Issue 16 item 2: a --config whose directory is missing is a typo until --create-parents
/// says otherwise; nothing is created.
#[test]
fn configure_refuses_a_missing_directory_unless_asked() {
    let n = Node::new();
    let file = n.root().join("nonexistent/dir/daemon.json");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "runtime",
            "configure",
            "--runtime",
            "docker",
            "--config",
            file.to_str().unwrap(),
            "--runtime-path",
            "/usr/bin/accel-container-runtime",
        ];
        a.extend(extra);
        n.ctk(&a)
    };
    let out = args(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("does not exist (pass --create-parents to create it)"),
        "{}",
        stderr(&out)
    );
    assert!(!n.root().join("nonexistent").exists());
    let out = args(&["--create-parents"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&file)
        .unwrap()
        .contains("/usr/bin/accel-container-runtime"));
}

/// Issue 16 item 5: typo'd keys are warned about, with the nearest known key, by every
/// command, not only by doctor and the runtime's log.
#[test]
fn unknown_keys_warn_in_every_command() {
    let n = Node::new();
    let text = std::fs::read_to_string(n.config()).unwrap();
    std::fs::write(
        n.config(),
        format!(
            "log-levl = \"debug\"\n{}",
            text.replace("driver-root", "driver-rot")
        ),
    )
    .unwrap();
    let daemon = n.root().join("daemon.json");
    let commands: [&[&str]; 5] = [
        &["list"],
        &["cdi", "list"],
        &["cdi", "generate"],
        &["checkpoint", "check"],
        &[
            "runtime",
            "configure",
            "--runtime",
            "docker",
            "--dry-run",
            "--runtime-path",
            "/usr/bin/accel-container-runtime",
            "--config",
            daemon.to_str().unwrap(),
        ],
    ];
    for args in commands {
        let err = stderr(&n.ctk(args));
        assert!(
            err.contains("unknown key `log-levl` ignored (did you mean `log-level`?)"),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("unknown key `driver-rot` ignored (did you mean `driver-root`?)"),
            "{args:?}: {err}"
        );
    }
}

/// Issue 16 item 9: `cdi list` with nothing to list says where it looked; a checkpoint named
/// on the command line must exist (kubelet's default path may be absent).
#[test]
fn empty_cdi_list_and_named_missing_checkpoint() {
    let n = Node::new();
    let cdi = n.root().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let text = std::fs::read_to_string(n.config()).unwrap();
    std::fs::write(
        n.config(),
        format!("cdi-spec-dirs = [\"{}\"]\n{text}", cdi.display()),
    )
    .unwrap();
    let out = n.ctk(&["cdi", "list"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    assert_eq!(
        stderr(&out),
        format!("accel-ctk: no CDI specs in {}\n", cdi.display())
    );

    let missing = n.root().join("no-such-checkpoint");
    let out = n.check(&missing, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "accel-ctk: --checkpoint {}: no such file\n",
            missing.display()
        )
    );
}

/// Issue 14, class 5: the files accel-ctk reads (the engines' configurations, kubelet's
/// config and device checkpoint) are bounded while reading. An endless one (a symlink to
/// /dev/zero, as a procfs file that never ends would be) or a huge one is refused in one line
/// naming it, never read whole; the file is left as it was.
#[test]
fn endless_or_huge_files_are_refused_naming_them() {
    use accel_container_runtime::{checkpoint, config, engine};
    let n = Node::new();
    let root = n.root();
    let huge = |p: &Path, len: u64| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::File::create(p).unwrap().set_len(len).unwrap();
    };
    let endless = |p: &Path| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink("/dev/zero", p).unwrap();
    };
    let over = |limit: u64| format!("over the {limit} byte limit");
    let refused = |out: &Output, file: &Path, limit: u64| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains(file.to_str().unwrap()) && err.contains(&over(limit)),
            "{err}"
        );
    };

    let cp = root.join("var/lib/kubelet/device-plugins/kubelet_internal_checkpoint");
    huge(&cp, checkpoint::MAX_SIZE + 1);
    let out = n.check(&cp, &[]);
    refused(&out, &cp, checkpoint::MAX_SIZE);
    assert_eq!(
        std::fs::metadata(&cp).unwrap().len(),
        checkpoint::MAX_SIZE + 1
    );

    for (runtime, file) in [
        ("docker", "daemon.json"),
        ("containerd", "config.toml"),
        ("crio", "99-accel.conf"),
    ] {
        let p = root.join("engines").join(file);
        endless(&p);
        let out = n.ctk(&[
            "runtime",
            "configure",
            "--runtime",
            runtime,
            "--config",
            p.to_str().unwrap(),
        ]);
        refused(&out, &p, engine::MAX_CONFIG_SIZE);
        assert!(std::fs::symlink_metadata(&p).unwrap().is_symlink());
    }

    // doctor: each such file fails its own check, naming it; the other checks still run.
    let daemon = root.join("etc/docker/daemon.json");
    endless(&daemon);
    let kubelet = root.join("var/lib/kubelet/config.yaml");
    huge(&kubelet, (16 << 20) + 1);
    let profile = root.join("etc/accel-container-runtime/profiles.d/endless.toml");
    endless(&profile);
    // Under --root the config names the node's own paths (the default profiles-dir, under
    // the root); this node's config names this machine's paths for the commands above.
    put(root, "/etc/accel-container-runtime/config.toml", "", 0o644);
    let (code, v, _) = doctor_json(&n);
    assert_eq!(code, Some(1));
    for (check, file, limit) in [
        ("docker", &daemon, engine::MAX_CONFIG_SIZE),
        ("kubelet-cpu-manager", &kubelet, 16 << 20),
        ("kubelet-checkpoint", &cp, checkpoint::MAX_SIZE),
        ("profiles", &profile, config::MAX_FILE_SIZE),
    ] {
        let f = finding(&v, check);
        let msg = f["message"].as_str().unwrap();
        assert_eq!(f["status"], "fail", "{check}: {msg}");
        assert!(
            msg.contains(file.to_str().unwrap()) && msg.contains(&over(limit)),
            "{check}: {msg}"
        );
    }
}

/// Issue 23, class 5: kubelet writing its checkpoint while `--fix` repairs it loses nothing.
/// strace holds accel-ctk in each fsync (its temp file exists then: the checkpoint was read,
/// the rename is still to come) while the test writes the file as kubelet does, a new file
/// renamed over it. The repair is refused with one line, kubelet's file stays, no backup.
#[test]
fn checkpoint_fix_never_overwrites_a_write_made_while_repairing() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let n = Node::standard([
        "GPU-99999999-2222-3333-4444-555555555555",
        "GPU-bbbbbbbb-bbbb-cccc-dddd-ffffffffffff",
    ]);
    let cp = n.checkpoint("../kubelet-checkpoints/stale-after-uuid-change.json");
    let dir = cp.parent().unwrap().to_path_buf();
    let child = Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync"])
        .args(["-e", "inject=fsync:delay_enter=1500000"])
        .arg(&*CTK)
        .args(["checkpoint", "check", "--fix", "--checkpoint"])
        .arg(&cp)
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", n.config())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace (this test needs it: apt-get install strace)");
    let temp = |d: &Path| {
        std::fs::read_dir(d).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".kubelet_internal_checkpoint.accel-")
        })
    };
    let start = Instant::now();
    while !temp(&dir) {
        assert!(start.elapsed() < Duration::from_secs(20), "no temp file");
        std::thread::sleep(Duration::from_millis(10));
    }
    let kubelet = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/checkpoint/numa-form-several.json"),
    )
    .unwrap();
    std::fs::write(dir.join("kubelet-write.tmp"), &kubelet).unwrap();
    std::fs::rename(dir.join("kubelet-write.tmp"), &cp).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("changed while being repaired; nothing written, run again"),
        "{err}"
    );
    assert!(
        std::fs::read(&cp).unwrap() == kubelet,
        "kubelet's write was lost"
    );
    assert!(backups(&cp).is_empty());
    assert!(!temp(&dir));
}

/// Issue 41 and 42 item 5: what only the daemons read is judged by `accel-ctk doctor` too. A
/// profile's `[sharing]` that does not read fails, naming its key, with the daemons refusing
/// to start on it; an unknown `[health]` key warns; a GPU whose config space reads all ones
/// fails the health check naming it, which passes again once it answers.
#[test]
fn doctor_judges_the_daemons_tables_and_each_devices_health() {
    let n = Node::standard([UUID1, UUID2]);
    let root = n.root();
    let config = "/etc/accel-container-runtime/config.toml";
    put(root, config, "", 0o644);
    let (_, v, _) = doctor_json(&n);
    assert_eq!(finding(&v, "health")["status"], "ok", "{v:#?}");
    assert_eq!(
        finding(&v, "profile nvidia [sharing]")["status"],
        "ok",
        "{v:#?}"
    );

    put(
        root,
        config,
        "[profiles.nvidia.sharing]\nlimits = \"maybe\"\n[profiles.nvidia.health.nvml]\nxid-ingore = [13]\n",
        0o644,
    );
    std::fs::write(
        root.join("sys/bus/pci/devices/0000:04:00.0/config"),
        [0xff; 64],
    )
    .unwrap();
    let (code, v, _) = doctor_json(&n);
    assert_eq!(code, Some(1), "{v:#?}");
    let sharing = finding(&v, "profile nvidia [sharing]");
    assert_eq!(sharing["status"], "fail", "{v:#?}");
    let said = sharing["message"].as_str().unwrap();
    assert!(
        said.contains("limits") && said.contains("refuse to start"),
        "{said}"
    );
    let health = finding(&v, "profile nvidia [health]");
    assert_eq!(health["status"], "warn", "{v:#?}");
    assert!(
        health["message"].as_str().unwrap().contains("xid-ignore"),
        "{v:#?}"
    );
    let sick = finding(&v, "health");
    assert_eq!(sick["status"], "fail", "{v:#?}");
    let said = sick["message"].as_str().unwrap();
    assert!(
        said.contains("unhealthy since 20")
            && said.contains("Z: PCI function 0000:04:00.0 reads all ones"),
        "{v:#?}"
    );

    std::fs::write(
        root.join("sys/bus/pci/devices/0000:04:00.0/config"),
        [0xde, 0x10, 0x00, 0x00],
    )
    .unwrap();
    let (_, v, _) = doctor_json(&n);
    assert_eq!(finding(&v, "health")["status"], "ok", "{v:#?}");
}

/// Issue 43: doctor on a containerd node says whether NRI lets `accel-nri-plugin` in and
/// whether a device container fails closed while it is down, from containerd's file, a
/// stand-in `containerd --version` and the socket: 2.1 cannot (said, with the plugin
/// installed, as a warning); 2.2 can, and warns with the lines to set until the validator is
/// on; NRI turned off warns with the line that turns it on.
#[test]
fn doctor_says_whether_nri_fails_closed() {
    let n = Node::new();
    let root = n.root();
    put(root, "/etc/accel-container-runtime/config.toml", "", 0o644);
    put(root, "/usr/bin/accel-nri-plugin", "", 0o755);
    let containerd = |v: &str| {
        put(
            root,
            "/usr/bin/containerd",
            &format!(
                "#!/bin/sh\necho 'containerd github.com/containerd/containerd/v2 {v} 0123abc'\n"
            ),
            0o755,
        )
    };
    let conf = |text: &str| put(root, "/etc/containerd/config.toml", text, 0o644);
    std::fs::create_dir_all(root.join("var/run/nri")).unwrap();
    let _nri = std::os::unix::net::UnixListener::bind(root.join("var/run/nri/nri.sock")).unwrap();
    let nri = |v: &[Value]| finding(v, "containerd NRI").clone();

    containerd("v2.1.9");
    conf("version = 3\n");
    let (_, v, _) = doctor_json(&n);
    let f = nri(&v);
    assert_eq!(f["status"], "warn", "{f:#}");
    let msg = f["message"].as_str().unwrap();
    assert!(msg.starts_with("containerd 2.1, "), "{msg}");
    assert!(msg.contains("NRI on (default)"), "{msg}");
    assert!(
        msg.contains("socket \"/var/run/nri/nri.sock\" present"),
        "{msg}"
    );
    assert!(msg.contains("cannot fail closed"), "{msg}");

    // The runc handler from a base spec with the check hook: closed while the hook's binary
    // is there; every container failing (doctor fails) when the spec names one that is not.
    let handler = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\nbase_runtime_spec = '/etc/containerd/accel-base-spec.json'\n";
    conf(handler);
    let spec = |bin: &str| {
        put(
            root,
            "/etc/containerd/accel-base-spec.json",
            &format!(
                r#"{{"ociVersion":"1.1.0","hooks":{{"createRuntime":[{{"path":"{bin}","args":["accel-nri-plugin","check"]}}]}}}}"#
            ),
            0o644,
        )
    };
    spec("/usr/bin/accel-nri-plugin");
    let f = nri(&doctor_json(&n).1);
    assert_eq!(f["status"], "ok", "{f:#}");
    assert!(
        f["message"].as_str().unwrap().contains(
            "\"runc\": fails closed through accel-nri-plugin check (base_runtime_spec \"/etc/containerd/accel-base-spec.json\")"
        ),
        "{f:#}"
    );
    spec("/opt/accel/bin/accel-nri-plugin");
    let f = nri(&doctor_json(&n).1);
    assert_eq!(f["status"], "fail", "{f:#}");
    assert!(
        f["message"].as_str().unwrap().contains(
            "runs the check hook \"/opt/accel/bin/accel-nri-plugin\", which is not an executable on this node"
        ),
        "{f:#}"
    );
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains("accel-ctk nri base-spec --plugin"),
        "{f:#}"
    );
    conf("version = 3\n");

    containerd("v2.2.0");
    let (_, v, _) = doctor_json(&n);
    let f = nri(&v);
    assert_eq!(f["status"], "warn", "{f:#}");
    assert!(
        f["message"].as_str().unwrap().contains("validator is off"),
        "{f:#}"
    );
    let fix = f["fix"].as_str().unwrap();
    assert!(
        fix.contains("[plugins.\"io.containerd.nri.v1.nri\".default_validator] enable = true"),
        "{fix}"
    );

    conf("version = 3\n[plugins.\"io.containerd.nri.v1.nri\".default_validator]\nenable = true\n");
    let (_, v, _) = doctor_json(&n);
    let f = nri(&v);
    assert_eq!(f["status"], "ok", "{f:#}");
    assert!(
        f["message"].as_str().unwrap().contains(
            "required-plugins.noderesource.dev/container.<name>: '[\"accel\"]' fails closed"
        ),
        "{f:#}"
    );

    conf("version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = true\n");
    let (_, v, _) = doctor_json(&n);
    let f = nri(&v);
    assert_eq!(f["status"], "warn", "{f:#}");
    assert!(
        f["message"].as_str().unwrap().contains("NRI off (set)"),
        "{f:#}"
    );
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains("set disable = false in [plugins.\"io.containerd.nri.v1.nri\"]"),
        "{f:#}"
    );

    // No containerd at all: nothing to say.
    std::fs::remove_file(root.join("usr/bin/containerd")).unwrap();
    std::fs::remove_file(root.join("etc/containerd/config.toml")).unwrap();
    let (_, v, _) = doctor_json(&n);
    assert!(!v.iter().any(|f| f["check"] == "containerd NRI"), "{v:#?}");
}
