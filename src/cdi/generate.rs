//! Building a CDI spec for one vendor profile from what is on this host.
//!
//! The edits are exactly the runtime's: the spec goes through the create's own steps
//! ([`crate::pipeline`], for every device, as [`Purpose::Spec`]): discovery, the host's nodes,
//! libraries and binaries gathered once, each device's edits and the shared ones (control
//! nodes, libraries, binaries, dev links) planned from them, and the same refusals. Device
//! nodes are written with `path` and `hostPath` only: type,
//! numbers, mode and owner are read from the host node when a container is created (by this
//! runtime and by any CDI consumer), so a reloaded driver with new majors does not make the
//! file stale. Devices are named by index, by UUID where the vendor has one, and `all`.
//!
//! The version written is the lowest that has every field used (CDI's own rule), normally
//! 0.5.0 (device names that start with a digit, `hostPath`), 0.7.0 when nodes need
//! `additionalGids`: the oldest consumers can load it, and it is still valid for newer ones.

use std::path::{Path, PathBuf};

use super::model::{ContainerEdits, Device, DeviceNode as CdiNode, Mount, Spec};
use crate::pipeline::{self, PipelineError, Purpose, Wanted};
use crate::plan::{self, Plan};
use crate::profile::Profile;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("profile {vendor} has no cdi-kind")]
    NoKind { vendor: String },
    /// No device of the vendor on this host (`accel-ctk cdi generate` of every vendor skips
    /// those).
    #[error(transparent)]
    NoDevices(PipelineError),
    #[error(transparent)]
    Pipeline(PipelineError),
    #[error("generated {vendor} spec is invalid: {msg}")]
    Invalid { vendor: String, msg: String },
}

impl From<PipelineError> for GenerateError {
    fn from(e: PipelineError) -> GenerateError {
        if e.is_no_devices() {
            GenerateError::NoDevices(e)
        } else {
            GenerateError::Pipeline(e)
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Capability list as the profile's variable takes it (`None`: the profile's defaults).
    pub capabilities: Option<String>,
    /// Container directory for libraries (the spec cannot look at the image).
    pub library_dir: PathBuf,
}

/// The CDI spec for `profile`'s devices on this host.
pub fn generate(profile: &Profile, opts: &Options) -> Result<Spec, GenerateError> {
    let kind = profile
        .cdi_kind
        .clone()
        .ok_or_else(|| GenerateError::NoKind {
            vendor: profile.name.clone(),
        })?;
    let planned = pipeline::run(&pipeline::Ask {
        profile,
        wanted: Wanted::All,
        capabilities: opts.capabilities.as_deref(),
        lib_dir: &opts.library_dir,
        purpose: Purpose::Spec,
    })?;
    let mut devices = Vec::new();
    let mut all = Plan::default();
    for (d, nodes) in planned.devices {
        let edits = edits(&nodes);
        devices.push(device(d.index.to_string(), &edits));
        // The names that stay the device's whatever else leaves the node (the device
        // plugin's answers and the DRA driver's claim specs use them): its UUID, unique on
        // the node, and its PCI function.
        let stable = [d.uuid.as_deref(), d.pci_bus_id.as_deref()];
        for (i, name) in stable.iter().enumerate() {
            if let Some(n) = name.filter(|n| super::valid_device_name(n)) {
                if !stable[..i].contains(&Some(n)) {
                    devices.push(device(n.to_string(), &edits));
                }
            }
        }
        all.extend(nodes);
    }
    devices.push(device("all".into(), &edits(&all)));
    let mut shared = planned.driver;
    // Development names (`libcuda.so`), as the variable path mounts them.
    shared.mounts.extend(planned.dev_links);

    let mut spec = Spec {
        cdi_version: String::new(),
        kind,
        devices,
        container_edits: edits(&shared),
        ..Spec::default()
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec.validate().map_err(|msg| GenerateError::Invalid {
        vendor: profile.name.clone(),
        msg,
    })?;
    Ok(spec)
}

fn device(name: String, edits: &ContainerEdits) -> Device {
    Device {
        name,
        container_edits: edits.clone(),
        ..Device::default()
    }
}

/// A plan as CDI edits: nodes by path (host path when it differs), mounts as the runtime
/// writes them, groups as the runtime adds them.
fn edits(plan: &Plan) -> ContainerEdits {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    ContainerEdits {
        device_nodes: plan
            .nodes
            .iter()
            .map(|n| CdiNode {
                path: s(&n.path),
                host_path: (n.host_path != n.path).then(|| s(&n.host_path)),
                ..CdiNode::default()
            })
            .collect(),
        mounts: plan
            .mounts
            .iter()
            .map(|m| Mount {
                host_path: s(&m.source),
                container_path: s(&m.destination),
                options: plan::MOUNT_OPTIONS.iter().map(|o| o.to_string()).collect(),
                typ: Some("bind".into()),
            })
            .collect(),
        additional_gids: plan.additional_gids.clone(),
        ..ContainerEdits::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_devices_and_no_kind_are_errors() {
        let root = tempfile::tempdir().unwrap();
        let mut p = crate::config::builtin_nvidia();
        p.driver_root = root.path().to_path_buf();
        let opts = Options {
            capabilities: None,
            library_dir: "/usr/lib64".into(),
        };
        let e = generate(&p, &opts).unwrap_err().to_string();
        assert!(e.starts_with("no nvidia devices found under "), "{e}");
        p.cdi_kind = None;
        assert_eq!(
            generate(&p, &opts).unwrap_err().to_string(),
            "profile nvidia has no cdi-kind"
        );
    }
}
