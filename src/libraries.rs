//! Finding the driver's libraries and binaries on the host, inside the driver root only.
//!
//! Libraries come from `<driver-root>/etc/ld.so.cache` (parsed natively), falling back to the
//! profile's search directories, for trees no cache knows (GKE's /usr/local/nvidia).
//! Symlinks are followed as if `driver-root` were `/`, so no link in a driver tree can make the
//! shim mount a host file from outside it (the class of CVE-2024-0132: a path that resolves
//! somewhere it should not by the time it is used).

use std::collections::VecDeque;
use std::ffi::OsString;
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

    fn lookup(&mut self, host: PathBuf) -> std::io::Result<Lookup> {
        let key = host.as_os_str().as_encoded_bytes();
        if let Some((_, l)) = self
            .seen
            .iter()
            .find(|(p, _)| p.as_os_str().as_encoded_bytes() == key)
        {
            return Ok(l.clone());
        }
        let meta = std::fs::symlink_metadata(&host)?;
        let l = if meta.file_type().is_symlink() {
            Lookup::Link(std::fs::read_link(&host)?)
        } else {
            Lookup::Other {
                is_file: meta.is_file(),
            }
        };
        self.seen.push((host, l.clone()));
        Ok(l)
    }

    /// Resolves `path` (absolute, container-style) under the root as a chroot would.
    pub fn resolve(&mut self, path: &Path) -> std::io::Result<Resolved> {
        let mut queue: VecDeque<OsString> = path.components().filter_map(normal).collect();
        let mut cur = PathBuf::new();
        // The root itself and anything reached by `..` is a directory.
        let mut is_file = false;
        let mut hops = 0;
        while let Some(comp) = queue.pop_front() {
            if comp == ".." {
                cur.pop();
                is_file = false;
                continue;
            }
            let candidate = cur.join(&comp);
            let host = self.root.join(&candidate);
            match self.lookup(host)? {
                Lookup::Link(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINKS {
                        return Err(std::io::Error::other(format!(
                            "{}: too many levels of symbolic links",
                            self.root.join(&candidate).display()
                        )));
                    }
                    if target.is_absolute() {
                        cur = PathBuf::new();
                        is_file = false;
                    }
                    for c in target.components().rev().filter_map(normal) {
                        queue.push_front(c);
                    }
                }
                Lookup::Other { is_file: f } => {
                    cur = candidate;
                    is_file = f;
                }
            }
        }
        Ok(Resolved {
            host: self.root.join(cur),
            is_file,
        })
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

/// Every library of `stems` the driver root has, one entry per soname.
/// Libraries the driver does not ship are left out (not every driver build has every one).
/// `resolver` must be for the profile's driver root.
pub fn libraries(
    profile: &Profile,
    stems: &[String],
    cache: &[ldcache::Entry],
    resolver: &mut Resolver,
) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    // Each search directory is listed once, when a stem first needs it.
    let mut listings: Vec<Option<Vec<String>>> = vec![None; profile.library_search_dirs.len()];
    for stem in stems {
        let mut from_cache: Vec<Found> = Vec::new();
        for e in cache
            .iter()
            .filter(|e| e.is_native() && matches_stem(&e.name, stem))
        {
            if from_cache.iter().any(|f| f.name == e.name) {
                continue;
            }
            if let Ok(r) = resolver.resolve(&e.path) {
                from_cache.push(Found {
                    host: r.host,
                    name: e.name.clone(),
                });
            }
        }
        drop_dev_links(&mut from_cache);
        if from_cache.is_empty() {
            from_cache = search_dirs(resolver, &profile.library_search_dirs, &mut listings, stem);
        }
        for f in from_cache {
            if !out.iter().any(|o| o.name == f.name) {
                out.push(f);
            }
        }
    }
    out
}

/// The loader looks up sonames. `libcuda.so` next to `libcuda.so.1` is the linker's dev link,
/// not a soname, so it is dropped; a library whose soname *is* unversioned (Ascend ships
/// `libascend_hal.so` so) has no versioned sibling and is kept.
fn drop_dev_links(found: &mut Vec<Found>) {
    if found.iter().any(|f| !f.name.ends_with(".so")) {
        found.retain(|f| !f.name.ends_with(".so"));
    }
}

/// The files named `stem.so*` in the first of `dirs` that has any. `listings[i]` holds the
/// names in `dirs[i]`, read on first use (a missing directory lists as empty).
fn search_dirs(
    resolver: &mut Resolver,
    dirs: &[PathBuf],
    listings: &mut [Option<Vec<String>>],
    stem: &str,
) -> Vec<Found> {
    for (dir, listing) in dirs.iter().zip(listings.iter_mut()) {
        let all = listing.get_or_insert_with(|| {
            let mut names: Vec<String> = std::fs::read_dir(Profile::under(resolver.root(), dir))
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            names
        });
        let names: Vec<String> = all
            .iter()
            .filter(|n| matches_stem(n, stem))
            .cloned()
            .collect();
        if names.is_empty() {
            continue;
        }
        let mut found: Vec<Found> = names
            .into_iter()
            .filter_map(|name| {
                let r = resolver.resolve(&dir.join(&name)).ok()?;
                r.is_file.then_some(Found { host: r.host, name })
            })
            .collect();
        drop_dev_links(&mut found);
        return found;
    }
    Vec::new()
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
            if !r.is_file {
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
        let mut p = crate::config::Config::parse("", None)
            .unwrap()
            .profile("nvidia")
            .unwrap()
            .clone();
        p.driver_root = r.to_path_buf();
        let cache = ldcache::parse(&ldcache::build(&[
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
        let mut profile = crate::config::Config::parse("", None)
            .unwrap()
            .profile("nvidia")
            .unwrap()
            .clone();
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
    fn unversioned_soname_is_kept_dev_link_is_not() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let lib = r.join("usr/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libascend_hal.so"), "elf").unwrap();
        std::fs::write(lib.join("libcuda.so.1"), "elf").unwrap();
        symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
        let mut p = crate::config::Config::parse("", None)
            .unwrap()
            .profile("nvidia")
            .unwrap()
            .clone();
        p.driver_root = r.to_path_buf();
        let flags = ldcache::native_flags();
        let cache = ldcache::parse(&ldcache::build(&[
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
            names(libraries(&p, &stems[..1], &[], &mut res)),
            ["libascend_hal.so"]
        );
        assert_eq!(
            names(libraries(&p, &stems[1..], &[], &mut res)),
            ["libcuda.so.1"]
        );
    }
}
