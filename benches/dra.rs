//! accel-dra-driver: publishing 64 devices (discovery, health and the slice built: the
//! driver's own time; and the whole write to a stand-in API server), preparing a claim of 8
//! of them (node checks, the claim's CDI spec generated and written atomically, the record:
//! the driver's own time; and the gRPC round trip kubelet makes, which includes reading the
//! claim from the stand-in); then the resident memory of the real binary with 64 devices,
//! published and one claim prepared. Sharing (issue 35): the 8-GCU node published with its
//! counter sets, shareable devices and partitions (64 offers), and a prepare of a share on a
//! GCU idle against one on a GCU already shared by 16 claims, as a ratio within one run.
//!
//! `cargo bench --features dra --bench dra` (root: mknod). Results: benches/BENCHMARKS.md.

#[path = "../tests/common/apiserver.rs"]
#[allow(dead_code)]
mod apiserver;
/// The stand-in kubelet's calls, as the tests make them.
#[path = "../tests/common/grpc.rs"]
#[allow(dead_code, unused_imports)]
mod grpc;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use accel_container_runtime::config::Config;
use accel_container_runtime::dra::claims::{ClaimRef, Claims};
use accel_container_runtime::dra::publish::Publisher;
use accel_container_runtime::dra::slices::{self, Pool};
use accel_container_runtime::dra::table;
use accel_container_runtime::kubelet::host_root::HostRoot;
use accel_container_runtime::kubelet::inventory;
use accel_container_runtime::kubelet::proto::dra::*;
use accel_container_runtime::kubelet::sharing::Sharing;
use accel_container_runtime::profile::Profile;
use apiserver::ApiServer;
use criterion::Criterion;
use grpc::{connect, PREPARE_V1};
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceClaim};

const DRIVER: &str = "gcu.enflame.com";
const NODE: &str = "bench-node";
const UID: &str = "0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e2a";

fn sh(cmd: &mut Command) {
    let st = cmd.status().unwrap();
    assert!(st.success(), "{cmd:?}: {st}");
}

/// A simulated host with `n` GCUs, 4 per PCIe switch, half on each NUMA node, the driver's
/// version file and one driver library in its ld.so.cache.
fn host(r: &Path, n: u64) -> u64 {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    for d in [
        "dev",
        "sys/module/enflame",
        "sys/bus/pci/devices",
        "sys/dev/char",
        "etc",
    ] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("sys/module/enflame/version"), "1.2.3.4\n").unwrap();
    let used = std::fs::read_to_string("/proc/devices").unwrap();
    let major = (234u64..254)
        .rev()
        .find(|m| {
            !used
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&m.to_string()))
        })
        .unwrap();
    let node = |p: &Path, minor: u64| {
        mknod(
            p,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .unwrap()
    };
    for i in 0..n {
        node(&r.join(format!("dev/gcu{i}")), i);
        let root = if i < n / 2 {
            "pci0000:00"
        } else {
            "pci0000:80"
        };
        let rel = PathBuf::from(root)
            .join(format!("0000:{:02x}:01.0", i / 8))
            .join(format!("0000:{:02x}:00.0", 0x40 + i / 4))
            .join(format!("0000:{:02x}:{:02x}.0", 0x60 + i / 4, i % 4))
            .join(format!("0000:{:02x}:00.0", 0x80 + i));
        let real = r.join("sys/devices").join(&rel);
        std::fs::create_dir_all(real.join(format!("enflame/gcu{i}"))).unwrap();
        std::fs::write(real.join("numa_node"), format!("{}\n", i / (n / 2).max(1))).unwrap();
        let bdf = format!("0000:{:02x}:00.0", 0x80 + i);
        std::os::unix::fs::symlink(
            Path::new("../../../devices").join(&rel),
            r.join("sys/bus/pci/devices").join(&bdf),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../devices")
                .join(&rel)
                .join(format!("enflame/gcu{i}")),
            r.join(format!("sys/dev/char/{major}:{i}")),
        )
        .unwrap();
    }
    node(&r.join("dev/gcuctl"), 255);
    let lib = r.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(r.join("lib.c"), "int efml_marker(void) { return 1; }\n").unwrap();
    sh(Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libefml.so.1", "-o"])
        .arg(lib.join("libefml.so.1"))
        .arg(r.join("lib.c")));
    std::fs::write(r.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n").unwrap();
    sh(Command::new("ldconfig").arg("-r").arg(r));
    major
}

/// The enflame profile on root `r`, with `extra` keys of config.toml.
fn enflame(r: &Path, extra: &str) -> (Profile, PathBuf) {
    let cfg = r.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profiles.enflame]\ndriver-root = \"{0}\"\n[profiles.nvidia]\ndriver-root = \"{0}\"\n{extra}",
            r.display()
        ),
    )
    .unwrap();
    let p = Config::load(&cfg)
        .unwrap()
        .profiles
        .into_iter()
        .find(|p| p.name == "enflame")
        .unwrap();
    (p, cfg)
}

fn claim_of_8() -> ResourceClaim {
    let results: Vec<serde_json::Value> = (0..8)
        .map(|i| serde_json::json!({"request": "gcus", "driver": DRIVER, "pool": NODE, "device": format!("gcu-{}", i * 8)}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "eight", "namespace": "default", "uid": UID},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

/// The taint of a device whose nodes are gone.
fn taint() -> DeviceTaint {
    DeviceTaint {
        key: format!("{DRIVER}/gone"),
        value: Some("device-node-gone".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// What a look at the node costs the driver: discovery, health, the pool's contents and its
/// slices serialized.
fn build(pool: &Pool, profile: &Profile) -> (Vec<table::DraDevice>, slices::Contents, Vec<u8>) {
    let t = table::discover(profile).unwrap();
    let taints: Vec<Option<DeviceTaint>> = t
        .iter()
        .map(|d| (!inventory::healthy(profile, &d.dev)).then(taint))
        .collect();
    let sharing = Sharing::of(profile).unwrap().0;
    let contents = slices::contents(pool, sharing.as_ref(), &t, &taints, "");
    let s = slices::slices(pool, &contents, 1);
    (t, contents, serde_json::to_vec(&s).unwrap())
}

fn timings(c: &mut Criterion, r: &Path, profile: &Profile) {
    let sharing = Sharing::of(profile).unwrap().0;
    let version = accel_container_runtime::discovery::driver_version(profile);
    let pool = Pool {
        driver: DRIVER,
        node: NODE,
        vendor: "enflame",
        driver_version: version.as_deref(),
    };
    let build = || build(&pool, profile);
    assert_eq!(build().0.len(), 64);
    c.bench_function("dra publish 64: discovery + health + slice JSON", |b| {
        b.iter(build)
    });

    let api = ApiServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let mut publisher = Publisher::new(
        api.client(),
        DRIVER,
        NODE,
        std::sync::Arc::new(tokio::sync::Notify::new()),
    );
    let mut turn = false;
    c.bench_function(
        "dra publish 64: discovery + a change written to the stand-in API server",
        |b| {
            b.iter(|| {
                let (t, mut contents, _) = build();
                // A change at every iteration: device 0 tainted, then not (a write of the
                // whole pool at a new generation, as any change makes).
                turn = !turn;
                let tainted = turn.then(taint);
                contents.devices[0] = slices::device(&pool, &t[0], tainted.as_ref());
                assert!(rt.block_on(publisher.publish(&pool, &contents)).unwrap());
            })
        },
    );
    // Nothing changed: what every poll of a steady node costs (no request).
    let (_, contents, _) = build();
    rt.block_on(publisher.publish(&pool, &contents)).unwrap();
    c.bench_function("dra publish 64: nothing changed (no request)", |b| {
        b.iter(|| {
            let (_, contents, _) = build();
            assert!(!rt.block_on(publisher.publish(&pool, &contents)).unwrap());
        })
    });

    let (table, _, _) = build();
    let claims = Claims::open(
        DRIVER.into(),
        NODE.into(),
        r.join("cdi"),
        r.join("state"),
        "/usr/lib64".into(),
        HostRoot::default(),
        "bench-boot".into(),
    )
    .unwrap();
    let claim = claim_of_8();
    let cref = ClaimRef {
        namespace: "default".into(),
        name: "eight".into(),
        uid: UID.into(),
    };
    c.bench_function(
        "dra prepare 8 of 64: checks + CDI spec + record (and unprepare)",
        |b| {
            b.iter(|| {
                let d = claims
                    .prepare(profile, sharing.as_ref(), &table, &cref, &claim)
                    .unwrap();
                assert_eq!(d.len(), 8);
                claims.unprepare(UID).unwrap();
            })
        },
    );
}

/// A claim of one share of `gcu-0-shared` (1Gi of its memory).
fn share_claim(i: usize) -> (ClaimRef, ResourceClaim) {
    let uid = format!("5a4c7f3e-9d2a-4c61-8f1e-2a7b9c0d{i:04}");
    let share = format!("7e1d2c3b-0000-4000-8000-00000000{i:04}");
    let claim = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("s{i}"), "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [{"request": "gcus", "driver": DRIVER,
            "pool": NODE, "device": "gcu-0-shared", "shareID": share,
            "consumedCapacity": {"memory": "1Gi"}}]}}}
    }))
    .unwrap();
    let cref = ClaimRef {
        namespace: "default".into(),
        name: format!("s{i}"),
        uid,
    };
    (cref, claim)
}

/// The 8-GCU node shared (its GCUs' memory stated, so each is published whole, shareable and
/// in halves and quarters): publishing it, and a prepare on an idle GCU against one on a GCU
/// already shared by 16 claims.
fn sharing(c: &mut Criterion, r: &Path, profile: &Profile) {
    let sharing = Sharing::of(profile).unwrap().0;
    let version = accel_container_runtime::discovery::driver_version(profile);
    let pool = Pool {
        driver: DRIVER,
        node: NODE,
        vendor: "enflame",
        driver_version: version.as_deref(),
    };
    let build = || build(&pool, profile);
    let (table, contents, _) = build();
    assert_eq!(
        (table.len(), contents.counters.len(), contents.devices.len()),
        (8, 8, 64)
    );
    c.bench_function(
        "dra publish 8 shared: discovery + health + 8 counter sets + 64 offers + slice JSON",
        |b| b.iter(build),
    );

    let claims = Claims::open(
        DRIVER.into(),
        NODE.into(),
        r.join("cdi"),
        r.join("state"),
        "/usr/lib64".into(),
        HostRoot::default(),
        "bench-boot".into(),
    )
    .unwrap();
    let (cref, claim) = share_claim(0);
    let once = || {
        let t = std::time::Instant::now();
        let d = claims
            .prepare(profile, sharing.as_ref(), &table, &cref, &claim)
            .unwrap();
        assert_eq!(d.len(), 1);
        claims.unprepare(&cref.uid).unwrap();
        t.elapsed()
    };
    c.bench_function("dra prepare a share of an idle GCU (and unprepare)", |b| {
        b.iter(once)
    });
    let idle: Vec<Duration> = (0..200).map(|_| once()).collect();
    for i in 1..=16 {
        let (r, cl) = share_claim(i);
        claims
            .prepare(profile, sharing.as_ref(), &table, &r, &cl)
            .unwrap();
    }
    c.bench_function(
        "dra prepare a share of a GCU shared by 16 claims (and unprepare)",
        |b| b.iter(once),
    );
    let shared: Vec<Duration> = (0..200).map(|_| once()).collect();
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (i, s) = (median(idle), median(shared));
    println!(
        "sharing: prepare of a share, median of 200: idle GCU {i:?}, GCU shared by 16 claims {s:?}: {:.2}x",
        s.as_secs_f64() / i.as_secs_f64()
    );
    for i in 1..=16 {
        claims.unprepare(&share_claim(i).0.uid).unwrap();
    }
}

fn write_kubeconfig(path: &Path, url: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: {url}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: s\n    user: u\ncurrent-context: c\n"
        ),
    )
    .unwrap();
}

/// The real binary (`ACCEL_DRA_BIN`, default the one cargo built) with 64 devices: published,
/// registered by a stand-in kubelet that prepares a claim of 8 over gRPC (timed), then its
/// peak and current RSS.
fn rss_with_64_devices(r: &Path, cfg: &Path) {
    let api = ApiServer::start();
    let v: serde_json::Value = serde_json::to_value(claim_of_8()).unwrap();
    let devices: Vec<(String, String)> = v["status"]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                "gcus".to_string(),
                x["device"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = devices
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    api.put_claim("default", "eight", UID, DRIVER, NODE, &pairs);
    let kubeconfig = r.join("kubeconfig");
    write_kubeconfig(&kubeconfig, &api.url);
    let bin = std::env::var_os("ACCEL_DRA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_accel-dra-driver").into());
    println!("rss: running {}", bin.display());
    let run = r.join("run");
    let mut child = Command::new(&bin)
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", cfg)
        .env("KUBECONFIG", &kubeconfig)
        .env("NODE_NAME", NODE)
        .arg(format!("--registry-dir={}", run.join("registry").display()))
        .arg(format!("--plugins-dir={}", run.join("plugins").display()))
        .arg(format!("--cdi-dir={}", run.join("cdi").display()))
        .arg(format!("--state-dir={}", run.join("state").display()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reg = run.join(format!("registry/{DRIVER}-reg.sock"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let start = std::time::Instant::now();
    while api.slices_of(DRIVER).is_empty() || !reg.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not published or registered in 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let n: usize = api
        .slices_of(DRIVER)
        .iter()
        .map(|s| s["spec"]["devices"].as_array().unwrap().len())
        .sum();
    assert_eq!(n, 64);
    let took = rt.block_on(async {
        let ch = connect(&reg, "localhost").await.unwrap();
        let info = grpc::get_info(&ch).await.unwrap();
        let ch = connect(Path::new(&info.endpoint), "localhost")
            .await
            .unwrap();
        let req = || NodePrepareResourcesRequest {
            claims: vec![Claim {
                namespace: "default".into(),
                name: "eight".into(),
                uid: UID.into(),
            }],
        };
        let t = std::time::Instant::now();
        let got = grpc::prepare(&ch, PREPARE_V1, req()).await.unwrap();
        let took = t.elapsed();
        assert_eq!(got.claims[UID].error, "");
        assert_eq!(got.claims[UID].devices.len(), 8);
        took
    });
    println!("prepare of 8 over gRPC (first, claim read from the stand-in): {took:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
            .unwrap_or_default()
    };
    println!(
        "rss with 64 devices: VmRSS {} kB, VmHWM {} kB, threads {}",
        field("VmRSS:"),
        field("VmHWM:"),
        field("Threads:")
    );
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let st = child.wait().unwrap();
    assert!(st.success(), "SIGTERM: {st}");
}

fn main() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("dra: not root, cannot mknod the simulated devices; skipped");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    host(r, 64);
    let (profile, cfg) = enflame(r, "");
    let shared_root = tempfile::tempdir().unwrap();
    host(shared_root.path(), 8);
    let (shared_profile, _) = enflame(
        shared_root.path(),
        "[profiles.enflame.sharing]\nmemory = \"32Gi\"\n",
    );
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    timings(&mut c, r, &profile);
    sharing(&mut c, shared_root.path(), &shared_profile);
    rss_with_64_devices(r, &cfg);
    c.final_summary();
}
