//! What one poll of a profile found: its devices, each with its identity, health and the
//! readings its sources gave, and the failures of those sources. Pure data: the poll
//! ([`super::poll`]) makes it, the collector ([`super::collect`]) renders it.

use crate::exporter::sources::profile::MetricKind;

/// One number of one device, in the base unit of its metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub kind: MetricKind,
    /// The sensor, clock or error kind where the metric has one.
    pub label: Option<String>,
    pub value: f64,
}

/// One device as exported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Device {
    /// The device table's stable name (`NodeDevice::name`): the `device` label.
    pub name: String,
    pub index: u32,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub minor: Option<u32>,
    pub model: Option<String>,
    /// The device plugin's ID for it (`GPU-<uuid>`, `GCU-0`), where the profile names one.
    pub plugin_id: Option<String>,
    /// Its name in the DRA driver's ResourceSlice (`gpu-0`).
    pub dra_name: String,
    /// The names of its shares and parts in the ResourceSlice (`gcu-3-shared`,
    /// `gcu-3-half-1`), where its profile shares devices: a claim on one holds this device.
    pub dra_offers: Vec<String>,
    /// By the daemons' health engine ([`crate::health`]), with why not.
    pub healthy: bool,
    pub problem: Option<crate::health::Reason>,
    /// Since when it has been unhealthy (kept through a change of reason and the hold-down).
    pub since: Option<std::time::SystemTime>,
    pub readings: Vec<Reading>,
}

/// Why a source gave no value: counted in `accel_exporter_source_errors_total` by
/// (profile, source, metric, reason); `detail` goes to the log only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `files`, `nvml`, `command <binary>`, `discovery`, `poll`.
    pub source: String,
    /// The metric the source was to give (`-` where the failure is the whole source's).
    pub metric: String,
    /// One of a few words: `missing`, `not-a-file`, `too-large`, `unreadable`, `parse`,
    /// `no-value`, `timeout`, `exit-status`, `not-found`, `hung`, ...
    pub reason: &'static str,
    pub detail: String,
}

impl Failure {
    pub fn new(
        source: impl Into<String>,
        metric: Option<MetricKind>,
        reason: &'static str,
        detail: impl Into<String>,
    ) -> Failure {
        Failure {
            source: source.into(),
            metric: metric.map_or_else(|| "-".to_string(), metric_key),
            reason,
            detail: detail.into(),
        }
    }
}

/// A metric's profile key (`memory-used`), as labels and messages name it.
pub fn metric_key(kind: MetricKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// One profile at its last poll.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileSnapshot {
    pub profile: String,
    pub driver_version: Option<String>,
    /// The device plugin's resources of this profile (`resource-name`, `shared-resource-name`).
    pub resources: Vec<String>,
    /// The DRA driver's name for this profile, where it has one.
    pub dra_driver: Option<String>,
    pub devices: Vec<Device>,
    /// How long the poll took, in seconds.
    pub poll_seconds: f64,
}
