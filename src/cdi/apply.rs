//! Writing resolved CDI edits into config.json (a `serde_json::Value`, never a typed Spec).
//!
//! CDI's rules, not the variable path's "keep what is there": a device node replaces the
//! spec's node at the same path, a mount replaces the spec's mounts at the same destination,
//! an `env` entry sets every entry of that name. Every node is checked on the host
//! (`facts::stat`, `plan::node`): the host path must be a char or block device, and type,
//! numbers, mode and owner the spec leaves out are taken from it, so a generated spec gives
//! the same entries as the variable. Entries are built by the same functions `spec::apply` uses.
//!
//! Hooks are refused. A CDI hook is a host program that runc starts during create; NVIDIA's
//! CVE-2025-23266 was exactly such a hook running with an environment the image chose
//! (`LD_PRELOAD`). This runtime's design is to run no hook at all (libraries are mounted at
//! their soname instead of running ldconfig), so a spec that needs one is an error naming the
//! file and the hook, rather than a container that silently lacks what the hook would do.
//! `intelRdt` and `netDevices` are refused the same way (not implemented).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::model::{ContainerEdits, DeviceNode as CdiNode};
use super::registry::Edits;
use crate::facts;
use crate::plan::{self, BindMount, DeviceNode, NodeKind, PlanError};
use crate::spec;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("CDI spec {}: device {path}: {msg}", spec.display())]
    Node {
        spec: PathBuf,
        path: String,
        msg: String,
    },
    #[error("CDI spec {}: {what} are not supported by this runtime ({detail})", spec.display())]
    Unsupported {
        spec: PathBuf,
        what: &'static str,
        detail: String,
    },
    #[error("cannot apply CDI edits: {0}")]
    Edit(String),
}

/// One node to add: the entry, and the cgroup access (`None`: CDI's `none`, no rule).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub node: DeviceNode,
    pub access: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MountEdit {
    pub mount: BindMount,
    pub typ: Option<String>,
    pub options: Vec<String>,
}

/// CDI edits after checking against the host, ready to write.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Resolved {
    pub env: Vec<String>,
    pub nodes: Vec<Node>,
    pub mounts: Vec<MountEdit>,
    pub additional_gids: Vec<u32>,
}

impl Resolved {
    pub fn is_empty(&self) -> bool {
        self == &Resolved::default()
    }
}

/// Checks every edit against the host; nothing is written here.
pub fn resolve(edits: &Edits<'_>) -> Result<Resolved, ApplyError> {
    let mut out = Resolved::default();
    for (path, e) in edits {
        refuse_unsupported(path, e)?;
        out.env.extend(e.env.iter().cloned());
        for n in &e.device_nodes {
            out.nodes.push(node(path, n)?);
        }
        for m in &e.mounts {
            out.mounts.push(MountEdit {
                mount: BindMount {
                    source: m.host_path.clone().into(),
                    destination: m.container_path.clone().into(),
                },
                typ: m.typ.clone(),
                options: m.options.clone(),
            });
        }
        out.additional_gids
            .extend(e.additional_gids.iter().filter(|g| **g != 0));
    }
    Ok(out)
}

fn refuse_unsupported(path: &Path, e: &ContainerEdits) -> Result<(), ApplyError> {
    let unsupported = |what, detail| ApplyError::Unsupported {
        spec: path.into(),
        what,
        detail,
    };
    if let Some(h) = e.hooks.first() {
        return Err(unsupported(
            "hooks",
            format!(
                "{} hook {}: this runtime runs no hook programs; see docs/cdi.md",
                h.hook_name, h.path
            ),
        ));
    }
    if e.intel_rdt.is_some() {
        return Err(unsupported("intelRdt edits", "not implemented".into()));
    }
    if !e.net_devices.is_empty() {
        return Err(unsupported("netDevices edits", "not implemented".into()));
    }
    Ok(())
}

fn node(spec_path: &Path, n: &CdiNode) -> Result<Node, ApplyError> {
    let err = |msg: String| ApplyError::Node {
        spec: spec_path.into(),
        path: n.path.clone(),
        msg,
    };
    let host = n.host_path.as_deref().unwrap_or(&n.path);
    let stat = facts::stat(Path::new(host)).map_err(|e| err(format!("host path {host}: {e}")))?;
    let mut node = match plan::node(Path::new(host), Path::new(&n.path), &stat) {
        Ok(node) => node,
        Err(PlanError::NotADevice { .. }) => {
            return Err(err(format!(
                "host path {host} is not a char or block device"
            )))
        }
        Err(e) => return Err(err(e.to_string())),
    };
    let kind = match n.typ.as_deref() {
        None | Some("") => None,
        Some("b") => Some(NodeKind::Block),
        Some(_) => Some(NodeKind::Char),
    };
    if let Some(k) = kind {
        if k != node.kind {
            return Err(err(format!(
                "type {} does not match the host node {host} ({})",
                k.as_str(),
                node.kind.as_str()
            )));
        }
        // A node the spec fully describes keeps its numbers (CDI's rule).
        if let (Some(major), Some(minor)) = (n.major.filter(|m| *m != 0), n.minor) {
            node.major = u64::try_from(major).map_err(|_| err(format!("major {major}")))?;
            node.minor = u64::try_from(minor).map_err(|_| err(format!("minor {minor}")))?;
        }
    }
    node.file_mode = n.file_mode.map_or(node.file_mode, |m| m & 0o7777);
    node.uid = n.uid.unwrap_or(node.uid);
    node.gid = n.gid.unwrap_or(node.gid);
    let access = match n.permissions.as_deref() {
        None | Some("") => Some("rwm".to_string()),
        Some("none") => None,
        Some(p) => Some(p.to_string()),
    };
    Ok(Node { node, access })
}

/// Writes the edits into the document with CDI's replace rules.
pub fn apply(doc: &mut Value, r: &Resolved) -> Result<(), ApplyError> {
    write(doc, r).map_err(ApplyError::Edit)
}

fn write(doc: &mut Value, r: &Resolved) -> Result<(), String> {
    if !r.env.is_empty() {
        let env = spec::array_mut(doc, &["process", "env"])?;
        for entry in &r.env {
            let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
            let same = |v: &Value| {
                v.as_str()
                    .and_then(|s| s.strip_prefix(key))
                    .is_some_and(|rest| rest.starts_with('='))
            };
            // Every entry of that name gets the value, so the result does not depend on
            // whether the first or the last of duplicated entries is the one that counts.
            let mut found = false;
            for v in env.iter_mut().filter(|v| same(v)) {
                *v = Value::from(entry.as_str());
                found = true;
            }
            if !found {
                env.push(Value::from(entry.as_str()));
            }
        }
    }
    if !r.nodes.is_empty() {
        let devices = spec::array_mut(doc, &["linux", "devices"])?;
        for n in &r.nodes {
            let path = n.node.path.to_string_lossy();
            devices.retain(|d| d.get("path").and_then(Value::as_str) != Some(&path));
            devices.push(spec::device_entry(&n.node)?);
        }
        // The section is there afterwards even when no node has an access rule (`none`).
        if r.nodes.iter().all(|n| n.access.is_none()) {
            spec::array_mut(doc, &["linux", "resources", "devices"])?;
        }
        for n in &r.nodes {
            if let Some(access) = &n.access {
                let rule = spec::rule_entry(&n.node, access)?;
                let rules = spec::array_mut(doc, &["linux", "resources", "devices"])?;
                if !rules.contains(&rule) {
                    rules.push(rule);
                }
            }
        }
    }
    if !r.mounts.is_empty() {
        let mounts = spec::array_mut(doc, &["mounts"])?;
        for m in &r.mounts {
            let dest = m.mount.destination.to_string_lossy();
            mounts.retain(|x| x.get("destination").and_then(Value::as_str) != Some(&dest));
            mounts.push(spec::mount_entry(&m.mount, m.typ.as_deref(), &m.options)?);
        }
    }
    spec::add_gids(doc, &r.additional_gids)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::model::{Hook, Mount};
    use serde_json::json;

    fn edits(e: ContainerEdits) -> Resolved {
        let p = PathBuf::from("/etc/cdi/x.yaml");
        resolve(&vec![(p.as_path(), &e)]).unwrap()
    }

    #[test]
    fn node_from_host_and_cdi_replace_rules() {
        let r = edits(ContainerEdits {
            env: vec!["A=cdi".into(), "NEW=1".into()],
            device_nodes: vec![CdiNode {
                path: "/dev/null".into(),
                ..CdiNode::default()
            }],
            mounts: vec![Mount {
                host_path: "/lib/x.so.1".into(),
                container_path: "/usr/lib64/x.so.1".into(),
                options: vec!["ro".into(), "bind".into()],
                typ: None,
            }],
            additional_gids: vec![0, 44],
            ..ContainerEdits::default()
        });
        assert_eq!(
            (r.nodes[0].node.major, r.nodes[0].node.minor),
            (1, 3),
            "filled from the host node"
        );
        let input = json!({"process": {"env": ["A=image", "B=1", "A=again"]},
            "mounts": [{"destination": "/usr/lib64/x.so.1", "source": "/old", "type": "bind"}],
            "linux": {"devices": [{"path": "/dev/null", "type": "c", "major": 9, "minor": 9}]}})
        .to_string();
        let mut doc: Value = serde_json::from_str(&input).unwrap();
        apply(&mut doc, &r).unwrap();
        assert_eq!(
            doc["process"]["env"],
            json!(["A=cdi", "B=1", "A=cdi", "NEW=1"])
        );
        assert_eq!(doc["linux"]["devices"].as_array().unwrap().len(), 1);
        assert_eq!(doc["linux"]["devices"][0]["major"], 1);
        assert_eq!(
            doc["linux"]["resources"]["devices"],
            json!([{"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}])
        );
        assert_eq!(
            doc["mounts"],
            json!([{"destination": "/usr/lib64/x.so.1", "source": "/lib/x.so.1", "options": ["ro", "bind"]}])
        );
        assert_eq!(doc["process"]["user"]["additionalGids"], json!([44]));
    }

    #[test]
    fn host_path_must_be_a_device() {
        let e = ContainerEdits {
            device_nodes: vec![CdiNode {
                path: "/dev/x".into(),
                host_path: Some("/etc/hostname".into()),
                ..CdiNode::default()
            }],
            ..ContainerEdits::default()
        };
        let p = PathBuf::from("/etc/cdi/x.yaml");
        let err = resolve(&vec![(p.as_path(), &e)]).unwrap_err().to_string();
        assert_eq!(
            err,
            "CDI spec /etc/cdi/x.yaml: device /dev/x: host path /etc/hostname is not a char or block device"
        );
    }

    #[test]
    fn hooks_are_refused_naming_file_and_hook() {
        let e = ContainerEdits {
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvidia-cdi-hook".into(),
                ..Hook::default()
            }],
            ..ContainerEdits::default()
        };
        let p = PathBuf::from("/var/run/cdi/nvidia.yaml");
        let err = resolve(&vec![(p.as_path(), &e)]).unwrap_err().to_string();
        assert!(
            err.starts_with("CDI spec /var/run/cdi/nvidia.yaml: hooks are not supported")
                && err.contains("createContainer hook /usr/bin/nvidia-cdi-hook"),
            "{err}"
        );
    }
}
