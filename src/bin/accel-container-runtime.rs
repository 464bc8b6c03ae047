//! `accel-container-runtime`: called by docker/containerd exactly as runc is.
//!
//! Only `create`/`run` read anything (the config and the bundle); every other command goes
//! straight to the low-level runtime. Errors: one line on stderr, the engine's `--log` gets a
//! runc-shaped line, exit status 1, config.json unchanged.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use accel_container_runtime::{argv, config, create, exec, logging, spec};

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let invoked_as = args
        .first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .unwrap_or(a.as_os_str())
                .to_os_string()
        })
        .unwrap_or_default();
    if invoked_as == spec::DOCKER_GPU_HOOK {
        // Reached only when runc ran docker's --gpus hook itself: this runtime was bypassed.
        eprintln!(
            "accel-container-runtime: `docker run --gpus` needs the accel runtime: add `--runtime accel` or make it the default (accel-ctk runtime configure --runtime docker --set-as-default)"
        );
        return ExitCode::FAILURE;
    }
    let inv = argv::scan(args.get(1..).unwrap_or_default());
    match run(&args, &inv) {
        Ok(never) => match never {},
        Err(msg) => {
            eprintln!("accel-container-runtime: {msg}");
            logging::engine_error(
                inv.log.as_deref(),
                inv.log_json,
                &format!("accel-container-runtime: {msg}"),
            );
            log::error!("{msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[OsString], inv: &argv::Invocation) -> Result<std::convert::Infallible, String> {
    let err_chain = |e: &dyn std::error::Error| {
        let mut msg = e.to_string();
        let mut src = e.source();
        while let Some(s) = src {
            let s_msg = s.to_string();
            if !msg.contains(&s_msg) {
                msg.push_str(": ");
                msg.push_str(&s_msg);
            }
            src = s.source();
        }
        msg
    };
    if inv.version {
        // stderr: containerd and docker parse stdout for runc's own `runc version` line.
        eprintln!(
            "accel-container-runtime version {}",
            env!("CARGO_PKG_VERSION")
        );
    }
    let cfg = config::Config::load().map_err(|e| err_chain(&e))?;
    if inv.creates() {
        logging::init(&cfg.log_file, cfg.log_level);
        for w in &cfg.warnings {
            log::warn!("{w}");
        }
        match create::create(inv, &cfg) {
            Ok(Some(out)) => log::info!(
                "create {}: {} nodes, {} mounts{}{}",
                inv.id.as_deref().unwrap_or("?"),
                out.plan.nodes.len() + out.cdi.nodes.len(),
                out.plan.mounts.len() + out.cdi.mounts.len(),
                if out.requests.is_empty() {
                    String::new()
                } else {
                    format!(" for {}", out.requests.join(" "))
                },
                if out.removed_docker_hook {
                    " (docker --gpus hook replaced)"
                } else {
                    ""
                },
            ),
            Ok(None) => log::debug!(
                "create {}: no device requested",
                inv.id.as_deref().unwrap_or("?")
            ),
            Err(e) => return Err(err_chain(&e)),
        }
    }
    let runtime = exec::resolve(&cfg.low_level_runtime).map_err(|e| e.to_string())?;
    Err(err_chain(&exec::exec(&runtime, args)))
}
