//! Building a CDI spec for one vendor profile from what is on this host.
//!
//! The edits are exactly the runtime's: `discovery::discover` finds the devices,
//! `plan::device_edits` gives each device's nodes, `plan::capabilities` +
//! `plan::driver_edits` (from `facts::driver`, with the driver root's `ld.so.cache`) give the
//! shared control nodes, libraries and binaries. The host's nodes are gathered once for all
//! devices and every device's edits are planned from them. Device nodes are written with `path` and `hostPath` only: type,
//! numbers, mode and owner are read from the host node when a container is created (by this
//! runtime and by any CDI consumer), so a reloaded driver with new majors does not make the
//! file stale. Devices are named by index, by UUID where the vendor has one, by the name the
//! device plugin answers with where that is another (a PCI bus id), and `all`.
//!
//! The version written is the lowest that has every field used (CDI's own rule), normally
//! 0.5.0 (device names that start with a digit, `hostPath`), 0.7.0 when nodes need
//! `additionalGids`: the oldest consumers can load it, and it is still valid for newer ones.

use std::path::{Path, PathBuf};

use super::model::{ContainerEdits, Device, DeviceNode as CdiNode, Mount, Spec};
use crate::discovery::{self, Device as HostDevice, DiscoveryError};
use crate::facts;
use crate::ldcache;
use crate::plan::{self, Plan, PlanError};
use crate::profile::Profile;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("profile {vendor} has no cdi-kind")]
    NoKind { vendor: String },
    #[error("no {vendor} devices found under {} (is the driver loaded?)", root.display())]
    NoDevices { vendor: String, root: PathBuf },
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("cannot read the driver's ld.so.cache under {}: {source}", root.display())]
    LdCache {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no {vendor} driver library found under {} (looked for {wanted}): a spec without them \
         gives containers devices their frameworks cannot use; point the profile's driver-root \
         at the driver's files (in the device plugin's pod: mount the host's / and pass \
         --host-root)",
        root.display()
    )]
    NoLibraries {
        vendor: String,
        root: PathBuf,
        wanted: String,
    },
    #[error("generated {vendor} spec is invalid: {msg}")]
    Invalid { vendor: String, msg: String },
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
    let found = discovery::discover(profile)?;
    if found.is_empty() {
        return Err(GenerateError::NoDevices {
            vendor: profile.name.clone(),
            root: profile.dev_root().to_path_buf(),
        });
    }
    let all: Vec<&HostDevice> = found.iter().collect();
    let dev_root = discovery::DevRoot::new(profile);
    let nodes = facts::device_nodes(&dev_root, &all);
    let mut devices = Vec::new();
    for d in &found {
        let edits = edits(&plan::device_edits(profile, &[d], &nodes)?);
        let index = d.index.to_string();
        devices.push(device(index.clone(), &edits));
        if let Some(uuid) = d.uuid.as_deref().filter(|u| super::valid_device_name(u)) {
            devices.push(device(uuid.to_string(), &edits));
        }
        // The name the device plugin answers with (a DRM device without a unique id: its PCI
        // bus id), so its CDI answers resolve to this device whatever else leaves the node.
        let stable = d.stable_name(&profile.discovery);
        if stable != index
            && d.uuid.as_deref() != Some(&stable)
            && super::valid_device_name(&stable)
        {
            devices.push(device(stable, &edits));
        }
    }
    devices.push(device(
        "all".into(),
        &edits(&plan::device_edits(profile, &all, &nodes)?),
    ));

    let caps = plan::capabilities(profile, opts.capabilities.as_deref())?;
    let cache = ldcache::load(&profile.driver_root).map_err(|source| GenerateError::LdCache {
        root: profile.driver_root.clone(),
        source,
    })?;
    let driver = facts::driver(&dev_root, &caps, &cache);
    // Every node but none of the libraries means the driver's files are somewhere this
    // process cannot see (a plugin pod given /dev only): refused, never written silently.
    let stems: Vec<&str> = caps
        .iter()
        .filter_map(|c| profile.capabilities.get(c))
        .flat_map(|g| g.libraries.iter().map(String::as_str))
        .collect();
    if !stems.is_empty() && driver.libraries.is_empty() {
        let mut wanted = stems.iter().take(4).copied().collect::<Vec<_>>().join(", ");
        if stems.len() > 4 {
            wanted.push_str(", ...");
        }
        return Err(GenerateError::NoLibraries {
            vendor: profile.name.clone(),
            root: profile.driver_root.clone(),
            wanted,
        });
    }
    let mut shared = plan::driver_edits(profile, &caps, &driver, &opts.library_dir)?;
    // Development names (`libcuda.so`), as the variable path mounts them.
    let links = crate::loader::dev_links(profile, &shared, &opts.library_dir);
    shared.mounts.extend(links);

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
