//! Preparing and unpreparing claims: the devices a claim's allocation gives this driver are
//! checked on the host now (every node a character device with the driver's major: a spec
//! written before the nodes exist is the bad cached spec of NVIDIA's driver issue #1380), a
//! per-claim CDI spec with the edits `accel-ctk cdi generate` writes is put in place
//! atomically, then a per-claim record on disk, so a claim prepared before a restart is
//! unprepared after it. Unpreparing removes both; an unknown claim is already unprepared.
//!
//! A prepare is a few named steps: the claim's allocation, what the host says of its devices
//! now (their nodes, what each is), the lock, the records, the decision ([`decide`]: pure,
//! where every reason to refuse is), the writes (the spec, then the record).
//!
//! A failed prepare leaves nothing behind and caches nothing: kubelet retries, and the retry
//! looks at the host afresh. A record whose spec file is gone (a reboot emptied a tmpfs
//! `/var/run/cdi`) is prepared again rather than answered from the record.
//!
//! A device is what it is, not the name it goes by: each record keeps, per device, what the
//! device was when prepared ([`Identity`]: its nodes' device numbers, PCI bus id, UUID) and
//! the boot it was prepared in, which [`decide`] compares. A claim prepared again whose
//! device is no longer the one its record names is refused, and nothing of the old record is
//! reused: its CDI spec is removed (the record stays, so the claim still unprepares).
//! Records written before identities were kept have theirs read back from the device nodes
//! their CDI spec gave the container.
//!
//! Nothing is kept in memory across calls: every prepare and unprepare takes an exclusive
//! lock on the state directory and reads the records there, so two instances of the driver
//! (the old and the new pod of a rolling update, each registered with kubelet, which may call
//! either) decide on the same records, and neither gives a device another has given.

use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, DeviceRequestAllocationResult, ResourceClaim,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::cdi::model::{Device as CdiDevice, Spec};
use crate::kubelet::host_root::HostRoot;
use crate::kubelet::inventory::{char_problem, node_problem};
use crate::kubelet::sharing::Sharing;
use crate::profile::Profile;

use super::decide::{decide, Claim, Facts, Health, Node, OnDisk, Plan, Refusal, SpecDevice};
pub use super::decide::{
    ClaimRef, Identity, Prepared, Record, Usage, CONFIG_API_VERSION, CONFIG_KIND,
};
use super::names;
use super::offers::{self, Offer};
use super::table::DraDevice;

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
    /// Each device's health at the driver's last check, by its name in the slice: what the
    /// decision is told. A device not in it is healthy to the decision.
    health: std::sync::RwLock<BTreeMap<String, Health>>,
    /// Where a share's or part's memory is kept by pod for the shim and the NRI plugin
    /// (`<dir>/<pod uid>/<claim uid>.json`, src/dmem.rs), and the cgroup v2 root whose
    /// `dmem.capacity` says which devices the kernel can hold to it. `None`: not kept.
    dmem: Option<(PathBuf, PathBuf)>,
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
            health: std::sync::RwLock::default(),
            dmem: None,
        })
    }

    /// Keeps each prepared share's and part's memory by pod under `grants_dir`, for the
    /// devices `cgroup_root`'s `dmem.capacity` lists a memory region of (src/dmem.rs).
    pub fn with_dmem(mut self, grants_dir: PathBuf, cgroup_root: PathBuf) -> Claims {
        self.dmem = Some((grants_dir, cgroup_root));
        self
    }

    /// Takes each device's health (by its name in the slice) from the driver's last check.
    pub fn set_health(&self, health: BTreeMap<String, Health>) {
        *self.health.write().unwrap_or_else(|e| e.into_inner()) = health;
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
    ///
    /// In named steps: the claim's allocation, what the host says of its devices, the lock,
    /// the records, the decision ([`decide`]), the writes.
    pub fn prepare(
        &self,
        profile: &Profile,
        sharing: Option<&Sharing>,
        table: &[DraDevice],
        r: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Vec<Prepared>, String> {
        let (results, configs) = allocation(r, claim)?;
        let offered = offers::offers(sharing, table);
        let facts = self.facts(profile, &offered, results);
        let state_err = |e: std::io::Error| {
            format!(
                "{r}: cannot read the claim records in {}: {e}",
                self.state_dir.display()
            )
        };
        let _locked = self.exclusive().map_err(state_err)?;
        let records = self.records().map_err(state_err)?;
        let spec_path = self.spec_path(&r.uid);
        let plan = decide(
            Claim {
                claim: r,
                results,
                configs,
            },
            Node {
                driver: &self.driver,
                pool: &self.pool,
                profile,
                offers: &offered,
                facts: &facts,
                boot_id: &self.boot_id,
            },
            OnDisk {
                records: &records,
                spec_in_place: spec_path.exists(),
            },
        )
        .map_err(|refusal| self.refused(&refusal, &spec_path))?;
        if plan.write {
            // The grants first: a prepare that fails leaves nothing, and one that succeeds
            // never leaves a share's container without its limit.
            let written = self
                .write_grants(r, &pods_of(claim), &plan.spec)
                .and_then(|()| self.write(profile, r, &plan));
            if let Err(e) = written {
                let _ = self.remove_grants(&r.uid);
                return Err(e);
            }
        }
        Ok(plan.devices)
    }

    /// What the host says now of each device of this driver that `results` name: its nodes
    /// checked as the runtime resolves them, what it is, and its health at the driver's last
    /// check ([`Claims::set_health`]).
    fn facts(
        &self,
        profile: &Profile,
        offered: &[Offer],
        results: &[DeviceRequestAllocationResult],
    ) -> BTreeMap<String, Facts> {
        let mut facts = BTreeMap::new();
        let health = self.health.read().unwrap_or_else(|e| e.into_inner());
        for res in results.iter().filter(|x| x.driver == self.driver) {
            let Some(dev) = offered
                .iter()
                .find(|o| o.name == res.device)
                .map(|o| o.parent)
            else {
                continue;
            };
            facts.entry(dev.name.clone()).or_insert_with(|| Facts {
                identity: match node_problem(profile, &dev.dev) {
                    Some(p) => Err(p),
                    None => identity_of(profile, dev),
                },
                health: health.get(&dev.name).cloned().unwrap_or_default(),
            });
        }
        facts
    }

    /// The refusal's line. A claim prepared before whose device is no longer the one it names
    /// loses its CDI spec: the old spec names the nodes of what the device was and, left in
    /// place, would give them to any container started with the claim's CDI IDs, which
    /// kubelet keeps in its checkpoint. The record stays, so the claim unprepares.
    fn refused(&self, refusal: &Refusal, spec_path: &Path) -> String {
        let e = refusal.to_string();
        if !refusal.spec_is_stale() {
            return e;
        }
        match std::fs::remove_file(spec_path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => format!(
                "{e}; its CDI spec {} could not be removed: {err}",
                spec_path.display()
            ),
            _ => e,
        }
    }

    /// Writes what `plan` gives claim `r`: its CDI spec (where it has devices), then its
    /// record; a record that cannot be written takes the spec with it.
    fn write(&self, profile: &Profile, r: &ClaimRef, plan: &Plan) -> Result<(), String> {
        let spec_path = self.spec_path(&r.uid);
        if !plan.spec.is_empty() {
            let spec = self.claim_spec(profile, r, &plan.spec)?;
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
            devices: plan.devices.clone(),
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
        Ok(())
    }

    /// The claim's CDI spec: `accel-ctk cdi generate`'s edits of the chosen devices under
    /// the claim's names, the shared edits (control nodes, libraries, binaries) once. Every
    /// node the spec names is checked to be a character device on the host now.
    fn claim_spec(
        &self,
        profile: &Profile,
        r: &ClaimRef,
        chosen: &[SpecDevice],
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
        for SpecDevice {
            name: cdi_name,
            device: d,
            env,
            ..
        } in chosen
        {
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
                name: cdi_name.clone(),
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

    /// Writes, for each pod the claim is reserved for, what its shares and parts on devices
    /// the kernel can hold to their memory were granted (`<grants dir>/<pod>/<claim>.json`,
    /// root's alone): what the shim and the NRI plugin read for `dmem.max`. Nothing where no
    /// device has a region: a create then finds no directory and reads nothing more.
    fn write_grants(
        &self,
        r: &ClaimRef,
        pods: &[String],
        chosen: &[SpecDevice],
    ) -> Result<(), String> {
        let Some((dir, cgroup_root)) = &self.dmem else {
            return Ok(());
        };
        self.remove_grants(&r.uid)?;
        if chosen.iter().all(|d| d.memory.is_none()) {
            return Ok(());
        }
        let capacity = crate::dmem::read_capacity(cgroup_root);
        let grants: Vec<crate::dmem::Grant> = chosen
            .iter()
            .filter_map(|d| {
                let bus = d.device.dev.pci_bus_id.clone()?;
                let memory = d.memory?;
                (crate::dmem::enforceable(&capacity, &bus) && !d.rdevs.is_empty()).then(|| {
                    crate::dmem::Grant {
                        device: d.name.clone(),
                        bus,
                        rdevs: d.rdevs.clone(),
                        memory,
                    }
                })
            })
            .collect();
        if grants.is_empty() {
            return Ok(());
        }
        for pod in pods {
            let record = crate::dmem::PodGrants {
                pod: pod.clone(),
                claim: r.uid.clone(),
                grants: grants.clone(),
            };
            let path = dir.join(pod).join(format!("{}.json", r.uid));
            let text = serde_json::to_vec(&record).map_err(|e| format!("{r}: {e}"))?;
            crate::atomic::make_dirs(&dir.join(pod))
                .and_then(|()| crate::atomic::replace(&path, &text, 0o644))
                .map_err(|e| {
                    format!(
                        "{r}: cannot write the memory grant {} its container's dmem.max is read from: {e}",
                        path.display()
                    )
                })?;
        }
        Ok(())
    }

    /// Removes claim `uid`'s grants of every pod, and each pod's directory left empty.
    fn remove_grants(&self, uid: &str) -> Result<(), String> {
        let Some((dir, _)) = &self.dmem else {
            return Ok(());
        };
        for pod in crate::dmem::pods_with_grants(dir) {
            let pod_dir = dir.join(&pod);
            let path = pod_dir.join(format!("{uid}.json"));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
            }
            // Fails while another claim's grant is there, as it should.
            let _ = std::fs::remove_dir(&pod_dir);
        }
        Ok(())
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
        self.remove_grants(uid)?;
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

/// The results and configs of `claim`'s allocation, where it is the claim kubelet named
/// (`r`) and allocated.
fn allocation<'c>(
    r: &ClaimRef,
    claim: &'c ResourceClaim,
) -> Result<
    (
        &'c [DeviceRequestAllocationResult],
        &'c [DeviceAllocationConfiguration],
    ),
    String,
> {
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
    Ok((
        allocation.results.as_deref().unwrap_or_default(),
        allocation.config.as_deref().unwrap_or_default(),
    ))
}

/// The UIDs of the pods `claim` is reserved for (`status.reservedFor`, core `pods` only):
/// the pods whose containers get its shares' `dmem.max`. Set by the scheduler before kubelet
/// prepares the claim; a pod reserved later (a claim shared by pods started apart) is not in
/// it: docs/sharing.md says so.
fn pods_of(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map(|r| {
            r.iter()
                .filter(|c| c.resource == "pods" && c.api_group.as_deref().unwrap_or("").is_empty())
                .map(|c| c.uid.clone())
                .filter(|u| crate::dmem::valid_uid(u))
                .collect()
        })
        .unwrap_or_default()
}

/// `major:minor` of a device number.
fn rdev(r: u64) -> String {
    format!("{}:{}", nix::sys::stat::major(r), nix::sys::stat::minor(r))
}

/// What `dev` is now: each node resolved beneath dev-root as the runtime resolves it, with
/// its device number, discovery's PCI bus id and UUID, and where its first node's device sits
/// in sysfs.
pub fn identity_of(profile: &Profile, dev: &DraDevice) -> Result<Identity, String> {
    let root = crate::discovery::DevRoot::new(profile);
    let mut rdevs = Vec::new();
    let mut first = None;
    for n in &dev.dev.nodes {
        let (_, st) = root.host_node(&n.path, true).map_err(|e| e.to_string())?;
        first.get_or_insert(st.st_rdev);
        rdevs.push(rdev(st.st_rdev));
    }
    let sysfs = first.and_then(|r| {
        let root = crate::inroot::Root::open(&profile.driver_root).ok()?;
        crate::topology::sysfs_path_of_char_device(
            &root,
            nix::sys::stat::major(r),
            nix::sys::stat::minor(r),
        )
    });
    Ok(Identity {
        rdevs,
        pci_bus_id: dev.dev.pci_bus_id.clone(),
        uuid: dev.dev.uuid.clone(),
        sysfs,
    })
}
