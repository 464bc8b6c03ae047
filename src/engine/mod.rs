//! Registering the runtime with a container engine's configuration file, and taking it out
//! again: docker's `daemon.json`, containerd's `config.toml`, a CRI-O drop-in.
//!
//! Each engine module is a pure text-to-text editor (`configure`, `unconfigure`,
//! `registered`, `default_runtime`) that keeps every byte it has no reason to touch; this
//! module does the file work around them: reading, the backup, the atomic write, and the
//! byte-exact undo.
//!
//! Undo. `configure` saves the file as it was before the runtime was first added
//! (`<file>.accel-ctk.bak`). `unconfigure` first asks whether the current file is exactly what
//! `configure` makes of that backup (with or without `--set-as-default`): if so, nothing else
//! changed in between and the backup's bytes go back verbatim (a file `configure` created is
//! removed). Otherwise the operator edited the file since, and only the runtime's own entries
//! come out (a default it set goes back to the backup's default, or is removed).
//!
//! Nothing here restarts an engine: [`Kind::restart_command`] says how.

pub mod checkhook;
pub mod containerd;
pub mod crio;
pub mod docker;

use std::path::{Path, PathBuf};

use crate::atomic;

/// Suffix of the backup kept beside an engine's configuration file.
pub const BACKUP_SUFFIX: &str = ".accel-ctk.bak";

/// The engines whose configuration this module edits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Docker,
    Containerd,
    Crio,
}

impl Kind {
    /// The file edited when the operator names none.
    pub fn default_config(self, runtime_name: &str) -> PathBuf {
        match self {
            Kind::Docker => PathBuf::from(docker::DEFAULT_CONFIG),
            Kind::Containerd => PathBuf::from(containerd::DEFAULT_CONFIG),
            Kind::Crio => crio::default_config(runtime_name),
        }
    }

    /// The one command that makes the engine read its configuration again.
    pub fn restart_command(self) -> &'static str {
        match self {
            Kind::Docker => "systemctl restart docker",
            Kind::Containerd => "systemctl restart containerd",
            Kind::Crio => "systemctl restart crio",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Docker => "docker",
            Kind::Containerd => "containerd",
            Kind::Crio => "crio",
        }
    }
}

/// What `configure` registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The runtime's name in the engine (`docker run --runtime <name>`).
    pub name: String,
    /// Absolute path of the `accel-container-runtime` binary the engine will exec.
    pub path: String,
    /// Also make it the engine's default runtime.
    pub set_as_default: bool,
}

/// Facts about the node that change what a new file looks like.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Host {
    /// Major version of the installed containerd (`containerd --version`), if any: picks the
    /// schema of a `config.toml` written from nothing.
    pub containerd_major: Option<u32>,
}

/// What an engine's file says about one runtime name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registered {
    /// The binary path registered under the name, if the name is registered.
    pub path: Option<String>,
    /// The name is the engine's default runtime.
    pub is_default: bool,
}

/// Why an engine module could not edit a file's text.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("not valid JSON")]
    Json(#[source] serde_json::Error),
    #[error("not valid TOML")]
    Toml(#[source] toml_edit::TomlError),
    #[error("{0}")]
    Layout(String),
}

/// Why `configure` or `unconfigure` failed; the file is untouched in every case. Messages
/// leave the cause to the `source` chain (printed as `a: b: c` by accel-ctk).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("runtime name {0:?}: use letters, digits, '-', '_' and '.' only")]
    BadName(String),
    #[error("runtime path {0:?}: must be an absolute path")]
    RelativePath(String),
    #[error("{path}", path = path.display())]
    Edit {
        path: PathBuf,
        #[source]
        source: EditError,
    },
    #[error("reading {path}", path = path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}", path = path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What happened (or, with `dry_run`, would happen) to the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Already as asked; nothing written.
    Unchanged,
    /// The name is not registered there; nothing written (`unconfigure`).
    NotRegistered,
    /// The file does not exist; nothing to undo (`unconfigure`).
    Missing,
    /// New content written; `backup` names the copy of the previous file, if one was made.
    Written { backup: Option<PathBuf> },
    /// The pre-`configure` bytes were put back from the backup (`unconfigure`).
    Restored,
    /// The runtime's entries were taken out of a file edited since (`unconfigure`).
    Edited,
    /// The file was removed: `configure` had created it (`unconfigure`).
    Removed,
}

/// The result of one `configure`/`unconfigure`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub path: PathBuf,
    pub action: Action,
    /// The file's content afterwards (`None`: no file).
    pub content: Option<String>,
    /// Nothing was written because the caller asked for a dry run.
    pub dry_run: bool,
}

impl Outcome {
    /// Whether the engine has to re-read its configuration.
    pub fn needs_restart(&self) -> bool {
        matches!(
            self.action,
            Action::Written { .. } | Action::Restored | Action::Edited | Action::Removed
        )
    }
}

/// The backup kept beside `path`.
pub fn backup_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(BACKUP_SUFFIX);
    PathBuf::from(p)
}

/// Pure edit: `current` (None: no file) with the runtime registered.
pub fn configure_text(
    kind: Kind,
    current: Option<&str>,
    reg: &Registration,
    host: &Host,
) -> Result<String, EditError> {
    match kind {
        Kind::Docker => docker::configure(current, reg),
        Kind::Containerd => containerd::configure(current, reg, host),
        Kind::Crio => crio::configure(current, reg),
    }
}

/// Pure edit: `current` without the runtime `name`; a default it held becomes
/// `previous_default` (or goes away).
pub fn unconfigure_text(
    kind: Kind,
    current: &str,
    name: &str,
    previous_default: Option<&str>,
) -> Result<String, EditError> {
    match kind {
        Kind::Docker => docker::unconfigure(current, name, previous_default),
        Kind::Containerd => containerd::unconfigure(current, name, previous_default),
        Kind::Crio => crio::unconfigure(current, name, previous_default),
    }
}

/// What `current` says about the runtime `name`.
pub fn registered(kind: Kind, current: &str, name: &str) -> Result<Registered, EditError> {
    match kind {
        Kind::Docker => docker::registered(current, name),
        Kind::Containerd => containerd::registered(current, name),
        Kind::Crio => crio::registered(current, name),
    }
}

/// The default runtime `current` names, if it names one.
pub fn default_runtime(kind: Kind, current: &str) -> Result<Option<String>, EditError> {
    match kind {
        Kind::Docker => docker::default_runtime(current),
        Kind::Containerd => containerd::default_runtime(current),
        Kind::Crio => crio::default_runtime(current),
    }
}

fn check_name(name: &str) -> Result<(), EngineError> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(EngineError::BadName(name.to_owned()))
    }
}

/// Larger than any engine's configuration (docker's daemon.json, containerd's config.toml,
/// CRI-O's drop-ins are a few KB); a bigger file, or one that never ends (a FIFO fed forever,
/// a symlink to /dev/zero), is refused with its path, never read whole (issue 14, class 5).
pub const MAX_CONFIG_SIZE: u64 = 16 << 20;

/// The text of an engine's file, `None` when it does not exist, at most [`MAX_CONFIG_SIZE`].
pub fn read_optional(path: &Path) -> Result<Option<String>, EngineError> {
    match crate::bounded::read_text(path, MAX_CONFIG_SIZE) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EngineError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn write(path: &Path, data: &str, mode: u32) -> Result<(), EngineError> {
    let err = |source| EngineError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    atomic::replace(path, data.as_bytes(), mode).map_err(err)
}

fn remove(path: &Path) -> Result<(), EngineError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(EngineError::Write {
            path: path.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Registers the runtime in the engine's file at `path`. With `dry_run` nothing is written
/// and the outcome carries the content that would be.
pub fn configure(
    kind: Kind,
    path: &Path,
    reg: &Registration,
    host: &Host,
    dry_run: bool,
) -> Result<Outcome, EngineError> {
    check_name(&reg.name)?;
    if !Path::new(&reg.path).is_absolute() {
        return Err(EngineError::RelativePath(reg.path.clone()));
    }
    let edit_err = |source| EngineError::Edit {
        path: path.to_owned(),
        source,
    };
    let current = read_optional(path)?;
    let new = configure_text(kind, current.as_deref(), reg, host).map_err(edit_err)?;
    let outcome = |action| Outcome {
        path: path.to_owned(),
        action,
        content: Some(new.clone()),
        dry_run,
    };
    if current.as_deref() == Some(new.as_str()) {
        return Ok(outcome(Action::Unchanged));
    }
    // The backup is the file as it was before the runtime was first added, so a
    // re-configure (say, now with --set-as-default) keeps the one that exists.
    let backup = match &current {
        Some(cur) => {
            let already = registered(kind, cur, &reg.name)
                .map_err(edit_err)?
                .path
                .is_some();
            let bak = backup_path(path);
            (!already || !bak.exists()).then_some((bak, cur))
        }
        None => None,
    };
    if dry_run {
        return Ok(outcome(Action::Written {
            backup: backup.map(|(b, _)| b),
        }));
    }
    if let Some((bak, cur)) = &backup {
        write(bak, cur, 0o600)?;
    }
    write(path, &new, 0o644)?;
    Ok(outcome(Action::Written {
        backup: backup.map(|(b, _)| b),
    }))
}

/// Takes the runtime `name` out of the engine's file at `path`, exactly undoing `configure`
/// when the file was not edited in between (see the module header).
pub fn unconfigure(
    kind: Kind,
    path: &Path,
    name: &str,
    host: &Host,
    dry_run: bool,
) -> Result<Outcome, EngineError> {
    check_name(name)?;
    let edit_err = |source| EngineError::Edit {
        path: path.to_owned(),
        source,
    };
    let done = |action, content| Outcome {
        path: path.to_owned(),
        action,
        content,
        dry_run,
    };
    let Some(current) = read_optional(path)? else {
        return Ok(done(Action::Missing, None));
    };
    let reg = registered(kind, &current, name).map_err(edit_err)?;
    if reg.path.is_none() && !reg.is_default {
        return Ok(done(Action::NotRegistered, Some(current)));
    }
    let bak = backup_path(path);
    let backup = read_optional(&bak)?;

    if let Some(rt_path) = &reg.path {
        let untouched_since = [false, true].into_iter().any(|set_as_default| {
            let again = Registration {
                name: name.to_owned(),
                path: rt_path.clone(),
                set_as_default,
            };
            configure_text(kind, backup.as_deref(), &again, host)
                .ok()
                .as_deref()
                == Some(current.as_str())
        });
        if untouched_since {
            if !dry_run {
                match &backup {
                    Some(b) => write(path, b, 0o644)?,
                    None => remove(path)?,
                }
                remove(&bak)?;
            }
            return Ok(match backup {
                Some(b) => done(Action::Restored, Some(b)),
                None => done(Action::Removed, None),
            });
        }
    }

    let previous_default = backup
        .as_deref()
        .and_then(|b| default_runtime(kind, b).ok().flatten())
        .filter(|d| d != name);
    let new =
        unconfigure_text(kind, &current, name, previous_default.as_deref()).map_err(edit_err)?;
    // A CRI-O drop-in holds nothing but this runtime: once it is out, the file goes.
    if kind == Kind::Crio && crio::is_empty(&new) {
        if !dry_run {
            remove(path)?;
        }
        return Ok(done(Action::Removed, None));
    }
    if !dry_run {
        write(path, &new, 0o644)?;
    }
    Ok(done(Action::Edited, Some(new)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registration every engine's tests use: `accel` at the packaged path.
    pub(crate) fn reg(default: bool) -> Registration {
        Registration {
            name: "accel".into(),
            path: "/usr/bin/accel-container-runtime".into(),
            set_as_default: default,
        }
    }

    #[test]
    fn refuses_bad_names_and_relative_paths() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("daemon.json");
        let mut r = reg(false);
        r.name = "../x".into();
        assert!(matches!(
            configure(Kind::Docker, &p, &r, &Host::default(), false),
            Err(EngineError::BadName(_))
        ));
        let mut r = reg(false);
        r.path = "accel-container-runtime".into();
        assert!(matches!(
            configure(Kind::Docker, &p, &r, &Host::default(), false),
            Err(EngineError::RelativePath(_))
        ));
        assert!(!p.exists());
    }

    #[test]
    fn created_file_is_removed_again() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("docker/daemon.json");
        let out = configure(Kind::Docker, &p, &reg(true), &Host::default(), false).unwrap();
        assert_eq!(out.action, Action::Written { backup: None });
        assert!(p.exists());
        let out = unconfigure(Kind::Docker, &p, "accel", &Host::default(), false).unwrap();
        assert_eq!(out.action, Action::Removed);
        assert!(!p.exists());
    }

    #[test]
    fn reconfigure_keeps_first_backup_and_undo_is_exact() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("daemon.json");
        let orig = "{\n    \"debug\": true,\n    \"default-runtime\": \"runc\"\n}\n";
        std::fs::write(&p, orig).unwrap();
        configure(Kind::Docker, &p, &reg(false), &Host::default(), false).unwrap();
        let out = configure(Kind::Docker, &p, &reg(true), &Host::default(), false).unwrap();
        assert_eq!(out.action, Action::Written { backup: None });
        assert_eq!(std::fs::read_to_string(backup_path(&p)).unwrap(), orig);
        let out = unconfigure(Kind::Docker, &p, "accel", &Host::default(), false).unwrap();
        assert_eq!(out.action, Action::Restored);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), orig);
        assert!(!backup_path(&p).exists());
    }

    #[test]
    fn edited_since_configure_removes_only_ours_and_restores_default() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("daemon.json");
        std::fs::write(&p, "{\n  \"default-runtime\": \"crun\"\n}\n").unwrap();
        configure(Kind::Docker, &p, &reg(true), &Host::default(), false).unwrap();
        let edited =
            std::fs::read_to_string(&p)
                .unwrap()
                .replacen("{\n", "{\n  \"debug\": true,\n", 1);
        std::fs::write(&p, &edited).unwrap();
        let out = unconfigure(Kind::Docker, &p, "accel", &Host::default(), false).unwrap();
        assert_eq!(out.action, Action::Edited);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "{\n  \"debug\": true,\n  \"default-runtime\": \"crun\"\n}\n"
        );
    }

    #[test]
    fn dry_run_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("daemon.json");
        std::fs::write(&p, "{}\n").unwrap();
        let out = configure(Kind::Docker, &p, &reg(false), &Host::default(), true).unwrap();
        assert!(out.content.unwrap().contains("accel-container-runtime"));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}\n");
        assert!(!backup_path(&p).exists());
    }

    #[test]
    fn unconfigure_of_unregistered_or_missing_is_a_no_op() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("daemon.json");
        let h = Host::default();
        assert_eq!(
            unconfigure(Kind::Docker, &p, "accel", &h, false)
                .unwrap()
                .action,
            Action::Missing
        );
        std::fs::write(&p, "{\"debug\":true}").unwrap();
        assert_eq!(
            unconfigure(Kind::Docker, &p, "accel", &h, false)
                .unwrap()
                .action,
            Action::NotRegistered
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"debug\":true}");
    }
}
