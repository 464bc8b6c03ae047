//! config.json files as runc, docker and containerd really write them (captured from runc 1.1
//! `runc spec`, docker 20.10 and containerd 1.6 `ctr run` on this project's CI distro), plus one
//! with invented future fields: after the shim's edit, the document is the input plus exactly
//! the injected entries, with every other key, value and key order intact, and the bytes
//! outside the edited sections exactly as they were.
//!
//! `docker-20.10-run-gpus.json` is `docker run -d --gpus all -e NVIDIA_VISIBLE_DEVICES=0
//! busybox sleep 1000` on docker 20.10.24 (dockerd with `--bridge=none`, a clean environment and
//! a stand-in `nvidia-container-runtime-hook` in its PATH, so docker wrote its GPU hook): the
//! real shape of the hook the shim replaces, and of the variable docker writes twice.

use std::collections::HashMap;
use std::path::PathBuf;

use accel_container_runtime::plan::{BindMount, DeviceNode, NodeKind, Plan};
use accel_container_runtime::spec;
use serde_json::value::RawValue;
use serde_json::Value;

const FIXTURES: &[&str] = &[
    "runc-1.1-spec.json",
    "docker-20.10-run.json",
    "containerd-1.6-ctr-run.json",
    "docker-20.10-run-gpus.json",
    "future-fields.json",
];

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/specs")
            .join(name),
    )
    .unwrap()
}

fn plan() -> Plan {
    let node = |path: &str, minor| DeviceNode {
        path: path.into(),
        host_path: path.into(),
        kind: NodeKind::Char,
        major: 195,
        minor,
        file_mode: 0o660,
        uid: 0,
        gid: 44,
    };
    Plan {
        nodes: vec![node("/dev/nvidia1", 1), node("/dev/nvidiactl", 255)],
        mounts: vec![
            BindMount {
                source: "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14".into(),
                destination: "/usr/lib64/libcuda.so.1".into(),
            },
            BindMount {
                source: "/run/nvidia/driver/usr/bin/nvidia-smi".into(),
                destination: "/usr/bin/nvidia-smi".into(),
            },
        ],
        additional_gids: vec![44],
    }
}

/// Takes the plan's entries back out of `edited`, dropping sections the input did not have.
fn strip(edited: &mut Value, input: &Value, plan: &Plan) {
    let paths: Vec<String> = plan
        .nodes
        .iter()
        .map(|n| n.path.to_string_lossy().into_owned())
        .collect();
    let dests: Vec<String> = plan
        .mounts
        .iter()
        .map(|m| m.destination.to_string_lossy().into_owned())
        .collect();
    let remove = |v: &mut Value, pointer: &str, keep: &dyn Fn(&Value) -> bool| {
        if let Some(arr) = v.pointer_mut(pointer).and_then(Value::as_array_mut) {
            arr.retain(|e| keep(e));
        }
    };
    remove(edited, "/linux/devices", &|d| {
        !paths.iter().any(|p| d["path"] == *p.as_str())
    });
    remove(edited, "/linux/resources/devices", &|r| {
        !(r["allow"] == true && r["major"] == 195)
    });
    remove(edited, "/mounts", &|m| {
        !dests.iter().any(|d| m["destination"] == *d.as_str())
    });
    remove(edited, "/process/user/additionalGids", &|g| *g != 44);
    for (parent, key) in [
        ("/linux", "devices"),
        ("/linux", "resources"),
        ("/linux/resources", "devices"),
        ("/process/user", "additionalGids"),
    ] {
        let had = input.pointer(&format!("{parent}/{key}")).is_some();
        if !had {
            if let Some(obj) = edited.pointer_mut(parent).and_then(Value::as_object_mut) {
                obj.remove(key);
            }
        }
    }
}

/// The document `spec::apply` of the plan makes of `bytes`, as written to disk.
fn applied(bytes: &[u8]) -> Vec<u8> {
    let mut doc = spec::Document::parse(bytes).unwrap_or_else(|e| panic!("{e:?}"));
    spec::apply(&mut doc, &plan()).unwrap();
    doc.to_bytes()
}

#[test]
fn edit_is_input_plus_exactly_the_injected_entries() {
    for name in FIXTURES {
        let bytes = fixture(name);
        let input: Value = serde_json::from_slice(&bytes).unwrap();
        let written = applied(&bytes);
        let mut reread: Value = serde_json::from_slice(&written).unwrap();

        // Every injected entry is there, exactly once.
        let devs = reread["linux"]["devices"].as_array().unwrap();
        assert_eq!(
            devs.iter().filter(|d| d["path"] == "/dev/nvidia1").count(),
            1,
            "{name}"
        );
        let mounts = reread["mounts"].as_array().unwrap();
        assert_eq!(
            mounts
                .iter()
                .filter(|m| m["destination"] == "/usr/lib64/libcuda.so.1")
                .count(),
            1,
            "{name}"
        );
        assert!(
            reread["process"]["user"]["additionalGids"]
                .as_array()
                .unwrap()
                .contains(&Value::from(44)),
            "{name}"
        );

        strip(&mut reread, &input, &plan());
        // Same values, and the same key order everywhere (compare the serialized text).
        assert_eq!(
            reread, input,
            "{name}: something besides the injected entries changed"
        );
        assert_eq!(
            serde_json::to_string(&reread).unwrap(),
            serde_json::to_string(&input).unwrap(),
            "{name}: key order changed"
        );
        // Every section the editor does not own is the same bytes (whitespace, escapes,
        // number spellings), at the top level and inside the sections it edits.
        for parent in [&[][..], &["linux"], &["process"], &["linux", "resources"]] {
            let before = raw_members(&bytes, parent);
            let after = raw_members(&written, parent);
            for (key, raw) in &before {
                if ["linux", "mounts", "process", "devices", "resources", "user"]
                    .contains(&key.as_str())
                {
                    continue;
                }
                assert_eq!(after.get(key), Some(raw), "{name}: {parent:?} {key}");
            }
        }
    }
}

/// The members of the object at `path` in `bytes`, each value's bytes as written.
fn raw_members(bytes: &[u8], path: &[&str]) -> HashMap<String, String> {
    let mut raw: &RawValue = serde_json::from_slice(bytes).unwrap();
    for key in path {
        let m: HashMap<String, &RawValue> = serde_json::from_str(raw.get()).unwrap();
        match m.get(*key) {
            Some(r) => raw = r,
            None => return HashMap::new(),
        }
    }
    let m: HashMap<String, &RawValue> = serde_json::from_str(raw.get()).unwrap();
    m.into_iter()
        .map(|(k, v)| (k, v.get().to_string()))
        .collect()
}

#[test]
fn second_edit_adds_nothing() {
    for name in FIXTURES {
        let once = applied(&fixture(name));
        assert_ne!(once, fixture(name), "{name}");
        let twice = applied(&once);
        // Not even rewritten: the create then leaves the file alone.
        assert_eq!(
            String::from_utf8(once).unwrap(),
            String::from_utf8(twice).unwrap(),
            "{name}"
        );
    }
}

/// Why the shim never writes a re-serialized `oci_spec::runtime::Spec`: the round trip loses
/// what it does not model. If this ever fails, oci-spec changed; the rule stays regardless.
#[test]
fn oci_spec_round_trip_loses_unknown_fields() {
    let bytes = fixture("future-fields.json");
    let typed: oci_spec::runtime::Spec = serde_json::from_slice(&bytes).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert!(
        back.get("org.example.future").is_none(),
        "oci-spec kept an unknown top-level key"
    );
    let ours = spec::Document::parse(&bytes).unwrap().to_bytes();
    assert_eq!(ours, bytes);
}

/// docker's `--gpus` hook, as docker 20.10 really writes it, is removed and nothing else is;
/// other prestart hooks (libnetwork's) are kept.
#[test]
fn docker_gpu_hook_is_removed_and_nothing_else() {
    let bytes = fixture("docker-20.10-run-gpus.json");
    let input: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        input["hooks"]["prestart"][0]["args"][0],
        "nvidia-container-runtime-hook"
    );
    let mut doc = spec::Document::parse(&bytes).unwrap();
    // docker appends `NVIDIA_VISIBLE_DEVICES=all` after the user's `-e`; runc applies the
    // entries in order, so the container sees `all`.
    assert_eq!(doc.env("NVIDIA_VISIBLE_DEVICES"), Some("all"));
    assert!(doc.remove_docker_gpu_hook().unwrap());
    let edited: Value = serde_json::from_slice(&doc.to_bytes()).unwrap();
    assert_eq!(edited["hooks"], serde_json::json!({}));
    let mut expected = input.clone();
    expected["hooks"] = serde_json::json!({});
    assert_eq!(
        serde_json::to_string(&edited).unwrap(),
        serde_json::to_string(&expected).unwrap()
    );

    let plain = fixture("docker-20.10-run.json");
    let mut doc = spec::Document::parse(&plain).unwrap();
    assert!(!doc.remove_docker_gpu_hook().unwrap());
    assert_eq!(
        doc.to_bytes(),
        plain,
        "libnetwork's prestart hook must stay"
    );
}
