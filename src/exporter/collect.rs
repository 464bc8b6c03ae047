//! What a scrape renders: the last snapshot of every profile, the last PodResources answer
//! (its holders only while younger than their maximum age, [`State::holders`]) and the error
//! counts, as metric families built afresh at each scrape (so a device or pod
//! that is gone leaves no stale series). Nothing here reads a file, calls a library or runs a
//! program.
//!
//! Families and their units (docs/exporter.md has the table): `accel_device_info`,
//! `accel_device_healthy`, `accel_device_holder_info`, one family per reading kind
//! ([`family`]), and the exporter's own `accel_exporter_*`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::exporter::sources::profile::MetricKind;

use super::attribution::{holder_labels, pod_labels, Holders};
use super::snapshot::{Device, Failure, ProfileSnapshot};

/// A family: name (before unit and `_total`), help, unit, type, and the name of its label.
pub type Family = (
    &'static str,
    &'static str,
    Option<Unit>,
    MetricType,
    Option<&'static str>,
);

/// A reading kind's family.
pub fn family(kind: MetricKind) -> Option<Family> {
    use MetricKind::*;
    use MetricType::{Counter, Gauge};
    let ratio = || Some(Unit::Other("ratio".into()));
    Some(match kind {
        Utilization => (
            "accel_utilization",
            "Share of time the device was busy",
            ratio(),
            Gauge,
            None,
        ),
        MemoryUtilization => (
            "accel_memory_utilization",
            "Share of time the device's memory was being read or written",
            ratio(),
            Gauge,
            None,
        ),
        MemoryUsed => (
            "accel_memory_used",
            "Device memory in use",
            Some(Unit::Bytes),
            Gauge,
            None,
        ),
        MemoryTotal => (
            "accel_memory_total",
            "Device memory installed",
            Some(Unit::Bytes),
            Gauge,
            None,
        ),
        Temperature => (
            "accel_temperature",
            "Temperature, by sensor",
            Some(Unit::Celsius),
            Gauge,
            Some("sensor"),
        ),
        Power => (
            "accel_power",
            "Power drawn",
            Some(Unit::Other("watts".into())),
            Gauge,
            None,
        ),
        PowerLimit => (
            "accel_power_limit",
            "Power limit in force",
            Some(Unit::Other("watts".into())),
            Gauge,
            None,
        ),
        Energy => (
            "accel_energy",
            "Energy consumed since the driver's counter started",
            Some(Unit::Joules),
            Counter,
            None,
        ),
        Clock => (
            "accel_clock",
            "Clock frequency, by clock",
            Some(Unit::Other("hertz".into())),
            Gauge,
            Some("clock"),
        ),
        Errors => (
            "accel_errors",
            "Errors the device counted, by kind",
            None,
            Counter,
            Some("kind"),
        ),
        MemoryUsedRatio => return None,
    })
}

/// Every kind that has a family, in the order they are rendered.
const KINDS: [MetricKind; 10] = [
    MetricKind::Utilization,
    MetricKind::MemoryUtilization,
    MetricKind::MemoryUsed,
    MetricKind::MemoryTotal,
    MetricKind::Temperature,
    MetricKind::Power,
    MetricKind::PowerLimit,
    MetricKind::Energy,
    MetricKind::Clock,
    MetricKind::Errors,
];

/// The error counter's key: (profile, source, metric, reason).
pub type ErrorKey = (String, String, String, &'static str);

/// kubelet's last answer, which the holder labels come from.
#[derive(Debug, Default)]
pub struct Attribution {
    pub holders: Arc<Holders>,
    /// When `List` last answered; `None` before it ever has.
    pub answered: Option<Instant>,
    /// The last `List` failed: `holders` are an earlier answer's.
    pub failed: bool,
}

/// The holders a scrape labels devices with, and how current they are.
#[derive(Debug)]
pub struct Current {
    /// The last answer's, or none where it is older than the maximum age.
    pub holders: Arc<Holders>,
    /// Since the last answer.
    pub age: Option<Duration>,
    /// Not the last `List`'s: it failed, or its answer is past the maximum age.
    pub stale: bool,
    /// Past the maximum age: the labels are dropped.
    pub expired: bool,
}

/// Everything a scrape renders, written by the pollers.
#[derive(Debug, Default)]
pub struct State {
    /// By profile name.
    pub profiles: RwLock<BTreeMap<String, Arc<ProfileSnapshot>>>,
    pub attribution: RwLock<Attribution>,
    /// How old an answer's holders may be and still label devices: a device since given to
    /// another pod must not keep the first one's labels while kubelet does not answer.
    /// `None`: until the next answer.
    pub holders_max_age: Option<Duration>,
    pub errors: Mutex<BTreeMap<ErrorKey, u64>>,
    pub polls: Mutex<BTreeMap<String, u64>>,
    /// PodResources: whether the last `List` answered, and failures by reason.
    pub pod_resources_up: Mutex<Option<bool>>,
    pub pod_resources_errors: Mutex<BTreeMap<&'static str, u64>>,
}

impl State {
    /// Counts `failed` for `profile`; each (source, metric, reason) first seen is logged.
    pub fn count(&self, profile: &str, failed: &[Failure]) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        for f in failed {
            let key = (
                profile.to_string(),
                f.source.clone(),
                f.metric.clone(),
                f.reason,
            );
            let n = errors.entry(key).or_insert(0);
            if *n == 0 {
                log::warn!(
                    "{profile}: {} {}: {} ({}); counted in accel_exporter_source_errors_total, said once",
                    f.source,
                    f.metric,
                    f.detail,
                    f.reason
                );
            }
            *n += 1;
        }
    }

    pub fn polled(&self, snap: ProfileSnapshot) {
        *self
            .polls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(snap.profile.clone())
            .or_insert(0) += 1;
        self.profiles
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(snap.profile.clone(), Arc::new(snap));
    }

    /// Drops `profile`'s readings (its poll hangs): the devices stay, their values go.
    pub fn stale(&self, profile: &str) {
        let mut all = self.profiles.write().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = all.get_mut(profile) {
            if p.devices.iter().any(|d| !d.readings.is_empty()) {
                let mut s = (**p).clone();
                for d in &mut s.devices {
                    d.readings.clear();
                }
                *p = Arc::new(s);
            }
        }
    }

    /// A state whose holders label devices for at most `max_age` after kubelet's answer.
    pub fn new(holders_max_age: Duration) -> State {
        State {
            holders_max_age: Some(holders_max_age),
            ..State::default()
        }
    }

    /// The holders as of now: none past their maximum age.
    pub fn holders(&self) -> Current {
        let a = self.attribution.read().unwrap_or_else(|e| e.into_inner());
        let age = a.answered.map(|t| t.elapsed());
        let expired = matches!((age, self.holders_max_age), (Some(age), Some(max)) if age > max);
        Current {
            holders: if expired {
                Arc::default()
            } else {
                Arc::clone(&a.holders)
            },
            age,
            stale: a.failed || expired,
            expired,
        }
    }

    pub fn pod_resources(&self, result: Result<Holders, &'static str>) {
        let ok = result.is_ok();
        match result {
            Ok(h) => {
                *self.attribution.write().unwrap_or_else(|e| e.into_inner()) = Attribution {
                    holders: Arc::new(h),
                    answered: Some(Instant::now()),
                    failed: false,
                }
            }
            Err(reason) => {
                self.attribution
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .failed = true;
                *self
                    .pod_resources_errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(reason)
                    .or_insert(0) += 1;
            }
        }
        *self
            .pod_resources_up
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(ok);
    }
}

/// The collector a scrape runs: `State` rendered.
#[derive(Debug, Clone)]
pub struct Exposition(pub Arc<State>);

type Labels = Vec<(&'static str, String)>;

/// A device's identity labels.
fn identity(p: &ProfileSnapshot, d: &Device) -> Labels {
    let mut l = vec![("profile", p.profile.clone()), ("device", d.name.clone())];
    if let Some(u) = &d.uuid {
        l.push(("uuid", u.clone()));
    }
    if let Some(b) = &d.pci_bus_id {
        l.push(("pci_bus_id", b.clone()));
    }
    if let Some(m) = &d.model {
        l.push(("model", m.clone()));
    }
    if let Some(v) = &p.driver_version {
        l.push(("driver_version", v.clone()));
    }
    l
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: &[(Labels, f64)],
) -> Result<(), std::fmt::Error> {
    series(enc, name, help, unit, MetricType::Gauge, rows)
}

fn series(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    kind: MetricType,
    rows: &[(Labels, f64)],
) -> Result<(), std::fmt::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, unit, kind)?;
    for (labels, v) in rows {
        let mut s = m.encode_family(labels)?;
        match kind {
            MetricType::Counter => {
                s.encode_counter::<NoLabelSet, f64, f64>(v, None::<&Exemplar<NoLabelSet, f64>>)?
            }
            _ => s.encode_gauge(v)?,
        }
    }
    Ok(())
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let profiles: Vec<Arc<ProfileSnapshot>> = s
            .profiles
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let current = s.holders();
        let holders = &current.holders;
        // Each device's identity and pod labels, once.
        let mut devices: Vec<(&ProfileSnapshot, &Device, Labels, Labels)> = Vec::new();
        let mut held: Vec<(Labels, f64)> = Vec::new();
        for p in &profiles {
            for d in &p.devices {
                let id = identity(p, d);
                let hs = holders.of(p, d);
                for h in &hs {
                    let mut l = vec![("profile", p.profile.clone()), ("device", d.name.clone())];
                    l.extend(holder_labels(h));
                    held.push((l, 1.0));
                }
                let mut full = id.clone();
                full.extend(pod_labels(&hs));
                devices.push((p, d, id, full));
            }
        }
        let info: Vec<(Labels, f64)> = devices
            .iter()
            .map(|(_, _, id, _)| (id.clone(), 1.0))
            .collect();
        gauge(
            &mut enc,
            "accel_device_info",
            "A device the exporter knows of, with its identity",
            None,
            &info,
        )?;
        let mut since: Vec<(Labels, f64)> = Vec::new();
        let health: Vec<(Labels, f64)> = devices
            .iter()
            .map(|(_, d, _, full)| {
                let mut l = full.clone();
                // The short name, as the DRA taint's value: a label whose values are few (the
                // whole line, with its counts, would make a series per count).
                if let Some(why) = &d.problem {
                    l.push(("reason", why.label()));
                }
                if let Some(t) = d.since {
                    let secs = t
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    since.push((l.clone(), secs as f64));
                }
                (l, if d.healthy { 1.0 } else { 0.0 })
            })
            .collect();
        gauge(
            &mut enc,
            "accel_device_healthy",
            "1 when the device can be handed to a container (the health engine: nodes, PCI function, AER, RAS, NVML), 0 with the reason",
            None,
            &health,
        )?;
        // A time, not an age: it stays the same while the device does, and `time() - ...`
        // gives the age in a query.
        gauge(
            &mut enc,
            "accel_device_unhealthy_since",
            "Since when the device has been unhealthy, in seconds since the Unix epoch; only while it is",
            Some(&Unit::Seconds),
            &since,
        )?;
        gauge(
            &mut enc,
            "accel_device_holder_info",
            "A container holding the device: a device plugin allocation or a DRA claim",
            None,
            &held,
        )?;
        for kind in KINDS {
            let Some((name, help, unit, mtype, label)) = family(kind) else {
                continue;
            };
            let mut rows: Vec<(Labels, f64)> = Vec::new();
            for (_, d, _, full) in &devices {
                for r in d.readings.iter().filter(|r| r.kind == kind) {
                    let mut l = full.clone();
                    if let (Some(key), Some(v)) = (label, &r.label) {
                        l.push((key, v.clone()));
                    }
                    rows.push((l, r.value));
                }
            }
            series(&mut enc, name, help, unit.as_ref(), mtype, &rows)?;
        }
        // The exporter's own.
        let errors: Vec<(Labels, f64)> = s
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((p, src, m, r), n)| {
                (
                    vec![
                        ("profile", p.clone()),
                        ("source", src.clone()),
                        ("metric", m.clone()),
                        ("reason", r.to_string()),
                    ],
                    *n as f64,
                )
            })
            .collect();
        series(
            &mut enc,
            "accel_exporter_source_errors",
            "Values a source could not give, by profile, source, metric and reason",
            None,
            MetricType::Counter,
            &errors,
        )?;
        let polls: Vec<(Labels, f64)> = s
            .polls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(p, n)| (vec![("profile", p.clone())], *n as f64))
            .collect();
        series(
            &mut enc,
            "accel_exporter_polls",
            "Polls of a profile's sources completed",
            None,
            MetricType::Counter,
            &polls,
        )?;
        let durations: Vec<(Labels, f64)> = profiles
            .iter()
            .map(|p| (vec![("profile", p.profile.clone())], p.poll_seconds))
            .collect();
        gauge(
            &mut enc,
            "accel_exporter_poll_duration",
            "How long the last poll of a profile's sources took",
            Some(&Unit::Seconds),
            &durations,
        )?;
        if let Some(up) = *s.pod_resources_up.lock().unwrap_or_else(|e| e.into_inner()) {
            gauge(
                &mut enc,
                "accel_exporter_pod_resources_up",
                "1 when kubelet's PodResources answered the last List",
                None,
                &[(Vec::new(), if up { 1.0 } else { 0.0 })],
            )?;
            gauge(
                &mut enc,
                "accel_exporter_pod_resources_stale",
                "1 when the holder labels are not the last List's: kept from an earlier answer until its maximum age, then dropped",
                None,
                &[(Vec::new(), if current.stale { 1.0 } else { 0.0 })],
            )?;
        }
        if let Some(age) = current.age {
            gauge(
                &mut enc,
                "accel_exporter_pod_resources_age",
                "Time since PodResources last answered List (the answer the holder labels come from)",
                Some(&Unit::Seconds),
                &[(Vec::new(), age.as_secs_f64())],
            )?;
        }
        let pr: Vec<(Labels, f64)> = s
            .pod_resources_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(r, n)| (vec![("reason", r.to_string())], *n as f64))
            .collect();
        series(
            &mut enc,
            "accel_exporter_pod_resources_errors",
            "PodResources List calls that failed, by reason",
            None,
            MetricType::Counter,
            &pr,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::proto::podresources::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    };

    /// Issue 41: a device unhealthy has `accel_device_unhealthy_since_seconds` (Unix time, the
    /// same labels as `accel_device_healthy`, its reason's short name among them); a healthy
    /// one has none.
    #[test]
    fn unhealthy_since_is_exported_only_while_unhealthy() {
        use crate::health::{Kind, Problem, Reason};
        let s = Arc::new(State::default());
        let at = std::time::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let sick = Device {
            name: "1".into(),
            healthy: false,
            problem: Reason::new(vec![Problem::new(Kind::AerFatal, "1 fatal")]),
            since: Some(at),
            ..Device::default()
        };
        let well = Device {
            name: "0".into(),
            healthy: true,
            ..Device::default()
        };
        s.polled(ProfileSnapshot {
            profile: "enflame".into(),
            devices: vec![well, sick],
            ..ProfileSnapshot::default()
        });
        let mut r = prometheus_client::registry::Registry::default();
        r.register_collector(Box::new(Exposition(Arc::clone(&s))));
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &r).unwrap();
        let lines: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with("accel_device_unhealthy_since_seconds{"))
            .collect();
        assert_eq!(lines.len(), 1, "{page}");
        assert!(
            lines[0].contains("device=\"1\"") && lines[0].contains("reason=\"aer-fatal\""),
            "{page}"
        );
        assert!(lines[0].ends_with(" 1790000000.0"), "{page}");
        assert!(
            page.contains("# UNIT accel_device_unhealthy_since_seconds seconds"),
            "{page}"
        );
    }

    /// Issue 42 item 8: the last answer's holders are kept, marked stale, while `List` fails,
    /// and dropped past their maximum age; the next answer is current again.
    #[test]
    fn holders_are_stale_after_a_failure_and_gone_past_their_age() {
        let answer = Holders::from_list(&ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "n".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "example.com/gpu".into(),
                        device_ids: vec!["GPU-0".into()],
                        topology: None,
                    }],
                    dynamic_resources: vec![],
                }],
            }],
        });
        let s = State::new(Duration::from_millis(200));
        s.pod_resources(Ok(answer.clone()));
        let now = s.holders();
        assert!(!now.stale && !now.expired && now.holders.count == 1);
        s.pod_resources(Err("unreachable"));
        let now = s.holders();
        assert!(
            now.stale && !now.expired && now.holders.count == 1,
            "{now:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
        let now = s.holders();
        assert!(
            now.stale && now.expired && now.holders.count == 0,
            "{now:?}"
        );
        assert!(now.age.is_some_and(|a| a >= Duration::from_millis(250)));
        s.pod_resources(Ok(answer));
        let now = s.holders();
        assert!(!now.stale && now.holders.count == 1);
        // Without a maximum age (a state built for tests), kept until the next answer.
        let s = State::default();
        s.pod_resources(Ok(Holders::default()));
        s.pod_resources(Err("timeout"));
        assert!(s.holders().stale && !s.holders().expired);
    }
}
