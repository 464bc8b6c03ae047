//! What the node runs underneath the engines: the cgroup version, whether systemd is PID 1
//! (and which systemd), the cgroup driver each engine uses, and the low-level runtime (runc)
//! with its known device bugs, each graded by whether this node can hit it.
//!
//! The bug class: with the systemd cgroup driver, runc hands device rules to systemd as
//! `DeviceAllow=/dev/char/MAJOR:MINOR`; systemd drops a path that does not exist and re-applies
//! its own list on every `systemctl daemon-reload`, so a running container loses a device
//! whose node has no `/dev/char` link (NVIDIA's, made by nvidia-modprobe, and any node udev
//! did not create). runc 1.1.3 made runc skip such rules itself; 1.1.7 fixed it for systemd
//! 240 and later (opencontainers/runc#3671). With cgroupfs, or without systemd as PID 1, none
//! of this applies.
//!
//! Ref: <https://github.com/opencontainers/runc/issues/3671>,
//! <https://github.com/opencontainers/runc/releases/tag/v1.1.7>

use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;

use super::{is_executable, Ctx, Finding, RUNC_MIN};
use crate::config::Config;

/// First runc release with the daemon-reload device regression (`DeviceAllow` rules skipped
/// for devices without a `/dev/char` link).
pub const RUNC_BUG_FROM: (u64, u64, u64) = (1, 1, 3);
/// First systemd that accepts runc 1.1.7's rules for devices without `/dev/char` links.
pub const SYSTEMD_MIN: u64 = 240;
/// The command that creates the missing `/dev/char` links.
pub const CREATE_LINKS: &str = "accel-ctk system create-dev-char-symlinks";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1 only (the devices controller enforces device rules).
    V1,
    /// v1 controllers with the v2 hierarchy mounted beside them (`/sys/fs/cgroup/unified`):
    /// devices are still the v1 controller's.
    Hybrid,
    /// The unified hierarchy: device rules are eBPF programs.
    V2,
    Unknown,
}

impl CgroupVersion {
    pub fn describe(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "cgroup v1",
            CgroupVersion::Hybrid => "cgroup v1 (hybrid: v2 mounted at /sys/fs/cgroup/unified)",
            CgroupVersion::V2 => "cgroup v2",
            CgroupVersion::Unknown => "cgroup version unknown (nothing under /sys/fs/cgroup)",
        }
    }
}

/// How an engine's runc sets up cgroups: `cgroupfs` writes the cgroup files itself,
/// `systemd` asks systemd for a transient unit (and so is exposed to systemd re-applying its
/// own device list on `systemctl daemon-reload`). Which one an engine uses is read by
/// `engines`, above this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    pub fn name(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

/// Facts about the node below the engines, read under the root.
#[derive(Debug, Clone)]
pub struct System {
    pub cgroup: CgroupVersion,
    /// systemd is PID 1 (`/run/systemd/system` exists, as `sd_booted()` asks).
    pub systemd_init: bool,
    /// `systemctl --version`'s number, asked only when systemd is PID 1.
    pub systemd_version: Option<u64>,
}

/// Reads the cgroup layout and systemd's presence and version under the root.
pub fn gather(ctx: &Ctx) -> System {
    let cg = ctx.path("/sys/fs/cgroup");
    let cgroup = if cg.join("cgroup.controllers").exists() {
        CgroupVersion::V2
    } else if cg.join("unified/cgroup.controllers").exists() {
        CgroupVersion::Hybrid
    } else if cg.join("devices").exists() {
        CgroupVersion::V1
    } else {
        CgroupVersion::Unknown
    };
    let systemd_init = ctx.path("/run/systemd/system").is_dir();
    let systemd_version = systemd_init
        .then(|| ctx.find_bin("systemctl"))
        .flatten()
        .and_then(|bin| run_version(&bin).ok())
        .and_then(|out| parse_systemd_version(&out));
    System {
        cgroup,
        systemd_init,
        systemd_version,
    }
}

/// `systemd 252 (252.22-1~deb12u1)` → 252.
pub fn parse_systemd_version(output: &str) -> Option<u64> {
    output
        .lines()
        .next()?
        .strip_prefix("systemd ")?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Whether the daemon-reload class of device bugs can reach containers on this node, from
/// what it runs.
#[derive(Debug, Clone)]
pub struct Exposure {
    pub system: System,
    /// Each engine found: (name, driver, where the driver was read).
    pub drivers: Vec<(&'static str, CgroupDriver, String)>,
    /// runc's version, when the low-level runtime is runc and answered `--version`.
    pub runc: Option<(u64, u64, u64)>,
}

impl Exposure {
    /// `drivers`: each engine found with its cgroup driver (`engines::Engine::driver`).
    pub fn new(
        system: System,
        drivers: impl IntoIterator<Item = (&'static str, CgroupDriver, String)>,
    ) -> Exposure {
        Exposure {
            system,
            drivers: drivers.into_iter().collect(),
            runc: None,
        }
    }

    /// Some container on this node can be set up through systemd: systemd is PID 1 and an
    /// engine found uses the systemd driver (or no engine was found to ask).
    pub fn systemd_driver(&self) -> bool {
        self.system.systemd_init
            && (self.drivers.is_empty()
                || self
                    .drivers
                    .iter()
                    .any(|(_, d, _)| *d == CgroupDriver::Systemd))
    }

    fn runc_affected(&self) -> bool {
        self.runc
            .is_some_and(|v| (RUNC_BUG_FROM..RUNC_MIN).contains(&v))
    }

    fn systemd_too_old(&self) -> bool {
        self.system.systemd_version.is_some_and(|v| v < SYSTEMD_MIN)
    }

    /// A device node without a `/dev/char` link loses its rule on `daemon-reload` here.
    pub fn links_needed(&self) -> bool {
        self.systemd_driver()
            && (self.runc_affected() || self.systemd_too_old() || self.runc.is_none())
    }

    /// "docker: cgroupfs (why); containerd: systemd (why)", or why no engine counts.
    pub fn describe_drivers(&self) -> String {
        if self.drivers.is_empty() {
            return "no docker or containerd found".into();
        }
        self.drivers
            .iter()
            .map(|(e, d, why)| format!("{e}: {} ({why})", d.name()))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The cgroup version, systemd as PID 1, and each engine's cgroup driver: the facts that
/// decide how the runc and `/dev/char` findings below are graded.
pub fn check_cgroups(x: &Exposure) -> Finding {
    let init = match (x.system.systemd_init, x.system.systemd_version) {
        (false, _) => "systemd is not PID 1".to_string(),
        (true, Some(v)) => format!("systemd {v} is PID 1"),
        (true, None) => "systemd is PID 1 (version unknown)".to_string(),
    };
    Finding::info(
        "cgroups",
        format!(
            "{}; {init}; {}",
            x.system.cgroup.describe(),
            x.describe_drivers()
        ),
    )
}

/// systemd's own part of the bug: before 240 no runc keeps a rule for a device without a
/// `/dev/char` link across `daemon-reload`.
pub fn check_systemd(x: &Exposure, missing_links: usize) -> Finding {
    const C: &str = "systemd";
    let Some(v) = x.system.systemd_version.filter(|_| x.system.systemd_init) else {
        return Finding::info(
            C,
            if x.system.systemd_init {
                "systemd is PID 1 but `systemctl --version` gave no version".to_string()
            } else {
                "systemd is not PID 1: its daemon-reload device bugs cannot occur here".to_string()
            },
        );
    };
    if v >= SYSTEMD_MIN {
        return Finding::ok(C, format!("systemd {v} (>= {SYSTEMD_MIN})"));
    }
    let msg = format!("systemd {v} is older than {SYSTEMD_MIN}: with the systemd cgroup driver no runc release keeps a device rule for a node without a /dev/char/MAJOR:MINOR link across `systemctl daemon-reload`");
    if !x.systemd_driver() {
        return Finding::info(
            C,
            format!(
                "{msg}; no engine here uses the systemd driver ({})",
                x.describe_drivers()
            ),
        );
    }
    if missing_links == 0 {
        return Finding::ok(C, format!("{msg}; every device node has its link"));
    }
    Finding::fail(
        C,
        format!("{msg}; {missing_links} link(s) missing (see dev-char below)"),
        CREATE_LINKS,
    )
}

/// Runs `bin --version`. A binary written a moment ago can still be open for writing in a
/// forked child (ETXTBSY); that clears within milliseconds.
pub(super) fn run_version(bin: &Path) -> std::io::Result<String> {
    let mut tries = 0;
    loop {
        match Command::new(bin).arg("--version").output() {
            Err(e) if e.kind() == ErrorKind::ExecutableFileBusy && tries < 5 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
            Ok(out) => return Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        }
    }
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

/// The low-level runtime exists; runc's version is recorded in `x` and graded by what this
/// node runs: the daemon-reload regression of runc 1.1.3 to 1.1.6 is a failure only where
/// systemd sets up containers' cgroups and some device node lacks its `/dev/char` link.
pub fn check_low_level(
    ctx: &Ctx,
    config: &Config,
    x: &mut Exposure,
    missing_links: usize,
) -> Finding {
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
    let text = match run_version(&bin) {
        Ok(t) => t,
        Err(e) => {
            return Finding::warn(
                C,
                format!("{} found but cannot run `--version`: {e}", bin.display()),
                format!("run `{} --version` on the node", bin.display()),
            )
        }
    };
    let Some(v) = parse_runc_version(&text) else {
        let first = text.lines().next().unwrap_or("").to_string();
        return Finding::ok(
            C,
            format!("{} ({first}); not runc, version not checked", bin.display()),
        );
    };
    x.runc = Some(v);
    let runc = format!("{} is runc {}.{}.{}", bin.display(), v.0, v.1, v.2);
    if !x.runc_affected() {
        return Finding::ok(C, runc);
    }
    let introduced = if v == RUNC_BUG_FROM {
        " (1.1.3 is the release that introduced it)"
    } else {
        ""
    };
    let bug = format!("runc 1.1.3 to 1.1.6 leave out systemd DeviceAllow rules for device nodes without a /dev/char/MAJOR:MINOR link (NVIDIA's, and any node udev did not make), so `systemctl daemon-reload` takes the device away from running containers (EPERM, \"Failed to initialize NVML: Unknown Error\"; opencontainers/runc#3671, fixed in 1.1.7 with systemd >= 240){introduced}");
    let upgrade = "install runc >= 1.1.7 (distro backports, or the static binary from github.com/opencontainers/runc/releases as /usr/sbin/runc)";
    if !x.systemd_driver() {
        let why = if x.system.systemd_init {
            format!(
                "no engine here uses the systemd cgroup driver ({})",
                x.describe_drivers()
            )
        } else {
            "systemd is not PID 1 here, so every engine uses cgroupfs".to_string()
        };
        return Finding::info(C, format!("{runc}: {bug}. It does not apply: {why}"));
    }
    if missing_links == 0 {
        return Finding::warn(
            C,
            format!("{runc}: {bug}. This node uses the systemd driver ({}); every device node has its /dev/char link, so it is safe as long as they exist", x.describe_drivers()),
            format!("{upgrade}; keep the links with `{CREATE_LINKS}` after every driver load"),
        );
    }
    Finding::fail(
        C,
        format!("{runc}: {bug}. This node uses the systemd driver ({}) and {missing_links} device node(s) have no link", x.describe_drivers()),
        format!("{CREATE_LINKS}   (then {upgrade})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::Status;

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
        // Debian 12 as the README runs it: no systemd as PID 1, cgroup v1, cgroupfs.
        let plain = System {
            cgroup: CgroupVersion::V1,
            systemd_init: false,
            systemd_version: None,
        };
        let x = || Exposure {
            system: plain.clone(),
            drivers: vec![("docker", CgroupDriver::Cgroupfs, "test".into())],
            runc: None,
        };
        let f = check_low_level(&t.ctx(), &config, &mut x(), 0);
        assert!(
            f.status == Status::Fail && f.message.contains("not found"),
            "{f:?}"
        );
        t.exe(
            "/usr/sbin/runc",
            "#!/bin/sh\necho 'runc version 1.1.5+ds1'\necho 'commit: x'\n",
        );
        let mut e = x();
        let f = check_low_level(&t.ctx(), &config, &mut e, 3);
        assert_eq!(f.status, Status::Info, "{f:?}");
        assert!(f.message.contains("1.1.5") && f.message.contains("does not apply"));
        assert_eq!(e.runc, Some((1, 1, 5)));
        t.exe("/usr/sbin/runc", "#!/bin/sh\necho 'runc version 1.1.12'\n");
        assert_eq!(
            check_low_level(&t.ctx(), &config, &mut x(), 3).status,
            Status::Ok
        );

        // An explicit binary is run as given.
        let other = t.exe("/elsewhere/runc", "#!/bin/sh\necho 'runc version 1.1.3'\n");
        let mut ctx = t.ctx();
        ctx.runc = Some(other);
        let f = check_low_level(&ctx, &config, &mut x(), 0);
        assert!(f.message.contains("introduced"), "{f:?}");
    }

    /// opencontainers/runc#3671: runc 1.1.3-1.1.6 with the systemd driver lose devices
    /// without /dev/char links on `systemctl daemon-reload`; graded by what the node runs.
    #[test]
    fn runc_3671_graded_by_cgroup_driver_and_links() {
        let t = Tree::new();
        let config = Config::parse("", None).unwrap();
        t.exe(
            "/usr/sbin/runc",
            "#!/bin/sh\necho 'runc version 1.1.5+ds1'\n",
        );
        let systemd = System {
            cgroup: CgroupVersion::V2,
            systemd_init: true,
            systemd_version: Some(252),
        };
        let with = |d: CgroupDriver| Exposure {
            system: systemd.clone(),
            drivers: vec![
                ("docker", CgroupDriver::Cgroupfs, "exec-opts".into()),
                ("containerd", d, "SystemdCgroup".into()),
            ],
            runc: None,
        };
        let mut x = with(CgroupDriver::Systemd);
        let f = check_low_level(&t.ctx(), &config, &mut x, 2);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.fix.unwrap().starts_with(CREATE_LINKS));
        assert!(x.links_needed());
        // Every link present: safe for now, upgrade still advised.
        let f = check_low_level(&t.ctx(), &config, &mut with(CgroupDriver::Systemd), 0);
        assert_eq!(f.status, Status::Warn, "{f:?}");
        // Every engine on cgroupfs: not a problem on this node.
        let mut x = with(CgroupDriver::Cgroupfs);
        let f = check_low_level(&t.ctx(), &config, &mut x, 2);
        assert_eq!(f.status, Status::Info, "{f:?}");
        assert!(!x.links_needed());
        // A fixed runc needs no links with systemd >= 240, but does with an older systemd.
        t.exe("/usr/sbin/runc", "#!/bin/sh\necho 'runc version 1.1.7'\n");
        let mut x = with(CgroupDriver::Systemd);
        assert_eq!(
            check_low_level(&t.ctx(), &config, &mut x, 2).status,
            Status::Ok
        );
        assert!(!x.links_needed());
        assert_eq!(check_systemd(&x, 2).status, Status::Ok);
        x.system.systemd_version = Some(239);
        assert!(x.links_needed());
        assert_eq!(check_systemd(&x, 2).status, Status::Fail);
        assert_eq!(check_systemd(&x, 0).status, Status::Ok);
    }

    #[test]
    fn system_facts_under_root() {
        let t = Tree::new();
        let s = gather(&t.ctx());
        assert_eq!(s.cgroup, CgroupVersion::Unknown);
        assert!(!s.systemd_init && s.systemd_version.is_none());
        std::fs::create_dir_all(t.ctx().path("/sys/fs/cgroup/devices")).unwrap();
        assert_eq!(gather(&t.ctx()).cgroup, CgroupVersion::V1);
        t.write("/sys/fs/cgroup/unified/cgroup.controllers", "");
        assert_eq!(gather(&t.ctx()).cgroup, CgroupVersion::Hybrid);
        t.write("/sys/fs/cgroup/cgroup.controllers", "cpu io memory\n");
        assert_eq!(gather(&t.ctx()).cgroup, CgroupVersion::V2);
        std::fs::create_dir_all(t.ctx().path("/run/systemd/system")).unwrap();
        t.exe(
            "/usr/bin/systemctl",
            "#!/bin/sh\necho 'systemd 252 (252.22-1~deb12u1)'\necho '+PAM +AUDIT'\n",
        );
        let s = gather(&t.ctx());
        assert!(s.systemd_init);
        assert_eq!(s.systemd_version, Some(252));
        assert_eq!(parse_systemd_version("systemd 239\n"), Some(239));
        assert_eq!(parse_systemd_version("runc 1\n"), None);
    }
}
