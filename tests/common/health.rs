//! The health engine's end-to-end set-ups, shared by tests/device_plugin.rs, tests/dra.rs and
//! tests/exporter.rs: a simulated PCI function's counters, the daemons' fast health settings,
//! a stand-in vendor tool, the taints of a published pool.
//!
//! Counter files are written as the kernel lays them out (see src/health/signals.rs for the
//! Refs): `aer_dev_fatal` / `aer_dev_nonfatal` with `NAME count` lines and the total last,
//! amdgpu's `ras/<block>_err_count` with `ue:` and `ce:` lines.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// PCI function `bdf`'s directory under `root`: the real one its `sys/bus/pci/devices` link
/// points at (where the counters are written).
pub fn function(root: &Path, bdf: &str) -> PathBuf {
    root.join("sys/bus/pci/devices")
        .join(bdf)
        .canonicalize()
        .unwrap()
}

/// GCU `n`'s PCI function under `root`, as `kubelet::enflame_sysfs` lays them out
/// (`0000:1n:00.0`).
pub fn gcu_function(root: &Path, n: u32) -> PathBuf {
    function(root, &format!("0000:{:02x}:00.0", 0x10 + n))
}

/// The AER fatal counter of the function in `dir` at `fatal`.
pub fn aer_fatal(dir: &Path, fatal: u64) {
    std::fs::write(
        dir.join("aer_dev_fatal"),
        format!("Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nTOTAL_ERR_FATAL {fatal}\n"),
    )
    .unwrap();
}

/// The AER non-fatal counter of the function in `dir` at `nonfatal`.
pub fn aer_nonfatal(dir: &Path, nonfatal: u64) {
    std::fs::write(
        dir.join("aer_dev_nonfatal"),
        format!("Undefined 0\nTLP 0\nTOTAL_ERR_NONFATAL {nonfatal}\n"),
    )
    .unwrap();
}

/// amdgpu's RAS counter of `block` of the function in `dir`.
pub fn ras(dir: &Path, block: &str, ue: u64, ce: u64) {
    std::fs::create_dir_all(dir.join("ras")).unwrap();
    std::fs::write(
        dir.join(format!("ras/{block}_err_count")),
        format!("ue: {ue}\nce: {ce}\n"),
    )
    .unwrap();
}

/// The health settings the in-process daemons (DRA driver) run under in tests: sysfs read
/// every 100 ms, held down 1 s.
pub fn fast() -> accel_container_runtime::health::Settings {
    accel_container_runtime::health::Settings {
        interval: Duration::from_millis(100),
        hold_down: Duration::from_secs(1),
    }
}

/// The same for a daemon binary (the exporter): its poll and health flags.
pub const FAST_FLAGS: [&str; 3] = [
    "--poll-seconds=0.2",
    "--health-interval-seconds=0.2",
    "--health-hold-down-seconds=1",
];

/// A stand-in `efsmi` in `root`'s `usr/bin` (busybox its `sh`, `sleep` and `cat`, so it runs
/// chrooted there): asked for `bus_id,health` it prints `/efsmi-health.csv`, or hangs while
/// `/efsmi-hangs` exists. Returns the writer of GCU 1's health (GCU 0 always `OK`).
pub fn stand_in_efsmi(root: &Path) -> impl Fn(&str) + '_ {
    std::fs::create_dir_all(root.join("bin")).unwrap();
    for applet in ["sh", "sleep", "cat"] {
        std::fs::copy("/bin/busybox", root.join("bin").join(applet)).unwrap();
    }
    let efsmi = root.join("usr/bin/efsmi");
    std::fs::create_dir_all(efsmi.parent().unwrap()).unwrap();
    std::fs::write(
        &efsmi,
        "#!/bin/sh\n[ \"$1\" = --query-gcu=bus_id,health ] || exit 0\n\
         [ -e /efsmi-hangs ] && exec sleep 60\ncat /efsmi-health.csv\n",
    )
    .unwrap();
    std::fs::set_permissions(&efsmi, std::fs::Permissions::from_mode(0o755)).unwrap();
    move |one: &str| {
        std::fs::write(
            root.join("efsmi-health.csv"),
            format!("0000:10:00.0, OK\n0000:11:00.0, {one}\n"),
        )
        .unwrap()
    }
}

/// The names of the devices of `slices` (ResourceSlices as JSON) that carry a taint.
pub fn tainted(slices: &[serde_json::Value]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d.get("taints").is_some())
        .map(|d| d["name"].as_str().unwrap_or_default().to_string())
        .collect()
}
