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
            let msg = one_line(&msg);
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

/// Engines show the runtime's stderr as one message: TOML errors come as a multi-line
/// snippet (`4 | key = "value"` and a caret line). Keep the quoted source line (it names the
/// key), drop the caret line, join the rest.
fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter_map(|l| {
            let rest = l.trim_start_matches(|c: char| c.is_ascii_digit());
            match rest.trim_start().strip_prefix('|') {
                Some(src) if rest.len() < l.len() && !src.trim().is_empty() => {
                    Some(format!("`{}`", src.trim()))
                }
                Some(_) => None,
                None if l.is_empty() => None,
                None => Some(l.to_string()),
            }
        })
        .collect::<Vec<_>>()
        .join(": ")
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
    // Only create/run need the profiles; everything else reads one key and execs, so a
    // `state` or `delete` costs little more than runc itself (benches/BENCHMARKS.md).
    let low_level_runtime = if inv.creates() {
        let quick = config::Quick::load().map_err(|e| err_chain(&e))?;
        if nothing_requested(inv, &quick) {
            quick.low_level_runtime
        } else {
            let cfg = config::Config::load().map_err(|e| err_chain(&e))?;
            create(inv, &cfg).map_err(|e| err_chain(&e))?;
            cfg.low_level_runtime
        }
    } else {
        config::Config::low_level_runtime().map_err(|e| err_chain(&e))?
    };
    let runtime = exec::resolve(&low_level_runtime).map_err(|e| e.to_string())?;
    Err(err_chain(&exec::exec(&runtime, args)))
}

/// True when the bundle's spec certainly asks for nothing: no variable any profile could
/// claim, no device-list mounts accepted, no docker `--gpus` hook to replace. Then neither
/// the profiles nor config.json are parsed (each costs more than the rest of a pass-through,
/// benches/BENCHMARKS.md) and config.json is never written.
///
/// The spec is screened as bytes: every `"NAME=` in it (env entries, as engines write them:
/// names are never escaped) is offered to [`config::Quick::may_claim`]. Any doubt (a name
/// some profile mentions, the hook's name anywhere, a file that does not read or is not a
/// JSON object) goes down the full create path, which decides and reports errors. A spec
/// that is a JSON object but has sections of the wrong type, and asks for nothing, goes to
/// the low-level runtime as it is: runc judges its own spec.
fn nothing_requested(inv: &argv::Invocation, quick: &config::Quick) -> bool {
    if quick.accept_container_devices_as_mounts {
        return false;
    }
    let bundle = inv.bundle.as_deref().unwrap_or(Path::new("."));
    let Some(data) = read_spec_bytes(&bundle.join("config.json")) else {
        return false;
    };
    // Not JSON, or not an object: the full path names the file and the error. (Checked
    // without building the document: no allocation per value.)
    let first = data.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') || serde_json::from_slice::<serde::de::IgnoredAny>(&data).is_err() {
        return false;
    }
    let hook = spec::DOCKER_GPU_HOOK.as_bytes();
    if data.windows(hook.len()).any(|w| w == hook) {
        return false;
    }
    let is_name = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    let mut rest = &data[..];
    while let Some(q) = rest.iter().position(|&b| b == b'"') {
        rest = &rest[q + 1..];
        let len = rest.iter().take_while(|b| is_name(b)).count();
        if rest.get(len) == Some(&b'=') {
            let name = std::str::from_utf8(&rest[..len]).unwrap_or_default();
            if quick.may_claim(name) {
                return false;
            }
        }
    }
    true
}

/// config.json's bytes as `spec::read` would accept them (regular file, no symlink, never
/// blocking on a FIFO, at most `spec::MAX_SIZE`); `None` otherwise.
fn read_spec_bytes(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > spec::MAX_SIZE {
        return None;
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut data).ok()?;
    Some(data)
}

/// The `create`/`run` edit, with its one log line.
fn create(inv: &argv::Invocation, cfg: &config::Config) -> Result<(), create::CreateError> {
    logging::init(&cfg.log_file, cfg.log_level);
    for w in &cfg.warnings {
        log::warn!("{w}");
    }
    match create::create(inv, cfg)? {
        Some(out) => log::info!(
            "create {}: {} nodes, {} mounts{}{}",
            inv.id.as_deref().unwrap_or("?"),
            out.plan.nodes.len(),
            out.plan.mounts.len(),
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
        None => log::debug!(
            "create {}: no device requested",
            inv.id.as_deref().unwrap_or("?")
        ),
    }
    Ok(())
}
