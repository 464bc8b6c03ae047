//! The runtime binary, its registration with docker and containerd, and the cgroup driver
//! each engine runs containers with. The engine files are read with `crate::engine`'s own
//! readers: one reading of `daemon.json` and of containerd's three schemas.

use std::io::ErrorKind;
use std::path::Path;

use super::system::{CgroupDriver, CgroupVersion, System};
use super::{is_executable, Ctx, Finding, BIN_DIRS, RUNTIME_BIN};
use crate::engine::{self, containerd, docker, Host, Kind};

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

/// One engine as found on the node.
#[derive(Debug, Clone)]
pub struct Engine {
    pub kind: Kind,
    /// Registration, path and default.
    pub finding: Finding,
    /// The name our runtime is registered under, when it is registered with an existing path.
    pub registered: Option<String>,
    /// Our runtime is the engine's default.
    pub is_default: bool,
    /// The cgroup driver and where that was read (`None`: the engine is not installed or its
    /// file cannot be read).
    pub cgroup_driver: Option<(CgroupDriver, String)>,
}

impl Engine {
    /// (engine name, cgroup driver, where it was read), for [`super::Exposure::new`]; `None`
    /// where the engine is not installed or its file cannot be read.
    pub fn driver(&self) -> Option<(&'static str, CgroupDriver, String)> {
        let (d, why) = self.cgroup_driver.clone()?;
        Some((self.kind.name(), d, why))
    }

    fn new(kind: Kind, finding: Finding) -> Engine {
        Engine {
            kind,
            finding,
            registered: None,
            is_default: false,
            cgroup_driver: None,
        }
    }
}

/// The engine's file under the root: present text, or the finding that ends the check.
fn read_engine_file(ctx: &Ctx, kind: Kind, daemon: &str) -> Result<(String, String), Box<Engine>> {
    let c = kind.name();
    let file = ctx.path(kind.default_config("accel"));
    let configure = format!(
        "accel-ctk runtime configure --runtime {c} && {}",
        kind.restart_command()
    );
    match crate::bounded::read_text(&file, engine::MAX_CONFIG_SIZE) {
        Ok(t) => Ok((t, file.display().to_string())),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(Box::new(match ctx.find_bin(daemon) {
            None => Engine::new(kind, Finding::info(c, format!("{c} is not installed"))),
            Some(_) => Engine::new(
                kind,
                Finding::fail(
                    c,
                    format!(
                        "{c} is installed but {} does not exist, so no runtime is registered",
                        file.display()
                    ),
                    configure,
                ),
            ),
        })),
        Err(e) => Err(Box::new(Engine::new(
            kind,
            Finding::fail(
                c,
                format!("cannot read {}: {e}", file.display()),
                super::unreadable_fix(&file, &e, engine::MAX_CONFIG_SIZE),
            ),
        ))),
    }
}

/// docker's `daemon.json` registers the runtime and its path exists; whether it is the
/// default is reported once for every engine by [`check_default_runtime`]. Also reads the
/// cgroup driver: `exec-opts` `native.cgroupdriver`, else dockerd's default (systemd on a
/// cgroup v2 host booted with systemd since docker 20.10, cgroupfs otherwise). `docker info`
/// would say it too, but only with dockerd running and never under `--root`.
pub fn check_docker(ctx: &Ctx, sys: &System) -> Engine {
    const C: &str = "docker";
    let kind = Kind::Docker;
    let (text, file) = match read_engine_file(ctx, kind, "dockerd") {
        Ok(t) => t,
        Err(done) => {
            let mut e = *done;
            if ctx.find_bin("dockerd").is_some() {
                e.cgroup_driver = Some(docker_default_driver(sys));
            }
            return e;
        }
    };
    let bad_file = |e: engine::EditError| {
        let mut msg =
            format!("{file} cannot be read as dockerd reads it (dockerd will not start): {e}");
        if let Some(src) = std::error::Error::source(&e) {
            msg = format!("{msg}: {src}");
        }
        Engine::new(
            kind,
            Finding::fail(
                C,
                msg,
                format!("correct {file} (check with `python3 -m json.tool {file}`)"),
            ),
        )
    };
    let runtimes = match docker::runtimes(&text) {
        Ok(r) => r,
        Err(e) => return bad_file(e),
    };
    let mut out = Engine::new(kind, Finding::info(C, ""));
    out.cgroup_driver = Some(match docker::cgroup_driver(&text) {
        Ok(Some(d)) if d == "systemd" => (CgroupDriver::Systemd, format!("exec-opts in {file}")),
        Ok(Some(d)) if d == "cgroupfs" => (CgroupDriver::Cgroupfs, format!("exec-opts in {file}")),
        Ok(Some(other)) => {
            out.finding = Finding::fail(
                C,
                format!("{file}: exec-opts native.cgroupdriver={other:?} is neither systemd nor cgroupfs (dockerd will not start)"),
                format!("correct {file}"),
            );
            return out;
        }
        Ok(None) => docker_default_driver(sys),
        Err(e) => return bad_file(e),
    });
    let default = docker::default_runtime(&text).ok().flatten();
    let Some((name, path)) = runtimes.into_iter().find(|(_, p)| is_ours(p)) else {
        out.finding = Finding::fail(
            C,
            format!("{file} registers no runtime whose path is {RUNTIME_BIN}"),
            format!(
                "accel-ctk runtime configure --runtime docker && {}",
                kind.restart_command()
            ),
        );
        return out;
    };
    if registered_path_missing(ctx, &path) {
        out.finding = Finding::fail(
            C,
            format!("runtime {name:?} in {file} points at {path}, which does not exist"),
            format!("accel-ctk runtime configure --runtime docker --runtime-name {name} --runtime-path \"$(command -v {RUNTIME_BIN})\" && systemctl restart docker"),
        );
        return out;
    }
    out.is_default = default.as_deref() == Some(name.as_str());
    out.finding = Finding::ok(
        C,
        format!(
            "runtime {name:?} ({path}) registered{}",
            if out.is_default { " and default" } else { "" }
        ),
    );
    out.registered = Some(name);
    out
}

fn docker_default_driver(sys: &System) -> (CgroupDriver, String) {
    if sys.cgroup == CgroupVersion::V2 && sys.systemd_init {
        (
            CgroupDriver::Systemd,
            "dockerd's default on cgroup v2 with systemd; daemon.json sets no native.cgroupdriver"
                .into(),
        )
    } else {
        (
            CgroupDriver::Cgroupfs,
            "dockerd's default here; daemon.json sets no native.cgroupdriver".into(),
        )
    }
}

/// containerd's `config.toml` registers the runtime for CRI (schema 3, 2 or 1, as
/// `crate::engine::containerd` reads them) and its `BinaryName` exists. The cgroup driver is
/// the `SystemdCgroup` option of our runtime (else of the default runtime): unset is
/// cgroupfs.
pub fn check_containerd(ctx: &Ctx) -> Engine {
    const C: &str = "containerd";
    let kind = Kind::Containerd;
    let cgroupfs_default = || (CgroupDriver::Cgroupfs, "containerd's default".to_string());
    let (text, file) = match read_engine_file(ctx, kind, "containerd") {
        Ok(t) => t,
        Err(done) => {
            let mut done = *done;
            if ctx.find_bin("containerd").is_some() {
                done.cgroup_driver = Some(cgroupfs_default());
            }
            return done;
        }
    };
    let cri = match containerd::cri_runtimes(&text, &Host::default()) {
        Ok(c) => c,
        Err(e) => {
            let mut msg = format!(
                "{file} cannot be read as containerd reads it (containerd will not start): {e}"
            );
            if let Some(src) = std::error::Error::source(&e) {
                msg = format!("{msg}: {src}");
            }
            return Engine::new(kind, Finding::fail(C, msg, format!("correct {file}")));
        }
    };
    let ours = cri
        .runtimes
        .iter()
        .find(|r| r.binary.as_deref().is_some_and(is_ours));
    let driver_of = |r: &containerd::CriRuntime| {
        r.systemd_cgroup.map(|on| {
            (
                if on {
                    CgroupDriver::Systemd
                } else {
                    CgroupDriver::Cgroupfs
                },
                format!("SystemdCgroup = {on} in runtimes.{} of {file}", r.name),
            )
        })
    };
    let default_rt = cri.runtimes.iter().find(|r| r.name == cri.default);
    let mut out = Engine::new(kind, Finding::info(C, ""));
    out.cgroup_driver = Some(
        ours.and_then(driver_of)
            .or_else(|| default_rt.and_then(driver_of))
            .unwrap_or_else(|| {
                (
                    CgroupDriver::Cgroupfs,
                    format!("SystemdCgroup not set in {file}: containerd's default"),
                )
            }),
    );
    let version = match cri.schema {
        Some(containerd::Schema::V3) => "version 3",
        Some(containerd::Schema::V2) => "version 2",
        Some(containerd::Schema::V1) => "version 1",
        None => "no schema yet",
    };
    let Some(rt) = ours else {
        out.finding = Finding::fail(
            C,
            format!(
                "{file} ({version}) has no runtime under {}.runtimes with options.BinaryName = .../{RUNTIME_BIN}",
                cri.table
            ),
            format!(
                "accel-ctk runtime configure --runtime containerd && {}",
                kind.restart_command()
            ),
        );
        return out;
    };
    let bin = rt.binary.clone().unwrap_or_default();
    let name = rt.name.clone();
    if registered_path_missing(ctx, &bin) {
        out.finding = Finding::fail(
            C,
            format!("runtime {name:?} in {file} points at {bin}, which does not exist"),
            format!("accel-ctk runtime configure --runtime containerd --runtime-name {name} --runtime-path \"$(command -v {RUNTIME_BIN})\" && systemctl restart containerd"),
        );
        return out;
    }
    out.is_default = cri.default == name;
    out.finding = Finding::ok(
        C,
        format!(
            "runtime {name:?} ({bin}) registered in {}{}",
            cri.table,
            if out.is_default {
                " and CRI's default"
            } else {
                ""
            }
        ),
    );
    out.registered = Some(name);
    out
}

/// `containerd_cdi_nri` for the node: its config file and the installed containerd's
/// version. Nothing when containerd has no file.
pub fn check_containerd_cdi(ctx: &Ctx) -> Option<Finding> {
    let (text, file) = read_engine_file(ctx, Kind::Containerd, "containerd").ok()?;
    containerd_cdi_nri(&text, &file, containerd_version_of(ctx))
}

/// containerd's `config.toml` under the root: `None` when it does not exist, `Err` when it
/// cannot be read (the containerd check says why).
pub(super) fn containerd_file(ctx: &Ctx) -> Option<Result<(String, String), ()>> {
    let file = ctx.path(containerd::DEFAULT_CONFIG);
    match crate::bounded::read_text(&file, engine::MAX_CONFIG_SIZE) {
        Ok(t) => Some(Ok((t, file.display().to_string()))),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(_) => Some(Err(())),
    }
}

/// The (major, minor) of the containerd found under the root, by its `--version`, as the
/// low-level runtime's is found: a test tree carries a stand-in.
pub(super) fn containerd_version_of(ctx: &Ctx) -> Option<(u32, u32)> {
    let bin = ctx.find_bin("containerd")?;
    containerd_version(&super::system::run_version(&bin).ok()?)
}

/// `containerd --version`'s `1.7.24` or `v2.1.9` as (major, minor).
fn containerd_version(line: &str) -> Option<(u32, u32)> {
    line.split_whitespace().skip(1).find_map(|tok| {
        let mut it = tok
            .strip_prefix('v')
            .unwrap_or(tok)
            .split(['.', '~', '-', '+']);
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    })
}

/// CDI and NRI in containerd's CRI, as `config.toml` and the version's defaults make them:
/// the device plugin's `cdi-cri` and `cdi-annotations` answers and the DRA driver's claims
/// reach a container only with CDI on (containerd 1.7: off unless `enable_cdi = true`; 2.x:
/// on unless turned off); NRI is reported for operators who run NRI plugins beside us.
/// `version` is containerd's (major, minor) when known (not under `--root`).
pub fn containerd_cdi_nri(text: &str, file: &str, version: Option<(u32, u32)>) -> Option<Finding> {
    const C: &str = "containerd CDI";
    let doc: toml::Table = text.parse().ok()?;
    let schema3 = doc.get("version").and_then(toml::Value::as_integer) == Some(3);
    let plugins = doc.get("plugins").and_then(toml::Value::as_table);
    let plugin = |name: &str| {
        plugins
            .and_then(|p| p.get(name))
            .and_then(toml::Value::as_table)
    };
    let cri = if schema3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    };
    let set_cdi = plugin(cri)
        .and_then(|t| t.get("enable_cdi"))
        .and_then(toml::Value::as_bool);
    let set_nri_off = plugin("io.containerd.nri.v1.nri")
        .and_then(|t| t.get("disable"))
        .and_then(toml::Value::as_bool);
    let shown = match version {
        Some((a, b)) => format!("containerd {a}.{b}"),
        None => "containerd (version unknown)".to_string(),
    };
    let defaults_on = version.map(|(major, _)| major >= 2);
    // 1.6's CRI has no CDI at all: a key there is ignored.
    let pre_cdi = version.is_some_and(|(a, b)| a == 1 && b < 7);
    let cdi = if pre_cdi {
        Some(false)
    } else {
        set_cdi.or(defaults_on)
    };
    let nri = set_nri_off.map(|off| !off).or(defaults_on);
    let said = |v: Option<bool>, set: bool| match (v, set && !pre_cdi) {
        (Some(true), true) => "on (set)",
        (Some(true), false) => "on (default)",
        (Some(false), true) => "off (set)",
        (Some(false), false) => "off (default)",
        (None, _) => "as the version's default",
    };
    let message = format!(
        "{shown}, {file}: CDI {}, NRI {}",
        said(cdi, set_cdi.is_some()),
        said(nri, set_nri_off.is_some())
    );
    Some(match cdi {
        Some(false) if pre_cdi => Finding::warn(
            C,
            format!("{message}: containerd before 1.7 applies no CDI device; the device plugin's cdi-cri and cdi-annotations answers and DRA claims give containers nothing"),
            "use the envvar, volume-mounts or device-specs strategy, or containerd >= 1.7",
        ),
        Some(false) => Finding::warn(
            C,
            format!("{message}: the device plugin's cdi-cri and cdi-annotations answers and DRA claims give containers nothing"),
            format!("set enable_cdi = true in [plugins.\"{cri}\"] of {file}, then systemctl restart containerd"),
        ),
        _ => Finding::info(C, message),
    })
}

/// One line for every engine where the runtime is registered but not the default. The
/// packages and install.sh leave the default alone on purpose (a node's other containers keep
/// plain runc), so this is information with the command that changes it, not a warning.
pub fn check_default_runtime(engines: &[&Engine]) -> Option<Finding> {
    let not_default: Vec<(&Engine, &str)> = engines
        .iter()
        .filter(|e| !e.is_default)
        .filter_map(|e| Some((*e, e.registered.as_deref()?)))
        .collect();
    if not_default.is_empty() {
        return None;
    }
    let how: Vec<String> = not_default
        .iter()
        .map(|(e, name)| match e.kind {
            Kind::Docker => format!("docker: `docker run --runtime {name}`"),
            Kind::Containerd => format!("containerd's CRI: pods with runtimeClassName {name}"),
            Kind::Crio => format!("CRI-O: pods with runtimeClassName {name}"),
        })
        .collect();
    let fix: Vec<String> = not_default
        .iter()
        .map(|(e, name)| {
            format!(
                "accel-ctk runtime configure --runtime {} --runtime-name {name} --set-as-default && {}",
                e.kind.name(),
                e.kind.restart_command()
            )
        })
        .collect();
    Some(Finding::new(
        "default-runtime",
        super::Status::Info,
        format!(
            "the runtime is registered but not the default (left so on purpose; only these containers get devices): {}",
            how.join("; ")
        ),
        Some(fix.join("; ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::{CgroupVersion, Status, System};

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

    fn sys(cgroup: CgroupVersion, systemd_init: bool) -> System {
        System {
            cgroup,
            systemd_init,
            systemd_version: None,
        }
    }

    #[test]
    fn docker_registration() {
        let t = Tree::new();
        let v1 = sys(CgroupVersion::V1, false);
        let docker = |t: &Tree| check_docker(&t.ctx(), &v1);
        assert_eq!(docker(&t).finding.status, Status::Info);
        assert!(docker(&t).cgroup_driver.is_none());
        t.exe("/usr/bin/dockerd", "");
        assert_eq!(docker(&t).finding.status, Status::Fail);
        t.write("/etc/docker/daemon.json", "{\"runtimes\": {");
        let f = docker(&t).finding;
        assert!(
            f.status == Status::Fail && f.message.contains("will not start"),
            "{f:?}"
        );
        t.write(
            "/etc/docker/daemon.json",
            r#"{"runtimes":{"nvidia":{"path":"nvidia-container-runtime"}}}"#,
        );
        let f = docker(&t).finding;
        assert!(
            f.status == Status::Fail && f.message.contains("registers no runtime"),
            "{f:?}"
        );
        t.write(
            "/etc/docker/daemon.json",
            r#"{"runtimes":{"accel":{"path":"/usr/local/bin/accel-container-runtime"}}}"#,
        );
        let f = docker(&t).finding;
        assert!(
            f.status == Status::Fail && f.message.contains("does not exist"),
            "{f:?}"
        );
        t.exe("/usr/local/bin/accel-container-runtime", "");
        let e = docker(&t);
        // Registered, not the default: fine, said once by check_default_runtime.
        assert_eq!(e.finding.status, Status::Ok, "{e:?}");
        assert_eq!(e.registered.as_deref(), Some("accel"));
        assert!(!e.is_default);
        assert_eq!(e.cgroup_driver.clone().unwrap().0, CgroupDriver::Cgroupfs);
        let info = check_default_runtime(&[&e]).unwrap();
        assert_eq!(info.status, Status::Info);
        assert!(info.fix.unwrap().contains("--set-as-default"));
        t.write(
            "/etc/docker/daemon.json",
            r#"{"default-runtime":"accel","runtimes":{"accel":{"path":"/usr/local/bin/accel-container-runtime"}}}"#,
        );
        let e = docker(&t);
        assert_eq!(e.finding.status, Status::Ok);
        assert!(e.is_default);
        assert!(check_default_runtime(&[&e]).is_none());
    }

    #[test]
    fn docker_cgroup_driver_from_exec_opts_or_default() {
        let t = Tree::new();
        t.exe("/usr/bin/dockerd", "");
        // No daemon.json: dockerd's default, which depends on the host.
        let d = |s: &System| check_docker(&t.ctx(), s).cgroup_driver.unwrap().0;
        assert_eq!(d(&sys(CgroupVersion::V1, true)), CgroupDriver::Cgroupfs);
        assert_eq!(d(&sys(CgroupVersion::V2, false)), CgroupDriver::Cgroupfs);
        assert_eq!(d(&sys(CgroupVersion::V2, true)), CgroupDriver::Systemd);
        t.write(
            "/etc/docker/daemon.json",
            r#"{"exec-opts":["native.cgroupdriver=cgroupfs"]}"#,
        );
        let e = check_docker(&t.ctx(), &sys(CgroupVersion::V2, true));
        let (driver, why) = e.cgroup_driver.unwrap();
        assert_eq!(driver, CgroupDriver::Cgroupfs);
        assert!(why.contains("exec-opts"), "{why}");
        t.write(
            "/etc/docker/daemon.json",
            r#"{"exec-opts":["native.cgroupdriver=systemd"]}"#,
        );
        assert_eq!(d(&sys(CgroupVersion::V1, false)), CgroupDriver::Systemd);
    }

    /// containerd 2 turns CDI and NRI on unless the file turns them off; 1.7 the other way;
    /// 1.6 has no CDI whatever the file says.
    #[test]
    fn containerd_cdi_and_nri_by_version_and_file() {
        let f = "/etc/containerd/config.toml";
        let v3 = "version = 3\n";
        let off3 = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = false\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = true\n";
        let on2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\n";
        let got = |t: &str, v| containerd_cdi_nri(t, f, v).unwrap();
        let g = got(v3, Some((2, 1)));
        assert_eq!(g.status, Status::Info, "{g:?}");
        assert!(
            g.message.contains("CDI on (default), NRI on (default)"),
            "{g:?}"
        );
        let g = got(off3, Some((2, 1)));
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(g.message.contains("CDI off (set), NRI off (set)"), "{g:?}");
        assert!(
            g.fix
                .as_deref()
                .unwrap()
                .contains("io.containerd.cri.v1.runtime"),
            "{g:?}"
        );
        let g = got("version = 2\n", Some((1, 7)));
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(
            g.message.contains("CDI off (default), NRI off (default)"),
            "{g:?}"
        );
        assert!(
            g.fix
                .as_deref()
                .unwrap()
                .contains("io.containerd.grpc.v1.cri"),
            "{g:?}"
        );
        assert_eq!(got(on2, Some((1, 7))).status, Status::Info);
        let g = got(on2, Some((1, 6)));
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(g.message.contains("before 1.7"), "{g:?}");
        let g = got(v3, None);
        assert!(g.message.contains("version unknown"), "{g:?}");
        assert_eq!(g.status, Status::Info);
        assert!(containerd_cdi_nri("version = [", f, None).is_none());
        assert_eq!(
            containerd_version("containerd github.com/containerd/containerd/v2 v2.1.9 abc"),
            Some((2, 1))
        );
        assert_eq!(
            containerd_version(
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1"
            ),
            Some((1, 6))
        );
    }

    #[test]
    fn containerd_both_schemas() {
        let t = Tree::new();
        let e = check_containerd(&t.ctx());
        assert_eq!(e.finding.status, Status::Info);
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
        let e = check_containerd(&t.ctx());
        assert_eq!(e.finding.status, Status::Ok, "{e:?}");
        assert!(e.is_default);
        assert_eq!(e.cgroup_driver.unwrap().0, CgroupDriver::Systemd);

        // The same tables in a version 3 file are not where containerd 2 looks.
        t.write(
            "/etc/containerd/config.toml",
            &v2.replace("version = 2", "version = 3"),
        );
        let e = check_containerd(&t.ctx());
        assert_eq!(e.finding.status, Status::Fail, "{e:?}");
        assert!(e.finding.message.contains("io.containerd.cri.v1.runtime") && !e.is_default);

        let v3 = v2
            .replace("version = 2", "version = 3")
            .replace("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
            .replace(
                "default_runtime_name = \"accel\"",
                "default_runtime_name = \"runc\"",
            )
            .replace("SystemdCgroup = true", "");
        t.write("/etc/containerd/config.toml", &v3);
        let e = check_containerd(&t.ctx());
        assert_eq!(e.finding.status, Status::Ok, "{e:?}");
        assert!(!e.is_default);
        assert_eq!(e.registered.as_deref(), Some("accel"));
        assert_eq!(e.cgroup_driver.clone().unwrap().0, CgroupDriver::Cgroupfs);
        let info = check_default_runtime(&[&e]).unwrap();
        assert!(info.message.contains("runtimeClassName accel"), "{info:?}");

        t.write(
            "/etc/containerd/config.toml",
            &v3.replace("/usr/bin/", "/opt/gone/"),
        );
        let e = check_containerd(&t.ctx());
        assert!(
            e.finding.status == Status::Fail && e.finding.message.contains("/opt/gone"),
            "{e:?}"
        );

        t.write("/etc/containerd/config.toml", "version = 2\n[plugins\n");
        assert_eq!(check_containerd(&t.ctx()).finding.status, Status::Fail);
        t.write("/etc/containerd/config.toml", "version = 4\n");
        let e = check_containerd(&t.ctx());
        assert!(e.finding.message.contains("version = 4"), "{e:?}");
    }
}
