//! The CDI spec file format (JSON or YAML), its name grammar and its version rules.
//!
//! Plain serde structs, strict like CDI's reference loader (unknown fields are an error), and
//! validated as a whole before any device of the file is used. Fields this runtime does not
//! apply (`hooks`, `intelRdt`, `netDevices`) are still parsed so that a file using them is
//! valid; a request for a device that needs them is refused in `cdi::apply`.
//! Ref: CDI SPEC.md (v1.1.0) and its `specs-go/version.go` for when each field appeared.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Released CDI spec versions, oldest first; 0.3.0 is the oldest a consumer accepts.
pub const VERSIONS: &[&str] = &[
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

pub use crate::spec::CDI_ANNOTATION_PREFIX as ANNOTATION_PREFIX;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self == &ContainerEdits::default()
    }
}

/// Parses a spec file's bytes: `.json` as JSON, anything else (`.yaml`) as YAML.
pub fn parse(path: &Path, data: &[u8]) -> Result<Spec, String> {
    if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_slice(data).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_slice(data).map_err(|e| e.to_string())
    }
}

impl Spec {
    /// `(vendor, class)` of `kind`.
    pub fn vendor_class(&self) -> Option<(&str, &str)> {
        self.kind.split_once('/')
    }

    /// The lowest spec version that has every field this spec uses (CDI's own rule, so a
    /// generated file loads in the oldest consumer that understands it).
    pub fn minimum_version(&self) -> &'static str {
        let edits: Vec<&ContainerEdits> = std::iter::once(&self.container_edits)
            .chain(self.devices.iter().map(|d| &d.container_edits))
            .collect();
        let rdt_v110 = |e: &&ContainerEdits| {
            e.intel_rdt.as_ref().is_some_and(|r| {
                r.get("schemata").is_some()
                    || r.get("enableMonitoring").and_then(|v| v.as_bool()) == Some(true)
            })
        };
        if edits
            .iter()
            .any(|e| rdt_v110(e) || !e.net_devices.is_empty())
        {
            "1.1.0"
        } else if edits
            .iter()
            .any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty())
        {
            "0.7.0"
        } else if !self.annotations.is_empty()
            || self.devices.iter().any(|d| !d.annotations.is_empty())
            || self.vendor_class().is_some_and(|(_, c)| c.contains('.'))
        {
            "0.6.0"
        } else if self
            .devices
            .iter()
            .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
            || edits
                .iter()
                .any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some()))
        {
            "0.5.0"
        } else if edits
            .iter()
            .any(|e| e.mounts.iter().any(|m| m.typ.is_some()))
        {
            "0.4.0"
        } else {
            "0.3.0"
        }
    }

    /// Checks what CDI's loader checks (version, kind, names, edits) plus this runtime's own
    /// rules for paths: container and host paths absolute, without `..`.
    pub fn validate(&self) -> Result<(), String> {
        let version = self.cdi_version.trim_start_matches('v');
        let Some(have) = VERSIONS.iter().position(|v| *v == version) else {
            return Err(format!("unknown cdiVersion {:?}", self.cdi_version));
        };
        let need = self.minimum_version();
        if have < VERSIONS.iter().position(|v| *v == need).unwrap_or(0) {
            return Err(format!(
                "cdiVersion {version} is too old for the fields used; needs {need}"
            ));
        }
        let (vendor, class) = self
            .vendor_class()
            .ok_or_else(|| format!("kind {:?} is not vendor/class", self.kind))?;
        check_vendor_or_class(vendor).map_err(|e| format!("kind {:?}: vendor {e}", self.kind))?;
        check_vendor_or_class(class).map_err(|e| format!("kind {:?}: class {e}", self.kind))?;
        if self.devices.is_empty() {
            return Err("no devices".into());
        }
        check_edits(&self.container_edits).map_err(|e| format!("containerEdits: {e}"))?;
        let mut seen = HashSet::new();
        for d in &self.devices {
            check_device_name(&d.name).map_err(|e| format!("device {:?}: {e}", d.name))?;
            if !seen.insert(d.name.as_str()) {
                return Err(format!("device {:?} is defined twice", d.name));
            }
            if d.container_edits.is_empty() {
                return Err(format!("device {:?} has no containerEdits", d.name));
            }
            check_edits(&d.container_edits).map_err(|e| format!("device {:?}: {e}", d.name))?;
        }
        Ok(())
    }
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

fn check_vendor_or_class(s: &str) -> Result<(), String> {
    let ok = s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} must start with a letter, end with a letter or digit, and hold only [A-Za-z0-9_.-]"
        ))
    }
}

fn check_device_name(s: &str) -> Result<(), String> {
    let ok = s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars()
            .all(|c| alnum(c) || matches!(c, '_' | '-' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err("name must start and end with a letter or digit and hold only [A-Za-z0-9_.:-]".into())
    }
}

/// Splits a fully-qualified device name `vendor.com/class=name`, checking each part with CDI's
/// grammar. The result is only ever used as a key, never as a path.
pub fn parse_qualified(name: &str) -> Result<(&str, &str, &str), String> {
    let bad = |why: String| {
        format!(
            "{} is not a fully-qualified CDI device name ({why})",
            crate::quote::quote(name)
        )
    };
    let (kind, dev) = name
        .split_once('=')
        .ok_or_else(|| bad("no '=': expected vendor.com/class=name".into()))?;
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| bad("no '/': expected vendor.com/class=name".into()))?;
    check_vendor_or_class(vendor).map_err(|e| bad(format!("vendor {e}")))?;
    check_vendor_or_class(class).map_err(|e| bad(format!("class {e}")))?;
    check_device_name(dev).map_err(|e| bad(format!("device {e}")))?;
    Ok((vendor, class, dev))
}

/// A container path or host path from a spec: absolute and without `..`.
pub fn check_path(what: &str, p: &str) -> Result<(), String> {
    let path = Path::new(p);
    if p.is_empty() || !path.is_absolute() || crate::profile::has_dotdot(path) {
        return Err(format!(
            "{what} {p:?} must be an absolute path without '..'"
        ));
    }
    Ok(())
}

fn check_edits(e: &ContainerEdits) -> Result<(), String> {
    for v in &e.env {
        if v.find('=').is_none_or(|i| i == 0) {
            return Err(format!("env entry {v:?} is not NAME=value"));
        }
    }
    for n in &e.device_nodes {
        check_path("device path", &n.path)?;
        if let Some(h) = &n.host_path {
            check_path("device hostPath", h)?;
        }
        if !matches!(n.typ.as_deref(), None | Some("" | "b" | "c" | "u")) {
            return Err(format!(
                "device {:?}: type {:?} is not b, c or u",
                n.path,
                n.typ.as_deref().unwrap_or_default()
            ));
        }
        if let Some(p) = n.permissions.as_deref() {
            if p != "none" && !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
                return Err(format!("device {:?}: permissions {p:?} not in rwm", n.path));
            }
        }
    }
    for m in &e.mounts {
        check_path("mount hostPath", &m.host_path)?;
        check_path("mount containerPath", &m.container_path)?;
    }
    for h in &e.hooks {
        if h.hook_name.is_empty() || h.path.is_empty() {
            return Err("hook without hookName or path".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Spec {
        parse(Path::new("x.yaml"), text.as_bytes()).unwrap()
    }

    #[test]
    fn minimum_version_follows_fields() {
        let mut s = spec("cdiVersion: 0.3.0\nkind: v.com/gpu\ndevices:\n- name: a\n  containerEdits:\n    deviceNodes:\n    - path: /dev/a\n");
        assert_eq!(s.minimum_version(), "0.3.0");
        s.validate().unwrap();
        s.container_edits.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            options: vec![],
            typ: Some("bind".into()),
        });
        assert_eq!(s.minimum_version(), "0.4.0");
        assert!(s.validate().unwrap_err().contains("needs 0.4.0"));
        s.devices[0].name = "0".into();
        assert_eq!(s.minimum_version(), "0.5.0");
        s.container_edits.additional_gids.push(44);
        assert_eq!(s.minimum_version(), "0.7.0");
        s.cdi_version = "0.7.0".into();
        s.validate().unwrap();
    }

    #[test]
    fn unknown_fields_and_bad_names_are_refused() {
        assert!(parse(
            Path::new("x.json"),
            br#"{"cdiVersion":"0.5.0","kind":"a.com/b","devices":[],"extra":1}"#
        )
        .unwrap_err()
        .contains("extra"));
        for (kind, name) in [("a.com", "x"), ("a.com/b/c", "x"), ("a.com/b", "-x")] {
            let mut s = spec("cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- name: a\n  containerEdits:\n    env: [A=1]\n");
            s.kind = kind.into();
            s.devices[0].name = name.into();
            assert!(s.validate().is_err(), "{kind} {name}");
        }
    }

    #[test]
    fn paths_must_be_absolute_without_dotdot() {
        for (path, host) in [
            ("dev/a", "/dev/a"),
            ("/dev/../etc/shadow", "/dev/a"),
            ("/dev/a", "/dev/../../etc"),
        ] {
            let mut s = spec("cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- name: a\n  containerEdits:\n    deviceNodes:\n    - path: /dev/a\n");
            s.devices[0].container_edits.device_nodes[0].path = path.into();
            s.devices[0].container_edits.device_nodes[0].host_path = Some(host.into());
            assert!(s.validate().unwrap_err().contains(".."), "{path} {host}");
        }
        let s = spec("cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n- name: a\n  containerEdits:\n    mounts:\n    - {hostPath: /lib/x, containerPath: ../x}\n");
        assert!(s.validate().unwrap_err().contains("containerPath"));
    }

    #[test]
    fn qualified_names() {
        assert_eq!(
            parse_qualified("nvidia.com/gpu=GPU-1:2").unwrap(),
            ("nvidia.com", "gpu", "GPU-1:2")
        );
        for bad in [
            "nvidia.com/gpu",
            "gpu=0",
            "nvidia.com/gpu=",
            "1a.com/gpu=0",
            "a.com/g=../x",
        ] {
            assert!(parse_qualified(bad).is_err(), "{bad}");
        }
    }
}
