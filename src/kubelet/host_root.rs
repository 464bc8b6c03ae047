//! The host's `/` as the device plugin's and the DRA driver's containers see it (`--host-root`,
//! `/host` in the DaemonSets).
//!
//! The pod cannot mount the host's `/dev` at `/dev` (kubelet's `/dev/termination-log` mount
//! then fails under a read-only bind) nor `/proc/driver` anywhere under `/proc` (runc refuses
//! the destination), and the CDI generator needs the driver's libraries, which live anywhere
//! under the host's root. So the pod mounts the host's `/` once, every profile is read under
//! it, and every path the plugin hands out (Allocate's device specs, the CDI spec's host
//! paths) is written back as the host names it: kubelet and the container runtime read them
//! on the host.

use std::path::{Path, PathBuf};

use crate::cdi::model::{ContainerEdits, Spec};
use crate::profile::Profile;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot(PathBuf);

impl Default for HostRoot {
    fn default() -> HostRoot {
        HostRoot(PathBuf::from("/"))
    }
}

impl HostRoot {
    pub fn new(dir: PathBuf) -> HostRoot {
        HostRoot(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    fn is_host(&self) -> bool {
        self.0 == Path::new("/")
    }

    /// `profile` with its driver root and dev root as this container reaches them.
    pub fn rebase(&self, mut profile: Profile) -> Profile {
        if self.is_host() {
            return profile;
        }
        profile.driver_root = Profile::under(&self.0, &profile.driver_root);
        profile.dev_root = profile.dev_root.map(|d| Profile::under(&self.0, &d));
        profile
    }

    /// The host's name for `path`, a path under this root (unchanged when it is not).
    pub fn to_host(&self, path: &str) -> String {
        if self.is_host() {
            return path.to_string();
        }
        match Path::new(path).strip_prefix(&self.0) {
            Ok(rest) => Path::new("/").join(rest).to_string_lossy().into_owned(),
            Err(_) => path.to_string(),
        }
    }

    /// A generated CDI spec with host paths (a node whose host path becomes its container
    /// path loses the redundant `hostPath`, as the generator writes it on the host).
    pub fn spec(&self, mut spec: Spec) -> Spec {
        let fix = |e: &mut ContainerEdits| {
            for n in &mut e.device_nodes {
                if let Some(h) = n.host_path.take() {
                    let h = self.to_host(&h);
                    n.host_path = (h != n.path).then_some(h);
                }
            }
            for m in &mut e.mounts {
                m.host_path = self.to_host(&m.host_path);
            }
        };
        fix(&mut spec.container_edits);
        for d in &mut spec.devices {
            fix(&mut d.container_edits);
        }
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::model::{Device, DeviceNode, Mount};

    #[test]
    fn profiles_are_read_under_the_root_and_paths_handed_out_as_the_host_names_them() {
        let h = HostRoot::new("/host".into());
        let mut p = crate::config::builtin_nvidia();
        p.dev_root = Some("/run/nvidia/driver".into());
        let p = h.rebase(p);
        assert_eq!(p.driver_root, Path::new("/host/"));
        assert_eq!(
            p.dev_root.as_deref(),
            Some(Path::new("/host/run/nvidia/driver"))
        );
        assert_eq!(h.to_host("/host/dev/nvidia0"), "/dev/nvidia0");
        assert_eq!(h.to_host("/host"), "/");
        // Not under the root (volume-mounts' /dev/null is the host's own name already).
        assert_eq!(h.to_host("/dev/null"), "/dev/null");
        assert_eq!(h.to_host("/hostile/x"), "/hostile/x");

        let edits = ContainerEdits {
            device_nodes: vec![
                DeviceNode {
                    path: "/dev/nvidia0".into(),
                    host_path: Some("/host/dev/nvidia0".into()),
                    ..DeviceNode::default()
                },
                DeviceNode {
                    path: "/dev/nvidia1".into(),
                    host_path: Some("/host/run/nvidia/driver/dev/nvidia1".into()),
                    ..DeviceNode::default()
                },
            ],
            mounts: vec![Mount {
                host_path: "/host/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                options: vec![],
                typ: None,
            }],
            ..ContainerEdits::default()
        };
        let s = h.spec(Spec {
            devices: vec![Device {
                name: "0".into(),
                container_edits: edits.clone(),
                ..Device::default()
            }],
            container_edits: edits,
            ..Spec::default()
        });
        for e in [&s.container_edits, &s.devices[0].container_edits] {
            assert_eq!(e.device_nodes[0].host_path, None);
            assert_eq!(
                e.device_nodes[1].host_path.as_deref(),
                Some("/run/nvidia/driver/dev/nvidia1")
            );
            assert_eq!(
                e.mounts[0].host_path,
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
            );
        }
    }

    #[test]
    fn the_host_itself_changes_nothing() {
        let h = HostRoot::default();
        let p = crate::config::builtin_nvidia();
        assert_eq!(h.rebase(p.clone()).driver_root, p.driver_root);
        assert_eq!(h.to_host("/dev/nvidia0"), "/dev/nvidia0");
    }
}
