//! accel-nri-plugin against a stand-in runtime (tests/common/nri.rs): a unix socket served as
//! containerd serves NRI's (its multiplexed connections and ttrpc framed by hand, byte by
//! byte, not with the plugin's code), which accepts the real built plugin's connection, answers RegisterPlugin,
//! calls Configure, Synchronize and CreateContainer, over a simulated NVIDIA host. The
//! adjustments are compared with what the shim itself writes into a bundle for the same
//! request: the same decision, from the same code.

mod common;

use std::collections::BTreeSet;
use std::os::unix::net::UnixListener;
use std::time::Duration;

use accel_container_runtime::nri::proto::api::{ContainerAdjustment, LinuxContainer, LinuxDevice};
use common::nri::{code, container, device_paths, Conn, Plugin};
use common::{Bundle, Runc, SimRoot};
use serde_json::Value;

/// Mounts as compared: destination, source, options.
type Mounts = BTreeSet<(String, String, Vec<String>)>;

/// What the shim writes for `env` into a busybox bundle: device paths, and the mounts it
/// added (destination, source, options).
fn shim_edits(runc: &Runc, env: &str) -> (BTreeSet<String>, Mounts) {
    let mut bundle = Bundle::busybox();
    let before: BTreeSet<String> = dests(&bundle.read_spec());
    bundle.env(env);
    let id = runc.id("nri-shim");
    let out = runc.create(&bundle, &id);
    assert_eq!(out.code, 0, "the shim's create: {}", out.stderr);
    let spec = bundle.read_spec();
    let devices = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap().to_string())
        .collect();
    let mounts = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !before.contains(m["destination"].as_str().unwrap()))
        .map(|m| {
            (
                m["destination"].as_str().unwrap().to_string(),
                m["source"].as_str().unwrap().to_string(),
                serde_json::from_value(m["options"].clone()).unwrap(),
            )
        })
        .collect();
    (devices, mounts)
}

fn dests(spec: &Value) -> BTreeSet<String> {
    spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["destination"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn stand_in_runtime_gets_the_shims_edits_through_nri() {
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let plugin = Plugin::start(&socket, &runc.config_path(), dir.path());
    let mut rt = Conn::accept(&listener);
    rt.handshake();
    plugin.wait_log("nri: registered as 10-accel with stand-in 2.1.9", 1);

    // NVIDIA_VISIBLE_DEVICES=1: the second GPU in bus order, the control nodes, the driver.
    let adj = rt
        .create(container("gpu", &["NVIDIA_VISIBLE_DEVICES=1"]))
        .unwrap();
    let gpu = format!("/dev/nvidia{}", sim.gpus()[1].minor);
    let want: BTreeSet<String> = [gpu.as_str(), "/dev/nvidiactl", "/dev/nvidia-uvm"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(device_paths(&adj), want);
    let linux = adj.linux.clone().unwrap();
    let node = linux.devices.iter().find(|d| d.path == gpu).unwrap();
    assert_eq!((node.r#type.as_str(), node.major), ("c", 195));
    assert_eq!(i64::from(sim.gpus()[1].minor), node.minor);
    let rules = linux.resources.unwrap().devices;
    assert_eq!(rules.len(), 3, "one allow rule per node: {rules:?}");
    assert!(rules.iter().all(|r| r.allow && r.access == "rwm"));
    // The same edits as the shim's create of a bundle asking the same.
    let (shim_devices, shim_mounts) = shim_edits(&runc, "NVIDIA_VISIBLE_DEVICES=1");
    assert_eq!(device_paths(&adj), shim_devices);
    let mounts: Mounts = adj
        .mounts
        .iter()
        .map(|m| (m.destination.clone(), m.source.clone(), m.options.clone()))
        .collect();
    assert!(!mounts.is_empty(), "the driver's files are mounted");
    assert_eq!(mounts, shim_mounts);
    assert!(adj
        .mounts
        .iter()
        .all(|m| m.options[0] == "ro" && m.r#type == "bind"));
    assert!(
        adj.mounts
            .iter()
            .any(|m| m.destination == "/usr/bin/nvidia-smi"),
        "{:?}",
        adj.mounts
    );
    plugin.wait_log(
        &format!(
            "nri: ns/pod/gpu: 3 nodes, {} mounts for NVIDIA_VISIBLE_DEVICES=1",
            mounts.len()
        ),
        1,
    );

    // No variable: nothing.
    let none = rt.create(container("plain", &["PATH=/bin"])).unwrap();
    assert_eq!(none, ContainerAdjustment::default());

    // /dev/nvidia<minor> already there, as CDI injects it (another path, same numbers):
    // no second copy, the rest still added.
    let mut cdi = container("cdi", &["NVIDIA_VISIBLE_DEVICES=1"]);
    cdi.linux = Some(LinuxContainer {
        devices: vec![LinuxDevice {
            path: "/dev/gpu-from-cdi".into(),
            r#type: "c".into(),
            major: 195,
            minor: i64::from(sim.gpus()[1].minor),
            ..LinuxDevice::default()
        }],
    });
    let adj = rt.create(cdi).unwrap();
    let got = device_paths(&adj);
    assert!(!got.contains(&gpu), "{got:?}");
    assert!(got.contains("/dev/nvidiactl"), "{got:?}");

    // A bad value fails the create, with the shim's message prefixed by the plugin's name.
    let err = rt
        .create(container("bad", &["NVIDIA_VISIBLE_DEVICES=7"]))
        .unwrap_err();
    assert!(err.starts_with("accel-nri-plugin: "), "{err}");
    assert!(err.contains("NVIDIA_VISIBLE_DEVICES"), "{err}");
    assert!(err.contains("\"7\""), "names the value: {err}");
    let mut bundle = Bundle::busybox();
    bundle.env("NVIDIA_VISIBLE_DEVICES=7");
    let id = runc.id("nri-bad");
    let shim = runc.create(&bundle, &id);
    assert_ne!(shim.code, 0);
    let message = err.strip_prefix("accel-nri-plugin: ").unwrap();
    assert!(
        shim.stderr.contains(message),
        "the shim says the same: {:?} vs {:?}",
        shim.stderr,
        message
    );

    // A method the plugin does not serve gets an error status, not silence.
    let r = rt.call("StopContainer", Vec::new());
    assert_eq!(code(&r), 12, "Unimplemented");

    assert_eq!(plugin.terminate().code(), Some(0), "SIGTERM: exit 0");
}

#[test]
fn plugin_registers_again_after_the_runtime_restarts() {
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    // No socket yet: the plugin waits for the runtime.
    let plugin = Plugin::start(&socket, &runc.config_path(), dir.path());
    plugin.wait_log("cannot connect to", 1);
    for round in 1..=2 {
        let listener = UnixListener::bind(&socket).unwrap();
        let mut rt = Conn::accept(&listener);
        rt.handshake();
        plugin.wait_log("nri: registered as 10-accel", round);
        let adj = rt
            .create(container("gpu", &["NVIDIA_VISIBLE_DEVICES=0"]))
            .unwrap();
        assert_eq!(
            device_paths(&adj).len(),
            3,
            "round {round}: {:?}",
            device_paths(&adj)
        );
        // The runtime goes away: connection and socket.
        drop(rt);
        drop(listener);
        std::fs::remove_file(&socket).unwrap();
        plugin.wait_log("dialing again", round);
    }
    // Logged once while the socket stayed missing, not at every try.
    std::thread::sleep(Duration::from_millis(1500));
    let log = plugin.log();
    assert!(
        log.matches("cannot connect to").count() <= 3,
        "one line per change:\n{log}"
    );
    assert_eq!(
        plugin.terminate().code(),
        Some(0),
        "SIGTERM while disconnected: exit 0"
    );
}
