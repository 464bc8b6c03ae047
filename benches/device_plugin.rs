//! accel-device-plugin: GetPreferredAllocation's choice at 8, 16 and 64 devices (exact search
//! up to 16, greedy beyond), Allocate's answer, both as pure functions and as the gRPC round
//! trip kubelet makes over the unix socket; then the plugin's resident memory with 64
//! simulated devices (the real binary, run as a DaemonSet would).
//!
//! `cargo bench --features plugin --bench device_plugin`. Results: benches/BENCHMARKS.md.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use accel_container_runtime::config::Config;
use accel_container_runtime::plugin::allocate::{allocate, Strategy};
use accel_container_runtime::plugin::api::*;
use accel_container_runtime::plugin::devices::PluginDevice;
use accel_container_runtime::plugin::grpc;
use accel_container_runtime::plugin::preferred::{choose, Place};
use accel_container_runtime::plugin::server::{Plugin, Served};
use accel_container_runtime::profile::Profile;
use accel_container_runtime::topology::Node;
use criterion::{BenchmarkId, Criterion};

/// `n` devices, 4 per PCIe switch, 2 switches per root port, half on each NUMA node.
fn places(n: usize) -> Vec<Place> {
    (0..n)
        .map(|i| {
            let (sw, port) = (i / 4, i / 8);
            Place {
                numa: Some((i * 2 / n) as u32),
                root: Some(format!("pci0000:{:02x}", (i * 2 / n) * 0x80)),
                bridges: vec![
                    format!("0000:{port:02x}:01.0"),
                    format!("0000:{:02x}:00.0", 0x40 + sw),
                    format!("0000:{:02x}:{:02x}.0", 0x60 + sw, i % 4),
                ],
            }
        })
        .collect()
}

fn table(n: usize) -> Vec<PluginDevice> {
    places(n)
        .into_iter()
        .enumerate()
        .map(|(i, place)| PluginDevice {
            id: format!("GCU-{i}"),
            name: i.to_string(),
            nodes: vec![Node {
                path: PathBuf::from(format!("/dev/gcu{i}")),
                major: Some(240),
                minor: Some(i as u64),
            }],
            host_nodes: vec![PathBuf::from(format!("/dev/gcu{i}"))],
            place,
        })
        .collect()
}

fn enflame() -> Profile {
    Config::load_from(Path::new("/nonexistent/accel-bench-config.toml"))
        .unwrap()
        .profiles
        .into_iter()
        .find(|p| p.name == "enflame")
        .unwrap()
}

fn quick() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .without_plots()
        .configure_from_args()
}

fn pure(c: &mut Criterion) {
    let mut g = c.benchmark_group("preferred");
    for n in [8usize, 16, 64] {
        let p = places(n);
        // kubelet asks for half the node in the worst exact case (C(16,8) = 12870 sets).
        for size in [2, n / 2] {
            g.bench_with_input(BenchmarkId::new(format!("{n}dev"), size), &size, |b, &s| {
                b.iter(|| choose(black_box(&p), &[], s))
            });
        }
    }
    g.finish();
    let profile = enflame();
    let t = table(64);
    let ids: Vec<String> = (0..8).map(|i| format!("GCU-{i}")).collect();
    c.bench_function("allocate/8-of-64 all strategies", |b| {
        b.iter(|| allocate(&profile, &t, &Strategy::ALL, black_box(&ids)))
    });
}

fn grpc_round_trip(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    let plugin = Arc::new(Plugin::from_table(
        enflame(),
        vec![Strategy::VolumeMounts, Strategy::DeviceSpecs],
        table(64),
    ));
    let ch = rt.block_on(async {
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let svc = grpc::DevicePluginServer(Arc::new(Served(plugin)));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l)),
        );
        grpc::connect(&sock, "localhost").await.unwrap()
    });
    let all: Vec<String> = (0..64).map(|i| format!("GCU-{i}")).collect();
    c.bench_function("grpc/GetPreferredAllocation 4 of 64", |b| {
        b.iter(|| {
            rt.block_on(grpc::get_preferred(
                &ch,
                PreferredAllocationRequest {
                    container_requests: vec![ContainerPreferredAllocationRequest {
                        available_device_ids: all.clone(),
                        must_include_device_ids: vec![],
                        allocation_size: 4,
                    }],
                },
            ))
            .unwrap()
        })
    });
    c.bench_function("grpc/Allocate 8 of 64", |b| {
        b.iter(|| {
            rt.block_on(grpc::allocate(
                &ch,
                AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: all[..8].to_vec(),
                    }],
                },
            ))
            .unwrap()
        })
    });
}

/// The real binary with 64 simulated GCUs (needs root for mknod), no kubelet answering:
/// peak and current RSS after it has discovered, served and started retrying.
fn rss_with_64_devices() {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("rss: not root, cannot mknod the simulated devices; skipped");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("dev")).unwrap();
    std::fs::create_dir_all(r.join("sys/module/enflame")).unwrap();
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
    for i in 0..64u64 {
        mknod(
            &r.join(format!("dev/gcu{i}")),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, i),
        )
        .unwrap();
    }
    let kubelet = r.join("device-plugins");
    std::fs::create_dir_all(&kubelet).unwrap();
    let cfg = r.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profiles.enflame]\ndriver-root = \"{}\"\n[profiles.nvidia]\ndriver-root = \"{}\"\n",
            r.display(),
            r.display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_accel-device-plugin"))
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", &cfg)
        .arg(format!("--kubelet-dir={}", kubelet.display()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
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
    assert!(
        std::fs::read_dir(&kubelet).unwrap().next().is_none(),
        "socket left behind"
    );
}

fn main() {
    let mut c = quick();
    pure(&mut c);
    grpc_round_trip(&mut c);
    rss_with_64_devices();
    c.final_summary();
}
