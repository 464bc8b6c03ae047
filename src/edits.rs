//! The edits a container gets, as plain data: what the plan decides (`plan`), what CDI specs
//! resolve to (`cdi`), and what the spec editor writes (`spec`). A leaf: it uses nothing of
//! the crate, so the planners and the editor share these types without using each other.

use std::path::PathBuf;

/// The options of every driver file bound into a container.
pub const MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

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

impl DeviceNode {
    /// Whether a node a spec already has (its `path`, `type` and numbers, as `linux.devices`
    /// carries them) is this one: the same path, or the same type and `major:minor` under
    /// another path (as CDI or kubelet may have put it).
    pub fn is(&self, path: &str, typ: &str, major: Option<u64>, minor: Option<u64>) -> bool {
        self.path == std::path::Path::new(path)
            || (typ == self.kind.as_str() && major == Some(self.major) && minor == Some(self.minor))
    }
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
    pub fn extend(&mut self, other: Plan) {
        for n in other.nodes {
            self.push_node(n);
        }
        for m in other.mounts {
            if !self.mounts.iter().any(|x| x.destination == m.destination) {
                self.mounts.push(m);
            }
        }
        for g in other.additional_gids {
            if !self.additional_gids.contains(&g) {
                self.additional_gids.push(g);
            }
        }
    }

    /// Adds a node unless one of that path is there, and its group when the node is not
    /// world read-writable (root's group is never handed out).
    pub fn push_node(&mut self, n: DeviceNode) {
        if self.nodes.iter().any(|x| x.path == n.path) {
            return;
        }
        if n.file_mode & 0o006 != 0o006 && n.gid != 0 && !self.additional_gids.contains(&n.gid) {
            self.additional_gids.push(n.gid);
        }
        self.nodes.push(n);
    }
}
