//! accel-dra-driver: publishing 64 devices (discovery, health and the slice built: the
//! driver's own time; and the whole write to a stand-in API server), preparing a claim of 8
//! of them (node checks, the claim's CDI spec generated and written atomically, the record:
//! the driver's own time; and the gRPC round trip kubelet makes, which includes reading the
//! claim from the stand-in); then the resident memory of the real binary with 64 devices,
//! published and one claim prepared.
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
use accel_container_runtime::profile::Profile;
use apiserver::ApiServer;
use criterion::Criterion;
use grpc::{connect, PREPARE_V1};
use k8s_openapi::api::resource::v1::ResourceClaim;

const DRIVER: &str = "gcu.enflame.com";
const NODE: &str = "bench-node";
const UID: &str = "0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e2a";

fn sh(cmd: &mut Command) {
    let st = cmd.status().unwrap();
    assert!(st.success(), "{cmd:?}: {st}");
}

/// A simulated host with 64 GCUs, 4 per PCIe switch, half on each NUMA node, the driver's
/// version file and one driver library in its ld.so.cache.
fn host_64(r: &Path) -> u64 {
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
    for i in 0..64u64 {
        node(&r.join(format!("dev/gcu{i}")), i);
        let root = if i < 32 { "pci0000:00" } else { "pci0000:80" };
        let rel = PathBuf::from(root)
            .join(format!("0000:{:02x}:01.0", i / 8))
            .join(format!("0000:{:02x}:00.0", 0x40 + i / 4))
            .join(format!("0000:{:02x}:{:02x}.0", 0x60 + i / 4, i % 4))
            .join(format!("0000:{:02x}:00.0", 0x80 + i));
        let real = r.join("sys/devices").join(&rel);
        std::fs::create_dir_all(real.join(format!("enflame/gcu{i}"))).unwrap();
        std::fs::write(real.join("numa_node"), format!("{}\n", i / 32)).unwrap();
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

fn enflame(r: &Path) -> (Profile, PathBuf) {
    let cfg = r.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profiles.enflame]\ndriver-root = \"{0}\"\n[profiles.nvidia]\ndriver-root = \"{0}\"\n",
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

fn timings(c: &mut Criterion, r: &Path, profile: &Profile) {
    let version = accel_container_runtime::discovery::driver_version(profile);
    let pool = Pool {
        driver: DRIVER,
        node: NODE,
        vendor: "enflame",
        driver_version: version.as_deref(),
    };
    let build = || {
        let t = table::discover(profile).unwrap();
        let devices: Vec<_> = t
            .iter()
            .map(|d| slices::device(&pool, d, inventory::healthy(profile, &d.dev)))
            .collect();
        let s = slices::slices(&pool, &devices, 1);
        (t, devices, serde_json::to_vec(&s).unwrap())
    };
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
                let (t, mut devices, _) = build();
                // A change at every iteration: device 0 tainted, then not (a write of the
                // whole pool at a new generation, as any change makes).
                turn = !turn;
                devices[0] = slices::device(&pool, &t[0], turn);
                assert!(rt.block_on(publisher.publish(&pool, &devices)).unwrap());
            })
        },
    );
    // Nothing changed: what every poll of a steady node costs (no request).
    let (_, devices, _) = build();
    rt.block_on(publisher.publish(&pool, &devices)).unwrap();
    c.bench_function("dra publish 64: nothing changed (no request)", |b| {
        b.iter(|| {
            let (_, devices, _) = build();
            assert!(!rt.block_on(publisher.publish(&pool, &devices)).unwrap());
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
                let d = claims.prepare(profile, &table, &cref, &claim).unwrap();
                assert_eq!(d.len(), 8);
                claims.unprepare(UID).unwrap();
            })
        },
    );
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
    host_64(r);
    let (profile, cfg) = enflame(r);
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    timings(&mut c, r, &profile);
    rss_with_64_devices(r, &cfg);
    c.final_summary();
}
