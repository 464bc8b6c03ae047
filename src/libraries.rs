//! Finding the driver's libraries and binaries on the host, inside the driver root only.
//!
//! Libraries come from `<driver-root>/etc/ld.so.cache` (parsed natively), falling back to the
//! profile's search directories, for trees no cache knows (GKE's /usr/local/nvidia).
//! Every path is resolved by [`crate::inroot`] as if `driver-root` were `/`
//! ([`Scope::InRoot`]), so no link in a driver tree can make the shim mount a host file from
//! outside it (the class of CVE-2024-0132: a path that resolves somewhere it should not by
//! the time it is used).

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{OFlags, RawDir};
use rustix::io::Errno;

use crate::inroot::{reopen, Entry, Root, Scope};
use crate::ldcache;
use crate::profile::Profile;

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

/// `errno` as an error naming `path` (kept in its kind).
fn named(errno: Errno, path: &Path) -> std::io::Error {
    let e = std::io::Error::from(errno);
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// A path resolved inside the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub host: PathBuf,
    /// Whether the final component is a regular file (it is never a symlink).
    pub is_file: bool,
}

/// The driver root of one create, opened at the first look and shared by its libraries and
/// binaries.
#[derive(Debug)]
pub struct Resolver<'a> {
    root: &'a Path,
    opened: Option<Result<Root, Errno>>,
}

impl<'a> Resolver<'a> {
    pub fn new(root: &'a Path) -> Self {
        Resolver { root, opened: None }
    }

    pub fn root(&self) -> &Path {
        self.root
    }

    fn opened(&mut self) -> std::io::Result<&Root> {
        let root = self.root;
        let opened = self.opened.get_or_insert_with(|| {
            Root::open(root).map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
        });
        match opened {
            Ok(r) => Ok(r),
            Err(e) => Err(named(*e, root)),
        }
    }

    /// Resolves `path` (absolute, container-style) under the root as a chroot would. For a
    /// library by its soname, which is a link as a rule ([`Root::lookup_link`]).
    pub fn resolve(&mut self, path: &Path) -> std::io::Result<Resolved> {
        let e = self.found(path, true)?;
        Ok(Resolved {
            is_file: e.is_file(),
            host: e.host,
        })
    }

    /// A tool's lookup (seldom a link), with its `O_PATH` fd, for a file read later from the
    /// inode that was checked.
    fn entry(&mut self, path: &Path) -> std::io::Result<Entry> {
        self.found(path, false)
    }

    fn found(&mut self, path: &Path, link: bool) -> std::io::Result<Entry> {
        let root = self.opened()?;
        let found = if link {
            root.lookup_link(path, Scope::InRoot)
        } else {
            root.lookup(path, Scope::InRoot)
        };
        found.map_err(|e| named(e, &root.display(path)))
    }

    /// The path under the root that directory `path` resolves to (`/usr/lib64` when
    /// `/lib64` is a link to it): one spelling per directory, to look at each once.
    fn dir_key(&mut self, path: &Path) -> std::io::Result<PathBuf> {
        let e = self.found(path, false)?;
        let root = self.opened()?;
        root.rel_of(&e.host).ok_or_else(|| {
            std::io::Error::other(format!("{}: not under the root", e.host.display()))
        })
    }

    /// The names in directory `key` (from [`Resolver::dir_key`]) that `wanted` takes; none
    /// when it cannot be read. Names are looked at in getdents64's buffer `buf` and copied
    /// only when wanted (a GPU node's /usr/lib/x86_64-linux-gnu held 720).
    fn list(
        &mut self,
        key: &Path,
        buf: &mut Vec<u8>,
        wanted: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let Ok(fd) = self
            .opened()
            .and_then(|r| Ok(r.open_at(key, OFlags::RDONLY | OFlags::DIRECTORY, Scope::InRoot)?))
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
        if let Ok(r) = resolver.resolve(e.path) {
            found.push(Found {
                host: r.host,
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
    let mut done: Vec<PathBuf> = cache_dirs(cache)
        .into_iter()
        .filter_map(|d| {
            resolver
                .dir_key(Path::new(std::ffi::OsStr::from_bytes(d)))
                .ok()
        })
        .collect();
    // getdents64's buffer, shared by the listings; the kernel touches what it fills.
    let mut buf: Vec<u8> = Vec::new();
    for dir in &profile.library_search_dirs {
        if missing.is_empty() {
            return;
        }
        let Ok(key) = resolver.dir_key(dir) else {
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
                if let Ok(r) = resolver.resolve(&key.join(name)) {
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
    // often a link to `/usr/bin`) counts once. Each is kept with the fd it was found by.
    let mut files: Vec<Vec<Entry>> = names.iter().map(|_| Vec::new()).collect();
    for dir in &profile.binary_search_dirs {
        // A directory that does not exist (most of them, on most hosts) is looked at once,
        // not once per name.
        let Ok(key) = resolver.dir_key(dir) else {
            continue;
        };
        for (name, files) in names.iter().zip(&mut files) {
            if let Ok(e) = resolver.entry(&key.join(name)) {
                if e.is_file() && !files.iter().any(|f| f.host == e.host) {
                    files.push(e);
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
                _ => files.iter().position(|f| is_elf(&f.fd)).unwrap_or(0),
            };
            Some(Found {
                host: files.swap_remove(pick).host,
                name: name.to_string(),
            })
        })
        .collect()
}

/// Whether the regular file whose `O_PATH` fd a lookup in the root gave starts with the ELF
/// magic: the inode that lookup checked is opened (through the fd, never by its host path
/// again, which a link swapped in since could lead out of the root) and 4 bytes are read.
fn is_elf(fd: &OwnedFd) -> bool {
    let mut magic = [0u8; 4];
    let Ok(file) = reopen(fd, OFlags::RDONLY | OFlags::NONBLOCK) else {
        return false;
    };
    rustix::io::pread(&file, &mut magic, 0).is_ok_and(|n| n == magic.len()) && magic == *b"\x7fELF"
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
            assert_eq!(e.kind(), std::io::ErrorKind::NotADirectory);
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
        let loop_msg = std::io::Error::from_raw_os_error(libc::ELOOP).to_string();
        assert!(e.to_string().ends_with(&loop_msg), "{e}");
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

    /// The ELF check reads the inode the lookup in the root found, not whatever its host path
    /// names by then: a script swapped for a link to a host ELF (outside the root) after the
    /// lookup is still the script.
    #[test]
    fn elf_magic_is_read_from_the_file_the_lookup_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(dir.path().join("host-elf"), b"\x7fELF\x02\x01").unwrap();
        std::fs::write(root.join("usr/bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::write(root.join("usr/bin/real"), b"\x7fELF\x02\x01").unwrap();
        std::fs::write(root.join("usr/bin/short"), b"\x7fEL").unwrap();
        let mut r = Resolver::new(&root);
        let script = r.entry(Path::new("/usr/bin/tool")).unwrap();
        let elf = r.entry(Path::new("/usr/bin/real")).unwrap();
        let short = r.entry(Path::new("/usr/bin/short")).unwrap();
        std::fs::rename(root.join("usr/bin/tool"), root.join("usr/bin/tool.old")).unwrap();
        symlink(dir.path().join("host-elf"), root.join("usr/bin/tool")).unwrap();
        assert!(!is_elf(&script.fd));
        assert!(is_elf(&elf.fd));
        assert!(!is_elf(&short.fd));
    }

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

    /// Ascend's driver libraries have unversioned sonames (`libascend_hal.so`): they are the
    /// soname and must be found; a dev link next to a versioned soname must not.
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
