//! Paths inside a root directory of the host (a driver root, a dev root, a container's
//! rootfs), resolved so that nothing on the path leads outside it. The one place that does
//! so: libraries and binaries of the driver ([`crate::libraries`]), device nodes
//! ([`crate::discovery`]) and the image's files ([`crate::rootfs`]) all come through here.
//!
//! The kernel walks the path: `openat2(2)` from an fd of the root, always with
//! `RESOLVE_NO_MAGICLINKS`, and one of three [`Scope`]s. Kernels before 5.6 have no
//! `openat2` (`ENOSYS`); there the same rules are walked here, one component at a time, each
//! opened `O_PATH | O_NOFOLLOW` relative to the directory fd the walk holds, links read with
//! `readlinkat` on that fd (a procfs magic link refused with `ELOOP`, as the kernel does:
//! its text is not where it leads) and `..` answered from the walk's own stack of directories
//! (never by the filesystem, so a directory moved out of the root cannot take the walk with
//! it). No binary can choose the walk (it is taken only where the kernel refuses `openat2`).
//! The unit tests hold the two walks to the same answers.
//!
//! This is the class of CVE-2024-0132 and CVE-2025-23267 (a path that resolves outside the
//! tree it was meant to stay in, by the time it is used) kept impossible by construction.
//! Ref: openat2(2), path_resolution(7); NVIDIA security bulletins for both CVEs.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// How many symlinks one path may pass through (the kernel's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// How a path may move within the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// As if the root were `/` (chroot): `..` stops at the root, an absolute symlink starts
    /// again from it. How the container sees its rootfs, and how a driver container sees the
    /// tree it installed under `driver-root`.
    InRoot,
    /// [`Scope::InRoot`] with no symlink anywhere on the path (`ELOOP`): for files the
    /// runtime replaces.
    NoSymlinks,
    /// `..` above the root or an absolute symlink is refused (`EXDEV`) rather than
    /// reinterpreted: for device nodes, where either means the node is not what the tree
    /// says it is.
    Beneath,
}

impl Scope {
    fn flags(self) -> ResolveFlags {
        let base = ResolveFlags::NO_MAGICLINKS;
        match self {
            Scope::InRoot => base | ResolveFlags::IN_ROOT,
            Scope::NoSymlinks => base | ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS,
            Scope::Beneath => base | ResolveFlags::BENEATH,
        }
    }
}

/// Set once `openat2` could not be used: later lookups walk here without asking again.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// A root directory, opened once (`O_PATH`).
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
    /// The root's own host path as the kernel names it, read at the first lookup or
    /// [`Root::rel_of`] that needs it.
    real: std::sync::OnceLock<Option<PathBuf>>,
}

/// A path found under a root: an `O_PATH` fd of it (no driver's open ran, no FIFO blocked),
/// what `fstat` says of that fd, and its host path.
#[derive(Debug)]
pub struct Entry {
    pub fd: OwnedFd,
    pub stat: Stat,
    pub host: PathBuf,
}

impl Entry {
    pub fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }

    pub fn is_file(&self) -> bool {
        self.file_type() == FileType::RegularFile
    }
}

impl Root {
    /// Opens `path`, a host path the configuration or the engine gave (its own symlinks are
    /// followed: it is not inside any root).
    pub fn open(path: &Path) -> std::io::Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            fd,
            path: path.to_path_buf(),
            real: std::sync::OnceLock::new(),
        })
    }

    /// The host path it was opened by, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `rel` (a container-style path; a leading `/` means the root) with `flags`,
    /// resolved in `scope`.
    pub fn open_at(&self, rel: &Path, flags: OFlags, scope: Scope) -> Result<OwnedFd, Errno> {
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            match kernel(self.fd.as_fd(), rel, flags, scope) {
                // ENOSYS: no openat2 in this kernel; EPERM: a seccomp filter from before
                // openat2 (the device plugin's pod on an old engine) refuses it. The opens made
                // here (O_PATH, read-only) get no EPERM of their own, so the walk answers.
                Err(Errno::NOSYS) | Err(Errno::PERM) => NO_OPENAT2.store(true, Ordering::Relaxed),
                r => return r,
            }
        }
        walk(self.fd.as_fd(), rel, flags, scope)
    }

    /// Finds `rel` without opening it: an `O_PATH` fd, its `fstat` and its host path.
    ///
    /// The host path of a path the kernel walked is what `/proc/self/fd` says of the fd, the
    /// costliest step of a lookup (more than the walk). Most paths looked up (device nodes,
    /// directories, tools) hold no symlink, and for those it is the root's own host path
    /// joined with `rel`: so `rel` is first resolved with no symlink allowed, and only a path
    /// with one on it (`ELOOP`) is resolved again in `scope` and read back from the fd. The
    /// answer is the same either way: without a symlink or `..` on the path every scope
    /// resolves it alike, and any other error is the one the walk in `scope` meets first.
    /// [`Root::lookup_link`] is for paths that are links as a rule.
    pub fn lookup(&self, rel: &Path, scope: Scope) -> Result<Entry, Errno> {
        let Some((real, plain)) = self.real().zip(plain(rel)) else {
            return self.lookup_link(rel, scope);
        };
        match self.open_at(rel, OFlags::PATH, Scope::NoSymlinks) {
            Ok(fd) => {
                let stat = rustix::fs::fstat(&fd)?;
                let mut host = real.to_path_buf();
                host.push(plain);
                Ok(Entry { fd, stat, host })
            }
            Err(Errno::LOOP) if scope != Scope::NoSymlinks => self.lookup_link(rel, scope),
            Err(e) => Err(e),
        }
    }

    /// [`Root::lookup`] for a path that is a link as a rule (a library's soname): resolved in
    /// `scope` at once, its host path read back from the fd.
    pub fn lookup_link(&self, rel: &Path, scope: Scope) -> Result<Entry, Errno> {
        let fd = self.open_at(rel, OFlags::PATH, scope)?;
        let stat = rustix::fs::fstat(&fd)?;
        let host = fd_path(&fd).map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        Ok(Entry { fd, stat, host })
    }

    /// The root's own host path as the kernel names it, read once.
    fn real(&self) -> Option<&Path> {
        self.real.get_or_init(|| fd_path(&self.fd).ok()).as_deref()
    }

    /// `rel` under the root, for messages.
    pub fn display(&self, rel: &Path) -> PathBuf {
        self.path.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// The path of `host` (a host path an [`Entry`] of this root gave) relative to the root,
    /// as a container-style path; `None` for a path not under it.
    pub fn rel_of(&self, host: &Path) -> Option<PathBuf> {
        let root = self.real()?;
        host.strip_prefix(root)
            .ok()
            .map(|rel| Path::new("/").join(rel))
    }
}

/// `rel` without its leading `/`, `.` and empty components, when it has no `..`: what it
/// names under a root when no component is a symlink. `None` for a path with `..`.
fn plain(rel: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in components(rel.as_os_str().as_bytes()) {
        if c == b".." {
            return None;
        }
        out.push(std::ffi::OsStr::from_bytes(&c));
    }
    Some(out)
}

/// The host path an fd stands for, as the kernel names it (`/proc/self/fd`).
pub fn fd_path(fd: &OwnedFd) -> std::io::Result<PathBuf> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let target = rustix::fs::readlink(link.as_str(), Vec::new())?;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(
        target.into_bytes(),
    )))
}

/// A real open of the inode an `O_PATH` fd holds, through `/proc/self/fd`: the name it was
/// found under is not looked up again, so what was checked is what is opened.
pub fn reopen(fd: &OwnedFd, flags: OFlags) -> std::io::Result<OwnedFd> {
    let magic = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(rustix::fs::open(
        magic.as_str(),
        flags | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn kernel(root: BorrowedFd<'_>, rel: &Path, flags: OFlags, scope: Scope) -> Result<OwnedFd, Errno> {
    loop {
        match rustix::fs::openat2(
            root,
            rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            scope.flags(),
        ) {
            // The kernel asks for a retry when a rename raced the lookup.
            Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
            r => return r,
        }
    }
}

/// `openat2`'s rules walked in user space, for kernels without it.
fn walk(root: BorrowedFd<'_>, rel: &Path, flags: OFlags, scope: Scope) -> Result<OwnedFd, Errno> {
    let mut todo: VecDeque<Vec<u8>> = components(rel.as_os_str().as_bytes()).collect();
    // The directories walked into below the root; `..` pops one.
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == b".." {
            if dirs.pop().is_none() && scope == Scope::Beneath {
                return Err(Errno::XDEV);
            }
            continue;
        }
        let here = dirs.last().map_or(root, |d| d.as_fd());
        let fd = rustix::fs::openat(
            here,
            name.as_slice(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
        if kind == FileType::Symlink {
            if scope == Scope::NoSymlinks {
                return Err(Errno::LOOP);
            }
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(Errno::LOOP);
            }
            let target = rustix::fs::readlinkat(&fd, "", Vec::new())?.into_bytes();
            if is_magic(&fd, here, &target) {
                return Err(Errno::LOOP);
            }
            if target.first() == Some(&b'/') {
                if scope == Scope::Beneath {
                    return Err(Errno::XDEV);
                }
                dirs.clear();
            }
            for (i, c) in components(&target).enumerate() {
                todo.insert(i, c);
            }
            continue;
        }
        if todo.is_empty() {
            if flags.contains(OFlags::PATH) {
                return Ok(fd);
            }
            // The last component, opened for real now that it is known to be no link; one
            // swapped in since fails the open (O_NOFOLLOW) rather than being followed.
            return rustix::fs::openat(
                here,
                name.as_slice(),
                flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
        }
        if kind != FileType::Directory {
            return Err(Errno::NOTDIR);
        }
        dirs.push(fd);
    }
    // The path ended at a directory (the root, or after `..`).
    let here = dirs.last().map_or(root, |d| d.as_fd());
    rustix::fs::openat(here, ".", flags | OFlags::CLOEXEC, Mode::empty())
}

/// Whether the link `fd` (found in directory `dir`, its text `target`) is a procfs magic
/// link, which `RESOLVE_NO_MAGICLINKS` refuses: its text is no path the kernel follows, it
/// jumps to what the link stands for (`/proc/<pid>/root`, `cwd`, `exe`, `fd/N`,
/// `map_files/*`, `ns/*`). Only procfs has them. Its plain links (`self`, `thread-self`,
/// `mounts`, `net`, made with a name relative to their directory) are the ones whose text is
/// a relative path that is there; a magic link's text is a host path (absolute) or a name
/// such as `pipe:[N]` or `mnt:[N]` that is not. The rule errs towards refusing: a plain link
/// it took for a magic one would fail with `ELOOP`, never lead anywhere.
/// Ref: openat2(2) RESOLVE_NO_MAGICLINKS; proc(5); fs/namei.c (the magic-link jump).
fn is_magic(fd: &OwnedFd, dir: BorrowedFd<'_>, target: &[u8]) -> bool {
    let on_proc =
        rustix::fs::fstatfs(fd).map_or(true, |s| s.f_type == rustix::fs::PROC_SUPER_MAGIC);
    on_proc
        && (target.first() == Some(&b'/')
            || target.is_empty()
            || rustix::fs::statat(dir, target, rustix::fs::AtFlags::empty()).is_err())
}

/// The components of `path`, without empty ones and `.`.
fn components(path: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A tree with every kind of link a driver root or an image holds, and paths through
    /// them: the kernel's walk and the fallback give the same file or the same error, in
    /// every scope.
    #[test]
    fn fallback_walk_answers_as_the_kernel_does() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("usr/lib/real")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::create_dir_all(r.join("dev/sub")).unwrap();
        std::fs::write(r.join("usr/lib/real/libx.so.1"), "elf").unwrap();
        std::fs::write(r.join("etc/passwd"), "inside").unwrap();
        std::fs::write(t.path().join("outside"), "host").unwrap();
        symlink("real", r.join("usr/lib/link")).unwrap();
        symlink("/usr/lib/real", r.join("usr/lib/abs")).unwrap();
        symlink("../../../../etc", r.join("usr/lib/real/up")).unwrap();
        symlink("/etc/passwd", r.join("usr/lib/libevil.so.1")).unwrap();
        symlink(t.path().join("outside"), r.join("dev/abs-out")).unwrap();
        symlink("../../../outside", r.join("dev/rel-out")).unwrap();
        symlink("../../usr/lib/real/libx.so.1", r.join("dev/sub/rel-in")).unwrap();
        symlink("b", r.join("a")).unwrap();
        symlink("a", r.join("b")).unwrap();
        let root = Root::open(&r).unwrap();
        let paths = [
            "/",
            "/..",
            "/usr/lib/link/libx.so.1",
            "/usr/lib/abs/libx.so.1",
            "/usr/lib/link/../real/libx.so.1",
            "/usr/lib/real/up",
            "/usr/lib/real/up/passwd",
            "/usr/lib/libevil.so.1",
            "/usr/lib/real/libx.so.1/x",
            "/usr/lib/real/libx.so.1/..",
            "/usr/lib/real//./libx.so.1",
            "/../../etc/passwd",
            "/dev/abs-out",
            "/dev/rel-out",
            "/dev/sub/rel-in",
            "/missing/x",
            "/a",
        ];
        let answer = |r: Result<OwnedFd, Errno>| r.map(|fd| fd_path(&fd).unwrap());
        for scope in [Scope::InRoot, Scope::NoSymlinks, Scope::Beneath] {
            for p in paths {
                let rel = Path::new(p.strip_prefix('/').unwrap());
                let rel = if rel.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    rel
                };
                for flags in [OFlags::PATH, OFlags::RDONLY] {
                    let k = answer(kernel(root.fd.as_fd(), rel, flags, scope));
                    let w = answer(walk(root.fd.as_fd(), rel, flags, scope));
                    assert_eq!(k, w, "{p} in {scope:?} ({flags:?})");
                }
            }
        }
        // And what the answers are, for the cases that matter.
        let host = |p: &str, scope| {
            root.lookup(Path::new(p), scope)
                .map(|e| e.host)
                .map_err(std::io::Error::from)
        };
        let canon = r.canonicalize().unwrap();
        assert_eq!(
            host("/usr/lib/libevil.so.1", Scope::InRoot).unwrap(),
            canon.join("etc/passwd")
        );
        assert_eq!(
            host("/usr/lib/real/up", Scope::InRoot).unwrap(),
            canon.join("etc")
        );
        assert_eq!(host("/..", Scope::InRoot).unwrap(), canon);
        assert!(host("/dev/abs-out", Scope::InRoot).is_err());
        for p in [
            "/dev/abs-out",
            "/dev/rel-out",
            "/usr/lib/abs/libx.so.1",
            "/..",
        ] {
            let e = host(p, Scope::Beneath).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{p}: {e}");
        }
        assert_eq!(
            host("/dev/sub/rel-in", Scope::Beneath).unwrap(),
            canon.join("usr/lib/real/libx.so.1")
        );
        let e = host("/usr/lib/link/libx.so.1", Scope::NoSymlinks).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        let e = host("/a", Scope::InRoot).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    }

    /// Issue 32, class 9: procfs magic links (`/proc/<pid>/{root,cwd,exe}`, `fd/N`, `ns/*`)
    /// jump where their text does not say, and `openat2` refuses them (`ELOOP`,
    /// `RESOLVE_NO_MAGICLINKS`); the fallback walk read their text and followed it. Both
    /// walks now answer alike on a root with procfs in it (the host's `/`, a driver root of
    /// `/`), while procfs's plain links (`self`, `thread-self`, `mounts`) still resolve.
    #[test]
    fn class9_fallback_walker_refuses_procfs_magic_links() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().canonicalize().unwrap();
        std::fs::write(dir.join("file"), "x").unwrap();
        symlink("/proc/self/root/etc", dir.join("via-root")).unwrap();
        let open = std::fs::File::open(dir.join("file")).unwrap();
        let n = open.as_raw_fd();
        let root = Root::open(Path::new("/")).unwrap();
        let rootfd = root.fd.as_raw_fd();
        let magic = [
            "/proc/self/root/etc/passwd".to_string(),
            "/proc/self/root".into(),
            "/proc/self/cwd".into(),
            "/proc/self/exe".into(),
            "/proc/thread-self/root/etc".into(),
            format!("/proc/self/fd/{n}"),
            format!("/proc/self/fd/{rootfd}/etc"),
            format!("/proc/{}/root/etc", std::process::id()),
            "/proc/self/ns/mnt".into(),
            format!("{}/via-root/passwd", dir.display()),
        ];
        let plain = [
            "/proc/self/status",
            "/proc/self",
            "/proc/thread-self/status",
            "/proc/mounts",
        ];
        let answer = |r: Result<OwnedFd, Errno>| r.map(|fd| fd_path(&fd).unwrap());
        let all = magic.iter().map(String::as_str).chain(plain);
        for p in all {
            let rel = Path::new(p.strip_prefix('/').unwrap());
            for scope in [Scope::InRoot, Scope::NoSymlinks, Scope::Beneath] {
                for flags in [OFlags::PATH, OFlags::RDONLY] {
                    let k = answer(kernel(root.fd.as_fd(), rel, flags, scope));
                    let w = answer(walk(root.fd.as_fd(), rel, flags, scope));
                    assert_eq!(k, w, "{p} in {scope:?} ({flags:?})");
                }
            }
        }
        for p in &magic {
            let w = walk(
                root.fd.as_fd(),
                Path::new(&p[1..]),
                OFlags::PATH,
                Scope::InRoot,
            );
            assert_eq!(w.unwrap_err(), Errno::LOOP, "{p}");
        }
        for p in plain {
            let w = walk(
                root.fd.as_fd(),
                Path::new(&p[1..]),
                OFlags::PATH,
                Scope::InRoot,
            );
            assert!(w.is_ok(), "{p}: {w:?}");
        }
        drop(open);
    }

    /// A lookup's host path is what the kernel says of its fd, whether the path held a
    /// symlink (read back from the fd) or not (the root's path joined with it).
    #[test]
    fn lookup_host_paths_are_the_kernels() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("usr/lib/real")).unwrap();
        std::fs::create_dir_all(r.join("dev")).unwrap();
        std::fs::write(r.join("usr/lib/real/libx.so.1"), "elf").unwrap();
        symlink("real", r.join("usr/lib/link")).unwrap();
        symlink("/usr/lib/real/libx.so.1", r.join("dev/abs")).unwrap();
        // The root itself through a link: the kernel names its real path.
        symlink("root", t.path().join("root-link")).unwrap();
        let root = Root::open(&t.path().join("root-link")).unwrap();
        for p in [
            "/",
            ".",
            "/usr/lib/real/libx.so.1",
            "usr//lib/./real/",
            "/usr/lib/link/libx.so.1",
            "/usr/lib/link/../real",
            "/dev/abs",
            "/missing",
            "/usr/lib/real/libx.so.1/x",
        ] {
            for scope in [Scope::InRoot, Scope::NoSymlinks, Scope::Beneath] {
                let fast = root.lookup(Path::new(p), scope);
                let slow = root.lookup_link(Path::new(p), scope);
                match (fast, slow) {
                    (Ok(f), Ok(s)) => {
                        assert_eq!(f.host, s.host, "{p} {scope:?}");
                        assert_eq!(f.host, fd_path(&f.fd).unwrap(), "{p} {scope:?}");
                        assert_eq!(f.stat.st_ino, s.stat.st_ino, "{p} {scope:?}");
                    }
                    (f, s) => assert_eq!(
                        f.map(|e| e.host).err(),
                        s.map(|e| e.host).err(),
                        "{p} {scope:?}"
                    ),
                }
            }
        }
    }

    /// The root `/` resolves absolute host paths as they are.
    #[test]
    fn slash_root_is_the_host() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("real")).unwrap();
        std::fs::write(t.path().join("real/libx.so.1"), "elf").unwrap();
        symlink("real", t.path().join("link")).unwrap();
        let root = Root::open(Path::new("/")).unwrap();
        let e = root
            .lookup(&t.path().join("link/libx.so.1"), Scope::InRoot)
            .unwrap();
        assert_eq!(
            e.host,
            t.path().canonicalize().unwrap().join("real/libx.so.1")
        );
        assert!(e.is_file());
        let up = root
            .lookup(Path::new("/../../dev/../dev/null"), Scope::InRoot)
            .unwrap();
        assert_eq!(up.host, Path::new("/dev/null"));
        assert_eq!(up.file_type(), FileType::CharacterDevice);
        assert_eq!(root.rel_of(&up.host).unwrap(), Path::new("/dev/null"));
    }
}
