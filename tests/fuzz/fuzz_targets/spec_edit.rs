//! The spec editor on arbitrary config.json bytes: `spec::Document::parse`, `spec::apply` of a
//! fixed plan, `to_bytes` (the splice). Never a panic; the output is valid JSON that keeps
//! every input field (the arrays the editor owns only grow at their end), a second apply
//! writes the same bytes, and a document with nothing to add is written back unchanged.
//!
//! The parse checks JSON syntax for the whole document but decodes only what the shim reads,
//! so a document serde_json's `Value` refuses elsewhere (a lone surrogate escape, a number out
//! of f64's range) may parse: runc (Go) takes such a document too. Those inputs are only
//! required not to panic.
#![no_main]

use accel_container_runtime::plan::{BindMount, DeviceNode, NodeKind, Plan};
use accel_container_runtime::spec;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const OWNED: [&str; 4] = [
    "/linux/devices",
    "/linux/resources/devices",
    "/mounts",
    "/process/user/additionalGids",
];

fn plan() -> Plan {
    let node = |path: &str, minor, gid| DeviceNode {
        path: path.into(),
        host_path: path.into(),
        kind: NodeKind::Char,
        major: 195,
        minor,
        file_mode: 0o660,
        uid: 0,
        gid,
    };
    Plan {
        nodes: vec![node("/dev/nvidia0", 0, 44), node("/dev/nvidiactl", 255, 44)],
        mounts: vec![BindMount {
            source: "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14".into(),
            destination: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        }],
        additional_gids: vec![44],
    }
}

fn kept(old: &Value, new: &Value, at: &str) -> bool {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|nv| kept(v, nv, &format!("{at}/{k}")))),
        (Value::Array(a), Value::Array(b)) if OWNED.contains(&at) => b.starts_with(a),
        _ => old == new,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(mut doc) = spec::Document::parse(data) else {
        return;
    };
    let applied = spec::apply(&mut doc, &plan());
    let out = doc.to_bytes();
    let Ok(input) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if applied.is_err() {
        return;
    }
    let back: Value = serde_json::from_slice(&out).expect("output is valid JSON");
    assert!(kept(&input, &back, ""), "an input field was lost or changed");
    let mut again = spec::Document::parse(&out).expect("output passes the shape check");
    spec::apply(&mut again, &plan()).expect("second apply");
    assert_eq!(again.to_bytes(), out, "second apply changed the spec");
    let mut unchanged = spec::Document::parse(data).expect("parsed before");
    spec::apply(&mut unchanged, &Plan::default()).expect("empty plan");
    assert_eq!(unchanged.to_bytes(), data, "an empty edit changed the bytes");
});
