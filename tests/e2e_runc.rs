//! End-to-end through real runc (issue 2): the shim is called as runc would be, on a simulated
//! accelerator host (tests/common), and what the container gets is checked from inside it.
//! Needs root, runc, busybox-static, gcc; fails (never skips) without them.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

#[test]
fn nvidia_index_1_gives_the_second_gpu_by_bus_order() {
    require_root();
    let sim = SimRoot::standard();
    // Bus order: index 0 = 0000:3b:00.0 (minor 3), index 1 = 0000:af:00.0 (minor 1).
    let second = &sim.gpus()[1];
    let first = &sim.gpus()[0];
    assert_eq!((first.minor, second.minor), (3, 1));

    let mut b = Bundle::busybox();
    b.env("NVIDIA_VISIBLE_DEVICES=1");
    let probe = nvidia_probe(&sim).cmd(
        "mknod",
        // The unrequested GPU, made by hand: the device cgroup must refuse to open it.
        &format!(
            "mknod /dev/probe c 195 {} && echo made && dd if=/dev/probe of=/dev/null count=0",
            first.minor
        ),
    );
    b.sh(&probe.script());
    // CAP_MKNOD so the container can try to make the node it was not given.
    b.edit(|s| {
        for set in ["bounding", "effective", "permitted"] {
            s["process"]["capabilities"][set]
                .as_array_mut()
                .unwrap()
                .push("CAP_MKNOD".into());
        }
    });
    let runc = Runc::new(&sim);
    let id = runc.id("nv1");
    let out = runc.run(&b, &id);
    out.ok();
    let r = Report::parse(&out.stdout);

    // The second GPU and the control nodes, the first absent, the libraries at their sonames
    // in glibc's default dir for this (non-Debian) image.
    assert_nvidia_index_1(&r, &sim);
    assert!(!r.ls("/usr/lib64").contains("libefml.so.1"), "{}", r.raw);
    let mknod = r.section("mknod").join("\n");
    assert!(
        mknod.starts_with("made\n")
            && mknod.contains("can't open '/dev/probe': Operation not permitted"),
        "opening an unrequested GPU made with mknod must be EPERM (cgroup), got: {mknod}"
    );
}

/// Runs `probe` in a fresh busybox container with `env` set; returns the report and the bundle.
fn run_probe(sim: &SimRoot, env: &[&str], probe: &Probe) -> (Report, Bundle) {
    let mut b = Bundle::busybox();
    for kv in env {
        b.env(kv);
    }
    b.sh(&probe.script());
    let runc = Runc::new(sim);
    let id = runc.id("probe");
    let out = runc.run(&b, &id);
    out.ok();
    assert!(
        out.stdout.starts_with("== "),
        "something besides the container wrote to stdout: {:?}",
        out.stdout
    );
    (Report::parse(&out.stdout), b)
}

#[test]
fn nvidia_by_uuid_all_none_void_unset() {
    require_root();
    let sim = SimRoot::standard();
    let probe = nvidia_probe(&sim);
    let uuid1 = format!("NVIDIA_VISIBLE_DEVICES={}", sim.gpus()[1].uuid);

    // By UUID: the same GPU as index 1.
    let (r, _) = run_probe(&sim, &[&uuid1], &probe);
    r.assert_extra_dev(&["nvidia1", "nvidia-uvm", "nvidiactl"]);
    assert_eq!(r.open("/dev/nvidia1"), Open::Enxio, "{}", r.raw);
    assert!(r.ls("/usr/lib64").contains("libcuda.so.1"), "{}", r.raw);

    // all: both GPUs.
    let (r, _) = run_probe(&sim, &["NVIDIA_VISIBLE_DEVICES=all"], &probe);
    r.assert_extra_dev(&["nvidia1", "nvidia3", "nvidia-uvm", "nvidiactl"]);
    assert_eq!(r.open("/dev/nvidia1"), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open("/dev/nvidia3"), Open::Enxio, "{}", r.raw);

    // Index and UUID of the same GPU, and both indices: deduplicated, bus order.
    let mixed = format!("NVIDIA_VISIBLE_DEVICES=0,{},1", sim.gpus()[1].uuid);
    let (r, b) = run_probe(&sim, &[&mixed], &probe);
    r.assert_extra_dev(&["nvidia1", "nvidia3", "nvidia-uvm", "nvidiactl"]);
    let spec = b.read_spec();
    let gpu_nodes = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["major"] == 195 && d["minor"] != 255)
        .count();
    assert_eq!(gpu_nodes, 2, "duplicates in linux.devices: {spec:#}");

    // none: control nodes, libraries and binaries, no GPU.
    let (r, _) = run_probe(&sim, &["NVIDIA_VISIBLE_DEVICES=none"], &probe);
    r.assert_extra_dev(&["nvidia-uvm", "nvidiactl"]);
    assert_eq!(r.open("/dev/nvidiactl"), Open::Enxio, "{}", r.raw);
    assert!(r.ls("/usr/lib64").contains("libcuda.so.1"), "{}", r.raw);
    assert!(r.ls("/usr/bin").contains("nvidia-smi"), "{}", r.raw);

    // void, empty and unset: nothing at all, config.json not rewritten.
    for env in [
        &["NVIDIA_VISIBLE_DEVICES=void"][..],
        &["NVIDIA_VISIBLE_DEVICES="][..],
        &[][..],
    ] {
        let mut b = Bundle::busybox();
        for kv in env {
            b.env(kv);
        }
        b.sh(&probe.script());
        let before = b.config_bytes();
        let runc = Runc::new(&sim);
        let id = runc.id("nothing");
        let out = runc.run(&b, &id);
        out.ok();
        let r = Report::parse(&out.stdout);
        assert_eq!(extra_dev(&r.ls("/dev")), names(&[]), "{env:?}: {}", r.raw);
        assert!(r.ls("/usr/lib64").is_empty(), "{env:?}: {}", r.raw);
        assert!(!r.ls("/usr/bin").contains("nvidia-smi"), "{env:?}");
        assert_eq!(b.config_bytes(), before, "{env:?}: config.json changed");
    }
}

#[test]
fn bad_index_is_one_clear_error_and_no_container() {
    require_root();
    let sim = SimRoot::standard();
    // "ALL": keywords are lower case, and the error says so (issue 16 item 9).
    for value in ["9", "GPU-00000000-dead-beef", "ALL"] {
        let mut b = Bundle::busybox();
        b.env(&format!("NVIDIA_VISIBLE_DEVICES={value}"))
            .sh("echo should-not-run");
        let meta_before = std::fs::metadata(b.config_path()).unwrap();
        let before = b.config_bytes();
        let runc = Runc::new(&sim);
        let id = runc.id("bad");
        let log = runc.scratch().join("engine.log");
        // containerd's global flags: the error must also land in its log as a JSON line.
        let out = runc.shim(&[
            "--log".as_ref(),
            log.as_os_str(),
            "--log-format".as_ref(),
            "json".as_ref(),
            "run".as_ref(),
            "--bundle".as_ref(),
            b.path().as_os_str(),
            id.as_ref(),
        ]);
        assert_ne!(out.code, 0, "{value}: {out:#?}");
        assert_eq!(out.stdout, "", "{value}: the shim wrote to stdout");
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{value}: not one line: {:?}", out.stderr);
        let line = lines[0];
        assert!(
            line.contains("NVIDIA_VISIBLE_DEVICES") && line.contains(value),
            "{value}: the error does not name the variable and value: {line}"
        );
        // ... and what exists: both GPUs' UUIDs (or indices).
        for g in sim.gpus() {
            assert!(
                line.contains(&g.uuid[..12]),
                "{value}: the error does not say what exists ({}): {line}",
                g.uuid
            );
        }

        assert_eq!(
            b.config_bytes(),
            before,
            "{value}: config.json changed on error"
        );
        let meta_after = std::fs::metadata(b.config_path()).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            meta_before.ino(),
            meta_after.ino(),
            "{value}: file replaced"
        );
        assert!(!runc.exists(&id), "{value}: runc state knows {id}");
        let list = runc.runc(&["list", "-q"]);
        list.ok();
        assert!(
            !list.stdout.lines().any(|l| l == id),
            "{value}: runc list shows {id}"
        );

        let engine_log = std::fs::read_to_string(&log).expect("the engine's --log file");
        let last: Value = serde_json::from_str(engine_log.lines().last().unwrap())
            .unwrap_or_else(|e| panic!("{value}: not a JSON line ({e}): {engine_log}"));
        assert_eq!(last["level"], "error", "{engine_log}");
        assert!(
            last["msg"].as_str().unwrap().contains(value),
            "{engine_log}"
        );
        assert!(last["time"].is_string(), "{engine_log}");
        assert!(
            runc.shim_log().contains(value),
            "the shim's own log lacks the error: {}",
            runc.shim_log()
        );
        // The ERROR line names the container, as the INFO line of a create does.
        assert!(
            runc.shim_log()
                .lines()
                .any(|l| l.contains(" ERROR ") && l.contains(&format!("run {id}: "))),
            "no ERROR line naming {id}: {}",
            runc.shim_log()
        );
        if value == "ALL" {
            assert!(line.contains("keywords are lower case"), "{line}");
        }
    }
}

#[test]
fn enflame_1_3_gives_gcu1_gcu3_gcuctl_only() {
    require_root();
    let sim = SimRoot::standard();
    let probe = Probe::new()
        .ls("/dev")
        .ls("/usr/lib64")
        .ls("/usr/bin")
        .open("/dev/gcu1")
        .open("/dev/gcu3")
        .open("/dev/gcuctl")
        .open("/dev/gcu0")
        .cmd("efsmi", "efsmi");
    let (r, _) = run_probe(&sim, &["ENFLAME_VISIBLE_DEVICES=1,3"], &probe);
    assert_enflame_1_3(&r, "");
    // The soname and its development name (profile `dev-links`), both the driver's file.
    assert_eq!(
        r.ls("/usr/lib64"),
        names(&["libefml.so", "libefml.so.1"]),
        "{}",
        r.raw
    );
    assert_eq!(r.section("efsmi"), ["efsmi (simulated)"], "{}", r.raw);
}

#[test]
fn device_still_opens_after_runc_update_cpuset() {
    require_root();
    let sim = SimRoot::standard();
    let mut b = Bundle::busybox();
    b.env("NVIDIA_VISIBLE_DEVICES=1").args(&["sleep", "1000"]);
    let runc = Runc::new(&sim);
    let id = runc.id("update");
    let created = runc.create(&b, &id);
    created.ok();
    assert_eq!(created.stdout, "", "the shim wrote to stdout on create");
    runc.start(&id).ok();

    // cgroup v1 and v2 keep these files in different places.
    let probe = Probe::new()
        .open("/dev/nvidia1")
        .open("/dev/nvidiactl")
        .cmd(
            "cpus",
            "cat /sys/fs/cgroup/cpuset/cpuset.cpus 2>/dev/null || cat /sys/fs/cgroup/cpuset.cpus",
        )
        .cmd(
            "pids",
            "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
        )
        .cmd("devices", "cat /sys/fs/cgroup/devices/devices.list");
    let before = Report::parse(&runc.exec(&id, &probe.script()).ok().stdout);
    assert_eq!(before.open("/dev/nvidia1"), Open::Enxio, "{}", before.raw);

    // What kubelet's CPU manager (static policy) does to every running container.
    runc.update(&id, &["--cpuset-cpus", "0"]).ok();

    let after = Report::parse(&runc.exec(&id, &probe.script()).ok().stdout);
    assert_eq!(
        after.section("cpus"),
        ["0"],
        "update did not apply: {}",
        after.raw
    );
    assert_eq!(after.open("/dev/nvidia1"), Open::Enxio, "{}", after.raw);
    assert_eq!(after.open("/dev/nvidiactl"), Open::Enxio, "{}", after.raw);
    if cgroup_v1() {
        assert!(
            after.section("devices").iter().any(|l| l == "c 195:1 rwm"),
            "the device rule is gone after update: {}",
            after.raw
        );
    }

    // `update --resources -` streams JSON on stdin: the shim must leave it all to runc.
    let out = runc.shim_stdin(
        &["update", "--resources", "-", id.as_str()],
        br#"{"pids": {"limit": 321}}"#,
    );
    out.ok();
    let after = Report::parse(&runc.exec(&id, &probe.script()).ok().stdout);
    assert_eq!(after.section("pids"), ["321"], "{}", after.raw);
    assert_eq!(after.open("/dev/nvidia1"), Open::Enxio, "{}", after.raw);

    runc.delete(&id).ok();
    assert!(!runc.exists(&id));
}

#[test]
fn ascend_profile_file_works_without_code() {
    require_root();
    let sim = SimRoot::builder()
        .ascend(2)
        .library(
            "/usr/local/Ascend/driver/lib64",
            "libascend_hal.so",
            "libascend_hal.so",
        )
        .binary(
            "/usr/local/bin/npu-smi",
            "#!/bin/sh\necho 'npu-smi (simulated)'\n",
        )
        .build();
    let probe = Probe::new()
        .ls("/dev")
        .ls("/usr/lib64")
        .open("/dev/davinci0")
        .open("/dev/davinci1")
        .open("/dev/davinci_manager")
        .cmd("npu-smi", "npu-smi");
    // Runc::new installs config/profiles/ascend.toml into the config's profiles-dir.
    let (r, _) = run_probe(&sim, &["ASCEND_VISIBLE_DEVICES=0"], &probe);
    r.assert_extra_dev(&["davinci0", "davinci_manager", "devmm_svm", "hisi_hdc"]);
    assert_eq!(r.open("/dev/davinci0"), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open("/dev/davinci_manager"), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open("/dev/davinci1"), Open::Absent, "{}", r.raw);
    assert_eq!(
        r.ls("/usr/lib64"),
        names(&["libascend_hal.so"]),
        "{}",
        r.raw
    );
    assert_eq!(r.section("npu-smi"), ["npu-smi (simulated)"], "{}", r.raw);
}

#[test]
fn no_variable_leaves_config_json_untouched() {
    use std::os::unix::fs::MetadataExt;
    require_root();
    let sim = SimRoot::standard();
    let mut b = Bundle::busybox();
    b.sh("ls /dev");
    // Make any rewrite visible in the mtime even on coarse clocks.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(b.config_path())
        .unwrap()
        .set_modified(old)
        .unwrap();
    let before = std::fs::metadata(b.config_path()).unwrap();
    let bytes = b.config_bytes();
    let runc = Runc::new(&sim);
    let id = runc.id("plain");
    runc.run(&b, &id).ok();
    let after = std::fs::metadata(b.config_path()).unwrap();
    assert_eq!(b.config_bytes(), bytes);
    assert_eq!(before.ino(), after.ino(), "config.json was replaced");
    assert_eq!(before.mtime(), after.mtime(), "config.json was rewritten");
    assert_eq!(before.mtime_nsec(), after.mtime_nsec());
    assert_eq!(before.mode(), after.mode());
}

const DLOPEN_PROGRAM: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*f)(void) = (int (*)(void))dlsym(h, "accel_sim_marker");
    if (!f) { printf("dlsym failed: %s\n", dlerror()); return 1; }
    printf("accel_sim_marker=%d\n", f());
    return 0;
}
"#;

#[test]
fn glibc_dlopen_by_soname_with_the_images_own_ld_so_cache() {
    require_root();
    let sim = SimRoot::standard();
    let src = tempfile::tempdir().unwrap();
    let program = compile_program(src.path(), "dlprobe", DLOPEN_PROGRAM);
    let mut b = Bundle::glibc(&program);
    b.args(&["/usr/bin/dlprobe"]);
    let cache = std::fs::read(b.rootfs().join("etc/ld.so.cache")).unwrap();
    assert!(
        cache.windows(6).any(|w| w == b"libc.s"),
        "the image's cache should list its own libc"
    );
    assert!(
        !cache.windows(7).any(|w| w == b"libcuda"),
        "the image's cache must know nothing of the driver"
    );
    let runc = Runc::new(&sim);

    // Control: without a request the image cannot load the library.
    let id = runc.id("dl-none");
    let out = runc.run(&b, &id);
    assert_ne!(out.code, 0, "{out:#?}");
    assert!(out.stdout.starts_with("dlopen failed"), "{out:#?}");

    b.env("NVIDIA_VISIBLE_DEVICES=0");
    let id = runc.id("dl");
    let out = runc.run(&b, &id);
    out.ok();
    assert_eq!(out.stdout, format!("accel_sim_marker={MARKER_VALUE}\n"));
    // The library is mounted at its soname in glibc's default directory.
    let mounts = b.read_spec()["mounts"].clone();
    assert!(
        mounts
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{mounts:#}"
    );
    // The image's cache now also lists the driver's library (tests/e2e_ldcache.rs), and
    // still its own libc.
    let merged = std::fs::read(b.rootfs().join("etc/ld.so.cache")).unwrap();
    assert_ne!(merged, cache);
    assert!(merged.windows(12).any(|w| w == b"libcuda.so.1"));
    assert!(merged.windows(9).any(|w| w == b"libc.so.6"));
}

#[test]
fn group_of_a_restricted_node_is_added_for_a_non_root_user() {
    require_root();
    let sim = SimRoot::standard_builder()
        .gpu_node_access(0o660, 44)
        .build();
    let mut b = Bundle::busybox();
    b.env("NVIDIA_VISIBLE_DEVICES=1")
        .sh(&Probe::new().open("/dev/nvidia1").cmd("id", "id").script())
        .edit(|s| s["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000}));
    let runc = Runc::new(&sim);
    let id = runc.id("gid");
    let out = runc.run(&b, &id);
    out.ok();
    let r = Report::parse(&out.stdout);
    assert_eq!(r.open("/dev/nvidia1"), Open::Enxio, "{}", r.raw);
    let spec = b.read_spec();
    assert_eq!(
        spec["process"]["user"]["additionalGids"],
        serde_json::json!([44]),
        "{spec:#}"
    );
    let node = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == "/dev/nvidia1")
        .unwrap()
        .clone();
    assert_eq!(
        (node["fileMode"].as_u64(), node["gid"].as_u64()),
        (Some(0o660), Some(44))
    );

    // Control, with plain runc: the same spec without the group cannot open the node.
    b.edit(|s| {
        *s = spec.clone();
        s["process"]["user"]
            .as_object_mut()
            .unwrap()
            .remove("additionalGids");
    });
    let id = runc.id("gid-control");
    let out = runc.runc(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    out.ok();
    let r = Report::parse(&out.stdout);
    assert_eq!(r.open("/dev/nvidia1"), Open::Eacces, "{}", r.raw);
}

/// `docker run -e NVIDIA_VISIBLE_DEVICES=0 --gpus all` writes the variable twice (captured in
/// tests/fixtures/specs/docker-20.10-run-gpus.json); runc sets the entries in order, so the
/// container sees the last one. The devices must match what the container sees.
#[test]
fn duplicate_variable_last_entry_wins_as_in_the_container() {
    require_root();
    let sim = SimRoot::standard();
    let probe = nvidia_probe(&sim).cmd("env", "echo $NVIDIA_VISIBLE_DEVICES");
    let (r, _) = run_probe(
        &sim,
        &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1"],
        &probe,
    );
    assert_eq!(r.section("env"), ["1"], "{}", r.raw);
    // Index 1 is the GPU on bus 0000:af:00.0, minor 1.
    r.assert_extra_dev(&["nvidia1", "nvidia-uvm", "nvidiactl"]);
}

/// Engines retry a failed start on the same bundle: a second create adds nothing twice.
#[test]
fn second_create_on_the_same_bundle_adds_nothing() {
    require_root();
    let sim = SimRoot::standard();
    let mut b = Bundle::busybox();
    b.env("NVIDIA_VISIBLE_DEVICES=all")
        .env("ENFLAME_VISIBLE_DEVICES=0")
        .sh(&Probe::new().ls("/dev").script());
    let runc = Runc::new(&sim);
    let first = runc.id("twice");
    runc.run(&b, &first).ok();
    let once = b.config_bytes();
    let second = runc.id("twice");
    let out = runc.run(&b, &second);
    out.ok();
    assert_eq!(
        String::from_utf8_lossy(&b.config_bytes()),
        String::from_utf8_lossy(&once)
    );
    let r = Report::parse(&out.stdout);
    r.assert_extra_dev(&[
        "nvidia1",
        "nvidia3",
        "nvidia-uvm",
        "nvidiactl",
        "gcu0",
        "gcuctl",
    ]);
}

/// containerd parses runc's `runc version X` from stdout: it must come through untouched.
#[test]
fn version_keeps_runcs_stdout() {
    require_root();
    let sim = SimRoot::builder().build();
    let runc = Runc::new(&sim);
    let ours = runc.shim(&["--version"]);
    ours.ok();
    let low = low_level_runtime();
    // With the same --root: crun prints it (`rundir:`).
    let real = runc.runc(&["--version"]);
    assert_eq!(ours.stdout, real.stdout);
    assert!(
        ours.stdout.starts_with(&format!("{low} version ")),
        "{ours:#?}"
    );
}

/// Issue 13: every injected node gets its `char/MAJOR:MINOR` link (under the config's
/// `host-dev-dir`, here a scratch dir: the host's real /dev never gets a link to a temporary
/// node) before runc runs; an entry that resolves to another device is left alone, with a
/// warning, and the container still starts.
#[test]
fn dev_char_links_for_every_injected_node_never_replacing_another_device() {
    use std::os::unix::fs::MetadataExt;
    require_root();
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let dev = runc.scratch().join("dev");
    // nvidiactl (c 195:255) already has an entry, to another device.
    std::fs::create_dir_all(dev.join("char")).unwrap();
    std::os::unix::fs::symlink("/dev/null", dev.join("char/195:255")).unwrap();

    let mut b = Bundle::busybox();
    b.env("NVIDIA_VISIBLE_DEVICES=1").sh("true");
    let id = runc.id("devchar");
    runc.run(&b, &id).ok();

    let spec = b.read_spec();
    let devices = spec["linux"]["devices"].as_array().unwrap();
    assert!(!devices.is_empty());
    for d in devices {
        let (major, minor) = (d["major"].as_u64().unwrap(), d["minor"].as_u64().unwrap());
        let link = dev.join(format!("char/{major}:{minor}"));
        if (major, minor) == (195, 255) {
            assert_eq!(
                std::fs::read_link(&link).unwrap(),
                std::path::Path::new("/dev/null")
            );
            continue;
        }
        let target = std::fs::read_link(&link)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", link.display(), runc.shim_log()));
        assert!(target.starts_with(sim.path()), "{}", target.display());
        let rdev = std::fs::metadata(&link).unwrap().rdev();
        assert_eq!(rdev, nix::sys::stat::makedev(major, minor));
    }
    let log = runc.shim_log();
    assert!(
        log.contains("created ") && log.contains("/char/195:1 -> "),
        "{log}"
    );
    assert!(
        log.contains("char/195:255 is a link to /dev/null (c 1:3), not a link to"),
        "{log}"
    );
    // Nothing but the links themselves (no temporary names left).
    let names: Vec<String> = std::fs::read_dir(dev.join("char"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), devices.len(), "{names:?}");
}

/// Concurrent creates of containers asking for the same GPU all start, and leave one link.
#[test]
fn dev_char_links_concurrent_creates_all_succeed() {
    require_root();
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let ids: Vec<String> = (0..6)
        .map(|i| runc.id(&format!("devchar-par{i}")))
        .collect();
    std::thread::scope(|s| {
        for id in &ids {
            let runc = &runc;
            s.spawn(move || {
                let mut b = Bundle::busybox();
                b.env("NVIDIA_VISIBLE_DEVICES=0").sh("true");
                runc.run(&b, id).ok();
            });
        }
    });
    let link = runc.scratch().join("dev/char/195:3");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        sim.path().join("dev/nvidia3")
    );
    let created = runc.shim_log().matches("/char/195:3 -> ").count();
    assert_eq!(created, 1, "{}", runc.shim_log());
}

/// Issue 14, class 12: a container started with a good config keeps answering `state`,
/// `kill` and `delete` through the shim after config.toml is broken (an unquoted value) and a
/// profile in profiles-dir stops parsing: the engine can still stop and remove it.
#[test]
fn broken_config_does_not_stop_state_kill_delete_of_a_running_container() {
    require_root();
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let mut b = Bundle::busybox();
    b.env("NVIDIA_VISIBLE_DEVICES=0").sh("sleep 600");
    let id = runc.id("broken-config");
    runc.create(&b, &id).ok();
    runc.start(&id).ok();

    let cfg = runc.config_path();
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replacen("log-level = \"debug\"", "log-level = debug", 1),
    )
    .unwrap();
    std::fs::write(runc.scratch().join("profiles.d/broken.toml"), "name = [").unwrap();
    // A create that needs the profiles is refused, naming the file.
    let refused = runc.create(&b, &runc.id("refused"));
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("config.toml"), "{refused:?}");

    let state = runc.shim(&["state", &id]);
    state.ok();
    assert!(state.stdout.contains("\"running\""), "{state:?}");
    runc.shim(&["kill", &id, "KILL"]).ok();
    let stopped = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        runc.shim(&["state", &id]).stdout.contains("\"stopped\"")
    });
    assert!(stopped, "not stopped after kill");
    runc.shim(&["delete", &id]).ok();
    assert!(!runc.exists(&id));
    assert!(runc.shim_log().contains("WARN"), "{}", runc.shim_log());
}

/// Issue 14, class 1, through real runc: on a node that takes device lists from mounts only,
/// an unprivileged container with an ordinary volume (tmpfs) at
/// `/var/run/nvidia-container-devices/all` starts with no GPU; a bind of /dev/null at
/// `.../0` (what a device plugin mounts) gives it GPU 0 and nothing else.
#[test]
fn device_list_volume_named_all_gives_nothing_and_a_dev_null_bind_gives_gpu_0() {
    require_root();
    let sim = SimRoot::standard();
    let runc = Runc::with_config(
        &sim,
        "accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true",
    );
    let dir = "/var/run/nvidia-container-devices";
    let probe = nvidia_probe(&sim);
    let run = |mount: Value| -> Report {
        let mut b = Bundle::busybox();
        b.sh(&probe.script());
        b.edit(|s| s["mounts"].as_array_mut().unwrap().push(mount));
        let caps = b.read_spec()["process"]["capabilities"]["bounding"].clone();
        assert!(
            !caps
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c == "CAP_SYS_ADMIN"),
            "the container must be unprivileged"
        );
        let id = runc.id("mount-list");
        let out = runc.run(&b, &id);
        out.ok();
        Report::parse(&out.stdout)
    };
    let r = run(serde_json::json!({
        "destination": format!("{dir}/all"), "type": "tmpfs", "source": "tmpfs",
        "options": ["nosuid", "nodev", "mode=755"]
    }));
    r.assert_extra_dev(&[]);

    let first = &sim.gpus()[0];
    let r = run(serde_json::json!({
        "destination": format!("{dir}/0"), "type": "bind", "source": "/dev/null",
        "options": ["rbind", "ro"]
    }));
    let want = first.node();
    let want = want.trim_start_matches("/dev/");
    r.assert_extra_dev(&[want, "nvidia-uvm", "nvidiactl"]);
    assert_eq!(r.open(&first.node()), Open::Enxio, "{}", r.raw);
}

/// Issue 14, class 11, through real runc: `create --help`, `create -h` and `run -h` print
/// runc's help and exit 0, as runc alone does (no ./config.json is read). crun (argp) knows
/// only `--help`, and prints `Usage: crun [OPTION...] create ...`.
#[test]
fn create_and_run_help_print_runc_s_help() {
    require_root();
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let cwd = tempfile::tempdir().unwrap();
    let low = low_level_runtime();
    let cases: &[&[&str]] = if low == "runc" {
        &[&["create", "--help"], &["create", "-h"], &["run", "-h"]]
    } else {
        &[&["create", "--help"], &["run", "--help"]]
    };
    for args in cases {
        let out = output(
            Command::new(&*SHIM)
                .env("ACCEL_CONTAINER_RUNTIME_CONFIG", runc.config_path())
                .current_dir(cwd.path())
                .args(*args),
        );
        out.ok();
        let direct = output(Command::new(&low).current_dir(cwd.path()).args(*args));
        assert_eq!(out.stdout, direct.stdout, "{args:?}");
        let subcommand = if low == "runc" {
            format!("runc {}", args[0])
        } else {
            format!(" {} ", args[0])
        };
        assert!(out.stdout.contains(&subcommand), "{out:?}");
    }
}
