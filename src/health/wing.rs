//! A profile's `[health]`: the settings of the signals a vendor's own library gives (today
//! NVIDIA's NVML, `[health.nvml]`). Read by the daemons that run the health engine, never by
//! a create, so its keys and checks live here, beside the engine, and not in
//! [`crate::profile`]. A bad value is refused when the daemon starts, naming the key; an
//! unknown key is warned of with the nearest known one.

use serde::Deserialize;

use crate::profile::{Profile, ProfileError};

/// A profile's `[health]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct HealthWing {
    /// NVML's signals (XID and double-bit ECC events, volatile uncorrected ECC counts,
    /// remapped rows, "GPU is lost"); absent: not read.
    #[serde(default)]
    pub nvml: Option<NvmlHealth>,
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
            .copied()
            .collect::<Vec<_>>();
        let Some((w, warnings)) = profile.wings.read::<HealthWing>("health", &known)? else {
            return Ok((HealthWing::default(), Vec::new()));
        };
        if let Some(n) = &w.nvml {
            n.validate().map_err(|msg| profile.wings.invalid(msg))?;
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
}
