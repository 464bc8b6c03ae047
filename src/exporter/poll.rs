//! One poll of one profile: its devices as the device plugin and the DRA driver name them
//! (the node's device table), each one's health by the daemons' health engine
//! ([`crate::health`]), and every reading its
//! sources give. Runs off the scrape path, on a thread of its own ([`super::run`]): a poll may
//! block on a slow driver file or wait out a CLI's time limit, a scrape never does.

use std::sync::Arc;
use std::time::Instant;

use crate::exporter::sources::profile::{MetricKind, Metrics};
use crate::health::{Monitor, Settings};
use crate::inroot::Root;
use crate::kubelet::inventory::{self, NodeDevice};
use crate::kubelet::sharing::Sharing;
use crate::profile::{Profile, ProfileError};

use super::snapshot::{Device, Failure, ProfileSnapshot, Reading};
use super::sources::{command, files, nvml::NvmlSource, DeviceRef};

/// The DRA driver's name for `dev` in its ResourceSlice ([`crate::kubelet::names`]), so a
/// claim kubelet reports maps back to the device.
pub fn dra_device_name(profile: &Profile, dev: &NodeDevice) -> String {
    crate::kubelet::names::device_name(profile, &dev.key)
}

/// What polls one profile, with what it keeps between polls (NVML, once loaded).
#[derive(Debug)]
pub struct Poller {
    pub profile: Profile,
    /// The profile's `[metrics]` and `[sharing]`, read once.
    metrics: Option<Metrics>,
    sharing: Option<Sharing>,
    dra_driver: Option<String>,
    nvml: NvmlSource,
    /// The profile's health engine: kept by the loop across pollers, so a poller made
    /// afresh keeps the baselines.
    monitor: Arc<Monitor>,
}

impl Poller {
    /// `dra_driver` overrides the driver name derived from the profile, as the DRA
    /// driver's `--driver-name` does. Fails where the profile's `[metrics]`, `[sharing]` or `[health]`
    /// does not read (loaded with [`crate::profile::Keep::All`]); each key of them it does
    /// not know is warned of in the log.
    pub fn new(profile: Profile, dra_driver: Option<&str>) -> Result<Poller, ProfileError> {
        let (metrics, mut warnings) = Metrics::of(&profile)?;
        let (sharing, more) = Sharing::of(&profile)?;
        warnings.extend(more);
        warnings.extend(crate::health::wing::HealthWing::of(&profile)?.1);
        for w in warnings {
            log::warn!("{w}");
        }
        let dra_driver = crate::kubelet::names::driver_name(&profile, dra_driver).ok();
        Ok(Poller {
            profile,
            metrics,
            sharing,
            dra_driver,
            nvml: NvmlSource::default(),
            monitor: Arc::new(Monitor::new(Settings::default())),
        })
    }

    /// The same poller as new, without what it keeps between polls but its health engine
    /// (whose baselines outlive a poller).
    pub fn fresh(&self) -> Poller {
        Poller {
            profile: self.profile.clone(),
            metrics: self.metrics.clone(),
            sharing: self.sharing.clone(),
            dra_driver: self.dra_driver.clone(),
            nvml: NvmlSource::default(),
            monitor: Arc::clone(&self.monitor),
        }
    }

    /// This poller with `monitor` as its health engine.
    pub fn with_monitor(mut self, monitor: Arc<Monitor>) -> Poller {
        self.monitor = monitor;
        self
    }

    /// The profile's devices with their device plugin IDs: the plugin's own table where
    /// the profile names a resource (its IDs are what kubelet's PodResources reports), else
    /// the node's device table alone.
    fn table(&self, failed: &mut Vec<Failure>) -> Vec<(Option<String>, NodeDevice)> {
        let p = &self.profile;
        if p.resource_name.is_some() {
            match crate::kubelet::ids::discover(p) {
                Ok(t) => return t.into_iter().map(|d| (Some(d.id), d.dev)).collect(),
                Err(crate::kubelet::ids::DevicesError::Discovery(e)) => {
                    failed.push(Failure::new("discovery", None, "unreadable", e.to_string()));
                    return Vec::new();
                }
                // No IDs to attribute device-plugin pods by; the devices are still exported.
                Err(_) => {}
            }
        }
        match inventory::discover(p) {
            Ok(t) => t.into_iter().map(|d| (None, d)).collect(),
            Err(e) => {
                failed.push(Failure::new("discovery", None, "unreadable", e.to_string()));
                Vec::new()
            }
        }
    }

    /// Polls the profile once.
    pub fn poll(&mut self) -> (ProfileSnapshot, Vec<Failure>) {
        let started = Instant::now();
        let p = &self.profile;
        let mut failed = Vec::new();
        let table = self.table(&mut failed);
        // NVML's metrics first, where the profile reads them: the health engine then finds
        // the library initialised and shares it (one nvmlInit in the process). A load that
        // fails is counted once, here; the read below does not try again this poll.
        let mut nvml_failed = false;
        if let Some(cfg) = self.metrics.as_ref().and_then(|m| m.nvml.as_ref()) {
            if !table.is_empty() {
                nvml_failed = !self.nvml.load(p, cfg, &mut failed);
            }
        }
        let subjects: Vec<_> = table.iter().map(|(_, d)| d.subject()).collect();
        let health = self.monitor.check_all(p, &subjects);
        drop(subjects);
        let mut devices: Vec<Device> = table
            .into_iter()
            .zip(health)
            .map(|((plugin_id, d), health)| {
                let healthy = health.is_healthy();
                let problem = health.reason().cloned();
                let since = health.since();
                let dra_name = dra_device_name(p, &d);
                Device {
                    dra_offers: crate::kubelet::names::offer_names(
                        self.sharing.as_ref(),
                        &dra_name,
                    ),
                    dra_name,
                    name: d.name,
                    index: d.index,
                    uuid: d.uuid,
                    pci_bus_id: d.pci_bus_id,
                    minor: d.minor,
                    model: d.model,
                    plugin_id,
                    healthy,
                    problem,
                    since,
                    readings: Vec::new(),
                }
            })
            .collect();
        if let Some(m) = &self.metrics {
            let refs: Vec<DeviceRef<'_>> = devices.iter().map(DeviceRef::from).collect();
            let mut readings: Vec<Vec<Reading>> = vec![Vec::new(); devices.len()];
            if !m.files.is_empty() && !refs.is_empty() {
                match Root::open(&p.driver_root) {
                    Ok(root) => {
                        let mut cache = files::HwmonCache::default();
                        for (d, out) in refs.iter().zip(readings.iter_mut()) {
                            files::read(&root, &m.files, d, &mut cache, out, &mut failed);
                        }
                    }
                    Err(e) => failed.push(Failure::new(
                        "files",
                        None,
                        "unreadable",
                        format!("{}: {e}", p.driver_root.display()),
                    )),
                }
            }
            if let (Some(cfg), false, false) = (&m.nvml, refs.is_empty(), nvml_failed) {
                self.nvml.read(p, cfg, &refs, &mut readings, &mut failed);
            }
            if !refs.is_empty() {
                command::read(p, &m.commands, &refs, &mut readings, &mut failed);
            }
            drop(refs);
            for (d, r) in devices.iter_mut().zip(readings) {
                d.readings = derive(r);
            }
        }
        let snap = ProfileSnapshot {
            profile: p.name.clone(),
            driver_version: crate::discovery::driver_version(p),
            resources: p
                .resource_name
                .iter()
                .chain(&p.shared_resource_name)
                .cloned()
                .collect(),
            dra_driver: self.dra_driver.clone(),
            devices,
            poll_seconds: started.elapsed().as_secs_f64(),
        };
        (snap, failed)
    }
}

/// A device's readings with memory-used-ratio turned into memory-used bytes (where the
/// total is known and no source gave bytes), and one reading per (metric, label): the first
/// source's.
pub fn derive(mut r: Vec<Reading>) -> Vec<Reading> {
    let has = |r: &[Reading], k| r.iter().any(|x| x.kind == k);
    if let Some(ratio) = r.iter().find(|x| x.kind == MetricKind::MemoryUsedRatio) {
        let total = r.iter().find(|x| x.kind == MetricKind::MemoryTotal);
        if let (Some(t), false) = (total, has(&r, MetricKind::MemoryUsed)) {
            let used = Reading {
                kind: MetricKind::MemoryUsed,
                label: None,
                value: (ratio.value * t.value).round(),
            };
            r.push(used);
        }
    }
    r.retain(|x| x.kind != MetricKind::MemoryUsedRatio);
    let mut seen: Vec<(MetricKind, Option<String>)> = Vec::new();
    r.retain(|x| {
        let key = (x.kind, x.label.clone());
        if seen.contains(&key) {
            return false;
        }
        seen.push(key);
        true
    });
    r
}
