//! Vendor tools that report device health where the kernel's signals do not: Enflame's
//! `efsmi` and Ascend's `npu-smi`. The tool is run as every vendor CLI is
//! ([`crate::vendortool`]: found in the profile's binary-search-dirs under driver-root, run
//! there with a time limit, killed with its process group past it), once per interval for
//! all of the profile's devices, never per device, on a thread of its own so a slow tool
//! never holds up a check: the engine uses the last answer it gave.
//!
//! A device the tool lists with a health other than its healthy word is unhealthy, the
//! reason naming the tool's words (`npu-smi reports "Alarm"`). Devices are matched by PCI
//! bus id, which both tools print. A tool that is missing, hangs, fails or prints nothing
//! this module reads judges nothing (every device as the other signals say) and is said in
//! the log once, until it answers again.
//!
//! What each tool prints:
//! - `npu-smi info` (Ascend's documented table, hiascend.com "npu-smi info"): per NPU a row
//!   `| <npu> <name> | <Health> | ...` then a row `| <chip> | <bus id> | ...`; Health is `OK`,
//!   `Warning`, `Alarm` or `Critical`.
//! - `efsmi`: Enflame documents no machine-readable health output (config/profiles/
//!   enflame.toml says the same of its metrics), so this is this project's declaration, as
//!   the exporter's: `--query-gcu=bus_id,health --format=csv,noheader,nounits`, one row
//!   `<bus id>, <health>` per GCU, healthy when `OK`. An efsmi that prints anything else
//!   judges nothing; point a wrapper script of that name at your release's output.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::reason::{Kind, Problem};
pub use super::wing::Format;
use super::wing::HealthWing;
use crate::profile::Profile;
use crate::topology::normalize_bdf;

/// One vendor's health tool, as its profile's `[health.tool]` names it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub binary: String,
    pub args: Vec<String>,
    pub format: Format,
    /// It is killed, with its process group, past this.
    pub timeout: Duration,
}

/// The health tool of a profile, from its `[health.tool]`; `None` where it names none, or
/// where the table does not read (a daemon refuses that at its start, naming the key).
pub fn of(profile: &Profile) -> Option<Tool> {
    let (w, _) = HealthWing::of(profile).ok()?;
    let t = w.tool?;
    Some(Tool {
        format: t.format(),
        timeout: t.timeout(),
        binary: t.binary,
        args: t.args,
    })
}

/// A health word that means healthy.
fn healthy_word(w: &str) -> bool {
    w.eq_ignore_ascii_case("OK")
}

/// The tool's words, short and printable, for a reason.
fn shown(w: &str) -> String {
    w.chars()
        .filter(|c| !c.is_control())
        .take(40)
        .collect::<String>()
}

fn looks_like_bdf(s: &str) -> bool {
    crate::discovery::is_bdf(&normalize_bdf(s))
}

/// Each device the output lists, by normalized bus id, with its health words.
pub fn parse(format: Format, text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match format {
        Format::BusHealthCsv => {
            for line in text.lines() {
                let mut cols = line.split(',').map(str::trim);
                if let (Some(bus), Some(health)) = (cols.next(), cols.next()) {
                    if looks_like_bdf(bus) && !health.is_empty() {
                        out.insert(normalize_bdf(bus), health.to_string());
                    }
                }
            }
        }
        Format::NpuSmiInfo => {
            // An NPU's row (id and name, then Health), then its chip's row (chip id, then
            // the bus id).
            let mut health: Option<String> = None;
            for line in text.lines() {
                let cells: Vec<&str> = line
                    .trim()
                    .trim_matches('|')
                    .split('|')
                    .map(str::trim)
                    .collect();
                if cells.len() < 2 {
                    continue;
                }
                let first: Vec<&str> = cells[0].split_whitespace().collect();
                let numbered = first.first().is_some_and(|t| t.parse::<u32>().is_ok());
                if !numbered {
                    continue;
                }
                if first.len() >= 2 {
                    health = Some(cells[1].to_string()).filter(|h| !h.is_empty());
                } else if let (Some(h), true) = (health.take(), looks_like_bdf(cells[1])) {
                    out.insert(normalize_bdf(cells[1]), h);
                }
            }
        }
    }
    out
}

/// Runs `tool` for `profile` now, within its time limit: each device it lists with its
/// health words, or why it judges nothing.
pub fn run_once(profile: &Profile, tool: &Tool) -> Result<BTreeMap<String, String>, String> {
    let Some((program, chroot)) = crate::vendortool::locate(profile, &tool.binary) else {
        return Err(format!(
            "{} is in none of binary-search-dirs under {}",
            tool.binary,
            profile.driver_root.display()
        ));
    };
    let out = crate::vendortool::run(&program, chroot.as_deref(), &tool.args, tool.timeout)
        .map_err(|(_, detail)| detail)?;
    let found = parse(tool.format, &String::from_utf8_lossy(&out));
    if found.is_empty() {
        return Err(format!(
            "{} printed no device's health this engine reads",
            tool.binary
        ));
    }
    Ok(found)
}

/// Why each device the tool reports unhealthy is: `<tool> reports "<words>"`.
pub fn reasons(tool: &Tool, found: &BTreeMap<String, String>) -> BTreeMap<String, Problem> {
    found
        .iter()
        .filter(|(_, w)| !healthy_word(w))
        .map(|(bus, w)| {
            (
                bus.clone(),
                Problem::new(
                    Kind::Tool(tool.binary.clone()),
                    format!("{} reports {:?}", tool.binary, shown(w)),
                ),
            )
        })
        .collect()
}

#[derive(Debug, Default)]
struct State {
    /// The profile's tool, read from its `[health.tool]` at the first call.
    tool: Option<Option<Tool>>,
    /// The run under way, its answer to come.
    running: Option<mpsc::Receiver<Result<BTreeMap<String, String>, String>>>,
    started: Option<Instant>,
    /// The last answer's unhealthy devices, by bus id, with why.
    unhealthy: BTreeMap<String, Problem>,
    /// The failure said last, until the tool answers again.
    said: Option<String>,
}

/// One profile's tool, run at most once per interval on a thread of its own.
#[derive(Debug, Default)]
pub struct Poller {
    state: Mutex<State>,
}

impl Poller {
    /// The devices the tool said unhealthy at its last answer (bus id → reason), a new run
    /// started where `interval` has passed since the last one began and none is under way.
    /// Empty for a profile without a tool.
    pub fn unhealthy(&self, profile: &Profile, interval: Duration) -> BTreeMap<String, Problem> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tool) = st.tool.get_or_insert_with(|| of(profile)).clone() else {
            return BTreeMap::new();
        };
        if let Some(rx) = &st.running {
            match rx.try_recv() {
                Ok(answer) => {
                    st.running = None;
                    match answer {
                        Ok(found) => {
                            if st.said.take().is_some() {
                                log::info!("{}: {} answers again", profile.name, tool.binary);
                            }
                            st.unhealthy = reasons(&tool, &found);
                        }
                        Err(why) => {
                            if st.said.as_deref() != Some(why.as_str()) {
                                log::warn!(
                                    "{}: health from {}: {why}; it judges no device until it answers",
                                    profile.name,
                                    tool.binary
                                );
                                st.said = Some(why);
                            }
                            st.unhealthy.clear();
                        }
                    }
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => st.running = None,
            }
        }
        let due = st.started.is_none_or(|t| t.elapsed() >= interval);
        if st.running.is_none() && due {
            let (tx, rx) = mpsc::channel();
            let p = profile.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{}-health", tool.binary))
                .spawn(move || {
                    let _ = tx.send(run_once(&p, &tool));
                });
            if spawned.is_ok() {
                st.running = Some(rx);
            }
            st.started = Some(Instant::now());
        }
        st.unhealthy.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NPU_SMI: &str = "\
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.0                   Version: 23.0.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.1        40                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Alarm         | 90.2        41                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
";

    #[test]
    fn npu_smi_info_and_the_efsmi_csv_are_read_by_bus_id() {
        let found = parse(Format::NpuSmiInfo, NPU_SMI);
        assert_eq!(
            found,
            BTreeMap::from([
                ("0000:c1:00.0".to_string(), "OK".to_string()),
                ("0000:c2:00.0".to_string(), "Alarm".to_string()),
            ])
        );
        let tool = Tool {
            binary: "npu-smi".into(),
            args: Vec::new(),
            format: Format::NpuSmiInfo,
            timeout: Duration::from_secs(1),
        };
        let r = reasons(&tool, &found);
        assert_eq!(r.keys().collect::<Vec<_>>(), ["0000:c2:00.0"]);
        assert_eq!(r["0000:c2:00.0"].text, "npu-smi reports \"Alarm\"");
        assert_eq!(r["0000:c2:00.0"].kind, Kind::Tool("npu-smi".into()));
        let csv = "0000:10:00.0, OK\n0000:11:00.0, Fault\x1b[0m\nnot a row\n, OK\n";
        assert_eq!(
            parse(Format::BusHealthCsv, csv),
            BTreeMap::from([
                ("0000:10:00.0".to_string(), "OK".to_string()),
                ("0000:11:00.0".to_string(), "Fault\x1b[0m".to_string()),
            ])
        );
        let efsmi = Tool {
            binary: "efsmi".into(),
            format: Format::BusHealthCsv,
            ..tool
        };
        assert_eq!(
            reasons(&efsmi, &parse(Format::BusHealthCsv, csv))["0000:11:00.0"].text,
            "efsmi reports \"Fault[0m\""
        );
        assert!(parse(Format::BusHealthCsv, "efsmi: unknown option\n").is_empty());
    }

    /// The shipped profile `name` with the last line of its `[health.tool]` (its
    /// `timeout-seconds`) replaced by `last`.
    fn profile_with_tool(name: &str, last: &str) -> Profile {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("config/profiles")
            .join(format!("{name}.toml"));
        let text = std::fs::read_to_string(path).unwrap();
        let at = text.find("[health.tool]").unwrap();
        let (head, tail) = text.split_at(at);
        let tail = tail.replacen("timeout-seconds = 5\n", &format!("{last}\n"), 1);
        Profile::from_text(&format!("{head}{tail}"), name)
            .unwrap()
            .0
    }

    /// Each shipped profile's tool, and one whose time limit config.toml's override set.
    #[test]
    fn the_tools_come_from_the_profiles_health_tables() {
        let builtin = crate::config::Config::builtin();
        let efsmi = of(builtin.profile("enflame").unwrap()).unwrap();
        assert_eq!(
            (efsmi.binary.as_str(), efsmi.format, efsmi.timeout),
            ("efsmi", Format::BusHealthCsv, Duration::from_secs(5))
        );
        assert_eq!(
            efsmi.args,
            ["--query-gcu=bus_id,health", "--format=csv,noheader,nounits"]
        );
        // Not built in: read from its file in profiles-dir.
        let npu = of(&profile_with_tool("ascend", "timeout-seconds = 5")).unwrap();
        assert_eq!(
            (npu.binary.as_str(), npu.args.as_slice(), npu.format),
            ("npu-smi", &["info".to_string()][..], Format::NpuSmiInfo)
        );
        assert_eq!(of(builtin.profile("nvidia").unwrap()), None);
        let short = profile_with_tool("enflame", "timeout-seconds = 0.5");
        assert_eq!(of(&short).unwrap().timeout, Duration::from_millis(500));
    }

    /// A simulated driver root with busybox as its `sh` and `sleep`, `efsmi` the script given,
    /// and the enflame profile's tool limited to `timeout` seconds.
    fn root_with_efsmi(script: &str, timeout: &str) -> (tempfile::TempDir, Profile) {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("bin")).unwrap();
        std::fs::create_dir_all(t.path().join("usr/bin")).unwrap();
        for applet in ["sh", "sleep"] {
            std::fs::copy("/bin/busybox", t.path().join("bin").join(applet)).unwrap();
        }
        let efsmi = t.path().join("usr/bin/efsmi");
        std::fs::write(&efsmi, format!("#!/bin/sh\n{script}")).unwrap();
        std::fs::set_permissions(&efsmi, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut p = profile_with_tool("enflame", &format!("timeout-seconds = {timeout}"));
        p.driver_root = t.path().to_path_buf();
        (t, p)
    }

    /// The tool run in the simulated driver root (chrooted, as on a host): one GCU reported
    /// unhealthy with the tool's words; one that hangs is killed at the profile's limit (1 s
    /// here, not the shipped 5) and judges nothing; one that is missing says so. Needs root
    /// (chroot).
    #[test]
    fn a_stand_in_efsmi_reports_a_gcu_and_one_that_hangs_is_killed() {
        let (_t, p) = root_with_efsmi(
            "[ \"$1\" = --query-gcu=bus_id,health ] || exit 2\n\
             echo '0000:10:00.0, OK'\necho '0000:11:00.0, Fault'\n",
            "5",
        );
        let tool = of(&p).unwrap();
        let found = run_once(&p, &tool).unwrap();
        let r = reasons(&tool, &found);
        assert_eq!(r.keys().collect::<Vec<_>>(), ["0000:11:00.0"]);
        assert_eq!(r["0000:11:00.0"].text, "efsmi reports \"Fault\"");
        // Through the poller: the first call starts the run, a later one has its answer.
        let poller = Poller::default();
        let t = Instant::now();
        let unhealthy = loop {
            let u = poller.unhealthy(&p, Duration::from_secs(3600));
            if !u.is_empty() {
                break u;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no answer");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(unhealthy["0000:11:00.0"].text, "efsmi reports \"Fault\"");

        let (_t, p) = root_with_efsmi("echo '0000:11:00.0, Fault'\nexec sleep 60\n", "1");
        let tool = of(&p).unwrap();
        let t = Instant::now();
        let e = run_once(&p, &tool).unwrap_err();
        assert!(e.contains("still running after 1s; killed"), "{e}");
        assert!(
            t.elapsed() >= Duration::from_secs(1) && t.elapsed() < Duration::from_secs(3),
            "{:?}",
            t.elapsed()
        );

        let mut gone = p.clone();
        gone.binary_search_dirs = vec!["/nowhere".into()];
        assert!(run_once(&gone, &tool)
            .unwrap_err()
            .starts_with("efsmi is in none of binary-search-dirs"));
    }
}
