//! Replacing a file so that a crash at any instant leaves either the old or the new content.
//!
//! Temp file in the same directory (same filesystem, so `rename` is atomic), same mode and
//! owner as the file it replaces, `fsync` before the rename and of the directory after it.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// The variable a `failpoints` build reads: the name of the step at which it SIGKILLs itself.
pub const FAILPOINT_ENV: &str = "ACCEL_FAILPOINT";

/// Steps of [`replace`] at which a crash is simulated, in order.
pub const FAILPOINTS: [&str; 5] = [
    "before-temp-create",
    "after-partial-write",
    "before-fsync",
    "before-rename",
    "before-dir-fsync",
];

/// Test-only crash injection (cargo feature `failpoints`, off in every shipped build): when
/// `ACCEL_FAILPOINT` names this step, the process SIGKILLs itself here, as an OOM kill or a
/// power cut would stop it, with no destructor or cleanup running.
#[cfg(feature = "failpoints")]
pub fn failpoint(name: &str) {
    if std::env::var_os(FAILPOINT_ENV).is_some_and(|v| v == name) {
        // SAFETY: raise has no memory-safety preconditions; SIGKILL does not return.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn failpoint(_name: &str) {}

/// Atomically replaces `path` with `data`. Mode and ownership of an existing file are kept;
/// a new file gets `new_mode`. On error nothing is left behind and `path` is untouched.
pub fn replace(path: &Path, data: &[u8], new_mode: u32) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let old = std::fs::metadata(path).ok();
    failpoint("before-temp-create");
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    // Two writes only where a crash between them is being tested.
    let half = if cfg!(feature = "failpoints") {
        data.len() / 2
    } else {
        data.len()
    };
    tmp.write_all(&data[..half])?;
    failpoint("after-partial-write");
    tmp.write_all(&data[half..])?;
    failpoint("before-fsync");
    let file = tmp.as_file();
    match &old {
        Some(m) => {
            file.set_permissions(Permissions::from_mode(m.mode() & 0o7777))?;
            if m.uid() != nix::unistd::geteuid().as_raw()
                || m.gid() != nix::unistd::getegid().as_raw()
            {
                std::os::unix::fs::fchown(file, Some(m.uid()), Some(m.gid()))?;
            }
        }
        None => file.set_permissions(Permissions::from_mode(new_mode))?,
    }
    file.sync_all()?;
    failpoint("before-rename");
    tmp.persist(path).map_err(|e| e.error)?;
    failpoint("before-dir-fsync");
    // The rename itself is durable only once the directory is.
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_mode_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        std::fs::write(&p, b"old").unwrap();
        std::fs::set_permissions(&p, Permissions::from_mode(0o640)).unwrap();
        replace(&p, b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o640);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn new_file_gets_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("daemon.json");
        replace(&p, b"{}", 0o644).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o644);
    }
}
