//! containerd's NRI as the NRI plugin (`accel-nri-plugin`) needs it: on, its socket there,
//! external plugins let in, and whether a container that needs the plugin fails closed while
//! it is down. NRI lets a container start without a plugin's adjustment when the plugin is not
//! registered; only NRI's default validator (containerd 2.2 and later, NRI 0.10) refuses it,
//! for the plugins the node's config requires of every container or a pod's
//! `required-plugins.noderesource.dev` annotation requires of its containers
//! (docs/nri.md, "Failing closed").
//! Ref: containerd/nri `plugins/default-validator`, `pkg/plugin/annotations.go`.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::Ctx;
use super::Finding;
use crate::quote::quote;

/// The name `accel-nri-plugin` registers under unless given `--name`.
pub const PLUGIN_NAME: &str = "accel";
pub const PLUGIN_BIN: &str = "accel-nri-plugin";
/// The runtime shim's binary, as a handler's `BinaryName` names it.
const SHIM_BIN: &str = "accel-container-runtime";
/// containerd's NRI table, the same in config schemas 2 and 3.
pub const TABLE: &str = "io.containerd.nri.v1.nri";
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// The pod annotation (with `/pod` or `/container.<name>`) naming plugins a container needs.
pub const REQUIRED_ANNOTATION: &str = "required-plugins.noderesource.dev";
/// The toleration annotation key this project's docs and manifests use; containerd has none
/// unless `tolerate_missing_plugins_annotation` names one.
pub const TOLERATE_ANNOTATION: &str = "tolerate-missing-plugins.noderesource.dev";
/// First containerd whose NRI has the default validator.
pub const VALIDATOR_SINCE: (u32, u32) = (2, 2);

/// The NRI keys of containerd's `config.toml`, as set (`None`: not in the file).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NriConfig {
    pub disable: Option<bool>,
    pub disable_connections: Option<bool>,
    pub socket_path: Option<String>,
    pub validator_enable: Option<bool>,
    pub required_plugins: Vec<String>,
    pub tolerate_annotation: Option<String>,
    /// The CRI runtime handlers: name, `base_runtime_spec` (as written), `BinaryName`.
    pub handlers: Vec<Handler>,
}

/// One CRI runtime handler of containerd's file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Handler {
    pub name: String,
    pub base_runtime_spec: Option<String>,
    pub binary_name: Option<String>,
}

/// The CRI plugin's table: schema 3, then schema 2.
const CRI_TABLES: [&str; 2] = ["io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"];

/// The handlers under `[plugins.<cri>.containerd.runtimes]`, by name.
fn handlers(doc: &toml::Table) -> Vec<Handler> {
    let Some(runtimes) = CRI_TABLES.iter().find_map(|t| {
        doc.get("plugins")?
            .get(*t)?
            .get("containerd")?
            .get("runtimes")?
            .as_table()
    }) else {
        return Vec::new();
    };
    let s = |v: Option<&toml::Value>| v.and_then(toml::Value::as_str).map(str::to_string);
    runtimes
        .iter()
        .map(|(name, r)| Handler {
            name: name.clone(),
            base_runtime_spec: s(r.get("base_runtime_spec")).filter(|p| !p.is_empty()),
            binary_name: s(r.get("options").and_then(|o| o.get("BinaryName"))),
        })
        .collect()
}

/// Whether a handler's containers fail closed without NRI's validator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    /// Its `base_runtime_spec` has `accel-nri-plugin check` (src/engine/checkhook.rs).
    Checked(String),
    /// Its runtime is this project's shim, which adds the devices itself.
    Shim,
    /// Neither: the spec file (if any), and why it does not count.
    Missing(Option<String>, String),
    /// Its `base_runtime_spec` runs the check hook from a path where no executable is: the
    /// runtime then fails every container of the handler, device-less ones included.
    Broken(String, String),
}

impl NriConfig {
    /// The NRI table of a `config.toml`; `None` when the file is not TOML (the containerd
    /// check says so).
    pub fn parse(text: &str) -> Option<NriConfig> {
        let doc: toml::Table = text.parse().ok()?;
        let Some(t) = doc
            .get("plugins")
            .and_then(|p| p.get(TABLE))
            .and_then(toml::Value::as_table)
        else {
            return Some(NriConfig {
                handlers: handlers(&doc),
                ..NriConfig::default()
            });
        };
        let flag = |t: &toml::Table, k: &str| t.get(k).and_then(toml::Value::as_bool);
        let v = t.get("default_validator").and_then(toml::Value::as_table);
        Some(NriConfig {
            handlers: handlers(&doc),
            disable: flag(t, "disable"),
            disable_connections: flag(t, "disable_connections"),
            socket_path: t
                .get("socket_path")
                .and_then(toml::Value::as_str)
                .map(str::to_string),
            validator_enable: v.and_then(|v| flag(v, "enable")),
            required_plugins: v
                .and_then(|v| v.get("required_plugins"))
                .and_then(toml::Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(toml::Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            tolerate_annotation: v
                .and_then(|v| v.get("tolerate_missing_plugins_annotation"))
                .and_then(toml::Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }

    /// NRI's validator matches a required plugin by its name or by `<index>-<name>`.
    fn requires_ours(&self) -> bool {
        self.required_plugins.iter().any(|r| {
            r == PLUGIN_NAME
                || r.split_once('-').is_some_and(|(idx, name)| {
                    name == PLUGIN_NAME
                        && !idx.is_empty()
                        && idx.bytes().all(|b| b.is_ascii_digit())
                })
        })
    }
}

/// What the node has beside the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// containerd's (major, minor), when its `--version` answered.
    pub version: Option<(u32, u32)>,
    /// The NRI socket exists as a socket under the root.
    pub socket: bool,
    /// `accel-nri-plugin` is installed in the usual bin dirs (a host install; the DaemonSet
    /// carries its own): then a gap is a warning, else a fact.
    pub plugin_installed: bool,
}

/// The lines that turn the validator on, for the fixes.
pub fn validator_lines() -> String {
    format!(
        "[plugins.\"{TABLE}\".default_validator] enable = true, \
         tolerate_missing_plugins_annotation = \"{TOLERATE_ANNOTATION}\""
    )
}

/// `accel-ctk nri base-spec`, for the fixes.
fn base_spec_fix(file: &str, which: &str) -> String {
    format!(
        "ctr oci spec | accel-ctk nri base-spec > /etc/containerd/accel-base-spec.json, and set base_runtime_spec = \"/etc/containerd/accel-base-spec.json\" for {which} in {file}, then systemctl restart containerd (docs/nri-fail-closed.md)"
    )
}

/// The finding for containerd's NRI, from its file's keys, what the node shows, and each
/// CRI handler's check hook (`hooks`, by handler name).
pub fn judge(cfg: &NriConfig, file: &str, seen: Seen, hooks: &[(String, Hook)]) -> Finding {
    const C: &str = "containerd NRI";
    let restart = "systemctl restart containerd";
    let shown = match seen.version {
        Some((a, b)) => format!("containerd {a}.{b}"),
        None => "containerd (version unknown)".to_string(),
    };
    let gap = |msg: String, fix: String| {
        if seen.plugin_installed {
            Finding::warn(C, msg, fix)
        } else {
            Finding::new(C, super::Status::Info, msg, Some(fix))
        }
    };
    if let Some(v @ (1, 0..=6)) = seen.version {
        return gap(
            format!("containerd {}.{} has no NRI for plugins ({PLUGIN_BIN} needs 2.0 or later, failing closed 2.2)", v.0, v.1),
            "use the runtime (accel-ctk runtime configure), or containerd >= 2.2".into(),
        );
    }
    // containerd 2 turns NRI on unless the file turns it off; 1.7 the other way.
    let on = match (cfg.disable, seen.version) {
        (Some(off), _) => Some(!off),
        (None, Some((major, _))) => Some(major >= 2),
        (None, None) => None,
    };
    let set = |s: bool| if s { "set" } else { "default" };
    let socket = cfg.socket_path.as_deref().unwrap_or(DEFAULT_SOCKET);
    let head = format!(
        "{shown}, {file}: NRI {} ({})",
        match on {
            Some(true) => "on",
            Some(false) => "off",
            None => "as the version's default",
        },
        set(cfg.disable.is_some())
    );
    if on == Some(false) {
        return gap(
            format!("{head}: {PLUGIN_BIN} cannot connect"),
            format!("set disable = false in [plugins.\"{TABLE}\"] of {file}, then {restart}"),
        );
    }
    if cfg.disable_connections == Some(true) {
        return gap(
            format!("{head}, disable_connections = true: containerd opens no socket for external plugins such as {PLUGIN_BIN}"),
            format!("set disable_connections = false in [plugins.\"{TABLE}\"] of {file}, then {restart}"),
        );
    }
    let head = format!(
        "{head}, socket {} {}",
        quote(socket),
        if seen.socket {
            "present"
        } else {
            "missing (containerd not running, or NRI off)"
        }
    );
    // Whatever the version: a hook the runtime cannot run fails every container it starts.
    let broken: Vec<String> = hooks
        .iter()
        .filter_map(|(name, h)| match h {
            Hook::Broken(spec, bin) => Some(format!(
                "{}: base_runtime_spec {} runs the check hook {}, which is not an executable on this node",
                quote(name),
                quote(spec),
                quote(bin)
            )),
            _ => None,
        })
        .collect();
    if !broken.is_empty() {
        return Finding::new(
            C,
            super::Status::Fail,
            format!(
                "{head}; every container of these handlers fails to start: {}",
                broken.join("; ")
            ),
            Some(format!("install {PLUGIN_BIN} at that path (the .deb or .rpm puts it at {}), or remake the spec with accel-ctk nri base-spec --plugin <its path>, then {restart}", crate::engine::checkhook::DEFAULT_PATH)),
        );
    }
    let can = seen.version.map(|v| v >= VALIDATOR_SINCE);
    if can == Some(false) {
        let missing: Vec<String> = hooks
            .iter()
            .filter_map(|(name, h)| match h {
                Hook::Missing(spec, why) => Some(format!(
                    "{}: {why}{}",
                    quote(name),
                    spec.as_deref()
                        .map(|s| format!(" (base_runtime_spec {})", quote(s)))
                        .unwrap_or_default()
                )),
                _ => None,
            })
            .collect();
        let closed: Vec<String> = hooks
            .iter()
            .filter_map(|(name, h)| match h {
                Hook::Checked(spec) => Some(format!(
                    "{}: fails closed through {PLUGIN_BIN} check (base_runtime_spec {})",
                    quote(name),
                    quote(spec)
                )),
                Hook::Shim => Some(format!("{}: the runtime itself", quote(name))),
                Hook::Missing(..) | Hook::Broken(..) => None,
            })
            .collect();
        if !closed.is_empty() && missing.is_empty() {
            return Finding::ok(
                C,
                format!(
                    "{head}; no NRI default validator before {}.{}, each CRI handler: {}",
                    VALIDATOR_SINCE.0,
                    VALIDATOR_SINCE.1,
                    closed.join("; ")
                ),
            );
        }
        if !closed.is_empty() {
            return gap(
                format!("{head}; cannot fail closed on {}: while {PLUGIN_BIN} is down a container there that asks for a device starts without it ({})", missing.join("; "), closed.join("; ")),
                base_spec_fix(file, "those handlers"),
            );
        }
        return gap(
            format!("{head}; cannot fail closed: containerd before {}.{} has no NRI default validator, so while {PLUGIN_BIN} is down a container that asks for a device starts without it", VALIDATOR_SINCE.0, VALIDATOR_SINCE.1),
            format!("{}; or containerd >= {}.{} with {}, or the runtime (accel-ctk runtime configure)", base_spec_fix(file, "each CRI runtime handler"), VALIDATOR_SINCE.0, VALIDATOR_SINCE.1, validator_lines()),
        );
    }
    let whose = if can.is_none() {
        " (if containerd is 2.2 or later)"
    } else {
        ""
    };
    if cfg.validator_enable != Some(true) {
        let msg = format!("{head}; the NRI default validator is off{whose}: while {PLUGIN_BIN} is down a container that asks for a device starts without it");
        let fix = format!(
            "in {file} set {}, then {restart}; and annotate device pods {REQUIRED_ANNOTATION}/container.<name>: '[\"{PLUGIN_NAME}\"]' (docs/nri.md); or, without the validator, {}",
            validator_lines(),
            base_spec_fix(file, "each CRI runtime handler")
        );
        return match can {
            Some(true) => Finding::warn(C, msg, fix),
            _ => gap(msg, fix),
        };
    }
    if cfg.requires_ours() {
        return match &cfg.tolerate_annotation {
            Some(t) => Finding::ok(
                C,
                format!("{head}; fails closed{whose}: every container requires {PLUGIN_NAME:?}, except pods annotated {t}: \"true\""),
            ),
            None => Finding::warn(
                C,
                format!("{head}; every container requires {PLUGIN_NAME:?}{whose}, and no pod can tolerate its absence: the plugin's own pod and static pods cannot start while it is down"),
                format!("in {file} set tolerate_missing_plugins_annotation = \"{TOLERATE_ANNOTATION}\" in [plugins.\"{TABLE}\".default_validator] and annotate those pods with it, then {restart}"),
            ),
        };
    }
    Finding::ok(
        C,
        format!("{head}; the NRI default validator is on{whose}: a pod annotated {REQUIRED_ANNOTATION}/container.<name>: '[\"{PLUGIN_NAME}\"]' fails closed while {PLUGIN_BIN} is down"),
    )
}

/// `judge` for the node: containerd's file under the root (none: containerd is not
/// installed, or runs on its defaults when its binary is there), its `--version`, the socket.
pub fn check_containerd_nri(ctx: &Ctx) -> Option<Finding> {
    let (text, file) = match super::engines::containerd_file(ctx) {
        Some(Ok(t)) => t,
        // The containerd check says why it cannot be read.
        Some(Err(())) => return None,
        None => {
            ctx.find_bin("containerd")?;
            (
                String::new(),
                format!(
                    "{} (absent)",
                    ctx.path(crate::engine::containerd::DEFAULT_CONFIG)
                        .display()
                ),
            )
        }
    };
    let cfg = NriConfig::parse(&text)?;
    let socket = ctx.path(cfg.socket_path.as_deref().unwrap_or(DEFAULT_SOCKET));
    let seen = Seen {
        version: super::engines::containerd_version_of(ctx),
        socket: std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket()),
        plugin_installed: ctx.find_bin(PLUGIN_BIN).is_some(),
    };
    let hooks: Vec<(String, Hook)> = cfg
        .handlers
        .iter()
        .map(|h| (h.name.clone(), hook_of(ctx, h)))
        .collect();
    Some(judge(&cfg, &file, seen, &hooks))
}

/// A spec file is a few KiB.
const MAX_BASE_SPEC: u64 = 4 << 20;

/// Whether handler `h` fails closed: this project's shim as its binary, or the check hook in
/// its `base_runtime_spec` (read under the root, bounded).
fn hook_of(ctx: &Ctx, h: &Handler) -> Hook {
    if h.binary_name
        .as_deref()
        .is_some_and(|b| b.rsplit('/').next() == Some(SHIM_BIN))
    {
        return Hook::Shim;
    }
    let Some(spec) = &h.base_runtime_spec else {
        return Hook::Missing(None, "no base_runtime_spec".into());
    };
    let doc = crate::bounded::read_file(&ctx.path(spec), MAX_BASE_SPEC)
        .map_err(|e| format!("cannot read it: {e}"))
        .and_then(|d| {
            serde_json::from_slice::<serde_json::Value>(&d).map_err(|e| format!("not JSON: {e}"))
        });
    match doc {
        Ok(doc) if crate::engine::checkhook::present(&doc) => {
            match crate::engine::checkhook::paths(&doc)
                .into_iter()
                .find(|p| !p.starts_with('/') || !super::is_executable(&ctx.path(p)))
            {
                Some(bin) => Hook::Broken(spec.clone(), bin.to_string()),
                None => Hook::Checked(spec.clone()),
            }
        }
        Ok(_) => Hook::Missing(Some(spec.clone()), format!("no {PLUGIN_BIN} check hook")),
        Err(why) => Hook::Missing(Some(spec.clone()), why),
    }
}

/// CRI-O's config: `crio.conf` and its drop-ins, in the order CRI-O reads them.
const CRIO_CONF: &str = "/etc/crio/crio.conf";
/// CRI-O's default `hooks_dir` (crio.conf(5)).
const CRIO_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";

/// What CRI-O's config text says: `[crio.nri] enable_nri` and `[crio.runtime] hooks_dir`,
/// the later text winning (drop-ins after `crio.conf`). `None` for a text that is not TOML.
pub fn crio_settings(texts: &[&str]) -> Option<(Option<bool>, Vec<String>)> {
    let mut nri = None;
    let mut dirs = None;
    for text in texts {
        let doc: toml::Table = text.parse().ok()?;
        let crio = doc.get("crio");
        if let Some(b) = crio
            .and_then(|c| c.get("nri"))
            .and_then(|n| n.get("enable_nri"))
            .and_then(toml::Value::as_bool)
        {
            nri = Some(b);
        }
        if let Some(a) = crio
            .and_then(|c| c.get("runtime"))
            .and_then(|r| r.get("hooks_dir"))
            .and_then(toml::Value::as_array)
        {
            dirs = Some(
                a.iter()
                    .filter_map(toml::Value::as_str)
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    Some((
        nri,
        dirs.unwrap_or_else(|| vec![CRIO_HOOKS_DIR.to_string()]),
    ))
}

/// Whether an oci-hooks(5) file (`hooks.d/*.json`) runs the check hook at `createRuntime`.
pub fn is_check_hook_file(text: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return false;
    };
    let staged = v
        .get("stages")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|a| a.iter().any(|s| s == "createRuntime"));
    let hook = v.get("hook").cloned().unwrap_or_default();
    staged
        && crate::engine::checkhook::present(
            &serde_json::json!({"hooks": {"createRuntime": [hook]}}),
        )
}

/// The finding for CRI-O's NRI where CRI-O's config is there: NRI on or off, and whether a
/// hooks dir has the check hook (CRI-O has no NRI validator: the hook is how it fails closed).
pub fn crio_finding(nri: Option<bool>, file: &str, hook: Option<&str>) -> Finding {
    const C: &str = "CRI-O NRI";
    let on = match nri {
        Some(true) => "NRI on (set)",
        Some(false) => "NRI off (set)",
        None => "NRI as the version's default (on since 1.30)",
    };
    if nri == Some(false) {
        return Finding::warn(
            C,
            format!("{file}: {on}: {PLUGIN_BIN} cannot connect"),
            "set enable_nri = true in [crio.nri] (a drop-in under /etc/crio/crio.conf.d/), then systemctl restart crio".to_string(),
        );
    }
    match hook {
        Some(h) => Finding::ok(
            C,
            format!("{file}: {on}; fails closed through {PLUGIN_BIN} check ({})", quote(h)),
        ),
        None => Finding::warn(
            C,
            format!("{file}: {on}; cannot fail closed: no hooks dir has {PLUGIN_BIN}'s check hook, so while {PLUGIN_BIN} is down a container that asks for a device starts without it"),
            format!("copy the packages' example crio-accel-nri-check.json into a hooks_dir of CRI-O (default {CRIO_HOOKS_DIR}; podman reads it too) (docs/nri-fail-closed.md)"),
        ),
    }
}

/// [`crio_finding`] for the node: none unless `crio.conf` or a drop-in is there.
pub fn check_crio_nri(ctx: &Ctx) -> Option<Finding> {
    const MAX: u64 = 1 << 20;
    let mut files = vec![ctx.path(CRIO_CONF)];
    if let Ok(rd) = std::fs::read_dir(ctx.path(crate::engine::crio::DROP_IN_DIR)) {
        let mut drop_ins: Vec<_> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        drop_ins.sort();
        files.extend(drop_ins);
    }
    let texts: Vec<String> = files
        .iter()
        .filter_map(|f| crate::bounded::read_text(f, MAX).ok())
        .collect();
    if texts.is_empty() {
        return None;
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let (nri, dirs) = crio_settings(&refs)?;
    let hook = dirs.iter().find_map(|d| {
        let rd = std::fs::read_dir(ctx.path(d)).ok()?;
        rd.filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .find(|p| crate::bounded::read_text(p, MAX).is_ok_and(|t| is_check_hook_file(&t)))
            .map(|p| {
                Path::new(d)
                    .join(p.file_name().unwrap_or_default())
                    .display()
                    .to_string()
            })
    });
    Some(crio_finding(nri, CRIO_CONF, hook.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    const F: &str = "/etc/containerd/config.toml";

    fn seen(version: Option<(u32, u32)>) -> Seen {
        Seen {
            version,
            socket: true,
            plugin_installed: true,
        }
    }

    fn cfg(text: &str) -> NriConfig {
        NriConfig::parse(text).unwrap()
    }

    const ON: &str =
        "version = 3\n[plugins.\"io.containerd.nri.v1.nri\".default_validator]\nenable = true\n";

    #[test]
    fn reads_the_nri_table_of_either_schema() {
        let c = cfg("version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = false\nsocket_path = \"/run/x.sock\"\n[plugins.\"io.containerd.nri.v1.nri\".default_validator]\nenable = true\nrequired_plugins = [\"10-accel\"]\ntolerate_missing_plugins_annotation = \"t\"\n");
        assert_eq!(c.disable, Some(false));
        assert_eq!(c.socket_path.as_deref(), Some("/run/x.sock"));
        assert_eq!(c.validator_enable, Some(true));
        assert!(c.requires_ours());
        assert_eq!(c.tolerate_annotation.as_deref(), Some("t"));
        assert_eq!(cfg("version = 3\n"), NriConfig::default());
        assert!(NriConfig::parse("version = [").is_none());
        for (req, ours) in [
            ("accel", true),
            ("x-accel", false),
            ("-accel", false),
            ("accel2", false),
        ] {
            let c = NriConfig {
                required_plugins: vec![req.into()],
                ..Default::default()
            };
            assert_eq!(c.requires_ours(), ours, "{req}");
        }
    }

    #[test]
    fn grades_by_version_and_validator() {
        // 2.1: on by default, cannot fail closed.
        let g = judge(&cfg("version = 3\n"), F, seen(Some((2, 1))), &[]);
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(g.message.contains("NRI on (default)"), "{g:?}");
        assert!(g.message.contains("cannot fail closed"), "{g:?}");
        // The same without the plugin installed is a fact.
        let mut s = seen(Some((2, 1)));
        s.plugin_installed = false;
        assert_eq!(judge(&cfg("version = 3\n"), F, s, &[]).status, Status::Info);
        // 2.2 without the validator: the lines to set, whether or not the plugin is here.
        s.version = Some((2, 2));
        let g = judge(&cfg("version = 3\n"), F, s, &[]);
        assert_eq!(g.status, Status::Warn, "{g:?}");
        let fix = g.fix.unwrap();
        assert!(
            fix.contains("[plugins.\"io.containerd.nri.v1.nri\".default_validator] enable = true"),
            "{fix}"
        );
        assert!(
            fix.contains("required-plugins.noderesource.dev/container."),
            "{fix}"
        );
        // On: by annotation.
        let g = judge(&cfg(ON), F, seen(Some((2, 2))), &[]);
        assert_eq!(g.status, Status::Ok, "{g:?}");
        assert!(g.message.contains("validator is on"), "{g:?}");
        // Required of everyone without a toleration: the plugin's own pod would deadlock.
        let every = format!("{ON}required_plugins = [\"accel\"]\n");
        let g = judge(&cfg(&every), F, seen(Some((2, 3))), &[]);
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(g.message.contains("cannot start"), "{g:?}");
        let tolerated =
            format!("{every}tolerate_missing_plugins_annotation = \"{TOLERATE_ANNOTATION}\"\n");
        let g = judge(&cfg(&tolerated), F, seen(Some((2, 3))), &[]);
        assert_eq!(g.status, Status::Ok, "{g:?}");
        assert!(g.message.contains("every container requires"), "{g:?}");
        // Version unknown: said, and the validator's state read from the file.
        let g = judge(&cfg(ON), F, seen(None), &[]);
        assert_eq!(g.status, Status::Ok, "{g:?}");
        assert!(g.message.contains("if containerd is 2.2 or later"), "{g:?}");
    }

    #[test]
    fn off_closed_or_too_old() {
        let off = "version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = true\n";
        let g = judge(&cfg(off), F, seen(Some((2, 2))), &[]);
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(g.message.contains("NRI off (set)"), "{g:?}");
        assert!(g.fix.unwrap().contains("disable = false"));
        // 1.7 is off unless turned on.
        let g = judge(&cfg("version = 2\n"), F, seen(Some((1, 7))), &[]);
        assert!(g.message.contains("NRI off (default)"), "{g:?}");
        let shut =
            "version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable_connections = true\n";
        let g = judge(&cfg(shut), F, seen(Some((2, 2))), &[]);
        assert!(g.message.contains("disable_connections = true"), "{g:?}");
        let g = judge(&cfg("version = 2\n"), F, seen(Some((1, 6))), &[]);
        assert!(g.message.contains("has no NRI"), "{g:?}");
        let mut s = seen(Some((2, 2)));
        s.socket = false;
        let g = judge(&cfg(ON), F, s, &[]);
        assert!(g.message.contains("missing"), "{g:?}");
    }

    #[test]
    fn reads_each_cri_handlers_base_spec_and_binary() {
        let text = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\nbase_runtime_spec = '/etc/containerd/b.json'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.accel.options]\nBinaryName = '/usr/bin/accel-container-runtime'\n";
        let c = cfg(text);
        assert_eq!(
            c.handlers,
            [
                Handler {
                    name: "accel".into(),
                    base_runtime_spec: None,
                    binary_name: Some("/usr/bin/accel-container-runtime".into()),
                },
                Handler {
                    name: "runc".into(),
                    base_runtime_spec: Some("/etc/containerd/b.json".into()),
                    binary_name: None,
                },
            ]
        );
        let v2 = cfg("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun]\nbase_runtime_spec = \"/x.json\"\n");
        assert_eq!(v2.handlers[0].base_runtime_spec.as_deref(), Some("/x.json"));
    }

    #[test]
    fn before_2_2_says_per_handler_whether_the_check_hook_closes_it() {
        let base = "/etc/containerd/accel-base-spec.json".to_string();
        let checked = vec![
            ("runc".to_string(), Hook::Checked(base.clone())),
            ("accel".to_string(), Hook::Shim),
        ];
        let g = judge(&cfg("version = 3\n"), F, seen(Some((2, 1))), &checked);
        assert_eq!(g.status, Status::Ok, "{g:?}");
        assert!(
            g.message.contains("\"runc\": fails closed through accel-nri-plugin check (base_runtime_spec \"/etc/containerd/accel-base-spec.json\")"),
            "{g:?}"
        );
        assert!(g.message.contains("\"accel\": the runtime itself"), "{g:?}");
        // One handler without it: a warning naming it, and the fix.
        let mut some = checked.clone();
        some.push((
            "crun".into(),
            Hook::Missing(Some(base.clone()), "no accel-nri-plugin check hook".into()),
        ));
        let g = judge(&cfg("version = 3\n"), F, seen(Some((2, 1))), &some);
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(
            g.message
                .contains("cannot fail closed on \"crun\": no accel-nri-plugin check hook"),
            "{g:?}"
        );
        assert!(g.fix.unwrap().contains("accel-ctk nri base-spec"));
        // None: the old warning, now with the hook as the fix.
        let none = vec![(
            "runc".to_string(),
            Hook::Missing(None, "no base_runtime_spec".into()),
        )];
        let g = judge(&cfg("version = 3\n"), F, seen(Some((2, 0))), &none);
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(g.message.contains("cannot fail closed"), "{g:?}");
        assert!(g
            .fix
            .unwrap()
            .starts_with("ctr oci spec | accel-ctk nri base-spec"));
        // 2.2: the validator's wording; the hook as the alternative in its fix.
        let g = judge(&cfg("version = 3\n"), F, seen(Some((2, 2))), &checked);
        assert!(g.message.contains("validator is off"), "{g:?}");
        assert!(g
            .fix
            .unwrap()
            .contains("without the validator, ctr oci spec | accel-ctk nri base-spec"));
    }

    #[test]
    fn crio_says_nri_and_whether_a_hooks_dir_has_the_check_hook() {
        let (nri, dirs) = crio_settings(&["[crio.nri]\nenable_nri = true\n"]).unwrap();
        assert_eq!(nri, Some(true));
        assert_eq!(dirs, [CRIO_HOOKS_DIR]);
        let (nri, dirs) = crio_settings(&[
            "[crio.nri]\nenable_nri = true\n",
            "[crio.nri]\nenable_nri = false\n[crio.runtime]\nhooks_dir = [\"/etc/containers/oci/hooks.d\"]\n",
        ])
        .unwrap();
        assert_eq!(nri, Some(false));
        assert_eq!(dirs, ["/etc/containers/oci/hooks.d"]);
        assert!(crio_settings(&["[crio"]).is_none());
        let example = include_str!("../../packaging/crio/accel-nri-check.json");
        assert!(is_check_hook_file(example));
        assert!(!is_check_hook_file(
            &example.replace("createRuntime", "poststop")
        ));
        assert!(!is_check_hook_file("{"));
        let g = crio_finding(
            Some(true),
            CRIO_CONF,
            Some("/usr/share/containers/oci/hooks.d/accel-nri-check.json"),
        );
        assert_eq!(g.status, Status::Ok, "{g:?}");
        assert!(
            g.message
                .contains("NRI on (set); fails closed through accel-nri-plugin check"),
            "{g:?}"
        );
        let g = crio_finding(None, CRIO_CONF, None);
        assert_eq!(g.status, Status::Warn, "{g:?}");
        assert!(g.message.contains("cannot fail closed"), "{g:?}");
        assert!(g.fix.unwrap().contains("crio-accel-nri-check.json"));
        let g = crio_finding(Some(false), CRIO_CONF, None);
        assert!(g.message.contains("NRI off (set)"), "{g:?}");
    }
}
