//! A profile's `[health]`: the settings of the signals a vendor's own library gives (today
//! NVIDIA's NVML, `[health.nvml]`) and of the vendor tool that reports health
//! (`[health.tool]`: Enflame's `efsmi`, Ascend's `npu-smi`), and what a DRM device's kernel
//! driver says in sysfs (`[health.drm]`: Intel's i915 and xe). Read by the daemons that run the health engine, never by
//! a create, so its keys and checks live here, beside the engine, and not in
//! [`crate::profile`]. A bad value is refused when the daemon starts, naming the key; an
//! unknown key is warned of with the nearest known one.

use serde::Deserialize;

use crate::profile::{Profile, ProfileError};

/// A profile's `[health]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct HealthWing {
    /// NVML's signals (XID and double-bit ECC events, volatile uncorrected ECC counts,
    /// remapped rows, "GPU is lost"); absent: not read.
    #[serde(default)]
    pub nvml: Option<NvmlHealth>,
    /// The vendor tool run for every device's health; absent: none.
    #[serde(default)]
    pub tool: Option<ToolHealth>,
    /// The kernel driver's state of each device's PCI function; absent: not read.
    #[serde(default)]
    pub drm: Option<DrmHealth>,
}

/// `[health.drm]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DrmHealth {
    /// The kernel drivers the PCI function must be bound to (`i915`); bound to none or to
    /// another (`vfio-pci`), it is unhealthy. Empty: not read.
    #[serde(default)]
    pub drivers: Vec<String>,
    /// Whether xe's `survivability_mode` file is looked for.
    #[serde(default)]
    pub survivability_mode: bool,
}

impl DrmHealth {
    fn validate(&self) -> Result<(), String> {
        let plain = |d: &String| {
            !d.is_empty()
                && d.len() <= 64
                && d.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        if let Some(d) = self.drivers.iter().find(|d| !plain(d)) {
            return Err(format!(
                "health.drm.drivers: {} is not a kernel driver's name (i915)",
                crate::quote::quote(d)
            ));
        }
        Ok(())
    }
}

/// How a tool's output is read: the parser's name in `[health.tool] format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `npu-smi info`'s table (`npu-smi-info`).
    NpuSmiInfo,
    /// CSV rows `<bus id>, <health>` (`bus-health-csv`).
    BusHealthCsv,
}

impl Format {
    pub const ALL: [Format; 2] = [Format::NpuSmiInfo, Format::BusHealthCsv];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::NpuSmiInfo => "npu-smi-info",
            Format::BusHealthCsv => "bus-health-csv",
        }
    }

    pub fn parse(s: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// `[health.tool]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ToolHealth {
    /// The tool's file name, found in the profile's binary-search-dirs under driver-root.
    pub binary: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// How its output is read: `npu-smi-info` or `bus-health-csv` ([`Format`]).
    pub format: String,
    /// It is killed, with its process group, past this.
    #[serde(default = "ToolHealth::default_timeout")]
    pub timeout_seconds: f64,
}

impl ToolHealth {
    /// A tool's time limit where the profile gives none.
    pub const DEFAULT_TIMEOUT: f64 = 5.0;
    /// The longest a tool may run: the engine uses its last answer meanwhile, and a limit
    /// past the health interval many times over would leave a device judged by a stale one.
    pub const MAX_TIMEOUT: f64 = 120.0;

    fn default_timeout() -> f64 {
        ToolHealth::DEFAULT_TIMEOUT
    }

    /// The parser, once validated.
    pub fn format(&self) -> Format {
        Format::parse(&self.format).unwrap_or(Format::BusHealthCsv)
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.timeout_seconds)
    }

    fn validate(&self) -> Result<(), String> {
        let b = &self.binary;
        if b.is_empty() || b.len() > 255 || b.contains(['/', '\0']) || b == "." || b == ".." {
            return Err(format!(
                "health.tool.binary: {} is not a file name (efsmi)",
                crate::quote::quote(b)
            ));
        }
        if self.args.len() > 32 {
            return Err(format!(
                "health.tool.args: {} arguments, at most 32",
                self.args.len()
            ));
        }
        if let Some(a) = self.args.iter().find(|a| a.len() > 256 || a.contains('\0')) {
            return Err(format!(
                "health.tool.args: {} is not an argument (at most 256 bytes, no NUL)",
                crate::quote::quote(a)
            ));
        }
        if Format::parse(&self.format).is_none() {
            let names: Vec<&str> = Format::ALL.iter().map(|f| f.as_str()).collect();
            return Err(format!(
                "health.tool.format: {} is not a parser ({})",
                crate::quote::quote(&self.format),
                names.join(", ")
            ));
        }
        let t = self.timeout_seconds;
        if !(t.is_finite() && (0.01..=ToolHealth::MAX_TIMEOUT).contains(&t)) {
            return Err(format!(
                "health.tool.timeout-seconds: {t} must be between 0.01 and {}",
                ToolHealth::MAX_TIMEOUT
            ));
        }
        Ok(())
    }
}

/// `[health.nvml]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct NvmlHealth {
    /// The library's soname, found in the driver root as the runtime finds the driver's
    /// libraries.
    pub library: String,
    /// XIDs a program causes (not the GPU): an event with one of them is logged and ignored.
    #[serde(default = "NvmlHealth::default_xid_ignore")]
    pub xid_ignore: Vec<u64>,
    /// Whether the volatile uncorrected ECC count is read.
    #[serde(default = "yes")]
    pub ecc: bool,
    /// Whether the remapped-rows state (pending, failed) is read.
    #[serde(default = "yes")]
    pub remapped_rows: bool,
    /// An XID clears after this many seconds; absent: only when the GPU was reset (NVML lost
    /// it and reaches it again) or the driver reloaded.
    #[serde(default)]
    pub xid_clear_seconds: Option<u64>,
}

fn yes() -> bool {
    true
}

impl NvmlHealth {
    /// The XIDs NVIDIA's device plugin skips as application errors (13 graphics engine
    /// exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68
    /// video processor exception).
    pub const APPLICATION_XIDS: [u64; 5] = [13, 31, 43, 45, 68];

    fn default_xid_ignore() -> Vec<u64> {
        NvmlHealth::APPLICATION_XIDS.to_vec()
    }

    fn validate(&self) -> Result<(), String> {
        let lib = &self.library;
        if lib.is_empty() || lib.contains('/') || !lib.contains(".so") {
            return Err(format!(
                "health.nvml.library: {} is not a library's file name (libnvidia-ml.so.1)",
                crate::quote::quote(lib)
            ));
        }
        if let Some(x) = self.xid_ignore.iter().find(|&&x| x == 0 || x > 65535) {
            return Err(format!(
                "health.nvml.xid-ignore: {x} is no XID (1 to 65535)"
            ));
        }
        if self.xid_clear_seconds == Some(0) {
            return Err(
                "health.nvml.xid-clear-seconds: 0 would never hold a GPU down; leave it out to \
                 keep an XID until the GPU is reset"
                    .to_string(),
            );
        }
        Ok(())
    }
}

impl HealthWing {
    /// `profile`'s `[health]` with the warnings for its unknown keys; the default (nothing
    /// read) where it has none.
    pub fn of(profile: &Profile) -> Result<(HealthWing, Vec<String>), ProfileError> {
        let known = crate::keys::fields::<HealthWing>()
            .iter()
            .chain(crate::keys::fields::<NvmlHealth>())
            .chain(crate::keys::fields::<ToolHealth>())
            .chain(crate::keys::fields::<DrmHealth>())
            .copied()
            .collect::<Vec<_>>();
        let Some((w, warnings)) = profile.wings.read::<HealthWing>("health", &known)? else {
            return Ok((HealthWing::default(), Vec::new()));
        };
        if let Some(n) = &w.nvml {
            n.validate().map_err(|msg| profile.wings.invalid(msg))?;
        }
        if let Some(t) = &w.tool {
            t.validate().map_err(|msg| profile.wings.invalid(msg))?;
        }
        if let Some(d) = &w.drm {
            d.validate().map_err(|msg| profile.wings.invalid(msg))?;
        }
        // serde_ignored writes the way through an `Option` as `?`: not a key anyone wrote.
        let warnings = warnings.iter().map(|w| w.replace(".?.", ".")).collect();
        Ok((w, warnings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvidia(health: &str) -> Result<(HealthWing, Vec<String>), String> {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles/nvidia.toml");
        let mut text = std::fs::read_to_string(path).unwrap();
        if !health.is_empty() {
            let at = text.find("[health.nvml]").unwrap();
            text.truncate(at);
            text.push_str(health);
        }
        let (p, _) = Profile::from_text(&text, "test").map_err(|e| e.to_string())?;
        HealthWing::of(&p).map_err(|e| e.to_string())
    }

    /// The shipped table: NVML read, the application XIDs ignored, ECC and remap read.
    #[test]
    fn the_shipped_nvidia_table_reads_nvml() {
        let (w, warnings) = nvidia("").unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let n = w.nvml.unwrap();
        assert_eq!(n.library, "libnvidia-ml.so.1");
        assert_eq!(n.xid_ignore, NvmlHealth::APPLICATION_XIDS);
        assert!(n.ecc && n.remapped_rows);
        assert_eq!(n.xid_clear_seconds, None);
    }

    /// A bad value is refused naming its key; an unknown key is warned of with the nearest.
    #[test]
    fn bad_values_are_refused_and_unknown_keys_warned_of() {
        for (table, key) in [
            (
                "library = \"/usr/lib/libnvidia-ml.so.1\"\n",
                "health.nvml.library",
            ),
            (
                "library = \"libnvidia-ml.so.1\"\nxid-ignore = [13, 0]\n",
                "health.nvml.xid-ignore",
            ),
            (
                "library = \"libnvidia-ml.so.1\"\nxid-clear-seconds = 0\n",
                "health.nvml.xid-clear-seconds",
            ),
            ("library = \"libnvidia-ml.so.1\"\necc = \"yes\"\n", "ecc"),
        ] {
            let e = nvidia(&format!("[health.nvml]\n{table}")).unwrap_err();
            assert!(e.contains(key), "{table}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let (w, warnings) =
            nvidia("[health.nvml]\nlibrary = \"libnvidia-ml.so.1\"\nxid-ingore = [79]\n").unwrap();
        assert_eq!(w.nvml.unwrap().xid_ignore, NvmlHealth::APPLICATION_XIDS);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("health.nvml.xid-ingore"),
            "{warnings:?}"
        );
        assert!(warnings[0].contains("xid-ignore"), "{warnings:?}");
    }

    /// The shipped enflame profile with its `[health.tool]` table's body replaced by `body`.
    fn enflame_tool(body: &str) -> Result<(HealthWing, Vec<String>), String> {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles/enflame.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let at = text.find("[health.tool]\n").unwrap() + "[health.tool]\n".len();
        let end = at + text[at..].find("\n\n").unwrap();
        let text = format!("{}{body}{}", &text[..at], &text[end..]);
        let (p, _) = Profile::from_text(&text, "test").map_err(|e| e.to_string())?;
        HealthWing::of(&p).map_err(|e| e.to_string())
    }

    /// `[health.tool]`: the shipped table reads; a bad value is refused naming its key, in one
    /// line; an unknown key is warned of with the nearest; the time limit defaults to 5 s.
    #[test]
    fn the_tool_table_is_checked_key_by_key() {
        let (w, warnings) = enflame_tool(
            "binary = \"efsmi\"\nargs = [\"-q\"]\nformat = \"bus-health-csv\"\ntimeout-seconds = 2.5",
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let t = w.tool.unwrap();
        assert_eq!(t.format(), Format::BusHealthCsv);
        assert_eq!(t.timeout(), std::time::Duration::from_millis(2500));
        let (w, _) = enflame_tool("binary = \"npu-smi\"\nformat = \"npu-smi-info\"").unwrap();
        let t = w.tool.unwrap();
        assert_eq!(t.format(), Format::NpuSmiInfo);
        assert!(t.args.is_empty());
        assert_eq!(t.timeout(), std::time::Duration::from_secs(5));

        let ok = "binary = \"efsmi\"\nformat = \"bus-health-csv\"\n";
        for (body, key) in [
            (
                "binary = \"/usr/bin/efsmi\"\nformat = \"bus-health-csv\"".to_string(),
                "health.tool.binary",
            ),
            (
                "binary = \"..\"\nformat = \"bus-health-csv\"".to_string(),
                "health.tool.binary",
            ),
            (
                "binary = \"efsmi\"\nformat = \"json\"".to_string(),
                "health.tool.format",
            ),
            (
                format!("{ok}timeout-seconds = 0"),
                "health.tool.timeout-seconds",
            ),
            (
                format!("{ok}timeout-seconds = 600"),
                "health.tool.timeout-seconds",
            ),
            (
                format!("{ok}timeout-seconds = nan"),
                "health.tool.timeout-seconds",
            ),
            (format!("{ok}args = [\"a\\u0000b\"]"), "health.tool.args"),
            (format!("{ok}timeout-seconds = \"5\""), "timeout-seconds"),
            ("format = \"bus-health-csv\"".to_string(), "binary"),
        ] {
            let e = enflame_tool(&body).unwrap_err();
            assert!(e.contains(key), "{body}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let (w, warnings) = enflame_tool(&format!("{ok}timeout-secnds = 1")).unwrap();
        assert_eq!(w.tool.unwrap().timeout_seconds, 5.0);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("health.tool.timeout-secnds")
                && warnings[0].contains("did you mean `timeout-seconds`"),
            "{warnings:?}"
        );
    }

    /// `[health.drm]` as the Intel profiles ship it, a driver name that is not one refused
    /// naming the key, an unknown key warned of with the nearest.
    #[test]
    fn the_drm_table_of_the_intel_profiles() {
        let read = |name: &str, replace: Option<(&str, &str)>| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("config/profiles")
                .join(format!("{name}.toml"));
            let mut text = std::fs::read_to_string(path).unwrap();
            if let Some((a, b)) = replace {
                assert!(text.contains(a));
                text = text.replace(a, b);
            }
            let (p, _) = Profile::from_text(&text, "test").map_err(|e| e.to_string())?;
            HealthWing::of(&p).map_err(|e| e.to_string())
        };
        let (w, warnings) = read("intel", None).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            w.drm.unwrap(),
            DrmHealth {
                drivers: vec!["i915".into()],
                survivability_mode: false
            }
        );
        let (w, _) = read("intel-xe", None).unwrap();
        assert_eq!(
            w.drm.unwrap(),
            DrmHealth {
                drivers: vec!["xe".into()],
                survivability_mode: true
            }
        );
        let e = read(
            "intel-xe",
            Some((
                "drivers = [\"xe\"]\nsurvivability-mode",
                "drivers = [\"../xe\"]\nsurvivability-mode",
            )),
        )
        .unwrap_err();
        assert!(e.contains("health.drm.drivers") && !e.contains('\n'), "{e}");
        let (_, warnings) = read(
            "intel-xe",
            Some(("survivability-mode = true", "survivabilty-mode = true")),
        )
        .unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("health.drm.survivabilty-mode")
                && warnings[0].contains("did you mean `survivability-mode`"),
            "{warnings:?}"
        );
    }
}
