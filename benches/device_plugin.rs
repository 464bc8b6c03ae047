//! accel-device-plugin: GetPreferredAllocation's choice at 8, 16 and 64 devices (exact search
//! up to 16, greedy beyond), Allocate's answer, both as pure functions and as the gRPC round
//! trip kubelet makes over the unix socket (through the shipped server, and without its
//! `:authority` rewrite for comparison); then the resident memory of the real plugin binary
//! serving 64 simulated devices to a stand-in kubelet. First, the health engine's CPU per
//! device per minute at 8 and 64 devices (issue 41).
//!
//! `cargo bench --features plugin --bench device_plugin`. Results: benches/BENCHMARKS.md.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use accel_container_runtime::config::Config;
use accel_container_runtime::kubelet::inventory::NodeDevice;
use accel_container_runtime::kubelet::proto::deviceplugin::device_plugin_server::DevicePluginServer;
use accel_container_runtime::kubelet::proto::deviceplugin::*;
use accel_container_runtime::kubelet::socket;
use accel_container_runtime::plugin::allocate::{allocate, Strategy};
use accel_container_runtime::plugin::devices::PluginDevice;
use accel_container_runtime::plugin::preferred::{choose, Place};
use accel_container_runtime::plugin::service::{Plugin, Served};
use accel_container_runtime::profile::{Profile, ReplicaPolicy};
use accel_container_runtime::topology::Node;
use criterion::{BenchmarkId, Criterion};

/// The stand-in kubelet's calls, as the tests make them.
#[path = "../tests/common/grpc.rs"]
#[allow(dead_code, unused_imports)]
mod grpc;

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
            dev: NodeDevice {
                index: i as u32,
                name: i.to_string(),
                // Healthy by the health engine's nodes signal wherever the bench runs: a
                // character device of any major (the plugin skips unhealthy devices).
                nodes: vec![Node {
                    path: PathBuf::from(format!("/dev/gcu{i}")),
                    major: None,
                    minor: Some(i as u64),
                }],
                host_nodes: vec![PathBuf::from("/dev/null")],
                place,
                ..NodeDevice::numbered(i as u32)
            },
        })
        .collect()
}

/// The built-in Enflame profile, its driver taken as loaded (no version file to find on a
/// machine without it), so that every device of [`table`] is healthy.
fn enflame() -> Profile {
    let mut p = Config::load(Path::new("/nonexistent/accel-bench-config.toml"))
        .unwrap()
        .profiles
        .into_iter()
        .find(|p| p.name == "enflame")
        .unwrap();
    p.version_file = None;
    p
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
    // No topology at all (every pair "anything"): nothing prunes the exact search.
    let flat = vec![Place::default(); 16];
    g.bench_function("16dev-flat/8", |b| {
        b.iter(|| choose(black_box(&flat), &[], 8))
    });
    g.finish();
    let profile = enflame();
    let t = table(64);
    let ids: Vec<String> = (0..8).map(|i| format!("GCU-{i}")).collect();
    c.bench_function("allocate/8-of-64 all strategies", |b| {
        b.iter(|| allocate(&profile, &t, &Strategy::ALL, black_box(&ids)))
    });
}

/// GetPreferredAllocation over replicas as kubelet asks it: 64 devices x 8 replicas, all 512
/// IDs offered (in Go's map order, here a fixed shuffle) or a scattered half of them, through
/// `Plugin::preferred` (ID parsing and grouping included), under each policy.
fn replicas(c: &mut Criterion) {
    let mut g = c.benchmark_group("preferred-replicas");
    let mut all: Vec<String> = (0..64)
        .flat_map(|i| (0..8).map(move |k| format!("GCU-{i}::{k}")))
        .collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..all.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        all.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let half: Vec<String> = all[..256].to_vec();
    let ask = |avail: &[String], size: i32| PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_ids: avail.to_vec(),
            must_include_device_ids: vec![],
            allocation_size: size,
        }],
    };
    for policy in [
        ReplicaPolicy::Spread,
        ReplicaPolicy::Pack,
        ReplicaPolicy::Strict,
    ] {
        let mut profile = enflame();
        profile.replicas = 8;
        profile.replica_policy = policy;
        let plugin = Plugin::from_table(profile, vec![Strategy::Envvar], table(64));
        let sizes: &[i32] = if policy == ReplicaPolicy::Strict {
            &[1]
        } else {
            &[2, 8, 32]
        };
        for &size in sizes {
            for (offered, avail) in [("512ids", &all), ("256ids", &half)] {
                g.bench_with_input(
                    BenchmarkId::new(format!("{offered}-{}", policy.as_str()), size),
                    &size,
                    |b, &s| b.iter(|| plugin.preferred(black_box(ask(avail, s))).unwrap()),
                );
            }
        }
    }
    g.finish();
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
    // The shipped server (every connection through the :authority rewrite), and beside it
    // the same service on a plain tonic server: the difference is what the rewrite costs.
    let plain_sock = dir.path().join("plain.sock");
    let (_serving, ch, plain) = rt.block_on(async {
        let routes =
            tonic::service::Routes::new(DevicePluginServer::new(Served(Arc::clone(&plugin))));
        let serving = socket::serve(routes, &sock).unwrap();
        let l = tokio::net::UnixListener::bind(&plain_sock).unwrap();
        let svc = DevicePluginServer::new(Served(plugin));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l)),
        );
        (
            serving,
            grpc::connect(&sock, "localhost").await.unwrap(),
            grpc::connect(&plain_sock, "localhost").await.unwrap(),
        )
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
    for (name, ch) in [
        ("grpc/Allocate 8 of 64", &ch),
        ("grpc/Allocate 8 of 64, no :authority rewrite", &plain),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(grpc::allocate(
                    ch,
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
}

/// A stand-in kubelet for the RSS run: serves Registration on `kubelet.sock`; on the
/// plugin's registration it dials the plugin, takes the first ListAndWatch message (its
/// device count goes to `seen`) and makes 100 GetPreferredAllocation and Allocate calls.
fn stand_in_kubelet(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    seen: std::sync::mpsc::Sender<usize>,
) {
    use tokio_stream::StreamExt;
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(dir.join(KUBELET_SOCKET)) })
        .unwrap();
    let dir = dir.to_path_buf();
    let svc = grpc::registration_server(move |r: RegisterRequest| {
        let (dir, seen) = (dir.clone(), seen.clone());
        tokio::spawn(async move {
            let ch = grpc::connect(&dir.join(&r.endpoint), "localhost")
                .await
                .unwrap();
            let mut stream = grpc::list_and_watch(&ch).await.unwrap();
            let first = stream.next().await.unwrap().unwrap();
            let all: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
            for i in 0..100 {
                let chosen = grpc::get_preferred(
                    &ch,
                    PreferredAllocationRequest {
                        container_requests: vec![ContainerPreferredAllocationRequest {
                            available_device_ids: all.clone(),
                            must_include_device_ids: vec![],
                            allocation_size: 1 + i % 8,
                        }],
                    },
                )
                .await
                .unwrap();
                grpc::allocate(
                    &ch,
                    AllocateRequest {
                        container_requests: vec![ContainerAllocateRequest {
                            devices_ids: chosen.container_responses[0].device_ids.clone(),
                        }],
                    },
                )
                .await
                .unwrap();
            }
            let _ = seen.send(first.devices.len());
            // Keep watching, as kubelet does.
            while let Some(Ok(_)) = stream.next().await {}
        });
        Ok(())
    });
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
}

/// The real binary with 64 simulated GCUs (needs root for mknod), registered with a stand-in
/// kubelet that watches it and makes 100 preferred + Allocate calls: peak and current RSS
/// then. `ACCEL_PLUGIN_BIN` names the binary to run (the shipped static build, as
/// BENCHMARKS.md records); the default is the one cargo built for this benchmark.
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    stand_in_kubelet(&rt, &kubelet, seen_tx);
    let bin = std::env::var_os("ACCEL_PLUGIN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_accel-device-plugin").into());
    println!("rss: running {}", bin.display());
    let mut child = std::process::Command::new(&bin)
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", &cfg)
        .arg(format!("--kubelet-dir={}", kubelet.display()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let devices = seen
        .recv_timeout(Duration::from_secs(30))
        .expect("registered, watched and called within 30 s");
    assert_eq!(devices, 64);
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
    let left: Vec<_> = std::fs::read_dir(&kubelet)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != KUBELET_SOCKET)
        .collect();
    assert!(left.is_empty(), "socket left behind: {left:?}");
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes the timespec given.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) },
        0
    );
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Issue 41: what the health engine costs, 8 and 64 devices in a simulated sysfs (each a PCI
/// function with AER counters, config space and two RAS blocks; its node `/dev/null`): one
/// check reading sysfs, one between sysfs reads (nodes only), and from them the CPU per
/// device per minute at each daemon's default intervals. Vendor tools are left out (one
/// process per profile per interval, whatever the device count).
fn health_cost(c: &mut Criterion) {
    use accel_container_runtime::health::{Monitor, Settings, Subject};
    for n in [8usize, 64] {
        let dir = tempfile::tempdir().unwrap();
        let mut profile = enflame();
        profile.driver_root = dir.path().to_path_buf();
        profile.version_file = None;
        let bdfs: Vec<String> = (0..n)
            .map(|i| format!("0000:{:02x}:00.0", 0x10 + i))
            .collect();
        for b in &bdfs {
            let d = dir.path().join("sys/bus/pci/devices").join(b);
            std::fs::create_dir_all(d.join("ras")).unwrap();
            std::fs::write(
                d.join("aer_dev_fatal"),
                "DLP 0\nSDES 0\nTOTAL_ERR_FATAL 0\n",
            )
            .unwrap();
            std::fs::write(
                d.join("aer_dev_nonfatal"),
                "Undefined 0\nTOTAL_ERR_NONFATAL 0\n",
            )
            .unwrap();
            std::fs::write(d.join("config"), [0x1e; 256]).unwrap();
            for block in ["umc", "gfx"] {
                std::fs::write(d.join(format!("ras/{block}_err_count")), "ue: 0\nce: 0\n").unwrap();
            }
        }
        let nodes = [Node {
            path: PathBuf::from("/dev/null"),
            major: Some(1),
            minor: Some(3),
        }];
        let host = [PathBuf::from("/dev/null")];
        let names: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let subjects: Vec<Subject> = (0..n)
            .map(|i| Subject {
                name: &names[i],
                pci_bus_id: Some(&bdfs[i]),
                nodes: &nodes,
                host_nodes: &host,
            })
            .collect();
        let full = Monitor::new(Settings {
            interval: Duration::ZERO,
            hold_down: Settings::DEFAULT_HOLD_DOWN,
        })
        .without_tools();
        let light = Monitor::new(Settings {
            interval: Duration::from_secs(3600),
            hold_down: Settings::DEFAULT_HOLD_DOWN,
        })
        .without_tools();
        assert!(light
            .check(&profile, &subjects)
            .iter()
            .all(|h| h.is_healthy()));
        c.bench_function(&format!("health/{n} devices, sysfs read"), |b| {
            b.iter(|| full.check(&profile, black_box(&subjects)))
        });
        c.bench_function(&format!("health/{n} devices, nodes only"), |b| {
            b.iter(|| light.check(&profile, black_box(&subjects)))
        });
        let cpu = |m: &Monitor| {
            let rounds = 200u32;
            let t = thread_cpu();
            for _ in 0..rounds {
                black_box(m.check(&profile, &subjects));
            }
            (thread_cpu() - t) / rounds
        };
        let (f, l) = (cpu(&full), cpu(&light));
        // Checks a minute and, of them, sysfs reads (every 5 s).
        for (daemon, checks) in [
            ("device plugin", 60u32),
            ("DRA driver", 30),
            ("exporter", 12),
        ] {
            let per_minute = f * 12 + l * (checks - 12);
            println!(
                "health cost, {n} devices, {daemon} defaults ({checks} checks/min, 12 sysfs reads): \
                 {:.1} µs CPU per device per minute",
                per_minute.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
}

fn main() {
    let mut c = quick();
    health_cost(&mut c);
    pure(&mut c);
    replicas(&mut c);
    grpc_round_trip(&mut c);
    rss_with_64_devices();
    c.final_summary();
}
