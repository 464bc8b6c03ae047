//! Replacing a file so that a crash at any instant leaves either the old or the new content.
//!
//! Temp file in the same directory (same filesystem, so `rename` is atomic), same mode and
//! owner as the file it replaces, `fsync` before the rename and of the directory after it.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

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
    let (mut file, tmp) = Temp::create(dir, &name)?;
    // Two writes only where a crash between them is being tested.
    let half = if cfg!(feature = "failpoints") {
        data.len() / 2
    } else {
        data.len()
    };
    file.write_all(&data[..half])?;
    failpoint("after-partial-write");
    file.write_all(&data[half..])?;
    failpoint("before-fsync");
    match &old {
        Some(m) => {
            file.set_permissions(Permissions::from_mode(m.mode() & 0o7777))?;
            if m.uid() != nix::unistd::geteuid().as_raw()
                || m.gid() != nix::unistd::getegid().as_raw()
            {
                std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
            }
        }
        None => file.set_permissions(Permissions::from_mode(new_mode))?,
    }
    file.sync_all()?;
    failpoint("before-rename");
    std::fs::rename(&tmp.0, path)?;
    tmp.renamed();
    failpoint("before-dir-fsync");
    // The rename itself is durable only once the directory is.
    crate::read::open(dir, OFlags::DIRECTORY)?.sync_all()
}

/// The temp file beside the target, `.NAME.<16 hex digits>.tmp`, removed when dropped (every
/// error path); forgotten once renamed. The digits come from getrandom(2); O_EXCL makes a
/// name already there (another create's, one a SIGKILLed shim left) a retry with new ones,
/// never a file reused or a symlink followed.
struct Temp(PathBuf);

impl Temp {
    fn create(dir: &Path, name: &str) -> std::io::Result<(File, Temp)> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
        // Randomness only spreads the names; O_EXCL is what makes them safe. Before the
        // kernel's pool is ready (early boot), the pid does.
        let mut random = [0u8; 8];
        let seed =
            match rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::NONBLOCK) {
                Ok(8) => u64::from_ne_bytes(random),
                _ => u64::from(std::process::id()) << 32,
            };
        for attempt in 0..16u64 {
            let path = dir.join(format!(".{name}.{:016x}.tmp", seed.wrapping_add(attempt)));
            match rustix::fs::open(&path, flags, Mode::from_raw_mode(0o600)) {
                Ok(fd) => return Ok((File::from(fd), Temp(path))),
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(rustix::io::Errno::EXIST.into())
    }

    /// The temp file is the target now: nothing to remove.
    fn renamed(self) {
        std::mem::forget(self);
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
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
    fn temp_files_are_private_distinct_and_removed_when_dropped() {
        let d = tempfile::tempdir().unwrap();
        let (_f1, t1) = Temp::create(d.path(), "config.json").unwrap();
        let (_f2, t2) = Temp::create(d.path(), "config.json").unwrap();
        assert_ne!(t1.0, t2.0);
        for t in [&t1, &t2] {
            let n = t.0.file_name().unwrap().to_str().unwrap();
            assert!(
                n.starts_with(".config.json.") && n.ends_with(".tmp") && n.len() == 33,
                "{n}"
            );
            assert_eq!(std::fs::metadata(&t.0).unwrap().mode() & 0o777, 0o600);
        }
        drop(t1);
        t2.renamed();
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            1,
            "t2 kept, t1 removed"
        );
    }

    #[test]
    fn an_error_leaves_nothing_behind() {
        let d = tempfile::tempdir().unwrap();
        // The rename fails: the target is a non-empty directory.
        let p = d.path().join("config.json");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("x"), b"").unwrap();
        assert!(replace(&p, b"new", 0o600).is_err());
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
