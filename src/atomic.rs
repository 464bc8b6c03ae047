//! Replacing a file so that a crash at any instant leaves either the old or the new content.
//!
//! Temp file in the same directory (same filesystem, so `rename` is atomic), same mode and
//! owner as the file it replaces, `fsync` before the rename and of the directory after it.
//! Temp files come from the `tempfile` crate (O_EXCL, mode 0600, removed on every error
//! path) and are named `.NAME.accel-<random>.tmp`: [`is_temp_of`] matches those and nothing
//! an engine or another tool would write, so a later create can tell a killed rewrite's
//! leftovers from anything else.
//!
//! And [`make_dirs`]: the directories the product makes, with their mode whatever the umask.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Between the target's name and the random part of its temp files' names.
const TEMP_MARK: &str = ".accel-";
const TEMP_SUFFIX: &str = ".tmp";
/// Random characters in a temp file's name.
const TEMP_RANDOM: usize = 16;

/// Whether `candidate` (a file name) is one of [`replace`]'s temp files for the file named
/// `target` in the same directory.
pub fn is_temp_of(candidate: &str, target: &str) -> bool {
    candidate
        .strip_prefix('.')
        .and_then(|c| c.strip_prefix(target))
        .and_then(|c| c.strip_prefix(TEMP_MARK))
        .and_then(|c| c.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|r| r.len() == TEMP_RANDOM && r.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A new temp file for replacing `dir/name`, named as [`is_temp_of`] expects: created
/// `O_EXCL` (a name planted there is never opened, another random one is tried) and mode
/// 0600, removed when dropped unless kept.
pub fn temp_in(dir: &Path, name: &str) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(&format!(".{name}{TEMP_MARK}"))
        .suffix(TEMP_SUFFIX)
        .rand_bytes(TEMP_RANDOM)
        .tempfile_in(dir)
}

/// Removes what a killed [`replace`] of `path` left in its directory: the entries whose name
/// [`is_temp_of`] matches, and nothing else (a symlink is unlinked, never followed). Returns
/// how many were removed. Engines never create one bundle twice at once, so no other
/// rewrite's temp file is in flight; were one, its rename would fail and leave `path` as it was.
pub fn remove_leftovers(path: &Path) -> std::io::Result<usize> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Some(target) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(0);
    };
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| is_temp_of(n, target)) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

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
    replace_if(path, data, new_mode, || Ok(true)).map(|_| ())
}

/// [`replace`] for a file another program may write at the same time: `unchanged` is asked
/// last, after the new content is on disk and right before the rename, so that a write it
/// did not see can only fall in the instant between the two. When it says false, `path` is
/// left as it is, the temp file removed, and the result is `Ok(false)`.
pub fn replace_if(
    path: &Path,
    data: &[u8],
    new_mode: u32,
    unchanged: impl FnOnce() -> std::io::Result<bool>,
) -> std::io::Result<bool> {
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
    let tmp = temp_in(dir, &name)?;
    let mut file = tmp.as_file();
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
                std::os::unix::fs::fchown(file, Some(m.uid()), Some(m.gid()))?;
            }
        }
        None => file.set_permissions(Permissions::from_mode(new_mode))?,
    }
    file.sync_all()?;
    if !unchanged()? {
        return Ok(false);
    }
    failpoint("before-rename");
    tmp.persist(path).map_err(|e| e.error)?;
    failpoint("before-dir-fsync");
    // The rename itself is durable only once the directory is.
    File::open(dir)?.sync_all()?;
    Ok(true)
}

/// Makes `dir` and the directories above it that are missing, each `0755` whatever the
/// process's umask (under umask 0 `create_dir_all` makes them `0777`, and anyone could then
/// rename a socket over ours or drop a file there). Directories already there are left as
/// they are: they are the node's.
pub fn make_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?,
            // Made meanwhile by someone else: theirs, as above.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
    fn temp_names_match_only_the_shims_own() {
        assert!(is_temp_of(
            ".config.json.accel-AbCdEf0123456789.tmp",
            "config.json"
        ));
        for other in [
            ".config.json.accel-AbCdEf012345678.tmp",
            ".config.json.AbCdEf0123456789.tmp",
            "config.json.accel-AbCdEf0123456789.tmp",
            ".config.json.accel-AbCdEf01234567/9.tmp",
            ".daemon.json.accel-AbCdEf0123456789.tmp",
            ".config.json.accel-AbCdEf0123456789.tmp.x",
        ] {
            assert!(!is_temp_of(other, "config.json"), "{other}");
        }
    }

    #[test]
    fn leftovers_of_a_killed_rewrite_are_removed_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        std::fs::write(&p, b"{}").unwrap();
        let ours = [
            ".config.json.accel-AbCdEf0123456789.tmp",
            ".config.json.accel-zzzzzzzzzzzzzzzz.tmp",
        ];
        let others = [
            ".config.json.accel-AbCdEf012345678.tmp",
            ".config.json.tmp",
            ".daemon.json.accel-AbCdEf0123456789.tmp",
            "rootfs",
        ];
        for n in ours.iter().chain(&others) {
            std::fs::write(d.path().join(n), b"x").unwrap();
        }
        assert_eq!(remove_leftovers(&p).unwrap(), 2);
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want: Vec<&str> = others.to_vec();
        want.push("config.json");
        want.sort();
        assert_eq!(left, want);
        assert_eq!(remove_leftovers(&p).unwrap(), 0);
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
