//! The host's `/dev/char/MAJOR:MINOR` (and `/dev/block/...`) link for every node the runtime
//! injects, made before runc runs.
//!
//! Why the runtime touches the host's /dev: with the systemd cgroup driver, runc hands a
//! container's device rules to systemd as `DeviceAllow=/dev/char/MAJOR:MINOR`. systemd drops a
//! path that does not exist, and re-applies its own (shorter) list on every `systemctl
//! daemon-reload`, so the running container loses the device (EPERM) although its spec still
//! lists it. udev makes these links only for nodes it created itself: NVIDIA's nodes come from
//! nvidia-modprobe, a containerized driver's live under /run/nvidia/driver/dev, and none of
//! them get one. runc reads the link when it creates the container's unit, so it must exist
//! before runc runs; made afterwards it does not help that container.
//! Ref: NVIDIA container toolkit issues #48 and #1227, `nvidia-ctk system
//! create-dev-char-symlinks`.
//!
//! Rules, so that concurrent creates and udev can never fight:
//! - an entry that resolves to a node with the same type and number is right, whatever path
//!   it names (udev's relative `../nvidia0`, another driver root's node): it is left alone;
//! - a missing entry is created with `symlink(2)`; `EEXIST` means another create (or udev)
//!   won the race, and the entry is looked at again;
//! - a dangling link (its target is gone: a driver container restarted elsewhere) points at
//!   no device, and systemd treats it as missing: it is replaced atomically (a new link under
//!   a unique name, `rename(2)` over it);
//! - anything else (a link to another device, a regular file, a directory) is never touched:
//!   [`ensure`] reports [`DevCharError::Wrong`]. The create path logs it as a warning and
//!   goes on: the container works until the next reload, and refusing it would turn a node
//!   misconfiguration into an outage; `accel-ctk system create-dev-char-symlinks` and
//!   `accel-ctk doctor` report it as an error.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::discovery::{self, DiscoveryError};
use crate::facts;
use crate::plan::{self, DeviceNode, NodeKind, PlanError};
use crate::profile::Profile;

#[derive(Debug, thiserror::Error)]
pub enum DevCharError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("{}: {source}", node.display())]
    Node {
        node: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a {} device node", node.display(), kind_name(*kind))]
    NotANode { node: PathBuf, kind: NodeKind },
    #[error("{} is {found}, not a link to {} (left as it is: remove it, then run `accel-ctk system create-dev-char-symlinks`)", link.display(), node.display())]
    Wrong {
        link: PathBuf,
        node: PathBuf,
        found: String,
    },
    #[error("cannot create {} -> {}: {source}", link.display(), node.display())]
    Create {
        link: PathBuf,
        node: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What the link of one node looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// Resolves to a node of the same type and number.
    Present,
    /// No entry at all.
    Missing,
    /// A symlink whose target does not exist (systemd treats it as missing).
    Dangling { target: PathBuf },
    /// Something that resolves elsewhere: never replaced.
    Wrong { found: String },
}

/// What [`ensure`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    AlreadyPresent,
    Created,
    /// A dangling link was replaced; it pointed at `old`.
    ReplacedDangling {
        old: PathBuf,
    },
}

fn kind_name(kind: NodeKind) -> &'static str {
    match kind {
        NodeKind::Char => "character",
        NodeKind::Block => "block",
    }
}

/// `<dev_dir>/char/MAJOR:MINOR` (or `block/`): the path systemd is given for a device.
pub fn link_path(dev_dir: &Path, kind: NodeKind, major: u64, minor: u64) -> PathBuf {
    let sub = match kind {
        NodeKind::Char => "char",
        NodeKind::Block => "block",
    };
    dev_dir.join(sub).join(format!("{major}:{minor}"))
}

/// The node's type and number, read from the node itself.
fn node_id(node: &Path) -> Result<(NodeKind, u64, u64), DevCharError> {
    let meta = std::fs::metadata(node).map_err(|source| DevCharError::Node {
        node: node.into(),
        source,
    })?;
    let kind = if meta.file_type().is_char_device() {
        NodeKind::Char
    } else if meta.file_type().is_block_device() {
        NodeKind::Block
    } else {
        return Err(DevCharError::NotANode {
            node: node.into(),
            kind: NodeKind::Char,
        });
    };
    let rdev = meta.rdev();
    Ok((
        kind,
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev),
    ))
}

fn inspect(link: &Path, kind: NodeKind, rdev: u64) -> LinkState {
    let lmeta = match std::fs::symlink_metadata(link) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return LinkState::Missing,
        Err(e) => {
            return LinkState::Wrong {
                found: format!("unreadable ({e})"),
            }
        }
    };
    match std::fs::metadata(link) {
        Ok(m) => {
            let ft = m.file_type();
            let same_kind = match kind {
                NodeKind::Char => ft.is_char_device(),
                NodeKind::Block => ft.is_block_device(),
            };
            if same_kind && m.rdev() == rdev {
                return LinkState::Present;
            }
            let what = if ft.is_char_device() || ft.is_block_device() {
                format!(
                    "{} {}:{}",
                    if ft.is_char_device() { "c" } else { "b" },
                    nix::sys::stat::major(m.rdev()),
                    nix::sys::stat::minor(m.rdev())
                )
            } else if ft.is_dir() {
                "a directory".into()
            } else {
                "not a device".into()
            };
            LinkState::Wrong {
                found: match std::fs::read_link(link) {
                    Ok(t) => format!("a link to {} ({what})", t.display()),
                    Err(_) => format!("an entry that is {what}"),
                },
            }
        }
        Err(e) if lmeta.file_type().is_symlink() && e.kind() == io::ErrorKind::NotFound => {
            LinkState::Dangling {
                target: std::fs::read_link(link).unwrap_or_default(),
            }
        }
        Err(e) => LinkState::Wrong {
            found: format!("an entry that does not resolve ({e})"),
        },
    }
}

/// Whether `node` (an absolute path to a device node) has its link under `dev_dir` (the
/// host's /dev). For `accel-ctk doctor`; changes nothing.
pub fn state(dev_dir: &Path, node: &Path) -> Result<LinkState, DevCharError> {
    let (kind, major, minor) = node_id(node)?;
    let rdev = nix::sys::stat::makedev(major, minor);
    Ok(inspect(&link_path(dev_dir, kind, major, minor), kind, rdev))
}

/// Makes sure `<dev_dir>/{char,block}/MAJOR:MINOR` resolves to `node` (an absolute path):
/// see the module doc for what is created, replaced and left alone.
pub fn ensure(dev_dir: &Path, node: &Path) -> Result<Action, DevCharError> {
    if !node.is_absolute() {
        return Err(DevCharError::Node {
            node: node.into(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path"),
        });
    }
    let (kind, major, minor) = node_id(node)?;
    let rdev = nix::sys::stat::makedev(major, minor);
    let link = link_path(dev_dir, kind, major, minor);
    let create_err = |source| DevCharError::Create {
        link: link.clone(),
        node: node.into(),
        source,
    };
    // Each round either settles or saw another writer change the entry: two rounds are what
    // a lost race costs; more would mean the entry keeps changing under us.
    for _ in 0..4 {
        match inspect(&link, kind, rdev) {
            LinkState::Present => return Ok(Action::AlreadyPresent),
            LinkState::Wrong { found } => {
                return Err(DevCharError::Wrong {
                    link,
                    node: node.into(),
                    found,
                })
            }
            LinkState::Missing => {
                if let Some(dir) = link.parent() {
                    crate::atomic::make_dirs(dir).map_err(create_err)?;
                }
                match std::os::unix::fs::symlink(node, &link) {
                    Ok(()) => return Ok(Action::Created),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(create_err(e)),
                }
            }
            LinkState::Dangling { target } => {
                let dir = link.parent().unwrap_or(dev_dir);
                let tmp = dir.join(format!(
                    ".{major}:{minor}.accel-{}-{:x}",
                    std::process::id(),
                    unique()
                ));
                std::os::unix::fs::symlink(node, &tmp).map_err(create_err)?;
                // rename(2) replaces whatever is there now in one step; if another create
                // replaced the dangling link first, it made the same (right) link.
                if let Err(e) = std::fs::rename(&tmp, &link) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(create_err(e));
                }
                return Ok(Action::ReplacedDangling { old: target });
            }
        }
    }
    Err(create_err(io::Error::other(
        "the entry kept changing while it was being created",
    )))
}

/// A per-call number for temporary link names (with the pid: unique across processes).
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (u64::from(t) << 16) ^ N.fetch_add(1, Ordering::Relaxed)
}

/// Host paths of every node a container could be given from `profile`: each discovered
/// device's nodes, then the control and capability nodes present (for `accel-ctk system
/// create-dev-char-symlinks` and `accel-ctk doctor`).
pub fn profile_nodes(profile: &Profile) -> Result<Vec<PathBuf>, DevCharError> {
    let devices = discovery::discover(profile)?;
    let all: Vec<_> = devices.iter().collect();
    let nodes = facts::device_nodes(&discovery::DevRoot::new(profile), &all);
    let mut out: Vec<PathBuf> = plan::device_edits(profile, &all, &nodes)?
        .nodes
        .into_iter()
        .map(|n| n.host_path)
        .collect();
    let optional = profile
        .control_nodes
        .iter()
        .chain(profile.capabilities.values().flat_map(|c| c.nodes.iter()));
    for node in optional {
        let host = Profile::under(profile.dev_root(), node);
        // Optional, as on the create path (nvidia-modeset only exists with a display driver).
        if node_id(&host).is_ok() && !out.contains(&host) {
            out.push(host);
        }
    }
    Ok(out)
}

/// The create path's call: [`ensure`] for every node about to be injected, one log line for
/// each link made or refused. Never fails the create (see the module doc).
pub fn ensure_logged<'a>(dev_dir: &Path, nodes: impl IntoIterator<Item = &'a DeviceNode>) {
    for n in nodes {
        match ensure(dev_dir, &n.host_path) {
            Ok(Action::AlreadyPresent) => {}
            Ok(Action::Created) => log::info!(
                "created {} -> {} (systemd's DeviceAllow= needs it)",
                link_path(dev_dir, n.kind, n.major, n.minor).display(),
                n.host_path.display()
            ),
            Ok(Action::ReplacedDangling { old }) => log::info!(
                "replaced dangling {} -> {} with -> {}",
                link_path(dev_dir, n.kind, n.major, n.minor).display(),
                old.display(),
                n.host_path.display()
            ),
            Err(e) => log::warn!(
                "{e}; with the systemd cgroup driver the container loses {} at the next `systemctl daemon-reload`",
                n.path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A char node to link to without root: /dev/null (c 1:3) stands in for a device node,
    /// and the links go to a scratch "dev" directory.
    fn null() -> PathBuf {
        PathBuf::from("/dev/null")
    }

    #[test]
    fn creates_a_missing_link_then_leaves_it() {
        let dev = tempfile::tempdir().unwrap();
        assert_eq!(state(dev.path(), &null()).unwrap(), LinkState::Missing);
        assert_eq!(ensure(dev.path(), &null()).unwrap(), Action::Created);
        let link = dev.path().join("char/1:3");
        assert_eq!(std::fs::read_link(&link).unwrap(), null());
        assert_eq!(state(dev.path(), &null()).unwrap(), LinkState::Present);
        assert_eq!(ensure(dev.path(), &null()).unwrap(), Action::AlreadyPresent);
    }

    #[test]
    fn a_link_by_another_path_to_the_same_device_is_right() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::create_dir(dev.path().join("char")).unwrap();
        // udev's links are relative, a driver container's node has another path: what
        // counts is the device the entry resolves to.
        let link = dev.path().join("char/1:3");
        std::os::unix::fs::symlink("/dev/../dev/null", &link).unwrap();
        assert_eq!(ensure(dev.path(), &null()).unwrap(), Action::AlreadyPresent);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from("/dev/../dev/null")
        );
    }

    #[test]
    fn never_replaces_a_link_to_another_device() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::create_dir(dev.path().join("char")).unwrap();
        let link = dev.path().join("char/1:3");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let err = ensure(dev.path(), &null()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DevCharError::Wrong { .. }), "{msg}");
        assert!(msg.contains("a link to /dev/zero (c 1:5)"), "{msg}");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from("/dev/zero")
        );
        assert!(matches!(
            state(dev.path(), &null()).unwrap(),
            LinkState::Wrong { .. }
        ));
    }

    #[test]
    fn never_replaces_a_file_or_directory() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dev.path().join("char/1:3")).unwrap();
        assert!(matches!(
            ensure(dev.path(), &null()),
            Err(DevCharError::Wrong { .. })
        ));
        assert!(dev.path().join("char/1:3").is_dir());
        std::fs::remove_dir(dev.path().join("char/1:3")).unwrap();
        std::fs::write(dev.path().join("char/1:3"), "x").unwrap();
        assert!(matches!(
            ensure(dev.path(), &null()),
            Err(DevCharError::Wrong { .. })
        ));
        assert_eq!(std::fs::read(dev.path().join("char/1:3")).unwrap(), b"x");
    }

    #[test]
    fn replaces_a_dangling_link() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::create_dir(dev.path().join("char")).unwrap();
        let link = dev.path().join("char/1:3");
        std::os::unix::fs::symlink("/run/gone/dev/null", &link).unwrap();
        assert!(matches!(
            state(dev.path(), &null()).unwrap(),
            LinkState::Dangling { .. }
        ));
        assert_eq!(
            ensure(dev.path(), &null()).unwrap(),
            Action::ReplacedDangling {
                old: "/run/gone/dev/null".into()
            }
        );
        assert_eq!(std::fs::read_link(&link).unwrap(), null());
        // No temporary link left behind.
        assert_eq!(
            std::fs::read_dir(dev.path().join("char")).unwrap().count(),
            1
        );
    }

    #[test]
    fn refuses_what_is_not_a_node() {
        let dev = tempfile::tempdir().unwrap();
        let file = dev.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            ensure(dev.path(), &file),
            Err(DevCharError::NotANode { .. })
        ));
        assert!(matches!(
            ensure(dev.path(), Path::new("dev/null")),
            Err(DevCharError::Node { .. })
        ));
        assert!(!dev.path().join("char").exists());
    }

    #[test]
    fn concurrent_ensures_all_succeed_and_leave_one_link() {
        for round in 0..20 {
            let dev = tempfile::tempdir().unwrap();
            if round % 2 == 1 {
                // Half the rounds race on replacing a dangling link instead.
                std::fs::create_dir(dev.path().join("char")).unwrap();
                std::os::unix::fs::symlink("/gone", dev.path().join("char/1:3")).unwrap();
            }
            let barrier = std::sync::Barrier::new(16);
            let results: Vec<_> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..16)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            ensure(dev.path(), &null())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for r in &results {
                assert!(r.is_ok(), "round {round}: {r:?}");
            }
            let made = results
                .iter()
                .filter(|r| !matches!(r, Ok(Action::AlreadyPresent)))
                .count();
            assert!(made >= 1, "round {round}: nobody made the link");
            if round % 2 == 0 {
                // symlink(2) is exclusive: exactly one creator.
                assert_eq!(made, 1, "round {round}: {results:?}");
            }
            let entries: Vec<_> = std::fs::read_dir(dev.path().join("char"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(entries, vec![std::ffi::OsString::from("1:3")]);
            assert_eq!(
                std::fs::read_link(dev.path().join("char/1:3")).unwrap(),
                null()
            );
        }
    }
}
