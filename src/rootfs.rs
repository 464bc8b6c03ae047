//! Reading and writing inside a container's root filesystem from the host, without ever
//! following a link the image planted to a host path.
//!
//! Every path is resolved by [`crate::inroot`] in [`Scope::InRoot`]: `..` and absolute
//! symlinks stop at the rootfs, as they would inside the container, and `/proc/self/...`-style
//! links are refused. Where a symlink is not wanted at all (the loader cache the runtime
//! replaces), the lookup is [`Scope::NoSymlinks`] and the last component is checked with
//! `AT_SYMLINK_NOFOLLOW`.
//! A file of the image is opened only once it is known to be a regular file: first `O_PATH`
//! (which runs no driver's open and does not block on a FIFO), `fstat`, then a real open of
//! that same inode (issue 23, class 1). Directories are opened with `O_DIRECTORY`, which the
//! kernel checks before any open of the inode.
//! This is the class of CVE-2024-0132 and CVE-2025-23267 (a hook that followed a link in the
//! image to a host file) kept impossible by construction.
//! Ref: openat2(2); NVIDIA security bulletins for CVE-2024-0132 and CVE-2025-23267.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::inroot::{reopen, Root, Scope};

/// A container's rootfs, opened once.
#[derive(Debug)]
pub struct Rootfs(Root);

/// What a directory entry is (from `readdir`, checked with `statx` when the fs does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Symlink,
    Other,
}

impl Rootfs {
    /// Opens the rootfs directory (`root.path` of the spec, a host path the engine made).
    pub fn open(path: &Path) -> std::io::Result<Rootfs> {
        Root::open(path).map(Rootfs)
    }

    /// The host path, for messages.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    fn resolve(&self, rel: &Path, flags: OFlags, scope: Scope) -> Result<OwnedFd, Errno> {
        self.0.open_at(rel, flags, scope)
    }

    /// The entries of directory `rel` (resolved in the root; symlinks inside the image are
    /// followed as the container would follow them). `None` when it does not exist.
    pub fn list_dir(&self, rel: &Path) -> std::io::Result<Option<Vec<(String, Kind)>>> {
        let fd = match self.resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY, Scope::InRoot) {
            Ok(fd) => fd,
            Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let dir = rustix::fs::Dir::new(fd)?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let kind = match entry.file_type() {
                rustix::fs::FileType::RegularFile => Kind::File,
                rustix::fs::FileType::Symlink => Kind::Symlink,
                _ => Kind::Other,
            };
            out.push((name.to_string(), kind));
        }
        out.sort();
        Ok(Some(out))
    }

    /// Opens directory `rel` with no symlink on its path, creating the last component (mode
    /// 0755) when missing and `create` is set.
    fn strict_dir(&self, rel: &Path, create: bool) -> std::io::Result<OwnedFd> {
        match self.resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY, Scope::NoSymlinks) {
            Err(Errno::NOENT) if create => {
                let parent = rel.parent().unwrap_or(Path::new("/"));
                let name = rel.file_name().ok_or(Errno::INVAL)?;
                let pfd = self.resolve(
                    parent,
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    Scope::NoSymlinks,
                )?;
                match rustix::fs::mkdirat(&pfd, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                Ok(self.resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY, Scope::NoSymlinks)?)
            }
            r => Ok(r?),
        }
    }

    /// Reads regular file `dir/name` (no symlink on the path or at the end), at most `limit`
    /// bytes. `Ok(None)` when it does not exist; a symlink, a non-regular file or a larger
    /// file is an error.
    pub fn read_strict(
        &self,
        dir: &Path,
        name: &str,
        limit: u64,
    ) -> std::io::Result<Option<Vec<u8>>> {
        let dfd = match self.strict_dir(dir, false) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => return Ok(None),
            Err(e) => return Err(e),
        };
        // O_PATH opens nothing: no driver's open runs for a device node, a FIFO does not
        // block or wake its writer. Only once the inode is known to be a regular file is it
        // opened for reading, through the same fd, so it cannot be swapped in between.
        let handle = match rustix::fs::openat(
            &dfd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let st = rustix::fs::fstat(&handle)?;
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        if kind != rustix::fs::FileType::RegularFile {
            return Err(other(format!(
                "{name} is {}, not a regular file; not opened",
                kind_name(kind)
            )));
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size > limit {
            return Err(other(format!(
                "{name} is {size} bytes, over the {limit} byte limit"
            )));
        }
        let fd = reopen(&handle, OFlags::RDONLY)?;
        // The limit holds while reading too: a file that grew past it is refused.
        crate::bounded::read_hinted(File::from(fd), limit, size)
            .map(Some)
            .map_err(|e| other(format!("{name}: {e}")))
    }

    /// Replaces regular file `dir/name` with `data` atomically (a temp file in the same
    /// directory, `rename`), creating `dir`'s last component when missing. Not synced: the
    /// files written here serve one container, whose every create (a restart after a host
    /// crash included) writes them again, and two fsyncs would cost each create milliseconds
    /// on a disk. No symlink
    /// may be on the path; an existing `name` that is not a regular file is refused. The new
    /// file gets `mode` and the owner of the file it replaces, or of `dir` when new. Temp
    /// files a killed replace of `name` left in `dir` are removed first.
    pub fn replace_strict(
        &self,
        dir: &Path,
        name: &str,
        data: &[u8],
        mode: u32,
    ) -> std::io::Result<()> {
        let dfd = self.strict_dir(dir, true)?;
        let owner = match rustix::fs::statat(&dfd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    != rustix::fs::FileType::RegularFile
                {
                    return Err(other(format!("{name} exists and is not a regular file")));
                }
                (st.st_uid, st.st_gid)
            }
            Err(Errno::NOENT) => {
                let st = rustix::fs::fstat(&dfd)?;
                (st.st_uid, st.st_gid)
            }
            Err(e) => return Err(e.into()),
        };
        remove_temp_leftovers(&dfd, name);
        // The temp file is made in the directory `dfd` holds, reached through its fd (no
        // path of the image is walked again); its name is random, so none can be planted.
        let dir_of_fd = PathBuf::from(format!("/proc/self/fd/{}", dfd.as_raw_fd()));
        let tmp = crate::atomic::temp_in(&dir_of_fd, name)?;
        let tmp_name = tmp
            .path()
            .file_name()
            .ok_or_else(|| other(format!("temp file for {name} has no name")))?
            .to_os_string();
        let f = tmp.as_file();
        (&*f).write_all(data)?;
        rustix::fs::fchmod(f.as_fd(), Mode::from_raw_mode(mode))?;
        rustix::fs::fchown(
            f.as_fd(),
            Some(rustix::fs::Uid::from_raw(owner.0)),
            Some(rustix::fs::Gid::from_raw(owner.1)),
        )?;
        rustix::fs::renameat(&dfd, tmp_name.as_os_str(), &dfd, name)?;
        // Renamed: there is nothing left for the drop to remove.
        let _ = tmp.into_temp_path().keep();
        Ok(())
    }
}

/// Removes the temp files a create killed while replacing `name` left in directory `dfd`
/// (names [`crate::atomic::is_temp_of`] matches; a symlink is unlinked, not followed). Best
/// effort: a leftover that cannot be removed only costs its space.
fn remove_temp_leftovers(dfd: &OwnedFd, name: &str) {
    let Ok(dir) = rustix::fs::Dir::read_from(dfd) else {
        return;
    };
    for entry in dir.flatten() {
        let Ok(n) = entry.file_name().to_str() else {
            continue;
        };
        if crate::atomic::is_temp_of(n, name) {
            if let Err(e) = rustix::fs::unlinkat(dfd, n, rustix::fs::AtFlags::empty()) {
                log::warn!("cannot remove leftover temp file {n}: {e}");
            }
        }
    }
}

/// What a non-regular file is, for messages.
pub fn kind_name(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match kind {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown type",
    }
}

fn other(msg: String) -> std::io::Error {
    std::io::Error::other(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_in_the_image_stay_in_the_image() {
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("secret");
        std::fs::write(&secret, "host").unwrap();
        let root = host.path().join("rootfs");
        std::fs::create_dir_all(root.join("usr/local/cuda-12/compat")).unwrap();
        std::fs::write(root.join("usr/local/cuda-12/compat/libcuda.so.570.1"), "").unwrap();
        symlink("cuda-12", root.join("usr/local/cuda")).unwrap();
        // Absolute links resolve inside the root, as in the container.
        symlink("/usr/local/cuda-12", root.join("usr/local/abs")).unwrap();
        symlink(host.path(), root.join("escape")).unwrap();
        let r = Rootfs::open(&root).unwrap();
        let list = r.list_dir(Path::new("/usr/local/cuda/compat")).unwrap();
        assert_eq!(
            list.unwrap(),
            [("libcuda.so.570.1".to_string(), Kind::File)]
        );
        assert!(r
            .list_dir(Path::new("/usr/local/abs/compat"))
            .unwrap()
            .is_some());
        // An absolute link to a host directory resolves inside the rootfs, where it is missing.
        assert_eq!(r.list_dir(Path::new("/escape")).unwrap(), None);
        assert_eq!(
            r.list_dir(Path::new("/../../..")).unwrap().unwrap().len(),
            2
        );
    }

    #[test]
    fn the_cache_is_replaced_only_through_real_directories() {
        let host = tempfile::tempdir().unwrap();
        let outside = host.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let root = host.path().join("rootfs");
        std::fs::create_dir(&root).unwrap();
        let r = Rootfs::open(&root).unwrap();
        // No /etc: made, file created.
        assert_eq!(r.read_strict(Path::new("/etc"), "c", 10).unwrap(), None);
        r.replace_strict(Path::new("/etc"), "c", b"one", 0o644)
            .unwrap();
        assert_eq!(std::fs::read(root.join("etc/c")).unwrap(), b"one");
        assert_eq!(
            r.read_strict(Path::new("/etc"), "c", 10).unwrap().unwrap(),
            b"one"
        );
        assert!(r.read_strict(Path::new("/etc"), "c", 2).is_err());
        // A symlinked file or directory is refused, and nothing is written outside.
        std::fs::remove_file(root.join("etc/c")).unwrap();
        symlink(outside.join("c"), root.join("etc/c")).unwrap();
        assert!(r
            .replace_strict(Path::new("/etc"), "c", b"two", 0o644)
            .is_err());
        assert!(r.read_strict(Path::new("/etc"), "c", 10).is_err());
        std::fs::remove_file(root.join("etc/c")).unwrap();
        std::fs::remove_dir(root.join("etc")).unwrap();
        symlink(&outside, root.join("etc")).unwrap();
        assert!(r
            .replace_strict(Path::new("/etc"), "c", b"two", 0o644)
            .is_err());
        assert!(r.read_strict(Path::new("/etc"), "c", 10).is_err());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // A FIFO is refused without being opened (an open for reading would block here).
        std::fs::create_dir_all(root.join("fifo")).unwrap();
        nix::unistd::mkfifo(
            &root.join("fifo/c"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let e = r.read_strict(Path::new("/fifo"), "c", 10).unwrap_err();
        assert!(
            e.to_string().contains("is a FIFO, not a regular file"),
            "{e}"
        );
        // A directory where the file should be is refused too.
        std::fs::remove_file(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("etc/c")).unwrap();
        assert!(r
            .replace_strict(Path::new("/etc"), "c", b"two", 0o644)
            .is_err());
    }
}
