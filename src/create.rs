//! The `create` path, top to bottom: read the spec once (its bytes: [`Bundle`]; what the shim
//! reads of it: [`spec::View`]), decide per vendor, apply, write.
//! Fully-qualified CDI names (in a vendor variable or `cdi.k8s.io/*` annotations) are resolved
//! from the CDI spec dirs and applied after the variable's edits, with CDI's replace rules.
//!
//! Nothing is written unless every vendor's request resolved: an error leaves config.json
//! exactly as it was, so runc is never started on a half-edited spec.

use std::path::{Path, PathBuf};

use crate::cdi::{self, CdiError};
use crate::config::Config;
use crate::discovery::{self, Device, DiscoveryError};
use crate::facts;
use crate::ldcache;
use crate::loader;
use crate::plan::{self, Plan, PlanError};
use crate::profile::Profile;
use crate::request::{self, Request, RequestError};
use crate::spec::{self, SpecError, View};

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
    #[error(transparent)]
    Cdi(#[from] CdiError),
    #[error(transparent)]
    Require(#[from] crate::require::RequireError),
    #[error("cannot read the driver's ld.so.cache under {}: {source}", root.display())]
    LdCache {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Edit { path: PathBuf, msg: String },
}

/// CUDA base images set `NVIDIA_VISIBLE_DEVICES=all`, so on a node that takes device lists
/// only from the device plugin, an unprivileged pod that asked kubelet for no device still
/// carries the variable: it must start, with no device (as NVIDIA's toolkit does), not fail.
const UNPRIVILEGED_IGNORED: &str = "ignored: device requests through the environment or annotations are not accepted from unprivileged containers on this node (accept-envvar-unprivileged = false); the container gets no device from it (use the device plugin's volume-mount list)";

/// What a create did, for the one log line.
#[derive(Debug, Default)]
pub struct Outcome {
    pub requests: Vec<String>,
    pub plan: Plan,
    /// Edits from CDI specs, for the fully-qualified names asked for.
    pub cdi: cdi::Resolved,
    pub removed_docker_hook: bool,
}

/// The bundle's config.json, read once: [`spec::screen`] looks at the bytes, [`create`]
/// parses and edits them.
#[derive(Debug)]
pub struct Bundle {
    pub dir: PathBuf,
    pub config_json: PathBuf,
    /// The file's bytes, or why they could not be read (reported by [`create`]).
    pub data: Result<Vec<u8>, SpecError>,
}

impl Bundle {
    pub fn read(dir: &Path) -> Bundle {
        let config_json = dir.join("config.json");
        Bundle {
            data: spec::read_bytes(&config_json),
            dir: dir.to_path_buf(),
            config_json,
        }
    }
}

/// A bundle whose config.json was parsed: what it can involve decides which profiles are
/// built ([`Parsed::variables`]) before [`create_parsed`] edits it.
#[derive(Debug)]
pub struct Parsed {
    dir: PathBuf,
    path: PathBuf,
    original: Vec<u8>,
    doc: serde_json::Value,
    pub spec: View,
}

impl Parsed {
    pub fn read(bundle: Bundle) -> Result<Parsed, CreateError> {
        let original = bundle.data?;
        let (doc, spec) = spec::parse_file(&bundle.config_json, &original)?;
        Ok(Parsed {
            dir: bundle.dir,
            path: bundle.config_json,
            original,
            doc,
            spec,
        })
    }

    /// The variables a profile must claim to be involved in this create (for
    /// `config::Quick::into_config_for`); `None`: every profile may be (CDI annotations are
    /// checked against every profile's kinds; device lists from mounts against every
    /// profile's mount dir).
    pub fn variables(&self, devices_as_mounts: bool) -> Option<Vec<&str>> {
        let cdi = self
            .spec
            .annotations
            .iter()
            .any(|(k, _)| k.starts_with(cdi::model::ANNOTATION_PREFIX));
        if cdi || devices_as_mounts {
            return None;
        }
        Some(
            self.spec
                .env
                .iter()
                .filter_map(|e| e.split_once('=').map(|(name, _)| name))
                .collect(),
        )
    }
}

/// Edits the bundle's config.json for `create`/`run`. `Ok(None)`: nothing asked for, the file
/// was not written.
pub fn create(bundle: Bundle, cfg: &Config) -> Result<Option<Outcome>, CreateError> {
    create_parsed(&mut Parsed::read(bundle)?, cfg)
}

/// [`create`] of a bundle already parsed. Borrowed, not taken: the binary keeps the document
/// until it execs the low-level runtime, so a create does not spend time freeing it.
pub fn create_parsed(parsed: &mut Parsed, cfg: &Config) -> Result<Option<Outcome>, CreateError> {
    let Parsed {
        dir: bundle_dir,
        path,
        original,
        doc,
        spec,
    } = parsed;
    // A rewrite killed midway (OOM, power cut) left its temp file; this create cleans up.
    match crate::atomic::remove_leftovers(path) {
        Ok(0) => {}
        Ok(n) => log::info!(
            "{}: removed {n} temp file(s) of a killed rewrite",
            path.display()
        ),
        Err(e) => log::warn!(
            "{}: cannot remove temp files of a killed rewrite: {e}",
            path.display()
        ),
    }

    let mut out = Outcome {
        removed_docker_hook: spec.docker_gpu_hook,
        ..Outcome::default()
    };
    let privileged = spec.privileged;
    let mut lib_dir: Option<PathBuf> = cfg.container_library_dir.clone();
    // The image side (loader cache, dev links, compat, requirements): src/loader.rs.
    let mut image: Option<loader::Image> = None;
    let mut vendor_libs: Vec<loader::VendorLibs> = Vec::new();
    // CDI names: from cdi.k8s.io/* annotations, then from the vendor variables.
    let mut cdi_requests = cdi::annotation_requests(spec)?;
    cdi::check_annotation_kinds(&cdi_requests, &cfg.profiles)?;
    // Annotations are as much the container's own input as its environment (CRI-O passes pod
    // annotations through), so the node's policy on unprivileged requests covers them too.
    if let Some((key, name)) = cdi_requests.first() {
        if !privileged && !cfg.accept_envvar_unprivileged {
            log::warn!(
                "{key}={}: {UNPRIVILEGED_IGNORED}",
                crate::quote::quote(name)
            );
            cdi_requests.clear();
        }
    }

    for profile in &cfg.profiles {
        let Some((var, value, request)) = vendor_request(cfg, profile, spec, privileged)? else {
            continue;
        };
        // Fully-qualified CDI names go with the annotations' to the spec files; those carry
        // the driver's edits too, so a request of only CDI names needs nothing more here.
        if let Request::Items { devices, cdi } = &request {
            cdi::check_variable_kinds(&var, cdi, profile)?;
            cdi_requests.extend(cdi.iter().map(|name| (var.clone(), name.clone())));
            if devices.is_empty() {
                out.requests.push(format!("{var}={value}"));
                continue;
            }
        }
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
            Request::Items { devices: items, .. } => {
                request::select(&var, items, &devices, ranges(profile))?
            }
        };
        let caps_value = profile
            .capabilities_env
            .as_deref()
            .and_then(|v| spec.env(v));
        let caps = plan::capabilities(profile, caps_value)?;
        // The host, looked at once: the selected devices' nodes, the driver's ld.so.cache,
        // nodes, libraries and binaries. The plan below only decides from these.
        let cache = ldcache::load(&profile.driver_root).map_err(|source| CreateError::LdCache {
            root: profile.driver_root.clone(),
            source,
        })?;
        let dev_root = discovery::DevRoot::new(profile);
        let nodes = facts::device_nodes(&dev_root, &selected);
        let driver_facts = facts::driver(&dev_root, &caps, &cache);
        let dir = lib_dir
            .get_or_insert_with(|| spec::default_library_dir(spec.rootfs(bundle_dir).as_deref()));
        out.plan
            .extend(plan::device_edits(profile, &selected, &nodes)?);
        let driver = plan::driver_edits(profile, &caps, &driver_facts, dir)?;
        let image =
            image.get_or_insert_with(|| loader::Image::open(spec.rootfs(bundle_dir).as_deref()));
        let libs = loader::prepare(profile, image, &spec.env_entries(), &driver, dir)?;
        out.plan.extend(driver);
        out.plan.extend(Plan {
            mounts: libs.dev_links.clone(),
            ..Plan::default()
        });
        vendor_libs.push(libs);
        out.requests.push(format!("{var}={value}"));
    }

    if !cdi_requests.is_empty() {
        out.cdi = cdi::resolve(&cfg.cdi_spec_dirs, &cdi_requests)?;
    }

    if out.plan.is_empty() && out.cdi.is_empty() && !out.removed_docker_hook {
        return Ok(None);
    }
    // Everything above was decided from the shim's reading of the spec; runc must read it alike.
    spec::check_read_as_runc(path, original)?;
    // A second create of an already edited bundle changes nothing: leave the file alone rather
    // than rewrite it (two fsyncs on a disk-backed bundle). The plan's edits only add, and say
    // whether they did; CDI edits replace entries in place, so only for those does a copy of
    // the whole document, compared afterwards, tell.
    let before = (!out.cdi.is_empty()).then(|| doc.clone());
    let removed_hook = spec::remove_docker_gpu_hook(doc);
    let added = spec::apply(doc, &out.plan).map_err(|msg| CreateError::Edit {
        path: path.clone(),
        msg,
    })?;
    cdi::apply::apply(doc, &out.cdi).map_err(CdiError::from)?;
    if let Some(image) = &image {
        loader::update_cache_or_warn(image, &vendor_libs);
    }
    let changed = match &before {
        Some(before) => *doc != *before,
        None => removed_hook || added,
    };
    if changed {
        spec::write_bytes(path, &spec::to_bytes(doc))?;
    }
    crate::devchar::ensure_logged(
        &cfg.host_dev_dir,
        out.plan
            .nodes
            .iter()
            .chain(out.cdi.nodes.iter().map(|n| &n.node)),
    );
    Ok(Some(out))
}

/// The vendor's request: from device-list mounts when accepted and present, else from the
/// variable (refused for unprivileged containers when configured so).
fn vendor_request(
    cfg: &Config,
    profile: &Profile,
    spec: &View,
    privileged: bool,
) -> Result<Option<(String, String, Request)>, CreateError> {
    if cfg.accept_container_devices_as_mounts {
        if let Some(dir) = profile.container_devices_mount_dir.as_deref() {
            let ids = request::device_list_from_mounts(dir, &spec.mounts);
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
        .find_map(|v| spec.env(v).map(|x| (v, x)))
    else {
        return Ok(None);
    };
    let request = request::parse(var, value)?;
    if request != Request::Nothing && !privileged && !cfg.accept_envvar_unprivileged {
        log::warn!(
            "{var}={}: {UNPRIVILEGED_IGNORED}",
            crate::quote::quote(value)
        );
        return Ok(None);
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
