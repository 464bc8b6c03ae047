//! `accel-ctk`: the node operator's tool. Each subcommand lives in `accel_container_runtime::ctk`;
//! this file only parses the command line and turns the result into an exit status.

use std::process::ExitCode;

use accel_container_runtime::ctk;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "accel-ctk",
    version,
    about = "Operate accel-container-runtime on a node"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Register the runtime with docker, containerd or CRI-O, or remove it again.
    Runtime {
        #[command(subcommand)]
        cmd: ctk::runtime::Cmd,
    },
    /// List every device each profile finds, with its topology.
    List(ctk::list::Args),
    /// Check the node end to end and say how to fix what is wrong.
    Doctor(ctk::doctor::Args),
    /// Write node labels (Node Feature Discovery feature file) for every profile's devices.
    Labels(ctk::labels::Args),
    /// Generate and list Container Device Interface specs.
    Cdi {
        #[command(subcommand)]
        cmd: ctk::cdi::Cmd,
    },
    /// Find and repair a kubelet device checkpoint that names devices this node no longer has.
    Checkpoint {
        #[command(subcommand)]
        cmd: ctk::checkpoint::Cmd,
    },
    /// Node setup: the /dev/char links systemd needs for every device node.
    System {
        #[command(subcommand)]
        cmd: ctk::system::Cmd,
    },
    /// accel-nri-plugin's fail-closed hook for engines without an NRI validator.
    Nri {
        #[command(subcommand)]
        cmd: ctk::nri::Cmd,
    },
    /// Which pod and container holds each device (replicas too), from kubelet's PodResources API.
    #[cfg(feature = "plugin")]
    Pods(ctk::pods::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Runtime { cmd } => ctk::runtime::run(cmd),
        Cmd::List(args) => ctk::list::run(args),
        Cmd::Doctor(args) => ctk::doctor::run(args),
        Cmd::Labels(args) => ctk::labels::run(args),
        Cmd::Cdi { cmd } => ctk::cdi::run(cmd),
        Cmd::Checkpoint { cmd } => ctk::checkpoint::run(cmd),
        Cmd::System { cmd } => ctk::system::run(cmd),
        Cmd::Nri { cmd } => ctk::nri::run(cmd),
        #[cfg(feature = "plugin")]
        Cmd::Pods(args) => ctk::pods::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("accel-ctk: {}", ctk::error_chain(&e));
            ExitCode::from(2)
        }
    }
}
