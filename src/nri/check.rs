//! `accel-nri-plugin check`: the plugin's fail-closed half on engines that cannot require a
//! plugin (containerd before 2.2 has no NRI default validator; CRI-O has none). Run by the
//! stock runc or crun as an OCI `createRuntime` hook (src/engine/checkhook.rs puts it in the
//! engine's base spec), it reads the container's final config.json and makes the create
//! path's decision on it ([`crate::create::decide`], as the plugin does): a container that
//! asked for a device whose node the engine did not add, or whose share's `dmem.max` is
//! missing, is refused with one line naming the plugin. It never edits the spec.
//!
//! A container that asks for nothing (every pause sandbox, most containers) passes whatever
//! else fails: one bounded read of config.json and the screen of its bytes
//! ([`crate::spec::screen`]), no parse.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::quote::quote;
use crate::spec::screen::{screen, Screen};

/// The OCI state on stdin is a few hundred bytes; its annotations are the spec's.
pub const MAX_STATE: u64 = 1 << 20;

const NOT_ADJUSTED: &str = "accel-nri-plugin did not adjust this container (down, not registered or too slow); refusing to start it without its devices";

/// What the runtime gives a hook on stdin (OCI runtime spec, runtime.md "State").
#[derive(serde::Deserialize)]
struct State {
    id: String,
    bundle: PathBuf,
}

/// The check of the container whose OCI state is on `state`, with the runtime's config at
/// `config`. `Err`: the one line to print (without the program's name).
pub fn run(state: impl Read, config: &Path) -> Result<(), String> {
    let bytes = crate::bounded::read(state, MAX_STATE)
        .map_err(|e| format!("cannot read the OCI state on stdin: {e}"))?;
    let state: State = serde_json::from_slice(&bytes)
        .map_err(|e| format!("the OCI state on stdin is not one: {e}"))?;
    if !state.bundle.is_absolute() {
        return Err(format!(
            "container {}: the state's bundle is not an absolute path: {}",
            quote(&state.id),
            quote(&state.bundle.to_string_lossy())
        ));
    }
    check(&state.bundle.join("config.json"), config)
        .map_err(|msg| format!("container {}: {msg}", quote(&state.id)))
}

/// The check of one config.json.
pub fn check(config_json: &Path, config: &Path) -> Result<(), String> {
    let data = crate::spec::read_bytes(config_json).map_err(|e| e.to_string())?;
    let quick = match crate::config::Quick::read(config) {
        Ok(q) => q,
        // Without the config no profile is known but the built-ins: a spec that names none
        // of theirs asks for nothing, and a broken config must not stop it.
        Err(e) => {
            let builtins = crate::profile::BUILTIN.iter().map(|b| b.text);
            return match screen(&data, builtins) {
                Screen::Nothing => Ok(()),
                Screen::Maybe => Err(e.to_string()),
            };
        }
    };
    let limits = crate::limits::screen(&quick.dmem_grants_dir, &quick.cgroup_root, &data).is_some();
    let nothing = !quick.accept_container_devices_as_mounts
        && screen(&data, quick.texts()) == Screen::Nothing;
    if nothing && !limits {
        return Ok(());
    }
    let (doc, mut view) = crate::spec::parse_file(config_json, &data).map_err(|e| e.to_string())?;
    let cfg = quick.into_create_config(None).map_err(|e| e.to_string())?;
    // As the plugin sees the container: NRI shows no capabilities (src/nri/adjust.rs).
    view.privileged = false;
    let decision = crate::create::decide(&cfg, &view, None).map_err(|e| e.to_string())?;
    if let Some(out) = decision.outcome(&cfg, false).map_err(|e| e.to_string())? {
        let present = devices(&doc);
        let nodes = out
            .plan
            .nodes
            .iter()
            .chain(out.cdi.nodes.iter().map(|n| &n.node));
        for n in nodes {
            let there = present
                .iter()
                .any(|(p, t, major, minor)| n.is(p, t, *major, *minor));
            if !there {
                let path = n.path.to_string_lossy();
                let asked = if out.requests.is_empty() {
                    "its CDI annotations".to_string()
                } else {
                    out.requests
                        .iter()
                        .map(|r| match r.split_once('=') {
                            Some((var, value)) => format!("{var}={}", quote(value)),
                            None => quote(r),
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                return Err(format!(
                    "{asked} asked for {path}, which the engine did not add: {NOT_ADJUSTED}"
                ));
            }
        }
    }
    if limits {
        dmem(&cfg, &doc, &view)?;
    }
    Ok(())
}

/// A share's kernel limit: what [`crate::dmem::unified_on_node`] says this container
/// carries (its pod's grants, its device nodes), each key present in the spec's
/// `linux.resources.unified`.
fn dmem(cfg: &crate::config::Config, doc: &Value, view: &crate::spec::View) -> Result<(), String> {
    let Some(pod) = crate::dmem::pod_uid(&view.annotations) else {
        return Ok(());
    };
    let rdevs = crate::spec::char_device_numbers(doc);
    let (entries, _) =
        crate::dmem::unified_on_node(&cfg.dmem_grants_dir, &cfg.cgroup_root, pod, &rdevs);
    let unified = doc.pointer("/linux/resources/unified");
    for (key, _) in entries.unwrap_or_default() {
        if unified.and_then(|u| u.get(&key)).is_none() {
            return Err(format!(
                "its pod {} holds a share whose {key} is missing from linux.resources.unified: {NOT_ADJUSTED}",
                quote(pod)
            ));
        }
    }
    Ok(())
}

/// `linux.devices` as (path, type, major, minor).
fn devices(doc: &Value) -> Vec<(String, String, Option<u64>, Option<u64>)> {
    let s = |d: &Value, k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    doc.pointer("/linux/devices")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|d| {
                    let n = |k: &str| d.get(k).and_then(Value::as_u64);
                    (s(d, "path"), s(d, "type"), n("major"), n("minor"))
                })
                .collect()
        })
        .unwrap_or_default()
}
