//! The kernel's limit on a device's memory: the dmem cgroup controller (Linux 6.14).
//!
//! A driver that registers its device memory (Intel xe, amdgpu through TTM) lists each region
//! in the cgroup v2 root's `dmem.capacity`, one line `drm/<pci bus id>/<region> <bytes>`; a
//! cgroup's `dmem.max`, lines of the same form, caps what its processes may allocate there.
//! A runtime sets it as any cgroup v2 key, `linux.resources.unified["dmem.max"]` (runc and
//! crun write it), and NRI's adjustment carries the same map.
//!
//! What a share's container may use comes from the DRA driver's record of what it prepared
//! ([`PodGrants`]: written by root, under a root-only directory, at prepare), matched to the
//! container by the pod UID the engine sets and by a device node the claim's CDI spec put in
//! its spec. Never from its variables or its own annotations: a container sets those itself.
//!
//! Only the `vram*` regions count: they are the device's own memory, which the share's grant
//! is a part of. Several (one per tile on xe) share the grant in proportion to their sizes,
//! so the limits still add up to the grant, as the scheduler's accounting assumes.
//!
//! Ref: Linux `Documentation/admin-guide/cgroup-v2.rst` ("DMEM"), kernel/cgroup/dmem.c.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The root cgroup's list of registered regions.
pub const CAPACITY_FILE: &str = "dmem.capacity";
/// The cgroup v2 key a container's limit is written under.
pub const MAX_KEY: &str = "dmem.max";
/// The host's cgroup v2 mount, where `dmem.capacity` is (config.toml's `cgroup-root`).
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Where the DRA driver keeps its grants by pod (config.toml's `dmem-grants-dir`): beside
/// its claim records, in the directory its DaemonSet mounts from the host.
pub const DEFAULT_GRANTS_DIR: &str = "/var/lib/accel-dra-driver/pods";

/// The annotations an engine gives every container of a pod with the pod's UID. containerd's
/// CRI plugin writes `io.kubernetes.cri.sandbox-uid` from the sandbox's metadata after the
/// pod annotations the operator lets through (its `DefaultCRIAnnotations` come last), so a
/// pod cannot set it. `io.kubernetes.pod.uid` is kubelet's container label, as CRI-O carries
/// it; not checked against CRI-O's source here (docs/security.md).
pub const POD_UID_ANNOTATIONS: &[&str] =
    &["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"];

/// `dmem.capacity` is a line per region: a few hundred bytes per device.
const MAX_CAPACITY: u64 = 64 << 10;
/// A grant file names a few devices.
const MAX_GRANT_FILE: u64 = 64 << 10;
/// Grant files of one pod read at most: far above the claims a pod can name. Pods with
/// grants are all listed: one left out would run without its limit.
const MAX_ENTRIES: usize = 256;

/// One region a driver registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region<'a> {
    /// The device's PCI function, as the kernel writes it (`0000:03:00.0`).
    pub bus: &'a str,
    /// The region's name on its device (`vram0`, `system`).
    pub name: &'a str,
    pub bytes: u64,
}

/// The regions of `dmem.capacity`'s text; lines of another form (other subsystems, a
/// future format) are skipped.
pub fn regions(capacity: &str) -> impl Iterator<Item = Region<'_>> {
    capacity.lines().filter_map(|line| {
        let mut words = line.split_whitespace();
        let key = words.next()?;
        let bytes = words.next()?.parse().ok()?;
        let (bus, name) = key.strip_prefix("drm/")?.rsplit_once('/')?;
        (!bus.is_empty() && !name.is_empty() && !bus.contains('/')).then_some(Region {
            bus,
            name,
            bytes,
        })
    })
}

/// The device memory regions (`vram*`) of the device at PCI function `bus`.
pub fn device_regions<'a>(capacity: &'a str, bus: &str) -> Vec<Region<'a>> {
    regions(capacity)
        .filter(|r| r.bus.eq_ignore_ascii_case(bus) && r.name.starts_with("vram") && r.bytes > 0)
        .collect()
}

/// Whether the kernel can hold a share of the device at `bus` to its memory on this node.
pub fn enforceable(capacity: &str, bus: &str) -> bool {
    !device_regions(capacity, bus).is_empty()
}

/// The text of `dmem.capacity` under `cgroup_root`; empty where there is none (cgroup v1, a
/// kernel before 6.14, the controller off) or it cannot be read: nothing is then enforced.
pub fn read_capacity(cgroup_root: &Path) -> String {
    crate::bounded::read_text(&cgroup_root.join(CAPACITY_FILE), MAX_CAPACITY).unwrap_or_default()
}

/// What one prepared share or part gives its pods of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Grant {
    /// Its name in the claim's CDI spec (for the reader).
    pub device: String,
    /// Its PCI function: the region's name in `dmem.capacity`.
    pub bus: String,
    /// `major:minor` of its nodes, as prepared: a container holds the device when its spec
    /// has one of them.
    pub rdevs: Vec<String>,
    /// The memory granted (bytes), after the claim's own narrower limit.
    pub memory: u64,
}

/// The DRA driver's record of one claim's grants to one pod, at
/// `<dmem-grants-dir>/<pod uid>/<claim uid>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PodGrants {
    pub pod: String,
    pub claim: String,
    pub grants: Vec<Grant>,
}

/// The cgroup v2 `unified` entries of a container of pod `pod_uid` whose spec holds the
/// device nodes `rdevs` (`major:minor`), from the DRA driver's records (`records`: those
/// of the pod's directory) and the node's `dmem.capacity` text: `dmem.max` with a line per
/// region of each device the container holds a grant on. `None` where nothing applies: no
/// record of this pod, no node of a granted device in the spec, no region registered.
///
/// Every input is one a pod cannot write: the records are root's, the UID is the engine's,
/// the device nodes came from the claim's CDI spec (a container that names a node it was
/// not given gets no device rule for it from the kubelet path). The shim's create and the
/// NRI plugin call this alike; the plugin maps the result into `LinuxResources.unified`.
pub fn unified(
    records: &[PodGrants],
    capacity: &str,
    pod_uid: &str,
    rdevs: &[String],
) -> Option<Vec<(String, String)>> {
    // By PCI function: two claims on one device (two shares) add up.
    let mut memory: BTreeMap<String, u64> = BTreeMap::new();
    for g in records
        .iter()
        .filter(|r| r.pod == pod_uid)
        .flat_map(|r| &r.grants)
        .filter(|g| g.rdevs.iter().any(|d| rdevs.contains(d)))
    {
        let m = memory.entry(g.bus.to_ascii_lowercase()).or_default();
        *m = m.saturating_add(g.memory);
    }
    let mut lines = Vec::new();
    for (bus, granted) in memory {
        let regions = device_regions(capacity, &bus);
        let total: u128 = regions.iter().map(|r| u128::from(r.bytes)).sum();
        for r in &regions {
            // Each region's part of the grant, as its part of the device's memory.
            let part = u128::from(granted) * u128::from(r.bytes) / total.max(1);
            let limit = u64::try_from(part).unwrap_or(u64::MAX).min(r.bytes);
            lines.push(format!("drm/{}/{} {limit}", r.bus, r.name));
        }
    }
    (!lines.is_empty()).then(|| vec![(MAX_KEY.to_string(), lines.join("\n"))])
}

/// [`unified`] with its inputs read from the node: pod `pod_uid`'s grants under
/// `grants_dir` ([`read_grants`]) and `cgroup_root`'s `dmem.capacity`. The one call for a
/// caller that has the pod's UID from the engine and the container's device numbers: the
/// shim's create (src/limits.rs) and the NRI plugin (the sandbox's `uid`, the container's
/// `linux.devices`; the result goes into `LinuxResources.unified`). Also returns what was
/// not believed, for the caller's log.
pub fn unified_on_node(
    grants_dir: &Path,
    cgroup_root: &Path,
    pod_uid: &str,
    rdevs: &[String],
) -> (Option<Vec<(String, String)>>, Vec<String>) {
    let (records, said) = read_grants(grants_dir, pod_uid);
    if records.is_empty() {
        return (None, said);
    }
    let capacity = read_capacity(cgroup_root);
    (unified(&records, &capacity, pod_uid, rdevs), said)
}

/// `entries` as one log line: `key=value`, a multi-line value's lines joined by `, `.
pub fn shown(entries: &[(String, String)]) -> String {
    entries
        .iter()
        .map(|(k, v)| format!("{k}={}", v.replace('\n', ", ")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A Kubernetes UID as a directory name: hex digits and dashes (no `/`, no `..`).
pub fn valid_uid(uid: &str) -> bool {
    (1..=64).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The pod UID the engine gave the container, from its annotations: the first of
/// [`POD_UID_ANNOTATIONS`] present; `None` where it is absent or not a UID.
pub fn pod_uid(annotations: &[(String, String)]) -> Option<&str> {
    POD_UID_ANNOTATIONS
        .iter()
        .find_map(|key| {
            annotations
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        })
        .filter(|v| valid_uid(v))
}

/// The pods with grants in `dir` now (its subdirectories named as UIDs): one directory
/// listing, none where it is missing. The shim's screen: a create whose spec names none of
/// them reads nothing more.
pub fn pods_with_grants(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| valid_uid(n))
        .collect()
}

/// The grants recorded for pod `pod` under `dir`, each file judged as config.toml is (root's
/// alone to write: src/trust.rs) and read bounded. A file that is not trusted or does not
/// parse is skipped and said in the second list: it grants nothing.
pub fn read_grants(dir: &Path, pod: &str) -> (Vec<PodGrants>, Vec<String>) {
    let (mut out, mut said) = (Vec::new(), Vec::new());
    if !valid_uid(pod) {
        return (out, said);
    }
    let pod_dir = dir.join(pod);
    let Ok(entries) = std::fs::read_dir(&pod_dir) else {
        return (out, said);
    };
    let mut checked = crate::trust::Checked::default();
    for path in entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .take(MAX_ENTRIES)
    {
        let read = crate::trust::open_file(&path, &mut checked)
            .map_err(|e| match e {
                crate::trust::OpenError::Io(e) => e.to_string(),
                crate::trust::OpenError::Untrusted(why) => why,
            })
            .and_then(|(f, _)| crate::bounded::read(f, MAX_GRANT_FILE).map_err(|e| e.to_string()))
            .and_then(|b| serde_json::from_slice::<PodGrants>(&b).map_err(|e| e.to_string()));
        match read {
            Ok(g) => out.push(g),
            Err(why) => said.push(format!(
                "{}: not used, its share's memory is not limited: {why}",
                path.display()
            )),
        }
    }
    (out, said)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "6f0c8a52-1b7e-4d0a-9c3e-5a2f1d7b8e90";
    const OTHER: &str = "0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e2f";
    const CAPACITY: &str = "drm/0000:03:00.0/system 67108864000\ndrm/0000:03:00.0/vram0 17163091968\ndrm/0000:83:00.0/vram0 8589934592\ndrm/0000:83:00.0/vram1 8589934592\n";

    fn grant(bus: &str, rdev: &str, memory: u64) -> Grant {
        Grant {
            device: format!("gpu-{bus}-shared"),
            bus: bus.into(),
            rdevs: vec![rdev.into()],
            memory,
        }
    }

    fn record(pod: &str, grants: Vec<Grant>) -> PodGrants {
        PodGrants {
            pod: pod.into(),
            claim: "c1".into(),
            grants,
        }
    }

    fn nodes(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn capacity_lines_are_read_and_others_skipped() {
        let text = format!("{CAPACITY}garbage\ndrm/ 1\ndrm/x/ 5\nother/0000:01:00.0/vram0 9\n");
        let r: Vec<Region> = regions(&text).collect();
        assert_eq!(r.len(), 4);
        assert_eq!(
            r[1],
            Region {
                bus: "0000:03:00.0",
                name: "vram0",
                bytes: 17163091968
            }
        );
        assert!(enforceable(CAPACITY, "0000:03:00.0"));
        assert!(enforceable(CAPACITY, "0000:83:00.0"));
        assert!(!enforceable(CAPACITY, "0000:04:00.0"));
        // A device with only system memory registered has nothing of its own to cap.
        assert!(!enforceable(
            "drm/0000:05:00.0/system 100\n",
            "0000:05:00.0"
        ));
    }

    #[test]
    fn no_region_registered_is_no_limit() {
        let r = [record(POD, vec![grant("0000:04:00.0", "226:0", 8 << 30)])];
        assert_eq!(unified(&r, CAPACITY, POD, &nodes(&["226:0"])), None);
        assert_eq!(unified(&r, "", POD, &nodes(&["226:0"])), None);
    }

    #[test]
    fn a_registered_region_gets_the_exact_line() {
        let r = [record(POD, vec![grant("0000:03:00.0", "226:0", 4 << 30)])];
        assert_eq!(
            unified(&r, CAPACITY, POD, &nodes(&["10:200", "226:0"])),
            Some(vec![(
                "dmem.max".to_string(),
                "drm/0000:03:00.0/vram0 4294967296".to_string()
            )])
        );
        // More than the region (a grant of the profile's stated memory): the region.
        let r = [record(POD, vec![grant("0000:03:00.0", "226:0", 32 << 30)])];
        assert_eq!(
            unified(&r, CAPACITY, POD, &nodes(&["226:0"])).unwrap()[0].1,
            "drm/0000:03:00.0/vram0 17163091968"
        );
    }

    #[test]
    fn two_shares_of_two_devices_get_a_line_each_and_tiles_split_the_grant() {
        let r = [
            record(POD, vec![grant("0000:03:00.0", "226:0", 4 << 30)]),
            PodGrants {
                claim: "c2".into(),
                ..record(POD, vec![grant("0000:83:00.0", "226:1", 6 << 30)])
            },
        ];
        let got = unified(&r, CAPACITY, POD, &nodes(&["226:0", "226:1"])).unwrap();
        assert_eq!(
            got[0].1,
            "drm/0000:03:00.0/vram0 4294967296\ndrm/0000:83:00.0/vram0 3221225472\ndrm/0000:83:00.0/vram1 3221225472"
        );
        // Two shares of one device add up.
        let r = [
            record(POD, vec![grant("0000:03:00.0", "226:0", 1 << 30)]),
            record(POD, vec![grant("0000:03:00.0", "226:0", 2 << 30)]),
        ];
        assert_eq!(
            unified(&r, CAPACITY, POD, &nodes(&["226:0"])).unwrap()[0].1,
            "drm/0000:03:00.0/vram0 3221225472"
        );
    }

    #[test]
    fn another_pods_record_and_a_device_not_held_are_ignored() {
        let r = [record(OTHER, vec![grant("0000:03:00.0", "226:0", 4 << 30)])];
        assert_eq!(unified(&r, CAPACITY, POD, &nodes(&["226:0"])), None);
        let r = [record(POD, vec![grant("0000:03:00.0", "226:0", 4 << 30)])];
        assert_eq!(unified(&r, CAPACITY, POD, &nodes(&["226:1"])), None);
    }

    /// The container's variables are not an input at all: a spec whose environment claims a
    /// bigger share (the vendor's variable, a made-up `dmem` one) gets what the record says,
    /// and a pod UID written as a variable is not the engine's annotation.
    #[test]
    fn a_forged_variable_is_ignored() {
        let annotations = vec![
            ("io.kubernetes.cri.sandbox-uid".to_string(), POD.to_string()),
            (
                "ENFLAME_CONTAINER_USABLE_GLOBAL_MEM".to_string(),
                "32".to_string(),
            ),
        ];
        assert_eq!(pod_uid(&annotations), Some(POD));
        let env_only = vec![("IO_KUBERNETES_POD_UID".to_string(), OTHER.to_string())];
        assert_eq!(pod_uid(&env_only), None);
        let r = [record(POD, vec![grant("0000:03:00.0", "226:0", 4 << 30)])];
        assert_eq!(
            unified(&r, CAPACITY, POD, &nodes(&["226:0"])).unwrap()[0].1,
            "drm/0000:03:00.0/vram0 4294967296"
        );
        // CRI-O's key, and a UID that could leave the directory, refused.
        let crio = vec![("io.kubernetes.pod.uid".to_string(), OTHER.to_string())];
        assert_eq!(pod_uid(&crio), Some(OTHER));
        let bad = vec![("io.kubernetes.pod.uid".to_string(), "../x".to_string())];
        assert_eq!(pod_uid(&bad), None);
    }

    #[test]
    fn grants_are_read_only_from_trusted_files_of_the_pod() {
        let dir = tempfile::tempdir().unwrap();
        assert!(pods_with_grants(&dir.path().join("none")).is_empty());
        let pod = dir.path().join(POD);
        std::fs::create_dir(&pod).unwrap();
        let rec = record(POD, vec![grant("0000:03:00.0", "226:0", 4 << 30)]);
        std::fs::write(pod.join("c1.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
        std::fs::write(pod.join("bad.json"), b"{").unwrap();
        std::fs::create_dir(dir.path().join("not-a-uid.x")).unwrap();
        assert_eq!(pods_with_grants(dir.path()), [POD]);
        let (got, said) = read_grants(dir.path(), POD);
        if nix::unistd::geteuid().is_root() {
            assert_eq!(got, [rec]);
            assert_eq!(said.len(), 1, "{said:?}");
            assert!(said[0].contains("bad.json"), "{said:?}");
        } else {
            // Not root's: nothing is believed.
            assert!(got.is_empty());
            assert_eq!(said.len(), 2, "{said:?}");
        }
        assert_eq!(read_grants(dir.path(), "../etc").0, []);
    }
}
