//! End-to-end through a real containerd 1.6 (issue 3, "End-to-end tests with the real
//! engines", item 5): a private containerd (root, state and sockets under a temp dir, never
//! the node's) runs busybox containers with `ctr run --runc-binary <shim>`, i.e. the shim as
//! the runc.v2 shim's `BinaryName`, on a simulated accelerator host (tests/common); and a
//! containerd started with the `config.toml` that `accel-ctk runtime configure` wrote loads it
//! and runs a container through the binary it names.
//!
//! The image is a hand-made OCI image layout (busybox rootfs as its one layer) imported with
//! `ctr images import`. The shim finds its config through `ACCEL_CONTAINER_RUNTIME_CONFIG` in
//! containerd's environment (containerd passes it to containerd-shim-runc-v2, which passes it
//! to the runtime binary). Each test starts its own containerd (about a second) and its Drop
//! removes tasks and containers, stops the daemon, unmounts what is left and removes its dirs,
//! also when the test panics. Needs root, containerd, runc, busybox-static, gcc; fails (never
//! skips) without them.

mod common;
#[path = "common/engines.rs"]
mod engines;

use std::ffi::OsStr;

use common::*;
use engines::*;

/// A containerd whose environment names `conf`'s shim config, with the busybox image.
fn containerd_with_image(conf: &Runc) -> Containerd {
    let c = Containerd::start(&[(
        "ACCEL_CONTAINER_RUNTIME_CONFIG",
        conf.config_path().as_os_str(),
    )]);
    import_image(&c);
    c
}

fn import_image(c: &Containerd) {
    let work = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs_tar(&work.path().join("rootfs.tar"));
    let archive = oci_image_archive(&rootfs, &work.path().join("image.tar"));
    c.ctr(&[
        OsStr::new("images"),
        OsStr::new("import"),
        archive.as_os_str(),
    ])
    .ok();
}

/// `ctr run --rm --runc-binary <runc_binary> --env ... IMAGE <id> sh -c <script>`.
fn ctr_run(c: &Containerd, runc_binary: &str, env: &[&str], script: &str) -> (String, Out) {
    let id = unique("e2e-ctr");
    let mut args = vec!["run", "--rm", "--runc-binary", runc_binary];
    for kv in env {
        args.extend_from_slice(&["--env", kv]);
    }
    args.extend_from_slice(&[IMAGE, &id, "sh", "-c", script]);
    let out = c.ctr(&args);
    (id, out)
}

#[track_caller]
fn ctr_probe(c: &Containerd, runc_binary: &str, env: &[&str], probe: &Probe) -> Report {
    let (_, out) = ctr_run(c, runc_binary, env, &probe.script());
    assert_eq!(
        out.code,
        0,
        "ctr run failed: {out:#?}\ncontainerd log:\n{}",
        c.log_tail(15)
    );
    Report::parse(&out.stdout)
}

#[test]
fn ctr_nvidia_index_1_through_the_shim_as_runc_binary() {
    require_engines();
    let sim = SimRoot::standard();
    let conf = Runc::new(&sim);
    let c = containerd_with_image(&conf);

    let r = ctr_probe(
        &c,
        SHIM.as_str(),
        &["NVIDIA_VISIBLE_DEVICES=1"],
        &nvidia_probe(&sim),
    );
    assert_nvidia_index_1(&r, &sim);
    assert!(
        conf.shim_log().contains("for NVIDIA_VISIBLE_DEVICES=1"),
        "the shim did not log to the file its config (from containerd's env) names: {}",
        conf.shim_log()
    );
}

#[test]
fn ctr_enflame_1_3_and_no_variable_same_as_runc() {
    require_engines();
    let sim = SimRoot::standard();
    let conf = Runc::new(&sim);
    let c = containerd_with_image(&conf);

    let probe = Probe::new()
        .ls("/dev")
        .open("/dev/gcu0")
        .open("/dev/gcu1")
        .open("/dev/gcu3")
        .open("/dev/gcuctl");
    let r = ctr_probe(&c, SHIM.as_str(), &["ENFLAME_VISIBLE_DEVICES=1,3"], &probe);
    assert_enflame_1_3(&r, "");

    // No variable: the same container as containerd's own runc gives.
    let probe = Probe::new()
        .ls("/dev")
        .ls("/usr/lib64")
        .cmd(
            "mounts",
            "cut -d' ' -f2-4 /proc/self/mounts | sed 's/lowerdir=.*//'",
        )
        .cmd("devices", "cat /sys/fs/cgroup/devices/devices.list");
    let accel = ctr_probe(&c, SHIM.as_str(), &[], &probe);
    let runc = ctr_probe(&c, "runc", &[], &probe);
    assert_eq!(
        accel.sections, runc.sections,
        "accel:\n{}\nrunc:\n{}",
        accel.raw, runc.raw
    );
}

#[test]
fn ctr_bad_index_fails_with_the_shims_line_from_log_json() {
    require_engines();
    let sim = SimRoot::standard();
    let conf = Runc::new(&sim);
    let c = containerd_with_image(&conf);

    let (id, out) = ctr_run(&c, SHIM.as_str(), &["NVIDIA_VISIBLE_DEVICES=7"], "true");
    assert_ne!(out.code, 0, "{out:#?}");
    // containerd-shim-runc-v2 calls the runtime with `--log <bundle>/log.json --log-format
    // json` and reports the last error there: the shim's line must be it.
    let want = "accel-container-runtime: NVIDIA_VISIBLE_DEVICES: no device \"7\" on this node";
    assert!(out.stderr.contains(want), "{out:#?}");
    assert_eq!(
        out.stderr.lines().filter(|l| l.contains(want)).count(),
        1,
        "{out:#?}"
    );
    let tasks = c.ctr(&["tasks", "ls", "-q"]);
    tasks.ok();
    assert!(
        !tasks.stdout.lines().any(|l| l.trim() == id),
        "a task was left for {id}: {tasks:#?}"
    );
}

#[test]
fn ctr_exec_into_a_running_container_keeps_the_device() {
    require_engines();
    let sim = SimRoot::standard();
    let gpu1 = &sim.gpus()[1];
    let conf = Runc::new(&sim);
    let c = containerd_with_image(&conf);

    let id = unique("e2e-ctr-exec");
    c.ctr(&[
        "run",
        "-d",
        "--runc-binary",
        SHIM.as_str(),
        "--env",
        "NVIDIA_VISIBLE_DEVICES=1",
        IMAGE,
        &id,
        "sleep",
        "600",
    ])
    .ok();
    // `exec` goes through the shim untouched to runc; the device rule is the container's.
    let probe = Probe::new().ls("/dev").open(&gpu1.node());
    let out = c.ctr(&[
        "tasks",
        "exec",
        "--exec-id",
        "probe",
        &id,
        "sh",
        "-c",
        &probe.script(),
    ]);
    assert_eq!(out.code, 0, "{out:#?}");
    let r = Report::parse(&out.stdout);
    r.assert_extra_dev(&["nvidia1", "nvidia-uvm", "nvidiactl"]);
    assert_eq!(r.open(&gpu1.node()), Open::Enxio, "{}", r.raw);
    c.ctr(&["tasks", "rm", "-f", &id]).ok();
    c.ctr(&["containers", "rm", &id]).ok();
}

/// `plugins."io.containerd.grpc.v1.cri".containerd` of `containerd --config F config dump`.
fn cri_containerd_section(file: &std::path::Path) -> toml::Table {
    let dump = containerd_config_dump(file);
    dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        .as_table()
        .unwrap_or_else(|| panic!("no CRI containerd section in:\n{dump}"))
        .clone()
}

#[test]
fn containerd_started_with_the_configured_file_runs_its_binary_name() {
    require_engines();
    let sim = SimRoot::standard();
    let gpu0 = &sim.gpus()[0];
    let conf = Runc::new(&sim);
    let conf_path = conf.config_path();
    let env = [("ACCEL_CONTAINER_RUNTIME_CONFIG", conf_path.as_os_str())];

    // The operator's file (the test's paths, CRI plugin on), then `runtime configure`.
    let c = Containerd::start_with_config(
        |dir| {
            let file = dir.join("config.toml");
            std::fs::write(&file, Containerd::base_config(dir)).unwrap();
            configure_containerd(&file, SHIM.as_str(), &["--set-as-default"]);
            file
        },
        &env,
    );

    // The daemon took the file: its CRI plugin (which refuses a default runtime it has no
    // entry for) came up.
    let plugins = c.ctr(&["plugins", "ls"]);
    plugins.ok();
    // Columns: TYPE ID PLATFORMS STATUS.
    let cri: Vec<&str> = plugins
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 4 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri")
        .unwrap_or_else(|| panic!("no CRI plugin: {}", plugins.stdout));
    assert_eq!(
        cri[3],
        "ok",
        "CRI plugin not loaded: {cri:?}\n{}",
        c.log_tail(30)
    );

    let section = cri_containerd_section(&c.config_path());
    assert_eq!(
        section["default_runtime_name"].as_str(),
        Some("accel"),
        "{section:#?}"
    );
    let accel = &section["runtimes"]["accel"];
    assert_eq!(
        accel["runtime_type"].as_str(),
        Some("io.containerd.runc.v2"),
        "{accel:#?}"
    );
    let binary = accel["options"]["BinaryName"]
        .as_str()
        .unwrap_or_else(|| panic!("no BinaryName: {accel:#?}"));
    assert_eq!(binary, SHIM.as_str());

    // What the runc.v2 shim does with that BinaryName: run it as runc.
    import_image(&c);
    let r = ctr_probe(
        &c,
        binary,
        &["NVIDIA_VISIBLE_DEVICES=0"],
        &nvidia_probe(&sim),
    );
    r.assert_extra_dev(&["nvidia3", "nvidia-uvm", "nvidiactl"]);
    assert_eq!(r.open(&gpu0.node()), Open::Enxio, "{}", r.raw);
}
