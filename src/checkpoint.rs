//! kubelet's device-manager checkpoint: reading it, comparing the device IDs it holds with
//! the devices this node has, and moving a stale one aside.
//!
//! After a crash or a board swap a GPU node can come back with different device IDs (NVIDIA
//! UUIDs change with the board); kubelet reads the old IDs from
//! `/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint` at start and pods fail with
//! "device ... not healthy / unknown". Deleting the file before kubelet starts is the
//! documented recovery: kubelet rebuilds it from the plugins' registrations.
//!
//! The file is only ever read or renamed, never rewritten. Its `Checksum` is not verified:
//! kubelet computes it as FNV-32a over a Go-specific `%#v`-style dump of its in-memory
//! structs (k8s.io/kubernetes/pkg/util/hash.DeepHashObject), which cannot be reproduced from
//! the JSON without re-implementing Go's printer; a file that is valid JSON of the right shape
//! is enough to compare IDs, and kubelet itself rejects a corrupted one.
//!
//! Ref: k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go (both
//! `DeviceIDs` forms: a list before 1.20, a map of NUMA node to list since).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::discovery::DiscoveryError;
use crate::profile::Profile;
use crate::topology::{discover_located, Located};

pub const DEFAULT_PATH: &str = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read checkpoint {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {} is not a kubelet device checkpoint (left untouched): {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error("--resource {0}: no profile has this resource-name (and a device-plugin-id), so its device IDs are unknown")]
    UnknownResource(String),
    #[error("cannot move checkpoint {} to {}: {source}", path.display(), backup.display())]
    Backup {
        path: PathBuf,
        backup: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Checkpoint {
    pub data: Data,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Data {
    /// Go writes `null` for an empty slice or map.
    #[serde(default)]
    pub pod_device_entries: Option<Vec<PodDeviceEntry>>,
    #[serde(default)]
    pub registered_devices: Option<BTreeMap<String, Option<Vec<String>>>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PodDeviceEntry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    #[serde(rename = "DeviceIDs", default)]
    pub device_ids: Option<DeviceIds>,
    /// The plugin's `ContainerAllocateResponse`, protobuf bytes in base64 (Go `[]byte`).
    #[serde(rename = "AllocResp", default)]
    pub alloc_resp: Option<String>,
}

impl PodDeviceEntry {
    /// Whether the plugin handed this container its devices as device specs (or CDI
    /// devices), which put them in the OCI spec; `None` when the response is absent or
    /// unreadable. Plugins that only set a variable (NVIDIA's without `--pass-device-specs`)
    /// answer `Some(false)`.
    pub fn passes_device_specs(&self) -> Option<bool> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.alloc_resp.as_deref().filter(|r| !r.is_empty())?)
            .ok()?;
        let fields = top_level_fields(&bytes)?;
        // ContainerAllocateResponse: 1 envs, 2 mounts, 3 devices, 4 annotations, 5 cdi_devices.
        Some(fields.iter().any(|f| *f == 3 || *f == 5))
    }
}

fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Field numbers of a protobuf message's top-level fields, in order; `None` if malformed.
/// Enough of the wire format to tell which fields a message has, without its schema.
fn top_level_fields(b: &[u8]) -> Option<Vec<u64>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < b.len() {
        let key = varint(b, &mut pos)?;
        match key & 7 {
            0 => {
                varint(b, &mut pos)?;
            }
            1 => pos = pos.checked_add(8)?,
            2 => {
                let len = usize::try_from(varint(b, &mut pos)?).ok()?;
                pos = pos.checked_add(len)?;
            }
            5 => pos = pos.checked_add(4)?,
            _ => return None,
        }
        if pos > b.len() {
            return None;
        }
        out.push(key >> 3);
    }
    Some(out)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DeviceIds {
    List(Vec<String>),
    /// NUMA node (as a string key) to IDs.
    ByNuma(BTreeMap<String, Option<Vec<String>>>),
}

impl DeviceIds {
    pub fn ids(&self) -> Vec<String> {
        match self {
            DeviceIds::List(v) => v.clone(),
            DeviceIds::ByNuma(m) => m.values().flatten().flatten().cloned().collect(),
        }
    }
}

impl Checkpoint {
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointError> {
        serde_json::from_slice(bytes).map_err(|source| CheckpointError::Parse {
            path: path.into(),
            source,
        })
    }

    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&bytes, path)
    }

    pub fn registered(&self, resource: &str) -> Vec<String> {
        self.data
            .registered_devices
            .as_ref()
            .and_then(|m| m.get(resource))
            .cloned()
            .flatten()
            .unwrap_or_default()
    }

    pub fn allocations(&self, resource: &str) -> Vec<Allocation> {
        self.data
            .pod_device_entries
            .iter()
            .flatten()
            .filter(|e| e.resource_name == resource)
            .map(|e| Allocation {
                pod_uid: e.pod_uid.clone(),
                container: e.container_name.clone(),
                ids: e
                    .device_ids
                    .as_ref()
                    .map(DeviceIds::ids)
                    .unwrap_or_default(),
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allocation {
    pub pod_uid: String,
    pub container: String,
    pub ids: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every registered and allocated ID is a device of this node.
    Consistent,
    /// Some ID names a device this node does not have.
    Stale,
    /// The checkpoint names devices but discovery found none: the driver may not be loaded
    /// yet, so nothing can be concluded and nothing is changed.
    NoDevicesFound,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceReport {
    pub resource: String,
    pub found: BTreeSet<String>,
    pub registered: Vec<String>,
    pub allocated: Vec<Allocation>,
    pub unknown_registered: Vec<String>,
    pub unknown_allocated: Vec<String>,
    pub verdict: Verdict,
}

/// The device an ID refers to: NVIDIA's plugin registers time-sliced replicas as
/// `<uuid>::<n>`, which are the same physical device.
fn base_id(id: &str) -> &str {
    id.split_once("::").map_or(id, |(b, _)| b)
}

/// Compares the checkpoint with `found` (resource name → IDs the node's devices carry). Only
/// the resources in `found` are looked at: others belong to plugins this tool knows nothing of.
pub fn compare(cp: &Checkpoint, found: &BTreeMap<String, BTreeSet<String>>) -> Vec<ResourceReport> {
    found
        .iter()
        .map(|(resource, ids)| {
            let registered = cp.registered(resource);
            let allocated = cp.allocations(resource);
            let unknown = |list: &mut dyn Iterator<Item = &String>| -> Vec<String> {
                let set: BTreeSet<String> = list
                    .filter(|id| !ids.contains(base_id(id)))
                    .cloned()
                    .collect();
                set.into_iter().collect()
            };
            let unknown_registered = unknown(&mut registered.iter());
            let unknown_allocated = unknown(&mut allocated.iter().flat_map(|a| a.ids.iter()));
            let verdict = if unknown_registered.is_empty() && unknown_allocated.is_empty() {
                Verdict::Consistent
            } else if ids.is_empty() {
                Verdict::NoDevicesFound
            } else {
                Verdict::Stale
            };
            ResourceReport {
                resource: resource.clone(),
                found: ids.clone(),
                registered,
                allocated,
                unknown_registered,
                unknown_allocated,
                verdict,
            }
        })
        .collect()
}

/// The IDs the profile's device plugin registers for these devices (`device-plugin-id`);
/// `None` when the profile does not say how its plugin names devices.
pub fn node_ids(profile: &Profile, devices: &[Located]) -> Option<BTreeSet<String>> {
    let template = profile.device_plugin_id.as_deref()?;
    Some(
        devices
            .iter()
            .filter_map(|d| d.device.plugin_id(template))
            .collect(),
    )
}

/// What the node's device plugins would register: for each profile with a `resource-name`
/// and a `device-plugin-id` (limited to `only` when it is not empty), the profile's name and
/// the IDs of the devices discovery finds.
pub fn expected_ids(
    profiles: &[Profile],
    only: &[String],
) -> Result<BTreeMap<String, (String, BTreeSet<String>)>, CheckpointError> {
    let mut out = BTreeMap::new();
    for p in profiles {
        let Some(resource) = p.resource_name.as_deref() else {
            continue;
        };
        if !only.is_empty() && !only.iter().any(|r| r == resource) {
            continue;
        }
        let devices = discover_located(p)?;
        if let Some(ids) = node_ids(p, &devices) {
            out.insert(resource.to_string(), (p.name.clone(), ids));
        }
    }
    if let Some(missing) = only.iter().find(|r| !out.contains_key(r.as_str())) {
        return Err(CheckpointError::UnknownResource(missing.clone()));
    }
    Ok(out)
}

/// The backup name for a checkpoint moved aside at `now`: `<name>.bak-YYYYMMDDTHHMMSSZ`.
pub fn backup_path(path: &Path, now: SystemTime) -> PathBuf {
    let stamp: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".bak-{stamp}"));
    path.with_file_name(name)
}

/// Moves the checkpoint to a timestamped backup beside it: one rename, so the original is
/// gone and the backup holds its exact bytes, or nothing changed. Never overwrites a backup.
pub fn move_aside(path: &Path, now: SystemTime) -> Result<PathBuf, CheckpointError> {
    let first = backup_path(path, now);
    let mut backup = first.clone();
    let mut n = 1;
    while backup.symlink_metadata().is_ok() {
        let mut name = first.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{n}"));
        backup = first.with_file_name(name);
        n += 1;
    }
    std::fs::rename(path, &backup).map_err(|source| CheckpointError::Backup {
        path: path.into(),
        backup: backup.clone(),
        source,
    })?;
    Ok(backup)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST_FORM: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p1","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":["GPU-a","GPU-b"],"AllocResp":"CgA="}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-a","GPU-b"],"rdma/hca":["x"]}},"Checksum":123}"#;
    const NUMA_FORM: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p1","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-a"],"1":["GPU-old"]},"AllocResp":"CgA="},{"PodUID":"p2","ContainerName":"d","ResourceName":"enflame.com/gcu","DeviceIDs":null,"AllocResp":""}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-a::0","GPU-a::1"],"enflame.com/gcu":null}},"Checksum":4294967295}"#;

    fn found(pairs: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        pairs
            .iter()
            .map(|(r, ids)| (r.to_string(), ids.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn list_form_consistent() {
        let cp = Checkpoint::parse(LIST_FORM.as_bytes(), Path::new("x")).unwrap();
        let r = compare(
            &cp,
            &found(&[("nvidia.com/gpu", &["GPU-a", "GPU-b", "GPU-c"])]),
        );
        assert_eq!(r.len(), 1, "rdma/hca belongs to another plugin");
        assert_eq!(r[0].verdict, Verdict::Consistent);
        assert_eq!(r[0].allocated[0].ids, ["GPU-a", "GPU-b"]);
    }

    #[test]
    fn numa_form_and_replicas() {
        let cp = Checkpoint::parse(NUMA_FORM.as_bytes(), Path::new("x")).unwrap();
        let r = compare(
            &cp,
            &found(&[
                ("nvidia.com/gpu", &["GPU-a"]),
                ("enflame.com/gcu", &["GCU-0"]),
            ]),
        );
        let gcu = r.iter().find(|r| r.resource == "enflame.com/gcu").unwrap();
        assert_eq!(gcu.verdict, Verdict::Consistent);
        let gpu = r.iter().find(|r| r.resource == "nvidia.com/gpu").unwrap();
        assert_eq!(gpu.verdict, Verdict::Stale);
        assert!(
            gpu.unknown_registered.is_empty(),
            "replicas of GPU-a are GPU-a"
        );
        assert_eq!(gpu.unknown_allocated, ["GPU-old"]);
    }

    #[test]
    fn alloc_resp_device_specs() {
        let entry = |resp: Option<&str>| PodDeviceEntry {
            pod_uid: "p".into(),
            container_name: "c".into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: None,
            alloc_resp: resp.map(String::from),
        };
        // envs {NVIDIA_VISIBLE_DEVICES: GPU-...0001}, then the same plus one DeviceSpec.
        let env = "CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS04ZTViMWYzYS0wMDAwLTQwMDAtODAwMC0wMDAwMDAwMDAwMDE=";
        let dev = "CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS04ZTViMWYzYS0wMDAwLTQwMDAtODAwMC0wMDAwMDAwMDAwMDEaIAoML2Rldi9udmlkaWEwEgwvZGV2L252aWRpYTAaAnJ3";
        assert_eq!(entry(Some(env)).passes_device_specs(), Some(false));
        assert_eq!(entry(Some(dev)).passes_device_specs(), Some(true));
        assert_eq!(entry(Some("")).passes_device_specs(), None);
        assert_eq!(entry(None).passes_device_specs(), None);
        assert_eq!(entry(Some("not base64!")).passes_device_specs(), None);
        // A length running past the end.
        assert_eq!(entry(Some("GkwKLg==")).passes_device_specs(), None);
    }

    #[test]
    fn nothing_found_is_not_stale() {
        let cp = Checkpoint::parse(LIST_FORM.as_bytes(), Path::new("x")).unwrap();
        let r = compare(&cp, &found(&[("nvidia.com/gpu", &[])]));
        assert_eq!(r[0].verdict, Verdict::NoDevicesFound);
    }

    #[test]
    fn malformed_names_file() {
        for bad in [
            "{",
            "{}",
            r#"{"Data":{"PodDeviceEntries":[{"PodUID":1}]}}"#,
            "[]",
        ] {
            let err = Checkpoint::parse(bad.as_bytes(), Path::new("/k/cp"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("/k/cp") && err.contains("untouched"), "{err}");
        }
    }

    #[test]
    fn move_aside_keeps_bytes_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let cp = dir.path().join("kubelet_internal_checkpoint");
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        assert_eq!(
            backup_path(&cp, now).file_name().unwrap(),
            "kubelet_internal_checkpoint.bak-20261118T110640Z"
        );
        std::fs::write(&cp, "one").unwrap();
        let b1 = move_aside(&cp, now).unwrap();
        std::fs::write(&cp, "two").unwrap();
        let b2 = move_aside(&cp, now).unwrap();
        assert_ne!(b1, b2);
        assert!(!cp.exists());
        assert_eq!(std::fs::read_to_string(b1).unwrap(), "one");
        assert_eq!(std::fs::read_to_string(b2).unwrap(), "two");
    }
}
