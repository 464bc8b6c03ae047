//! accel-exporter: a scrape of 8 devices with attribution (4 device-plugin pods, 4 DRA claims),
//! timed two ways: the render alone in this process (the exporter's own time: what a scrape
//! does once the request is parsed) and the real binary's HTTP round trip over loopback; the
//! binary's resident memory after 2 000 scrapes; and a storm of 50 concurrent scrapes, during
//! which the polls must keep their period and memory must not grow.
//!
//! Needs root (mknod of the simulated GCUs, the efsmi stand-in chrooted in their root).
//! `cargo bench --features exporter --bench exporter`. Results: benches/BENCHMARKS.md.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use accel_container_runtime::config::Config;
use accel_container_runtime::exporter::attribution::Holders;
use accel_container_runtime::exporter::collect::State;
use accel_container_runtime::exporter::poll::Poller;
use accel_container_runtime::kubelet::metrics::{encode, Format};
use accel_container_runtime::kubelet::proto::podresources::*;

#[path = "../tests/common/grpc.rs"]
#[allow(dead_code, unused_imports)]
mod grpc;

const DEVICES: u64 = 8;

/// 8 GCUs under `r` (dev nodes, the driver's version file) and an efsmi stand-in with
/// busybox as the root's shell.
fn sim(r: &Path) {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
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
    for i in 0..DEVICES {
        mknod(
            &r.join(format!("dev/gcu{i}")),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, i),
        )
        .unwrap();
    }
    std::fs::create_dir_all(r.join("bin")).unwrap();
    std::fs::create_dir_all(r.join("usr/bin")).unwrap();
    std::fs::copy("/bin/busybox", r.join("bin/sh")).unwrap();
    let rows: String = (0..DEVICES)
        .map(|i| {
            format!(
                "echo '{i}, -, {}, {}, 32768, {}, 210.5'\n",
                10 + i,
                1024 * (i + 1),
                50 + i
            )
        })
        .collect();
    let efsmi = r.join("usr/bin/efsmi");
    std::fs::write(&efsmi, format!("#!/bin/sh\n{rows}")).unwrap();
    std::fs::set_permissions(&efsmi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// 4 device-plugin pods and 4 DRA claims over the 8 GCUs.
fn holders(driver: &str, dra_name: impl Fn(u32) -> String) -> ListPodResourcesResponse {
    let pod = |i: u64| {
        let mut c = ContainerResources {
            name: "main".into(),
            ..Default::default()
        };
        if i < 4 {
            c.devices.push(ContainerDevices {
                resource_name: "enflame.com/gcu".into(),
                device_ids: vec![format!("GCU-{i}")],
                topology: None,
            });
        } else {
            c.dynamic_resources.push(DynamicResource {
                claim_name: format!("claim-{i}"),
                claim_namespace: "ml".into(),
                claim_resources: vec![ClaimResource {
                    driver_name: driver.into(),
                    pool_name: "node".into(),
                    device_name: dra_name(i as u32),
                    ..Default::default()
                }],
            });
        }
        PodResources {
            name: format!("pod-{i}"),
            namespace: "ml".into(),
            containers: vec![c],
        }
    };
    ListPodResourcesResponse {
        pod_resources: (0..DEVICES).map(pod).collect(),
    }
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn get(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

fn status(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn polls(page: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with("accel_exporter_polls_total{profile=\"enflame\"}"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("exporter bench: needs root (mknod, chroot); not run");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    sim(r);
    let mut enflame = Config::builtin()
        .profiles
        .into_iter()
        .find(|p| p.name == "enflame")
        .unwrap();
    enflame.driver_root = r.to_path_buf();
    let driver = accel_container_runtime::kubelet::names::driver_name(&enflame, None).unwrap();
    let table = accel_container_runtime::kubelet::inventory::discover(&enflame).unwrap();
    let answer = holders(&driver, |i| {
        let d = table.iter().find(|d| d.index == i).unwrap();
        accel_container_runtime::kubelet::names::device_name(&enflame, &d.key)
    });

    // 1. The exporter's own time: one poll's snapshot and the holders, rendered.
    let state = Arc::new(State::default());
    let (snap, failed) = Poller::new(enflame.clone(), None)
        .expect("enflame's tables read")
        .poll();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(snap.devices.len() as u64, DEVICES);
    state.polled(snap);
    state.pod_resources(Ok(Holders::from_list(&answer)));
    let registry = accel_container_runtime::exporter::registry(Arc::clone(&state));
    let page = encode(&registry, Format::Text);
    assert!(page.matches("pod=\"pod-").count() as u64 >= DEVICES);
    let mut times = Vec::new();
    for _ in 0..5000 {
        let t = Instant::now();
        std::hint::black_box(encode(&registry, Format::Text));
        times.push(t.elapsed());
    }
    println!(
        "render, 8 devices with attribution ({} bytes): p50 {:?}, p99 {:?}, max {:?}",
        page.len(),
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.99),
        percentile(&mut times, 1.0)
    );

    // 2. The real binary: HTTP scrapes, RSS, a storm.
    let sock = r.join("pod-resources.sock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    grpc::serve_pod_resources(&rt, &sock, answer);
    let cfg = r.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profiles.enflame]\ndriver-root = \"{0}\"\n[profiles.nvidia]\ndriver-root = \"{0}\"\n",
            r.display()
        ),
    )
    .unwrap();
    let addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let bin = std::env::var_os("ACCEL_EXPORTER_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_accel-exporter").into());
    println!("binary: {}", bin.display());
    let mut child = std::process::Command::new(&bin)
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", &cfg)
        .arg(format!("--listen={addr}"))
        .arg(format!("--pod-resources-socket={}", sock.display()))
        .args(["--poll-seconds=0.5", "--pod-resources-seconds=1"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            let _ = write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            );
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if out.contains("pod=\"pod-7\"") && out.contains("accel_memory_used_bytes") {
                break;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "exporter not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut times = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        std::hint::black_box(get(addr));
        times.push(t.elapsed());
    }
    let pid = child.id();
    println!(
        "HTTP scrape over loopback, 8 devices with attribution: p50 {:?}, p99 {:?}; after 2000 scrapes VmRSS {} kB, VmHWM {} kB",
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.99),
        status(pid, "VmRSS:"),
        status(pid, "VmHWM:")
    );
    // Two storms of 3 s each, 50 concurrent scrapes at a time: the polls keep their period
    // through both, and the second leaves memory where the first did.
    let mut rss = vec![status(pid, "VmRSS:")];
    for storm in 1..=2 {
        let polls_before = polls(&get(addr));
        let started = Instant::now();
        let (mut rounds, mut worst) = (0, Duration::ZERO);
        while started.elapsed() < Duration::from_secs(3) {
            let handles: Vec<_> = (0..50)
                .map(|_| {
                    std::thread::spawn(move || {
                        let t = Instant::now();
                        get(addr);
                        t.elapsed()
                    })
                })
                .collect();
            for h in handles {
                worst = worst.max(h.join().unwrap());
            }
            rounds += 1;
        }
        let elapsed = started.elapsed();
        let done = polls(&get(addr)) - polls_before;
        rss.push(status(pid, "VmRSS:"));
        println!(
            "storm {storm}: {rounds} rounds of 50 concurrent scrapes in {elapsed:?}, slowest scrape {worst:?}; {done:.0} polls completed (period 0.5 s: {:.0} due); VmRSS {} kB",
            elapsed.as_secs_f64() / 0.5,
            rss[storm]
        );
    }
    println!(
        "VmRSS before the storms {} kB, after the first {} kB, after the second {} kB",
        rss[0], rss[1], rss[2]
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let _ = child.wait();
}
