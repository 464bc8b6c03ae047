//! Issue 32 ("a device is what it is, not where it sits"): one regression test per class,
//! each named after its class, at the level of the binaries. The device-churn cases (a device
//! leaving and coming back between two prepares or two container starts) run end to end: the
//! DRA driver or the device plugin under the stand-in kubelet (and API server), and what each
//! claim or answer gives a container checked from inside it, through our runtime and real
//! runc. Each failed on 73afeb9, before the fix. At the end, issue 42's item 6 (identity
//! that does not survive a reboot), one test per identity class; the enflame one failed on
//! 4f6aabe.
//!
//! Classes tested elsewhere: 3 at discovery level and 6 in tests/drm.rs, 9 in src/inroot.rs,
//! 10 in src/dra/slices.rs, 12 in tests/doctor_propagation.rs.
//!
//! `cargo test --features dra --test identity` (root: the simulated nodes are made with mknod).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use accel_container_runtime::config::Config;
use accel_container_runtime::dra::server::Options as DraOptions;
use accel_container_runtime::kubelet::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
};
use accel_container_runtime::plugin::allocate::Strategy;
use accel_container_runtime::plugin::server as plugin_server;
use accel_container_runtime::plugin::service;
use common::apiserver::ApiServer;
use common::dra::{cdi_ids, claim, options, prepare, register, unprepare, Driver, DRIVER, NODE};
use common::drm::{self, Func, DRM_MAJOR};
use common::grpc::{self, PREPARE_V1};
use common::kubelet::{
    apply_answer, config, enflame_host, enflame_sysfs, ids, rt, Kubelet, STRATEGIES,
};
use common::{binary, mknod, Bundle, Probe, Report, Runc, SimRoot, LIB_DIR, NVIDIA_MAJOR};
use serde_json::{json, Value};
use tokio::sync::watch;

/// The NVIDIA profile's driver name (its `cdi-kind` `nvidia.com/gpu`, turned around).
const NV: &str = "gpu.nvidia.com";
/// The Intel i915 profile's driver name (`gpu.intel.com/i915`).
const I915: &str = "i915.gpu.intel.com";

/// Claim UIDs: `uid(n)`.
fn uid(n: u32) -> String {
    format!("0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d{n:04x}")
}

/// Where this boot's id is read: set on the tree that has it (81c3cfa), a no-op before.
fn with_boot_id(opts: &mut DraOptions, file: &Path) {
    opts.boot_id_file = file.to_path_buf();
}

// ---------------------------------------------------------------------------------------------
// A simulated NVIDIA node whose GPUs come and go
// ---------------------------------------------------------------------------------------------

/// GPUs as (PCI bus id, minor) with the driver's libraries (the CDI generator needs them) and
/// each GPU's PCI function in sysfs, so the slice carries its `pciBusID`.
fn nvidia_host(gpus: &[(&str, u32)]) -> SimRoot {
    let sim = SimRoot::builder()
        .nvidia(gpus)
        .library(LIB_DIR, "libcuda.so.550.54.14", "libcuda.so.1")
        .library(LIB_DIR, "libnvidia-ml.so.550.54.14", "libnvidia-ml.so.1")
        .build();
    for (n, (bus, _)) in gpus.iter().enumerate() {
        let rel = format!("pci0000:00/0000:00:0{}.0/{bus}", n + 1);
        let dir = sim.path().join("sys/devices").join(&rel);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("numa_node"), "0\n").unwrap();
        std::fs::create_dir_all(sim.path().join("sys/bus/pci/devices")).unwrap();
        symlink(
            format!("../../../devices/{rel}"),
            sim.path().join("sys/bus/pci/devices").join(bus),
        )
        .unwrap();
    }
    sim
}

/// A GPU that fell off the bus (or was unbound for passthrough), as the NVIDIA driver and the
/// kernel show it: its procfs entry, its PCI function and its node gone.
struct Gone {
    bus: String,
    minor: u32,
    information: String,
    pci_link: PathBuf,
}

fn gpu_leaves(sim: &SimRoot, bus: &str, minor: u32) -> Gone {
    let dir = sim.path().join("proc/driver/nvidia/gpus").join(bus);
    let information = std::fs::read_to_string(dir.join("information")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let link = sim.path().join("sys/bus/pci/devices").join(bus);
    let pci_link = std::fs::read_link(&link).unwrap();
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_file(sim.path().join(format!("dev/nvidia{minor}"))).unwrap();
    Gone {
        bus: bus.into(),
        minor,
        information,
        pci_link,
    }
}

/// The GPU back, at `minor` (the same, or what a driver reload gave it).
fn gpu_comes_back(sim: &SimRoot, g: &Gone, minor: u32) {
    let dir = sim.path().join("proc/driver/nvidia/gpus").join(&g.bus);
    std::fs::create_dir_all(&dir).unwrap();
    let was = format!("Device Minor: \t\t {}\n", g.minor);
    assert!(g.information.contains(&was), "{}", g.information);
    std::fs::write(
        dir.join("information"),
        g.information
            .replace(&was, &format!("Device Minor: \t\t {minor}\n")),
    )
    .unwrap();
    symlink(
        &g.pci_link,
        sim.path().join("sys/bus/pci/devices").join(&g.bus),
    )
    .unwrap();
    mknod(
        &sim.path().join(format!("dev/nvidia{minor}")),
        NVIDIA_MAJOR,
        minor,
        0o666,
    );
}

/// The devices `driver` publishes once there are `n` of them (20 s at most).
async fn published(api: &ApiServer, driver: &str, n: usize) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let devices: Vec<Value> = api
            .slices_of(driver)
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .collect();
        if devices.len() == n {
            return devices;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{driver}: {n} devices never published; now {devices:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The published name of the device whose `pciBusID` is `bus`.
fn name_of(devices: &[Value], bus: &str) -> String {
    devices
        .iter()
        .find(|d| d["attributes"]["resource.kubernetes.io/pciBusID"]["string"] == bus)
        .and_then(|d| d["name"].as_str())
        .unwrap_or_else(|| panic!("no device at {bus} in {devices:#?}"))
        .to_string()
}

/// Each published device's name by its PCI bus id.
fn names_by_bus(devices: &[Value]) -> BTreeMap<String, String> {
    devices
        .iter()
        .map(|d| {
            (
                d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no pciBusID: {d}"))
                    .to_string(),
                d["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The DRA registration socket of `driver` in a [`Driver`]'s dirs.
fn reg_socket(drv: &Driver, driver: &str) -> PathBuf {
    drv.dir
        .path()
        .join(format!("plugins_registry/{driver}-reg.sock"))
}

fn spec_path(cdi_dir: &Path, driver: &str, uid: &str) -> PathBuf {
    cdi_dir.join(format!("k8s.{driver}-claim_{uid}.json"))
}

/// Lets the profile whose table header is `header` (`[profiles.nvidia]`) in `runc`'s config
/// take `driver`'s claim kind, as a container engine takes kubelet's CDI devices (tests/dra.rs
/// says why).
fn allow_claims(runc: &Runc, header: &str, driver: &str) {
    let text = std::fs::read_to_string(runc.config_path()).unwrap();
    let header = format!("{header}\n");
    assert!(text.contains(&header), "{text}");
    let text = text.replacen(
        &header,
        &format!("{header}cdi-extra-kinds = [\"k8s.{driver}/claim\"]\n"),
        1,
    );
    std::fs::write(runc.config_path(), text).unwrap();
}

/// A container given `ids` as kubelet gives a claim's CDI devices, through our runtime and
/// real runc, probed with `probe`: its exit and what it saw.
fn run_claim(runc: &Runc, ids: &[String], probe: &Probe) -> (common::Out, Option<Report>) {
    let mut b = Bundle::busybox();
    b.edit(|s| s["annotations"] = json!({"cdi.k8s.io/dra-claim": ids.join(",")}));
    b.sh(&probe.script());
    let id = runc.id("identity");
    let out = runc.run(&b, &id);
    let report = (out.code == 0).then(|| Report::parse(&out.stdout));
    (out, report)
}

/// The NVIDIA GPU nodes (`nvidia<minor>`) a container given `ids` sees in its `/dev`.
fn gpus_seen(sim: &SimRoot, cdi_dir: &Path, ids: &[String]) -> BTreeSet<String> {
    let runc = Runc::with_config(sim, &format!("cdi-spec-dirs = [{cdi_dir:?}]"));
    allow_claims(&runc, "[profiles.nvidia]", NV);
    let (out, report) = run_claim(&runc, ids, &Probe::new().ls("/dev"));
    let r = report.unwrap_or_else(|| panic!("{ids:?}: {out:#?}\n{}", runc.shim_log()));
    r.ls("/dev")
        .into_iter()
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|m| m.parse::<u32>().is_ok())
        })
        .collect()
}

/// Prepares, one claim each, every published device but `held`, the name a claim holds (what
/// the scheduler, counting allocations by name, would hand out next), and returns each new
/// claim's UID, device name and CDI IDs.
async fn allocate_the_free_names(
    api: &ApiServer,
    ch: &tonic::transport::Channel,
    devices: &[Value],
    held: &str,
    first_uid: u32,
) -> Vec<(String, String, Vec<String>)> {
    let mut got = Vec::new();
    let free = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .filter(|n| n != held);
    for (i, name) in free.enumerate() {
        let (u, c) = (uid(first_uid + i as u32), format!("b{i}"));
        api.put_claim("ns", &c, &u, NV, NODE, &[("gpus", &name)]);
        let r = prepare(ch, PREPARE_V1, vec![claim("ns", &c, &u)]).await;
        let r = &r.claims[&u];
        assert_eq!(r.error, "", "claim {c} for the free name {name}");
        got.push((u, name, cdi_ids(r)));
    }
    got
}

// ---------------------------------------------------------------------------------------------
// Class 1: DRA device names were positions
// ---------------------------------------------------------------------------------------------

/// Three GPUs whose minors are not in bus order; claim A holds the middle one; the
/// lowest-bus GPU falls off the bus and the pool is republished. The scheduler counts
/// allocations by name: a claim allocated a published name no claim holds must get another
/// GPU than A's. Before the fix the names shifted down, the name of A's GPU was "free", and
/// both claims' containers got one GPU.
#[test]
fn class1_dra_names_survive_a_device_leaving() {
    let gpus = [
        ("0000:1a:00.0", 2),
        ("0000:3b:00.0", 0),
        ("0000:af:00.0", 1),
    ];
    let sim = nvidia_host(&gpus);
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
        let devices = published(&api, NV, 3).await;
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let a_name = name_of(&devices, gpus[1].0);
        api.put_claim("ns", "a", &uid(1), NV, NODE, &[("gpus", &a_name)]);
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        let a_ids = cdi_ids(&r.claims[&uid(1)]);

        let _gone = gpu_leaves(&sim, gpus[0].0, gpus[0].1);
        let devices = published(&api, NV, 2).await;
        let others = allocate_the_free_names(&api, &ch, &devices, &a_name, 10).await;
        assert_eq!(others.len(), 1, "{devices:#?}");

        let a_sees = gpus_seen(&sim, &drv.cdi_dir(), &a_ids);
        assert_eq!(a_sees, common::names(&["nvidia0"]), "claim a ({a_name})");
        for (u, name, ids) in &others {
            let sees = gpus_seen(&sim, &drv.cdi_dir(), ids);
            assert_eq!(sees.len(), 1, "{u} ({name}): {sees:?}");
            assert!(
                sees.is_disjoint(&a_sees),
                "claim {u}, allocated the free name {name}, got claim a's GPU ({a_name}): {sees:?}"
            );
        }
        drv.stop().await;
    });
}

/// A GPU leaves and comes back (same bus, same minor) between the prepares of two claims:
/// every device keeps its name through it, the claim that holds a device keeps every other
/// claim off it, and claims given the names no claim holds get GPUs of their own. Before the
/// fix claim A, prepared while the GPU was gone, held a name that then stood for another GPU,
/// and the name of A's GPU went to the next claim.
#[test]
fn class1_a_device_coming_back_keeps_its_name() {
    let gpus = [
        ("0000:1a:00.0", 2),
        ("0000:3b:00.0", 0),
        ("0000:af:00.0", 1),
    ];
    let sim = nvidia_host(&gpus);
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
        let before = names_by_bus(&published(&api, NV, 3).await);
        let (_, ch) = register(&reg_socket(&drv, NV)).await;

        let gone = gpu_leaves(&sim, gpus[0].0, gpus[0].1);
        let devices = published(&api, NV, 2).await;
        // Claim A is given the highest-bus GPU while the lowest is away.
        let a_name = name_of(&devices, gpus[2].0);
        api.put_claim("ns", "a", &uid(1), NV, NODE, &[("gpus", &a_name)]);
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        let a_ids = cdi_ids(&r.claims[&uid(1)]);

        gpu_comes_back(&sim, &gone, gone.minor);
        let devices = published(&api, NV, 3).await;
        let others = allocate_the_free_names(&api, &ch, &devices, &a_name, 10).await;
        assert_eq!(others.len(), 2, "{devices:#?}");
        let a_sees = gpus_seen(&sim, &drv.cdi_dir(), &a_ids);
        assert_eq!(a_sees, common::names(&["nvidia1"]), "claim a ({a_name})");
        let mut seen = a_sees.clone();
        for (u, name, ids) in &others {
            let sees = gpus_seen(&sim, &drv.cdi_dir(), ids);
            assert_eq!(sees.len(), 1, "{u} ({name}): {sees:?}");
            assert!(
                sees.is_disjoint(&seen),
                "claim {u}, allocated the free name {name}, got a GPU another claim holds: {sees:?} of {seen:?}"
            );
            seen.extend(sees);
        }

        // Every GPU goes by the name it had before, the one that came back too.
        assert_eq!(names_by_bus(&devices), before);
        assert_eq!(before[gpus[2].0], a_name);
        // A claim allocated the name of A's GPU is kept off it.
        api.put_claim("ns", "late", &uid(20), NV, NODE, &[("gpus", &a_name)]);
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "late", &uid(20))]).await;
        let e = &r.claims[&uid(20)].error;
        assert!(e.contains(&format!("is prepared for claim ns/a ({})", uid(1))), "{e}");
        assert!(!spec_path(&drv.cdi_dir(), NV, &uid(20)).exists());
        drv.stop().await;
    });
}

// ---------------------------------------------------------------------------------------------
// Classes 2 and 3: the device plugin's answers
// ---------------------------------------------------------------------------------------------

fn i915(bdf: &str, bridges: &[&str], card: u32, render: u32) -> Func {
    Func {
        bdf: bdf.into(),
        bridges: bridges.iter().map(|s| s.to_string()).collect(),
        vendor: "0x8086",
        device: "0x56c0",
        driver: "i915",
        numa: 0,
        card: Some(card),
        render: Some(render),
        kfd: None,
    }
}

/// The sysfs path of `f` below `sys/devices` (what its class links point into).
fn rel_of(sim: &SimRoot, f: &Func) -> PathBuf {
    drm::sysfs_dir(sim.path(), f)
        .strip_prefix(sim.path().join("sys/devices"))
        .unwrap()
        .to_path_buf()
}

/// `f`'s card and render node names with their minors.
fn drm_nodes(f: &Func) -> [(String, u32); 2] {
    let (c, r) = (f.card.unwrap(), f.render.unwrap());
    [(format!("card{c}"), c), (format!("renderD{r}"), r)]
}

/// `f` unbound from its driver, as the kernel shows it: its DRM class devices, their
/// `/sys/dev/char` entries and nodes gone, no `driver` link.
fn drm_unbind(sim: &SimRoot, f: &Func) {
    let dir = drm::sysfs_dir(sim.path(), f);
    for (name, minor) in drm_nodes(f) {
        std::fs::remove_dir_all(dir.join("drm").join(&name)).unwrap();
        std::fs::remove_file(sim.path().join("sys/class/drm").join(&name)).unwrap();
        std::fs::remove_file(sim.path().join(format!("sys/dev/char/{DRM_MAJOR}:{minor}"))).unwrap();
        std::fs::remove_file(sim.path().join("dev/dri").join(&name)).unwrap();
    }
    std::fs::remove_file(dir.join("driver")).unwrap();
}

/// `f` bound again with the numbers of `to` (a reboot or driver reload probes in another
/// order): its DRM class devices and nodes made anew.
fn drm_bind(sim: &SimRoot, to: &Func) {
    let dir = drm::sysfs_dir(sim.path(), to);
    let rel = rel_of(sim, to);
    for (name, minor) in drm_nodes(to) {
        std::fs::create_dir_all(dir.join("drm").join(&name)).unwrap();
        std::fs::write(
            dir.join("drm").join(&name).join("dev"),
            format!("{DRM_MAJOR}:{minor}\n"),
        )
        .unwrap();
        let target = format!("../../devices/{}/drm/{name}", rel.display());
        symlink(&target, sim.path().join("sys/class/drm").join(&name)).unwrap();
        symlink(
            &target,
            sim.path().join(format!("sys/dev/char/{DRM_MAJOR}:{minor}")),
        )
        .unwrap();
        mknod(
            &sim.path().join("dev/dri").join(&name),
            DRM_MAJOR,
            minor,
            0o666,
        );
    }
    let depth = rel.components().count() + 1;
    symlink(
        format!("{}bus/pci/drivers/{}", "../".repeat(depth), to.driver),
        dir.join("driver"),
    )
    .unwrap();
}

/// `/dev/dri` of a container run from `answer` (applied as containerd applies it) through
/// our runtime and runc.
fn dri_of_answer(runc: &Runc, answer: &ContainerAllocateResponse, what: &str) -> BTreeSet<String> {
    let mut b = Bundle::busybox();
    apply_answer(&mut b, answer);
    b.sh(&Probe::new().ls("/dev").ls("/dev/dri").script());
    let id = runc.id("answer");
    let out = runc.run(&b, &id);
    assert_eq!(out.code, 0, "{what}: {out:#?}\n{}", runc.shim_log());
    Report::parse(&out.stdout).ls("/dev/dri")
}

fn profile_of(runc: &Runc, name: &str) -> accel_container_runtime::profile::Profile {
    Config::load(&runc.config_path())
        .unwrap()
        .profiles
        .into_iter()
        .find(|p| p.name == name)
        .unwrap()
}

/// Intel i915 (no unique id), the plugin's default strategies (volume-mounts and
/// device-specs) under the stand-in kubelet: the middle GPU is allocated; its container runs;
/// a GPU below it is unbound; kubelet starts the container again from the answer it stored,
/// as it does at every restart. The container gets the GPU it was allocated and no other.
/// Before the fix the answer named a position, and the restarted container got the GPU that
/// had come to stand there as well.
#[test]
fn class2_plugin_answer_survives_a_device_leaving() {
    common::require_root();
    let sim = SimRoot::builder().build();
    let funcs = vec![
        i915("0000:00:02.0", &[], 0, 128),
        i915("0000:03:00.0", &["0000:00:01.0"], 1, 129),
        i915("0000:05:00.0", &["0000:00:1c.0"], 2, 130),
    ];
    drm::build(sim.path(), funcs.clone(), false, &[]);
    let runc = Runc::with_config(
        &sim,
        "accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true",
    );
    drm::install_profiles(&runc, &sim, &["intel"]);
    let profile = profile_of(&runc, "intel");
    let answer = rt().block_on(async {
        let mut kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.cdi_dir = runc.scratch().join("cdi");
        opts.poll = Duration::from_millis(100);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(plugin_server::run(vec![profile], opts, stop_rx));
        kubelet.wait_registrations(1).await;
        let reg = kubelet.registrations.lock().unwrap()[0].clone();
        let ch = grpc::connect(&kubelet.dir().join(&reg.endpoint), "localhost")
            .await
            .unwrap();
        let listed = kubelet.updates.recv().await.unwrap();
        assert_eq!(listed.devices.len(), 3, "{listed:?}");
        let middle = listed.devices[1].id.clone();
        let answer = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![middle],
                }],
            },
        )
        .await
        .unwrap()
        .container_responses
        .remove(0);
        stop.send(true).unwrap();
        task.await.unwrap().unwrap();
        answer
    });
    let want = common::names(&["card1", "renderD129"]);
    assert_eq!(dri_of_answer(&runc, &answer, "first start"), want);
    drm_unbind(&sim, &funcs[0]);
    assert_eq!(
        dri_of_answer(&runc, &answer, "restart after 0000:00:02.0 left"),
        want,
        "the answer: {answer:?}"
    );
}

/// AMD with KFD topology where two GPUs report one `unique_id`: Allocate of the second of
/// them, by its ID (`{bus}`), answered by each strategy the runtime resolves and run: the
/// container sees that GPU only. Before the fix the answer named the shared id, which the
/// runtime resolved to the first of the two.
#[test]
fn class3_duplicate_unique_id_allocate_gives_the_right_device() {
    common::require_root();
    let sim = SimRoot::builder().build();
    let mut funcs = drm::amd_funcs();
    let shared = funcs[1].kfd.unwrap().1;
    let node = funcs[2].kfd.unwrap().0;
    funcs[2].kfd = Some((node, shared));
    let host = drm::build(sim.path(), funcs, true, &[]);
    let gpus = host.offered("0x1002", "amdgpu");
    let (first, second) = (gpus[1], gpus[2]);
    assert_eq!(first.kfd.unwrap().1, second.kfd.unwrap().1);
    for (strategy, extra) in STRATEGIES {
        let cdi_dir = tempfile::tempdir().unwrap();
        let extra = format!("{extra}\ncdi-spec-dirs = [{:?}]", cdi_dir.path());
        let runc = Runc::with_config(&sim, &extra);
        drm::install_profiles(&runc, &sim, &["amd"]);
        let profile = profile_of(&runc, "amd");
        if matches!(strategy, Strategy::CdiCri | Strategy::CdiAnnotations) {
            let mut opts = plugin_server::Options::new(PathBuf::from("/nonexistent"));
            opts.cdi_dir = cdi_dir.path().to_path_buf();
            plugin_server::write_cdi(&profile, &opts).unwrap();
        }
        let plugin = service::Plugin::new(profile, vec![strategy]).unwrap();
        let answer = plugin
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&[&second.bdf]),
                }],
            })
            .unwrap()
            .container_responses
            .remove(0);
        let want: BTreeSet<String> = [second.card_node(), second.render_node()]
            .iter()
            .map(|n| n.trim_start_matches("/dev/dri/").to_string())
            .collect();
        let got = dri_of_answer(&runc, &answer, strategy.as_str());
        assert_eq!(
            got, want,
            "{strategy:?}: allocated {} ({}), the answer {answer:?}",
            second.bdf, first.bdf
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Class 4: a record after a reboot
// ---------------------------------------------------------------------------------------------

const BOOT_1: &str = "5f0c1a52-3e0b-4d7e-9a55-0c6f3b1e2d01\n";
const BOOT_2: &str = "5f0c1a52-3e0b-4d7e-9a55-0c6f3b1e2d02\n";

/// Claim A is prepared on the GPU at 0000:3b:00.0 (minor 1). The node reboots: that GPU is
/// gone and the GPU at 0000:af:00.0 now has minor 1, so the name A was allocated stands for
/// it; the CDI spec stayed. kubelet prepares A again: refused, naming both devices, and
/// nothing of the old spec reaches a container. Before the fix the record's answer was
/// returned as it was, the old spec giving A the other GPU. The claim still unprepares.
#[test]
fn class4_a_record_is_not_reused_after_a_reboot_changed_the_device() {
    let (b, other) = (("0000:3b:00.0", 1), ("0000:af:00.0", 0));
    let sim = nvidia_host(&[b, other]);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let boot = scratch.path().join("boot_id");
    std::fs::write(&boot, BOOT_1).unwrap();
    let api = ApiServer::start();
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), Duration::from_millis(50));
        with_boot_id(&mut opts, &boot);
        let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
        let devices = published(&api, NV, 2).await;
        let a_name = name_of(&devices, b.0);
        api.put_claim("ns", "a", &uid(1), NV, NODE, &[("gpus", &a_name)]);
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        let a_ids = cdi_ids(&r.claims[&uid(1)]);
        let spec = spec_path(&drv.cdi_dir(), NV, &uid(1));
        assert!(spec.exists());
        let dir = drv.stop().await;

        // The reboot.
        std::fs::write(&boot, BOOT_2).unwrap();
        gpu_leaves(&sim, b.0, b.1);
        let moved = gpu_leaves(&sim, other.0, other.1);
        gpu_comes_back(&sim, &moved, b.1);
        api.wipe();

        let drv = Driver::start_with(&cfg, &api, dir, opts);
        let devices = published(&api, NV, 1).await;
        assert_eq!(name_of(&devices, other.0), a_name, "the name now stands for {}", other.0);
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        let got = &r.claims[&uid(1)];
        assert!(
            !got.error.is_empty(),
            "claim a prepared again after the reboot on the device its name now stands for: {got:?}\n{}",
            std::fs::read_to_string(&spec).unwrap_or_default()
        );
        assert!(got.devices.is_empty(), "{got:?}");
        for bus in [b.0, other.0] {
            assert!(got.error.contains(bus), "{bus} not named: {}", got.error);
        }
        assert!(got.error.contains("earlier boot"), "{}", got.error);
        // kubelet keeps a claim's CDI IDs in its checkpoint: given to a container, they give
        // it nothing.
        let runc = Runc::with_config(&sim, &format!("cdi-spec-dirs = [{:?}]", drv.cdi_dir()));
        allow_claims(&runc, "[profiles.nvidia]", NV);
        let (out, report) = run_claim(&runc, &a_ids, &Probe::new().ls("/dev"));
        if let Some(r) = report {
            panic!(
                "a container given claim a's old CDI IDs got {:?}",
                common::extra_dev(&r.ls("/dev"))
            );
        }
        assert!(out.stderr.contains(&a_ids[0]), "{out:#?}");
        assert!(!spec.exists(), "the old spec left in {}", spec.display());

        // The record stays: the claim still unprepares when its pod goes.
        let record = drv.dir.path().join(format!("state/{NV}/{}.json", uid(1)));
        assert!(record.is_file());
        let u = unprepare(&ch, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(u.claims[&uid(1)].error, "");
        assert!(!record.exists());
        drv.stop().await;
    });
}

/// The positive side: the same GPU after a reboot is prepared again, with a spec made afresh.
/// NVIDIA: the same GPU at the same minor (its name is its minor), the spec rewritten. Intel
/// i915 (named by PCI function): the two GPUs probed the other way round, so A's GPU has new
/// card and render numbers: A gets a spec naming its new nodes, and its container sees them.
/// Before the fix the record's old spec was returned, naming the other GPU's nodes now.
#[test]
fn class4_the_same_device_after_a_reboot_is_prepared_afresh() {
    let scratch = tempfile::tempdir().unwrap();
    let boot = scratch.path().join("boot_id");

    // Intel i915, new numbers.
    let sim = SimRoot::builder().build();
    let funcs = vec![
        i915("0000:00:02.0", &[], 0, 128),
        i915("0000:03:00.0", &["0000:00:01.0"], 2, 130),
    ];
    drm::build(sim.path(), funcs.clone(), false, &[]);
    let cdi = tempfile::tempdir().unwrap();
    let runc = Runc::with_config(&sim, &format!("cdi-spec-dirs = [{:?}]", cdi.path()));
    drm::install_profiles(&runc, &sim, &["intel"]);
    allow_claims(&runc, "[profiles.\"intel\"]", I915);
    let cfg = Config::load(&runc.config_path()).unwrap();
    let api = ApiServer::start();
    std::fs::write(&boot, BOOT_1).unwrap();
    let (a_name, name_after, ids) = rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), Duration::from_millis(50));
        opts.cdi_dir = cdi.path().to_path_buf();
        with_boot_id(&mut opts, &boot);
        let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
        let a_name = name_of(&published(&api, I915, 2).await, &funcs[1].bdf);
        api.put_claim("ns", "a", &uid(1), I915, NODE, &[("gpus", &a_name)]);
        let (_, ch) = register(&reg_socket(&drv, I915)).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        let dir = drv.stop().await;

        // The reboot: the two GPUs probed the other way round.
        std::fs::write(&boot, BOOT_2).unwrap();
        for f in &funcs {
            drm_unbind(&sim, f);
        }
        drm_bind(&sim, &i915("0000:00:02.0", &[], 2, 130));
        drm_bind(&sim, &i915("0000:03:00.0", &["0000:00:01.0"], 0, 128));
        api.wipe();
        let drv = Driver::start_with(&cfg, &api, dir, opts);
        let name_after = name_of(&published(&api, I915, 2).await, &funcs[1].bdf);
        let (_, ch) = register(&reg_socket(&drv, I915)).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        drv.stop().await;
        (a_name, name_after, cdi_ids(&r.claims[&uid(1)]))
    });
    let (out, report) = run_claim(&runc, &ids, &Probe::new().ls("/dev").ls("/dev/dri"));
    let r = report.unwrap_or_else(|| panic!("{out:#?}\n{}", runc.shim_log()));
    assert_eq!(
        r.ls("/dev/dri"),
        common::names(&["card0", "renderD128"]),
        "claim a after the reboot; its spec:\n{}",
        std::fs::read_to_string(spec_path(cdi.path(), I915, &uid(1))).unwrap_or_default()
    );
    assert_eq!(name_after, a_name, "{} renamed by the reboot", funcs[1].bdf);

    // NVIDIA, the same minor.
    let sim = nvidia_host(&[("0000:3b:00.0", 1), ("0000:af:00.0", 0)]);
    let cfg = config(&sim, scratch.path(), "");
    std::fs::write(&boot, BOOT_1).unwrap();
    let api = ApiServer::start();
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), Duration::from_millis(50));
        with_boot_id(&mut opts, &boot);
        let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
        let a_name = name_of(&published(&api, NV, 2).await, "0000:3b:00.0");
        api.put_claim("ns", "a", &uid(1), NV, NODE, &[("gpus", &a_name)]);
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        let spec = spec_path(&drv.cdi_dir(), NV, &uid(1));
        let ino = std::fs::metadata(&spec).unwrap().ino();
        let dir = drv.stop().await;
        std::fs::write(&boot, BOOT_2).unwrap();
        let drv = Driver::start_with(&cfg, &api, dir, opts);
        published(&api, NV, 2).await;
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let again = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(again.claims[&uid(1)], r.claims[&uid(1)]);
        assert_ne!(
            std::fs::metadata(&spec).unwrap().ino(),
            ino,
            "the spec of an earlier boot was reused"
        );
        let ids = cdi_ids(&again.claims[&uid(1)]);
        assert_eq!(
            gpus_seen(&sim, &drv.cdi_dir(), &ids),
            common::names(&["nvidia1"])
        );
        drv.stop().await;
    });
}

// ---------------------------------------------------------------------------------------------
// Class 5: a shareID on a device not published as shareable
// ---------------------------------------------------------------------------------------------

/// Claim Y's result carries a `shareID` on gcu-2, claim X (exclusive) is allocated gcu-2;
/// prepared in both orders, each on a fresh driver: never both prepared, and Y refused since
/// no device is published as shareable. Before the fix Y then X prepared both.
#[test]
fn class5_share_id_never_lets_an_exclusive_claim_share() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let (x, y) = (uid(1), uid(2));
    for order in [["y", "x"], ["x", "y"]] {
        let api = ApiServer::start();
        api.put_claim("ns", "x", &x, DRIVER, NODE, &[("gcus", "gcu-2")]);
        api.put_claim_results(
            "ns",
            "y",
            &y,
            DRIVER,
            vec![
                json!({"request": "gcus", "driver": DRIVER, "pool": NODE, "device": "gcu-2",
                        "shareID": "6a1d3c2e-5b4f-4e0a-9d8c-7b6a5f4e3d2c"}),
            ],
        );
        rt().block_on(async {
            let drv = Driver::start(
                &cfg,
                &api,
                tempfile::tempdir().unwrap(),
                Duration::from_millis(50),
            );
            published(&api, DRIVER, 8).await;
            let (_, ch) = register(&drv.reg_socket()).await;
            let mut errors = BTreeMap::new();
            for c in order {
                let u = if c == "x" { &x } else { &y };
                let r = prepare(&ch, PREPARE_V1, vec![claim("ns", c, u)]).await;
                errors.insert(c, r.claims[u].error.clone());
            }
            assert!(
                !(errors["x"].is_empty() && errors["y"].is_empty()),
                "{order:?}: both claims prepared on gcu-2: {errors:?}"
            );
            assert!(
                errors["y"].contains("not published as shareable"),
                "{order:?}: {errors:?}"
            );
            assert_eq!(errors["x"], "", "{order:?}");
            assert!(!drv.spec_path(&y).exists());
            drv.stop().await;
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Classes 7 and 8: the accel-dra-driver binary
// ---------------------------------------------------------------------------------------------

static DRA_BIN: LazyLock<String> = LazyLock::new(|| binary(env!("CARGO_BIN_EXE_accel-dra-driver")));

/// The driver's directories, none of them made yet, under one temp dir.
struct Dirs {
    base: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            base: tempfile::tempdir().unwrap(),
        }
    }
    fn registry(&self) -> PathBuf {
        self.base.path().join("kubelet/plugins_registry")
    }
    fn plugins(&self) -> PathBuf {
        self.base.path().join("kubelet/plugins")
    }
    fn cdi(&self) -> PathBuf {
        self.base.path().join("run/cdi")
    }
    fn state(&self) -> PathBuf {
        self.base.path().join("lib/accel-dra-driver")
    }
}

/// `accel-dra-driver` run as the DaemonSet runs it (under `umask`), its log on stderr kept in
/// a file; killed on drop, also when an assertion fails.
struct DriverProcess {
    child: std::process::Child,
    log: PathBuf,
}

impl DriverProcess {
    fn spawn(config: &Path, kubeconfig: &Path, dirs: &Dirs, umask: &str, log: PathBuf) -> Self {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask}; exec \"$0\" \"$@\""))
            .arg(&*DRA_BIN)
            .args(["--node-name", NODE, "--poll-seconds", "0.1"])
            .arg("--registry-dir")
            .arg(dirs.registry())
            .arg("--plugins-dir")
            .arg(dirs.plugins())
            .arg("--cdi-dir")
            .arg(dirs.cdi())
            .arg("--state-dir")
            .arg(dirs.state())
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", config)
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        DriverProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its registration socket, once there (20 s at most, or as soon as it exits).
    fn wait_socket(&mut self, path: &Path) {
        let start = Instant::now();
        while !path.exists() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("accel-dra-driver exited ({status}):\n{}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no {} after 20 s:\n{}",
                path.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its peak resident memory so far (`VmHWM`), in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM in {status}"))
    }

    /// SIGTERM, as the kubelet stops a pod; panics unless it exits 0 within 10 s.
    fn stop(mut self) {
        common::sh_ok(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{status}:\n{}", self.log());
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no exit 10 s after SIGTERM:\n{}",
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

/// The real `accel-dra-driver` under umask 0, every directory it works in missing: it makes
/// them, and a claim prepared over its socket makes the CDI spec's; none may be group- or
/// world-writable (anyone could rename a socket over `dra.sock` or drop a spec). Before the
/// fix the socket and CDI directories were 0777.
#[test]
fn class7_dirs_are_not_world_writable_under_umask_0() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.put_claim("ns", "a", &uid(1), DRIVER, NODE, &[("gcus", "gcu-1")]);
    let dirs = Dirs::new();
    let mut drv = DriverProcess::spawn(
        &scratch.path().join("config.toml"),
        &api.kubeconfig(scratch.path(), "{}"),
        &dirs,
        "0",
        scratch.path().join("driver.log"),
    );
    let reg = dirs.registry().join(format!("{DRIVER}-reg.sock"));
    drv.wait_socket(&reg);
    rt().block_on(async {
        let (_, ch) = register(&reg).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "", "{}", drv.log());
    });
    assert!(spec_path(&dirs.cdi(), DRIVER, &uid(1)).exists());
    let made: Vec<PathBuf> = walkdir(dirs.base.path())
        .into_iter()
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect();
    for want in [
        dirs.registry(),
        dirs.plugins().join(DRIVER),
        dirs.cdi(),
        dirs.state().join(DRIVER),
    ] {
        assert!(
            made.contains(&want),
            "{} not made: {made:?}",
            want.display()
        );
    }
    let loose: Vec<String> = made
        .iter()
        .map(|d| (d, std::fs::symlink_metadata(d).unwrap().mode() & 0o7777))
        .filter(|(_, mode)| mode & 0o022 != 0)
        .map(|(d, mode)| format!("{} {mode:04o}", d.display()))
        .collect();
    assert!(loose.is_empty(), "writable by others: {loose:#?}");
    drv.stop();
}

/// Every path under `dir` (not `dir` itself), depth first.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walkdir(&p));
        }
        out.push(p);
    }
    out
}

/// The DaemonSet's memory limit for the driver
/// (packaging/kubernetes/accel-dra-driver-daemonset.yaml: 64Mi).
const DAEMONSET_LIMIT_KIB: u64 = 64 * 1024;

/// A claim record of 64 MiB (sparse) beside a valid one in the state dir: the real driver
/// starts, skips the huge one with a log line, and unprepares the valid claim, its peak
/// resident memory staying under the DaemonSet's limit. Before the fix the record was read
/// whole: 64 MiB more at every start, an out-of-memory loop under the limit.
#[test]
fn class8_a_huge_claim_record_does_not_stop_the_driver() {
    let (sim, _major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    let api = ApiServer::start();
    api.put_claim("ns", "a", &uid(1), DRIVER, NODE, &[("gcus", "gcu-1")]);
    let dirs = Dirs::new();
    let config = scratch.path().join("config.toml");
    let kube = api.kubeconfig(scratch.path(), "{}");
    let reg = dirs.registry().join(format!("{DRIVER}-reg.sock"));
    let mut drv = DriverProcess::spawn(&config, &kube, &dirs, "022", scratch.path().join("1.log"));
    drv.wait_socket(&reg);
    rt().block_on(async {
        let (_, ch) = register(&reg).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "", "{}", drv.log());
    });
    let first_peak = drv.peak_rss_kib();
    drv.stop();
    let valid = dirs.state().join(DRIVER).join(format!("{}.json", uid(1)));
    assert!(valid.is_file());

    let huge = dirs.state().join(DRIVER).join(format!("{}.json", uid(2)));
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(64 << 20).unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    drop(f);
    let started = Instant::now();
    let mut drv = DriverProcess::spawn(&config, &kube, &dirs, "022", scratch.path().join("2.log"));
    drv.wait_socket(&reg);
    let up = started.elapsed();
    rt().block_on(async {
        let (_, ch) = register(&reg).await;
        let u = unprepare(&ch, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(u.claims[&uid(1)].error, "", "{}", drv.log());
    });
    assert!(!valid.exists() && !spec_path(&dirs.cdi(), DRIVER, &uid(1)).exists());
    let peak = drv.peak_rss_kib();
    let log = drv.log();
    assert!(
        log.lines()
            .any(|l| l.contains("ignoring claim record") && l.contains(&huge.display().to_string())),
        "{log}"
    );
    assert!(
        peak < DAEMONSET_LIMIT_KIB,
        "peak resident memory {peak} KiB with the 64 MiB record (up in {up:?}; {first_peak} KiB without it)"
    );
    drv.stop();
}

// ---------------------------------------------------------------------------------------------
// Issue 42, item 6: identity that does not survive a reboot fails closed on the device it names
// ---------------------------------------------------------------------------------------------

/// `n` GCUs as the seed has them, with each GCU's `/sys/dev/char` link into its PCI function
/// (`with_sysfs`) or without any (a driver that makes its nodes by hand: nothing but the
/// node's numbers is known of a GCU).
fn gcu_host(with_sysfs: bool) -> SimRoot {
    let sim = SimRoot::builder()
        .enflame(8)
        .library(LIB_DIR, "libefml.so.1.2.3", "libefml.so.1")
        .build();
    if with_sysfs {
        enflame_sysfs(sim.path(), sim.enflame_major().unwrap());
    }
    sim
}

/// Claim A prepared on gcu-1; the node reboots (a new boot id, the driver started afresh,
/// the slices gone) with the same GCUs. kubelet prepares A again: accepted, on the same
/// device, with the same answer, whether or not sysfs knows the GCUs' PCI functions. Before
/// the fix a GCU whose PCI function is not known was refused after every reboot ("prepared
/// for it as nodes M:1 in an earlier boot and is now nodes M:1: not the same device").
#[test]
fn identity_that_does_not_survive_a_reboot_enflame_claim_prepared_again_after_reboot() {
    for with_sysfs in [false, true] {
        let sim = gcu_host(with_sysfs);
        let major = sim.enflame_major().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let cfg = config(&sim, scratch.path(), "");
        let boot = scratch.path().join("boot_id");
        std::fs::write(&boot, BOOT_1).unwrap();
        let api = ApiServer::start();
        api.put_claim("ns", "a", &uid(1), DRIVER, NODE, &[("gcus", "gcu-1")]);
        rt().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut opts = options(dir.path(), Duration::from_millis(50));
            with_boot_id(&mut opts, &boot);
            let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
            published(&api, DRIVER, 8).await;
            let (_, ch) = register(&drv.reg_socket()).await;
            let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
            assert_eq!(r.claims[&uid(1)].error, "", "sysfs {with_sysfs}");
            let dir = drv.stop().await;

            // The reboot.
            std::fs::write(&boot, BOOT_2).unwrap();
            api.wipe();
            let drv = Driver::start_with(&cfg, &api, dir, opts);
            published(&api, DRIVER, 8).await;
            let (_, ch) = register(&drv.reg_socket()).await;
            let again = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
            assert_eq!(
                again.claims[&uid(1)].error,
                "",
                "sysfs {with_sysfs}: the claim's pod stays down after the reboot"
            );
            assert_eq!(
                again.claims[&uid(1)],
                r.claims[&uid(1)],
                "sysfs {with_sysfs}"
            );
            let spec = std::fs::read_to_string(drv.spec_path(&uid(1))).unwrap();
            assert!(spec.contains("/dev/gcu1\""), "{spec}");
            assert!(!spec.contains("/dev/gcu2\""), "{spec}");
            let record = std::fs::read_to_string(
                drv.dir
                    .path()
                    .join(format!("state/{DRIVER}/{}.json", uid(1))),
            )
            .unwrap();
            assert!(record.contains(&format!("{major}:1")), "{record}");
            assert!(record.contains(BOOT_2.trim()), "{record}");
            drv.stop().await;
        });
    }
}

const BOOT_3: &str = "5f0c1a52-3e0b-4d7e-9a55-0c6f3b1e2d03\n";

/// `/sys/dev/char/<major>:<minor>` of `sim` pointing at `target` (relative to `sys/dev/char`).
fn char_link(sim: &SimRoot, major: u32, minor: u32, target: &str) {
    let link = sim.path().join(format!("sys/dev/char/{major}:{minor}"));
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&link);
    symlink(target, link).unwrap();
}

/// Enflame class, the numbers now another device's: claim A prepared on gcu-1, then the node
/// reboots and the driver numbers the GCUs otherwise, so that `M:1` (`/dev/gcu1`) is the
/// card in another slot, as its `/sys/dev/char` link says: into another PCI function (the
/// seed's sysfs), or, for a GCU on no PCI bus, into another platform device. Refused, naming
/// both.
#[test]
fn identity_that_does_not_survive_a_reboot_enflame_numbers_now_another_gcu_refused() {
    for pci in [true, false] {
        let sim = gcu_host(pci);
        let major = sim.enflame_major().unwrap();
        let target = |n: u32, name: u32| -> String {
            if pci {
                let was = std::fs::read_link(sim.path().join(format!("sys/dev/char/{major}:{n}")))
                    .unwrap();
                let dir = was.parent().unwrap().display().to_string();
                format!("{dir}/gcu{name}")
            } else {
                format!("../../devices/platform/gcu.{n}/enflame/gcu{name}")
            }
        };
        let (one, five) = (target(1, 1), target(5, 5));
        if !pci {
            char_link(&sim, major, 1, &one);
            char_link(&sim, major, 5, &five);
        }
        let scratch = tempfile::tempdir().unwrap();
        let cfg = config(&sim, scratch.path(), "");
        let boot = scratch.path().join("boot_id");
        std::fs::write(&boot, BOOT_1).unwrap();
        let api = ApiServer::start();
        api.put_claim("ns", "a", &uid(1), DRIVER, NODE, &[("gcus", "gcu-1")]);
        rt().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut opts = options(dir.path(), Duration::from_millis(50));
            with_boot_id(&mut opts, &boot);
            let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
            published(&api, DRIVER, 8).await;
            let (_, ch) = register(&drv.reg_socket()).await;
            let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
            assert_eq!(r.claims[&uid(1)].error, "", "pci {pci}");
            let dir = drv.stop().await;

            // The reboot: the cards in the slots of gcu1 and gcu5 numbered the other way round.
            std::fs::write(&boot, BOOT_2).unwrap();
            let swap = |t: &str, from: u32, to: u32| {
                t.replace(&format!("/gcu{from}"), &format!("/gcu{to}"))
            };
            char_link(&sim, major, 1, &swap(&five, 5, 1));
            char_link(&sim, major, 5, &swap(&one, 1, 5));
            api.wipe();
            let drv = Driver::start_with(&cfg, &api, dir, opts);
            published(&api, DRIVER, 8).await;
            let (_, ch) = register(&drv.reg_socket()).await;
            let again = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
            let got = &again.claims[&uid(1)];
            assert!(got.devices.is_empty(), "pci {pci}: {got:?}");
            let (was, now) = if pci {
                ("0000:11:00.0", "0000:15:00.0")
            } else {
                ("devices/platform/gcu.1", "devices/platform/gcu.5")
            };
            assert!(
                got.error.contains(&format!(
                    "device gcu-1 was prepared for it as nodes {major}:1"
                )) && got.error.contains(&format!(
                    "{was} in an earlier boot and is now nodes {major}:1"
                )) && got.error.contains(now)
                    && got.error.contains("not the same device"),
                "pci {pci}: {}",
                got.error
            );
            assert!(
                !drv.spec_path(&uid(1)).exists(),
                "pci {pci}: the old spec left"
            );
            drv.stop().await;
        });
    }
}

/// NVIDIA class (PCI function and UUID known): the same GPU after a reboot is prepared again;
/// after another, the GPU the claim was given is gone and the other one probed at its minor,
/// so the name stands for it: refused, naming both PCI functions and UUIDs.
#[test]
fn identity_that_does_not_survive_a_reboot_nvidia_same_gpu_accepted_other_at_its_minor_refused() {
    let (b, other) = (("0000:3b:00.0", 1), ("0000:af:00.0", 0));
    let sim = nvidia_host(&[b, other]);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    let boot = scratch.path().join("boot_id");
    std::fs::write(&boot, BOOT_1).unwrap();
    let api = ApiServer::start();
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), Duration::from_millis(50));
        with_boot_id(&mut opts, &boot);
        let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
        let devices = published(&api, NV, 2).await;
        let a_name = name_of(&devices, b.0);
        api.put_claim("ns", "a", &uid(1), NV, NODE, &[("gpus", &a_name)]);
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        let record = drv.dir.path().join(format!("state/{NV}/{}.json", uid(1)));
        let text = std::fs::read_to_string(&record).unwrap();
        let uuid_b = text
            .split("\"uuid\":\"")
            .nth(1)
            .and_then(|t| t.split('"').next())
            .unwrap_or_else(|| panic!("no UUID in {text}"))
            .to_string();
        let dir = drv.stop().await;

        // A reboot, the same GPUs.
        std::fs::write(&boot, BOOT_2).unwrap();
        api.wipe();
        let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
        published(&api, NV, 2).await;
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let again = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(again.claims[&uid(1)], r.claims[&uid(1)]);
        let dir = drv.stop().await;

        // Another: A's GPU gone, the other one at its minor.
        std::fs::write(&boot, BOOT_3).unwrap();
        gpu_leaves(&sim, b.0, b.1);
        let moved = gpu_leaves(&sim, other.0, other.1);
        gpu_comes_back(&sim, &moved, b.1);
        api.wipe();
        let drv = Driver::start_with(&cfg, &api, dir, opts);
        let devices = published(&api, NV, 1).await;
        assert_eq!(name_of(&devices, other.0), a_name);
        let (_, ch) = register(&reg_socket(&drv, NV)).await;
        let got = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        let got = &got.claims[&uid(1)];
        assert!(got.devices.is_empty(), "{got:?}");
        for named in [
            b.0,
            other.0,
            &uuid_b,
            "in an earlier boot",
            "not the same device",
        ] {
            assert!(got.error.contains(named), "{named} not said: {}", got.error);
        }
        drv.stop().await;
    });
}

/// DRM class (Intel i915, named by PCI function): the same GPU after a reboot, probed with
/// other card and render numbers, is prepared again; after another, a different card sits
/// at the same PCI address under other bridges (a card added, the buses numbered anew) with
/// the same numbers: refused, naming both places. Before, the PCI address alone said "the
/// same device".
#[test]
fn identity_that_does_not_survive_a_reboot_drm_same_gpu_accepted_other_card_at_its_address_refused()
{
    let scratch = tempfile::tempdir().unwrap();
    let boot = scratch.path().join("boot_id");
    let sim = SimRoot::builder().build();
    let funcs = vec![
        i915("0000:00:02.0", &[], 0, 128),
        i915("0000:03:00.0", &["0000:00:01.0"], 2, 130),
    ];
    drm::build(sim.path(), funcs.clone(), false, &[]);
    let cdi = tempfile::tempdir().unwrap();
    let runc = Runc::with_config(&sim, &format!("cdi-spec-dirs = [{:?}]", cdi.path()));
    drm::install_profiles(&runc, &sim, &["intel"]);
    let cfg = Config::load(&runc.config_path()).unwrap();
    let api = ApiServer::start();
    std::fs::write(&boot, BOOT_1).unwrap();
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), Duration::from_millis(50));
        opts.cdi_dir = cdi.path().to_path_buf();
        with_boot_id(&mut opts, &boot);
        let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
        let a_name = name_of(&published(&api, I915, 2).await, &funcs[1].bdf);
        api.put_claim("ns", "a", &uid(1), I915, NODE, &[("gpus", &a_name)]);
        let (_, ch) = register(&reg_socket(&drv, I915)).await;
        let r = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(r.claims[&uid(1)].error, "");
        let dir = drv.stop().await;

        // A reboot: the two GPUs probed the other way round.
        std::fs::write(&boot, BOOT_2).unwrap();
        for f in &funcs {
            drm_unbind(&sim, f);
        }
        let a_now = i915("0000:03:00.0", &["0000:00:01.0"], 0, 128);
        drm_bind(&sim, &i915("0000:00:02.0", &[], 2, 130));
        drm_bind(&sim, &a_now);
        api.wipe();
        let drv = Driver::start_with(&cfg, &api, dir, opts.clone());
        published(&api, I915, 2).await;
        let (_, ch) = register(&reg_socket(&drv, I915)).await;
        let again = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        assert_eq!(again.claims[&uid(1)].error, "");
        let dir = drv.stop().await;

        // Another: A's card gone; another card, under another root port, numbered
        // 0000:03:00.0 now, and probed with the numbers A's card had.
        std::fs::write(&boot, BOOT_3).unwrap();
        drm_unbind(&sim, &a_now);
        std::fs::remove_file(sim.path().join("sys/bus/pci/devices/0000:03:00.0")).unwrap();
        std::fs::remove_dir_all(drm::sysfs_dir(sim.path(), &a_now)).unwrap();
        let other = i915("0000:03:00.0", &["0000:00:1c.0"], 0, 128);
        let dir_other = drm::sysfs_dir(sim.path(), &other);
        std::fs::create_dir_all(&dir_other).unwrap();
        for (file, text) in [
            ("vendor", "0x8086\n"),
            ("device", "0x56c0\n"),
            ("numa_node", "0\n"),
        ] {
            std::fs::write(dir_other.join(file), text).unwrap();
        }
        symlink(
            format!("../../../devices/{}", rel_of(&sim, &other).display()),
            sim.path().join("sys/bus/pci/devices/0000:03:00.0"),
        )
        .unwrap();
        drm_bind(&sim, &other);
        api.wipe();
        let drv = Driver::start_with(&cfg, &api, dir, opts);
        assert_eq!(name_of(&published(&api, I915, 2).await, &other.bdf), a_name);
        let (_, ch) = register(&reg_socket(&drv, I915)).await;
        let got = prepare(&ch, PREPARE_V1, vec![claim("ns", "a", &uid(1))]).await;
        let got = &got.claims[&uid(1)];
        assert!(got.devices.is_empty(), "{got:?}");
        for named in [
            // The simulated tree names the root complex after the bus (`pci0000:03`).
            "sysfs devices/pci0000:03/0000:00:01.0/0000:03:00.0 in an earlier boot",
            "sysfs devices/pci0000:03/0000:00:1c.0/0000:03:00.0",
            "not the same device",
        ] {
            assert!(got.error.contains(named), "{named} not said: {}", got.error);
        }
        drv.stop().await;
    });
}
