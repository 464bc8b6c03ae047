//! Finding the driver's libraries and binaries on the host, inside the driver root only.
//!
//! Libraries come from `<driver-root>/etc/ld.so.cache` (parsed natively), falling back to the
//! profile's search directories, for trees no cache knows (GKE's /usr/local/nvidia).
//! Symlinks are followed as if `driver-root` were `/`, so no link in a driver tree can make the
//! shim mount a host file from outside it (the class of CVE-2024-0132: a path that resolves
//! somewhere it should not by the time it is used).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::ldcache;
use crate::profile::Profile;

const MAX_SYMLINKS: usize = 40;

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

/// What `lstat` said about one host path.
#[derive(Debug, Clone)]
enum Lookup {
    Link(PathBuf),
    Other { is_file: bool },
}

/// Resolves paths under one root as [`resolve_in_root`] does, remembering what each host path
/// turned out to be: the libraries and binaries of a create share their directories (`usr`,
/// `usr/lib/x86_64-linux-gnu`), which are then looked at once rather than once per file. Use
/// one for a single create only (the answers are as of the first look).
#[derive(Debug)]
pub struct Resolver<'a> {
    root: &'a Path,
    /// Host path and what it was; a create resolves a few dozen, so a list beats hashing.
    seen: Vec<(PathBuf, Lookup)>,
}

impl<'a> Resolver<'a> {
    pub fn new(root: &'a Path) -> Self {
        Resolver {
            root,
            seen: Vec::new(),
        }
    }

    pub fn root(&self) -> &Path {
        self.root
    }

    /// What `host` is: its index in `seen`, looked at with lstat on first use.
    fn lookup(&mut self, host: &Path) -> std::io::Result<usize> {
        let key = host.as_os_str().as_encoded_bytes();
        if let Some(i) = self
            .seen
            .iter()
            .rposition(|(p, _)| p.as_os_str().as_encoded_bytes() == key)
        {
            return Ok(i);
        }
        let meta = std::fs::symlink_metadata(host)?;
        let l = if meta.file_type().is_symlink() {
            Lookup::Link(std::fs::read_link(host)?)
        } else {
            Lookup::Other {
                is_file: meta.is_file(),
            }
        };
        self.seen.push((host.to_path_buf(), l));
        Ok(self.seen.len() - 1)
    }

    /// Resolves `path` (absolute, container-style) under the root as a chroot would.
    pub fn resolve(&mut self, path: &Path) -> std::io::Result<Resolved> {
        // Components still to walk, the next one last; a link's target is pushed in its place.
        let mut todo: Vec<OsString> = path.components().rev().filter_map(normal).collect();
        // The host path walked so far: the root, then the components resolved under it.
        let mut host = self.root.to_path_buf();
        let depth0 = host.components().count();
        let mut depth = depth0;
        // The root itself and anything reached by `..` is a directory.
        let mut is_file = false;
        let mut hops = 0;
        while let Some(comp) = todo.pop() {
            if comp == ".." {
                // `..` never climbs above the root.
                if depth > depth0 {
                    host.pop();
                    depth -= 1;
                }
                is_file = false;
                continue;
            }
            host.push(&comp);
            let i = self.lookup(&host)?;
            match &self.seen[i].1 {
                Lookup::Link(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINKS {
                        return Err(std::io::Error::other(format!(
                            "{}: too many levels of symbolic links",
                            host.display()
                        )));
                    }
                    host.pop();
                    if target.is_absolute() {
                        host = self.root.to_path_buf();
                        depth = depth0;
                        is_file = false;
                    }
                    todo.extend(target.components().rev().filter_map(normal));
                }
                Lookup::Other { is_file: f } => {
                    depth += 1;
                    is_file = *f;
                }
            }
        }
        Ok(Resolved { host, is_file })
    }
}

fn normal(c: Component) -> Option<OsString> {
    match c {
        Component::Normal(n) => Some(n.to_os_string()),
        Component::ParentDir => Some("..".into()),
        _ => None,
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
    stems: &[String],
    cache: &ldcache::Cache,
    resolver: &mut Resolver,
) -> Vec<Found> {
    let mut found: Vec<Vec<Found>> = stems
        .iter()
        .map(|stem| from_cache(stem, cache, resolver))
        .collect();
    let missing: Vec<usize> = (0..stems.len()).filter(|&i| found[i].is_empty()).collect();
    if !missing.is_empty() {
        // A directory ldconfig indexed holds no library the cache lacks: listing it again
        // finds nothing (on a GPU node, /usr/lib/x86_64-linux-gnu's 720 entries on every
        // create, for the stems this driver does not ship).
        // Compared as resolved under the root: ldconfig may spell a directory through a link
        // (`/lib/x86_64-linux-gnu` on a distro whose /lib is a link to usr/lib).
        let indexed: Vec<PathBuf> = cache_dirs(cache)
            .into_iter()
            .filter_map(|d| resolver.resolve(Path::new(OsStr::from_bytes(d))).ok())
            .map(|r| r.host)
            .collect();
        let dirs: Vec<PathBuf> = profile
            .library_search_dirs
            .iter()
            .filter(|d| {
                resolver
                    .resolve(d)
                    .map_or(true, |r| !indexed.contains(&r.host))
            })
            .cloned()
            .collect();
        search_dirs(resolver, &dirs, stems, missing, &mut found);
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
/// of `dirs` that has any, into `found`. Each directory is listed once, and only when a stem
/// is still unresolved; only the names some missing stem matches are kept (a distro's
/// /usr/lib/x86_64-linux-gnu holds hundreds of files).
fn search_dirs(
    resolver: &mut Resolver,
    dirs: &[PathBuf],
    stems: &[String],
    mut missing: Vec<usize>,
    found: &mut [Vec<Found>],
) {
    for dir in dirs {
        if missing.is_empty() {
            return;
        }
        let wanted = |n: &str| missing.iter().any(|&i| matches_stem(n, &stems[i]));
        let mut names = list_matching(&Profile::under(resolver.root(), dir), wanted);
        names.sort();
        missing.retain(|&i| {
            let mut here: Vec<Found> = Vec::new();
            let mut any = false;
            for name in names.iter().filter(|n| matches_stem(n, &stems[i])) {
                any = true;
                if let Ok(r) = resolver.resolve(&dir.join(name)) {
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
    }
}

/// The names in `dir` that `wanted` takes (none when it cannot be read). Names are looked at
/// in readdir's buffer and copied only when wanted: `std::fs::read_dir` allocates one per
/// entry, and a GPU node's /usr/lib/x86_64-linux-gnu held 720.
fn list_matching(dir: &Path, wanted: impl Fn(&str) -> bool) -> Vec<String> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(mut d) = nix::dir::Dir::open(dir, flags, Mode::empty()) else {
        return Vec::new();
    };
    d.iter()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str().ok()?;
            wanted(name).then(|| name.to_string())
        })
        .collect()
}

/// For each of `names`, the first ELF file of that name in the profile's binary search dirs,
/// else the first regular file. Hosts put wrapper scripts in `/usr/bin` that `exec` the real
/// tool by its host path (seen on a GPU node whose driver lives in /usr/local/nvidia): such a
/// script mounted into a container only fails there, so an ELF found later wins over it.
/// `resolver` must be for the profile's driver root.
pub fn binaries(profile: &Profile, names: &[String], resolver: &mut Resolver) -> Vec<Found> {
    let mut out = Vec::new();
    for name in names {
        let mut first: Option<PathBuf> = None;
        for dir in &profile.binary_search_dirs {
            let Ok(r) = resolver.resolve(&dir.join(name)) else {
                continue;
            };
            // `/bin` is often a link to `/usr/bin`: the same file is not read twice.
            if !r.is_file || first.as_ref() == Some(&r.host) {
                continue;
            }
            if is_elf(&r.host) {
                first = Some(r.host);
                break;
            }
            first.get_or_insert(r.host);
        }
        if let Some(host) = first {
            out.push(Found {
                host,
                name: name.clone(),
            });
        }
    }
    out
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvidia() -> Profile {
        crate::config::Config::parse("", None)
            .unwrap()
            .profile("nvidia")
            .unwrap()
            .clone()
    }
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
            &["libcuda".into(), "libnvidia-ml".into(), "libnvoptix".into()],
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
        // Only a script anywhere: the script is taken (a vendor may ship one).
        std::fs::write(root.join("usr/bin/efsmi"), "#!/bin/sh\necho efsmi\n").unwrap();
        std::fs::write(root.join("opt/bin/efsmi"), "#!/bin/sh\necho later\n").unwrap();
        let mut profile = nvidia();
        profile.binary_search_dirs = ["/usr/bin", "/usr/local/nvidia/bin", "/opt/bin"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let names = [
            "nvidia-smi".to_string(),
            "efsmi".to_string(),
            "absent".to_string(),
        ];
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
        let stems = [
            "libcuda".to_string(),
            "libnvidia-ml".to_string(),
            "libnvoptix".to_string(),
        ];
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
        let stems = ["libcuda".to_string(), "libnvidia-ml".to_string()];
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
        let stems = ["libascend_hal".to_string(), "libcuda".to_string()];
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
