//! The runtime binary and its registration with docker and containerd.

use std::io::ErrorKind;
use std::path::Path;

use super::{is_executable, Ctx, Finding, BIN_DIRS, RUNTIME_BIN};
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::Status;

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
}
