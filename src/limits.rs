//! The shim's half of a share's kernel limit (src/dmem.rs): on `create`, a container of a
//! pod the DRA driver recorded a grant for, holding that device's node, gets the grant as
//! `linux.resources.unified["dmem.max"]` in its config.json, which runc or crun writes into
//! its cgroup. The NRI plugin calls [`crate::dmem::unified`] with the same inputs.
//!
//! A create on a node where no share is prepared lists one directory and reads nothing more;
//! where some are, a spec that names none of their pods' UIDs is not parsed for this.

use std::path::{Path, PathBuf};

use crate::dmem;
use crate::spec::{self, SpecError};

/// What the screen found: the pods with grants whose UID the spec's bytes name.
#[derive(Debug)]
pub struct Pending {
    pods: Vec<String>,
    grants_dir: PathBuf,
    cgroup_root: PathBuf,
}

/// The screen, before the spec is parsed: the pods with grants in `grants_dir` whose UID
/// occurs in config.json's bytes (`data`). `None` (most creates): nothing to do. The bytes
/// only choose whether to look further; the UID used is the parsed annotation's.
pub fn screen(grants_dir: &Path, cgroup_root: &Path, data: &[u8]) -> Option<Pending> {
    let pods: Vec<String> = dmem::pods_with_grants(grants_dir)
        .into_iter()
        .filter(|uid| data.windows(uid.len()).any(|w| w == uid.as_bytes()))
        .collect();
    (!pods.is_empty()).then(|| Pending {
        pods,
        grants_dir: grants_dir.to_path_buf(),
        cgroup_root: cgroup_root.to_path_buf(),
    })
}

impl Pending {
    /// Writes the container's `dmem.max` into the config.json at `path` (read again: the
    /// create may have rewritten it), where its pod's grants and the node's regions give one.
    /// Returns the entries written, for the create's log line, and what was not believed.
    pub fn write(&self, path: &Path) -> Result<(Option<String>, Vec<String>), SpecError> {
        let data = spec::read_bytes(path)?;
        let (mut doc, view) = spec::parse_file(path, &data)?;
        let Some(pod) =
            dmem::pod_uid(&view.annotations).filter(|p| self.pods.iter().any(|x| x == p))
        else {
            return Ok((None, Vec::new()));
        };
        let (entries, said) = dmem::unified_on_node(
            &self.grants_dir,
            &self.cgroup_root,
            pod,
            &spec::char_device_numbers(&doc),
        );
        let Some(entries) = entries else {
            return Ok((None, said));
        };
        let edit = |msg| SpecError::Shape {
            path: path.to_path_buf(),
            msg,
        };
        if spec::set_unified(&mut doc, &entries).map_err(edit)? {
            spec::check_read_as_runc(path, &data)?;
            spec::write_bytes(path, &spec::to_bytes(&doc))?;
        }
        Ok((Some(dmem::shown(&entries)), said))
    }
}
