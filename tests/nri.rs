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

/// A share's container (the DRA driver recorded a grant for its pod; CDI put the device's
/// node in it) gets the grant as `dmem.max` in the adjustment's unified resources, on a
/// node whose cgroup root lists the device's memory region; the same container in another
/// pod, or without the node, gets none. The check hook refuses that container's spec
/// without the limit, and passes it with the limit or in another pod.
#[test]
fn a_shares_container_gets_its_dmem_max_through_nri() {
    const POD: &str = "5b1f0c2e-8d4a-4f7e-9a3b-2c1d0e9f8a7b";
    const OTHER: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
    const BUS: &str = "0000:0a:00.0";
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let dir = tempfile::tempdir().unwrap();
    let cgroup = dir.path().join("cgroup");
    let grants = dir.path().join("pods");
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::create_dir_all(grants.join(POD)).unwrap();
    std::fs::write(
        cgroup.join("dmem.capacity"),
        format!("drm/{BUS}/system 1048576\ndrm/{BUS}/vram0 34359738368\n"),
    )
    .unwrap();
    let minor = sim.gpus()[1].minor;
    std::fs::write(
        grants.join(POD).join("claim-1.json"),
        serde_json::json!({
            "pod": POD,
            "claim": "claim-1",
            "grants": [{
                "device": "gpu-1-shared",
                "bus": BUS,
                "rdevs": [format!("195:{minor}")],
                "memory": 8u64 << 30,
            }],
        })
        .to_string(),
    )
    .unwrap();
    let config = runc.config_path();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!(
            "cgroup-root = {:?}\ndmem-grants-dir = {:?}\n{text}",
            cgroup.display().to_string(),
            grants.display().to_string()
        ),
    )
    .unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let plugin = Plugin::start(&socket, &config, dir.path());
    let mut rt = Conn::accept(&listener);
    rt.handshake();
    plugin.wait_log("nri: registered as 10-accel", 1);

    let with_node = |name: &str| {
        let mut c = container(name, &["PATH=/bin"]);
        c.linux = Some(LinuxContainer {
            devices: vec![LinuxDevice {
                path: format!("/dev/nvidia{minor}"),
                r#type: "c".into(),
                major: 195,
                minor: i64::from(minor),
                ..LinuxDevice::default()
            }],
        });
        c
    };
    let unified = |a: &ContainerAdjustment| {
        a.linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map(|r| r.unified.clone())
            .unwrap_or_default()
    };
    let want = format!("drm/{BUS}/vram0 {}", 8u64 << 30);

    // By CDI's node alone: the limit is the whole adjustment.
    let adj = rt.create_in(with_node("share"), POD).unwrap();
    assert_eq!(
        unified(&adj).get("dmem.max").map(String::as_str),
        Some(want.as_str())
    );
    assert_eq!(unified(&adj).len(), 1);
    assert!(device_paths(&adj).is_empty(), "no second copy of the node");
    plugin.wait_log(&format!("nri: ns/pod/share: dmem.max={want}"), 1);

    // Asked by variable, the node added by this adjustment: the limit beside the nodes.
    let adj = rt
        .create_in(container("asks", &["NVIDIA_VISIBLE_DEVICES=1"]), POD)
        .unwrap();
    assert!(device_paths(&adj).contains(&format!("/dev/nvidia{minor}")));
    assert_eq!(
        unified(&adj).get("dmem.max").map(String::as_str),
        Some(want.as_str())
    );

    // Another pod with the same node, or the pod's container without it: no limit.
    assert_eq!(
        rt.create_in(with_node("other"), OTHER).unwrap(),
        ContainerAdjustment::default()
    );
    assert_eq!(
        rt.create_in(container("plain", &["PATH=/bin"]), POD)
            .unwrap(),
        ContainerAdjustment::default()
    );
    assert_eq!(plugin.terminate().code(), Some(0));

    // The check hook on the share's final spec: its node without the limit is refused (the
    // plugin did not adjust it); with the limit, or in another pod, it passes.
    let share = |pod: &str, limit: Option<&str>| {
        let mut b = Bundle::busybox();
        b.edit(|s| {
            s["annotations"] = serde_json::json!({"io.kubernetes.cri.sandbox-uid": pod});
            s["linux"]["devices"] = serde_json::json!([
                {"path": format!("/dev/nvidia{minor}"), "type": "c", "major": 195, "minor": minor}
            ]);
            if let Some(l) = limit {
                s["linux"]["resources"]["unified"] = serde_json::json!({"dmem.max": l});
            }
        });
        b
    };
    let out = run_check(&share(POD, None), &config);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.starts_with("accel-nri-plugin check: container \"share\": its pod ")
            && out.stderr.contains("dmem.max is missing from linux.resources.unified: accel-nri-plugin did not adjust this container"),
        "{out:?}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    assert_eq!(run_check(&share(POD, Some(&want)), &config).code, 0);
    assert_eq!(run_check(&share(OTHER, None), &config).code, 0);
}

/// `accel-nri-plugin check` as a runtime runs it: the OCI state of container "share" on
/// stdin, the runtime's config in its environment.
fn run_check(bundle: &Bundle, config: &std::path::Path) -> common::Out {
    use std::io::Write as _;
    let mut child =
        std::process::Command::new(common::binary(env!("CARGO_BIN_EXE_accel-nri-plugin")))
            .arg("check")
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", config)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    let state = serde_json::json!({"ociVersion": "1.2.0", "id": "share", "status": "creating",
        "pid": 1, "bundle": bundle.path()});
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(state.to_string().as_bytes()).unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    common::Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The plugin in its DaemonSet pod: the host's / mounted at some directory (`--host-root`),
/// the shipped profiles with the host's own driver root (`/`). The devices and the driver's
/// files are found under it, and the engine is answered with the host's paths, never the
/// pod's.
#[test]
fn a_plugin_in_a_pod_reads_the_host_under_host_root() {
    let sim = SimRoot::standard();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let root = sim.path().to_str().unwrap().to_string();
    let socket = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let plugin = Plugin::start_with(
        &socket,
        &config,
        dir.path(),
        &["--host-root", root.as_str()],
    );
    let mut rt = Conn::accept(&listener);
    rt.handshake();
    plugin.wait_log("nri: registered as 10-accel", 1);
    let adj = rt
        .create(container("gpu", &["NVIDIA_VISIBLE_DEVICES=1"]))
        .unwrap();
    let gpu = format!("/dev/nvidia{}", sim.gpus()[1].minor);
    assert!(
        device_paths(&adj).contains(&gpu),
        "{:?}",
        device_paths(&adj)
    );
    assert!(!adj.mounts.is_empty(), "the driver's files are mounted");
    for m in &adj.mounts {
        assert!(
            !m.source.starts_with(&root) && m.source.starts_with('/'),
            "a pod path handed to the engine: {m:?}"
        );
        let inside = std::path::Path::new(&root).join(m.source.trim_start_matches('/'));
        assert!(
            inside.exists(),
            "{} is not the host's name of a file",
            m.source
        );
    }
    assert!(
        adj.mounts.iter().any(|m| m.source == "/usr/bin/nvidia-smi"),
        "{:?}",
        adj.mounts
    );
    assert_eq!(plugin.terminate().code(), Some(0));
}

/// `--host-root` that is not a directory: the plugin stops at once, naming it.
#[test]
fn a_host_root_that_is_no_directory_stops_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let socket = dir.path().join("nri.sock");
    let mut plugin = Plugin::start_with(
        &socket,
        &config,
        dir.path(),
        &["--host-root", "/nonexistent/host"],
    );
    let status = plugin.wait();
    assert_ne!(status.code(), Some(0));
    assert!(status.code().is_some(), "an exit, not a signal: {status:?}");
    assert!(plugin.log().contains("--host-root"), "{}", plugin.log());
}

// ---------------------------------------------------------------------------------------------
// The check hook (`accel-nri-plugin check`) as the stock runtime runs it: fail closed
// ---------------------------------------------------------------------------------------------

/// The low-level runtimes on this host: runc, and crun where installed.
fn stock_runtimes() -> Vec<String> {
    let mut r = vec!["runc".to_string()];
    if common::which("crun").is_some() {
        r.push("crun".into());
    }
    r
}

/// `bundle` with the check hook as `accel-ctk nri base-spec` writes it, the runtime's config
/// `config` given in the hook's own environment (as on a node, where it is the default path).
fn with_check_hook(bundle: &mut Bundle, config: &std::path::Path) {
    let plugin = common::binary(env!("CARGO_BIN_EXE_accel-nri-plugin"));
    let out = common::output(
        std::process::Command::new(&*common::CTK)
            .args(["nri", "base-spec", "--plugin", &plugin, "--from"])
            .arg(bundle.config_path()),
    );
    out.ok();
    let mut spec: Value = serde_json::from_str(&out.stdout).unwrap();
    spec["hooks"]["createRuntime"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(format!("ACCEL_CONTAINER_RUNTIME_CONFIG={}", config.display()).into());
    bundle.edit(|s| *s = spec);
}

/// `low run --bundle B ID` straight, no shim: the stock runtime and its hook alone.
fn stock_run(runc: &Runc, low: &str, bundle: &Bundle, name: &str) -> common::Out {
    let id = runc.id(name);
    let out = common::output(
        std::process::Command::new(low)
            .arg("--root")
            .arg(runc.state_dir())
            .args(["run", "--bundle"])
            .arg(bundle.path())
            .arg(&id),
    );
    // `run` removes what it ran; a refused create leaves nothing either.
    out
}

/// Issue 43, fail closed without an NRI validator: the stock runc (and crun) running the
/// check hook from the spec refuse a container that asks for GPU 1 by variable when its node
/// is not in the spec (the plugin did not adjust it), with one line naming accel-nri-plugin,
/// the container, the variable and the node; run one that asks for nothing; and run one that
/// asks with its nodes present (as the plugin or CDI adds them), which sees them inside.
#[test]
fn the_check_hook_refuses_a_device_container_the_plugin_did_not_adjust() {
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    // The nodes as the create path adds them: the shim's edit of the same request.
    let added = {
        let mut b = Bundle::busybox();
        b.env("NVIDIA_VISIBLE_DEVICES=1");
        let id = runc.id("check-nodes");
        assert_eq!(runc.create(&b, &id).code, 0);
        b.read_spec()["linux"].clone()
    };
    for low in stock_runtimes() {
        // (a) asks, no node: refused by the hook.
        let mut b = Bundle::busybox();
        b.env("NVIDIA_VISIBLE_DEVICES=1").sh("echo started");
        with_check_hook(&mut b, &runc.config_path());
        let out = stock_run(&runc, &low, &b, "check-refused");
        println!("{low} (a): {}", out.stderr.trim());
        assert_ne!(out.code, 0, "{low}: started without its device: {out:?}");
        assert!(!out.stdout.contains("started"), "{low}: {out:?}");
        // runc's logrus line escapes the hook's quotes.
        let stderr = out.stderr.replace("\\\"", "\"");
        let line = stderr
            .lines()
            .find(|l| l.contains("accel-nri-plugin check: container \"e2e-check-refused"))
            .unwrap_or_else(|| panic!("{low}: no line from the hook: {out:?}"));
        assert!(
            line.contains("NVIDIA_VISIBLE_DEVICES=\"1\" asked for /dev/nvidia1, which the engine did not add: accel-nri-plugin did not adjust this container"),
            "{low}: {line}"
        );

        // (b) asks for nothing: runs, untouched.
        let mut b = Bundle::busybox();
        b.sh("ls /dev; echo started");
        with_check_hook(&mut b, &runc.config_path());
        let out = stock_run(&runc, &low, &b, "check-none");
        assert_eq!(out.code, 0, "{low}: {out:?}");
        assert!(out.stdout.contains("started"), "{low}: {out:?}");
        assert!(!out.stdout.contains("nvidia"), "{low}: {out:?}");

        // (c) asks, its nodes in the spec: runs and sees them.
        let mut b = Bundle::busybox();
        b.env("NVIDIA_VISIBLE_DEVICES=1").sh(
            "for d in /dev/nvidia1 /dev/nvidiactl /dev/nvidia0; do [ -c $d ] && echo \"has $d\" || echo \"no $d\"; done",
        );
        b.edit(|s| {
            s["linux"]["devices"] = added["devices"].clone();
            s["linux"]["resources"]["devices"] = added["resources"]["devices"].clone();
        });
        with_check_hook(&mut b, &runc.config_path());
        let out = stock_run(&runc, &low, &b, "check-present");
        assert_eq!(out.code, 0, "{low}: {out:?}");
        for want in ["has /dev/nvidia1", "has /dev/nvidiactl", "no /dev/nvidia0"] {
            assert!(out.stdout.contains(want), "{low}: {want}: {out:?}");
        }
    }
}

/// The check hook never breaks a container that asks for nothing, whatever else is wrong on
/// the node (a config that does not parse, a profiles-dir that is missing); a container that
/// asks gets the error's one line instead, and a bad request the decision's own line.
#[test]
fn the_check_hook_passes_a_device_less_container_whatever_else_fails() {
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let dir = tempfile::tempdir().unwrap();
    let plain = Bundle::busybox();
    let mut asks = Bundle::busybox();
    asks.env("NVIDIA_VISIBLE_DEVICES=1");
    let mut bad = Bundle::busybox();
    bad.env("NVIDIA_VISIBLE_DEVICES=7");

    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "low-level-runtime = [\n").unwrap();
    let no_dir = dir.path().join("no-dir.toml");
    std::fs::write(&no_dir, "profiles-dir = \"/nonexistent/profiles.d\"\n").unwrap();
    for config in [&broken, &no_dir, &dir.path().join("absent.toml")] {
        let out = run_check(&plain, config);
        assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{config:?}");
    }
    let out = run_check(&asks, &broken);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr
            .starts_with("accel-nri-plugin check: container \"share\": ")
            && out.stderr.contains("broken.toml"),
        "{out:?}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");

    let out = run_check(&bad, &runc.config_path());
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr
            .contains("NVIDIA_VISIBLE_DEVICES: no device \"7\""),
        "{out:?}"
    );
}
