//! The taint an unhealthy device is published with (KEP-5055): its key names how bad it is
//! (a [`Severity`] in the driver's domain), its value the reason short, its effect what the
//! operator chose for that severity ([`Effects`]: `NoSchedule` unless told, `NoExecute`
//! only where asked, since it evicts the pods holding the device), and its `timeAdded` kept
//! while the reason stays the same ([`Stamps`]), so a steady pool is not rewritten.
//!
//! The severity and the value are the health engine's typed reason's
//! ([`crate::health::Reason`]): its worst part names the taint, as it names the exporter's
//! `reason` label.
//!
//! Ref: k8s.io/api/resource/v1 types.go (`DeviceTaint`: key a qualified name, value a label
//! value of at most 63 characters, at most 16 taints per device).

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::health::Reason;
pub use crate::health::Severity;

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
        devices: &[(&str, Option<&Reason>)],
    ) -> Vec<Option<DeviceTaint>> {
        let mut kept = BTreeMap::new();
        let out = devices
            .iter()
            .map(|(name, reason)| {
                let reason = (*reason)?;
                let (sev, value) = (reason.severity(), reason.label());
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
    use crate::health::{Kind, Problem};
    use std::time::{Duration, Instant};

    /// The engine's own decisions, each with the taint's severity and value: the kinds come
    /// from where the signal is read, so a reworded reason keeps its taint.
    #[test]
    fn each_decision_taints_by_its_worst_kind() {
        let read = |pci: Pci, fatal: u64, ras: u64, nodes: Vec<Problem>| Reading {
            nodes,
            bdf: Some("0000:11:00.0".into()),
            pci,
            counters: Counters {
                aer_fatal: Some(fatal),
                aer_nonfatal: Some(0),
                ras_ue: [("umc".to_string(), ras)].into(),
            },
            nvml: Vec::new(),
            drm: Vec::new(),
        };
        let (t0, _) = step(
            None,
            &read(Pci::Present, 0, 0, Vec::new()),
            Instant::now(),
            SystemTime::now(),
            Duration::ZERO,
        );
        let tool = || {
            vec![Problem::new(
                Kind::Tool("npu-smi".into()),
                "npu-smi reports \"Warning\"",
            )]
        };
        let mut s = Stamps::default();
        for (r, key, value) in [
            (
                read(Pci::AllOnes, 0, 0, Vec::new()),
                "gone",
                "fallen-off-the-bus",
            ),
            (
                read(Pci::Gone, 0, 0, Vec::new()),
                "gone",
                "pci-function-gone",
            ),
            (read(Pci::Present, 1, 0, Vec::new()), "error", "aer-fatal"),
            (read(Pci::Present, 0, 2, Vec::new()), "error", "ras-ue-umc"),
            (
                read(Pci::AllOnes, 1, 0, Vec::new()),
                "gone",
                "fallen-off-the-bus",
            ),
            (read(Pci::Present, 0, 0, tool()), "reported", "npu-smi"),
            // The tool is named first, the worse fatal error names the taint.
            (read(Pci::Present, 1, 0, tool()), "error", "aer-fatal"),
        ] {
            let (t, _) = step(
                Some(&t0),
                &r,
                Instant::now(),
                SystemTime::now(),
                Duration::ZERO,
            );
            let why = t.health.reason().unwrap();
            let taint = s.taints("d.x", &Effects::default(), &[("a", Some(why))])[0]
                .clone()
                .unwrap();
            assert_eq!(
                (taint.key.as_str(), taint.value.as_deref()),
                (format!("d.x/{key}").as_str(), Some(value)),
                "{}",
                why.text()
            );
        }
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

    fn reason(kind: Kind, text: &str) -> Reason {
        Reason::new(vec![Problem::new(kind, text)]).unwrap()
    }

    /// `timeAdded` stays while the reason does; a new reason, or a device healthy and failing
    /// again, is a new taint.
    #[test]
    fn time_added_is_kept_while_the_reason_is_the_same() {
        let mut s = Stamps::default();
        let e = Effects::default();
        let fatal = reason(Kind::AerFatal, "1 fatal PCIe (AER) error(s)");
        let t = s.taints("d.x", &e, &[("a", Some(&fatal)), ("b", None)]);
        let first = t[0].clone().unwrap();
        assert_eq!(first.key, "d.x/error");
        assert_eq!(first.value.as_deref(), Some("aer-fatal"));
        assert_eq!(first.effect, "NoSchedule");
        assert!(t[1].is_none());
        std::thread::sleep(Duration::from_millis(1100));
        let fatal2 = reason(Kind::AerFatal, "2 fatal PCIe (AER) error(s)");
        let t = s.taints("d.x", &e, &[("a", Some(&fatal2))]);
        assert_eq!(t[0].as_ref().unwrap().time_added, first.time_added);
        let ones = reason(Kind::FallenOffTheBus, "PCI function x reads all ones");
        let t = s.taints("d.x", &e, &[("a", Some(&ones))]);
        let gone = t[0].clone().unwrap();
        assert_eq!(gone.key, "d.x/gone");
        assert_ne!(gone.time_added, first.time_added);
        s.taints("d.x", &e, &[("a", None)]);
        std::thread::sleep(Duration::from_millis(1100));
        let t = s.taints("d.x", &e, &[("a", Some(&ones))]);
        assert_ne!(t[0].as_ref().unwrap().time_added, gone.time_added);
    }
}
