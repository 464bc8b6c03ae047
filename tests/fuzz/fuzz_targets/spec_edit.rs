//! The spec reader and editor on arbitrary config.json bytes: `spec::parse` (the document and
//! its `View`), `spec::apply` of a fixed plan, `spec::to_bytes`. Never a panic; the output is
//! valid JSON that keeps every input field (the arrays the editor owns only grow at their
//! end), a second apply changes nothing, an empty plan changes nothing, and the screen never
//! says "nothing asked for" about a spec whose view asks for the plan's variable. The check
//! of keys as runc's Go decoder reads them (`spec::golang::check`) never panics, and a spec
//! it accepts is still accepted once edited.
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

const PROFILE: &str = "visible-devices-env = [\"NVIDIA_VISIBLE_DEVICES\"]";

fuzz_target!(|data: &[u8]| {
    let Ok((mut doc, view)) = spec::parse(data) else {
        return;
    };
    if view.env("NVIDIA_VISIBLE_DEVICES").is_some()
        || view.docker_gpu_hook
        || view.annotations.iter().any(|(k, _)| k.starts_with("cdi.k8s.io/"))
    {
        assert_eq!(
            spec::screen::screen(data, [PROFILE]),
            spec::screen::Screen::Maybe,
            "the screen skipped a request"
        );
    }
    let input = doc.clone();
    if spec::apply(&mut doc, &plan()).is_err() {
        return;
    }
    let out = spec::to_bytes(&doc);
    if spec::golang::check(data).is_ok() {
        assert_eq!(spec::golang::check(&out), Ok(()), "the edit made an ambiguous key");
    }
    let back: Value = serde_json::from_slice(&out).expect("output is valid JSON");
    assert!(kept(&input, &back, ""), "an input field was lost or changed");
    let (mut again, _) = spec::parse(&out).expect("output passes the shape check");
    spec::apply(&mut again, &plan()).expect("second apply");
    assert_eq!(again, back, "second apply changed the spec");
    let mut unchanged = input.clone();
    spec::apply(&mut unchanged, &Plan::default()).expect("empty plan");
    assert_eq!(unchanged, input, "an empty edit changed the document");
});
