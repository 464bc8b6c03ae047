//! The CDI devices found in the spec directories, and which spec file each name resolves to.
//!
//! CDI's rules (reference: `pkg/cdi/cache.go`): every `*.json` and `*.yaml` file directly in
//! each directory is a spec; a later directory has priority over an earlier one for the same
//! fully-qualified device name; the same name defined by two files of one directory is a
//! conflict and that name resolves to nothing. A file that does not parse or validate is left
//! out with a warning in the log (and named in the error when a request then finds nothing), so
//! one broken file does not break every other vendor's devices. So is a file that is not root's
//! alone to write (src/trust.rs).

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::model::{self, ContainerEdits, Spec};

/// Far larger than any real spec (NVIDIA's for 8 GPUs is ~20 KB); bigger files are refused.
pub const MAX_SPEC_SIZE: u64 = 16 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("{origin}: {msg}")]
    BadName { origin: String, msg: String },
    #[error("{origin}: unknown CDI device {name:?} (searched {dirs}{skipped})")]
    Unknown {
        origin: String,
        name: String,
        dirs: String,
        skipped: String,
    },
    #[error("{origin}: CDI device {name:?} is defined by both {} and {}", a.display(), b.display())]
    Conflict {
        origin: String,
        name: String,
        a: PathBuf,
        b: PathBuf,
    },
}

/// One loaded spec file.
#[derive(Debug)]
pub struct SpecFile {
    pub path: PathBuf,
    pub priority: usize,
    pub spec: Spec,
}

/// Edits to make for a request, in CDI's order: a spec's shared edits once, before the first
/// of its devices, then each device's own; each tagged with the file it came from.
pub type Edits<'a> = Vec<(&'a Path, &'a ContainerEdits)>;

#[derive(Debug, Default)]
pub struct Registry {
    pub dirs: Vec<PathBuf>,
    pub files: Vec<SpecFile>,
    /// Fully-qualified name -> (file index, device index).
    devices: BTreeMap<String, (usize, usize)>,
    conflicts: BTreeMap<String, (PathBuf, PathBuf)>,
    /// Files left out, with why.
    pub invalid: Vec<(PathBuf, String)>,
}

impl Registry {
    /// Loads every spec in `dirs` (missing directories are skipped). Never fails: problems
    /// are kept in `invalid` and surface when a request cannot be resolved.
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut reg = Registry {
            dirs: dirs.to_vec(),
            ..Registry::default()
        };
        for (priority, dir) in dirs.iter().enumerate() {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    reg.invalid.push((dir.clone(), e.to_string()));
                    continue;
                }
            };
            let mut paths: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml"))
                .filter(|p| !p.is_dir())
                .collect();
            paths.sort();
            for path in paths {
                match read_spec(&path) {
                    Ok(spec) => reg.add(SpecFile {
                        path,
                        priority,
                        spec,
                    }),
                    Err(msg) => {
                        log::warn!("CDI spec {} skipped: {msg}", path.display());
                        reg.invalid.push((path, msg));
                    }
                }
            }
        }
        for name in reg.conflicts.keys() {
            reg.devices.remove(name);
        }
        reg
    }

    fn add(&mut self, file: SpecFile) {
        let fi = self.files.len();
        for (di, d) in file.spec.devices.iter().enumerate() {
            let name = format!("{}={}", file.spec.kind, d.name);
            if let Some(&(other, _)) = self.devices.get(&name) {
                let prev = &self.files[other];
                if prev.priority == file.priority {
                    self.conflicts
                        .entry(name.clone())
                        .or_insert_with(|| (prev.path.clone(), file.path.clone()));
                }
            }
            // Same directory: a conflict (removed after loading); later directory: it wins.
            self.devices.insert(name, (fi, di));
        }
        self.files.push(file);
    }

    /// Every resolvable fully-qualified device name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.devices.keys().map(String::as_str).collect()
    }

    /// Names defined twice in one directory, with the two files.
    pub fn conflicts(&self) -> impl Iterator<Item = (&str, &Path, &Path)> {
        self.conflicts
            .iter()
            .map(|(n, (a, b))| (n.as_str(), a.as_path(), b.as_path()))
    }

    /// The edits for `names` (each `(origin, name)`, origin being the variable or annotation
    /// that asked): every name must resolve, or nothing is returned.
    pub fn resolve<'a>(&'a self, names: &[(String, String)]) -> Result<Edits<'a>, RegistryError> {
        let mut out: Edits<'a> = Vec::new();
        let mut specs_done: Vec<usize> = Vec::new();
        let mut devices_done: Vec<(usize, usize)> = Vec::new();
        for (origin, name) in names {
            model::parse_qualified(name).map_err(|msg| RegistryError::BadName {
                origin: origin.clone(),
                msg,
            })?;
            // A device plugin's replica (`kind=<name>::<k>`) is its device, unless a spec
            // names the replica itself.
            let named = |n: &str| self.devices.contains_key(n) || self.conflicts.contains_key(n);
            let key = match crate::request::split_replica(name) {
                Some((base, _)) if !named(name) && named(base) => base,
                _ => name.as_str(),
            };
            if let Some((a, b)) = self.conflicts.get(key) {
                return Err(RegistryError::Conflict {
                    origin: origin.clone(),
                    name: name.clone(),
                    a: a.clone(),
                    b: b.clone(),
                });
            }
            let Some(&(fi, di)) = self.devices.get(key) else {
                return Err(self.unknown(origin, name));
            };
            if devices_done.contains(&(fi, di)) {
                continue;
            }
            devices_done.push((fi, di));
            let file = &self.files[fi];
            if !specs_done.contains(&fi) {
                specs_done.push(fi);
                out.push((&file.path, &file.spec.container_edits));
            }
            out.push((&file.path, &file.spec.devices[di].container_edits));
        }
        Ok(out)
    }

    fn unknown(&self, origin: &str, name: &str) -> RegistryError {
        let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        let skipped = match self.invalid.as_slice() {
            [] => String::new(),
            [(p, why), rest @ ..] => {
                let more = if rest.is_empty() {
                    String::new()
                } else {
                    format!(" and {} more", rest.len())
                };
                format!("; skipped invalid {}: {why}{more}", p.display())
            }
        };
        RegistryError::Unknown {
            origin: origin.into(),
            name: name.into(),
            dirs: dirs.join(", "),
            skipped,
        }
    }
}

/// Reads and validates one spec file (regular file, at most [`MAX_SPEC_SIZE`]).
pub fn read_spec(path: &Path) -> Result<Spec, String> {
    // O_NONBLOCK: a FIFO named *.json cannot hang a create.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    // A spec names host files to mount into containers: only one root alone could have
    // written (the file and its directories, src/trust.rs) is a host administrator's statement.
    crate::trust::check_file(path)?;
    if meta.len() > MAX_SPEC_SIZE {
        return Err(format!(
            "{} bytes, over the {MAX_SPEC_SIZE} byte limit",
            meta.len()
        ));
    }
    // The limit holds while reading too: a file that grew past it is refused.
    let data = crate::bounded::read(f, MAX_SPEC_SIZE).map_err(|e| e.to_string())?;
    let spec = model::parse(path, &data)?;
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, kind: &str, devices: &[&str]) {
        let devs: Vec<String> = devices
            .iter()
            .map(|d| format!("- name: \"{d}\"\n  containerEdits:\n    env: [\"FROM={file}\"]\n"))
            .collect();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join(file),
            format!(
                "cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n{}",
                devs.concat()
            ),
        )
        .unwrap();
    }

    fn from(reg: &Registry, name: &str) -> Result<String, RegistryError> {
        let edits = reg.resolve(&[("V".into(), name.into())])?;
        Ok(edits.last().unwrap().1.env[0].clone())
    }

    #[test]
    fn later_dir_wins_same_dir_conflicts() {
        let t = tempfile::tempdir().unwrap();
        let (etc, run) = (t.path().join("etc"), t.path().join("run"));
        write(&etc, "a.yaml", "v.com/gpu", &["0", "1", "2"]);
        write(&run, "b.yaml", "v.com/gpu", &["1"]);
        write(&run, "c.yaml", "v.com/gpu", &["2"]);
        write(&run, "d.yaml", "v.com/gpu", &["2"]);
        std::fs::write(run.join("broken.json"), "{").unwrap();
        std::fs::write(run.join("ignored.txt"), "{").unwrap();
        write(&run, "writable.yaml", "v.com/gpu", &["3"]);
        std::fs::set_permissions(
            run.join("writable.yaml"),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .unwrap();
        let reg = Registry::load(&[etc, run, t.path().join("missing")]);
        assert_eq!(from(&reg, "v.com/gpu=0").unwrap(), "FROM=a.yaml");
        assert_eq!(from(&reg, "v.com/gpu=1").unwrap(), "FROM=b.yaml");
        let e = from(&reg, "v.com/gpu=2").unwrap_err().to_string();
        assert!(e.contains("c.yaml") && e.contains("d.yaml"), "{e}");
        assert_eq!(reg.names(), ["v.com/gpu=0", "v.com/gpu=1"]);
        assert!(reg
            .invalid
            .iter()
            .any(|(p, why)| p.ends_with("writable.yaml")
                && why.contains("writable by group and others")));
        // A replica is its device; a replica of a conflicting name conflicts alike.
        assert_eq!(from(&reg, "v.com/gpu=1::3").unwrap(), "FROM=b.yaml");
        let e = from(&reg, "v.com/gpu=2::0").unwrap_err().to_string();
        assert!(e.contains("c.yaml") && e.contains("d.yaml"), "{e}");
        assert!(from(&reg, "v.com/gpu=9::0").is_err());
        let e = from(&reg, "v.com/gpu=9").unwrap_err().to_string();
        assert!(
            e.starts_with("V: unknown CDI device \"v.com/gpu=9\" (searched ")
                && e.contains("skipped invalid ")
                && e.contains("broken.json"),
            "{e}"
        );
        assert!(matches!(
            from(&reg, "../../etc"),
            Err(RegistryError::BadName { .. })
        ));
    }

    #[test]
    fn shared_edits_come_once_before_devices() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join("s.json"),
            r#"{"cdiVersion":"0.5.0","kind":"v.com/gpu","containerEdits":{"env":["SHARED=1"]},
               "devices":[{"name":"0","containerEdits":{"env":["D=0"]}},{"name":"1","containerEdits":{"env":["D=1"]}}]}"#,
        )
        .unwrap();
        let reg = Registry::load(&[t.path().to_path_buf()]);
        let names: Vec<(String, String)> = ["v.com/gpu=1", "v.com/gpu=0", "v.com/gpu=1"]
            .iter()
            .map(|n| ("V".to_string(), n.to_string()))
            .collect();
        let envs: Vec<&str> = reg
            .resolve(&names)
            .unwrap()
            .iter()
            .map(|(_, e)| e.env[0].as_str())
            .collect();
        assert_eq!(envs, ["SHARED=1", "D=1", "D=0"]);
    }
}
