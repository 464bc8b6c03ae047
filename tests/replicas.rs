//! Sharing a device (issue 26): each device listed as `<id>::<k>` replicas, placed by the
//! profile's `replica-policy`, Allocate answering each container exactly its devices, a
//! shared resource beside the whole one, the runtime taking replica IDs, and the checkpoint
//! tool reading a checkpoint of replicas. Over the seed's simulated 8-GCU host (Enflame's
//! PCIe-switch example) and, for the runtime, real runc.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use accel_container_runtime::config::Config;
use accel_container_runtime::kubelet::proto::deviceplugin::*;
use accel_container_runtime::plugin::allocate::Strategy;
use accel_container_runtime::plugin::server::{self, Options};
use accel_container_runtime::plugin::service;
use common::grpc;
use common::kubelet::{
    apply_answer, config, enflame_host, ids, rt, seed, shuffled, Kubelet, Plugin,
};
use common::{mknod, SimRoot, CTK};

/// `GCU-<i>::<k>` for each device `i` and replica `k`.
fn replicas(devices: impl IntoIterator<Item = u32>, n: u32) -> Vec<String> {
    devices
        .into_iter()
        .flat_map(|i| (0..n).map(move |k| format!("GCU-{i}::{k}")))
        .collect()
}

/// The device index of `GCU-<i>` or `GCU-<i>::<k>`.
fn device_of(id: &str) -> u32 {
    id.trim_start_matches("GCU-")
        .split("::")
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

async fn allocate(
    ch: &tonic::transport::Channel,
    v: Vec<String>,
) -> Result<ContainerAllocateResponse, String> {
    grpc::allocate(
        ch,
        AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: v }],
        },
    )
    .await
    .map(|mut r| r.container_responses.remove(0))
    .map_err(|s| s.message().to_string())
}

/// kubelet's GetPreferredAllocation with `avail` in Go's map order, asked 10 times: the
/// answer must not depend on the order.
async fn prefer(
    ch: &tonic::transport::Channel,
    avail: &[String],
    must: &[String],
    n: i32,
) -> Result<Vec<String>, String> {
    let mut answers = BTreeSet::new();
    for _ in 0..10 {
        let got = grpc::get_preferred(
            ch,
            PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_ids: shuffled(avail, seed()),
                    must_include_device_ids: must.to_vec(),
                    allocation_size: n,
                }],
            },
        )
        .await
        .map(|mut r| r.container_responses.remove(0).device_ids)
        .map_err(|s| s.message().to_string());
        answers.insert(got);
    }
    assert_eq!(
        answers.len(),
        1,
        "one answer whatever the order: {answers:?}"
    );
    answers.pop_first().unwrap()
}

/// Asserts that `a` hands over exactly the devices `want` (indexes, ascending) by every
/// strategy.
fn assert_exactly(a: &ContainerAllocateResponse, want: &[u32], ctx: &str) {
    let names: Vec<String> = want.iter().map(u32::to_string).collect();
    assert_eq!(a.envs["ENFLAME_VISIBLE_DEVICES"], names.join(","), "{ctx}");
    let mounts: Vec<&str> = a.mounts.iter().map(|m| m.container_path.as_str()).collect();
    let want_mounts: Vec<String> = names
        .iter()
        .map(|n| format!("/var/run/enflame-container-devices/{n}"))
        .collect();
    assert_eq!(mounts, want_mounts, "{ctx}");
    let cdi: Vec<&str> = a.cdi_devices.iter().map(|c| c.name.as_str()).collect();
    let want_cdi: Vec<String> = names
        .iter()
        .map(|n| format!("enflame.com/gcu={n}"))
        .collect();
    assert_eq!(cdi, want_cdi, "{ctx}");
    assert_eq!(
        a.annotations.values().collect::<Vec<_>>(),
        [&want_cdi.join(",")],
        "{ctx}"
    );
    let nodes: Vec<&str> = a
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    let mut want_nodes: Vec<String> = names.iter().map(|n| format!("/dev/gcu{n}")).collect();
    want_nodes.push("/dev/gcuctl".into());
    assert_eq!(nodes, want_nodes, "{ctx}");
}

/// The next ListAndWatch message whose IDs satisfy `pick`, within 2 s.
async fn next_update(
    kubelet: &mut Kubelet,
    pick: impl Fn(&ListAndWatchResponse) -> bool,
) -> ListAndWatchResponse {
    let t = Instant::now();
    loop {
        let left = Duration::from_secs(2).saturating_sub(t.elapsed());
        let m = tokio::time::timeout(left, kubelet.updates.recv())
            .await
            .expect("ListAndWatch update within 2 s")
            .unwrap();
        if pick(&m) {
            return m;
        }
    }
}

/// 8 devices x 4 replicas: 32 IDs listed with their device's NUMA node; 32 Allocates of mixed
/// replica sets at once, each answered exactly its devices (two replicas of one device give
/// it once); whole IDs and replicas beyond `replicas` refused; all replicas of a device follow
/// its health.
#[test]
fn thirty_two_concurrent_allocates_of_replicas_each_get_exactly_their_devices() {
    let (sim, major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "replicas = 4");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.strategies = Strategy::ALL.to_vec();
        opts.cdi_dir = scratch.path().join("cdi");
        let plugin = Plugin::enflame(cfg, opts);
        kubelet.wait_registrations(1).await;
        let reg = kubelet.registrations.lock().unwrap()[0].clone();
        assert_eq!(reg.resource_name, "enflame.com/gcu");

        let first = kubelet.updates.recv().await.unwrap();
        let listed: Vec<(String, String, i64)> = first
            .devices
            .iter()
            .map(|d| {
                let numa = d.topology.as_ref().unwrap().nodes[0].id;
                (d.id.clone(), d.health.clone(), numa)
            })
            .collect();
        let all = replicas(0..8, 4);
        let want: Vec<(String, String, i64)> = all
            .iter()
            .map(|id| {
                (
                    id.clone(),
                    HEALTHY.to_string(),
                    i64::from(device_of(id) / 4),
                )
            })
            .collect();
        assert_eq!(listed, want);

        let ch = grpc::connect(&kubelet.dir().join(&reg.endpoint), "localhost")
            .await
            .unwrap();
        // Mixed sets: 1 to 6 replicas each, drawn from a seed printed on failure, and always
        // some with two replicas of one device.
        let s = seed();
        eprintln!("seed {s}");
        let mut x = s | 1;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m) as usize
        };
        let sets: Vec<Vec<String>> = (0..32)
            .map(|j| {
                if j % 8 == 0 {
                    return ids(&["GCU-5::3", "GCU-5::0"]);
                }
                let n = 1 + next(6);
                let mut set: Vec<String> = (0..n).map(|_| all[next(32)].clone()).collect();
                set.sort();
                set.dedup();
                shuffled(&set, s ^ j as u64)
            })
            .collect();
        let calls: Vec<_> = sets
            .iter()
            .cloned()
            .map(|set| {
                let ch = ch.clone();
                tokio::spawn(async move { allocate(&ch, set).await })
            })
            .collect();
        for (set, call) in sets.iter().zip(calls) {
            let answer = call.await.unwrap().unwrap();
            let devices: BTreeSet<u32> = set.iter().map(|id| device_of(id)).collect();
            let devices: Vec<u32> = devices.into_iter().collect();
            assert_exactly(&answer, &devices, &format!("{set:?} (seed {s})"));
        }

        // Only the IDs listed: not the whole device, not a fifth replica.
        for bad in ["GCU-2", "GCU-2::4", "GCU-2::01", "GCU-9::0"] {
            let e = allocate(&ch, ids(&[bad])).await.unwrap_err();
            assert_eq!(
                e,
                format!("[{bad:?}] unknown device ID {bad:?} for enflame.com/gcu")
            );
        }

        // Health: every replica of a device follows it, in the same message.
        let node = sim.path().join("dev/gcu5");
        std::fs::remove_file(&node).unwrap();
        let m = next_update(&mut kubelet, |m| {
            m.devices.iter().any(|d| d.health == UNHEALTHY)
        })
        .await;
        let sick: Vec<&str> = m
            .devices
            .iter()
            .filter(|d| d.health == UNHEALTHY)
            .map(|d| d.id.as_str())
            .collect();
        assert_eq!(sick, replicas([5], 4));
        assert_eq!(m.devices.len(), 32);
        mknod(&node, major, 5, 0o666);
        next_update(&mut kubelet, |m| {
            m.devices.iter().all(|d| d.health == HEALTHY)
        })
        .await;
        plugin.stop().await;
    });
}

/// A plugin (no socket) for the seed's host with `keys` in the enflame profile.
fn direct(sim: &SimRoot, keys: &str) -> (service::Plugin, tempfile::TempDir) {
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(sim, scratch.path(), keys);
    let profile = cfg
        .profiles
        .into_iter()
        .find(|p| p.name == "enflame")
        .unwrap();
    (
        service::Plugin::new(profile, vec![Strategy::Envvar]).unwrap(),
        scratch,
    )
}

fn prefer_direct(p: &service::Plugin, avail: &[String], n: i32) -> Result<Vec<String>, String> {
    p.preferred(PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_ids: shuffled(avail, seed()),
            must_include_device_ids: vec![],
            allocation_size: n,
        }],
    })
    .map(|mut r| r.container_responses.remove(0).device_ids)
    .map_err(|s| s.message().to_string())
}

/// `count` pods of `n` replicas one after another, each taken from what the earlier ones left
/// free (as kubelet does).
fn pods(p: &service::Plugin, count: usize, n: i32) -> Vec<Vec<String>> {
    let mut free = replicas(0..8, 4);
    (0..count)
        .map(|_| {
            let got = prefer_direct(p, &free, n).unwrap();
            free.retain(|id| !got.contains(id));
            got
        })
        .collect()
}

/// The three policies on the seed's topology (switch pairs 0+1 and 4+5, lone 2, 3, 6, 7).
#[test]
fn pack_spread_strict_on_the_seed_topology() {
    let (sim, _) = enflame_host();
    let all = replicas(0..8, 4);

    // spread (the default): one replica per device, the switch pair for two, a lone device
    // for one; eight single pods on eight devices, the ninth back on the first.
    let (p, _t) = direct(&sim, "replicas = 4");
    assert_eq!(
        prefer_direct(&p, &all, 2).unwrap(),
        ids(&["GCU-0::0", "GCU-1::0"])
    );
    assert_eq!(prefer_direct(&p, &all, 1).unwrap(), ids(&["GCU-2::0"]));
    let singles: Vec<u32> = pods(&p, 9, 1).iter().map(|g| device_of(&g[0])).collect();
    assert_eq!(singles, [2, 3, 6, 7, 0, 1, 4, 5, 2]);
    let ten = prefer_direct(&p, &all, 10).unwrap();
    let devices: BTreeSet<u32> = ten.iter().map(|id| device_of(id)).collect();
    assert_eq!((ten.len(), devices.len()), (10, 8), "{ten:?}");

    // pack: two on one lone device; single pods fill it before the next; six take a
    // switch pair whole and a half.
    let (p, _t) = direct(&sim, "replicas = 4\nreplica-policy = \"pack\"");
    assert_eq!(
        prefer_direct(&p, &all, 2).unwrap(),
        ids(&["GCU-2::0", "GCU-2::1"])
    );
    let singles: Vec<String> = pods(&p, 5, 1).into_iter().flatten().collect();
    assert_eq!(
        singles,
        ids(&["GCU-2::0", "GCU-2::1", "GCU-2::2", "GCU-2::3", "GCU-3::0"])
    );
    assert_eq!(
        prefer_direct(&p, &all, 6).unwrap(),
        ids(&["GCU-0::0", "GCU-0::1", "GCU-0::2", "GCU-0::3", "GCU-1::0", "GCU-1::1"])
    );

    // strict: one replica, placed as spread; more is refused at both calls.
    let (p, _t) = direct(&sim, "replicas = 4\nreplica-policy = \"strict\"");
    assert_eq!(prefer_direct(&p, &all, 1).unwrap(), ids(&["GCU-2::0"]));
    assert_eq!(
        prefer_direct(&p, &all, 2).unwrap_err(),
        "replica-policy strict: at most 1 replica per container, 2 asked for"
    );
    let e = p
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids(&["GCU-2::0", "GCU-3::0"]),
            }],
        })
        .unwrap_err();
    assert_eq!(
        e.message(),
        "[\"GCU-2::0\", \"GCU-3::0\"] replica-policy strict: at most 1 replica per container, 2 asked for"
    );
    let one = p
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids(&["GCU-3::2"]),
            }],
        })
        .unwrap();
    assert_eq!(
        one.container_responses[0].envs["ENFLAME_VISIBLE_DEVICES"],
        "3"
    );
}

/// The seed's two 2-GCU pods on the whole resource beside four `enflame.com/shared-gcu` pods:
/// two registrations over separate device sets, each plugin refusing the other's IDs; then
/// the checkpoint kubelet would write for them, checked by `accel-ctk checkpoint check`.
#[test]
fn two_whole_gcu_pods_beside_four_shared_gcu_pods() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let keys = "replicas = 4\nshared-resource-name = \"enflame.com/shared-gcu\"\nshared-devices = [2, 3, 6, 7]";
    let cfg = config(&sim, scratch.path(), keys);
    let config_path = scratch.path().join("config.toml");
    let cp_dir = tempfile::tempdir().unwrap();
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.strategies = Strategy::ALL.to_vec();
        opts.cdi_dir = scratch.path().join("cdi");
        let plugin = Plugin::enflame(cfg, opts);
        kubelet.wait_registrations(2).await;
        let regs = kubelet.registrations.lock().unwrap().clone();
        let mut names: Vec<(&str, &str)> = regs
            .iter()
            .map(|r| (r.resource_name.as_str(), r.endpoint.as_str()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("enflame.com/gcu", "accel-enflame-com-gcu.sock"),
                (
                    "enflame.com/shared-gcu",
                    "accel-enflame-com-shared-gcu.sock"
                ),
            ]
        );
        let mut listed: Vec<Vec<String>> = Vec::new();
        for _ in 0..2 {
            let m = kubelet.updates.recv().await.unwrap();
            listed.push(m.devices.into_iter().map(|d| d.id).collect());
        }
        listed.sort();
        let whole_ids = ids(&["GCU-0", "GCU-1", "GCU-4", "GCU-5"]);
        let shared_ids = replicas([2, 3, 6, 7], 4);
        assert_eq!(listed, [whole_ids.clone(), shared_ids.clone()]);

        let dial = |name: &str| {
            let sock = kubelet.dir().join(name);
            async move { grpc::connect(&sock, "localhost").await.unwrap() }
        };
        let whole = dial("accel-enflame-com-gcu.sock").await;
        let shared = dial("accel-enflame-com-shared-gcu.sock").await;

        // The seed's example: GCU0+1, then GCU4+5.
        let first = prefer(&whole, &whole_ids, &[], 2).await.unwrap();
        assert_eq!(first, ids(&["GCU-0", "GCU-1"]));
        let second = prefer(&whole, &whole_ids[2..], &[], 2).await.unwrap();
        assert_eq!(second, ids(&["GCU-4", "GCU-5"]));
        // Four single shared-GCU pods: one device each (spread), never a whole pod's.
        let mut free = shared_ids.clone();
        let mut shared_pods = Vec::new();
        for _ in 0..4 {
            let got = prefer(&shared, &free, &[], 1).await.unwrap();
            free.retain(|id| !got.contains(id));
            shared_pods.push(got);
        }
        assert_eq!(
            shared_pods.concat(),
            ids(&["GCU-2::0", "GCU-3::0", "GCU-6::0", "GCU-7::0"])
        );
        let mut entries = Vec::new();
        for (pod, (set, ch, resource)) in [
            (first.clone(), &whole, "enflame.com/gcu"),
            (second.clone(), &whole, "enflame.com/gcu"),
        ]
        .into_iter()
        .chain(
            shared_pods
                .iter()
                .map(|p| (p.clone(), &shared, "enflame.com/shared-gcu")),
        )
        .enumerate()
        {
            let a = allocate(ch, set.clone()).await.unwrap();
            let devices: Vec<u32> = set.iter().map(|id| device_of(id)).collect();
            assert_exactly(&a, &devices, &format!("{set:?}"));
            let numa = (devices[0] / 4).to_string();
            entries.push(serde_json::json!({
                "PodUID": format!("pod-{pod}"), "ContainerName": "main",
                "ResourceName": resource, "DeviceIDs": { numa: set },
                "AllocResp": base64_of(&a),
            }));
        }
        // Each plugin lists only its own devices.
        let e = allocate(&shared, ids(&["GCU-0::0"])).await.unwrap_err();
        assert!(e.contains("unknown device ID"), "{e}");
        let e = allocate(&whole, ids(&["GCU-2"])).await.unwrap_err();
        assert!(e.contains("unknown device ID"), "{e}");
        plugin.stop().await;

        // The checkpoint kubelet writes for these pods, replicas as the plugin listed them.
        let registered = serde_json::json!({
            "enflame.com/gcu": whole_ids, "enflame.com/shared-gcu": shared_ids,
        });
        let cp = write_checkpoint(cp_dir.path(), &entries, &registered);
        let out = ctk_check(&config_path, &cp);
        assert_eq!(out.0, Some(0), "{}", out.1);
        assert!(
            out.1.contains("checkpoint is consistent with this node"),
            "{}",
            out.1
        );

        // A replica of a device the node no longer has is stale, under the shared resource.
        entries.push(serde_json::json!({
            "PodUID": "gone", "ContainerName": "main", "ResourceName": "enflame.com/shared-gcu",
            "DeviceIDs": { "1": ["GCU-9::1"] }, "AllocResp": "",
        }));
        let cp = write_checkpoint(cp_dir.path(), &entries, &registered);
        let out = ctk_check(&config_path, &cp);
        assert_eq!(out.0, Some(1), "{}", out.1);
        assert!(out.1.contains("GCU-9::1"), "{}", out.1);

        // A replica the plugin no longer lists (replicas lowered from 8 to 4 since kubelet
        // wrote the file) is stale too; the shared device listed whole is not a replica.
        entries.pop();
        for (pod, id) in [("lowered", "GCU-2::7"), ("whole", "GCU-3")] {
            entries.push(serde_json::json!({
                "PodUID": pod, "ContainerName": "main", "ResourceName": "enflame.com/shared-gcu",
                "DeviceIDs": { "0": [id] }, "AllocResp": "",
            }));
            let cp = write_checkpoint(cp_dir.path(), &entries, &registered);
            let out = ctk_check(&config_path, &cp);
            assert_eq!(out.0, Some(1), "{id}: {}", out.1);
            assert!(out.1.contains(&format!("\"{id}\"")), "{id}: {}", out.1);
            entries.pop();
        }
    });
}

/// `accel-ctk pods` against a stand-in PodResources server: each replica is attributed to
/// its pod, namespace and container, with its device; other resources are left out.
#[test]
fn ctk_pods_names_who_holds_each_replica() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let keys = "replicas = 4\nshared-resource-name = \"enflame.com/shared-gcu\"\nshared-devices = [2, 3, 6, 7]";
    config(&sim, scratch.path(), keys);
    let sock = scratch.path().join("pod-resources.sock");
    use accel_container_runtime::kubelet::proto::podresources::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    };
    let pod = |name: &str, container: &str, resource: &str, ids: &[&str]| PodResources {
        name: name.into(),
        namespace: "ml".into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            dynamic_resources: vec![],
        }],
    };
    let answer = ListPodResourcesResponse {
        pod_resources: vec![
            pod("train", "main", "enflame.com/gcu", &["GCU-0", "GCU-1"]),
            pod("infer-a", "srv", "enflame.com/shared-gcu", &["GCU-2::0"]),
            pod(
                "infer-b",
                "srv",
                "enflame.com/shared-gcu",
                &["GCU-2::1", "GCU-6::0"],
            ),
            pod("nic", "main", "rdma/hca", &["mlx5_0"]),
        ],
    };
    let rt = rt();
    grpc::serve_pod_resources(&rt, &sock, answer);
    let run = |json: bool| {
        let mut cmd = std::process::Command::new(&*CTK);
        cmd.args(["pods", "--socket"]).arg(&sock);
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .env(
                "ACCEL_CONTAINER_RUNTIME_CONFIG",
                scratch.path().join("config.toml"),
            )
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        String::from_utf8(out.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let got: Vec<(&str, &str, &str, &str)> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["device"].as_str().unwrap(),
                h["id"].as_str().unwrap(),
                h["pod"].as_str().unwrap(),
                h["container"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("GCU-0", "GCU-0", "train", "main"),
            ("GCU-1", "GCU-1", "train", "main"),
            ("GCU-2", "GCU-2::0", "infer-a", "srv"),
            ("GCU-2", "GCU-2::1", "infer-b", "srv"),
            ("GCU-6", "GCU-6::0", "infer-b", "srv"),
        ]
    );
    let table = run(false);
    assert!(
        table.contains("enflame.com/shared-gcu  GCU-2   GCU-2::1  ml/infer-b  srv"),
        "{table}"
    );
    assert!(!table.contains("rdma"), "{table}");
}

fn base64_of(a: &ContainerAllocateResponse) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(prost::Message::encode_to_vec(a))
}

/// `kubelet_internal_checkpoint` as kubelet writes it: NUMA-keyed device IDs, the
/// AllocResp as base64 protobuf, kubelet's checksum.
fn write_checkpoint(
    dir: &Path,
    entries: &[serde_json::Value],
    registered: &serde_json::Value,
) -> PathBuf {
    use accel_container_runtime::checkpoint::{kubelet_checksum, Checkpoint};
    let path = dir.join("kubelet_internal_checkpoint");
    let mut doc = serde_json::json!({
        "Data": { "PodDeviceEntries": entries, "RegisteredDevices": registered },
        "Checksum": 0,
    });
    let text = serde_json::to_vec(&doc).unwrap();
    let cp = Checkpoint::parse(&text, &path).unwrap();
    doc["Checksum"] = kubelet_checksum(&cp.data).unwrap().into();
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    path
}

/// `accel-ctk checkpoint check --checkpoint <cp>`: exit code and stdout + stderr.
fn ctk_check(config: &Path, cp: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(&*CTK)
        .args(["checkpoint", "check", "--checkpoint"])
        .arg(cp)
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The shim's config for `sim` with `extra` top-level keys, CDI specs read from `cdi_dir`,
/// and 4 replicas per GCU.
fn runc_with_replicas(sim: &SimRoot, extra: &str, cdi_dir: &Path) -> common::Runc {
    let runc = common::Runc::with_config(sim, &format!("{extra}\ncdi-spec-dirs = [{cdi_dir:?}]"));
    let path = runc.config_path();
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "[profiles.enflame]\n",
        "[profiles.enflame]\nreplicas = 4\n",
        1,
    );
    std::fs::write(&path, text).unwrap();
    runc
}

/// Runs `b` (a busybox bundle) under the shim and real runc and asserts that the container
/// sees exactly gcu1, gcu3 and gcuctl.
fn assert_sees_1_3(runc: &common::Runc, mut b: common::Bundle, name: &str) {
    let probe = common::Probe::new()
        .ls("/dev")
        .open("/dev/gcu1")
        .open("/dev/gcu3")
        .open("/dev/gcuctl")
        .open("/dev/gcu0");
    b.sh(&probe.script());
    let id = runc.id(name);
    let out = runc.run(&b, &id);
    out.ok();
    let r = common::Report::parse(&out.stdout);
    common::assert_enflame_1_3(&r, &format!("{name}: "));
}

/// Replicas through the runtime and real runc, checked from inside the container: the
/// plugin's answer for three replicas of GCU 1 and 3 by every strategy; and replica IDs
/// handed to the runtime itself, in the variable, as device-list mounts and as CDI names.
#[test]
fn replicas_through_the_runtime_and_runc_give_their_devices() {
    let sim = SimRoot::standard();
    for (strategy, extra) in common::kubelet::STRATEGIES {
        let cdi_dir = tempfile::tempdir().unwrap();
        let runc = runc_with_replicas(&sim, extra, cdi_dir.path());
        let cfg = Config::load(&runc.config_path()).unwrap();
        let profile = cfg
            .profiles
            .into_iter()
            .find(|p| p.name == "enflame")
            .unwrap();
        let mut opts = Options::new(PathBuf::from("/nonexistent"));
        opts.cdi_dir = cdi_dir.path().to_path_buf();
        server::write_cdi(&profile, &opts).unwrap();
        let plugin = service::Plugin::new(profile, vec![strategy]).unwrap();
        let answer = plugin
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&["GCU-3::1", "GCU-1::0", "GCU-3::2"]),
                }],
            })
            .unwrap()
            .container_responses
            .remove(0);
        let mut b = common::Bundle::busybox();
        apply_answer(&mut b, &answer);
        assert_sees_1_3(&runc, b, &format!("replicas-{}", strategy.as_str()));
    }

    // The runtime given replica IDs itself (as NVIDIA's plugin hands them on).
    let cdi_dir = tempfile::tempdir().unwrap();
    let runc = runc_with_replicas(&sim, "", cdi_dir.path());
    let mut b = common::Bundle::busybox();
    b.env("ENFLAME_VISIBLE_DEVICES=3::1,GCU-1::0,1::3");
    assert_sees_1_3(&runc, b, "replicas-variable");

    let cfg = Config::load(&runc.config_path()).unwrap();
    let profile = cfg
        .profiles
        .into_iter()
        .find(|p| p.name == "enflame")
        .unwrap();
    let mut opts = Options::new(PathBuf::from("/nonexistent"));
    opts.cdi_dir = cdi_dir.path().to_path_buf();
    server::write_cdi(&profile, &opts).unwrap();
    let mut b = common::Bundle::busybox();
    b.env("ENFLAME_VISIBLE_DEVICES=enflame.com/gcu=1::1,enflame.com/gcu=3::0");
    assert_sees_1_3(&runc, b, "replicas-cdi-names");

    let runc = runc_with_replicas(
        &sim,
        "accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true",
        cdi_dir.path(),
    );
    let mut b = common::Bundle::busybox();
    b.edit(|s| {
        let mounts = s["mounts"].as_array_mut().unwrap();
        for id in ["GCU-1::2", "3::0", "3::1"] {
            mounts.push(serde_json::json!({
                "destination": format!("/var/run/enflame-container-devices/{id}"),
                "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"],
            }));
        }
    });
    assert_sees_1_3(&runc, b, "replicas-mounts");
}
