//! What a claim's allocation gives it on this node, or why it gives nothing: the decision of
//! a prepare, apart from the lock, the records on disk and the CDI spec it is acted on with
//! ([`super::claims`]). Pure: a function of the claim's allocation results and configs, the
//! node's offers and what the host said of each device a moment ago, and every claim's
//! record, so each refusal is a row of a table in its tests.
//!
//! It decides, in this order, refusing at the first that fails: that each device is of this
//! node's pool and offered by it, that the allocation of each is one the offers allow (a share
//! of a shareable device, within its capacities), that the claim's configuration is this
//! driver's and only narrows what was granted, that the host has the device and finds it
//! healthy; then, against the records, that a claim prepared before still names the same
//! devices, and that no device is given beside what another claim holds of it (a whole device
//! beside nothing, a part beside parts it does not overlap, a share beside shares within each
//! capacity's total).
//!
//! A device is what it is, not the name it goes by: each record keeps, per device, what the
//! device was when prepared ([`Identity`]) and the boot it was prepared in, and two devices
//! are one by identity, not by name: within one boot the same PCI function or a node in
//! common; across a reboot, what survives one ([`Identity::across_boots`]).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, DeviceRequestAllocationResult,
};
use serde::{Deserialize, Serialize};

use crate::kubelet::sharing::Sharing;
use crate::profile::Profile;

use super::names;
use super::offers::{self, Grant, Kind, Offer};
use super::table::DraDevice;

/// The claim kubelet names: its namespace, name and UID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "claim {}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One prepared device, as kubelet is told of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    /// The claim's request names that got this device (`/subrequest` cut off).
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
    #[serde(default)]
    pub admin_access: bool,
    #[serde(default)]
    pub share_id: Option<String>,
    /// What the device was when prepared; `None` in records of older versions until
    /// [`super::claims::Claims`] reads it back from their CDI spec.
    #[serde(default)]
    pub identity: Option<Identity>,
    /// What of its physical device it holds; records of older versions held it whole.
    #[serde(default)]
    pub usage: Usage,
}

/// What a prepared device holds of its physical device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Usage {
    #[default]
    Whole,
    /// A share, with what it consumes of each capacity (the allocation's
    /// `consumedCapacity`).
    Shared { consumed: BTreeMap<String, u64> },
    /// A partition, with the slices of the device it holds.
    Partition { slices: Vec<u32> },
}

/// What a device is, to tell it from every other device of the node now and after a reboot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// `major:minor` of each of its nodes, as dev-root had them when it was prepared.
    pub rdevs: Vec<String>,
    /// The PCI function (`0000:c3:00.0`), where discovery knows it.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    /// The vendor's UUID, where discovery found it unique on the node.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Where the device sits in sysfs (`devices/pci0000:00/0000:00:01.0/0000:03:00.0`), as
    /// its first node's `/sys/dev/char` link says, where the kernel has one: the slot, which
    /// a reboot keeps, not the class device's name, which a probe hands out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sysfs: Option<String>,
}

impl Identity {
    /// Whether `self` and `other`, both of one boot, are one device: the same PCI function
    /// where both know theirs, else a node in common.
    pub fn same_now(&self, other: &Identity) -> bool {
        if let (Some(a), Some(b)) = (&self.pci_bus_id, &other.pci_bus_id) {
            return a.eq_ignore_ascii_case(b);
        }
        self.rdevs.iter().any(|r| other.rdevs.contains(r))
    }

    /// Whether `self`, of an earlier boot, and `other` are one device, by what survives a
    /// reboot: the PCI function, the vendor's UUID and the sysfs path, each where both know
    /// it, must all agree; where none is known to both, the nodes' numbers, only when every
    /// node's major is one the vendor fixes (`fixed_majors`: the profile's `device-majors`;
    /// a dynamic major and the minors under it are handed out again at each driver load).
    /// `None` when nothing that survives is known to both: the name is then all there is.
    pub fn across_boots(&self, other: &Identity, fixed_majors: &[u64]) -> Option<bool> {
        let both = |a: &Option<String>, b: &Option<String>| {
            a.as_deref()
                .zip(b.as_deref())
                .map(|(a, b)| a.eq_ignore_ascii_case(b))
        };
        let said: Vec<bool> = [
            both(&self.pci_bus_id, &other.pci_bus_id),
            both(&self.uuid, &other.uuid),
            both(&self.sysfs, &other.sysfs),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !said.is_empty() {
            return Some(said.iter().all(|s| *s));
        }
        let fixed = |i: &Identity| {
            !i.rdevs.is_empty()
                && i.rdevs.iter().all(|r| {
                    r.split_once(':')
                        .and_then(|(m, _)| m.parse::<u64>().ok())
                        .is_some_and(|m| fixed_majors.contains(&m))
                })
        };
        (fixed(self) && fixed(other)).then(|| {
            let mut a = self.rdevs.clone();
            let mut b = other.rdevs.clone();
            a.sort();
            b.sort();
            a == b
        })
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nodes {}", self.rdevs.join(","))?;
        if let Some(b) = &self.pci_bus_id {
            write!(f, ", PCI {b}")?;
        }
        if let Some(u) = &self.uuid {
            write!(f, ", UUID {u}")?;
        }
        if let Some(p) = &self.sysfs {
            write!(f, ", sysfs {p}")?;
        }
        Ok(())
    }
}

/// What is kept on disk per prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub claim: ClaimRef,
    pub devices: Vec<Prepared>,
    /// The boot it was prepared in (the kernel's `boot_id`); `None` in records of older
    /// versions.
    #[serde(default)]
    pub boot_id: Option<String>,
}

impl Record {
    pub fn same_boot(&self, boot_id: &str) -> bool {
        // An older record's boot is not known: taken as this one, so its nodes still count
        // against other claims (a false conflict refuses a prepare; a missed one would give
        // a device twice).
        self.boot_id.as_deref().is_none_or(|b| b == boot_id)
    }
}

/// A claim's per-device configuration (`opaque.parameters` for this driver, from its
/// DeviceClass then the claim, later entries winning): limits below what was granted, for
/// the vendor's stack to read (docs/sharing.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SharingConfig {
    api_version: String,
    kind: String,
    #[serde(default)]
    limits: Option<ConfigLimits>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigLimits {
    #[serde(default)]
    memory: Option<String>,
    #[serde(default)]
    cores: Option<u64>,
}

/// The `apiVersion` and `kind` of a claim's configuration for this driver.
pub const CONFIG_API_VERSION: &str = "accel-container-runtime/v1";
pub const CONFIG_KIND: &str = "SharingConfig";

/// Whether a device is fit to be given, as the node's health checks say; every device is
/// healthy to the decision until a check says otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Health {
    #[default]
    Healthy,
    /// Why it is not.
    Unhealthy(String),
}

/// What the host said of one device just before the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// What the device is now, or why it cannot be given now (a node missing, of another
    /// major: kubelet retries).
    pub identity: Result<Identity, String>,
    pub health: Health,
}

/// The claim's side of the decision: who it is and what its allocation gives.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'c> {
    pub claim: &'c ClaimRef,
    pub results: &'c [DeviceRequestAllocationResult],
    pub configs: &'c [DeviceAllocationConfiguration],
}

/// The node's side of the decision.
#[derive(Debug, Clone, Copy)]
pub struct Node<'n, 't> {
    /// This driver's name: results and configs of other drivers are not ours.
    pub driver: &'n str,
    /// This node's pool.
    pub pool: &'n str,
    pub profile: &'n Profile,
    /// Every device the node offers ([`offers::offers`]).
    pub offers: &'n [Offer<'t>],
    /// What the host said of each device the results name, by its name in the table.
    pub facts: &'n BTreeMap<String, Facts>,
    /// This boot's id.
    pub boot_id: &'n str,
}

/// What is on disk when the decision is made (read under the lock).
#[derive(Debug, Clone, Copy)]
pub struct OnDisk<'d> {
    /// Every claim's record by UID, this claim's too.
    pub records: &'d HashMap<String, Record>,
    /// Whether this claim's CDI spec is in place.
    pub spec_in_place: bool,
}

/// One device of the claim's CDI spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecDevice<'t> {
    /// Its name in the spec.
    pub name: String,
    /// The device of the table whose edits it gets.
    pub device: &'t DraDevice,
    /// The variables its containers get beside them (a share's or a part's limits).
    pub env: Vec<String>,
    /// A share's or a part's memory (bytes), after the claim's narrower limit: its
    /// `dmem.max` where the kernel enforces it (src/dmem.rs). `None` for a whole device.
    pub memory: Option<u64>,
    /// `major:minor` of the device's nodes, as prepared: how a container is known to hold it.
    pub rdevs: Vec<String>,
}

/// What to do for a claim that may be prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<'t> {
    /// What kubelet is told and the record keeps.
    pub devices: Vec<Prepared>,
    /// The claim's CDI spec (none when no device is this driver's).
    pub spec: Vec<SpecDevice<'t>>,
    /// Whether the record and the spec must be written: not when this claim's record says
    /// the same of this boot and its spec is in place.
    pub write: bool,
}

/// Why a claim is given nothing: the claim, and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub claim: ClaimRef,
    pub why: Why,
}

impl Refusal {
    /// Whether the claim's CDI spec must go: it names the nodes of what a device was, and
    /// would give them to any container started with the claim's CDI IDs (kubelet keeps
    /// them in its checkpoint).
    pub fn spec_is_stale(&self) -> bool {
        matches!(self.why, Why::NotTheSame { .. })
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.claim, self.why)
    }
}

/// The reasons a claim is refused, each said in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// A device of another node's pool.
    OtherPool {
        device: String,
        pool: String,
        ours: String,
    },
    /// A device this node does not offer.
    Unknown { device: String, driver: String },
    /// An allocation the offers do not allow: a share of a device not shareable, a shareable
    /// device without its share, a capacity it does not have or past its total.
    WrongAllocation { device: String, why: String },
    /// A configuration entry that is not this driver's or not valid.
    BadConfig { request: String, why: String },
    /// Limits that do not narrow what was granted.
    BadLimits {
        request: String,
        device: String,
        why: String,
    },
    /// The host does not have the device as offered now (kubelet retries).
    NotOnHost { device: String, why: String },
    /// The node's health checks find the device unhealthy (kubelet retries).
    Unhealthy { device: String, why: String },
    /// The claim was prepared before, and the name it was allocated now stands for another
    /// device.
    NotTheSame {
        device: String,
        was: Identity,
        now: Identity,
        same_boot: bool,
    },
    /// Another claim (or this claim's other device) holds the device whole, or the part this
    /// one would hold.
    Held {
        device: String,
        mine: Identity,
        holder: ClaimRef,
        /// The name the holder has it by, where not the same.
        holder_as: Option<String>,
        same_part: bool,
    },
    /// A share whose capacity, with the shares prepared beside it, is past the device's
    /// total.
    PastTotal {
        device: String,
        mine: Identity,
        capacity: String,
        want: String,
        held: String,
        shares: usize,
        total: String,
    },
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::OtherPool { device, pool, ours } => write!(
                f,
                "device {device} is from pool {pool:?}, this node's pool is {ours:?}"
            ),
            Why::Unknown { device, driver } => {
                write!(f, "device {device} is not one of this node's {driver} devices")
            }
            Why::WrongAllocation { device, why } => {
                write!(f, "device {device}: {why}; nothing prepared")
            }
            Why::BadConfig { request, why } => {
                write!(f, "request {request:?}: {why}; nothing prepared")
            }
            Why::BadLimits {
                request,
                device,
                why,
            } => write!(
                f,
                "request {request:?}: device {device}: {why}; nothing prepared"
            ),
            Why::NotOnHost { device, why } => write!(
                f,
                "device {device}: {why}; nothing prepared (kubelet retries)"
            ),
            Why::Unhealthy { device, why } => write!(
                f,
                "device {device} is unhealthy: {why}; nothing prepared (kubelet retries)"
            ),
            Why::NotTheSame {
                device,
                was,
                now,
                same_boot,
            } => write!(
                f,
                "device {device} was prepared for it as {was}{} and is now {now}: not the same device; nothing prepared (delete the pod to release the claim)",
                if *same_boot { "" } else { " in an earlier boot" }
            ),
            Why::Held {
                device,
                mine,
                holder,
                holder_as,
                same_part,
            } => {
                write!(f, "device {device} ({mine}) is prepared for {holder}")?;
                if let Some(a) = holder_as {
                    write!(f, " (as {a})")?;
                }
                write!(
                    f,
                    " already{}",
                    if *same_part { ", on the same part of it" } else { "" }
                )
            }
            Why::PastTotal {
                device,
                mine,
                capacity,
                want,
                held,
                shares,
                total,
            } => write!(
                f,
                "device {device} ({mine}): {capacity} {want} with the {shares} share(s) prepared on it ({held}) is past its total {total}: a wrong allocation; nothing prepared"
            ),
        }
    }
}

/// What `claim` is given on `node` with `disk` as it is, or why it is refused.
pub fn decide<'t>(
    claim: Claim<'_>,
    node: Node<'_, 't>,
    disk: OnDisk<'_>,
) -> Result<Plan<'t>, Box<Refusal>> {
    let r = claim.claim;
    let refuse = |why: Why| {
        Box::new(Refusal {
            claim: r.clone(),
            why,
        })
    };
    let profile = node.profile;
    let mut devices: Vec<Prepared> = Vec::new();
    let mut spec: Vec<SpecDevice<'t>> = Vec::new();
    for res in claim.results.iter().filter(|x| x.driver == node.driver) {
        if res.pool != node.pool {
            return Err(refuse(Why::OtherPool {
                device: res.device.clone(),
                pool: res.pool.clone(),
                ours: node.pool.to_string(),
            }));
        }
        let offer = node
            .offers
            .iter()
            .find(|o| o.name == res.device)
            .ok_or_else(|| {
                refuse(Why::Unknown {
                    device: res.device.clone(),
                    driver: node.driver.to_string(),
                })
            })?;
        let dev: &'t DraDevice = offer.parent;
        let request = res
            .request
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let (usage, granted) = usage_of(offer, res).map_err(|why| {
            refuse(Why::WrongAllocation {
                device: res.device.clone(),
                why,
            })
        })?;
        let config = config_for(node.driver, claim.configs, &request).map_err(|why| {
            refuse(Why::BadConfig {
                request: request.clone(),
                why,
            })
        })?;
        let granted = match config {
            Some(c) => limited(offer.sharing, &profile.name, granted, &c).map_err(|why| {
                refuse(Why::BadLimits {
                    request: request.clone(),
                    device: res.device.clone(),
                    why,
                })
            })?,
            None => granted,
        };
        let memory = granted.as_ref().and_then(|g| g.memory);
        let env = granted
            .zip(offer.sharing)
            .map(|(g, s)| offers::env(s, &g))
            .unwrap_or_default();
        let facts = node.facts.get(&dev.name);
        let identity = match facts.map(|f| &f.identity) {
            Some(Ok(i)) => i.clone(),
            Some(Err(why)) => {
                return Err(refuse(Why::NotOnHost {
                    device: res.device.clone(),
                    why: why.clone(),
                }))
            }
            None => {
                return Err(refuse(Why::NotOnHost {
                    device: res.device.clone(),
                    why: "not looked at on the host".into(),
                }))
            }
        };
        if let Some(Health::Unhealthy(why)) = facts.map(|f| &f.health) {
            return Err(refuse(Why::Unhealthy {
                device: res.device.clone(),
                why: why.clone(),
            }));
        }
        let share_id = matches!(usage, Usage::Shared { .. })
            .then(|| res.share_id.clone())
            .flatten();
        match devices
            .iter_mut()
            .find(|p| p.device == res.device && p.share_id == share_id)
        {
            Some(p) => {
                if !p.request_names.contains(&request) {
                    p.request_names.push(request);
                }
            }
            None => {
                let cdi_name = match &share_id {
                    Some(share) => format!("{}-{share}", res.device),
                    None => res.device.clone(),
                };
                let rdevs = identity.rdevs.clone();
                devices.push(Prepared {
                    request_names: vec![request],
                    pool: res.pool.clone(),
                    device: res.device.clone(),
                    cdi_device_ids: vec![names::claim_cdi_id(node.driver, &r.uid, &cdi_name)],
                    admin_access: res.admin_access.unwrap_or(false),
                    share_id,
                    identity: Some(identity),
                    usage,
                });
                spec.push(SpecDevice {
                    name: names::claim_device_name(&r.uid, &cdi_name),
                    device: dev,
                    env,
                    memory,
                    rdevs,
                });
            }
        }
    }
    if let Some(rec) = disk.records.get(&r.uid) {
        check_again(&node, rec, &devices).map_err(|why| refuse(*why))?;
        if rec.devices == devices && rec.same_boot(node.boot_id) && disk.spec_in_place {
            return Ok(Plan {
                devices,
                spec,
                write: false,
            });
        }
    }
    for (i, p) in devices.iter().enumerate().filter(|(_, p)| !p.admin_access) {
        let Some(mine) = p.identity.as_ref() else {
            continue;
        };
        // Everything else prepared on the same physical device: other claims' devices,
        // and this claim's other devices (two shares, or two parts, of one device).
        let mut holders: Vec<(&ClaimRef, &Prepared)> = Vec::new();
        for other in disk.records.values().filter(|o| o.claim.uid != r.uid) {
            let same_boot = other.same_boot(node.boot_id);
            holders.extend(
                other
                    .devices
                    .iter()
                    .filter(|d| !d.admin_access && one_device(&node, d, p, same_boot))
                    .map(|d| (&other.claim, d)),
            );
        }
        holders.extend(
            devices
                .iter()
                .enumerate()
                .filter(|&(j, d)| j != i && !d.admin_access && one_device(&node, d, p, true))
                .map(|(_, d)| (r, d)),
        );
        let totals = node
            .offers
            .iter()
            .find(|o| o.name == p.device)
            .map(|o| o.totals())
            .unwrap_or_default();
        check_holders(p, mine, &holders, &totals).map_err(|why| refuse(*why))?;
    }
    Ok(Plan {
        devices,
        spec,
        write: true,
    })
}

/// Whether `was` (prepared in this boot, or in an earlier one: `same_boot`) and `now` are
/// one device: within one boot by identity ([`Identity::same_now`]); across a reboot by what
/// survives one ([`Identity::across_boots`]), and where nothing that does is known to both,
/// by the physical device their names stand for (a device known by its node alone is its
/// name: a GCU whose driver makes `/dev/gcu1` by hand).
fn one_device(node: &Node, was: &Prepared, now: &Prepared, same_boot: bool) -> bool {
    let (Some(a), Some(b)) = (&was.identity, &now.identity) else {
        return false;
    };
    if same_boot {
        return a.same_now(b);
    }
    a.across_boots(b, &node.profile.device_majors)
        .unwrap_or_else(|| {
            let parent = |name: &str| {
                node.offers
                    .iter()
                    .find(|o| o.name == name)
                    .map(|o| o.parent.name.as_str())
            };
            parent(&was.device).is_some_and(|p| Some(p) == parent(&now.device))
        })
}

/// A claim prepared before (its record `rec`) is prepared again: each device it was allocated
/// must still be the device the record names ([`one_device`]). Otherwise the name has come to
/// stand for another device (a card gone and the driver reloaded, another card in the slot):
/// refused, naming both.
fn check_again(node: &Node, rec: &Record, devices: &[Prepared]) -> Result<(), Box<Why>> {
    let same_boot = rec.same_boot(node.boot_id);
    for p in devices {
        let Some(was) = rec.devices.iter().find(|d| d.device == p.device) else {
            continue;
        };
        let (Some(was_id), Some(now)) = (&was.identity, &p.identity) else {
            continue;
        };
        if !one_device(node, was, p, same_boot) {
            return Err(Box::new(Why::NotTheSame {
                device: p.device.clone(),
                was: was_id.clone(),
                now: now.clone(),
                same_boot,
            }));
        }
    }
    Ok(())
}

/// What allocation result `res` holds of `offer`'s device, and what it was granted (for its
/// containers' variables; `None` for a whole device). Refuses what cannot be a right
/// allocation: a share of a device not published as shareable, a shareable device without
/// its share, consumption of a capacity the device does not have or past its total.
fn usage_of(
    offer: &Offer,
    res: &DeviceRequestAllocationResult,
) -> Result<(Usage, Option<Grant>), String> {
    let share = res.share_id.as_deref();
    let shown = |s: &str| s.chars().take(64).collect::<String>();
    match &offer.kind {
        Kind::Shared => {
            let Some(share) = share else {
                return Err("it is shareable but was allocated without a share ID".into());
            };
            if !names::valid_uid(share) {
                return Err(format!("share ID {:?} is not a UID", shown(share)));
            }
            let totals = offer.totals();
            let given = res.consumed_capacity.clone().unwrap_or_default();
            let mut consumed = BTreeMap::new();
            for (name, q) in &given {
                let Some(total) = totals.get(name) else {
                    return Err(format!(
                        "consumedCapacity names {:?}, which it does not have",
                        shown(name)
                    ));
                };
                let n = crate::quantity::parse(&q.0)
                    .map_err(|e| format!("consumedCapacity {name}: {e}"))?;
                if n > *total {
                    return Err(format!(
                        "consumedCapacity {name} {} is past its total {}",
                        shown(&q.0),
                        total
                    ));
                }
                consumed.insert(name.clone(), n);
            }
            if let Some(missing) = totals.keys().find(|k| !consumed.contains_key(*k)) {
                return Err(format!(
                    "consumedCapacity lacks {missing} (the API lists every capacity of a share)"
                ));
            }
            // Without a cores capacity a share has all of the compute, oversubscribed, and a
            // claim's config may set less.
            let grant = Grant {
                memory: consumed.get(offers::MEMORY).copied(),
                cores: consumed.get(offers::CORES).copied().or(Some(100)),
                slots: consumed.get(offers::SLOTS).copied(),
            };
            Ok((Usage::Shared { consumed }, Some(grant)))
        }
        kind => {
            // Nothing else is published as shareable: a share on one is a wrong allocation,
            // and must never let the claim in beside another.
            if let Some(share) = share {
                return Err(format!(
                    "allocated with share {:?}, but it is not published as shareable",
                    shown(share)
                ));
            }
            match (kind, offer.sharing) {
                (Kind::Partition { .. }, Some(sharing)) => Ok((
                    Usage::Partition {
                        slices: offer.slices(sharing).collect(),
                    },
                    Some(offer.partition_grant()),
                )),
                (Kind::Partition { .. }, None) => {
                    Err("a partition of a profile without sharing".into())
                }
                _ => Ok((Usage::Whole, None)),
            }
        }
    }
}

/// Whether `p` (which is `mine`) may be prepared beside `holders` (everything else prepared
/// on its physical device): a whole device beside nothing, a partition beside partitions it
/// does not overlap, a share beside shares while every capacity's sum stays within its
/// total.
fn check_holders(
    p: &Prepared,
    mine: &Identity,
    holders: &[(&ClaimRef, &Prepared)],
    totals: &BTreeMap<String, u64>,
) -> Result<(), Box<Why>> {
    let refuse = |holder: &ClaimRef, d: &Prepared, same_part: bool| {
        Box::new(Why::Held {
            device: p.device.clone(),
            mine: mine.clone(),
            holder: holder.clone(),
            holder_as: (d.device != p.device).then(|| d.device.clone()),
            same_part,
        })
    };
    let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
    let mut sharing = 0;
    for &(other, d) in holders {
        match (&p.usage, &d.usage) {
            (Usage::Shared { .. }, Usage::Shared { consumed }) => {
                sharing += 1;
                for (k, v) in consumed {
                    *sums.entry(k.as_str()).or_default() += v;
                }
            }
            (Usage::Partition { slices: a }, Usage::Partition { slices: b }) => {
                if a.iter().any(|s| b.contains(s)) {
                    return Err(refuse(other, d, true));
                }
            }
            _ => return Err(refuse(other, d, false)),
        }
    }
    if let Usage::Shared { consumed } = &p.usage {
        for (k, total) in totals {
            let held = sums.get(k.as_str()).copied().unwrap_or(0);
            let want = consumed.get(k).copied().unwrap_or(0);
            if held.saturating_add(want) > *total {
                let q = |n: u64| {
                    if k == offers::MEMORY {
                        crate::quantity::bytes(n)
                    } else {
                        n.to_string()
                    }
                };
                return Err(Box::new(Why::PastTotal {
                    device: p.device.clone(),
                    mine: mine.clone(),
                    capacity: k.clone(),
                    want: q(want),
                    held: q(held),
                    shares: sharing,
                    total: q(*total),
                }));
            }
        }
    }
    Ok(())
}

/// This driver's configuration of `request`: its opaque entries from the DeviceClass, then
/// from the claim, later entries winning field by field; `None` without any.
fn config_for(
    driver: &str,
    configs: &[DeviceAllocationConfiguration],
    request: &str,
) -> Result<Option<SharingConfig>, String> {
    let mut ordered: Vec<&DeviceAllocationConfiguration> = configs
        .iter()
        .filter(|c| {
            c.requests.as_ref().is_none_or(|rs| {
                rs.is_empty() || rs.iter().any(|x| x.split('/').next() == Some(request))
            })
        })
        .collect();
    // Stable: FromClass before FromClaim, each in its own order.
    ordered.sort_by_key(|c| c.source != "FromClass");
    let mut out: Option<SharingConfig> = None;
    for c in ordered {
        let Some(o) = &c.opaque else {
            return Err(format!(
                "a config entry ({}) of a kind this driver does not know",
                c.source
            ));
        };
        if o.driver != driver {
            continue;
        }
        let parsed: SharingConfig = serde_json::from_value(o.parameters.0.clone())
            .map_err(|e| format!("config ({}) parameters: {e}", c.source))?;
        if parsed.api_version != CONFIG_API_VERSION || parsed.kind != CONFIG_KIND {
            return Err(format!(
                "config ({}) parameters: apiVersion {:?} kind {:?}, expected {CONFIG_API_VERSION:?} {CONFIG_KIND:?}",
                c.source,
                parsed.api_version.chars().take(64).collect::<String>(),
                parsed.kind.chars().take(64).collect::<String>()
            ));
        }
        let merged = out.get_or_insert_with(SharingConfig::default);
        if let Some(l) = parsed.limits {
            let m = merged.limits.get_or_insert_with(ConfigLimits::default);
            if l.memory.is_some() {
                m.memory = l.memory;
            }
            if l.cores.is_some() {
                m.cores = l.cores;
            }
        }
    }
    Ok(out)
}

/// `granted` narrowed by `config`'s limits: only below what was granted, only on a share or
/// a partition, only for what `sharing` (of profile `vendor`) gives containers a variable for.
fn limited(
    sharing: Option<&Sharing>,
    vendor: &str,
    granted: Option<Grant>,
    config: &SharingConfig,
) -> Result<Option<Grant>, String> {
    let Some(limits) = &config.limits else {
        return Ok(granted);
    };
    let Some(mut g) = granted else {
        return Err(
            "limits.*: limits apply to shares and partitions, not to a whole device".into(),
        );
    };
    let templates: Vec<&String> = sharing
        .map(|s| s.env.values().collect())
        .unwrap_or_default();
    let told = |what: &str| templates.iter().any(|t| t.contains(&format!("{{{what}")));
    if let Some(m) = &limits.memory {
        let n = crate::quantity::parse(m).map_err(|e| format!("limits.memory: {e}"))?;
        if !told("memory") {
            return Err(format!(
                "limits.memory: profile {} gives containers no memory limit to set",
                vendor
            ));
        }
        match g.memory {
            Some(have) if n <= have && n > 0 => g.memory = Some(n),
            have => {
                return Err(format!(
                    "limits.memory {} must be above 0 and at most the {} granted",
                    crate::quote::quote(m),
                    have.map_or("nothing".into(), crate::quantity::bytes)
                ))
            }
        }
    }
    if let Some(c) = limits.cores {
        if !told("cores") {
            return Err(format!(
                "limits.cores: profile {} gives containers no compute limit to set",
                vendor
            ));
        }
        match g.cores {
            Some(have) if c <= have && c > 0 => g.cores = Some(c),
            have => {
                return Err(format!(
                    "limits.cores {c} must be above 0 and at most the {} percent granted",
                    have.unwrap_or(0)
                ))
            }
        }
    }
    Ok(Some(g))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::inventory::NodeDevice;
    use serde_json::{json, Value};

    const DRIVER: &str = "x.example.com";
    const POOL: &str = "node-a";
    const BOOT: &str = "boot-1";
    const SHARE: &str = "6a1d3c2e-5b4f-4e0a-9d8c-7b6a5f4e3d2c";
    const SHARE_2: &str = "6a1d3c2e-5b4f-4e0a-9d8c-7b6a5f4e3d2d";

    /// A device-node profile whose devices are offered whole, shared by capacity (32 GiB,
    /// 100 percent of compute, 16 slots) and in halves and quarters.
    fn profile() -> Profile {
        Profile::from_text(
            "name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{index}\"]\n[sharing]\nlimits = \"advisory\"\nmemory = \"32Gi\"\nenv = { MEM = \"{memory-gib}\", PCT = \"{cores}\" }\n[sharing.capacity]\nmemory = { default = \"8Gi\", min = \"1Gi\", step = \"1Gi\" }\ncores = { default = \"25\", min = \"5\", step = \"5\" }\nslots = 16\n[[sharing.partitions]]\nname = \"half\"\ncount = 2\n[[sharing.partitions]]\nname = \"quarter\"\ncount = 4\n",
            "t",
        )
        .unwrap()
        .0
    }

    fn table() -> Vec<DraDevice> {
        (0..2)
            .map(|i| DraDevice {
                name: format!("x-{i}"),
                dev: NodeDevice::numbered(i),
            })
            .collect()
    }

    fn claim_ref(n: u32) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: format!("c{n}"),
            uid: format!("0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d{n:04x}"),
        }
    }

    /// What the host says of the table's devices: nodes `240:<index>`, nothing else known.
    fn facts() -> BTreeMap<String, Facts> {
        (0..2)
            .map(|i| {
                (
                    format!("x-{i}"),
                    Facts {
                        identity: Ok(Identity {
                            rdevs: vec![format!("240:{i}")],
                            ..Identity::default()
                        }),
                        health: Health::Healthy,
                    },
                )
            })
            .collect()
    }

    fn identity<'f>(f: &'f mut BTreeMap<String, Facts>, device: &str) -> &'f mut Identity {
        f.get_mut(device).unwrap().identity.as_mut().unwrap()
    }

    /// A result for `device` under request `gcus`.
    fn res(device: &str) -> Value {
        json!({"request": "gcus", "driver": DRIVER, "pool": POOL, "device": device})
    }

    /// A share of `device` consuming `memory` with a quarter of the compute and one slot.
    fn share(device: &str, id: &str, memory: &str) -> Value {
        json!({"request": "gcus", "driver": DRIVER, "pool": POOL, "device": device,
               "shareID": id, "consumedCapacity": {"memory": memory, "cores": "25", "slots": "1"}})
    }

    fn config(parameters: Value) -> Value {
        json!({"source": "FromClaim", "requests": ["gcus"],
               "opaque": {"driver": DRIVER, "parameters": parameters}})
    }

    fn limits(l: Value) -> Value {
        config(json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "limits": l}))
    }

    /// What a decision is made on beyond the claim's own results.
    struct World {
        facts: BTreeMap<String, Facts>,
        records: HashMap<String, Record>,
        spec_in_place: bool,
        boot: String,
        /// The profile's `device-majors` when the claim is decided.
        device_majors: Vec<u64>,
    }

    type Want = Result<&'static [&'static str], (fn(&Why) -> bool, &'static str)>;

    struct Case {
        name: &'static str,
        results: Vec<Value>,
        configs: Vec<Value>,
        /// Claims prepared before, each decided on the disk as the ones before it left it:
        /// `(n, results)`; `n` 1 is this claim.
        held: Vec<(u32, Vec<Value>)>,
        /// Changes to the world after `held` (another boot, another device).
        then: fn(&mut World),
        /// The devices prepared, or a refusal of this kind naming this.
        want: Want,
    }

    /// The devices prepared, their variables, and whether to write; or the refusal.
    type Got = Result<(Vec<Prepared>, Vec<Vec<String>>, bool), Box<Refusal>>;

    fn run(
        profile: &Profile,
        table: &[DraDevice],
        n: u32,
        results: &[Value],
        configs: &[Value],
        world: &World,
    ) -> Got {
        let results: Vec<DeviceRequestAllocationResult> = results
            .iter()
            .map(|v| serde_json::from_value(v.clone()).unwrap())
            .collect();
        let configs: Vec<DeviceAllocationConfiguration> = configs
            .iter()
            .map(|v| serde_json::from_value(v.clone()).unwrap())
            .collect();
        let sharing = Sharing::of(profile).unwrap().0;
        let offered = offers::offers(sharing.as_ref(), table);
        let r = claim_ref(n);
        decide(
            Claim {
                claim: &r,
                results: &results,
                configs: &configs,
            },
            Node {
                driver: DRIVER,
                pool: POOL,
                profile,
                offers: &offered,
                facts: &world.facts,
                boot_id: &world.boot,
            },
            OnDisk {
                records: &world.records,
                spec_in_place: world.spec_in_place,
            },
        )
        .map(|p| {
            let env = p.spec.iter().map(|s| s.env.clone()).collect();
            (p.devices, env, p.write)
        })
    }

    fn check(case: &Case) -> Got {
        let (profile, table) = (profile(), table());
        let mut world = World {
            facts: facts(),
            records: HashMap::new(),
            spec_in_place: true,
            boot: BOOT.into(),
            device_majors: Vec::new(),
        };
        for (n, results) in &case.held {
            let (devices, ..) = run(&profile, &table, *n, results, &[], &world)
                .unwrap_or_else(|e| panic!("{}: held claim {n}: {e}", case.name));
            let claim = claim_ref(*n);
            world.records.insert(
                claim.uid.clone(),
                Record {
                    claim,
                    devices,
                    boot_id: Some(world.boot.clone()),
                },
            );
        }
        (case.then)(&mut world);
        let mut profile = profile;
        profile.device_majors = world.device_majors.clone();
        let got = run(&profile, &table, 1, &case.results, &case.configs, &world);
        match (&got, &case.want) {
            (Ok((devices, ..)), Ok(want)) => {
                let names: Vec<&str> = devices.iter().map(|d| d.device.as_str()).collect();
                assert_eq!(names, *want, "{}", case.name);
            }
            (Err(e), Err((kind, text))) => {
                assert!(kind(&e.why), "{}: refused otherwise: {e}", case.name);
                let line = e.to_string();
                assert!(line.contains(text), "{}: {line}", case.name);
                assert!(line.starts_with("claim ns/c1 ("), "{}: {line}", case.name);
                assert!(!line.contains('\n'), "{}: {line}", case.name);
            }
            (Ok(d), Err((_, text))) => {
                panic!("{}: prepared, not refused ({text}): {d:?}", case.name)
            }
            (Err(e), Ok(_)) => panic!("{}: refused: {e}", case.name),
        }
        got
    }

    fn none(_: &mut World) {}

    #[test]
    fn every_refusal_of_a_prepare_is_decided_with_its_reason() {
        let cases = vec![
            Case {
                name: "a device of another node's pool",
                results: vec![json!({"request": "gcus", "driver": DRIVER, "pool": "node-b", "device": "x-0"})],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::OtherPool { .. }),
                    "device x-0 is from pool \"node-b\", this node's pool is \"node-a\"",
                )),
            },
            Case {
                name: "an unknown device",
                results: vec![res("x-9")],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::Unknown { .. }),
                    "device x-9 is not one of this node's x.example.com devices",
                )),
            },
            Case {
                name: "a shareable device without its share ID",
                results: vec![res("x-0-shared")],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::WrongAllocation { .. }),
                    "device x-0-shared: it is shareable but was allocated without a share ID",
                )),
            },
            Case {
                name: "a share ID that is not a UID",
                results: vec![share("x-0-shared", "../c2", "8Gi")],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::WrongAllocation { .. }),
                    "device x-0-shared: share ID \"../c2\" is not a UID; nothing prepared",
                )),
            },
            Case {
                name: "a share ID on a device not published as shareable",
                results: vec![share("x-0", SHARE, "8Gi")],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::WrongAllocation { .. }),
                    "but it is not published as shareable",
                )),
            },
            Case {
                name: "a share consuming past the device's capacity",
                results: vec![share("x-0-shared", SHARE, "64Gi")],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::WrongAllocation { .. }),
                    "consumedCapacity memory 64Gi is past its total",
                )),
            },
            Case {
                name: "a share consuming a capacity the device does not have",
                results: vec![json!({"request": "gcus", "driver": DRIVER, "pool": POOL, "device": "x-0-shared",
                    "shareID": SHARE, "consumedCapacity": {"memory": "8Gi", "cores": "25", "slots": "1", "watts": "5"}})],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::WrongAllocation { .. }),
                    "consumedCapacity names \"watts\", which it does not have",
                )),
            },
            Case {
                name: "a share without every capacity",
                results: vec![json!({"request": "gcus", "driver": DRIVER, "pool": POOL, "device": "x-0-shared",
                    "shareID": SHARE, "consumedCapacity": {"memory": "8Gi", "cores": "25"}})],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::WrongAllocation { .. }),
                    "consumedCapacity lacks slots",
                )),
            },
            Case {
                name: "a config entry of a kind this driver does not know",
                results: vec![res("x-0")],
                configs: vec![json!({"source": "FromClaim", "requests": ["gcus"]})],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::BadConfig { .. }),
                    "request \"gcus\": a config entry (FromClaim) of a kind this driver does not know",
                )),
            },
            Case {
                name: "a config of another apiVersion",
                results: vec![res("x-0")],
                configs: vec![config(json!({"apiVersion": "v1", "kind": CONFIG_KIND}))],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::BadConfig { .. }),
                    "apiVersion \"v1\" kind \"SharingConfig\", expected",
                )),
            },
            Case {
                name: "a config with a field it does not have",
                results: vec![res("x-0")],
                configs: vec![config(json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "limit": {}}))],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::BadConfig { .. }),
                    "config (FromClaim) parameters: unknown field `limit`",
                )),
            },
            Case {
                name: "limits on a whole device",
                results: vec![res("x-0")],
                configs: vec![limits(json!({"cores": 50}))],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::BadLimits { .. }),
                    "request \"gcus\": device x-0: limits.*: limits apply to shares and partitions",
                )),
            },
            Case {
                name: "a memory limit above what was granted",
                results: vec![share("x-0-shared", SHARE, "8Gi")],
                configs: vec![limits(json!({"memory": "9Gi"}))],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::BadLimits { .. }),
                    "limits.memory \"9Gi\" must be above 0 and at most the 8Gi granted",
                )),
            },
            Case {
                name: "a compute limit above what was granted",
                results: vec![res("x-0-half-0")],
                configs: vec![limits(json!({"cores": 60}))],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::BadLimits { .. }),
                    "limits.cores 60 must be above 0 and at most the 50 percent granted",
                )),
            },
            Case {
                name: "a device whose node the host does not have as offered",
                results: vec![res("x-1")],
                configs: vec![],
                held: vec![],
                then: |w| {
                    w.facts.get_mut("x-1").unwrap().identity =
                        Err("/dev/x1: not a character device".into());
                },
                want: Err((
                    |w| matches!(w, Why::NotOnHost { .. }),
                    "device x-1: /dev/x1: not a character device; nothing prepared (kubelet retries)",
                )),
            },
            Case {
                name: "a device the host was not asked about",
                results: vec![res("x-1")],
                configs: vec![],
                held: vec![],
                then: |w| {
                    w.facts.remove("x-1");
                },
                want: Err((
                    |w| matches!(w, Why::NotOnHost { .. }),
                    "device x-1: not looked at on the host",
                )),
            },
            Case {
                name: "an unhealthy device, a part of it asked for",
                results: vec![res("x-1-quarter-3")],
                configs: vec![],
                held: vec![],
                then: |w| {
                    w.facts.get_mut("x-1").unwrap().health =
                        Health::Unhealthy("its driver reports an uncorrectable error".into());
                },
                want: Err((
                    |w| matches!(w, Why::Unhealthy { .. }),
                    "device x-1-quarter-3 is unhealthy: its driver reports an uncorrectable error",
                )),
            },
            Case {
                name: "a whole device another claim holds whole",
                results: vec![res("x-0")],
                configs: vec![],
                held: vec![(2, vec![res("x-0")])],
                then: none,
                want: Err((
                    |w| matches!(w, Why::Held { same_part: false, .. }),
                    "device x-0 (nodes 240:0) is prepared for claim ns/c2 (0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d0002) already",
                )),
            },
            Case {
                name: "a whole device another claim holds a part of",
                results: vec![res("x-0")],
                configs: vec![],
                held: vec![(2, vec![res("x-0-quarter-2")])],
                then: none,
                want: Err((
                    |w| matches!(w, Why::Held { holder_as: Some(_), .. }),
                    "is prepared for claim ns/c2 (0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d0002) (as x-0-quarter-2) already",
                )),
            },
            Case {
                name: "a part overlapping another claim's part",
                results: vec![res("x-0-quarter-1")],
                configs: vec![],
                held: vec![(2, vec![res("x-0-half-0")])],
                then: none,
                want: Err((
                    |w| matches!(w, Why::Held { same_part: true, .. }),
                    "(as x-0-half-0) already, on the same part of it",
                )),
            },
            Case {
                name: "a share beside another claim holding the device whole",
                results: vec![share("x-0-shared", SHARE, "8Gi")],
                configs: vec![],
                held: vec![(2, vec![res("x-0")])],
                then: none,
                want: Err((
                    |w| matches!(w, Why::Held { .. }),
                    "device x-0-shared (nodes 240:0) is prepared for claim ns/c2",
                )),
            },
            Case {
                name: "a share past the memory left beside another claim's share",
                results: vec![share("x-0-shared", SHARE, "16Gi")],
                configs: vec![],
                held: vec![(2, vec![share("x-0-shared", SHARE_2, "24Gi")])],
                then: none,
                want: Err((
                    |w| matches!(w, Why::PastTotal { .. }),
                    "device x-0-shared (nodes 240:0): memory 16Gi with the 1 share(s) prepared on it (24Gi) is past its total 32Gi: a wrong allocation",
                )),
            },
            Case {
                name: "this claim's own two overlapping parts of one device",
                results: vec![res("x-1-half-1"), res("x-1-quarter-3")],
                configs: vec![],
                held: vec![],
                then: none,
                want: Err((
                    |w| matches!(w, Why::Held { same_part: true, .. }),
                    "device x-1-half-1 (nodes 240:1) is prepared for claim ns/c1 (0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d0001) (as x-1-quarter-3) already",
                )),
            },
            Case {
                name: "a claim prepared before whose device's node is now another's",
                results: vec![res("x-0")],
                configs: vec![],
                held: vec![(1, vec![res("x-0")])],
                then: |w| identity(&mut w.facts, "x-0").rdevs = vec!["240:7".into()],
                want: Err((
                    |w| matches!(w, Why::NotTheSame { same_boot: true, .. }),
                    "device x-0 was prepared for it as nodes 240:0 and is now nodes 240:7: not the same device",
                )),
            },
            Case {
                name: "a claim prepared in an earlier boot on another PCI function",
                results: vec![res("x-0")],
                configs: vec![],
                held: vec![(1, vec![res("x-0")])],
                then: |w| {
                    let r = w.records.values_mut().next().unwrap();
                    r.devices[0].identity.as_mut().unwrap().pci_bus_id = Some("0000:3b:00.0".into());
                    identity(&mut w.facts, "x-0").pci_bus_id = Some("0000:af:00.0".into());
                    w.boot = "boot-2".into();
                },
                want: Err((
                    |w| matches!(w, Why::NotTheSame { same_boot: false, .. }),
                    "device x-0 was prepared for it as nodes 240:0, PCI 0000:3b:00.0 in an earlier boot and is now nodes 240:0, PCI 0000:af:00.0: not the same device",
                )),
            },
        ];
        for case in &cases {
            let _ = check(case);
        }
    }

    #[test]
    fn what_a_prepare_may_give_is_decided_with_its_plan() {
        let ok = |name, results: Vec<Value>, held, want| Case {
            name,
            results,
            configs: vec![],
            held,
            then: none,
            want: Ok(want),
        };
        let cases = vec![
            ok("a whole device", vec![res("x-1")], vec![], &["x-1"][..]),
            ok(
                "another driver's results are not ours",
                vec![
                    json!({"request": "gcus", "driver": "other.example.com", "pool": "node-b", "device": "z"}),
                ],
                vec![],
                &[],
            ),
            ok(
                "parts beside parts they do not overlap",
                vec![res("x-0-half-1")],
                vec![
                    (2, vec![res("x-0-quarter-0")]),
                    (3, vec![res("x-0-quarter-1")]),
                ],
                &["x-0-half-1"],
            ),
            ok(
                "a share beside shares within every capacity",
                vec![share("x-0-shared", SHARE, "8Gi")],
                vec![(2, vec![share("x-0-shared", SHARE_2, "24Gi")])],
                &["x-0-shared"],
            ),
            ok(
                "a whole device beside another's whole device",
                vec![res("x-1")],
                vec![(2, vec![res("x-0")])],
                &["x-1"],
            ),
            ok(
                "admin access beside a claim holding the device",
                vec![
                    json!({"request": "gcus", "driver": DRIVER, "pool": POOL, "device": "x-0", "adminAccess": true}),
                ],
                vec![(2, vec![res("x-0")])],
                &["x-0"],
            ),
            ok(
                "two requests given one device",
                vec![
                    res("x-1"),
                    json!({"request": "more/sub", "driver": DRIVER, "pool": POOL, "device": "x-1"}),
                ],
                vec![],
                &["x-1"],
            ),
            ok(
                "two shares of one device in one claim",
                vec![
                    share("x-0-shared", SHARE, "8Gi"),
                    share("x-0-shared", SHARE_2, "8Gi"),
                ],
                vec![],
                &["x-0-shared", "x-0-shared"],
            ),
            ok(
                "a claim prepared again on the same device",
                vec![res("x-0")],
                vec![(1, vec![res("x-0")])],
                &["x-0"],
            ),
        ];
        for case in &cases {
            let _ = check(case);
        }

        // Two requests, one device: both named, one CDI device.
        let (devices, env, write) = check(&cases[6]).unwrap();
        assert_eq!(devices[0].request_names, ["gcus", "more"]);
        assert_eq!(
            devices[0].cdi_device_ids,
            ["k8s.x.example.com/claim=0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d0001-x-1"]
        );
        assert_eq!(devices[0].identity.as_ref().unwrap().rdevs, ["240:1"]);
        assert_eq!(devices[0].usage, Usage::Whole);
        assert_eq!(env, [Vec::<String>::new()]);
        assert!(write);
        // Two shares: each its own CDI device, named by its share.
        let (devices, env, _) = check(&cases[7]).unwrap();
        assert_eq!(devices[1].share_id.as_deref(), Some(SHARE_2));
        assert!(devices[1].cdi_device_ids[0].ends_with(&format!("-x-0-shared-{SHARE_2}")));
        assert_eq!(env[0], ["MEM=8", "PCT=25"]);
        // A part: its slices and its variables.
        let (devices, env, _) = check(&cases[2]).unwrap();
        assert_eq!(devices[0].usage, Usage::Partition { slices: vec![2, 3] });
        assert_eq!(env[0], ["MEM=16", "PCT=50"]);
        // Prepared again: the record and spec on disk say the same, nothing to write; the
        // spec gone, or another boot, and it is written again.
        assert!(!check(&cases[8]).unwrap().2);
        let mut gone = ok(
            "the spec gone",
            vec![res("x-0")],
            vec![(1, vec![res("x-0")])],
            &["x-0"],
        );
        gone.then = |w| w.spec_in_place = false;
        assert!(check(&gone).unwrap().2);
        gone.then = |w| {
            let r = w.records.values_mut().next().unwrap();
            r.devices[0].identity.as_mut().unwrap().pci_bus_id = Some("0000:3b:00.0".into());
            identity(&mut w.facts, "x-0").pci_bus_id = Some("0000:3B:00.0".into());
            w.boot = "boot-2".into();
        };
        assert!(check(&gone).unwrap().2);
        // Limits narrow what a share was granted.
        let limited = Case {
            name: "limits below the grant",
            results: vec![share("x-0-shared", SHARE, "8Gi")],
            configs: vec![limits(json!({"memory": "4Gi", "cores": 10}))],
            held: vec![],
            then: none,
            want: Ok(&["x-0-shared"]),
        };
        assert_eq!(check(&limited).unwrap().1[0], ["MEM=4", "PCT=10"]);
    }

    /// The record of claim 1 (this claim) and claim 2 made in [`BOOT`], and the node rebooted.
    fn rebooted(w: &mut World) {
        w.boot = "boot-2".into();
    }

    /// `f` applied to the identity of every device of every record, and of the host's `x-0`.
    fn everywhere(w: &mut World, f: fn(&mut Identity, bool)) {
        for r in w.records.values_mut() {
            for d in &mut r.devices {
                f(d.identity.as_mut().unwrap(), false);
            }
        }
        f(identity(&mut w.facts, "x-0"), true);
    }

    /// Issue 42, item 6: across a reboot a device is compared by what survives one, and
    /// refused only when that differs; known by its node alone, it is its name.
    #[test]
    fn identity_that_does_not_survive_a_reboot_is_compared_by_what_does() {
        let again = |name, then: fn(&mut World), want: Want| Case {
            name,
            results: vec![res("x-0")],
            configs: vec![],
            held: vec![(1, vec![res("x-0")])],
            then,
            want,
        };
        let cases = vec![
            again(
                "enflame class: its nodes alone, their major dynamic",
                rebooted,
                Ok(&["x-0"]),
            ),
            again(
                "enflame class: its nodes alone, the dynamic major another after the reboot",
                |w| {
                    rebooted(w);
                    identity(&mut w.facts, "x-0").rdevs = vec!["238:0".into()];
                },
                Ok(&["x-0"]),
            ),
            again(
                "a vendor-fixed major: the same numbers",
                |w| {
                    rebooted(w);
                    w.device_majors = vec![240];
                },
                Ok(&["x-0"]),
            ),
            again(
                "a vendor-fixed major: other numbers",
                |w| {
                    rebooted(w);
                    w.device_majors = vec![240];
                    identity(&mut w.facts, "x-0").rdevs = vec!["240:7".into()];
                },
                Err((
                    |w| matches!(w, Why::NotTheSame { same_boot: false, .. }),
                    "device x-0 was prepared for it as nodes 240:0 in an earlier boot and is now nodes 240:7: not the same device",
                )),
            ),
            again(
                "sysfs: the same place, other numbers",
                |w| {
                    rebooted(w);
                    everywhere(w, |i, _| i.sysfs = Some("devices/platform/gcu.0".into()));
                    identity(&mut w.facts, "x-0").rdevs = vec!["240:7".into()];
                },
                Ok(&["x-0"]),
            ),
            again(
                "sysfs: the numbers now another device's",
                |w| {
                    rebooted(w);
                    everywhere(w, |i, now| {
                        i.sysfs = Some(format!("devices/platform/gcu.{}", if now { 5 } else { 0 }))
                    });
                },
                Err((
                    |w| matches!(w, Why::NotTheSame { same_boot: false, .. }),
                    "as nodes 240:0, sysfs devices/platform/gcu.0 in an earlier boot and is now nodes 240:0, sysfs devices/platform/gcu.5: not the same device",
                )),
            ),
            again(
                "NVIDIA class: the same PCI function and UUID, another minor",
                |w| {
                    rebooted(w);
                    everywhere(w, |i, _| {
                        i.pci_bus_id = Some("0000:3b:00.0".into());
                        i.uuid = Some("GPU-8f6b1c01".into());
                    });
                    w.device_majors = vec![240];
                    identity(&mut w.facts, "x-0").rdevs = vec!["240:7".into()];
                },
                Ok(&["x-0"]),
            ),
            again(
                "NVIDIA class: another GPU in the slot (its UUID)",
                |w| {
                    rebooted(w);
                    everywhere(w, |i, now| {
                        i.pci_bus_id = Some("0000:3b:00.0".into());
                        i.uuid = Some(format!("GPU-8f6b1c0{}", u8::from(now)));
                    });
                },
                Err((
                    |w| matches!(w, Why::NotTheSame { .. }),
                    "UUID GPU-8f6b1c00 in an earlier boot and is now nodes 240:0, PCI 0000:3b:00.0, UUID GPU-8f6b1c01",
                )),
            ),
            again(
                "DRM class: another card at the same PCI address, under other bridges",
                |w| {
                    rebooted(w);
                    everywhere(w, |i, now| {
                        i.pci_bus_id = Some("0000:03:00.0".into());
                        let bridge = if now { "0000:00:1c.0" } else { "0000:00:01.0" };
                        i.sysfs = Some(format!("devices/pci0000:00/{bridge}/0000:03:00.0"));
                    });
                },
                Err((
                    |w| matches!(w, Why::NotTheSame { .. }),
                    "sysfs devices/pci0000:00/0000:00:01.0/0000:03:00.0 in an earlier boot and is now nodes 240:0, PCI 0000:03:00.0, sysfs devices/pci0000:00/0000:00:1c.0/0000:03:00.0",
                )),
            ),
            Case {
                name: "another claim's device of an earlier boot, known by its node alone, holds it",
                results: vec![res("x-0")],
                configs: vec![],
                held: vec![(2, vec![res("x-0")])],
                then: rebooted,
                want: Err((
                    |w| matches!(w, Why::Held { .. }),
                    "device x-0 (nodes 240:0) is prepared for claim ns/c2",
                )),
            },
            Case {
                name: "another claim's device of an earlier boot, known by its node alone, is not another's",
                results: vec![res("x-1")],
                configs: vec![],
                held: vec![(2, vec![res("x-0")])],
                then: |w| {
                    rebooted(w);
                    identity(&mut w.facts, "x-1").rdevs = vec!["240:0".into()];
                },
                want: Ok(&["x-1"]),
            },
            Case {
                name: "another claim's device of an earlier boot, on another PCI function now at its node",
                results: vec![res("x-0")],
                configs: vec![],
                held: vec![(2, vec![res("x-0")])],
                then: |w| {
                    rebooted(w);
                    everywhere(w, |i, now| {
                        i.pci_bus_id = Some(format!("0000:{}:00.0", if now { "af" } else { "3b" }))
                    });
                },
                want: Ok(&["x-0"]),
            },
        ];
        for case in &cases {
            let _ = check(case);
        }
    }

    #[test]
    fn a_refusal_of_a_device_no_longer_the_same_says_its_spec_is_stale() {
        let r = |why| Refusal {
            claim: claim_ref(1),
            why,
        };
        let same = Why::NotTheSame {
            device: "x-0".into(),
            was: Identity::default(),
            now: Identity::default(),
            same_boot: false,
        };
        assert!(r(same).spec_is_stale());
        let held = Why::Unknown {
            device: "x-0".into(),
            driver: DRIVER.into(),
        };
        assert!(!r(held).spec_is_stale());
    }
}
