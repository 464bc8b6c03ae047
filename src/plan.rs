//! The edits a container gets, decided before anything is written.
//!
//! A [`Plan`] is plain data: device nodes (with type/major/minor/mode/owner taken from the
//! host node), read-only bind mounts and extra group ids. The runtime builds one from the
//! variable, `accel-ctk cdi generate` builds the same pieces for a CDI spec, and
//! `spec::apply` writes one into config.json. Sources of mounts are host files inside the
//! profile's driver root; destinations are fixed directories plus a file name.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::discovery::{self, Device};
use crate::ldcache;
use crate::libraries::{self, Found};
use crate::profile::{self, Profile};

pub const MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];
pub const BIN_DIR: &str = "/usr/bin";

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{vendor} device {device}: node {} is missing on the host ({source})", host.display())]
    MissingNode {
        vendor: String,
        device: String,
        host: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a device node", host.display())]
    NotADevice { host: PathBuf },
    #[error("{var}={value}: unknown capability {cap}; known: {known}")]
    Capability {
        var: String,
        value: String,
        cap: String,
        known: String,
    },
    #[error("refusing mount {}: {why}", path.display())]
    UnsafeMount { path: PathBuf, why: String },
    #[error(transparent)]
    HostNode(crate::discovery::DiscoveryError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeKind {
    Char,
    Block,
}

impl NodeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Char => "c",
            NodeKind::Block => "b",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: PathBuf,
    pub host_path: PathBuf,
    pub kind: NodeKind,
    pub major: u64,
    pub minor: u64,
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: PathBuf,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub nodes: Vec<DeviceNode>,
    pub mounts: Vec<BindMount>,
    /// Groups of nodes that are not world read-writable, so a non-root user can open them.
    pub additional_gids: Vec<u32>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.mounts.is_empty() && self.additional_gids.is_empty()
    }

    /// Adds `other`, skipping nodes by path and mounts by destination already present.
    /// Paths are compared as bytes, as spec::apply compares them with the spec's strings
    /// (`Path`'s `==` parses components: most of this function's cost).
    pub fn extend(&mut self, other: Plan) {
        for n in other.nodes {
            self.push_node(n);
        }
        for m in other.mounts {
            let dest = m.destination.as_os_str();
            if !self
                .mounts
                .iter()
                .any(|x| x.destination.as_os_str() == dest)
            {
                self.mounts.push(m);
            }
        }
        for g in other.additional_gids {
            if !self.additional_gids.contains(&g) {
                self.additional_gids.push(g);
            }
        }
    }

    fn push_node(&mut self, n: DeviceNode) {
        if self
            .nodes
            .iter()
            .any(|x| x.path.as_os_str() == n.path.as_os_str())
        {
            return;
        }
        // World read-write nodes need no group; root's group is never handed out.
        if n.file_mode & 0o006 != 0o006 && n.gid != 0 && !self.additional_gids.contains(&n.gid) {
            self.additional_gids.push(n.gid);
        }
        self.nodes.push(n);
    }
}

/// Reads type, numbers, mode and owner of a host node (following symlinks, as udev makes
/// `/dev/...` links).
pub fn stat_node(host: &Path, container: &Path) -> std::io::Result<Result<DeviceNode, PlanError>> {
    let m = std::fs::metadata(host)?;
    let kind = if m.file_type().is_char_device() {
        NodeKind::Char
    } else if m.file_type().is_block_device() {
        NodeKind::Block
    } else {
        return Ok(Err(PlanError::NotADevice { host: host.into() }));
    };
    let rdev = m.rdev();
    Ok(Ok(DeviceNode {
        path: container.into(),
        host_path: host.into(),
        kind,
        major: nix::sys::stat::major(rdev),
        minor: nix::sys::stat::minor(rdev),
        file_mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
    }))
}

/// The nodes of the selected devices; each must exist on the host.
pub fn device_edits(profile: &Profile, devices: &[&Device]) -> Result<Plan, PlanError> {
    let mut plan = Plan::default();
    for d in devices {
        for node in &d.nodes {
            let host = match discovery::host_node(profile, node, true) {
                Ok(host) => host,
                Err(e) if e.is_not_found() => Profile::under(profile.dev_root(), node),
                Err(e) => return Err(PlanError::HostNode(e)),
            };
            let n = match stat_node(&host, node) {
                Ok(n) => n?,
                Err(source) => {
                    let device = match &d.uuid {
                        Some(u) => format!("{} ({u})", d.index),
                        None => d.index.to_string(),
                    };
                    return Err(PlanError::MissingNode {
                        vendor: profile.name.clone(),
                        device,
                        host,
                        source,
                    });
                }
            };
            plan.push_node(n);
        }
    }
    Ok(plan)
}

/// The capability groups a container gets: the profile's variable (comma list, `all`), or
/// its defaults; a profile without a variable gets every group.
pub fn capabilities(profile: &Profile, value: Option<&str>) -> Result<Vec<String>, PlanError> {
    let all: Vec<String> = profile.capabilities.keys().cloned().collect();
    let (Some(var), Some(value)) = (&profile.capabilities_env, value.filter(|v| !v.is_empty()))
    else {
        return Ok(if profile.capabilities_env.is_some() {
            expand(profile, &profile.default_capabilities)
        } else {
            all
        });
    };
    let mut chosen = Vec::new();
    for cap in value.split(',') {
        if cap == "all" {
            return Ok(all);
        }
        if !profile.capabilities.contains_key(cap) {
            return Err(PlanError::Capability {
                var: var.clone(),
                value: crate::quote::quote(value),
                cap: crate::quote::quote(cap),
                known: all.join(", "),
            });
        }
        chosen.push(cap.to_string());
    }
    Ok(expand(profile, &chosen))
}

fn expand(profile: &Profile, caps: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut todo: Vec<String> = caps.to_vec();
    while let Some(c) = todo.pop() {
        if out.contains(&c) {
            continue;
        }
        if let Some(cap) = profile.capabilities.get(&c) {
            todo.extend(cap.includes.iter().cloned());
        }
        out.push(c);
    }
    out.sort();
    out
}

/// The driver's part: control nodes and capability nodes present on the host, libraries
/// mounted under `lib_dir` by soname, binaries under /usr/bin.
pub fn driver_edits(
    profile: &Profile,
    caps: &[String],
    cache: &ldcache::Cache,
    lib_dir: &Path,
) -> Result<Plan, PlanError> {
    let mut plan = Plan::default();
    let groups: Vec<&profile::Capability> = caps
        .iter()
        .filter_map(|c| profile.capabilities.get(c))
        .collect();
    let nodes = profile
        .control_nodes
        .iter()
        .chain(groups.iter().flat_map(|g| g.nodes.iter()));
    for node in nodes {
        // Control nodes are optional (nvidia-modeset only exists with a display driver); one
        // that exists must pass discovery::host_node's checks.
        let host = match discovery::host_node(profile, node, false) {
            Ok(host) => host,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(PlanError::HostNode(e)),
        };
        if let Ok(n) = stat_node(&host, node) {
            plan.push_node(n?);
        }
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
    for f in libraries::libraries(profile, &stems, cache, &mut resolver) {
        plan.mounts.push(bind(profile, f, lib_dir)?);
    }
    for f in libraries::binaries(profile, &bins, &mut resolver) {
        plan.mounts.push(bind(profile, f, Path::new(BIN_DIR))?);
    }
    Ok(plan)
}

fn bind(profile: &Profile, f: Found, dir: &Path) -> Result<BindMount, PlanError> {
    let unsafe_mount = |path: &Path, why: &str| PlanError::UnsafeMount {
        path: path.into(),
        why: why.into(),
    };
    if f.name.is_empty() || f.name.contains('/') || f.name == "." || f.name == ".." {
        return Err(unsafe_mount(&f.host, "name is not a plain file name"));
    }
    if !is_under(&f.host, &profile.driver_root) || profile::has_dotdot(&f.host) {
        return Err(unsafe_mount(&f.host, "source is outside the driver root"));
    }
    // `name` is a plain file name: the destination is absolute without `..` when `dir` is
    // (checked on the shorter path), and joins with a byte copy, as `Path::join` would.
    if !dir.is_absolute() || profile::has_dotdot(dir) {
        return Err(unsafe_mount(
            &dir.join(&f.name),
            "destination must be absolute without '..'",
        ));
    }
    let dir = dir.as_os_str().as_bytes();
    let mut destination = Vec::with_capacity(dir.len() + 1 + f.name.len());
    destination.extend_from_slice(dir);
    if !dir.ends_with(b"/") {
        destination.push(b'/');
    }
    destination.extend_from_slice(f.name.as_bytes());
    Ok(BindMount {
        source: f.host,
        destination: PathBuf::from(OsString::from_vec(destination)),
    })
}

/// `path` is `root` or inside it: a byte-level `Path::starts_with` (a create checks every
/// mount, and `Path` parses components on each call). It errs on the safe side: a spelling
/// only component parsing would equate (`a//b`) is refused, never accepted.
fn is_under(path: &Path, root: &Path) -> bool {
    let p = path.as_os_str().as_bytes();
    let r = root.as_os_str().as_bytes();
    let r = r.strip_suffix(b"/").unwrap_or(r);
    p.starts_with(r) && matches!(p.get(r.len()), None | Some(b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::builtin_nvidia as nvidia;

    #[test]
    fn byte_path_checks_agree_with_components() {
        for (path, root, under) in [
            (
                "/run/nvidia/driver/usr/lib/x.so",
                "/run/nvidia/driver",
                true,
            ),
            (
                "/run/nvidia/driver/usr/lib/x.so",
                "/run/nvidia/driver/",
                true,
            ),
            ("/run/nvidia/driver", "/run/nvidia/driver", true),
            ("/run/nvidia/driver2/x.so", "/run/nvidia/driver", false),
            ("/usr/lib/x.so", "/", true),
            ("/etc/x", "/usr", false),
        ] {
            assert_eq!(
                is_under(Path::new(path), Path::new(root)),
                under,
                "{path} {root}"
            );
            assert_eq!(Path::new(path).starts_with(root), under, "{path} {root}");
        }
        for (path, dotdot) in [
            ("/a/../b", true),
            ("..", true),
            ("/a/..", true),
            ("/a/..b/c", false),
            ("/a/b../c", false),
            ("/a/./b", false),
        ] {
            assert_eq!(profile::has_dotdot(Path::new(path)), dotdot, "{path}");
            let components = Path::new(path)
                .components()
                .any(|c| c == std::path::Component::ParentDir);
            assert_eq!(components, dotdot, "{path}");
        }
    }

    #[test]
    fn capabilities_defaults_all_and_includes() {
        let p = nvidia();
        assert_eq!(capabilities(&p, None).unwrap(), ["compute", "utility"]);
        assert_eq!(capabilities(&p, Some("")).unwrap(), ["compute", "utility"]);
        assert_eq!(
            capabilities(&p, Some("video")).unwrap(),
            ["compute", "video"]
        );
        assert_eq!(
            capabilities(&p, Some("all")).unwrap().len(),
            p.capabilities.len()
        );
        let e = capabilities(&p, Some("compute,bogus"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "NVIDIA_DRIVER_CAPABILITIES=\"compute,bogus\": unknown capability \"bogus\""
            ),
            "{e}"
        );
    }

    #[test]
    fn missing_node_names_device_and_path() {
        let mut p = nvidia();
        p.driver_root = "/nonexistent-root".into();
        let d = Device {
            index: 1,
            nodes: vec!["/dev/nvidia1".into()],
            uuid: Some("GPU-x".into()),
            pci_bus_id: None,
            minor: Some(1),
            aliases: vec![],
        };
        let e = device_edits(&p, &[&d]).unwrap_err().to_string();
        assert!(
            e.starts_with("nvidia device 1 (GPU-x): node /nonexistent-root/dev/nvidia1 is missing"),
            "{e}"
        );
    }

    #[test]
    fn real_host_node_and_group_rule() {
        let n = stat_node(Path::new("/dev/null"), Path::new("/dev/null"))
            .unwrap()
            .unwrap();
        assert_eq!((n.kind, n.major, n.minor), (NodeKind::Char, 1, 3));
        let mut plan = Plan::default();
        plan.push_node(DeviceNode {
            file_mode: 0o660,
            gid: 44,
            ..n.clone()
        });
        plan.push_node(DeviceNode {
            path: "/dev/x".into(),
            file_mode: 0o666,
            gid: 45,
            ..n
        });
        assert_eq!(plan.additional_gids, [44]);
    }

    #[test]
    fn mount_outside_driver_root_is_refused() {
        let mut p = nvidia();
        p.driver_root = "/run/nvidia/driver".into();
        let f = Found {
            host: "/etc/shadow".into(),
            name: "libcuda.so.1".into(),
        };
        assert!(bind(&p, f, Path::new("/usr/lib64")).is_err());
        let f = Found {
            host: "/run/nvidia/driver/lib/x".into(),
            name: "..".into(),
        };
        assert!(bind(&p, f, Path::new("/usr/lib64")).is_err());
        let f = Found {
            host: "/run/nvidia/driver/lib/x".into(),
            name: "x.so.1".into(),
        };
        assert!(bind(&p, f.clone(), Path::new("/usr/../etc")).is_err());
        assert!(bind(&p, f.clone(), Path::new("usr/lib")).is_err());
        for dir in ["/usr/lib64", "/usr/lib64/", "/"] {
            let m = bind(&p, f.clone(), Path::new(dir)).unwrap();
            assert_eq!(m.destination, Path::new(dir).join("x.so.1"), "{dir}");
            assert_eq!(m.source, f.host);
        }
    }
}
