//! The runtime's configuration file and the set of vendor profiles it yields.
//!
//! Order of precedence for profiles: built-in, then `profiles-dir/*.toml` (a file with a
//! built-in's name replaces it), then `[profiles.<name>]` tables in config.toml merged key by
//! key. Unknown keys are collected as warnings, never silently dropped.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::profile::{self, Profile, ProfileError};

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
}

/// What `create` reads before deciding whether to load the profiles at all.
///
/// Parsing the profiles is most of a create's cost (TOML: about 0.2 ms for the two built-in
/// ones, benches/BENCHMARKS.md), and most containers ask for no device. This screen parses
/// only config.toml's top-level keys and keeps every profile source as text: a variable
/// that appears in none of them as a TOML string (`"NAME"` or `'NAME'`) cannot be claimed
/// by any profile. A name it finds may be a false alarm (the full load then decides); a
/// variable name written with escape sequences in a profile would be missed, so write
/// variable names plainly.
#[derive(Debug, Clone)]
pub struct Quick {
    pub low_level_runtime: String,
    pub accept_container_devices_as_mounts: bool,
    /// config.toml and each `profiles-dir/*.toml`, unparsed.
    texts: Vec<String>,
    /// Every TOML string in the built-ins and `texts` that could be a variable name, sorted:
    /// a create's spec holds dozens of `NAME=` entries, each looked up here.
    quoted: Vec<String>,
}

impl Quick {
    pub fn load() -> Result<Quick, ConfigError> {
        Self::load_from(&config_path())
    }

    pub fn load_from(path: &Path) -> Result<Quick, ConfigError> {
        let Some(text) = read_text(path)? else {
            return Ok(Quick::new(
                d_runtime(),
                false,
                profile_texts(&d_profiles_dir())?,
            ));
        };
        let file: QuickFile = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
        let mut texts = profile_texts(&file.profiles_dir)?;
        texts.push(text);
        Ok(Quick::new(
            check_runtime(&file.low_level_runtime, path)?,
            file.accept_container_devices_as_mounts,
            texts,
        ))
    }

    fn new(
        low_level_runtime: String,
        accept_container_devices_as_mounts: bool,
        texts: Vec<String>,
    ) -> Quick {
        let mut quoted: Vec<String> = profile::BUILTIN
            .iter()
            .map(|(_, t)| *t)
            .chain(texts.iter().map(String::as_str))
            .flat_map(quoted_names)
            .map(str::to_string)
            .collect();
        quoted.sort_unstable();
        quoted.dedup();
        Quick {
            low_level_runtime,
            accept_container_devices_as_mounts,
            texts,
            quoted,
        }
    }

    /// Whether some profile might select devices through the variable `name`.
    pub fn may_claim(&self, name: &str) -> bool {
        if name.is_empty() {
            return false;
        }
        if name.bytes().all(is_name_byte) {
            return self
                .quoted
                .binary_search_by(|q| q.as_str().cmp(name))
                .is_ok();
        }
        profile::BUILTIN
            .iter()
            .map(|(_, t)| *t)
            .chain(self.texts.iter().map(String::as_str))
            .any(|t| quoted_in(t, name))
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Each run of name bytes (`[A-Za-z0-9_]`) in `text` with the same quote right before and
/// after it: every name `n` for which [`quoted_in`]`(text, n)` holds.
fn quoted_names(text: &str) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    b.iter().enumerate().filter_map(move |(i, &q)| {
        if q != b'"' && q != b'\'' {
            return None;
        }
        let start = i + 1;
        let len = b[start..].iter().take_while(|&&c| is_name_byte(c)).count();
        // Name bytes are ASCII, so both ends are char boundaries.
        (len > 0 && b.get(start + len) == Some(&q)).then(|| &text[start..start + len])
    })
}

fn quoted_in(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        matches!(
            (before, after),
            (Some('"'), Some('"')) | (Some('\''), Some('\''))
        )
    })
}

/// The texts of the `*.toml` files in `dir` (missing dir: none).
fn profile_texts(dir: &Path) -> Result<Vec<String>, ConfigError> {
    let mut warnings = Vec::new();
    profile_files(dir, &mut warnings)
        .into_iter()
        .map(|p| read_text(&p).map(Option::unwrap_or_default))
        .collect()
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
    pub profiles: Vec<Profile>,
    /// Unknown keys and other things worth a log line.
    pub warnings: Vec<String>,
}

impl Config {
    /// Loads the file named by `ACCEL_CONTAINER_RUNTIME_CONFIG`, else the default path.
    /// A missing file is the defaults; an unreadable or invalid one is an error.
    pub fn load() -> Result<Config, ConfigError> {
        Self::load_from(&config_path())
    }

    pub fn load_from(path: &Path) -> Result<Config, ConfigError> {
        match read_text(path)? {
            Some(text) => Self::parse(&text, Some(path)),
            None => Self::parse("", None),
        }
    }

    /// `low-level-runtime` alone, from the file [`Config::load`] would read: what every command
    /// but `create`/`run` needs. Profiles and the other keys are not parsed (nor validated:
    /// a broken profile must not stop `delete` from cleaning up a container).
    pub fn low_level_runtime() -> Result<String, ConfigError> {
        Self::low_level_runtime_from(&config_path())
    }

    pub fn low_level_runtime_from(path: &Path) -> Result<String, ConfigError> {
        let Some(text) = read_text(path)? else {
            return Ok(d_runtime());
        };
        let parsed: RuntimeOnly = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
        check_runtime(&parsed.low_level_runtime, path)
    }

    /// As [`Config::load`], for a container whose spec sets only the variables `names`: a
    /// built-in profile nothing can involve is not built (parsing the profiles is most of a
    /// create's cost). A built-in is involved when its text holds one of `names` as a TOML
    /// string (see [`Quick`]), when config.toml overrides it, or when one of the operator's
    /// profiles uses a variable it names. Every profile file and config.toml table is still
    /// built and validated, so the result, errors and warnings are those of [`Config::load`]
    /// for every profile that can matter.
    pub fn load_claiming(names: &[&str]) -> Result<Config, ConfigError> {
        let path = config_path();
        match read_text(&path)? {
            Some(text) => Self::parse_claiming(&text, Some(&path), Some(names)),
            None => Self::parse_claiming("", None, Some(names)),
        }
    }

    /// Parses config text; `path` names it in errors (`None`: defaults, no file).
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Config, ConfigError> {
        Self::parse_claiming(text, path, None)
    }

    /// [`Config::parse`], skipping the built-ins nothing involves for a spec setting `names`
    /// (`None`: skip none), as [`Config::load_claiming`] does.
    pub fn parse_claiming(
        text: &str,
        path: Option<&Path>,
        names: Option<&[&str]>,
    ) -> Result<Config, ConfigError> {
        let shown = path
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("<defaults>"));
        let mut warnings = Vec::new();
        let de = toml::Deserializer::new(text);
        let file: File = serde_ignored::deserialize(de, |p| {
            warnings.push(format!("{}: unknown key `{p}` ignored", shown.display()))
        })
        .map_err(|source| ConfigError::Parse {
            path: shown.clone(),
            source,
        })?;
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

        let profiles = load_profiles(
            &file.profiles_dir,
            file.profiles,
            &shown,
            names,
            &mut warnings,
        )?;
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
            profiles,
            warnings,
        })
    }

    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

fn config_path() -> PathBuf {
    std::env::var_os(ENV_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

/// The file's text; `None` when it does not exist (the defaults apply).
fn read_text(path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Read {
            path: path.into(),
            source,
        }),
    }
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

/// The profiles, from the built-ins, `dir` and config.toml's `[profiles.*]` tables. With
/// `claims`, a built-in is skipped when nothing can involve it: its text names none of the
/// variables, config.toml has no `[profiles.<name>]` for it, and no file in `dir` or table in
/// config.toml uses one of the variables it names. Skipping it changes no result, error or
/// warning (built-ins are compiled in and tested); the operator's files and tables are always
/// built, so a broken one is reported by every create.
fn load_profiles(
    dir: &Path,
    mut overrides: toml::Table,
    config_path: &Path,
    claims: Option<&[&str]>,
    warnings: &mut Vec<String>,
) -> Result<Vec<Profile>, ConfigError> {
    let mut files: Vec<(String, toml::Table)> = Vec::new();
    for path in profile_files(dir, warnings) {
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let origin = path.display().to_string();
        let table: toml::Table = toml::from_str(&text).map_err(|source| ProfileError::Parse {
            origin: origin.clone(),
            source,
        })?;
        files.push((origin, table));
    }
    // The variables the operator's own profiles use, as written in their tables.
    let operator_vars: Vec<&str> = files
        .iter()
        .map(|(_, t)| t)
        .chain(overrides.values().filter_map(toml::Value::as_table))
        .filter_map(|t| t.get("visible-devices-env")?.as_array())
        .flatten()
        .filter_map(toml::Value::as_str)
        .collect();
    let involved = |name: &str, text: &str| match claims {
        None => true,
        Some(names) => {
            names
                .iter()
                .chain(&operator_vars)
                .any(|n| quoted_in(text, n))
                || overrides.contains_key(name)
        }
    };
    // (origin, table) in precedence order; a later table of the same name replaces.
    let mut tables: Vec<(String, toml::Table)> = Vec::new();
    for (file, text) in profile::BUILTIN {
        if !involved(file.strip_suffix(".toml").unwrap_or(file), text) {
            continue;
        }
        let table = toml::from_str(text).map_err(|source| ProfileError::Parse {
            origin: format!("built-in {file}"),
            source,
        })?;
        tables.push((format!("built-in {file}"), table));
    }
    for (origin, table) in files {
        let name = table
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        tables.retain(|(_, t)| t.get("name").and_then(|v| v.as_str()) != Some(name.as_str()));
        tables.push((origin, table));
    }

    let mut profiles = Vec::new();
    for (origin, mut table) in tables {
        let name = table
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let origin = match overrides.remove(&name) {
            Some(toml::Value::Table(over)) => {
                profile::merge_tables(&mut table, over);
                format!(
                    "{origin} with [profiles.{name}] from {}",
                    config_path.display()
                )
            }
            Some(_) => {
                return Err(ConfigError::Invalid {
                    path: config_path.into(),
                    msg: format!("profiles.{name} must be a table"),
                })
            }
            None => origin,
        };
        let (p, unknown) = Profile::from_table(table, &origin)?;
        warnings.extend(
            unknown
                .into_iter()
                .map(|k| format!("{origin}: unknown key `{k}` ignored")),
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
                .map(|k| format!("{origin}: unknown key `{k}` ignored")),
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
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_gives_defaults() {
        let c = Config::load_from(Path::new("/nonexistent/accel.toml")).unwrap();
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
        let q = Quick::load_from(&cfg).unwrap();
        let full = Config::load_from(&cfg).unwrap();
        assert_eq!(full.profiles.len(), 7);
        for p in &full.profiles {
            for v in &p.visible_devices_env {
                assert!(q.may_claim(v), "{v} of {} missed", p.name);
            }
        }
        for other in ["HOSTNAME", "PATH", "NVIDIA_VISIBLE", "VISIBLE_DEVICES", ""] {
            assert!(!q.may_claim(other), "{other}");
        }
        // No file: built-ins only.
        let q = Quick::load_from(&dir.path().join("none.toml")).unwrap();
        assert!(q.may_claim("NVIDIA_VISIBLE_DEVICES") && !q.may_claim("MY_ACCELS"));
    }

    #[test]
    fn quoted_names_are_what_quoted_in_finds() {
        let text = "a = \"NV_X\"\nb = ['Y_1', \"Z\" ]\n# \"mixed' \"ab\"cd\" x\"\"\n";
        let names: Vec<&str> = quoted_names(text).collect();
        assert_eq!(names, ["NV_X", "Y_1", "Z", "ab", "cd"]);
        for n in &names {
            assert!(quoted_in(text, n), "{n}");
        }
        for n in ["NV", "mixed", "x", "b", "Y"] {
            assert!(!quoted_in(text, n) && !names.contains(&n), "{n}");
        }
    }

    /// `create` skips only the built-ins nothing involves: the operator's files and tables are
    /// always built (a broken one is an error for every create), an override keeps its
    /// built-in, and an operator profile sharing a built-in's variable still meets it.
    #[test]
    fn claiming_load_skips_only_uninvolved_builtins() {
        let path = Some(Path::new("c.toml"));
        let names = |text: &str, vars: &[&str]| -> Vec<String> {
            Config::parse_claiming(text, path, Some(vars))
                .unwrap()
                .profiles
                .into_iter()
                .map(|p| p.name)
                .collect()
        };
        let nv = ["NVIDIA_VISIBLE_DEVICES"];
        assert_eq!(names("", &nv), ["nvidia"]);
        assert_eq!(names("", &["ENFLAME_VISIBLE_DEVICES"]), ["enflame"]);
        assert!(names("", &["NOBODY"]).is_empty());
        assert_eq!(
            names("[profiles.enflame]\ndriver-root = \"/sim\"\n", &nv),
            ["nvidia", "enflame"]
        );
        let err = Config::parse_claiming("[profiles.enflame]\ndriver-root = 5\n", path, Some(&nv))
            .unwrap_err();
        assert!(err.to_string().contains("enflame"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles.d");
        std::fs::create_dir(&profiles).unwrap();
        let text = format!("profiles-dir = {profiles:?}\n");
        std::fs::write(profiles.join("broken.toml"), "name = \"broken\"\nx = [").unwrap();
        assert!(Config::parse_claiming(&text, path, Some(&nv)).is_err());
        std::fs::remove_file(profiles.join("broken.toml")).unwrap();
        // A file claiming enflame's variable under another name: two profiles claim it.
        let copy = profile::BUILTIN[1]
            .1
            .replace("name = \"enflame\"", "name = \"my-gcu\"");
        std::fs::write(profiles.join("my-gcu.toml"), copy).unwrap();
        let full = Config::parse(&text, path).unwrap_err().to_string();
        let claiming = Config::parse_claiming(&text, path, Some(&nv))
            .unwrap_err()
            .to_string();
        assert!(full.contains("claimed by two profiles"), "{full}");
        assert_eq!(claiming, full);
    }

    #[test]
    fn runtime_only_reads_one_key_and_ignores_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        assert_eq!(Config::low_level_runtime_from(&p).unwrap(), "runc");
        // A profile that would not load must not stop pass-through commands.
        std::fs::write(
            &p,
            "low-level-runtime = \"/usr/sbin/runc\"\n[profiles.nvidia]\ndriver-root = 5\n",
        )
        .unwrap();
        assert_eq!(
            Config::low_level_runtime_from(&p).unwrap(),
            "/usr/sbin/runc"
        );
        assert!(Config::load_from(&p).is_err());
        std::fs::write(&p, "low-level-runtime = \"sbin/runc\"\n").unwrap();
        let err = Config::low_level_runtime_from(&p).unwrap_err().to_string();
        assert!(err.contains("low-level-runtime"), "{err}");
        std::fs::write(&p, "low-level-runtime = [").unwrap();
        assert!(Config::low_level_runtime_from(&p).is_err());
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
