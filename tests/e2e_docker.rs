//! End-to-end through a real dockerd (issue 3, "End-to-end tests with the real engines"): a
//! private dockerd 20.10 (its own data root, exec root, managed containerd and socket under a
//! temp dir, never the node's docker) runs busybox containers through the shim on a simulated
//! accelerator host (tests/common), and what each container gets is checked from inside it.
//!
//! One `#[test]` runs every scenario as a named step against one daemon: starting dockerd is
//! the slow part, and a Rust test binary has no global teardown, so the daemon lives in this
//! test's scope and its Drop (which also runs when a step panics) stops it, its containerd and
//! its containers, unmounts what it left and removes its dirs. Steps catch their own panics so
//! one failure does not hide the rest; the test fails listing every failed step.
//!
//! The shim finds its config through `ACCEL_CONTAINER_RUNTIME_CONFIG` in dockerd's
//! environment: dockerd passes its environment to the containerd it manages, containerd to
//! containerd-shim-runc-v2, and the shim to the runtime binary (checked below: the devices
//! come from the simulated root named only in that file, and the shim's log is the one it
//! names). Needs root, docker.io, containerd, runc, busybox-static, gcc; fails (never skips)
//! without them.

mod common;
#[path = "common/engines.rs"]
mod engines;

use std::ffi::OsStr;
use std::path::Path;

use common::*;
use engines::*;

/// [`common::nvidia_probe`], and the variable the container saw.
fn nvidia_probe(sim: &SimRoot) -> Probe {
    common::nvidia_probe(sim).cmd("visible", "echo \"$NVIDIA_VISIBLE_DEVICES\"")
}

fn enflame_probe() -> Probe {
    Probe::new()
        .ls("/dev")
        .ls("/usr/lib64")
        .open("/dev/gcu0")
        .open("/dev/gcu1")
        .open("/dev/gcu2")
        .open("/dev/gcu3")
        .open("/dev/gcuctl")
}

/// `docker run --rm --network none <flags> IMAGE sh -c <probe>`; panics unless it succeeds.
#[track_caller]
fn run_probe(d: &Dockerd, flags: &[&str], probe: &Probe) -> Report {
    let script = probe.script();
    let mut args = vec!["run", "--rm", "--network", "none"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[IMAGE, "sh", "-c", &script]);
    let out = d.docker(&args);
    assert_eq!(
        out.code,
        0,
        "docker {args:?} failed: {out:#?}\ndockerd log:\n{}",
        d.log_tail(15)
    );
    Report::parse(&out.stdout)
}

/// `docker run -d --network none <flags> IMAGE sleep 600`; the container's id.
#[track_caller]
fn run_detached(d: &Dockerd, flags: &[&str]) -> String {
    let mut args = vec!["run", "-d", "--network", "none"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[IMAGE, "sleep", "600"]);
    let out = d.docker(&args);
    out.ok();
    out.stdout.trim().to_string()
}

/// What `docker info` says the default runtime is.
fn default_runtime(d: &Dockerd) -> String {
    let out = d.docker(&["info", "--format", "{{.DefaultRuntime}}"]);
    out.ok();
    out.stdout.trim().to_string()
}

#[test]
fn docker_runs_containers_through_the_shim() {
    require_root();
    require_engines();
    let sim = SimRoot::standard();
    // Index 0 = bus 0000:3b:00.0 (minor 3), index 1 = bus 0000:af:00.0 (minor 1).
    let (gpu0, gpu1) = (sim.gpus()[0].clone(), sim.gpus()[1].clone());
    assert_eq!((gpu0.minor, gpu1.minor), (3, 1));
    // The shim's config.toml (every profile pointed at `sim`) and its log; only its path is
    // used here, never its runc state dir.
    let conf = Runc::new(&sim);
    let scratch = tempfile::tempdir().unwrap();
    let rootfs_tar = busybox_rootfs_tar(&scratch.path().join("rootfs.tar"));

    // Declared after `conf` so it drops (and stops) first.
    let daemon_json = serde_json::json!({
        "runtimes": {"accel": {"path": SHIM.as_str()}},
        "log-level": "info"
    });
    let d = Dockerd::start(
        &daemon_json,
        &[(
            "ACCEL_CONTAINER_RUNTIME_CONFIG",
            conf.config_path().as_os_str(),
        )],
        // docker registers its --gpus driver only when this name is on its PATH at start.
        &[("nvidia-container-runtime-hook", Path::new(SHIM.as_str()))],
    );
    d.docker(&[
        OsStr::new("import"),
        rootfs_tar.as_os_str(),
        OsStr::new(IMAGE),
    ])
    .ok();
    let original_daemon_json = std::fs::read(d.daemon_json_path()).unwrap();

    let gpu_probe = nvidia_probe(&sim);
    let mut steps = Steps::new();

    steps.run(
        "--runtime accel -e NVIDIA_VISIBLE_DEVICES=1: GPU index 1 only",
        || {
            let r = run_probe(
                &d,
                &["--runtime", "accel", "-e", "NVIDIA_VISIBLE_DEVICES=1"],
                &gpu_probe,
            );
            assert_nvidia_index_1(&r, &sim);
            assert!(!r.ls("/usr/lib64").contains("libefml.so.1"), "{}", r.raw);
            // The log named by the config dockerd's environment carried.
            assert!(
                conf.shim_log().contains("for NVIDIA_VISIBLE_DEVICES=1"),
                "the shim did not log to the file its config names: {}",
                conf.shim_log()
            );
        },
    );

    steps.run(
        "--runtime accel -e ENFLAME_VISIBLE_DEVICES=1,3: gcu1, gcu3, gcuctl",
        || {
            let r = run_probe(
                &d,
                &["--runtime", "accel", "-e", "ENFLAME_VISIBLE_DEVICES=1,3"],
                &enflame_probe(),
            );
            assert_enflame_1_3(&r, "");
            assert_eq!(r.open("/dev/gcu2"), Open::Absent, "{}", r.raw);
            assert!(r.ls("/usr/lib64").contains("libefml.so.1"), "{}", r.raw);
        },
    );

    steps.run("no variable: the container is what runc gives", || {
        let probe = Probe::new()
            .ls("/dev")
            .ls("/usr/lib64")
            .ls("/usr/bin")
            // Mount point, type and options; the rootfs source names the container's own
            // overlay dirs, which differ between any two containers.
            .cmd(
                "mounts",
                "cut -d' ' -f2-4 /proc/self/mounts | sed 's/lowerdir=.*//'",
            )
            .cmd("devices", "cat /sys/fs/cgroup/devices/devices.list");
        let accel = run_probe(&d, &["--runtime", "accel"], &probe);
        let runc = run_probe(&d, &["--runtime", "runc"], &probe);
        assert_eq!(
            accel.sections, runc.sections,
            "accel:\n{}\nrunc:\n{}",
            accel.raw, runc.raw
        );
        assert!(extra_dev(&accel.ls("/dev")).is_empty(), "{}", accel.raw);
    });

    steps.run(
        "--gpus all: both GPUs, docker's hook replaced by the shim",
        || {
            let r = run_probe(&d, &["--runtime", "accel", "--gpus", "all"], &gpu_probe);
            r.assert_extra_dev(&["nvidia1", "nvidia3", "nvidia-uvm", "nvidiactl"]);
            assert_eq!(r.section("visible"), ["all"], "{}", r.raw);
            for g in [&gpu0, &gpu1] {
                assert_eq!(r.open(&g.node()), Open::Enxio, "{}", r.raw);
            }
            // Had the hook stayed in config.json, runc would have run it (the link to the shim)
            // and the container would not have started (see the runc step below).
            assert!(
                conf.shim_log().contains("(docker --gpus hook replaced)"),
                "{}",
                conf.shim_log()
            );

            // The bundle containerd handed the runtime, as the shim left it: docker's hook
            // gone, the GPU nodes and their cgroup rules in.
            let id = run_detached(&d, &["--runtime", "accel", "--gpus", "all"]);
            let bundle = d
                .dir()
                .join("exec/containerd/daemon/io.containerd.runtime.v2.task/moby")
                .join(&id)
                .join("config.json");
            let spec: serde_json::Value = serde_json::from_slice(
                &std::fs::read(&bundle).unwrap_or_else(|e| panic!("{}: {e}", bundle.display())),
            )
            .unwrap();
            d.docker(&["rm", "-f", &id]).ok();
            let hooks = spec["hooks"].to_string();
            assert!(
                !hooks.contains("nvidia-container-runtime-hook"),
                "docker's hook is still in config.json: {hooks}"
            );
            let paths: Vec<&str> = spec["linux"]["devices"]
                .as_array()
                .map(|a| a.iter().filter_map(|d| d["path"].as_str()).collect())
                .unwrap_or_default();
            for node in ["/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl"] {
                assert!(
                    paths.contains(&node),
                    "{node} not in linux.devices: {paths:?}"
                );
            }
        },
    );

    steps.run("--gpus '\"device=1\"' and device=<uuid of index 0>", || {
        let r = run_probe(
            &d,
            &["--runtime", "accel", "--gpus", "\"device=1\""],
            &gpu_probe,
        );
        r.assert_extra_dev(&["nvidia1", "nvidia-uvm", "nvidiactl"]);
        assert_eq!(r.open(&gpu1.node()), Open::Enxio, "{}", r.raw);

        let by_uuid = format!("\"device={}\"", gpu0.uuid);
        let r = run_probe(&d, &["--runtime", "accel", "--gpus", &by_uuid], &gpu_probe);
        r.assert_extra_dev(&["nvidia3", "nvidia-uvm", "nvidiactl"]);
        assert_eq!(r.open(&gpu0.node()), Open::Enxio, "{}", r.raw);
    });

    steps.run(
        "--runtime runc --gpus all: the hook fails with one line",
        || {
            let out = d.docker(&[
                "run",
                "--rm",
                "--network",
                "none",
                "--runtime",
                "runc",
                "--gpus",
                "all",
                IMAGE,
                "true",
            ]);
            assert_ne!(out.code, 0, "{out:#?}");
            let want = "`docker run --gpus` needs the accel runtime: add `--runtime accel`";
            assert!(out.stderr.contains(want), "{out:#?}");
            assert_eq!(
                out.stderr.lines().filter(|l| l.contains(want)).count(),
                1,
                "{out:#?}"
            );
        },
    );

    steps.run(
        "NVIDIA_VISIBLE_DEVICES=7 on 2 GPUs: docker run fails with the shim's line",
        || {
            let name = unique("e2e-bad");
            let out = d.docker(&[
                "run",
                "--name",
                &name,
                "--network",
                "none",
                "--runtime",
                "accel",
                "-e",
                "NVIDIA_VISIBLE_DEVICES=7",
                IMAGE,
                "true",
            ]);
            assert_ne!(out.code, 0, "{out:#?}");
            let want = "accel-container-runtime: NVIDIA_VISIBLE_DEVICES: no device \"7\"";
            assert!(
                out.stderr.contains(want),
                "docker's error must carry the shim's line: {out:#?}"
            );
            // Created by docker, never started: runc has nothing under its name.
            let state = d.docker(&[
                "inspect",
                "--format",
                "{{.State.Status}} {{.State.Pid}}",
                &name,
            ]);
            assert_eq!(state.stdout.trim(), "created 0", "{state:#?}");
            d.docker(&["rm", "-f", &name]).ok();
        },
    );

    steps.run(
        "docker update --cpuset-cpus 0: the device still opens (ENXIO)",
        || {
            let id = run_detached(
                &d,
                &["--runtime", "accel", "-e", "NVIDIA_VISIBLE_DEVICES=1"],
            );
            let cpuset = if cgroup_v1() {
                "cat /sys/fs/cgroup/cpuset/cpuset.cpus"
            } else {
                "cat /sys/fs/cgroup/cpuset.cpus"
            };
            let probe = Probe::new()
                .open(&gpu1.node())
                .open("/dev/nvidiactl")
                .cmd("cpuset", cpuset);
            let exec = |what: &str| {
                let out = d.docker(&["exec", &id, "sh", "-c", &probe.script()]);
                assert_eq!(out.code, 0, "docker exec {what}: {out:#?}");
                Report::parse(&out.stdout)
            };
            let before = exec("before the update");
            assert_eq!(before.open(&gpu1.node()), Open::Enxio, "{}", before.raw);

            d.docker(&["update", "--cpuset-cpus", "0", &id]).ok();
            let after = exec("after the update");
            assert_eq!(
                after.section("cpuset"),
                ["0"],
                "update did not apply: {}",
                after.raw
            );
            assert_eq!(
                after.open(&gpu1.node()),
                Open::Enxio,
                "the device rule is gone after the update: {}",
                after.raw
            );
            assert_eq!(after.open("/dev/nvidiactl"), Open::Enxio, "{}", after.raw);
            d.docker(&["rm", "-f", &id]).ok();
        },
    );

    steps.run(
        "accel-ctk runtime configure --runtime-name accel-default --set-as-default, SIGHUP: no --runtime needed; unconfigure restores the file",
        || {
            let file = d.daemon_json_path();
            // A name of its own, so the entry docker uses is the one configure wrote.
            let args = |verb: &'static str| -> Vec<&OsStr> {
                vec![
                    OsStr::new("runtime"),
                    OsStr::new(verb),
                    OsStr::new("--runtime"),
                    OsStr::new("docker"),
                    OsStr::new("--config"),
                    file.as_os_str(),
                    OsStr::new("--runtime-name"),
                    OsStr::new("accel-default"),
                    OsStr::new("--runtime-path"),
                    OsStr::new(SHIM.as_str()),
                    OsStr::new("--set-as-default"),
                ]
            };
            accel_ctk(&args("configure")).ok();
            d.reload();
            assert_eq!(default_runtime(&d), "accel-default", "{}", d.log_tail(10));
            let runtimes = d.docker(&["info", "--format", "{{json .Runtimes}}"]);
            let runtimes: serde_json::Value = serde_json::from_str(&runtimes.stdout).unwrap();
            assert_eq!(
                runtimes["accel-default"]["path"].as_str(),
                Some(SHIM.as_str()),
                "{runtimes:#}"
            );
            assert_eq!(runtimes["accel"]["path"].as_str(), Some(SHIM.as_str()), "{runtimes:#}");

            let r = run_probe(&d, &["-e", "NVIDIA_VISIBLE_DEVICES=0"], &gpu_probe);
            r.assert_extra_dev(&["nvidia3", "nvidia-uvm", "nvidiactl"]);
            let r = run_probe(&d, &["--gpus", "\"device=1\""], &gpu_probe);
            r.assert_extra_dev(&["nvidia1", "nvidia-uvm", "nvidiactl"]);

            accel_ctk(&args("unconfigure")).ok();
            assert_eq!(
                String::from_utf8_lossy(&std::fs::read(&file).unwrap()),
                String::from_utf8_lossy(&original_daemon_json),
                "unconfigure must give daemon.json its bytes back"
            );
            // Not reloaded: dockerd's SIGHUP applies only keys present in the file, so a
            // removed `default-runtime` would stay pointing at a runtime the file no longer
            // has until a restart. The file is the check here.
        },
    );

    // Nothing left behind by the steps (each removed its own containers).
    steps.run("no container left running", || {
        let ps = d.docker(&["ps", "-aq"]);
        ps.ok();
        assert_eq!(ps.stdout.trim(), "", "{ps:#?}");
    });

    steps.finish();
}
