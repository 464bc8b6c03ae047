//! The `create` path, top to bottom: read the spec, decide per vendor, apply, write.
//!
//! Nothing is written unless every vendor's request resolved: an error leaves config.json
//! exactly as it was, so runc is never started on a half-edited spec.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::argv::Invocation;
use crate::config::Config;
use crate::discovery::{self, Device, DiscoveryError};
use crate::ldcache;
use crate::plan::{self, Plan, PlanError};
use crate::profile::Profile;
use crate::request::{self, Request, RequestError};
use crate::spec::{self, SpecError};

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("{var}={value}: {msg}")]
    Refused {
        var: String,
        value: String,
        msg: String,
    },
    #[error("{var}: CDI device names are not resolved by this build ({name})")]
    Cdi { var: String, name: String },
    #[error("cannot read the driver's ld.so.cache under {}: {source}", root.display())]
    LdCache {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Edit { path: PathBuf, msg: String },
}

/// What a create did, for the one log line.
#[derive(Debug, Default)]
pub struct Outcome {
    pub requests: Vec<String>,
    pub plan: Plan,
    pub removed_docker_hook: bool,
}

/// Edits the bundle's config.json for `create`/`run`. `Ok(None)`: nothing asked for, the file
/// was not written.
pub fn create(inv: &Invocation, cfg: &Config) -> Result<Option<Outcome>, CreateError> {
    let bundle = inv.bundle.clone().unwrap_or_else(|| PathBuf::from("."));
    let path = bundle.join("config.json");
    let mut spec = spec::read(&path)?;

    let mut out = Outcome {
        removed_docker_hook: spec::remove_docker_gpu_hook(&mut spec),
        ..Outcome::default()
    };
    let privileged = spec::is_privileged(&spec);
    let mut lib_dir: Option<PathBuf> = cfg.container_library_dir.clone();

    for profile in &cfg.profiles {
        let Some((var, value, request)) = vendor_request(cfg, profile, &spec, privileged)? else {
            continue;
        };
        let devices = discovery::discover(profile)?;
        let selected: Vec<&Device> = match &request {
            Request::Nothing => continue,
            Request::DriverOnly if !profile.none_injects_driver => continue,
            Request::DriverOnly => Vec::new(),
            Request::All if devices.is_empty() => {
                return Err(CreateError::Refused {
                    var,
                    value,
                    msg: format!(
                        "no {} devices found under {} (is the driver loaded?)",
                        profile.name,
                        profile.dev_root().display()
                    ),
                })
            }
            Request::All => devices.iter().collect(),
            Request::Items { cdi, .. } if !cdi.is_empty() => {
                return Err(CreateError::Cdi {
                    var,
                    name: cdi[0].clone(),
                })
            }
            Request::Items { devices: items, .. } => {
                request::select(&var, items, &devices, ranges(profile))?
            }
        };
        out.plan.extend(plan::device_edits(profile, &selected)?);

        let caps_value = profile
            .capabilities_env
            .as_deref()
            .and_then(|v| spec::env(&spec, v));
        let caps = plan::capabilities(profile, caps_value)?;
        let cache = ldcache::load(&profile.driver_root).map_err(|source| CreateError::LdCache {
            root: profile.driver_root.clone(),
            source,
        })?;
        let dir = lib_dir.get_or_insert_with(|| {
            spec::default_library_dir(spec::rootfs(&spec, &bundle).as_deref())
        });
        out.plan
            .extend(plan::driver_edits(profile, &caps, &cache, dir)?);
        out.requests.push(format!("{var}={value}"));
    }

    if out.plan.is_empty() && !out.removed_docker_hook {
        return Ok(None);
    }
    let before = owned_lengths(&spec);
    spec::apply(&mut spec, &out.plan).map_err(|msg| CreateError::Edit {
        path: path.clone(),
        msg,
    })?;
    // A second create of an already edited bundle adds nothing: leave the file alone rather
    // than rewrite the same bytes (two fsyncs on a disk-backed bundle).
    if owned_lengths(&spec) != before || out.removed_docker_hook {
        spec::write(&path, &spec)?;
    }
    Ok(Some(out))
}

/// Lengths of the arrays `spec::apply` appends to (`None`: absent). `apply` only appends or
/// creates, so equal lengths before and after mean it changed nothing.
fn owned_lengths(spec: &Value) -> [Option<usize>; 4] {
    [
        "/linux/devices",
        "/linux/resources/devices",
        "/mounts",
        "/process/user/additionalGids",
    ]
    .map(|p| spec.pointer(p).and_then(Value::as_array).map(Vec::len))
}

/// The vendor's request: from device-list mounts when accepted and present, else from the
/// variable (refused for unprivileged containers when configured so).
fn vendor_request(
    cfg: &Config,
    profile: &Profile,
    spec: &Value,
    privileged: bool,
) -> Result<Option<(String, String, Request)>, CreateError> {
    if cfg.accept_container_devices_as_mounts {
        if let Some(dir) = profile.container_devices_mount_dir.as_deref() {
            let ids: Vec<&str> = spec::mount_destinations(spec)
                .into_iter()
                .filter_map(|d| Path::new(d).strip_prefix(dir).ok()?.to_str())
                .filter(|id| !id.is_empty() && !id.contains('/'))
                .collect();
            if !ids.is_empty() {
                let value = ids.join(",");
                let request = request::parse(dir, &value)?;
                return Ok(Some((dir.to_string(), value, request)));
            }
        }
    }
    let Some((var, value)) = profile
        .visible_devices_env
        .iter()
        .find_map(|v| spec::env(spec, v).map(|x| (v, x)))
    else {
        return Ok(None);
    };
    let request = request::parse(var, value)?;
    if request != Request::Nothing && !privileged && !cfg.accept_envvar_unprivileged {
        return Err(CreateError::Refused {
            var: var.clone(),
            value: value.chars().take(64).collect(),
            msg: "device requests through the environment are refused for unprivileged containers on this node (accept-envvar-unprivileged = false); use the device plugin's volume-mount list".into(),
        });
    }
    Ok(Some((var.clone(), value.to_string(), request)))
}

fn ranges(profile: &Profile) -> bool {
    matches!(
        profile.discovery,
        crate::profile::Discovery::DeviceNodes {
            index_ranges: true,
            ..
        }
    )
}
