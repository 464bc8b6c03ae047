//! `accel-ctk checkpoint check [--fix] [--restart-kubelet] [--checkpoint PATH] [--resource R]...`
//!
//! Compares kubelet's device checkpoint with the devices this node has and, with `--fix`,
//! removes its stale entries, keeping the resources kubelet knows and writing kubelet's own
//! checksum (a pre-1.20 file is moved aside). Every step is one JSON line on stdout
//! (`{"time","level","step","msg",...}`) so `journalctl -u accel-ctk-checkpoint` reads as a
//! record of what was found and done. Exit status: 0 consistent or repaired, 1 stale (or
//! undecidable) and not repaired, 2 error (the file is then untouched).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::SystemTime;

use anyhow::Context as _;
use serde_json::{json, Value};

use crate::checkpoint::{self, compare, expected_ids, move_aside, Checkpoint, Verdict};

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Compare the checkpoint's device IDs with this node's devices; repair with --fix.
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// On a mismatch, remove the stale entries (the old file kept as a timestamped backup).
    #[arg(long)]
    pub fix: bool,
    /// After a fix, run `systemctl restart kubelet`.
    #[arg(long, requires = "fix")]
    pub restart_kubelet: bool,
    /// The checkpoint file [default: kubelet's, which may be absent on a node without pods
    /// using devices; a file named here must exist].
    #[arg(long, value_name = "PATH")]
    pub checkpoint: Option<PathBuf>,
    /// Only these resources (default: every profile's `resource-name`).
    #[arg(long = "resource", value_name = "NAME")]
    pub resources: Vec<String>,
}

pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Check(args) => check(args),
    }
}

fn log(level: &str, step: &str, msg: &str, fields: Value) {
    let mut line = json!({
        "time": humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        "level": level,
        "step": step,
        "msg": msg,
    });
    if let (Some(obj), Value::Object(extra)) = (line.as_object_mut(), fields) {
        obj.extend(extra);
    }
    println!("{line}");
}

fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let config = super::load_config()?;
    let named = args.checkpoint.is_some();
    let path = &args
        .checkpoint
        .clone()
        .unwrap_or_else(|| PathBuf::from(checkpoint::DEFAULT_PATH));
    if named && !path.exists() {
        anyhow::bail!("--checkpoint {}: no such file", path.display());
    }
    if !path.exists() {
        log(
            "info",
            "verdict",
            "no checkpoint: nothing to check",
            json!({"checkpoint": path, "verdict": "absent"}),
        );
        return Ok(ExitCode::SUCCESS);
    }
    let cp = Checkpoint::load(path)?;
    for p in &config.profiles {
        if let (Some(resource), None) = (&p.resource_name, &p.device_plugin_id) {
            if args.resources.is_empty() || args.resources.contains(resource) {
                log(
                    "warning",
                    "found",
                    "profile has no device-plugin-id: its device IDs are unknown, resource not checked",
                    json!({"resource": resource, "vendor": p.name}),
                );
            }
        }
    }
    let expected = expected_ids(&config.profiles, &args.resources)?;
    for (resource, (vendor, ids)) in &expected {
        log(
            "info",
            "found",
            &format!(
                "{} {vendor} device ID(s) listed for this node's devices",
                ids.len()
            ),
            json!({"resource": resource, "vendor": vendor, "ids": ids}),
        );
    }
    let found: std::collections::BTreeMap<_, _> =
        expected.into_iter().map(|(r, (_, ids))| (r, ids)).collect();
    let reports = compare(&cp, &found);
    let mut stale = false;
    let mut undecided = false;
    for r in &reports {
        log(
            "info",
            "registered",
            &format!("{} ID(s) registered in the checkpoint", r.registered.len()),
            json!({"resource": r.resource, "ids": r.registered, "unknown": r.unknown_registered}),
        );
        for a in &r.allocated {
            log(
                "info",
                "allocated",
                &format!(
                    "pod {} container {} holds {:?}",
                    a.pod_uid, a.container, a.ids
                ),
                json!({"resource": r.resource, "pod_uid": a.pod_uid, "container": a.container, "ids": a.ids}),
            );
        }
        let (level, msg) = match r.verdict {
            Verdict::Consistent => ("info", "consistent".to_string()),
            Verdict::Stale => {
                stale = true;
                (
                    "warning",
                    format!(
                        "stale: the checkpoint names devices this node does not have: {}",
                        r.unknown_registered
                            .iter()
                            .chain(&r.unknown_allocated)
                            .map(String::as_str)
                            .collect::<std::collections::BTreeSet<_>>()
                            .into_iter()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            }
            Verdict::NoDevicesFound => {
                undecided = true;
                (
                    "warning",
                    "the checkpoint names devices but none were found: is the driver loaded? \
                     Nothing changed"
                        .to_string(),
                )
            }
        };
        log(
            level,
            "verdict",
            &msg,
            json!({"resource": r.resource, "verdict": r.verdict}),
        );
    }
    if !stale {
        log(
            "info",
            "verdict",
            if undecided {
                "checkpoint not checked for every resource; unchanged"
            } else {
                "checkpoint is consistent with this node; unchanged"
            },
            json!({"checkpoint": path, "verdict": if undecided { "undecided" } else { "consistent" }}),
        );
        return Ok(if undecided {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    if !args.fix {
        log(
            "warning",
            "verdict",
            &format!(
                "stale checkpoint left in place; repair with `{}`",
                checkpoint::repair_advice(Path::new("/"), None)
            ),
            json!({"checkpoint": path, "verdict": "stale"}),
        );
        return Ok(ExitCode::from(1));
    }
    // Current kubelets: drop only the stale entries and write kubelet's checksum, so the
    // resource stays a device-plugin resource whichever of kubelet and the plugin starts
    // first. The pre-1.20 list form has another checksum: that file is moved aside.
    let raw = crate::bounded::read_file(path, checkpoint::MAX_SIZE)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let backup = match checkpoint::repair(&raw, path, &found) {
        Ok(repaired) => {
            let backup = checkpoint::write_repaired(path, &raw, &repaired, SystemTime::now())?;
            log(
                "info",
                "fix",
                "stale entries removed; registered resources kept; kubelet's checksum written",
                json!({"checkpoint": path, "backup": backup, "verdict": "repaired",
                       "removed": repaired.removed, "unregistered": repaired.unregistered,
                       "checksum": repaired.checksum}),
            );
            backup
        }
        Err(checkpoint::CheckpointError::LegacyForm { .. }) => {
            let backup = move_aside(path, SystemTime::now())?;
            log(
                "info",
                "fix",
                "stale pre-1.20 checkpoint moved aside; kubelet rebuilds it from the device plugins",
                json!({"checkpoint": path, "backup": backup, "verdict": "repaired"}),
            );
            backup
        }
        Err(e) => return Err(e.into()),
    };
    if args.restart_kubelet {
        let status = Command::new("systemctl")
            .args(["restart", "kubelet"])
            .status()
            .context("cannot run `systemctl restart kubelet`")?;
        if !status.success() {
            anyhow::bail!(
                "`systemctl restart kubelet` failed ({status}); the old checkpoint is kept at {}",
                backup.display()
            );
        }
        log(
            "info",
            "restart",
            "kubelet restarted",
            json!({"command": "systemctl restart kubelet"}),
        );
    }
    Ok(ExitCode::SUCCESS)
}
