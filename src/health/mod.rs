//! One health engine for the device plugin, the DRA driver, the exporter and `accel-ctk`:
//! per device, [`Health::Healthy`] or [`Health::Unhealthy`] with a reason and since when,
//! decided ([`decide`]) from signals read on the host ([`signals`]).
//!
//! A [`Monitor`] is one profile's engine in one process: it keeps each device's baselines,
//! verdict and hold-down between checks, and says each transition in the log once. Each check
//! reads the nodes' signal (cheap, and what inotify reports at once); the sysfs signals are
//! read again only once [`Settings::interval`] has passed for that device, so a daemon that
//! checks often costs no more sysfs reads. Callers check from the loop they already run: no
//! thread or process per device.

pub mod decide;
#[cfg(feature = "plugin")]
pub mod nvml;
pub mod reason;
pub mod signals;
pub mod tools;
pub mod wing;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::inroot::Root;
use crate::profile::Profile;
use crate::topology::Node;

pub use decide::Health;
use decide::{Counters, Pci, Reading, Tracked};
pub use reason::{Kind, Problem, Reason, Severity};

/// How often sysfs is read and how long a device is held down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The sysfs signals of a device are read at most this often.
    pub interval: Duration,
    /// How long every signal of a device must stay clear, after a hardware signal, before it
    /// is healthy again.
    pub hold_down: Duration,
}

impl Settings {
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
    pub const DEFAULT_HOLD_DOWN: Duration = Duration::from_secs(30);
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            interval: Settings::DEFAULT_INTERVAL,
            hold_down: Settings::DEFAULT_HOLD_DOWN,
        }
    }
}

/// One device, as the engine is shown it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// What it is known by while on the node (the device table's stable name): the key of
    /// what is kept of it, and the name in the log.
    pub name: &'a str,
    pub pci_bus_id: Option<&'a str>,
    pub nodes: &'a [Node],
    pub host_nodes: &'a [PathBuf],
}

/// What is kept of one device.
#[derive(Debug)]
struct Kept {
    tracked: Tracked,
    /// The bus id seen last: a device whose function left sysfs may no longer be found by
    /// it, and is still that function.
    bdf: Option<String>,
    /// The last sysfs read and when it was made.
    pci: (Pci, Counters),
    /// What the kernel driver said of the function at that read (`[health.drm]`).
    drm: Vec<Problem>,
    read_at: Option<Instant>,
}

/// One profile's health engine (see the module's doc).
#[derive(Debug)]
pub struct Monitor {
    settings: Settings,
    devices: Mutex<HashMap<String, Kept>>,
    /// The profiles' vendor libraries (NVML), by profile name, where [`Monitor::with_nvml`]
    /// asked for them.
    #[cfg(feature = "plugin")]
    nvml: Option<Mutex<HashMap<String, NvmlState>>>,
    /// The profile's vendor tool ([`tools`]), run once per interval for all devices; `None`
    /// in a one-shot check, which would leave the tool running behind it.
    tools: Option<tools::Poller>,
    /// Each profile's `[health.drm]`, by profile name, read at its first check.
    drm: Mutex<HashMap<String, Option<std::sync::Arc<wing::DrmHealth>>>>,
}

/// A profile's NVML for the engine: started, or why not and when it was last tried.
#[cfg(feature = "plugin")]
#[derive(Debug)]
enum NvmlState {
    Off,
    On(std::sync::Arc<nvml::Watch>),
    Failed(Instant, String),
}

/// How long after NVML failed to load it is tried again.
#[cfg(feature = "plugin")]
const NVML_RETRY: Duration = Duration::from_secs(60);

impl Monitor {
    pub fn new(settings: Settings) -> Monitor {
        Monitor {
            settings,
            devices: Mutex::new(HashMap::new()),
            #[cfg(feature = "plugin")]
            nvml: None,
            tools: Some(tools::Poller::default()),
            drm: Mutex::new(HashMap::new()),
        }
    }

    /// `profile`'s `[health.drm]`, read once; `None` where it has none (or it does not read:
    /// a daemon refuses that at its start).
    fn drm(&self, profile: &Profile) -> Option<std::sync::Arc<wing::DrmHealth>> {
        let mut all = self.drm.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(profile.name.clone())
            .or_insert_with(|| {
                wing::HealthWing::of(profile)
                    .ok()
                    .and_then(|(w, _)| w.drm)
                    .map(std::sync::Arc::new)
            })
            .clone()
    }

    /// This engine reads the NVML signals of the profiles whose `[health.nvml]` asks for them
    /// (the daemons'; `accel-ctk list`, run once, does not): the library loaded at the first
    /// check of the profile, with one event thread.
    #[cfg(feature = "plugin")]
    pub fn with_nvml(mut self) -> Monitor {
        self.nvml = Some(Mutex::new(HashMap::new()));
        self
    }

    /// `profile`'s NVML, started at its first call; `None` where it has none or it failed
    /// (said once, tried again after [`NVML_RETRY`]).
    #[cfg(feature = "plugin")]
    fn nvml(&self, profile: &Profile) -> Option<std::sync::Arc<nvml::Watch>> {
        let mut all = self
            .nvml
            .as_ref()?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let state = all.get(&profile.name);
        match state {
            Some(NvmlState::On(w)) => return Some(w.clone()),
            Some(NvmlState::Off) => return None,
            Some(NvmlState::Failed(at, _)) if at.elapsed() < NVML_RETRY => return None,
            _ => {}
        }
        let cfg = match wing::HealthWing::of(profile) {
            Ok((w, _)) => w.nvml,
            Err(_) => None,
        };
        let Some(cfg) = cfg else {
            all.insert(profile.name.clone(), NvmlState::Off);
            return None;
        };
        let new = match nvml::Watch::start(profile, &cfg) {
            Ok(w) => NvmlState::On(std::sync::Arc::new(w)),
            Err(e) => {
                let said = matches!(state, Some(NvmlState::Failed(_, m)) if *m == e);
                if !said {
                    log::warn!(
                        "{}: NVML not read ({e}); tried again every {}s, each GPU judged by \
                         its other signals",
                        profile.name,
                        NVML_RETRY.as_secs()
                    );
                }
                NvmlState::Failed(Instant::now(), e)
            }
        };
        let w = match &new {
            NvmlState::On(w) => Some(w.clone()),
            _ => None,
        };
        all.insert(profile.name.clone(), new);
        w
    }

    /// This engine without the vendor tools, for a check made once (`accel-ctk list`): a tool
    /// is run on a thread of its own, and the process would end before its answer.
    pub fn without_tools(mut self) -> Monitor {
        self.tools = None;
        self
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Each device's health now, in the order given. The first check of a device takes its
    /// counts as the baseline.
    pub fn check(&self, profile: &Profile, subjects: &[Subject<'_>]) -> Vec<Health> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut root: Option<Option<Root>> = None;
        let drm = self.drm(profile);
        #[cfg(feature = "plugin")]
        let nvml = self.nvml(profile);
        let reported = self
            .tools
            .as_ref()
            .map(|t| t.unhealthy(profile, self.settings.interval))
            .unwrap_or_default();
        let mut kept = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        subjects
            .iter()
            .map(|s| {
                let nodes = signals::nodes_problem(profile, s.nodes, s.host_nodes);
                let k = kept.entry(s.name.to_string()).or_insert_with(|| Kept {
                    tracked: Tracked {
                        health: Health::Healthy,
                        baseline: Counters::default(),
                        present: true,
                        seen: false,
                        held: None,
                        nonfatal_said: None,
                    },
                    bdf: None,
                    pci: (Pci::Unknown, Counters::default()),
                    drm: Vec::new(),
                    read_at: None,
                });
                let first = k.read_at.is_none();
                if let Some(b) = s.pci_bus_id {
                    k.bdf = Some(crate::topology::normalize_bdf(b));
                }
                let due = k
                    .read_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.settings.interval);
                if due {
                    let root = root.get_or_insert_with(|| Root::open(&profile.driver_root).ok());
                    k.pci = match (root.as_ref(), k.bdf.as_deref()) {
                        (Some(r), Some(b)) => signals::read_pci(r, b),
                        _ => (Pci::Unknown, Counters::default()),
                    };
                    k.drm = match (root.as_ref(), k.bdf.as_deref(), drm.as_deref()) {
                        (Some(r), Some(b), Some(c)) => signals::read_drm(r, b, c),
                        _ => Vec::new(),
                    };
                    k.read_at = Some(now);
                }
                #[cfg(feature = "plugin")]
                let vendor = match (&nvml, k.bdf.as_deref()) {
                    (Some(w), Some(b)) => w.read(b, due),
                    _ => Vec::new(),
                };
                #[cfg(not(feature = "plugin"))]
                let vendor = Vec::new();
                // A tool's report is read as the nodes' signal is: not held down, clear as
                // soon as the tool says so.
                let told = k.bdf.as_deref().and_then(|b| reported.get(b));
                let nodes: Vec<Problem> = nodes.into_iter().chain(told.cloned()).collect();
                let reading = Reading {
                    nodes,
                    bdf: k.bdf.clone(),
                    pci: k.pci.0,
                    counters: k.pci.1.clone(),
                    nvml: vendor,
                    drm: k.drm.clone(),
                };
                let prev = (!first).then_some(&k.tracked);
                let (tracked, notes) =
                    decide::step(prev, &reading, now, wall, self.settings.hold_down);
                for n in notes {
                    let shown: String = s.name.chars().take(80).collect();
                    match n {
                        decide::Note::Unhealthy(_) | decide::Note::NonFatal { .. } => {
                            log::warn!("{}: device {shown:?} {n}", profile.name)
                        }
                        _ => log::info!("{}: device {shown:?} {n}", profile.name),
                    }
                }
                k.tracked = tracked;
                k.tracked.health.clone()
            })
            .collect()
    }

    /// [`Monitor::check`] of every device of the profile now (a table discovered afresh): a
    /// device not among `subjects` has left the node's table and is forgotten, so that when
    /// it comes back it is a device new to the node, read afresh (its function not yet back
    /// in sysfs then is no signal). A caller whose table keeps every device it has seen (the
    /// device plugin's) calls [`Monitor::check`].
    pub fn check_all(&self, profile: &Profile, subjects: &[Subject<'_>]) -> Vec<Health> {
        let health = self.check(profile, subjects);
        let now: std::collections::HashSet<&str> = subjects.iter().map(|s| s.name).collect();
        self.devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| now.contains(name.as_str()));
        health
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in Enflame profile with its driver root at `root`, its driver taken as loaded.
    fn enflame_under(root: &std::path::Path) -> Profile {
        let mut p = crate::config::Config::builtin()
            .profile("enflame")
            .unwrap()
            .clone();
        p.driver_root = root.to_path_buf();
        p.version_file = None;
        p
    }

    /// The engine over a simulated root: a device's fatal count bumped is unhealthy at the
    /// next sysfs read (not before the interval), the other stays healthy; a function removed
    /// and brought back with its counts at zero is healthy after the hold-down.
    #[test]
    fn monitor_reads_at_its_interval_and_keeps_the_bus_id() {
        let t = tempfile::tempdir().unwrap();
        let profile = enflame_under(t.path());
        let devs = ["0000:11:00.0", "0000:12:00.0"];
        for b in devs {
            let d = t.path().join("sys/bus/pci/devices").join(b);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("aer_dev_fatal"), "TOTAL_ERR_FATAL 4\n").unwrap();
        }
        let m = Monitor::new(Settings {
            interval: Duration::from_millis(200),
            hold_down: Duration::from_millis(400),
        });
        let subjects = |known: bool| -> Vec<Subject<'static>> {
            devs.iter()
                .enumerate()
                .map(|(i, b)| Subject {
                    name: ["1", "2"][i],
                    pci_bus_id: known.then_some(*b),
                    nodes: &[],
                    host_nodes: &[],
                })
                .collect()
        };
        let healthy = |h: &[Health]| h.iter().map(Health::is_healthy).collect::<Vec<_>>();
        assert_eq!(healthy(&m.check(&profile, &subjects(true))), [true, true]);
        let one = t.path().join("sys/bus/pci/devices").join(devs[0]);
        std::fs::write(one.join("aer_dev_fatal"), "TOTAL_ERR_FATAL 5\n").unwrap();
        assert_eq!(
            healthy(&m.check(&profile, &subjects(true))),
            [true, true],
            "not read again before the interval"
        );
        std::thread::sleep(Duration::from_millis(250));
        let h = m.check(&profile, &subjects(true));
        assert_eq!(healthy(&h), [false, true]);
        assert!(h[0]
            .reason_text()
            .unwrap()
            .contains("1 fatal PCIe (AER) error"));
        assert_eq!(h[0].reason().unwrap().label(), "aer-fatal");

        // Gone, and no longer found by its bus id (a fresh discovery has none for it).
        std::fs::remove_dir_all(&one).unwrap();
        std::thread::sleep(Duration::from_millis(250));
        let h = m.check(&profile, &subjects(false));
        assert_eq!(
            h[0].reason_text(),
            Some("PCI function 0000:11:00.0 is gone from sysfs")
        );
        std::fs::create_dir_all(&one).unwrap();
        std::fs::write(one.join("aer_dev_fatal"), "TOTAL_ERR_FATAL 0\n").unwrap();
        std::thread::sleep(Duration::from_millis(250));
        let back = Instant::now();
        assert!(!m.check(&profile, &subjects(true))[0].is_healthy(), "held");
        loop {
            if m.check(&profile, &subjects(true))[0].is_healthy() {
                break;
            }
            assert!(back.elapsed() < Duration::from_secs(3), "never back");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            back.elapsed() >= Duration::from_millis(400),
            "{:?}",
            back.elapsed()
        );
    }

    /// An xe GPU (the intel-xe profile's `[health.drm]`) in survivability mode is unhealthy
    /// at the next sysfs read, held down once the mode is gone, healthy after; its function
    /// bound to vfio-pci is unhealthy naming it, gone with the function at once.
    #[test]
    fn an_xe_gpu_in_survivability_mode_is_held_down_like_the_others() {
        let t = tempfile::tempdir().unwrap();
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles/intel-xe.toml");
        let (mut profile, _) =
            Profile::from_text(&std::fs::read_to_string(path).unwrap(), "intel-xe").unwrap();
        profile.driver_root = t.path().to_path_buf();
        let dir = t.path().join("sys/bus/pci/devices/0000:04:00.0");
        std::fs::create_dir_all(&dir).unwrap();
        let bind = |to: &str| {
            let _ = std::fs::remove_file(dir.join("driver"));
            std::os::unix::fs::symlink(format!("../../drivers/{to}"), dir.join("driver")).unwrap();
        };
        bind("xe");
        let one = [Subject {
            name: "card1",
            pci_bus_id: Some("0000:04:00.0"),
            nodes: &[],
            host_nodes: &[],
        }];
        let m = Monitor::new(Settings {
            interval: Duration::ZERO,
            hold_down: Duration::from_millis(300),
        })
        .without_tools();
        assert!(m.check(&profile, &one)[0].is_healthy());
        std::fs::write(dir.join("survivability_mode"), "Runtime\n").unwrap();
        let h = m.check(&profile, &one);
        let why = h[0].reason().unwrap();
        assert_eq!(
            (why.severity(), why.label().as_str()),
            (Severity::Error, "survivability-mode"),
            "{}",
            why.text()
        );
        std::fs::remove_file(dir.join("survivability_mode")).unwrap();
        let cleared = Instant::now();
        assert!(!m.check(&profile, &one)[0].is_healthy(), "held down");
        while !m.check(&profile, &one)[0].is_healthy() {
            assert!(cleared.elapsed() < Duration::from_secs(3), "never back");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(cleared.elapsed() >= Duration::from_millis(300));

        bind("vfio-pci");
        let h = m.check(&profile, &one);
        assert_eq!(
            h[0].reason_text(),
            Some("PCI function 0000:04:00.0 is bound to \"vfio-pci\", not xe")
        );
        assert_eq!(h[0].reason().unwrap().label(), "driver-unbound");
    }

    /// A device that leaves the table discovered afresh ([`Monitor::check_all`]) and comes
    /// back before its function is back in sysfs is new to the node: no signal, no
    /// hold-down; with [`Monitor::check`] (a table that keeps it) its function's absence is.
    #[test]
    fn a_device_that_left_the_table_comes_back_afresh() {
        let t = tempfile::tempdir().unwrap();
        let profile = enflame_under(t.path());
        let dir = t.path().join("sys/bus/pci/devices/0000:11:00.0");
        std::fs::create_dir_all(&dir).unwrap();
        let one = [Subject {
            name: "1",
            pci_bus_id: Some("0000:11:00.0"),
            nodes: &[],
            host_nodes: &[],
        }];
        let settings = Settings {
            interval: Duration::ZERO,
            hold_down: Duration::from_secs(3600),
        };
        let (all, kept) = (Monitor::new(settings), Monitor::new(settings));
        assert!(all.check_all(&profile, &one)[0].is_healthy());
        assert!(kept.check(&profile, &one)[0].is_healthy());
        std::fs::remove_dir(&dir).unwrap();
        assert!(all.check_all(&profile, &[]).is_empty());
        assert!(
            all.check_all(&profile, &one)[0].is_healthy(),
            "new to the node"
        );
        assert_eq!(
            kept.check(&profile, &one)[0].reason_text(),
            Some("PCI function 0000:11:00.0 is gone from sysfs")
        );
        std::fs::create_dir_all(&dir).unwrap();
        assert!(all.check_all(&profile, &one)[0].is_healthy());
        assert!(!kept.check(&profile, &one)[0].is_healthy(), "held down");
    }
}
