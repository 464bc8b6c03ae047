//! End-to-end through real runc (issue 2): the shim is called as runc would be, on a simulated
//! accelerator host (tests/common), and what the container gets is checked from inside it.
//! Needs root, runc, busybox-static, gcc; fails (never skips) without them.

mod common;

use common::*;

/// `ls /dev`, open every node the tests care about, the library and binary dirs.
fn nvidia_probe(sim: &SimRoot) -> Probe {
    let mut p = Probe::new()
        .ls("/dev")
        .ls("/usr/lib64")
        .ls("/usr/bin")
        .open("/dev/nvidiactl");
    for g in sim.gpus() {
        p = p.open(&g.node());
    }
    p
}

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

    assert_eq!(
        extra_dev(&r.ls("/dev")),
        names(&["nvidia1", "nvidia-uvm", "nvidiactl"]),
        "{}",
        r.raw
    );
    assert_eq!(r.open(&second.node()), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open("/dev/nvidiactl"), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open(&first.node()), Open::Absent, "{}", r.raw);
    let mknod = r.section("mknod").join("\n");
    assert!(
        mknod.starts_with("made\n")
            && mknod.contains("can't open '/dev/probe': Operation not permitted"),
        "opening an unrequested GPU made with mknod must be EPERM (cgroup), got: {mknod}"
    );
    // Libraries at their sonames in glibc's default dir for this (non-Debian) image, binaries.
    let libs = r.ls("/usr/lib64");
    assert!(libs.contains("libcuda.so.1"), "{}", r.raw);
    assert!(libs.contains("libnvidia-ml.so.1"), "{}", r.raw);
    assert!(!libs.contains("libefml.so.1"), "{}", r.raw);
    assert!(r.ls("/usr/bin").contains("nvidia-smi"), "{}", r.raw);
}
