//! The health decision of one device: from what its signals read now and what was kept of the
//! reads before (baselines, the verdict, the hold-down), the verdict now and what to say in
//! the log. Pure: time comes in as arguments, so every rule is a row of a table in its tests.
//!
//! The rules, in the order the reason names them:
//! - its nodes or driver ([`Reading::nodes`]) are the device plugin's old rule; a device whose
//!   node comes back is healthy at once, as before: the driver made it again, nothing flaps;
//! - its PCI function gone from sysfs once it has been seen there, or its config space reading
//!   all ones (a device that fell off the bus answers every read with ones);
//! - what its kernel driver says of the function ([`Reading::drm`]: bound to another driver,
//!   xe's survivability mode), states with no baseline;
//! - the AER fatal count (`TOTAL_ERR_FATAL`) above its baseline;
//! - an amdgpu RAS block's uncorrectable count (`ue:`) above its baseline;
//! - what NVML says of an NVIDIA GPU ([`Reading::nvml`], from `health::nvml`: an XID, ECC,
//!   remapped rows, lost), its baselines and clearing kept there.
//!
//! A non-fatal AER error never makes a device unhealthy: it is one the link survived, and the
//! kernel's recovery either brings the function back or leaves it reading all ones or removed,
//! which the rules above see. Each rise is said once in the log.
//!
//! Baselines are the first count read, so an old count is not a new failure. A count that
//! falls below its baseline (the driver reloaded, the device reset) becomes the baseline, and
//! a PCI function that comes back after it was gone is counted afresh from what it reads
//! then. Once a hardware signal (all but the nodes') has been seen, the device stays
//! unhealthy until every signal has been clear for the hold-down.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use super::reason::{Kind, Problem, Reason};

/// A device's health as the engine decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy {
        /// Every signal that is not clear; while a hold-down runs, the last hardware reason.
        reason: Reason,
        /// When it turned unhealthy.
        since: SystemTime,
    },
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }

    /// Why not, `None` when healthy.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Health::Healthy => None,
            Health::Unhealthy { reason, .. } => Some(reason),
        }
    }

    /// Why not, in one line; `None` when healthy.
    pub fn reason_text(&self) -> Option<&str> {
        self.reason().map(Reason::text)
    }

    /// Since when it has been unhealthy; `None` when healthy.
    pub fn since(&self) -> Option<SystemTime> {
        match self {
            Health::Healthy => None,
            Health::Unhealthy { since, .. } => Some(*since),
        }
    }
}

/// What the device's PCI function looks like in sysfs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pci {
    /// No PCI address known for the device, or sysfs could not be read: no PCI signal.
    #[default]
    Unknown,
    /// `sys/bus/pci/devices/<bdf>` is not there.
    Gone,
    /// Its `config` reads all ones.
    AllOnes,
    Present,
}

/// Error counts read from the function's sysfs directory; `None` where the file is absent or
/// unreadable (no signal, not zero).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub aer_fatal: Option<u64>,
    pub aer_nonfatal: Option<u64>,
    /// amdgpu RAS uncorrectable counts by block (`umc`, `gfx`, ...).
    pub ras_ue: BTreeMap<String, u64>,
}

/// One read of a device's signals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    /// Why its nodes or its driver cannot serve it, and what a vendor tool reports: the
    /// signals not held down. Empty when clear.
    pub nodes: Vec<Problem>,
    /// Its PCI bus id, where known (named in reasons).
    pub bdf: Option<String>,
    pub pci: Pci,
    pub counters: Counters,
    /// What NVML says is wrong with the GPU; empty when clear or not read.
    pub nvml: Vec<Problem>,
    /// What the kernel driver says of the PCI function ([`super::signals::read_drm`]): bound
    /// to another driver, survivability mode; empty when clear or not read.
    pub drm: Vec<Problem>,
}

/// What is kept of one device between reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    pub health: Health,
    pub baseline: Counters,
    /// The PCI function was there (or not known) at the last read.
    pub present: bool,
    /// The PCI function has been seen in sysfs: only then is its absence a signal (a root
    /// whose sysfs does not show it, as a container's without the host's /sys, says nothing).
    pub seen: bool,
    /// Since a hardware signal was seen: `None` while it is still seen, else when every
    /// signal was first seen clear again. Absent when no hold-down runs.
    pub held: Option<Option<Instant>>,
    /// The last non-fatal count said in the log (the baseline at first).
    pub nonfatal_said: Option<u64>,
}

/// What the log is told of one read: at most one line per transition or event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Unhealthy(String),
    /// Unhealthy still, for another reason now.
    Reason(String),
    /// Healthy again; what had been wrong.
    Healthy(String),
    /// The function is back and its counts are counted from these.
    Rebaselined(String),
    /// Non-fatal AER errors since start, and the total count.
    NonFatal {
        new: u64,
        total: u64,
    },
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Note::Unhealthy(r) => write!(f, "is unhealthy: {r}"),
            Note::Reason(r) => write!(f, "is still unhealthy, now: {r}"),
            Note::Healthy(r) => write!(f, "is healthy again (was: {r})"),
            Note::Rebaselined(bdf) => write!(
                f,
                "has its PCI function {bdf} back; its error counts are counted from now"
            ),
            Note::NonFatal { new, total } => write!(
                f,
                "has {new} non-fatal PCIe (AER) error(s) since it was first read ({total} in all); \
                 kept healthy: the link recovered"
            ),
        }
    }
}

/// `count` against `base`: `base` moves down to a count that fell (a reset), and is set by
/// the first count read. Returns the count when it is above the baseline.
fn above(base: &mut Option<u64>, count: Option<u64>) -> Option<u64> {
    let c = count?;
    match *base {
        Some(b) if c > b => Some(c),
        _ => {
            *base = Some(c);
            None
        }
    }
}

/// The decision for one read. `prev` is `None` at the first read of the device; `now` and
/// `wall` are the monotonic and wall clocks of the read.
pub fn step(
    prev: Option<&Tracked>,
    r: &Reading,
    now: Instant,
    wall: SystemTime,
    hold_down: Duration,
) -> (Tracked, Vec<Note>) {
    let mut notes = Vec::new();
    let seen = prev.is_some_and(|p| p.seen) || matches!(r.pci, Pci::Present | Pci::AllOnes);
    let pci = match r.pci {
        Pci::Gone if !seen => Pci::Unknown,
        p => p,
    };
    let present = pci != Pci::Gone;
    let bdf = r.bdf.as_deref().unwrap_or("(unknown)");
    // The baseline of a first read, or of a function that is back, is what it reads now.
    let fresh = match prev {
        None => true,
        Some(p) => !p.present && present,
    };
    let mut baseline = match prev {
        Some(p) if !fresh => p.baseline.clone(),
        _ => r.counters.clone(),
    };
    if fresh && prev.is_some() {
        notes.push(Note::Rebaselined(bdf.to_string()));
    }

    let mut hardware: Vec<Problem> = Vec::new();
    match pci {
        Pci::Gone => hardware.push(Problem::new(
            Kind::PciFunctionGone,
            format!("PCI function {bdf} is gone from sysfs"),
        )),
        Pci::AllOnes => hardware.push(Problem::new(
            Kind::FallenOffTheBus,
            format!("PCI function {bdf} reads all ones (fallen off the bus)"),
        )),
        Pci::Unknown | Pci::Present => {}
    }
    if pci != Pci::Gone {
        hardware.extend(r.drm.iter().cloned());
    }
    if let Some(c) = above(&mut baseline.aer_fatal, r.counters.aer_fatal) {
        let b = baseline.aer_fatal.unwrap_or(0);
        hardware.push(Problem::new(
            Kind::AerFatal,
            format!(
                "{} fatal PCIe (AER) error(s) on {bdf} since it was first read",
                c - b
            ),
        ));
    }
    for (block, &count) in &r.counters.ras_ue {
        let base = baseline.ras_ue.get(block).copied();
        let mut b = base;
        if let Some(c) = above(&mut b, Some(count)) {
            hardware.push(Problem::new(
                Kind::RasUe(block.clone()),
                format!(
                    "{} uncorrectable RAS error(s) in block {block:?} since it was first read",
                    c - b.unwrap_or(0)
                ),
            ));
        }
        if let Some(b) = b {
            baseline.ras_ue.insert(block.clone(), b);
        }
    }
    hardware.extend(r.nvml.iter().cloned());
    let mut nonfatal_said = prev.and_then(|p| p.nonfatal_said).filter(|_| !fresh);
    if let Some(c) = above(&mut baseline.aer_nonfatal, r.counters.aer_nonfatal) {
        if nonfatal_said.is_none_or(|s| c > s) {
            let b = baseline.aer_nonfatal.unwrap_or(0);
            notes.push(Note::NonFatal {
                new: c - b,
                total: c,
            });
            nonfatal_said = Some(c);
        }
    } else {
        nonfatal_said = baseline.aer_nonfatal;
    }

    let held = if !hardware.is_empty() {
        Some(None)
    } else {
        match prev.and_then(|p| p.held) {
            Some(None) if hold_down.is_zero() => None,
            Some(None) => Some(Some(now)),
            Some(Some(t)) if now.saturating_duration_since(t) >= hold_down => None,
            other => other,
        }
    };

    let mut parts: Vec<Problem> = r.nodes.clone();
    parts.extend(hardware);
    let prev_health = prev.map(|p| &p.health);
    let health = match (Reason::new(parts), held, prev_health) {
        (None, None, _) => Health::Healthy,
        // Clear, held down: the reason the hardware last gave.
        (None, Some(_), Some(Health::Unhealthy { reason, since })) => Health::Unhealthy {
            reason: reason.clone(),
            since: *since,
        },
        (None, Some(_), _) => Health::Healthy,
        (Some(reason), _, Some(Health::Unhealthy { since, .. })) => Health::Unhealthy {
            reason,
            since: *since,
        },
        (Some(reason), _, _) => Health::Unhealthy {
            reason,
            since: wall,
        },
    };
    match (prev_health, &health) {
        (None | Some(Health::Healthy), Health::Unhealthy { reason, .. }) => {
            notes.push(Note::Unhealthy(reason.text().to_string()))
        }
        (Some(Health::Unhealthy { reason: old, .. }), Health::Unhealthy { reason, .. })
            if old.text() != reason.text() =>
        {
            notes.push(Note::Reason(reason.text().to_string()))
        }
        (Some(Health::Unhealthy { reason, .. }), Health::Healthy) => {
            notes.push(Note::Healthy(reason.text().to_string()))
        }
        _ => {}
    }
    (
        Tracked {
            health,
            baseline,
            present,
            seen,
            held,
            nonfatal_said,
        },
        notes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(30);

    fn counters(fatal: u64, nonfatal: u64, ras: &[(&str, u64)]) -> Counters {
        Counters {
            aer_fatal: Some(fatal),
            aer_nonfatal: Some(nonfatal),
            ras_ue: ras.iter().map(|(b, n)| (b.to_string(), *n)).collect(),
        }
    }

    fn reading(pci: Pci, c: Counters) -> Reading {
        Reading {
            nodes: Vec::new(),
            bdf: Some("0000:11:00.0".into()),
            pci,
            counters: c,
            nvml: Vec::new(),
            drm: Vec::new(),
        }
    }

    /// Runs `reads` (seconds since start, reading) through [`step`]; the verdict and notes
    /// after each.
    fn run(reads: &[(u64, Reading)]) -> Vec<(Option<String>, Vec<Note>)> {
        let t0 = Instant::now();
        let w0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut prev: Option<Tracked> = None;
        let mut out = Vec::new();
        for (s, r) in reads {
            let at = Duration::from_secs(*s);
            let (t, notes) = step(prev.as_ref(), r, t0 + at, w0 + at, HOLD);
            out.push((t.health.reason_text().map(str::to_string), notes));
            prev = Some(t);
        }
        out
    }

    fn verdicts(reads: &[(u64, Reading)]) -> Vec<Option<String>> {
        run(reads).into_iter().map(|(h, _)| h).collect()
    }

    /// What NVML says is a hardware reason: named after the others, and held down once clear.
    #[test]
    fn an_nvml_reason_is_a_hardware_signal_held_down() {
        let clear = reading(Pci::Present, counters(0, 0, &[]));
        let xid = Reading {
            nvml: vec![Problem::new(Kind::Xid(79), "XID 79 on GPU 0000:11:00.0")],
            ..clear.clone()
        };
        let both = Reading {
            pci: Pci::AllOnes,
            ..xid.clone()
        };
        let hold = HOLD.as_secs();
        let v = verdicts(&[
            (0, clear.clone()),
            (1, xid.clone()),
            (2, both),
            (3, clear.clone()),
            (3 + hold - 1, clear.clone()),
            (3 + hold, clear),
        ]);
        let xid_reason = Some("XID 79 on GPU 0000:11:00.0".to_string());
        let both_reason = Some(
            "PCI function 0000:11:00.0 reads all ones (fallen off the bus); XID 79 on GPU \
             0000:11:00.0"
                .to_string(),
        );
        assert_eq!(
            v,
            [
                None,
                xid_reason,
                both_reason.clone(),
                both_reason.clone(),
                both_reason,
                None
            ]
        );
    }

    /// Counts already there at the first read are the baseline: no failure, whatever they are.
    #[test]
    fn old_counts_are_not_new_failures() {
        let v = verdicts(&[
            (0, reading(Pci::Present, counters(7, 90, &[("umc", 3)]))),
            (5, reading(Pci::Present, counters(7, 90, &[("umc", 3)]))),
        ]);
        assert_eq!(v, [None, None]);
    }

    /// Each hardware signal, alone, on a table: the reason it gives.
    #[test]
    fn each_signal_and_its_reason() {
        let base = counters(1, 0, &[("umc", 0), ("gfx", 2)]);
        let rows: [(&str, Reading, Option<&str>); 7] = [
            ("clear", reading(Pci::Present, base.clone()), None),
            (
                "function gone",
                reading(Pci::Gone, Counters::default()),
                Some("PCI function 0000:11:00.0 is gone from sysfs"),
            ),
            (
                "all ones",
                reading(Pci::AllOnes, base.clone()),
                Some("PCI function 0000:11:00.0 reads all ones (fallen off the bus)"),
            ),
            (
                "fatal up",
                reading(Pci::Present, counters(3, 0, &[("umc", 0), ("gfx", 2)])),
                Some("2 fatal PCIe (AER) error(s) on 0000:11:00.0 since it was first read"),
            ),
            (
                "umc ue up",
                reading(Pci::Present, counters(1, 0, &[("umc", 1), ("gfx", 2)])),
                Some("1 uncorrectable RAS error(s) in block \"umc\" since it was first read"),
            ),
            (
                "non-fatal up: healthy",
                reading(Pci::Present, counters(1, 500, &[("umc", 0), ("gfx", 2)])),
                None,
            ),
            (
                "no PCI address: no PCI signal",
                Reading {
                    bdf: None,
                    ..reading(Pci::Unknown, base.clone())
                },
                None,
            ),
        ];
        for (name, r, want) in rows {
            let v = verdicts(&[(0, reading(Pci::Present, base.clone())), (5, r)]);
            assert_eq!(v[1].as_deref(), want, "{name}");
        }
        // Two at once: both named, in order.
        let v = verdicts(&[
            (0, reading(Pci::Present, base.clone())),
            (
                5,
                Reading {
                    nodes: vec![Problem::new(Kind::DeviceNode, "/dev/gcu1: does not exist")],
                    ..reading(Pci::AllOnes, counters(2, 0, &[("umc", 0), ("gfx", 2)]))
                },
            ),
        ]);
        assert_eq!(
            v[1].as_deref(),
            Some(
                "/dev/gcu1: does not exist; PCI function 0000:11:00.0 reads all ones (fallen off \
                 the bus); 1 fatal PCIe (AER) error(s) on 0000:11:00.0 since it was first read"
            )
        );
    }

    /// A fatal count that rose keeps the device unhealthy while it stays up; the device comes
    /// back only once the count is at or below its baseline (reset) and the hold-down has run.
    #[test]
    fn hold_down_before_a_device_comes_back() {
        let ok = || reading(Pci::Present, counters(0, 0, &[]));
        let bad = || reading(Pci::Present, counters(1, 0, &[]));
        let v = verdicts(&[
            (0, ok()),
            (5, bad()),
            (100, bad()),
            (105, ok()),
            (120, ok()),
            (134, ok()),
            (135, ok()),
        ]);
        let bad_reason = "1 fatal PCIe (AER) error(s) on 0000:11:00.0 since it was first read";
        let got: Vec<bool> = v.iter().map(Option::is_none).collect();
        assert_eq!(got, [true, false, false, false, false, false, true]);
        assert_eq!(
            v[4].as_deref(),
            Some(bad_reason),
            "the reason kept while held"
        );
    }

    /// A signal that flaps (clear, bad, clear...) inside the hold-down keeps the device
    /// unhealthy: one transition each way, said once each.
    #[test]
    fn a_flapping_signal_does_not_flap_the_device() {
        let ok = || reading(Pci::Present, counters(0, 0, &[]));
        let ones = || reading(Pci::AllOnes, counters(0, 0, &[]));
        let mut reads = vec![(0, ok())];
        for i in 0..10 {
            reads.push((5 + 10 * i, ones()));
            reads.push((10 + 10 * i, ok()));
        }
        // The last clear read at 100: back 30 s later.
        reads.push((130, ok()));
        let out = run(&reads);
        let healthy: Vec<bool> = out.iter().map(|(h, _)| h.is_none()).collect();
        assert!(healthy[0] && healthy[1..healthy.len() - 1].iter().all(|h| !h));
        assert!(healthy[healthy.len() - 1], "back after the hold-down");
        let notes: Vec<&Note> = out.iter().flat_map(|(_, n)| n).collect();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(matches!(notes[0], Note::Unhealthy(_)));
        assert!(matches!(notes[1], Note::Healthy(_)));
    }

    /// The function removed and back (a reset, a reload): counted afresh from what it reads
    /// then, so a count that stayed high, or one back at zero, is clear after the hold-down.
    #[test]
    fn a_function_that_comes_back_is_counted_afresh() {
        let out = run(&[
            (0, reading(Pci::Present, counters(0, 0, &[("umc", 0)]))),
            (5, reading(Pci::Present, counters(1, 0, &[("umc", 0)]))),
            (10, reading(Pci::Gone, Counters::default())),
            (15, reading(Pci::Present, counters(4, 0, &[("umc", 2)]))),
            (44, reading(Pci::Present, counters(4, 0, &[("umc", 2)]))),
            (45, reading(Pci::Present, counters(4, 0, &[("umc", 2)]))),
            (50, reading(Pci::Present, counters(4, 0, &[("umc", 3)]))),
        ]);
        let healthy: Vec<bool> = out.iter().map(|(h, _)| h.is_none()).collect();
        assert_eq!(
            healthy,
            [true, false, false, false, false, true, false],
            "{out:?}"
        );
        assert_eq!(
            out[2].0.as_deref(),
            Some("PCI function 0000:11:00.0 is gone from sysfs")
        );
        assert_eq!(
            out[3].1,
            [Note::Rebaselined("0000:11:00.0".into())],
            "said once, as it comes back"
        );
        assert_eq!(
            out[6].0.as_deref(),
            Some("1 uncorrectable RAS error(s) in block \"umc\" since it was first read")
        );
    }

    /// A count below its baseline (a driver reload resets RAS counts) becomes the baseline:
    /// the next rise from it is a failure.
    #[test]
    fn a_count_reset_below_its_baseline_is_the_new_baseline() {
        let v = verdicts(&[
            (0, reading(Pci::Present, counters(0, 0, &[("gfx", 5)]))),
            (5, reading(Pci::Present, counters(0, 0, &[("gfx", 0)]))),
            (10, reading(Pci::Present, counters(0, 0, &[("gfx", 1)]))),
        ]);
        assert_eq!(v[0], None);
        assert_eq!(v[1], None);
        assert!(v[2].as_deref().unwrap().contains("block \"gfx\""), "{v:?}");
    }

    /// A count first readable later (a block that appears, a file that was unreadable) is
    /// baselined when first read.
    #[test]
    fn a_count_first_read_later_is_its_baseline() {
        let v = verdicts(&[
            (0, reading(Pci::Present, Counters::default())),
            (5, reading(Pci::Present, counters(9, 0, &[("umc", 4)]))),
            (10, reading(Pci::Present, counters(9, 0, &[("umc", 4)]))),
        ]);
        assert_eq!(v, [None, None, None]);
    }

    /// A function never seen in sysfs (a root without the host's sysfs, a bus id sysfs does
    /// not show) is no signal; once seen, its absence is.
    #[test]
    fn a_function_never_seen_in_sysfs_is_no_signal() {
        let gone = || reading(Pci::Gone, Counters::default());
        let v = verdicts(&[(0, gone()), (5, gone())]);
        assert_eq!(v, [None, None]);
        let v = verdicts(&[
            (0, gone()),
            (5, reading(Pci::Present, Counters::default())),
            (10, gone()),
        ]);
        assert_eq!(v[1], None);
        assert_eq!(
            v[2].as_deref(),
            Some("PCI function 0000:11:00.0 is gone from sysfs")
        );
    }

    /// The nodes' signal is not held down: a node made again is healthy at once, as the
    /// device plugin always had it.
    #[test]
    fn nodes_come_back_at_once() {
        let gone = Reading {
            nodes: vec![Problem::new(Kind::DeviceNode, "/dev/gcu1: does not exist")],
            ..reading(Pci::Present, counters(0, 0, &[]))
        };
        let v = verdicts(&[
            (0, gone.clone()),
            (1, reading(Pci::Present, counters(0, 0, &[]))),
        ]);
        assert_eq!(v, [Some("/dev/gcu1: does not exist".into()), None]);
    }

    /// Non-fatal errors are said once per rise, and never change the verdict.
    #[test]
    fn non_fatal_errors_are_said_once_per_rise() {
        let nf = |n| reading(Pci::Present, counters(0, n, &[]));
        let out = run(&[(0, nf(3)), (5, nf(5)), (10, nf(5)), (15, nf(6))]);
        assert!(out.iter().all(|(h, _)| h.is_none()));
        let notes: Vec<Note> = out.into_iter().flat_map(|(_, n)| n).collect();
        assert_eq!(
            notes,
            [
                Note::NonFatal { new: 2, total: 5 },
                Note::NonFatal { new: 3, total: 6 }
            ]
        );
    }

    /// `since` is when it turned unhealthy, kept while it stays so whatever the reason.
    #[test]
    fn since_is_kept_while_unhealthy() {
        let t0 = Instant::now();
        let w0 = SystemTime::UNIX_EPOCH;
        let (a, _) = step(
            None,
            &reading(Pci::Present, counters(0, 0, &[])),
            t0,
            w0,
            HOLD,
        );
        let s = |n| Duration::from_secs(n);
        let (b, _) = step(
            Some(&a),
            &reading(Pci::AllOnes, counters(0, 0, &[])),
            t0 + s(5),
            w0 + s(5),
            HOLD,
        );
        let (c, notes) = step(
            Some(&b),
            &reading(Pci::Gone, Counters::default()),
            t0 + s(9),
            w0 + s(9),
            HOLD,
        );
        assert!(matches!(notes[..], [Note::Reason(_)]), "{notes:?}");
        match c.health {
            Health::Unhealthy { since, .. } => assert_eq!(since, w0 + s(5)),
            h => panic!("{h:?}"),
        }
    }
}
