//! The two ends of the plugin's decision, pure: an NRI container read as the create path reads
//! a spec ([`view`]: the same [`View`] the shim builds from config.json, so
//! [`crate::create::decide`] cannot tell the two apart), and the create's edits written as
//! NRI's `ContainerAdjustment` ([`adjustment`]) with what the container already carries left
//! out.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde_json::{json, Value};

use super::proto::api::Container;
use super::proto::api::{
    ContainerAdjustment, KeyValue, LinuxContainerAdjustment, LinuxDevice, LinuxDeviceCgroup,
    LinuxResources, Mount, OptionalFileMode, OptionalInt64, OptionalUInt32,
};
use crate::create::Outcome;
use crate::edits::{DeviceNode, MOUNT_OPTIONS};
use crate::spec::View;

/// The container as the create path's [`View`]. NRI shows no capabilities, so the container
/// is taken as unprivileged: where the node refuses unprivileged requests
/// (`accept-envvar-unprivileged = false`) the plugin ignores its variable, as the shim does
/// for an unprivileged one (the shim would honour a privileged one). Annotations are sorted
/// by name (NRI sends a map). No rootfs and no hooks: the plugin sees neither.
pub fn view(c: &Container) -> View {
    let mut annotations: Vec<(String, String)> = c
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.sort();
    let mounts: Vec<Value> = c
        .mounts
        .iter()
        .map(|m| {
            json!({
                "destination": m.destination,
                "type": m.r#type,
                "source": m.source,
                "options": m.options,
            })
        })
        .collect();
    View {
        env: c.env.clone(),
        privileged: false,
        annotations,
        root_path: None,
        mount_destinations: c.mounts.iter().map(|m| m.destination.clone()).collect(),
        mounts,
        docker_gpu_hook: false,
    }
}

/// What the adjustment adds, for the log line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Added {
    pub nodes: usize,
    pub mounts: usize,
    /// Groups the plan wanted for non-root users: NRI's adjustment has no field for them.
    pub dropped_gids: Vec<u32>,
}

/// The edits as an adjustment: each node (with the shim's cgroup rule, `rwm`, or the CDI
/// edit's access) unless the container has one of that path or of that type and major:minor
/// already (CDI devices kubelet or DRA injected); each mount (read-only, the shim's options,
/// or the CDI edit's) unless one is at that destination; CDI's variables. A path that is not
/// UTF-8 is an error naming it (NRI's fields are strings).
pub fn adjustment(out: &Outcome, c: &Container) -> Result<(ContainerAdjustment, Added), String> {
    let present: &[LinuxDevice] = c.linux.as_ref().map_or(&[], |l| &l.devices);
    let mut devices: Vec<LinuxDevice> = Vec::new();
    let mut rules: Vec<LinuxDeviceCgroup> = Vec::new();
    let nodes = out
        .plan
        .nodes
        .iter()
        .map(|n| (n, Some("rwm")))
        .chain(out.cdi.nodes.iter().map(|n| (&n.node, n.access.as_deref())));
    for (n, access) in nodes {
        let path = utf8(&n.path, "device path")?;
        let same = |d: &LinuxDevice| {
            n.is(
                &d.path,
                &d.r#type,
                u64::try_from(d.major).ok(),
                u64::try_from(d.minor).ok(),
            )
        };
        if present.iter().any(same) || devices.iter().any(same) {
            continue;
        }
        devices.push(device(n, path)?);
        if let Some(access) = access {
            rules.push(LinuxDeviceCgroup {
                allow: true,
                r#type: n.kind.as_str().to_string(),
                major: Some(OptionalInt64 {
                    value: number(n.major, path)?,
                }),
                minor: Some(OptionalInt64 {
                    value: number(n.minor, path)?,
                }),
                access: access.to_string(),
            });
        }
    }
    let shim_options: Vec<String> = MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect();
    let plan_mounts = out
        .plan
        .mounts
        .iter()
        .map(|m| (m, "bind", &shim_options[..]));
    let cdi_mounts = out
        .cdi
        .mounts
        .iter()
        .map(|m| (&m.mount, m.typ.as_deref().unwrap_or(""), &m.options[..]));
    let mut mounts: Vec<Mount> = Vec::new();
    for (m, typ, options) in plan_mounts.chain(cdi_mounts) {
        let destination = utf8(&m.destination, "mount destination")?;
        if c.mounts.iter().any(|x| x.destination == destination)
            || mounts.iter().any(|x| x.destination == destination)
        {
            continue;
        }
        mounts.push(Mount {
            destination: destination.to_string(),
            r#type: typ.to_string(),
            source: utf8(&m.source, "mount source")?.to_string(),
            options: options.to_vec(),
        });
    }
    let env = out
        .cdi
        .env
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| KeyValue {
            key: k.to_string(),
            value: v.to_string(),
        })
        .collect();
    let mut dropped_gids: Vec<u32> = Vec::new();
    for g in out
        .plan
        .additional_gids
        .iter()
        .chain(&out.cdi.additional_gids)
    {
        if !dropped_gids.contains(g) {
            dropped_gids.push(*g);
        }
    }
    let added = Added {
        nodes: devices.len(),
        mounts: mounts.len(),
        dropped_gids,
    };
    let linux = (!devices.is_empty()).then(|| LinuxContainerAdjustment {
        devices,
        resources: (!rules.is_empty()).then(|| LinuxResources {
            devices: rules,
            ..LinuxResources::default()
        }),
    });
    Ok((
        ContainerAdjustment {
            mounts,
            env,
            linux,
            ..ContainerAdjustment::default()
        },
        added,
    ))
}

fn device(n: &DeviceNode, path: &str) -> Result<LinuxDevice, String> {
    Ok(LinuxDevice {
        path: path.to_string(),
        r#type: n.kind.as_str().to_string(),
        major: number(n.major, path)?,
        minor: number(n.minor, path)?,
        file_mode: Some(OptionalFileMode { value: n.file_mode }),
        uid: Some(OptionalUInt32 { value: n.uid }),
        gid: Some(OptionalUInt32 { value: n.gid }),
    })
}

fn number(x: u64, path: &str) -> Result<i64, String> {
    i64::try_from(x).map_err(|_| {
        format!(
            "{}: device number {x} is out of range",
            crate::quote::quote(path)
        )
    })
}

fn utf8<'p>(p: &'p Path, what: &str) -> Result<&'p str, String> {
    p.to_str().ok_or_else(|| {
        format!(
            "{what} {} is not UTF-8",
            crate::quote::quote_bytes(p.as_os_str().as_bytes())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::apply::{MountEdit, Node, Resolved};
    use crate::edits::{BindMount, NodeKind, Plan};
    use crate::nri::proto::api::LinuxContainer;

    fn node(path: &str, minor: u64, mode: u32, gid: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: path.into(),
            kind: NodeKind::Char,
            major: 195,
            minor,
            file_mode: mode,
            uid: 0,
            gid,
        }
    }

    fn outcome() -> Outcome {
        let mut plan = Plan::default();
        plan.push_node(node("/dev/nvidia1", 1, 0o666, 0));
        plan.push_node(node("/dev/nvidiactl", 255, 0o660, 44));
        plan.mounts.push(BindMount {
            source: "/drv/usr/bin/nvidia-smi".into(),
            destination: "/usr/bin/nvidia-smi".into(),
        });
        Outcome {
            plan,
            ..Outcome::default()
        }
    }

    fn container(devices: Vec<LinuxDevice>, mounts: Vec<Mount>) -> Container {
        Container {
            name: "c".into(),
            mounts,
            linux: Some(LinuxContainer { devices }),
            ..Container::default()
        }
    }

    #[test]
    fn nodes_come_with_the_shims_rule_and_mounts_with_its_options() {
        let (adj, added) = adjustment(&outcome(), &container(vec![], vec![])).unwrap();
        let linux = adj.linux.unwrap();
        let paths: Vec<&str> = linux.devices.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvidia1", "/dev/nvidiactl"]);
        let d = &linux.devices[1];
        assert_eq!((d.r#type.as_str(), d.major, d.minor), ("c", 195, 255));
        assert_eq!(d.file_mode, Some(OptionalFileMode { value: 0o660 }));
        assert_eq!(d.gid, Some(OptionalUInt32 { value: 44 }));
        let rules = linux.resources.unwrap().devices;
        assert_eq!(rules.len(), 2);
        assert!(rules[0].allow);
        assert_eq!(rules[0].access, "rwm");
        assert_eq!(rules[0].minor, Some(OptionalInt64 { value: 1 }));
        assert_eq!(adj.mounts.len(), 1);
        assert_eq!(adj.mounts[0].r#type, "bind");
        assert_eq!(adj.mounts[0].options, ["ro", "nosuid", "nodev", "bind"]);
        assert_eq!(adj.mounts[0].source, "/drv/usr/bin/nvidia-smi");
        assert_eq!(added.nodes, 2);
        assert_eq!(added.mounts, 1);
        // nvidiactl is not world read-writable: the shim would add group 44.
        assert_eq!(added.dropped_gids, [44]);
    }

    #[test]
    fn a_node_the_container_has_is_not_added_twice() {
        // As CDI would have injected it: another path, the same major:minor.
        let cdi = LinuxDevice {
            path: "/dev/gpu-by-cdi".into(),
            r#type: "c".into(),
            major: 195,
            minor: 1,
            ..LinuxDevice::default()
        };
        let by_path = LinuxDevice {
            path: "/dev/nvidiactl".into(),
            r#type: "c".into(),
            major: 1,
            minor: 3,
            ..LinuxDevice::default()
        };
        let mount = Mount {
            destination: "/usr/bin/nvidia-smi".into(),
            ..Mount::default()
        };
        let (adj, added) =
            adjustment(&outcome(), &container(vec![cdi, by_path], vec![mount])).unwrap();
        assert_eq!(adj.linux, None);
        assert!(adj.mounts.is_empty());
        assert_eq!((added.nodes, added.mounts), (0, 0));
    }

    #[test]
    fn a_block_node_of_the_same_numbers_is_another_device() {
        let blk = LinuxDevice {
            path: "/dev/sdx".into(),
            r#type: "b".into(),
            major: 195,
            minor: 1,
            ..LinuxDevice::default()
        };
        let (adj, _) = adjustment(&outcome(), &container(vec![blk], vec![])).unwrap();
        assert_eq!(adj.linux.unwrap().devices.len(), 2);
    }

    #[test]
    fn cdi_edits_keep_their_access_options_and_variables() {
        let out = Outcome {
            cdi: Resolved {
                env: vec!["A=1".into(), "B=x=y".into()],
                nodes: vec![
                    Node {
                        node: node("/dev/card0", 0, 0o666, 0),
                        access: Some("rw".into()),
                    },
                    Node {
                        node: node("/dev/card1", 7, 0o666, 0),
                        access: None,
                    },
                ],
                mounts: vec![MountEdit {
                    mount: BindMount {
                        source: "/a".into(),
                        destination: "/b".into(),
                    },
                    typ: None,
                    options: vec!["ro".into(), "rbind".into()],
                }],
                additional_gids: vec![],
            },
            ..Outcome::default()
        };
        let (adj, _) = adjustment(&out, &container(vec![], vec![])).unwrap();
        let linux = adj.linux.unwrap();
        assert_eq!(linux.devices.len(), 2);
        let rules = linux.resources.unwrap().devices;
        assert_eq!(rules.len(), 1, "CDI's access none writes no rule");
        assert_eq!(rules[0].access, "rw");
        assert_eq!(adj.mounts[0].options, ["ro", "rbind"]);
        assert_eq!(adj.mounts[0].r#type, "");
        assert_eq!(adj.env[1].key, "B");
        assert_eq!(adj.env[1].value, "x=y");
    }

    #[test]
    fn nothing_asked_is_an_empty_adjustment() {
        let (adj, added) = adjustment(&Outcome::default(), &Container::default()).unwrap();
        assert_eq!(adj, ContainerAdjustment::default());
        assert_eq!(added, Added::default());
    }

    #[test]
    fn the_view_reads_env_mounts_and_annotations() {
        let c = Container {
            env: vec!["NVIDIA_VISIBLE_DEVICES=1".into(), "X".into()],
            annotations: [("b".to_string(), "2".to_string()), ("a".into(), "1".into())]
                .into_iter()
                .collect(),
            mounts: vec![Mount {
                destination: "/var/run/nvidia-container-devices/0".into(),
                r#type: "bind".into(),
                source: "/dev/null".into(),
                options: vec!["rbind".into()],
            }],
            ..Container::default()
        };
        let v = view(&c);
        assert_eq!(v.env("NVIDIA_VISIBLE_DEVICES"), Some("1"));
        assert!(!v.privileged);
        assert_eq!(v.annotations[0].0, "a");
        assert_eq!(
            crate::request::device_list_from_mounts("/var/run/nvidia-container-devices", &v.mounts),
            ["0"]
        );
    }
}
