//! The edits a container gets, decided before anything is written.
//!
//! A [`Plan`] is plain data: device nodes (with type/major/minor/mode/owner taken from the
//! host node), read-only bind mounts and extra group ids. A create and every CDI spec plan
//! through [`vendor`], in the same steps ([`crate::pipeline`]); `spec::apply` writes a plan
//! into config.json, `cdi::generate` into a spec. Sources of mounts are host files inside the
//! profile's driver root; destinations are fixed directories plus a file name.
//!
//! Planning is a pure function of the profile, what the container asked for and the host
//! facts gathered beforehand ([`crate::facts`]): nothing here looks at the host, so every
//! decision (a node missing or refused, a mount outside the driver root) is unit-tested
//! with facts built by hand.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::discovery::{Device, DiscoveryError};
use crate::facts::{self, Found, Stat};
use crate::profile::{self, Profile};

pub use crate::edits::{BindMount, DeviceNode, NodeKind, Plan, MOUNT_OPTIONS};

pub const BIN_DIR: &str = "/usr/bin";

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{vendor} device {device}: node {} is missing on the host ({source})", host.display())]
    MissingNode {
        vendor: String,
        device: String,
        host: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
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
    HostNode(Arc<DiscoveryError>),
    #[error("no {vendor} devices found under {} (is the driver loaded?)", root.display())]
    NoDevices { vendor: String, root: PathBuf },
    #[error(
        "no {vendor} driver library found under {} (looked for {wanted}): a spec without them \
         gives containers devices their frameworks cannot use; point the profile's driver-root \
         at the driver's files (in the device plugin's pod: mount the host's / and pass \
         --host-root)",
        root.display()
    )]
    NoLibraries {
        vendor: String,
        root: PathBuf,
        wanted: String,
    },
}

/// What a vendor's plan is for: the one thing besides the facts that its refusals depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A container's create, from its variable or device-list mounts.
    Create,
    /// A CDI spec of every device (`accel-ctk cdi generate`, the device plugin's spec, a DRA
    /// claim's): written once, then handed to every container that names a device of it.
    Spec,
}

// The refusals that depend on what was asked and for what, in one place. A create and a spec
// go through the same steps ([`crate::pipeline`]); each refusal below says where it applies
// and why. (The others, the same for both, are where their fact is judged: a device's node
// missing or refused in [`device_edits`], a control node refused and a mount outside the
// driver root in [`driver_edits`], an unknown capability in [`capabilities`].)

/// Every device asked for (a create's `all`, every spec), and discovery found none: refused
/// for both. A create would start a container without the devices it asked for; a spec would
/// be written without devices. (A create that names devices is refused by
/// [`crate::request::select`] for each it cannot find; `none`, the driver alone, needs none.)
pub fn refuse_no_devices(profile: &Profile, every: bool, found: usize) -> Result<(), PlanError> {
    if every && found == 0 {
        return Err(PlanError::NoDevices {
            vendor: profile.name.clone(),
            root: profile.dev_root().to_path_buf(),
        });
    }
    Ok(())
}

/// Capability groups that name libraries, and not one of them found in the driver root:
/// refused for a spec only. That is the mark of a process that sees the nodes but not the
/// driver's files (the device plugin's or the DRA driver's pod given `/dev` only, a wrong
/// `--host-root`), and a spec it wrote would hand devices without libraries to every
/// container that names them, silently and for as long as it stays. A create looks at the
/// host itself, for one container whose image may carry the user-space libraries (as CUDA
/// forward-compatibility images do, and as NVIDIA's toolkit allows: a library it does not
/// find is left out, not an error); it gets the nodes, as it always has (tests/hostile.rs
/// creates on driver roots that hold no library).
pub fn refuse_no_libraries(purpose: Purpose, facts: &facts::Vendor) -> Result<(), PlanError> {
    if purpose != Purpose::Spec || !facts.driver.libraries.is_empty() {
        return Ok(());
    }
    let profile = facts.profile;
    let stems: Vec<&str> = facts
        .caps
        .iter()
        .filter_map(|c| profile.capabilities.get(c))
        .flat_map(|g| g.libraries.iter().map(String::as_str))
        .collect();
    if stems.is_empty() {
        return Ok(());
    }
    let mut wanted = stems.iter().take(4).copied().collect::<Vec<_>>().join(", ");
    if stems.len() > 4 {
        wanted.push_str(", ...");
    }
    Err(PlanError::NoLibraries {
        vendor: profile.name.clone(),
        root: profile.driver_root.clone(),
        wanted,
    })
}

/// One vendor's plan: what a create adds for it, and what a spec writes.
#[derive(Debug, Default)]
pub struct Vendor {
    /// Each covered device's nodes, in the order of the facts' devices.
    pub devices: Vec<Plan>,
    /// The driver's control and capability nodes, libraries and binaries.
    pub driver: Plan,
    /// The profile's development names (`libcuda.so`) of the libraries `driver` mounts.
    pub dev_links: Vec<BindMount>,
}

/// The plan of one vendor, from its facts alone; `lib_dir` is where the container gets the
/// driver's libraries.
pub fn vendor(facts: &facts::Vendor, lib_dir: &Path) -> Result<Vendor, PlanError> {
    let profile = facts.profile;
    let devices = facts
        .devices
        .iter()
        .map(|d| device_edits(profile, &[d], &facts.nodes))
        .collect::<Result<Vec<Plan>, PlanError>>()?;
    let driver = driver_edits(profile, &facts.caps, &facts.driver, lib_dir)?;
    let dev_links = dev_links(profile, &driver, lib_dir);
    Ok(Vendor {
        devices,
        driver,
        dev_links,
    })
}

/// The node at `container` in the container, from the host node at `host` as stat saw it.
pub fn node(host: &Path, container: &Path, stat: &Stat) -> Result<DeviceNode, PlanError> {
    let Some(kind) = stat.kind else {
        return Err(PlanError::NotADevice { host: host.into() });
    };
    Ok(DeviceNode {
        path: container.into(),
        host_path: host.into(),
        kind,
        major: stat.major,
        minor: stat.minor,
        file_mode: stat.mode,
        uid: stat.uid,
        gid: stat.gid,
    })
}

/// The nodes of the selected devices; each must be on the host (`nodes`: from
/// [`facts::device_nodes`] for these devices).
pub fn device_edits(
    profile: &Profile,
    devices: &[&Device],
    nodes: &facts::Nodes,
) -> Result<Plan, PlanError> {
    let mut plan = Plan::default();
    for d in devices {
        for path in &d.nodes {
            let missing = |host: PathBuf, source: Arc<std::io::Error>| {
                let device = match &d.uuid {
                    Some(u) => format!("{} ({u})", d.index),
                    None => d.index.to_string(),
                };
                PlanError::MissingNode {
                    vendor: profile.name.clone(),
                    device,
                    host,
                    source,
                }
            };
            match nodes.get(path) {
                Some(facts::Node::At {
                    host,
                    stat: Ok(stat),
                }) => plan.push_node(node(host, path, stat)?),
                Some(facts::Node::At { host, stat: Err(e) }) => {
                    return Err(missing(host.clone(), e.clone()))
                }
                Some(facts::Node::Refused(e)) => return Err(PlanError::HostNode(e.clone())),
                // No fact (gathered for other devices) is no node: a device's own node is
                // required, so it is missing where dev-root would have it.
                Some(facts::Node::Absent) | None => {
                    return Err(missing(
                        Profile::under(profile.dev_root(), path),
                        Arc::new(std::io::ErrorKind::NotFound.into()),
                    ))
                }
            }
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
/// mounted under `lib_dir` by soname, binaries under /usr/bin (`driver`: from
/// [`facts::driver`] for the same capability groups).
pub fn driver_edits(
    profile: &Profile,
    caps: &[String],
    driver: &facts::Driver,
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
    for path in nodes {
        // Control nodes are optional (nvidia-modeset only exists with a display driver); one
        // that exists must have passed discovery::host_node's checks. One stat could not
        // read after host_node saw it was removed since: left out, as one not found.
        match driver.nodes.get(path) {
            Some(facts::Node::At {
                host,
                stat: Ok(stat),
            }) => plan.push_node(node(host, path, stat)?),
            Some(facts::Node::Refused(e)) => return Err(PlanError::HostNode(e.clone())),
            Some(facts::Node::At { stat: Err(_), .. } | facts::Node::Absent) | None => {}
        }
    }
    for f in &driver.libraries {
        plan.mounts.push(bind(profile, f, lib_dir)?);
    }
    for f in &driver.binaries {
        plan.mounts.push(bind(profile, f, Path::new(BIN_DIR))?);
    }
    Ok(plan)
}

/// The driver's mounts of libraries (those in `lib_dir`).
pub fn library_mounts<'a>(
    driver: &'a Plan,
    lib_dir: &'a Path,
) -> impl Iterator<Item = &'a BindMount> {
    driver
        .mounts
        .iter()
        .filter(move |m| m.destination.parent() == Some(lib_dir))
}

/// The profile's development names (`libcuda.so`) for the sonames `driver` mounts in
/// `lib_dir`: read-only mounts of the same host files, next to them.
pub fn dev_links(profile: &Profile, driver: &Plan, lib_dir: &Path) -> Vec<BindMount> {
    let mut out = Vec::new();
    for m in library_mounts(driver, lib_dir) {
        let name = m
            .destination
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        for (dev, _) in profile.dev_links.iter().filter(|(_, s)| **s == name) {
            out.push(BindMount {
                source: m.source.clone(),
                destination: lib_dir.join(dev),
            });
        }
    }
    out
}

fn bind(profile: &Profile, f: &Found, dir: &Path) -> Result<BindMount, PlanError> {
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
        source: f.host.clone(),
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
    //! Every decision from facts built by hand: no root, no file is looked at.

    use super::*;

    use crate::config::builtin_nvidia as nvidia;
    use crate::facts::Node;

    fn profile() -> Profile {
        let mut p = nvidia();
        p.driver_root = "/run/nvidia/driver".into();
        p
    }

    fn gpu(index: u32, uuid: Option<&str>) -> Device {
        Device {
            index,
            nodes: vec![format!("/dev/nvidia{index}").into()],
            uuid: uuid.map(String::from),
            pci_bus_id: None,
            minor: Some(index),
            aliases: vec![],
            model: None,
            duplicate_uuid: None,
        }
    }

    fn char_dev(minor: u64, mode: u32, gid: u32) -> Stat {
        Stat {
            kind: Some(NodeKind::Char),
            major: 195,
            minor,
            mode,
            uid: 0,
            gid,
        }
    }

    fn at(host: &str, stat: Stat) -> Node {
        Node::At {
            host: host.into(),
            stat: Ok(stat),
        }
    }

    fn os_error(code: i32) -> Arc<std::io::Error> {
        Arc::new(std::io::Error::from_raw_os_error(code))
    }

    fn nodes<'a>(facts: Vec<(&'a str, Node)>) -> facts::Nodes<'a> {
        facts::Nodes(facts.into_iter().map(|(p, n)| (Path::new(p), n)).collect())
    }

    fn found(host: &str, name: &str) -> Found {
        Found {
            host: host.into(),
            name: name.into(),
        }
    }

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
        // `display` brings `graphics`; a name given twice counts once.
        assert_eq!(
            capabilities(&p, Some("display,utility,display")).unwrap(),
            ["display", "graphics", "utility"]
        );
        assert_eq!(
            capabilities(&p, Some("all")).unwrap().len(),
            p.capabilities.len()
        );
        assert_eq!(
            capabilities(&p, Some("compute,all")).unwrap().len(),
            p.capabilities.len()
        );
        let e = capabilities(&p, Some("compute,bogus"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "NVIDIA_DRIVER_CAPABILITIES=\"compute,bogus\": unknown capability \"bogus\"; known: "
            ),
            "{e}"
        );
        assert!(e.contains("compute") && e.contains("utility"), "{e}");
    }

    #[test]
    fn unknown_capability_is_quoted_and_escaped() {
        let e = capabilities(&nvidia(), Some("compute,\u{1b}[31m"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\u{1b}'), "{e}");
        assert!(e.contains("unknown capability \"\\u{1b}[31m\""), "{e}");
    }

    #[test]
    fn profile_without_a_capability_variable_gets_every_group() {
        let mut p = nvidia();
        p.capabilities_env = None;
        let all = capabilities(&p, Some("compute")).unwrap();
        assert_eq!(all.len(), p.capabilities.len());
        assert_eq!(capabilities(&p, None).unwrap(), all);
    }

    #[test]
    fn device_nodes_take_type_numbers_mode_and_owner_from_the_host() {
        let p = profile();
        let (g0, g1) = (gpu(0, None), gpu(1, None));
        let facts = nodes(vec![
            (
                "/dev/nvidia0",
                at("/run/nvidia/driver/dev/nvidia0", char_dev(0, 0o660, 44)),
            ),
            (
                "/dev/nvidia1",
                at("/run/nvidia/driver/dev/nvidia1", char_dev(1, 0o666, 45)),
            ),
        ]);
        let plan = device_edits(&p, &[&g0, &g1], &facts).unwrap();
        assert_eq!(
            plan.nodes[0],
            DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: "/run/nvidia/driver/dev/nvidia0".into(),
                kind: NodeKind::Char,
                major: 195,
                minor: 0,
                file_mode: 0o660,
                uid: 0,
                gid: 44,
            }
        );
        assert_eq!(plan.nodes[1].minor, 1);
        // Only the group of a node that is not world read-writable is handed out.
        assert_eq!(plan.additional_gids, [44]);
        assert!(plan.mounts.is_empty());
    }

    #[test]
    fn root_group_is_never_handed_out_and_a_shared_node_counts_once() {
        let p = profile();
        let mut g0 = gpu(0, None);
        let mut g1 = gpu(1, None);
        g0.nodes.push("/dev/shared".into());
        g1.nodes.push("/dev/shared".into());
        let facts = nodes(vec![
            ("/dev/nvidia0", at("/h/nvidia0", char_dev(0, 0o600, 0))),
            ("/dev/nvidia1", at("/h/nvidia1", char_dev(1, 0o600, 0))),
            ("/dev/shared", at("/h/shared", char_dev(9, 0o600, 0))),
        ]);
        let plan = device_edits(&p, &[&g0, &g1], &facts).unwrap();
        let paths: Vec<&Path> = plan.nodes.iter().map(|n| n.path.as_path()).collect();
        assert_eq!(paths, ["/dev/nvidia0", "/dev/shared", "/dev/nvidia1"]);
        assert!(plan.additional_gids.is_empty());
    }

    #[test]
    fn missing_node_names_device_and_path() {
        let p = profile();
        let facts = nodes(vec![(
            "/dev/nvidia1",
            Node::At {
                host: "/run/nvidia/driver/dev/nvidia1".into(),
                stat: Err(os_error(libc::ENOENT)),
            },
        )]);
        let e = device_edits(&p, &[&gpu(1, Some("GPU-x"))], &facts)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "nvidia device 1 (GPU-x): node /run/nvidia/driver/dev/nvidia1 is missing on the host \
             (No such file or directory (os error 2))"
        );
        let e = device_edits(&p, &[&gpu(1, None)], &facts)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("nvidia device 1: node /run/nvidia/driver/dev/nvidia1 is missing"),
            "{e}"
        );
    }

    #[test]
    fn node_without_facts_is_missing_where_dev_root_has_it() {
        let mut p = profile();
        p.dev_root = Some("/host".into());
        for facts in [nodes(vec![]), nodes(vec![("/dev/nvidia3", Node::Absent)])] {
            let e = device_edits(&p, &[&gpu(3, None)], &facts)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("nvidia device 3: node /host/dev/nvidia3 is missing on the host"),
                "{e}"
            );
        }
    }

    #[test]
    fn refused_node_keeps_the_discovery_message() {
        let p = profile();
        let refused = |msg: &str| {
            Node::Refused(Arc::new(DiscoveryError::Node {
                vendor: "nvidia".into(),
                path: "/dev/nvidia2".into(),
                msg: msg.into(),
            }))
        };
        for msg in [
            "/run/nvidia/driver/dev/nvidia2 is not a character device",
            "a symlink on its path leads out of /run/nvidia/driver (absolute, or above it)",
        ] {
            let facts = nodes(vec![("/dev/nvidia2", refused(msg))]);
            let e = device_edits(&p, &[&gpu(2, None)], &facts).unwrap_err();
            assert!(matches!(e, PlanError::HostNode(_)), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!("nvidia: refusing node /dev/nvidia2: {msg}")
            );
        }
    }

    #[test]
    fn wrong_kind_is_not_a_device_node() {
        let p = profile();
        let file = Stat {
            kind: None,
            ..char_dev(0, 0o644, 0)
        };
        let facts = nodes(vec![("/dev/nvidia0", at("/h/dev/nvidia0", file))]);
        let e = device_edits(&p, &[&gpu(0, None)], &facts)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "/h/dev/nvidia0: not a device node");
        // A control node that turned out to be a file is refused as well, not skipped.
        let driver = facts::Driver {
            nodes: nodes(vec![("/dev/nvidiactl", at("/h/dev/nvidiactl", file))]),
            ..Default::default()
        };
        let e = driver_edits(&p, &[], &driver, Path::new("/usr/lib64"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "/h/dev/nvidiactl: not a device node");
        // A block device is a device (CDI specs may name one).
        let block = Stat {
            kind: Some(NodeKind::Block),
            ..char_dev(0, 0o660, 6)
        };
        let n = node(Path::new("/h/sda"), Path::new("/dev/sda"), &block).unwrap();
        assert_eq!((n.kind, n.major, n.minor), (NodeKind::Block, 195, 0));
    }

    #[test]
    fn control_nodes_are_optional_but_refused_ones_fail() {
        let p = profile();
        let driver = facts::Driver {
            nodes: nodes(vec![
                (
                    "/dev/nvidiactl",
                    at("/h/nvidiactl", char_dev(255, 0o666, 0)),
                ),
                ("/dev/nvidia-uvm", Node::Absent),
                (
                    "/dev/nvidia-uvm-tools",
                    Node::At {
                        host: "/h/nvidia-uvm-tools".into(),
                        stat: Err(os_error(libc::ENOENT)),
                    },
                ),
                // /dev/nvidia-modeset: not gathered at all.
            ]),
            ..Default::default()
        };
        let plan = driver_edits(&p, &[], &driver, Path::new("/usr/lib64")).unwrap();
        let paths: Vec<&Path> = plan.nodes.iter().map(|n| n.path.as_path()).collect();
        assert_eq!(paths, ["/dev/nvidiactl"]);

        let mut refused = driver.clone();
        refused.nodes.0[1].1 = Node::Refused(Arc::new(DiscoveryError::Node {
            vendor: "nvidia".into(),
            path: "/dev/nvidia-uvm".into(),
            msg: "/h/nvidia-uvm has major 7, not one of the profile's device-majors [195]".into(),
        }));
        let e = driver_edits(&p, &[], &refused, Path::new("/usr/lib64"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "nvidia: refusing node /dev/nvidia-uvm: /h/nvidia-uvm has major 7, not one of the \
             profile's device-majors [195]"
        );
    }

    #[test]
    fn capability_nodes_come_only_with_their_group() {
        let mut p = profile();
        p.capabilities.get_mut("graphics").unwrap().nodes = vec!["/dev/dri/card1".into()];
        let driver = facts::Driver {
            nodes: nodes(vec![(
                "/dev/dri/card1",
                at("/h/card1", char_dev(1, 0o660, 44)),
            )]),
            ..Default::default()
        };
        let lib = Path::new("/usr/lib64");
        let caps = capabilities(&p, Some("compute")).unwrap();
        assert!(driver_edits(&p, &caps, &driver, lib).unwrap().is_empty());
        let caps = capabilities(&p, Some("display")).unwrap();
        let plan = driver_edits(&p, &caps, &driver, lib).unwrap();
        assert_eq!(plan.nodes.len(), 1);
        assert_eq!(plan.nodes[0].path, Path::new("/dev/dri/card1"));
        assert_eq!(plan.additional_gids, [44]);
    }

    #[test]
    fn libraries_by_soname_and_binaries_under_usr_bin() {
        let p = profile();
        let driver = facts::Driver {
            libraries: vec![
                found(
                    "/run/nvidia/driver/usr/lib/libcuda.so.550.1",
                    "libcuda.so.1",
                ),
                found(
                    "/run/nvidia/driver/usr/lib/libnvidia-ml.so.550.1",
                    "libnvidia-ml.so.1",
                ),
            ],
            binaries: vec![found("/run/nvidia/driver/usr/bin/nvidia-smi", "nvidia-smi")],
            ..Default::default()
        };
        let plan = driver_edits(&p, &[], &driver, Path::new("/usr/lib/x86_64-linux-gnu")).unwrap();
        let mounts: Vec<(&Path, &Path)> = plan
            .mounts
            .iter()
            .map(|m| (m.source.as_path(), m.destination.as_path()))
            .collect();
        assert_eq!(
            mounts,
            [
                (
                    Path::new("/run/nvidia/driver/usr/lib/libcuda.so.550.1"),
                    Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
                ),
                (
                    Path::new("/run/nvidia/driver/usr/lib/libnvidia-ml.so.550.1"),
                    Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
                ),
                (
                    Path::new("/run/nvidia/driver/usr/bin/nvidia-smi"),
                    Path::new("/usr/bin/nvidia-smi")
                ),
            ]
        );
        assert!(plan.nodes.is_empty());
    }

    #[test]
    fn driver_file_outside_driver_root_fails_the_plan() {
        let p = profile();
        let lib = Path::new("/usr/lib64");
        for (libraries, binaries, want) in [
            (
                vec![found("/etc/shadow", "libcuda.so.1")],
                vec![],
                "refusing mount /etc/shadow: source is outside the driver root",
            ),
            (
                vec![],
                vec![found("/run/nvidia/driver/../../usr/bin/sh", "nvidia-smi")],
                "refusing mount /run/nvidia/driver/../../usr/bin/sh: source is outside the driver root",
            ),
            (
                vec![found(
                    "/run/nvidia/driver/usr/lib/libcuda.so.550",
                    "libcuda.so.1/../../../../etc/cron.d/evil",
                )],
                vec![],
                "refusing mount /run/nvidia/driver/usr/lib/libcuda.so.550: name is not a plain file name",
            ),
        ] {
            let driver = facts::Driver {
                libraries,
                binaries,
                ..Default::default()
            };
            let e = driver_edits(&p, &[], &driver, lib).unwrap_err();
            assert!(matches!(e, PlanError::UnsafeMount { .. }), "{e:?}");
            assert_eq!(e.to_string(), want);
        }
    }

    #[test]
    fn mount_outside_driver_root_is_refused() {
        let p = profile();
        let f = found("/etc/shadow", "libcuda.so.1");
        assert!(bind(&p, &f, Path::new("/usr/lib64")).is_err());
        let f = found("/run/nvidia/driver/lib/x", "..");
        assert!(bind(&p, &f, Path::new("/usr/lib64")).is_err());
        let f = found("/run/nvidia/driver/lib/x", "x.so.1");
        assert!(bind(&p, &f, Path::new("/usr/../etc")).is_err());
        assert!(bind(&p, &f, Path::new("usr/lib")).is_err());
        for dir in ["/usr/lib64", "/usr/lib64/", "/"] {
            let m = bind(&p, &f, Path::new(dir)).unwrap();
            assert_eq!(m.destination, Path::new(dir).join("x.so.1"), "{dir}");
            assert_eq!(m.source, f.host);
        }
    }

    fn vendor_facts<'a>(
        p: &'a Profile,
        devices: Vec<&'a Device>,
        caps: &[&str],
        nodes: facts::Nodes<'a>,
        libraries: Vec<Found>,
    ) -> facts::Vendor<'a> {
        facts::Vendor {
            profile: p,
            devices,
            caps: caps.iter().map(|c| c.to_string()).collect(),
            nodes,
            driver: facts::Driver {
                libraries,
                ..Default::default()
            },
        }
    }

    /// The one refusal a create and a spec do not share: a spec whose driver has none of the
    /// libraries its groups name (`refuse_no_libraries` says why only a spec).
    #[test]
    fn only_a_spec_is_refused_without_the_drivers_libraries() {
        let p = profile();
        let none = vendor_facts(&p, vec![], &["compute", "utility"], nodes(vec![]), vec![]);
        assert!(refuse_no_libraries(Purpose::Create, &none).is_ok());
        let e = refuse_no_libraries(Purpose::Spec, &none).unwrap_err();
        assert!(matches!(e, PlanError::NoLibraries { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with(
                "no nvidia driver library found under /run/nvidia/driver (looked for libcuda, \
                 libcudadebugger, libnvidia-opencl, libnvidia-gpucomp, ...): "
            ),
            "{e}"
        );
        let lib = found("/run/nvidia/driver/usr/lib64/libcuda.so.1", "libcuda.so.1");
        let one = vendor_facts(&p, vec![], &["compute"], nodes(vec![]), vec![lib]);
        assert!(refuse_no_libraries(Purpose::Spec, &one).is_ok());
        // Groups that name no library have none to miss.
        let empty = vendor_facts(&p, vec![], &["compat32"], nodes(vec![]), vec![]);
        assert!(refuse_no_libraries(Purpose::Spec, &empty).is_ok());
    }

    #[test]
    fn every_device_asked_and_none_found_is_refused() {
        let p = profile();
        let e = refuse_no_devices(&p, true, 0).unwrap_err().to_string();
        assert_eq!(
            e,
            "no nvidia devices found under /run/nvidia/driver (is the driver loaded?)"
        );
        assert!(refuse_no_devices(&p, true, 1).is_ok());
        assert!(refuse_no_devices(&p, false, 0).is_ok());
    }

    /// A vendor's plan is one plan per device (a spec names each), which together are the
    /// plan of all of them (a create's `all`, a spec's `all`), the driver's edits and the dev
    /// links of its libraries.
    #[test]
    fn vendor_plan_per_device_adds_up_to_all_devices() {
        let p = profile();
        let (g0, g1) = (gpu(0, None), gpu(1, None));
        let facts = vendor_facts(
            &p,
            vec![&g0, &g1],
            &["compute"],
            nodes(vec![
                ("/dev/nvidia0", at("/dev/nvidia0", char_dev(0, 0o660, 44))),
                ("/dev/nvidia1", at("/dev/nvidia1", char_dev(1, 0o660, 45))),
            ]),
            vec![found(
                "/run/nvidia/driver/usr/lib64/libcuda.so.550",
                "libcuda.so.1",
            )],
        );
        let v = vendor(&facts, Path::new("/usr/lib64")).unwrap();
        assert_eq!(v.devices.len(), 2);
        assert_eq!(v.devices[1].nodes[0].path, Path::new("/dev/nvidia1"));
        let mut merged = Plan::default();
        for d in v.devices.clone() {
            merged.extend(d);
        }
        assert_eq!(merged, device_edits(&p, &[&g0, &g1], &facts.nodes).unwrap());
        assert_eq!(merged.additional_gids, [44, 45]);
        assert_eq!(
            v.driver.mounts[0].destination,
            Path::new("/usr/lib64/libcuda.so.1")
        );
        assert_eq!(
            v.dev_links,
            [BindMount {
                source: "/run/nvidia/driver/usr/lib64/libcuda.so.550".into(),
                destination: "/usr/lib64/libcuda.so".into(),
            }]
        );
        // A device whose node is missing fails the whole plan.
        let g2 = gpu(2, None);
        let facts = facts::Vendor {
            devices: vec![&g0, &g2],
            ..facts
        };
        let e = vendor(&facts, Path::new("/usr/lib64")).unwrap_err();
        assert!(matches!(e, PlanError::MissingNode { .. }), "{e:?}");
    }
}
