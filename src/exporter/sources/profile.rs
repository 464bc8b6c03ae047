//! A profile's `[metrics]`: where the exporter reads each device's numbers. Read by the
//! exporter alone (a create never parses it), so its keys and checks live here, beside the
//! sources that read them, and not in [`crate::profile`].

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::profile::{has_dotdot, placeholders, plain_name, Profile, ProfileError};

/// The sources of one vendor's device metrics: files the kernel driver publishes, the
/// vendor's management library, the vendor's CLI. Each reading names the metric it gives
/// ([`MetricKind`]) and the factor to its base unit.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Metrics {
    /// Files under driver-root, one reading each per device.
    #[serde(default)]
    pub files: Vec<MetricFile>,
    /// NVIDIA's management library (NVML), loaded from driver-root.
    #[serde(default)]
    pub nvml: Option<MetricNvml>,
    /// Vendor CLIs run with a time limit, their output in a declared format.
    #[serde(default)]
    pub commands: Vec<MetricCommand>,
}

/// What a reading is: the exporter's metric it becomes (src/exporter/families.rs names each
/// family and its unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetricKind {
    /// How busy the device is, 0 to 1.
    Utilization,
    /// How busy its memory (controller) is, 0 to 1.
    MemoryUtilization,
    MemoryUsed,
    MemoryTotal,
    /// Memory used as a share of memory-total, 0 to 1: turned into memory-used bytes where
    /// memory-total is known (Ascend's npu-smi gives only the rate).
    MemoryUsedRatio,
    /// Degrees Celsius; `label` names the sensor (`edge`, `junction`, `memory`).
    Temperature,
    Power,
    PowerLimit,
    /// Joules since some start (a counter).
    Energy,
    /// Hertz; `label` names the clock (`graphics`, `memory`).
    Clock,
    /// A count of errors (a counter); `label` names their kind.
    Errors,
}

impl MetricKind {
    /// Whether a reading of this kind needs a `label` (its series are told apart by it).
    pub fn labelled(self) -> bool {
        matches!(
            self,
            MetricKind::Temperature | MetricKind::Clock | MetricKind::Errors
        )
    }
}

/// One file per device. `path` is container-style under driver-root with the device's
/// placeholders: `{bus}` (PCI bus id), `{card}` (DRM card number), `{index}`, and
/// `{hwmon}` / `{hwmon:NAME}` (the `hwmonN` directory there, the one whose `name` file says
/// NAME). The file holds one number; the reading is that number times `scale`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MetricFile {
    pub metric: MetricKind,
    #[serde(default)]
    pub label: Option<String>,
    pub path: String,
    #[serde(default = "scale_one")]
    pub scale: f64,
    /// A file some of the driver's devices lack: its absence is no error.
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MetricNvml {
    /// The library's soname, found in driver-root as the runtime finds libraries.
    pub library: String,
}

/// A vendor CLI, found in the profile's binary-search-dirs under driver-root and run there.
/// Arguments with a device placeholder (`{index}`, `{bus}`, `{uuid}`, `{minor}`) run it once
/// per device; without, once for all.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MetricCommand {
    pub binary: String,
    #[serde(default)]
    pub args: Vec<String>,
    pub format: CommandFormat,
    /// `csv`: which device a row is, by the field at `key-column` (from 0).
    #[serde(default)]
    pub key: Option<DeviceKey>,
    #[serde(default)]
    pub key_column: Option<usize>,
    /// Killed (its whole process group) past this.
    #[serde(default = "five")]
    pub timeout_seconds: f64,
    pub fields: Vec<CommandField>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandFormat {
    /// One row per device, fields separated by commas.
    Csv,
    /// `Key : value` lines (one device's, from a per-device run).
    KeyValue,
}

/// How a CLI's row names its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKey {
    Index,
    Bus,
    Uuid,
    Minor,
}

/// One number of a CLI's output: at `column` (csv) or after `key` (key-value), its first
/// token parsed as a number, times `scale`. `N/A` and the like are missing values.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct CommandField {
    pub metric: MetricKind,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub column: Option<usize>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default = "scale_one")]
    pub scale: f64,
}

fn scale_one() -> f64 {
    1.0
}

fn five() -> f64 {
    5.0
}

/// The placeholders a metric file's path may hold.
const FILE_PLACEHOLDERS: &[&str] = &["bus", "card", "index", "hwmon"];
/// The placeholders a metric command's arguments may hold.
pub const DEVICE_PLACEHOLDERS: &[&str] = &["index", "bus", "uuid", "minor"];

impl Metrics {
    /// `profile`'s `[metrics]`, checked, with a warning for each key it does not know; `None`
    /// where it declares none.
    pub fn of(profile: &Profile) -> Result<(Option<Metrics>, Vec<String>), ProfileError> {
        let known = crate::keys::fields::<Metrics>()
            .iter()
            .chain(crate::keys::fields::<MetricFile>())
            .chain(crate::keys::fields::<MetricNvml>())
            .chain(crate::keys::fields::<MetricCommand>())
            .chain(crate::keys::fields::<CommandField>())
            .copied()
            .collect::<Vec<_>>();
        let Some((m, warnings)) = profile.wings.read::<Metrics>("metrics", &known)? else {
            return Ok((None, Vec::new()));
        };
        m.validate().map_err(|msg| profile.wings.invalid(msg))?;
        Ok((Some(m), warnings))
    }

    fn validate(&self) -> Result<(), String> {
        let label = |kind: MetricKind, label: &Option<String>, what: &str| {
            if kind.labelled() && label.is_none() {
                return Err(format!("metrics {what}: {kind:?} needs a label"));
            }
            match label {
                Some(l)
                    if l.is_empty()
                        || l.len() > 32
                        || !l
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
                {
                    Err(format!(
                        "metrics {what}: label {l:?} must be 1-32 of [A-Za-z0-9_-]"
                    ))
                }
                _ => Ok(()),
            }
        };
        let scale = |s: f64, what: &str| {
            if s.is_finite() && s > 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "metrics {what}: scale {s} must be a positive number"
                ))
            }
        };
        for f in &self.files {
            let what = format!("file {:?}", f.path);
            let p = Path::new(&f.path);
            if !p.is_absolute() || has_dotdot(p) {
                return Err(format!("{what} must be an absolute path without '..'"));
            }
            for ph in placeholders(&f.path)? {
                let name = ph.split_once(':').map_or(ph, |(n, _)| n);
                if !FILE_PLACEHOLDERS.contains(&name) || (name != "hwmon" && ph.contains(':')) {
                    return Err(format!("metrics {what}: unknown placeholder {{{ph}}}"));
                }
            }
            label(f.metric, &f.label, &what)?;
            scale(f.scale, &what)?;
        }
        if let Some(n) = &self.nvml {
            if !plain_name(&n.library) {
                return Err(format!(
                    "metrics nvml.library {:?} must be a plain file name",
                    n.library
                ));
            }
        }
        for c in &self.commands {
            let what = format!("command {:?}", c.binary);
            if !plain_name(&c.binary) {
                return Err(format!("metrics {what}: binary must be a plain file name"));
            }
            for a in &c.args {
                if let Some(ph) = placeholders(a)?
                    .into_iter()
                    .find(|p| !DEVICE_PLACEHOLDERS.contains(p))
                {
                    return Err(format!("metrics {what}: unknown placeholder {{{ph}}}"));
                }
            }
            if !(c.timeout_seconds.is_finite() && (0.01..=300.0).contains(&c.timeout_seconds)) {
                return Err(format!(
                    "metrics {what}: timeout-seconds {} must be between 0.01 and 300",
                    c.timeout_seconds
                ));
            }
            if c.format == CommandFormat::Csv && (c.key.is_none() || c.key_column.is_none()) {
                return Err(format!("metrics {what}: csv needs key and key-column"));
            }
            for f in &c.fields {
                let ok = match c.format {
                    CommandFormat::Csv => f.column.is_some() && f.key.is_none(),
                    CommandFormat::KeyValue => f.key.is_some() && f.column.is_none(),
                };
                if !ok {
                    return Err(format!(
                        "metrics {what}: each field of a {} output names {}",
                        if c.format == CommandFormat::Csv {
                            "csv"
                        } else {
                            "key-value"
                        },
                        if c.format == CommandFormat::Csv {
                            "a column (and no key)"
                        } else {
                            "a key (and no column)"
                        }
                    ));
                }
                label(f.metric, &f.label, &what)?;
                scale(f.scale, &what)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shipped profile's `[metrics]` reads and checks with no key it does not know.
    #[test]
    fn every_shipped_metrics_table_reads_with_no_unknown_keys() {
        let mut with = Vec::new();
        for p in crate::profile::shipped() {
            let (m, warnings) = Metrics::of(&p).unwrap();
            assert!(warnings.is_empty(), "{}: {warnings:?}", p.name);
            if m.is_some() {
                with.push(p.name);
            }
        }
        with.sort();
        assert_eq!(
            with,
            ["amd", "ascend", "enflame", "hygon", "intel", "intel-xe", "nvidia"]
        );
    }

    #[test]
    fn metric_sources_are_checked() {
        let parse = |metrics: &str| {
            let text = format!(
                "name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{{index}}\"]\n{metrics}"
            );
            let (p, unknown) = Profile::from_text(&text, "t").map_err(|e| e.to_string())?;
            assert!(unknown.is_empty(), "{unknown:?}");
            Metrics::of(&p).map_err(|e| e.to_string())
        };
        let (m, unknown) = parse(
            "[[metrics.files]]\nmetric = \"temperature\"\nlabel = \"edge\"\npath = \"/sys/bus/pci/devices/{bus}/hwmon/{hwmon:amdgpu}/temp1_input\"\nscale = 0.001\n",
        )
        .unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert_eq!(m.unwrap().files[0].metric, MetricKind::Temperature);
        for (bad, says) in [
            ("[[metrics.files]]\nmetric = \"power\"\npath = \"sys/x\"\n", "absolute"),
            ("[[metrics.files]]\nmetric = \"power\"\npath = \"/sys/../etc/x\"\n", "'..'"),
            ("[[metrics.files]]\nmetric = \"power\"\npath = \"/sys/{uuid}/x\"\n", "unknown placeholder"),
            ("[[metrics.files]]\nmetric = \"power\"\npath = \"/sys/{bus/x\"\n", "without"),
            ("[[metrics.files]]\nmetric = \"clock\"\npath = \"/sys/x\"\n", "needs a label"),
            ("[[metrics.files]]\nmetric = \"power\"\npath = \"/sys/x\"\nscale = 0\n", "positive"),
            ("[metrics.nvml]\nlibrary = \"../libnvidia-ml.so.1\"\n", "plain file name"),
            ("[[metrics.commands]]\nbinary = \"/bin/sh\"\nformat = \"key-value\"\nfields = []\n", "plain file name"),
            ("[[metrics.commands]]\nbinary = \"smi\"\nformat = \"csv\"\nfields = []\n", "csv needs key"),
            ("[[metrics.commands]]\nbinary = \"smi\"\nargs = [\"{pid}\"]\nformat = \"key-value\"\nfields = []\n", "unknown placeholder"),
            ("[[metrics.commands]]\nbinary = \"smi\"\nformat = \"key-value\"\ntimeout-seconds = 0.0\nfields = []\n", "timeout-seconds"),
            ("[[metrics.commands]]\nbinary = \"smi\"\nformat = \"key-value\"\nfields = [{ metric = \"power\", column = 1 }]\n", "names a key"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
