//! Shared end-to-end harness: a simulated accelerator host, OCI bundles, and the shim driven
//! like runc. Everything is real: real `runc` from the distro, real device nodes made with
//! `mknod` (NVIDIA's major 195; free dynamic majors for Enflame and Ascend), libraries compiled
//! by `gcc` with real sonames, an `ld.so.cache` written by `ldconfig -r`. Assertions are made
//! from inside the container.
//!
//! Use from an integration test with `mod common;` (each test file compiles its own copy, so
//! helpers one file does not use are allowed to be dead there).
//!
//! # API
//!
//! - [`require_root`]: call first. Panics (never skips) when not root or when `runc`,
//!   `/bin/busybox`, `gcc` or `ldconfig` is missing: CI runs as root and must run these tests.
//! - [`SimRoot`]: a driver root in a temp dir, built with [`SimRoot::builder`]:
//!   `.nvidia(&[("0000:3b:00.0", 3), ...])` GPUs (bus id, minor; UUIDs derived, see [`Gpu`]),
//!   `.enflame(4)` (`/dev/gcu0..3` + `/dev/gcuctl`), `.ascend(2)` (`/dev/davinci0..1` + shared
//!   nodes), `.library(dir, file, soname)`, `.binary(path, script)`,
//!   `.gpu_node_access(mode, gid)` (e.g. `0o660, 44`), `.build()`. [`SimRoot::standard`] is the
//!   demo's host: 2 GPUs on buses whose order differs from their minors' order, 4 GCUs,
//!   `libcuda.so.1`, `libnvidia-ml.so.1`, `libefml.so.1`, `nvidia-smi`, `efsmi`. Every fake
//!   library exports `int accel_sim_marker(void)` returning [`MARKER_VALUE`].
//!   [`SimRoot::gpus`] lists GPUs in PCI bus order, i.e. by the index the shim gives them.
//! - [`Runc`]: a runc state dir (`--root`) plus a shim `config.toml` pointing every profile at
//!   a `SimRoot` (`Runc::new(&sim)`; `Runc::with_config(&sim, extra_top_level_toml)`), given to
//!   the shim through `ACCEL_CONTAINER_RUNTIME_CONFIG`. Methods run the shim binary
//!   ([`SHIM`]) exactly as an engine runs runc: [`Runc::run`],
//!   [`Runc::create`] (detached, `--pid-file`, stdio to files so nothing holds a pipe open),
//!   [`Runc::start`], [`Runc::exec`], [`Runc::update`], [`Runc::delete`], [`Runc::shim`] (any
//!   argv), [`Runc::shim_stdin`] (any argv, bytes on stdin), and [`Runc::runc`] (the real runc
//!   on the same state dir, to check what exists). `Runc` is `Sync`: share one `&Runc`
//!   between threads (`std::thread::scope`) for parallel creates.
//!   [`Runc::id`] makes a unique container id and registers it: on drop (also when the test
//!   panics) every registered container is `delete -f`'d. Declare the `Runc` after the
//!   bundles it runs so it drops first. Every call returns an [`Out`] (exit code, stdout,
//!   stderr).
//! - [`Bundle`]: a temp bundle dir whose `config.json` comes from `runc spec`, with
//!   `process.terminal = false`, edited as a `serde_json::Value` and written back on every
//!   change: [`Bundle::busybox`], [`Bundle::glibc`] (a Debian-layout rootfs with the host's
//!   glibc loader and the libraries a program needs, and its own `/etc/ld.so.cache`),
//!   [`Bundle::env`], [`Bundle::args`], [`Bundle::sh`], [`Bundle::edit`].
//! - [`Probe`]: a shell script that prints sections (`ls` of dirs, result of opening paths,
//!   any command), and [`Report`] parses its output: `report.ls("/dev")`,
//!   `report.open("/dev/nvidia1")` ([`Open::Enxio`], [`Open::Eperm`], ...).
//! - [`drm`]: DRM-class hosts (AMD, Intel, Hygon sysfs and `/dev/dri` nodes) built into a
//!   `SimRoot`, and `drm::install_profiles` to add their profile files to a `Runc`.
//! - [`unique`]: a process- and thread-unique name for ids and files.
//! - [`cgroup_v1`]: whether the host runs cgroup v1 (devices.list exists) or v2 (eBPF).
//! - [`binary`]: the path of one of the crate's binaries, cargo's build or, with
//!   `ACCEL_TEST_BINARIES=<dir>`, the one in `<dir>` ([`SHIM`] and [`CTK`] are the runtime's
//!   and accel-ctk's). Every test that starts one of them goes through it, but
//!   tests/crash_safety.rs (no shipped build has its failpoints).

#![allow(dead_code)]

#[cfg(feature = "dra")]
pub mod apiserver;
#[cfg(feature = "dra")]
pub mod dra;
pub mod drm;
#[cfg(feature = "plugin")]
pub mod grpc;
#[cfg(feature = "plugin")]
pub mod kubelet;
#[cfg(feature = "plugin")]
pub mod nri;
pub mod nvml;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use serde_json::Value;
use tempfile::TempDir;

/// What every fake library's `accel_sim_marker()` returns.
pub const MARKER_VALUE: i32 = 42;
pub const MARKER_SYMBOL: &str = "accel_sim_marker";
pub const NVIDIA_MAJOR: u32 = 195;
/// The shim under test.
pub static SHIM: LazyLock<String> =
    LazyLock::new(|| binary(env!("CARGO_BIN_EXE_accel-container-runtime")));
/// accel-ctk under test.
pub static CTK: LazyLock<String> = LazyLock::new(|| binary(env!("CARGO_BIN_EXE_accel-ctk")));

/// `built` (a `CARGO_BIN_EXE_<name>` path), or with `ACCEL_TEST_BINARIES=<dir>` the file of
/// the same name in `<dir>` (relative to the repository root). `.ci/run` points it at the
/// shipped build (`target/<triple>/release`), so the suites run the binaries the packages hold
/// without compiling the harnesses again under the release profile.
///
/// A missing or non-executable file panics rather than falling back to `built`: a mistyped
/// directory would otherwise pass by testing cargo's debug build instead of the shipped one.
pub fn binary(built: &'static str) -> String {
    let Some(dir) = std::env::var_os("ACCEL_TEST_BINARIES") else {
        return built.to_owned();
    };
    let name = Path::new(built)
        .file_name()
        .expect("CARGO_BIN_EXE_* names a file");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(name);
    match path.metadata() {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
        Ok(_) => panic!(
            "ACCEL_TEST_BINARIES: {} is not an executable file",
            path.display()
        ),
        Err(e) => panic!("ACCEL_TEST_BINARIES: {}: {e}", path.display()),
    }
    path.into_os_string()
        .into_string()
        .unwrap_or_else(|p| panic!("ACCEL_TEST_BINARIES: {p:?} is not UTF-8"))
}
/// The Debian multiarch library directory (where the fake driver puts its libraries).
pub const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// Panics with a clear message when these tests cannot run here. They never skip.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the end-to-end tests need root (runc, mknod); CI runs them as root: run `sudo cargo test`"
    );
    for tool in ["runc", "gcc", "ldconfig", "ldd"] {
        assert!(
            which(tool).is_some(),
            "the end-to-end tests need `{tool}` in PATH (apt-get install runc gcc libc-bin)"
        );
    }
    assert!(
        Path::new("/bin/busybox").is_file(),
        "the end-to-end tests need /bin/busybox (apt-get install busybox-static)"
    );
}

/// `tool`'s path on PATH or in the sbin dirs (a test runner's PATH may lack them).
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// True on a cgroup v1 host (the devices controller has `devices.list`); false on v2, where
/// device rules are an eBPF program and cgroup files sit directly under /sys/fs/cgroup.
pub fn cgroup_v1() -> bool {
    !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A name no other test, thread or process uses at the same time.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Result of a command: exit code (-1 when killed by a signal) and its output.
#[derive(Debug, Clone)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    fn from(o: std::process::Output) -> Out {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Panics with both streams unless the exit code is 0.
    #[track_caller]
    pub fn ok(&self) -> &Out {
        assert_eq!(self.code, 0, "command failed: {self:#?}");
        self
    }
}

/// Runs `cmd`, panicking only when it cannot be started at all.
pub fn output(cmd: &mut Command) -> Out {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    Out::from(o)
}

/// `accel-ctk args...`.
pub fn accel_ctk<S: AsRef<OsStr>>(args: &[S]) -> Out {
    output(Command::new(&*CTK).args(args))
}

#[track_caller]
pub fn sh_ok(cmd: &mut Command) -> Out {
    let out = output(cmd);
    assert_eq!(out.code, 0, "{cmd:?} failed: {out:#?}");
    out
}

// ---------------------------------------------------------------------------------------------
// Simulated accelerator root
// ---------------------------------------------------------------------------------------------

/// A simulated NVIDIA GPU.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub bus: String,
    pub minor: u32,
    pub uuid: String,
}

impl Gpu {
    /// `/dev/nvidia<minor>`, the node's path in the container (and under the driver root).
    pub fn node(&self) -> String {
        format!("/dev/nvidia{}", self.minor)
    }
}

#[derive(Debug, Clone)]
struct FakeLib {
    dir: String,
    file: String,
    soname: String,
}

/// Builder for [`SimRoot`].
#[derive(Debug, Clone, Default)]
pub struct SimRootBuilder {
    gpus: Vec<(String, u32)>,
    enflame: usize,
    ascend: usize,
    libs: Vec<FakeLib>,
    bins: Vec<(String, String)>,
    gpu_access: Option<(u32, u32)>,
}

impl SimRootBuilder {
    /// GPUs as (PCI bus id, device minor).
    pub fn nvidia(mut self, gpus: &[(&str, u32)]) -> Self {
        self.gpus = gpus.iter().map(|(b, m)| (b.to_string(), *m)).collect();
        self
    }
    /// `n` Enflame GCUs: `/dev/gcu0..n-1` and `/dev/gcuctl` on a free dynamic major.
    pub fn enflame(mut self, n: usize) -> Self {
        self.enflame = n;
        self
    }
    /// `n` Ascend NPUs: `/dev/davinci0..n-1`, `/dev/davinci_manager`, `/dev/devmm_svm`,
    /// `/dev/hisi_hdc` on a free dynamic major.
    pub fn ascend(mut self, n: usize) -> Self {
        self.ascend = n;
        self
    }
    /// A shared library compiled with `-Wl,-soname,<soname>` at `<dir>/<file>`, with a
    /// `<soname>` symlink next to it when the names differ.
    pub fn library(mut self, dir: &str, file: &str, soname: &str) -> Self {
        self.libs.push(FakeLib {
            dir: dir.into(),
            file: file.into(),
            soname: soname.into(),
        });
        self
    }
    /// An executable shell script at `path` (absolute, container-style).
    pub fn binary(mut self, path: &str, script: &str) -> Self {
        self.bins.push((path.into(), script.into()));
        self
    }
    /// Mode and group of the GPU nodes (default 0666, root).
    pub fn gpu_node_access(mut self, mode: u32, gid: u32) -> Self {
        self.gpu_access = Some((mode, gid));
        self
    }

    pub fn build(self) -> SimRoot {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("accel-e2e-root.")
            .tempdir()
            .expect("temp dir for the driver root");
        let r = dir.path().to_path_buf();
        for d in ["dev", "etc", "usr/bin", "var/cache/ldconfig", &LIB_DIR[1..]] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        let mut sim = SimRoot {
            dir,
            gpus: Vec::new(),
            enflame_major: None,
            ascend_major: None,
        };

        if !self.gpus.is_empty() {
            let (mode, gid) = self.gpu_access.unwrap_or((0o666, 0));
            let gpus_dir = r.join("proc/driver/nvidia/gpus");
            std::fs::create_dir_all(&gpus_dir).unwrap();
            for (bus, minor) in &self.gpus {
                let uuid = format!(
                    "GPU-{:08x}-0d7a-4f52-9c1e-{}",
                    0x8f6b_1c00 + minor,
                    bus.replace([':', '.'], "")
                );
                std::fs::create_dir_all(gpus_dir.join(bus)).unwrap();
                std::fs::write(
                    gpus_dir.join(bus).join("information"),
                    format!(
                        "Model: \t\t Simulated GPU\nIRQ:   \t\t 0\nGPU UUID: \t\t {uuid}\nVideo BIOS: \t\t ??.??.??.??.??\nBus Type: \t\t PCIe\nDMA Size: \t\t 47 bits\nDMA Mask: \t\t 0x7fffffffffff\nBus Location: \t\t {bus}\nDevice Minor: \t\t {minor}\nGPU Excluded:\t\t No\n"
                    ),
                )
                .unwrap();
                let node = r.join(format!("dev/nvidia{minor}"));
                mknod(&node, NVIDIA_MAJOR, *minor, mode);
                nix::unistd::chown(&node, None, Some(nix::unistd::Gid::from_raw(gid))).unwrap();
                sim.gpus.push(Gpu {
                    bus: bus.clone(),
                    minor: *minor,
                    uuid,
                });
            }
            sim.gpus.sort_by(|a, b| a.bus.cmp(&b.bus));
            std::fs::write(
                r.join("proc/driver/nvidia/version"),
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  (simulated)\n",
            )
            .unwrap();
            mknod(&r.join("dev/nvidiactl"), NVIDIA_MAJOR, 255, 0o666);
            mknod(&r.join("dev/nvidia-uvm"), 511, 0, 0o666);
        }

        let majors = free_majors(2);
        if self.enflame > 0 {
            let major = majors[0];
            for n in 0..self.enflame {
                mknod(&r.join(format!("dev/gcu{n}")), major, n as u32, 0o666);
            }
            mknod(&r.join("dev/gcuctl"), major, 255, 0o666);
            std::fs::create_dir_all(r.join("sys/module/enflame")).unwrap();
            std::fs::write(r.join("sys/module/enflame/version"), "1.2.3.4\n").unwrap();
            sim.enflame_major = Some(major);
        }
        if self.ascend > 0 {
            let major = majors[1];
            for n in 0..self.ascend {
                mknod(&r.join(format!("dev/davinci{n}")), major, n as u32, 0o666);
            }
            for (i, shared) in ["davinci_manager", "devmm_svm", "hisi_hdc"]
                .iter()
                .enumerate()
            {
                mknod(&r.join("dev").join(shared), major, 250 + i as u32, 0o666);
            }
            sim.ascend_major = Some(major);
        }

        let mut conf_dirs: BTreeSet<String> = BTreeSet::new();
        for lib in &self.libs {
            let dir = r.join(lib.dir.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(compiled_lib(&lib.soname), dir.join(&lib.file)).unwrap();
            if lib.file != lib.soname {
                symlink(&lib.file, dir.join(&lib.soname)).unwrap();
            }
            conf_dirs.insert(lib.dir.clone());
        }
        conf_dirs.insert(LIB_DIR.into());
        let conf: String = conf_dirs.iter().map(|d| format!("{d}\n")).collect();
        std::fs::write(r.join("etc/ld.so.conf"), conf).unwrap();
        sh_ok(Command::new("ldconfig").arg("-r").arg(&r));

        for (path, script) in &self.bins {
            let p = r.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, script).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        sim
    }
}

/// A simulated accelerator host: the driver root every profile is pointed at.
#[derive(Debug)]
pub struct SimRoot {
    dir: TempDir,
    gpus: Vec<Gpu>,
    enflame_major: Option<u32>,
    ascend_major: Option<u32>,
}

impl SimRoot {
    pub fn builder() -> SimRootBuilder {
        SimRootBuilder::default()
    }

    /// The demo's host: GPU index 0 is bus 0000:3b:00.0 with minor 3, index 1 is bus
    /// 0000:af:00.0 with minor 1 (bus order differs from minor order); 4 GCUs; libcuda,
    /// libnvidia-ml, libefml; nvidia-smi and efsmi scripts.
    pub fn standard() -> SimRoot {
        Self::standard_builder().build()
    }

    pub fn standard_builder() -> SimRootBuilder {
        SimRoot::builder()
            .nvidia(&[("0000:af:00.0", 1), ("0000:3b:00.0", 3)])
            .enflame(4)
            .library(LIB_DIR, "libcuda.so.550.54.14", "libcuda.so.1")
            .library(LIB_DIR, "libnvidia-ml.so.550.54.14", "libnvidia-ml.so.1")
            .library(LIB_DIR, "libefml.so.1.2.3", "libefml.so.1")
            .binary(
                "/usr/bin/nvidia-smi",
                "#!/bin/sh\necho 'nvidia-smi (simulated)'\n",
            )
            .binary("/usr/bin/efsmi", "#!/bin/sh\necho 'efsmi (simulated)'\n")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// GPUs in PCI bus order: `gpus()[i]` is what `NVIDIA_VISIBLE_DEVICES=i` selects.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    pub fn enflame_major(&self) -> Option<u32> {
        self.enflame_major
    }

    pub fn ascend_major(&self) -> Option<u32> {
        self.ascend_major
    }
}

/// A character device node at `path` (its parent dirs made) with exactly `mode`.
pub fn mknod(path: &Path, major: u32, minor: u32, mode: u32) {
    use nix::sys::stat::{makedev, Mode, SFlag};
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    nix::sys::stat::mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(mode),
        makedev(major.into(), minor.into()),
    )
    .unwrap_or_else(|e| {
        panic!(
            "mknod {} c {major} {minor}: {e} (these tests need root; CI runs them as root)",
            path.display()
        )
    });
    // mknod's mode is filtered by the umask; set it exactly.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `n` character majors in the dynamic range that no driver on this host registered (the
/// same pick as packaging/demo.sh), so opening such a node gives ENXIO.
pub fn free_majors(n: usize) -> Vec<u32> {
    let devices = std::fs::read_to_string("/proc/devices").expect("/proc/devices");
    let used: BTreeSet<u32> = devices
        .lines()
        .take_while(|l| !l.starts_with("Block"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    let free: Vec<u32> = (240..=254)
        .chain(234..240)
        .filter(|m| !used.contains(m))
        .take(n)
        .collect();
    assert_eq!(free.len(), n, "no {n} free char majors in 234..=254");
    free
}

/// Path of a library with `soname` exporting `accel_sim_marker`, compiled once per soname
/// into the target dir (renamed into place, so parallel test binaries never see half a file).
pub fn compiled_lib(soname: &str) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-libs");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{soname}.{MARKER_VALUE}"));
    if out.is_file() {
        return out;
    }
    let src = dir.join(format!("{}.c", unique("marker")));
    std::fs::write(
        &src,
        format!("int {MARKER_SYMBOL}(void) {{ return {MARKER_VALUE}; }}\n"),
    )
    .unwrap();
    let tmp = dir.join(unique("lib"));
    sh_ok(
        Command::new("gcc")
            .args(["-shared", "-fPIC"])
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-o")
            .arg(&tmp)
            .arg(&src),
    );
    std::fs::rename(&tmp, &out).unwrap();
    let _ = std::fs::remove_file(&src);
    out
}

/// Compiles a C program (source text) with the host gcc; the binary lives in `dir`.
pub fn compile_program(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let bin = dir.join(name);
    sh_ok(Command::new("gcc").arg("-o").arg(&bin).arg(&src));
    bin
}

// ---------------------------------------------------------------------------------------------
// Bundles
// ---------------------------------------------------------------------------------------------

/// An OCI bundle in a temp dir; `config.json` is rewritten after every edit.
#[derive(Debug)]
pub struct Bundle {
    dir: TempDir,
    spec: Value,
}

/// A new bundle's temp dir, once [`require_root`] has checked these tests can run here.
fn bundle_dir() -> TempDir {
    require_root();
    tempfile::Builder::new()
        .prefix("accel-e2e-bundle.")
        .tempdir()
        .expect("temp dir for the bundle")
}

impl Bundle {
    /// rootfs: `/bin/busybox` with a symlink per applet; config from `runc spec`.
    pub fn busybox() -> Bundle {
        let dir = bundle_dir();
        install_busybox(&dir.path().join("rootfs"));
        Self::from_dir(dir)
    }

    /// A glibc image at Debian paths: `program` at `/usr/bin/<name>`, the libraries `ldd`
    /// names copied to `/usr/lib/x86_64-linux-gnu` (the loader also to `/lib64`), `/lib` a
    /// link to `usr/lib` (merged /usr), busybox for a shell, and the image's own
    /// `/etc/ld.so.cache` made by `ldconfig -r rootfs` (so it knows only the image's files).
    pub fn glibc(program: &Path) -> Bundle {
        let dir = bundle_dir();
        let rootfs = dir.path().join("rootfs");
        install_busybox(&rootfs);
        let libdir = rootfs.join(&LIB_DIR[1..]);
        for d in [&libdir, &rootfs.join("lib64"), &rootfs.join("usr/bin")] {
            std::fs::create_dir_all(d).unwrap();
        }
        symlink("usr/lib", rootfs.join("lib")).unwrap();
        let name = program.file_name().unwrap();
        std::fs::copy(program, rootfs.join("usr/bin").join(name)).unwrap();
        let ldd = sh_ok(Command::new("ldd").arg(program));
        for line in ldd.stdout.lines() {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
            let path = match line.split_once("=>") {
                Some((_, rhs)) => rhs.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            let Some(path) = path.filter(|p| p.starts_with('/')) else {
                continue;
            };
            let file = Path::new(path).file_name().unwrap();
            std::fs::copy(path, libdir.join(file)).unwrap();
            if path.starts_with("/lib64/") {
                std::fs::copy(path, rootfs.join("lib64").join(file)).unwrap();
            }
        }
        std::fs::create_dir_all(rootfs.join("var/cache/ldconfig")).unwrap();
        std::fs::write(rootfs.join("etc/ld.so.conf"), format!("{LIB_DIR}\n")).unwrap();
        sh_ok(Command::new("ldconfig").arg("-r").arg(&rootfs));
        Self::from_dir(dir)
    }

    fn from_dir(dir: TempDir) -> Bundle {
        sh_ok(Command::new("runc").arg("spec").current_dir(dir.path()));
        let bytes = std::fs::read(dir.path().join("config.json")).unwrap();
        let mut bundle = Bundle {
            spec: serde_json::from_slice(&bytes).unwrap(),
            dir,
        };
        bundle.edit(|s| s["process"]["terminal"] = Value::Bool(false));
        bundle
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn rootfs(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.json")
    }
    /// config.json as it is on disk now (after the shim's edit, if any).
    pub fn config_bytes(&self) -> Vec<u8> {
        std::fs::read(self.config_path()).unwrap()
    }
    pub fn read_spec(&self) -> Value {
        serde_json::from_slice(&self.config_bytes()).unwrap()
    }

    /// Edits the spec and writes config.json.
    pub fn edit(&mut self, f: impl FnOnce(&mut Value)) -> &mut Self {
        f(&mut self.spec);
        let text = serde_json::to_vec_pretty(&self.spec).unwrap();
        std::fs::write(self.config_path(), text).unwrap();
        self
    }
    /// Adds `KEY=VALUE` to `process.env`.
    pub fn env(&mut self, kv: &str) -> &mut Self {
        self.edit(|s| s["process"]["env"].as_array_mut().unwrap().push(kv.into()))
    }
    pub fn args(&mut self, args: &[&str]) -> &mut Self {
        let args: Vec<Value> = args.iter().map(|a| Value::from(*a)).collect();
        self.edit(|s| s["process"]["args"] = Value::Array(args))
    }
    /// `process.args = ["sh", "-c", script]`.
    pub fn sh(&mut self, script: &str) -> &mut Self {
        self.args(&["sh", "-c", script])
    }
}

fn install_busybox(rootfs: &Path) {
    let bin = rootfs.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for d in ["etc", "dev", "proc", "sys", "tmp", "usr"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    let list = sh_ok(Command::new("/bin/busybox").arg("--list"));
    for applet in list
        .stdout
        .lines()
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        symlink("busybox", bin.join(applet)).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// The shim, driven like runc
// ---------------------------------------------------------------------------------------------

/// The low-level runtime the shim execs in these tests: `runc` unless
/// `ACCEL_E2E_LOW_LEVEL_RUNTIME` names another on PATH (the sid guest of tests/vm runs the
/// same test binary a second time with `crun`).
pub fn low_level_runtime() -> String {
    match std::env::var("ACCEL_E2E_LOW_LEVEL_RUNTIME") {
        Ok(name) if !name.is_empty() => name,
        _ => "runc".to_string(),
    }
}

/// A runc state dir, the shim's config and log, and the containers to delete on drop.
#[derive(Debug)]
pub struct Runc {
    dir: TempDir,
    ids: Mutex<Vec<String>>,
}

impl Runc {
    /// Config pointing the nvidia and enflame profiles (and ascend, installed from
    /// `config/profiles/ascend.toml` into a temp `profiles-dir`) at `sim`.
    pub fn new(sim: &SimRoot) -> Runc {
        Self::with_config(sim, "")
    }

    /// As [`Runc::new`], with `extra` (top-level TOML keys) added before the tables.
    pub fn with_config(sim: &SimRoot, extra: &str) -> Runc {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("accel-e2e-runc.")
            .tempdir()
            .expect("temp dir for runc state");
        let profiles = dir.path().join("profiles.d");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles/ascend.toml"),
            profiles.join("ascend.toml"),
        )
        .unwrap();
        let root = sim.path().display();
        let text = format!(
            "low-level-runtime = {low:?}\nlog-file = {log:?}\nlog-level = \"debug\"\nprofiles-dir = {profiles:?}\nhost-dev-dir = {dev:?}\n{extra}\n\
             [profiles.nvidia]\ndriver-root = \"{root}\"\n\
             [profiles.enflame]\ndriver-root = \"{root}\"\n\
             [profiles.ascend]\ndriver-root = \"{root}\"\n",
            low = low_level_runtime(),
            log = dir.path().join("shim.log"),
            // The /dev/char links of the simulated nodes go here, never to the host's /dev.
            dev = dir.path().join("dev"),
        );
        std::fs::write(dir.path().join("config.toml"), text).unwrap();
        Runc {
            dir,
            ids: Mutex::new(Vec::new()),
        }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
    /// A scratch dir that lives as long as this `Runc`.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
    /// The shim's own log file, "" when it was never written.
    pub fn shim_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("shim.log")).unwrap_or_default()
    }

    /// A unique container id, deleted (`delete -f`) when this `Runc` drops.
    pub fn id(&self, name: &str) -> String {
        let id = unique(&format!("e2e-{name}"));
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.clone());
        id
    }

    fn shim_cmd(&self) -> Command {
        let mut c = Command::new(&*SHIM);
        c.env("ACCEL_CONTAINER_RUNTIME_CONFIG", self.config_path())
            .arg("--root")
            .arg(self.state_dir());
        c
    }

    /// The shim with `--root <state>` and then `args`, as an engine calls runc.
    pub fn shim<S: AsRef<OsStr>>(&self, args: &[S]) -> Out {
        output(self.shim_cmd().args(args))
    }

    /// As [`Runc::shim`], with `input` on stdin (`update --resources -` reads it there).
    pub fn shim_stdin<S: AsRef<OsStr>>(&self, args: &[S], input: &[u8]) -> Out {
        use std::io::Write;
        let mut child = self
            .shim_cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start the shim");
        // Dropped after writing, so the reader sees EOF.
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input).unwrap();
        drop(stdin);
        Out::from(child.wait_with_output().unwrap())
    }

    /// The real low-level runtime (runc, or [`low_level_runtime`]) with the same `--root`
    /// (to check what exists without the shim).
    pub fn runc<S: AsRef<OsStr>>(&self, args: &[S]) -> Out {
        output(
            Command::new(low_level_runtime())
                .arg("--root")
                .arg(self.state_dir())
                .args(args),
        )
    }

    /// `run --bundle B ID` in the foreground; the container's output is the result's.
    pub fn run(&self, bundle: &Bundle, id: &str) -> Out {
        self.shim(&[
            OsStr::new("run"),
            OsStr::new("--bundle"),
            bundle.path().as_os_str(),
            OsStr::new(id),
        ])
    }

    /// `create --bundle B --pid-file P ID`, detached. The container's stdio goes to files in
    /// the scratch dir (a pipe would be held open by the container and never reach EOF).
    pub fn create(&self, bundle: &Bundle, id: &str) -> Out {
        self.create_with(self.shim_cmd(), bundle, id)
    }

    /// `cmd create --bundle B --pid-file P ID`, its stdio in files (see [`Runc::create`]).
    fn create_with(&self, mut cmd: Command, bundle: &Bundle, id: &str) -> Out {
        let base = self.dir.path().join(id);
        let file = |ext: &str| std::fs::File::create(base.with_extension(ext)).unwrap();
        let status = cmd
            .arg("create")
            .arg("--bundle")
            .arg(bundle.path())
            .arg("--pid-file")
            .arg(base.with_extension("pid"))
            .arg(id)
            .stdin(Stdio::null())
            .stdout(file("stdout"))
            .stderr(file("stderr"))
            .status()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let read = |ext: &str| std::fs::read_to_string(base.with_extension(ext)).unwrap();
        Out {
            code: status.code().unwrap_or(-1),
            stdout: read("stdout"),
            stderr: read("stderr"),
        }
    }

    pub fn start(&self, id: &str) -> Out {
        self.shim(&["start", id])
    }

    /// `exec ID sh -c script`.
    pub fn exec(&self, id: &str, script: &str) -> Out {
        self.shim(&["exec", id, "sh", "-c", script])
    }

    /// `update <args> ID`, e.g. `&["--cpuset-cpus", "0"]`.
    pub fn update(&self, id: &str, args: &[&str]) -> Out {
        let mut all: Vec<&str> = vec!["update"];
        all.extend_from_slice(args);
        all.push(id);
        self.shim(&all)
    }

    pub fn delete(&self, id: &str) -> Out {
        self.shim(&["delete", "-f", id])
    }

    /// True when runc knows a container `id` (`runc state` succeeds).
    pub fn exists(&self, id: &str) -> bool {
        self.runc(&["state", id]).code == 0
    }
}

impl Drop for Runc {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut *self.ids.lock().unwrap_or_else(|e| e.into_inner()));
        for id in ids {
            let _ = self.runc(&["delete", "-f", &id]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Looking from inside the container
// ---------------------------------------------------------------------------------------------

/// What opening a path inside the container gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Open {
    /// Opened (a regular file, or a node with a driver behind it).
    Ok,
    /// The path does not exist.
    Absent,
    /// "No such device or address": the cgroup allowed it, no driver behind the node.
    Enxio,
    /// "Operation not permitted": the device cgroup denied it.
    Eperm,
    /// "Permission denied": file mode / groups denied it.
    Eacces,
    Other(String),
}

/// A shell script printing `== <section>` headers followed by lines.
#[derive(Debug, Default, Clone)]
pub struct Probe {
    script: String,
}

impl Probe {
    pub fn new() -> Probe {
        Probe::default()
    }
    /// Section `ls <dir>`: one name per line (nothing when the dir is absent).
    pub fn ls(mut self, dir: &str) -> Self {
        self.script
            .push_str(&format!("echo '== ls {dir}'; ls -1a {dir} 2>/dev/null; "));
        self
    }
    /// Section `open <path>`: one line, `absent`, `ok` or the error text of opening it.
    pub fn open(mut self, path: &str) -> Self {
        self.script.push_str(&format!(
            "echo '== open {path}'; if [ -e {path} ] || [ -L {path} ]; then \
             r=$(dd if={path} of=/dev/null bs=1 count=0 2>&1 >/dev/null) && echo ok || echo \"$r\"; \
             else echo absent; fi; "
        ));
        self
    }
    /// Section `<name>`: the output of a command (stdout and stderr).
    pub fn cmd(mut self, name: &str, cmd: &str) -> Self {
        self.script
            .push_str(&format!("echo '== {name}'; {{ {cmd} ; }} 2>&1; "));
        self
    }
    pub fn script(&self) -> String {
        format!("{}echo '== end'", self.script)
    }
}

/// Parsed output of a [`Probe`].
#[derive(Debug, Clone)]
pub struct Report {
    pub sections: BTreeMap<String, Vec<String>>,
    pub raw: String,
}

impl Report {
    /// Panics unless the output has the probe's `== end` marker (the script ran to the end).
    #[track_caller]
    pub fn parse(stdout: &str) -> Report {
        assert!(
            stdout.contains("== end"),
            "the probe did not run to its end:\n{stdout}"
        );
        let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut cur: Option<String> = None;
        for line in stdout.lines() {
            if let Some(name) = line.strip_prefix("== ") {
                cur = Some(name.to_string());
                sections.entry(name.to_string()).or_default();
            } else if let Some(c) = &cur {
                sections.get_mut(c).unwrap().push(line.to_string());
            }
        }
        Report {
            sections,
            raw: stdout.to_string(),
        }
    }

    #[track_caller]
    pub fn section(&self, name: &str) -> &[String] {
        self.sections
            .get(name)
            .unwrap_or_else(|| panic!("no section {name:?} in:\n{}", self.raw))
    }

    /// Names in `dir` (without `.` and `..`).
    pub fn ls(&self, dir: &str) -> BTreeSet<String> {
        self.section(&format!("ls {dir}"))
            .iter()
            .filter(|n| *n != "." && *n != "..")
            .cloned()
            .collect()
    }

    pub fn open(&self, path: &str) -> Open {
        let text = self.section(&format!("open {path}")).join(" ");
        match text.as_str() {
            "ok" => Open::Ok,
            "absent" => Open::Absent,
            t if t.contains("No such device or address") => Open::Enxio,
            t if t.contains("Operation not permitted") => Open::Eperm,
            t if t.contains("Permission denied") => Open::Eacces,
            t => Open::Other(t.to_string()),
        }
    }
}

/// `/dev` entries runc itself creates (default devices, pts, shm, mqueue, links).
pub const RUNC_DEV: &[&str] = &[
    "console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr",
    "stdin", "stdout", "tty", "urandom", "zero",
];

/// The accelerator nodes in a `/dev` listing: everything runc does not create itself.
pub fn extra_dev(listing: &BTreeSet<String>) -> BTreeSet<String> {
    listing
        .iter()
        .filter(|n| !RUNC_DEV.contains(&n.as_str()))
        .cloned()
        .collect()
}

/// A set of names from string literals, for comparisons.
pub fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

impl Report {
    /// Panics unless the accelerator nodes in the container's `/dev` (see [`extra_dev`]) are
    /// exactly `want`.
    #[track_caller]
    pub fn assert_extra_dev(&self, want: &[&str]) {
        assert_eq!(extra_dev(&self.ls("/dev")), names(want), "{}", self.raw);
    }
}

/// `ls` of /dev and the driver dirs, nvidiactl and every GPU node of `sim` opened.
pub fn nvidia_probe(sim: &SimRoot) -> Probe {
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

/// What [`nvidia_probe`] saw in a container given `NVIDIA_VISIBLE_DEVICES=1` on
/// [`SimRoot::standard`]: the second GPU by bus order (nvidia1) and the control nodes, each
/// opening with ENXIO (allowed, no driver), the first GPU absent, the driver's libraries and
/// nvidia-smi.
#[track_caller]
pub fn assert_nvidia_index_1(r: &Report, sim: &SimRoot) {
    let (gpu0, gpu1) = (&sim.gpus()[0], &sim.gpus()[1]);
    r.assert_extra_dev(&["nvidia1", "nvidia-uvm", "nvidiactl"]);
    assert_eq!(r.open(&gpu1.node()), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open("/dev/nvidiactl"), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open(&gpu0.node()), Open::Absent, "{}", r.raw);
    let libs = r.ls("/usr/lib64");
    assert!(
        libs.contains("libcuda.so.1") && libs.contains("libnvidia-ml.so.1"),
        "{}",
        r.raw
    );
    assert!(r.ls("/usr/bin").contains("nvidia-smi"), "{}", r.raw);
}

/// What a probe that lists /dev and opens gcu0, gcu1, gcu3 and gcuctl saw in a container
/// given `ENFLAME_VISIBLE_DEVICES=1,3` on [`SimRoot::standard`]: gcu1, gcu3 and gcuctl, each
/// opening with ENXIO (the simulated major has no driver), and gcu0 absent. `ctx` starts each
/// failure message.
#[track_caller]
pub fn assert_enflame_1_3(r: &Report, ctx: &str) {
    assert_eq!(
        extra_dev(&r.ls("/dev")),
        names(&["gcu1", "gcu3", "gcuctl"]),
        "{ctx}{}",
        r.raw
    );
    for node in ["/dev/gcu1", "/dev/gcu3", "/dev/gcuctl"] {
        assert_eq!(r.open(node), Open::Enxio, "{ctx}{node}: {}", r.raw);
    }
    assert_eq!(r.open("/dev/gcu0"), Open::Absent, "{ctx}{}", r.raw);
}

// =============================================================================================
// Stress and soak helpers (tests/stress.rs): shared read-only rootfs, a low-level runtime
// wrapper, waiting for a detached container, and host-state counters for leak checks.
// Additive only: nothing above this line depends on it.
// =============================================================================================

/// A busybox rootfs in `dir` (created), to be shared read-only by many bundles.
pub fn busybox_rootfs(dir: &Path) -> PathBuf {
    require_root();
    install_busybox(dir);
    dir.to_path_buf()
}

impl Bundle {
    /// A bundle whose `config.json` (from `runc spec`) points `root.path` at the absolute
    /// `rootfs`, read-only, so many bundles share one image; the bundle dir itself holds only
    /// `config.json`.
    pub fn on_rootfs(rootfs: &Path) -> Bundle {
        let dir = bundle_dir();
        let mut b = Self::from_dir(dir);
        let root = rootfs.to_str().expect("UTF-8 rootfs path").to_string();
        b.edit(|s| {
            s["root"]["path"] = Value::from(root);
            s["root"]["readonly"] = Value::Bool(true);
        });
        b
    }

    /// Names in the bundle dir (to find temp files left behind).
    pub fn dir_entries(&self) -> BTreeSet<String> {
        dir_names(self.path())
    }
}

/// Names of the entries of `dir` (empty when it does not exist).
pub fn dir_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Runc {
    /// As [`Runc::new`], with `low-level-runtime` set to `runtime` (an absolute path), e.g. a
    /// wrapper that records something and then execs runc.
    pub fn with_low_level_runtime(sim: &SimRoot, runtime: &Path) -> Runc {
        let r = Runc::new(sim);
        let text = std::fs::read_to_string(r.config_path()).unwrap();
        let line = format!("low-level-runtime = {:?}\n", low_level_runtime());
        assert!(text.starts_with(&line), "config layout changed: {text}");
        let text = text.replacen(
            &line,
            &format!("low-level-runtime = {:?}\n", runtime.display().to_string()),
            1,
        );
        std::fs::write(r.config_path(), text).unwrap();
        r
    }

    /// `runc state ID`'s `status` ("created", "running", "stopped"), None when unknown.
    pub fn status(&self, id: &str) -> Option<String> {
        let out = self.runc(&["state", id]);
        if out.code != 0 {
            return None;
        }
        let v: Value = serde_json::from_str(&out.stdout).ok()?;
        v["status"].as_str().map(str::to_string)
    }

    /// Polls until the container is `stopped`; panics after `timeout`.
    #[track_caller]
    pub fn wait_stopped(&self, id: &str, timeout: std::time::Duration) {
        let t0 = std::time::Instant::now();
        loop {
            match self.status(id).as_deref() {
                Some("stopped") => return,
                None => panic!("container {id} vanished while waiting for it to stop"),
                _ if t0.elapsed() > timeout => {
                    panic!("container {id} still not stopped after {timeout:?}")
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    }

    /// What a container made by [`Runc::create`] wrote to its stdout so far.
    pub fn created_stdout(&self, id: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(id).with_extension("stdout"))
            .unwrap_or_default()
    }

    /// As [`Runc::shim`], started as `launcher SHIM --root <state> args...`: a small program
    /// that forks and runs the shim, so the shim's process does not inherit this (big, many
    /// threaded) test process's memory high-water mark through `vfork` + `exec`.
    pub fn shim_via<S: AsRef<OsStr>>(&self, launcher: &Path, args: &[S]) -> Out {
        output(self.launched(launcher).args(args))
    }

    /// As [`Runc::create`], started through `launcher` (see [`Runc::shim_via`]).
    pub fn create_via(&self, launcher: &Path, bundle: &Bundle, id: &str) -> Out {
        self.create_with(self.launched(launcher), bundle, id)
    }

    fn launched(&self, launcher: &Path) -> Command {
        let mut c = Command::new(launcher);
        c.env("ACCEL_CONTAINER_RUNTIME_CONFIG", self.config_path())
            .arg(&*SHIM)
            .arg("--root")
            .arg(self.state_dir());
        c
    }

    /// Removes the stdio and pid files [`Runc::create`] left in the scratch dir for `id`.
    pub fn forget_files(&self, id: &str) {
        for ext in ["stdout", "stderr", "pid"] {
            let _ = std::fs::remove_file(self.dir.path().join(id).with_extension(ext));
        }
    }
}

/// Lines of this process's `/proc/self/mountinfo`.
pub fn mountinfo() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("/proc/self/mountinfo")
        .lines()
        .map(str::to_string)
        .collect()
}

/// Number of open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Pids of live processes whose command line contains `needle` (this process excluded).
pub fn pids_with_cmdline(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd: Vec<u8> = cmd
            .into_iter()
            .map(|b| if b == 0 { b' ' } else { b })
            .collect();
        if String::from_utf8_lossy(&cmd).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Directories named `parent` (a cgroup path relative to the hierarchy root, e.g.
/// `accel-soak-123`) in every mounted cgroup hierarchy: v1 has one per controller under
/// `/sys/fs/cgroup/<controller>`, v2 one under `/sys/fs/cgroup`.
pub fn cgroup_parent_dirs(parent: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if !cgroup_v1() {
        return vec![root.join(parent)];
    }
    std::fs::read_dir(root)
        .expect("/sys/fs/cgroup")
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.path().join(parent))
        .collect()
}

/// Child cgroups under `parent` in every hierarchy, as paths (what runc left behind).
pub fn cgroup_children(parent: &str) -> Vec<PathBuf> {
    cgroup_parent_dirs(parent)
        .into_iter()
        .flat_map(|d| {
            std::fs::read_dir(&d)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| e.path())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Removes the (empty) `parent` cgroup dirs runc made with `mkdir -p`.
pub fn remove_cgroup_parent(parent: &str) {
    for d in cgroup_parent_dirs(parent) {
        let _ = std::fs::remove_dir(d);
    }
}
