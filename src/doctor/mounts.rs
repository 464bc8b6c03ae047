//! The propagation of the host's `/` mount, which decides whether the device-plugin and DRA
//! DaemonSets can start (issue 32, class 12).
//!
//! Both DaemonSets (packaging/kubernetes/components/device-plugin/accel-device-plugin.yaml,
//! components/dra/accel-dra-driver.yaml) mount the host's `/` with `mountPropagation:
//! HostToContainer`, which the runtime makes an `rslave` bind mount. containerd (and docker)
//! accept that only where the source mount is shared or a slave, and otherwise refuse the
//! container with nothing but `path "/" is mounted on "/" but it is not a shared or slave
//! mount`. systemd as PID 1 makes `/` shared at boot; on a host without it `/` stays private.
//! Read from `/proc/self/mountinfo` under the root (doctor runs in the host's mount
//! namespace, as containerd does), whose optional fields say `shared:N` or `master:N`.
//!
//! Ref: proc(5) (`/proc/pid/mountinfo`); Documentation/filesystems/sharedsubtree.rst;
//! containerd's CRI `ensureSharedOrSlave`.

use std::path::Path;

use super::{Ctx, Finding};
use crate::inroot::Root;

const C: &str = "mount-propagation";
/// A node with thousands of pods lists a few hundred bytes per mount; far above any.
const MAX_MOUNTINFO: u64 = 16 << 20;
const MOUNTINFO: &str = "/proc/self/mountinfo";
/// What containerd says when it refuses such a container.
const CONTAINERD_SAYS: &str =
    "path \"/\" is mounted on \"/\" but it is not a shared or slave mount";
pub const MAKE_SHARED: &str = "mount --make-rshared /";

/// The propagation fields (`shared:1`, `master:3`, `unbindable`) of the mount at `/` in
/// `mountinfo`; `None` when no line mounts `/`. Where several do, the first, as containerd
/// picks it.
pub fn root_propagation(mountinfo: &str) -> Option<Vec<&str>> {
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        // id, parent, major:minor, root, mount point, options, optional fields..., `-`, ...
        if fields.get(4) != Some(&"/") {
            return None;
        }
        let end = fields.iter().position(|f| *f == "-")?;
        Some(fields.get(6..end).unwrap_or_default().to_vec())
    })
}

/// Whether the DaemonSets' HostToContainer mount of the host's `/` can start here.
pub fn check_mount_propagation(ctx: &Ctx) -> Finding {
    let file = ctx.path(MOUNTINFO);
    let text = Root::open(&ctx.root)
        .and_then(|root| crate::discovery::read_in_root(&root, Path::new(MOUNTINFO), MAX_MOUNTINFO))
        .and_then(crate::bounded::text);
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            return Finding::info(
                C,
                format!(
                    "cannot read {}: {e}; whether the accel-device-plugin and accel-dra-driver DaemonSets can mount the host's / is not known",
                    file.display()
                ),
            )
        }
    };
    let Some(fields) = root_propagation(&text) else {
        return Finding::info(C, format!("{} lists no mount at /", file.display()));
    };
    if let Some(f) = fields
        .iter()
        .find(|f| f.starts_with("shared:") || f.starts_with("master:"))
    {
        let kind = if f.starts_with("shared:") {
            "shared"
        } else {
            "slave"
        };
        return Finding::ok(
            C,
            format!("\"/\" is a {kind} mount ({f}): the accel-device-plugin and accel-dra-driver DaemonSets can mount it with HostToContainer propagation"),
        );
    }
    let msg = format!(
        "\"/\" is a private mount (no shared: or master: field in {}; a host without systemd as PID 1 leaves it so): containerd will not start the accel-device-plugin and accel-dra-driver DaemonSets' pods, which mount the host's / with mountPropagation: HostToContainer (packaging/kubernetes/), saying only '{CONTAINERD_SAYS}'",
        file.display()
    );
    let fix = format!("{MAKE_SHARED}   (at every boot, before containerd and kubelet start; systemd as PID 1 makes / shared by itself)");
    if ctx.path("/var/lib/kubelet").is_dir() {
        Finding::warn(C, msg, fix)
    } else {
        Finding::new(
            C,
            super::Status::Info,
            format!("{msg}; this is not a Kubernetes node (no /var/lib/kubelet)"),
            Some(fix),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::Status;

    #[test]
    fn root_propagation_fields() {
        let private =
            "22 27 0:21 / /proc rw - proc proc rw\n27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
        assert_eq!(root_propagation(private), Some(vec![]));
        let shared = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";
        assert_eq!(root_propagation(shared), Some(vec!["shared:1"]));
        let both =
            "1 0 8:1 / / rw shared:1 master:4 - ext4 /dev/sda1 rw\n2 1 8:2 / / rw - ext4 x rw\n";
        assert_eq!(root_propagation(both), Some(vec!["shared:1", "master:4"]));
        assert_eq!(
            root_propagation("22 27 0:21 / /proc rw - proc proc rw\n"),
            None
        );
        // A mount point that only starts like `/` is not `/`.
        assert_eq!(
            root_propagation("5 1 0:1 / /\\040x rw - tmpfs t rw\n"),
            None
        );
    }

    #[test]
    fn graded_by_kubelet_presence() {
        let t = Tree::new();
        let f = check_mount_propagation(&t.ctx());
        assert_eq!(f.status, Status::Info, "{f:?}");
        assert!(f.message.starts_with("cannot read"), "{f:?}");
        t.write(MOUNTINFO, "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n");
        let f = check_mount_propagation(&t.ctx());
        assert_eq!(f.status, Status::Info, "{f:?}");
        assert!(f.message.contains("not a Kubernetes node"), "{f:?}");
        std::fs::create_dir_all(t.ctx().path("/var/lib/kubelet")).unwrap();
        let f = check_mount_propagation(&t.ctx());
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(f.message.contains(CONTAINERD_SAYS), "{f:?}");
        assert!(f.fix.unwrap().starts_with(MAKE_SHARED));
        t.write(MOUNTINFO, "27 1 254:0 / / rw master:2 - ext4 /dev/vda rw\n");
        assert_eq!(check_mount_propagation(&t.ctx()).status, Status::Ok);
    }
}
