//! Preparing and unpreparing claims: the devices a claim's allocation gives this driver are
//! checked on the host now (every node a character device with the driver's major: a spec
//! written before the nodes exist is the bad cached spec of NVIDIA's driver issue #1380), a
//! per-claim CDI spec with the edits `accel-ctk cdi generate` writes is put in place
//! atomically, then a per-claim record on disk, so a claim prepared before a restart is
//! unprepared after it. Unpreparing removes both; an unknown claim is already unprepared.
//!
//! A failed prepare leaves nothing behind and caches nothing: kubelet retries, and the retry
//! looks at the host afresh. A record whose spec file is gone (a reboot emptied a tmpfs
//! `/var/run/cdi`) is prepared again rather than answered from the record.
//!
//! A device is what it is, not the name it goes by: each record keeps, per device, what the
//! device was when prepared ([`Identity`]: its nodes' device numbers, PCI bus id, UUID) and
//! the boot it was prepared in. Two claims may never hold one device: that is decided by
//! identity (the same PCI function, or within one boot the same device node), not by name.
//! A claim prepared again (kubelet after a reboot or its own restart) gets its device only if
//! the name it was allocated still stands for the device the record names; otherwise the
//! prepare is refused with both identities named, and nothing of the old record is reused:
//! its CDI spec is removed (the record stays, so the claim still unprepares).
//! Records written before identities were kept have theirs read back from the device nodes
//! their CDI spec gave the container.
//!
//! Nothing is kept in memory across calls: every prepare and unprepare takes an exclusive
//! lock on the state directory and reads the records there, so two instances of the driver
//! (the old and the new pod of a rolling update, each registered with kubelet, which may call
//! either) decide on the same records, and neither gives a device another has given.

use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::cdi::model::{Device as CdiDevice, Spec};
use crate::kubelet::host_root::HostRoot;
use crate::kubelet::inventory::{char_problem, node_problem};
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
    /// [`Claims::open`] reads it back from their CDI spec.
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

/// The `apiVersion` and `kind` of [`SharingConfig`].
pub const CONFIG_API_VERSION: &str = "accel-container-runtime/v1";
pub const CONFIG_KIND: &str = "SharingConfig";

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
}

impl Identity {
    /// Whether `self` and `other` are one device: the same PCI function where both know
    /// theirs (it survives reboots and driver reloads); else, only within one boot, a node in
    /// common (minors are handed out again at every driver load).
    pub fn same(&self, other: &Identity, same_boot: bool) -> bool {
        if let (Some(a), Some(b)) = (&self.pci_bus_id, &other.pci_bus_id) {
            return a.eq_ignore_ascii_case(b);
        }
        same_boot && self.rdevs.iter().any(|r| other.rdevs.contains(r))
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
    fn same_boot(&self, boot_id: &str) -> bool {
        // An older record's boot is not known: taken as this one, so its nodes still count
        // against other claims (a false conflict refuses a prepare; a missed one would give
        // a device twice).
        self.boot_id.as_deref().is_none_or(|b| b == boot_id)
    }
}

/// A claim record is a few hundred bytes per device; anything near this is not one (and a
/// huge file must not put the driver in an out-of-memory loop at every start).
const MAX_RECORD: u64 = 1 << 20;
/// A per-claim CDI spec names a few dozen files per device.
const MAX_SPEC: u64 = 4 << 20;

/// The kernel's id of this boot, where the driver reads it by default.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id read from `path` (a line of 36 characters); empty when it cannot be read,
/// which makes every record look as if made in another boot (prepared again, never reused).
pub fn boot_id(path: &Path) -> String {
    crate::bounded::read_text(path, 64)
        .map(|t| t.trim().to_string())
        .unwrap_or_default()
}

/// Where and how one driver prepares claims.
#[derive(Debug)]
pub struct Claims {
    pub driver: String,
    /// This node's pool (the node's name).
    pub pool: String,
    pub cdi_dir: PathBuf,
    /// The per-claim records (`<uid>.json`).
    pub state_dir: PathBuf,
    pub library_dir: PathBuf,
    pub host_root: HostRoot,
    /// This boot's id ([`boot_id`]).
    pub boot_id: String,
}

/// The state directory's lock, held for one prepare or unprepare (`flock`, released when
/// dropped); every instance of the driver takes the same one.
struct Locked(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl Claims {
    /// The driver's claims, with the records a previous run left in `state_dir`. A record
    /// not owned by this user, writable by others, larger than a record can be or not a
    /// regular file is not trusted (skipped, and said so). Records of older versions get
    /// their devices' identities from the device nodes of their CDI spec.
    pub fn open(
        driver: String,
        pool: String,
        cdi_dir: PathBuf,
        state_dir: PathBuf,
        library_dir: PathBuf,
        host_root: HostRoot,
        boot_id: String,
    ) -> std::io::Result<Claims> {
        crate::atomic::make_dirs(&state_dir)?;
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(Claims {
            driver,
            pool,
            cdi_dir,
            state_dir,
            library_dir,
            host_root,
            boot_id,
        })
    }

    /// The state directory locked for this caller: waits for another prepare or unprepare,
    /// of this instance or another, to end.
    fn exclusive(&self) -> std::io::Result<Locked> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.state_dir.join(".lock"))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map(Locked)
            .map_err(|(_, e)| e.into())
    }

    /// The records in the state directory now. A record not owned by this user, writable by
    /// others, larger than a record can be or not a regular file is not trusted (skipped,
    /// and said so). Records of older versions get their devices' identities from the device
    /// nodes of their CDI spec.
    fn records(&self) -> std::io::Result<HashMap<String, Record>> {
        let mut records = HashMap::new();
        let me = nix::unistd::geteuid().as_raw();
        for entry in std::fs::read_dir(&self.state_dir)? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let trusted = std::fs::symlink_metadata(&path).is_ok_and(|m| {
                m.is_file() && m.uid() == me && m.mode() & 0o022 == 0 && m.len() <= MAX_RECORD
            });
            let record = trusted
                .then(|| crate::bounded::read_file(&path, MAX_RECORD).ok())
                .flatten()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
                .filter(|r| {
                    names::valid_uid(&r.claim.uid)
                        && path.file_stem().is_some_and(|s| s == r.claim.uid.as_str())
                });
            match record {
                Some(mut r) => {
                    if r.devices.iter().any(|d| d.identity.is_none()) {
                        self.identify_from_spec(&mut r);
                    }
                    records.insert(r.claim.uid.clone(), r);
                }
                None => ignored_once(&self.driver, &path),
            }
        }
        Ok(records)
    }

    /// Fills in the identities an older record lacks from the device nodes its CDI spec gave
    /// the container (what it holds, whatever name the device now goes by). Devices whose
    /// spec is gone stay unknown; they are then compared by nothing, and the claim is
    /// prepared afresh when kubelet asks again.
    fn identify_from_spec(&self, r: &mut Record) {
        let path = self.spec_path(&r.claim.uid);
        let Some(spec) = crate::bounded::read_file(&path, MAX_SPEC)
            .ok()
            .and_then(|b| serde_json::from_slice::<Spec>(&b).ok())
        else {
            log::warn!(
                "{}: {}: a record of an older version without its CDI spec {}; its devices are not known",
                self.driver,
                r.claim,
                path.display()
            );
            return;
        };
        for p in r.devices.iter_mut().filter(|p| p.identity.is_none()) {
            let name = names::claim_device_name(&r.claim.uid, &p.device);
            let Some(d) = spec.devices.iter().find(|d| d.name == name) else {
                continue;
            };
            let rdevs: Vec<String> = d
                .container_edits
                .device_nodes
                .iter()
                .filter_map(|n| {
                    let host = self.host_root.path().join(
                        Path::new(n.host_path.as_deref().unwrap_or(&n.path))
                            .strip_prefix("/")
                            .ok()?,
                    );
                    let m = std::fs::symlink_metadata(host).ok()?;
                    m.file_type().is_char_device().then(|| rdev(m.rdev()))
                })
                .collect();
            p.identity = Some(Identity {
                rdevs,
                ..Identity::default()
            });
        }
    }

    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(names::claim_spec_file(&self.driver, uid))
    }

    fn record_path(&self, uid: &str) -> PathBuf {
        self.state_dir.join(format!("{uid}.json"))
    }

    /// The UIDs of the claims prepared now (by any instance).
    pub fn prepared(&self) -> BTreeSet<String> {
        self.records()
            .map(|r| r.into_keys().collect())
            .unwrap_or_default()
    }

    /// Prepares `claim` (as read from the API server) for `r`: the devices it was given by
    /// this driver, each checked on the host, and the claim's CDI spec. One line on error.
    pub fn prepare(
        &self,
        profile: &Profile,
        table: &[DraDevice],
        r: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Vec<Prepared>, String> {
        if !names::valid_uid(&r.uid) {
            return Err(format!("{r}: the UID is not a UID"));
        }
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if uid != r.uid {
            return Err(format!(
                "{r}: the API server's claim has UID {uid:?} (deleted and made again?)"
            ));
        }
        let allocation = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .ok_or_else(|| format!("{r}: not allocated"))?;
        let results = allocation.results.as_deref().unwrap_or_default();
        let configs = allocation.config.as_deref().unwrap_or_default();
        let offered = offers::offers(profile, table);
        // Each device with its name in the claim's CDI spec and its variables.
        let mut wanted: Vec<(Prepared, &DraDevice, String, Vec<String>)> = Vec::new();
        for res in results.iter().filter(|x| x.driver == self.driver) {
            if res.pool != self.pool {
                return Err(format!(
                    "{r}: device {} is from pool {:?}, this node's pool is {:?}",
                    res.device, res.pool, self.pool
                ));
            }
            let offer = offered
                .iter()
                .find(|o| o.name == res.device)
                .ok_or_else(|| {
                    format!(
                        "{r}: device {} is not one of this node's {} devices",
                        res.device, self.driver
                    )
                })?;
            let dev = offer.parent;
            let request = res
                .request
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string();
            let (usage, granted) = usage_of(profile, offer, res)
                .map_err(|e| format!("{r}: device {}: {e}; nothing prepared", res.device))?;
            let env = match config_for(&self.driver, configs, &request)
                .map_err(|e| format!("{r}: request {request:?}: {e}; nothing prepared"))?
            {
                Some(c) => limited(profile, granted, &c).map_err(|e| {
                    format!(
                        "{r}: request {request:?}: device {}: {e}; nothing prepared",
                        res.device
                    )
                })?,
                None => granted,
            }
            .map(|g| offers::env(profile.sharing.as_ref().expect("shared"), &g))
            .unwrap_or_default();
            if let Some(p) = node_problem(profile, &dev.dev) {
                return Err(format!(
                    "{r}: device {}: {p}; nothing prepared (kubelet retries)",
                    res.device
                ));
            }
            let identity = identity_of(profile, dev).map_err(|p| {
                format!(
                    "{r}: device {}: {p}; nothing prepared (kubelet retries)",
                    res.device
                )
            })?;
            let admin = res.admin_access.unwrap_or(false);
            let share_id = matches!(usage, Usage::Shared { .. })
                .then(|| res.share_id.clone())
                .flatten();
            let cdi_name = match &share_id {
                Some(share) => format!("{}-{share}", res.device),
                None => res.device.clone(),
            };
            match wanted
                .iter_mut()
                .find(|(p, ..)| p.device == res.device && p.share_id == share_id)
            {
                Some((p, ..)) => {
                    if !p.request_names.contains(&request) {
                        p.request_names.push(request);
                    }
                }
                None => wanted.push((
                    Prepared {
                        request_names: vec![request],
                        pool: res.pool.clone(),
                        device: res.device.clone(),
                        cdi_device_ids: vec![names::claim_cdi_id(&self.driver, &r.uid, &cdi_name)],
                        admin_access: admin,
                        share_id,
                        identity: Some(identity),
                        usage,
                    },
                    dev,
                    names::claim_device_name(&r.uid, &cdi_name),
                    env,
                )),
            }
        }
        let devices: Vec<Prepared> = wanted.iter().map(|(p, ..)| p.clone()).collect();
        let spec_path = self.spec_path(&r.uid);
        let state_err = |e: std::io::Error| {
            format!(
                "{r}: cannot read the claim records in {}: {e}",
                self.state_dir.display()
            )
        };
        let _locked = self.exclusive().map_err(state_err)?;
        let records = self.records().map_err(state_err)?;
        if let Some(rec) = records.get(&r.uid) {
            if let Err(e) = self.check_again(r, rec, &devices) {
                // The old spec names the nodes of what the device was: left in place, it
                // would give them to any container started with the claim's CDI IDs, which
                // kubelet keeps in its checkpoint. The record stays, so the claim unprepares.
                return Err(match std::fs::remove_file(&spec_path) {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => format!(
                        "{e}; its CDI spec {} could not be removed: {err}",
                        spec_path.display()
                    ),
                    _ => e,
                });
            }
            if rec.devices == devices && rec.same_boot(&self.boot_id) && spec_path.exists() {
                return Ok(devices);
            }
        }
        let spec = if wanted.is_empty() {
            None
        } else {
            let chosen: Vec<(&str, &DraDevice, &[String])> = wanted
                .iter()
                .map(|(_, d, name, env)| (name.as_str(), *d, env.as_slice()))
                .collect();
            Some(self.claim_spec(profile, r, &chosen)?)
        };

        for (i, p) in devices.iter().enumerate().filter(|(_, p)| !p.admin_access) {
            let mine = p.identity.as_ref().expect("set above");
            // Everything else prepared on the same physical device: other claims' devices,
            // and this claim's other devices (two shares, or two parts, of one device).
            let mut holders: Vec<(&ClaimRef, &Prepared)> = Vec::new();
            for other in records.values().filter(|o| o.claim.uid != r.uid) {
                let same_boot = other.same_boot(&self.boot_id);
                holders.extend(
                    other
                        .devices
                        .iter()
                        .filter(|d| {
                            !d.admin_access
                                && d.identity.as_ref().is_some_and(|x| x.same(mine, same_boot))
                        })
                        .map(|d| (&other.claim, d)),
                );
            }
            holders.extend(
                devices
                    .iter()
                    .enumerate()
                    .filter(|&(j, d)| {
                        j != i
                            && !d.admin_access
                            && d.identity.as_ref().is_some_and(|x| x.same(mine, true))
                    })
                    .map(|(_, d)| (r, d)),
            );
            let totals = offered
                .iter()
                .find(|o| o.name == p.device)
                .map(|o| o.totals(profile))
                .unwrap_or_default();
            check_holders(r, p, &holders, &totals)?;
        }
        if let Some(spec) = spec {
            let text = serde_json::to_vec_pretty(&spec).map_err(|e| format!("{r}: {e}"))?;
            crate::atomic::make_dirs(&self.cdi_dir)
                .and_then(|()| crate::atomic::replace(&spec_path, &text, 0o644))
                .map_err(|e| {
                    format!(
                        "{r}: cannot write the CDI spec {}: {e}",
                        spec_path.display()
                    )
                })?;
        }
        let record = Record {
            claim: r.clone(),
            devices: devices.clone(),
            boot_id: Some(self.boot_id.clone()),
        };
        let rec_path = self.record_path(&r.uid);
        let text = serde_json::to_vec(&record).map_err(|e| format!("{r}: {e}"))?;
        if let Err(e) = crate::atomic::replace(&rec_path, &text, 0o600) {
            let _ = std::fs::remove_file(&spec_path);
            return Err(format!(
                "{r}: cannot write the claim record {}: {e}",
                rec_path.display()
            ));
        }
        Ok(devices)
    }

    /// A claim prepared before (a record of `r`) is prepared again: each device it was
    /// allocated must still be the device the record names, by [`Identity::same`] (across a
    /// reboot only the PCI function can say so). Otherwise the name has come to stand for
    /// another device (a card gone and the driver reloaded): refused, naming both.
    fn check_again(&self, r: &ClaimRef, rec: &Record, devices: &[Prepared]) -> Result<(), String> {
        let same_boot = rec.same_boot(&self.boot_id);
        for p in devices {
            let Some(was) = rec
                .devices
                .iter()
                .find(|d| d.device == p.device)
                .and_then(|d| d.identity.as_ref())
            else {
                continue;
            };
            let now = p.identity.as_ref().expect("set by prepare");
            if !was.same(now, same_boot) {
                return Err(format!(
                    "{r}: device {} was prepared for it as {was}{} and is now {now}: not the same device; nothing prepared (delete the pod to release the claim)",
                    p.device,
                    if same_boot { "" } else { " in an earlier boot" }
                ));
            }
        }
        Ok(())
    }

    /// The claim's CDI spec: `accel-ctk cdi generate`'s edits of the chosen devices under
    /// the claim's names, the shared edits (control nodes, libraries, binaries) once. Every
    /// node the spec names is checked to be a character device on the host now.
    fn claim_spec(
        &self,
        profile: &Profile,
        r: &ClaimRef,
        chosen: &[(&str, &DraDevice, &[String])],
    ) -> Result<Spec, String> {
        let full = crate::cdi::generate::generate(
            profile,
            &crate::cdi::generate::Options {
                capabilities: None,
                library_dir: self.library_dir.clone(),
            },
        )
        .map_err(|e| format!("{r}: {e}"))?;
        let mut devices = Vec::new();
        for (cdi_name, d, env) in chosen {
            // By the name that stays the device's: the table may be a poll older than the
            // spec just generated, and an index may have moved in between.
            let g = full
                .devices
                .iter()
                .find(|g| g.name == d.dev.name)
                .ok_or_else(|| format!("{r}: device {} is no longer found on this node", d.name))?;
            for n in &g.container_edits.device_nodes {
                let host = n.host_path.as_deref().unwrap_or(&n.path);
                if let Some(p) = char_problem(Path::new(host), None, &[]) {
                    return Err(format!(
                        "{r}: device {}: {host}: {p}; nothing prepared (kubelet retries)",
                        d.name
                    ));
                }
            }
            let mut edits = g.container_edits.clone();
            edits.env.extend(env.iter().cloned());
            devices.push(CdiDevice {
                name: cdi_name.to_string(),
                container_edits: edits,
                ..CdiDevice::default()
            });
        }
        let mut spec = Spec {
            cdi_version: String::new(),
            kind: names::claim_kind(&self.driver),
            devices,
            container_edits: full.container_edits,
            ..Spec::default()
        };
        spec = self.host_root.spec(spec);
        spec.cdi_version = spec.minimum_version().to_string();
        spec.validate()
            .map_err(|e| format!("{r}: the claim's CDI spec is invalid: {e}"))?;
        Ok(spec)
    }

    /// Unprepares claim `uid`: its spec and record removed. Unknown claims are success.
    pub fn unprepare(&self, uid: &str) -> Result<(), String> {
        if !names::valid_uid(uid) {
            return Err(format!("claim UID {uid:?} is not a UID"));
        }
        let _locked = self.exclusive().map_err(|e| {
            format!(
                "cannot lock the claim records in {}: {e}",
                self.state_dir.display()
            )
        })?;
        for path in [self.spec_path(uid), self.record_path(uid)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
            }
        }
        Ok(())
    }
}

/// Says once per process that the record at `path` is not trusted (every call reads the
/// records again).
fn ignored_once(driver: &str, path: &Path) {
    use std::sync::Mutex;
    static SAID: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    if SAID
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_path_buf())
    {
        log::warn!(
            "{driver}: ignoring claim record {} (unreadable, not ours, writable by others, or over {MAX_RECORD} bytes)",
            path.display()
        );
    }
}

/// `major:minor` of a device number.
fn rdev(r: u64) -> String {
    format!("{}:{}", nix::sys::stat::major(r), nix::sys::stat::minor(r))
}

/// What `dev` is now: each node resolved beneath dev-root as the runtime resolves it, with
/// its device number, and discovery's PCI bus id and UUID.
pub fn identity_of(profile: &Profile, dev: &DraDevice) -> Result<Identity, String> {
    let root = crate::discovery::DevRoot::new(profile);
    let mut rdevs = Vec::new();
    for n in &dev.dev.nodes {
        let (_, st) = root.host_node(&n.path, true).map_err(|e| e.to_string())?;
        rdevs.push(rdev(st.st_rdev));
    }
    Ok(Identity {
        rdevs,
        pci_bus_id: dev.dev.pci_bus_id.clone(),
        uuid: dev.dev.uuid.clone(),
    })
}

/// What allocation result `res` holds of `offer`'s device, and what it was granted (for its
/// containers' variables; `None` for a whole device). Refuses what cannot be a right
/// allocation: a share of a device not published as shareable, a shareable device without
/// its share, consumption of a capacity the device does not have or past its total.
fn usage_of(
    profile: &Profile,
    offer: &Offer,
    res: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
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
            let totals = offer.totals(profile);
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
            match kind {
                Kind::Partition { .. } => {
                    let sharing = profile.sharing.as_ref().expect("a partition has sharing");
                    Ok((
                        Usage::Partition {
                            slices: offer.slices(sharing).collect(),
                        },
                        Some(offer.partition_grant()),
                    ))
                }
                _ => Ok((Usage::Whole, None)),
            }
        }
    }
}

/// Whether `p` may be prepared beside `holders` (everything else prepared on its physical
/// device): a whole device beside nothing, a partition beside partitions it does not
/// overlap, a share beside shares while every capacity's sum stays within its total.
fn check_holders(
    r: &ClaimRef,
    p: &Prepared,
    holders: &[(&ClaimRef, &Prepared)],
    totals: &BTreeMap<String, u64>,
) -> Result<(), String> {
    let mine = p.identity.as_ref().expect("set by prepare");
    let refuse = |other: &ClaimRef, d: &Prepared, how: &str| {
        let as_named = if d.device == p.device {
            String::new()
        } else {
            format!(" (as {})", d.device)
        };
        Err(format!(
            "{r}: device {} ({mine}) is prepared for {other}{as_named} already{how}",
            p.device
        ))
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
                    return refuse(other, d, ", on the same part of it");
                }
            }
            _ => return refuse(other, d, ""),
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
                return Err(format!(
                    "{r}: device {} ({mine}): {k} {} with the {sharing} share(s) prepared on it ({}) is past its total {}: a wrong allocation; nothing prepared",
                    p.device,
                    q(want),
                    q(held),
                    q(*total)
                ));
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
/// a partition, only for what the profile gives containers a variable for.
fn limited(
    profile: &Profile,
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
    let templates: Vec<&String> = profile
        .sharing
        .as_ref()
        .map(|s| s.env.values().collect())
        .unwrap_or_default();
    let told = |what: &str| templates.iter().any(|t| t.contains(&format!("{{{what}")));
    if let Some(m) = &limits.memory {
        let n = crate::quantity::parse(m).map_err(|e| format!("limits.memory: {e}"))?;
        if !told("memory") {
            return Err(format!(
                "limits.memory: profile {} gives containers no memory limit to set",
                profile.name
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
                profile.name
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
