//! What a plan needs to know of the host, looked at once before anything is decided: the
//! nodes a profile names (where each resolves inside dev-root and what stat says of it) and
//! the driver's libraries and binaries found inside the driver root. [`gather`] is the one
//! gathering a create and every CDI spec make ([`crate::pipeline`]).
//!
//! Facts are plain data and record failures too (a node that is missing, refused, or not a
//! device): whether a failure matters is the plan's call ([`crate::plan`]), so the plan reads
//! nothing itself and its tests build facts by hand, without root. Each host path is looked
//! at here exactly as the plan used to look at it while planning: no extra stat or listing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::discovery::{DevRoot, Device, DiscoveryError};
use crate::edits::NodeKind;
use crate::ldcache;
use crate::libraries;
use crate::profile::Profile;

pub use crate::libraries::Found;

/// One vendor's facts: all its plan is decided from ([`crate::plan::vendor`]).
#[derive(Debug)]
pub struct Vendor<'a> {
    pub profile: &'a Profile,
    /// The devices the plan covers: a create's selection, a spec's every device.
    pub devices: Vec<&'a Device>,
    /// The capability groups (from [`crate::plan::capabilities`]).
    pub caps: Vec<String>,
    /// The covered devices' nodes.
    pub nodes: Nodes<'a>,
    pub driver: Driver<'a>,
}

/// The driver root's `ld.so.cache` exists but cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the driver's ld.so.cache under {}: {source}", root.display())]
pub struct LdCacheError {
    pub root: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Gathers [`Vendor`] facts for `devices` and capability groups `caps`: the driver root's
/// `ld.so.cache` (where libraries are looked up first), the devices' nodes and the driver's
/// ([`device_nodes`], [`driver`], one dev-root opened for both).
pub fn gather<'a>(
    profile: &'a Profile,
    devices: Vec<&'a Device>,
    caps: Vec<String>,
) -> Result<Vendor<'a>, LdCacheError> {
    let cache = ldcache::load(&profile.driver_root).map_err(|source| LdCacheError {
        root: profile.driver_root.clone(),
        source,
    })?;
    let dev_root = DevRoot::new(profile);
    let nodes = device_nodes(&dev_root, &devices);
    let driver = driver(&dev_root, &caps, &cache);
    Ok(Vendor {
        profile,
        devices,
        caps,
        nodes,
        driver,
    })
}

/// What stat says of a host node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `None`: the path is there but no char or block device.
    pub kind: Option<NodeKind>,
    pub major: u64,
    pub minor: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Stats a host node, following symlinks (udev makes `/dev/...` links).
pub fn stat(host: &Path) -> std::io::Result<Stat> {
    Ok(Stat::of(&rustix::fs::stat(host)?))
}

impl Stat {
    fn of(m: &rustix::fs::Stat) -> Stat {
        use rustix::fs::FileType;
        let kind = match FileType::from_raw_mode(m.st_mode) {
            FileType::CharacterDevice => Some(NodeKind::Char),
            FileType::BlockDevice => Some(NodeKind::Block),
            _ => None,
        };
        Stat {
            kind,
            major: rustix::fs::major(m.st_rdev).into(),
            minor: rustix::fs::minor(m.st_rdev).into(),
            mode: m.st_mode & 0o7777,
            uid: m.st_uid,
            gid: m.st_gid,
        }
    }
}

/// One node a profile names, as found on the host. Errors are shared (`Arc`): the plan reports
/// them from borrowed facts, and `cdi generate` plans several device sets from one gathering.
#[derive(Debug, Clone)]
pub enum Node {
    /// Resolved to `host`, with what stat said there.
    At {
        host: PathBuf,
        stat: Result<Stat, Arc<std::io::Error>>,
    },
    /// Not on the host; only an optional (control or capability) node is recorded so, a
    /// device's own node is looked for where it should be (see [`device_nodes`]).
    Absent,
    /// [`crate::discovery::host_node`] refused it (a link out of dev-root, not a character
    /// device, a major not in the profile's list) or could not look.
    Refused(Arc<DiscoveryError>),
}

/// Facts about nodes by their container path (`/dev/nvidia0`), in the order first asked for.
/// A create asks about a few dozen, so a list beats hashing.
#[derive(Debug, Clone, Default)]
pub struct Nodes<'a>(pub Vec<(&'a Path, Node)>);

impl<'a> Nodes<'a> {
    pub fn get(&self, path: &Path) -> Option<&Node> {
        self.0.iter().find(|(p, _)| *p == path).map(|(_, n)| n)
    }

    fn has(&self, path: &Path) -> bool {
        self.0.iter().any(|(p, _)| *p == path)
    }
}

/// The nodes of `devices`, each required: one [`crate::discovery::host_node`] does not find
/// is stat'ed where dev-root would have it, so the plan can name the path and the error.
/// `dev_root` is the profile's, resolved once for this and [`driver`].
pub fn device_nodes<'a>(dev_root: &DevRoot<'_>, devices: &[&'a Device]) -> Nodes<'a> {
    let profile = dev_root.profile();
    let mut out = Nodes::default();
    for node in devices.iter().flat_map(|d| d.nodes.iter()) {
        if out.has(node) {
            continue;
        }
        let fact = looked_up(dev_root, node, true, || {
            at(Profile::under(profile.dev_root(), node))
        });
        out.0.push((node, fact));
    }
    out
}

/// The driver's side for capability groups `caps`: control and capability nodes (optional:
/// one that is not there is not stat'ed), libraries by soname, binaries.
#[derive(Debug, Clone, Default)]
pub struct Driver<'a> {
    pub nodes: Nodes<'a>,
    /// Libraries of the groups' stems, one per soname, in the order of the stems.
    pub libraries: Vec<Found>,
    pub binaries: Vec<Found>,
}

/// Gathers [`Driver`] facts for `caps` (names the profile knows; others are skipped), for
/// the profile of `dev_root`.
pub fn driver<'a>(dev_root: &DevRoot<'a>, caps: &[String], cache: &ldcache::Cache) -> Driver<'a> {
    let profile = dev_root.profile();
    let groups: Vec<&'a crate::profile::Capability> = caps
        .iter()
        .filter_map(|c| profile.capabilities.get(c))
        .collect();
    let mut nodes = Nodes::default();
    let wanted = profile
        .control_nodes
        .iter()
        .chain(groups.iter().flat_map(|g| g.nodes.iter()));
    for node in wanted {
        if nodes.has(node) {
            continue;
        }
        // nvidia-modeset only exists with a display driver: a node not found is left out.
        let fact = looked_up(dev_root, node, false, || Node::Absent);
        nodes.0.push((node, fact));
    }
    let stems: Vec<&str> = groups
        .iter()
        .flat_map(|g| g.libraries.iter().map(String::as_str))
        .collect();
    let bins: Vec<&str> = groups
        .iter()
        .flat_map(|g| g.binaries.iter().map(String::as_str))
        .collect();
    // One resolver for both: libraries and binaries share the driver root's directories.
    let mut resolver = libraries::Resolver::new(&profile.driver_root);
    let libraries = libraries::libraries(profile, &stems, cache, &mut resolver);
    let binaries = libraries::binaries(profile, &bins, &mut resolver);
    Driver {
        nodes,
        libraries,
        binaries,
    }
}

/// The fact for `node` as [`DevRoot::host_node`] finds it (`device`: a device's own node,
/// whose major the profile may restrict); `not_found` says what a node that is not there is.
fn looked_up(
    dev_root: &DevRoot<'_>,
    node: &Path,
    device: bool,
    not_found: impl FnOnce() -> Node,
) -> Node {
    match dev_root.host_node(node, device) {
        Ok((host, meta)) => Node::At {
            host,
            stat: Ok(Stat::of(&meta)),
        },
        Err(e) if e.is_not_found() => not_found(),
        Err(e) => Node::Refused(Arc::new(e)),
    }
}

fn at(host: PathBuf) -> Node {
    let stat = stat(&host).map_err(Arc::new);
    Node::At { host, stat }
}

#[cfg(test)]
mod tests {
    //! Gathering without root: a driver tree in a temp dir holds no device nodes (mknod needs
    //! root), so these pin what is recorded for absent, refused and present paths; the e2e
    //! tests gather real nodes.

    use super::*;

    use crate::config::builtin_nvidia as nvidia;

    fn profile(root: &Path) -> Profile {
        let mut p = nvidia();
        p.driver_root = root.to_path_buf();
        p
    }

    fn gpu(index: u32) -> Device {
        Device {
            index,
            nodes: vec![format!("/dev/nvidia{index}").into()],
            uuid: None,
            pci_bus_id: None,
            minor: Some(index),
            aliases: vec![],
            model: None,
            duplicate_uuid: None,
        }
    }

    #[test]
    fn stat_follows_links_and_tells_devices_from_files() {
        let s = stat(Path::new("/dev/null")).unwrap();
        assert_eq!((s.kind, s.major, s.minor), (Some(NodeKind::Char), 1, 3));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        assert_eq!(stat(&file).unwrap().kind, None);
        let link = dir.path().join("null");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert_eq!(stat(&link).unwrap(), s);
    }

    #[test]
    fn missing_device_node_is_looked_for_where_dev_root_has_it() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("dev")).unwrap();
        let p = profile(root.path());
        let (g0, g1) = (gpu(0), gpu(1));
        let facts = device_nodes(&DevRoot::new(&p), &[&g0, &g1, &g0]);
        assert_eq!(facts.0.len(), 2, "{facts:?}");
        match facts.get(Path::new("/dev/nvidia1")) {
            Some(Node::At { host, stat: Err(e) }) => {
                assert_eq!(*host, root.path().join("dev/nvidia1"));
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_file_where_a_node_should_be_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("dev")).unwrap();
        std::fs::write(root.path().join("dev/nvidia0"), "").unwrap();
        std::fs::write(root.path().join("dev/nvidiactl"), "").unwrap();
        let p = profile(root.path());
        let g0 = gpu(0);
        let facts = device_nodes(&DevRoot::new(&p), &[&g0]);
        match facts.get(Path::new("/dev/nvidia0")) {
            Some(Node::Refused(e)) => {
                assert!(e.to_string().ends_with("is not a character device"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        let driver = driver(&DevRoot::new(&p), &[], &ldcache::Cache::default());
        assert!(matches!(
            driver.nodes.get(Path::new("/dev/nvidiactl")),
            Some(Node::Refused(_))
        ));
    }

    #[test]
    fn absent_control_nodes_are_recorded_without_a_stat() {
        let root = tempfile::tempdir().unwrap();
        let p = profile(root.path());
        let d = driver(
            &DevRoot::new(&p),
            &["compute".into()],
            &ldcache::Cache::default(),
        );
        assert_eq!(d.nodes.0.len(), p.control_nodes.len());
        for (path, n) in &d.nodes.0 {
            assert!(matches!(n, Node::Absent), "{path:?}: {n:?}");
        }
        assert!(d.libraries.is_empty() && d.binaries.is_empty(), "{d:?}");
    }

    #[test]
    fn driver_files_are_found_inside_the_root_for_the_groups_asked() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("usr/lib/x86_64-linux-gnu");
        let bin = root.path().join("usr/bin");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(lib.join("libcuda.so.550.1"), "").unwrap();
        std::os::unix::fs::symlink("libcuda.so.550.1", lib.join("libcuda.so.1")).unwrap();
        std::fs::write(lib.join("libnvidia-ml.so.1"), "").unwrap();
        std::fs::write(bin.join("nvidia-smi"), "").unwrap();
        let p = profile(root.path());
        let cache = ldcache::Cache::default();

        let d = driver(&DevRoot::new(&p), &["compute".into()], &cache);
        let cuda = d
            .libraries
            .iter()
            .find(|f| f.name == "libcuda.so.1")
            .unwrap();
        // The link resolved inside the root, to the file it names.
        assert_eq!(cuda.host, lib.join("libcuda.so.550.1"));
        assert!(d.libraries.iter().all(|f| f.name.starts_with("libcuda.")));
        assert!(d.binaries.is_empty(), "{:?}", d.binaries);

        let d = driver(&DevRoot::new(&p), &["utility".into()], &cache);
        let names: Vec<&str> = d.libraries.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["libnvidia-ml.so.1"]);
        assert_eq!(
            d.binaries,
            [Found {
                host: bin.join("nvidia-smi"),
                name: "nvidia-smi".into(),
            }]
        );
    }
}
