//! The `create` path, top to bottom: read the spec (once: [`Bundle`]), screen it, decide per
//! vendor, apply, write.
//! Fully-qualified CDI names (in a vendor variable or `cdi.k8s.io/*` annotations) are resolved
//! from the CDI spec dirs and applied after the variable's edits, with CDI's replace rules.
//!
//! Nothing is written unless every vendor's request resolved: an error leaves config.json
//! exactly as it was, so runc is never started on a half-edited spec.

use std::path::{Path, PathBuf};

use crate::cdi::{self, CdiError};
use crate::config::{Config, Quick};
use crate::discovery::{self, Device, DiscoveryError};
use crate::ldcache;
use crate::loader;
use crate::plan::{self, Plan, PlanError};
use crate::profile::Profile;
use crate::request::{self, Request, RequestError};
use crate::spec::{self, Document, SpecError};

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

const UNPRIVILEGED_REFUSED: &str = "device requests through the environment or annotations are refused for unprivileged containers on this node (accept-envvar-unprivileged = false); use the device plugin's volume-mount list";

/// What a create did, for the one log line.
#[derive(Debug, Default)]
pub struct Outcome {
    pub requests: Vec<String>,
    pub plan: Plan,
    /// Edits from CDI specs, for the fully-qualified names asked for.
    pub cdi: cdi::Resolved,
    pub removed_docker_hook: bool,
}

/// The bundle's config.json, read once: [`screen`] looks at the bytes, [`create`] edits them.
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

/// Edits the bundle's config.json for `create`/`run`. `Ok(None)`: nothing asked for, the file
/// was not written.
pub fn create(bundle: Bundle, cfg: &Config) -> Result<Option<Outcome>, CreateError> {
    let path = bundle.config_json;
    let original = bundle.data?;
    let mut spec = Document::parse_file(&path, &original)?;

    let removed_docker_hook = spec
        .remove_docker_gpu_hook()
        .map_err(|msg| CreateError::Edit {
            path: path.clone(),
            msg,
        })?;
    let mut out = Outcome {
        removed_docker_hook,
        ..Outcome::default()
    };
    let privileged = spec.is_privileged();
    let mut lib_dir: Option<PathBuf> = cfg.container_library_dir.clone();
    // The image side (loader cache, dev links, compat, requirements): src/loader.rs.
    let mut image: Option<loader::Image> = None;
    let mut vendor_libs: Vec<loader::VendorLibs> = Vec::new();
    // CDI names: from cdi.k8s.io/* annotations, then from the vendor variables.
    let mut cdi_requests = cdi::annotation_requests(&spec)?;
    cdi::check_annotation_kinds(&cdi_requests, &cfg.profiles)?;
    // Annotations are as much the container's own input as its environment (CRI-O passes pod
    // annotations through), so the node's policy on unprivileged requests covers them too.
    if let Some((key, name)) = cdi_requests.first() {
        if !privileged && !cfg.accept_envvar_unprivileged {
            return Err(CreateError::Refused {
                var: key.clone(),
                value: name.clone(),
                msg: UNPRIVILEGED_REFUSED.into(),
            });
        }
    }

    for profile in &cfg.profiles {
        let Some((var, value, request)) = vendor_request(cfg, profile, &spec, privileged)? else {
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
        out.plan.extend(plan::device_edits(profile, &selected)?);

        let caps_value = profile
            .capabilities_env
            .as_deref()
            .and_then(|v| spec.env(v));
        let caps = plan::capabilities(profile, caps_value)?;
        let cache = ldcache::load(&profile.driver_root).map_err(|source| CreateError::LdCache {
            root: profile.driver_root.clone(),
            source,
        })?;
        let dir = lib_dir
            .get_or_insert_with(|| spec::default_library_dir(spec.rootfs(&bundle.dir).as_deref()));
        let driver = plan::driver_edits(profile, &caps, &cache, dir)?;
        let image =
            image.get_or_insert_with(|| loader::Image::open(spec.rootfs(&bundle.dir).as_deref()));
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
    spec::apply(&mut spec, &out.plan).map_err(|msg| CreateError::Edit {
        path: path.clone(),
        msg,
    })?;
    cdi::apply::apply(&mut spec, &out.cdi).map_err(CdiError::from)?;
    if let Some(image) = &image {
        loader::update_cache_or_warn(image, &vendor_libs);
    }
    // A second create of an already edited bundle changes nothing: leave the file alone rather
    // than rewrite the same bytes (two fsyncs on a disk-backed bundle). CDI edits replace
    // entries in place, so only the result tells: an unchanged document splices back to
    // exactly the bytes read.
    let edited = spec.to_bytes();
    if edited != original {
        spec::write_bytes(&path, &edited)?;
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

/// What a look at the bundle's spec, before any profile is parsed, says about a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    /// The spec certainly asks for nothing: config.json is neither parsed nor written.
    Nothing,
    /// Only these variables can make a request: only the profiles that may claim one of
    /// them need building.
    Variables(Vec<String>),
    /// Anything may be asked for (device-list mounts accepted, docker's `--gpus` hook, CDI
    /// annotations, a spec that does not read): every profile is built.
    Anything,
}

impl Screen {
    /// The only variables that can make a request (`None`: any can), for
    /// [`Quick::into_config`], which then builds only the profiles that may claim them.
    pub fn variables(&self) -> Option<&[String]> {
        match self {
            Screen::Variables(names) => Some(names),
            _ => None,
        }
    }
}

/// Screens the bundle's spec: whether it certainly asks for nothing (then neither the
/// profiles nor config.json are parsed, each costs more than the rest of a pass-through,
/// benches/BENCHMARKS.md, and config.json is never written), and else which variables can
/// make a request, so that only the profiles claiming them are parsed.
///
/// The spec is screened as bytes: every `"NAME=` in it (env entries, as engines write them:
/// names are never escaped) is offered to [`config::Quick::may_claim`]. Any doubt (a name
/// some profile mentions, the hook's name or `cdi.k8s.io/` anywhere, a file that does not read or is not a
/// JSON object) goes down the full create path, which decides and reports errors. A spec
/// that is a JSON object but has sections of the wrong type, and asks for nothing, goes to
/// the low-level runtime as it is: runc judges its own spec.
pub fn screen(bundle: &Bundle, quick: &Quick) -> Screen {
    if quick.accept_container_devices_as_mounts {
        return Screen::Anything;
    }
    let Ok(data) = &bundle.data else {
        return Screen::Anything;
    };
    // Not an object: the full path names the file and the error.
    if data.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Screen::Anything;
    }
    // Docker's --gpus hook to replace, or CDI annotations to resolve.
    for needle in [spec::DOCKER_GPU_HOOK, cdi::model::ANNOTATION_PREFIX] {
        if bytes::contains(data, needle.as_bytes()) {
            return Screen::Anything;
        }
    }
    if escapes_hook_byte(data) {
        return Screen::Anything;
    }
    // Each `=` preceded by a run of name bytes and a quote is a `"NAME=`; `=` is much rarer
    // than `"` in a spec, so the scan starts from it.
    let is_name = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    let mut names: Vec<String> = Vec::new();
    for eq in bytes::positions(b'=', data) {
        let len = data[..eq].iter().rev().take_while(|b| is_name(b)).count();
        let start = eq - len;
        if start > 0 && data[start - 1] == b'"' {
            let name = std::str::from_utf8(&data[start..eq]).unwrap_or_default();
            if quick.may_claim(name) && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    if !names.is_empty() {
        return Screen::Variables(names);
    }
    // Not JSON: the full path names the file and the error. Checked last, as only a spec
    // that asks for nothing needs it, and without building the document.
    if std::str::from_utf8(data).is_ok_and(spec::scan::is_json) {
        Screen::Nothing
    } else {
        Screen::Anything
    }
}

/// Whether `data` has a `\u00XX` escape of a byte of docker's hook name: any escaped
/// spelling of the name (runc decodes it) has one. Go's encoder escapes `<`, `>`, `&` this way
/// in every spec docker writes, so a plain `\u` would send many specs down the full path.
fn escapes_hook_byte(data: &[u8]) -> bool {
    bytes::positions(b'\\', data).any(|i| {
        let Some(esc) = data.get(i + 1..i + 6) else {
            return false;
        };
        esc.starts_with(b"u00")
            && std::str::from_utf8(&esc[3..])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .is_some_and(|b| spec::DOCKER_GPU_HOOK.as_bytes().contains(&b))
    })
}

/// The vendor's request: from device-list mounts when accepted and present, else from the
/// variable (refused for unprivileged containers when configured so).
fn vendor_request(
    cfg: &Config,
    profile: &Profile,
    spec: &Document<'_>,
    privileged: bool,
) -> Result<Option<(String, String, Request)>, CreateError> {
    if cfg.accept_container_devices_as_mounts {
        if let Some(dir) = profile.container_devices_mount_dir.as_deref() {
            let ids = request::device_list_from_mounts(dir, &spec.mounts());
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
        return Err(CreateError::Refused {
            var: var.clone(),
            value: crate::quote::quote(value),
            msg: UNPRIVILEGED_REFUSED.into(),
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

/// memchr's searches for the screen, which looks at every byte of every create's config.json
/// (a byte loop was ~0.1 M instructions for 9 KB). On x86_64 its SSE2 routines, which every
/// x86_64 CPU has, rather than the ones it picks at run time: the pick runs CPUID about ten
/// times per process, and in a VM each CPUID traps to the hypervisor (~0.8 us on the bench
/// VM, more than the searches themselves).
mod bytes {
    /// Whether `needle` is in `haystack`.
    #[cfg(target_arch = "x86_64")]
    pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        use memchr::arch::x86_64::sse2::packedpair::Finder;
        match Finder::new(needle) {
            Some(f) if haystack.len() >= f.min_haystack_len() => f.find(haystack, needle).is_some(),
            _ => needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle),
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        memchr::memmem::find(haystack, needle).is_some()
    }

    /// The offsets of `byte` in `haystack`.
    #[cfg(target_arch = "x86_64")]
    pub fn positions(byte: u8, haystack: &[u8]) -> impl Iterator<Item = usize> + '_ {
        // SAFETY: SSE2 is part of every x86_64 CPU (the target's baseline).
        let one = unsafe { memchr::arch::x86_64::sse2::memchr::One::new_unchecked(byte) };
        let mut at = 0;
        std::iter::from_fn(move || {
            let found = at + one.find(haystack.get(at..)?)?;
            at = found + 1;
            Some(found)
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn positions(byte: u8, haystack: &[u8]) -> impl Iterator<Item = usize> + '_ {
        memchr::memchr_iter(byte, haystack)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn searches_agree_with_plain_loops() {
            let text: Vec<u8> = (0..3000u32)
                .map(|i| b"ab=\"x-h\\"[(i * 7 % 13 % 8) as usize])
                .chain(*b"nvidia-container-runtime-hook==")
                .collect();
            for len in [0, 1, 5, 16, 40, 100, text.len()] {
                let hay = &text[text.len() - len..];
                for needle in [
                    &b"nvidia-container-runtime-hook"[..],
                    b"=\\",
                    b"ab=",
                    b"zz",
                    b"x",
                ] {
                    let want = hay.windows(needle.len()).any(|w| w == needle);
                    assert_eq!(super::contains(hay, needle), want, "{len} {needle:?}");
                }
                let want: Vec<usize> = (0..hay.len()).filter(|&i| hay[i] == b'=').collect();
                assert_eq!(
                    super::positions(b'=', hay).collect::<Vec<_>>(),
                    want,
                    "{len}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screen_names_the_variables_profiles_may_claim() {
        let quick = Quick::load_from(Path::new("/nonexistent/config.toml")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let screen_of = |json: &str| {
            std::fs::write(dir.path().join("config.json"), json).unwrap();
            screen(&Bundle::read(dir.path()), &quick)
        };
        assert_eq!(
            screen_of(
                r#"{"process":{"env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES=all","ENFLAME_VISIBLE_DEVICES=0","NVIDIA_VISIBLE_DEVICES=0"]},"mounts":[{"options":["mode=755"]}]}"#
            ),
            Screen::Variables(vec![
                "NVIDIA_VISIBLE_DEVICES".into(),
                "ENFLAME_VISIBLE_DEVICES".into()
            ])
        );
        assert_eq!(
            screen_of(r#"{"process":{"env":["PATH=/bin","X_VISIBLE_DEVICES=1"]}}"#),
            Screen::Nothing
        );
        assert_eq!(
            screen_of(r#"{"process":{"env":["PATH=/bin"]}"#),
            Screen::Anything
        );
        assert_eq!(screen_of(r#"["PATH=/bin"]"#), Screen::Anything);
        assert_eq!(
            screen_of(r#"{"annotations":{"cdi.k8s.io/x":"vendor.com/gpu=0"}}"#),
            Screen::Anything
        );
        // An escaped spelling of docker's hook is looked at; Go's HTML escapes are not.
        assert_eq!(
            screen_of(
                r#"{"hooks":{"prestart":[{"path":"/usr/bin/nvidia-container-runtime-hoo\u006B"}]}}"#
            ),
            Screen::Anything
        );
        assert_eq!(
            screen_of(r#"{"process":{"env":["URL=a\u0026b\u003cc\u003e"]}}"#),
            Screen::Nothing
        );
    }
}
