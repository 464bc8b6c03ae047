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
    let mut queue: VecDeque<OsString> = path.components().filter_map(normal).collect();
    let mut cur = PathBuf::new();
    let mut hops = 0;
    while let Some(comp) = queue.pop_front() {
        if comp == ".." {
            cur.pop();
            continue;
        }
        let candidate = cur.join(&comp);
        let host = root.join(&candidate);
        let meta = std::fs::symlink_metadata(&host)?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > MAX_SYMLINKS {
                return Err(std::io::Error::other(format!(
                    "{}: too many levels of symbolic links",
                    host.display()
                )));
            }
            let target = std::fs::read_link(&host)?;
            if target.is_absolute() {
                cur = PathBuf::new();
            }
            for c in target.components().rev().filter_map(normal) {
                queue.push_front(c);
            }
        } else {
            cur = candidate;
        }
    }
    Ok(root.join(cur))
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
pub fn libraries(profile: &Profile, stems: &[String], cache: &[ldcache::Entry]) -> Vec<Found> {
    let root = &profile.driver_root;
    let mut out: Vec<Found> = Vec::new();
    for stem in stems {
        let mut from_cache: Vec<Found> = Vec::new();
        for e in cache
            .iter()
            .filter(|e| e.is_native() && matches_stem(&e.name, stem))
        {
            if from_cache.iter().any(|f| f.name == e.name) {
                continue;
            }
            if let Ok(host) = resolve_in_root(root, &e.path) {
                from_cache.push(Found {
                    host,
                    name: e.name.clone(),
                });
            }
        }
        drop_dev_links(&mut from_cache);
        if from_cache.is_empty() {
            from_cache = search_dirs(root, &profile.library_search_dirs, stem);
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

fn search_dirs(root: &Path, dirs: &[PathBuf], stem: &str) -> Vec<Found> {
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(Profile::under(root, dir)) else {
            continue;
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| matches_stem(n, stem))
            .collect();
        if names.is_empty() {
            continue;
        }
        names.sort();
        let mut found: Vec<Found> = names
            .into_iter()
            .filter_map(|name| {
                let host = resolve_in_root(root, &dir.join(&name)).ok()?;
                host.is_file().then_some(Found { host, name })
            })
            .collect();
        drop_dev_links(&mut found);
        return found;
    }
    Vec::new()
}

/// The first regular file named `name` in the profile's binary search dirs.
pub fn binaries(profile: &Profile, names: &[String]) -> Vec<Found> {
    names
        .iter()
        .filter_map(|name| {
            profile.binary_search_dirs.iter().find_map(|dir| {
                let host = resolve_in_root(&profile.driver_root, &dir.join(name)).ok()?;
                host.is_file().then(|| Found {
                    host,
                    name: name.clone(),
                })
            })
        })
        .collect()
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
            names(libraries(&p, &stems, &cache)),
            ["libascend_hal.so", "libcuda.so.1"]
        );
        // The same through the search directories (no cache).
        p.library_search_dirs = vec!["/usr/lib".into()];
        assert_eq!(names(libraries(&p, &stems[..1], &[])), ["libascend_hal.so"]);
        assert_eq!(names(libraries(&p, &stems[1..], &[])), ["libcuda.so.1"]);
    }
}
