//! `accel-ctk labels`: node labels for every profile that finds devices, written as a Node
//! Feature Discovery local feature file (what NVIDIA's GPU feature discovery and Enflame's
//! gcu-feature-discovery each do for one vendor).
//!
//! NFD's `local` source (source/local/local.go) reads every non-hidden regular file in
//! `features.d`, one `name=value` per line (`name` alone means `true`), `#` lines comments
//! except directives `# +<directive>`; after `# +expiry-time=<RFC3339>` the lines are dropped
//! once that time has passed, so labels of a node whose writer stopped go away. A name
//! without a prefix is given NFD's `feature.node.kubernetes.io/`. The file is replaced with a
//! rename (src/atomic.rs), its temp file hidden (`.name…`), so NFD never reads half of one.
//!
//! Names (`<p>` the profile's name; docs/operating.md lists them): `accel-<p>.present`,
//! `.count`, `.model` (PCI `vendor-device` ids, DRM-class profiles, when every device is the
//! same), `.driver-version`, `.numa-nodes` (`0_1`), `.pcie-switches` (switch groups),
//! `.pcie-switch-sizes` (`4_4`), `.sharing` (`none` or `time-slicing`), `.replicas`.
//! A profile that finds no device has no labels: `DoesNotExist` in a node affinity selects
//! nodes without it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;

use crate::config::Config;
use crate::discovery::drm::pci_model;

/// Where NFD's worker reads local feature files (its default `features.d`).
pub const DEFAULT_OUTPUT: &str =
    "/etc/kubernetes/node-feature-discovery/features.d/accel-container-runtime";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// File to write, replaced atomically (`-`: print to stdout).
    #[arg(long, default_value = DEFAULT_OUTPUT)]
    pub output: PathBuf,
    /// How long NFD keeps the labels unless this runs again (`1h`, `30m`).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub expiry: Duration,
}

/// A label value as Kubernetes allows one: at most 63 of `[A-Za-z0-9._-]`, starting and
/// ending alphanumeric; other characters become `_`. `None` when nothing is left.
fn value(raw: &str) -> Option<String> {
    let v: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    let v = v.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    (!v.is_empty()).then(|| v.to_string())
}

/// The labels, sorted by name, of every profile in `config` that finds devices; with the
/// discovery errors (that profile's labels are left out).
pub fn labels(config: &Config) -> (BTreeMap<String, String>, Vec<String>) {
    let listing = super::list::collect(config);
    let mut out = BTreeMap::new();
    for profile in &config.profiles {
        let rows: Vec<_> = listing
            .devices
            .iter()
            .filter(|r| r.vendor == profile.name)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let mut put = |name: &str, v: Option<String>| {
            if let Some(v) = v.as_deref().and_then(value) {
                out.insert(format!("accel-{}.{name}", profile.name), v);
            }
        };
        put("present", Some("true".into()));
        put("count", Some(rows.len().to_string()));
        let models: BTreeSet<Option<String>> = rows
            .iter()
            .map(|r| pci_model(profile, r.pci_bus_id.as_deref()?))
            .collect();
        if let [Some(model)] = models.into_iter().collect::<Vec<_>>().as_slice() {
            put("model", Some(model.clone()));
        }
        put("driver-version", rows[0].driver_version.clone());
        let numa: BTreeSet<u32> = rows.iter().filter_map(|r| r.numa_node).collect();
        if !numa.is_empty() {
            let list: Vec<String> = numa.iter().map(u32::to_string).collect();
            put("numa-nodes", Some(list.join("_")));
        }
        let mut switches: BTreeMap<&str, usize> = BTreeMap::new();
        for sw in rows.iter().filter_map(|r| r.switch.as_deref()) {
            *switches.entry(sw).or_default() += 1;
        }
        put("pcie-switches", Some(switches.len().to_string()));
        if !switches.is_empty() {
            let sizes: Vec<String> = switches.values().map(usize::to_string).collect();
            put("pcie-switch-sizes", Some(sizes.join("_")));
        }
        let shared = profile.replicas > 1;
        put(
            "sharing",
            Some(if shared { "time-slicing" } else { "none" }.into()),
        );
        if shared {
            put("replicas", Some(profile.replicas.to_string()));
        }
    }
    let errors = listing
        .errors
        .iter()
        .map(|e| format!("{}: {}", e.vendor, e.error))
        .collect();
    (out, errors)
}

/// The feature file's text: the expiry directive, then one `name=value` per line.
pub fn render(labels: &BTreeMap<String, String>, expires: SystemTime) -> String {
    let mut text = format!(
        "# Written by accel-ctk labels; replaced whole on each run.\n# +expiry-time={}\n",
        humantime::format_rfc3339_seconds(expires)
    );
    for (k, v) in labels {
        text.push_str(&format!("{k}={v}\n"));
    }
    text
}

/// Writes `config`'s labels to `output` (its directory made), replacing it with a rename;
/// returns the discovery errors (those profiles' labels left out). Also the device plugin's
/// `--nfd-labels`.
pub fn write(
    config: &Config,
    output: &std::path::Path,
    expiry: Duration,
) -> anyhow::Result<Vec<String>> {
    let (labels, errors) = labels(config);
    let text = render(&labels, SystemTime::now() + expiry);
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    crate::atomic::replace(output, text.as_bytes(), 0o644)
        .with_context(|| format!("writing {}", output.display()))?;
    Ok(errors)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = super::load_config()?;
    let errors = if args.output.as_os_str() == "-" {
        let (labels, errors) = labels(&config);
        print!("{}", render(&labels, SystemTime::now() + args.expiry));
        errors
    } else {
        write(&config, &args.output, args.expiry)?
    };
    for e in &errors {
        eprintln!("accel-ctk: {e} (its labels are left out)");
    }
    Ok(if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_what_kubernetes_accepts() {
        assert_eq!(value("550.54.14").as_deref(), Some("550.54.14"));
        assert_eq!(
            value("NVIDIA H100 80GB").as_deref(),
            Some("NVIDIA_H100_80GB")
        );
        assert_eq!(value("-x-").as_deref(), Some("x"));
        assert_eq!(value("//"), None);
        assert_eq!(value(&"a".repeat(80)).unwrap().len(), 63);
    }

    #[test]
    fn render_puts_the_expiry_first() {
        let mut l = BTreeMap::new();
        l.insert("accel-amd.count".to_string(), "8".to_string());
        let t = render(&l, SystemTime::UNIX_EPOCH + Duration::from_secs(86400));
        assert_eq!(
            t.lines().nth(1),
            Some("# +expiry-time=1970-01-02T00:00:00Z")
        );
        assert!(t.ends_with("accel-amd.count=8\n"));
    }
}
