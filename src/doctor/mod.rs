//! Node checks behind `accel-ctk doctor`: each a small function over a root directory (`/`
//! on a node, a fake tree in tests) that returns findings, each with the one command that
//! fixes it.
//!
//! Everything is read under the root: the runtime's config (its `profiles-dir` and every
//! profile's `driver-root`/`dev-root` are re-rooted), docker's `daemon.json`, containerd's
//! `config.toml`, kubelet's config, checkpoint and plugin sockets, and the binaries looked up
//! in the usual `PATH` directories. What runs is `--version` of the low-level runtime (the
//! binary found under the root, or the one named by `runc`), of containerd under the root,
//! and, where systemd is PID 1, of `systemctl` under the root: a test tree can carry stand-in scripts and an operator can
//! point at any binary.
//!
//! Topics, one module each: `config` (the runtime's files), `vendors` (drivers, device nodes,
//! their `/dev/char` links), `engines` (registration and cgroup driver, read with
//! `crate::engine`'s readers), `system` (cgroup version, systemd, runc and their device
//! bugs), `mounts` (whether `/` propagates as the DaemonSets need), `nri` (containerd's NRI for
//! the NRI plugin, and whether a container needing it fails closed), `kubelet` (CPU manager,
//! checkpoint, plugin sockets). `engines` uses `system`'s facts, `vendors` its `Exposure`,
//! `nri` the containerd file and version `engines` reads; none uses another back. A finding about a known bug is graded by what this node runs: a
//! failure only where it can bite.

mod config;
mod engines;
mod kubelet;
mod mounts;
mod nri;
mod system;
mod vendors;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config as runtime_config;
use crate::profile::Profile;

pub use config::{check_config, check_profile_files, load_config};
pub use engines::{
    check_containerd, check_containerd_cdi, check_default_runtime, check_docker,
    check_runtime_installed, Engine,
};
pub use kubelet::{check_checkpoint, check_cpu_manager, check_plugin_sockets};
pub use mounts::{check_mount_propagation, root_propagation};
pub use nri::{check_containerd_nri, NriConfig};
pub use system::{
    check_cgroups, check_low_level, check_systemd, parse_runc_version, parse_systemd_version,
    CgroupDriver, CgroupVersion, Exposure, System,
};
pub use vendors::{check_dev_char_links, check_driver, dev_char_links, LinkState, Links};

/// Directories searched for binaries, as a root shell's `PATH` on Debian and RHEL.
pub const BIN_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];
pub const RUNTIME_BIN: &str = "accel-container-runtime";
/// First runc release that keeps device rules across `systemctl daemon-reload`.
pub const RUNC_MIN: (u64, u64, u64) = (1, 1, 7);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Not a problem and nothing to do (a vendor that is simply not on this node).
    Info,
    Ok,
    /// Works, but something an operator should know; does not fail the run.
    Warn,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: String,
    pub status: Status,
    pub message: String,
    /// The command (or edit) that fixes it; `None` when there is nothing to fix.
    pub fix: Option<String>,
}

impl Finding {
    fn new(check: &str, status: Status, message: impl Into<String>, fix: Option<String>) -> Self {
        Finding {
            check: check.to_string(),
            status,
            message: message.into(),
            fix,
        }
    }
    fn ok(check: &str, message: impl Into<String>) -> Self {
        Self::new(check, Status::Ok, message, None)
    }
    fn info(check: &str, message: impl Into<String>) -> Self {
        Self::new(check, Status::Info, message, None)
    }
    fn warn(check: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(check, Status::Warn, message, Some(fix.into()))
    }
    fn fail(check: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(check, Status::Fail, message, Some(fix.into()))
    }
}

/// Where the checks look.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// `/` on a node; every host path is read under it.
    pub root: PathBuf,
    /// The runtime's config file as a host path (rooted before reading).
    pub config_path: PathBuf,
    /// Low-level runtime binary to run for `--version`, taken as is (not rooted).
    pub runc: Option<PathBuf>,
}

impl Ctx {
    /// The node itself: config from `ACCEL_CONTAINER_RUNTIME_CONFIG` or the default path.
    pub fn host(root: PathBuf) -> Ctx {
        let config_path = std::env::var_os(runtime_config::ENV_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(runtime_config::DEFAULT_PATH));
        Ctx {
            root,
            config_path,
            runc: None,
        }
    }

    pub fn path(&self, host: impl AsRef<Path>) -> PathBuf {
        Profile::under(&self.root, host.as_ref())
    }

    fn is_real_root(&self) -> bool {
        self.root == Path::new("/")
    }

    /// An executable named `name` in the usual bin dirs under the root.
    pub fn find_bin(&self, name: &str) -> Option<PathBuf> {
        BIN_DIRS
            .iter()
            .map(|d| self.path(d).join(name))
            .find(|p| is_executable(p))
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The fix for a file a check could not read: its mode, or (over the size limit, or not
/// UTF-8) what the file must be.
fn unreadable_fix(file: &Path, e: &std::io::Error, limit: u64) -> String {
    if e.kind() == std::io::ErrorKind::InvalidData {
        format!(
            "make {} a UTF-8 text file of at most {limit} bytes",
            file.display()
        )
    } else {
        format!("chmod 0644 {}", file.display())
    }
}

/// Every check, in the order an operator fixes things: config, driver, binaries, engines,
/// cgroups and runc, `/dev/char` links, mount propagation, kubelet.
pub fn run_all(ctx: &Ctx) -> Vec<Finding> {
    let (loaded, config) = load_config(ctx);
    let mut out = check_config(ctx, &loaded);
    out.extend(check_profile_files(&config.profiles_dir));
    out.extend(config.profiles.iter().map(check_driver));
    out.push(check_runtime_installed(ctx));
    let sys = system::gather(ctx);
    let docker = check_docker(ctx, &sys);
    let containerd = check_containerd(ctx);
    out.push(docker.finding.clone());
    out.push(containerd.finding.clone());
    out.extend(check_containerd_cdi(ctx));
    out.extend(check_containerd_nri(ctx));
    out.extend(nri::check_crio_nri(ctx));
    out.extend(check_default_runtime(&[&docker, &containerd]));
    // The links first: how bad an old runc or systemd is depends on whether they exist.
    let links: Vec<Links> = config
        .profiles
        .iter()
        .map(|p| dev_char_links(ctx, p))
        .collect();
    let missing = links.iter().map(Links::missing).sum();
    let mut exposure = Exposure::new(
        sys,
        [&docker, &containerd].iter().filter_map(|e| e.driver()),
    );
    out.push(check_cgroups(&exposure));
    out.push(check_low_level(ctx, &config, &mut exposure, missing));
    out.push(check_systemd(&exposure, missing));
    out.extend(
        links
            .iter()
            .filter_map(|l| check_dev_char_links(l, &exposure)),
    );
    out.push(check_mount_propagation(ctx));
    out.push(check_cpu_manager(ctx, containerd.is_default));
    out.push(check_checkpoint(ctx, &config));
    out.extend(check_plugin_sockets(ctx));
    out
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    pub struct Tree(pub tempfile::TempDir);

    impl Tree {
        pub fn new() -> Tree {
            Tree(tempfile::tempdir().unwrap())
        }
        pub fn ctx(&self) -> Ctx {
            Ctx {
                root: self.0.path().to_path_buf(),
                config_path: PathBuf::from(runtime_config::DEFAULT_PATH),
                runc: None,
            }
        }
        pub fn write(&self, host: &str, text: &str) -> PathBuf {
            let p = self.ctx().path(host);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            p
        }
        pub fn exe(&self, host: &str, script: &str) -> PathBuf {
            let p = self.write(host, script);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        }
        /// Needs root; CI runs as root and a non-root run fails here loudly.
        pub fn node(&self, host: &str, major: u64, minor: u64) {
            use nix::sys::stat::{makedev, mknod, Mode, SFlag};
            let p = self.ctx().path(host);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            mknod(
                &p,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(major, minor),
            )
            .unwrap_or_else(|e| panic!("mknod {} (tests need root): {e}", p.display()));
        }
        pub fn nvidia_gpu(&self, bus: &str, minor: u32, uuid: &str) {
            self.write(
                &format!("/proc/driver/nvidia/gpus/{bus}/information"),
                &format!("GPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"),
            );
        }
        pub fn profile(&self, name: &str) -> Profile {
            let (_, c) = load_config(&self.ctx());
            c.profile(name).unwrap().clone()
        }
    }
}
