//! Whether a file on disk may be believed: config.toml, the profiles and the CDI specs each
//! say which host files go into containers, so each must be something only root could have
//! written, as sudo (`sudoers`) and sshd (`StrictModes`) require of their files.
//!
//! A file is trusted when it is a regular file owned by root and not writable by group or
//! others, and every directory above it is owned by root and not writable by group or others.
//! A symlink is judged by its target (and the target's directories) and by the directories
//! holding the link itself. One exception, as for /tmp: a root-owned directory with the
//! sticky bit may be writable by others, since they can add entries to it but cannot rename
//! or remove root's, so a root-owned file below it stays root's.
//!
//! Ref: sudo's `sudo_secure_path`, OpenSSH's `safe_path` (auth.c).

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const STICKY: u32 = 0o1000;

/// Directories found trustworthy so far: the files of one directory (config.toml's
/// profiles-dir) cost one check of its chain, not one per file, and a directory that two
/// chains share (`/etc`, `/`) is looked at once.
#[derive(Debug, Default)]
pub struct Checked {
    /// Parents of files opened, as they were named.
    named: Vec<PathBuf>,
    /// Directories checked, resolved.
    dirs: Vec<PathBuf>,
}

/// Why [`open_file`] gave no file.
#[derive(Debug)]
pub enum OpenError {
    /// It could not be opened (`NotFound` included).
    Io(std::io::Error),
    /// It may not be believed: what is wrong, as [`check_file`] says it.
    Untrusted(String),
}

/// Opens `path` for reading when it may be trusted (the rules of [`check_file`]). The file is
/// judged by `fstat` of the descriptor that is then read, so what is read is what was
/// checked; a symlink is opened through and judged by [`check_file`]. O_NONBLOCK: a FIFO
/// put in a profile's place is refused as not a regular file instead of hanging the create.
pub fn open_file(
    path: &Path,
    checked: &mut Checked,
) -> Result<(File, std::fs::Metadata), OpenError> {
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    let file = match open(libc::O_NOFOLLOW | libc::O_NONBLOCK) {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            let file = open(libc::O_NONBLOCK).map_err(OpenError::Io)?;
            check_file(path).map_err(OpenError::Untrusted)?;
            // The target may have been swapped since check_file looked: the open one is
            // judged again.
            let meta = file.metadata().map_err(OpenError::Io)?;
            regular_root_file(&meta).map_err(OpenError::Untrusted)?;
            return Ok((file, meta));
        }
        Err(e) => return Err(OpenError::Io(e)),
    };
    let meta = file.metadata().map_err(OpenError::Io)?;
    regular_root_file(&meta).map_err(OpenError::Untrusted)?;
    // Not a symlink: its directories are those of its parent, resolved.
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Compared as bytes: a path spelled two ways is only checked twice.
    if !checked
        .named
        .iter()
        .any(|d| d.as_os_str() == parent.as_os_str())
    {
        let real = std::fs::canonicalize(parent)
            .map_err(|e| OpenError::Untrusted(format!("cannot resolve: {e}")))?;
        for dir in real.ancestors() {
            if !checked
                .dirs
                .iter()
                .any(|d| d.as_os_str() == dir.as_os_str())
            {
                check_dir(dir).map_err(OpenError::Untrusted)?;
                checked.dirs.push(dir.to_path_buf());
            }
        }
        checked.named.push(parent.to_path_buf());
    }
    Ok((file, meta))
}

fn regular_root_file(meta: &std::fs::Metadata) -> Result<(), String> {
    if !meta.is_file() {
        return Err("not a regular file; refused".into());
    }
    owner_and_mode(meta).map_err(|why| format!("{why}; refused"))
}

/// `Ok` when `path` may be trusted; else what is wrong with it, naming the file or the
/// directory at fault (the caller prefixes the file it was reading).
pub fn check_file(path: &Path) -> Result<(), String> {
    let target = std::fs::canonicalize(path).map_err(|e| format!("cannot resolve: {e}"))?;
    let meta = std::fs::metadata(&target).map_err(|e| format!("cannot stat: {e}"))?;
    let shown = if target == path {
        String::new()
    } else {
        format!(" (symlink target {})", target.display())
    };
    if !meta.is_file() {
        return Err(format!("not a regular file{shown}; refused"));
    }
    owner_and_mode(&meta).map_err(|why| format!("{why}{shown}; refused"))?;
    // The directories of the target, then those of the link (when it is one).
    let mut dirs: Vec<std::path::PathBuf> = target.ancestors().skip(1).map(Into::into).collect();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Ok(parent) = std::fs::canonicalize(parent) {
            dirs.extend(parent.ancestors().map(Into::into));
        }
    }
    dirs.sort();
    dirs.dedup();
    for dir in dirs.iter().rev() {
        check_dir(dir)?;
    }
    Ok(())
}

fn check_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir)
        .map_err(|e| format!("cannot stat directory {}: {e}", dir.display()))?;
    if meta.uid() != 0 {
        return Err(format!(
            "directory {} is owned by uid {}, not root; refused",
            dir.display(),
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & STICKY == 0 {
        return Err(format!(
            "directory {} is writable by {} (mode {mode:04o}); refused",
            dir.display(),
            who(mode)
        ));
    }
    Ok(())
}

fn owner_and_mode(meta: &std::fs::Metadata) -> Result<(), String> {
    if meta.uid() != 0 {
        return Err(format!("owned by uid {}, not root", meta.uid()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!("writable by {} (mode {mode:04o})", who(mode)));
    }
    Ok(())
}

fn who(mode: u32) -> &'static str {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "group and others",
        (true, false) => "group",
        _ => "others",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A temp dir with `etc/` (0755) holding `name` (0644, `text`), all root's when run as
    /// root: the trusted starting point each test then spoils.
    fn trusted_file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("etc");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o755);
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        chmod(&f, 0o644);
        (t, dir, f)
    }

    /// `dir/link.toml`, a symlink to a root-owned 0644 file in `other`, a directory anyone
    /// can write (mode 0777): returns (other, target, link).
    fn link_to_open_dir(t: &tempfile::TempDir, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let other = t.path().join("other");
        std::fs::create_dir(&other).unwrap();
        chmod(&other, 0o777);
        let target = other.join("real.toml");
        std::fs::write(&target, "").unwrap();
        chmod(&target, 0o644);
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        (other, target, link)
    }

    /// Needs root (files made here must be root's); CI runs as root.
    #[test]
    fn owner_mode_and_directories() {
        let (t, dir, f) = trusted_file("config.toml", "");
        check_file(&f).unwrap();

        chmod(&f, 0o664);
        let e = check_file(&f).unwrap_err();
        assert!(e.contains("writable by group (mode 0664)"), "{e}");
        chmod(&f, 0o646);
        assert!(check_file(&f).unwrap_err().contains("by others"));
        chmod(&f, 0o644);

        std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
        assert!(check_file(&f).unwrap_err().contains("owned by uid 65534"));
        std::os::unix::fs::chown(&f, Some(0), None).unwrap();

        chmod(&dir, 0o775);
        let e = check_file(&f).unwrap_err();
        assert!(e.contains(&format!("directory {}", dir.display())), "{e}");
        // Sticky and root's, as /tmp: others cannot replace root's entries.
        chmod(&dir, 0o1777);
        check_file(&f).unwrap();
        chmod(&dir, 0o755);

        // A symlink: judged by its target and the target's directories.
        let (other, target, link) = link_to_open_dir(&t, &dir);
        let e = check_file(&link).unwrap_err();
        assert!(
            e.contains(&format!("directory {}", other.display())) && !e.contains("symlink"),
            "{e}"
        );
        chmod(&other, 0o755);
        check_file(&link).unwrap();
        chmod(&target, 0o666);
        let e = check_file(&link).unwrap_err();
        assert!(e.contains("symlink target"), "{e}");
    }

    /// Needs root, as above. `open_file` gives the same verdicts as `check_file`, on the
    /// descriptor it returns; a FIFO is refused without blocking.
    #[test]
    fn open_file_judges_what_it_opens() {
        let (t, dir, f) = trusted_file("a.toml", "x");
        let mut checked = Checked::default();
        let (_, meta) = open_file(&f, &mut checked).unwrap();
        assert_eq!(meta.len(), 1);
        let untrusted = |p: &Path, checked: &mut Checked| match open_file(p, checked) {
            Err(OpenError::Untrusted(msg)) => msg,
            other => panic!("{other:?}"),
        };
        chmod(&f, 0o664);
        let e = untrusted(&f, &mut checked);
        assert!(e.contains("writable by group (mode 0664)"), "{e}");
        assert_eq!(e, check_file(&f).unwrap_err());
        chmod(&f, 0o644);
        // A directory made writable after it was judged: a new Checked looks again.
        chmod(&dir, 0o775);
        assert!(open_file(&f, &mut checked).is_ok());
        let e = untrusted(&f, &mut Checked::default());
        assert_eq!(e, check_file(&f).unwrap_err());
        chmod(&dir, 0o755);
        let fifo = dir.join("fifo.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        assert!(untrusted(&fifo, &mut checked).contains("not a regular file"));
        // A symlink: judged by its target's directories, as check_file does.
        let (other, _, link) = link_to_open_dir(&t, &dir);
        assert_eq!(
            untrusted(&link, &mut checked),
            check_file(&link).unwrap_err()
        );
        chmod(&other, 0o755);
        assert!(open_file(&link, &mut checked).is_ok());
        let missing = dir.join("none.toml");
        assert!(matches!(
            open_file(&missing, &mut checked),
            Err(OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound
        ));
    }
}
