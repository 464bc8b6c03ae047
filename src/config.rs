//! The runtime's configuration file and the set of vendor profiles it yields.
//!
//! Order of precedence for profiles: built-in, then `profiles-dir/*.toml` (a file with a
//! built-in's name replaces it), then `[profiles.<name>]` tables in config.toml merged key by
//! key. Unknown keys are collected as warnings, never silently dropped.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::profile::{self, Builtin, Keep, Profile, ProfileError};
use crate::trust::{self, OpenError};

pub const DEFAULT_PATH: &str = "/etc/accel-container-runtime/config.toml";
pub const ENV_VAR: &str = "ACCEL_CONTAINER_RUNTIME_CONFIG";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{}: {msg}", path.display())]
    Invalid { path: PathBuf, msg: String },
    /// Not root's alone to write (src/trust.rs).
    #[error("{}: {msg}", path.display())]
    Untrusted { path: PathBuf, msg: String },
    #[error(transparent)]
    Profile(#[from] ProfileError),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct File {
    #[serde(default = "d_runtime")]
    low_level_runtime: String,
    #[serde(default = "d_log_file")]
    log_file: PathBuf,
    #[serde(default = "d_log_level")]
    log_level: String,
    #[serde(default = "d_profiles_dir")]
    profiles_dir: PathBuf,
    #[serde(default = "d_cdi_dirs")]
    cdi_spec_dirs: Vec<PathBuf>,
    #[serde(default = "d_lib_dir")]
    container_library_dir: String,
    #[serde(default = "d_true")]
    accept_envvar_unprivileged: bool,
    #[serde(default)]
    accept_container_devices_as_mounts: bool,
    #[serde(default = "d_host_dev_dir")]
    host_dev_dir: PathBuf,
    #[serde(default = "d_cgroup_root")]
    cgroup_root: PathBuf,
    #[serde(default = "d_dmem_grants_dir")]
    dmem_grants_dir: PathBuf,
    #[serde(default)]
    profiles: toml::Table,
}

/// The one key a pass-through command needs; every other key (and every profile) is left
/// unparsed, so `state`/`kill`/`delete` cost no more than finding runc.
#[derive(Debug, Deserialize)]
struct RuntimeOnly {
    #[serde(default = "d_runtime", rename = "low-level-runtime")]
    low_level_runtime: String,
}

/// The keys the quick screen of `create` reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct QuickFile {
    #[serde(default = "d_runtime")]
    low_level_runtime: String,
    #[serde(default = "d_profiles_dir")]
    profiles_dir: PathBuf,
    #[serde(default)]
    accept_container_devices_as_mounts: bool,
    #[serde(default = "d_cgroup_root")]
    cgroup_root: PathBuf,
    #[serde(default = "d_dmem_grants_dir")]
    dmem_grants_dir: PathBuf,
}

/// The config loader's first half: config.toml read and parsed, the `profiles-dir/*.toml`
/// files read but not parsed. [`Quick::into_config`] is the second half ([`Config::load`] is
/// both); `create` stops after the first when the spec certainly asks for nothing
/// (`spec::screen` reads [`Quick::texts`]), as most containers ask for no device.
#[derive(Debug, Clone)]
pub struct Quick {
    pub low_level_runtime: String,
    pub accept_container_devices_as_mounts: bool,
    /// The host's cgroup v2 root and the DRA driver's grants by pod: what a create reads for
    /// a share's `dmem.max` (src/dmem.rs), before the screen, since a share's container may
    /// ask for nothing else.
    pub cgroup_root: PathBuf,
    pub dmem_grants_dir: PathBuf,
    /// config.toml (`None`: no file, the defaults).
    path: Option<PathBuf>,
    text: String,
    /// `text` deserialized, with its warnings (unknown keys, an unlistable profiles-dir);
    /// `None` when only the screen's keys deserialize: the full load reports the error.
    file: Option<(File, Vec<String>)>,
    /// The `*.toml` files of profiles-dir, read.
    profiles: ProfileFiles,
}

impl Quick {
    /// Reads config.toml at `path` (usually [`path()`]) and the profile files it names.
    pub fn read(path: &Path) -> Result<Quick, ConfigError> {
        let mut checked = trust::Checked::default();
        let (path, text) = match read_text(path, &mut checked)? {
            Some(text) => (Some(path.to_path_buf()), text),
            None => (None, String::new()),
        };
        let shown = shown(path.as_deref());
        let (low_level_runtime, accept, profiles_dir, dmem, file) = match parse_file(&text, &shown)
        {
            Ok((file, warnings)) => (
                file.low_level_runtime.clone(),
                file.accept_container_devices_as_mounts,
                file.profiles_dir.clone(),
                (file.cgroup_root.clone(), file.dmem_grants_dir.clone()),
                Some((file, warnings)),
            ),
            // Only the screen's keys need to deserialize here.
            Err(_) => {
                let q: QuickFile = toml::from_str(&text).map_err(|source| ConfigError::Parse {
                    path: shown.clone(),
                    source,
                })?;
                (
                    q.low_level_runtime,
                    q.accept_container_devices_as_mounts,
                    q.profiles_dir,
                    (q.cgroup_root, q.dmem_grants_dir),
                    None,
                )
            }
        };
        let mut listing = Vec::new();
        let profiles = read_profile_files(&profiles_dir, &mut listing, &mut checked)?;
        let low_level_runtime = check_runtime(&low_level_runtime, &shown)?;
        let (cgroup_root, dmem_grants_dir) = dmem;
        for (key, p) in [
            ("cgroup-root", &cgroup_root),
            ("dmem-grants-dir", &dmem_grants_dir),
        ] {
            check_host_dir(key, p, &shown)?;
        }
        Ok(Quick {
            low_level_runtime,
            accept_container_devices_as_mounts: accept,
            cgroup_root,
            dmem_grants_dir,
            path,
            text,
            file: file.map(|(f, mut warnings)| {
                warnings.extend(listing);
                (f, warnings)
            }),
            profiles,
        })
    }

    /// Every text that can name a variable a profile claims: config.toml, the profile
    /// files, the built-ins.
    pub fn texts(&self) -> impl Iterator<Item = &str> + Clone {
        std::iter::once(self.text.as_str())
            .chain(self.profiles.iter().filter_map(|(_, t)| t.as_deref()))
            .chain(profile::BUILTIN.iter().map(|b| b.text))
    }

    /// The [`Config`]: every profile built from what was read here (config.toml and the
    /// profile files are neither read nor parsed again), with every table of each.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        self.into_config_keeping(Keep::All, None)
    }

    /// [`Quick::into_config`] for a create whose spec's environment sets `variables`
    /// (`None`: a create that may involve any profile: CDI annotations, device-list mounts):
    /// only the profiles that may claim one of them are parsed and built, each with every
    /// source of its name, as the full load builds it, in the same order, so the create's
    /// plan is the same (test `a_create_builds_the_claiming_profiles_as_the_full_load`); and
    /// none keeps the tables only the daemons read ([`Keep::Create`]). Both spare a create
    /// what it never uses: every other vendor's profile, and the exporter's and sharing's
    /// tables (benches/BENCHMARKS.md, "What a create parses").
    pub fn into_create_config(self, variables: Option<&[&str]>) -> Result<Config, ConfigError> {
        self.into_config_keeping(Keep::Create, variables)
    }

    fn into_config_keeping(
        self,
        keep: Keep,
        variables: Option<&[&str]>,
    ) -> Result<Config, ConfigError> {
        match self.file {
            Some((file, warnings)) => Config::build(
                file,
                warnings,
                self.path.as_deref(),
                Some(self.profiles),
                keep,
                variables,
            ),
            // Fails again, as the full load does.
            None => Config::parse(&self.text, self.path.as_deref()),
        }
    }
}

/// The `*.toml` files of a profiles-dir as (path, text); `None`: gone since it was listed.
type ProfileFiles = Vec<(PathBuf, Option<String>)>;

/// Lists and reads the profile files of `dir` (missing dir: none).
fn read_profile_files(
    dir: &Path,
    warnings: &mut Vec<String>,
    checked: &mut trust::Checked,
) -> Result<ProfileFiles, ConfigError> {
    let mut files = Vec::new();
    for path in profile_files(dir, warnings) {
        let text = read_text(&path, checked)?;
        files.push((path, text));
    }
    Ok(files)
}

fn d_runtime() -> String {
    "runc".into()
}
fn d_log_file() -> PathBuf {
    "/var/log/accel-container-runtime.log".into()
}
fn d_log_level() -> String {
    "info".into()
}
fn d_profiles_dir() -> PathBuf {
    "/etc/accel-container-runtime/profiles.d".into()
}
fn d_cdi_dirs() -> Vec<PathBuf> {
    vec!["/etc/cdi".into(), "/var/run/cdi".into()]
}
fn d_lib_dir() -> String {
    "auto".into()
}
fn d_host_dev_dir() -> PathBuf {
    PathBuf::from("/dev")
}
fn d_cgroup_root() -> PathBuf {
    PathBuf::from(crate::dmem::DEFAULT_CGROUP_ROOT)
}
fn d_dmem_grants_dir() -> PathBuf {
    PathBuf::from(crate::dmem::DEFAULT_GRANTS_DIR)
}

/// A host directory key's value: an absolute path without `..`.
fn check_host_dir(key: &str, p: &Path, shown: &Path) -> Result<(), ConfigError> {
    if p.is_absolute() && !profile::has_dotdot(p) {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        path: shown.to_path_buf(),
        msg: format!("{key} {p:?} must be an absolute path without '..'"),
    })
}
fn d_true() -> bool {
    true
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from (`None`: built-in defaults, no file present).
    pub path: Option<PathBuf>,
    pub low_level_runtime: String,
    pub log_file: PathBuf,
    pub log_level: log::LevelFilter,
    pub profiles_dir: PathBuf,
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// `None` = auto (decided per container from its rootfs).
    pub container_library_dir: Option<PathBuf>,
    pub accept_envvar_unprivileged: bool,
    pub accept_container_devices_as_mounts: bool,
    /// The host's /dev, under which every injected node gets its `char/MAJOR:MINOR` link
    /// (src/devchar.rs).
    pub host_dev_dir: PathBuf,
    /// The host's cgroup v2 root, whose `dmem.capacity` lists the device-memory regions the
    /// kernel can limit (src/dmem.rs).
    pub cgroup_root: PathBuf,
    /// Where the DRA driver keeps each share's memory by pod, for `dmem.max`.
    pub dmem_grants_dir: PathBuf,
    pub profiles: Vec<Profile>,
    /// Unknown keys and other things worth a log line.
    pub warnings: Vec<String>,
}

impl Config {
    /// Loads config.toml at `path` (usually [`path()`]) and every profile. A missing file is
    /// the defaults; an unreadable or invalid one is an error.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Quick::read(path)?.into_config()
    }

    /// The config of the node whose `/` is `root` (the doctor's `--root`): config.toml at
    /// `path` under it, `profiles-dir` under it, every profile's driver-root and dev-root
    /// under it. Nothing of this machine's own files is read. config.toml is read bounded
    /// but not judged by owner (a root copied from another node keeps its owners).
    pub fn load_under(root: &Path, path: &Path) -> Result<Config, ConfigError> {
        let at = Profile::under(root, path);
        let text = match crate::bounded::read_text(&at, MAX_FILE_SIZE) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(ConfigError::Read { path: at, source }),
        };
        let shown_at = text.as_ref().map(|_| at.as_path());
        let (mut file, mut warnings) = parse_file(text.as_deref().unwrap_or(""), &shown(shown_at))?;
        file.profiles_dir = Profile::under(root, &file.profiles_dir);
        let files = read_profile_files(
            &file.profiles_dir,
            &mut warnings,
            &mut trust::Checked::default(),
        )?;
        let mut cfg = Self::build(file, warnings, shown_at, Some(files), Keep::All, None)?;
        cfg.reroot(root);
        Ok(cfg)
    }

    /// The built-in defaults and profiles alone: no file read.
    pub fn builtin() -> Config {
        let (file, warnings) = parse_file("", &shown(None)).expect("the defaults deserialize");
        Self::build(file, warnings, None, Some(Vec::new()), Keep::All, None)
            .expect("the built-in profiles build")
    }

    /// [`Config::builtin`] for the node whose `/` is `root`: profiles-dir, driver-roots and
    /// dev-roots under it.
    pub fn builtin_under(root: &Path) -> Config {
        let mut cfg = Self::builtin();
        cfg.profiles_dir = Profile::under(root, &cfg.profiles_dir);
        cfg.reroot(root);
        cfg
    }

    /// Every profile's driver-root and dev-root moved under `root`.
    fn reroot(&mut self, root: &Path) {
        for p in &mut self.profiles {
            p.driver_root = Profile::under(root, &p.driver_root);
            p.dev_root = p.dev_root.as_ref().map(|d| Profile::under(root, d));
        }
    }

    /// Parses config text; `path` names it in errors (`None`: defaults, no file).
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Config, ConfigError> {
        let (file, warnings) = parse_file(text, &shown(path))?;
        Self::build(file, warnings, path, None, Keep::All, None)
    }

    /// The config from a deserialized config.toml, with the warnings so far. `files`: the
    /// profile files already read (`None`: list and read `profiles-dir` now); `keep`: which
    /// of each profile's tables to keep; `variables`: as for [`Quick::into_create_config`].
    fn build(
        file: File,
        mut warnings: Vec<String>,
        path: Option<&Path>,
        files: Option<ProfileFiles>,
        keep: Keep,
        variables: Option<&[&str]>,
    ) -> Result<Config, ConfigError> {
        let shown = shown(path);
        let invalid = |msg: String| ConfigError::Invalid {
            path: shown.clone(),
            msg,
        };

        let low_level_runtime = check_runtime(&file.low_level_runtime, &shown)?;
        let log_level = file.log_level.parse::<log::LevelFilter>().map_err(|_| {
            invalid(format!(
                "log-level {:?} is not one of off, error, warn, info, debug, trace",
                file.log_level
            ))
        })?;
        let container_library_dir = match file.container_library_dir.as_str() {
            "auto" => None,
            p if Path::new(p).is_absolute() && !profile::has_dotdot(Path::new(p)) => {
                Some(PathBuf::from(p))
            }
            p => {
                return Err(invalid(format!(
                    "container-library-dir {p:?} must be \"auto\" or an absolute path without '..'"
                )))
            }
        };
        if !file.host_dev_dir.is_absolute() || profile::has_dotdot(&file.host_dev_dir) {
            return Err(invalid(format!(
                "host-dev-dir {:?} must be an absolute path without '..'",
                file.host_dev_dir
            )));
        }
        check_host_dir("cgroup-root", &file.cgroup_root, &shown)?;
        check_host_dir("dmem-grants-dir", &file.dmem_grants_dir, &shown)?;

        let files = match files {
            Some(files) => files,
            None => read_profile_files(
                &file.profiles_dir,
                &mut warnings,
                &mut trust::Checked::default(),
            )?,
        };
        let profiles = load_profiles(files, file.profiles, &shown, &mut warnings, keep, variables)?;
        Ok(Config {
            path: path.map(Path::to_path_buf),
            low_level_runtime,
            log_file: file.log_file,
            log_level,
            profiles_dir: file.profiles_dir,
            cdi_spec_dirs: file.cdi_spec_dirs,
            container_library_dir,
            accept_envvar_unprivileged: file.accept_envvar_unprivileged,
            accept_container_devices_as_mounts: file.accept_container_devices_as_mounts,
            host_dev_dir: file.host_dev_dir,
            cgroup_root: file.cgroup_root,
            dmem_grants_dir: file.dmem_grants_dir,
            profiles,
            warnings,
        })
    }

    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// How errors and warnings name config.toml (`None`: no file, the defaults).
fn shown(path: Option<&Path>) -> PathBuf {
    path.map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("<defaults>"))
}

/// config.toml's text deserialized, with a warning for each unknown key.
fn parse_file(text: &str, shown: &Path) -> Result<(File, Vec<String>), ConfigError> {
    let mut warnings = Vec::new();
    let parse_error = |source| ConfigError::Parse {
        path: shown.to_path_buf(),
        source,
    };
    let de = toml::Deserializer::parse(text).map_err(parse_error)?;
    let known = crate::keys::fields::<File>();
    let file: File = serde_ignored::deserialize(de, |p| {
        warnings.push(crate::keys::unknown_key(
            &shown.display().to_string(),
            &p.to_string(),
            known,
        ))
    })
    .map_err(parse_error)?;
    Ok((file, warnings))
}

/// The config file: `ACCEL_CONTAINER_RUNTIME_CONFIG` when set, else the default path.
pub fn path() -> PathBuf {
    std::env::var_os(ENV_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

/// config.toml and each profile are a few KiB; a larger one is refused, read no further.
pub const MAX_FILE_SIZE: u64 = 1 << 20;

/// The file's text (at most [`MAX_FILE_SIZE`] bytes, enforced while reading), if it is root's
/// alone to write (src/trust.rs: config.toml and every profile file are); `None` when it does
/// not exist (the defaults apply). `checked`: the directories already judged.
fn read_text(path: &Path, checked: &mut trust::Checked) -> Result<Option<String>, ConfigError> {
    let read_err = |source| ConfigError::Read {
        path: path.into(),
        source,
    };
    let (file, meta) = match trust::open_file(path, checked) {
        Ok(opened) => opened,
        Err(OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(OpenError::Io(source)) => return Err(read_err(source)),
        Err(OpenError::Untrusted(msg)) => {
            return Err(ConfigError::Untrusted {
                path: path.into(),
                msg,
            })
        }
    };
    crate::bounded::read_hinted(file, MAX_FILE_SIZE, meta.len())
        .and_then(crate::bounded::text)
        .map(Some)
        .map_err(read_err)
}

/// What a pass-through command (`state`, `kill`, `delete`, `--version`, ...) execs, and a
/// warning with the log file to write it to when config.toml could not be used as is.
///
/// These commands must reach the low-level runtime whatever is wrong with the file, or an
/// engine could no longer stop or remove the containers it started. When the file does not
/// parse, its `low-level-runtime` line is read alone (a top-level `low-level-runtime = "..."`
/// on one line); when even that fails, or the file is not root's alone to write (its value
/// then cannot be believed), the fallback is `runc` looked up in PATH.
pub fn pass_through_runtime(path: &Path) -> (String, Option<(String, PathBuf)>) {
    let err = match runtime_only(path) {
        Ok(runtime) => return (runtime, None),
        Err(e) => e,
    };
    let text = match &err {
        ConfigError::Untrusted { .. } | ConfigError::Read { .. } => None,
        _ => crate::bounded::read_text(path, MAX_FILE_SIZE).ok(),
    };
    let key = |k: &str| text.as_deref().and_then(|t| single_key(t, k));
    let runtime = key("low-level-runtime").and_then(|v| check_runtime(&v, path).ok());
    let log_file = key("log-file").map_or_else(d_log_file, PathBuf::from);
    let (runtime, used) = match runtime {
        Some(r) => (r, "its low-level-runtime line"),
        None => (d_runtime(), "the fallback `runc`"),
    };
    let warning = format!(
        "{}; a pass-through command runs {} ({used})",
        crate::quote::line(&err.to_string()),
        crate::quote::quote(&runtime),
    );
    (runtime, Some((warning, log_file)))
}

/// `low-level-runtime` alone: profiles and the other keys are neither parsed nor validated
/// (a broken profile must not stop `delete` from cleaning up a container).
fn runtime_only(path: &Path) -> Result<String, ConfigError> {
    let Some(text) = read_text(path, &mut trust::Checked::default())? else {
        return Ok(d_runtime());
    };
    let parsed: RuntimeOnly = toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.into(),
        source,
    })?;
    check_runtime(&parsed.low_level_runtime, path)
}

/// A top-level `key = "string"` of a TOML text that does not parse as a whole: the line
/// alone, parsed as TOML. Lines after the first table header are not top-level.
fn single_key(text: &str, key: &str) -> Option<String> {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .find_map(|l| {
            let t: toml::Table = toml::from_str(l).ok()?;
            t.get(key)?.as_str().map(str::to_string)
        })
}

fn check_runtime(value: &str, path: &Path) -> Result<String, ConfigError> {
    let low = value.trim();
    if low.is_empty() || (low.contains('/') && !Path::new(low).is_absolute()) {
        return Err(ConfigError::Invalid {
            path: path.into(),
            msg: format!(
                "low-level-runtime {low:?} must be a name looked up in PATH or an absolute path"
            ),
        });
    }
    Ok(low.to_string())
}

/// A profile in precedence order: a built-in, or an operator's file already built (with the
/// keys it did not know and the origin its warnings name).
enum Source {
    Builtin(&'static Builtin),
    File { name: String, built: Box<Built> },
}

type Built = ((Profile, Vec<String>), String);

impl Source {
    fn name(&self) -> &str {
        match self {
            Source::Builtin(b) => b.name,
            Source::File { name, .. } => name,
        }
    }
}

/// The profile of a parsed file `doc` of `origin`, config.toml's table `over` for it merged
/// in.
fn build(
    doc: toml::Spanned<toml::de::DeTable<'_>>,
    name: &str,
    origin: String,
    over: Option<&toml::Value>,
    config_path: &Path,
    keep: Keep,
) -> Result<Built, ConfigError> {
    let Some(over) = over else {
        return Ok((Profile::from_document(doc, &origin, keep)?, origin));
    };
    let invalid = |msg: String| ConfigError::Invalid {
        path: config_path.into(),
        msg,
    };
    let toml::Value::Table(over) = over else {
        return Err(invalid(format!("profiles.{name} must be a table")));
    };
    let origin = format!(
        "{origin} with [profiles.{name}] from {}",
        config_path.display()
    );
    // Merged as parsed documents, so that every profile is read by the one deserializer.
    let text = toml::to_string(over).map_err(|e| invalid(format!("profiles.{name}: {e}")))?;
    let over = profile::parse_document(&text, &origin)?;
    let merged = profile::merge_documents(doc, over);
    Ok((Profile::from_document(merged, &origin, keep)?, origin))
}

/// The profiles, from the built-ins, `files` and config.toml's `[profiles.*]` tables; with
/// `variables` (a create's: the names its spec's environment sets), only those that may claim
/// one of them, with every source of the same name (see [`Quick::into_create_config`]).
fn load_profiles(
    files: ProfileFiles,
    mut overrides: toml::Table,
    config_path: &Path,
    warnings: &mut Vec<String>,
    keep: Keep,
    variables: Option<&[&str]>,
) -> Result<Vec<Profile>, ConfigError> {
    // A file gone since it was listed is read now, for its error.
    let mut texts = Vec::with_capacity(files.len());
    for (path, text) in files {
        let text = match text {
            Some(text) => text,
            None => crate::bounded::read_text(&path, MAX_FILE_SIZE).map_err(|source| {
                ConfigError::Read {
                    path: path.clone(),
                    source,
                }
            })?,
        };
        texts.push((path, text));
    }
    let (builtins, docs) = involved(&texts, &overrides, variables)?;
    // In precedence order; a later one of the same name replaces.
    let mut sources: Vec<Source> = profile::BUILTIN
        .iter()
        .zip(builtins)
        .filter(|(_, used)| *used)
        .map(|(b, _)| Source::Builtin(b))
        .collect();
    for ((path, _), doc) in texts.iter().zip(docs) {
        let Some(doc) = doc else { continue };
        let origin = path.display().to_string();
        let name = profile::document_name(&doc).unwrap_or_default().to_string();
        let built = build(doc, &name, origin, overrides.get(&name), config_path, keep)?;
        let file = Source::File {
            name,
            built: Box::new(built),
        };
        sources.retain(|s| s.name() != file.name());
        sources.push(file);
    }

    let mut profiles = Vec::new();
    for source in sources {
        let name = source.name().to_string();
        let over = overrides.remove(&name);
        let ((p, unknown), origin) = match source {
            Source::Builtin(b) => {
                let origin = b.origin();
                let doc = profile::parse_document(b.text, &origin)?;
                build(doc, &name, origin, over.as_ref(), config_path, keep)?
            }
            // Built with config.toml's keys for it when it was read.
            Source::File { built, .. } => *built,
        };
        warnings.extend(
            unknown
                .into_iter()
                .map(|k| crate::keys::unknown_key(&origin, &k, &profile::known_keys())),
        );
        profiles.push(p);
    }
    // A [profiles.<name>] table for no known profile defines a whole new one.
    for (name, value) in overrides {
        let origin = format!("[profiles.{name}] in {}", config_path.display());
        let toml::Value::Table(mut table) = value else {
            return Err(ConfigError::Invalid {
                path: config_path.into(),
                msg: format!("profiles.{name} must be a table"),
            });
        };
        table.entry("name").or_insert_with(|| name.clone().into());
        let (p, unknown) = Profile::from_table(table, &origin)?;
        warnings.extend(
            unknown
                .into_iter()
                .map(|k| crate::keys::unknown_key(&origin, &k, &profile::known_keys())),
        );
        profiles.push(p);
    }
    for (i, p) in profiles.iter().enumerate() {
        if let Some(env) = p.visible_devices_env.iter().find(|e| {
            profiles[..i]
                .iter()
                .any(|q| q.visible_devices_env.contains(e))
        }) {
            return Err(ConfigError::Invalid {
                path: config_path.into(),
                msg: format!(
                    "variable {env} is claimed by two profiles (second: {})",
                    p.name
                ),
            });
        }
    }
    Ok(profiles)
}

/// A profile file's parsed document, borrowing its text.
type Document<'t> = toml::Spanned<toml::de::DeTable<'t>>;

/// The sources a create whose spec sets `variables` may involve: for each built-in, whether
/// it may, and each file's document where it may (`variables` `None`: every one). A source
/// may claim a variable only where its text quotes the variable's name, and one that
/// replaces or is merged into a claiming profile quotes that profile's name (config.toml's
/// `[profiles.<name>]` tables name theirs). So, by rounds: the sources whose text may quote
/// a variable or a name so far ([`profile::may_quote`]: a text it cannot read plainly may),
/// their names added, until no name is added. What is not chosen is neither parsed nor
/// checked by this create; `accel-ctk`, the doctor and the creates that involve it are.
fn involved<'t>(
    files: &'t [(PathBuf, String)],
    overrides: &toml::Table,
    variables: Option<&[&str]>,
) -> Result<(Vec<bool>, Vec<Option<Document<'t>>>), ConfigError> {
    let parse = |(path, text): &'t (PathBuf, String)| {
        profile::parse_document(text, &path.display().to_string())
    };
    let Some(variables) = variables else {
        let docs = files
            .iter()
            .map(|f| parse(f).map(Some))
            .collect::<Result<_, _>>()?;
        return Ok((vec![true; profile::BUILTIN.len()], docs));
    };
    let mut names: std::collections::BTreeSet<Vec<u8>> = variables
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .chain(overrides.keys().map(|k| k.as_bytes().to_vec()))
        .collect();
    let mut builtins = vec![false; profile::BUILTIN.len()];
    let mut docs: Vec<Option<Document<'t>>> = files.iter().map(|_| None).collect();
    loop {
        let may = |text: &str| profile::may_quote(text.as_bytes(), |run| names.contains(run));
        let mut more = Vec::new();
        for (used, b) in builtins.iter_mut().zip(profile::BUILTIN) {
            if !*used && may(b.text) {
                *used = true;
                more.push(b.name.as_bytes().to_vec());
            }
        }
        for (doc, file) in docs.iter_mut().zip(files) {
            if doc.is_none() && may(&file.1) {
                let d = parse(file)?;
                more.extend(profile::document_name(&d).map(|n| n.as_bytes().to_vec()));
                *doc = Some(d);
            }
        }
        let before = names.len();
        names.extend(more);
        if names.len() == before {
            return Ok((builtins, docs));
        }
    }
}

fn profile_files(dir: &Path, warnings: &mut Vec<String>) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            warnings.push(format!("{}: cannot list profiles: {e}", dir.display()));
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    // One directory: the order of the names' bytes, without Path's component-wise compare.
    files.sort_unstable_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    files
}

/// The built-in NVIDIA profile as the defaults give it, for other modules' tests.
#[cfg(test)]
pub(crate) fn builtin_nvidia() -> Profile {
    Config::builtin().profile("nvidia").unwrap().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_gives_defaults() {
        let c = Config::load(Path::new("/nonexistent/accel.toml")).unwrap();
        assert_eq!(c.low_level_runtime, "runc");
        assert_eq!(
            c.log_file,
            PathBuf::from("/var/log/accel-container-runtime.log")
        );
        assert!(c.profile("nvidia").is_some() && c.profile("enflame").is_some());
        assert!(c.path.is_none());
    }

    #[test]
    fn shipped_config_parses_to_the_defaults() {
        let shipped = Config::parse(
            include_str!("../config/config.toml"),
            Some(Path::new("config.toml")),
        )
        .unwrap();
        let defaults = Config::parse("", None).unwrap();
        assert!(shipped.warnings.is_empty(), "{:?}", shipped.warnings);
        assert_eq!(shipped.low_level_runtime, defaults.low_level_runtime);
        assert_eq!(shipped.log_file, defaults.log_file);
        assert_eq!(shipped.log_level, defaults.log_level);
        assert_eq!(shipped.profiles_dir, defaults.profiles_dir);
        assert_eq!(shipped.cdi_spec_dirs, defaults.cdi_spec_dirs);
        assert_eq!(
            shipped.container_library_dir,
            defaults.container_library_dir
        );
        assert_eq!(
            shipped.accept_envvar_unprivileged,
            defaults.accept_envvar_unprivileged
        );
        assert_eq!(
            shipped.accept_container_devices_as_mounts,
            defaults.accept_container_devices_as_mounts
        );
        assert_eq!(shipped.host_dev_dir, defaults.host_dev_dir);
        assert_eq!(shipped.cgroup_root, defaults.cgroup_root);
        assert_eq!(shipped.dmem_grants_dir, defaults.dmem_grants_dir);
        assert_eq!(shipped.profiles, defaults.profiles);
    }

    #[test]
    fn override_driver_root() {
        let c = Config::parse(
            "[profiles.nvidia]\ndriver-root = \"/run/nvidia/driver\"\n",
            Some(Path::new("c.toml")),
        )
        .unwrap();
        assert_eq!(
            c.profile("nvidia").unwrap().driver_root,
            PathBuf::from("/run/nvidia/driver")
        );
        assert_eq!(
            c.profile("enflame").unwrap().driver_root,
            PathBuf::from("/")
        );
    }

    #[test]
    fn broken_file_names_the_file() {
        let err =
            Config::parse("low-level-runtime = [", Some(Path::new("/etc/x.toml"))).unwrap_err();
        assert!(err.to_string().starts_with("/etc/x.toml"), "{err}");
        let err = Config::parse("log-level = 3", Some(Path::new("/etc/x.toml"))).unwrap_err();
        assert!(err.to_string().contains("log-level"), "{err}");
    }

    #[test]
    fn unknown_keys_warn() {
        let c = Config::parse(
            "lowlevel-runtime = \"crun\"\n[profiles.nvidia]\ndriver-rot = \"/x\"\n",
            Some(Path::new("c.toml")),
        )
        .unwrap();
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("lowlevel-runtime"));
        assert!(c.warnings.iter().any(|w| w.contains("driver-rot")));
    }

    #[test]
    fn profiles_dir_adds_vendor() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/profiles/ascend.toml"),
            dir.path().join("ascend.toml"),
        )
        .unwrap();
        let text = format!(
            "profiles-dir = {:?}\n[profiles.ascend]\ndriver-root = \"/sim\"\n",
            dir.path()
        );
        let c = Config::parse(&text, Some(Path::new("c.toml"))).unwrap();
        assert_eq!(
            c.profile("ascend").unwrap().driver_root,
            PathBuf::from("/sim")
        );
    }

    #[test]
    fn quick_screen_finds_every_profile_variable() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles.d");
        std::fs::create_dir(&profiles).unwrap();
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles");
        for e in std::fs::read_dir(&shipped).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), profiles.join(e.file_name())).unwrap();
        }
        let cfg = dir.path().join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                "# HOSTNAME in a comment is no claim\nprofiles-dir = {profiles:?}\n[profiles.custom]\nvisible-devices-env = ['MY_ACCELS']\n[profiles.custom.discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/myaccel{{index}}\"]\n"
            ),
        )
        .unwrap();
        let q = Quick::read(&cfg).unwrap();
        let full = Config::load(&cfg).unwrap();
        assert_eq!(full.profiles.len(), 12);
        let screen = |q: &Quick, var: &str| {
            let spec = format!(r#"{{"process":{{"env":["{var}=0"]}}}}"#);
            crate::spec::screen::screen(spec.as_bytes(), q.texts())
        };
        use crate::spec::screen::Screen;
        for p in &full.profiles {
            for v in &p.visible_devices_env {
                assert_eq!(screen(&q, v), Screen::Maybe, "{v} of {} missed", p.name);
            }
        }
        for other in ["HOSTNAME", "PATH", "NVIDIA_VISIBLE", "VISIBLE_DEVICES", ""] {
            assert_eq!(screen(&q, other), Screen::Nothing, "{other}");
        }
        // No file: built-ins only.
        let q = Quick::read(&dir.path().join("none.toml")).unwrap();
        assert_eq!(screen(&q, "NVIDIA_VISIBLE_DEVICES"), Screen::Maybe);
        assert_eq!(screen(&q, "MY_ACCELS"), Screen::Nothing);
    }

    /// The create path builds its Config from the screen's reading of config.toml: the same
    /// Config, warnings and errors as loading it anew.
    #[test]
    /// The create's config is the full load's, less the tables only daemons read.
    fn quick_into_config_is_the_full_load_less_the_wings() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles.d");
        std::fs::create_dir(&profiles).unwrap();
        let mut ascend = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles/ascend.toml"),
        )
        .unwrap();
        ascend.insert_str(0, "driver-rot = \"/typo\"\n");
        std::fs::write(profiles.join("ascend.toml"), ascend).unwrap();
        let cfg = dir.path().join("config.toml");
        let show = |r: Result<Config, ConfigError>| match r {
            Ok(mut c) => {
                for p in &mut c.profiles {
                    p.wings = profile::Wings::default();
                }
                format!("{c:?}")
            }
            Err(e) => format!("error: {e}"),
        };
        let top = format!("profiles-dir = {profiles:?}\n");
        for extra in [
            "",
            "[profiles.nvidia]\ndriver-root = \"/run/nvidia/driver\"\n",
            "lowlevel-runtime = \"crun\"\n[profiles.enflame]\ndriver-rot = \"/x\"\n",
            "[profiles.nvidia.capabilities.compute]\nlibraries = [\"libcuda\"]\n[profiles.ascend]\ndriver-root = \"/sim\"\n",
            "[profiles.custom]\nvisible-devices-env = ['NVIDIA_VISIBLE_DEVICES']\n[profiles.custom.discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/c{index}\"]\n",
            "log-level = 3\n",
            "log-level = \"loud\"\n",
            "low-level-runtime = \"sbin/runc\"\n",
            "[profiles.nvidia]\ndriver-root = 5\n",
            "[profiles.nvidia.discovery]\nproc-dri = \"/x\"\n",
            "[profiles.nvidia]\ncontrol-nodes = [\"/dev/../etc/shadow\"]\n",
            "profiles = { nvidia = 5 }\n",
        ] {
            std::fs::write(&cfg, format!("{top}{extra}")).unwrap();
            let full = show(Config::load(&cfg));
            if let Ok(c) = Config::load(&cfg) {
                let wings = |name| {
                    let p = c.profiles.iter().find(|p| p.name == name).unwrap();
                    p.wings.names().collect::<Vec<_>>()
                };
                assert_eq!(wings("enflame"), ["health", "metrics", "sharing"], "{extra}");
            }
            let quick = match Quick::read(&cfg) {
                Ok(quick) => quick,
                // The screen reports what it needs itself, as the full load does.
                Err(e) => {
                    assert_eq!(format!("error: {e}"), full, "{extra}");
                    continue;
                }
            };
            let create = quick.into_create_config(None);
            if let Ok(c) = &create {
                for p in &c.profiles {
                    assert_eq!(p.wings.names().count(), 0, "{}: {extra}", p.name);
                }
            }
            assert_eq!(show(create), full, "{extra}");
            let text = std::fs::read_to_string(&cfg).unwrap();
            assert_eq!(show(Config::parse(&text, Some(&cfg))), full, "{extra}");
        }
        // No file: the defaults, either way.
        let none = dir.path().join("none.toml");
        let quick = Quick::read(&none).unwrap();
        assert_eq!(
            show(quick.into_create_config(None)),
            show(Config::load(&none))
        );
    }

    /// A create builds only the profiles that may claim a variable its spec sets: each one
    /// that claims one is built as the full load builds it, in the same order, so the plan is
    /// the same; and an error of the create's load is the full load's.
    #[test]
    fn a_create_builds_the_claiming_profiles_as_the_full_load() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles.d");
        std::fs::create_dir(&profiles).unwrap();
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles");
        // Every profile the packages install.
        for p in [
            "amd",
            "ascend",
            "cambricon",
            "habana",
            "hygon",
            "intel",
            "intel-xe",
            "metax",
            "mthreads",
        ] {
            let file = format!("{p}.toml");
            std::fs::copy(shipped.join(&file), profiles.join(&file)).unwrap();
        }
        let nvidia = std::fs::read_to_string(shipped.join("nvidia.toml")).unwrap();
        let cfg = dir.path().join("config.toml");
        let top = format!("profiles-dir = {profiles:?}\n");
        let files: &[(&str, String)] = &[
            ("", String::new()),
            // A file replacing the built-in nvidia without claiming its variable.
            (
                "zz-nvidia.toml",
                nvidia.replace("\"NVIDIA_VISIBLE_DEVICES\"", "\"MY_GPUS\""),
            ),
            // One replacing it with a different driver-root, another file named like it.
            (
                "zz-nvidia.toml",
                format!("{nvidia}\ndriver-root = \"/run/nvidia/driver\"\n"),
            ),
            // A second profile claiming a variable another claims.
            (
                "zz-dup.toml",
                "name = \"dup\"\nvisible-devices-env = ['HABANA_VISIBLE_DEVICES']\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/d{index}\"]\n".into(),
            ),
            // A broken one, and one whose name is escaped.
            ("zz-broken.toml", "name = [\n".into()),
            (
                "zz-esc.toml",
                "name = \"e\\u0073c\"\nvisible-devices-env = ['ESC_DEVS']\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/e{index}\"]\n".into(),
            ),
        ];
        let extras = [
            "",
            "[profiles.nvidia]\ndriver-root = \"/run/nvidia/driver\"\n",
            "[profiles.habana]\nvisible-devices-env = ['NVIDIA_VISIBLE_DEVICES']\n",
            "[profiles.cambricon]\nvisible-devices-env = ['MY_GPUS']\n",
            "[profiles.custom]\nvisible-devices-env = ['MY_GPUS']\n[profiles.custom.discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/c{index}\"]\n",
            "[profiles.ascend]\ndriver-root = 5\n",
        ];
        let variables: &[&[&str]] = &[
            &[],
            &["PATH", "HOME"],
            &["NVIDIA_VISIBLE_DEVICES"],
            &["MY_GPUS", "PATH"],
            &["HABANA_VISIBLE_DEVICES"],
            &[
                "ASCEND_VISIBLE_DEVICES",
                "MTHREADS_VISIBLE_DEVICES",
                "ESC_DEVS",
            ],
        ];
        let mut compared = 0;
        for (file, text) in files {
            if !file.is_empty() {
                std::fs::write(profiles.join(file), text).unwrap();
            }
            for extra in extras {
                std::fs::write(&cfg, format!("{top}{extra}")).unwrap();
                // The full load's profiles without the daemons' tables, which no create keeps.
                let full = Config::load(&cfg).map(|mut c| {
                    for p in &mut c.profiles {
                        p.wings = profile::Wings::default();
                    }
                    c
                });
                for vars in variables {
                    let lazy = Quick::read(&cfg).unwrap().into_create_config(Some(vars));
                    let (lazy, full) = match (lazy, &full) {
                        (Ok(lazy), Ok(full)) => (lazy, full),
                        // Both refused: for the same reason, unless the full load's is the
                        // broken file no variable here can involve.
                        (Err(e), Err(f)) => {
                            let f = f.to_string();
                            if !f.contains("zz-broken.toml") {
                                assert_eq!(e.to_string(), f, "{file} {extra} {vars:?}");
                            }
                            continue;
                        }
                        (Err(e), Ok(_)) => panic!("{file} {extra} {vars:?}: lazy only: {e}"),
                        // Not built, not validated: only what no variable here can involve.
                        (Ok(_), Err(_)) => continue,
                    };
                    // The lazy profiles are full ones, in the full order...
                    let mut rest = full.profiles.iter();
                    for p in &lazy.profiles {
                        let mut p = p.clone();
                        p.wings = profile::Wings::default();
                        assert!(rest.any(|f| *f == p), "{file} {extra} {vars:?}: {}", p.name);
                    }
                    // ... and every full one that claims a variable is among them.
                    for p in &full.profiles {
                        if vars
                            .iter()
                            .any(|v| p.visible_devices_env.iter().any(|e| e == v))
                        {
                            assert!(
                                lazy.profiles.iter().any(|l| l.name == p.name
                                    && l.visible_devices_env == p.visible_devices_env
                                    && l.driver_root == p.driver_root),
                                "{file} {extra} {vars:?}: {}",
                                p.name
                            );
                        }
                    }
                    compared += 1;
                }
            }
            if !file.is_empty() {
                std::fs::remove_file(profiles.join(file)).unwrap();
            }
        }
        assert!(compared > 50, "{compared}");
        // Only what is needed is built: nothing for a spec that sets no claimed variable.
        std::fs::write(&cfg, &top).unwrap();
        let q = Quick::read(&cfg).unwrap();
        assert!(q
            .into_create_config(Some(&["PATH"]))
            .unwrap()
            .profiles
            .is_empty());
        let q = Quick::read(&cfg).unwrap();
        let names: Vec<String> = q
            .into_create_config(Some(&["NVIDIA_VISIBLE_DEVICES"]))
            .unwrap()
            .profiles
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["nvidia"]);
    }

    /// A create reads none of the tables only the daemons read: a mistake in one does not
    /// stop a create, and their size costs it nothing past finding where they end.
    #[test]
    fn a_create_reads_no_daemon_table() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles.d");
        std::fs::create_dir(&profiles).unwrap();
        std::fs::write(
            profiles.join("x.toml"),
            "name = \"x\"\nvisible-devices-env = [\"X_DEVICES\"]\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{index}\"]\n[sharing]\nlimits = \"maybe\"\n[metrics]\nfiles = 5\n",
        )
        .unwrap();
        let cfg = dir.path().join("config.toml");
        std::fs::write(&cfg, format!("profiles-dir = {profiles:?}\n")).unwrap();
        let create = Quick::read(&cfg)
            .unwrap()
            .into_create_config(Some(&["X_DEVICES"]))
            .unwrap();
        let x = create.profile("x").expect("the claiming profile");
        assert_eq!(x.wings.names().count(), 0);
        assert!(create.warnings.is_empty(), "{:?}", create.warnings);
        // The daemons' load keeps them, for the wing that reads each to judge.
        let full = Config::load(&cfg).unwrap();
        let names: Vec<_> = full.profile("x").unwrap().wings.names().collect();
        assert_eq!(names, ["metrics", "sharing"]);
    }

    #[test]
    fn runtime_only_reads_one_key_and_ignores_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        assert_eq!(runtime_only(&p).unwrap(), "runc");
        // A profile that would not load must not stop pass-through commands.
        std::fs::write(
            &p,
            "low-level-runtime = \"/usr/sbin/runc\"\n[profiles.nvidia]\ndriver-root = 5\n",
        )
        .unwrap();
        assert_eq!(runtime_only(&p).unwrap(), "/usr/sbin/runc");
        assert!(Config::load(&p).is_err());
        std::fs::write(&p, "low-level-runtime = \"sbin/runc\"\n").unwrap();
        let err = runtime_only(&p).unwrap_err().to_string();
        assert!(err.contains("low-level-runtime"), "{err}");
        std::fs::write(&p, "low-level-runtime = [").unwrap();
        assert!(runtime_only(&p).is_err());
    }

    #[test]
    fn pass_through_survives_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "low-level-runtime = \"/usr/sbin/runc\"\n").unwrap();
        assert_eq!(pass_through_runtime(&p), ("/usr/sbin/runc".into(), None));
        std::fs::write(
            &p,
            "low-level-runtime = \"/opt/runc\"\nlog-file = \"/x.log\"\nlog-level = debug\n",
        )
        .unwrap();
        let (runtime, warning) = pass_through_runtime(&p);
        assert_eq!(runtime, "/opt/runc");
        let (msg, log) = warning.unwrap();
        assert!(
            msg.contains("c.toml") && msg.contains("low-level-runtime line"),
            "{msg}"
        );
        assert_eq!(log, PathBuf::from("/x.log"));
        std::fs::write(&p, "low-level-runtime = [\n").unwrap();
        assert_eq!(pass_through_runtime(&p).0, "runc");
        std::fs::write(&p, "low-level-runtime = \"/opt/runc\"\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o664)).unwrap();
        let (runtime, warning) = pass_through_runtime(&p);
        assert_eq!(runtime, "runc");
        assert!(warning.unwrap().0.contains("writable by group"));
    }

    #[test]
    fn wrong_type_in_profile_is_an_error() {
        let err = Config::parse(
            "[profiles.nvidia]\ndriver-root = 5\n",
            Some(Path::new("c.toml")),
        )
        .unwrap_err();
        assert!(err.to_string().contains("nvidia"), "{err}");
    }
}
