//! accel-dra-driver against a stand-in API server (tests/common/apiserver.rs: the JSON of
//! resource.k8s.io/v1) and a stand-in kubelet (plugin registration, then the DRA gRPC over
//! the unix sockets, as kubelet calls them), on the seed's simulated 8-GCU Enflame host; the
//! prepared CDI spec then gives a container its devices through our runtime and real runc
//! (through containerd 2's own CDI: tests/e2e_cri.rs, in the sid guest of tests/vm).
//!
//! `cargo test --features dra --test dra` (root: the simulated nodes are made with mknod).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use accel_container_runtime::kubelet::proto::health::{HealthStatus, NodeWatchResourcesResponse};
use common::apiserver::ApiServer;
use common::dra::{
    cdi_ids, claim, prepare, register, unprepare, wait_slices, Driver, DRIVER, NODE,
};
use common::grpc;
use common::grpc::{PREPARE_V1, PREPARE_V1BETA1, WATCH_HEALTH_V1, WATCH_HEALTH_V1ALPHA1};
use common::kubelet::{config, enflame_host, rt};
use common::{assert_enflame_1_3, Bundle, Probe, Report, Runc};
use serde_json::Value;

fn devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

const UID_A: &str = "0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e2a";

/// The seed's 8 GCUs published with their attributes; the pool's generation follows devices
/// turning unhealthy (tainted) and back, and a slice wiped by kubelet is published again.
#[test]
fn the_8_gcu_topology_is_published_with_its_attributes_and_health() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    rt().block_on(async {
        let mut drv = Driver::start(
            &cfg,
            &api,
            tempfile::tempdir().unwrap(),
            Duration::from_millis(50),
        );
        let _ = &mut drv;
        let s = wait_slices(&api, "first publish", |s| !s.is_empty()).await;
        assert_eq!(s.len(), 1);
        assert_eq!(s[0]["spec"]["nodeName"], NODE);
        assert_eq!(s[0]["spec"]["pool"]["name"], NODE);
        assert_eq!(s[0]["spec"]["pool"]["generation"], 1);
        assert_eq!(s[0]["spec"]["pool"]["resourceSliceCount"], 1);
        // No NVIDIA GPU on this host: no gpu.nvidia.com slice.
        assert!(api.slices().iter().all(|x| x["spec"]["driver"] == DRIVER));
        let d = devices(&s);
        let names: Vec<&str> = d.iter().map(|x| x["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["gcu-0", "gcu-1", "gcu-2", "gcu-3", "gcu-4", "gcu-5", "gcu-6", "gcu-7"]
        );
        let switches = [
            "0000:01:00.0",
            "0000:01:00.0",
            "",
            "",
            "0000:81:00.0",
            "0000:81:00.0",
            "",
            "",
        ];
        for (i, dev) in d.iter().enumerate() {
            let a = &dev["attributes"];
            assert_eq!(a["vendor"]["string"], "enflame", "{dev}");
            assert_eq!(a["index"]["int"], i, "{dev}");
            assert_eq!(a["driverVersionText"]["string"], "1.2.3.4", "{dev}");
            assert!(
                a.get("driverVersion").is_none(),
                "1.2.3.4 is not semver: {dev}"
            );
            assert_eq!(
                a["resource.kubernetes.io/pciBusID"]["string"],
                format!("0000:{:02x}:00.0", 0x10 + i),
                "{dev}"
            );
            let (root, numa) = if i < 4 {
                ("pci0000:00", 0)
            } else {
                ("pci0000:80", 1)
            };
            assert_eq!(
                a["resource.kubernetes.io/pcieRoot"]["string"], root,
                "{dev}"
            );
            assert_eq!(a["numaNode"]["int"], numa, "{dev}");
            assert_eq!(a["resource.kubernetes.io/numaNode"]["int"], numa, "{dev}");
            match switches[i] {
                "" => assert!(a.get("pcieSwitch").is_none(), "{dev}"),
                sw => assert_eq!(a["pcieSwitch"]["string"], sw, "{dev}"),
            }
            assert!(dev.get("taints").is_none(), "{dev}");
        }

        // The driver unloaded (its version file gone): every device tainted, a new generation.
        let version = sim.path().join("sys/module/enflame/version");
        std::fs::rename(&version, version.with_extension("away")).unwrap();
        let s = wait_slices(&api, "tainted", |s| {
            devices(s)
                .iter()
                .all(|d| d["taints"][0]["key"] == format!("{DRIVER}/gone"))
        })
        .await;
        assert_eq!(s[0]["spec"]["pool"]["generation"], 2);
        assert_eq!(devices(&s)[0]["taints"][0]["effect"], "NoSchedule");
        assert_eq!(devices(&s)[0]["taints"][0]["value"], "driver-not-loaded");
        std::fs::rename(version.with_extension("away"), &version).unwrap();
        let s = wait_slices(&api, "healthy again", |s| {
            devices(s).iter().all(|d| d.get("taints").is_none())
        })
        .await;
        assert_eq!(s[0]["spec"]["pool"]["generation"], 3);

        // A device gone: the pool shrinks, at a new generation.
        let gcu5 = sim.path().join("dev/gcu5");
        std::fs::remove_file(&gcu5).unwrap();
        let s = wait_slices(&api, "gcu5 gone", |s| devices(s).len() == 7).await;
        assert_eq!(s[0]["spec"]["pool"]["generation"], 4);
        common::mknod(&gcu5, sim.enflame_major().unwrap(), 5, 0o666);
        let s = wait_slices(&api, "gcu5 back", |s| devices(s).len() == 8).await;
        let generation = s[0]["spec"]["pool"]["generation"].as_i64().unwrap();

        // kubelet deletes the node's slices when it starts: the watch sees it and the driver
        // publishes them again, at a generation above the last.
        api.wipe();
        let s = wait_slices(&api, "republished", |s| devices(s).len() == 8).await;
        assert!(s[0]["spec"]["pool"]["generation"].as_i64().unwrap() > generation);

        // Every write was a create or an update of the one slice; nothing else was touched.
        for r in api.requests() {
            assert!(
                r.path
                    .starts_with("/apis/resource.k8s.io/v1/resourceslices"),
                "{} {}",
                r.method,
                r.path
            );
        }
        drv.stop().await;
    });
}

/// kubelet's health watch (the registration lists the service; kubelet 1.34-1.36 call it
/// under v1alpha1, 1.37 under v1): every device, healthy, then each check again; the driver
/// unloaded turns every device unhealthy with why, and back.
#[test]
fn kubelet_watches_every_devices_health() {
    use tokio_stream::StreamExt;
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
        let (info, dra) = register(&drv.reg_socket()).await;
        for v in [
            "v1alpha1.DRAResourceHealth",
            "v1beta1.DRAResourceHealth",
            "v1.DRAResourceHealth",
        ] {
            assert!(info.supported_versions.iter().any(|s| s == v), "{info:?}");
        }
        let mut alpha = grpc::watch_health(&dra, WATCH_HEALTH_V1ALPHA1)
            .await
            .unwrap();
        let mut v1 = grpc::watch_health(&dra, WATCH_HEALTH_V1).await.unwrap();
        async fn next_where(
            s: &mut tonic::codec::Streaming<NodeWatchResourcesResponse>,
            what: &str,
            ok: impl Fn(&NodeWatchResourcesResponse) -> bool,
        ) -> NodeWatchResourcesResponse {
            let wait = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    let r = s.next().await.expect("stream open").expect("a message");
                    if ok(&r) {
                        return r;
                    }
                }
            });
            wait.await
                .unwrap_or_else(|_| panic!("{what}: no such update in 20 s"))
        }
        let all = |h: HealthStatus| {
            move |r: &NodeWatchResourcesResponse| {
                r.devices.len() == 8 && r.devices.iter().all(|d| d.health == h as i32)
            }
        };
        let r = next_where(&mut alpha, "healthy", all(HealthStatus::Healthy)).await;
        let names: Vec<(&str, &str)> = r
            .devices
            .iter()
            .map(|d| {
                let id = d.device.as_ref().unwrap();
                (id.pool_name.as_str(), id.device_name.as_str())
            })
            .collect();
        let want: Vec<String> = (0..8).map(|i| format!("gcu-{i}")).collect();
        assert_eq!(
            names,
            want.iter().map(|n| (NODE, n.as_str())).collect::<Vec<_>>()
        );
        assert!(r.devices.iter().all(|d| d.last_updated_time > 1_700_000_000
            && d.health_check_timeout_seconds >= 30
            && d.message.is_empty()));
        // Sent again at each check, not only on a change.
        let again = next_where(&mut alpha, "again", all(HealthStatus::Healthy)).await;
        assert_eq!(again.devices.len(), 8);
        assert_eq!(
            next_where(&mut v1, "v1", all(HealthStatus::Healthy))
                .await
                .devices
                .len(),
            8
        );

        let version = sim.path().join("sys/module/enflame/version");
        std::fs::rename(&version, version.with_extension("away")).unwrap();
        let r = next_where(&mut alpha, "unhealthy", all(HealthStatus::Unhealthy)).await;
        assert!(
            r.devices.iter().all(|d| d.message.contains("not loaded")),
            "{r:?}"
        );
        next_where(&mut v1, "v1 unhealthy", all(HealthStatus::Unhealthy)).await;
        std::fs::rename(version.with_extension("away"), &version).unwrap();
        next_where(&mut alpha, "healthy again", all(HealthStatus::Healthy)).await;
        drop((alpha, v1, dra));
        drv.stop().await;
    });
}

/// Registration as kubelet does it; a claim of GCU 1 and 3 prepared over v1 (again: the same
/// answer, over v1beta1 too), its CDI spec giving a container exactly gcu1, gcu3 and gcuctl
/// through our runtime and real runc; after a driver restart the claim is unprepared from its
/// record.
#[test]
fn a_claim_is_prepared_run_and_unprepared_across_a_restart() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.put_claim(
        "default",
        "two",
        UID_A,
        DRIVER,
        NODE,
        &[("gcus", "gcu-3"), ("gcus", "gcu-1")],
    );
    rt().block_on(async {
        let drv = Driver::start(
            &cfg,
            &api,
            tempfile::tempdir().unwrap(),
            Duration::from_millis(100),
        );
        wait_slices(&api, "publish", |s| !s.is_empty()).await;
        let (info, ch) = register(&drv.reg_socket()).await;
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, DRIVER);
        assert_eq!(
            info.supported_versions,
            [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1beta1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"
            ]
        );
        assert_eq!(
            PathBuf::from(&info.endpoint),
            drv.dir.path().join(format!("plugins/{DRIVER}/dra.sock"))
        );

        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "two", UID_A)]).await;
        let got = &r.claims[UID_A];
        assert_eq!(got.error, "");
        let ids = cdi_ids(got);
        assert_eq!(
            ids,
            [
                format!("k8s.{DRIVER}/claim={UID_A}-gcu-3"),
                format!("k8s.{DRIVER}/claim={UID_A}-gcu-1")
            ]
        );
        assert_eq!(got.devices[0].request_names, ["gcus"]);
        assert_eq!(got.devices[0].pool_name, NODE);
        // What the container got, in the claim's status (issue 36): as `kubectl get
        // resourceclaim two -o yaml` shows it.
        let c = api.claim("default", "two");
        let status = &c["status"]["devices"];
        println!(
            "status.devices:\n{}",
            serde_yaml_ng::to_string(status).unwrap()
        );
        let entries = status.as_array().unwrap();
        assert_eq!(entries.len(), 2, "{status}");
        for (e, n) in entries.iter().zip([3, 1]) {
            assert_eq!(e["driver"], DRIVER);
            assert_eq!(e["pool"], NODE);
            assert_eq!(e["device"], format!("gcu-{n}"));
            assert_eq!(e["conditions"][0]["type"], "Ready");
            assert_eq!(e["conditions"][0]["status"], "True");
            assert_eq!(
                e["data"]["nodes"],
                serde_json::json!([format!("/dev/gcu{n}")])
            );
            assert_eq!(e["data"]["pciBusID"], format!("0000:{:02x}:00.0", 0x10 + n));
            assert_eq!(e["data"]["driverVersion"], "1.2.3.4");
        }
        let spec = drv.spec_path(UID_A);
        let ino = std::fs::metadata(&spec).unwrap();
        // Idempotent: the same answer, the spec untouched; v1beta1 answers the same.
        let again = prepare(&ch, PREPARE_V1, vec![claim("default", "two", UID_A)]).await;
        assert_eq!(again.claims[UID_A], *got);
        let beta = prepare(&ch, PREPARE_V1BETA1, vec![claim("default", "two", UID_A)]).await;
        assert_eq!(beta.claims[UID_A], *got);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&spec).unwrap().ino(), ino.ino());

        // The container kubelet starts with these CDI IDs: exactly its devices.
        // containerd and CRI-O resolve CDIDevices themselves; our runtime, given them as an
        // annotation, lets a profile reach the claim kind it is told of (cdi-extra-kinds).
        let runc = Runc::with_config(&sim, &format!("cdi-spec-dirs = [{:?}]", drv.cdi_dir()));
        let text = std::fs::read_to_string(runc.config_path())
            .unwrap()
            .replace(
                "[profiles.enflame]\n",
                &format!("[profiles.enflame]\ncdi-extra-kinds = [\"k8s.{DRIVER}/claim\"]\n"),
            );
        std::fs::write(runc.config_path(), text).unwrap();
        let mut b = Bundle::busybox();
        b.edit(|s| {
            s["annotations"] = serde_json::json!({"cdi.k8s.io/dra-claim": ids.join(",")});
        });
        let probe = Probe::new()
            .ls("/dev")
            .open("/dev/gcu1")
            .open("/dev/gcu3")
            .open("/dev/gcuctl")
            .open("/dev/gcu0");
        b.sh(&probe.script());
        let id = runc.id("dra");
        let out = runc.run(&b, &id);
        out.ok();
        assert_enflame_1_3(&Report::parse(&out.stdout), "dra: ");

        // Restart: the claim prepared before is unprepared after it.
        let dir = drv.stop().await;
        assert!(spec.exists());
        let drv = Driver::start(&cfg, &api, dir, Duration::from_millis(100));
        let (_, ch) = register(&drv.reg_socket()).await;
        let u = unprepare(&ch, vec![claim("default", "two", UID_A)]).await;
        assert_eq!(u.claims[UID_A].error, "");
        assert!(!spec.exists(), "spec left after unprepare");
        assert!(!drv
            .dir
            .path()
            .join(format!("state/{DRIVER}/{UID_A}.json"))
            .exists());
        // Unknown (already unprepared) claims are success.
        let u = unprepare(&ch, vec![claim("default", "two", UID_A)]).await;
        assert_eq!(u.claims[UID_A].error, "");
        drv.stop().await;
    });
}

/// Concurrent claims: eight claims of one GCU each, prepared in one call and from parallel
/// calls, each get their own spec; a claim for a device another claim holds is refused.
#[test]
fn concurrent_claims_get_their_own_devices() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    let uid = |i: usize| format!("0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1f{i:02}");
    for i in 0..8 {
        api.put_claim(
            "ns",
            &format!("c{i}"),
            &uid(i),
            DRIVER,
            NODE,
            &[("gcus", &format!("gcu-{i}"))],
        );
    }
    api.put_claim("ns", "thief", &uid(99), DRIVER, NODE, &[("gcus", "gcu-2")]);
    rt().block_on(async {
        let (drv, ch) = Driver::serving(&cfg, &api, Duration::from_millis(100)).await;
        let one = prepare(
            &ch,
            PREPARE_V1,
            (0..4)
                .map(|i| claim("ns", &format!("c{i}"), &uid(i)))
                .collect(),
        )
        .await;
        let mut tasks = Vec::new();
        for i in 4..8 {
            let ch = ch.clone();
            let c = claim("ns", &format!("c{i}"), &uid(i));
            tasks.push(tokio::spawn(async move {
                prepare(&ch, PREPARE_V1, vec![c]).await
            }));
        }
        let mut all = one.claims;
        for t in tasks {
            all.extend(t.await.unwrap().claims);
        }
        assert_eq!(all.len(), 8);
        for i in 0..8 {
            let r = &all[&uid(i)];
            assert_eq!(r.error, "", "c{i}");
            assert_eq!(r.devices[0].device_name, format!("gcu-{i}"));
            assert!(drv.spec_path(&uid(i)).exists());
        }
        let t = prepare(&ch, PREPARE_V1, vec![claim("ns", "thief", &uid(99))]).await;
        let e = &t.claims[&uid(99)].error;
        assert!(
            e.contains("device gcu-2 (nodes ") && e.contains(" is prepared for claim ns/c2 "),
            "{e}"
        );
        assert!(!drv.spec_path(&uid(99)).exists());
        drv.stop().await;
    });
}

/// A node missing when the claim is prepared (the driver saw it at its last look): the
/// prepare fails with one line naming the node, no spec or record is written, and once the
/// node is back the retry succeeds (nothing bad was cached: NVIDIA's driver issue #1380).
#[test]
fn a_node_missing_at_prepare_fails_it_and_caches_nothing() {
    let (sim, major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.put_claim("default", "six", UID_A, DRIVER, NODE, &[("gcus", "gcu-6")]);
    rt().block_on(async {
        // One look at the devices only: the table still lists gcu-6 when its node goes.
        let (drv, ch) = Driver::serving(&cfg, &api, Duration::from_secs(3600)).await;
        let gcu6 = sim.path().join("dev/gcu6");
        std::fs::remove_file(&gcu6).unwrap();
        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "six", UID_A)]).await;
        let e = &r.claims[UID_A].error;
        assert_eq!(
            *e,
            format!(
                "claim default/six ({UID_A}): device gcu-6: {}: does not exist; nothing prepared (kubelet retries)",
                gcu6.display()
            )
        );
        assert!(r.claims[UID_A].devices.is_empty());
        assert_eq!(std::fs::read_dir(drv.cdi_dir()).map(|d| d.count()).unwrap_or(0), 0);
        assert!(!drv.dir.path().join(format!("state/{DRIVER}/{UID_A}.json")).exists());

        // Wrong major: refused the same way.
        common::mknod(&gcu6, major + 1, 6, 0o666);
        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "six", UID_A)]).await;
        assert!(r.claims[UID_A].error.contains(&format!("has major {}, the driver's is {major}", major + 1)), "{:?}", r.claims[UID_A]);
        std::fs::remove_file(&gcu6).unwrap();

        common::mknod(&gcu6, major, 6, 0o666);
        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "six", UID_A)]).await;
        assert_eq!(r.claims[UID_A].error, "");
        let spec = std::fs::read_to_string(drv.spec_path(UID_A)).unwrap();
        assert!(spec.contains("/dev/gcu6"), "{spec}");
        drv.stop().await;
    });
}

/// Issue 36, quiet at fleet scale: a steady driver sends no request to the API server over a
/// minute (it listed every resync), and a slice deleted or changed behind its back is written
/// back within seconds, seen through its watch.
#[test]
fn a_steady_driver_sends_nothing_and_puts_back_what_others_change() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    rt().block_on(async {
        let drv = Driver::start(
            &cfg,
            &api,
            tempfile::tempdir().unwrap(),
            Duration::from_millis(100),
        );
        let s = wait_slices(&api, "publish", |s| !s.is_empty()).await;
        let name = s[0]["metadata"]["name"].as_str().unwrap().to_string();
        // Settled: the watch's own events have come back.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = api.requests().len();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let during: Vec<String> = api.requests()[before..]
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        assert!(during.is_empty(), "a steady driver sent {during:#?}");

        let generation = s[0]["spec"]["pool"]["generation"].as_i64().unwrap();
        let t = std::time::Instant::now();
        api.delete_slice(&name);
        let s = wait_slices(&api, "put back after a delete", |s| !s.is_empty()).await;
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(s[0]["spec"]["pool"]["generation"].as_i64().unwrap() > generation);

        let t = std::time::Instant::now();
        api.edit_slice(&name, |s| {
            s["spec"]["devices"].as_array_mut().unwrap().truncate(2);
        });
        let s = wait_slices(&api, "put back after an edit", |s| {
            s.len() == 1 && s[0]["spec"]["devices"].as_array().unwrap().len() == 8
        })
        .await;
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(devices(&s)[7]["name"], "gcu-7");
        drv.stop().await;
    });
}

/// Issue 36, an upgrade without a gap: the old and the new pod of a rolling update run at
/// once, each with its own sockets (kubelet takes both registrations and calls the newer),
/// over one state directory: a device one gave is never given by the other, a prepare sent to
/// both during the switch prepares the claim once, and the old one leaving takes no slice and
/// no socket of the new one with it.
#[test]
fn a_rolling_updates_two_instances_keep_one_set_of_claims() {
    use accel_container_runtime::dra::server::socket_paths;
    let uid = |i: usize| format!("0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e{i:02}");
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.put_claim("ns", "a", &uid(1), DRIVER, NODE, &[("gcus", "gcu-1")]);
    api.put_claim("ns", "b", &uid(2), DRIVER, NODE, &[("gcus", "gcu-1")]);
    api.put_claim("ns", "c", &uid(3), DRIVER, NODE, &[("gcus", "gcu-2")]);
    let dir = tempfile::tempdir().unwrap();
    let mut old_opts = common::dra::options(dir.path(), Duration::from_millis(100));
    old_opts.instance = Some("0ld-pod-uid".into());
    let mut new_opts = old_opts.clone();
    new_opts.instance = Some("new-pod-uid".into());
    rt().block_on(async {
        let old = Driver::start_with(&cfg, &api, dir, old_opts.clone());
        wait_slices(&api, "publish", |s| !s.is_empty()).await;
        let (old_info, old_ch) = register(&socket_paths(&old_opts, DRIVER).unwrap().1).await;
        let a = prepare(&old_ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(a.claims[&uid(1)].error, "");

        let new = Driver::start_with(&cfg, &api, tempfile::tempdir().unwrap(), new_opts.clone());
        let (new_info, new_ch) = register(&socket_paths(&new_opts, DRIVER).unwrap().1).await;
        assert_eq!(new_info.name, old_info.name);
        assert_ne!(new_info.endpoint, old_info.endpoint);
        // The old one's claim is the new one's to keep others off.
        let b = prepare(&new_ch, PREPARE_V1, vec![claim("ns", "b", &uid(2))]).await;
        let e = &b.claims[&uid(2)].error;
        assert!(e.contains("is prepared for claim ns/a "), "{e}");

        // Sent to both during the switch: prepared once, the same answer.
        let (via_old, via_new) = tokio::join!(
            prepare(&old_ch, PREPARE_V1, vec![claim("ns", "c", &uid(3))]),
            prepare(&new_ch, PREPARE_V1, vec![claim("ns", "c", &uid(3))])
        );
        assert_eq!(via_old.claims[&uid(3)].error, "");
        assert_eq!(via_old.claims[&uid(3)], via_new.claims[&uid(3)]);
        let state = old_opts.state_dir.join(DRIVER);
        let records: Vec<_> = std::fs::read_dir(&state)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json"))
            .collect();
        assert_eq!(records.len(), 2, "{records:?}");

        // The new one unprepares what the old one prepared.
        let u = unprepare(&new_ch, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(u.claims[&uid(1)].error, "");
        let b = prepare(&new_ch, PREPARE_V1, vec![claim("ns", "b", &uid(2))]).await;
        assert_eq!(b.claims[&uid(2)].error, "");

        // The old one leaves: its sockets go, the new one's stay, no slice is deleted.
        let writes_before = api.requests().len();
        // Its dirs are the new one's too: kept.
        let _dir = old.stop().await;
        for p in [
            &old_info.endpoint,
            &socket_paths(&old_opts, DRIVER)
                .unwrap()
                .1
                .display()
                .to_string(),
        ] {
            assert!(!std::path::Path::new(p).exists(), "{p} left behind");
        }
        assert!(std::path::Path::new(&new_info.endpoint).exists());
        assert!(socket_paths(&new_opts, DRIVER).unwrap().1.exists());
        assert!(
            api.requests()[writes_before..]
                .iter()
                .all(|r| r.method != "DELETE"),
            "{:?}",
            api.requests()
        );
        assert!(!api.slices_of(DRIVER).is_empty());
        let u = unprepare(
            &new_ch,
            vec![claim("ns", "b", &uid(2)), claim("ns", "c", &uid(3))],
        )
        .await;
        assert!(u.claims.values().all(|r| r.error.is_empty()), "{u:?}");
        new.stop().await;
    });
}

/// Issue 42 item 12: every driver wrote claims' `status.devices` under one field manager, so
/// where one claim holds devices of two of a node's drivers, the second driver's apply took
/// the first one's entries out (server-side apply removes what the manager applied before and
/// leaves out now). A field manager per driver keeps each driver's entries.
#[test]
fn policies_narrower_than_the_api_a_field_manager_per_driver_keeps_both_drivers_status() {
    const NV: &str = "gpu.nvidia.com";
    let sim = common::SimRoot::builder()
        .enflame(8)
        .library(common::LIB_DIR, "libefml.so.1.2.3", "libefml.so.1")
        .nvidia(&[("0000:41:00.0", 0)])
        .library(common::LIB_DIR, "libcuda.so.550.54.14", "libcuda.so.1")
        .library(
            common::LIB_DIR,
            "libnvidia-ml.so.550.54.14",
            "libnvidia-ml.so.1",
        )
        .build();
    common::kubelet::enflame_sysfs(sim.path(), sim.enflame_major().unwrap());
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    rt().block_on(async {
        let drv = Driver::start(
            &cfg,
            &api,
            tempfile::tempdir().unwrap(),
            Duration::from_millis(100),
        );
        wait_slices(&api, "publish", |s| !s.is_empty()).await;
        let start = std::time::Instant::now();
        let gpu = loop {
            let d = devices(&api.slices_of(NV));
            if let Some(name) = d.first().and_then(|d| d["name"].as_str()) {
                break name.to_string();
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no {NV} slice");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let result = |req: &str, driver: &str, device: &str| {
            serde_json::json!({"request": req, "driver": driver, "pool": NODE, "device": device})
        };
        api.put_claim_results(
            "default",
            "both",
            UID_A,
            DRIVER,
            vec![
                result("gcus", DRIVER, "gcu-1"),
                result("gpus", NV, &gpu),
            ],
        );
        for driver in [DRIVER, NV] {
            let reg = drv
                .dir
                .path()
                .join(format!("plugins_registry/{driver}-reg.sock"));
            let (_, ch) = register(&reg).await;
            let r = prepare(&ch, PREPARE_V1, vec![claim("default", "both", UID_A)]).await;
            assert_eq!(r.claims[UID_A].error, "", "{driver}");
        }
        let status = api.claim("default", "both")["status"]["devices"].clone();
        let mut held: Vec<(String, String)> = status
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["driver"].as_str().unwrap().to_string(),
                    e["device"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        held.sort();
        assert_eq!(
            held,
            [(DRIVER.to_string(), "gcu-1".to_string()), (NV.to_string(), gpu)],
            "{status}"
        );
        let managers: std::collections::BTreeSet<String> = api
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("/resourceclaims/both/status"))
            .map(|r| {
                let q = r.path.split_once("fieldManager=").unwrap().1;
                q.split('&').next().unwrap().to_string()
            })
            .collect();
        assert_eq!(managers.len(), 2, "{managers:?}");
        drv.stop().await;
    });
}

/// The DRA DaemonSet's admission policy, evaluated as kube-apiserver evaluates it (CEL, its
/// variables in order, every validation) on the writes a driver can make.
mod policy {
    use std::collections::HashMap;

    use crate::common::dra::to_cel;
    use accel_container_runtime::kubelet::names::driver_name;
    use accel_container_runtime::profile::Profile;
    use serde_json::{json, Value};

    const MANIFEST: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/kubernetes/components/dra/accel-dra-driver.yaml"
    );

    const SLICES: &str = "accel-dra-driver-own-node-slices";
    const CLAIM_STATUS: &str = "accel-dra-driver-claim-status";
    /// The token-request policy's answer to a pod's token.
    const POD_TOKEN: &str = "a pod's token may not ask for another token: kubelet renews it; only the Node-bound credential of the driver run from systemd renews its own";

    fn policy(name: &str) -> Value {
        let text = std::fs::read_to_string(MANIFEST).unwrap();
        let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        docs.into_iter()
            .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the DaemonSet's ValidatingAdmissionPolicy {name}"))
    }

    fn cel(expr: &str, ctx: &cel::Context) -> cel::Value {
        cel::Program::compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
            .execute(ctx)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    /// What the policy answers a request: `Err` with the first failing validation's message.
    fn admit(op: &str, node: Option<&str>, object: Value, old: Value) -> Result<(), String> {
        admit_by(SLICES, op, node, object, old)
    }

    /// As [`admit`], by the policy `name`.
    fn admit_by(
        name: &str,
        op: &str,
        node: Option<&str>,
        object: Value,
        old: Value,
    ) -> Result<(), String> {
        admit_as(name, op, extra(node, false), object, old)
    }

    /// A credential's user info extras as the API server gives them: a pod's projected token
    /// names its pod and its node; a token bound to a Node names the node alone.
    fn extra(node: Option<&str>, pod: bool) -> Value {
        let mut e = serde_json::Map::new();
        if let Some(n) = node {
            e.insert("authentication.kubernetes.io/node-name".into(), json!([n]));
        }
        if pod {
            e.insert(
                "authentication.kubernetes.io/pod-name".into(),
                json!(["accel-dra-driver-x7k2p"]),
            );
        }
        e.into()
    }

    /// As [`admit_by`], for a credential with the user info `extra`.
    fn admit_as(
        name: &str,
        op: &str,
        extra: Value,
        object: Value,
        old: Value,
    ) -> Result<(), String> {
        let p = policy(name);
        let request = json!({
            "operation": op,
            "userInfo": {
                "username": "system:serviceaccount:accel-system:accel-dra-driver",
                "extra": extra,
            },
        });
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("request", to_cel(&request));
        ctx.add_variable_from_value("object", to_cel(&object));
        ctx.add_variable_from_value("oldObject", to_cel(&old));
        for m in p["spec"]["matchConditions"].as_array().unwrap() {
            assert_eq!(
                cel(m["expression"].as_str().unwrap(), &ctx),
                cel::Value::Bool(true)
            );
        }
        let mut vars: HashMap<String, cel::Value> = HashMap::new();
        for v in p["spec"]["variables"].as_array().unwrap() {
            let got = cel(v["expression"].as_str().unwrap(), &ctx);
            vars.insert(v["name"].as_str().unwrap().to_string(), got);
            ctx.add_variable_from_value("variables", vars.clone());
        }
        for v in p["spec"]["validations"].as_array().unwrap() {
            if cel(v["expression"].as_str().unwrap(), &ctx) != cel::Value::Bool(true) {
                let msg = match v.get("messageExpression") {
                    Some(m) => match cel(m.as_str().unwrap(), &ctx) {
                        cel::Value::String(s) => s.to_string(),
                        other => format!("{other:?}"),
                    },
                    None => v["message"].as_str().unwrap().to_string(),
                };
                return Err(msg);
            }
        }
        Ok(())
    }

    fn slice(driver: &str, node: &str) -> Value {
        json!({"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}}})
    }

    /// Every driver name the shipped profiles give, as the driver derives them.
    fn shipped_drivers() -> Vec<String> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/profiles");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let path = e.unwrap().path();
                let text = std::fs::read_to_string(&path).unwrap();
                let name = path.file_stem().unwrap().to_str().unwrap().to_string();
                let (p, _) = Profile::from_table(toml::from_str(&text).unwrap(), &name).unwrap();
                driver_name(&p, None).unwrap()
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Issue 32 class 11: the driver's account could replace or delete another driver's
    /// slices on its node, and publish under any driver's name.
    #[test]
    fn class11_the_driver_writes_only_its_own_drivers_slices_of_its_own_node() {
        let drivers = shipped_drivers();
        assert_eq!(drivers.len(), 11, "{drivers:?}");
        for d in &drivers {
            let mine = slice(d, "n1");
            assert_eq!(
                admit("CREATE", Some("n1"), mine.clone(), Value::Null),
                Ok(()),
                "{d}"
            );
            assert_eq!(
                admit("UPDATE", Some("n1"), mine.clone(), mine.clone()),
                Ok(())
            );
            assert_eq!(
                admit("DELETE", Some("n1"), Value::Null, mine.clone()),
                Ok(())
            );
        }
        let theirs = slice("gpu.example.com", "n1");
        let e = admit("CREATE", Some("n1"), theirs.clone(), Value::Null).unwrap_err();
        assert!(e.contains("not of gpu.example.com"), "{e}");
        let e = admit("DELETE", Some("n1"), Value::Null, theirs.clone()).unwrap_err();
        assert!(e.contains("not of gpu.example.com"), "{e}");
        // Taking over another driver's slice by replacing it with one of ours.
        let ours = slice("gcu.enflame.com", "n1");
        let e = admit("UPDATE", Some("n1"), ours.clone(), theirs).unwrap_err();
        assert!(e.contains("not of gpu.example.com"), "{e}");
        // Another node's slice, written or moved here.
        let other_node = slice("gcu.enflame.com", "n2");
        for (op, new, old) in [
            ("CREATE", other_node.clone(), Value::Null),
            ("DELETE", Value::Null, other_node.clone()),
            ("UPDATE", ours.clone(), other_node.clone()),
            ("UPDATE", other_node, ours.clone()),
        ] {
            let e = admit(op, Some("n1"), new, old).unwrap_err();
            assert!(
                e.contains("may only write that node's ResourceSlices"),
                "{op}: {e}"
            );
        }
        assert_eq!(
            admit("CREATE", None, ours, Value::Null).unwrap_err(),
            "the driver's token names no node"
        );
    }

    /// Issue 42 item 12: the slice policy pinned the node and the driver but not the pool,
    /// so a node's driver could publish into another node's pool (or one made up), which the
    /// scheduler reads as that pool's.
    #[test]
    fn policies_narrower_than_the_api_a_slice_is_in_its_nodes_pool() {
        let mine = slice("gcu.enflame.com", "n1");
        assert_eq!(
            admit("CREATE", Some("n1"), mine.clone(), Value::Null),
            Ok(())
        );
        let mut elsewhere = mine.clone();
        elsewhere["spec"]["pool"]["name"] = "n2".into();
        for (op, new, old) in [
            ("CREATE", elsewhere.clone(), Value::Null),
            ("UPDATE", elsewhere.clone(), mine.clone()),
            ("UPDATE", mine, elsewhere.clone()),
            ("DELETE", Value::Null, elsewhere),
        ] {
            let e = admit(op, Some("n1"), new, old).unwrap_err();
            assert!(e.contains("of the pool n1"), "{op}: {e}");
        }
    }

    /// A claim allocated `gcu-1` of `gcu.enflame.com` and `gpu-0` of `gpu.example.com` on
    /// `node`, reserved for one pod, as the scheduler leaves it; `devices` its status.devices.
    fn allocated(node: &str, devices: Value) -> Value {
        json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "status": {
                "allocation": {
                    "devices": {"results": [
                        {"request": "a", "driver": "gcu.enflame.com", "pool": node, "device": "gcu-1"},
                        {"request": "b", "driver": "gpu.example.com", "pool": node, "device": "gpu-0"},
                    ]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}
                    ]}]},
                },
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
                "devices": devices,
            },
        })
    }

    /// Issue 42 item 12: `resourceclaims/status` patch, granted for every claim, covers on
    /// 1.34 and 1.35 the allocation and reservedFor as much as status.devices, and every
    /// driver's entries, on every node. The policy leaves the driver its own entries on its
    /// own node's claims.
    #[test]
    fn policies_narrower_than_the_api_claim_status_is_the_drivers_entries_alone() {
        let ours = json!({"driver": "gcu.enflame.com", "pool": "n1", "device": "gcu-1"});
        let theirs = json!({"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"});
        let before = allocated("n1", json!([theirs]));
        let after = allocated("n1", json!([theirs, ours]));
        let status = |node: Option<&str>, new: &Value, old: &Value| {
            admit_by(CLAIM_STATUS, "UPDATE", node, new.clone(), old.clone())
        };
        assert_eq!(status(Some("n1"), &after, &before), Ok(()));
        // Its own entry written again, changed, or taken out: still its own.
        assert_eq!(status(Some("n1"), &before, &after), Ok(()));

        let mut realloc = after.clone();
        realloc["status"]["allocation"]["devices"]["results"][0]["device"] = "gcu-2".into();
        assert_eq!(
            status(Some("n1"), &realloc, &before).unwrap_err(),
            "accel-dra-driver may not change a claim's allocation"
        );
        let mut dealloc = after.clone();
        dealloc["status"]
            .as_object_mut()
            .unwrap()
            .remove("allocation");
        assert_eq!(
            status(Some("n1"), &dealloc, &before).unwrap_err(),
            "accel-dra-driver may not change a claim's allocation"
        );
        let mut reserved = after.clone();
        reserved["status"]["reservedFor"] = json!([]);
        assert_eq!(
            status(Some("n1"), &reserved, &before).unwrap_err(),
            "accel-dra-driver may not change a claim's reservedFor"
        );
        // Another driver's entry dropped or rewritten.
        for devices in [
            json!([ours]),
            json!([ours, {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0", "data": {"x": "y"}}]),
        ] {
            assert_eq!(
                status(Some("n1"), &allocated("n1", devices), &before).unwrap_err(),
                "accel-dra-driver may only write status.devices entries of its own drivers"
            );
        }
        // Another node's claim.
        let e = status(Some("n2"), &allocated("n1", json!([theirs, ours])), &before).unwrap_err();
        assert!(e.contains("claims allocated to that node"), "{e}");
        let unallocated = json!({"status": {}});
        let e = status(
            Some("n1"),
            &json!({"status": {"devices": [ours]}}),
            &unallocated,
        )
        .unwrap_err();
        assert!(e.contains("claims allocated to that node"), "{e}");
        assert_eq!(
            status(None, &after, &before).unwrap_err(),
            "the driver's token names no node"
        );
    }

    const TOKEN_REQUEST: &str = "accel-dra-driver-token-request";

    /// Every object of the DRA manifest.
    fn manifest() -> Vec<Value> {
        let text = std::fs::read_to_string(MANIFEST).unwrap();
        serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect()
    }

    /// Whether the manifest's roles bound to the driver's service account grant `verb` on
    /// `group`/`resource` named `name` in `namespace` (a ClusterRole anywhere, a Role in its
    /// own namespace), as RBAC answers it.
    fn granted(verb: &str, group: &str, resource: &str, name: &str, namespace: &str) -> bool {
        let docs = manifest();
        let bound = |kind: &str, role: &Value| {
            docs.iter().any(|b| {
                b["kind"] == kind
                    && b["roleRef"]["name"] == role["metadata"]["name"]
                    && (kind == "ClusterRoleBinding"
                        || b["metadata"]["namespace"] == role["metadata"]["namespace"])
                    && b["subjects"].as_array().unwrap().iter().any(|s| {
                        s["kind"] == "ServiceAccount"
                            && s["name"] == "accel-dra-driver"
                            && s["namespace"] == "accel-system"
                    })
            })
        };
        let has = |list: &Value, x: &str| {
            list.as_array()
                .is_some_and(|l| l.iter().any(|v| v == x || v == "*"))
        };
        docs.iter()
            .filter(|r| {
                (r["kind"] == "ClusterRole" && bound("ClusterRoleBinding", r))
                    || (r["kind"] == "Role"
                        && r["metadata"]["namespace"] == namespace
                        && bound("RoleBinding", r))
            })
            .flat_map(|r| r["rules"].as_array().unwrap().clone())
            .any(|rule| {
                has(&rule["verbs"], verb)
                    && has(&rule["apiGroups"], group)
                    && has(&rule["resources"], resource)
                    && (rule.get("resourceNames").is_none() || has(&rule["resourceNames"], name))
            })
    }

    /// The node a deployment's credential names to the API server
    /// (`authentication.kubernetes.io/node-name`), read from what is shipped: the DaemonSet's
    /// pod gets its service account's projected token, bound to the pod and carrying its node
    /// (ServiceAccountTokenPodNodeInfo); the systemd unit's driver holds a token bound to its
    /// Node where it keeps one (`--token-file`), else whatever its kubeconfig has, which names
    /// no node.
    fn credential_node(deployment: &str, node: &str) -> Option<String> {
        match deployment {
            "DaemonSet" => {
                let docs = manifest();
                let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
                let pod = &ds["spec"]["template"]["spec"];
                (pod["serviceAccountName"] == "accel-dra-driver"
                    && pod["automountServiceAccountToken"] != false)
                    .then(|| node.to_string())
            }
            "systemd" => {
                let unit = std::fs::read_to_string(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/packaging/systemd/accel-dra-driver.service"
                ))
                .unwrap();
                unit.lines()
                    .any(|l| l.starts_with("ExecStart=") && l.contains(" --token-file "))
                    .then(|| node.to_string())
            }
            _ => None,
        }
    }

    /// What Kubernetes 1.36 asks of a driver writing a claim's status.devices, on the
    /// synthetic `resourceclaims/driver` named by the driver: `associated-node:patch` where
    /// the credential names the node the claim is allocated to, else `arbitrary-node:patch`.
    fn status_verb(credential: Option<&str>, claim_node: &str) -> &'static str {
        if credential == Some(claim_node) {
            "associated-node:patch"
        } else {
            "arbitrary-node:patch"
        }
    }

    /// What the API server answers the driver of each deployment for the writes it makes: its
    /// node's slice, a prepared claim's status.devices, and (the systemd unit's) the renewal
    /// of its token. `Err` says what refuses.
    fn writes(credential: Option<&str>, pod: bool) -> Vec<(&'static str, Result<(), String>)> {
        let node = "n1";
        let c = credential;
        let admit_by = |name: &str, op: &str, _: Option<&str>, object: Value, old: Value| {
            admit_as(name, op, extra(c, pod), object, old)
        };
        let mine = slice("gcu.enflame.com", node);
        let ours = json!({"driver": "gcu.enflame.com", "pool": node, "device": "gcu-1"});
        let before = allocated(node, json!([]));
        let after = allocated(node, json!([ours]));
        let verb = status_verb(c, node);
        let rbac = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
        let token = json!({"spec": {
            "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": node},
            "expirationSeconds": 86400,
        }});
        vec![
            ("slice", admit_by(SLICES, "CREATE", c, mine, Value::Null)),
            (
                "claim status (policy)",
                admit_by(CLAIM_STATUS, "UPDATE", c, after, before),
            ),
            (
                "claim status (1.36 RBAC)",
                rbac(
                    granted(
                        verb,
                        "resource.k8s.io",
                        "resourceclaims/driver",
                        "gcu.enflame.com",
                        "ns",
                    ),
                    format!("1.36 asks for {verb} on resourceclaims/driver, not granted"),
                ),
            ),
            (
                "token request (policy)",
                admit_by(TOKEN_REQUEST, "CREATE", c, token, Value::Null),
            ),
            (
                "token request (RBAC)",
                rbac(
                    granted(
                        "create",
                        "",
                        "serviceaccounts/token",
                        "accel-dra-driver",
                        "accel-system",
                    ),
                    "create on serviceaccounts/token not granted".into(),
                ),
            ),
        ]
    }

    /// Issue 42 item 2: Kubernetes 1.36 lets a driver write a claim's status.devices with
    /// `associated-node:patch` only where its credential names the claim's node; the systemd
    /// unit's kubeconfig credential named none, so every status write (and every slice write,
    /// by the shipped policy) was refused. Each deployment as shipped: the DaemonSet's pod
    /// token and the systemd unit's Node-bound token are let through everywhere; a credential
    /// tied to no node is refused, saying why.
    #[test]
    fn claim_status_from_a_driver_outside_a_pod_each_deployment_as_the_api_server_answers() {
        for (deployment, pod) in [("DaemonSet", true), ("systemd", false)] {
            let c = credential_node(deployment, "n1");
            assert_eq!(
                c.as_deref(),
                Some("n1"),
                "the {deployment} deployment's credential names no node"
            );
            assert_eq!(status_verb(c.as_deref(), "n1"), "associated-node:patch");
            for (what, answer) in writes(c.as_deref(), pod) {
                // kubelet renews a pod's token: the pod never needs another.
                let want = if pod && what == "token request (policy)" {
                    Err(POD_TOKEN.to_string())
                } else {
                    Ok(())
                };
                assert_eq!(answer, want, "{deployment}: {what}");
            }
        }
        // A kubeconfig credential tied to no node (a client certificate, a token bound to
        // no Node): refused, each write saying why.
        // RBAC alone lets it ask for a token (the policy refuses it).
        let plain: Vec<_> = writes(None, false)
            .into_iter()
            .map(|(what, a)| (what, a.err()))
            .collect();
        let no_node = Some("the driver's token names no node".to_string());
        assert_eq!(
            plain,
            [
                ("slice", no_node.clone()),
                ("claim status (policy)", no_node.clone()),
                (
                    "claim status (1.36 RBAC)",
                    Some(
                        "1.36 asks for arbitrary-node:patch on resourceclaims/driver, not granted"
                            .to_string()
                    )
                ),
                ("token request (policy)", no_node),
                ("token request (RBAC)", None),
            ]
        );
        // Nor does a Node-bound credential reach another node's claims.
        assert_eq!(status_verb(Some("n2"), "n1"), "arbitrary-node:patch");
    }

    /// Issue 42 item 2: the grant that lets the systemd unit's driver renew its token would let
    /// it mint one bound to any node, or to nothing; the policy leaves it a token bound to its
    /// own Node, for at most 48 hours.
    #[test]
    fn claim_status_from_a_driver_outside_a_pod_token_requests_for_its_own_node_only() {
        // A pod's token (the DaemonSet's) holds the same grant; a Node-bound token minted with
        // it would outlive the pod by up to the policy's 48 hours.
        let from_pod = admit_as(
            TOKEN_REQUEST,
            "CREATE",
            extra(Some("n1"), true),
            json!({"spec": {
                "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
                "expirationSeconds": 3600,
            }}),
            Value::Null,
        );
        assert_eq!(from_pod.unwrap_err(), POD_TOKEN);
        let req = |bound: Value, seconds: Option<i64>| {
            let mut spec = json!({"audiences": []});
            if !bound.is_null() {
                spec["boundObjectRef"] = bound;
            }
            if let Some(s) = seconds {
                spec["expirationSeconds"] = s.into();
            }
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        };
        let node = |n: &str| json!({"apiVersion": "v1", "kind": "Node", "name": n});
        let ask = |r: Value| admit_by(TOKEN_REQUEST, "CREATE", Some("n1"), r, Value::Null);
        assert_eq!(ask(req(node("n1"), Some(86400))), Ok(()));
        assert_eq!(ask(req(node("n1"), None)), Ok(()));
        assert_eq!(ask(req(node("n1"), Some(172800))), Ok(()));
        let own = "accel-dra-driver on node n1 may only ask for tokens bound to the Node n1";
        for r in [
            req(node("n2"), Some(3600)),
            req(Value::Null, Some(3600)),
            req(
                json!({"apiVersion": "v1", "kind": "Pod", "name": "n1"}),
                Some(3600),
            ),
            req(
                json!({"apiVersion": "v1", "kind": "Secret", "name": "n1"}),
                Some(3600),
            ),
        ] {
            assert_eq!(ask(r.clone()).unwrap_err(), own, "{r}");
        }
        assert_eq!(
            ask(req(node("n1"), Some(172801))).unwrap_err(),
            "accel-dra-driver may only ask for tokens that expire within 48 hours"
        );
        assert_eq!(
            admit_by(
                TOKEN_REQUEST,
                "CREATE",
                None,
                req(node("n1"), Some(3600)),
                Value::Null
            )
            .unwrap_err(),
            "the driver's token names no node"
        );
    }
}

/// The README's selector examples, evaluated as CEL on devices as the driver publishes them:
/// each selects the device it describes and not one that differs in that respect. The
/// Kubernetes CEL library's `semver()`, `quantity()`, `isGreaterThan` and `compareTo` are
/// given here by what they do (semver order, a quantity's value).
mod selectors {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use accel_container_runtime::discovery::Key;
    use accel_container_runtime::dra::slices::{device, Pool};
    use accel_container_runtime::dra::table::DraDevice;
    use accel_container_runtime::kubelet::inventory::NodeDevice;
    use accel_container_runtime::topology::PciLocation;
    use cel::extractors::This;
    use serde_json::Value;

    /// The README's selectors, and one by a standard attribute (docs/dra.md).
    fn examples() -> Vec<String> {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let section = text
            .split("Devices are selected by what they are.")
            .nth(1)
            .expect("the README's selectors");
        let yaml = section
            .split("```yaml")
            .nth(1)
            .unwrap()
            .split("```")
            .next()
            .unwrap();
        let v: Value = serde_yaml_ng::from_str(yaml).unwrap();
        let mut ex: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["cel"]["expression"].as_str().unwrap().to_string())
            .collect();
        ex.push(r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#.into());
        ex
    }

    fn triple(s: &str) -> (u64, u64, u64) {
        let n: Vec<u64> = s.split('.').map(|p| p.parse().unwrap()).collect();
        (n[0], n[1], n[2])
    }

    fn quantity(q: Arc<String>) -> i64 {
        let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = match &q[digits.len()..] {
            "" => 1,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            other => panic!("quantity suffix {other}"),
        };
        digits.parse::<i64>().unwrap() * unit
    }

    /// An attribute's value as CEL sees it (a `version` is its text here).
    #[derive(serde::Serialize)]
    #[serde(untagged)]
    enum Attr {
        S(String),
        I(i64),
        B(bool),
    }

    #[derive(serde::Serialize)]
    struct CelDevice {
        driver: String,
        attributes: BTreeMap<String, BTreeMap<String, Attr>>,
        capacity: BTreeMap<String, BTreeMap<String, i64>>,
    }

    /// The CEL `device` of one published device: attributes and capacity by domain (an
    /// unqualified name is in the driver's own).
    fn cel_device(driver: &str, published: &Value) -> CelDevice {
        let mut d = CelDevice {
            driver: driver.into(),
            attributes: BTreeMap::new(),
            capacity: BTreeMap::new(),
        };
        for (k, v) in published["attributes"].as_object().unwrap() {
            let (domain, name) = k.rsplit_once('/').unwrap_or((driver, k));
            let value = if let Some(i) = v.get("int") {
                Attr::I(i.to_string().parse().unwrap())
            } else if let Some(b) = v.get("bool") {
                Attr::B(b.as_bool().unwrap())
            } else {
                let s = v.get("string").or_else(|| v.get("version")).unwrap();
                Attr::S(s.as_str().unwrap().to_string())
            };
            d.attributes
                .entry(domain.into())
                .or_default()
                .insert(name.into(), value);
        }
        for (k, v) in published["capacity"]
            .as_object()
            .cloned()
            .unwrap_or_default()
        {
            let (domain, name) = k.rsplit_once('/').unwrap_or((driver, &k));
            let q = quantity(Arc::new(v["value"].as_str().unwrap().to_string()));
            d.capacity
                .entry(domain.into())
                .or_default()
                .insert(name.into(), q);
        }
        d
    }

    fn selects(expr: &str, dev: &CelDevice) -> bool {
        let mut ctx = cel::Context::default();
        ctx.add_function("semver", |s: Arc<String>| s.to_string())
            .unwrap();
        ctx.add_function("quantity", quantity).unwrap();
        ctx.add_function(
            "isGreaterThan",
            |This(a): This<Arc<String>>, b: Arc<String>| triple(&a) > triple(&b),
        )
        .unwrap();
        ctx.add_function("compareTo", |This(a): This<i64>, b: i64| {
            (a > b) as i64 - (a < b) as i64
        })
        .unwrap();
        ctx.add_variable("device", cel::to_value(dev).unwrap())
            .unwrap();
        match cel::Program::compile(expr).unwrap().execute(&ctx) {
            Ok(cel::Value::Bool(b)) => b,
            other => panic!("{expr}: {other:?}"),
        }
    }

    /// A device of `driver` as the driver publishes it.
    fn published(
        driver: &str,
        version: &str,
        model: &str,
        memory: Option<u64>,
        root: &str,
    ) -> CelDevice {
        let pool = Pool {
            driver,
            node: "n1",
            vendor: "v",
            driver_version: Some(version),
        };
        let mut dev = NodeDevice::numbered(0);
        dev.key = Key::Bus("0000:c3:00.0".into());
        dev.model = Some(model.into());
        dev.memory = memory;
        dev.pci = Some(PciLocation {
            bus_id: "0000:c3:00.0".into(),
            numa_node: None,
            root: Some(root.into()),
            bridges: vec![],
        });
        let d = device(
            &pool,
            &DraDevice {
                name: "gpu-0000-c3-00-0".into(),
                dev,
            },
            None,
        );
        cel_device(driver, &serde_json::to_value(d).unwrap())
    }

    #[test]
    fn the_documented_selectors_select_by_model_driver_version_and_memory() {
        let ex = examples();
        assert_eq!(ex.len(), 4, "{ex:?}");
        let amd =
            |model, memory, root| published("gpu.amd.com", "6.8.5", model, Some(memory), root);
        let nv = |version| published("gpu.nvidia.com", version, "NVIDIA H100", None, "pci0000:00");
        let yes = amd("1002-74a1", 64 << 30, "pci0000:00");
        // By model.
        assert!(selects(&ex[0], &yes));
        assert!(!selects(&ex[0], &amd("1002-73bf", 64 << 30, "pci0000:00")));
        // By driver version: 580.65.06 is published as 580.65.6.
        assert!(selects(&ex[1], &nv("580.65.06")));
        assert!(!selects(&ex[1], &nv("575.57.08")));
        // By memory.
        assert!(selects(&ex[2], &yes));
        assert!(!selects(&ex[2], &amd("1002-74a1", 16 << 30, "pci0000:00")));
        // By a standard attribute.
        assert!(selects(&ex[3], &yes));
        assert!(!selects(&ex[3], &amd("1002-74a1", 64 << 30, "pci0000:80")));
    }
}

/// `accel-dra-driver` started with kubelet's registry and plugins directories under `root`
/// and `instance`, against the stand-in API server; its log kept in a file, killed on drop.
struct DriverProcess {
    child: std::process::Child,
    log: PathBuf,
}

impl DriverProcess {
    fn spawn(
        scratch: &std::path::Path,
        api: &ApiServer,
        root: &std::path::Path,
        instance: &str,
    ) -> Self {
        Self::spawn_as(scratch, api, root, instance, "{}", &[])
    }

    /// As [`DriverProcess::spawn`], its kubeconfig's user `user` (YAML), with `extra` args.
    fn spawn_as(
        scratch: &std::path::Path,
        api: &ApiServer,
        root: &std::path::Path,
        instance: &str,
        user: &str,
        extra: &[&std::ffi::OsStr],
    ) -> Self {
        let kubeconfig = api.kubeconfig(scratch, user);
        let log = scratch.join("driver.log");
        let child =
            std::process::Command::new(common::binary(env!("CARGO_BIN_EXE_accel-dra-driver")))
                .args([
                    "--node-name",
                    NODE,
                    "--poll-seconds",
                    "0.1",
                    "--instance",
                    instance,
                ])
                .arg("--registry-dir")
                .arg(root.join("plugins_registry"))
                .arg("--plugins-dir")
                .arg(root.join("plugins"))
                .arg("--cdi-dir")
                .arg(scratch.join("cdi"))
                .arg("--state-dir")
                .arg(scratch.join("state"))
                .args(extra)
                .env(
                    "ACCEL_CONTAINER_RUNTIME_CONFIG",
                    scratch.join("config.toml"),
                )
                .env("KUBECONFIG", &kubeconfig)
                .env_remove("POD_UID")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
        DriverProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The one file `dir` holds once there (20 s at most, or until the driver exits).
    fn wait_file(&mut self, dir: &std::path::Path) -> PathBuf {
        let start = std::time::Instant::now();
        loop {
            let found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map(|d| d.map(|e| e.unwrap().path()).collect())
                .unwrap_or_default();
            if let [one] = &found[..] {
                return one.clone();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("accel-dra-driver exited ({status}):\n{}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{} holds {found:?} after 20 s:\n{}",
                dir.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 42, item 1: a kubelet root dir a few characters longer than `/var/lib/kubelet` (as
/// k0s and other distributions have it) makes the registration socket's path 100-107 bytes:
/// it fits a socket address (108 bytes with the NUL), but it was bound under
/// `.<name>.<pid>.tmp` beside it, which does not, and the driver exited at start. Here the
/// real driver, a pod UID for instance (too long to fit: hashed), the registration socket's
/// path exactly 107 bytes: registered and serving. With a root no name fits under, it exits
/// naming the directory.
#[test]
fn socket_paths_that_fit_bound_through_a_path_that_does_not() {
    use std::os::unix::ffi::OsStrExt;
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.put_claim("ns", "a", UID_A, DRIVER, NODE, &[("gcus", "gcu-1")]);
    let base = tempfile::tempdir().unwrap();
    // `<root>/plugins_registry/gcu.enflame.com-<16 hex digits>-reg.sock`: 60 bytes and the
    // root's name.
    let root = |extra: usize| {
        let n = 107 - 60 - base.path().as_os_str().len() + extra;
        base.path().join("k".repeat(n))
    };
    let uid = "6b1f3c2e-0d4a-4c8e-9f7a-1a2b3c4d5e6f";
    let at = root(0);
    let mut drv = DriverProcess::spawn(scratch.path(), &api, &at, uid);
    let reg = drv.wait_file(&at.join("plugins_registry"));
    assert_eq!(reg.as_os_str().len(), 107, "{}", reg.display());
    rt().block_on(async {
        let (info, ch) = register(&reg).await;
        assert!(info.endpoint.len() <= 107, "{}", info.endpoint);
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", UID_A)]).await;
        assert_eq!(r.claims[UID_A].error, "", "{}", drv.log());
    });
    drop(drv);

    // No name fits: the driver says which directory is too long.
    let at = root(40);
    let mut drv = DriverProcess::spawn(scratch.path(), &api, &at, uid);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = drv.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "still running with no socket name that fits:\n{}",
            drv.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = drv.log();
    assert!(!status.success(), "{log}");
    eprintln!("no name fits: {}", log.trim_end());
    let shown = String::from_utf8_lossy(at.as_os_str().as_bytes()).into_owned();
    assert!(log.contains(&shown) && log.contains("too long"), "{log}");
}

const SA: &str = "accel-system/accel-dra-driver";

fn epoch() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Issue 42 item 2: the systemd unit's driver had a kubeconfig credential tied to no node, so
/// Kubernetes 1.36 refused every claim status it wrote. Now its kubeconfig reads a token
/// bound to its Node from a file (`tokenFile`), and the driver renews it: here one issued
/// 1000 s ago with 100 s left is renewed at once through TokenRequest (asked with the present
/// token, bound to the Node of the driver's node, as long-lived as the present one), written
/// over the file whole and 0600; the stand-in API server, which refuses a status written with
/// a token bound to no node (as 1.36 does), takes the claim's status.devices.
#[test]
fn claim_status_from_a_driver_outside_a_pod_renews_its_node_bound_token() {
    use std::os::unix::fs::PermissionsExt;
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.require_node_bound_status();
    api.put_claim("ns", "a", UID_A, DRIVER, NODE, &[("gcus", "gcu-1")]);
    let creds = scratch.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    let file = creds.join("token");
    let now = epoch();
    let old = common::apiserver::token(SA, Some(NODE), now - 1000, now + 100);
    std::fs::write(&file, &old).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let root = tempfile::tempdir().unwrap();
    let user = format!("{{tokenFile: {}}}", file.display());
    let mut drv = DriverProcess::spawn_as(
        scratch.path(),
        &api,
        root.path(),
        "i1",
        &user,
        &["--token-file".as_ref(), file.as_os_str()],
    );
    let start = std::time::Instant::now();
    let new = loop {
        let now = std::fs::read_to_string(&file).unwrap();
        if now != old {
            break now;
        }
        if let Some(status) = drv.child.try_wait().unwrap() {
            panic!("accel-dra-driver exited ({status}):\n{}", drv.log());
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the token is not renewed after 20 s:\n{}",
            drv.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{:o}", mode);
    assert_eq!(std::fs::read_dir(&creds).unwrap().count(), 1);
    let asked: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/serviceaccounts/"))
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "{:?}",
        asked.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    let r = &asked[0];
    assert_eq!(
        (r.method.as_str(), r.path.split('?').next().unwrap()),
        (
            "POST",
            "/api/v1/namespaces/accel-system/serviceaccounts/accel-dra-driver/token"
        )
    );
    assert_eq!(r.authorization, Some(format!("Bearer {old}")));
    let spec = &r.body.as_ref().unwrap()["spec"];
    assert_eq!(spec["boundObjectRef"]["kind"], "Node");
    assert_eq!(spec["boundObjectRef"]["name"], NODE);
    assert_eq!(spec["expirationSeconds"], 1100);
    let claims = common::apiserver::claims_of(&new);
    assert_eq!(claims["kubernetes.io"]["node"]["name"], NODE);
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        1100
    );
    assert!(drv.log().contains("renewed the token"), "{}", drv.log());

    let reg = drv.wait_file(&root.path().join("plugins_registry"));
    rt().block_on(async {
        let (_, ch) = register(&reg).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", UID_A)]).await;
        assert_eq!(r.claims[UID_A].error, "", "{}", drv.log());
    });
    let devices = &api.claim("ns", "a")["status"]["devices"];
    assert_eq!(devices[0]["device"], "gcu-1", "{devices}\n{}", drv.log());
    assert!(!drv.log().contains("cannot write"), "{}", drv.log());
}

/// Issue 42 item 2: with a credential tied to no node the status writes were refused with a
/// bare warning per claim. Now the first says what is missing and where the set-up is told;
/// the prepares stand. Given `--token-file` with a token bound to no Node, the driver does
/// not start and says why.
#[test]
fn claim_status_from_a_driver_outside_a_pod_refused_says_why_once() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.require_node_bound_status();
    const UID_B: &str = "1c5d8f4a-ae3b-4d72-9a2f-3b8cad1e2f3b";
    api.put_claim("ns", "a", UID_A, DRIVER, NODE, &[("gcus", "gcu-1")]);
    api.put_claim("ns", "b", UID_B, DRIVER, NODE, &[("gcus", "gcu-2")]);
    let now = epoch();
    let plain = common::apiserver::token(SA, None, now, now + 3600);
    let root = tempfile::tempdir().unwrap();
    let user = format!("{{token: {plain}}}");
    let mut drv = DriverProcess::spawn_as(scratch.path(), &api, root.path(), "i1", &user, &[]);
    let reg = drv.wait_file(&root.path().join("plugins_registry"));
    rt().block_on(async {
        let (_, ch) = register(&reg).await;
        for (name, uid) in [("a", UID_A), ("b", UID_B)] {
            let r = prepare(&ch, PREPARE_V1, vec![claim("ns", name, uid)]).await;
            assert_eq!(r.claims[uid].error, "", "{}", drv.log());
        }
    });
    let log = drv.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("status.devices"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains("not tied to the claim's node")
            && said[0].contains("arbitrary-node:patch")
            && said[0].contains("Running the driver from systemd"),
        "{}",
        said[0]
    );
    eprintln!("said once: {}", said[0]);
    assert!(api.claim("ns", "a")["status"]["devices"].is_null());
    drop(drv);

    // --token-file with that token: refused at start.
    let file = scratch.path().join("token");
    std::fs::write(&file, &plain).unwrap();
    let user = format!("{{tokenFile: {}}}", file.display());
    let extra = ["--token-file".as_ref(), file.as_os_str()];
    let mut drv = DriverProcess::spawn_as(scratch.path(), &api, root.path(), "i2", &user, &extra);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = drv.child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{}", drv.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = drv.log();
    assert!(!status.success(), "{log}");
    assert!(log.contains("bound to no Node"), "{log}");
}

/// Issue 41: the driver's health comes from the health engine's sysfs signals. GCU 1's AER
/// fatal count rises: it alone is tainted in the slice, kubelet's health stream says it is
/// Unhealthy and why, and a claim of it is not prepared; its count back at its baseline (a
/// reset): untainted after the hold-down, and the claim prepared.
#[test]
fn a_gcu_whose_aer_fatal_count_rises_is_tainted_reported_and_not_prepared() {
    use tokio_stream::StreamExt;
    let (sim, _major) = enflame_host();
    // enflame_sysfs: GCU n is PCI function 0000:1n:00.0.
    let one = common::health::gcu_function(sim.path(), 1);
    let fatal = |n: u64| common::health::aer_fatal(&one, n);
    fatal(2);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.put_claim("default", "one", UID_A, DRIVER, NODE, &[("gcus", "gcu-1")]);
    let tainted = common::health::tainted;
    rt().block_on(async {
        let drv = Driver::watching_health(&cfg, &api);
        wait_slices(&api, "published untainted", |s| {
            devices(s).len() == 8 && tainted(s).is_empty()
        })
        .await;
        let (_, ch) = register(&drv.reg_socket()).await;
        let mut health = grpc::watch_health(&ch, WATCH_HEALTH_V1).await.unwrap();

        fatal(3);
        let s = wait_slices(&api, "gcu-1 tainted", |s| !tainted(s).is_empty()).await;
        assert_eq!(tainted(&s), ["gcu-1"]);
        let why = "1 fatal PCIe (AER) error(s) on 0000:11:00.0 since it was first read";
        let r = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let r = health.next().await.unwrap().unwrap();
                if r.devices
                    .iter()
                    .any(|d| d.health == HealthStatus::Unhealthy as i32)
                {
                    return r;
                }
            }
        })
        .await
        .expect("an Unhealthy device on the health stream");
        let sick: Vec<(&str, &str)> = r
            .devices
            .iter()
            .filter(|d| d.health != HealthStatus::Healthy as i32)
            .map(|d| {
                (
                    d.device.as_ref().unwrap().device_name.as_str(),
                    d.message.as_str(),
                )
            })
            .collect();
        assert_eq!(sick, [("gcu-1", why)]);

        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "one", UID_A)]).await;
        assert_eq!(
            r.claims[UID_A].error,
            format!(
                "claim default/one ({UID_A}): device gcu-1 is unhealthy: {why}; nothing \
                 prepared (kubelet retries)"
            )
        );
        assert!(!drv.spec_path(UID_A).exists());

        fatal(2);
        let t = std::time::Instant::now();
        wait_slices(&api, "gcu-1 untainted", |s| tainted(s).is_empty()).await;
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "one", UID_A)]).await;
        assert_eq!(r.claims[UID_A].error, "");
        drop((health, ch));
        drv.stop().await;
    });
}

/// The slices of driver `driver` once `ok`, within 20 s.
async fn wait_slices_of(
    api: &ApiServer,
    driver: &str,
    what: &str,
    ok: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let start = std::time::Instant::now();
    loop {
        let s = api.slices_of(driver);
        if ok(&s) {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{what}: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 41: NVIDIA's signals through NVML (a stand-in library driven by a control file) in
/// the DRA driver. XID 79 on one GPU: it alone is tainted, and a claim of it is not prepared,
/// naming the XID; the GPU reset (NVML loses it and reaches it again): untainted after the
/// hold-down, and the claim prepared.
#[test]
fn an_nvidia_gpu_with_a_critical_xid_is_tainted_and_not_prepared_until_reset() {
    const NV: &str = "gpu.nvidia.com";
    let sim = common::SimRoot::builder()
        .nvidia(&[("0000:41:00.0", 0), ("0000:42:00.0", 1)])
        .library(common::LIB_DIR, "libcuda.so.550.54.14", "libcuda.so.1")
        .build();
    let control = common::nvml::stand_in(&sim, &[]);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    let tainted = common::health::tainted;
    rt().block_on(async {
        let drv = Driver::watching_health(&cfg, &api);
        let s = wait_slices_of(&api, NV, "published untainted", |s| {
            devices(s).len() == 2 && tainted(s).is_empty()
        })
        .await;
        // Named in bus-id order: the first is the GPU at 0000:41:00.0.
        let mut names: Vec<String> = devices(&s)
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        let sick = names[0].clone();
        api.put_claim(
            "default",
            "one",
            UID_A,
            NV,
            NODE,
            &[("gpus", sick.as_str())],
        );
        let reg = drv
            .dir
            .path()
            .join(format!("plugins_registry/{NV}-reg.sock"));
        let (_, ch) = register(&reg).await;

        common::nvml::write_control(&control, "xid 0 79 1\n");
        let s = wait_slices_of(&api, NV, "one GPU tainted", |s| !tainted(s).is_empty()).await;
        assert_eq!(tainted(&s), [sick.as_str()]);
        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "one", UID_A)]).await;
        assert_eq!(
            r.claims[UID_A].error,
            format!(
                "claim default/one ({UID_A}): device {sick} is unhealthy: XID 79 on GPU \
                 0000:41:00.0; nothing prepared (kubelet retries)"
            )
        );
        assert!(!drv.spec_path(UID_A).exists());

        // A reset: NVML loses the GPU, then reaches it again.
        common::nvml::write_control(&control, "xid 0 79 1\nlost 0\n");
        let t = std::time::Instant::now();
        loop {
            let r = prepare(&ch, PREPARE_V1, vec![claim("default", "one", UID_A)]).await;
            if r.claims[UID_A].error.contains("is lost to NVML") {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "{}",
                r.claims[UID_A].error
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        common::nvml::write_control(&control, "xid 0 79 1\n");
        let t = std::time::Instant::now();
        wait_slices_of(&api, NV, "untainted after the reset", |s| {
            tainted(s).is_empty()
        })
        .await;
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        let r = prepare(&ch, PREPARE_V1, vec![claim("default", "one", UID_A)]).await;
        assert_eq!(r.claims[UID_A].error, "");
        drop(ch);
        drv.stop().await;
    });
}

/// Issue 41, Intel xe: the intel-xe profile's `[health.drm]` in the DRA driver. The xe GPU's
/// PCI function shows `survivability_mode` (its firmware failed): it is tainted
/// `xe.gpu.intel.com/error=survivability-mode`, the i915 GPUs beside it are not this driver's;
/// the file gone (flashed): untainted after the hold-down.
#[test]
fn an_xe_gpu_in_survivability_mode_is_tainted_until_it_leaves_it() {
    const XE: &str = "xe.gpu.intel.com";
    let sim = common::SimRoot::builder().build();
    let host = common::drm::intel_node(&sim);
    let xe = host.offered("0x8086", "xe")[0].clone();
    let mode = common::drm::sysfs_dir(sim.path(), &xe).join("survivability_mode");
    let scratch = tempfile::tempdir().unwrap();
    let profiles = scratch.path().join("profiles.d");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/profiles/intel-xe.toml"),
        profiles.join("intel-xe.toml"),
    )
    .unwrap();
    let root = sim.path().display().to_string();
    let path = scratch.path().join("config.toml");
    std::fs::write(
        &path,
        format!(
            "profiles-dir = {profiles:?}\n[profiles.nvidia]\ndriver-root = {root:?}\n\
             [profiles.enflame]\ndriver-root = {root:?}\n[profiles.intel-xe]\n\
             driver-root = {root:?}\n"
        ),
    )
    .unwrap();
    let cfg = accel_container_runtime::config::Config::load(&path).unwrap();
    let api = ApiServer::start();
    let taints = |s: &[Value]| -> Vec<Value> {
        devices(s)
            .iter()
            .filter_map(|d| d.get("taints").cloned())
            .collect()
    };
    let tainted = common::health::tainted;
    rt().block_on(async {
        let drv = Driver::watching_health(&cfg, &api);
        let s = wait_slices_of(&api, XE, "published untainted", |s| {
            devices(s).len() == 1 && tainted(s).is_empty()
        })
        .await;
        let xe_name = devices(&s)[0]["name"].as_str().unwrap().to_string();

        std::fs::write(&mode, "Runtime\n").unwrap();
        let s = wait_slices_of(&api, XE, "the xe GPU tainted", |s| !tainted(s).is_empty()).await;
        assert_eq!(tainted(&s), [xe_name.as_str()], "{s:?}");
        let t = &taints(&s)[0][0];
        assert_eq!(t["key"], format!("{XE}/error"), "{s:?}");
        assert_eq!(t["value"], "survivability-mode", "{s:?}");
        assert_eq!(t["effect"], "NoSchedule", "{s:?}");

        std::fs::remove_file(&mode).unwrap();
        let at = std::time::Instant::now();
        wait_slices_of(&api, XE, "untainted once flashed", |s| {
            devices(s).len() == 1 && tainted(s).is_empty()
        })
        .await;
        assert!(
            at.elapsed() >= Duration::from_millis(900),
            "held down: {:?}",
            at.elapsed()
        );
        drv.stop().await;
    });
}

/// A simulated host of `n` Enflame GCUs, each its own PCI function 0000:1n:00.0 behind its
/// own root port (numa 0), with the driver library; `[sharing]` makes 8 offers of each.
fn enflame_host_of(n: usize) -> common::SimRoot {
    use std::os::unix::fs::symlink;
    let sim = common::SimRoot::builder()
        .enflame(n)
        .library(common::LIB_DIR, "libefml.so.1.2.3", "libefml.so.1")
        .build();
    let major = sim.enflame_major().unwrap();
    let root = sim.path();
    std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
    std::fs::create_dir_all(root.join("sys/dev/char")).unwrap();
    for i in 0..n {
        let bdf = format!("0000:{:02x}:00.0", 0x10 + i);
        let rel = PathBuf::from(format!("pci0000:00/0000:00:{:02x}.0/{bdf}", i + 1));
        let real = root.join("sys/devices").join(&rel);
        std::fs::create_dir_all(real.join(format!("enflame/gcu{i}"))).unwrap();
        std::fs::write(real.join("numa_node"), "0\n").unwrap();
        std::fs::write(real.join("config"), [0x1e, 0x1e, 0x01, 0x00]).unwrap();
        symlink(
            PathBuf::from("../../../devices").join(&rel),
            root.join("sys/bus/pci/devices").join(&bdf),
        )
        .unwrap();
        symlink(
            PathBuf::from("../../devices")
                .join(&rel)
                .join(format!("enflame/gcu{i}")),
            root.join(format!("sys/dev/char/{major}:{i}")),
        )
        .unwrap();
    }
    sim
}

/// Issue 41: with sharing on, 16 GCUs are 128 offers; once GCU 5 falls off the bus (its
/// config space reads all ones) its 8 offers carry the taint `gone=fallen-off-the-bus`
/// (`NoSchedule`), no other does, and the pool is split into slices of at most 64 devices
/// (the stand-in refuses more, as the API server does), all of one generation with the right
/// count; `timeAdded` stays while the reason does. With `--taint-no-execute gone` the effect
/// is `NoExecute`.
#[test]
fn sixteen_shared_gcus_one_fallen_off_the_bus_are_tainted_in_slices_of_64() {
    let sim = enflame_host_of(16);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(
        &sim,
        scratch.path(),
        "[profiles.enflame.sharing]\nmemory = \"32Gi\"\n",
    );
    let api = ApiServer::start();
    let config5 = sim.path().join("sys/bus/pci/devices/0000:15:00.0/config");
    let parent = |d: &Value| -> String {
        d["attributes"]["parent"]["string"]
            .as_str()
            .or(d["name"].as_str())
            .unwrap()
            .to_string()
    };
    let check = |s: &[Value], effect: &str| {
        let count = s.len() as i64;
        let generation = &s[0]["spec"]["pool"]["generation"];
        for x in s {
            assert_eq!(x["spec"]["pool"]["resourceSliceCount"], count, "{x:#}");
            assert_eq!(&x["spec"]["pool"]["generation"], generation);
            let n = x["spec"]["devices"].as_array().map_or(0, Vec::len);
            assert!(n <= 64, "{n} devices in {}", x["metadata"]["name"]);
        }
        let d = devices(s);
        assert_eq!(d.len(), 128);
        let mut tainted = 0;
        for dev in &d {
            let gcu5 = dev["name"] == "gcu-5" || parent(dev) == "gcu-5";
            match dev.get("taints") {
                Some(t) => {
                    assert!(gcu5, "{dev:#}");
                    assert_eq!(t.as_array().unwrap().len(), 1, "{dev:#}");
                    assert_eq!(t[0]["key"], format!("{DRIVER}/gone"));
                    assert_eq!(t[0]["value"], "fallen-off-the-bus");
                    assert_eq!(t[0]["effect"], effect);
                    assert!(t[0]["timeAdded"].is_string(), "{dev:#}");
                    tainted += 1;
                }
                None => assert!(!gcu5, "{dev:#}"),
            }
        }
        assert_eq!(tainted, 8, "every offer of gcu-5");
    };
    // A pool being written holds slices of two generations, or not all of its slices, for a
    // moment: looked at once it is whole.
    let any_tainted = |s: &[Value]| {
        devices(s).iter().any(|d| d.get("taints").is_some())
            && s.iter().all(|x| {
                x["spec"]["pool"]["generation"] == s[0]["spec"]["pool"]["generation"]
                    && x["spec"]["pool"]["resourceSliceCount"] == s.len()
            })
    };
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = common::dra::options(dir.path(), Duration::from_millis(100));
        opts.health = accel_container_runtime::health::Settings {
            interval: Duration::from_millis(100),
            hold_down: Duration::ZERO,
        };
        let drv = Driver::start_with(&cfg, &api, dir, opts);
        let s = wait_slices(&api, "128 offers", |s| devices(s).len() == 128).await;
        assert!(!any_tainted(&s));
        std::fs::write(&config5, [0xff; 4]).unwrap();
        let s = wait_slices(&api, "gcu-5 tainted", any_tainted).await;
        check(&s, "NoSchedule");
        // Counter sets (16, 8 a slice) and devices (128, 64 a slice) apart.
        assert_eq!(
            s.len(),
            4,
            "{:?}",
            s.iter().map(|x| &x["metadata"]["name"]).collect::<Vec<_>>()
        );
        let added = devices(&s)
            .iter()
            .find_map(|d| d.get("taints").map(|t| t[0]["timeAdded"].clone()))
            .unwrap();
        let generation = s[0]["spec"]["pool"]["generation"].clone();
        // Steady: nothing rewritten, the taint's time kept.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let s = api.slices_of(DRIVER);
        assert_eq!(s[0]["spec"]["pool"]["generation"], generation);
        assert!(devices(&s)
            .iter()
            .filter_map(|d| d.get("taints"))
            .all(|t| t[0]["timeAdded"] == added));
        std::fs::write(&config5, [0x1e, 0x1e, 0x01, 0x00]).unwrap();
        wait_slices(&api, "gcu-5 back", |s| {
            devices(s).len() == 128 && !any_tainted(s)
        })
        .await;
        drv.stop().await;

        // The operator asked for NoExecute where a device is gone.
        api.wipe();
        let dir = tempfile::tempdir().unwrap();
        let mut opts = common::dra::options(dir.path(), Duration::from_millis(100));
        opts.taint_effects = accel_container_runtime::dra::taints::Effects::parse("gone").unwrap();
        std::fs::write(&config5, [0xff; 4]).unwrap();
        let drv = Driver::start_with(&cfg, &api, dir, opts);
        let s = wait_slices(&api, "gcu-5 tainted NoExecute", any_tainted).await;
        check(&s, "NoExecute");
        drv.stop().await;
    });
}

/// Issue 41: a publish the API server refuses is tried again after a backoff, not at the
/// next change or poll (here a minute away): the first write refused (500), the pool is
/// published within seconds.
#[test]
fn a_publish_refused_once_is_retried_with_backoff() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.refuse_slice_writes(1);
    rt().block_on(async {
        let drv = Driver::start(
            &cfg,
            &api,
            tempfile::tempdir().unwrap(),
            Duration::from_secs(60),
        );
        let t = std::time::Instant::now();
        let s = wait_slices(&api, "published after a refusal", |s| !s.is_empty()).await;
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert_eq!(devices(&s).len(), 8);
        let writes: Vec<String> = api
            .requests()
            .iter()
            .filter(|r| r.method == "POST" || r.method == "PUT")
            .filter(|r| {
                r.path
                    .starts_with("/apis/resource.k8s.io/v1/resourceslices")
            })
            .map(|r| r.method.clone())
            .collect();
        assert!(writes.len() >= 2, "{writes:?}");
        drv.stop().await;
    });
}
