//! Finding the driver's libraries and binaries on the host, inside the driver root only.
//!
//! Libraries come from `<driver-root>/etc/ld.so.cache` (parsed natively), falling back to the
//! profile's search directories, for trees no cache knows (GKE's /usr/local/nvidia).
//! Symlinks are followed as if `driver-root` were `/`, so no link in a driver tree can make the
//! shim mount a host file from outside it (the class of CVE-2024-0132: a path that resolves
//! somewhere it should not by the time it is used).
//!
//! Every look at the host is relative to the driver root, opened once, and never follows a
//! link by itself (`readlinkat`, `fstatat(AT_SYMLINK_NOFOLLOW)`, `openat(O_NOFOLLOW)`): links
//! are read and walked here, under the root.

use std::ffi::{OsStr, OsString};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use rustix::buffer::spare_capacity;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir, CWD};
use rustix::io::Errno;

use crate::ldcache;
use crate::profile::Profile;

const MAX_SYMLINKS: usize = 40;
/// Longer than any symlink target Linux stores (`PATH_MAX` with its NUL).
const LINK_MAX: usize = 4096;
/// getdents64's buffer for listing a search directory: a few hundred names a call.
const DIR_BUF: usize = 8 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Host path of the real file (symlinks resolved within the root).
    pub host: PathBuf,
    /// File name to give it in the container: the soname for libraries.
    pub name: String,
}

/// Resolves `path` (absolute, container-style) under `root` as a chroot would: `..` and
/// absolute symlink targets stay inside `root`. Returns the host path of the final file.
pub fn resolve_in_root(root: &Path, path: &Path) -> std::io::Result<PathBuf> {
    Resolver::new(root).resolve(path).map(|r| r.host)
}

/// A path resolved inside the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub host: PathBuf,
    /// Whether the final component is a regular file (it is never a symlink).
    pub is_file: bool,
}

/// What one path under the root turned out to be.
#[derive(Debug, Clone)]
enum Lookup {
    /// The target, as a range of [`Resolver::names`].
    Link(Range<usize>),
    /// Exists and is no symlink; whether it is a regular file, once that was asked: a
    /// directory on the way to a file needs only `readlinkat` (which says "no link" with
    /// EINVAL), not a stat as well.
    Node(Option<bool>),
    /// The look failed (mostly ENOENT): remembered, as the search directories share missing
    /// parents (`usr/local` for three of them).
    Failed(Errno),
}

/// Resolves paths under one root as [`resolve_in_root`] does, remembering what each path
/// turned out to be: the libraries and binaries of a create share their directories (`usr`,
/// `usr/lib/x86_64-linux-gnu`), which are then looked at once rather than once per file. Use
/// one for a single create only (the answers are as of the first look).
#[derive(Debug)]
pub struct Resolver<'a> {
    root: &'a Path,
    /// `root` without trailing slashes: empty for `/`.
    prefix: &'a [u8],
    /// The root, opened (`O_PATH`) at the first look: paths are then walked from it, not
    /// from `/` through the root's own components on every call. Not used for `/` itself,
    /// whose paths are walked from the cwd's fd as absolute ones.
    dir: Option<Result<OwnedFd, Errno>>,
    /// Paths under the root (`/usr/lib`, as in the container) as ranges of `names`, and what
    /// each was; a create resolves a few dozen, so a list beats hashing.
    seen: Vec<(Range<usize>, Lookup)>,
    /// The bytes of the paths in `seen` and of the links' targets: one buffer, not an
    /// allocation each.
    names: Vec<u8>,
    /// The directory of the last path walked when that path spelled it as it resolved (no
    /// link, `.`, `..` or doubled slash in it): the next path in the same directory (the
    /// libraries of a driver share one) starts its walk after it instead of looking each of
    /// its components up again. Empty when there is none.
    last_dir: Vec<u8>,
    /// Buffers reused by every walk: what is left to walk, the path walked so far, and
    /// readlinkat's room (a target is then copied to `names`: reading it there would make
    /// `names` grow by the room each time, reallocating and touching fresh pages).
    rest: Vec<u8>,
    key: Vec<u8>,
    link: Vec<u8>,
}

impl<'a> Resolver<'a> {
    pub fn new(root: &'a Path) -> Self {
        let bytes = root.as_os_str().as_bytes();
        let trimmed = bytes.len() - bytes.iter().rev().take_while(|&&b| b == b'/').count();
        Resolver {
            root,
            prefix: &bytes[..trimmed],
            dir: None,
            seen: Vec::with_capacity(64),
            // Room for the paths of a create (a few dozen, 40 bytes each), grown only beyond.
            names: Vec::with_capacity(2048),
            last_dir: Vec::new(),
            rest: Vec::new(),
            key: Vec::new(),
            link: Vec::new(),
        }
    }

    pub fn root(&self) -> &Path {
        self.root
    }

    /// The fd and path to give an `*at` call for `key` (a path under the root, `/...`).
    fn at<'k>(&mut self, key: &'k [u8]) -> Result<(BorrowedFd<'_>, &'k [u8]), Errno> {
        if self.prefix.is_empty() {
            return Ok((CWD, if key.is_empty() { b"/" } else { key }));
        }
        let root = self.root;
        let dir = self.dir.get_or_insert_with(|| {
            rustix::fs::open(
                root,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
        });
        let path: &[u8] = match key.get(1..) {
            Some(rel) if !rel.is_empty() => rel,
            _ => b".",
        };
        match &*dir {
            Ok(fd) => Ok((fd.as_fd(), path)),
            Err(e) => Err(*e),
        }
    }

    /// Looks at `key` on the host: `kind` asks whether it is a regular file as well.
    fn look(&mut self, key: &[u8], kind: bool) -> Lookup {
        let mut link = std::mem::take(&mut self.link);
        let l = match self.at(key) {
            Err(e) => Lookup::Failed(e),
            Ok((dir, path)) => {
                let stat = if kind {
                    rustix::fs::statat(dir, path, AtFlags::SYMLINK_NOFOLLOW).map(|st| {
                        let t = FileType::from_raw_mode(st.st_mode);
                        (t != FileType::Symlink).then_some(t == FileType::RegularFile)
                    })
                } else {
                    Ok(None)
                };
                match stat {
                    Err(e) => Lookup::Failed(e),
                    Ok(Some(is_file)) => Lookup::Node(Some(is_file)),
                    Ok(None) => {
                        link.clear();
                        link.reserve(LINK_MAX);
                        match rustix::fs::readlinkat_raw(dir, path, spare_capacity(&mut link)) {
                            Ok(n) if n < LINK_MAX => {
                                let start = self.names.len();
                                self.names.extend_from_slice(&link);
                                Lookup::Link(start..self.names.len())
                            }
                            Ok(_) => Lookup::Failed(Errno::NAMETOOLONG),
                            // Not a link (the only other cause, a zero size, is not ours).
                            Err(Errno::INVAL) if !kind => Lookup::Node(None),
                            Err(e) => Lookup::Failed(e),
                        }
                    }
                }
            }
        };
        self.link = link;
        l
    }

    /// What `key` is, looked at on first use: `kind` when the caller needs to know whether it
    /// is a regular file.
    fn lookup(&mut self, key: &[u8], kind: bool) -> Result<Step<'_>, Errno> {
        let names = &self.names;
        let i = match self
            .seen
            .iter()
            .rposition(|(p, _)| names[p.clone()] == *key)
        {
            Some(i) => {
                if kind && matches!(self.seen[i].1, Lookup::Node(None)) {
                    self.seen[i].1 = self.look(key, true);
                }
                i
            }
            None => {
                let l = self.look(key, kind);
                let start = self.names.len();
                self.names.extend_from_slice(key);
                self.seen.push((start..self.names.len(), l));
                self.seen.len() - 1
            }
        };
        match &self.seen[i].1 {
            Lookup::Link(target) => Ok(Step::Link(&self.names[target.clone()])),
            Lookup::Node(is_file) => Ok(Step::Node(is_file.unwrap_or(false))),
            Lookup::Failed(e) => Err(*e),
        }
    }

    /// Resolves `path` (absolute, container-style) under the root as a chroot would.
    pub fn resolve(&mut self, path: &Path) -> std::io::Result<Resolved> {
        self.resolve_bytes(path.as_os_str().as_bytes())
    }

    fn resolve_bytes(&mut self, path: &[u8]) -> std::io::Result<Resolved> {
        let is_file = self.walk(path, true)?;
        Ok(Resolved {
            host: self.host(),
            is_file,
        })
    }

    /// The host path `path` resolves to, when it exists, without asking what it is (a library
    /// the cache names).
    fn locate(&mut self, path: &[u8]) -> std::io::Result<PathBuf> {
        self.walk(path, false)?;
        Ok(self.host())
    }

    /// As [`Resolver::locate`], as the path under the root (for [`Resolver::list`]).
    fn locate_key(&mut self, path: &[u8]) -> std::io::Result<Vec<u8>> {
        self.walk(path, false)?;
        Ok(self.key.clone())
    }

    /// The names in the directory at `key` (a resolved path under the root) that `wanted`
    /// takes; none when it cannot be read. Names are looked at in getdents64's buffer `buf`
    /// and copied only when wanted (a GPU node's /usr/lib/x86_64-linux-gnu held 720).
    fn list(
        &mut self,
        key: &[u8],
        buf: &mut Vec<u8>,
        wanted: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Ok(fd) = self
            .at(key)
            .and_then(|(dir, path)| rustix::fs::openat(dir, path, flags, Mode::empty()))
        else {
            return Vec::new();
        };
        if buf.capacity() == 0 {
            buf.reserve(DIR_BUF);
        }
        let mut names = Vec::new();
        let mut entries = RawDir::new(fd, buf.spare_capacity_mut());
        while let Some(Ok(e)) = entries.next() {
            if let Ok(name) = e.file_name().to_str() {
                if wanted(name) {
                    names.push(name.to_string());
                }
            }
        }
        names
    }

    /// The host path of the last walk.
    fn host(&self) -> PathBuf {
        if self.key.is_empty() {
            return self.root.to_path_buf();
        }
        let mut host = Vec::with_capacity(self.prefix.len() + self.key.len());
        host.extend_from_slice(self.prefix);
        host.extend_from_slice(&self.key);
        PathBuf::from(OsString::from_vec(host))
    }

    /// Walks `path` into `self.key`: the path under the root, `/`-separated, with no `.`,
    /// `..` or link left in it. Returns whether the end is a regular file when `kind` asks
    /// (false otherwise).
    fn walk(&mut self, path: &[u8], kind: bool) -> std::io::Result<bool> {
        let mut rest = std::mem::take(&mut self.rest);
        let mut key = std::mem::take(&mut self.key);
        rest.clear();
        rest.extend_from_slice(path);
        key.clear();
        let r = self.walk_in(&mut rest, &mut key, kind);
        if let Ok((_, verbatim)) = r {
            // The directory part of `path`, when it was walked as spelled.
            let dir = path.iter().rposition(|&b| b == b'/').unwrap_or(0);
            if dir > 0 && verbatim >= dir {
                self.last_dir.clear();
                self.last_dir.extend_from_slice(&path[..dir]);
            }
        }
        self.rest = rest;
        self.key = key;
        r.map(|(is_file, _)| is_file)
    }

    fn walk_in(
        &mut self,
        rest: &mut Vec<u8>,
        key: &mut Vec<u8>,
        kind: bool,
    ) -> std::io::Result<(bool, usize)> {
        let prefix = self.prefix;
        // `rest[pos..]` is still to walk; a link's target is put in place of what was walked.
        let mut pos = 0;
        let dir = self.last_dir.len();
        if dir > 0
            && rest.starts_with(&self.last_dir)
            && rest.get(dir) == Some(&b'/')
            && !is_end(rest, dir)
        {
            key.extend_from_slice(&self.last_dir);
            pos = dir;
        }
        // How much of `rest` resolved to itself: `key == rest[..verbatim]`, until a link.
        let mut verbatim = pos;
        let mut linked = false;
        // The root itself and anything reached by `..` is a directory.
        let mut is_file = false;
        let mut hops = 0;
        while let Some((start, end)) = next_component(rest, pos) {
            pos = end;
            if &rest[start..end] == b".." {
                // `..` never climbs above the root.
                let parent = key.iter().rposition(|&b| b == b'/').unwrap_or(0);
                key.truncate(parent);
                is_file = false;
                linked = true;
                continue;
            }
            let len = key.len();
            key.push(b'/');
            key.extend_from_slice(&rest[start..end]);
            // Only the end's kind is asked for: on the way, "no link" is all that matters.
            let last = kind && is_end(rest, pos);
            match self.lookup(key, last)? {
                Step::Link(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINKS {
                        let mut host = prefix.to_vec();
                        host.extend_from_slice(key);
                        return Err(std::io::Error::other(format!(
                            "{}: too many levels of symbolic links",
                            Path::new(OsStr::from_bytes(&host)).display()
                        )));
                    }
                    key.truncate(len);
                    if target.first() == Some(&b'/') {
                        key.clear();
                        is_file = false;
                    }
                    rest.splice(..pos, target.iter().copied().chain([b'/']));
                    pos = 0;
                    linked = true;
                }
                Step::Node(f) => {
                    is_file = f;
                    if !linked && key.len() == pos {
                        verbatim = pos;
                    }
                }
            }
        }
        Ok((is_file, verbatim))
    }
}

/// A lookup's answer, borrowed from the resolver's memory.
enum Step<'s> {
    Link(&'s [u8]),
    Node(bool),
}

/// The next component of `path` from `pos` as its range, skipping slashes and `.`.
fn next_component(path: &[u8], mut pos: usize) -> Option<(usize, usize)> {
    loop {
        while path.get(pos) == Some(&b'/') {
            pos += 1;
        }
        if pos >= path.len() {
            return None;
        }
        let end = path[pos..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(path.len(), |n| pos + n);
        if &path[pos..end] != b"." {
            return Some((pos, end));
        }
        pos = end;
    }
}

/// Whether nothing but slashes and `.` is left of `path` from `pos`.
fn is_end(path: &[u8], pos: usize) -> bool {
    next_component(path, pos).is_none()
}

/// The sonames `stem` has in the cache: `libcuda` matches `libcuda.so` and `libcuda.so.*`.
fn matches_stem(name: &str, stem: &str) -> bool {
    name.strip_prefix(stem)
        .and_then(|r| r.strip_prefix(".so"))
        .is_some_and(|r| r.is_empty() || r.starts_with('.'))
}

/// Every library of `stems` the driver root has, one entry per soname, in the order of
/// `stems`. Libraries the driver does not ship are left out (not every driver build has every
/// one). `resolver` must be for the profile's driver root.
pub fn libraries(
    profile: &Profile,
    stems: &[&str],
    cache: &ldcache::Cache,
    resolver: &mut Resolver,
) -> Vec<Found> {
    let mut found: Vec<Vec<Found>> = stems
        .iter()
        .map(|stem| from_cache(stem, cache, resolver))
        .collect();
    let missing: Vec<usize> = (0..stems.len()).filter(|&i| found[i].is_empty()).collect();
    if !missing.is_empty() {
        search_dirs(profile, cache, resolver, stems, missing, &mut found);
    }
    let mut out: Vec<Found> = Vec::new();
    for f in found.into_iter().flatten() {
        if !out.iter().any(|o| o.name == f.name) {
            out.push(f);
        }
    }
    out
}

/// The directories the cache's entries are in, as ldconfig spelled them.
fn cache_dirs(cache: &ldcache::Cache) -> Vec<&[u8]> {
    let mut dirs: Vec<&[u8]> = Vec::new();
    for e in cache.iter() {
        let p = e.path.as_os_str().as_bytes();
        if let Some(slash) = p.iter().rposition(|&b| b == b'/') {
            let dir = &p[..slash];
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// The cache's libraries of `stem` that exist under the root, one per soname.
fn from_cache(stem: &str, cache: &ldcache::Cache, resolver: &mut Resolver) -> Vec<Found> {
    let mut found: Vec<Found> = Vec::new();
    for e in cache
        .iter()
        .filter(|e| e.is_native() && matches_stem(e.name, stem))
    {
        if found.iter().any(|f| f.name == e.name) {
            continue;
        }
        if let Ok(host) = resolver.locate(e.path.as_os_str().as_bytes()) {
            found.push(Found {
                host,
                name: e.name.to_string(),
            });
        }
    }
    drop_dev_links(&mut found);
    found
}

/// The loader looks up sonames. `libcuda.so` next to `libcuda.so.1` is the linker's dev link,
/// not a soname, so it is dropped; a library whose soname *is* unversioned (Ascend ships
/// `libascend_hal.so` so) has no versioned sibling and is kept.
fn drop_dev_links(found: &mut Vec<Found>) {
    if found.iter().any(|f| !f.name.ends_with(".so")) {
        found.retain(|f| !f.name.ends_with(".so"));
    }
}

/// For each stem in `missing` (indices into `stems`), the files named `stem.so*` in the first
/// of the profile's search directories that has any, into `found`. Each directory is listed
/// once, as resolved under the root, and only while a stem is still unresolved; only the
/// names some missing stem matches are kept (a distro's /usr/lib/x86_64-linux-gnu holds
/// hundreds of files). A directory that does not exist is skipped without being opened.
fn search_dirs(
    profile: &Profile,
    cache: &ldcache::Cache,
    resolver: &mut Resolver,
    stems: &[&str],
    mut missing: Vec<usize>,
    found: &mut [Vec<Found>],
) {
    // A directory ldconfig indexed holds no library the cache lacks: listing it again finds
    // nothing (on a GPU node, /usr/lib/x86_64-linux-gnu's 720 entries on every create, for
    // the stems this driver does not ship). Compared as resolved under the root: ldconfig may
    // spell a directory through a link (`/lib/x86_64-linux-gnu` on a distro whose /lib is a
    // link to usr/lib); so is a search directory that is a link to one listed before.
    let mut done: Vec<Vec<u8>> = cache_dirs(cache)
        .into_iter()
        .filter_map(|d| resolver.locate_key(d).ok())
        .collect();
    // getdents64's buffer, shared by the listings; the kernel touches what it fills.
    let mut buf: Vec<u8> = Vec::new();
    let mut path: Vec<u8> = Vec::new();
    for dir in &profile.library_search_dirs {
        if missing.is_empty() {
            return;
        }
        let Ok(key) = resolver.locate_key(dir.as_os_str().as_bytes()) else {
            continue;
        };
        if done.contains(&key) {
            continue;
        }
        let wanted = |n: &str| missing.iter().any(|&i| matches_stem(n, stems[i]));
        let mut names = resolver.list(&key, &mut buf, wanted);
        names.sort();
        missing.retain(|&i| {
            let mut here: Vec<Found> = Vec::new();
            let mut any = false;
            for name in names.iter().filter(|n| matches_stem(n, stems[i])) {
                any = true;
                path.clear();
                path.extend_from_slice(&key);
                path.push(b'/');
                path.extend_from_slice(name.as_bytes());
                if let Ok(r) = resolver.resolve_bytes(&path) {
                    if r.is_file {
                        here.push(Found {
                            host: r.host,
                            name: name.clone(),
                        });
                    }
                }
            }
            drop_dev_links(&mut here);
            found[i] = here;
            !any
        });
        done.push(key);
    }
}

/// For each of `names`, the first ELF file of that name in the profile's binary search dirs,
/// else the first regular file. Hosts put wrapper scripts in `/usr/bin` that `exec` the real
/// tool by its host path (seen on a GPU node whose driver lives in /usr/local/nvidia): such a
/// script mounted into a container only fails there, so an ELF found later wins over it.
/// `resolver` must be for the profile's driver root.
pub fn binaries(profile: &Profile, names: &[&str], resolver: &mut Resolver) -> Vec<Found> {
    // Every regular file of each name, in the order of the dirs; one reached twice (`/bin` is
    // often a link to `/usr/bin`) counts once.
    let mut files: Vec<Vec<PathBuf>> = vec![Vec::new(); names.len()];
    let mut path: Vec<u8> = Vec::new();
    for dir in &profile.binary_search_dirs {
        // A directory that does not exist (most of them, on most hosts) is looked at once,
        // not once per name.
        let Ok(key) = resolver.locate_key(dir.as_os_str().as_bytes()) else {
            continue;
        };
        for (name, files) in names.iter().zip(&mut files) {
            path.clear();
            path.extend_from_slice(&key);
            path.push(b'/');
            path.extend_from_slice(name.as_bytes());
            if let Ok(r) = resolver.resolve_bytes(&path) {
                if r.is_file && !files.contains(&r.host) {
                    files.push(r.host);
                }
            }
        }
    }
    names
        .iter()
        .zip(files)
        .filter_map(|(name, mut files)| {
            // A lone file is the answer whatever it holds: reading it (open, read, close)
            // only pays when there is a choice, and looking in the other dirs costs less
            // (each is looked at once per create, and mostly does not exist).
            let pick = match files.len() {
                0 => return None,
                1 => 0,
                _ => files.iter().position(|f| is_elf(f)).unwrap_or(0),
            };
            Some(Found {
                host: files.swap_remove(pick),
                name: name.to_string(),
            })
        })
        .collect()
}

/// Whether `path`, a regular file just resolved, starts with the ELF magic. `O_NOFOLLOW`: had
/// a link replaced it since, it is not opened through that link.
fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut magic = [0u8; 4];
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::builtin_nvidia as nvidia;
    use std::os::unix::fs::symlink;

    #[test]
    fn absolute_symlink_stays_in_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::write(r.join("etc/passwd"), "fake").unwrap();
        symlink("/etc/passwd", r.join("usr/lib/libevil.so.1")).unwrap();
        symlink(
            "../../../../../../etc/passwd",
            r.join("usr/lib/libevil2.so.1"),
        )
        .unwrap();
        assert_eq!(
            resolve_in_root(r, Path::new("/usr/lib/libevil.so.1")).unwrap(),
            r.join("etc/passwd")
        );
        assert_eq!(
            resolve_in_root(r, Path::new("/usr/lib/libevil2.so.1")).unwrap(),
            r.join("etc/passwd")
        );
    }

    /// A resolver shared by many lookups answers as fresh ones do, through symlinked
    /// directories, `..` and absolute links alike.
    #[test]
    fn shared_resolver_matches_fresh_resolution() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib/real")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::write(r.join("usr/lib/real/libx.so.1"), "elf").unwrap();
        symlink("real", r.join("usr/lib/link")).unwrap();
        symlink("/usr/lib/real", r.join("usr/lib/abs")).unwrap();
        symlink("../../../../etc", r.join("usr/lib/real/up")).unwrap();
        let paths = [
            "/usr/lib/link/libx.so.1",
            "/usr/lib/abs/libx.so.1",
            "/usr/lib/link/../real/libx.so.1",
            "/usr/lib/real/up",
            "/usr/lib/link",
            "/usr/lib/link/libx.so.1/..",
            "/usr/lib/abs/missing",
            // Same directory as the path before, spelled through `..`, `.`, `//`, a link.
            "/usr/lib/real/libx.so.1",
            "/usr/lib/real/up/../real",
            "/usr/lib/real/../link/libx.so.1",
            "/usr/lib/real/./libx.so.1",
            "/usr/lib/real//libx.so.1/",
            "/usr/lib/real/libx.so.1/x",
            "/usr/lib/realx",
            "/usr/lib/real",
            "/usr/lib/real/",
            "/usr/lib/real/.",
            "/usr/lib/real/up/passwd",
        ];
        let mut shared = Resolver::new(r);
        for _ in 0..2 {
            for p in paths {
                let fresh = Resolver::new(r).resolve(Path::new(p));
                let again = shared.resolve(Path::new(p));
                match (fresh, again) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{p}"),
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("{p}: {a:?} vs {b:?}"),
                }
            }
        }
        let got = shared.resolve(Path::new("/usr/lib/abs/libx.so.1")).unwrap();
        assert_eq!(got.host, r.join("usr/lib/real/libx.so.1"));
        assert!(got.is_file);
        let up = shared.resolve(Path::new("/usr/lib/real/up")).unwrap();
        assert_eq!(up.host, r.join("etc"));
        let dir = shared.resolve(Path::new("/usr/lib/link")).unwrap();
        assert!(!dir.is_file);
    }

    #[test]
    fn dotdot_never_climbs_above_the_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        symlink("../../../../etc", r.join("usr/lib/up")).unwrap();
        for p in ["/../../etc", "/usr/../../etc", "/usr/lib/up"] {
            assert_eq!(
                resolve_in_root(r, Path::new(p)).unwrap(),
                r.join("etc"),
                "{p}"
            );
        }
    }

    #[test]
    fn symlink_loop_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        symlink("b", root.path().join("a")).unwrap();
        symlink("a", root.path().join("b")).unwrap();
        assert!(resolve_in_root(root.path(), Path::new("/a")).is_err());
    }

    /// The root `/` is walked from the cwd's fd with absolute paths, not from an fd of its own.
    #[test]
    fn slash_root_resolves_absolute_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        std::fs::create_dir_all(t.join("real")).unwrap();
        std::fs::write(t.join("real/libx.so.1"), "elf").unwrap();
        symlink("real", t.join("link")).unwrap();
        let mut res = Resolver::new(Path::new("/"));
        let got = res.resolve(&t.join("link/libx.so.1")).unwrap();
        assert_eq!(got.host, t.join("real/libx.so.1"));
        assert!(got.is_file);
        let up = res.resolve(Path::new("/../../dev/../dev/null")).unwrap();
        assert_eq!(up.host, Path::new("/dev/null"));
        assert!(!up.is_file);
        assert_eq!(res.resolve(Path::new("/..")).unwrap().host, Path::new("/"));
    }

    /// A missing root, a missing file, a file used as a directory: errors, and the same ones
    /// when asked again (failures are remembered).
    #[test]
    fn failures_are_errors_every_time() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::write(r.join("file"), "x").unwrap();
        let mut res = Resolver::new(r);
        for _ in 0..2 {
            let e = res.resolve(Path::new("/missing/x")).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            let e = res.resolve(Path::new("/file/x")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
        }
        // Known as "no link" on the way to another path, then asked for its kind.
        assert!(res.resolve(Path::new("/file")).unwrap().is_file);
        let gone = r.join("gone");
        assert!(Resolver::new(&gone).resolve(Path::new("/x")).is_err());
    }

    #[test]
    fn symlink_loop_names_the_link() {
        let root = tempfile::tempdir().unwrap();
        symlink("b", root.path().join("a")).unwrap();
        symlink("a", root.path().join("b")).unwrap();
        let e = resolve_in_root(root.path(), Path::new("/a")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("{}/", root.path().display())),
            "{e}"
        );
        assert!(
            e.to_string().ends_with("too many levels of symbolic links"),
            "{e}"
        );
    }

    /// A search directory that is an absolute link is listed where the link points inside the
    /// root, never where it would point on the host.
    #[test]
    fn search_dir_link_is_listed_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let host_dir = tempfile::tempdir().unwrap();
        // On the host, the link's target holds a library of another name.
        std::fs::write(host_dir.path().join("libnvidia-cfg.so.1"), "elf").unwrap();
        let inside = r.join(host_dir.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::write(inside.join("libnvidia-ml.so.1"), "elf").unwrap();
        std::fs::create_dir_all(r.join("usr")).unwrap();
        symlink(host_dir.path(), r.join("usr/lib64")).unwrap();
        let mut p = nvidia();
        p.library_search_dirs = vec!["/usr/lib64".into()];
        let found = libraries(
            &p,
            &["libnvidia-ml", "libnvidia-cfg"],
            &ldcache::Cache::default(),
            &mut Resolver::new(r),
        );
        assert_eq!(
            found,
            [Found {
                host: inside.join("libnvidia-ml.so.1"),
                name: "libnvidia-ml.so.1".into()
            }]
        );
    }

    #[test]
    fn stem_matching() {
        assert!(matches_stem("libcuda.so.1", "libcuda"));
        assert!(matches_stem("libcuda.so", "libcuda"));
        assert!(!matches_stem("libcudadebugger.so.1", "libcuda"));
        assert!(!matches_stem(
            "libnvidia-pkcs11-openssl3.so.550",
            "libnvidia-pkcs11"
        ));
    }

    #[test]
    fn cache_then_search_dirs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::create_dir_all(r.join("usr/local/nvidia/lib64")).unwrap();
        std::fs::write(
            r.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"),
            "elf",
        )
        .unwrap();
        symlink(
            "libcuda.so.550.54.14",
            r.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        )
        .unwrap();
        std::fs::write(
            r.join("usr/local/nvidia/lib64/libnvidia-ml.so.550.54.14"),
            "elf",
        )
        .unwrap();
        symlink(
            "libnvidia-ml.so.550.54.14",
            r.join("usr/local/nvidia/lib64/libnvidia-ml.so.1"),
        )
        .unwrap();
        let mut p = nvidia();
        p.driver_root = r.to_path_buf();
        let cache = ldcache::Cache::parse(ldcache::build(&[
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                ldcache::native_flags(),
            ),
            (
                "libcuda.so",
                "/usr/lib/x86_64-linux-gnu/libcuda.so",
                ldcache::native_flags(),
            ),
        ]))
        .unwrap();
        let found = libraries(
            &p,
            &["libcuda", "libnvidia-ml", "libnvoptix"],
            &cache,
            &mut Resolver::new(r),
        );
        let names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "libcuda.so.1",
                "libnvidia-ml.so.1",
                "libnvidia-ml.so.550.54.14"
            ]
        );
        assert_eq!(
            found[0].host,
            r.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14")
        );
    }

    /// Ascend's driver libraries have unversioned sonames (`libascend_hal.so`): they are the
    /// soname and must be found; a dev link next to a versioned soname must not.
    #[test]
    fn elf_binary_wins_over_an_earlier_wrapper_script() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["usr/bin", "usr/local/nvidia/bin", "opt/bin"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        // A wrapper in /usr/bin, the real tool later: the tool is taken.
        std::fs::write(
            root.join("usr/bin/nvidia-smi"),
            "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n",
        )
        .unwrap();
        std::fs::write(
            root.join("usr/local/nvidia/bin/nvidia-smi"),
            b"\x7fELF\x02\x01",
        )
        .unwrap();
        // A lone script is taken without being read.
        std::fs::write(root.join("opt/bin/tool"), "#!/bin/sh\n").unwrap();
        // Only a script anywhere: the script is taken (a vendor may ship one).
        std::fs::write(root.join("usr/bin/efsmi"), "#!/bin/sh\necho efsmi\n").unwrap();
        std::fs::write(root.join("opt/bin/efsmi"), "#!/bin/sh\necho later\n").unwrap();
        let mut profile = nvidia();
        // `/bin` is a link to usr/bin: a file reached through both counts once.
        symlink("usr/bin", root.join("bin")).unwrap();
        profile.binary_search_dirs = ["/usr/bin", "/bin", "/usr/local/nvidia/bin", "/opt/bin"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let names = ["nvidia-smi", "efsmi", "absent", "tool"];
        let found = binaries(&profile, &names, &mut Resolver::new(root));
        assert_eq!(
            found,
            vec![
                Found {
                    host: root.join("usr/local/nvidia/bin/nvidia-smi"),
                    name: "nvidia-smi".into()
                },
                Found {
                    host: root.join("usr/bin/efsmi"),
                    name: "efsmi".into()
                },
                Found {
                    host: root.join("opt/bin/tool"),
                    name: "tool".into()
                },
            ]
        );
    }

    #[test]
    fn each_missing_stem_comes_from_the_first_dir_that_has_it() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for (dir, file) in [
            ("a", "libnvidia-ml.so.1"),
            ("a", "unrelated.so.1"),
            ("b", "libcuda.so.1"),
            ("b", "libnvidia-ml.so.1"),
        ] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
            std::fs::write(r.join(dir).join(file), "elf").unwrap();
        }
        let mut p = nvidia();
        p.library_search_dirs = vec!["/none".into(), "/a".into(), "/b".into()];
        let stems = ["libcuda", "libnvidia-ml", "libnvoptix"];
        let found = libraries(
            &p,
            &stems,
            &ldcache::Cache::default(),
            &mut Resolver::new(r),
        );
        assert_eq!(
            found,
            vec![
                Found {
                    host: r.join("b/libcuda.so.1"),
                    name: "libcuda.so.1".into()
                },
                Found {
                    host: r.join("a/libnvidia-ml.so.1"),
                    name: "libnvidia-ml.so.1".into()
                },
            ]
        );
    }

    #[test]
    fn search_skips_dirs_the_cache_indexed() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for (dir, file) in [
            ("usr/lib/x86_64-linux-gnu", "libcuda.so.1"),
            // Not in the cache although in an indexed dir: ldconfig would have listed it.
            ("usr/lib/x86_64-linux-gnu", "libnvidia-ml.so.1"),
            ("opt/x", "libnvidia-ml.so.1"),
        ] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
            std::fs::write(r.join(dir).join(file), "elf").unwrap();
        }
        let mut p = nvidia();
        // ldconfig spelled the directory through a link, the profile does not.
        symlink("usr/lib", r.join("lib")).unwrap();
        p.library_search_dirs = vec!["/usr/lib/x86_64-linux-gnu/".into(), "/opt/x".into()];
        let cache = ldcache::Cache::parse(ldcache::build(&[(
            "libcuda.so.1",
            "/lib/x86_64-linux-gnu/libcuda.so.1",
            ldcache::native_flags(),
        )]))
        .unwrap();
        let stems = ["libcuda", "libnvidia-ml"];
        let found = libraries(&p, &stems, &cache, &mut Resolver::new(r));
        assert_eq!(
            found.iter().map(|f| f.host.clone()).collect::<Vec<_>>(),
            [
                r.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                r.join("opt/x/libnvidia-ml.so.1")
            ]
        );
    }

    #[test]
    fn unversioned_soname_is_kept_dev_link_is_not() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let lib = r.join("usr/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libascend_hal.so"), "elf").unwrap();
        std::fs::write(lib.join("libcuda.so.1"), "elf").unwrap();
        symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
        let mut p = nvidia();
        p.driver_root = r.to_path_buf();
        let flags = ldcache::native_flags();
        let cache = ldcache::Cache::parse(ldcache::build(&[
            ("libascend_hal.so", "/usr/lib/libascend_hal.so", flags),
            ("libcuda.so.1", "/usr/lib/libcuda.so.1", flags),
            ("libcuda.so", "/usr/lib/libcuda.so", flags),
        ]))
        .unwrap();
        let stems = ["libascend_hal", "libcuda"];
        let names =
            |found: Vec<Found>| -> Vec<String> { found.into_iter().map(|f| f.name).collect() };
        assert_eq!(
            names(libraries(&p, &stems, &cache, &mut Resolver::new(r))),
            ["libascend_hal.so", "libcuda.so.1"]
        );
        // The same through the search directories (no cache).
        p.library_search_dirs = vec!["/usr/lib".into()];
        let mut res = Resolver::new(r);
        assert_eq!(
            names(libraries(
                &p,
                &stems[..1],
                &ldcache::Cache::default(),
                &mut res
            )),
            ["libascend_hal.so"]
        );
        assert_eq!(
            names(libraries(
                &p,
                &stems[1..],
                &ldcache::Cache::default(),
                &mut res
            )),
            ["libcuda.so.1"]
        );
    }
}
