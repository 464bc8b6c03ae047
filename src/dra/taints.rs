//! The taint an unhealthy device is published with (KEP-5055): its key names how bad it is
//! (a [`Severity`] in the driver's domain), its value the reason short, its effect what the
//! operator chose for that severity ([`Effects`]: `NoSchedule` unless told, `NoExecute`
//! only where asked, since it evicts the pods holding the device), and its `timeAdded` kept
//! while the reason stays the same ([`Stamps`]), so a steady pool is not rewritten.
//!
//! The severity is read from the health engine's reason, one line of `; `-joined parts: the
//! worst part names the taint. A reason this module does not know is an `error` (a hardware
//! signal the engine grew since), never dropped.
//!
//! Ref: k8s.io/api/resource/v1 types.go (`DeviceTaint`: key a qualified name, value a label
//! value of at most 63 characters, at most 16 taints per device).

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How bad a device's failure is, worst last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// A vendor tool says the device is unhealthy; the kernel's signals are clear.
    Reported,
    /// An uncorrectable error (a fatal AER error, an amdgpu RAS `ue` count, an ECC or XID
    /// error): the device is there and may fail any work.
    Error,
    /// The device is gone: fallen off the bus, its PCI function removed, its nodes or its
    /// driver gone. Nothing on it can run.
    Gone,
}

impl Severity {
    pub const ALL: [Severity; 3] = [Severity::Gone, Severity::Error, Severity::Reported];

    /// The name in the taint's key and in `--taint-no-execute`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Reported => "reported",
            Severity::Error => "error",
            Severity::Gone => "gone",
        }
    }

    pub fn parse(s: &str) -> Option<Severity> {
        Severity::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// The longest taint value the API takes (a label value).
pub const MAX_VALUE: usize = 63;

/// One part of a health reason: its severity and its short name (a label value).
fn part(p: &str) -> (Severity, String) {
    let has = |s: &str| p.contains(s);
    let (sev, code): (Severity, String) = if has("reads all ones") {
        (Severity::Gone, "fallen-off-the-bus".into())
    } else if has("is gone from sysfs") {
        (Severity::Gone, "pci-function-gone".into())
    } else if has("the driver is not loaded") {
        (Severity::Gone, "driver-not-loaded".into())
    } else if has(": does not exist")
        || has(": is not a character device")
        || has(": has major")
        || has(": cannot be read")
    {
        (Severity::Gone, "device-node-gone".into())
    } else if has("GPU is lost") || has("is lost") {
        (Severity::Gone, "gpu-lost".into())
    } else if has("fatal PCIe (AER)") {
        (Severity::Error, "aer-fatal".into())
    } else if let Some(block) = p
        .split_once("uncorrectable RAS error(s) in block ")
        .map(|(_, b)| b.split_whitespace().next().unwrap_or("").trim_matches('"'))
    {
        (Severity::Error, format!("ras-ue-{block}"))
    } else if let Some((tool, _)) = p.split_once(" reports ") {
        // The vendor tools' reasons (crate::health::tools): `<tool> reports ...`.
        (Severity::Reported, tool.to_string())
    } else if let Some(x) = xid(p) {
        (Severity::Error, format!("xid-{x}"))
    } else if has("ECC") || has("ecc") {
        (Severity::Error, "ecc".into())
    } else if has("remap") {
        (Severity::Error, "row-remap".into())
    } else {
        (Severity::Error, "unhealthy".into())
    };
    (sev, label_value(&code))
}

/// The XID a reason names (`XID 79`, `Xid 48`), if any.
fn xid(p: &str) -> Option<u32> {
    let lower = p.to_ascii_lowercase();
    let at = lower.find("xid")?;
    lower[at + 3..]
        .trim_start_matches([' ', ':'])
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// `s` as a label value: lower-case letters, digits, `-` and `.`, at most 63 characters,
/// beginning and ending with a letter or digit; `unhealthy` where nothing is left.
pub fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_VALUE));
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_alphanumeric() || c == '.' {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
        if out.len() >= MAX_VALUE {
            break;
        }
    }
    let out = out.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if out.is_empty() {
        "unhealthy".into()
    } else {
        out.to_string()
    }
}

/// The severity of a health reason (its worst part) and the short name of the first part of
/// that severity.
pub fn classify(reason: &str) -> (Severity, String) {
    let mut worst: Option<(Severity, String)> = None;
    for p in reason.split("; ").filter(|p| !p.trim().is_empty()) {
        let (s, code) = part(p);
        if worst.as_ref().is_none_or(|(w, _)| s > *w) {
            worst = Some((s, code));
        }
    }
    worst.unwrap_or((Severity::Error, "unhealthy".into()))
}

/// The effect of each severity's taint: `NoSchedule`, or `NoExecute` for those the operator
/// named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    pub no_execute: BTreeSet<Severity>,
}

impl Effects {
    /// From `--taint-no-execute`'s comma-separated severities (`gone,error`); an error naming
    /// the one that is not a severity.
    pub fn parse(list: &str) -> Result<Effects, String> {
        let mut no_execute = BTreeSet::new();
        for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match Severity::parse(s) {
                Some(v) => no_execute.insert(v),
                None => {
                    return Err(format!(
                        "{:?} is not a severity (gone, error, reported)",
                        s.chars().take(32).collect::<String>()
                    ))
                }
            };
        }
        Ok(Effects { no_execute })
    }

    pub fn effect(&self, s: Severity) -> &'static str {
        if self.no_execute.contains(&s) {
            "NoExecute"
        } else {
            "NoSchedule"
        }
    }
}

/// When each device's taint was added: kept while its key and value stay the same.
#[derive(Debug, Default)]
pub struct Stamps {
    added: BTreeMap<String, (String, String, Time)>,
}

/// Now in whole seconds, as the API server keeps a `metav1.Time` (a finer time would never
/// compare equal to what it returns).
fn now() -> Time {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Time(
        k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
            .unwrap_or_default(),
    )
}

impl Stamps {
    /// The taint of each of `devices` (name, the reason it is unhealthy or `None`) of
    /// `driver`; a device not among them, or healthy, is forgotten.
    pub fn taints(
        &mut self,
        driver: &str,
        effects: &Effects,
        devices: &[(&str, Option<&str>)],
    ) -> Vec<Option<DeviceTaint>> {
        let mut kept = BTreeMap::new();
        let out = devices
            .iter()
            .map(|(name, reason)| {
                let (sev, value) = classify((*reason)?);
                let key = format!("{driver}/{}", sev.as_str());
                let added = match self.added.remove(*name) {
                    Some((k, v, t)) if k == key && v == value => t,
                    _ => now(),
                };
                kept.insert(
                    name.to_string(),
                    (key.clone(), value.clone(), added.clone()),
                );
                Some(DeviceTaint {
                    key,
                    value: Some(value),
                    effect: effects.effect(sev).into(),
                    time_added: Some(added),
                })
            })
            .collect();
        self.added = kept;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::decide::{step, Counters, Pci, Reading};
    use std::time::{Duration, Instant};

    /// The reasons the health engine gives, each with its severity and name; the sysfs ones
    /// made by the engine's own decision, so a reworded reason fails here, not in a cluster.
    #[test]
    fn each_reason_has_its_severity_and_a_short_name() {
        let read = |pci: Pci, fatal: u64, ras: u64| Reading {
            nodes: None,
            bdf: Some("0000:11:00.0".into()),
            pci,
            counters: Counters {
                aer_fatal: Some(fatal),
                aer_nonfatal: Some(0),
                ras_ue: [("umc".to_string(), ras)].into(),
            },
            nvml: None,
        };
        let (t0, _) = step(
            None,
            &read(Pci::Present, 0, 0),
            Instant::now(),
            SystemTime::now(),
            Duration::ZERO,
        );
        let reason = |pci, fatal, ras| {
            step(
                Some(&t0),
                &read(pci, fatal, ras),
                Instant::now(),
                SystemTime::now(),
                Duration::ZERO,
            )
            .0
            .health
            .reason()
            .unwrap()
            .to_string()
        };
        for (why, sev, name) in [
            (
                reason(Pci::AllOnes, 0, 0),
                Severity::Gone,
                "fallen-off-the-bus",
            ),
            (reason(Pci::Gone, 0, 0), Severity::Gone, "pci-function-gone"),
            (reason(Pci::Present, 1, 0), Severity::Error, "aer-fatal"),
            (reason(Pci::Present, 0, 2), Severity::Error, "ras-ue-umc"),
            // Both: the worst names it.
            (
                reason(Pci::AllOnes, 1, 0),
                Severity::Gone,
                "fallen-off-the-bus",
            ),
            (
                "the driver is not loaded (its version file /x/version is gone)".into(),
                Severity::Gone,
                "driver-not-loaded",
            ),
            (
                "/dev/gcu3: does not exist".into(),
                Severity::Gone,
                "device-node-gone",
            ),
            // NVML's reasons (crate::health::nvml), as the engine words them.
            ("XID 79 on GPU 0000:3b:00.0".into(), Severity::Error, "xid-79"),
            (
                "double-bit ECC error on GPU 0000:3b:00.0".into(),
                Severity::Error,
                "ecc",
            ),
            (
                "2 uncorrected ECC error(s) on GPU 0000:3b:00.0 since it was first read (volatile count 6)".into(),
                Severity::Error,
                "ecc",
            ),
            (
                "row remapping pending on GPU 0000:3b:00.0 (it needs a reset)".into(),
                Severity::Error,
                "row-remap",
            ),
            (
                "GPU 0000:3b:00.0 is lost to NVML (NVML_ERROR_GPU_IS_LOST)".into(),
                Severity::Gone,
                "gpu-lost",
            ),
            (
                "efsmi reports \"Fault\"".into(),
                Severity::Reported,
                "efsmi",
            ),
            (
                "npu-smi reports \"Warning\"; 1 fatal PCIe (AER) error(s) on x".into(),
                Severity::Error,
                "aer-fatal",
            ),
            (
                "XID 79 (fallen off the bus)".into(),
                Severity::Error,
                "xid-79",
            ),
            ("something new".into(), Severity::Error, "unhealthy"),
        ] {
            assert_eq!(classify(&why), (sev, name.to_string()), "{why}");
        }
    }

    #[test]
    fn values_are_label_values() {
        assert_eq!(label_value("ras-ue-umc"), "ras-ue-umc");
        assert_eq!(label_value("Ras UE: \"MMHUB\"!"), "ras-ue-mmhub");
        assert_eq!(label_value("--"), "unhealthy");
        let long = label_value(&"ab-".repeat(40));
        assert!(long.len() <= MAX_VALUE && long.ends_with('b'), "{long}");
    }

    #[test]
    fn effects_are_noschedule_unless_named() {
        let e = Effects::parse("").unwrap();
        assert!(Severity::ALL.iter().all(|s| e.effect(*s) == "NoSchedule"));
        let e = Effects::parse("gone, error").unwrap();
        assert_eq!(e.effect(Severity::Gone), "NoExecute");
        assert_eq!(e.effect(Severity::Error), "NoExecute");
        assert_eq!(e.effect(Severity::Reported), "NoSchedule");
        assert_eq!(
            Effects::parse("gone,evict").unwrap_err(),
            "\"evict\" is not a severity (gone, error, reported)"
        );
    }

    /// `timeAdded` stays while the reason does; a new reason, or a device healthy and failing
    /// again, is a new taint.
    #[test]
    fn time_added_is_kept_while_the_reason_is_the_same() {
        let mut s = Stamps::default();
        let e = Effects::default();
        let fatal = "1 fatal PCIe (AER) error(s) on x since it was first read";
        let t = s.taints("d.x", &e, &[("a", Some(fatal)), ("b", None)]);
        let first = t[0].clone().unwrap();
        assert_eq!(first.key, "d.x/error");
        assert_eq!(first.value.as_deref(), Some("aer-fatal"));
        assert_eq!(first.effect, "NoSchedule");
        assert!(t[1].is_none());
        std::thread::sleep(Duration::from_millis(1100));
        let fatal2 = "2 fatal PCIe (AER) error(s) on x since it was first read";
        let t = s.taints("d.x", &e, &[("a", Some(fatal2))]);
        assert_eq!(t[0].as_ref().unwrap().time_added, first.time_added);
        let t = s.taints("d.x", &e, &[("a", Some("PCI function x reads all ones"))]);
        let gone = t[0].clone().unwrap();
        assert_eq!(gone.key, "d.x/gone");
        assert_ne!(gone.time_added, first.time_added);
        s.taints("d.x", &e, &[("a", None)]);
        std::thread::sleep(Duration::from_millis(1100));
        let t = s.taints("d.x", &e, &[("a", Some("PCI function x reads all ones"))]);
        assert_ne!(t[0].as_ref().unwrap().time_added, gone.time_added);
    }
}
