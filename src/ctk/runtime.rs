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
    Configure(ConfigureArgs),
    /// Remove what `configure` added; a file not edited since gets its previous bytes back, and
    /// a default runtime configure set goes back to the previous one.
    Unconfigure(UnconfigureArgs),
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

/// Which engine file, and which runtime name in it.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The engine whose configuration is edited.
    #[arg(long, value_enum)]
    pub runtime: Engine,
    /// The file to edit [default: /etc/docker/daemon.json, /etc/containerd/config.toml,
    /// /etc/crio/crio.conf.d/99-RUNTIME-NAME.conf]. The directory of a file named here must
    /// exist (a typo is an error, not a new tree) unless --create-parents; the directory of a
    /// default path is created when missing.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Create the missing directories of --config's path.
    #[arg(long)]
    pub create_parents: bool,
    /// The name the engine knows the runtime by (`docker run --runtime <name>`, the
    /// Kubernetes RuntimeClass handler).
    #[arg(long, value_name = "NAME", default_value = "accel")]
    pub runtime_name: String,
    /// Print the resulting file on stdout and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl Target {
    /// The file to edit; a named one whose directory is missing is an error unless
    /// `--create-parents`.
    fn path(&self) -> anyhow::Result<PathBuf> {
        let Some(path) = &self.config else {
            return Ok(Kind::from(self.runtime).default_config(&self.runtime_name));
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !self.create_parents && !dir.is_dir() {
                anyhow::bail!(
                    "--config {}: directory {} does not exist (pass --create-parents to create it)",
                    path.display(),
                    dir.display()
                );
            }
        }
        Ok(path.clone())
    }
}

#[derive(Debug, clap::Args)]
pub struct ConfigureArgs {
    #[command(flatten)]
    pub target: Target,
    /// Also make it the engine's default runtime.
    #[arg(long)]
    pub set_as_default: bool,
    /// The runtime binary the engine runs [default: accel-container-runtime beside accel-ctk].
    #[arg(long, value_name = "PATH")]
    pub runtime_path: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct UnconfigureArgs {
    #[command(flatten)]
    pub target: Target,
    // Accepted so that scripts can undo with configure's own arguments; what to undo is read
    // from the file and its backup, not from these.
    #[arg(long, hide = true)]
    pub set_as_default: bool,
    #[arg(long, hide = true, value_name = "PATH")]
    pub runtime_path: Option<PathBuf>,
}

pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    super::warn_config();
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
fn runtime_path(args: &ConfigureArgs) -> anyhow::Result<String> {
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

fn configure(args: &ConfigureArgs) -> anyhow::Result<ExitCode> {
    let t = &args.target;
    let kind = Kind::from(t.runtime);
    let reg = Registration {
        name: t.runtime_name.clone(),
        path: runtime_path(args)?,
        set_as_default: args.set_as_default,
    };
    let out = engine::configure(kind, &t.path()?, &reg, &host(kind), t.dry_run)?;
    report(
        kind,
        &out,
        &format!("runtime `{}` ({})", reg.name, reg.path),
    );
    Ok(ExitCode::SUCCESS)
}

fn unconfigure(args: &UnconfigureArgs) -> anyhow::Result<ExitCode> {
    let t = &args.target;
    let kind = Kind::from(t.runtime);
    let out = engine::unconfigure(kind, &t.path()?, &t.runtime_name, &host(kind), t.dry_run)?;
    report(kind, &out, &format!("runtime `{}`", t.runtime_name));
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
