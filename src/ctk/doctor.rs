//! `accel-ctk doctor` (not written yet).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`doctor` is not available in this build yet")
}
