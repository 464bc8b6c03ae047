//! Sharing on the DRA path (issue 35, docs/sharing.md): the seed's 8-GCU node published with
//! each GCU whole, shareable by memory and in halves and quarters, as `resource.k8s.io/v1`
//! JSON that the stand-in API server validates with the real server's rules for these fields;
//! prepare's own accounting (the last place that can notice a wrong allocation) across claims,
//! restarts and unprepares; the limits each share's container is given; per-claim config.
//!
//! `cargo test --features dra --test sharing` (root: the simulated nodes are made with mknod).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::apiserver::ApiServer;
use common::dra::{claim, prepare, register, to_cel, unprepare, wait_slices, Driver, DRIVER, NODE};
use common::grpc::PREPARE_V1;
use common::kubelet::{config, enflame_host, rt};
use serde_json::{json, Value};

/// The operator's statement of the GCUs' memory, which turns sharing on (discovery reads
/// none for Enflame).
const SHARING: &str = "[profiles.enflame.sharing]\nmemory = \"32Gi\"\n";

fn uid(i: usize) -> String {
    format!("5a4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e{i:02}")
}

fn share_id(i: usize) -> String {
    format!("7e1d2c3b-0000-4000-8000-0000000000{i:02}")
}

fn share(dev: &str, i: usize, memory: &str) -> Value {
    json!({"request": "gcus", "driver": DRIVER, "pool": NODE, "device": dev,
           "shareID": share_id(i), "consumedCapacity": {"memory": memory}})
}

fn whole(dev: &str) -> Value {
    json!({"request": "gcus", "driver": DRIVER, "pool": NODE, "device": dev})
}

fn devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn attr<'a>(d: &'a Value, name: &str) -> &'a Value {
    let a = &d["attributes"][name];
    a.get("string").or(a.get("int")).unwrap_or(&Value::Null)
}

/// The variables claim `uid`'s CDI spec gives its device `name`.
fn env_of(drv: &Driver, uid: &str) -> Vec<String> {
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(drv.spec_path(uid)).unwrap()).unwrap();
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The seed's node published with counters and every offer; every counter a device consumes
/// exists in the pool (what the scheduler checks of a complete pool, KEP-4815), and the
/// shipped DeviceClasses (packaging/kubernetes) each select exactly their mode's devices.
#[test]
fn the_8_gcu_node_is_published_whole_shareable_and_in_parts() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), SHARING);
    let api = ApiServer::start();
    rt().block_on(async {
        let drv = Driver::start(
            &cfg,
            &api,
            tempfile::tempdir().unwrap(),
            Duration::from_millis(50),
        );
        let s = wait_slices(&api, "publish", |s| s.len() == 2).await;
        for x in &s {
            assert_eq!(x["spec"]["pool"]["resourceSliceCount"], 2);
        }
        let sets = s[0]["spec"]["sharedCounters"].as_array().unwrap();
        assert!(s[0]["spec"].get("devices").is_none());
        assert_eq!(sets.len(), 8);
        assert_eq!(
            sets[3],
            json!({"name": "gcu-3", "counters": {"memory": {"value": "32Gi"},
                "slice-0": {"value": "1"}, "slice-1": {"value": "1"},
                "slice-2": {"value": "1"}, "slice-3": {"value": "1"}}})
        );
        let d = devices(&s);
        assert_eq!(d.len(), 64);
        let by: BTreeMap<&str, &Value> =
            d.iter().map(|x| (x["name"].as_str().unwrap(), x)).collect();
        let counters: BTreeMap<&str, BTreeSet<&str>> = sets
            .iter()
            .map(|x| {
                (
                    x["name"].as_str().unwrap(),
                    x["counters"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .map(String::as_str)
                        .collect(),
                )
            })
            .collect();
        for x in &d {
            for c in x["consumesCounters"].as_array().unwrap() {
                let set = &counters[c["counterSet"].as_str().unwrap()];
                for k in c["counters"].as_object().unwrap().keys() {
                    assert!(set.contains(k.as_str()), "{}: {k}", x["name"]);
                }
            }
        }
        let shared = by["gcu-3-shared"];
        assert_eq!(shared["allowMultipleAllocations"], true);
        assert_eq!(
            shared["capacity"]["memory"],
            json!({"value": "32Gi", "requestPolicy": {"default": "4Gi",
                   "validRange": {"min": "1Gi", "max": "32Gi", "step": "1Gi"}}})
        );
        assert_eq!(attr(shared, "sharing"), "capacity");
        assert_eq!(attr(shared, "limits"), "advisory");
        assert_eq!(attr(shared, "parent"), "gcu-3");
        assert_eq!(
            attr(shared, "resource.kubernetes.io/pciBusID"),
            "0000:13:00.0"
        );
        let half = by["gcu-3-half-1"];
        assert_eq!(attr(half, "partition"), "half");
        assert_eq!(attr(half, "placement"), 2);
        assert_eq!(half["capacity"]["memory"]["value"], "16Gi");
        assert!(half.get("allowMultipleAllocations").is_none());
        assert_eq!(
            half["consumesCounters"],
            json!([{"counterSet": "gcu-3", "counters": {"memory": {"value": "16Gi"},
                    "slice-2": {"value": "1"}, "slice-3": {"value": "1"}}}])
        );
        assert_eq!(attr(by["gcu-3"], "sharing"), "whole");
        assert_eq!(
            by["gcu-3"]["consumesCounters"][0]["counters"]
                .as_object()
                .unwrap()
                .len(),
            5
        );
        let picked = |class: &str| -> Vec<String> {
            d.iter()
                .filter(|x| selectors::class_selects(class, x))
                .map(|x| x["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            picked("gcu.enflame.com"),
            (0..8).map(|i| format!("gcu-{i}")).collect::<Vec<_>>()
        );
        assert_eq!(picked("gcu-shared.enflame.com").len(), 8);
        assert!(picked("gcu-shared.enflame.com")
            .iter()
            .all(|n| n.ends_with("-shared")));
        assert_eq!(picked("gcu-half.enflame.com").len(), 16);
        assert_eq!(picked("gcu-quarter.enflame.com").len(), 32);
        drv.stop().await;
    });
}

/// Without the memory stated the GCUs are published as before: whole, no counters.
#[test]
fn without_the_memory_known_devices_stay_whole() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    rt().block_on(async {
        let drv = Driver::start(
            &cfg,
            &api,
            tempfile::tempdir().unwrap(),
            Duration::from_millis(50),
        );
        let s = wait_slices(&api, "publish", |s| !s.is_empty()).await;
        assert_eq!(s.len(), 1);
        let d = devices(&s);
        assert_eq!(d.len(), 8);
        assert!(d.iter().all(
            |x| x.get("consumesCounters").is_none() && x["attributes"].get("sharing").is_none()
        ));
        assert!(d
            .iter()
            .all(|x| selectors::class_selects("gcu.enflame.com", x)));
        drv.stop().await;
    });
}

/// The pod the stand-in API server reserves every claim for.
const POD: &str = "0b4c7f3e-0000-4000-8000-000000000001";

/// The runtime's `create` on a bundle whose config.json is `spec`, with a config.toml that
/// reads the driver's grants under `dir` and execs `/bin/true` (this cgroup v1 machine's runc
/// cannot apply a cgroup v2 key: config.json is what is asserted). Returns the file after.
fn create_with_dmem(dir: &std::path::Path, spec: &Value) -> (Vec<u8>, Vec<u8>) {
    let scratch = tempfile::tempdir().unwrap();
    let config = scratch.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "low-level-runtime = \"/bin/true\"\nlog-file = {:?}\ncgroup-root = {:?}\ndmem-grants-dir = {:?}\n",
            scratch.path().join("shim.log"),
            dir.join("cgroup"),
            dir.join("dmem"),
        ),
    )
    .unwrap();
    let bundle = scratch.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    let before = serde_json::to_vec(spec).unwrap();
    std::fs::write(bundle.join("config.json"), &before).unwrap();
    let out = std::process::Command::new(&*common::SHIM)
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", &config)
        .arg("--root")
        .arg(scratch.path().join("state"))
        .arg("create")
        .arg("--bundle")
        .arg(&bundle)
        .arg("dmem-test")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (before, std::fs::read(bundle.join("config.json")).unwrap())
}

/// Issue 43: where the GCU's driver registered its memory with the dmem cgroup controller
/// (the simulated host's `dmem.capacity` lists `vram0` of gcu-3's PCI function), gcu-3's
/// share and parts are published `enforcement: kernel` (a DeviceAttribute string, selectable
/// with CEL), the others `advisory`; prepare records the share's memory by the pod the claim
/// is reserved for, and the real runtime's `create` writes it as `dmem.max` into the
/// container's config.json when the engine's pod UID annotation and the device's node are
/// there, keeping every other key in its place. Another pod's container, and the pod's
/// container without the device, are left byte for byte; after unprepare nothing is written.
#[test]
fn a_share_on_a_device_with_a_dmem_region_is_kernel_enforced_and_gets_dmem_max() {
    let (sim, major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), SHARING);
    let api = ApiServer::start();
    api.put_claim_results(
        "ns",
        "s0",
        &uid(0),
        DRIVER,
        vec![share("gcu-3-shared", 0, "8Gi")],
    );
    api.put_claim_results(
        "ns",
        "s1",
        &uid(1),
        DRIVER,
        vec![share("gcu-2-shared", 1, "8Gi")],
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cgroup")).unwrap();
    std::fs::write(
        dir.path().join("cgroup/dmem.capacity"),
        "drm/0000:13:00.0/system 68719476736\ndrm/0000:13:00.0/vram0 34359738368\n",
    )
    .unwrap();
    let root = dir.path().to_path_buf();
    rt().block_on(async {
        let drv = Driver::start(&cfg, &api, dir, Duration::from_millis(50));
        let s = wait_slices(&api, "publish", |s| s.len() == 2).await;
        let d = devices(&s);
        let by: BTreeMap<&str, &Value> =
            d.iter().map(|x| (x["name"].as_str().unwrap(), x)).collect();
        assert_eq!(
            by["gcu-3-shared"]["attributes"]["enforcement"],
            json!({"string": "kernel"})
        );
        assert_eq!(attr(by["gcu-3-half-1"], "enforcement"), "kernel");
        assert_eq!(attr(by["gcu-3-shared"], "limits"), "enforced");
        assert_eq!(attr(by["gcu-2-shared"], "enforcement"), "advisory");
        assert_eq!(attr(by["gcu-2-quarter-0"], "enforcement"), "advisory");
        assert_eq!(attr(by["gcu-2-shared"], "limits"), "advisory");
        // A whole device is no one else's: it carries none.
        assert!(by["gcu-3"]["attributes"].get("enforcement").is_none());
        // A claim asking for the kernel's enforcement or better, within the shared class.
        let kernel_or_better =
            r#"device.attributes["gcu.enflame.com"].enforcement in ["hardware", "kernel"]"#;
        let picked: Vec<&str> = d
            .iter()
            .filter(|x| selectors::class_selects("gcu-shared.enflame.com", x))
            .filter(|x| selectors::selects(kernel_or_better, x))
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        assert_eq!(picked, ["gcu-3-shared"]);

        let (_, ch) = register(&drv.reg_socket()).await;
        let r = prepare(
            &ch,
            PREPARE_V1,
            vec![claim("ns", "s0", &uid(0)), claim("ns", "s1", &uid(1))],
        )
        .await;
        assert_eq!(r.claims[&uid(0)].error, "");
        assert_eq!(r.claims[&uid(1)].error, "");
        let grants: Value = serde_json::from_slice(
            &std::fs::read(root.join(format!("dmem/{POD}/{}.json", uid(0)))).unwrap(),
        )
        .unwrap();
        let node = std::fs::metadata(sim.path().join("dev/gcu3")).unwrap();
        let rdev = format!(
            "{}:{}",
            nix::sys::stat::major(std::os::unix::fs::MetadataExt::rdev(&node)),
            nix::sys::stat::minor(std::os::unix::fs::MetadataExt::rdev(&node))
        );
        assert_eq!(grants["pod"], POD);
        assert_eq!(grants["grants"][0]["bus"], "0000:13:00.0");
        assert_eq!(grants["grants"][0]["memory"], 8u64 << 30);
        assert_eq!(grants["grants"][0]["rdevs"], json!([rdev]));
        // gcu-2 has no region: nothing recorded for its share.
        assert!(!root.join(format!("dmem/{POD}/{}.json", uid(1))).exists());

        let (dev_major, dev_minor) = rdev.split_once(':').unwrap();
        assert_eq!(dev_major, major.to_string());
        let spec = |pod: &str, with_node: bool| {
            let devices = if with_node {
                json!([{"path": "/dev/gcu3", "type": "c", "major": major,
                        "minor": dev_minor.parse::<u64>().unwrap()}])
            } else {
                json!([])
            };
            json!({"ociVersion": "1.2.0", "zz-unknown": {"kept": [1, 2]},
                   "process": {"args": ["sh"], "cwd": "/",
                               "env": ["PATH=/bin", "ENFLAME_CONTAINER_USABLE_GLOBAL_MEM=32",
                                       "DMEM_MAX=drm/0000:13:00.0/vram0 max"]},
                   "root": {"path": "rootfs"},
                   "annotations": {"io.kubernetes.cri.sandbox-uid": pod},
                   "linux": {"devices": devices,
                             "resources": {"unified": {"memory.high": "max"}, "zz": 1}}})
        };
        let (_, after) = create_with_dmem(&root, &spec(POD, true));
        let doc: Value = serde_json::from_slice(&after).unwrap();
        assert_eq!(
            doc["linux"]["resources"]["unified"],
            json!({"memory.high": "max", "dmem.max": "drm/0000:13:00.0/vram0 8589934592"})
        );
        let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "ociVersion",
                "zz-unknown",
                "process",
                "root",
                "annotations",
                "linux"
            ]
        );
        let unified: Vec<&String> = doc["linux"]["resources"]["unified"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(unified, ["memory.high", "dmem.max"]);
        assert_eq!(doc["zz-unknown"], json!({"kept": [1, 2]}));
        // Another pod's container, and this pod's without the device: untouched.
        let other = "0b4c7f3e-0000-4000-8000-000000000002";
        for (pod, with_node) in [(other, true), (POD, false)] {
            let (before, after) = create_with_dmem(&root, &spec(pod, with_node));
            assert_eq!(before, after, "{pod} {with_node}");
        }

        let u = unprepare(&ch, vec![claim("ns", "s0", &uid(0))]).await;
        assert_eq!(u.claims[&uid(0)].error, "");
        assert!(!root.join(format!("dmem/{POD}")).exists());
        let (before, after) = create_with_dmem(&root, &spec(POD, true));
        assert_eq!(before, after);
        drv.stop().await;
    });
}

/// Four claims of 8 GiB on one 32 GiB GCU are prepared, each container told its own 8 GiB; a
/// fifth (a wrong allocation: the scheduler would not make it) is refused by the driver's own
/// check, after a restart too; once one share is unprepared the fifth fits. Nothing whole or
/// partitioned is prepared beside the shares.
#[test]
fn four_8gi_shares_fill_a_32gi_gcu_and_a_fifth_is_refused() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), SHARING);
    let api = ApiServer::start();
    for i in 0..5 {
        api.put_claim_results(
            "ns",
            &format!("s{i}"),
            &uid(i),
            DRIVER,
            vec![share("gcu-3-shared", i, "8Gi")],
        );
    }
    api.put_claim_results("ns", "whole", &uid(10), DRIVER, vec![whole("gcu-3")]);
    api.put_claim_results("ns", "half", &uid(11), DRIVER, vec![whole("gcu-3-half-0")]);
    rt().block_on(async {
        let (drv, ch) = Driver::serving(&cfg, &api, Duration::from_millis(100)).await;
        let r = prepare(
            &ch,
            PREPARE_V1,
            (0..4)
                .map(|i| claim("ns", &format!("s{i}"), &uid(i)))
                .collect(),
        )
        .await;
        for i in 0..4 {
            let got = &r.claims[&uid(i)];
            assert_eq!(got.error, "", "s{i}");
            assert_eq!(got.devices[0].device_name, "gcu-3-shared");
            assert_eq!(
                got.devices[0].share_id.as_deref(),
                Some(share_id(i).as_str())
            );
            assert_eq!(
                got.devices[0].cdi_device_ids,
                [format!(
                    "k8s.{DRIVER}/claim={}-gcu-3-shared-{}",
                    uid(i),
                    share_id(i)
                )]
            );
            let env = env_of(&drv, &uid(i));
            assert!(
                env.contains(&"ENFLAME_CONTAINER_USABLE_GLOBAL_MEM=8".to_string()),
                "{env:?}"
            );
            assert!(
                env.contains(&"ENFLAME_CONTAINER_SUB_CARD=true".to_string()),
                "{env:?}"
            );
        }
        // What `kubectl describe resourceclaim s0` shows: the share, and what its GCU is.
        let status = &api.claim("ns", "s0")["status"]["devices"][0];
        assert_eq!(status["device"], "gcu-3-shared");
        assert_eq!(status["shareID"], share_id(0));
        assert_eq!(status["data"]["pciBusID"], "0000:13:00.0");
        let fifth = |ch| async move {
            prepare(ch, PREPARE_V1, vec![claim("ns", "s4", &uid(4))])
                .await
                .claims[&uid(4)]
                .error
                .clone()
        };
        let e = fifth(&ch).await;
        assert!(
            e.contains("device gcu-3-shared")
                && e.contains(
                    "memory 8Gi with the 4 share(s) prepared on it (32Gi) is past its total 32Gi"
                ),
            "{e}"
        );
        assert!(!drv.spec_path(&uid(4)).exists());
        for (name, u) in [("whole", uid(10)), ("half", uid(11))] {
            let r = prepare(&ch, PREPARE_V1, vec![claim("ns", name, &u)]).await;
            let e = &r.claims[&u].error;
            assert!(
                e.contains("is prepared for claim ns/s") && e.contains("(as gcu-3-shared) already"),
                "{name}: {e}"
            );
        }

        // The accounting is the records': a restart keeps it.
        let dir = drv.stop().await;
        let drv = Driver::start(&cfg, &api, dir, Duration::from_millis(100));
        let (_, ch) = register(&drv.reg_socket()).await;
        assert!(fifth(&ch).await.contains("past its total"));
        let u = unprepare(&ch, vec![claim("ns", "s1", &uid(1))]).await;
        assert_eq!(u.claims[&uid(1)].error, "");
        assert_eq!(fifth(&ch).await, "");
        assert!(
            env_of(&drv, &uid(4)).contains(&"ENFLAME_CONTAINER_USABLE_GLOBAL_MEM=8".to_string())
        );
        drv.stop().await;
    });
}

/// A half and its whole device are never both prepared, nor two parts that overlap; parts
/// that do not overlap pack, each told its own memory.
#[test]
fn a_part_and_its_whole_device_are_never_both_prepared() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), SHARING);
    let api = ApiServer::start();
    let claims = [
        ("half0", whole("gcu-2-half-0")),
        ("whole", whole("gcu-2")),
        ("quarter1", whole("gcu-2-quarter-1")),
        ("quarter2", whole("gcu-2-quarter-2")),
        ("shared", share("gcu-2-shared", 1, "4Gi")),
    ];
    for (i, (name, res)) in claims.iter().enumerate() {
        api.put_claim_results("ns", name, &uid(20 + i), DRIVER, vec![res.clone()]);
    }
    rt().block_on(async {
        let (drv, ch) = Driver::serving(&cfg, &api, Duration::from_millis(100)).await;
        let go = |i: usize| {
            let ch = ch.clone();
            let name = claims[i].0;
            async move {
                let u = uid(20 + i);
                prepare(&ch, PREPARE_V1, vec![claim("ns", name, &u)])
                    .await
                    .claims[&u]
                    .error
                    .clone()
            }
        };
        assert_eq!(go(0).await, "");
        assert!(
            env_of(&drv, &uid(20)).contains(&"ENFLAME_CONTAINER_USABLE_GLOBAL_MEM=16".to_string())
        );
        let e = go(1).await;
        assert!(
            e.contains("device gcu-2 (")
                && e.contains("prepared for claim ns/half0")
                && e.contains("(as gcu-2-half-0)"),
            "{e}"
        );
        let e = go(2).await;
        assert!(e.contains("on the same part of it"), "{e}");
        assert_eq!(go(3).await, "");
        assert!(
            env_of(&drv, &uid(23)).contains(&"ENFLAME_CONTAINER_USABLE_GLOBAL_MEM=8".to_string())
        );
        assert!(go(4).await.contains("already"));
        for i in [0, 3] {
            let u = uid(20 + i);
            assert_eq!(
                unprepare(&ch, vec![claim("ns", claims[i].0, &u)])
                    .await
                    .claims[&u]
                    .error,
                ""
            );
        }
        assert_eq!(go(1).await, "");
        drv.stop().await;
    });
}

/// What only a wrong allocation or a wrong config can hold is refused with one line naming
/// it, and nothing is prepared; a claim's limits below its grant reach its container.
#[test]
fn wrong_allocations_and_configs_are_refused_naming_the_field() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), SHARING);
    let api = ApiServer::start();
    let limits = |source: &str, params: Value| json!({"source": source, "requests": ["gcus"], "opaque": {"driver": DRIVER, "parameters": params}});
    let sharing = |l: Value| json!({"apiVersion": "accel-container-runtime/v1", "kind": "SharingConfig", "limits": l});
    let cases: Vec<(&str, Vec<Value>, Vec<Value>, &str)> = vec![
        ("whole-with-share", vec![json!({"request": "gcus", "driver": DRIVER, "pool": NODE, "device": "gcu-1", "shareID": share_id(1)})], vec![],
         "allocated with share \"7e1d2c3b-0000-4000-8000-000000000001\", but it is not published as shareable"),
        ("share-without-id", vec![json!({"request": "gcus", "driver": DRIVER, "pool": NODE, "device": "gcu-1-shared", "consumedCapacity": {"memory": "4Gi"}})], vec![],
         "allocated without a share ID"),
        ("unknown-capacity", vec![json!({"request": "gcus", "driver": DRIVER, "pool": NODE, "device": "gcu-1-shared", "shareID": share_id(2), "consumedCapacity": {"memory": "4Gi", "cores": "5"}})], vec![],
         "consumedCapacity names \"cores\", which it does not have"),
        ("past-total", vec![share("gcu-1-shared", 3, "40Gi")], vec![], "consumedCapacity memory 40Gi is past its total"),
        ("milli", vec![share("gcu-1-shared", 4, "500m")], vec![], "consumedCapacity memory: \"500m\" is not a quantity"),
        ("unknown-field", vec![share("gcu-1-shared", 5, "8Gi")],
         vec![limits("FromClaim", json!({"apiVersion": "accel-container-runtime/v1", "kind": "SharingConfig", "limit": {}}))],
         "config (FromClaim) parameters: unknown field `limit`"),
        ("above-grant", vec![share("gcu-1-shared", 6, "8Gi")], vec![limits("FromClaim", sharing(json!({"memory": "10Gi"})))],
         "limits.memory \"10Gi\" must be above 0 and at most the 8Gi granted"),
        ("wrong-kind", vec![share("gcu-1-shared", 7, "8Gi")],
         vec![limits("FromClass", json!({"apiVersion": "v1", "kind": "GpuConfig"}))], "apiVersion \"v1\" kind \"GpuConfig\""),
        ("whole-limits", vec![whole("gcu-5")], vec![limits("FromClaim", sharing(json!({"memory": "1Gi"})))],
         "limits apply to shares and partitions, not to a whole device"),
    ];
    for (i, (name, results, config, _)) in cases.iter().enumerate() {
        api.put_claim_config(
            "ns",
            name,
            &uid(40 + i),
            DRIVER,
            results.clone(),
            config.clone(),
        );
    }
    // Limits below the grant, the class's overridden by the claim's; another driver's config
    // is not ours to read.
    api.put_claim_config(
        "ns",
        "limited",
        &uid(60),
        DRIVER,
        vec![share("gcu-6-shared", 9, "8Gi")],
        vec![
            limits("FromClass", sharing(json!({"memory": "7Gi"}))),
            json!({"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"anything": 1}}}),
            limits("FromClaim", sharing(json!({"memory": "6Gi"}))),
        ],
    );
    rt().block_on(async {
        let (drv, ch) = Driver::serving(&cfg, &api, Duration::from_millis(100)).await;
        for (i, (name, _, _, says)) in cases.iter().enumerate() {
            let u = uid(40 + i);
            let r = prepare(&ch, PREPARE_V1, vec![claim("ns", name, &u)]).await;
            let e = &r.claims[&u].error;
            assert!(e.contains(says), "{name}: {e}");
            assert!(
                !e.contains('\n') && e.ends_with("nothing prepared"),
                "{name}: {e}"
            );
            assert!(!drv.spec_path(&u).exists(), "{name}");
        }
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "limited", &uid(60))]).await;
        assert_eq!(r.claims[&uid(60)].error, "");
        let env = env_of(&drv, &uid(60));
        assert!(
            env.contains(&"ENFLAME_CONTAINER_USABLE_GLOBAL_MEM=6".to_string()),
            "{env:?}"
        );
        drv.stop().await;
    });
}

/// The shipped admission policy on claims, templates and classes refuses an opaque config of
/// one of the drivers that prepare would refuse for its shape, and lets the rest through.
#[test]
fn the_admission_policy_refuses_a_config_prepare_would() {
    let ok = json!({"apiVersion": "accel-container-runtime/v1", "kind": "SharingConfig", "limits": {"memory": "6Gi", "cores": 50}});
    let opaque = |driver: &str, p: &Value| json!([{"opaque": {"driver": driver, "parameters": p}}]);
    let claim = |c: Value| json!({"spec": {"devices": {"requests": [], "config": c}}});
    let template = |c: Value| json!({"spec": {"spec": {"devices": {"config": c}}}});
    let class = |c: Value| json!({"spec": {"config": c}});
    for (resource, wrap) in [
        ("resourceclaims", &claim as &dyn Fn(Value) -> Value),
        ("resourceclaimtemplates", &template),
        ("deviceclasses", &class),
    ] {
        assert_eq!(
            policy::admit(resource, wrap(opaque(DRIVER, &ok))),
            Ok(()),
            "{resource}"
        );
        // Another driver's config is not ours to judge.
        assert_eq!(
            policy::admit(resource, wrap(opaque("gpu.example.com", &json!({"x": 1})))),
            Ok(())
        );
        for (bad, says) in [
            (
                json!({"apiVersion": "v1", "kind": "SharingConfig"}),
                "apiVersion must be",
            ),
            (
                json!({"apiVersion": "accel-container-runtime/v1", "kind": "SharingConfig", "limit": {}}),
                "only apiVersion, kind and limits",
            ),
            (
                json!({"apiVersion": "accel-container-runtime/v1", "kind": "SharingConfig", "limits": {"mem": "1Gi"}}),
                "only memory and cores",
            ),
            (
                json!({"apiVersion": "accel-container-runtime/v1", "kind": "SharingConfig", "limits": {"cores": 150}}),
                "1 to 100",
            ),
            (
                json!({"apiVersion": "accel-container-runtime/v1", "kind": "SharingConfig", "limits": {"cores": "50"}}),
                "1 to 100",
            ),
        ] {
            let e = policy::admit(resource, wrap(opaque("gpu.nvidia.com", &bad))).unwrap_err();
            assert!(e.contains(says), "{resource} {bad}: {e}");
        }
    }
    assert_eq!(
        policy::admit(
            "resourceclaims",
            json!({"spec": {"devices": {"requests": []}}})
        ),
        Ok(())
    );
    assert_eq!(policy::admit("deviceclasses", json!({"spec": {}})), Ok(()));
}

mod policy {
    use serde_json::{json, Value};
    use std::collections::HashMap;

    fn cel(expr: &str, ctx: &cel::Context) -> cel::Value {
        cel::Program::compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
            .execute(ctx)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    /// What the shipped sharing-config policy answers a CREATE of `object` (a `resource` of
    /// resource.k8s.io): `Err` with the first failing validation's message.
    pub fn admit(resource: &str, object: Value) -> Result<(), String> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/kubernetes/components/dra/accel-dra-driver.yaml"
        ))
        .unwrap();
        let p = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
            .find(|v| {
                v["metadata"]["name"] == "accel-dra-driver-sharing-config"
                    && v["kind"] == "ValidatingAdmissionPolicy"
            })
            .expect("the sharing-config policy");
        let request = json!({"operation": "CREATE", "resource": {"group": "resource.k8s.io", "resource": resource}});
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("request", super::to_cel(&request));
        ctx.add_variable_from_value("object", super::to_cel(&object));
        let mut vars: HashMap<String, cel::Value> = HashMap::new();
        for v in p["spec"]["variables"].as_array().unwrap() {
            let got = cel(v["expression"].as_str().unwrap(), &ctx);
            vars.insert(v["name"].as_str().unwrap().to_string(), got);
            ctx.add_variable_from_value("variables", vars.clone());
        }
        for v in p["spec"]["validations"].as_array().unwrap() {
            if cel(v["expression"].as_str().unwrap(), &ctx) != cel::Value::Bool(true) {
                return Err(v["message"].as_str().unwrap().to_string());
            }
        }
        Ok(())
    }
}

/// The shipped DeviceClasses' selectors (packaging/kubernetes/components/dra), evaluated as
/// CEL on devices as the driver publishes them.
mod selectors {
    use serde_json::Value;
    use std::collections::BTreeMap;

    fn classes() -> BTreeMap<String, String> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/kubernetes/components/dra/accel-dra-driver.yaml"
        ))
        .unwrap();
        serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
            .filter(|v| v["kind"] == "DeviceClass")
            .map(|v| {
                let exprs: Vec<String> = v["spec"]["selectors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| format!("({})", s["cel"]["expression"].as_str().unwrap()))
                    .collect();
                (
                    v["metadata"]["name"].as_str().unwrap().to_string(),
                    exprs.join(" && "),
                )
            })
            .collect()
    }

    /// Whether DeviceClass `class` selects `device` (slice JSON): its attributes as CEL sees
    /// them, `device.attributes[domain][name]`, unprefixed names in the driver's domain.
    pub fn class_selects(class: &str, device: &Value) -> bool {
        let expr = classes()
            .remove(class)
            .unwrap_or_else(|| panic!("no DeviceClass {class}"));
        selects(&expr, device)
    }

    /// Whether the CEL selector `expr` (a DeviceClass's or a claim's) selects `device`.
    pub fn selects(expr: &str, device: &Value) -> bool {
        let mut attrs: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
        for (k, v) in device["attributes"].as_object().unwrap() {
            let (domain, name) = k.rsplit_once('/').unwrap_or((super::DRIVER, k));
            let value = v.as_object().unwrap().values().next().unwrap().clone();
            attrs
                .entry(domain.into())
                .or_default()
                .insert(name.into(), value);
        }
        attrs.entry(super::DRIVER.into()).or_default();
        let mut ctx = cel::Context::default();
        let device = serde_json::json!({"driver": super::DRIVER, "attributes": attrs});
        ctx.add_variable_from_value("device", super::to_cel(&device));
        match cel::Program::compile(expr).unwrap().execute(&ctx) {
            Ok(cel::Value::Bool(b)) => b,
            other => panic!("{expr}: {other:?}"),
        }
    }
}
