//! The real engines for the end-to-end tests: a private `dockerd` and a private `containerd`,
//! each in its own short temp dir under /tmp (a unix socket path has at most 108 bytes), never
//! the node's own daemons, sockets or data; images made from the harness's busybox rootfs.
//!
//! Include after the shared harness: `mod common;` then
//! `#[path = "common/engines.rs"] mod engines;` (it uses `crate::common`).
//!
//! # API
//!
//! - [`require_engines`]: call first (after `common::require_root`). Panics, never skips,
//!   when `dockerd`, Debian's `/usr/bin/docker` client, `containerd`, `ctr`, `tar` or
//!   `sha256sum` is missing: CI installs `docker.io` and `containerd`.
//! - [`busybox_rootfs_tar`]: the harness's busybox rootfs as a plain tarball (for
//!   `docker import`, and the single layer of [`oci_image_archive`]).
//! - [`oci_image_archive`]: a minimal OCI image layout tarball (index.json with the image name
//!   annotation, manifest, config, one uncompressed layer, sha256 digests from `sha256sum`)
//!   that `ctr images import` takes.
//! - [`Dockerd`]: `Dockerd::start(daemon_json, env, bin_links)` runs `dockerd --iptables=false
//!   --ip6tables=false --bridge=none` with its data root, exec root (hence its own managed
//!   containerd), pid file, socket and `--config-file` in its temp dir; `env` is added to
//!   dockerd's environment (which its containerd, the containerd shims and so the runtime
//!   inherit). `bin_links` go into [`Dockerd::bin_dir`], first on dockerd's PATH (a
//!   `nvidia-container-runtime-hook` link there turns on `docker run --gpus`).
//!   [`Dockerd::docker`] runs Debian's docker client (20.10, the daemon's API) against it;
//!   [`Dockerd::reload`] sends SIGHUP (dockerd re-reads `runtimes` and `default-runtime`).
//! - [`Containerd`]: `Containerd::start(env)` runs `containerd` with a version 2 config whose
//!   root, state, grpc/ttrpc sockets and opt dir are in its temp dir
//!   ([`Containerd::base_config`]) and the CRI plugin disabled;
//!   [`Containerd::start_with_config`] starts it with a file the test writes in that dir
//!   (e.g. one `accel-ctk runtime configure` edited). [`Containerd::ctr`] runs `ctr -a <socket>`.
//! - [`Steps`]: runs named sub-steps of one `#[test]` (the daemon is shared by them and torn
//!   down when the test returns or panics: Rust tests have no global teardown), catching each
//!   step's panic so every step runs; [`Steps::finish`] fails the test listing the failed
//!   steps.
//!
//! Teardown (Drop, also on panic): remove the daemon's containers, SIGTERM the daemon (SIGKILL
//! after a grace period), SIGTERM a dockerd-managed containerd that outlived dockerd, lazily
//! unmount whatever is still mounted under the temp dir, then remove the dir.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::common::{output, sh_ok, which, Bundle, Out};

/// Debian's docker client, the same release as its dockerd (a newer client in
/// /usr/local/bin would need DOCKER_API_VERSION against a 20.10 daemon).
pub const DOCKER: &str = "/usr/bin/docker";
/// The image `docker import` and `ctr images import` make from the busybox rootfs.
pub const IMAGE: &str = "docker.io/library/accel-e2e:busybox";

/// Panics with a clear message when the engines are not installed. Never skips.
pub fn require_engines() {
    crate::common::require_root();
    for (tool, pkg) in [
        ("dockerd", "docker.io"),
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("containerd-shim-runc-v2", "containerd"),
        ("tar", "tar"),
        ("sha256sum", "coreutils"),
    ] {
        assert!(
            which(tool).is_some(),
            "the engine end-to-end tests need `{tool}` (apt-get install {pkg}); CI installs it"
        );
    }
    assert!(
        Path::new(DOCKER).is_file(),
        "the engine end-to-end tests need Debian's docker client at {DOCKER} (apt-get install docker.io)"
    );
}

/// PATH for the daemons: the caller's, plus the sbin dirs (dockerd, runc) a test runner's
/// PATH may lack.
fn daemon_path(first: Option<&Path>) -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> = first.into_iter().map(Path::to_path_buf).collect();
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs.extend(["/usr/sbin".into(), "/sbin".into()]);
    std::env::join_paths(dirs).expect("PATH entries without ':'")
}

/// A short temp dir under /tmp: every socket path built on it stays far below 108 bytes.
fn short_tempdir(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("temp dir under /tmp")
}

// ---------------------------------------------------------------------------------------------
// Images
// ---------------------------------------------------------------------------------------------

/// The harness's busybox rootfs (`/bin/busybox` and its applet links) as a tarball at `dest`.
pub fn busybox_rootfs_tar(dest: &Path) -> PathBuf {
    let bundle = Bundle::busybox();
    sh_ok(
        Command::new("tar")
            .arg("-C")
            .arg(bundle.rootfs())
            .arg("--numeric-owner")
            .arg("-cf")
            .arg(dest)
            .arg("."),
    );
    dest.to_path_buf()
}

fn sha256_file(path: &Path) -> String {
    let out = sh_ok(Command::new("sha256sum").arg(path));
    let hex = out.stdout.split_whitespace().next().unwrap_or_default();
    assert_eq!(
        hex.len(),
        64,
        "sha256sum {}: {}",
        path.display(),
        out.stdout
    );
    hex.to_string()
}

/// Copies `from` into the layout in `dir` as a blob; returns (digest, size).
fn put_blob(dir: &Path, from: &Path) -> (String, u64) {
    let hex = sha256_file(from);
    let size = std::fs::metadata(from).unwrap().len();
    std::fs::copy(from, dir.join("blobs/sha256").join(&hex)).unwrap();
    (format!("sha256:{hex}"), size)
}

/// A minimal OCI image layout tarball at `dest`, named [`IMAGE`], whose only layer is
/// `rootfs_tar` (uncompressed), for linux/amd64.
pub fn oci_image_archive(rootfs_tar: &Path, dest: &Path) -> PathBuf {
    let work = tempfile::tempdir().expect("temp dir for the OCI layout");
    let dir = work.path().join("layout");
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    let scratch = |name: &str, json: &serde_json::Value| {
        let p = work.path().join(name);
        std::fs::write(&p, serde_json::to_vec(json).unwrap()).unwrap();
        p
    };

    let (layer, layer_size) = put_blob(&dir, rootfs_tar);
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["sh"]
        },
        // An uncompressed layer's diff id is its own digest.
        "rootfs": {"type": "layers", "diff_ids": [layer]}
    });
    let (config, config_size) = put_blob(&dir, &scratch("config.json", &config));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config,
            "size": config_size
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer,
            "size": layer_size
        }]
    });
    let (manifest, manifest_size) = put_blob(&dir, &scratch("manifest.json", &manifest));
    let tag = IMAGE.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest,
            "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": IMAGE,
                "org.opencontainers.image.ref.name": tag
            }
        }]
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    sh_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&dir)
            .arg("-cf")
            .arg(dest)
            .args(["oci-layout", "index.json", "blobs"]),
    );
    dest.to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// Daemon processes and teardown
// ---------------------------------------------------------------------------------------------

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid this test started; no memory is involved.
    unsafe {
        libc::kill(pid, sig);
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
}

/// SIGTERM, then SIGKILL after `grace`; reaps the child.
fn stop_child(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    signal(child.id() as i32, libc::SIGTERM);
    let end = Instant::now() + grace;
    while Instant::now() < end {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Stops a process that is not our child (dockerd's managed containerd), when its command
/// line still names `marker` (our temp dir), so a recycled pid is never signalled.
fn stop_foreign(pid: i32, marker: &Path, grace: Duration) {
    let owned = |pid: i32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(&*marker.to_string_lossy()))
            .unwrap_or(false)
    };
    if !alive(pid) || !owned(pid) {
        return;
    }
    signal(pid, libc::SIGTERM);
    let end = Instant::now() + grace;
    while Instant::now() < end && alive(pid) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) && owned(pid) {
        signal(pid, libc::SIGKILL);
    }
}

/// Mount points at or under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // mountinfo escapes space, tab, newline and backslash as octal.
        .map(|p| {
            p.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
                .replace("\\134", "\\")
        })
        .filter(|p| p == &dir || p.starts_with(&format!("{dir}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    points
}

/// Lazily unmounts everything still mounted under `dir` (overlay, shm, netns, bind mounts a
/// killed daemon left), so removing the dir never walks into a mount.
fn umount_under(dir: &Path) {
    for _ in 0..3 {
        let points = mounts_under(dir);
        if points.is_empty() {
            return;
        }
        for p in points {
            let _ = output(Command::new("umount").arg("-l").arg(&p));
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts the daemon `cmd` with `env` added, its output to the file `log`, and in its own
/// process group: a ^C to the test run reaches the test, whose Drop stops it.
fn spawn_logged(mut cmd: Command, log: &Path, env: &[(&str, &OsStr)], name: &str) -> Child {
    let file = std::fs::File::create(log).unwrap();
    cmd.env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

/// Polls `ready` until it holds, panicking with the daemon's log tail if the daemon exits or
/// `limit` passes.
fn wait_ready(
    name: &str,
    child: &mut Child,
    log: &Path,
    limit: Duration,
    ready: impl Fn() -> bool,
) {
    let end = Instant::now() + limit;
    loop {
        if ready() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{name} exited ({status}) before it was ready; its log:\n{}",
                tail(log, 40)
            );
        }
        assert!(
            Instant::now() < end,
            "{name} not ready after {limit:?}; its log:\n{}",
            tail(log, 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------------
// dockerd
// ---------------------------------------------------------------------------------------------

/// Debian's docker client for the daemon whose dir is `dir`; its own client config dir, so
/// the user's contexts and credentials are never read.
fn docker_at(dir: &Path) -> Command {
    let mut c = Command::new(DOCKER);
    c.env("DOCKER_CONFIG", dir.join("client"))
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_CONTEXT")
        .arg("-H")
        .arg(format!("unix://{}", dir.join("docker.sock").display()));
    c
}

/// A private dockerd (and the containerd it manages), stopped and cleaned up on drop.
#[derive(Debug)]
pub struct Dockerd {
    child: Child,
    dir: TempDir,
}

impl Dockerd {
    /// Starts dockerd with `daemon_json` as its `--config-file`, `env` added to its
    /// environment and `bin_links` (name, target) as symlinks in [`Dockerd::bin_dir`], first
    /// on its PATH; waits until its API answers.
    pub fn start(
        daemon_json: &serde_json::Value,
        env: &[(&str, &OsStr)],
        bin_links: &[(&str, &Path)],
    ) -> Dockerd {
        require_engines();
        let dir = short_tempdir("ae2e-d.");
        let d = dir.path();
        for sub in ["bin", "data", "exec", "client"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(
            d.join("daemon.json"),
            serde_json::to_vec_pretty(daemon_json).unwrap(),
        )
        .unwrap();
        for (name, target) in bin_links {
            std::os::unix::fs::symlink(target, d.join("bin").join(name)).unwrap();
        }
        Self::spawn(dir, env)
    }

    fn spawn(dir: TempDir, env: &[(&str, &OsStr)]) -> Dockerd {
        let d = dir.path();
        // By full path: a test runner's PATH may lack /usr/sbin.
        let mut cmd = Command::new(which("dockerd").expect("dockerd"));
        cmd.args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", d.join("docker.sock").display()))
            .arg("--config-file")
            .arg(d.join("daemon.json"))
            .env("PATH", daemon_path(Some(&d.join("bin"))))
            .env_remove("DOCKER_HOST");
        let child = spawn_logged(cmd, &d.join("dockerd.log"), env, "dockerd");
        let mut daemon = Dockerd { child, dir };
        let log = daemon.log_path();
        let dir = daemon.dir.path().to_path_buf();
        wait_ready(
            "dockerd",
            &mut daemon.child,
            &log,
            Duration::from_secs(60),
            || {
                output(docker_at(&dir).args(["version", "--format", "{{.Server.Version}}"])).code
                    == 0
            },
        );
        daemon
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    /// First on dockerd's PATH (read by dockerd at start only).
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }
    pub fn daemon_json_path(&self) -> PathBuf {
        self.dir.path().join("daemon.json")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("dockerd.log")
    }
    /// The last `lines` lines of dockerd's log (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }

    /// Debian's docker client against this daemon.
    pub fn docker<S: AsRef<OsStr>>(&self, args: &[S]) -> Out {
        output(docker_at(self.dir.path()).args(args))
    }

    /// SIGHUP: dockerd re-reads daemon.json (`runtimes`, `default-runtime` among the keys it
    /// reloads). Waits until the reload is logged.
    pub fn reload(&self) {
        let before = std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .matches("Reloaded configuration")
            .count();
        signal(self.child.id() as i32, libc::SIGHUP);
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            if log.matches("Reloaded configuration").count() > before {
                return;
            }
            assert!(
                Instant::now() < end,
                "dockerd did not log a reload after SIGHUP:\n{}",
                self.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `docker rm -f` of every container this daemon has.
    pub fn remove_all_containers(&self) {
        let ids = self.docker(&["ps", "-aq"]);
        let ids: Vec<&str> = ids.stdout.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids);
            let _ = self.docker(&args);
        }
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let d = self.dir.path().to_path_buf();
        if self.child.try_wait().ok().flatten().is_none() {
            self.remove_all_containers();
        }
        stop_child(&mut self.child, Duration::from_secs(20));
        // dockerd stops the containerd it manages; this covers a dockerd that was killed.
        if let Some(pid) = std::fs::read_to_string(d.join("exec/containerd/containerd.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            stop_foreign(pid, &d, Duration::from_secs(10));
        }
        umount_under(&d);
    }
}

// ---------------------------------------------------------------------------------------------
// containerd
// ---------------------------------------------------------------------------------------------

/// A private containerd, stopped and cleaned up on drop.
#[derive(Debug)]
pub struct Containerd {
    child: Child,
    dir: TempDir,
}

impl Containerd {
    /// The config every private containerd gets: root, state, sockets and the opt plugin's
    /// dir in `dir`; nothing under /var/lib/containerd, /run/containerd or /opt.
    pub fn base_config(dir: &Path) -> String {
        format!(
            "version = 2\nroot = {root:?}\nstate = {state:?}\n\n[grpc]\n  address = {sock:?}\n\n\
             [ttrpc]\n  address = {ttrpc:?}\n\n[plugins]\n  [plugins.\"io.containerd.internal.v1.opt\"]\n    path = {opt:?}\n",
            root = dir.join("root"),
            state = dir.join("state"),
            sock = dir.join("c.sock"),
            ttrpc = dir.join("c.sock.ttrpc"),
            opt = dir.join("opt"),
        )
    }

    /// A containerd with [`Containerd::base_config`], the CRI plugin disabled (these tests
    /// drive it with ctr), and `env` added to its environment.
    pub fn start(env: &[(&str, &OsStr)]) -> Containerd {
        require_engines();
        let dir = short_tempdir("ae2e-c.");
        let text = format!(
            "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n{}",
            Self::base_config(dir.path())
        );
        std::fs::write(dir.path().join("config.toml"), text).unwrap();
        Self::spawn(dir, env)
    }

    /// A containerd started with `make_config(dir)`'s file (the test writes it; use
    /// [`Containerd::base_config`] for the paths).
    pub fn start_with_config(
        make_config: impl FnOnce(&Path) -> PathBuf,
        env: &[(&str, &OsStr)],
    ) -> Containerd {
        require_engines();
        let dir = short_tempdir("ae2e-c.");
        let file = make_config(dir.path());
        if file != dir.path().join("config.toml") {
            std::fs::copy(&file, dir.path().join("config.toml")).unwrap();
        }
        Self::spawn(dir, env)
    }

    fn spawn(dir: TempDir, env: &[(&str, &OsStr)]) -> Containerd {
        let d = dir.path();
        let mut cmd = Command::new(which("containerd").expect("containerd"));
        cmd.arg("--config")
            .arg(d.join("config.toml"))
            .env("PATH", daemon_path(None));
        let child = spawn_logged(cmd, &d.join("containerd.log"), env, "containerd");
        let mut daemon = Containerd { child, dir };
        let log = daemon.log_path();
        let sock = daemon.socket();
        wait_ready(
            "containerd",
            &mut daemon.child,
            &log,
            Duration::from_secs(60),
            || output(Command::new("ctr").arg("-a").arg(&sock).arg("version")).code == 0,
        );
        daemon
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("c.sock")
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("containerd.log")
    }
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }

    /// `ctr -a <socket> args...`.
    pub fn ctr<S: AsRef<OsStr>>(&self, args: &[S]) -> Out {
        output(
            Command::new("ctr")
                .arg("-a")
                .arg(self.socket())
                .args(args)
                .env_remove("CONTAINERD_NAMESPACE"),
        )
    }

    /// Kills and deletes every task and container in every namespace.
    pub fn remove_all_containers(&self) {
        let namespaces = self.ctr(&["namespaces", "ls", "-q"]);
        for ns in namespaces.stdout.split_whitespace() {
            let ids = self.ctr(&["-n", ns, "containers", "ls", "-q"]);
            for id in ids.stdout.split_whitespace() {
                let _ = self.ctr(&["-n", ns, "tasks", "rm", "-f", id]);
                let _ = self.ctr(&["-n", ns, "containers", "rm", id]);
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.remove_all_containers();
        }
        stop_child(&mut self.child, Duration::from_secs(20));
        umount_under(self.dir.path());
    }
}

/// `accel-ctk runtime configure --runtime containerd --config <file> --runtime-path <runtime>
/// <extra>`; panics unless it succeeds.
pub fn configure_containerd(file: &Path, runtime: &str, extra: &[&str]) {
    let mut args = vec![
        "runtime",
        "configure",
        "--runtime",
        "containerd",
        "--config",
        file.to_str().unwrap(),
        "--runtime-path",
        runtime,
    ];
    args.extend_from_slice(extra);
    crate::common::accel_ctk(&args).ok();
}

/// The configuration containerd makes of `file`: `containerd --config <file> config dump`.
#[track_caller]
pub fn containerd_config_dump(file: &Path) -> toml::Table {
    let out = output(
        Command::new("containerd")
            .arg("--config")
            .arg(file)
            .args(["config", "dump"]),
    );
    assert_eq!(
        out.code,
        0,
        "containerd refused {}: {}",
        file.display(),
        out.stderr
    );
    toml::from_str(&out.stdout).expect("config dump is TOML")
}

// ---------------------------------------------------------------------------------------------
// Sub-steps of one test
// ---------------------------------------------------------------------------------------------

/// Named steps of one `#[test]` sharing an expensive fixture (a daemon). Each step's panic is
/// caught and recorded, so one failure does not hide the others, and the fixture's Drop still
/// runs when the test ends.
#[derive(Debug, Default)]
pub struct Steps {
    ran: usize,
    failed: Vec<String>,
}

impl Steps {
    pub fn new() -> Steps {
        Steps::default()
    }

    pub fn run(&mut self, name: &str, f: impl FnOnce()) {
        self.ran += 1;
        let start = Instant::now();
        eprintln!("--- step {name}");
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(()) => eprintln!("--- step {name}: ok ({:.1?})", start.elapsed()),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "(non-string panic)".into());
                eprintln!("--- step {name}: FAILED");
                self.failed.push(format!("step `{name}`: {msg}"));
            }
        }
    }

    /// Fails the test when any step failed, listing each with its message.
    #[track_caller]
    pub fn finish(self) {
        assert!(
            self.failed.is_empty(),
            "{} of {} steps failed:\n\n{}",
            self.failed.len(),
            self.ran,
            self.failed.join("\n\n")
        );
    }
}
