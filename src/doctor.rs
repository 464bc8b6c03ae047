//! Node checks behind `accel-ctk doctor`: each a small function over a root directory (`/`
//! on a node, a fake tree in tests) that returns findings, each with the one command that
//! fixes it.
//!
//! Everything is read under the root: the runtime's config (its `profiles-dir` and every
//! profile's `driver-root`/`dev-root` are re-rooted), docker's `daemon.json`, containerd's
//! `config.toml`, kubelet's config, checkpoint and plugin sockets, and the binaries looked up
//! in the usual `PATH` directories. The one thing that runs is the low-level runtime's
//! `--version`: the binary found under the root (or the one named by `runc`), so a test tree
//! can carry a stand-in script and an operator can point at any binary.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::checkpoint::{self, compare, expected_ids, Checkpoint, Verdict};
use crate::config::{self, Config};
use crate::discovery::{discover, driver_version};
use crate::profile::{Discovery, Profile};
use crate::topology::locate;

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
        let config_path = std::env::var_os(config::ENV_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(config::DEFAULT_PATH));
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

/// Loads the runtime config under the root, with `profiles-dir` and every profile's roots
/// moved under it. Returns the result and a config to go on with: the loaded one, or on
/// error the built-in defaults (so the other checks still run).
pub fn load_config(ctx: &Ctx) -> (Result<Config, config::ConfigError>, Config) {
    let path = ctx.path(&ctx.config_path);
    let loaded = if ctx.is_real_root() {
        Config::load_from(&path)
    } else {
        load_rooted(ctx, &path)
    };
    let mut usable = match &loaded {
        Ok(c) => c.clone(),
        Err(_) => Config::parse("", None).expect("built-in profiles parse"),
    };
    if !ctx.is_real_root() {
        if loaded.is_err() {
            usable.profiles_dir = ctx.path(&usable.profiles_dir);
        }
        for p in &mut usable.profiles {
            p.driver_root = ctx.path(&p.driver_root);
            p.dev_root = p.dev_root.as_ref().map(|d| ctx.path(d));
        }
    }
    (loaded, usable)
}

fn load_rooted(ctx: &Ctx, path: &Path) -> Result<Config, config::ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(config::ConfigError::Read {
                path: path.into(),
                source,
            })
        }
    };
    // Parse as written first, so errors carry the file's own line numbers.
    let shown = (!text.is_empty()).then_some(path);
    let plain = Config::parse(&text, shown)?;
    let mut doc: toml_edit::DocumentMut =
        text.parse().map_err(|_| config::ConfigError::Invalid {
            path: path.into(),
            msg: "not TOML".into(),
        })?;
    let dir = ctx.path(&plain.profiles_dir);
    doc["profiles-dir"] = toml_edit::value(dir.to_string_lossy().into_owned());
    Config::parse(&doc.to_string(), shown)
}

/// The runtime's config and profile files parse.
pub fn check_config(ctx: &Ctx, loaded: &Result<Config, config::ConfigError>) -> Vec<Finding> {
    const C: &str = "config";
    let shown = ctx.config_path.display();
    let mut out = Vec::new();
    match loaded {
        Ok(c) => {
            if c.warnings.is_empty() {
                out.push(Finding::ok(
                    C,
                    match &c.path {
                        Some(_) => format!("{shown} and {} profile(s) parse", c.profiles.len()),
                        None => format!("{shown} absent: built-in defaults"),
                    },
                ));
            }
            for w in &c.warnings {
                out.push(Finding::warn(C, w.clone(), format!("edit {shown}")));
            }
        }
        Err(e) => out.push(Finding::fail(
            C,
            format!("the runtime's config does not load, so every container start fails: {e}"),
            "correct the file named above, then re-run `accel-ctk doctor`",
        )),
    }
    out
}

/// Each file in `profiles-dir` (already under the root, as `load_config` leaves it) parses
/// on its own: the config check stops at the first broken one.
pub fn check_profile_files(dir: &Path) -> Vec<Finding> {
    const C: &str = "profiles";
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let result = std::fs::read_to_string(&f)
                .map_err(|e| e.to_string())
                .and_then(|t| toml::from_str::<toml::Table>(&t).map_err(|e| e.to_string()))
                .and_then(|t| {
                    Profile::from_table(t, &f.display().to_string()).map_err(|e| e.to_string())
                });
            match result {
                Ok((p, _)) => Finding::ok(C, format!("{}: profile {} parses", f.display(), p.name)),
                Err(e) => Finding::fail(
                    C,
                    format!("{}: {e}", f.display()),
                    format!("correct or remove {}", f.display()),
                ),
            }
        })
        .collect()
}

/// The kernel module a profile's version file belongs to (`/sys/module/<m>/version`).
fn module_name(p: &Profile) -> String {
    p.version_file
        .as_deref()
        .and_then(|v| v.strip_prefix("/sys/module").ok())
        .and_then(|rest| rest.iter().next())
        .and_then(|m| m.to_str())
        .unwrap_or(&p.name)
        .to_string()
}

/// Driver loaded and device nodes present. A vendor with no trace at all (no version file,
/// no control node, no device) is not on this node: info, not a failure. A partial trace is.
pub fn check_driver(profile: &Profile) -> Finding {
    let check = format!("driver/{}", profile.name);
    let c = check.as_str();
    let devices = match discover(profile) {
        Ok(d) => d,
        Err(e) => return Finding::fail(c, e.to_string(), "reload the driver: check `dmesg`"),
    };
    let version = driver_version(profile);
    let version_file = profile
        .version_file
        .as_ref()
        .map(|v| (v, Profile::under(&profile.driver_root, v).exists()));
    let control = profile
        .control_nodes
        .iter()
        .any(|n| Profile::under(profile.dev_root(), n).exists());
    let module = module_name(profile);
    let loaded = version_file.is_none_or(|(_, exists)| exists);
    if devices.is_empty() {
        if !control && !version_file.is_some_and(|(_, e)| e) {
            return Finding::info(
                c,
                format!(
                    "not present (no driver, no devices under {})",
                    profile.driver_root.display()
                ),
            );
        }
        let detail = match version_file {
            Some((v, true)) => format!("the driver is loaded ({} exists)", v.display()),
            Some((v, false)) => format!("{} is missing but control nodes exist", v.display()),
            None => "control nodes exist".into(),
        };
        let fix = match &profile.discovery {
            Discovery::NvidiaProcfs { .. } if loaded => {
                "dmesg | grep -i nvrm   (the driver bound no GPU: see why)".to_string()
            }
            _ if loaded => "udevadm trigger --action=add && udevadm settle".to_string(),
            _ => format!("modprobe {module}"),
        };
        return Finding::fail(c, format!("{detail} but no device was found"), fix);
    }
    let located: Vec<_> = devices.into_iter().map(|d| locate(profile, d)).collect();
    let missing: Vec<_> = located
        .iter()
        .flat_map(|d| d.nodes.iter().take(1).map(move |n| (d, n)))
        .filter(|(_, n)| n.major.is_none())
        .collect();
    if let Some((d, n)) = missing.first() {
        let names: Vec<String> = missing
            .iter()
            .map(|(_, n)| n.path.display().to_string())
            .collect();
        let fix = match (&profile.discovery, d.device.minor) {
            (Discovery::NvidiaProcfs { .. }, Some(minor)) => {
                format!("nvidia-modprobe -u -c {minor}")
            }
            _ => format!(
                "udevadm trigger --action=add && udevadm settle   (creates {})",
                n.path.display()
            ),
        };
        return Finding::fail(
            c,
            format!(
                "{} device(s) known to the driver but node(s) missing: {}",
                located.len(),
                names.join(", ")
            ),
            fix,
        );
    }
    if let Some((v, false)) = version_file {
        return Finding::fail(
            c,
            format!(
                "{} device node(s) exist but {} is missing: the kernel module is not loaded (stale nodes?)",
                located.len(),
                v.display()
            ),
            format!("modprobe {module}"),
        );
    }
    Finding::ok(
        c,
        format!(
            "{} device(s), driver {}",
            located.len(),
            version.as_deref().unwrap_or("version unknown")
        ),
    )
}

/// The runtime binary is installed.
pub fn check_runtime_installed(ctx: &Ctx) -> Finding {
    const C: &str = "runtime-binary";
    match ctx.find_bin(RUNTIME_BIN) {
        Some(p) => Finding::ok(C, format!("{} installed", p.display())),
        None => Finding::fail(
            C,
            format!("{RUNTIME_BIN} is not installed in {}", BIN_DIRS.join(", ")),
            format!("install -m 0755 target/release/{RUNTIME_BIN} /usr/bin/   (or packaging/install.sh)"),
        ),
    }
}

fn is_ours(binary: &str) -> bool {
    Path::new(binary)
        .file_name()
        .is_some_and(|f| f == RUNTIME_BIN)
}

/// Whether a registered runtime path exists (absolute under root, or a name in the bin dirs).
fn registered_path_missing(ctx: &Ctx, binary: &str) -> bool {
    if Path::new(binary).is_absolute() {
        !is_executable(&ctx.path(binary))
    } else {
        ctx.find_bin(binary).is_none()
    }
}

/// docker's `daemon.json` registers the runtime, its path exists, and it is the default.
pub fn check_docker(ctx: &Ctx) -> Finding {
    const C: &str = "docker";
    let file = ctx.path("/etc/docker/daemon.json");
    let configure =
        "accel-ctk runtime configure --runtime docker --set-as-default && systemctl restart docker";
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return match ctx.find_bin("dockerd") {
                None => Finding::info(C, "docker is not installed"),
                Some(_) => Finding::fail(
                    C,
                    format!(
                        "docker is installed but {} does not exist, so no runtime is registered",
                        file.display()
                    ),
                    configure,
                ),
            }
        }
        Err(e) => {
            return Finding::fail(
                C,
                format!("cannot read {}: {e}", file.display()),
                format!("chmod 0644 {}", file.display()),
            )
        }
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return Finding::fail(
                C,
                format!(
                    "{} is not valid JSON (dockerd will not start): {e}",
                    file.display()
                ),
                format!(
                    "correct {} (check with `python3 -m json.tool {}`)",
                    file.display(),
                    file.display()
                ),
            )
        }
    };
    let ours = v["runtimes"].as_object().and_then(|rts| {
        rts.iter().find_map(|(name, rt)| {
            let path = rt["path"].as_str()?;
            is_ours(path).then(|| (name.clone(), path.to_string()))
        })
    });
    let Some((name, path)) = ours else {
        return Finding::fail(
            C,
            format!(
                "{} registers no runtime whose path is {RUNTIME_BIN}",
                file.display()
            ),
            configure,
        );
    };
    if registered_path_missing(ctx, &path) {
        return Finding::fail(
            C,
            format!("runtime {name:?} in {} points at {path}, which does not exist", file.display()),
            format!("accel-ctk runtime configure --runtime docker --runtime-name {name} --runtime-path \"$(command -v {RUNTIME_BIN})\" && systemctl restart docker"),
        );
    }
    let default = v["default-runtime"].as_str().unwrap_or("runc");
    if default != name {
        return Finding::warn(
            C,
            format!("runtime {name:?} is registered but the default is {default:?}: only `docker run --runtime {name}` gets devices"),
            format!("accel-ctk runtime configure --runtime docker --runtime-name {name} --set-as-default && systemctl restart docker"),
        );
    }
    Finding::ok(
        C,
        format!("runtime {name:?} ({path}) registered and default"),
    )
}

fn table_at<'a>(t: &'a toml::Table, keys: &[&str]) -> Option<&'a toml::Table> {
    let mut cur = t;
    for k in keys {
        cur = cur.get(*k)?.as_table()?;
    }
    Some(cur)
}

/// containerd's `config.toml` registers the runtime for CRI and makes it the default. Reads
/// schema version 3 (`plugins."io.containerd.cri.v1.runtime"`), 2
/// (`plugins."io.containerd.grpc.v1.cri"`) and 1 (also `plugins.cri`). Returns whether the
/// runtime is CRI's default (then every pod's containers go through it).
pub fn check_containerd(ctx: &Ctx) -> (Finding, bool) {
    const C: &str = "containerd";
    let file = ctx.path("/etc/containerd/config.toml");
    let configure = "accel-ctk runtime configure --runtime containerd --set-as-default && systemctl restart containerd";
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return match ctx.find_bin("containerd") {
                None => (Finding::info(C, "containerd is not installed"), false),
                Some(_) => (Finding::fail(C, format!("containerd is installed but {} does not exist (built-in defaults register no runtime)", file.display()), configure), false),
            }
        }
        Err(e) => return (Finding::fail(C, format!("cannot read {}: {e}", file.display()), format!("chmod 0644 {}", file.display())), false),
    };
    let doc: toml::Table = match toml::from_str(&text) {
        Ok(d) => d,
        Err(e) => {
            return (
                Finding::fail(
                    C,
                    format!(
                        "{} does not parse (containerd will not start): {e}",
                        file.display()
                    ),
                    format!("correct {}", file.display()),
                ),
                false,
            )
        }
    };
    let version = doc
        .get("version")
        .and_then(toml::Value::as_integer)
        .unwrap_or(1);
    let sections: &[&str] = match version {
        3 => &["io.containerd.cri.v1.runtime"],
        2 => &["io.containerd.grpc.v1.cri"],
        _ => &["io.containerd.grpc.v1.cri", "cri"],
    };
    let mut found = None;
    for s in sections {
        let Some(ctr) = table_at(&doc, &["plugins", s, "containerd"]) else {
            continue;
        };
        let default = ctr
            .get("default_runtime_name")
            .and_then(|v| v.as_str())
            .unwrap_or("runc");
        if let Some(rts) = ctr.get("runtimes").and_then(|v| v.as_table()) {
            for (name, rt) in rts {
                let bin = rt
                    .get("options")
                    .and_then(|o| o.get("BinaryName"))
                    .and_then(|b| b.as_str());
                if let Some(bin) = bin.filter(|b| is_ours(b)) {
                    found = Some((*s, name.clone(), bin.to_string(), default.to_string()));
                }
            }
        }
    }
    let Some((section, name, bin, default)) = found else {
        let hint = if version >= 3 {
            "plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes"
        } else {
            "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes"
        };
        return (
            Finding::fail(C, format!("{} (version {version}) has no runtime under {hint} with options.BinaryName = .../{RUNTIME_BIN}", file.display()), configure),
            false,
        );
    };
    if registered_path_missing(ctx, &bin) {
        return (
            Finding::fail(
                C,
                format!("runtime {name:?} in {} points at {bin}, which does not exist", file.display()),
                format!("accel-ctk runtime configure --runtime containerd --runtime-name {name} --runtime-path \"$(command -v {RUNTIME_BIN})\" && systemctl restart containerd"),
            ),
            false,
        );
    }
    if default != name {
        return (
            Finding::warn(
                C,
                format!("runtime {name:?} is registered in plugins.{section:?} but CRI's default is {default:?}: only pods with runtimeClassName {name} get devices"),
                format!("accel-ctk runtime configure --runtime containerd --runtime-name {name} --set-as-default && systemctl restart containerd"),
            ),
            false,
        );
    }
    (
        Finding::ok(
            C,
            format!("runtime {name:?} ({bin}) registered in plugins.{section:?} and default"),
        ),
        true,
    )
}

/// `(major, minor, patch)` from `runc --version` output (`runc version 1.1.5+ds1`).
pub fn parse_runc_version(output: &str) -> Option<(u64, u64, u64)> {
    let v = output
        .lines()
        .find_map(|l| l.strip_prefix("runc version "))?
        .trim();
    let mut nums = v.split(['.', '-', '+', '~']).map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().ok()
    });
    Some((
        nums.next()??,
        nums.next()??,
        nums.next().flatten().unwrap_or(0),
    ))
}

/// The low-level runtime exists and, when it is runc, is at least 1.1.7.
pub fn check_low_level(ctx: &Ctx, config: &Config) -> Finding {
    const C: &str = "low-level-runtime";
    let name = &config.low_level_runtime;
    let bin = match &ctx.runc {
        Some(p) => Some(p.clone()).filter(|p| is_executable(p)),
        None if Path::new(name).is_absolute() => Some(ctx.path(name)).filter(|p| is_executable(p)),
        None => ctx.find_bin(name),
    };
    let Some(bin) = bin else {
        return Finding::fail(
            C,
            format!("low-level runtime {name:?} (config key low-level-runtime) not found: every container start fails"),
            "apt-get install runc   (or dnf install runc)",
        );
    };
    // A binary written a moment ago can still be open for writing in a forked child
    // (ETXTBSY); that clears within milliseconds.
    let mut tries = 0;
    let out = loop {
        match Command::new(&bin).arg("--version").output() {
            Err(e) if e.kind() == ErrorKind::ExecutableFileBusy && tries < 5 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other,
        }
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return Finding::warn(
                C,
                format!("{} found but cannot run `--version`: {e}", bin.display()),
                format!("run `{} --version` on the node", bin.display()),
            )
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(v) = parse_runc_version(&text) else {
        let first = text.lines().next().unwrap_or("").to_string();
        return Finding::ok(
            C,
            format!("{} ({first}); not runc, version not checked", bin.display()),
        );
    };
    if v < RUNC_MIN {
        return Finding::fail(
            C,
            format!(
                "{} is runc {}.{}.{}, older than 1.1.7: with the systemd cgroup driver, runc 1.1.3 to 1.1.6 leave out systemd DeviceAllow rules for devices without a /dev/char/<major>:<minor> link (NVIDIA's), so `systemctl daemon-reload` re-applies systemd's rules and running containers lose their GPUs (\"Failed to initialize NVML: Unknown Error\"; opencontainers/runc#3671, fixed in 1.1.7 with systemd >= 240)",
                bin.display(), v.0, v.1, v.2
            ),
            "install runc >= 1.1.7 (distro backports, or the static binary from github.com/opencontainers/runc/releases as /usr/sbin/runc); until then creating the /dev/char links avoids it",
        );
    }
    Finding::ok(
        C,
        format!("{} is runc {}.{}.{}", bin.display(), v.0, v.1, v.2),
    )
}

/// kubelet's CPU manager `static` policy rewrites containers' cgroups; devices that were
/// never in the OCI spec (a device plugin that sets only a variable, no device specs) are
/// lost then. Containers started through this runtime have them in the spec. Whether the
/// plugins pass device specs is read from the allocations in kubelet's checkpoint when there
/// are any; otherwise it can only be a warning.
pub fn check_cpu_manager(ctx: &Ctx, runtime_is_default: bool) -> Finding {
    const C: &str = "kubelet-cpu-manager";
    let file = ctx.path("/var/lib/kubelet/config.yaml");
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Finding::info(C, "no kubelet config: not a Kubernetes node")
        }
        Err(e) => {
            return Finding::fail(
                C,
                format!("cannot read {}: {e}", file.display()),
                format!("chmod 0644 {}", file.display()),
            )
        }
    };
    let v: serde_yaml_ng::Value = match serde_yaml_ng::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return Finding::fail(
                C,
                format!("{} is not valid YAML: {e}", file.display()),
                format!("correct {}", file.display()),
            )
        }
    };
    let policy = v
        .get("cpuManagerPolicy")
        .and_then(|p| p.as_str())
        .unwrap_or("none");
    if policy != "static" {
        return Finding::ok(C, format!("cpuManagerPolicy {policy:?}"));
    }
    if runtime_is_default {
        return Finding::ok(C, format!("cpuManagerPolicy \"static\"; {RUNTIME_BIN} is containerd's default, so every container has its devices in its spec and keeps them when the CPU manager updates its cgroup"));
    }
    let entries: Vec<_> = Checkpoint::load(&ctx.path(checkpoint::DEFAULT_PATH))
        .map(|cp| cp.data.pod_device_entries.unwrap_or_default())
        .unwrap_or_default();
    let resources = |want: bool| -> std::collections::BTreeSet<String> {
        entries
            .iter()
            .filter(|e| e.passes_device_specs() == Some(want))
            .map(|e| e.resource_name.clone())
            .collect()
    };
    let (without, with) = (resources(false), resources(true));
    let fix = "run the device plugin with device specs (NVIDIA: PASS_DEVICE_SPECS=true / --pass-device-specs), or make the runtime the default: accel-ctk runtime configure --runtime containerd --set-as-default";
    if !without.is_empty() {
        let list: Vec<_> = without.into_iter().collect();
        return Finding::warn(
            C,
            format!("cpuManagerPolicy \"static\" and the device plugin(s) for {} pass no device specs (their allocations in kubelet's checkpoint carry none): containers started through {RUNTIME_BIN} are safe (it puts the devices in the OCI spec), containers started by another runtime lose device access at the CPU manager's next cgroup update", list.join(", ")),
            fix,
        );
    }
    if !with.is_empty() {
        return Finding::ok(C, "cpuManagerPolicy \"static\"; the device plugins pass device specs (kubelet's checkpoint), so containers keep their devices on cgroup updates");
    }
    Finding::warn(
        C,
        format!("cpuManagerPolicy \"static\": containers started through {RUNTIME_BIN} are safe (their devices are in the OCI spec, so cgroup updates keep them); containers started by another runtime from a device plugin that does not pass device specs lose device access at the CPU manager's next update (no allocation in kubelet's checkpoint to tell which kind this node's plugins are)"),
        fix,
    )
}

/// kubelet's device checkpoint names only devices this node has.
pub fn check_checkpoint(ctx: &Ctx, config: &Config) -> Finding {
    const C: &str = "kubelet-checkpoint";
    let file = ctx.path(checkpoint::DEFAULT_PATH);
    if !file.exists() {
        return Finding::ok(C, "no device checkpoint");
    }
    let fix = if ctx.is_real_root() {
        "accel-ctk checkpoint check --fix --restart-kubelet".to_string()
    } else {
        format!(
            "accel-ctk checkpoint check --fix --restart-kubelet --checkpoint {}",
            file.display()
        )
    };
    let cp = match Checkpoint::load(&file) {
        Ok(c) => c,
        Err(e) => {
            return Finding::fail(
                C,
                e.to_string(),
                format!(
                    "mv {} {}.bak && systemctl restart kubelet",
                    file.display(),
                    file.display()
                ),
            )
        }
    };
    let expected = match expected_ids(&config.profiles, &[]) {
        Ok(e) => e,
        Err(e) => {
            return Finding::warn(
                C,
                format!("cannot list this node's devices: {e}"),
                "accel-ctk list",
            )
        }
    };
    let found = expected.into_iter().map(|(r, (_, ids))| (r, ids)).collect();
    let reports = compare(&cp, &found);
    let stale: Vec<String> = reports
        .iter()
        .filter(|r| r.verdict == Verdict::Stale)
        .map(|r| {
            format!(
                "{} ({})",
                r.resource,
                r.unknown_registered
                    .iter()
                    .chain(&r.unknown_allocated)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    if !stale.is_empty() {
        return Finding::fail(
            C,
            format!(
                "{} names devices this node does not have: {}; pods using them fail to start",
                file.display(),
                stale.join("; ")
            ),
            fix,
        );
    }
    if let Some(r) = reports
        .iter()
        .find(|r| r.verdict == Verdict::NoDevicesFound)
    {
        return Finding::warn(
            C,
            format!(
                "{} names {} devices but none were found on this node",
                file.display(),
                r.resource
            ),
            "load the driver, then: accel-ctk checkpoint check",
        );
    }
    Finding::ok(C, format!("{} matches this node's devices", file.display()))
}

/// Sockets in kubelet's device-plugin dir that nobody listens on: a plugin restarting on the
/// same name fails with `bind: address already in use`.
pub fn check_plugin_sockets(ctx: &Ctx) -> Vec<Finding> {
    const C: &str = "device-plugin-sockets";
    let dir = ctx.path("/var/lib/kubelet/device-plugins");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut socks: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .collect();
    socks.sort();
    let mut out = Vec::new();
    let mut live = 0;
    for s in socks {
        match std::os::unix::net::UnixStream::connect(&s) {
            Ok(_) => live += 1,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => out.push(Finding::fail(
                C,
                format!("{} is left over with nothing listening: a plugin starting on it fails with `bind: address already in use`", s.display()),
                format!("rm {}", s.display()),
            )),
            Err(e) => out.push(Finding::warn(C, format!("{}: cannot connect: {e}", s.display()), format!("ls -l {}", s.display()))),
        }
    }
    if out.is_empty() && live > 0 {
        out.push(Finding::ok(C, format!("{live} socket(s), all listening")));
    }
    out
}

/// Every check, in the order an operator fixes things: config, driver, binaries, engines,
/// kubelet.
pub fn run_all(ctx: &Ctx) -> Vec<Finding> {
    let (loaded, config) = load_config(ctx);
    let mut out = check_config(ctx, &loaded);
    out.extend(check_profile_files(&config.profiles_dir));
    out.extend(config.profiles.iter().map(check_driver));
    out.push(check_runtime_installed(ctx));
    out.push(check_low_level(ctx, &config));
    out.push(check_docker(ctx));
    let (f, default) = check_containerd(ctx);
    out.push(f);
    out.push(check_cpu_manager(ctx, default));
    out.push(check_checkpoint(ctx, &config));
    out.extend(check_plugin_sockets(ctx));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tree(tempfile::TempDir);

    impl Tree {
        fn new() -> Tree {
            Tree(tempfile::tempdir().unwrap())
        }
        fn ctx(&self) -> Ctx {
            Ctx {
                root: self.0.path().to_path_buf(),
                config_path: PathBuf::from(config::DEFAULT_PATH),
                runc: None,
            }
        }
        fn write(&self, host: &str, text: &str) -> PathBuf {
            let p = self.ctx().path(host);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            p
        }
        fn exe(&self, host: &str, script: &str) -> PathBuf {
            let p = self.write(host, script);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        }
        /// Needs root; CI runs as root and a non-root run fails here loudly.
        fn node(&self, host: &str, major: u64, minor: u64) {
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
        fn nvidia_gpu(&self, bus: &str, minor: u32, uuid: &str) {
            self.write(
                &format!("/proc/driver/nvidia/gpus/{bus}/information"),
                &format!("GPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"),
            );
        }
        fn profile(&self, name: &str) -> Profile {
            let (_, c) = load_config(&self.ctx());
            c.profile(name).unwrap().clone()
        }
    }

    #[test]
    fn config_absent_broken_and_unknown_key() {
        let t = Tree::new();
        let (loaded, _) = load_config(&t.ctx());
        let f = check_config(&t.ctx(), &loaded);
        assert_eq!(f[0].status, Status::Ok, "{f:?}");
        assert!(f[0].message.contains("built-in defaults"));

        t.write(config::DEFAULT_PATH, "log-level = \"loud\"\n");
        let (loaded, usable) = load_config(&t.ctx());
        let f = check_config(&t.ctx(), &loaded);
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0].message.contains("log-level"), "{f:?}");
        assert!(usable
            .profile("nvidia")
            .unwrap()
            .driver_root
            .starts_with(t.0.path()));

        t.write(config::DEFAULT_PATH, "low-level-runtim = \"crun\"\n");
        let (loaded, _) = load_config(&t.ctx());
        let f = check_config(&t.ctx(), &loaded);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Warn);
        assert!(f[0].message.contains("low-level-runtim"));
    }

    #[test]
    fn profiles_are_rooted_and_each_file_checked() {
        let t = Tree::new();
        t.write(
            config::DEFAULT_PATH,
            "[profiles.nvidia]\ndriver-root = \"/run/nvidia/driver\"\n",
        );
        let dir = "/etc/accel-container-runtime/profiles.d";
        t.write(
            &format!("{dir}/ascend.toml"),
            include_str!("../config/profiles/ascend.toml"),
        );
        t.write(
            &format!("{dir}/broken.toml"),
            "name = \"x\"\nvisible-devices-env = [\"X\"]\n",
        );
        let (loaded, usable) = load_config(&t.ctx());
        // The broken file also breaks the config as a whole.
        assert!(loaded.is_err());
        let f = check_profile_files(&usable.profiles_dir);
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].status, Status::Ok);
        assert_eq!(f[1].status, Status::Fail);
        assert!(f[1].message.contains("broken.toml"), "{f:?}");

        std::fs::remove_file(t.ctx().path(format!("{dir}/broken.toml"))).unwrap();
        let (loaded, usable) = load_config(&t.ctx());
        loaded.unwrap();
        assert_eq!(
            usable.profile("nvidia").unwrap().driver_root,
            t.0.path().join("run/nvidia/driver")
        );
        assert!(usable
            .profile("ascend")
            .unwrap()
            .driver_root
            .starts_with(t.0.path()));
    }

    #[test]
    fn driver_states() {
        let t = Tree::new();
        let f = check_driver(&t.profile("nvidia"));
        assert_eq!(f.status, Status::Info, "{f:?}");
        let mut bare = t.profile("enflame");
        bare.version_file = None;
        assert_eq!(check_driver(&bare).status, Status::Info);
        // A control node alone is a partial trace.
        t.node("/dev/gcuctl", 240, 255);
        assert_eq!(check_driver(&bare).status, Status::Fail);
        std::fs::remove_file(t.ctx().path("/dev/gcuctl")).unwrap();

        // Module loaded, no GPU bound.
        t.write(
            "/proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Kernel Module  550.54.14\n",
        );
        assert_eq!(check_driver(&t.profile("nvidia")).status, Status::Fail);

        // GPU known to the driver, node missing.
        t.nvidia_gpu("0000:3b:00.0", 3, "GPU-a");
        let f = check_driver(&t.profile("nvidia"));
        assert_eq!(f.status, Status::Fail);
        assert!(f.message.contains("/dev/nvidia3"), "{f:?}");
        assert_eq!(f.fix.as_deref(), Some("nvidia-modprobe -u -c 3"));

        t.node("/dev/nvidia3", 195, 3);
        let f = check_driver(&t.profile("nvidia"));
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.message.contains("550.54.14"));

        // Enflame: a node but no module.
        t.node("/dev/gcu0", 240, 0);
        let f = check_driver(&t.profile("enflame"));
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert_eq!(f.fix.as_deref(), Some("modprobe enflame"));
        t.write("/sys/module/enflame/version", "1.0.0\n");
        assert_eq!(check_driver(&t.profile("enflame")).status, Status::Ok);
    }

    #[test]
    fn runtime_binary() {
        let t = Tree::new();
        assert_eq!(check_runtime_installed(&t.ctx()).status, Status::Fail);
        t.write("/usr/bin/accel-container-runtime", "");
        assert_eq!(
            check_runtime_installed(&t.ctx()).status,
            Status::Fail,
            "not executable"
        );
        t.exe("/usr/bin/accel-container-runtime", "");
        assert_eq!(check_runtime_installed(&t.ctx()).status, Status::Ok);
    }

    #[test]
    fn docker_registration() {
        let t = Tree::new();
        assert_eq!(check_docker(&t.ctx()).status, Status::Info);
        t.exe("/usr/bin/dockerd", "");
        assert_eq!(check_docker(&t.ctx()).status, Status::Fail);
        t.write("/etc/docker/daemon.json", "{\"runtimes\": {");
        let f = check_docker(&t.ctx());
        assert!(
            f.status == Status::Fail && f.message.contains("not valid JSON"),
            "{f:?}"
        );
        t.write(
            "/etc/docker/daemon.json",
            r#"{"runtimes":{"nvidia":{"path":"nvidia-container-runtime"}}}"#,
        );
        let f = check_docker(&t.ctx());
        assert!(
            f.status == Status::Fail && f.message.contains("registers no runtime"),
            "{f:?}"
        );
        t.write(
            "/etc/docker/daemon.json",
            r#"{"runtimes":{"accel":{"path":"/usr/local/bin/accel-container-runtime"}}}"#,
        );
        let f = check_docker(&t.ctx());
        assert!(
            f.status == Status::Fail && f.message.contains("does not exist"),
            "{f:?}"
        );
        t.exe("/usr/local/bin/accel-container-runtime", "");
        let f = check_docker(&t.ctx());
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(f.fix.unwrap().contains("--set-as-default"));
        t.write(
            "/etc/docker/daemon.json",
            r#"{"default-runtime":"accel","runtimes":{"accel":{"path":"/usr/local/bin/accel-container-runtime"}}}"#,
        );
        assert_eq!(check_docker(&t.ctx()).status, Status::Ok);
    }

    #[test]
    fn containerd_both_schemas() {
        let t = Tree::new();
        assert_eq!(check_containerd(&t.ctx()).0.status, Status::Info);
        t.exe("/usr/bin/accel-container-runtime", "");
        let v2 = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "accel"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.accel]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.accel.options]
      BinaryName = "/usr/bin/accel-container-runtime"
      SystemdCgroup = true
"#;
        t.write("/etc/containerd/config.toml", v2);
        let (f, default) = check_containerd(&t.ctx());
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(default);

        // The same tables in a version 3 file are not where containerd 2 looks.
        t.write(
            "/etc/containerd/config.toml",
            &v2.replace("version = 2", "version = 3"),
        );
        let (f, default) = check_containerd(&t.ctx());
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.message.contains("io.containerd.cri.v1.runtime") && !default);

        let v3 = v2
            .replace("version = 2", "version = 3")
            .replace("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
            .replace(
                "default_runtime_name = \"accel\"",
                "default_runtime_name = \"runc\"",
            );
        t.write("/etc/containerd/config.toml", &v3);
        let (f, default) = check_containerd(&t.ctx());
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(!default);

        t.write(
            "/etc/containerd/config.toml",
            &v3.replace("/usr/bin/", "/opt/gone/"),
        );
        let (f, _) = check_containerd(&t.ctx());
        assert!(
            f.status == Status::Fail && f.message.contains("/opt/gone"),
            "{f:?}"
        );

        t.write("/etc/containerd/config.toml", "version = 2\n[plugins\n");
        assert_eq!(check_containerd(&t.ctx()).0.status, Status::Fail);
    }

    #[test]
    fn runc_versions() {
        assert_eq!(
            parse_runc_version("runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1\nspec: 1.0.2-dev\n"),
            Some((1, 1, 5))
        );
        assert_eq!(
            parse_runc_version("runc version 1.2.0-rc.1\n"),
            Some((1, 2, 0))
        );
        assert_eq!(
            parse_runc_version("runc version 1.1.12\n"),
            Some((1, 1, 12))
        );
        assert_eq!(parse_runc_version("crun version 1.8.1\n"), None);

        let t = Tree::new();
        let config = Config::parse("", None).unwrap();
        let f = check_low_level(&t.ctx(), &config);
        assert!(
            f.status == Status::Fail && f.message.contains("not found"),
            "{f:?}"
        );
        t.exe(
            "/usr/sbin/runc",
            "#!/bin/sh\necho 'runc version 1.1.5+ds1'\necho 'commit: x'\n",
        );
        let f = check_low_level(&t.ctx(), &config);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.message.contains("1.1.5") && f.message.contains("daemon-reload"));
        t.exe("/usr/sbin/runc", "#!/bin/sh\necho 'runc version 1.1.12'\n");
        assert_eq!(check_low_level(&t.ctx(), &config).status, Status::Ok);

        // An explicit binary is run as given.
        let other = t.exe("/elsewhere/runc", "#!/bin/sh\necho 'runc version 1.0.0'\n");
        let mut ctx = t.ctx();
        ctx.runc = Some(other);
        assert_eq!(check_low_level(&ctx, &config).status, Status::Fail);
    }

    #[test]
    fn cpu_manager_policy() {
        let t = Tree::new();
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Info);
        let cfg = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n";
        t.write("/var/lib/kubelet/config.yaml", cfg);
        let f = check_cpu_manager(&t.ctx(), false);
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.message.contains("safe") && f.message.contains("device specs"),
            "{f:?}"
        );
        assert_eq!(check_cpu_manager(&t.ctx(), true).status, Status::Ok);
        // Allocations in the checkpoint tell which kind of plugin this is.
        let cp = |resp: &str| {
            format!(
                r#"{{"Data":{{"PodDeviceEntries":[{{"PodUID":"p","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":["GPU-a"],"AllocResp":"{resp}"}}]}},"Checksum":1}}"#
            )
        };
        t.write(checkpoint::DEFAULT_PATH, &cp("CgA="));
        let f = check_cpu_manager(&t.ctx(), false);
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.message.contains("nvidia.com/gpu pass no device specs"),
            "{f:?}"
        );
        t.write(checkpoint::DEFAULT_PATH, &cp("GgsKAS8SAS8aA3J3bQ=="));
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Ok);
        std::fs::remove_file(t.ctx().path(checkpoint::DEFAULT_PATH)).unwrap();
        t.write(
            "/var/lib/kubelet/config.yaml",
            &cfg.replace("static", "none"),
        );
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Ok);
        t.write(
            "/var/lib/kubelet/config.yaml",
            "cpuManagerPolicy: [static\n",
        );
        assert_eq!(check_cpu_manager(&t.ctx(), false).status, Status::Fail);
    }

    #[test]
    fn stale_checkpoint() {
        let t = Tree::new();
        let (_, config) = load_config(&t.ctx());
        assert_eq!(check_checkpoint(&t.ctx(), &config).status, Status::Ok);
        t.nvidia_gpu("0000:3b:00.0", 0, "GPU-new");
        t.node("/dev/nvidia0", 195, 0);
        let cp = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-old"]}},"Checksum":1}"#;
        t.write(checkpoint::DEFAULT_PATH, cp);
        let f = check_checkpoint(&t.ctx(), &config);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.message.contains("GPU-old"));
        assert!(f
            .fix
            .unwrap()
            .starts_with("accel-ctk checkpoint check --fix"));
        t.write(checkpoint::DEFAULT_PATH, &cp.replace("GPU-old", "GPU-new"));
        assert_eq!(check_checkpoint(&t.ctx(), &config).status, Status::Ok);
        t.write(checkpoint::DEFAULT_PATH, "{");
        assert_eq!(check_checkpoint(&t.ctx(), &config).status, Status::Fail);
    }

    #[test]
    fn leftover_socket() {
        let t = Tree::new();
        let dir = t.ctx().path("/var/lib/kubelet/device-plugins");
        std::fs::create_dir_all(&dir).unwrap();
        let live = std::os::unix::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
        let f = check_plugin_sockets(&t.ctx());
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Ok);
        drop(std::os::unix::net::UnixListener::bind(dir.join("nvidia-gpu.sock")).unwrap());
        let f = check_plugin_sockets(&t.ctx());
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0].message.contains("nvidia-gpu.sock"));
        assert_eq!(
            f[0].fix.as_deref(),
            Some(format!("rm {}", dir.join("nvidia-gpu.sock").display()).as_str())
        );
        drop(live);
    }
}
