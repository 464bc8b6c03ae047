//! `accel-ctk system create-dev-char-symlinks [--dev-dir DIR] [--dry-run]`: the
//! `/dev/char/MAJOR:MINOR` link for every node of every profile (src/devchar.rs says why
//! systemd needs them). The runtime makes the links of the nodes it injects on each create;
//! this is for boot and after a driver load (packaging/systemd/, packaging/udev/), so that
//! containers other engines start with `--device` keep their devices across `systemctl
//! daemon-reload` too. Exit status 1 when any link is wrong or could not be made.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::devchar::{self, Action, LinkState};

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Create the missing /dev/char/MAJOR:MINOR link of every node of every profile.
    CreateDevCharSymlinks(Args),
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The host's /dev (default: config.toml's `host-dev-dir`, /dev).
    #[arg(long)]
    pub dev_dir: Option<PathBuf>,
    /// Only say what is missing or wrong; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    let Cmd::CreateDevCharSymlinks(args) = cmd;
    let config = super::load_config()?;
    let dev_dir = args.dev_dir.unwrap_or_else(|| config.host_dev_dir.clone());
    let mut failed = false;
    for profile in &config.profiles {
        let nodes = match devchar::profile_nodes(profile) {
            Ok(n) => n,
            Err(e) => {
                // A profile whose driver is not on this node has nothing to link.
                println!("{}: skipped: {e}", profile.name);
                continue;
            }
        };
        for node in nodes {
            let shown = node.display();
            let result = if args.dry_run {
                devchar::state(&dev_dir, &node).map(|s| match s {
                    LinkState::Present => "ok".to_string(),
                    LinkState::Missing => "missing".to_string(),
                    LinkState::Dangling { target } => {
                        format!("dangling (-> {})", target.display())
                    }
                    LinkState::Wrong { found } => {
                        failed = true;
                        format!("WRONG: is {found}")
                    }
                })
            } else {
                devchar::ensure(&dev_dir, &node).map(|a| match a {
                    Action::AlreadyPresent => "ok".to_string(),
                    Action::Created => "created".to_string(),
                    Action::ReplacedDangling { old } => {
                        format!("replaced dangling link (-> {})", old.display())
                    }
                })
            };
            match result {
                Ok(what) => println!("{}: {shown}: {what}", profile.name),
                Err(e) => {
                    failed = true;
                    println!("{}: {shown}: ERROR: {e}", profile.name);
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
