//! `accel-ctk cdi` (not written yet).

use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {}

pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    match cmd {}
}
