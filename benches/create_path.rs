//! Criterion benchmarks of the pieces of the create path: argv scan, config + profile load,
//! device discovery, ld.so.cache parse and the spec edit (parse + apply + splice back to bytes) at
//! 10 KB, 1 MB and 10 MB, to show that its cost grows linearly with the size of config.json.
//!
//! `cargo bench --bench create_path` (a few minutes on 2 cores); `cargo test --all-targets`
//! runs each benchmark once as a smoke test. Results and how to read them: benches/BENCHMARKS.md.

use std::ffi::OsString;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use accel_container_runtime::config::{Config, Quick};
use accel_container_runtime::plan::{BindMount, DeviceNode, NodeKind, Plan};
use accel_container_runtime::spec::screen::{screen, Screen};
use accel_container_runtime::{argv, discovery, ldcache, spec};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use serde_json::Value;

fn quick() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .without_plots()
}

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

fn bench_argv(c: &mut Criterion) {
    let containerd = os(&[
        "--root",
        "/run/containerd/runc/k8s.io",
        "--log",
        "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/log.json",
        "--log-format",
        "json",
        "--systemd-cgroup",
        "create",
        "--bundle",
        "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc",
        "--pid-file",
        "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/init.pid",
        "--console-socket",
        "/tmp/pty123/pty.sock",
        "abc",
    ]);
    let state = os(&["--root", "/run/containerd/runc/k8s.io", "state", "abc"]);
    let mut g = c.benchmark_group("argv_scan");
    g.bench_function("containerd_create", |b| {
        b.iter(|| argv::scan(black_box(&containerd)))
    });
    g.bench_function("state", |b| b.iter(|| argv::scan(black_box(&state))));
    g.finish();
}

fn bench_config(c: &mut Criterion) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    let profiles = dir.path().join("profiles.d");
    std::fs::create_dir(&profiles).expect("mkdir");
    // The four profiles that ship as files, installed as an operator would.
    for name in ["ascend", "cambricon", "habana", "mthreads"] {
        std::fs::copy(
            manifest.join(format!("config/profiles/{name}.toml")),
            profiles.join(format!("{name}.toml")),
        )
        .expect("copy profile");
    }
    let shipped = std::fs::read_to_string(manifest.join("config/config.toml")).expect("config");
    let default_dir = "profiles-dir = \"/etc/accel-container-runtime/profiles.d\"";
    assert!(shipped.contains(default_dir), "shipped config.toml changed");
    let with_dir = shipped.replace(default_dir, &format!("profiles-dir = {profiles:?}"));
    let cfg_path = dir.path().join("config.toml");
    std::fs::write(&cfg_path, &with_dir).expect("write config");

    let mut g = c.benchmark_group("config_load");
    g.bench_function("builtin_profiles_only", |b| {
        b.iter(|| Config::parse(black_box(""), None).expect("defaults"))
    });
    g.bench_function("shipped_config_and_4_profile_files", |b| {
        b.iter(|| Config::load(black_box(&cfg_path)).expect("config"))
    });
    g.bench_function("low_level_runtime_only", |b| {
        b.iter(|| accel_container_runtime::config::pass_through_runtime(black_box(&cfg_path)).0)
    });
    g.bench_function("quick_screen", |b| {
        b.iter(|| {
            let q = Quick::read(black_box(&cfg_path)).expect("quick");
            let spec = br#"{"process":{"env":["PATH=/bin","HOSTNAME=x"]}}"#;
            assert_eq!(screen(spec, q.texts()), Screen::Nothing);
            q
        })
    });
    g.finish();
}

/// An NVIDIA driver root with `n` GPUs as the kernel module shows them in procfs. Discovery
/// reads only these files (nodes are stat'ed later, by the plan), so no mknod is needed.
fn nvidia_root(n: usize) -> (tempfile::TempDir, accel_container_runtime::profile::Profile) {
    let root = tempfile::tempdir().expect("tempdir");
    for i in 0..n {
        let bus = format!("0000:{:02x}:00.0", 0x10 + i);
        let d = root.path().join("proc/driver/nvidia/gpus").join(&bus);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("information"),
            format!(
                "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t\t GPU-{i:08x}-1111-2222-3333-444455556666\nVideo BIOS: \t\t 96.00.74.00.01\nBus Type: \t\t PCIe\nDMA Size: \t\t 52 bits\nDMA Mask: \t\t 0xfffffffffffff\nBus Location: \t\t {bus}\nDevice Minor: \t\t {i}\nGPU Excluded:\t\t No\n"
            ),
        )
        .expect("write information");
    }
    let mut p = Config::parse("", None)
        .expect("defaults")
        .profile("nvidia")
        .expect("nvidia profile")
        .clone();
    p.driver_root = root.path().to_path_buf();
    (root, p)
}

fn bench_discovery(c: &mut Criterion) {
    let mut g = c.benchmark_group("discovery_nvidia_procfs");
    for n in [8, 64] {
        let (_root, profile) = nvidia_root(n);
        assert_eq!(discovery::discover(&profile).expect("discover").len(), n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &profile, |b, p| {
            b.iter(|| discovery::discover(black_box(p)).expect("discover"))
        });
    }
    g.finish();
}

fn bench_ldcache(c: &mut Criterion) {
    let mut g = c.benchmark_group("ldcache_parse");
    let host = std::fs::read("/etc/ld.so.cache").expect("/etc/ld.so.cache on a glibc host");
    let n = ldcache::parse(&host).expect("host cache parses").len();
    g.throughput(Throughput::Bytes(host.len() as u64));
    g.bench_function(format!("host_{}_entries_{}_bytes", n, host.len()), |b| {
        b.iter(|| ldcache::parse(black_box(&host)).expect("parse"))
    });
    let names: Vec<(String, String)> = (0..10_000)
        .map(|i| {
            (
                format!("libsynthetic{i}.so.1"),
                format!("/usr/lib/x86_64-linux-gnu/libsynthetic{i}.so.1.2.3"),
            )
        })
        .collect();
    let entries: Vec<(&str, &str, i32)> = names
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_str(), ldcache::native_flags()))
        .collect();
    let synthetic = ldcache::build(&entries);
    g.throughput(Throughput::Bytes(synthetic.len() as u64));
    g.bench_function(
        format!("synthetic_10000_entries_{}_bytes", synthetic.len()),
        |b| b.iter(|| ldcache::parse(black_box(&synthetic)).expect("parse")),
    );
    g.finish();
}

/// A create's loader-cache step (src/loader.rs) on an image whose cache is this host's (a
/// Debian 12 with ~550 entries): read it through the rootfs fd, merge 12 driver libraries,
/// sort as ldconfig, write a temp file and rename it; and the second create of the same
/// bundle, which finds the same bytes and writes nothing.
fn bench_loader_cache(c: &mut Criterion) {
    use accel_container_runtime::{ldcache::Record, loader};
    use criterion::BatchSize;
    let mut g = c.benchmark_group("loader_cache");
    let host = std::fs::read("/etc/ld.so.cache").expect("/etc/ld.so.cache on a glibc host");
    let root = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(root.path().join("etc")).expect("etc");
    let cache = root.path().join("etc/ld.so.cache");
    let vendors = [loader::VendorLibs {
        records: (0..12)
            .map(|i| {
                Record::native(
                    &format!("libnvidia-x{i}.so.1"),
                    &format!("/usr/lib/x86_64-linux-gnu/libnvidia-x{i}.so.1"),
                )
            })
            .collect(),
        ..loader::VendorLibs::default()
    }];
    let image = loader::Image::open(Some(root.path()));
    g.bench_function("merge_12_into_host_cache_and_write", |b| {
        b.iter_batched(
            || std::fs::write(&cache, &host).expect("reset"),
            |()| loader::update_cache(&image, &vendors).expect("written"),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("second_create_unchanged", |b| {
        b.iter(|| loader::update_cache(&image, &vendors).expect("unchanged"))
    });
    g.finish();
}

/// docker's config.json padded to about `size` bytes with what makes real specs big: env
/// entries, bind mounts and annotations (a third each).
pub fn padded_spec(size: usize) -> Vec<u8> {
    let base = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/specs/docker-20.10-run.json"),
    )
    .expect("fixture");
    let mut v: Value = serde_json::from_slice(&base).expect("fixture parses");
    // Sizes are summed per entry (serializing the whole document each round would make
    // building the 10 MB one quadratic); the total is within a few percent of the real size.
    let mut len = base.len();
    v.as_object_mut()
        .expect("object")
        .entry("annotations")
        .or_insert_with(|| serde_json::json!({}));
    let mut i = 0usize;
    while len < size {
        let env = format!("PADDING_VARIABLE_{i}=value-{i}-abcdefghijklmnopqrstuvwxyz");
        let mount = serde_json::json!({
            "destination": format!("/data/volume-{i}"),
            "type": "bind",
            "source": format!("/var/lib/docker/volumes/v{i}/_data"),
            "options": ["rbind", "rprivate"]
        });
        let (key, value) = (format!("io.example/key-{i}"), format!("value {i}"));
        len += env.len() + 3 + mount.to_string().len() + 1 + key.len() + value.len() + 6;
        v["process"]["env"]
            .as_array_mut()
            .expect("env")
            .push(env.into());
        v["mounts"].as_array_mut().expect("mounts").push(mount);
        v["annotations"]
            .as_object_mut()
            .expect("annotations")
            .insert(key, value.into());
        i += 1;
    }
    serde_json::to_vec(&v).expect("serialize")
}

/// What `NVIDIA_VISIBLE_DEVICES=all` on 8 GPUs with default capabilities adds.
pub fn plan_8_gpus() -> Plan {
    let node = |path: String, minor| DeviceNode {
        path: path.clone().into(),
        host_path: path.into(),
        kind: NodeKind::Char,
        major: 195,
        minor,
        file_mode: 0o666,
        uid: 0,
        gid: 0,
    };
    let mut nodes: Vec<DeviceNode> = (0..8).map(|i| node(format!("/dev/nvidia{i}"), i)).collect();
    nodes.push(node("/dev/nvidiactl".into(), 255));
    nodes.push(node("/dev/nvidia-uvm".into(), 0));
    let mounts = [
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "libnvidia-ptxjitcompiler.so.1",
        "libnvidia-nvvm.so.4",
        "nvidia-smi",
    ]
    .iter()
    .map(|n| BindMount {
        source: format!("/usr/lib/x86_64-linux-gnu/{n}").into(),
        destination: format!("/usr/lib/x86_64-linux-gnu/{n}").into(),
    })
    .collect();
    Plan {
        nodes,
        mounts,
        additional_gids: vec![],
    }
}

fn edit(data: &[u8], plan: &Plan) -> Vec<u8> {
    let (mut doc, _) = spec::parse(data).expect("spec parses");
    spec::apply(&mut doc, plan).expect("apply");
    spec::to_bytes(&doc)
}

fn bench_spec_edit(c: &mut Criterion) {
    let plan = plan_8_gpus();
    let mut g = c.benchmark_group("spec_edit");
    for (label, size) in [("10KB", 10_000), ("1MB", 1_000_000), ("10MB", 10_000_000)] {
        let data = padded_spec(size);
        g.throughput(Throughput::Bytes(data.len() as u64));
        if size >= 1_000_000 {
            g.sample_size(10);
        }
        g.bench_with_input(
            BenchmarkId::new("parse_apply_serialize", label),
            &data,
            |b, d| b.iter(|| edit(black_box(d), &plan)),
        );
    }
    g.finish();
}

/// The screen of a spec that asks for nothing (its last step is serde_json's `IgnoredAny`
/// check), against that check alone, on docker's spec and a padded 1 MB one.
fn bench_json_check(c: &mut Criterion) {
    let mut g = c.benchmark_group("json_check");
    for (label, size) in [("9KB", 0), ("1MB", 1_000_000)] {
        let data = padded_spec(size);
        let text = std::str::from_utf8(&data).expect("UTF-8");
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_with_input(BenchmarkId::new("screen", label), text, |b, t| {
            b.iter(|| screen(black_box(t.as_bytes()), [""]))
        });
        g.bench_with_input(
            BenchmarkId::new("serde_ignored_any", label),
            text,
            |b, t| b.iter(|| serde_json::from_str::<serde::de::IgnoredAny>(black_box(t)).unwrap()),
        );
    }
    g.finish();
}

criterion_group! {
    name = pieces;
    config = quick();
    targets = bench_argv, bench_config, bench_discovery, bench_ldcache, bench_loader_cache, bench_json_check, bench_spec_edit
}
/// `criterion_main!`, plus one thing: CI runs `cargo test --all-targets -- --test-threads=2`,
/// which hands libtest's `--test-threads` to every target, and criterion's argument parser
/// refuses it. Such a run is re-executed without it (criterion's test mode then runs each
/// benchmark once, as `cargo test --benches` does).
fn main() {
    use std::os::unix::process::CommandExt;
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut kept: Vec<OsString> = Vec::new();
    let mut dropped = false;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--test-threads") => {
                it.next();
                dropped = true;
            }
            Some(s) if s.starts_with("--test-threads=") => dropped = true,
            _ => kept.push(a.clone()),
        }
    }
    if dropped {
        let err = std::process::Command::new("/proc/self/exe")
            .arg0(&args[0])
            .args(kept)
            .exec();
        panic!("re-exec without --test-threads: {err}");
    }
    pieces();
    Criterion::default().configure_from_args().final_summary();
}
