//! Reading, editing and writing the bundle's `config.json` as a `serde_json::Value`.
//!
//! One grammar: serde_json's, with its recursion limit (a spec nested deeper than 128 levels
//! is refused with one line, never a stack overflow). `preserve_order` keeps every object's
//! key order and `arbitrary_precision` keeps every number as it was written, so a field the
//! shim does not own is written back with the same value. A typed `oci_spec` `Spec` is never
//! round-tripped: it drops keys it does not know and rewrites capability lists
//! (tests/spec_roundtrip.rs shows it).
//!
//! Everything the shim decides from the spec is read in one place, [`View::of`]: the
//! environment, privilege, annotations, root, hooks and existing mounts. Before a spec is
//! edited on that reading, [`golang::check`] makes sure runc's Go decoder reads those keys
//! the same way (no case variants, no repeats) and that their lists are bounded. The
//! entries the shim adds are typed structs ([`DeviceEntry`], [`RuleEntry`], [`MountEntry`]) converted with
//! `serde_json::to_value` and appended to `/linux/devices`, `/linux/resources/devices` and
//! `/mounts`; missing sections are created empty, never from a typed default.
//! Ref: OCI runtime spec, config.md and config-linux.md (devices, resources.devices, mounts).

pub mod golang;
pub mod screen;

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::atomic;
use crate::edits::{BindMount, DeviceNode, Plan, MOUNT_OPTIONS};
use crate::inroot::{Root, Scope};

/// Larger than any real spec (docker's are ~10 KB); a bigger file is refused, not parsed.
pub const MAX_SIZE: u64 = 64 << 20;

/// The name docker's `--gpus` hook has; its work is done in the spec instead.
pub const DOCKER_GPU_HOOK: &str = "nvidia-container-runtime-hook";

/// Prefix of the OCI annotations through which Kubernetes device plugins request CDI devices
/// (`cdi.k8s.io/<plugin>`). Here, below src/cdi/, so that the screen and CDI's reading of the
/// annotations cannot disagree on it.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    NotAFile { path: PathBuf, msg: String },
    #[error("{}: not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {msg}", path.display())]
    Shape { path: PathBuf, msg: String },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// config.json's bytes, when it is a regular file (not a symlink, FIFO or device) of at most
/// [`MAX_SIZE`] (enforced while reading: a file that grows is not read past it).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, SpecError> {
    let open_err = |source| SpecError::Open {
        path: path.into(),
        source,
    };
    // O_NOFOLLOW: a symlinked config.json is refused; O_NONBLOCK: a FIFO cannot hang us.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(SpecError::NotAFile {
            path: path.into(),
            msg: format!("is {what}"),
        });
    }
    let too_big = |size: u64| SpecError::NotAFile {
        path: path.into(),
        msg: format!("is {size} bytes, over the {MAX_SIZE} byte limit"),
    };
    if meta.size() > MAX_SIZE {
        return Err(too_big(meta.size()));
    }
    let mut data = Vec::with_capacity(usize::try_from(meta.size()).unwrap_or(0));
    file.take(MAX_SIZE + 1)
        .read_to_end(&mut data)
        .map_err(open_err)?;
    if data.len() as u64 > MAX_SIZE {
        return Err(too_big(data.len() as u64));
    }
    Ok(data)
}

/// Why spec bytes are not a spec the shim can read.
#[derive(Debug)]
pub enum ParseError {
    /// Not JSON to serde_json (syntax, invalid UTF-8, nested deeper than its limit).
    Json(serde_json::Error),
    /// JSON, but a section the shim reads has the wrong type.
    Shape(String),
}

/// Parses spec bytes into the document and checks the sections the shim reads.
pub fn parse(data: &[u8]) -> Result<(Value, View), ParseError> {
    let doc: Value = serde_json::from_slice(data).map_err(ParseError::Json)?;
    let view = View::of(&doc).map_err(ParseError::Shape)?;
    Ok((doc, view))
}

/// [`parse`], with errors naming `path`.
pub fn parse_file(path: &Path, data: &[u8]) -> Result<(Value, View), SpecError> {
    parse(data).map_err(|e| match e {
        ParseError::Json(source) => SpecError::Json {
            path: path.into(),
            source,
        },
        ParseError::Shape(msg) => SpecError::Shape {
            path: path.into(),
            msg,
        },
    })
}

/// For a spec the shim is about to edit: refuses keys runc's Go decoder would read otherwise
/// than the shim did, and lists over their limits ([`golang::check`]).
pub fn check_read_as_runc(path: &Path, data: &[u8]) -> Result<(), SpecError> {
    golang::check(data).map_err(|msg| SpecError::Shape {
        path: path.into(),
        msg,
    })
}

/// What the shim reads from a spec, read once: every decision (is anything asked for, by
/// whom, may it be given) is made from this, never from the document again. The one place
/// where the spec is read the way runc reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// `process.env`, in order; null is "" as to runc, other non-strings are skipped.
    pub env: Vec<String>,
    /// `CAP_SYS_ADMIN` in the bounding set.
    pub privileged: bool,
    /// `annotations` with string values (null is "", as to runc), in the document's order.
    pub annotations: Vec<(String, String)>,
    /// `root.path` as written; "" when `root` has no `path` (Go's zero value).
    pub root_path: Option<String>,
    /// Destinations of `mounts`.
    pub mount_destinations: Vec<String>,
    /// The `mounts` entries (the device lists from mounts: `request::device_list_from_mounts`).
    pub mounts: Vec<Value>,
    /// Docker's `--gpus` prestart hook is there.
    pub docker_gpu_hook: bool,
}

impl View {
    /// Reads the view of a parsed document; a section of the wrong JSON type is an error
    /// naming it (runc would refuse the spec too).
    pub fn of(doc: &Value) -> Result<View, String> {
        let root = doc.as_object().ok_or("the document is not a JSON object")?;
        check_shape(root)?;
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| a.iter().filter_map(go_string).collect())
                .unwrap_or_default()
        };
        let env = strings(doc.pointer("/process/env"));
        let privileged = doc
            .pointer("/process/capabilities/bounding")
            .and_then(Value::as_array)
            .is_some_and(|caps| caps.iter().any(|c| c == "CAP_SYS_ADMIN"));
        let annotations = root
            .get("annotations")
            .and_then(Value::as_object)
            .map(|a| {
                a.iter()
                    .filter_map(|(k, v)| Some((k.clone(), go_string(v)?)))
                    .collect()
            })
            .unwrap_or_default();
        // A `root` without `path` is runc's `Root{Path: ""}`: the bundle directory itself,
        // as runc resolves a relative path (found by tests/go_differential.rs).
        let root_path = root.get("root").and_then(Value::as_object).map(|r| {
            r.get("path")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        });
        let mounts: Vec<Value> = root
            .get("mounts")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mount_destinations = mounts
            .iter()
            .filter_map(|m| Some(m.get("destination")?.as_str()?.to_string()))
            .collect();
        let docker_gpu_hook = doc
            .pointer("/hooks/prestart")
            .and_then(Value::as_array)
            .is_some_and(|hooks| hooks.iter().any(is_docker_gpu_hook));
        Ok(View {
            env,
            privileged,
            annotations,
            root_path,
            mount_destinations,
            mounts,
            docker_gpu_hook,
        })
    }

    /// The value of `name` in `process.env` as the container sees it: runc sets the entries
    /// in order, so the last one wins (`docker run -e NVIDIA_VISIBLE_DEVICES=0 --gpus all`
    /// writes both). Entries without `=` are skipped.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
    }

    /// Every `NAME=value` entry of `process.env` in order (a name may repeat: the last
    /// counts), for checks that look at a family of names (`NVIDIA_REQUIRE_*`).
    pub fn env_entries(&self) -> Vec<(&str, &str)> {
        self.env.iter().filter_map(|e| e.split_once('=')).collect()
    }

    /// The container's rootfs on the host: `root.path`, relative to the bundle when relative.
    pub fn rootfs(&self, bundle: &Path) -> Option<PathBuf> {
        let p = Path::new(self.root_path.as_deref()?);
        Some(if p.is_absolute() {
            p.to_path_buf()
        } else {
            bundle.join(p)
        })
    }
}

/// A value read into a Go `string`: a JSON string, or null, which Go reads as "" (in a
/// `[]string` or a `map[string]string` the entry is there, empty; found by
/// tests/go_differential.rs). Anything else is a type error to Go; the shim skips it.
fn go_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

fn check_shape(root: &Map<String, Value>) -> Result<(), String> {
    let at = |key: &str| {
        let mut parts = key.split('/');
        let mut cur = root.get(parts.next()?)?;
        for p in parts {
            cur = cur.as_object()?.get(p)?;
        }
        Some(cur)
    };
    // null is the section's absence to Go (a nil pointer, slice or map; a zero `User`), so it
    // is to the shim (found by tests/go_differential.rs: refusing it refused specs runc runs).
    let kind = |key: &str, want: fn(&Value) -> bool, what: &str| match at(key) {
        Some(x) if !x.is_null() && !want(x) => Err(format!("`{key}` must be {what}")),
        _ => Ok(()),
    };
    kind("process", Value::is_object, "an object")?;
    kind("process/env", Value::is_array, "an array of strings")?;
    kind("process/user", Value::is_object, "an object")?;
    kind("process/user/additionalGids", Value::is_array, "an array")?;
    kind("process/capabilities", Value::is_object, "an object")?;
    kind("process/capabilities/bounding", Value::is_array, "an array")?;
    kind("linux", Value::is_object, "an object")?;
    kind("linux/devices", Value::is_array, "an array")?;
    kind("linux/resources", Value::is_object, "an object")?;
    kind("linux/resources/devices", Value::is_array, "an array")?;
    kind("mounts", Value::is_array, "an array")?;
    kind("hooks", Value::is_object, "an object")?;
    kind("hooks/prestart", Value::is_array, "an array")?;
    kind("annotations", Value::is_object, "an object")?;
    kind("root", Value::is_object, "an object")?;
    kind("root/path", Value::is_string, "a string")?;
    Ok(())
}

fn is_docker_gpu_hook(hook: &Value) -> bool {
    let path = hook.get("path").and_then(Value::as_str).unwrap_or_default();
    Path::new(path)
        .file_name()
        .is_some_and(|n| n == DOCKER_GPU_HOOK)
}

/// Removes docker's `--gpus` prestart hook; true when one was there. An emptied `prestart`
/// is removed with it.
pub fn remove_docker_gpu_hook(doc: &mut Value) -> bool {
    let Some(hooks) = doc.get_mut("hooks").and_then(Value::as_object_mut) else {
        return false;
    };
    let Some(prestart) = hooks.get_mut("prestart").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = prestart.len();
    prestart.retain(|h| !is_docker_gpu_hook(h));
    let removed = prestart.len() != before;
    if removed && prestart.is_empty() {
        hooks.shift_remove("prestart");
    }
    removed
}

/// Debian's and Ubuntu's library directory, searched by their glibc by default.
pub const MULTIARCH_LIBRARY_DIR: &str = if cfg!(target_arch = "aarch64") {
    "/usr/lib/aarch64-linux-gnu"
} else {
    "/usr/lib/x86_64-linux-gnu"
};

/// Where glibc in the image looks for libraries by default: the Debian multiarch directory
/// when the image has it as a real directory, else /usr/lib64 (RHEL family). The path is
/// resolved in the rootfs by [`crate::inroot`] with no symlink allowed on it
/// ([`Scope::NoSymlinks`], `O_PATH | O_DIRECTORY`): a link in the image is never followed,
/// on the host or in the image.
pub fn default_library_dir(rootfs: Option<&Path>) -> PathBuf {
    let multiarch = Path::new(MULTIARCH_LIBRARY_DIR);
    let real_dir = rootfs.and_then(|r| Root::open(r).ok()).is_some_and(|root| {
        root.open_at(
            multiarch,
            OFlags::PATH | OFlags::DIRECTORY,
            Scope::NoSymlinks,
        )
        .is_ok()
    });
    if real_dir {
        multiarch.to_path_buf()
    } else {
        PathBuf::from("/usr/lib64")
    }
}

/// A `linux.devices` entry (OCI `LinuxDevice`), fields in runc's order.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceEntry<'a> {
    pub path: &'a str,
    #[serde(rename = "type")]
    pub typ: &'static str,
    pub major: u64,
    pub minor: u64,
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A `linux.resources.devices` rule (OCI `LinuxDeviceCgroup`).
#[derive(Debug, Serialize)]
pub struct RuleEntry<'a> {
    pub allow: bool,
    #[serde(rename = "type")]
    pub typ: &'static str,
    pub major: u64,
    pub minor: u64,
    pub access: &'a str,
}

/// A `mounts` entry (OCI `Mount`); no `type` leaves it to runc (it goes by the options).
#[derive(Debug, Serialize)]
pub struct MountEntry<'a> {
    pub destination: &'a str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub typ: Option<&'a str>,
    pub source: &'a str,
    pub options: &'a [String],
}

fn utf8<'p>(p: &'p Path, what: &str) -> Result<&'p str, String> {
    p.to_str()
        .ok_or_else(|| format!("{what} {} is not UTF-8", p.display()))
}

fn to_value(entry: impl Serialize) -> Result<Value, String> {
    serde_json::to_value(entry).map_err(|e| e.to_string())
}

/// The `linux.devices` entry for a node (shared with CDI's edits, so both write the same).
pub fn device_entry(n: &DeviceNode) -> Result<Value, String> {
    to_value(DeviceEntry {
        path: utf8(&n.path, "device path")?,
        typ: n.kind.as_str(),
        major: n.major,
        minor: n.minor,
        file_mode: n.file_mode,
        uid: n.uid,
        gid: n.gid,
    })
}

/// The `linux.resources.devices` allow rule for a node with the given cgroup access.
pub fn rule_entry(n: &DeviceNode, access: &str) -> Result<Value, String> {
    to_value(RuleEntry {
        allow: true,
        typ: n.kind.as_str(),
        major: n.major,
        minor: n.minor,
        access,
    })
}

/// A `mounts` entry; `typ` `None` leaves the type out.
pub fn mount_entry(m: &BindMount, typ: Option<&str>, options: &[String]) -> Result<Value, String> {
    to_value(MountEntry {
        destination: utf8(&m.destination, "mount destination")?,
        typ,
        source: utf8(&m.source, "mount source")?,
        options,
    })
}

/// The array at `path` (object keys from the root), created with its parents when missing;
/// a section of another type is an error naming it.
pub fn array_mut<'d>(doc: &'d mut Value, path: &[&str]) -> Result<&'d mut Vec<Value>, String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("empty section path".into());
    };
    let mut cur = doc;
    for (i, key) in parents.iter().enumerate() {
        let obj = cur.as_object_mut().ok_or_else(|| shape_error(&path[..i]))?;
        cur = section(obj, key, || Value::Object(Map::new()));
    }
    let obj = cur.as_object_mut().ok_or_else(|| shape_error(parents))?;
    section(obj, last, || Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| format!("`{}` must be an array", path.join(".")))
}

/// The section `key` of `obj`, made with `new` when missing or null (null is its absence to
/// runc, so the section replaces it).
fn section<'o>(
    obj: &'o mut Map<String, Value>,
    key: &str,
    new: impl Fn() -> Value,
) -> &'o mut Value {
    let slot = obj.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = new();
    }
    slot
}

fn shape_error(path: &[&str]) -> String {
    if path.is_empty() {
        "the document is not a JSON object".into()
    } else {
        format!("`{}` must be an object", path.join("."))
    }
}

/// Writes the plan into the spec. Entries already present are respected: nodes by path,
/// cgroup rules by value, mounts by destination, gids by value. An empty plan touches
/// nothing (no section is created). True when the document changed: a section is only ever
/// created to hold an entry added to it, so "added something" is "changed", and the create
/// needs no copy of the whole document to compare against.
pub fn apply(doc: &mut Value, plan: &Plan) -> Result<bool, String> {
    let mut changed = false;
    if !plan.nodes.is_empty() {
        let devices = array_mut(doc, &["linux", "devices"])?;
        for n in &plan.nodes {
            let path = utf8(&n.path, "device path")?;
            if !devices
                .iter()
                .any(|d| d.get("path").and_then(Value::as_str) == Some(path))
            {
                devices.push(device_entry(n)?);
                changed = true;
            }
        }
        let rules = array_mut(doc, &["linux", "resources", "devices"])?;
        for n in &plan.nodes {
            let rule = rule_entry(n, "rwm")?;
            if !rules.contains(&rule) {
                rules.push(rule);
                changed = true;
            }
        }
    }
    if !plan.mounts.is_empty() {
        let options: Vec<String> = MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect();
        let mounts = array_mut(doc, &["mounts"])?;
        for m in &plan.mounts {
            let dest = utf8(&m.destination, "mount destination")?;
            if !mounts
                .iter()
                .any(|x| x.get("destination").and_then(Value::as_str) == Some(dest))
            {
                mounts.push(mount_entry(m, Some("bind"), &options)?);
                changed = true;
            }
        }
    }
    Ok(add_gids(doc, &plan.additional_gids)? || changed)
}

/// Adds groups to `process.user.additionalGids` (creating the sections; a new `user` is
/// root's, as runc's default), each once. True when one was added.
pub fn add_gids(doc: &mut Value, add: &[u32]) -> Result<bool, String> {
    if add.is_empty() {
        return Ok(false);
    }
    let process = section(
        doc.as_object_mut()
            .ok_or("the document is not a JSON object")?,
        "process",
        || Value::Object(Map::new()),
    );
    let user = section(
        process
            .as_object_mut()
            .ok_or("`process` must be an object")?,
        "user",
        || serde_json::json!({"uid": 0, "gid": 0}),
    );
    let gids = section(
        user.as_object_mut()
            .ok_or("`process.user` must be an object")?,
        "additionalGids",
        || Value::Array(Vec::new()),
    )
    .as_array_mut()
    .ok_or("`process.user.additionalGids` must be an array")?;
    let mut changed = false;
    for g in add {
        if !gids.iter().any(|x| go_gid(x) == Some(*g)) {
            gids.push(Value::from(*g));
            changed = true;
        }
    }
    Ok(changed)
}

/// An `additionalGids` entry as runc's Go decoder reads it into a `uint32`: null is 0 (found
/// by tests/go_differential.rs); anything that is not a uint32 is an error to Go.
pub fn go_gid(v: &Value) -> Option<u32> {
    match v {
        Value::Null => Some(0),
        v => u32::try_from(v.as_u64()?).ok(),
    }
}

/// Sets each `(key, value)` in `linux.resources.unified` (the cgroup v2 keys runc and crun
/// write into the container's cgroup), creating the sections; every other key stays where
/// it was, and a key already there keeps its place. True when the document changed.
pub fn set_unified(doc: &mut Value, entries: &[(String, String)]) -> Result<bool, String> {
    if entries.is_empty() {
        return Ok(false);
    }
    let mut cur = doc;
    let path = ["linux", "resources", "unified"];
    for (i, key) in path.iter().enumerate() {
        let obj = cur.as_object_mut().ok_or_else(|| shape_error(&path[..i]))?;
        cur = section(obj, key, || Value::Object(Map::new()));
    }
    let unified = cur.as_object_mut().ok_or_else(|| shape_error(&path))?;
    let mut changed = false;
    for (k, v) in entries {
        if unified.get(k).and_then(Value::as_str) != Some(v) {
            unified.insert(k.clone(), Value::from(v.as_str()));
            changed = true;
        }
    }
    Ok(changed)
}

/// `major:minor` of each character device in `linux.devices`: the nodes the container gets.
pub fn char_device_numbers(doc: &Value) -> Vec<String> {
    doc.pointer("/linux/devices")
        .and_then(Value::as_array)
        .map(|devices| {
            devices
                .iter()
                .filter(|d| d.get("type").and_then(Value::as_str) == Some("c"))
                .filter_map(|d| {
                    let n = |k: &str| d.get(k).and_then(Value::as_u64);
                    Some(format!("{}:{}", n("major")?, n("minor")?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The bytes written for a document (compact JSON, as engines write it).
pub fn to_bytes(doc: &Value) -> Vec<u8> {
    // A Value with string keys always serializes.
    serde_json::to_vec(doc).unwrap_or_default()
}

/// Atomically replaces config.json with `data` (mode and owner kept).
pub fn write_bytes(path: &Path, data: &[u8]) -> Result<(), SpecError> {
    atomic::replace(path, data, 0o600).map_err(|source| SpecError::Write {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::NodeKind;
    use serde_json::json;

    fn node(path: &str, minor: u64) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: path.into(),
            kind: NodeKind::Char,
            major: 195,
            minor,
            file_mode: 0o666,
            uid: 0,
            gid: 0,
        }
    }

    fn plan() -> Plan {
        Plan {
            nodes: vec![node("/dev/nvidia1", 1), node("/dev/nvidiactl", 255)],
            mounts: vec![BindMount {
                source: "/drv/libcuda.so.550".into(),
                destination: "/usr/lib64/libcuda.so.1".into(),
            }],
            additional_gids: vec![44],
        }
    }

    fn doc(input: &str) -> Value {
        parse(input.as_bytes())
            .unwrap_or_else(|e| panic!("{input}: {e:?}"))
            .0
    }

    fn applied(input: &str) -> String {
        let mut d = doc(input);
        apply(&mut d, &plan()).unwrap();
        String::from_utf8(to_bytes(&d)).unwrap()
    }

    #[test]
    fn apply_adds_entries_and_keeps_unknown_fields_and_order() {
        let input = json!({"ociVersion": "1.0.2", "zzz-future": {"x": [3, 1, 2]}, "process": {"env": ["A=1"], "capabilities": {"bounding": ["CAP_KILL", "CAP_CHOWN"]}}, "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "aaa": 1}});
        let spec: Value = serde_json::from_str(&applied(&input.to_string())).unwrap();
        assert_eq!(spec["zzz-future"], input["zzz-future"]);
        assert_eq!(
            spec["process"]["capabilities"],
            input["process"]["capabilities"]
        );
        let keys: Vec<&String> = spec.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["ociVersion", "zzz-future", "process", "linux", "mounts"]
        );
        assert_eq!(
            spec["linux"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["resources", "aaa", "devices"]
        );
        assert_eq!(
            spec["linux"]["devices"][0],
            json!({"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 438, "uid": 0, "gid": 0})
        );
        assert_eq!(
            spec["linux"]["resources"]["devices"][1],
            json!({"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"})
        );
        assert_eq!(
            spec["mounts"][0],
            json!({"destination": "/usr/lib64/libcuda.so.1", "type": "bind", "source": "/drv/libcuda.so.550", "options": ["ro", "nosuid", "nodev", "bind"]})
        );
        assert_eq!(
            spec["process"]["user"],
            json!({"uid": 0, "gid": 0, "additionalGids": [44]})
        );
    }

    #[test]
    fn apply_is_idempotent_and_an_empty_plan_changes_nothing() {
        for input in [
            "{\"linux\": {}}",
            "{}",
            " { } ",
            "{\n  \"linux\": {\n    \"devices\": [ ]\n  },\n  \"mounts\": []\n}\n",
        ] {
            let once = applied(input);
            assert_eq!(applied(&once), once, "{input}");
            let mut d = doc(input);
            let before = d.clone();
            assert!(!apply(&mut d, &Plan::default()).unwrap(), "{input}");
            assert_eq!(d, before, "{input}");
            assert!(apply(&mut d, &plan()).unwrap(), "{input}: first apply adds");
            assert!(
                !apply(&mut d, &plan()).unwrap(),
                "{input}: second apply adds nothing"
            );
        }
    }

    #[test]
    fn numbers_and_unicode_are_kept_as_written() {
        let input =
            r#"{"a":1.50,"b":1e400,"c":18446744073709551616,"d":-0,"e":"a\u003cb","f":0.1}"#;
        let out = applied(input);
        assert!(
            // (An exponent gains its `+`: the same number to every reader.)
            out.starts_with(
                r#"{"a":1.50,"b":1e+400,"c":18446744073709551616,"d":-0,"e":"a<b","f":0.1,"#
            ),
            "{out}"
        );
    }

    #[test]
    fn missing_sections_are_created_at_each_level() {
        let cases = [
            ("{}", "{\"linux\":{\"devices\":[1],\"resources\":{\"devices\":[2]}},\"mounts\":[3],\"process\":{\"user\":{\"uid\":0,\"gid\":0,\"additionalGids\":[44]}}}"),
            ("{\"linux\":{\"resources\":{}},\"process\":{}}", "{\"linux\":{\"resources\":{\"devices\":[2]},\"devices\":[1]},\"process\":{\"user\":{\"uid\":0,\"gid\":0,\"additionalGids\":[44]}},\"mounts\":[3]}"),
            ("{\"linux\":{\"resources\":{\"devices\":[]}},\"process\":{\"user\":{\"uid\":5}},\"mounts\":[]}", "{\"linux\":{\"resources\":{\"devices\":[2]},\"devices\":[1]},\"process\":{\"user\":{\"uid\":5,\"additionalGids\":[44]}},\"mounts\":[3]}"),
        ];
        for (input, want) in cases {
            let mut d = doc(input);
            array_mut(&mut d, &["linux", "devices"])
                .unwrap()
                .push(json!(1));
            array_mut(&mut d, &["linux", "resources", "devices"])
                .unwrap()
                .push(json!(2));
            array_mut(&mut d, &["mounts"]).unwrap().push(json!(3));
            add_gids(&mut d, &[44]).unwrap();
            assert_eq!(String::from_utf8(to_bytes(&d)).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn a_rule_already_there_in_another_key_order_is_not_added_again() {
        let input = "{\"linux\": {\"resources\": {\"devices\": [\n  {\"access\": \"rwm\", \"minor\": 1, \"major\": 195,\n   \"type\": \"c\", \"allow\": true},\n  {\"allow\": true, \"type\": \"c\", \"major\": 195, \"minor\": 255, \"access\": \"rw\"}\n]}}}";
        let v: Value = serde_json::from_str(&applied(input)).unwrap();
        let rules = v["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[2]["minor"], 255);
        assert_eq!(rules[2]["access"], "rwm");
    }

    #[test]
    fn duplicate_keys_last_one_counts_for_reads_and_edits() {
        let input = r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"linux":{"devices":[{"path":"/dev/old"}]},"process":{"env":["NVIDIA_VISIBLE_DEVICES=1"],"env":["NVIDIA_VISIBLE_DEVICES=2"]},"linux":{"resources":{}}}"#;
        let (_, view) = parse(input.as_bytes()).unwrap();
        assert_eq!(view.env("NVIDIA_VISIBLE_DEVICES"), Some("2"));
        let v: Value = serde_json::from_str(&applied(input)).unwrap();
        assert_eq!(v["process"]["env"], json!(["NVIDIA_VISIBLE_DEVICES=2"]));
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(
            v["linux"]["resources"]["devices"].as_array().unwrap().len(),
            2
        );
        assert!(parse(br#"{"linux":[],"linux":{}}"#).is_ok());
        assert!(matches!(
            parse(br#"{"linux":{},"linux":[]}"#),
            Err(ParseError::Shape(m)) if m == "`linux` must be an object"
        ));
        let (_, view) = parse(br#"{"annotations":{"x":"1","a":"1","b":2,"a":"3"}}"#).unwrap();
        assert_eq!(
            view.annotations,
            [("x".into(), "1".into()), ("a".into(), "3".into())]
        );
    }

    #[test]
    fn escaped_keys_and_values_are_the_same_keys_and_values() {
        let input = r#"{"\u006cinux":{"d\u0065vices":[{"path":"\/dev\/nvidia1"}]},"pro\u0063ess":{"env":["NVIDIA_VISIBLE_DEVICES=\u0030"]},"annotations":{"cdi.k8s.io\/x":"v"}}"#;
        let (_, view) = parse(input.as_bytes()).unwrap();
        assert_eq!(view.env("NVIDIA_VISIBLE_DEVICES"), Some("0"));
        assert_eq!(view.annotations, [("cdi.k8s.io/x".into(), "v".into())]);
        let v: Value = serde_json::from_str(&applied(input)).unwrap();
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn reads_of_capabilities_mounts_root_hooks() {
        let (_, view) = parse(
            br#"{"process":{"capabilities":{"bounding":["CAP_KILL","CAP_SYS_\u0041DMIN"]}},"root":{"path":"rootfs"},"mounts":[{"destination":"/a"},{"source":"/b"},3,{"destination":"/c","destination":"/d"}],"hooks":{"prestart":[{"path":"/usr/bin/nvidia-container-runtime-hook"}]}}"#,
        )
        .unwrap();
        assert!(view.privileged);
        assert!(view.docker_gpu_hook);
        assert_eq!(
            view.rootfs(Path::new("/b")),
            Some(PathBuf::from("/b/rootfs"))
        );
        assert_eq!(view.mount_destinations, ["/a", "/d"]);
        let (_, plain) = parse(
            br#"{"process":{"capabilities":{"bounding":["CAP_KILL"]}},"root":{"path":"/r"}}"#,
        )
        .unwrap();
        assert!(!plain.privileged && !plain.docker_gpu_hook);
        assert_eq!(plain.rootfs(Path::new("/b")), Some(PathBuf::from("/r")));
    }

    /// Regressions found by tests/go_differential.rs: where runc's Go decoder reads a null
    /// or a missing field as its zero value, the view and the edits do too.
    #[test]
    fn null_and_missing_read_as_go_zero_values() {
        let (_, view) = parse(
            br#"{"process":{"env":["A=1",null]},"annotations":{"cdi.k8s.io/a":null},"root":{"readonly":true}}"#,
        )
        .unwrap();
        assert_eq!(view.env, ["A=1", ""]);
        assert_eq!(view.annotations, [("cdi.k8s.io/a".into(), String::new())]);
        assert_eq!(view.root_path.as_deref(), Some(""));
        assert_eq!(view.rootfs(Path::new("/b")), Some(PathBuf::from("/b/")));
        // A null section is an absent one: read as empty, replaced when the shim adds to it.
        let input = r#"{"process":{"user":null,"capabilities":null,"env":null},"linux":{"devices":null,"resources":null},"mounts":null,"annotations":null,"hooks":null,"root":null}"#;
        let (_, view) = parse(input.as_bytes()).unwrap();
        assert_eq!(view, View::default());
        let v: Value = serde_json::from_str(&applied(input)).unwrap();
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(
            v["linux"]["resources"]["devices"].as_array().unwrap().len(),
            2
        );
        assert_eq!(v["mounts"].as_array().unwrap().len(), 1);
        assert_eq!(
            v["process"]["user"],
            json!({"uid": 0, "gid": 0, "additionalGids": [44]})
        );
        // A null gid is runc's 0.
        let mut d = doc(r#"{"process":{"user":{"additionalGids":[null]}}}"#);
        assert!(!add_gids(&mut d, &[0]).unwrap());
        assert!(add_gids(&mut d, &[44]).unwrap());
    }

    #[test]
    fn env_last_entry_wins_and_bad_entries_skip() {
        let (_, view) = parse(br#"{"process": {"env": ["NOEQUALS", "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=all", 5, {"NVIDIA_VISIBLE_DEVICES": 2}]}}"#).unwrap();
        assert_eq!(view.env("NVIDIA_VISIBLE_DEVICES"), Some("all"));
        assert_eq!(view.env("NVIDIA_VISIBLE"), None);
    }

    #[test]
    fn shape_and_json_errors() {
        for (doc, want) in [
            ("[]", "not a JSON object"),
            ("42", "not a JSON object"),
            ("{\"process\": 1}", "`process`"),
            ("{\"linux\": {\"devices\": {}}}", "`linux/devices`"),
            ("{\"root\": {\"path\": 1}}", "`root/path` must be a string"),
        ] {
            match parse(doc.as_bytes()) {
                Err(ParseError::Shape(m)) => assert!(m.contains(want), "{m}"),
                Err(e) => panic!("{doc}: {e:?}"),
                Ok(_) => panic!("{doc}: parsed"),
            }
        }
        for bad in [
            &b""[..],
            b"{",
            b"[",
            b"{} x",
            b"{\"a\":1,}",
            b"{\"a\":\"\xff\"}",
            br#"{"process":{"env":["A=\ud800"]}}"#,
        ] {
            assert!(matches!(parse(bad), Err(ParseError::Json(_))), "{bad:?}");
        }
    }

    #[test]
    fn nesting_past_the_limit_is_an_error_not_a_crash() {
        let deep = format!(
            "{{\"linux\":{{\"resources\":{{\"devices\":{}{}}}}}}}",
            "[".repeat(20_000),
            "]".repeat(20_000)
        );
        match parse(deep.as_bytes()) {
            Err(ParseError::Json(e)) => assert!(e.to_string().contains("recursion limit"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn docker_hook_removed() {
        let mut d = doc(
            r#"{"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}]}}"#,
        );
        assert!(remove_docker_gpu_hook(&mut d));
        assert!(!remove_docker_gpu_hook(&mut d));
        assert_eq!(d, json!({"hooks": {}}));
        // Escaped, it is still the hook (every JSON reader decodes the same path).
        let (mut d, view) = parse(
            br#"{"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hoo\u006b"}]}}"#,
        )
        .unwrap();
        assert!(view.docker_gpu_hook && remove_docker_gpu_hook(&mut d));
        let other = json!({"hooks": {"prestart": [{"path": "/usr/bin/libnetwork-setkey"}]}});
        let mut d = other.clone();
        assert!(!remove_docker_gpu_hook(&mut d));
        assert_eq!(d, other);
    }

    #[test]
    fn library_dir_never_follows_image_symlinks() {
        let r = tempfile::tempdir().unwrap();
        assert_eq!(
            default_library_dir(Some(r.path())),
            PathBuf::from("/usr/lib64")
        );
        std::fs::create_dir_all(r.path().join("real/lib/x86_64-linux-gnu")).unwrap();
        std::os::unix::fs::symlink("real", r.path().join("usr")).unwrap();
        assert_eq!(
            default_library_dir(Some(r.path())),
            PathBuf::from("/usr/lib64")
        );
        std::fs::remove_file(r.path().join("usr")).unwrap();
        // The last component a link to a real directory, or a file: not a real directory.
        std::fs::create_dir_all(r.path().join("usr/lib")).unwrap();
        for last in ["aarch64-linux-gnu", "x86_64-linux-gnu"] {
            std::os::unix::fs::symlink(
                "/real/lib/x86_64-linux-gnu",
                r.path().join("usr/lib").join(last),
            )
            .unwrap();
        }
        assert_eq!(
            default_library_dir(Some(r.path())),
            PathBuf::from("/usr/lib64")
        );
        for last in ["aarch64-linux-gnu", "x86_64-linux-gnu"] {
            std::fs::remove_file(r.path().join("usr/lib").join(last)).unwrap();
            std::fs::write(r.path().join("usr/lib").join(last), "").unwrap();
        }
        assert_eq!(
            default_library_dir(Some(r.path())),
            PathBuf::from("/usr/lib64")
        );
        for last in ["aarch64-linux-gnu", "x86_64-linux-gnu"] {
            std::fs::remove_file(r.path().join("usr/lib").join(last)).unwrap();
        }
        std::fs::create_dir_all(r.path().join("usr/lib/x86_64-linux-gnu")).unwrap();
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                default_library_dir(Some(r.path())),
                PathBuf::from("/usr/lib/x86_64-linux-gnu")
            );
        }
    }

    #[test]
    fn read_refuses_symlink_and_fifo() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("real.json"), "{}").unwrap();
        std::os::unix::fs::symlink("real.json", d.path().join("config.json")).unwrap();
        assert!(matches!(
            read_bytes(&d.path().join("config.json")),
            Err(SpecError::Open { .. })
        ));
        nix::unistd::mkfifo(
            &d.path().join("fifo.json"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let e = read_bytes(&d.path().join("fifo.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("FIFO"), "{e}");
    }

    /// `dmem.max` goes into `linux.resources.unified`, made where missing; every other key
    /// keeps its place and value; the same entries again change nothing.
    #[test]
    fn unified_entries_are_set_in_place() {
        let mut doc = json!({"ociVersion": "1.2.0", "x-unknown": 1, "linux": {"resources": {"unified": {"memory.high": "max", "dmem.max": "old"}, "pids": {"limit": 5}}}});
        let e = vec![(
            "dmem.max".to_string(),
            "drm/0000:03:00.0/vram0 1".to_string(),
        )];
        assert!(set_unified(&mut doc, &e).unwrap());
        assert!(!set_unified(&mut doc, &e).unwrap());
        let keys: Vec<&String> = doc["linux"]["resources"]["unified"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(keys, ["memory.high", "dmem.max"]);
        assert_eq!(
            doc["linux"]["resources"]["unified"]["dmem.max"],
            "drm/0000:03:00.0/vram0 1"
        );
        assert_eq!(doc["linux"]["resources"]["pids"]["limit"], 5);
        let mut bare = json!({"process": {}});
        assert!(set_unified(&mut bare, &e).unwrap());
        assert_eq!(
            bare["linux"],
            json!({"resources": {"unified": {"dmem.max": "drm/0000:03:00.0/vram0 1"}}})
        );
        let mut bad = json!({"linux": {"resources": {"unified": []}}});
        assert!(set_unified(&mut bad, &e)
            .unwrap_err()
            .contains("linux.resources.unified"));
        let devs = json!({"linux": {"devices": [{"path": "/dev/a", "type": "c", "major": 226, "minor": 0}, {"path": "/dev/b", "type": "b", "major": 8, "minor": 0}, {"path": "/dev/c", "type": "c"}]}});
        assert_eq!(char_device_numbers(&devs), ["226:0"]);
    }
}
