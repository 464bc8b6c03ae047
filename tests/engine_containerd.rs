//! The real containerd loads what `accel-ctk runtime configure` writes (issue 3, item 5b):
//! `containerd config dump` shows the runtime with its `BinaryName`, and a private containerd
//! (root, state and socket under a temp dir; never the node's) started with the file brings up
//! its CRI plugin with the runtime registered and made the default.
//!
//! Needs root and containerd on PATH (CI installs it); without them these tests fail rather
//! than skip. containerd 1.x reads config versions 1 and 2 only, so the v3 golden file is
//! checked by the golden tests, not here.

mod common;
#[path = "common/engines.rs"]
mod engines;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use engines::{configure_containerd, containerd_config_dump};

const RUNTIME_PATH: &str = "/usr/bin/accel-container-runtime";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/engine")
        .join(name)
}

fn configure(file: &Path, extra: &[&str]) {
    configure_containerd(file, RUNTIME_PATH, extra);
}

fn cri_runtime<'a>(dump: &'a toml::Table, name: &str) -> &'a toml::Value {
    &dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][name]
}

#[test]
fn config_dump_shows_runtime_from_operator_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::copy(fixture("containerd-v2.toml"), &file).unwrap();
    configure(&file, &["--set-as-default"]);
    let dump = containerd_config_dump(&file);
    let accel = cri_runtime(&dump, "accel");
    assert_eq!(
        accel["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    assert_eq!(accel["options"]["BinaryName"].as_str(), Some(RUNTIME_PATH));
    assert_eq!(accel["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"].as_str(),
        Some("accel")
    );
    // The operator's runtimes are still there.
    assert_eq!(
        cri_runtime(&dump, "kata")["runtime_type"].as_str(),
        Some("io.containerd.kata.v2")
    );
}

#[test]
fn config_dump_shows_runtime_from_new_file() {
    let dir = tempfile::tempdir().unwrap();
    // /etc/containerd may not exist before containerd's first configuration.
    let file = dir.path().join("containerd/config.toml");
    configure(&file, &["--create-parents"]);
    let dump = containerd_config_dump(&file);
    assert_eq!(
        cri_runtime(&dump, "accel")["options"]["BinaryName"].as_str(),
        Some(RUNTIME_PATH)
    );
    // runc stays the default and stays defined: containerd drops its built-in runtimes when
    // a file names any.
    assert_eq!(
        cri_runtime(&dump, "runc")["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    assert_eq!(
        dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"].as_str(),
        Some("runc")
    );
}

/// A file without `version` is schema 1 (`plugins.cri`), which containerd 1.x still loads.
#[test]
fn config_dump_shows_runtime_from_schema_1_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        "# no version key\n[plugins.cri.containerd]\n  snapshotter = \"overlayfs\"\n[plugins.cri.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n[plugins.cri.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n",
    )
    .unwrap();
    configure(&file, &["--set-as-default"]);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("[plugins.cri.containerd.runtimes.accel]"),
        "{text}"
    );
    let dump = containerd_config_dump(&file);
    let accel = cri_runtime(&dump, "accel");
    assert_eq!(accel["options"]["BinaryName"].as_str(), Some(RUNTIME_PATH));
    assert_eq!(accel["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"].as_str(),
        Some("accel")
    );
}

/// A containerd of our own, killed and reaped when dropped (test failure included).
struct Daemon {
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &Path, dir: &Path) -> (Daemon, PathBuf) {
    let sock = dir.join("containerd.sock");
    let child = Command::new("containerd")
        .arg("--config")
        .arg(config)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--address")
        .arg(&sock)
        .arg("--log-level")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("containerd must be installed (apt-get install containerd)");
    (Daemon { child }, sock)
}

/// Copies an operator file for a private daemon: the `opt` plugin creates its directory at
/// start, so it goes under the test's temp dir instead of the node's.
fn copy_for_daemon(from: &Path, to: &Path, dir: &Path) {
    let text = std::fs::read_to_string(from).unwrap();
    let opt = format!("path = \"{}\"", dir.join("opt").display());
    let text = text
        .replace("path = \"/opt/containerd\"", &opt)
        .replace("path = \"/var/lib/containerd/opt\"", &opt);
    assert!(
        text.contains(&opt),
        "{} has no opt plugin path",
        from.display()
    );
    std::fs::write(to, text).unwrap();
}

/// Starts a private containerd on `file` and returns the line in which its CRI plugin logs
/// its whole effective config as it starts.
fn cri_start_line(file: &Path, dir: &Path) -> String {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test starts containerd and must run as root"
    );
    let (mut daemon, _sock) = start(file, dir);
    let stderr = daemon.child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("Start cri plugin with config") => return line,
            Ok(line) => seen.push(line),
            Err(_) => panic!(
                "containerd never started its CRI plugin on {}; its log:\n{}",
                file.display(),
                seen.join("\n")
            ),
        }
    }
}

fn runtime_in_log(name: &str) -> String {
    format!(
        "{name}:{{Type:io.containerd.runc.v2 Path: Engine: PodAnnotations:[] ContainerAnnotations:[] Root: Options:map[BinaryName:{RUNTIME_PATH}"
    )
}

#[test]
fn private_containerd_starts_cri_with_the_runtime_as_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    copy_for_daemon(&fixture("containerd-v2.toml"), &file, dir.path());
    configure(&file, &["--set-as-default"]);
    let line = cri_start_line(&file, dir.path());
    assert!(line.contains("DefaultRuntimeName:accel"), "{line}");
    assert!(
        line.contains(&format!("{} SystemdCgroup:true]", runtime_in_log("accel"))),
        "{line}"
    );
}

/// Debian 12's own /etc/containerd/config.toml has no `runtimes`: adding ours must not take
/// away containerd's built-in runc, or the CRI plugin refuses to load.
#[test]
fn private_containerd_starts_cri_on_distro_default_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    copy_for_daemon(&fixture("containerd-debian12.toml"), &file, dir.path());
    configure(&file, &[]);
    let line = cri_start_line(&file, dir.path());
    assert!(line.contains("DefaultRuntimeName:runc"), "{line}");
    assert!(
        line.contains(&format!("{}]", runtime_in_log("accel"))),
        "{line}"
    );
    assert!(line.contains("runc:{Type:io.containerd.runc.v2"), "{line}");
}
