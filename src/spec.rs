//! Reading, editing and writing the bundle's `config.json` as JSON, not as a typed `Spec`.
//!
//! A serde round trip through `oci_spec::runtime::Spec` drops keys it does not know and
//! reorders capability lists, and even a whole-document `serde_json::Value` round trip costs
//! most of a create (parse, serialize and drop of ~10 KB that the shim never reads:
//! capabilities, seccomp, masked paths). So the document is a [`Document`] borrowing the
//! file's bytes: read in place, the sections edited spliced back, everything else copied
//! byte for byte. This module has the file handling and the editor's rules ([`apply`]);
//! the entries added are written as JSON text by [`Entry`], scanned for in the arrays'
//! bytes by `checked`.
//! Ref: OCI runtime spec, config.md and config-linux.md (devices, resources.devices, mounts).

mod checked;
mod entry;

mod document;
pub mod scan;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::atomic;
use crate::plan::{self, BindMount, DeviceNode, Plan};
pub use document::{Document, ParseError};
pub use entry::Entry;

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
    let file = crate::read::open(
        path,
        crate::read::OFlags::NOFOLLOW | crate::read::OFlags::NONBLOCK,
    )
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
    crate::read::whole(&file, meta.size(), MAX_SIZE).map_err(open_err)
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
/// rules by value, mounts by destination, gids by value.
pub fn apply(doc: &mut Document<'_>, plan: &Plan) -> Result<(), String> {
    for n in &plan.nodes {
        doc.append_unique(&["linux", "devices"], Entry::device(n)?)?;
    }
    for n in &plan.nodes {
        doc.append_unique(&["linux", "resources", "devices"], Entry::rule(n, "rwm"))?;
    }
    for m in &plan.mounts {
        let entry = Entry::mount(m, Some("bind"), &plan::MOUNT_OPTIONS)?;
        doc.append_unique(&["mounts"], entry)?;
    }
    add_gids(doc, &plan.additional_gids)
}

/// Adds groups to `process.user.additionalGids` (creating the sections), each once.
pub fn add_gids(doc: &mut Document<'_>, add: &[u32]) -> Result<(), String> {
    for g in add {
        doc.append_unique(&["process", "user", "additionalGids"], Entry::gid(*g))?;
    }
    Ok(())
}

/// The `linux.devices` entry for a node as a value ([`Entry::device`]'s).
pub fn device_entry(n: &DeviceNode) -> Result<Value, String> {
    Entry::device(n)?.to_value()
}

/// The `linux.resources.devices` allow rule for a node as a value ([`Entry::rule`]'s).
pub fn rule_entry(n: &DeviceNode, access: &str) -> Result<Value, String> {
    Entry::rule(n, access).to_value()
}

/// A `mounts` entry as a value ([`Entry::mount`]'s).
pub fn mount_entry(m: &BindMount, typ: Option<&str>, options: &[String]) -> Result<Value, String> {
    Entry::mount(m, typ, options)?.to_value()
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
    use crate::plan::NodeKind;
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

    /// Parses `input`, runs `edit`, and returns the spliced bytes (checked to be JSON).
    fn edited(input: &str, edit: impl FnOnce(&mut Document<'_>)) -> String {
        let mut doc = Document::parse(input.as_bytes()).unwrap();
        edit(&mut doc);
        let bytes = doc.to_bytes();
        // Allocated once, at the size it was computed to have.
        assert_eq!(bytes.capacity(), bytes.len());
        let out = String::from_utf8(bytes).unwrap();
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
        out
    }

    fn applied(input: &str) -> String {
        edited(input, |d| apply(d, &plan()).unwrap())
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
    fn apply_is_idempotent_and_an_unchanged_document_is_the_input() {
        for input in [
            "{\"linux\": {}}",
            "{}",
            " { } ",
            "{\n  \"linux\": {\n    \"devices\": [ ]\n  },\n  \"mounts\": []\n}\n",
        ] {
            let once = applied(input);
            assert_eq!(applied(&once), once, "{input}");
        }
        // Nothing edited, or edited to the same value: the input byte for byte.
        let pretty = "{\n  \"linux\" : {\"devices\": [\n   {\"path\": \"/dev/nvidia1\"},\n   {\"path\": \"/dev/nvidiactl\"}\n  ], \"resources\": {\"devices\": [{\"allow\":true,\"type\":\"c\",\"major\":195,\"minor\":1,\"access\":\"rwm\"}, {\"allow\":true,\"type\":\"c\",\"major\":195,\"minor\":255,\"access\":\"rwm\"}]}},\n  \"mounts\": [{\"destination\": \"/usr/lib64/libcuda.so.1\"}],\n \"process\":{\"user\":{\"additionalGids\":[44]}}\n}";
        assert_eq!(applied(pretty), pretty);
        assert_eq!(edited(pretty, |_| {}), pretty);
    }

    #[test]
    fn splice_keeps_bytes_outside_edited_spans() {
        let input = "{\n  \"ociVersion\" : \"1.0.2\",\n  \"hostname\": \"a\\u003cb\",\n  \"mounts\": [\n    {\"destination\": \"/proc\"}\n  ],\n  \"linux\": {\n    \"seccomp\": {\"x\": 1.50}\n  }\n}\n";
        let out = applied(input);
        assert!(
            // Appended to: the old elements are as written, the new ones follow the last.
            out.starts_with("{\n  \"ociVersion\" : \"1.0.2\",\n  \"hostname\": \"a\\u003cb\",\n  \"mounts\": [\n    {\"destination\": \"/proc\"},{\"destination\":\"/usr/lib64/libcuda.so.1\""),
            "{out}"
        );
        assert!(
            out.contains("\n  \"linux\": {\n    \"seccomp\": {\"x\": 1.50},\"devices\":[{\"path\":\"/dev/nvidia1\""),
            "{out}"
        );
        assert!(
            out.ends_with("]}}\n}\n")
                && out.contains(
                    ",\"process\":{\"user\":{\"uid\":0,\"gid\":0,\"additionalGids\":[44]}}"
                ),
            "{out}"
        );
    }

    #[test]
    fn splice_creates_missing_sections_at_each_level() {
        let cases = [
            ("{}", "{\"linux\":{\"devices\":[1],\"resources\":{\"devices\":[2]}},\"mounts\":[3],\"process\":{\"user\":{\"uid\":0,\"gid\":0,\"additionalGids\":[44]}}}"),
            ("{\"linux\":{}}", "{\"linux\":{\"devices\":[1],\"resources\":{\"devices\":[2]}},\"mounts\":[3],\"process\":{\"user\":{\"uid\":0,\"gid\":0,\"additionalGids\":[44]}}}"),
            ("{\"linux\":{\"resources\":{}},\"process\":{}}", "{\"linux\":{\"resources\":{\"devices\":[2]},\"devices\":[1]},\"process\":{\"user\":{\"uid\":0,\"gid\":0,\"additionalGids\":[44]}},\"mounts\":[3]}"),
            ("{\"linux\":{\"resources\":{\"devices\":[]}},\"process\":{\"user\":{\"uid\":5}},\"mounts\":[]}", "{\"linux\":{\"resources\":{\"devices\":[2]},\"devices\":[1]},\"process\":{\"user\":{\"uid\":5,\"additionalGids\":[44]}},\"mounts\":[3]}"),
        ];
        for (input, want) in cases {
            let out = edited(input, |d| {
                d.array_mut(&["linux", "devices"]).unwrap().push(json!(1));
                d.array_mut(&["linux", "resources", "devices"])
                    .unwrap()
                    .push(json!(2));
                d.array_mut(&["mounts"]).unwrap().push(json!(3));
                add_gids(d, &[44]).unwrap();
            });
            assert_eq!(out, want, "{input}");
        }
    }

    #[test]
    fn apply_inserts_missing_arrays_into_parents_in_the_bytes() {
        let out = applied(r#"{"linux":{"x":1},"process":{"user":{}}}"#);
        assert!(
            out.starts_with(r#"{"linux":{"x":1,"devices":[{"path":"/dev/nvidia1","#),
            "{out}"
        );
        assert!(
            out.contains(r#"}],"resources":{"devices":[{"allow":true,"#),
            "{out}"
        );
        assert!(
            out.contains(r#"}]}},"process":{"user":{"additionalGids":[44]}},"mounts":[{"#),
            "{out}"
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(
            v["linux"]["resources"]["devices"].as_array().unwrap().len(),
            2
        );
        assert_eq!(applied(&out), out);
    }

    #[test]
    fn a_rule_already_there_in_another_key_order_is_not_added_again() {
        let input = "{\"linux\": {\"resources\": {\"devices\": [\n  {\"access\": \"rwm\", \"minor\": 1, \"major\": 195,\n   \"type\": \"c\", \"allow\": true},\n  {\"allow\": true, \"type\": \"c\", \"major\": 195, \"minor\": 255, \"access\": \"rw\"}\n]}}}";
        let out = applied(input);
        let v: Value = serde_json::from_str(&out).unwrap();
        let rules = v["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules.len(), 3, "{out}");
        assert_eq!(rules[2]["minor"], 255);
        assert_eq!(rules[2]["access"], "rwm");
    }

    #[test]
    fn duplicate_keys_last_one_counts_for_reads_and_edits() {
        let input = r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"linux":{"devices":[{"path":"/dev/old"}]},"process":{"env":["NVIDIA_VISIBLE_DEVICES=1"],"env":["NVIDIA_VISIBLE_DEVICES=2"]},"linux":{"resources":{}}}"#;
        let doc = Document::parse(input.as_bytes()).unwrap();
        assert_eq!(doc.env("NVIDIA_VISIBLE_DEVICES"), Some("2"));
        let out = applied(input);
        // The earlier occurrences are left as they were; serde_json (like runc) reads the last.
        assert!(out.starts_with(r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"linux":{"devices":[{"path":"/dev/old"}]},"process":{"env":["NVIDIA_VISIBLE_DEVICES=1"],"env":["NVIDIA_VISIBLE_DEVICES=2"],"user":"#), "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["process"]["env"], json!(["NVIDIA_VISIBLE_DEVICES=2"]));
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(v["linux"]["devices"][0]["path"], "/dev/nvidia1");
        assert_eq!(
            v["linux"]["resources"]["devices"].as_array().unwrap().len(),
            2
        );
        // An earlier object of the same name is not where the edit goes; an empty one is.
        let out = applied(r#"{"linux" :{"devices":[{"path":"/dev/x"}]},"linux": { } }"#);
        assert!(out.starts_with(r#"{"linux" :{"devices":[{"path":"/dev/x"}]},"linux": {"devices":[{"path":"/dev/nvidia1","#), "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["linux"]["devices"].as_array().unwrap().len(), 2);
        // A mount with its destination written twice is at the last one.
        let count = |input: &str| {
            let v: Value = serde_json::from_str(&applied(input)).unwrap();
            v["mounts"].as_array().unwrap().len()
        };
        let lib = "/usr/lib64/libcuda.so.1";
        assert_eq!(
            count(&format!(
                r#"{{"mounts":[[1],"x",{{"destination":"{lib}","destination":"/o"}}]}}"#
            )),
            4
        );
        assert_eq!(
            count(&format!(
                r#"{{"mounts":[[1],"x",{{"destination":"/o","destination":"{lib}"}}]}}"#
            )),
            3
        );
        // The shape check reads the last occurrence too.
        assert!(Document::parse(br#"{"linux":[],"linux":{}}"#).is_ok());
        assert!(matches!(
            Document::parse(br#"{"linux":{},"linux":[]}"#),
            Err(ParseError::Shape(m)) if m == "`linux` must be an object"
        ));
        // Annotations: the last value of a repeated key, once.
        let doc = Document::parse(br#"{"annotations":{"a":"1","b":2,"a":"3"}}"#).unwrap();
        assert_eq!(doc.annotations(), [("a".into(), "3".into())]);
        let doc = Document::parse(br#"{"annotations":{"x":"1","a":"1","y":"2","a":"3"}}"#).unwrap();
        let keys: Vec<&str> = doc.annotations().iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(keys, ["x", "y", "a"]);
    }

    #[test]
    fn escaped_keys_are_the_same_keys() {
        let input = r#"{"\u006cinux":{"d\u0065vices":[{"path":"/dev/nvidia1"}]},"pro\u0063ess":{"env":["NVIDIA_VISIBLE_DEVICES=\u0030"]}}"#;
        let doc = Document::parse(input.as_bytes()).unwrap();
        assert_eq!(doc.env("NVIDIA_VISIBLE_DEVICES"), Some("0"));
        let out = applied(input);
        let v: Value = serde_json::from_str(&out).unwrap();
        let linux = v["linux"].as_object().unwrap();
        assert_eq!(linux.keys().collect::<Vec<_>>(), ["devices", "resources"]);
        assert_eq!(linux["devices"].as_array().unwrap().len(), 2);
        assert_eq!(v.as_object().unwrap().len(), 3, "{out}");
        assert!(
            out.starts_with(r#"{"\u006cinux":{"d\u0065vices":[{"path":"/dev/nvidia1"},"#),
            "{out}"
        );
        assert!(matches!(
            Document::parse(br#"{"\u006cinux":[]}"#),
            Err(ParseError::Shape(m)) if m == "`linux` must be an object"
        ));
    }

    #[test]
    fn elements_written_with_escapes_are_the_same_elements() {
        // The mount, the node, the gid and the /dev/nvidiactl rule are there, escaped; the
        // /dev/nvidia1 rule is not (a minor of 1.0 is not the number 1 to serde_json or Go).
        let input = r#"{"mounts":[{"d\u0065stination":"\/usr\/lib64\/libcuda.so.1"}],"linux":{"devices":[{"path":"\u002fdev/nvidia1"}],"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":1.0,"access":"rwm"},{"access":"rw\u006d","minor":255,"allow":true,"type":"\u0063","major":195}]}},"process":{"user":{"additionalGids":[4.4e1,44]}}}"#;
        let out = applied(input);
        let v: Value = serde_json::from_str(&out).unwrap();
        let len = |p: &str| v.pointer(p).and_then(Value::as_array).map(Vec::len);
        assert_eq!(len("/mounts"), Some(1), "{out}");
        assert_eq!(len("/linux/devices"), Some(2), "{out}");
        assert_eq!(len("/linux/resources/devices"), Some(3), "{out}");
        assert_eq!(len("/process/user/additionalGids"), Some(2), "{out}");
        assert_eq!(v["linux"]["resources"]["devices"][2]["minor"], 1);
        assert_eq!(applied(&out), out);
        // The last of a repeated member is the one compared, escaped or not.
        let out = applied(
            r#"{"mounts":[{"destination":"/usr/lib64/libcuda.so.1","destin\u0061tion":"/o"}]}"#,
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["mounts"].as_array().unwrap().len(), 2, "{out}");
    }

    #[test]
    fn spans_end_at_the_value_not_at_brackets_in_strings() {
        let input = r#"{"mounts":[{"destination":"/a]},{\"x","options":["}]"]}],"linux":{"devices":[],"x":"]}"},"z":"{["}"#;
        let out = applied(input);
        assert!(out.starts_with(r#"{"mounts":[{"destination":"/a]},{\"x","options":["}]"]},{"destination":"/usr/lib64/libcuda.so.1""#), "{out}");
        assert!(
            out.contains(r#"],"x":"]}","resources":{"devices":[{"allow":true"#),
            "{out}"
        );
        assert!(out.contains(r#"},"z":"{[","process":{"#), "{out}");
        // Replaced whole (as CDI's edits do): the span is the whole array, strings and all.
        let out = edited(input, |d| d.array_mut(&["mounts"]).unwrap().push(json!(1)));
        let want = input.replacen(r#""}]"]}]"#, r#""}]"]},1]"#, 1);
        assert_eq!(out, want);
    }

    #[test]
    fn appended_then_edited_whole_keeps_old_and_new_elements_in_order() {
        let input = "{\"mounts\": [ {\"destination\": \"/a\"} ]}";
        let out = edited(input, |d| {
            let add = |dest: &str| json!({"destination": dest});
            let by_dest = |dest: &str| Entry::by_member("destination", &add(dest)).unwrap();
            assert!(d.append_unique(&["mounts"], by_dest("/b")).unwrap());
            assert!(!d.append_unique(&["mounts"], by_dest("/a")).unwrap());
            assert!(!d.append_unique(&["mounts"], by_dest("/b")).unwrap());
            assert_eq!(d.mount_destinations(), ["/a", "/b"]);
            let all = d.array_mut(&["mounts"]).unwrap();
            assert_eq!(all.len(), 2);
            all.push(add("/c"));
            assert!(!d.append_unique(&["mounts"], by_dest("/c")).unwrap());
            assert_eq!(d.mount_destinations(), ["/a", "/b", "/c"]);
        });
        assert_eq!(
            out,
            r#"{"mounts": [{"destination":"/a"},{"destination":"/b"},{"destination":"/c"}]}"#
        );
        // Appended only: the old elements as written.
        let out = edited(input, |d| {
            d.append_unique(&["mounts"], Entry::by_value(&json!(2)))
                .unwrap();
            d.append_unique(&["mounts"], Entry::by_value(&json!(3)))
                .unwrap();
        });
        assert_eq!(out, "{\"mounts\": [ {\"destination\": \"/a\"},2,3 ]}");
    }

    #[test]
    fn env_last_entry_wins_and_bad_entries_skip() {
        let spec = br#"{"process": {"env": ["NOEQUALS", "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=all", 5, {"NVIDIA_VISIBLE_DEVICES": 2}]}}"#;
        let mut doc = Document::parse(spec).unwrap();
        assert_eq!(doc.env("NVIDIA_VISIBLE_DEVICES"), Some("all"));
        assert_eq!(doc.env("NVIDIA_VISIBLE"), None);
        // Reads see edits.
        doc.array_mut(&["process", "env"])
            .unwrap()
            .push(json!("NVIDIA_VISIBLE_DEVICES=3"));
        assert_eq!(doc.env("NVIDIA_VISIBLE_DEVICES"), Some("3"));
    }

    #[test]
    fn reads_of_capabilities_mounts_root() {
        let doc = Document::parse(
            br#"{"process":{"capabilities":{"bounding":["CAP_KILL","CAP_SYS_\u0041DMIN"]}},"root":{"path":"rootfs"},"mounts":[{"destination":"/a"},{"source":"/b"},3,{"destination":"/c","destination":"/d"}]}"#,
        )
        .unwrap();
        assert!(doc.is_privileged());
        assert_eq!(
            doc.rootfs(Path::new("/b")),
            Some(PathBuf::from("/b/rootfs"))
        );
        assert_eq!(doc.mount_destinations(), ["/a", "/d"]);
        let plain = Document::parse(
            br#"{"process":{"capabilities":{"bounding":["CAP_KILL"]}},"root":{"path":"/r"}}"#,
        )
        .unwrap();
        assert!(!plain.is_privileged());
        assert_eq!(plain.rootfs(Path::new("/b")), Some(PathBuf::from("/r")));
    }

    #[test]
    fn shape_errors() {
        for (doc, want) in [
            ("[]", "not a JSON object"),
            ("42", "not a JSON object"),
            ("{\"process\": 1}", "`process`"),
            ("{\"linux\": {\"devices\": {}}}", "`linux/devices`"),
            ("{\"root\": {\"path\": 1}}", "`root/path` must be a string"),
        ] {
            match Document::parse(doc.as_bytes()) {
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
        ] {
            assert!(
                matches!(Document::parse(bad), Err(ParseError::Json(_))),
                "{bad:?}"
            );
        }
        // What the shim reads must decode.
        assert!(matches!(
            Document::parse(br#"{"process":{"env":["A=\ud800"]}}"#),
            Err(ParseError::Json(_))
        ));
    }

    #[test]
    fn docker_hook_removed() {
        let input = r#"{"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}]}}"#;
        let mut doc = Document::parse(input.as_bytes()).unwrap();
        assert!(doc.remove_docker_gpu_hook().unwrap());
        assert!(!doc.remove_docker_gpu_hook().unwrap());
        assert_eq!(
            String::from_utf8(doc.to_bytes()).unwrap(),
            r#"{"hooks": {}}"#
        );
        let other = r#"{"hooks": {"prestart": [{"path": "/usr/bin/libnetwork-setkey"}]}}"#;
        let mut doc = Document::parse(other.as_bytes()).unwrap();
        assert!(!doc.remove_docker_gpu_hook().unwrap());
        assert_eq!(doc.to_bytes(), other.as_bytes());
        // A sibling that does not decode: refused, never left in place.
        let bad = r#"{"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "env": ["X=\ud800"]}]}}"#;
        let mut doc = Document::parse(bad.as_bytes()).unwrap();
        let e = doc.remove_docker_gpu_hook().unwrap_err();
        assert!(e.contains("cannot remove docker's --gpus hook"), "{e}");
        // Escaped, it is still the hook.
        let escaped =
            r#"{"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hoo\u006b"}]}}"#;
        let mut doc = Document::parse(escaped.as_bytes()).unwrap();
        assert!(doc.remove_docker_gpu_hook().unwrap());
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
}
