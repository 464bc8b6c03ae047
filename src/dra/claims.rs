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

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use crate::cdi::model::{Device as CdiDevice, Spec};
use crate::kubelet::host_root::HostRoot;
use crate::kubelet::inventory::{char_problem, node_problem};
use crate::profile::Profile;

use super::names;
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
}

/// What is kept on disk per prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub claim: ClaimRef,
    pub devices: Vec<Prepared>,
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
    records: Mutex<HashMap<String, Record>>,
}

impl Claims {
    /// The driver's claims, with the records a previous run left in `state_dir`. A record
    /// not owned by this user or writable by others is not trusted (skipped, and said so).
    pub fn open(
        driver: String,
        pool: String,
        cdi_dir: PathBuf,
        state_dir: PathBuf,
        library_dir: PathBuf,
        host_root: HostRoot,
    ) -> std::io::Result<Claims> {
        std::fs::create_dir_all(&state_dir)?;
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700))?;
        let mut records = HashMap::new();
        let me = nix::unistd::geteuid().as_raw();
        for entry in std::fs::read_dir(&state_dir)? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let trusted = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.is_file() && m.uid() == me && m.mode() & 0o022 == 0);
            let record = trusted
                .then(|| std::fs::read(&path).ok())
                .flatten()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
                .filter(|r| {
                    names::valid_uid(&r.claim.uid)
                        && path.file_stem().is_some_and(|s| s == r.claim.uid.as_str())
                });
            match record {
                Some(r) => {
                    records.insert(r.claim.uid.clone(), r);
                }
                None => log::info!(
                    "{driver}: ignoring claim record {} (unreadable, not ours, or writable by others)",
                    path.display()
                ),
            }
        }
        Ok(Claims {
            driver,
            pool,
            cdi_dir,
            state_dir,
            library_dir,
            host_root,
            records: Mutex::new(records),
        })
    }

    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(names::claim_spec_file(&self.driver, uid))
    }

    fn record_path(&self, uid: &str) -> PathBuf {
        self.state_dir.join(format!("{uid}.json"))
    }

    /// The UIDs of the claims prepared now.
    pub fn prepared(&self) -> BTreeSet<String> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
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
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .map(|d| d.results.as_deref().unwrap_or_default())
            .ok_or_else(|| format!("{r}: not allocated"))?;
        let mut wanted: Vec<(Prepared, &DraDevice)> = Vec::new();
        for res in results.iter().filter(|x| x.driver == self.driver) {
            if res.pool != self.pool {
                return Err(format!(
                    "{r}: device {} is from pool {:?}, this node's pool is {:?}",
                    res.device, res.pool, self.pool
                ));
            }
            let dev = table.iter().find(|d| d.name == res.device).ok_or_else(|| {
                format!(
                    "{r}: device {} is not one of this node's {} devices",
                    res.device, self.driver
                )
            })?;
            if let Some(p) = node_problem(profile, &dev.dev) {
                return Err(format!(
                    "{r}: device {}: {p}; nothing prepared (kubelet retries)",
                    res.device
                ));
            }
            let request = res
                .request
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string();
            let admin = res.admin_access.unwrap_or(false);
            match wanted.iter_mut().find(|(p, _)| p.device == res.device) {
                Some((p, _)) => {
                    if !p.request_names.contains(&request) {
                        p.request_names.push(request);
                    }
                }
                None => wanted.push((
                    Prepared {
                        request_names: vec![request],
                        pool: res.pool.clone(),
                        device: res.device.clone(),
                        cdi_device_ids: vec![names::claim_cdi_id(
                            &self.driver,
                            &r.uid,
                            &res.device,
                        )],
                        admin_access: admin,
                        share_id: res.share_id.clone(),
                    },
                    dev,
                )),
            }
        }
        let devices: Vec<Prepared> = wanted.iter().map(|(p, _)| p.clone()).collect();
        let spec_path = self.spec_path(&r.uid);
        if self
            .lock()
            .get(&r.uid)
            .is_some_and(|rec| rec.devices == devices)
            && spec_path.exists()
        {
            return Ok(devices);
        }
        let spec = if wanted.is_empty() {
            None
        } else {
            let chosen: Vec<&DraDevice> = wanted.iter().map(|(_, d)| *d).collect();
            Some(self.claim_spec(profile, r, &chosen)?)
        };

        let mut records = self.lock();
        for p in devices.iter().filter(|p| !p.admin_access) {
            if let Some(other) = records.values().find(|o| {
                o.claim.uid != r.uid
                    && o.devices
                        .iter()
                        .any(|d| d.device == p.device && !d.admin_access && d.share_id.is_none())
            }) {
                return Err(format!(
                    "{r}: device {} is prepared for {} already",
                    p.device, other.claim
                ));
            }
        }
        if let Some(spec) = spec {
            let text = serde_json::to_vec_pretty(&spec).map_err(|e| format!("{r}: {e}"))?;
            std::fs::create_dir_all(&self.cdi_dir)
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
        records.insert(r.uid.clone(), record);
        Ok(devices)
    }

    /// The claim's CDI spec: `accel-ctk cdi generate`'s edits of the chosen devices under
    /// the claim's names, the shared edits (control nodes, libraries, binaries) once. Every
    /// node the spec names is checked to be a character device on the host now.
    fn claim_spec(
        &self,
        profile: &Profile,
        r: &ClaimRef,
        chosen: &[&DraDevice],
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
        for d in chosen {
            let index = d.dev.index.to_string();
            let g = full
                .devices
                .iter()
                .find(|g| g.name == index)
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
            devices.push(CdiDevice {
                name: format!("{}-{}", r.uid, d.name),
                container_edits: g.container_edits.clone(),
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
        let mut records = self.lock();
        for path in [self.spec_path(uid), self.record_path(uid)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
            }
        }
        records.remove(uid);
        Ok(())
    }
}
