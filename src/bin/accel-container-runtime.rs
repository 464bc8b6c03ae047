//! `accel-container-runtime`: called by docker/containerd exactly as runc is.
//!
//! Only `create`/`run` read anything (the config and the bundle); every other command goes
//! straight to the low-level runtime. Errors: one line on stderr, the engine's `--log` gets a
//! runc-shaped line, exit status 1, config.json unchanged.
//!
//! The C `main` (`no_main`), not std's: std's start-up sets SIGPIPE to ignored before
//! `main`, and an ignored signal stays ignored across `exec`, so runc would start with a
//! disposition the engine did not give it (and the engine's own could not be restored).
//! Here the signal dispositions runc gets are exactly the engine's. Arguments come from
//! `main`'s own argv: `std::env::args_os` is empty without std's start-up on musl.
// `cargo test --all-targets` builds this file with libtest's main; the binary is tested as a
// binary by tests/hostile.rs and tests/e2e_*.rs.
#![cfg_attr(not(test), no_main)]
#![cfg_attr(test, allow(dead_code))]

use std::ffi::OsString;
use std::path::Path;

use accel_container_runtime::{argv, config, create, exec, logging, spec};

/// The C entry point (see the module doc). Returns only on failure: exit status 1.
///
/// # Safety
/// Called by the C runtime only, with its argc and argv.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    use std::os::unix::ffi::OsStrExt;
    let args = (0..usize::try_from(argc).unwrap_or(0))
        .map(|i| {
            // SAFETY: the C runtime passes argc valid, NUL-terminated strings in argv.
            let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) };
            std::ffi::OsStr::from_bytes(arg.to_bytes()).to_os_string()
        })
        .collect();
    shim(args)
}

fn shim(args: Vec<OsString>) -> libc::c_int {
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
        return 1;
    }
    let inv = argv::scan(args.get(1..).unwrap_or_default());
    match run(&args, &inv) {
        Ok(never) => match never {},
        Err(msg) => {
            let msg = accel_container_runtime::quote::line(&one_line(&msg));
            eprintln!("accel-container-runtime: {msg}");
            logging::engine_error(
                inv.log.as_deref(),
                inv.log_json,
                &format!("accel-container-runtime: {msg}"),
            );
            // Named like the info line of a create, so both are found by the container's id.
            log::error!(
                "{} {}: {msg}",
                inv.command.as_deref().unwrap_or("?"),
                inv.id.as_deref().unwrap_or("?")
            );
            1
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
        // The runtime's output first and unchanged (containerd and docker parse its
        // `runc version` line on stdout; runc's own tests read stdout and stderr together),
        // then ours on stderr. The runtime prints its version and makes nothing whatever
        // else argv holds, so nothing is edited.
        let runtime = exec::resolve(&pass_through_runtime()).map_err(|e| e.to_string())?;
        let code = exec::run_and_wait(&runtime, args).map_err(|e| err_chain(&e))?;
        eprintln!(
            "accel-container-runtime version {}",
            env!("CARGO_PKG_VERSION")
        );
        std::process::exit(code);
    }
    // What a create parsed and built is kept until the exec below replaces the process:
    // freeing it would only cost time.
    let mut _kept = None;
    // Only create/run need the profiles; everything else reads one key and execs, so a
    // `state` or `delete` costs little more than runc itself (benches/BENCHMARKS.md).
    let low_level_runtime = if inv.creates() {
        let done = create::run(
            inv.bundle.as_deref().unwrap_or(Path::new(".")),
            inv.id.as_deref().unwrap_or("?"),
        )
        .map_err(|e| err_chain(&e))?;
        _kept = done.kept;
        done.low_level_runtime
    } else {
        pass_through_runtime()
    };
    let runtime = exec::resolve(&low_level_runtime).map_err(|e| e.to_string())?;
    Err(err_chain(&exec::exec(&runtime, args)))
}

/// The low-level runtime of a command that only passes through: never an error (issue 14,
/// class 12): a broken config.toml is a warning in the log and a documented fallback.
fn pass_through_runtime() -> String {
    let (runtime, warning) = config::pass_through_runtime(&config::path());
    if let Some((msg, log_file)) = warning {
        logging::init(&log_file, log::LevelFilter::Warn);
        log::warn!("{msg}");
    }
    runtime
}
