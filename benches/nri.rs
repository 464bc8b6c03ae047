//! A container's create through accel-nri-plugin against the shim's create of the same spec,
//! on the simulated NVIDIA host of tests/common (two GPUs, the driver's libraries and tools):
//!
//! - `nri/create_container`: one CreateContainer round trip from a stand-in runtime in this
//!   process (tests/common/nri.rs: NRI's multiplexing and ttrpc framed by hand) through the
//!   real built plugin over its unix socket: encode, the plugin's decision (config read, device
//!   discovery, the plan), its answer decoded. What containerd waits on per container.
//! - `shim/create_run`: the shim's create path in this process (`create::run`) on a bundle
//!   whose config.json is put back before every run: config, discovery, plan, the image side
//!   (loader cache), the atomic rewrite. No process start.
//! - `shim/process`: the shim binary as an engine starts it (`accel-container-runtime --root
//!   ... create --bundle ...`), its low-level runtime `/bin/true`: the process start, the create
//!   path and the exec; a real runc's own create comes after that on the shim path and after
//!   the adjustment on the NRI path alike.
//!
//! - `nri/check`: `accel-nri-plugin check` (the createRuntime hook) on a device-less spec and
//!   on a device spec with its nodes present: in this process (`check::run`), and the binary
//!   as runc starts it (`process/...`: the process start, the state on stdin).
//!
//! `cargo bench --features plugin --bench nri` as root (mknod); results in
//! benches/BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write as _;
use std::os::unix::net::UnixListener;
use std::time::Duration;

use accel_container_runtime::nri::check;
use common::nri::{container, Conn, Plugin};
use common::{Bundle, Runc, SimRoot};
use criterion::{BatchSize, Criterion};

fn main() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("nri: not root, cannot mknod the simulated devices; skipped");
        return;
    }
    // Arguments first: criterion exits on one it refuses, which must not leave a plugin behind.
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .without_plots();
    let sim = SimRoot::standard();
    // The shim's config names its low-level runtime from this variable (tests/common).
    std::env::set_var("ACCEL_E2E_LOW_LEVEL_RUNTIME", "/bin/true");
    let runc = Runc::new(&sim);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let plugin = Plugin::start(&socket, &runc.config_path(), dir.path());
    let mut rt = Conn::accept(&listener);
    rt.handshake();

    let mut g = c.benchmark_group("nri/create_container");
    g.bench_function("NVIDIA_VISIBLE_DEVICES=1", |b| {
        b.iter(|| {
            let a = rt
                .create(container("gpu", &["NVIDIA_VISIBLE_DEVICES=1"]))
                .unwrap();
            assert_eq!(a.linux.map_or(0, |l| l.devices.len()), 3);
        })
    });
    g.bench_function("no variable", |b| {
        b.iter(|| rt.create(container("plain", &["PATH=/bin"])).unwrap())
    });
    g.finish();

    let mut bundle = Bundle::busybox();
    bundle.env("NVIDIA_VISIBLE_DEVICES=1");
    let original = bundle.config_bytes();
    let config_json = bundle.path().join("config.json");
    let restore = || std::fs::write(&config_json, &original).unwrap();
    std::env::set_var("ACCEL_CONTAINER_RUNTIME_CONFIG", runc.config_path());
    let mut g = c.benchmark_group("shim");
    g.bench_function("create_run/NVIDIA_VISIBLE_DEVICES=1", |b| {
        b.iter_batched(
            restore,
            |()| accel_container_runtime::create::run(bundle.path(), "bench").unwrap(),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("process/NVIDIA_VISIBLE_DEVICES=1", |b| {
        b.iter_batched(
            restore,
            |()| {
                let out = runc.create(&bundle, "bench");
                assert_eq!(out.code, 0, "{}", out.stderr);
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();

    // The check hook, as runc runs it for every container: the OCI state on stdin, the
    // bundle's final config.json (here the shim's edit of it: the nodes present, as the
    // plugin's adjustment leaves them).
    restore();
    accel_container_runtime::create::run(bundle.path(), "bench").unwrap();
    let mut plain = Bundle::busybox();
    plain.env("PATH=/bin");
    let state = |b: &Bundle| {
        format!(
            r#"{{"ociVersion":"1.2.0","id":"bench","status":"creating","pid":1,"bundle":"{}"}}"#,
            b.path().display()
        )
    };
    let config = runc.config_path();
    let mut g = c.benchmark_group("nri/check");
    for (name, b) in [
        ("no variable", &plain),
        ("NVIDIA_VISIBLE_DEVICES=1", &bundle),
    ] {
        let st = state(b);
        g.bench_function(name, |bench| {
            bench.iter(|| check::run(st.as_bytes(), &config).unwrap())
        });
        let bin = common::binary(env!("CARGO_BIN_EXE_accel-nri-plugin"));
        g.bench_function(format!("process/{name}"), |bench| {
            bench.iter(|| {
                let mut child = std::process::Command::new(&bin)
                    .arg("check")
                    .env("ACCEL_CONTAINER_RUNTIME_CONFIG", &config)
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(st.as_bytes())
                    .unwrap();
                assert!(child.wait().unwrap().success());
            })
        });
    }
    g.finish();
    assert_eq!(plugin.terminate().code(), Some(0));
    c.final_summary();
}
