//! `accel-nri-plugin`: an NRI plugin for containerd 2 and CRI-O that gives each container the
//! devices it asks for, with the runtime's own decision (src/nri/), so the node keeps its
//! stock runtime. Built only with the `plugin` feature.

use std::path::PathBuf;
use std::process::ExitCode;

use accel_container_runtime::kubelet::daemon;
use accel_container_runtime::nri::check;
use accel_container_runtime::nri::session::{run, Options};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "accel-nri-plugin",
    version,
    about = "NRI plugin: accelerator devices for containers without a runtime shim"
)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// The runtime's NRI socket.
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    socket: PathBuf,
    /// The plugin's name, as the runtime lists it (and as `required-plugins` names it).
    #[arg(long, default_value = "accel", value_parser = parse_name)]
    name: String,
    /// The plugin's index: two digits, its place among the runtime's plugins.
    #[arg(long, default_value = "10", value_parser = parse_index)]
    index: String,
    /// Where the host's / is mounted in this container (`/host` in the DaemonSet): profiles
    /// are read under it, and the engine gets the host's paths.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// As an OCI createRuntime hook (state on stdin): refuse a container that asked for a
    /// device the engine did not add (this plugin down, not registered or too slow).
    Check,
}

fn parse_name(s: &str) -> Result<String, String> {
    if !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        Ok(s.to_string())
    } else {
        Err("a plugin name is letters, digits, '-', '_' and '.' (at most 64)".into())
    }
}

fn parse_index(s: &str) -> Result<String, String> {
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s.to_string())
    } else {
        Err("an index is two digits (00-99)".into())
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Cmd::Check) = args.cmd {
        let config = accel_container_runtime::config::path();
        return match check::run(std::io::stdin().lock(), &config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(msg) => {
                eprintln!(
                    "{}",
                    accel_container_runtime::quote::line(&format!("accel-nri-plugin check: {msg}"))
                );
                ExitCode::FAILURE
            }
        };
    }
    daemon::main("accel-nri-plugin", || {
        let opts = Options {
            socket: args.socket,
            name: args.name,
            index: args.index,
            config: accel_container_runtime::config::path(),
            host_root: daemon::host_root(args.host_root)?,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let stop = daemon::stop_on_signals()?;
            run(opts, stop).await
        })
    })
}
