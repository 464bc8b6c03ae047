//! `accel-ctk doctor [--root DIR] [--runc PATH] [--json]`: runs every node check
//! (`crate::doctor`) and prints, per check, OK or the problem and the command that fixes it.
//! Exit status 1 when any check failed (warnings and info do not count), 0 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::doctor::{run_all, Ctx, Finding, Status};
use crate::profile::{Profile, ProfileError};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Check this directory tree instead of `/` (config, driver files, engine configs,
    /// kubelet state and binaries are all read under it).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Low-level runtime binary to run for `--version` (default: the config's
    /// `low-level-runtime` looked up under the root).
    #[arg(long)]
    pub runc: Option<PathBuf>,
    /// Print the findings as a JSON array of {check, status, message, fix}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !args.root.is_absolute() {
        anyhow::bail!("--root {} must be an absolute path", args.root.display());
    }
    // A report over a tree that is not there would read as "nothing installed".
    match std::fs::metadata(&args.root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => anyhow::bail!("--root {}: not a directory", args.root.display()),
        Err(e) => anyhow::bail!("--root {}: {e}", args.root.display()),
    }
    let mut ctx = Ctx::host(args.root);
    ctx.runc = args.runc;
    let mut findings = run_all(&ctx);
    findings.extend(daemons(&ctx));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&findings)?);
    } else {
        for f in &findings {
            let tag = match f.status {
                Status::Info => "INFO",
                Status::Ok => " OK ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            println!("[{tag}] {}: {}", f.check, f.message);
            match (&f.fix, f.status) {
                (Some(fix), Status::Warn | Status::Fail) => println!("       fix: {fix}"),
                (Some(cmd), Status::Info) => println!("       to change: {cmd}"),
                _ => {}
            }
        }
        let count = |s| findings.iter().filter(|f| f.status == s).count();
        println!(
            "\n{} problem(s), {} warning(s)",
            count(Status::Fail),
            count(Status::Warn)
        );
    }
    Ok(if findings.iter().any(|f| f.status == Status::Fail) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// What the node checks (`crate::doctor`, a floor below the daemons) cannot judge: each
/// profile's tables only the daemons read (`[sharing]`, `[health]`, and `[metrics]` where this
/// accel-ctk has the exporter's code), which a create never parses and a daemon refuses to
/// start on, and each device's health by the engine's one-shot signals (`accel-ctk list`'s).
fn daemons(ctx: &Ctx) -> Vec<Finding> {
    let (loaded, _) = crate::doctor::load_config(ctx);
    let Ok(config) = loaded else {
        // The config check has said why; nothing more to judge.
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in &config.profiles {
        out.extend(tables(p));
    }
    for row in crate::ctk::list::collect(&config).devices {
        if let Some(why) = &row.health_reason {
            out.push(Finding {
                check: "health".into(),
                status: Status::Fail,
                message: format!(
                    "{} device {} ({}): {}: {}",
                    row.vendor,
                    row.index,
                    row.name,
                    crate::ctk::list::unhealthy_since(&row),
                    crate::quote::line(why)
                ),
                fix: Some(
                    "see docs/health.md: a device comes back once its signal clears (a reset, a driver reload)"
                        .into(),
                ),
            });
        }
    }
    if !out.iter().any(|f| f.check == "health") {
        out.push(Finding {
            check: "health".into(),
            status: Status::Ok,
            message: "no device unhealthy by its nodes or its PCI function (the daemons also \
                      read counters, NVML and vendor tools)"
                .into(),
            fix: None,
        });
    }
    out
}

/// One finding per daemons' table of `p` that does not read, one per key none knows.
fn tables(p: &Profile) -> Vec<Finding> {
    type Read = fn(&Profile) -> Result<Vec<String>, ProfileError>;
    let wings: &[(&str, Read)] = &[
        ("sharing", |p| {
            crate::kubelet::sharing::Sharing::of(p).map(|(_, w)| w)
        }),
        ("health", |p| {
            crate::health::wing::HealthWing::of(p).map(|(_, w)| w)
        }),
        #[cfg(feature = "exporter")]
        ("metrics", |p| {
            crate::exporter::sources::profile::Metrics::of(p).map(|(_, w)| w)
        }),
    ];
    let mut out = Vec::new();
    for &(name, read) in wings {
        if !p.wings.names().any(|n| n == name) {
            continue;
        }
        let check = format!("profile {} [{name}]", p.name);
        match read(p) {
            Ok(warnings) if warnings.is_empty() => out.push(Finding {
                check,
                status: Status::Ok,
                message: "reads".into(),
                fix: None,
            }),
            Ok(warnings) => out.extend(warnings.into_iter().map(|w| Finding {
                check: check.clone(),
                status: Status::Warn,
                message: w,
                fix: None,
            })),
            Err(e) => out.push(Finding {
                check,
                status: Status::Fail,
                message: format!("{e}; the daemons that read it refuse to start"),
                fix: Some(format!("correct [{name}] of profile {}", p.name)),
            }),
        }
    }
    out
}
