//! What the image's dynamic loader sees of the injected libraries: the container's
//! `/etc/ld.so.cache`, forward-compatibility libraries the image carries, and the image's
//! driver requirements (`NVIDIA_REQUIRE_*`). (Development links, `libcuda.so`, are planned
//! with the driver's mounts: `plan::dev_links`.)
//!
//! Frameworks find driver libraries through the loader cache: Triton runs `ldconfig -p` and
//! looks for `libcuda.so.1`. NVIDIA's toolkit gets there by running `ldconfig` in the
//! container from a hook, which is where CVE-2025-23266 (the image's environment reaching a
//! privileged hook) and CVE-2025-23267 (a hook following a link in the image) happened. Here
//! nothing runs in or for the container: the runtime merges the image's cache with entries
//! for the mounted libraries on the host, in the format and order glibc's `ldconfig` writes
//! (`ldcache::write`), and replaces the file inside the rootfs through `rootfs::Rootfs`
//! (openat2 with `RESOLVE_IN_ROOT`, no symlink allowed on the path). It is a plain file, not a
//! bind mount, so a later `ldconfig` in the container (any `apt-get install`) can rename its
//! new cache over it. When the cache cannot be written (a read-only rootfs directory, a
//! symlinked `/etc`, an image cache that does not parse) the create goes on with a warning:
//! the libraries are mounted at their sonames in a directory glibc searches by default, so
//! `dlopen` by soname works without the cache; only `ldconfig -p` does not list them.
//! Ref: glibc `elf/cache.c`; NVIDIA security bulletins for CVE-2025-23266, CVE-2025-23267.

use std::path::{Path, PathBuf};

use crate::constraints::{self, RequireError};
use crate::discovery;
use crate::ldcache::{self, Record};
use crate::plan::{self, BindMount, Plan};
use crate::profile::Profile;
use crate::rootfs::{Kind, Rootfs};

/// Largest image cache read (a distro's is well under 1 MiB).
const CACHE_LIMIT: u64 = 64 << 20;
const CACHE_DIR: &str = "/etc";
const CACHE_NAME: &str = "ld.so.cache";

/// The container's rootfs, opened once per create, or why it could not be.
#[derive(Debug)]
pub struct Image(Result<Rootfs, String>);

impl Image {
    /// Opens `root.path` of the spec (`None`: the spec has none).
    pub fn open(path: Option<&Path>) -> Image {
        Image(match path {
            Some(p) => Rootfs::open(p).map_err(|e| format!("{}: {e}", p.display())),
            None => Err("the spec has no root.path".to_string()),
        })
    }

    fn rootfs(&self) -> Option<&Rootfs> {
        self.0.as_ref().ok()
    }
}

/// Forward-compatibility libraries found in the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compat {
    /// Their driver version (`570.124.06`, from `libcuda.so.570.124.06`).
    pub version: String,
    /// Whether they are of a newer driver branch than the host's, and so take precedence.
    pub used: bool,
    /// Cache entries for their sonames, in the image's compat directory.
    pub records: Vec<Record>,
}

/// One vendor's share of the image-side work, from [`prepare`].
#[derive(Debug, Default)]
pub struct VendorLibs {
    /// Cache entries for the mounted libraries.
    pub records: Vec<Record>,
    pub compat: Option<Compat>,
}

/// For one vendor whose driver edits are `driver` (libraries mounted in `lib_dir`): checks
/// the image's requirements (the one error), finds compat libraries, and lists the cache
/// entries to add for the mounted libraries. Reads the image only through `image`'s rootfs fd.
pub fn prepare(
    profile: &Profile,
    image: &Image,
    env: &[(&str, &str)],
    driver: &Plan,
    lib_dir: &Path,
) -> Result<VendorLibs, RequireError> {
    // Read only for a profile that uses it (each create pays the file read).
    let host_driver = (profile.compat.is_some() || profile.requirements.is_some())
        .then(|| discovery::driver_version(profile))
        .flatten();
    let compat = match (&profile.compat, image.rootfs()) {
        (Some(c), Some(root)) => find_compat(c, root, host_driver.as_deref()),
        _ => None,
    };
    if let Some(req) = &profile.requirements {
        let mut host = constraints::Host::from_driver(host_driver.clone(), &req.cuda_by_driver);
        // Newer compat libraries bring their own CUDA version into the container.
        if let Some(c) = compat.as_ref().filter(|c| c.used) {
            if let Some(cuda) = constraints::cuda_for_driver(&c.version, &req.cuda_by_driver) {
                let newer = host
                    .cuda
                    .as_deref()
                    .is_none_or(|h| constraints::compare_versions(&cuda, h).is_gt());
                if newer {
                    host.cuda = Some(cuda);
                }
            }
        }
        let names = constraints::Names {
            prefix: &req.env_prefix,
            disable: req.disable_env.as_deref(),
            legacy_cuda: req.legacy_cuda_env.as_deref(),
        };
        constraints::check(names, env, &host)?;
    }
    let mut out = VendorLibs {
        compat,
        ..VendorLibs::default()
    };
    for m in plan::library_mounts(driver, lib_dir) {
        if let Some(dest) = m.destination.to_str() {
            out.records.push(Record::native(&soname_of(m), dest));
        }
    }
    Ok(out)
}

fn soname_of(m: &BindMount) -> String {
    m.destination
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The compat libraries in the image's `c.dir` (resolved inside the rootfs), if any: their
/// version from the newest `<version-library>.so.<x.y...>` file name, and whether that
/// driver's major version (its branch) is above the host's, the test NVIDIA's toolkit makes.
/// Unknown host version: not used.
pub fn find_compat(
    c: &crate::profile::Compat,
    root: &Rootfs,
    host_driver: Option<&str>,
) -> Option<Compat> {
    let entries = match root.list_dir(&c.dir) {
        Ok(Some(e)) => e,
        Ok(None) => return None,
        Err(e) => {
            log::warn!(
                "{}: cannot list {}: {e}; compat libraries ignored",
                root.path().display(),
                c.dir.display()
            );
            return None;
        }
    };
    let prefix = format!("{}.so.", c.version_library);
    let version = entries
        .iter()
        .filter(|(_, k)| *k != Kind::Other)
        .filter_map(|(n, _)| n.strip_prefix(&prefix))
        .filter(|v| v.contains('.') && is_dotted(v))
        .max_by(|a, b| constraints::compare_versions(a, b))?
        .to_string();
    let major = |v: &str| v.split('.').next().and_then(|m| m.parse::<u64>().ok());
    let used =
        matches!((major(&version), host_driver.and_then(major)), (Some(c), Some(h)) if c > h);
    let records = entries
        .iter()
        .filter(|(_, k)| *k != Kind::Other)
        .filter(|(n, _)| {
            c.libraries.iter().any(|stem| {
                n.strip_prefix(stem.as_str())
                    .and_then(|r| r.strip_prefix(".so."))
                    .is_some_and(|v| !v.contains('.') && is_dotted(v))
            })
        })
        .filter_map(|(n, _)| {
            let path = c.dir.join(n);
            Some(Record::native(n, path.to_str()?))
        })
        .collect();
    Some(Compat {
        version,
        used,
        records,
    })
}

fn is_dotted(v: &str) -> bool {
    v.split('.')
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// What [`update_cache`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum CacheUpdate {
    /// Written with this many entries.
    Written(usize),
    /// The image's cache already held every entry.
    Unchanged,
}

/// Merges the vendors' entries into the image's `/etc/ld.so.cache` (a missing one is made):
/// newer compat libraries first, then the driver's, then the image's own, so the loader,
/// taking the first entry of a soname, prefers them in that order.
pub fn update_cache(image: &Image, vendors: &[VendorLibs]) -> Result<CacheUpdate, String> {
    let root = image.0.as_ref().map_err(Clone::clone)?;
    let dir = Path::new(CACHE_DIR);
    let old = root
        .read_strict(dir, CACHE_NAME, CACHE_LIMIT)
        .map_err(|e| format!("/etc/ld.so.cache: {e}"))?;
    let own = match &old {
        Some(data) if data.is_empty() => Vec::new(),
        Some(data) => ldcache::records(data).map_err(|e| match e {
            ldcache::LdCacheError::TooLarge(_) => {
                format!("the image's /etc/ld.so.cache is left as it is: {e}")
            }
            _ => format!("the image's /etc/ld.so.cache does not parse: {e}"),
        })?,
        None => Vec::new(),
    };
    let mut merged: Vec<Record> = vendors
        .iter()
        .filter_map(|v| v.compat.as_ref().filter(|c| c.used))
        .flat_map(|c| c.records.iter().cloned())
        .collect();
    merged.extend(vendors.iter().flat_map(|v| v.records.iter().cloned()));
    // The image's entries for a soname the driver provides come after the driver's; an
    // entry of ours from an earlier create is the same entry again (dropped as a duplicate).
    merged.extend(own);
    let data = ldcache::write(merged);
    let n = ldcache::parse(&data).map_or(0, |e| e.len());
    if old.as_deref() == Some(data.as_slice()) {
        return Ok(CacheUpdate::Unchanged);
    }
    root.replace_strict(dir, CACHE_NAME, &data, 0o644)
        .map_err(|e| format!("/etc/ld.so.cache: {e}"))?;
    Ok(CacheUpdate::Written(n))
}

/// [`update_cache`] for the create path: a failure is a warning, never an error (the
/// libraries still load by soname from the default directory).
pub fn update_cache_or_warn(image: &Image, vendors: &[VendorLibs]) {
    if vendors.iter().all(|v| v.records.is_empty()) {
        return;
    }
    let at = match &image.0 {
        Ok(r) => r.path().to_path_buf(),
        Err(_) => PathBuf::from("rootfs"),
    };
    match update_cache(image, vendors) {
        Ok(CacheUpdate::Written(n)) => {
            log::debug!("{}: wrote /etc/ld.so.cache ({n} entries)", at.display())
        }
        Ok(CacheUpdate::Unchanged) => {}
        Err(e) => log::warn!(
            "{}: loader cache not updated ({e}); the libraries still load by soname from glibc's default directory, but `ldconfig -p` will not list them",
            at.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn compat_profile() -> crate::profile::Compat {
        crate::profile::Compat {
            dir: "/usr/local/cuda/compat".into(),
            version_library: "libcuda".into(),
            libraries: vec!["libcuda".into(), "libnvidia-ptxjitcompiler".into()],
        }
    }

    fn image_with_compat(version: &str) -> (tempfile::TempDir, Image) {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("usr/local/cuda-12.8/compat");
        std::fs::create_dir_all(&c).unwrap();
        symlink("cuda-12.8", d.path().join("usr/local/cuda")).unwrap();
        std::fs::write(c.join(format!("libcuda.so.{version}")), "").unwrap();
        symlink(format!("libcuda.so.{version}"), c.join("libcuda.so.1")).unwrap();
        symlink("libcuda.so.1", c.join("libcuda.so")).unwrap();
        std::fs::write(c.join(format!("libnvidia-ptxjitcompiler.so.{version}")), "").unwrap();
        symlink(
            format!("libnvidia-ptxjitcompiler.so.{version}"),
            c.join("libnvidia-ptxjitcompiler.so.1"),
        )
        .unwrap();
        std::fs::write(c.join("libunrelated.so.1"), "").unwrap();
        let image = Image::open(Some(d.path()));
        (d, image)
    }

    #[test]
    fn compat_wins_only_from_a_newer_branch() {
        let (_d, image) = image_with_compat("570.124.06");
        let root = image.rootfs().unwrap();
        let c = find_compat(&compat_profile(), root, Some("550.54.14")).unwrap();
        assert_eq!(c.version, "570.124.06");
        assert!(c.used);
        let names: Vec<(&str, &str)> = c
            .records
            .iter()
            .map(|r| (r.name.as_str(), r.path.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"),
                (
                    "libnvidia-ptxjitcompiler.so.1",
                    "/usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.1"
                ),
            ]
        );
        for host in ["570.26", "575.51.03", "580.65.06"] {
            assert!(
                !find_compat(&compat_profile(), root, Some(host))
                    .unwrap()
                    .used,
                "{host}"
            );
        }
        assert!(!find_compat(&compat_profile(), root, None).unwrap().used);
        let empty = tempfile::tempdir().unwrap();
        let image = Image::open(Some(empty.path()));
        assert_eq!(
            find_compat(&compat_profile(), image.rootfs().unwrap(), Some("550.1")),
            None
        );
    }

    #[test]
    fn merged_cache_orders_compat_driver_image_and_is_idempotent() {
        let (d, image) = image_with_compat("570.124.06");
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        let own = ldcache::write(vec![
            Record::native("libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            Record::native("libcuda.so.1", "/usr/lib/stubs/libcuda.so.1"),
        ]);
        std::fs::write(d.path().join("etc/ld.so.cache"), &own).unwrap();
        let lib = "/usr/lib/x86_64-linux-gnu";
        let vendor = VendorLibs {
            records: vec![Record::native(
                "libcuda.so.1",
                &format!("{lib}/libcuda.so.1"),
            )],
            compat: find_compat(
                &compat_profile(),
                image.rootfs().unwrap(),
                Some("550.54.14"),
            ),
        };
        let vendors = [vendor];
        assert_eq!(update_cache(&image, &vendors), Ok(CacheUpdate::Written(5)));
        let data = std::fs::read(d.path().join("etc/ld.so.cache")).unwrap();
        let got: Vec<String> = ldcache::records(&data)
            .unwrap()
            .into_iter()
            .map(|r| format!("{} {}", r.name, r.path))
            .collect();
        assert_eq!(
            got,
            [
                "libnvidia-ptxjitcompiler.so.1 /usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.1",
                "libcuda.so.1 /usr/local/cuda/compat/libcuda.so.1",
                "libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "libcuda.so.1 /usr/lib/stubs/libcuda.so.1",
                "libc.so.6 /usr/lib/x86_64-linux-gnu/libc.so.6",
            ]
        );
        assert_eq!(update_cache(&image, &vendors), Ok(CacheUpdate::Unchanged));
    }

    #[test]
    fn unusable_caches_are_left_alone_with_a_reason() {
        let d = tempfile::tempdir().unwrap();
        let vendors = [VendorLibs {
            records: vec![Record::native("libx.so.1", "/usr/lib64/libx.so.1")],
            ..VendorLibs::default()
        }];
        // No /etc at all: made, with only the driver's entry.
        let image = Image::open(Some(d.path()));
        assert_eq!(update_cache(&image, &vendors), Ok(CacheUpdate::Written(1)));
        // A cache that does not parse is not replaced.
        std::fs::write(d.path().join("etc/ld.so.cache"), "junk").unwrap();
        let e = update_cache(&image, &vendors).unwrap_err();
        assert!(e.contains("does not parse"), "{e}");
        assert_eq!(
            std::fs::read(d.path().join("etc/ld.so.cache")).unwrap(),
            b"junk"
        );
        // A symlinked cache is refused.
        std::fs::remove_file(d.path().join("etc/ld.so.cache")).unwrap();
        symlink("/etc/passwd", d.path().join("etc/ld.so.cache")).unwrap();
        let e = update_cache(&image, &vendors).unwrap_err();
        assert!(e.contains("symlink"), "{e}");
        assert!(update_cache(&Image::open(None), &vendors).is_err());
    }
}
