//! The `create` path, top to bottom ([`run`], the one way in): read the config and the spec
//! once (its bytes: [`Bundle`]; what the shim reads of it: [`spec::View`]), decide what is
//! asked (`asked`), each asked vendor's devices, host facts and plan (`plan`: the steps every
//! CDI spec takes too, [`crate::pipeline`]), the image side (`image_side`), apply (`apply`),
//! write atomically. The decision ([`decide`], [`Decision::outcome`]) is a function of the
//! view alone, which the NRI plugin (src/nri/) builds from NRI's container.
//! Fully-qualified CDI names (in a vendor variable or `cdi.k8s.io/*` annotations) are resolved
//! from the CDI spec dirs and applied after the variable's edits, with CDI's replace rules.
//!
//! Nothing is written unless every vendor's request resolved: an error leaves config.json
//! exactly as it was, so runc is never started on a half-edited spec.

use std::path::{Path, PathBuf};

use crate::cdi::{self, CdiError};
use crate::config::Config;
use crate::loader;
use crate::pipeline::{self, PipelineError, Planned, Purpose, Wanted};
use crate::plan::Plan;
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
    Pipeline(#[from] PipelineError),
    #[error("{var}={value}: {msg}")]
    Refused {
        var: String,
        value: String,
        msg: String,
    },
    #[error(transparent)]
    Cdi(#[from] CdiError),
    #[error(transparent)]
    Require(#[from] crate::constraints::RequireError),
    #[error("{}: {msg}", path.display())]
    Edit { path: PathBuf, msg: String },
    #[error(transparent)]
    Config(Box<crate::config::ConfigError>),
}

impl From<crate::config::ConfigError> for CreateError {
    fn from(e: crate::config::ConfigError) -> CreateError {
        CreateError::Config(Box::new(e))
    }
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

/// The bundle's config.json, read once: [`spec::screen`] looks at the bytes, [`run`]
/// parses and edits them.
#[derive(Debug)]
pub struct Bundle {
    pub dir: PathBuf,
    pub config_json: PathBuf,
    /// The file's bytes, or why they could not be read (reported by [`run`]).
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

/// A bundle whose config.json was parsed, for [`run`] to edit.
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
}

/// What the binary needs once the create is done: the low-level runtime to exec, and what
/// the create read and built. The caller keeps it until the exec replaces the process:
/// freeing it would only cost time.
#[derive(Debug)]
pub struct Done {
    pub low_level_runtime: String,
    pub kept: Option<(Parsed, Config)>,
}

/// `create`/`run`, the one way in: read the config and the spec, decide what the spec asks
/// for, look at the host once, plan from what was seen, apply the plan to the document and
/// replace config.json atomically. Returns the low-level runtime to exec with the untouched
/// argv. A spec that certainly asks for nothing (most containers) is not even parsed:
/// [`spec::screen`] tells from its bytes and the names the profiles claim.
pub fn run(bundle_dir: &Path, id: &str) -> Result<Done, CreateError> {
    let quick = crate::config::Quick::read(&crate::config::path())?;
    let bundle = Bundle::read(bundle_dir);
    let nothing = match &bundle.data {
        Ok(data) if !quick.accept_container_devices_as_mounts => {
            spec::screen::screen(data, quick.texts()) == spec::screen::Screen::Nothing
        }
        _ => false,
    };
    if nothing {
        return Ok(Done {
            low_level_runtime: quick.low_level_runtime,
            kept: None,
        });
    }
    let mut parsed = Parsed::read(bundle)?;
    let cfg = {
        // A spec asks by its environment's names alone unless it has CDI annotations,
        // docker's hook, or the node takes device-list mounts: then any profile may be asked.
        let spec = &parsed.spec;
        let names: Vec<&str> = spec
            .env
            .iter()
            .map(|e| e.split_once('=').map_or(e.as_str(), |(name, _)| name))
            .collect();
        let by_env = !quick.accept_container_devices_as_mounts
            && !spec.docker_gpu_hook
            && !spec
                .annotations
                .iter()
                .any(|(k, _)| k.starts_with(spec::CDI_ANNOTATION_PREFIX));
        quick.into_create_config(by_env.then_some(&names[..]))?
    };
    crate::logging::init(&cfg.log_file, cfg.log_level);
    for w in &cfg.warnings {
        log::warn!("{w}");
    }
    match edit(&mut parsed, &cfg)? {
        Some(out) => log::info!(
            "create {id}: {} nodes, {} mounts{}{}",
            out.plan.nodes.len() + out.cdi.nodes.len(),
            out.plan.mounts.len() + out.cdi.mounts.len(),
            if out.requests.is_empty() {
                String::new()
            } else {
                format!(" for {}", out.requests.join(" "))
            },
            if out.removed_docker_hook {
                " (docker --gpus hook replaced)"
            } else {
                ""
            },
        ),
        None => log::debug!("create {id}: no device requested"),
    }
    Ok(Done {
        low_level_runtime: cfg.low_level_runtime.clone(),
        kept: Some((parsed, cfg)),
    })
}

/// The edit of a parsed bundle, step by step. `Ok(None)`: nothing asked for, the file was
/// not written.
fn edit(parsed: &mut Parsed, cfg: &Config) -> Result<Option<Outcome>, CreateError> {
    remove_leftovers(&parsed.path);
    let spec = &parsed.spec;
    let rootfs = spec.rootfs(&parsed.dir);
    let decision = decide(cfg, spec, rootfs.as_deref())?;
    let (image, vendor_libs) = image_side(
        &decision.asked,
        &decision.planned,
        spec,
        &parsed.dir,
        &decision.lib_dir,
    )?;
    let Some(out) = decision.outcome(cfg, spec.docker_gpu_hook)? else {
        return Ok(None);
    };
    // Everything above was decided from the shim's reading of the spec; runc must read it alike.
    spec::check_read_as_runc(&parsed.path, &parsed.original)?;
    if apply(&mut parsed.doc, &parsed.path, &out)? {
        spec::write_bytes(&parsed.path, &spec::to_bytes(&parsed.doc))?;
    }
    if let Some(image) = &image {
        loader::update_cache_or_warn(image, &vendor_libs);
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

/// What a container asks for and each asked vendor's plan: the decision the shim's create and
/// the NRI plugin (src/nri/) share, made from the container's [`View`] alone. Finished by
/// [`Decision::outcome`]; between the two the shim checks the image (`image_side`), which the
/// plugin cannot see.
pub struct Decision<'c> {
    asked: Asked<'c>,
    planned: Vec<Planned>,
    /// Where libraries go in the container.
    pub lib_dir: PathBuf,
}

/// Steps 1 and 2: what `spec` asks for (its variables, device-list mounts when the node takes
/// them, CDI names in annotations and variables) and each asked vendor's plan. `rootfs`: the
/// image, where the library directory is looked up when the config names none (`None`: the
/// default, `/usr/lib64`).
pub fn decide<'c>(
    cfg: &'c Config,
    spec: &View,
    rootfs: Option<&Path>,
) -> Result<Decision<'c>, CreateError> {
    let asked = asked(cfg, spec)?;
    // Where libraries go in the container: looked up in the image only when a vendor is asked.
    let lib_dir = match &cfg.container_library_dir {
        Some(d) => d.clone(),
        None if asked.vendors.is_empty() => PathBuf::new(),
        None => spec::default_library_dir(rootfs),
    };
    let planned = plan(&asked, spec, &lib_dir)?;
    Ok(Decision {
        asked,
        planned,
        lib_dir,
    })
}

impl Decision<'_> {
    /// The edits, vendor by vendor as the profiles are ordered (its nodes, its driver, its dev
    /// links), then the CDI names resolved. `Ok(None)`: nothing to edit (`docker_hook`: docker's
    /// hook is there to replace, which is an edit).
    pub fn outcome(self, cfg: &Config, docker_hook: bool) -> Result<Option<Outcome>, CreateError> {
        let mut out = Outcome {
            requests: self.asked.requests,
            removed_docker_hook: docker_hook,
            ..Outcome::default()
        };
        for p in self.planned {
            for (_, nodes) in p.devices {
                out.plan.extend(nodes);
            }
            out.plan.extend(p.driver);
            out.plan.extend(Plan {
                mounts: p.dev_links,
                ..Plan::default()
            });
        }
        if !self.asked.cdi.is_empty() {
            out.cdi = cdi::resolve(&cfg.cdi_spec_dirs, &self.asked.cdi)?;
        }
        if out.plan.is_empty() && out.cdi.is_empty() && !out.removed_docker_hook {
            return Ok(None);
        }
        Ok(Some(out))
    }
}

/// A rewrite killed midway (OOM, power cut) left its temp file; this create cleans up.
fn remove_leftovers(path: &Path) {
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
}

/// What one vendor is asked for: by its variable or by device-list mounts.
struct Ask<'c> {
    profile: &'c Profile,
    var: String,
    value: String,
    request: Request,
}

/// Step 1, what the spec asks for: each vendor's request, and the CDI names (from
/// `cdi.k8s.io/*` annotations and the vendor variables) with where each came from.
struct Asked<'c> {
    vendors: Vec<Ask<'c>>,
    cdi: Vec<(String, String)>,
    /// `VAR=value` of each request, for the log line.
    requests: Vec<String>,
}

fn asked<'c>(cfg: &'c Config, spec: &View) -> Result<Asked<'c>, CreateError> {
    let mut cdi_requests = cdi::annotation_requests(spec)?;
    cdi::check_annotation_kinds(&cdi_requests, &cfg.profiles)?;
    // Annotations are as much the container's own input as its environment (CRI-O passes pod
    // annotations through), so the node's policy on unprivileged requests covers them too.
    if let Some((key, name)) = cdi_requests.first() {
        if !spec.privileged && !cfg.accept_envvar_unprivileged {
            log::warn!(
                "{key}={}: {UNPRIVILEGED_IGNORED}",
                crate::quote::quote(name)
            );
            cdi_requests.clear();
        }
    }
    let mut asked = Asked {
        vendors: Vec::new(),
        cdi: cdi_requests,
        requests: Vec::new(),
    };
    for profile in &cfg.profiles {
        let Some((var, value, request)) = vendor_request(cfg, profile, spec, spec.privileged)?
        else {
            continue;
        };
        // Fully-qualified CDI names go with the annotations' to the spec files; those carry
        // the driver's edits too, so a request of only CDI names needs nothing more here.
        if let Request::Items { devices, cdi } = &request {
            cdi::check_variable_kinds(&var, cdi, profile)?;
            asked
                .cdi
                .extend(cdi.iter().map(|name| (var.clone(), name.clone())));
            if devices.is_empty() {
                asked.requests.push(format!("{var}={value}"));
                continue;
            }
        }
        match request {
            Request::Nothing => continue,
            Request::DriverOnly if !profile.none_injects_driver => continue,
            _ => {}
        }
        asked.requests.push(format!("{var}={value}"));
        asked.vendors.push(Ask {
            profile,
            var,
            value,
            request,
        });
    }
    Ok(asked)
}

/// Step 2, each asked vendor through the steps every CDI spec takes too ([`pipeline::run`]):
/// its devices discovered, those asked selected, its capability groups (the spec's variable),
/// the host looked at once, the plan decided from what was seen. Vendor by vendor, in the
/// profiles' order.
fn plan(asked: &Asked<'_>, spec: &View, lib_dir: &Path) -> Result<Vec<Planned>, CreateError> {
    asked
        .vendors
        .iter()
        .map(|ask| {
            let profile = ask.profile;
            let wanted = match &ask.request {
                Request::All => Wanted::All,
                Request::Items { devices, .. } => Wanted::Items {
                    var: &ask.var,
                    items: devices,
                },
                Request::DriverOnly | Request::Nothing => Wanted::DriverOnly,
            };
            let capabilities = profile
                .capabilities_env
                .as_deref()
                .and_then(|v| spec.env(v));
            pipeline::run(&pipeline::Ask {
                profile,
                wanted,
                capabilities,
                lib_dir,
                purpose: Purpose::Create,
            })
            .map_err(|e| match e {
                // Named with the variable that asked for every device.
                e if e.is_no_devices() => CreateError::Refused {
                    var: ask.var.clone(),
                    value: ask.value.clone(),
                    msg: e.to_string(),
                },
                e => e.into(),
            })
        })
        .collect()
}

/// Step 3, the image side (src/loader.rs): each vendor's requirements checked against the
/// image, compat libraries and loader-cache entries. The image is read only through its
/// rootfs fd, and only when a vendor is asked for.
fn image_side(
    asked: &Asked<'_>,
    planned: &[Planned],
    spec: &View,
    bundle_dir: &Path,
    lib_dir: &Path,
) -> Result<(Option<loader::Image>, Vec<loader::VendorLibs>), CreateError> {
    if asked.vendors.is_empty() {
        return Ok((None, Vec::new()));
    }
    let image = loader::Image::open(spec.rootfs(bundle_dir).as_deref());
    let env = spec.env_entries();
    let mut libs = Vec::with_capacity(planned.len());
    for (ask, p) in asked.vendors.iter().zip(planned) {
        libs.push(loader::prepare(
            ask.profile,
            &image,
            &env,
            &p.driver,
            lib_dir,
        )?);
    }
    Ok((Some(image), libs))
}

/// Step 4, the plan applied to the document. Returns whether it changed: a second create of
/// an already edited bundle changes nothing, and the file is then left alone rather than
/// rewritten (two fsyncs on a disk-backed bundle). The plan's edits only add, and say
/// whether they did; CDI edits replace entries in place, so only for those does a copy of
/// the whole document, compared afterwards, tell.
fn apply(doc: &mut serde_json::Value, path: &Path, out: &Outcome) -> Result<bool, CreateError> {
    let before = (!out.cdi.is_empty()).then(|| doc.clone());
    let removed_hook = spec::remove_docker_gpu_hook(doc);
    let added = spec::apply(doc, &out.plan).map_err(|msg| CreateError::Edit {
        path: path.to_path_buf(),
        msg,
    })?;
    cdi::apply::apply(doc, &out.cdi).map_err(CdiError::from)?;
    Ok(match &before {
        Some(before) => *doc != *before,
        None => removed_hook || added,
    })
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
