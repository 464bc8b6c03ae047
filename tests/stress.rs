//! Concurrency and soak through the shim and real runc (issue 5, "Crash safety and
//! concurrency"): 64 parallel creates on 64 bundles asking for different device subsets, and a
//! long create/start/delete soak that checks for leaked mounts, fds, processes, cgroups, temp
//! files and shim memory. Needs root, runc, busybox-static, gcc; fails (never skips) without.
//!
//! `ACCEL_SOAK_CYCLES` sets the soak's length (default [`DEFAULT_SOAK_CYCLES`]; the issue's
//! 2,000 is run by hand, see benches/CONFORMANCE.md). Run with `--nocapture` to see timings.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// Both tests count host-wide and process-wide state (fds, mounts, cgroups): never run them
/// at the same time, whatever `--test-threads` says.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// 8 GPUs whose minors are not in bus order, so index, minor and UUID all differ.
const GPUS: &[(&str, u32)] = &[
    ("0000:1a:00.0", 5),
    ("0000:1b:00.0", 0),
    ("0000:3d:00.0", 7),
    ("0000:3e:00.0", 2),
    ("0000:88:00.0", 6),
    ("0000:89:00.0", 1),
    ("0000:b1:00.0", 4),
    ("0000:b2:00.0", 3),
];
const GCUS: usize = 4;
const CONTAINERS: usize = 64;

/// What container `k` asks for and must see.
#[derive(Debug, Clone)]
struct Want {
    env: Vec<String>,
    /// GPU indices (bus order).
    gpus: BTreeSet<usize>,
    /// nvidiactl and nvidia-uvm.
    nvidia_control: bool,
    gcus: BTreeSet<usize>,
}

fn bits(mask: usize, n: usize) -> BTreeSet<usize> {
    (0..n).filter(|i| mask & (1 << i) != 0).collect()
}

/// A different request per `k`: nothing at all, NVIDIA `none`, `all`, subsets by index, by
/// UUID and mixed (in scrambled order), Enflame subsets with and without GPUs.
fn want(k: usize, sim: &SimRoot) -> Want {
    let mut w = Want {
        env: Vec::new(),
        gpus: BTreeSet::new(),
        nvidia_control: false,
        gcus: BTreeSet::new(),
    };
    match k % 16 {
        15 => return w,
        14 => match k / 16 {
            // `void` is no request: config.json stays byte for byte.
            0 => w.env.push("NVIDIA_VISIBLE_DEVICES=void".into()),
            n => {
                w.env.push("NVIDIA_VISIBLE_DEVICES=none".into());
                w.nvidia_control = true;
                if n > 1 {
                    w.env.push(format!("ENFLAME_VISIBLE_DEVICES={}", n - 1));
                    w.gcus.insert(n - 1);
                }
            }
        },
        13 => {
            w.env.push("NVIDIA_VISIBLE_DEVICES=all".into());
            w.gpus = (0..GPUS.len()).collect();
            w.nvidia_control = true;
        }
        12 => {}
        _ => {
            // A nonzero 8-bit mask that differs for every k in 0..64.
            let mask = (k * 29 + 7) % 255 + 1;
            w.gpus = bits(mask, GPUS.len());
            w.nvidia_control = true;
            let mut items: Vec<String> = w
                .gpus
                .iter()
                .enumerate()
                .map(|(pos, &i)| match (k % 3, pos % 2) {
                    (0, _) | (2, 0) => i.to_string(),
                    _ => sim.gpus()[i].uuid.clone(),
                })
                .collect();
            if k % 2 == 1 {
                items.reverse();
            }
            w.env
                .push(format!("NVIDIA_VISIBLE_DEVICES={}", items.join(",")));
        }
    }
    if k % 4 == 1 || k % 16 == 12 {
        let mask = (k / 4) % 15 + 1;
        w.gcus = bits(mask, GCUS);
        let items: Vec<String> = w.gcus.iter().map(|i| i.to_string()).collect();
        w.env
            .push(format!("ENFLAME_VISIBLE_DEVICES={}", items.join(",")));
    }
    w
}

impl Want {
    /// Accelerator nodes expected in the container's `/dev`.
    fn dev(&self, sim: &SimRoot) -> BTreeSet<String> {
        let mut s: BTreeSet<String> = self
            .gpus
            .iter()
            .map(|&i| format!("nvidia{}", sim.gpus()[i].minor))
            .collect();
        if self.nvidia_control {
            s.extend(["nvidiactl".to_string(), "nvidia-uvm".to_string()]);
        }
        s.extend(self.gcus.iter().map(|i| format!("gcu{i}")));
        if !self.gcus.is_empty() {
            s.insert("gcuctl".into());
        }
        s
    }
}

fn probe(sim: &SimRoot) -> Probe {
    let mut p = Probe::new().ls("/dev").open("/dev/nvidiactl");
    for g in sim.gpus() {
        p = p.open(&g.node());
    }
    for i in 0..GCUS {
        p = p.open(&format!("/dev/gcu{i}"));
    }
    p.open("/dev/gcuctl")
}

/// Runs `f(k)` for every k in 0..n on its own thread, all at once; results in k order.
fn parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|k| s.spawn(move || f(k))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    })
}

#[test]
fn parallel_creates_64_bundles_each_get_exactly_their_devices() {
    require_root();
    let _g = serial();
    let t0 = Instant::now();
    let sim = SimRoot::builder()
        .nvidia(GPUS)
        .enflame(GCUS)
        .library(LIB_DIR, "libcuda.so.550.54.14", "libcuda.so.1")
        .library(LIB_DIR, "libefml.so.1.2.3", "libefml.so.1")
        .build();
    let image = tempfile::Builder::new()
        .prefix("accel-e2e-rootfs.")
        .tempdir()
        .unwrap();
    // One read-only rootfs for all 64: runc bind-mounts it privately per container, and the
    // bundle dirs then hold nothing but config.json, so a stray temp file stands out.
    let rootfs = busybox_rootfs(&image.path().join("rootfs"));
    let script = probe(&sim).script();
    let wants: Vec<Want> = (0..CONTAINERS).map(|k| want(k, &sim)).collect();
    // Every request differs, except the four that ask for nothing at all.
    let distinct: BTreeSet<String> = wants.iter().map(|w| w.env.join(" ")).collect();
    assert_eq!(distinct.len(), CONTAINERS - 3, "requests must differ");
    let bundles: Vec<Bundle> = wants
        .iter()
        .map(|w| {
            let mut b = Bundle::on_rootfs(&rootfs);
            for kv in &w.env {
                b.env(kv);
            }
            b.sh(&script);
            b
        })
        .collect();
    let before: Vec<Vec<u8>> = bundles.iter().map(Bundle::config_bytes).collect();
    let runc = Runc::new(&sim);
    let ids: Vec<String> = (0..CONTAINERS)
        .map(|k| runc.id(&format!("par{k}")))
        .collect();
    let setup = t0.elapsed();

    let t1 = Instant::now();
    let created = parallel(CONTAINERS, |k| runc.create(&bundles[k], &ids[k]));
    let create_time = t1.elapsed();
    let failed: Vec<String> = created
        .iter()
        .enumerate()
        .filter(|(_, o)| o.code != 0)
        .map(|(k, o)| format!("#{k} {:?}: exit {} {}", wants[k].env, o.code, o.stderr))
        .collect();
    assert!(
        failed.is_empty(),
        "parallel creates failed:\n{}",
        failed.join("\n")
    );

    for (k, b) in bundles.iter().enumerate() {
        assert_eq!(
            b.dir_entries(),
            names(&["config.json"]),
            "#{k}: the bundle dir holds something besides config.json (a temp file?)"
        );
        let spec: Value = serde_json::from_slice(&b.config_bytes())
            .unwrap_or_else(|e| panic!("#{k}: config.json does not parse after create: {e}"));
        if wants[k].dev(&sim).is_empty() {
            assert_eq!(
                b.config_bytes(),
                before[k],
                "#{k}: a container with no request must keep config.json byte for byte"
            );
        }
        let in_spec: BTreeSet<String> = spec["linux"]["devices"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d["path"].as_str())
                    .map(|p| p.trim_start_matches("/dev/").to_string())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            in_spec,
            wants[k].dev(&sim),
            "#{k} {:?}: linux.devices",
            wants[k].env
        );
    }

    let t2 = Instant::now();
    let started = parallel(CONTAINERS, |k| runc.start(&ids[k]));
    for (k, o) in started.iter().enumerate() {
        assert_eq!(o.code, 0, "#{k}: start failed: {o:#?}");
    }
    for id in &ids {
        runc.wait_stopped(id, Duration::from_secs(60));
    }
    let run_time = t2.elapsed();

    for (k, w) in wants.iter().enumerate() {
        let r = Report::parse(&runc.created_stdout(&ids[k]));
        let ctx = format!("#{k} {:?}:\n{}", w.env, r.raw);
        assert_eq!(extra_dev(&r.ls("/dev")), w.dev(&sim), "{ctx}");
        for (i, g) in sim.gpus().iter().enumerate() {
            let expect = if w.gpus.contains(&i) {
                Open::Enxio
            } else {
                Open::Absent
            };
            assert_eq!(r.open(&g.node()), expect, "{} {ctx}", g.node());
        }
        for i in 0..GCUS {
            let expect = if w.gcus.contains(&i) {
                Open::Enxio
            } else {
                Open::Absent
            };
            assert_eq!(r.open(&format!("/dev/gcu{i}")), expect, "gcu{i} {ctx}");
        }
        let ctl = if w.nvidia_control {
            Open::Enxio
        } else {
            Open::Absent
        };
        assert_eq!(r.open("/dev/nvidiactl"), ctl, "{ctx}");
        let gctl = if w.gcus.is_empty() {
            Open::Absent
        } else {
            Open::Enxio
        };
        assert_eq!(r.open("/dev/gcuctl"), gctl, "{ctx}");
    }

    let deleted = parallel(CONTAINERS, |k| runc.delete(&ids[k]));
    for (k, o) in deleted.iter().enumerate() {
        assert_eq!(o.code, 0, "#{k}: delete failed: {o:#?}");
        assert!(!runc.exists(&ids[k]), "#{k} still exists after delete");
    }
    for (k, b) in bundles.iter().enumerate() {
        assert_eq!(
            b.dir_entries(),
            names(&["config.json"]),
            "#{k} after delete"
        );
    }
    eprintln!(
        "parallel: {CONTAINERS} containers; setup {setup:.1?}, {CONTAINERS} parallel creates \
         {create_time:.1?}, parallel start + run to exit {run_time:.1?}, total {:.1?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Soak
// ---------------------------------------------------------------------------------------------

/// Cycles in a plain `cargo test`; `ACCEL_SOAK_CYCLES` overrides.
const DEFAULT_SOAK_CYCLES: usize = 300;
/// Every this many cycles the container's output is checked from inside.
const CHECK_EVERY: usize = 50;

/// Two small static programs from one source, returned as (launcher, wrapper).
///
/// The wrapper is the shim's low-level runtime: it records the peak RSS of its process so far
/// (the shim, which execs it: `ru_maxrss` of RUSAGE_SELF survives exec and covers the old
/// image) with the command word, then execs runc with the same argv.
///
/// The launcher starts the shim from a fork of itself. Started directly from this test, the
/// shim would be a `vfork` child of the test process, and exec folds the high-water mark of
/// the mm it replaces (the test's, tens of MiB) into `ru_maxrss`.
fn rss_programs(dir: &Path, log: &Path, runc: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let src = format!(
        r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {{
    struct rusage ru;
    if (strstr(argv[0], "rss-launch")) {{
        int st;
        pid_t pid = fork();
        if (pid < 0) return 126;
        if (pid == 0) {{
            execv(argv[1], argv + 1);
            _exit(127);
        }}
        while (waitpid(pid, &st, 0) < 0)
            if (errno != EINTR) return 126;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }}
    const char *cmd = "?";
    const char *words[] = {{"create", "start", "delete", "run", "state", "kill", 0}};
    for (int i = 1; i < argc && cmd[0] == '?'; i++)
        for (int w = 0; words[w]; w++)
            if (strcmp(argv[i], words[w]) == 0) cmd = words[w];
    if (getrusage(RUSAGE_SELF, &ru) == 0) {{
        int fd = open("{log}", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {{
            char line[64];
            int n = snprintf(line, sizeof line, "%s %ld\n", cmd, ru.ru_maxrss);
            if (write(fd, line, n) != n) return 125;
            close(fd);
        }}
    }}
    execv("{runc}", argv);
    perror("execv runc");
    return 127;
}}
"#,
        log = log.display(),
        runc = runc.display(),
    );
    let c = dir.join("rss-wrapper.c");
    std::fs::write(&c, src).unwrap();
    let bin = dir.join("rss-wrapper");
    let out = output(
        std::process::Command::new("gcc")
            .args(["-static", "-O2", "-o"])
            .arg(&bin)
            .arg(&c),
    );
    assert_eq!(
        out.code, 0,
        "gcc -static rss-wrapper (needs libc6-dev): {out:#?}"
    );
    let launch = dir.join("rss-launch");
    std::fs::copy(&bin, &launch).unwrap();
    (launch, bin)
}

fn runc_path() -> std::path::PathBuf {
    let out = output(std::process::Command::new("sh").args(["-c", "command -v runc"]));
    assert_eq!(out.code, 0, "runc not in PATH");
    out.stdout.trim().into()
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Deletes the container if a cycle panics half-way, so a failure leaks nothing itself.
struct Cleanup<'a> {
    runc: &'a Runc,
    id: Option<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.runc.runc(&["delete", "-f", &id]);
        }
    }
}

/// On drop (also when a check panics): deletes every container runc still knows in this
/// state dir and removes the test's cgroup parent, so a failing soak leaves the host clean.
struct SoakTeardown<'a> {
    runc: &'a Runc,
    cg_parent: String,
}

impl Drop for SoakTeardown<'_> {
    fn drop(&mut self) {
        let list = self.runc.runc(&["list", "-q"]);
        for id in list.stdout.lines().filter(|l| !l.is_empty()) {
            let _ = self.runc.runc(&["delete", "-f", id]);
        }
        remove_cgroup_parent(&self.cg_parent);
    }
}

#[test]
fn soak_create_start_delete_leaks_nothing_and_rss_stays_flat() {
    require_root();
    let _g = serial();
    let cycles: usize = std::env::var("ACCEL_SOAK_CYCLES")
        .ok()
        .map(|v| v.parse().expect("ACCEL_SOAK_CYCLES must be a number"))
        .unwrap_or(DEFAULT_SOAK_CYCLES);
    assert!(cycles >= 2, "ACCEL_SOAK_CYCLES must be at least 2");
    let t0 = Instant::now();
    let sim = SimRoot::standard();
    let image = tempfile::Builder::new()
        .prefix("accel-e2e-rootfs.")
        .tempdir()
        .unwrap();
    let rootfs = busybox_rootfs(&image.path().join("rootfs"));
    let cg_parent = unique("accel-soak");
    // Half the cycles ask for devices (config.json rewritten each time: restored first),
    // half ask for nothing (config.json must never be rewritten).
    let dev_probe = Probe::new()
        .ls("/dev")
        .open("/dev/nvidia1")
        .open("/dev/gcu2")
        .ls("/usr/lib64");
    let mut with_dev = Bundle::on_rootfs(&rootfs);
    with_dev
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env("ENFLAME_VISIBLE_DEVICES=0,2")
        .sh(&dev_probe.script());
    let mut plain = Bundle::on_rootfs(&rootfs);
    plain.sh(&Probe::new().ls("/dev").script());
    let dev_original = with_dev.config_bytes();
    let expect_dev = names(&[
        "nvidia1",
        "nvidiactl",
        "nvidia-uvm",
        "gcu0",
        "gcu2",
        "gcuctl",
    ]);

    let rss_log = image.path().join("rss.log");
    let (launch, wrapper) = rss_programs(image.path(), &rss_log, &runc_path());
    let runc = Runc::with_low_level_runtime(&sim, &wrapper);
    let _teardown = SoakTeardown {
        runc: &runc,
        cg_parent: cg_parent.clone(),
    };
    let our_paths: Vec<String> = [sim.path(), image.path(), with_dev.path(), plain.path()]
        .iter()
        .map(|p| p.display().to_string())
        .chain([runc.scratch().display().to_string(), cg_parent.clone()])
        .collect();
    let ours = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| our_paths.iter().any(|p| l.contains(p.as_str())))
            .cloned()
            .collect()
    };
    let mounts_before = mountinfo();
    let fds_before = open_fds();
    let scratch_before = dir_names(runc.scratch());
    assert!(
        ours(&mounts_before).is_empty(),
        "{:?}",
        ours(&mounts_before)
    );
    assert!(cgroup_children(&cg_parent).is_empty());

    let t1 = Instant::now();
    for n in 0..cycles {
        let devices = n % 2 == 0;
        let b = if devices { &with_dev } else { &plain };
        if devices {
            std::fs::write(b.config_path(), &dev_original).unwrap();
        }
        let id = unique("soak");
        b_cgroup(b, &cg_parent, &id);
        let original = b.config_bytes();
        let mut guard = Cleanup {
            runc: &runc,
            id: Some(id.clone()),
        };
        let out = runc.create_via(&launch, b, &id);
        assert_eq!(out.code, 0, "cycle {n}: create: {out:#?}");
        if devices {
            let spec = b.read_spec();
            let count = spec["linux"]["devices"].as_array().map_or(0, Vec::len);
            assert_eq!(count, expect_dev.len(), "cycle {n}: linux.devices");
        } else {
            assert_eq!(
                b.config_bytes(),
                original,
                "cycle {n}: no request, rewritten"
            );
        }
        let out = runc.shim_via(&launch, &["start", &id]);
        assert_eq!(out.code, 0, "cycle {n}: start: {out:#?}");
        if n % CHECK_EVERY < 2 || n + 2 >= cycles {
            runc.wait_stopped(&id, Duration::from_secs(30));
            let r = Report::parse(&runc.created_stdout(&id));
            let want = if devices {
                expect_dev.clone()
            } else {
                BTreeSet::new()
            };
            assert_eq!(extra_dev(&r.ls("/dev")), want, "cycle {n}:\n{}", r.raw);
            if devices {
                assert_eq!(r.open("/dev/nvidia1"), Open::Enxio, "cycle {n}:\n{}", r.raw);
                assert_eq!(r.open("/dev/gcu2"), Open::Enxio, "cycle {n}:\n{}", r.raw);
                assert!(r.ls("/usr/lib64").contains("libcuda.so.1"), "{}", r.raw);
            }
        }
        let out = runc.shim_via(&launch, &["delete", "-f", &id]);
        assert_eq!(out.code, 0, "cycle {n}: delete: {out:#?}");
        guard.id = None;
        runc.forget_files(&id);
        assert_eq!(
            b.dir_entries(),
            names(&["config.json"]),
            "cycle {n}: bundle dir"
        );
    }
    let soak_time = t1.elapsed();

    // Leaks, checked after the last cycle.
    let state = dir_names(&runc.state_dir());
    assert!(state.is_empty(), "runc state left behind: {state:?}");
    let cg_left = cgroup_children(&cg_parent);
    remove_cgroup_parent(&cg_parent);
    assert!(cg_left.is_empty(), "cgroups left behind: {cg_left:?}");
    let mounts_after = mountinfo();
    assert!(
        ours(&mounts_after).is_empty(),
        "mounts left behind: {:?}",
        ours(&mounts_after)
    );
    let fds_after = open_fds();
    assert_eq!(
        fds_after, fds_before,
        "fds of the test process before/after"
    );
    let lingering: Vec<u32> = [SHIM.to_string(), runc.state_dir().display().to_string()]
        .iter()
        .flat_map(|needle| pids_with_cmdline(needle))
        .collect();
    assert!(
        lingering.is_empty(),
        "shim/runc processes still alive: {lingering:?}"
    );
    let scratch_after = dir_names(runc.scratch());
    // shim.log, and the host-dev-dir the config points here: its /dev/char links stay by
    // design (src/devchar.rs), one per injected node, however many cycles ran.
    let new: Vec<&String> = scratch_after
        .difference(&scratch_before)
        .filter(|n| *n != "shim.log" && *n != "dev")
        .collect();
    assert!(new.is_empty(), "files left in the scratch dir: {new:?}");
    let dev = runc.scratch().join("dev");
    if dev.exists() {
        assert_eq!(
            dir_names(&dev).into_iter().collect::<Vec<_>>(),
            ["char"],
            "the test's host-dev-dir holds more than /dev/char links"
        );
        let links = dir_names(&dev.join("char"));
        assert!(
            !links.is_empty() && links.len() <= 16,
            "one link per injected node, not one per cycle: {links:?}"
        );
    }
    let sim_tmp: Vec<String> = dir_names(sim.path())
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(
        sim_tmp.is_empty(),
        "temp files in the driver root: {sim_tmp:?}"
    );

    // Shim peak RSS per create, first vs last window.
    let log = std::fs::read_to_string(&rss_log).unwrap();
    let creates: Vec<u64> = log
        .lines()
        .filter_map(|l| l.strip_prefix("create "))
        .map(|v| v.parse().expect("rss line"))
        .collect();
    let others: Vec<u64> = log
        .lines()
        .filter(|l| !l.starts_with("create "))
        .filter_map(|l| l.split_once(' ')?.1.parse().ok())
        .collect();
    assert_eq!(creates.len(), cycles, "one RSS sample per create:\n{log}");
    assert_eq!(
        others.len(),
        2 * cycles,
        "one RSS sample per start and delete"
    );
    let w = (cycles / 2).min(100);
    let (mut first, mut last) = (creates[..w].to_vec(), creates[cycles - w..].to_vec());
    let (first_max, last_max) = (*first.iter().max().unwrap(), *last.iter().max().unwrap());
    let (first_med, last_med) = (median(&mut first), median(&mut last));
    // Each cycle is a new process, so growth can only come from state that grows on the host
    // (a log read back, a cache): allow page-granularity noise, not a trend.
    assert!(
        last_med <= first_med + 256 && last_max <= first_max + 1024,
        "shim peak RSS grew: first {w} creates median {first_med} KiB max {first_max} KiB, \
         last {w} median {last_med} KiB max {last_max} KiB"
    );
    eprintln!(
        "soak: {cycles} create/start/delete cycles in {soak_time:.1?} ({:.0} ms/cycle), total \
         {:.1?}; shim peak RSS per create (KiB): first {w} median {first_med} max {first_max}, \
         last {w} median {last_med} max {last_max}; start/delete pass-through max {} KiB; \
         mountinfo lines {} -> {}, test fds {fds_before} -> {fds_after}, cgroups left 0, \
         processes left 0",
        soak_time.as_secs_f64() * 1000.0 / cycles as f64,
        t0.elapsed(),
        others.iter().max().unwrap(),
        mounts_before.len(),
        mounts_after.len(),
    );
}

/// Puts the container's cgroup under `parent` so what runc leaves there can be counted.
fn b_cgroup(b: &Bundle, parent: &str, id: &str) {
    let mut spec = b.read_spec();
    spec["linux"]["cgroupsPath"] = Value::from(format!("/{parent}/{id}"));
    std::fs::write(b.config_path(), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}
