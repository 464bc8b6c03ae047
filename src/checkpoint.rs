//! kubelet's device-manager checkpoint: reading it, comparing the device IDs it holds with
//! the devices this node has, verifying and recomputing kubelet's own checksum, and repairing
//! a stale one the way kubelet will accept.
//!
//! After a crash or a board swap a GPU node can come back with different device IDs (NVIDIA
//! UUIDs change with the board); kubelet reads the old IDs from
//! `/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint` at start and refuses the pods
//! that held them ("previously allocated devices are no longer healthy"). Deleting the file is
//! not a safe repair: if kubelet then starts before the device plugin registers, it no longer
//! knows the resource is a device-plugin resource and admits a pod asking for it with no device
//! at all. [`repair`] therefore drops only the entries that name devices this node does not have,
//! keeps every `RegisteredDevices` key (kubelet learns its device-plugin resources from those
//! keys at restore), and writes the checksum kubelet computes: FNV-32a over the text
//! `spew.Sprintf("%#v", data)` gives for the `Data` struct ([`kubelet_checksum`]).
//!
//! Ref: k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go (both
//! `DeviceIDs` forms: a list before 1.20, a map of NUMA node to list since),
//! pkg/kubelet/checkpointmanager/checksum/checksum.go, pkg/util/hash/hash.go (DeepHashObject:
//! spew with SortKeys, DisableMethods, SpewKeys).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::discovery::DiscoveryError;
use crate::profile::Profile;
use crate::topology::{discover_located, Located};

/// Where systemd looks for a `kubelet.service` unit (admin, runtime, vendor dirs).
const KUBELET_UNITS: [&str; 5] = [
    "/etc/systemd/system/kubelet.service",
    "/run/systemd/system/kubelet.service",
    "/usr/local/lib/systemd/system/kubelet.service",
    "/usr/lib/systemd/system/kubelet.service",
    "/lib/systemd/system/kubelet.service",
];

/// Whether kubelet is a systemd unit on the node under `root` (systemd running, a
/// `kubelet.service` installed): only then can `systemctl restart kubelet` restart it.
/// Kubelets run by another supervisor (a container, a snap, a hand-written script) are not.
pub fn kubelet_is_systemd_unit(root: &Path) -> bool {
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    at("/run/systemd/system").is_dir() && KUBELET_UNITS.iter().any(|u| at(u).exists())
}

/// The repair command to advise on the node under `root`, with `--restart-kubelet` only
/// where it can work, and what to do otherwise.
pub fn repair_advice(root: &Path, checkpoint: Option<&Path>) -> String {
    let mut cmd = String::from("accel-ctk checkpoint check --fix");
    let systemd = kubelet_is_systemd_unit(root);
    if systemd {
        cmd.push_str(" --restart-kubelet");
    }
    if let Some(p) = checkpoint {
        cmd.push_str(&format!(" --checkpoint {}", p.display()));
    }
    if !systemd {
        cmd.push_str(", then restart kubelet the way this node runs it (no kubelet.service unit)");
    }
    cmd
}

pub const DEFAULT_PATH: &str = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";

/// Far above any node's checkpoint (a few hundred bytes per allocated container); a bigger
/// file, or one that never ends, is refused with its path, never read whole (issue 14,
/// class 5).
pub const MAX_SIZE: u64 = 64 << 20;

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
    #[error("checkpoint {} uses the pre-1.20 list form of DeviceIDs, whose checksum is not reproduced; it can only be moved aside", path.display())]
    LegacyForm { path: PathBuf },
    #[error("checkpoint {} changed while being repaired; nothing written, run again", path.display())]
    Changed { path: PathBuf },
    #[error("cannot write repaired checkpoint {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
    /// kubelet's checksum of `data` ([`kubelet_checksum`]); a Go `uint64`.
    #[serde(default)]
    pub checksum: Option<u64>,
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
        let bytes =
            crate::bounded::read_file(path, MAX_SIZE).map_err(|source| CheckpointError::Read {
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

/// Whether kubelet may hold `id` for a resource whose plugin lists `ids`: listed as it is,
/// or a replica of a device listed whole (another plugin's time-slicing, NVIDIA's
/// `<uuid>::<n>`, of a device this node has).
fn is_listed(ids: &BTreeSet<String>, id: &str) -> bool {
    ids.contains(id)
        || id
            .split_once("::")
            .is_some_and(|(base, _)| ids.contains(base))
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
                let set: BTreeSet<String> =
                    list.filter(|id| !is_listed(ids, id)).cloned().collect();
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

/// The IDs the profile's device plugin lists for these devices (`device-plugin-id`): a
/// shared device's replicas `<id>::0` .. `<id>::<replicas - 1>`, so a replica beyond those
/// (replicas lowered since kubelet wrote the file) is stale like a device that is gone.
/// `None` when the profile does not say how its plugin names devices.
pub fn node_ids(profile: &Profile, devices: &[Located]) -> Option<BTreeSet<String>> {
    let template = profile.device_plugin_id.as_deref()?;
    let mut ids = BTreeSet::new();
    for d in devices {
        let Some(id) = d.device.plugin_id(template) else {
            continue;
        };
        if profile.shares(d.device.index) {
            ids.extend((0..profile.replicas).map(|k| crate::profile::replica_id(&id, k)));
        } else {
            ids.insert(id);
        }
    }
    Some(ids)
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
        // With `shared-resource-name`, the shared devices are registered under it (as
        // replicas, `<id>::<k>`, which `compare` reads as their device) and the others under
        // `resource-name`.
        let mut resources = vec![(resource, false)];
        resources.extend(p.shared_resource_name.as_deref().map(|s| (s, true)));
        let wanted: Vec<(&str, bool)> = resources
            .into_iter()
            .filter(|(r, _)| only.is_empty() || only.iter().any(|o| o == r))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let devices = discover_located(p)?;
        for (resource, shared) in wanted {
            let split = p.shared_resource_name.is_some();
            let held: Vec<Located> = devices
                .iter()
                .filter(|d| !split || p.shares(d.device.index) == shared)
                .cloned()
                .collect();
            if let Some(ids) = node_ids(p, &held) {
                out.insert(resource.to_string(), (p.name.clone(), ids));
            }
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

/// The timestamped backup name beside `path`, with `.N` added until nothing has that name:
/// a backup is never overwritten.
fn unused_backup_path(path: &Path, now: SystemTime) -> PathBuf {
    let first = backup_path(path, now);
    let mut backup = first.clone();
    let mut n = 1;
    while backup.symlink_metadata().is_ok() {
        let mut name = first.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{n}"));
        backup = first.with_file_name(name);
        n += 1;
    }
    backup
}

/// Moves the checkpoint to a timestamped backup beside it: one rename, so the original is
/// gone and the backup holds its exact bytes, or nothing changed. Never overwrites a backup.
pub fn move_aside(path: &Path, now: SystemTime) -> Result<PathBuf, CheckpointError> {
    let backup = unused_backup_path(path, now);
    std::fs::rename(path, &backup).map_err(|source| CheckpointError::Backup {
        path: path.into(),
        backup: backup.clone(),
        source,
    })?;
    Ok(backup)
}

/// kubelet's checksum of a checkpoint's `Data`: FNV-32a over what Go's
/// `spew.ConfigState{Indent: " ", SortKeys: true, DisableMethods: true, SpewKeys: true}`
/// prints for `%#v` of the `checkpointData` struct (kubelet's `hashutil.DeepHashObject`).
/// `None` for the pre-1.20 list form of `DeviceIDs`, a different struct.
///
/// The `%#v` text is types in parentheses before every value that is not a slice element, a
/// map key or a map value; strings raw, `[]byte` as decimal bytes, `nil` slices and maps as
/// `<nil>`, maps with sorted keys as `map[k:v k:v]`, struct fields as `Name:value`, one space
/// between items. kubelet verifies the checksum against the data it decoded from the JSON,
/// so the same is done here from the parsed file.
pub fn kubelet_checksum(data: &Data) -> Option<u32> {
    let mut out = Vec::with_capacity(512);
    spew_data(data, &mut out)?;
    Some(fnv32a(&out))
}

fn fnv32a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

fn spew_list(out: &mut Vec<u8>, items: Option<&[String]>) {
    let Some(items) = items else {
        out.extend_from_slice(b"<nil>");
        return;
    };
    out.push(b'[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(s.as_bytes());
    }
    out.push(b']');
}

fn spew_data(data: &Data, out: &mut Vec<u8>) -> Option<()> {
    use base64::Engine as _;
    use std::io::Write as _;
    out.extend_from_slice(
        b"(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)",
    );
    match &data.pod_device_entries {
        None => out.extend_from_slice(b"<nil>"),
        Some(entries) => {
            out.push(b'[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                // A slice element's own type is not printed; its fields' types are.
                let _ = write!(
                    out,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)",
                    e.pod_uid, e.container_name, e.resource_name
                );
                match &e.device_ids {
                    None => out.extend_from_slice(b"<nil>"),
                    Some(DeviceIds::List(_)) => return None,
                    Some(DeviceIds::ByNuma(m)) => {
                        // Go decodes the keys into int64 and spew sorts them as numbers.
                        let mut numa: Vec<(i64, Option<&[String]>)> = m
                            .iter()
                            .map(|(k, v)| Some((k.parse().ok()?, v.as_deref())))
                            .collect::<Option<_>>()?;
                        numa.sort_by_key(|(k, _)| *k);
                        out.extend_from_slice(b"map[");
                        for (j, (k, v)) in numa.into_iter().enumerate() {
                            if j > 0 {
                                out.push(b' ');
                            }
                            let _ = write!(out, "{k}:");
                            spew_list(out, v);
                        }
                        out.push(b']');
                    }
                }
                out.extend_from_slice(b" AllocResp:([]uint8)");
                match &e.alloc_resp {
                    None => out.extend_from_slice(b"<nil>"),
                    Some(b64) => {
                        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
                        out.push(b'[');
                        for (j, b) in bytes.iter().enumerate() {
                            if j > 0 {
                                out.push(b' ');
                            }
                            let _ = write!(out, "{b}");
                        }
                        out.push(b']');
                    }
                }
                out.push(b'}');
            }
            out.push(b']');
        }
    }
    out.extend_from_slice(b" RegisteredDevices:(map[string][]string)");
    match &data.registered_devices {
        None => out.extend_from_slice(b"<nil>"),
        Some(m) => {
            // BTreeMap orders by bytes, as Go's sort of string keys does.
            out.extend_from_slice(b"map[");
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend_from_slice(k.as_bytes());
                out.push(b':');
                spew_list(out, v.as_deref());
            }
            out.push(b']');
        }
    }
    out.push(b'}');
    Some(())
}

/// What [`repair`] removed, and the file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repaired {
    /// Pod entries dropped because they hold a device this node does not have.
    pub removed: Vec<Allocation>,
    /// `(resource, id)` registered IDs dropped for the same reason (the keys stay).
    pub unregistered: Vec<(String, String)>,
    pub checksum: u32,
    /// The repaired checkpoint, JSON as kubelet writes it (other keys kept in place).
    pub bytes: Vec<u8>,
}

/// Removes from a checkpoint exactly the stale parts, for the resources in `found` (resource
/// → IDs this node has): pod entries naming an unknown device and unknown registered IDs.
/// Every `RegisteredDevices` key stays, so kubelet keeps treating the resource as a
/// device-plugin resource until the plugin registers. The checksum is recomputed.
pub fn repair(
    raw: &[u8],
    path: &Path,
    found: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Repaired, CheckpointError> {
    let parse_err = |source| CheckpointError::Parse {
        path: path.into(),
        source,
    };
    let mut doc: serde_json::Value = serde_json::from_slice(raw).map_err(parse_err)?;
    let cp: Checkpoint = serde_json::from_value(doc.clone()).map_err(parse_err)?;
    let legacy = || CheckpointError::LegacyForm { path: path.into() };
    if kubelet_checksum(&cp.data).is_none() {
        return Err(legacy());
    }
    let known = |resource: &str, id: &str| found.get(resource).is_none_or(|ids| is_listed(ids, id));
    let mut removed = Vec::new();
    let mut unregistered = Vec::new();
    let data = doc.get_mut("Data").ok_or_else(legacy)?;
    if let Some(entries) = data
        .get_mut("PodDeviceEntries")
        .and_then(|e| e.as_array_mut())
    {
        let parsed = cp.data.pod_device_entries.clone().unwrap_or_default();
        let mut keep = parsed.iter().map(|e| {
            let ids = e
                .device_ids
                .as_ref()
                .map(DeviceIds::ids)
                .unwrap_or_default();
            let stale = ids.iter().any(|id| !known(&e.resource_name, id));
            if stale {
                removed.push(Allocation {
                    pod_uid: e.pod_uid.clone(),
                    container: e.container_name.clone(),
                    ids,
                });
            }
            !stale
        });
        let flags: Vec<bool> = keep.by_ref().collect();
        let mut i = 0;
        entries.retain(|_| {
            i += 1;
            flags[i - 1]
        });
    }
    if let Some(reg) = data
        .get_mut("RegisteredDevices")
        .and_then(|r| r.as_object_mut())
    {
        for (resource, ids) in reg.iter_mut() {
            if let Some(list) = ids.as_array_mut() {
                list.retain(|id| {
                    let id = id.as_str().unwrap_or_default();
                    let ok = known(resource, id);
                    if !ok {
                        unregistered.push((resource.clone(), id.to_string()));
                    }
                    ok
                });
            }
        }
    }
    let new: Checkpoint = serde_json::from_value(doc.clone()).map_err(parse_err)?;
    let checksum = kubelet_checksum(&new.data).ok_or_else(legacy)?;
    doc["Checksum"] = serde_json::Value::from(checksum);
    let bytes = serde_json::to_vec(&doc).map_err(parse_err)?;
    Ok(Repaired {
        removed,
        unregistered,
        checksum,
        bytes,
    })
}

/// Writes a repaired checkpoint in place of `path`, after keeping the old bytes as a
/// timestamped backup (a hard link, so the backup is exactly the old file). The file is
/// replaced atomically: kubelet reads either the old or the repaired checkpoint. kubelet
/// writes the file whenever an allocation changes: when `path` no longer holds `original`
/// (the bytes `repaired` was made from) right before the rename, nothing is written and the
/// backup is removed, so kubelet's write is never lost (issue 23, class 5).
pub fn write_repaired(
    path: &Path,
    original: &[u8],
    repaired: &Repaired,
    now: SystemTime,
) -> Result<PathBuf, CheckpointError> {
    let backup = unused_backup_path(path, now);
    std::fs::hard_link(path, &backup).map_err(|source| CheckpointError::Backup {
        path: path.into(),
        backup: backup.clone(),
        source,
    })?;
    let unchanged =
        || Ok(crate::bounded::read_file(path, MAX_SIZE).is_ok_and(|now| now == original));
    let replaced =
        crate::atomic::replace_if(path, &repaired.bytes, 0o644, unchanged).map_err(|source| {
            CheckpointError::Write {
                path: path.into(),
                source,
            }
        })?;
    if !replaced {
        let _ = std::fs::remove_file(&backup);
        return Err(CheckpointError::Changed { path: path.into() });
    }
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

    fn fixture(name: &str) -> (Vec<u8>, Checkpoint) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubelet-checkpoints")
            .join(name);
        let raw = std::fs::read(&path).unwrap();
        let cp = Checkpoint::parse(&raw, &path).unwrap();
        (raw, cp)
    }

    const KUBELET_FILES: [&str; 6] = [
        "registered-only.json",
        "one-gpu-pod.json",
        "before-crash.json",
        "stale-after-uuid-change.json",
        "after-repair-and-restart.json",
        "no-registered-devices.json",
    ];

    #[test]
    fn checksum_of_every_kubelet_written_file() {
        for name in KUBELET_FILES {
            let (_, cp) = fixture(name);
            let want = cp.checksum.expect("kubelet always writes Checksum");
            assert_eq!(
                kubelet_checksum(&cp.data).map(u64::from),
                Some(want),
                "{name}"
            );
        }
    }

    #[test]
    fn checksum_changes_with_any_field() {
        let (_, cp) = fixture("one-gpu-pod.json");
        let base = kubelet_checksum(&cp.data).unwrap();
        let mut d = cp.data.clone();
        d.pod_device_entries.as_mut().unwrap()[0].container_name = "mai".into();
        assert_ne!(kubelet_checksum(&d), Some(base));
        let mut d = cp.data.clone();
        d.registered_devices = None;
        assert_ne!(kubelet_checksum(&d), Some(base));
        assert_eq!(fnv32a(b""), 0x811c_9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c_292c);
    }

    #[test]
    fn repair_removes_exactly_the_stale_entry() {
        let (raw, cp) = fixture("stale-after-uuid-change.json");
        let node = cp.registered("nvidia.com/gpu");
        let found =
            BTreeMap::from([("nvidia.com/gpu".to_string(), node.iter().cloned().collect())]);
        let r = repair(&raw, Path::new("x"), &found).unwrap();
        assert_eq!(r.removed.len(), 1);
        assert_eq!(
            r.removed[0].ids,
            ["GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]
        );
        assert!(r.unregistered.is_empty());
        let new = Checkpoint::parse(&r.bytes, Path::new("x")).unwrap();
        assert_eq!(new.checksum, Some(u64::from(r.checksum)));
        assert_eq!(kubelet_checksum(&new.data), Some(r.checksum));
        assert_eq!(
            new.data.pod_device_entries.as_deref().map(<[_]>::len),
            Some(0)
        );
        assert_eq!(
            new.registered("nvidia.com/gpu"),
            node,
            "registered devices kept"
        );
        assert_eq!(compare(&new, &found)[0].verdict, Verdict::Consistent);
    }

    #[test]
    fn repair_keeps_every_registered_key() {
        // kubelet started before the plugin: nothing registered, a pod entry for a device
        // the node no longer has; and a resource of another plugin stays as it is.
        let (raw, _) = fixture("before-crash.json");
        let found = BTreeMap::from([(
            "nvidia.com/gpu".to_string(),
            BTreeSet::from(["GPU-new".to_string()]),
        )]);
        let r = repair(&raw, Path::new("x"), &found).unwrap();
        let new = Checkpoint::parse(&r.bytes, Path::new("x")).unwrap();
        let keys: Vec<_> = new.data.registered_devices.unwrap().into_keys().collect();
        assert_eq!(keys, ["nvidia.com/gpu"]);
        assert_eq!(r.removed.len(), 1);
        assert_eq!(r.unregistered.len(), 2);
        // Resources this tool does not know are never touched.
        let (raw, cp) = fixture("one-gpu-pod.json");
        let r = repair(&raw, Path::new("x"), &BTreeMap::new()).unwrap();
        assert!(r.removed.is_empty() && r.unregistered.is_empty());
        assert_eq!(u64::from(r.checksum), cp.checksum.unwrap());
    }

    #[test]
    fn repair_refuses_the_legacy_form() {
        let err = repair(LIST_FORM.as_bytes(), Path::new("/k/cp"), &BTreeMap::new()).unwrap_err();
        assert!(matches!(err, CheckpointError::LegacyForm { .. }), "{err}");
    }

    #[test]
    fn write_repaired_keeps_a_backup() {
        let dir = tempfile::tempdir().unwrap();
        let cp = dir.path().join("kubelet_internal_checkpoint");
        let (raw, c) = fixture("stale-after-uuid-change.json");
        std::fs::write(&cp, &raw).unwrap();
        let found = BTreeMap::from([(
            "nvidia.com/gpu".to_string(),
            c.registered("nvidia.com/gpu").into_iter().collect(),
        )]);
        let r = repair(&raw, &cp, &found).unwrap();
        let b = write_repaired(&cp, &raw, &r, SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), raw);
        assert_eq!(std::fs::read(&cp).unwrap(), r.bytes);
        // kubelet wrote the file after it was read: nothing written, no second backup.
        std::fs::write(&cp, b"kubelet's").unwrap();
        let e = write_repaired(&cp, &raw, &r, SystemTime::UNIX_EPOCH).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("changed while being repaired; nothing written, run again"),
            "{e}"
        );
        assert_eq!(std::fs::read(&cp).unwrap(), b"kubelet's");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
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
