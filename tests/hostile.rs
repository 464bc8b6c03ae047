//! Hostile and broken input, at the binary: the real `accel-container-runtime` runs against a
//! bundle, a config.toml and a simulated NVIDIA driver root (mknod, real major 195) made here,
//! with a low-level runtime that is a script recording that it ran. A refusal must be one line
//! on stderr naming what was wrong, a non-zero exit, the bundle byte-for-byte unchanged and the
//! low-level runtime never executed (so no container is made).
//!
//! Needs root (mknod): CI runs as root; elsewhere these tests fail loudly, never skip.
//! Decisions pinned here (issue 5):
//! - `linux` missing with a device request: handled, the sections are created (runc needs
//!   nothing else there), so the container gets its devices instead of an error.
//! - `process` missing, or an env entry without `=`: read as getenv would (no entry, entry
//!   skipped); the shim adds no error of its own and runc judges the rest of the spec.
//! - a profile without `driver-root` means `/` (the documented default), not an error.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{mknod, SHIM};
use serde_json::{json, Value};

const DOCKER_SPEC: &str = include_str!("fixtures/specs/docker-20.10-run.json");

/// Three GPUs; the first two share an 8-character UUID prefix.
const UUIDS: [&str; 3] = [
    "GPU-12345678-aaaa-bbbb-cccc-000000000000",
    "GPU-12345678-dddd-eeee-ffff-111111111111",
    "GPU-87654321-aaaa-bbbb-cccc-222222222222",
];

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    /// A simulated driver root, a bundle with docker's config.json (no device variable), a
    /// recording low-level runtime and a config.toml pointing at both.
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Env { dir };
        let root = e.root();
        for (i, uuid) in UUIDS.iter().enumerate() {
            let bus = format!("0000:{:02x}:00.0", 0x18 + i);
            let d = root.join("proc/driver/nvidia/gpus").join(&bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("Model: \t\t NVIDIA H100\nGPU UUID: \t\t {uuid}\nBus Location: \t\t {bus}\nDevice Minor: \t\t {i}\n"),
            )
            .unwrap();
            mknod(&root.join(format!("dev/nvidia{i}")), 195, i as u32, 0o666);
        }
        mknod(&root.join("dev/nvidiactl"), 195, 255, 0o666);
        std::fs::create_dir_all(e.bundle()).unwrap();
        e.set_env(&[]);
        let runtime = e.path("runtime");
        std::fs::write(
            &runtime,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\n",
                e.path("runtime-called").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        e.config("");
        e
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn root(&self) -> PathBuf {
        self.path("driver")
    }
    fn bundle(&self) -> PathBuf {
        self.path("bundle")
    }
    fn config_json(&self) -> PathBuf {
        self.bundle().join("config.json")
    }

    /// config.toml: the recording runtime, a private log, the simulated root, plus `extra`
    /// top-level keys and tables.
    fn config(&self, extra: &str) {
        let (top, tables) = extra
            .split_once("\n[")
            .map_or((extra, String::new()), |(a, b)| (a, format!("\n[{b}")));
        std::fs::write(
            self.path("config.toml"),
            format!(
                "low-level-runtime = {:?}\nlog-file = {:?}\nprofiles-dir = {:?}\nhost-dev-dir = {:?}\n{top}\n[profiles.nvidia]\ndriver-root = {:?}\n{tables}\n",
                self.path("runtime"),
                self.path("shim.log"),
                self.path("profiles.d"),
                self.path("dev"),
                self.root(),
            ),
        )
        .unwrap();
    }

    /// docker's config.json with `env` added to process.env (device variables removed).
    fn set_env(&self, env: &[&str]) {
        let mut spec: Value = serde_json::from_str(DOCKER_SPEC).unwrap();
        let list = spec["process"]["env"].as_array_mut().unwrap();
        list.retain(|e| !e.as_str().unwrap().starts_with("NVIDIA_"));
        list.extend(env.iter().map(|e| json!(e)));
        self.write_spec(&serde_json::to_vec_pretty(&spec).unwrap());
    }

    fn write_spec(&self, data: &[u8]) {
        let _ = std::fs::remove_file(self.config_json());
        std::fs::write(self.config_json(), data).unwrap();
    }

    fn spec(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.config_json()).unwrap()).unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&*SHIM);
        c.args(args)
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", self.path("config.toml"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        c
    }

    fn create(&self) -> Output {
        self.run(&["create", "--bundle", self.bundle().to_str().unwrap(), "ctr"])
    }

    fn run(&self, args: &[&str]) -> Output {
        wait_with_timeout(self.command(args), Duration::from_secs(20))
    }

    fn runtime_ran(&self) -> bool {
        self.path("runtime-called").exists()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("shim.log")).unwrap_or_default()
    }

    /// Every file in the bundle, by name, with its bytes (temp files would show up here).
    fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(self.bundle())
            .map(|rd| {
                rd.map(|e| {
                    let e = e.unwrap();
                    let ft = e.file_type().unwrap();
                    let data = if ft.is_file() {
                        std::fs::read(e.path()).unwrap()
                    } else {
                        format!("{ft:?}").into_bytes()
                    };
                    (e.file_name().to_string_lossy().into_owned(), data)
                })
                .collect()
            })
            .unwrap_or_default()
    }

    /// Runs create and checks it was refused properly; returns the stderr line.
    fn refused(&self, what: &[&str]) -> String {
        let before = self.snapshot();
        let out = self.create();
        self.check_refusal(&out, what, &before)
    }

    fn check_refusal(
        &self,
        out: &Output,
        what: &[&str],
        before: &BTreeMap<String, Vec<u8>>,
    ) -> String {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "accepted; stderr: {stderr}");
        assert!(out.stdout.is_empty(), "wrote to stdout: {:?}", out.stdout);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "not one line: {stderr:?}");
        assert!(
            lines[0].starts_with("accel-container-runtime: "),
            "{stderr}"
        );
        for w in what {
            assert!(lines[0].contains(w), "{w:?} not in {stderr:?}");
        }
        assert!(!self.runtime_ran(), "low-level runtime ran after: {stderr}");
        assert!(self.snapshot() == *before, "bundle changed after: {stderr}");
        lines[0].to_string()
    }

    /// Create succeeded and the low-level runtime ran.
    fn accepted(&self) -> Value {
        let out = self.create();
        assert!(
            out.status.success(),
            "refused: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty());
        assert!(self.runtime_ran(), "low-level runtime not run");
        std::fs::remove_file(self.path("runtime-called")).unwrap();
        self.spec()
    }
}

/// Runs to completion, or kills the process and fails after `limit` (a FIFO must not hang).
fn wait_with_timeout(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shim");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // SAFETY: kill(2) on the pid of our own still-unreaped child.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("shim still running after {limit:?}");
        }
    }
}

fn device_paths(spec: &Value) -> Vec<String> {
    spec.pointer("/linux/devices")
        .and_then(Value::as_array)
        .map(|d| {
            d.iter()
                .map(|d| d["path"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

// ---- config.json -------------------------------------------------------------------------

#[test]
fn config_json_malformed() {
    let e = Env::new();
    e.write_spec(br#"{"ociVersion": "1.0.2", "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]"#);
    e.refused(&["config.json", "not valid JSON"]);
}

#[test]
fn config_json_empty() {
    let e = Env::new();
    e.write_spec(b"");
    e.refused(&["config.json", "not valid JSON"]);
}

#[test]
fn config_json_huge_is_refused_without_reading_it() {
    let e = Env::new();
    let f = std::fs::File::create(e.config_json()).unwrap();
    f.set_len(100 << 20).unwrap(); // sparse: 100 MB that costs nothing to make
    drop(f);
    let start = Instant::now();
    e.refused(&["config.json", "104857600 bytes", "limit"]);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn config_json_not_an_object() {
    let e = Env::new();
    for doc in [
        &b"[]"[..],
        b"null",
        b"\"NVIDIA_VISIBLE_DEVICES=all\"",
        b"42",
    ] {
        e.write_spec(doc);
        e.refused(&["config.json", "not a JSON object"]);
    }
}

#[test]
fn config_json_wrong_section_types() {
    let e = Env::new();
    let var = json!(["NVIDIA_VISIBLE_DEVICES=0"]);
    for (doc, key) in [
        (
            json!({"process": {"env": "NVIDIA_VISIBLE_DEVICES=0"}}),
            "`process/env`",
        ),
        (
            json!({"process": {"env": var}, "linux": {"devices": {}}}),
            "`linux/devices`",
        ),
        (json!({"process": {"env": var}, "linux": []}), "`linux`"),
        (json!({"process": {"env": var}, "mounts": {}}), "`mounts`"),
        (
            json!({"process": {"env": var, "user": 0}}),
            "`process/user`",
        ),
    ] {
        e.write_spec(doc.to_string().as_bytes());
        e.refused(&["config.json", key]);
    }
}

/// Asking for nothing, a spec the shim would not edit goes to runc as it is: runc judges
/// its own spec, the shim adds no error of its own (it is not even parsed into a document).
#[test]
fn config_json_wrong_section_types_without_request_pass_through() {
    let e = Env::new();
    let doc = br#"{"process": [], "linux": {"devices": {}}}"#;
    e.write_spec(doc);
    e.accepted();
    assert_eq!(std::fs::read(e.config_json()).unwrap(), doc);
}

#[test]
fn config_json_without_process_passes_through_unchanged() {
    let e = Env::new();
    let doc = br#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"linux":{}}"#;
    e.write_spec(doc);
    e.accepted();
    assert_eq!(std::fs::read(e.config_json()).unwrap(), doc);
}

#[test]
fn config_json_without_linux_gets_the_sections_it_needs() {
    let e = Env::new();
    let doc = json!({"ociVersion": "1.0.2", "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]}, "root": {"path": "rootfs"}});
    e.write_spec(doc.to_string().as_bytes());
    let spec = e.accepted();
    assert_eq!(device_paths(&spec), ["/dev/nvidia1", "/dev/nvidiactl"]);
    let linux = spec["linux"].as_object().unwrap();
    assert_eq!(
        linux.keys().collect::<Vec<_>>(),
        ["devices", "resources"],
        "{spec}"
    );
    assert_eq!(spec["process"], doc["process"]);
    assert_eq!(spec["root"], doc["root"]);
}

#[test]
fn config_json_env_with_invalid_utf8_is_refused() {
    let e = Env::new();
    let mut raw = br#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0","X="#.to_vec();
    raw.extend_from_slice(&[0xff, 0xfe, b'"', b']', b'}', b'}']);
    e.write_spec(&raw);
    e.refused(&["config.json", "not valid JSON"]);
    // A lone surrogate escape decodes to no valid string either.
    e.write_spec(br#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=\ud800"]}}"#);
    e.refused(&["config.json", "not valid JSON"]);
}

#[test]
fn config_json_env_entries_without_equals_are_skipped_like_getenv() {
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES", "JUNK", "NVIDIA_VISIBLE_DEVICES=2"]);
    let spec = e.accepted();
    assert_eq!(device_paths(&spec), ["/dev/nvidia2", "/dev/nvidiactl"]);
    // Only the entry without '=': no request at all, config.json not rewritten.
    e.set_env(&["NVIDIA_VISIBLE_DEVICES"]);
    let before = std::fs::read(e.config_json()).unwrap();
    e.accepted();
    assert_eq!(std::fs::read(e.config_json()).unwrap(), before);
}

#[test]
fn bundle_missing() {
    let e = Env::new();
    let out = e.run(&["create", "--bundle", "/nonexistent/bundle", "ctr"]);
    e.check_refusal(
        &out,
        &["/nonexistent/bundle/config.json", "No such file"],
        &e.snapshot(),
    );
}

#[test]
fn bundle_unreadable() {
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    // The shim runs as an unprivileged user here, so mode bits apply; everything but the
    // bundle is readable by it.
    for p in [e.dir.path().to_path_buf(), e.path("runtime")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(
        e.path("config.toml"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::set_permissions(e.bundle(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = e.snapshot();
    let mut cmd = e.command(&["create", "--bundle", e.bundle().to_str().unwrap(), "ctr"]);
    std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    let out = wait_with_timeout(cmd, Duration::from_secs(20));
    e.check_refusal(&out, &["config.json", "Permission denied"], &before);
}

#[test]
fn config_json_symlink_is_refused() {
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    std::fs::rename(e.config_json(), e.path("elsewhere.json")).unwrap();
    std::os::unix::fs::symlink(e.path("elsewhere.json"), e.config_json()).unwrap();
    let target_before = std::fs::read(e.path("elsewhere.json")).unwrap();
    e.refused(&["config.json"]);
    assert_eq!(
        std::fs::read(e.path("elsewhere.json")).unwrap(),
        target_before
    );
}

#[test]
fn config_json_fifo_is_refused_without_blocking() {
    let e = Env::new();
    std::fs::remove_file(e.config_json()).unwrap();
    nix::unistd::mkfifo(
        &e.config_json(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    // No writer ever opens the FIFO: a blocking open or read would hang (caught by the timeout).
    e.refused(&["config.json", "FIFO"]);
}

// ---- the variable ------------------------------------------------------------------------

#[test]
fn variable_values_that_name_no_device() {
    let e = Env::new();
    for value in [
        "../../etc",
        "/etc/shadow",
        "/dev/nvidia0",
        "-1",
        "99999999999999999999",
        "ALL",
        "All",
        "3",
        "GPU-00000000",
    ] {
        e.set_env(&[&format!("NVIDIA_VISIBLE_DEVICES={value}")]);
        let line = e.refused(&["NVIDIA_VISIBLE_DEVICES", "no device"]);
        assert!(line.contains(&format!("{value:?}")), "{line}");
    }
}

#[test]
fn variable_with_too_many_items() {
    let e = Env::new();
    let value = vec!["0"; 10_000].join(",");
    e.set_env(&[&format!("NVIDIA_VISIBLE_DEVICES={value}")]);
    let line = e.refused(&["NVIDIA_VISIBLE_DEVICES", "10000 items", "1024"]);
    assert!(
        line.len() < 400,
        "the whole value was echoed: {} bytes",
        line.len()
    );
}

#[test]
fn variable_with_empty_items_or_whitespace() {
    let e = Env::new();
    for (value, why) in [
        ("0,,1", "empty item"),
        (",0", "empty item"),
        ("0,", "empty item"),
        ("0, 1", "whitespace"),
        (" 0", "whitespace"),
        ("0\t", "whitespace"),
        ("all,0", "cannot be combined"),
    ] {
        e.set_env(&[&format!("NVIDIA_VISIBLE_DEVICES={value}")]);
        e.refused(&["NVIDIA_VISIBLE_DEVICES", why]);
    }
}

#[test]
fn variable_uuid_prefix_matching_two_gpus() {
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=GPU-12345678"]);
    e.refused(&[
        "NVIDIA_VISIBLE_DEVICES",
        "more than one",
        UUIDS[0],
        UUIDS[1],
    ]);
    // A prefix unique to one GPU selects it.
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=GPU-87654321"]);
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia2", "/dev/nvidiactl"]
    );
}

// ---- config.toml and profiles ------------------------------------------------------------

#[test]
fn unknown_config_and_profile_keys_are_logged() {
    let e = Env::new();
    std::fs::create_dir_all(e.path("profiles.d")).unwrap();
    let mut ascend = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/profiles/ascend.toml"
    ))
    .unwrap();
    ascend.insert_str(0, "driver-rot = \"/typo\"\n");
    std::fs::write(e.path("profiles.d/ascend.toml"), ascend).unwrap();
    e.config("lowlevel-runtime = \"crun\"\n[profiles.enflame]\ndriver-rot = \"/x\"");
    // A create builds the profiles its variables can involve (and every one config.toml
    // names): ascend.toml is read by this one because the spec sets its variable (`none`:
    // no Ascend device, nothing injected).
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0", "ASCEND_VISIBLE_DEVICES=none"]);
    e.accepted();
    let log = e.log();
    for key in ["lowlevel-runtime", "driver-rot", "enflame", "ascend.toml"] {
        assert!(
            log.lines().any(|l| l.contains(" WARN ") && l.contains(key)),
            "no warning for {key}: {log}"
        );
    }
}

/// Issue 42 item 5: a create never parses the tables only the daemons read, nor a profile no
/// variable of its spec can claim. A broken `[sharing]` and `[metrics]` in a profile the spec
/// asks for, and a file of another vendor that does not parse at all, leave the create of the
/// NVIDIA GPU as it was; what is wrong is the daemons' and the doctor's to say.
#[test]
fn the_creates_cost_grows_with_profile_sections_it_never_reads() {
    let e = Env::new();
    std::fs::create_dir_all(e.path("profiles.d")).unwrap();
    // Another vendor's file, broken past parsing: no variable of this spec can reach it.
    std::fs::write(e.path("profiles.d/broken.toml"), "name = [\n").unwrap();
    e.config("[profiles.nvidia.sharing]\nlimits = \"maybe\"\n[profiles.nvidia.metrics]\nfiles = 5");
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    let spec = e.accepted();
    assert_eq!(
        device_paths(&spec)
            .iter()
            .filter(|p| p.as_str() == "/dev/nvidia0")
            .count(),
        1,
        "{spec}"
    );
    let log = e.log();
    assert!(
        !log.contains("sharing") && !log.contains("metrics") && !log.contains("broken.toml"),
        "{log}"
    );
}

#[test]
fn config_wrong_types_are_refused() {
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    for (extra, key) in [
        (
            "accept-envvar-unprivileged = \"yes\"",
            "accept-envvar-unprivileged",
        ),
        ("log-level = 3", "log-level"),
        ("cdi-spec-dirs = \"/etc/cdi\"", "cdi-spec-dirs"),
        (
            "container-library-dir = \"usr/lib\"",
            "container-library-dir",
        ),
        (
            "container-library-dir = \"/usr/../etc\"",
            "container-library-dir",
        ),
        ("[profiles.enflame]\ndriver-root = 5", "enflame"),
        ("[profiles.nvidia.discovery]\nproc-dir = [1]", "nvidia"),
        // The discovery table is closed: a typo there is an error, not a warning.
        ("[profiles.nvidia.discovery]\nproc-dri = \"/x\"", "proc-dri"),
    ] {
        e.config(extra);
        e.refused(&["config.toml", key]);
    }
}

#[test]
fn profile_with_relative_driver_root_or_dotdot_node_is_refused() {
    let e = Env::new();
    // A create builds the profiles its variables can involve: this one, Ascend's.
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0", "ASCEND_VISIBLE_DEVICES=0"]);
    std::fs::create_dir_all(e.path("profiles.d")).unwrap();
    let ascend = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/profiles/ascend.toml"
    ))
    .unwrap();
    for (edit, what) in [
        ("driver-root = \"run/ascend\"\n", "driver-root"),
        ("driver-root = \"/run/../etc\"\n", "driver-root"),
        ("control-nodes = [\"/dev/../etc/shadow\"]\n", ".."),
    ] {
        let mut t: toml::Table = toml::from_str(&ascend).unwrap();
        let patch: toml::Table = toml::from_str(edit).unwrap();
        t.extend(patch);
        std::fs::write(e.path("profiles.d/ascend.toml"), t.to_string()).unwrap();
        e.refused(&["ascend.toml", what]);
    }
    // The same through [profiles.<name>] in config.toml: every profile config.toml names is
    // built, whatever the spec asks for.
    std::fs::remove_file(e.path("profiles.d/ascend.toml")).unwrap();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    e.config("[profiles.enflame]\ncontrol-nodes = [\"/dev/gcu/../../etc/shadow\"]");
    e.refused(&["config.toml", "enflame", ".."]);
}

#[test]
fn profile_without_driver_root_means_slash() {
    let e = Env::new();
    std::fs::create_dir_all(e.path("profiles.d")).unwrap();
    let ascend = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/profiles/ascend.toml"
    ))
    .unwrap();
    let mut t: toml::Table = toml::from_str(&ascend).unwrap();
    t.remove("driver-root");
    t.remove("dev-root");
    std::fs::write(e.path("profiles.d/ascend.toml"), t.to_string()).unwrap();
    // This host has no Ascend devices under /: the error shows where it looked.
    e.set_env(&["ASCEND_VISIBLE_DEVICES=all"]);
    e.refused(&[
        "ASCEND_VISIBLE_DEVICES=all",
        "no ascend devices found under /",
    ]);
}

/// No hook is ever added (so none can be handed the container's environment, the
/// CVE-2025-23266 class): the edit adds devices and mounts, and hooks stay as they were.
#[test]
fn no_hook_is_added() {
    let e = Env::new();
    e.set_env(&[
        "NVIDIA_VISIBLE_DEVICES=all",
        "LD_PRELOAD=/tmp/evil.so",
        "LD_LIBRARY_PATH=/tmp",
    ]);
    let before = e.spec();
    let after = e.accepted();
    assert_eq!(after["hooks"], before["hooks"]);
    assert_eq!(after["process"]["env"], before["process"]["env"]);
    assert_eq!(device_paths(&after).len(), UUIDS.len() + 1);
}

// ---- mounts: sources in the driver root, destinations checked -----------------------------

/// A driver root whose ld.so.cache lists `name -> path` for libcuda.
fn with_cache(e: &Env, entries: &[(&str, &str)]) {
    let list: Vec<(&str, &str, i32)> = entries
        .iter()
        .map(|(n, p)| (*n, *p, accel_container_runtime::ldcache::native_flags()))
        .collect();
    std::fs::create_dir_all(e.root().join("etc")).unwrap();
    std::fs::write(
        e.root().join("etc/ld.so.cache"),
        accel_container_runtime::ldcache::build(&list),
    )
    .unwrap();
}

#[test]
fn driver_symlinks_pointing_outside_resolve_inside_the_root() {
    let e = Env::new();
    let lib = e.root().join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(e.root().join("etc")).unwrap();
    // Absolute and climbing links to the host's /etc/passwd; inside the root that path is a
    // decoy file, which is what must be mounted.
    std::fs::write(e.root().join("etc/passwd"), "decoy").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", lib.join("libcuda.so.1")).unwrap();
    std::os::unix::fs::symlink(
        "../../../../../../../../etc/passwd",
        lib.join("libnvidia-ml.so.1"),
    )
    .unwrap();
    // A link to a host path with no counterpart in the root is left out.
    std::os::unix::fs::symlink("/etc/hostname", lib.join("libnvidia-ptxjitcompiler.so.1")).unwrap();
    with_cache(
        &e,
        &[
            ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            (
                "libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ),
            (
                "libnvidia-ptxjitcompiler.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
            ),
        ],
    );
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    let spec = e.accepted();
    let root = e.root();
    let ours: Vec<(&str, &str)> = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["destination"].as_str().unwrap().contains(".so."))
        .map(|m| {
            (
                m["destination"].as_str().unwrap(),
                m["source"].as_str().unwrap(),
            )
        })
        .collect();
    let decoy = root.join("etc/passwd");
    assert_eq!(ours.len(), 2, "{ours:?}");
    for (dest, src) in &ours {
        assert_eq!(Path::new(src), decoy, "{dest} mounted from {src}");
    }
}

#[test]
fn cache_entry_with_a_path_in_its_name_is_refused() {
    let e = Env::new();
    let lib = e.root().join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libcuda.so.550"), "elf").unwrap();
    with_cache(
        &e,
        &[(
            "libcuda.so.1/../../../../etc/cron.d/evil",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550",
        )],
    );
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    e.refused(&["refusing mount", "plain file name"]);
}

// ---- unprivileged containers and the volume-mount device list -----------------------------

fn set_privileged(e: &Env, privileged: bool) {
    let mut spec = e.spec();
    let caps = spec["process"]["capabilities"]["bounding"]
        .as_array_mut()
        .unwrap();
    caps.retain(|c| c != "CAP_SYS_ADMIN");
    if privileged {
        caps.push(json!("CAP_SYS_ADMIN"));
    }
    e.write_spec(&serde_json::to_vec(&spec).unwrap());
}

/// On such a node the variable gives an unprivileged container nothing, and does not stop
/// it: CUDA images carry `NVIDIA_VISIBLE_DEVICES=all` whether the pod asked kubelet for a
/// device or not (issue 17: "gets none under the Kubernetes defaults").
#[test]
fn unprivileged_variable_ignored_when_configured() {
    let e = Env::new();
    e.config("accept-envvar-unprivileged = false");
    for value in ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=all"] {
        e.set_env(&[value]);
        set_privileged(&e, false);
        let before = std::fs::read(e.config_json()).unwrap();
        e.accepted();
        assert_eq!(
            std::fs::read(e.config_json()).unwrap(),
            before,
            "{value}: config.json was rewritten for an ignored request"
        );
        assert!(
            e.log().contains("NVIDIA_VISIBLE_DEVICES") && e.log().contains("ignored"),
            "{value}: no warning in the log: {}",
            e.log()
        );
    }
    // Nothing requested is not a refusal.
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=void"]);
    set_privileged(&e, false);
    e.accepted();
    // A privileged container may still use the variable.
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    set_privileged(&e, true);
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );
    // Default (compatible with NVIDIA's toolkit): accepted.
    e.config("");
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=1"]);
    set_privileged(&e, false);
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia1", "/dev/nvidiactl"]
    );
}

fn add_device_list_mount(e: &Env, id: &str) {
    let mut spec = e.spec();
    spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": format!("/var/run/nvidia-container-devices/{id}"),
        "type": "bind",
        "source": "/dev/null",
        "options": ["rbind", "ro"]
    }));
    e.write_spec(&serde_json::to_vec(&spec).unwrap());
}

#[test]
fn volume_mount_device_list_both_ways() {
    let e = Env::new();
    // Accepted: the plugin's mounts name GPU 2 by UUID; the variable is not consulted.
    e.config("accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true");
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=all"]);
    set_privileged(&e, false);
    add_device_list_mount(&e, UUIDS[2]);
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia2", "/dev/nvidiactl"]
    );
    // Not accepted (the default): the same mounts request nothing, config.json is untouched.
    e.config("");
    e.set_env(&[]);
    add_device_list_mount(&e, UUIDS[2]);
    let before = std::fs::read(e.config_json()).unwrap();
    e.accepted();
    assert_eq!(std::fs::read(e.config_json()).unwrap(), before);
    // Accepted, but naming a GPU this node does not have: refused like the variable.
    e.config("accept-container-devices-as-mounts = true");
    e.set_env(&[]);
    add_device_list_mount(&e, "GPU-ffffffff-0000-0000-0000-000000000000");
    e.refused(&["/var/run/nvidia-container-devices", "no device"]);
}

// ---- fds and stdin -----------------------------------------------------------------------

/// Runs `program args` with fd 3 open on `preserved` (as an engine passing `--preserve-fds 1`)
/// and returns the fds the listing script saw: fd -> target.
fn fds_seen(e: &Env, program: &str, args: &[&str], preserved: &Path) -> BTreeMap<u32, String> {
    let listing = e.path("fds");
    let _ = std::fs::remove_file(&listing);
    let file = std::fs::File::open(preserved).unwrap();
    // The same environment the shim gets (the config), whichever program runs.
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", e.path("config.toml"))
        .current_dir(e.dir.path())
        .stdin(Stdio::null());
    let raw = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: dup2/fcntl are async-signal-safe; fd 3 is what --preserve-fds 1 hands on.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            let r = if raw == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = wait_with_timeout(cmd, Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&listing).unwrap();
    text.lines()
        .filter_map(|l| {
            let (left, target) = l.split_once(" -> ")?;
            let fd = left.rsplit(' ').next()?.parse().ok()?;
            Some((fd, target.to_string()))
        })
        // ls's own descriptor on the directory it lists.
        .filter(|(_, t)| !(t.starts_with("/proc/") && t.ends_with("/fd")))
        // Pipes differ between runs by inode number only.
        .map(|(fd, t)| {
            (
                fd,
                if t.starts_with("pipe:") {
                    "pipe".into()
                } else {
                    t
                },
            )
        })
        .collect()
}

/// The low-level runtime sees exactly the fds it would see if the engine had started it
/// directly: stdio, the one passed with --preserve-fds, and whatever else the caller (here
/// cargo's jobserver) leaves open. Nothing the shim opened on create (config, profiles,
/// spec, procfs, nodes, log) leaks; nothing inherited is closed.
#[test]
fn no_fd_leaks_into_the_low_level_runtime_and_inherited_fds_survive() {
    let e = Env::new();
    let listing = e.path("fds");
    std::fs::write(
        e.path("runtime"),
        format!(
            "#!/bin/sh\nexec /bin/ls -l /proc/self/fd > {}\n",
            listing.display()
        ),
    )
    .unwrap();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=all"]);
    let preserved = e.path("preserved");
    std::fs::write(&preserved, "x").unwrap();
    let bundle = e.bundle();
    let runtime = e.path("runtime");
    for args in [
        vec![
            "create",
            "--bundle",
            bundle.to_str().unwrap(),
            "--preserve-fds",
            "1",
            "ctr",
        ],
        vec!["exec", "--preserve-fds", "1", "ctr", "true"],
    ] {
        let direct = fds_seen(&e, runtime.to_str().unwrap(), &args, &preserved);
        let through_shim = fds_seen(&e, &SHIM, &args, &preserved);
        assert_eq!(through_shim, direct, "{args:?}");
        assert_eq!(Path::new(&through_shim[&3]), preserved, "{through_shim:?}");
        for fd in [0, 1, 2] {
            assert!(through_shim.contains_key(&fd), "{through_shim:?}");
        }
    }
    // The create really did open files (it injected the GPUs).
    assert_eq!(device_paths(&e.spec()).len(), UUIDS.len() + 1);
}

#[test]
fn stdin_reaches_the_low_level_runtime_untouched() {
    let e = Env::new();
    std::fs::write(
        e.path("runtime"),
        format!(
            "#!/bin/sh\necho \"$@\" > {}\nexec cat > {}\n",
            e.path("args").display(),
            e.path("stdin").display()
        ),
    )
    .unwrap();
    let resources: Vec<u8> = serde_json::to_vec_pretty(&json!({
        "cpu": {"shares": 512, "cpus": "0-1"},
        "devices": [{"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]
    }))
    .unwrap()
    .repeat(2000); // ~300 KB: more than a pipe holds, so a stray read would be noticed
    let mut child = e
        .command(&["update", "--resources=-", "ctr"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = resources.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(e.path("args")).unwrap().trim(),
        "update --resources=- ctr"
    );
    assert!(std::fs::read(e.path("stdin")).unwrap() == resources);
}

/// Signal dispositions reach the low-level runtime as the engine set them: an ignored SIGPIPE
/// stays ignored and a default one stays default, on create (with a device edit) and on a
/// pass-through, exactly as when runc is started directly.
#[test]
fn signal_dispositions_reach_the_low_level_runtime_unchanged() {
    let e = Env::new();
    let seen = e.path("sigign");
    std::fs::write(
        e.path("runtime"),
        format!(
            "#!/bin/sh\nexec /bin/grep SigIgn /proc/self/status > {}\n",
            seen.display()
        ),
    )
    .unwrap();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=all"]);
    let bundle = e.bundle();
    let runtime = e.path("runtime");
    let sigign = |program: &str, args: &[&str], ignore_pipe: bool| -> String {
        let _ = std::fs::remove_file(&seen);
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", e.path("config.toml"))
            .stdin(Stdio::null());
        // SAFETY: signal(2) is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                let disp = if ignore_pipe {
                    libc::SIG_IGN
                } else {
                    libc::SIG_DFL
                };
                libc::signal(libc::SIGPIPE, disp);
                Ok(())
            });
        }
        let out = wait_with_timeout(cmd, Duration::from_secs(20));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(&seen).unwrap()
    };
    let sigpipe_bit = 1u64 << (libc::SIGPIPE - 1);
    for args in [
        vec!["create", "--bundle", bundle.to_str().unwrap(), "ctr"],
        vec!["state", "ctr"],
    ] {
        for ignore_pipe in [false, true] {
            let direct = sigign(runtime.to_str().unwrap(), &args, ignore_pipe);
            let through_shim = sigign(&SHIM, &args, ignore_pipe);
            assert_eq!(through_shim, direct, "{args:?} ignore_pipe={ignore_pipe}");
            let mask = u64::from_str_radix(direct.split_whitespace().nth(1).unwrap(), 16).unwrap();
            assert_eq!(mask & sigpipe_bit != 0, ignore_pipe, "{direct}");
        }
    }
    assert_eq!(device_paths(&e.spec()).len(), UUIDS.len() + 1);
}

// ---- regressions of the private JSON reader (issue 12) ------------------------------------

/// Issue 12: a config.json with 20,000 nested arrays inside `linux.resources.devices` killed
/// the shim with SIGSEGV (exit 139, no message: unbounded recursion in the private checker).
/// serde_json's depth limit makes it one line and exit 1.
#[test]
fn regression_20000_nested_arrays_in_resources_devices_is_one_line_not_a_signal() {
    let e = Env::new();
    let mut spec: Value = serde_json::from_str(DOCKER_SPEC).unwrap();
    spec["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!("NVIDIA_VISIBLE_DEVICES=0"));
    spec["linux"]["resources"]["devices"] = json!("DEEP");
    let text = serde_json::to_string(&spec).unwrap().replace(
        "\"DEEP\"",
        &format!("{}{}", "[".repeat(20_000), "]".repeat(20_000)),
    );
    e.write_spec(text.as_bytes());
    let before = e.snapshot();
    let out = e.create();
    assert_eq!(
        out.status.code(),
        Some(1),
        "ended by a signal or another status: {:?}",
        out.status
    );
    e.check_refusal(
        &out,
        &["config.json", "not valid JSON", "recursion limit"],
        &before,
    );
}

/// Issue 12: an annotation key written with a JSON escape (`"cdi.k8s.io\/x"`, the same key
/// to every JSON reader) made the byte-level pre-check answer "nothing asked for", and the
/// container started without the device it asked for. It is a request: here one for a CDI
/// device no spec describes, so the create is refused naming it.
#[test]
fn regression_escaped_cdi_annotation_key_is_a_request() {
    let e = Env::new();
    std::fs::create_dir_all(e.path("cdi")).unwrap();
    e.config(&format!("cdi-spec-dirs = [{:?}]", e.path("cdi")));
    let spec = DOCKER_SPEC.replacen(
        "{",
        r#"{"annotations": {"cdi.k8s.io\/x": "vendor.example/gpu=0"},"#,
        1,
    );
    let parsed: Value = serde_json::from_str(&spec).unwrap();
    assert_eq!(
        parsed["annotations"]["cdi.k8s.io/x"],
        "vendor.example/gpu=0"
    );
    e.write_spec(spec.as_bytes());
    e.refused(&["vendor.example/gpu=0"]);
}

// ---- issue 14: hardening, round 2 ---------------------------------------------------------

fn with_mounts(e: &Env, mounts: &[Value]) {
    let mut spec = e.spec();
    spec["mounts"]
        .as_array_mut()
        .unwrap()
        .extend(mounts.iter().cloned());
    e.write_spec(&serde_json::to_vec(&spec).unwrap());
}

/// Issue 14, class 1: on a node that takes device lists from mounts only, an ordinary volume
/// (tmpfs, emptyDir: any pod may declare one) at the list's directory gives nothing, nor does
/// the keyword `all`; a bind of /dev/null (what a device plugin mounts) names a device.
#[test]
fn device_list_mounts_count_only_dev_null_binds() {
    let e = Env::new();
    e.config("accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true");
    let dir = "/var/run/nvidia-container-devices";
    for volume in [
        json!({"destination": format!("{dir}/all"), "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}),
        json!({"destination": format!("{dir}/all"), "type": "bind", "source": "/var/lib/kubelet/pods/p/volumes/kubernetes.io~empty-dir/v", "options": ["rbind", "rprivate"]}),
        json!({"destination": format!("{dir}/0"), "type": "tmpfs", "source": "tmpfs", "options": []}),
        json!({"destination": format!("{dir}/all"), "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]}),
    ] {
        e.set_env(&[]);
        set_privileged(&e, false);
        with_mounts(&e, std::slice::from_ref(&volume));
        assert_eq!(
            device_paths(&e.accepted()),
            Vec::<String>::new(),
            "{volume}"
        );
    }
    e.set_env(&[]);
    set_privileged(&e, false);
    with_mounts(
        &e,
        &[
            json!({"destination": format!("{dir}/0"), "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]}),
        ],
    );
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );
}

fn write_cdi_spec(dir: &Path, file: &str, kind: &str, device: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(file),
        format!("cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n- name: \"{device}\"\n  containerEdits:\n    env: [\"FROM_CDI={kind}\"]\n"),
    )
    .unwrap();
    std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn env_of(spec: &Value) -> Vec<String> {
    spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Issue 14, class 2: a vendor variable names CDI devices of its profile's kind only; an
/// annotation only kinds of the node's profiles; anything else needs `cdi-extra-kinds`.
#[test]
fn cdi_names_reach_only_the_allowed_kinds() {
    let e = Env::new();
    let cdi = e.path("cdi");
    write_cdi_spec(&cdi, "hostfs.yaml", "example.com/hostfs", "etc");
    write_cdi_spec(&cdi, "gpu.yaml", "nvidia.com/gpu", "0");
    e.config(&format!("cdi-spec-dirs = [{cdi:?}]"));
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]);
    assert!(env_of(&e.accepted()).contains(&"FROM_CDI=nvidia.com/gpu".to_string()));

    e.set_env(&["NVIDIA_VISIBLE_DEVICES=example.com/hostfs=etc"]);
    e.refused(&[
        "NVIDIA_VISIBLE_DEVICES",
        "example.com/hostfs",
        "cdi-extra-kinds",
    ]);
    e.set_env(&[]);
    let mut spec = e.spec();
    spec["annotations"] = json!({"cdi.k8s.io/pod": "example.com/hostfs=etc"});
    e.write_spec(&serde_json::to_vec(&spec).unwrap());
    e.refused(&["cdi.k8s.io/pod", "example.com/hostfs", "cdi-extra-kinds"]);

    // Listed by the operator: reachable.
    let text = std::fs::read_to_string(e.path("config.toml"))
        .unwrap()
        .replace(
            "[profiles.nvidia]\n",
            "[profiles.nvidia]\ncdi-extra-kinds = [\"example.com/hostfs\"]\n",
        );
    std::fs::write(e.path("config.toml"), text).unwrap();
    assert!(env_of(&e.accepted()).contains(&"FROM_CDI=example.com/hostfs".to_string()));
}

/// Issue 14, class 3: config.toml, profile files and CDI specs (and their directories) must be
/// root's alone to write. /tmp's sticky, root-owned directory is accepted (these files live
/// under it).
#[test]
fn files_not_root_s_alone_are_refused() {
    let chmod = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    let config = e.path("config.toml");
    chmod(&config, 0o664);
    e.refused(&["config.toml", "writable by group (mode 0664)"]);
    chmod(&config, 0o644);

    let profiles = e.path("profiles.d");
    std::fs::create_dir_all(&profiles).unwrap();
    let ascend = profiles.join("ascend.toml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles/ascend.toml"),
        &ascend,
    )
    .unwrap();
    chmod(&ascend, 0o644);
    std::os::unix::fs::chown(&ascend, Some(65534), None).unwrap();
    e.refused(&["ascend.toml", "owned by uid 65534, not root"]);
    std::os::unix::fs::chown(&ascend, Some(0), None).unwrap();
    chmod(&profiles, 0o777);
    e.refused(&[
        "ascend.toml",
        "directory",
        "profiles.d",
        "writable by group and others",
    ]);
    chmod(&profiles, 0o755);
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );

    // A symlinked config.toml is judged by its target's directories.
    let other = e.path("other");
    std::fs::create_dir(&other).unwrap();
    chmod(&other, 0o775);
    std::fs::rename(&config, other.join("config.toml")).unwrap();
    std::os::unix::fs::symlink(other.join("config.toml"), &config).unwrap();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    e.refused(&["config.toml", "other", "writable by group"]);
    chmod(&other, 0o755);
    e.accepted();

    // A CDI spec writable by its group is skipped with a warning.
    std::fs::remove_file(&config).unwrap();
    let cdi = e.path("cdi");
    write_cdi_spec(&cdi, "gpu.yaml", "nvidia.com/gpu", "0");
    e.config(&format!("cdi-spec-dirs = [{cdi:?}]"));
    chmod(&cdi.join("gpu.yaml"), 0o664);
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]);
    e.refused(&["unknown CDI device", "gpu.yaml", "writable by group"]);
    assert!(
        e.log().contains("gpu.yaml") && e.log().contains("WARN"),
        "{}",
        e.log()
    );
    chmod(&cdi.join("gpu.yaml"), 0o644);
    e.accepted();
}

/// Issue 14, class 6: a value from the container in an error is cut and its control
/// characters escaped, on stderr, in the engine's --log (JSON) and in the shim's log.
#[test]
fn container_text_in_messages_is_cut_and_escaped() {
    let e = Env::new();
    let hostile = format!("0,\x1b]0;pwned\x07\r{}", "A".repeat(20_000));
    e.set_env(&[&format!("NVIDIA_VISIBLE_DEVICES={hostile}")]);
    let engine_log = e.path("engine.json");
    let b = e.bundle();
    let out = e.run(&[
        "--log",
        engine_log.to_str().unwrap(),
        "--log-format",
        "json",
        "create",
        "--bundle",
        b.to_str().unwrap(),
        "ctr",
    ]);
    assert!(!out.status.success());
    let clean = |what: &str, text: &str| {
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{what} has a control character: {text:?}"
        );
        for line in text.lines() {
            assert!(line.len() < 2048, "{what}: {} bytes", line.len());
        }
        assert!(text.contains("more bytes"), "{what}: no cut marker: {text}");
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    clean("stderr", &stderr);
    assert!(stderr.contains("\\u{1b}]0;pwned\\u{7}\\r"), "{stderr}");
    let line = std::fs::read_to_string(&engine_log).unwrap();
    let v: Value = serde_json::from_str(line.trim_end()).unwrap();
    clean("--log msg", v["msg"].as_str().unwrap());
    clean("shim log", &e.log());
}

/// Issue 14, class 7: the shim's log is created 0640 under any umask, a symlink at its path
/// is not followed, and a log over the cap is rotated to `<file>.1`.
#[test]
fn shim_log_is_private_not_followed_and_capped() {
    use std::os::unix::process::CommandExt;
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=9"]);
    let create = || {
        let mut cmd = e.command(&["create", "--bundle", e.bundle().to_str().unwrap(), "ctr"]);
        // SAFETY: umask(2) only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
        let out = wait_with_timeout(cmd, Duration::from_secs(20));
        assert!(!out.status.success());
    };
    let log = e.path("shim.log");
    create();
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o640);
    assert!(e.log().contains("no device"), "{}", e.log());

    std::fs::remove_file(&log).unwrap();
    let victim = e.path("victim");
    std::fs::write(&victim, "").unwrap();
    std::os::unix::fs::symlink(&victim, &log).unwrap();
    create();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "");
    std::fs::remove_file(&log).unwrap();

    let big = 10 << 20;
    std::fs::write(&log, vec![b'x'; big]).unwrap();
    create();
    assert!(
        e.log().len() < 4096 && e.log().contains("no device"),
        "{} bytes",
        e.log().len()
    );
    assert_eq!(
        std::fs::metadata(e.path("shim.log.1")).unwrap().len(),
        big as u64
    );
}

fn with_gpu_hook(e: &Env, path_json: &str, env_json: &str) {
    let mut spec = e.spec();
    spec["hooks"] = json!({"prestart": [
        {"path": "/usr/bin/libnetwork-setkey"},
        {"path": "PATH", "args": ["nvidia-container-runtime-hook", "prestart"], "env": ["ENV"]}
    ]});
    let text = serde_json::to_string(&spec)
        .unwrap()
        .replace("\"PATH\"", path_json)
        .replace("\"ENV\"", env_json);
    e.write_spec(text.as_bytes());
}

fn hook_paths(spec: &Value) -> Vec<String> {
    spec.pointer("/hooks/prestart")
        .and_then(Value::as_array)
        .map(|h| {
            h.iter()
                .map(|h| h["path"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 14, class 8: docker's --gpus hook is removed, or the create refused; never left in
/// place because a sibling field did not decode, nor because its name was escaped.
#[test]
fn docker_gpu_hook_is_removed_or_the_create_refused() {
    let e = Env::new();
    let hook = "\"/usr/bin/nvidia-container-runtime-hook\"";
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    with_gpu_hook(&e, hook, "\"X=\\ud800\"");
    // A sibling that does not decode: the whole spec is read with serde_json, so the create
    // is refused naming the file; the hook is never left in place.
    e.refused(&["config.json", "not valid JSON"]);

    // Escaped name, no device variable: still found and removed.
    e.set_env(&[]);
    with_gpu_hook(
        &e,
        "\"/usr/bin/nvidia-container-runtime-hoo\\u006b\"",
        "\"X=1\"",
    );
    assert_eq!(hook_paths(&e.accepted()), ["/usr/bin/libnetwork-setkey"]);

    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    with_gpu_hook(&e, hook, "\"X=1\"");
    let spec = e.accepted();
    assert_eq!(hook_paths(&spec), ["/usr/bin/libnetwork-setkey"]);
    assert_eq!(device_paths(&spec), ["/dev/nvidia0", "/dev/nvidiactl"]);
}

/// Issue 14, class 9: a GPU's node must be a character device of the profile's majors,
/// resolved inside dev-root.
#[test]
fn host_nodes_outside_dev_root_or_of_the_wrong_kind_are_refused() {
    use nix::sys::stat::{makedev, Mode, SFlag};
    let e = Env::new();
    let dev = e.root().join("dev");
    // A symlink out of the driver root, to a node that exists.
    mknod(&e.path("outside/nvidia1"), 195, 1, 0o666);
    std::fs::remove_file(dev.join("nvidia1")).unwrap();
    std::os::unix::fs::symlink(e.path("outside/nvidia1"), dev.join("nvidia1")).unwrap();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=1"]);
    e.refused(&["nvidia1", "leads out of"]);
    // A block device.
    std::fs::remove_file(dev.join("nvidia2")).unwrap();
    nix::sys::stat::mknod(
        &dev.join("nvidia2"),
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o666),
        makedev(195, 2),
    )
    .unwrap();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=2"]);
    e.refused(&["nvidia2", "not a character device"]);
    // Another driver's major (a loop device's, 7).
    std::fs::remove_file(dev.join("nvidia2")).unwrap();
    mknod(&dev.join("nvidia2"), 7, 2, 0o666);
    e.refused(&["nvidia2", "major 7", "device-majors"]);
    // A symlink that stays inside is followed.
    std::fs::remove_file(dev.join("nvidia2")).unwrap();
    std::os::unix::fs::symlink("nvidia0", dev.join("nvidia2")).unwrap();
    e.accepted();
}

/// Issue 14, class 11: crun's and youki's global flags (both forms) do not hide `create`,
/// and `create --help` reaches the low-level runtime instead of failing on ./config.json.
#[test]
fn crun_youki_flags_and_help_reach_the_right_place() {
    let e = Env::new();
    for args in [&["create", "--help"][..], &["create", "-h"], &["run", "-h"]] {
        let out = e.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ran = std::fs::read_to_string(e.path("runtime-called")).unwrap();
        assert_eq!(ran.trim_end(), args.join(" "));
        std::fs::remove_file(e.path("runtime-called")).unwrap();
    }
    let b = e.bundle();
    let b = b.to_str().unwrap();
    for globals in [
        &["--log-level", "debug"][..],
        &["--cgroup-manager", "systemd"],
        &["-r", "/run/youki", "-l", "/dev/null"],
        &["--log-level=debug", "--cgroup-manager=cgroupfs"],
    ] {
        e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
        let mut args = globals.to_vec();
        args.extend(["create", "--bundle", b, "ctr"]);
        let out = e.run(&args);
        assert!(out.status.success(), "{args:?}");
        assert_eq!(
            device_paths(&e.spec()),
            ["/dev/nvidia0", "/dev/nvidiactl"],
            "{args:?}"
        );
    }
}

/// Issue 14, class 12: pass-through commands reach the low-level runtime whatever is wrong
/// with config.toml or profiles-dir, with a warning in the log.
#[test]
fn pass_through_commands_survive_a_broken_config() {
    let e = Env::new();
    let config = e.path("config.toml");
    let good = std::fs::read_to_string(&config).unwrap();
    // `runc` in PATH, for the fallback.
    let bin = e.path("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(
        bin.join("runc"),
        format!(
            "#!/bin/sh\necho \"$@\" >> {}\n",
            e.path("path-runc-called").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("runc"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |args: &[&str]| {
        let mut cmd = e.command(args);
        cmd.env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display()),
        );
        let out = wait_with_timeout(cmd, Duration::from_secs(20));
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let took = |file: &str| {
        let p = e.path(file);
        let ran = std::fs::read_to_string(&p).unwrap_or_default();
        let _ = std::fs::remove_file(&p);
        ran
    };
    // An unquoted value: its low-level-runtime line still counts.
    std::fs::write(
        &config,
        good.replacen("[profiles", "log-level = debug\n[profiles", 1),
    )
    .unwrap();
    for args in [
        &["state", "ctr"][..],
        &["kill", "ctr", "KILL"],
        &["delete", "-f", "ctr"],
    ] {
        run(args);
        assert_eq!(took("runtime-called").trim_end(), args.join(" "));
    }
    assert!(
        e.log().contains("config.toml") && e.log().contains("WARN"),
        "{}",
        e.log()
    );
    // Not even low-level-runtime reads: `runc` from PATH.
    std::fs::write(&config, "low-level-runtime = [\n").unwrap();
    run(&["state", "ctr"]);
    assert_eq!(took("path-runc-called").trim_end(), "state ctr");
    // Writable by its group: its low-level-runtime is not believed.
    std::fs::write(&config, &good).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o664)).unwrap();
    run(&["--version"]);
    assert_eq!(took("path-runc-called").trim_end(), "--version");
    assert_eq!(took("runtime-called"), "");
    // A broken profile never stops a pass-through.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir_all(e.path("profiles.d")).unwrap();
    std::fs::write(e.path("profiles.d/broken.toml"), "name = [").unwrap();
    run(&["delete", "ctr"]);
    assert_eq!(took("runtime-called").trim_end(), "delete ctr");
}

// ---- issue 14, classes 4, 5 and 10 -------------------------------------------------------

/// The spec as compact JSON, with `from` replaced by `to` once (the key tricks below cannot
/// be written through a `Value`, which keeps one of each key).
fn spec_text_with(e: &Env, from: &str, to: &str) -> String {
    let text = serde_json::to_string(&e.spec()).unwrap();
    assert!(text.contains(from), "{from} not in {text}");
    text.replacen(from, to, 1)
}

/// Writes `plain` as config.json, then it again with `from` replaced by `to`.
fn reset_then_write_with(e: &Env, plain: &str, from: &str, to: &str) {
    e.write_spec(plain.as_bytes());
    e.write_spec(spec_text_with(e, from, to).as_bytes());
}

#[test]
fn spec_keys_are_read_as_runc_reads_them_or_refused() {
    let e = Env::new();
    e.config("accept-envvar-unprivileged = false");
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    set_privileged(&e, false);
    let plain = serde_json::to_string(&e.spec()).unwrap();
    // Privileged to an exact-key reader; to runc's Go decoder the second key is the same
    // field and replaces the first: CAP_KILL only.
    e.write_spec(
        spec_text_with(
            &e,
            "\"bounding\":[",
            "\"bounding\":[\"CAP_SYS_ADMIN\"],\"Bounding\":[",
        )
        .as_bytes(),
    );
    e.refused(&["\"Bounding\"", "process.capabilities", "`bounding` to runc"]);
    // The environment runc sets is the later, case-variant key's: no request to runc.
    e.config("");
    reset_then_write_with(&e, &plain, "\"cwd\":", "\"ENV\":[],\"cwd\":");
    e.refused(&["\"ENV\"", "`process`", "`env` to runc"]);
    // The other way round, the shim sees no request: nothing is given (runc's environment
    // has the variable, but no device is in the spec).
    reset_then_write_with(&e, &plain, "\"env\":[", "\"env\":[],\"ENV\":[");
    assert_eq!(device_paths(&e.accepted()), Vec::<String>::new());
    // Unicode simple folding: U+017F (long s) is `s` to Go.
    reset_then_write_with(
        &e,
        &plain,
        "\"mounts\":[",
        "\"mount\u{17f}\":[],\"mounts\":[",
    );
    e.refused(&["mount\u{17f}", "`mounts` to runc"]);
    // ... and U+212A (Kelvin sign) is `k`: a hook runc would run, hidden from an exact reader.
    reset_then_write_with(
        &e,
        &plain,
        "\"process\":{",
        "\"hoo\u{212a}s\":{\"prestart\":[]},\"process\":{",
    );
    e.refused(&["hoo\u{212a}s", "`hooks` to runc"]);
    // A repeated object: runc merges it into the first, serde_json keeps the last.
    reset_then_write_with(
        &e,
        &plain,
        "\"process\":{",
        "\"linux\":{\"devices\":[]},\"process\":{",
    );
    e.refused(&["`linux` repeated", "top level"]);
    // A repeated annotation.
    reset_then_write_with(
        &e,
        &plain,
        "\"process\":{",
        "\"annotations\":{\"a\":\"1\",\"a\":\"2\"},\"process\":{",
    );
    e.refused(&["\"a\" repeated", "`annotations`"]);
    // Issue 23, class 4: a section the shim never reads. runc merges the repeated memory
    // object (limit and swap both apply); the rewritten file would hold only the second.
    reset_then_write_with(
        &e,
        &plain,
        "\"resources\":{",
        "\"resources\":{\"memory\":{\"limit\":1048576},\"memory\":{\"swap\":0},",
    );
    e.refused(&[
        "\"memory\" repeated",
        "`linux.resources`",
        "keep only the last",
    ]);
    // Keys that name no field runc reads are ignored by both, whatever their case.
    reset_then_write_with(
        &e,
        &plain,
        "\"process\":{",
        "\"Mountz\":1,\"X\":1,\"x\":2,\"process\":{",
    );
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );
    // A spec that asks for nothing is runc's to judge: passed through untouched.
    e.set_env(&[]);
    let text = spec_text_with(
        &e,
        "\"bounding\":[",
        "\"bounding\":[\"CAP_SYS_ADMIN\"],\"Bounding\":[",
    );
    e.write_spec(text.as_bytes());
    e.accepted();
    assert_eq!(std::fs::read_to_string(e.config_json()).unwrap(), text);
}

/// `n` copies of `item`, as a JSON list's inside.
fn repeated(item: &str, n: usize) -> String {
    let mut s = String::with_capacity((item.len() + 1) * n);
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(item);
    }
    s
}

#[test]
fn every_input_is_bounded_while_read() {
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    let plain = serde_json::to_string(&e.spec()).unwrap();
    // Item counts of the lists the shim reads (limits in src/spec/golang.rs).
    let env = format!("\"env\":[{},", repeated("\"A=1\"", (1 << 20) + 1));
    e.write_spec(spec_text_with(&e, "\"env\":[", &env).as_bytes());
    e.refused(&["`process.env` has more than 1048576 entries"]);
    e.write_spec(plain.as_bytes());
    let mounts = format!("\"mounts\":[{},", repeated("{}", (1 << 16) + 1));
    e.write_spec(spec_text_with(&e, "\"mounts\":[", &mounts).as_bytes());
    e.refused(&["`mounts` has more than 65536 entries"]);
    e.write_spec(plain.as_bytes());
    let annotations: Vec<String> = (0..=(1 << 16)).map(|i| format!("\"a{i}\":\"\"")).collect();
    e.write_spec(
        spec_text_with(
            &e,
            "\"process\":{",
            &format!(
                "\"annotations\":{{{}}},\"process\":{{",
                annotations.join(",")
            ),
        )
        .as_bytes(),
    );
    e.refused(&["`annotations` has more than 65536 entries"]);
    e.write_spec(plain.as_bytes());
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );

    // File sizes, enforced on what is read. config.toml: a valid file made large by a comment.
    let config = std::fs::read_to_string(e.path("config.toml")).unwrap();
    let padding = format!("# {}\n", "x".repeat(2 << 20));
    std::fs::write(e.path("config.toml"), format!("{padding}{config}")).unwrap();
    e.refused(&["config.toml", "over the 1048576 byte limit"]);
    // A profile, the same.
    std::fs::write(e.path("config.toml"), &config).unwrap();
    std::fs::create_dir_all(e.path("profiles.d")).unwrap();
    let ascend = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles/ascend.toml"),
    )
    .unwrap();
    std::fs::write(
        e.path("profiles.d/ascend.toml"),
        format!("{padding}{ascend}"),
    )
    .unwrap();
    e.refused(&["ascend.toml", "over the 1048576 byte limit"]);
    std::fs::remove_file(e.path("profiles.d/ascend.toml")).unwrap();
    // The driver's /proc information: a GPU's is under 1 KiB.
    let info = e
        .root()
        .join("proc/driver/nvidia/gpus/0000:18:00.0/information");
    let text = std::fs::read_to_string(&info).unwrap();
    std::fs::write(&info, format!("{text}{}", "Note: x\n".repeat(1 << 18))).unwrap();
    e.refused(&["information", "over the 1048576 byte limit"]);
    std::fs::write(&info, &text).unwrap();
    // The driver's ld.so.cache: a sparse file over 64 MiB (no disk, all zeros).
    std::fs::create_dir_all(e.root().join("etc")).unwrap();
    let cache = std::fs::File::create(e.root().join("etc/ld.so.cache")).unwrap();
    cache.set_len((64 << 20) + 1).unwrap();
    e.refused(&["ld.so.cache", "over the 67108864 byte limit"]);
    std::fs::remove_file(e.root().join("etc/ld.so.cache")).unwrap();
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );
    // Nesting depth: regression_20000_nested_arrays_in_resources_devices_is_one_line_not_a_signal.
}

#[test]
fn temp_files_of_a_killed_rewrite_are_removed_by_the_next_create() {
    let e = Env::new();
    e.set_env(&["NVIDIA_VISIBLE_DEVICES=0"]);
    let ours = [
        ".config.json.accel-AbCdEf0123456789.tmp",
        ".config.json.accel-0000000000000000.tmp",
    ];
    // Names only an engine or another tool would write: never touched.
    let others = [
        ".config.json.accel-AbCdEf012345678.tmp",
        ".config.json.accel-AbCdEf0123456789.tmp.keep",
        "config.json.accel-AbCdEf0123456789.tmp",
        ".config.json.tmp",
        ".config.json.AbCdEf0123456789.tmp",
    ];
    for n in ours.iter().chain(&others) {
        std::fs::write(e.bundle().join(n), b"{\"half\":").unwrap();
    }
    // One of ours as a symlink: unlinked, its target untouched.
    let target = e.path("outside");
    std::fs::write(&target, b"keep").unwrap();
    let link = ".config.json.accel-LinkLinkLinkLink.tmp";
    std::os::unix::fs::symlink(&target, e.bundle().join(link)).unwrap();
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );
    let mut left: Vec<String> = e.snapshot().into_keys().collect();
    left.sort();
    let mut want: Vec<String> = others.iter().map(|s| s.to_string()).collect();
    want.push("config.json".into());
    want.sort();
    assert_eq!(left, want);
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
}

// ---- issue 23: hardening round 3 ----------------------------------------------------------

/// A driver with one library and an image: the spec's `root.path` names `<bundle>/rootfs`
/// (with an empty `/etc`), so a create that asks for a device reaches the image's loader cache.
fn with_image(e: &Env, env: &[&str]) -> PathBuf {
    let lib = e.root().join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libcuda.so.550.54.14"), "elf").unwrap();
    with_cache(
        e,
        &[(
            "libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14",
        )],
    );
    e.set_env(env);
    let rootfs = e.bundle().join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    let mut spec = e.spec();
    spec["root"]["path"] = json!(rootfs);
    e.write_spec(&serde_json::to_vec(&spec).unwrap());
    rootfs
}

/// The sonames the image's `/etc/ld.so.cache` lists (empty when it is not a cache).
fn cache_names(rootfs: &Path) -> Vec<String> {
    let data = std::fs::read(rootfs.join("etc/ld.so.cache")).unwrap_or_default();
    accel_container_runtime::ldcache::records(&data)
        .map(|r| r.into_iter().map(|r| r.name).collect())
        .unwrap_or_default()
}

/// Issue 23, class 1: nothing of the image is opened on the host before it is known to be a
/// regular file. A FIFO at `/etc/ld.so.cache` (a writer blocked in open(2) here sees whether
/// anything opened it for reading) and a character device there (whose driver's open could
/// arm a watchdog) are never opened: the container starts, the node stays as it is, and the
/// log names the path and what it is.
#[test]
fn image_nodes_are_never_opened_on_the_host() {
    let e = Env::new();
    let rootfs = with_image(&e, &["NVIDIA_VISIBLE_DEVICES=0"]);
    let cache = rootfs.join("etc/ld.so.cache");
    nix::unistd::mkfifo(&cache, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let fifo = cache.clone();
    let writer = std::thread::spawn(move || {
        let opened = std::fs::OpenOptions::new().write(true).open(&fifo);
        let _ = tx.send(opened.is_ok());
    });
    // The writer blocks until a reader opens the FIFO; give it time to get there.
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "writer did not block");
    let spec = e.accepted();
    assert_eq!(device_paths(&spec), ["/dev/nvidia0", "/dev/nvidiactl"]);
    std::thread::sleep(Duration::from_millis(100));
    let opened = rx.try_recv().is_ok();
    // Release the writer whatever happened.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&cache)
        .unwrap();
    writer.join().unwrap();
    assert!(!opened, "the shim opened the image's FIFO for reading");
    let log = e.log();
    assert!(
        log.contains("/etc/ld.so.cache") && log.contains("is a FIFO, not a regular file"),
        "{log}"
    );
    assert!(std::fs::symlink_metadata(&cache)
        .unwrap()
        .file_type()
        .is_fifo());

    // A character device no driver serves: an open would fail with ENXIO, so the log tells
    // whether it was attempted.
    std::fs::remove_file(&cache).unwrap();
    std::fs::remove_file(e.path("shim.log")).unwrap();
    mknod(&cache, 240, 0, 0o644);
    assert_eq!(
        device_paths(&e.accepted()),
        ["/dev/nvidia0", "/dev/nvidiactl"]
    );
    let log = e.log();
    assert!(
        log.contains("/etc/ld.so.cache")
            && log.contains("is a character device, not a regular file"),
        "{log}"
    );
    assert!(std::fs::symlink_metadata(&cache)
        .unwrap()
        .file_type()
        .is_char_device());
}

/// A glibc-shaped cache image of `n` entries whose names and paths all point into one
/// NUL-free run of `run` bytes (each entry one byte further in): every string differs, and
/// copying each one costs `n * run` bytes from a file of `24 * n + run`.
fn shared_string_cache(n: usize, run: usize) -> Vec<u8> {
    let mut img = accel_container_runtime::ldcache::build(&[]);
    let strings_at = img.len() + 24 * n;
    img[20..24].copy_from_slice(&(n as u32).to_ne_bytes());
    let flags = accel_container_runtime::ldcache::native_flags();
    let mut table = Vec::with_capacity(24 * n);
    for i in 0..n {
        let at = (strings_at + i) as u32;
        table.extend_from_slice(&flags.to_ne_bytes());
        table.extend_from_slice(&at.to_ne_bytes());
        table.extend_from_slice(&at.to_ne_bytes());
        table.extend_from_slice(&[0u8; 12]);
    }
    img.extend_from_slice(&table);
    img.extend(std::iter::repeat_n(b'l', run));
    img.push(0);
    img
}

/// [`Env::create`] with the shim's address space capped at `limit` bytes (an algorithm that
/// needs more fails to allocate), and how long it took.
fn create_capped(e: &Env, limit: u64) -> (Output, Duration) {
    use std::os::unix::process::CommandExt;
    let mut cmd = e.command(&["create", "--bundle", e.bundle().to_str().unwrap(), "ctr"]);
    // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent's.
    unsafe {
        cmd.pre_exec(move || {
            let l = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let out = wait_with_timeout(cmd, Duration::from_secs(60));
    (out, start.elapsed())
}

/// Issue 23, class 2: every input the container controls costs time and memory linear in its
/// size. Ceilings are many times what the linear algorithms take in a debug build on a loaded
/// machine, and far below what the quadratic ones took (docs/security.md).
#[test]
fn container_input_costs_linear_time_and_memory() {
    const MEMORY: u64 = 512 << 20;
    const CACHE_TIME: Duration = Duration::from_secs(2);
    const TIME: Duration = Duration::from_secs(15);
    let e = Env::new();
    // An image cache whose strings all share one run: each entry's copy used to cost the
    // whole run. Left as it is, with a warning, and the container starts.
    let rootfs = with_image(&e, &["NVIDIA_VISIBLE_DEVICES=0"]);
    let hostile = shared_string_cache(2_000, 450_000);
    std::fs::write(rootfs.join("etc/ld.so.cache"), &hostile).unwrap();
    let (out, took) = create_capped(&e, MEMORY);
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < CACHE_TIME, "hostile image cache: {took:?}");
    assert!(
        std::fs::read(rootfs.join("etc/ld.so.cache")).unwrap() == hostile,
        "the image's cache was rewritten"
    );
    let log = e.log();
    assert!(
        log.contains("/etc/ld.so.cache") && log.contains("over the"),
        "{log}"
    );
    std::fs::remove_file(e.path("runtime-called")).unwrap();

    // A real-shaped image cache, larger than any distribution's: merged, in the same time.
    let names: Vec<(String, String)> = (0..20_000)
        .map(|i| {
            (
                format!("libx{i}.so.1"),
                format!("/usr/lib/x86_64-linux-gnu/libx{i}.so.1"),
            )
        })
        .collect();
    let records: Vec<accel_container_runtime::ldcache::Record> = names
        .iter()
        .map(|(n, p)| accel_container_runtime::ldcache::Record::native(n, p))
        .collect();
    std::fs::write(
        rootfs.join("etc/ld.so.cache"),
        accel_container_runtime::ldcache::write(records),
    )
    .unwrap();
    let (out, took) = create_capped(&e, MEMORY);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < CACHE_TIME, "large image cache: {took:?}");
    let merged = cache_names(&rootfs);
    assert_eq!(merged.len(), 20_001);
    assert!(merged.iter().any(|n| n == "libcuda.so.1"));
    std::fs::remove_file(e.path("runtime-called")).unwrap();

    // Many NVIDIA_REQUIRE_* variables (each met: an empty requirement).
    let require: Vec<String> = (0..60_000)
        .map(|i| format!("NVIDIA_REQUIRE_X{i}="))
        .collect();
    let mut env: Vec<&str> = require.iter().map(String::as_str).collect();
    env.push("NVIDIA_VISIBLE_DEVICES=0");
    e.set_env(&env);
    let (out, took) = create_capped(&e, MEMORY);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < TIME,
        "{} NVIDIA_REQUIRE_* variables: {took:?}",
        require.len()
    );
    std::fs::remove_file(e.path("runtime-called")).unwrap();

    // As many device-list mounts as a spec may hold, each a /dev/null bind naming another
    // device: refused as more items than any node has devices, as the variable is.
    e.config("accept-container-devices-as-mounts = true");
    e.set_env(&[]);
    let dir = "/var/run/nvidia-container-devices";
    let mounts: Vec<Value> = (0..65_536)
        .map(|i| json!({"destination": format!("{dir}/{i}"), "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]}))
        .collect();
    with_mounts(&e, &mounts);
    let before = e.snapshot();
    let (out, took) = create_capped(&e, MEMORY);
    e.check_refusal(&out, &["at most 1024 allowed"], &before);
    assert!(took < TIME, "{} device-list mounts: {took:?}", mounts.len());
}

/// Issue 23, class 5: the container's new loader cache is written through a temp file whose
/// name nobody can guess (a name planted in the image cannot stop the write), and the temp
/// files a killed create left in the image's `/etc` are removed by the next create; other
/// names are not touched.
#[test]
fn container_cache_temp_names_are_unguessable_and_leftovers_removed() {
    let e = Env::new();
    let rootfs = with_image(&e, &["NVIDIA_VISIBLE_DEVICES=0"]);
    let etc = rootfs.join("etc");
    let ours = [
        ".ld.so.cache.accel-AbCdEf0123456789.tmp",
        ".ld.so.cache.accel-0000000000000000.tmp",
    ];
    let others = [
        ".ld.so.cache.accel-AbCdEf012345678.tmp",
        ".ld.so.cache.tmp",
        "ld.so.cache.accel-AbCdEf0123456789.tmp",
        ".passwd.accel-AbCdEf0123456789.tmp",
    ];
    for n in ours.iter().chain(&others) {
        std::fs::write(etc.join(n), b"half").unwrap();
    }
    // In a new PID namespace the shim is pid 1 (or 2): directories at every name a
    // pid-derived temp name could take there.
    for pid in 1..=4 {
        std::fs::create_dir(etc.join(format!(".ld.so.cache.accel-{pid}"))).unwrap();
        std::fs::create_dir(etc.join(format!(".ld.so.cache.accel-{pid}.tmp"))).unwrap();
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", SHIM.as_str(), "create", "--bundle"])
        .arg(e.bundle())
        .arg("ctr")
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", e.path("config.toml"))
        .current_dir(e.dir.path())
        .stdin(Stdio::null());
    let out = wait_with_timeout(cmd, Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(e.runtime_ran());
    assert_eq!(cache_names(&rootfs), ["libcuda.so.1"], "{}", e.log());
    let mut left: Vec<String> = std::fs::read_dir(&etc)
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".ld.so.cache.accel-") || n.len() > 24)
        .collect();
    left.sort();
    let mut want: Vec<String> = others.iter().map(|s| s.to_string()).collect();
    want.push("ld.so.cache".into());
    want.sort();
    assert_eq!(left, want);
}

/// Issue 23, class 6: `--version` and `-v` print the low-level runtime's output first and
/// unchanged (runc's own test suite reads both streams), then the shim's line on stderr;
/// the exit status is the runtime's.
#[test]
fn version_prints_runc_s_output_first_and_unchanged() {
    let e = Env::new();
    let runc = Command::new("runc").arg("--version").output().unwrap();
    assert!(runc.status.success() && !runc.stdout.is_empty());
    e.config("");
    let config = std::fs::read_to_string(e.path("config.toml"))
        .unwrap()
        .replace(
            &format!("low-level-runtime = {:?}", e.path("runtime")),
            "low-level-runtime = \"runc\"",
        );
    std::fs::write(e.path("config.toml"), config).unwrap();
    for flag in ["--version", "-v"] {
        let out = e.run(&[flag]);
        assert!(out.status.success(), "{flag}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&runc.stdout),
            "{flag}"
        );
        // Both streams into one pipe, as a test harness that reads them together sees them.
        let mut both = e.command(&[flag]);
        // SAFETY: dup2 is async-signal-safe; it makes stderr the stdout pipe.
        unsafe {
            use std::os::unix::process::CommandExt;
            both.pre_exec(|| {
                if libc::dup2(1, 2) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = wait_with_timeout(both, Duration::from_secs(20));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with(&*String::from_utf8_lossy(&runc.stdout)),
            "{flag}: {text:?}"
        );
        assert!(
            text.ends_with(&format!(
                "accel-container-runtime version {}\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{flag}: {text:?}"
        );
    }
    // The runtime's exit status comes through.
    std::fs::write(e.path("fails"), "#!/bin/sh\necho fail-out\nexit 3\n").unwrap();
    std::fs::set_permissions(e.path("fails"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = std::fs::read_to_string(e.path("config.toml"))
        .unwrap()
        .replace(
            "low-level-runtime = \"runc\"",
            &format!("low-level-runtime = {:?}", e.path("fails")),
        );
    std::fs::write(e.path("config.toml"), config).unwrap();
    let out = e.run(&["--version"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"fail-out\n");
}
