//! Allocate: what a container gets for the device IDs kubelet chose. A pure function of
//! those IDs and the device table: no record kept, no pod looked up, the same answer for the
//! same IDs, so concurrent pods cannot mix each other up (Enflame's plugin kept allocation
//! records and could not tell pods apart; kubelet owns allocation and may repeat an Allocate
//! after a node restart).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::kubelet::host_root::HostRoot;
use crate::profile::Profile;

use super::devices::PluginDevice;

/// How the answer hands the devices over; a profile may combine several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// `<VENDOR>_VISIBLE_DEVICES=<names>`, read by our runtime.
    Envvar,
    /// `/dev/null` bound at `<container-devices-mount-dir>/<name>`: read by our runtime, and
    /// not settable by an image, unlike the variable.
    VolumeMounts,
    /// CDI device names in the response's `cdi_devices` (containerd >= 1.7, CRI-O inject them).
    CdiCri,
    /// CDI device names in a `cdi.k8s.io/` annotation.
    CdiAnnotations,
    /// The device nodes themselves (kept under CPU manager `static`, and for other runtimes).
    DeviceSpecs,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::Envvar,
        Strategy::VolumeMounts,
        Strategy::CdiCri,
        Strategy::CdiAnnotations,
        Strategy::DeviceSpecs,
    ];

    pub fn parse(s: &str) -> Option<Strategy> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Envvar => "envvar",
            Strategy::VolumeMounts => "volume-mounts",
            Strategy::CdiCri => "cdi-cri",
            Strategy::CdiAnnotations => "cdi-annotations",
            Strategy::DeviceSpecs => "device-specs",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

/// One container's answer, independent of the wire format.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    pub devices: Vec<DeviceSpec>,
    pub annotations: BTreeMap<String, String>,
    pub cdi_devices: Vec<String>,
}

impl Answer {
    /// The answer with the host's paths, as kubelet and the runtime read them on the host.
    pub fn to_host(mut self, root: &HostRoot) -> Answer {
        for d in &mut self.devices {
            d.host_path = root.to_host(&d.host_path);
        }
        for m in &mut self.mounts {
            m.host_path = root.to_host(&m.host_path);
        }
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("unknown device ID {0:?} for {1}")]
    Unknown(String, String),
    #[error("{vendor}: strategy {strategy} needs {what} in the profile")]
    Missing {
        vendor: String,
        strategy: &'static str,
        what: &'static str,
    },
}

/// The answer for `ids` (kubelet's order is irrelevant: devices are answered in table order,
/// duplicates once).
pub fn allocate(
    profile: &Profile,
    table: &[PluginDevice],
    strategies: &[Strategy],
    ids: &[String],
) -> Result<Answer, AllocateError> {
    let resource = profile.resource_name.clone().unwrap_or_default();
    for id in ids {
        if !table.iter().any(|d| d.id == *id) {
            return Err(AllocateError::Unknown(
                id.chars().take(80).collect(),
                resource,
            ));
        }
    }
    let chosen: Vec<&PluginDevice> = table.iter().filter(|d| ids.contains(&d.id)).collect();
    let names: Vec<&str> = chosen.iter().map(|d| d.dev.name.as_str()).collect();
    let missing = |strategy: Strategy, what| AllocateError::Missing {
        vendor: profile.name.clone(),
        strategy: strategy.as_str(),
        what,
    };
    let mut a = Answer::default();
    for &s in strategies {
        match s {
            Strategy::Envvar => {
                let var = profile
                    .visible_devices_env
                    .first()
                    .ok_or_else(|| missing(s, "visible-devices-env"))?;
                a.envs.insert(var.clone(), names.join(","));
            }
            Strategy::VolumeMounts => {
                let dir = profile
                    .container_devices_mount_dir
                    .as_deref()
                    .ok_or_else(|| missing(s, "container-devices-mount-dir"))?;
                for n in &names {
                    a.mounts.push(Mount {
                        container_path: format!("{}/{n}", dir.trim_end_matches('/')),
                        host_path: "/dev/null".into(),
                        read_only: true,
                    });
                }
            }
            Strategy::CdiCri | Strategy::CdiAnnotations => {
                let kind = profile
                    .cdi_kind
                    .as_deref()
                    .ok_or_else(|| missing(s, "cdi-kind"))?;
                let qualified: Vec<String> = names.iter().map(|n| format!("{kind}={n}")).collect();
                if s == Strategy::CdiCri {
                    a.cdi_devices.extend(qualified);
                } else {
                    // CDI annotation keys are `cdi.k8s.io/<plugin>_<device-id>`: one key per
                    // resource is enough, as a container gets one answer per resource.
                    let key = format!(
                        "cdi.k8s.io/accel-device-plugin_{}",
                        resource.replace(['/', '.'], "-")
                    );
                    a.annotations.insert(key, qualified.join(","));
                }
            }
            Strategy::DeviceSpecs => {
                let control = profile
                    .control_nodes
                    .iter()
                    .map(|c| (c.clone(), Profile::under(profile.dev_root(), c)))
                    .filter(|(_, host)| host.exists());
                let nodes = chosen.iter().flat_map(|d| {
                    d.dev
                        .nodes
                        .iter()
                        .map(|n| n.path.clone())
                        .zip(d.dev.host_nodes.iter().cloned())
                });
                for (container, host) in nodes.chain(control) {
                    if a.devices
                        .iter()
                        .any(|d| d.container_path == path_str(&container))
                    {
                        continue;
                    }
                    a.devices.push(DeviceSpec {
                        container_path: path_str(&container),
                        host_path: path_str(&host),
                        permissions: "rw".into(),
                    });
                }
            }
        }
    }
    Ok(a)
}

fn path_str(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_name_the_hosts_paths() {
        let a = Answer {
            devices: vec![DeviceSpec {
                container_path: "/dev/nvidia0".into(),
                host_path: "/host/dev/nvidia0".into(),
                permissions: "rw".into(),
            }],
            mounts: vec![Mount {
                container_path: "/var/run/nvidia-container-devices/0".into(),
                host_path: "/dev/null".into(),
                read_only: true,
            }],
            ..Answer::default()
        }
        .to_host(&HostRoot::new("/host".into()));
        assert_eq!(a.devices[0].host_path, "/dev/nvidia0");
        assert_eq!(a.mounts[0].host_path, "/dev/null");
    }
}
