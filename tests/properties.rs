//! Properties of the spec edit and of device selection (proptest):
//! - editing is idempotent: a second apply of the written document writes the same bytes;
//! - an edit never removes or alters a field it does not own: arbitrary JSON merged into the
//!   captured specs (written compact or pretty) survives, and only the owned arrays grow (by
//!   appending); the written bytes are valid JSON;
//! - the set of injected nodes equals the set requested, for random subsets named by index,
//!   UUID or PCI bus id, on a simulated driver root with real device nodes (mknod: root).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;

use accel_container_runtime::config::Config;
use accel_container_runtime::discovery::{self, Device};
use accel_container_runtime::facts;
use accel_container_runtime::plan::{self, BindMount, DeviceNode, NodeKind, Plan};
use accel_container_runtime::profile::Profile;
use accel_container_runtime::request::{self, Request};
use accel_container_runtime::spec;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const FIXTURES: [&str; 4] = [
    include_str!("fixtures/specs/runc-1.1-spec.json"),
    include_str!("fixtures/specs/docker-20.10-run.json"),
    include_str!("fixtures/specs/containerd-1.6-ctr-run.json"),
    include_str!("fixtures/specs/future-fields.json"),
];

/// Arrays the editor appends to; everything else it must leave exactly as it was.
const OWNED_ARRAYS: [&str; 4] = [
    "/linux/devices",
    "/linux/resources/devices",
    "/mounts",
    "/process/user/additionalGids",
];
/// Keys the editor may create where they are missing (parent pointer, key).
const CREATABLE: [(&str, &str); 10] = [
    ("", "linux"),
    ("", "mounts"),
    ("", "process"),
    ("/linux", "devices"),
    ("/linux", "resources"),
    ("/linux/resources", "devices"),
    ("/process", "user"),
    ("/process/user", "additionalGids"),
    ("/process/user", "uid"),
    ("/process/user", "gid"),
];

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec(("[a-zA-Z_./-]{0,8}", inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Where arbitrary fields go: unknown keys at every level the editor touches, and extra
/// elements (of any shape) in the arrays it appends to.
#[derive(Debug, Clone)]
enum Graft {
    Key(&'static str, String, Value),
    Element(&'static str, Value),
}

fn arb_graft() -> impl Strategy<Value = Graft> {
    let objects = prop::sample::select(vec![
        "",
        "/process",
        "/process/user",
        "/linux",
        "/linux/resources",
        "/root",
        "/hooks",
    ]);
    prop_oneof![
        (objects, "x-[a-z]{1,6}", arb_json()).prop_map(|(p, k, v)| Graft::Key(p, k, v)),
        (prop::sample::select(OWNED_ARRAYS.to_vec()), arb_json())
            .prop_map(|(p, v)| Graft::Element(p, v)),
    ]
}

fn graft(spec: &mut Value, g: &Graft) {
    match g {
        Graft::Key(parent, k, v) => {
            if let Some(o) = spec.pointer_mut(parent).and_then(Value::as_object_mut) {
                o.insert(k.clone(), v.clone());
            }
        }
        Graft::Element(arr, v) => {
            if let Some(a) = spec.pointer_mut(arr).and_then(Value::as_array_mut) {
                a.push(v.clone());
            }
        }
    }
}

fn arb_plan() -> impl Strategy<Value = Plan> {
    // Small name pools so plans overlap with each other and with what a spec already has.
    let node = (0u64..6, prop::bool::ANY, 0u32..3).prop_map(|(minor, block, gid)| {
        let path = format!("/dev/accel{minor}");
        DeviceNode {
            path: path.clone().into(),
            host_path: path.into(),
            kind: if block {
                NodeKind::Block
            } else {
                NodeKind::Char
            },
            major: 195,
            minor,
            file_mode: if gid == 0 { 0o666 } else { 0o660 },
            uid: 0,
            gid: 40 + gid,
        }
    });
    let mount = (0u32..6).prop_map(|i| BindMount {
        source: format!("/drv/usr/lib/libx.so.{i}").into(),
        destination: format!("/usr/lib64/libx.so.{i}").into(),
    });
    (
        prop::collection::vec(node, 0..6),
        prop::collection::vec(mount, 0..6),
        prop::collection::vec(40u32..43, 0..3),
    )
        .prop_map(|(nodes, mounts, additional_gids)| {
            let mut plan = Plan::default();
            plan.extend(Plan {
                nodes,
                mounts,
                additional_gids,
            });
            plan
        })
}

fn base_spec(i: usize, grafts: &[Graft]) -> Value {
    let mut v: Value = serde_json::from_str(FIXTURES[i]).expect("fixture");
    for g in grafts {
        graft(&mut v, g);
    }
    v
}

/// `new` keeps every field of `old`: objects keep their keys (in order) and values; owned
/// arrays only grow at the end; new keys appear only where the editor may create them.
fn check_preserved(old: &Value, new: &Value, at: &str) -> Result<(), String> {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let nv = b.get(k).ok_or_else(|| format!("{at}/{k} removed"))?;
                check_preserved(v, nv, &format!("{at}/{k}"))?;
            }
            let order: Vec<&String> = b.keys().filter(|k| a.contains_key(*k)).collect();
            if order != a.keys().collect::<Vec<_>>() {
                return Err(format!("{at}: key order changed"));
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                if !CREATABLE.contains(&(at, k.as_str())) {
                    return Err(format!("{at}/{k} added"));
                }
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(b)) if OWNED_ARRAYS.contains(&at) => {
            if b.starts_with(a) {
                Ok(())
            } else {
                Err(format!("{at}: existing elements changed"))
            }
        }
        _ if old == new => Ok(()),
        _ => Err(format!("{at}: {old} became {new}")),
    }
}

/// The bytes the runtime writes for `input`; the input itself when the edit changes nothing
/// (the create then leaves the file alone).
fn edit(input: &[u8], plan: &Plan) -> Vec<u8> {
    let (mut doc, _) = spec::parse(input).unwrap();
    let before = doc.clone();
    let changed = spec::apply(&mut doc, plan).unwrap();
    // The create writes only when apply says it changed something: never wrongly "no".
    assert_eq!(changed, doc != before, "apply's answer on {plan:?}");
    if doc == before {
        input.to_vec()
    } else {
        spec::to_bytes(&doc)
    }
}

fn to_bytes(v: &Value, pretty: bool) -> Vec<u8> {
    if pretty {
        serde_json::to_vec_pretty(v).unwrap()
    } else {
        serde_json::to_vec(v).unwrap()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn apply_is_idempotent(
        i in 0..FIXTURES.len(),
        grafts in prop::collection::vec(arb_graft(), 0..6),
        plan in arb_plan(),
        pretty in any::<bool>(),
    ) {
        let input = to_bytes(&base_spec(i, &grafts), pretty);
        let once = edit(&input, &plan);
        // As the runtime sees it on a second create: written, read back, edited again, and
        // the same bytes (so the file is not rewritten).
        let twice = edit(&once, &plan);
        prop_assert_eq!(&twice, &once);
        // An empty plan changes nothing at all.
        prop_assert_eq!(edit(&input, &Plan::default()), input);
    }

    #[test]
    fn apply_keeps_every_field_it_does_not_own(
        i in 0..FIXTURES.len(),
        grafts in prop::collection::vec(arb_graft(), 0..8),
        plan in arb_plan(),
        pretty in any::<bool>(),
    ) {
        // The bytes written to disk are JSON, and parsed back they keep every input field
        // (numbers, unicode, key order) and have what was asked for.
        let before = base_spec(i, &grafts);
        let out = edit(&to_bytes(&before, pretty), &plan);
        let after: Value = serde_json::from_slice(&out).unwrap();
        if let Err(e) = check_preserved(&before, &after, "") {
            prop_assert!(false, "{}", e);
        }
        for n in &plan.nodes {
            let p = n.path.to_str().unwrap();
            prop_assert!(after["linux"]["devices"].as_array().unwrap().iter().any(|d| d["path"] == p));
        }
        for m in &plan.mounts {
            let d = m.destination.to_str().unwrap();
            prop_assert!(after["mounts"].as_array().unwrap().iter().any(|x| x["destination"] == d));
        }
    }

    #[test]
    fn edit_equals_the_same_edit_of_the_whole_document(
        i in 0..FIXTURES.len(),
        grafts in prop::collection::vec(arb_graft(), 0..8),
        plan in arb_plan(),
        pretty in any::<bool>(),
    ) {
        // The splice gives the document a whole-document edit would: the sections the
        // editor owns, edited as values with the same rules, in place of the old ones.
        let before = base_spec(i, &grafts);
        let out = edit(&to_bytes(&before, pretty), &plan);
        let after: Value = serde_json::from_slice(&out).unwrap();
        let mut want = before.clone();
        whole_document_apply(&mut want, &plan);
        prop_assert_eq!(
            serde_json::to_string(&after).unwrap(),
            serde_json::to_string(&want).unwrap()
        );
    }
}

/// `spec::apply`'s rules written out on a whole `Value` (the editor before the splice).
fn whole_document_apply(v: &mut Value, plan: &Plan) {
    fn section<'v>(v: &'v mut Value, key: &str, empty: Value) -> &'v mut Value {
        v.as_object_mut().unwrap().entry(key).or_insert(empty)
    }
    let obj = || Value::Object(Map::new());
    let arr = || Value::Array(vec![]);
    if !plan.nodes.is_empty() {
        let linux = section(v, "linux", obj());
        let devices = section(linux, "devices", arr());
        for n in &plan.nodes {
            let list = devices.as_array_mut().unwrap();
            if !list.iter().any(|d| d["path"] == n.path.to_str().unwrap()) {
                list.push(spec::device_entry(n).unwrap());
            }
        }
        let rules = section(section(linux, "resources", obj()), "devices", arr());
        for n in &plan.nodes {
            let rule = spec::rule_entry(n, "rwm").unwrap();
            let list = rules.as_array_mut().unwrap();
            if !list.contains(&rule) {
                list.push(rule);
            }
        }
    }
    if !plan.mounts.is_empty() {
        let mounts = section(v, "mounts", arr());
        let options: Vec<String> = plan::MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect();
        for m in &plan.mounts {
            let list = mounts.as_array_mut().unwrap();
            if !list
                .iter()
                .any(|x| x["destination"] == m.destination.to_str().unwrap())
            {
                list.push(spec::mount_entry(m, Some("bind"), &options).unwrap());
            }
        }
    }
    if !plan.additional_gids.is_empty() {
        let user = section(
            section(v, "process", obj()),
            "user",
            json!({"uid": 0, "gid": 0}),
        );
        let gids = section(user, "additionalGids", arr());
        for g in &plan.additional_gids {
            let list = gids.as_array_mut().unwrap();
            if !list.iter().any(|x| x.as_u64() == Some(u64::from(*g))) {
                list.push(Value::from(*g));
            }
        }
    }
}

// ---- device selection on a simulated root --------------------------------------------------

const GPUS: usize = 16;

struct Sim {
    _dir: tempfile::TempDir,
    profile: Profile,
    devices: Vec<Device>,
}

/// A 16-GPU NVIDIA root with real nodes (major 195), minors shuffled against bus order so
/// that index, minor and node name differ.
fn sim() -> &'static Sim {
    static SIM: OnceLock<Sim> = OnceLock::new();
    SIM.get_or_init(|| {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("dev")).unwrap();
        for i in 0..GPUS {
            let minor = (i * 7) % GPUS;
            let bus = format!("0000:{:02x}:00.0", 0x10 + i);
            let d = root.join("proc/driver/nvidia/gpus").join(&bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("GPU UUID: \t\t GPU-{i:08x}-0000-1111-2222-333333333333\nBus Location: \t\t {bus}\nDevice Minor: \t\t {minor}\n"),
            )
            .unwrap();
            let node = root.join(format!("dev/nvidia{minor}"));
            mknod(&node, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(195, minor as u64))
                .unwrap_or_else(|e| panic!("mknod {} (this test needs root): {e}", node.display()));
        }
        let mut profile = Config::parse("", None)
            .unwrap()
            .profile("nvidia")
            .unwrap()
            .clone();
        profile.driver_root = root.to_path_buf();
        let devices = discovery::discover(&profile).unwrap();
        assert_eq!(devices.len(), GPUS);
        Sim { _dir: dir, profile, devices }
    })
}

/// How an item names a device.
#[derive(Debug, Clone, Copy)]
enum Name {
    Index,
    Uuid,
    Bus,
    BusUpper,
}

fn name_of(d: &Device, how: Name) -> String {
    match how {
        Name::Index => d.index.to_string(),
        Name::Uuid => d.uuid.clone().unwrap(),
        Name::Bus => d.pci_bus_id.clone().unwrap(),
        Name::BusUpper => d.pci_bus_id.clone().unwrap().to_ascii_uppercase(),
    }
}

fn injected_nodes(value: &str) -> BTreeSet<PathBuf> {
    let s = sim();
    let var = "NVIDIA_VISIBLE_DEVICES";
    let selected: Vec<&Device> = match request::parse(var, value).unwrap() {
        Request::All => s.devices.iter().collect(),
        Request::Items { devices, cdi } => {
            assert!(cdi.is_empty());
            request::select(var, &devices, &s.devices, false).unwrap()
        }
        other => panic!("{other:?}"),
    };
    let nodes = facts::device_nodes(&discovery::DevRoot::new(&s.profile), &selected);
    let plan = plan::device_edits(&s.profile, &selected, &nodes).unwrap();
    let doc: Value = serde_json::from_slice(&edit(FIXTURES[1].as_bytes(), &plan)).unwrap();
    let rules: BTreeSet<(u64, u64)> = doc["linux"]["resources"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["allow"] == true && r["major"] == 195)
        .map(|r| (195, r["minor"].as_u64().unwrap()))
        .collect();
    let nodes: BTreeSet<PathBuf> = doc["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| PathBuf::from(d["path"].as_str().unwrap()))
        .collect();
    let minors: BTreeSet<(u64, u64)> = plan.nodes.iter().map(|n| (n.major, n.minor)).collect();
    assert_eq!(rules, minors, "cgroup rules differ from nodes for {value}");
    nodes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn injected_nodes_equal_requested_devices(
        picks in prop::collection::vec(
            (0..GPUS, prop::sample::select(vec![Name::Index, Name::Uuid, Name::Bus, Name::BusUpper])),
            1..24,
        ),
    ) {
        let s = sim();
        let value = picks
            .iter()
            .map(|(i, how)| name_of(&s.devices[*i], *how))
            .collect::<Vec<_>>()
            .join(",");
        let want: BTreeSet<PathBuf> = picks
            .iter()
            .map(|(i, _)| s.devices[*i].nodes[0].clone())
            .collect();
        prop_assert_eq!(injected_nodes(&value), want);
    }
}

#[test]
fn all_injects_every_node() {
    let s = sim();
    let want: BTreeSet<PathBuf> = s.devices.iter().map(|d| d.nodes[0].clone()).collect();
    assert_eq!(want.len(), GPUS);
    assert_eq!(injected_nodes("all"), want);
}
