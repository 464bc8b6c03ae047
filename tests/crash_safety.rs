//! Crash safety of the config.json rewrite: the shim is SIGKILLed at every step of the atomic
//! replace (test-only failpoints, cargo feature `failpoints`), and also at random instants of a
//! whole create; afterwards config.json parses and is byte-for-byte either the original or the
//! fully edited spec, never truncated or empty.
//!
//! Run with `cargo test --features failpoints --test crash_safety` (needs root: mknod).
//!
//! Temp files: a kill after the temp file exists and before the rename leaves one hidden
//! `.config.json.accel-<random>.tmp` in the bundle (nothing can run at a SIGKILL). The next
//! create of the bundle removes it (issue 14, class 10: only names `atomic::is_temp_of`
//! matches). The tests below pin that at most one such file is left, that it never disturbs
//! the next create, and that the next create leaves none.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use accel_container_runtime::atomic::{FAILPOINTS, FAILPOINT_ENV};
use serde_json::Value;

// Always cargo's build, never `ACCEL_TEST_BINARIES`' (tests/common: `binary`): the
// failpoints are compiled into no shipped build.
const SHIM: &str = env!("CARGO_BIN_EXE_accel-container-runtime");

struct Bundle {
    dir: tempfile::TempDir,
    original: Vec<u8>,
    edited: Vec<u8>,
}

impl Bundle {
    fn new() -> Bundle {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("driver");
        std::fs::create_dir_all(root.join("dev")).unwrap();
        for i in 0..4u64 {
            let bus = format!("0000:{:02x}:00.0", 0x18 + i);
            let d = root.join("proc/driver/nvidia/gpus").join(&bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("GPU UUID: \t\t GPU-{i:08}-0000-1111-2222-333333333333\nBus Location: \t\t {bus}\nDevice Minor: \t\t {i}\n"),
            )
            .unwrap();
            let node = root.join(format!("dev/nvidia{i}"));
            mknod(
                &node,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(195, i),
            )
            .unwrap_or_else(|e| panic!("mknod {} (this test needs root): {e}", node.display()));
        }
        let runtime = dir.path().join("runtime");
        std::fs::write(&runtime, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "low-level-runtime = {runtime:?}\nlog-file = {:?}\nprofiles-dir = {:?}\nhost-dev-dir = {:?}\n[profiles.nvidia]\ndriver-root = {root:?}\n",
                dir.path().join("shim.log"),
                dir.path().join("profiles.d"),
                dir.path().join("dev"),
            ),
        )
        .unwrap();
        let mut spec: Value =
            serde_json::from_str(include_str!("fixtures/specs/docker-20.10-run.json")).unwrap();
        let env = spec["process"]["env"].as_array_mut().unwrap();
        env.retain(|e| !e.as_str().unwrap().starts_with("NVIDIA_"));
        env.push("NVIDIA_VISIBLE_DEVICES=all".into());
        let original = serde_json::to_vec_pretty(&spec).unwrap();
        std::fs::create_dir_all(dir.path().join("bundle")).unwrap();
        let mut b = Bundle {
            dir,
            original,
            edited: Vec::new(),
        };
        b.restore();
        let status = b.create(None);
        assert!(status.success(), "uninterrupted create failed: {status:?}");
        b.edited = std::fs::read(b.config_json()).unwrap();
        let v: Value = serde_json::from_slice(&b.edited).unwrap();
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 4);
        b.restore();
        b
    }

    fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }

    fn config_json(&self) -> PathBuf {
        self.bundle().join("config.json")
    }

    fn restore(&self) {
        for e in std::fs::read_dir(self.bundle()).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        std::fs::write(self.config_json(), &self.original).unwrap();
    }

    fn command(&self, failpoint: Option<&str>) -> Command {
        let mut c = Command::new(SHIM);
        c.args(["create", "--bundle", self.bundle().to_str().unwrap(), "ctr"])
            .env(
                "ACCEL_CONTAINER_RUNTIME_CONFIG",
                self.dir.path().join("config.toml"),
            )
            .env_remove(FAILPOINT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(fp) = failpoint {
            c.env(FAILPOINT_ENV, fp);
        }
        c
    }

    fn create(&self, failpoint: Option<&str>) -> std::process::ExitStatus {
        self.command(failpoint).status().expect("run shim")
    }

    /// config.json is exactly one of the two documents; returns which.
    fn state(&self) -> &'static str {
        let now = std::fs::read(self.config_json()).expect("config.json exists");
        assert!(!now.is_empty(), "config.json is empty");
        serde_json::from_slice::<Value>(&now).expect("config.json parses");
        if now == self.original {
            "original"
        } else if now == self.edited {
            "edited"
        } else {
            panic!(
                "config.json is neither the original nor the edited spec ({} bytes)",
                now.len()
            )
        }
    }

    fn temp_files(&self) -> Vec<String> {
        std::fs::read_dir(self.bundle())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "config.json")
            .collect()
    }
}

fn check_temp_names(names: &[String]) {
    assert!(names.len() <= 1, "{names:?}");
    for n in names {
        assert!(n.starts_with(".config.json.") && n.ends_with(".tmp"), "{n}");
    }
}

#[test]
fn sigkill_at_every_step_of_the_rewrite() {
    let b = Bundle::new();
    let mut report = Vec::new();
    for fp in FAILPOINTS {
        b.restore();
        let status = b.create(Some(fp));
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "{fp}: the failpoint did not fire ({status:?}); build with --features failpoints"
        );
        let state = b.state();
        // Up to the rename the original stands; from the rename on, the edited spec.
        let want = if fp == "before-dir-fsync" {
            "edited"
        } else {
            "original"
        };
        assert_eq!(state, want, "after SIGKILL at {fp}");
        let temps = b.temp_files();
        check_temp_names(&temps);
        let leaves_temp = matches!(fp, "after-partial-write" | "before-fsync" | "before-rename");
        assert_eq!(!temps.is_empty(), leaves_temp, "{fp}: {temps:?}");
        // The next create (the engine retrying) ends with the edited spec, whatever was left.
        assert!(b.create(None).success(), "create after a crash at {fp}");
        assert_eq!(b.state(), "edited", "create after a crash at {fp}");
        assert_eq!(
            b.temp_files(),
            Vec::<String>::new(),
            "after the create after {fp}"
        );
        report.push(format!("{fp}: {state}, temp files left: {}", temps.len()));
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn sigkill_at_random_instants() {
    let b = Bundle::new();
    let (mut original, mut edited) = (0, 0);
    // Delays spread over 1.5 times a whole create (measured here, so a slow or loaded machine
    // still covers every step), from a fixed seed so a failure can be replayed.
    let mut whole = Duration::ZERO;
    for _ in 0..3 {
        b.restore();
        let start = Instant::now();
        assert!(b.create(None).success());
        whole = whole.max(start.elapsed());
    }
    let span = (whole.as_micros() as u64 * 3 / 2).max(1);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200 {
        b.restore();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % span);
        let mut child = b.command(None).spawn().expect("spawn");
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        match b.state() {
            "original" => original += 1,
            _ => edited += 1,
        }
        check_temp_names(&b.temp_files());
    }
    eprintln!("random SIGKILL over {span} us: {original} original, {edited} edited");
    assert!(
        original > 0 && edited > 0,
        "delays missed the window: {original} original, {edited} edited"
    );
}
