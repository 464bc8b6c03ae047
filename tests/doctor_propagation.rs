//! `accel-ctk doctor` on the propagation of the host's `/` mount (issue 32, class 12). The
//! device-plugin and DRA DaemonSets (packaging/kubernetes/) mount the host's `/` with
//! `mountPropagation: HostToContainer`; containerd starts such a container only where that
//! mount is shared or a slave, and a host without systemd as PID 1 leaves `/` private. Run
//! as the real binary over a tree holding a `proc/self/mountinfo` fixture, and over this
//! machine's own `/`, judged against `findmnt`.

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// `accel-ctk doctor --root <root> --json`'s finding on mount propagation.
fn propagation(root: &Path) -> Value {
    let out = accel_ctk(&["doctor", "--root", root.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:#?}"));
    v.as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "mount-propagation")
        .unwrap_or_else(|| panic!("no mount-propagation finding: {out:#?}"))
        .clone()
}

/// A node tree whose `proc/self/mountinfo` is fixture `name`, with kubelet's directory when
/// `kubelet` is set.
fn tree(name: Option<&str>, kubelet: bool) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    if let Some(name) = name {
        std::fs::create_dir_all(t.path().join("proc/self")).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/mountinfo")
                .join(name),
            t.path().join("proc/self/mountinfo"),
        )
        .unwrap();
    }
    if kubelet {
        std::fs::create_dir_all(t.path().join("var/lib/kubelet")).unwrap();
    }
    t
}

#[test]
fn class12_private_root_mount_is_reported_for_the_daemonsets() {
    // A Kubernetes node without systemd as PID 1: `/` is private.
    let f = propagation(tree(Some("private-root"), true).path());
    assert_eq!(f["status"], "warn", "{f}");
    let msg = f["message"].as_str().unwrap();
    for part in [
        "\"/\" is a private mount",
        "HostToContainer",
        "accel-device-plugin",
        "accel-dra-driver",
        "is not a shared or slave mount",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .starts_with("mount --make-rshared /"),
        "{f}"
    );
    // Not a Kubernetes node: said, but nothing to fix for it.
    let f = propagation(tree(Some("private-root"), false).path());
    assert_eq!(f["status"], "info", "{f}");
    assert!(
        f["message"].as_str().unwrap().contains("private mount"),
        "{f}"
    );
    // systemd makes `/` shared; inside a container `/` may be a slave: either will do.
    for name in ["shared-root", "slave-root"] {
        let f = propagation(tree(Some(name), true).path());
        assert_eq!(f["status"], "ok", "{name}: {f}");
    }
    // Nothing to read: said so, not guessed.
    let f = propagation(tree(None, true).path());
    assert_eq!(f["status"], "info", "{f}");
    assert!(
        f["message"].as_str().unwrap().contains("cannot read"),
        "{f}"
    );
}

/// This machine's own `/`, as `findmnt` (util-linux) reports its propagation.
#[test]
fn class12_the_real_root_mount_is_judged_as_findmnt_sees_it() {
    let out = output(std::process::Command::new("findmnt").args(["-no", "PROPAGATION", "/"]));
    assert_eq!(out.code, 0, "findmnt (util-linux): {out:#?}");
    let seen = out.stdout.trim().to_string();
    let f = propagation(Path::new("/"));
    let msg = f["message"].as_str().unwrap();
    if seen.contains("shared") || seen.contains("slave") {
        assert_eq!(f["status"], "ok", "findmnt: {seen}; {f}");
    } else {
        assert!(
            msg.contains("\"/\" is a private mount"),
            "findmnt: {seen}; {f}"
        );
        let want = if Path::new("/var/lib/kubelet").is_dir() {
            "warn"
        } else {
            "info"
        };
        assert_eq!(f["status"], want, "findmnt: {seen}; {f}");
    }
}
