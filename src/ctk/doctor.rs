//! `accel-ctk doctor [--root DIR] [--runc PATH] [--json]`: runs every node check
//! (`crate::doctor`) and prints, per check, OK or the problem and the command that fixes it.
//! Exit status 1 when any check failed (warnings and info do not count), 0 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::doctor::{run_all, Ctx, Status};

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
    let findings = run_all(&ctx);
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
