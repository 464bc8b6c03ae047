//! Reading, editing and writing the bundle's `config.json` as JSON, not as a typed `Spec`.
//!
//! A serde round trip through `oci_spec::runtime::Spec` drops keys it does not know and
//! reorders capability lists, so the document stays a `serde_json::Value` (key order kept);
//! typed `oci-spec` structs are used only to build the entries added here.
//! Ref: OCI runtime spec, config.md and config-linux.md (devices, resources.devices, mounts).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxDeviceBuilder, LinuxDeviceCgroupBuilder, LinuxDeviceType, MountBuilder,
};
use serde_json::{Map, Value};

use crate::atomic;
use crate::plan::{self, BindMount, DeviceNode, NodeKind, Plan};

/// Larger than any real spec (docker's are ~10 KB); a bigger file is refused, not parsed.
pub const MAX_SIZE: u64 = 64 << 20;

/// The name docker's `--gpus` hook has; its work is done in the spec instead.
pub const DOCKER_GPU_HOOK: &str = "nvidia-container-runtime-hook";

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
/// [`MAX_SIZE`].
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, SpecError> {
    let open_err = |source| SpecError::Open {
        path: path.into(),
        source,
    };
    // O_NOFOLLOW: a symlinked config.json is refused; O_NONBLOCK: a FIFO cannot hang us.
    let mut file = std::fs::OpenOptions::new()
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
    if meta.size() > MAX_SIZE {
        return Err(SpecError::NotAFile {
            path: path.into(),
            msg: format!("is {} bytes, over the {} byte limit", meta.size(), MAX_SIZE),
        });
    }
    let mut data = Vec::with_capacity(meta.size() as usize);
    file.read_to_end(&mut data).map_err(open_err)?;
    Ok(data)
}

/// Reads config.json: a regular file (not a symlink, FIFO or device), at most [`MAX_SIZE`],
/// holding a JSON object.
pub fn read(path: &Path) -> Result<Value, SpecError> {
    parse_file(path, &read_bytes(path)?)
}

/// Parses the bytes [`read_bytes`] got from `path`; errors name the file.
pub fn parse_file(path: &Path, data: &[u8]) -> Result<Value, SpecError> {
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

#[derive(Debug)]
pub enum ParseError {
    Json(serde_json::Error),
    Shape(String),
}

/// Parses spec bytes and checks the parts the shim reads have the right JSON types.
pub fn parse(data: &[u8]) -> Result<Value, ParseError> {
    let v: Value = serde_json::from_slice(data).map_err(ParseError::Json)?;
    check_shape(&v).map_err(ParseError::Shape)?;
    Ok(v)
}

fn check_shape(v: &Value) -> Result<(), String> {
    let obj = v.as_object().ok_or("the document is not a JSON object")?;
    let kind = |key: &str, want: fn(&Value) -> bool, what: &str| match obj_path(obj, key) {
        Some(x) if !want(x) => Err(format!("`{key}` must be {what}")),
        _ => Ok(()),
    };
    kind("process", Value::is_object, "an object")?;
    kind("process/env", Value::is_array, "an array of strings")?;
    kind("process/user", Value::is_object, "an object")?;
    kind("process/user/additionalGids", Value::is_array, "an array")?;
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

fn obj_path<'a>(obj: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('/');
    let mut cur = obj.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

/// The value of `name` in `process.env` as the container sees it: runc sets the entries in
/// order, so the last one wins (`docker run -e NVIDIA_VISIBLE_DEVICES=0 --gpus all` writes
/// both). Entries without `=` are skipped.
pub fn env<'a>(spec: &'a Value, name: &str) -> Option<&'a str> {
    spec.pointer("/process/env")?
        .as_array()?
        .iter()
        .rev()
        .filter_map(Value::as_str)
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

/// Docker sets `CAP_SYS_ADMIN` in the bounding set only for `--privileged` (and NVIDIA's
/// toolkit uses the same test).
pub fn is_privileged(spec: &Value) -> bool {
    spec.pointer("/process/capabilities/bounding")
        .and_then(Value::as_array)
        .is_some_and(|caps| caps.iter().any(|c| c == "CAP_SYS_ADMIN"))
}

/// Destinations of mounts in the spec (the volume-mount device list strategy reads them).
pub fn mount_destinations(spec: &Value) -> Vec<&str> {
    spec.get("mounts")
        .and_then(Value::as_array)
        .map(|m| {
            m.iter()
                .filter_map(|m| m.get("destination")?.as_str())
                .collect()
        })
        .unwrap_or_default()
}

pub fn annotations(spec: &Value) -> Vec<(&str, &str)> {
    spec.get("annotations")
        .and_then(Value::as_object)
        .map(|a| {
            a.iter()
                .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes docker's `--gpus` prestart hook; true when one was there.
pub fn remove_docker_gpu_hook(spec: &mut Value) -> bool {
    let Some(hooks) = spec.get_mut("hooks").and_then(Value::as_object_mut) else {
        return false;
    };
    let Some(prestart) = hooks.get_mut("prestart").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = prestart.len();
    prestart.retain(|h| {
        let path = h.get("path").and_then(Value::as_str).unwrap_or_default();
        Path::new(path)
            .file_name()
            .is_none_or(|n| n != DOCKER_GPU_HOOK)
    });
    let removed = prestart.len() != before;
    if prestart.is_empty() && removed {
        hooks.remove("prestart");
    }
    removed
}

/// The container's rootfs on the host: `root.path`, relative to the bundle when relative.
pub fn rootfs(spec: &Value, bundle: &Path) -> Option<PathBuf> {
    let p = Path::new(spec.pointer("/root/path")?.as_str()?);
    Some(if p.is_absolute() {
        p.to_path_buf()
    } else {
        bundle.join(p)
    })
}

/// Debian's and Ubuntu's library directory, searched by their glibc by default.
pub const MULTIARCH_LIBRARY_DIR: &str = if cfg!(target_arch = "aarch64") {
    "/usr/lib/aarch64-linux-gnu"
} else {
    "/usr/lib/x86_64-linux-gnu"
};

/// Where glibc in the image looks for libraries by default: the Debian multiarch directory
/// when the image has it as a real directory, else /usr/lib64 (RHEL family). Each component
/// is checked with lstat, so no symlink in the image is ever followed on the host.
pub fn default_library_dir(rootfs: Option<&Path>) -> PathBuf {
    let multiarch = MULTIARCH_LIBRARY_DIR.trim_start_matches('/');
    if let Some(root) = rootfs {
        let mut cur = root.to_path_buf();
        let real_dir = multiarch.split('/').all(|c| {
            cur.push(c);
            std::fs::symlink_metadata(&cur).is_ok_and(|m| m.file_type().is_dir())
        });
        if real_dir {
            return Path::new("/").join(multiarch);
        }
    }
    PathBuf::from("/usr/lib64")
}

/// Writes the plan into the spec. Entries already present are respected: nodes by path, cgroup
/// rules by (type, major, minor, access), mounts by destination, gids by value.
pub fn apply(spec: &mut Value, plan: &Plan) -> Result<(), String> {
    let root = spec
        .as_object_mut()
        .ok_or("the document is not a JSON object")?;
    if !plan.nodes.is_empty() {
        let linux = section(root, "linux", || Value::Object(Map::new()))
            .as_object_mut()
            .ok_or("`linux` must be an object")?;
        let devices = section(linux, "devices", || Value::Array(vec![]))
            .as_array_mut()
            .ok_or("`linux.devices` must be an array")?;
        for n in &plan.nodes {
            let path = n.path.to_string_lossy();
            if devices
                .iter()
                .any(|d| d.get("path").and_then(Value::as_str) == Some(&path))
            {
                continue;
            }
            devices.push(device_entry(n)?);
        }
        let resources = section(linux, "resources", || Value::Object(Map::new()))
            .as_object_mut()
            .ok_or("`linux.resources` must be an object")?;
        let rules = section(resources, "devices", || Value::Array(vec![]))
            .as_array_mut()
            .ok_or("`linux.resources.devices` must be an array")?;
        for n in &plan.nodes {
            let rule = rule_entry(n, "rwm")?;
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
    }
    if !plan.mounts.is_empty() {
        let mounts = section(root, "mounts", || Value::Array(vec![]))
            .as_array_mut()
            .ok_or("`mounts` must be an array")?;
        for m in &plan.mounts {
            let dest = m.destination.to_string_lossy();
            if mounts
                .iter()
                .any(|x| x.get("destination").and_then(Value::as_str) == Some(&dest))
            {
                continue;
            }
            let options: Vec<String> = plan::MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect();
            mounts.push(mount_entry(m, Some("bind"), &options)?);
        }
    }
    add_gids(root, &plan.additional_gids)
}

/// Adds groups to `process.user.additionalGids` (creating the sections), each once.
pub fn add_gids(root: &mut Map<String, Value>, add: &[u32]) -> Result<(), String> {
    if add.is_empty() {
        return Ok(());
    }
    let process = section(root, "process", || Value::Object(Map::new()))
        .as_object_mut()
        .ok_or("`process` must be an object")?;
    let user = section(process, "user", || serde_json::json!({"uid": 0, "gid": 0}))
        .as_object_mut()
        .ok_or("`process.user` must be an object")?;
    let gids = section(user, "additionalGids", || Value::Array(vec![]))
        .as_array_mut()
        .ok_or("`process.user.additionalGids` must be an array")?;
    for g in add {
        if !gids.iter().any(|x| x.as_u64() == Some(u64::from(*g))) {
            gids.push(Value::from(*g));
        }
    }
    Ok(())
}

/// The `linux.devices` entry for a node (shared with CDI's edits, so both paths write the same).
pub fn device_entry(n: &DeviceNode) -> Result<Value, String> {
    let dev = LinuxDeviceBuilder::default()
        .path(n.path.clone())
        .typ(device_type(n.kind))
        .major(n.major as i64)
        .minor(n.minor as i64)
        .file_mode(n.file_mode)
        .uid(n.uid)
        .gid(n.gid)
        .build()
        .map_err(|e| e.to_string())?;
    serde_json::to_value(dev).map_err(|e| e.to_string())
}

/// The `linux.resources.devices` allow rule for a node with the given cgroup access.
pub fn rule_entry(n: &DeviceNode, access: &str) -> Result<Value, String> {
    let rule = LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .typ(device_type(n.kind))
        .major(n.major as i64)
        .minor(n.minor as i64)
        .access(access)
        .build()
        .map_err(|e| e.to_string())?;
    serde_json::to_value(rule).map_err(|e| e.to_string())
}

/// A `mounts` entry; `typ` `None` leaves the type out (runc then goes by the options).
pub fn mount_entry(m: &BindMount, typ: Option<&str>, options: &[String]) -> Result<Value, String> {
    let mut b = MountBuilder::default()
        .destination(m.destination.clone())
        .source(m.source.clone())
        .options(options.to_vec());
    if let Some(t) = typ {
        b = b.typ(t);
    }
    let mount = b.build().map_err(|e| e.to_string())?;
    serde_json::to_value(mount).map_err(|e| e.to_string())
}

/// `obj[key]`, created with `empty()` when missing.
pub fn section<'a>(
    obj: &'a mut Map<String, Value>,
    key: &str,
    empty: fn() -> Value,
) -> &'a mut Value {
    obj.entry(key).or_insert_with(empty)
}

fn device_type(k: NodeKind) -> LinuxDeviceType {
    match k {
        NodeKind::Char => LinuxDeviceType::C,
        NodeKind::Block => LinuxDeviceType::B,
    }
}

/// Serializes and atomically replaces config.json (mode and owner kept).
pub fn write(path: &Path, spec: &Value) -> Result<(), SpecError> {
    write_bytes(path, &to_bytes(path, spec)?)
}

/// The bytes [`write`] would put in `path` (compact JSON, as engines write it).
pub fn to_bytes(path: &Path, spec: &Value) -> Result<Vec<u8>, SpecError> {
    serde_json::to_vec(spec).map_err(|e| SpecError::Write {
        path: path.into(),
        source: e.into(),
    })
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

    #[test]
    fn apply_adds_entries_and_keeps_unknown_fields_and_order() {
        let mut spec = json!({"ociVersion": "1.0.2", "zzz-future": {"x": [3, 1, 2]}, "process": {"env": ["A=1"], "capabilities": {"bounding": ["CAP_KILL", "CAP_CHOWN"]}}, "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "aaa": 1}});
        let before = spec.clone();
        apply(&mut spec, &plan()).unwrap();
        assert_eq!(spec["zzz-future"], before["zzz-future"]);
        assert_eq!(
            spec["process"]["capabilities"],
            before["process"]["capabilities"]
        );
        let keys: Vec<&String> = spec.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["ociVersion", "zzz-future", "process", "linux", "mounts"]
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
        assert_eq!(spec["process"]["user"]["additionalGids"], json!([44]));
    }

    #[test]
    fn apply_is_idempotent() {
        let mut once = json!({"linux": {}});
        apply(&mut once, &plan()).unwrap();
        let mut twice = once.clone();
        apply(&mut twice, &plan()).unwrap();
        assert_eq!(once, twice);
    }

    #[test]
    fn env_last_entry_wins_and_bad_entries_skip() {
        let spec = json!({"process": {"env": ["NOEQUALS", "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=all", 5]}});
        assert_eq!(env(&spec, "NVIDIA_VISIBLE_DEVICES"), Some("all"));
        assert_eq!(env(&spec, "NVIDIA_VISIBLE"), None);
    }

    #[test]
    fn shape_errors() {
        for (doc, want) in [
            ("[]", "not a JSON object"),
            ("{\"process\": 1}", "`process`"),
            ("{\"linux\": {\"devices\": {}}}", "`linux/devices`"),
        ] {
            match parse(doc.as_bytes()) {
                Err(ParseError::Shape(m)) => assert!(m.contains(want), "{m}"),
                other => panic!("{doc}: {other:?}"),
            }
        }
        assert!(matches!(parse(b""), Err(ParseError::Json(_))));
    }

    #[test]
    fn docker_hook_removed() {
        let mut spec = json!({"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}]}});
        assert!(remove_docker_gpu_hook(&mut spec));
        assert_eq!(spec, json!({"hooks": {}}));
        assert!(!remove_docker_gpu_hook(&mut spec));
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
            read(&d.path().join("config.json")),
            Err(SpecError::Open { .. })
        ));
        nix::unistd::mkfifo(
            &d.path().join("fifo.json"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let e = read(&d.path().join("fifo.json")).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
    }
}
