//! `accel-ctk runtime configure|unconfigure`: register the runtime with docker, containerd or
//! CRI-O, or take it out again. The flag names are a contract for install scripts and
//! packages. The file work lives in [`crate::engine`]; this module turns flags into a
//! [`Registration`], prints what happened (stderr) or the resulting file (`--dry-run`, stdout),
//! and says which command restarts the engine: it never restarts one itself.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::engine::{self, Action, Host, Kind, Outcome, Registration};

/// The runtime binary's file name, looked up beside `accel-ctk` by default.
pub const RUNTIME_BINARY: &str = "accel-container-runtime";

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Register accel-container-runtime in the engine's configuration (backup kept beside it).
    Configure(Args),
    /// Remove what `configure` added; a file not edited since gets its previous bytes back.
    Unconfigure(Args),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    Docker,
    Containerd,
    Crio,
}

impl From<Engine> for Kind {
    fn from(e: Engine) -> Kind {
        match e {
            Engine::Docker => Kind::Docker,
            Engine::Containerd => Kind::Containerd,
            Engine::Crio => Kind::Crio,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The engine to register with.
    #[arg(long, value_enum)]
    pub runtime: Engine,
    /// The file to edit [default: /etc/docker/daemon.json, /etc/containerd/config.toml,
    /// /etc/crio/crio.conf.d/99-<runtime-name>.conf].
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Also make it the engine's default runtime (unconfigure puts the previous default back
    /// whatever is given here).
    #[arg(long)]
    pub set_as_default: bool,
    /// The name the engine knows the runtime by (`docker run --runtime <name>`).
    #[arg(long, value_name = "NAME", default_value = "accel")]
    pub runtime_name: String,
    /// The runtime binary the engine runs [default: accel-container-runtime beside accel-ctk].
    #[arg(long, value_name = "PATH")]
    pub runtime_path: Option<PathBuf>,
    /// Print the resulting file on stdout and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Configure(args) => configure(&args),
        Cmd::Unconfigure(args) => unconfigure(&args),
    }
}

fn host(kind: Kind) -> Host {
    Host {
        containerd_major: if kind == Kind::Containerd {
            engine::containerd::installed_major()
        } else {
            None
        },
    }
}

/// `--runtime-path`, or `accel-container-runtime` in the directory `accel-ctk` runs from.
fn runtime_path(args: &Args) -> anyhow::Result<String> {
    let path = match &args.runtime_path {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("finding accel-ctk's own path for the default --runtime-path")?
            .with_file_name(RUNTIME_BINARY),
    };
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("--runtime-path {}: not UTF-8", path.display()))
}

fn configure(args: &Args) -> anyhow::Result<ExitCode> {
    let kind = Kind::from(args.runtime);
    let path = args
        .config
        .clone()
        .unwrap_or_else(|| kind.default_config(&args.runtime_name));
    let reg = Registration {
        name: args.runtime_name.clone(),
        path: runtime_path(args)?,
        set_as_default: args.set_as_default,
    };
    let out = engine::configure(kind, &path, &reg, &host(kind), args.dry_run)?;
    report(
        kind,
        &out,
        &format!("runtime `{}` ({})", reg.name, reg.path),
    );
    Ok(ExitCode::SUCCESS)
}

fn unconfigure(args: &Args) -> anyhow::Result<ExitCode> {
    let kind = Kind::from(args.runtime);
    let path = args
        .config
        .clone()
        .unwrap_or_else(|| kind.default_config(&args.runtime_name));
    let out = engine::unconfigure(kind, &path, &args.runtime_name, &host(kind), args.dry_run)?;
    report(kind, &out, &format!("runtime `{}`", args.runtime_name));
    Ok(ExitCode::SUCCESS)
}

fn report(kind: Kind, out: &Outcome, what: &str) {
    let file = out.path.display();
    let would = if out.dry_run { "would be " } else { "" };
    let msg = match &out.action {
        Action::Unchanged => format!("{file}: {what} already registered as asked; nothing to do"),
        Action::NotRegistered => format!("{file}: {what} is not registered; nothing to do"),
        Action::Missing => format!("{file}: no such file; nothing to do"),
        Action::Written { backup: Some(b) } => format!(
            "{file}: {what} {would}registered (previous file {would}kept as {})",
            b.display()
        ),
        Action::Written { backup: None } => format!("{file}: {what} {would}registered"),
        Action::Restored => format!("{file}: {would}restored as it was before configure"),
        Action::Edited => format!(
            "{file}: {what} {would}removed (the file changed since configure, so only its entries {would}taken out)"
        ),
        Action::Removed => format!("{file}: {would}removed (configure had created it)"),
    };
    eprintln!("accel-ctk: {msg}");
    if out.dry_run {
        if let Some(content) = &out.content {
            print!("{content}");
        }
    } else if out.needs_restart() {
        eprintln!(
            "accel-ctk: {} reads this at start; to apply: {}",
            kind.name(),
            kind.restart_command()
        );
    }
}
