//! Handing over to the low-level runtime with `execv`: same pid, same fds (console socket,
//! `--preserve-fds`, stdio), same argv after `argv[0]`. Never spawn-and-wait, except for
//! `--version`, which makes no container and must print the runtime's output first.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("low-level runtime {name:?} not found in PATH")]
    NotFound { name: String },
    #[error("low-level runtime {} is this shim itself; set low-level-runtime to runc's path", path.display())]
    IsSelf { path: PathBuf },
    #[error("cannot exec {}: {source}", path.display())]
    Exec {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
}

/// Resolves `low-level-runtime`: an absolute path as is, a name through PATH.
pub fn resolve(name: &str) -> Result<PathBuf, ExecError> {
    use std::os::unix::fs::PermissionsExt;
    let path = if name.contains('/') {
        PathBuf::from(name)
    } else {
        let search = std::env::var_os("PATH")
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_PATH.into());
        std::env::split_paths(&search)
            .map(|d| d.join(name))
            .find(|p| {
                std::fs::metadata(p)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
            .ok_or_else(|| ExecError::NotFound { name: name.into() })?
    };
    if is_self(&path) {
        return Err(ExecError::IsSelf { path });
    }
    Ok(path)
}

/// True when `path` is the running binary (e.g. the shim installed as `runc`), which would
/// exec itself forever.
fn is_self(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata("/proc/self/exe")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Replaces this process with `runtime`, argv[1..] unchanged. Returns only on failure.
pub fn exec(runtime: &Path, args: &[OsString]) -> ExecError {
    let to_c = |s: &[u8]| CString::new(s).unwrap_or_default();
    let prog = to_c(runtime.as_os_str().as_bytes());
    let mut argv = Vec::with_capacity(args.len());
    argv.push(prog.clone());
    argv.extend(args.iter().skip(1).map(|a| to_c(a.as_bytes())));
    match nix::unistd::execv(&prog, &argv) {
        Err(source) => ExecError::Exec {
            path: runtime.into(),
            source,
        },
        Ok(never) => match never {},
    }
}

/// Runs `runtime` with argv[1..] of `args` (same stdio and fds) and waits for it: its exit
/// status, or 128 + the signal that ended it, as a shell reports it. Only for `--version`,
/// whose output must come before the shim's own line (issue 23, class 6); every other
/// command goes through [`exec`].
pub fn run_and_wait(runtime: &Path, args: &[OsString]) -> Result<i32, ExecError> {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let status = std::process::Command::new(runtime)
        .arg0(runtime)
        .args(args.iter().skip(1))
        .status()
        .map_err(|e| ExecError::Exec {
            path: runtime.into(),
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
    Ok(status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_through_path_and_refuses_self() {
        assert!(resolve("sh").unwrap().is_absolute());
        assert!(matches!(
            resolve("no-such-runtime-xyz"),
            Err(ExecError::NotFound { .. })
        ));
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(matches!(
            resolve(me.to_str().unwrap()),
            Err(ExecError::IsSelf { .. })
        ));
    }
}
