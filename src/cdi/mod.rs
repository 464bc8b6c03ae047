//! Container Device Interface: specs that describe devices as edits to an OCI spec.
//!
//! `accel-ctk cdi generate` writes one for a vendor from what the runtime itself would inject
//! ([`generate`]); the runtime resolves fully-qualified names (`nvidia.com/gpu=0`) given in a
//! vendor variable or in `cdi.k8s.io/*` annotations against the spec directories
//! ([`registry`]) and writes their edits into config.json ([`apply`]). The spec format, name
//! grammar and version rules are in [`model`].
//!
//! The `container-device-interface` crate is not used: it edits an `oci_spec` `Spec`, and a
//! round trip of config.json through that type drops unknown keys and reorders capability
//! lists; it also brings an HTTP-capable JSON-schema validator, a file watcher and `anyhow`
//! errors onto the create path, and needs a newer Rust than this crate's 1.88.

pub mod apply;
pub mod generate;
pub mod model;
pub mod registry;

use std::path::PathBuf;

pub use apply::{ApplyError, Resolved};
pub use registry::{Registry, RegistryError};

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("annotation {key}: {msg}")]
    Annotation { key: String, msg: String },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("{origin}: CDI device {name} is of a kind this node does not let it reach: {msg}")]
    KindNotAllowed {
        origin: String,
        name: String,
        msg: String,
    },
}

/// The kind (`vendor/class`) of a fully-qualified CDI name.
fn kind_of(name: &str) -> &str {
    name.split_once('=').map_or(name, |(kind, _)| kind)
}

/// A vendor variable names CDI devices of its own profile's `cdi-kind` only, or of a kind the
/// operator listed in the profile's `cdi-extra-kinds`: a container's variable must not reach
/// another vendor's spec, or a spec that mounts host files, on its own.
pub fn check_variable_kinds(
    var: &str,
    names: &[String],
    profile: &crate::profile::Profile,
) -> Result<(), CdiError> {
    for name in names {
        let kind = kind_of(name);
        if profile.cdi_kind.as_deref() == Some(kind)
            || profile.cdi_extra_kinds.iter().any(|k| k == kind)
        {
            continue;
        }
        return Err(CdiError::KindNotAllowed {
            origin: var.to_string(),
            name: crate::quote::quote(name),
            msg: format!(
                "{var} may name devices of {} only; list {} in cdi-extra-kinds of [profiles.{}] in config.toml to allow it",
                profile.cdi_kind.as_deref().map_or("no CDI kind".into(), crate::quote::quote),
                crate::quote::quote(kind),
                profile.name
            ),
        });
    }
    Ok(())
}

/// `cdi.k8s.io/*` annotations reach the kinds of the node's profiles (their `cdi-kind` and
/// `cdi-extra-kinds`) only: CRI-O passes a pod's own annotations into the spec, so any other
/// spec in the CDI directories (host-file mounts, another tool's devices) stays out of reach.
pub fn check_annotation_kinds(
    requests: &[(String, String)],
    profiles: &[crate::profile::Profile],
) -> Result<(), CdiError> {
    let known = profiles
        .iter()
        .flat_map(|p| p.cdi_kind.iter().chain(&p.cdi_extra_kinds));
    for (key, name) in requests {
        let kind = kind_of(name);
        if !known.clone().any(|k| k == kind) {
            return Err(CdiError::KindNotAllowed {
                origin: format!("annotation {}", crate::quote::quote(key)),
                name: crate::quote::quote(name),
                msg: format!(
                    "annotations may name devices of the profiles' CDI kinds only; list {} in a profile's cdi-extra-kinds in config.toml to allow it",
                    crate::quote::quote(kind)
                ),
            });
        }
    }
    Ok(())
}

/// CDI device names requested by `cdi.k8s.io/*` annotations, each with its annotation key.
pub fn annotation_requests(spec: &crate::spec::View) -> Result<Vec<(String, String)>, CdiError> {
    let mut out = Vec::new();
    for (key, value) in &spec.annotations {
        if !key.starts_with(model::ANNOTATION_PREFIX) {
            continue;
        }
        for name in value.split(',') {
            model::parse_qualified(name).map_err(|msg| CdiError::Annotation {
                key: crate::quote::quote(key),
                msg,
            })?;
            out.push((key.to_string(), name.to_string()));
        }
    }
    Ok(out)
}

/// Loads the specs in `dirs` and checks every requested device's edits against the host.
pub fn resolve(dirs: &[PathBuf], requests: &[(String, String)]) -> Result<Resolved, CdiError> {
    let registry = Registry::load(dirs);
    let edits = registry.resolve(requests)?;
    Ok(apply::resolve(&edits)?)
}

/// Whether `name` is a valid CDI device name (the part after `=`).
pub(crate) fn valid_device_name(name: &str) -> bool {
    model::parse_qualified(&format!("x.com/x={name}")).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec;

    #[test]
    fn annotations_are_split_and_checked() {
        let spec = br#"{"annotations": {"other": "x", "cdi.k8s.io/plugin_0": "nvidia.com/gpu=0,nvidia.com/gpu=GPU-1"}}"#;
        let (_, spec) = spec::parse(spec).unwrap();
        assert_eq!(
            annotation_requests(&spec).unwrap(),
            [
                ("cdi.k8s.io/plugin_0".into(), "nvidia.com/gpu=0".into()),
                ("cdi.k8s.io/plugin_0".into(), "nvidia.com/gpu=GPU-1".into())
            ]
        );
        let (_, bad) =
            spec::parse(br#"{"annotations": {"cdi.k8s.io/p": "nvidia.com/gpu=0,/dev/sda"}}"#)
                .unwrap();
        let e = annotation_requests(&bad).unwrap_err().to_string();
        assert!(
            e.starts_with("annotation \"cdi.k8s.io/p\": \"/dev/sda\" is not a fully-qualified"),
            "{e}"
        );
    }
}
