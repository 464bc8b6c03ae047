//! Readings from NVIDIA's management library through the `nvml-wrapper` crate. The library
//! is found in driver-root as the runtime finds the driver's libraries (ld.so.cache under the
//! root, then library-search-dirs; every path resolved in the root), opened there, checked a
//! regular file, and loaded through that open file (`/proc/self/fd/N`), so what was checked is
//! what runs; never a name the dynamic loader would look up in this process's own paths.
//! Loaded once, at the first poll that needs it, and again after it failed.
//!
//! A library that lacks a symbol never panics the exporter. nvml-wrapper looks up each
//! function when it is called (a missing one is `FailedToLoadSymbol`: that reading is absent,
//! counted `not-in-library`) except `nvmlShutdown`, which its `Drop` calls unchecked: a panic
//! where it is absent, an abort (exit 134) in a release build (`panic = "abort"`). So the
//! symbols without which nothing can be done or undone (`REQUIRED`) are looked up before
//! `nvmlInit` and a library lacking one is refused, uninitialised, in one counted failure;
//! and `Loaded` never lets that `Drop` run without the symbol.
//!
//! Ref: NVML API Reference Guide, Device Queries (units: %, bytes, °C, mW, mJ, MHz).

use std::ffi::OsStr;

use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::profile::{MetricKind, MetricNvml};
use crate::exporter::snapshot::{Failure, Reading};
use crate::profile::Profile;

use super::DeviceRef;

const SOURCE: &str = "nvml";

/// The functions a library must have to be used at all: initialising and shutting it down,
/// and the two device look-ups every reading goes through. A reading's own function missing
/// costs that reading only.
const REQUIRED: [&[u8]; 4] = [
    b"nvmlInit_v2\0",
    b"nvmlShutdown\0",
    b"nvmlDeviceGetHandleByUUID\0",
    b"nvmlDeviceGetHandleByPciBusId_v2\0",
];

/// An initialised NVML, shut down when dropped where the library has `nvmlShutdown`. Where it
/// has not (only if a library changed under [`load`]'s check), the handle is forgotten:
/// nvml-wrapper's `Drop` would panic, and unloading a library that was initialised and never
/// shut down could pull its code from under threads it started; one leaked handle is the
/// sound cost.
struct Loaded(Option<Nvml>);

impl Loaded {
    fn get(&self) -> Option<&Nvml> {
        self.0.as_ref()
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            if n.lib().nvmlShutdown.is_ok() {
                drop(n);
            } else {
                std::mem::forget(n);
            }
        }
    }
}

/// NVML, once loaded.
#[derive(Default)]
pub struct NvmlSource {
    nvml: Option<Loaded>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("loaded", &self.nvml.is_some())
            .finish()
    }
}

/// An NVML error as a reason word; `None` for what means "this GPU has no such value".
fn reason(e: &NvmlError) -> Option<&'static str> {
    Some(match e {
        NvmlError::NotSupported | NvmlError::NotFound => return None,
        NvmlError::NoPermission => "no-permission",
        NvmlError::GpuLost => "gpu-lost",
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => "not-in-library",
        NvmlError::Uninitialized | NvmlError::DriverNotLoaded => "not-loaded",
        NvmlError::Timeout => "timeout",
        _ => "nvml-error",
    })
}

/// Loads `cfg.library` from `profile`'s driver root, as the health engine does
/// ([`crate::health::nvml::open`]).
fn load(profile: &Profile, cfg: &MetricNvml) -> Result<Loaded, (&'static str, String)> {
    let opened = crate::health::nvml::open(profile, &cfg.library)?;
    let missing = crate::health::nvml::lacking(&opened.lib, &REQUIRED);
    if !missing.is_empty() {
        return Err((
            "not-in-library",
            format!(
                "{} lacks {}: refused, never initialised (not an NVML the exporter can use)",
                opened.shown,
                missing.join(", ")
            ),
        ));
    }
    // Loaded again by nvml-wrapper through the same open file, held open until then so the
    // library's initialisers run once.
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(&opened.path))
        .init()
        .map_err(|e| {
            (
                reason(&e).unwrap_or("nvml-error"),
                format!("{}: {e}", opened.shown),
            )
        })?;
    drop(opened);
    Ok(Loaded(Some(nvml)))
}

impl NvmlSource {
    /// Loads and initialises the library where it is not yet; whether it is loaded. Called
    /// before the health engine's first check, so the engine finds NVML initialised and uses
    /// it as it is: one `nvmlInit` in the process ([`crate::health::nvml`]).
    pub fn load(&mut self, profile: &Profile, cfg: &MetricNvml, failed: &mut Vec<Failure>) -> bool {
        if self.nvml.is_none() {
            match load(profile, cfg) {
                Ok(n) => self.nvml = Some(n),
                Err((reason, detail)) => {
                    failed.push(Failure::new(SOURCE, None, reason, detail));
                    return false;
                }
            }
        }
        true
    }

    /// Every device's readings into `out` (one list per device of `devs`).
    pub fn read(
        &mut self,
        profile: &Profile,
        cfg: &MetricNvml,
        devs: &[DeviceRef<'_>],
        out: &mut [Vec<Reading>],
        failed: &mut Vec<Failure>,
    ) {
        if !self.load(profile, cfg, failed) {
            return;
        }
        let Some(nvml) = self.nvml.as_ref().and_then(Loaded::get) else {
            return;
        };
        let mut lost = false;
        for (dev, readings) in devs.iter().zip(out.iter_mut()) {
            let handle = match (dev.uuid, dev.pci_bus_id) {
                (Some(u), _) => nvml.device_by_uuid(u),
                (None, Some(b)) => nvml.device_by_pci_bus_id(b),
                (None, None) => continue,
            };
            let d = match handle {
                Ok(d) => d,
                Err(e) => {
                    lost |= matches!(e, NvmlError::Uninitialized | NvmlError::DriverNotLoaded);
                    failed.push(Failure::new(
                        SOURCE,
                        None,
                        reason(&e).unwrap_or("not-found"),
                        format!("device {}: {e}", dev.index),
                    ));
                    continue;
                }
            };
            let mut put = |kind: MetricKind, label: Option<&str>, r: Result<f64, NvmlError>| match r
            {
                Ok(v) => readings.push(Reading {
                    kind,
                    label: label.map(str::to_string),
                    value: v,
                }),
                Err(e) => {
                    if let Some(why) = reason(&e) {
                        failed.push(Failure::new(
                            SOURCE,
                            Some(kind),
                            why,
                            format!("device {}: {e}", dev.index),
                        ));
                    }
                }
            };
            match d.utilization_rates() {
                Ok(u) => {
                    put(MetricKind::Utilization, None, Ok(f64::from(u.gpu) / 100.0));
                    put(
                        MetricKind::MemoryUtilization,
                        None,
                        Ok(f64::from(u.memory) / 100.0),
                    );
                }
                Err(e) => put(MetricKind::Utilization, None, Err(e)),
            }
            match d.memory_info() {
                Ok(m) => {
                    put(MetricKind::MemoryUsed, None, Ok(m.used as f64));
                    put(MetricKind::MemoryTotal, None, Ok(m.total as f64));
                }
                Err(e) => put(MetricKind::MemoryUsed, None, Err(e)),
            }
            put(
                MetricKind::Temperature,
                Some("gpu"),
                d.temperature(TemperatureSensor::Gpu).map(f64::from),
            );
            put(
                MetricKind::Power,
                None,
                d.power_usage().map(|mw| f64::from(mw) / 1e3),
            );
            put(
                MetricKind::PowerLimit,
                None,
                d.enforced_power_limit().map(|mw| f64::from(mw) / 1e3),
            );
            put(
                MetricKind::Energy,
                None,
                d.total_energy_consumption().map(|mj| mj as f64 / 1e3),
            );
            for (clock, label) in [
                (Clock::Graphics, "graphics"),
                (Clock::SM, "sm"),
                (Clock::Memory, "memory"),
            ] {
                put(
                    MetricKind::Clock,
                    Some(label),
                    d.clock_info(clock).map(|mhz| f64::from(mhz) * 1e6),
                );
            }
            for (kind, label) in [
                (MemoryError::Corrected, "ecc-corrected"),
                (MemoryError::Uncorrected, "ecc-uncorrected"),
            ] {
                put(
                    MetricKind::Errors,
                    Some(label),
                    d.total_ecc_errors(kind, EccCounter::Volatile)
                        .map(|n| n as f64),
                );
            }
            put(
                MetricKind::Errors,
                Some("pcie-replay"),
                d.pcie_replay_counter().map(f64::from),
            );
        }
        if lost {
            // A driver reload: load the library again at the next poll.
            self.nvml = None;
        }
    }
}
