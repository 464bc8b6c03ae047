//! The device plugin and the DRA driver on a node with a real NVIDIA driver (not run by CI,
//! which has no GPU: every test here is `#[ignore]`d). `tests/real_gpu.sh` runs them with
//! `--ignored` and then starts containers from what they leave in `ACCEL_REAL_OUT`, so the
//! answers kubelet would have been given are checked from inside a container on the GPU.
//!
//! - `ACCEL_REAL_GPUS`: the output of `nvidia-smi --query-gpu=index,uuid,pci.bus_id,
//!   driver_version,name --format=csv,noheader`: what the driver's own tool says the node has.
//! - `ACCEL_REAL_OUT`: a directory for the answers (the plugin's per strategy, the claim's CDI
//!   IDs and its spec).
//! - `ACCEL_REAL_DRIVER_ROOT`: the nvidia profile's driver-root (default `/`).
//!
//! Run without those variables, each test fails and says which is missing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use accel_container_runtime::config::Config;
use accel_container_runtime::dra::names::{claim_cdi_id, claim_kind};
use accel_container_runtime::kubelet::names;
use accel_container_runtime::kubelet::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
};
use accel_container_runtime::plugin::allocate::Strategy;
use accel_container_runtime::plugin::server as plugin_server;
use common::apiserver::ApiServer;
use common::dra;
use common::grpc::PREPARE_V1;
use common::grpc::{self, connect};
use common::kubelet::{rt, Kubelet};
use serde_json::{json, Value};
use tokio::sync::watch;

const CLAIM_UID: &str = "6a1f3c2e-5b4d-4e7f-9a0b-1c2d3e4f5a6b";
const GONE_UID: &str = "6a1f3c2e-5b4d-4e7f-9a0b-1c2d3e4f5a6c";

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug)]
struct Gpu {
    uuid: String,
    /// `0000:00:06.0`: nvidia-smi writes an eight-digit domain in upper case.
    bus: String,
    driver: String,
    name: String,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (see tests/real_gpu.rs)"))
}

fn gpus() -> Vec<Gpu> {
    let v: Vec<Gpu> = env("ACCEL_REAL_GPUS")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.splitn(5, ',').map(str::trim).collect();
            assert_eq!(f.len(), 5, "ACCEL_REAL_GPUS line {l:?}");
            let bus = f[2].to_ascii_lowercase();
            Gpu {
                uuid: f[1].to_string(),
                bus: bus[bus.len() - 12..].to_string(),
                driver: f[3].to_string(),
                name: f[4].to_string(),
            }
        })
        .collect();
    assert!(!v.is_empty(), "ACCEL_REAL_GPUS lists no GPU");
    v
}

fn out_dir(sub: &str) -> PathBuf {
    let d = PathBuf::from(env("ACCEL_REAL_OUT")).join(sub);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The built-in nvidia profile at the node's driver root, nothing else.
fn config(scratch: &Path) -> Config {
    let root = std::env::var("ACCEL_REAL_DRIVER_ROOT").unwrap_or_else(|_| "/".into());
    let path = scratch.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "profiles-dir = \"{}\"\n[profiles.nvidia]\ndriver-root = \"{root}\"\n",
            scratch.join("none.d").display()
        ),
    )
    .unwrap();
    let mut cfg = Config::load(&path).unwrap();
    cfg.profiles.retain(|p| p.name == "nvidia");
    assert_eq!(cfg.profiles.len(), 1);
    cfg
}

/// The NUMA node sysfs gives the GPU's PCI function, where it gives one.
fn numa_of(bus: &str) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bus}/numa_node")).ok()?;
    s.trim().parse().ok().filter(|n: &i64| *n >= 0)
}

/// The GPU's device minor, as the driver gives it (nvidia-smi's index need not be it).
fn minor_of(bus: &str) -> u32 {
    let info = std::fs::read_to_string(format!("/proc/driver/nvidia/gpus/{bus}/information"))
        .unwrap_or_else(|e| panic!("/proc/driver/nvidia/gpus/{bus}/information: {e}"));
    info.lines()
        .find_map(|l| l.strip_prefix("Device Minor:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Device Minor in {info:?}"))
}

/// What kubelet hands the engine from one Allocate answer, as JSON for tests/real_gpu.sh.
fn answer_json(a: &ContainerAllocateResponse) -> Value {
    let sorted = |m: &std::collections::HashMap<String, String>| -> BTreeMap<String, String> {
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    json!({
        "envs": sorted(&a.envs),
        "annotations": sorted(&a.annotations),
        "mounts": a.mounts.iter().map(|m| json!({
            "container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only,
        })).collect::<Vec<_>>(),
        "devices": a.devices.iter().map(|d| json!({
            "container_path": d.container_path, "host_path": d.host_path,
            "permissions": d.permissions,
        })).collect::<Vec<_>>(),
        "cdi_devices": a.cdi_devices.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
    })
}

/// The plugin under the stand-in kubelet: it registers `nvidia.com/gpu`, lists exactly the
/// GPUs nvidia-smi lists (by UUID, healthy, on sysfs's NUMA node), and answers an Allocate of
/// the first GPU under each strategy; the answers are left for the script to run.
#[test]
#[ignore]
fn the_device_plugin_offers_the_real_gpus() {
    let gpus = gpus();
    let out = out_dir("plugin");
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(scratch.path());
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.strategies = Strategy::ALL.to_vec();
        opts.cdi_dir = out.join("cdi");
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(plugin_server::run(cfg.profiles, opts, rx));

        kubelet.wait_registrations(1).await;
        let reg = kubelet.registrations.lock().unwrap()[0].clone();
        assert_eq!(reg.resource_name, "nvidia.com/gpu");
        let list = tokio::time::timeout(Duration::from_secs(20), kubelet.updates.recv())
            .await
            .expect("no ListAndWatch answer in 20 s")
            .unwrap();
        let mut listed: Vec<(String, String, Option<i64>)> = list
            .devices
            .iter()
            .map(|d| {
                let numa = d
                    .topology
                    .as_ref()
                    .and_then(|t| t.nodes.first())
                    .map(|n| n.id);
                (d.id.clone(), d.health.clone(), numa)
            })
            .collect();
        listed.sort();
        let mut want: Vec<(String, String, Option<i64>)> = gpus
            .iter()
            .map(|g| (g.uuid.clone(), "Healthy".to_string(), numa_of(&g.bus)))
            .collect();
        want.sort();
        assert_eq!(listed, want, "ListAndWatch against nvidia-smi");
        eprintln!("ListAndWatch: {listed:?}");

        let sock = kubelet.dir().join(&reg.endpoint);
        let ch = connect(&sock, "localhost").await.unwrap();
        let first = &gpus[0].uuid;
        let r = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![first.clone()],
                }],
            },
        )
        .await
        .unwrap();
        let a = &r.container_responses[0];
        let answer = answer_json(a);
        eprintln!("Allocate, every strategy: {answer:#}");
        // The node answered in device-specs is the GPU's own, as the driver numbers it.
        let node = format!("/dev/nvidia{}", minor_of(&gpus[0].bus));
        assert!(
            a.devices.iter().any(|d| d.host_path == node),
            "{node} not in {answer}"
        );
        std::fs::write(out.join("answer.json"), answer.to_string()).unwrap();
        stop.send(true).unwrap();
        task.await.unwrap().unwrap();
    });
}

/// The DRA driver against the stand-in API server: one slice of exactly the GPUs nvidia-smi
/// lists, with their UUIDs, bus IDs, driver version and model; a claim of the first GPU prepared and
/// unprepared (its spec gone), then another prepared (its nodes checked on the real driver)
/// to a spec left for the script.
#[test]
#[ignore]
fn the_dra_driver_publishes_and_prepares_the_real_gpus() {
    let gpus = gpus();
    let out = out_dir("dra");
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(scratch.path());
    let profile = cfg.profiles[0].clone();
    let driver = names::driver_name(&profile, None).unwrap();
    let api = ApiServer::start();
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = dra::options(dir.path(), Duration::from_secs(1));
        opts.cdi_dir = out.join("cdi");
        let drv = dra::Driver::start_with(&cfg, &api, dir, opts);

        let start = Instant::now();
        let slices = loop {
            let s = api.slices_of(&driver);
            if !s.is_empty() {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no slice");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        eprintln!("slices: {slices:#?}");
        let devs: Vec<&Value> = slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().unwrap())
            .collect();
        assert_eq!(devs.len(), gpus.len(), "{slices:?}");
        let mut first = String::new();
        for g in &gpus {
            let d = devs
                .iter()
                .find(|d| d["attributes"]["uuid"]["string"] == g.uuid.as_str())
                .unwrap_or_else(|| panic!("{} not published", g.uuid));
            let a = &d["attributes"];
            assert_eq!(
                a["resource.kubernetes.io/pciBusID"]["string"],
                g.bus.as_str(),
                "{d}"
            );
            assert_eq!(a["driverVersionText"]["string"], g.driver.as_str(), "{d}");
            assert_eq!(
                a["driverVersion"]["version"].as_str(),
                accel_container_runtime::dra::slices::semver(&g.driver).as_deref(),
                "{d}"
            );
            assert_eq!(a["vendor"]["string"], "nvidia", "{d}");
            assert_eq!(a["model"]["string"], g.name.as_str(), "{d}");
            match numa_of(&g.bus) {
                Some(n) => assert_eq!(a["numaNode"]["int"], n, "{d}"),
                None => assert!(a.get("numaNode").is_none(), "{d}"),
            }
            assert!(d.get("taints").is_none(), "{d}");
            if first.is_empty() {
                first = d["name"].as_str().unwrap().to_string();
            }
        }
        // The claims the scheduler would have left: the first GPU nvidia-smi lists.
        for uid in [CLAIM_UID, GONE_UID] {
            api.put_claim("default", uid, uid, &driver, dra::NODE, &[("gpus", &first)]);
        }

        let reg = drv
            .dir
            .path()
            .join(format!("plugins_registry/{driver}-reg.sock"));
        let (_, ch) = dra::register(&reg).await;
        let claim = |uid: &str| dra::claim("default", uid, uid);
        // One GPU may be all the node has: the claim prepared and unprepared first frees it
        // for the claim left to the script (a device is prepared for one claim at a time).
        let r = dra::prepare(&ch, PREPARE_V1, vec![claim(GONE_UID)]).await;
        assert_eq!(r.claims[GONE_UID].error, "");
        let gone = out.join(format!("cdi/k8s.{driver}-claim_{GONE_UID}.json"));
        assert!(gone.exists());
        let u = dra::unprepare(&ch, vec![claim(GONE_UID)]).await;
        assert_eq!(u.claims[GONE_UID].error, "");
        assert!(!gone.exists(), "{gone:?} left after unprepare");

        let r = dra::prepare(&ch, PREPARE_V1, vec![claim(CLAIM_UID)]).await;
        assert_eq!(r.claims[CLAIM_UID].error, "");
        let ids = dra::cdi_ids(&r.claims[CLAIM_UID]);
        assert_eq!(ids, [claim_cdi_id(&driver, CLAIM_UID, &first)]);
        std::fs::write(
            out.join("claim.json"),
            json!({"driver": driver, "kind": claim_kind(&driver), "ids": ids}).to_string(),
        )
        .unwrap();
        drv.stop().await;
    });
}
