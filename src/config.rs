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
        let path = std::env::var_os(ENV_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH));
        Self::load_from(&path)
    }

    pub fn load_from(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, Some(path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::parse("", None),
            Err(source) => Err(ConfigError::Read {
                path: path.into(),
                source,
            }),
        }
    }

    /// Parses config text; `path` names it in errors (`None`: defaults, no file).
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Config, ConfigError> {
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

        let low = file.low_level_runtime.trim();
        if low.is_empty() || (low.contains('/') && !Path::new(low).is_absolute()) {
            return Err(invalid(format!(
                "low-level-runtime {low:?} must be a name looked up in PATH or an absolute path"
            )));
        }
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

        let profiles = load_profiles(&file.profiles_dir, file.profiles, &shown, &mut warnings)?;
        Ok(Config {
            path: path.map(Path::to_path_buf),
            low_level_runtime: low.to_string(),
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

fn load_profiles(
    dir: &Path,
    mut overrides: toml::Table,
    config_path: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<Profile>, ConfigError> {
    // (origin, table) in precedence order; a later table of the same name replaces.
    let mut tables: Vec<(String, toml::Table)> = Vec::new();
    for (file, text) in profile::BUILTIN {
        let table = toml::from_str(text).map_err(|source| ProfileError::Parse {
            origin: format!("built-in {file}"),
            source,
        })?;
        tables.push((format!("built-in {file}"), table));
    }
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
    fn wrong_type_in_profile_is_an_error() {
        let err = Config::parse(
            "[profiles.nvidia]\ndriver-root = 5\n",
            Some(Path::new("c.toml")),
        )
        .unwrap_err();
        assert!(err.to_string().contains("nvidia"), "{err}");
    }
}
