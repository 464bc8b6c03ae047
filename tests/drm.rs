//! DRM-class vendors (AMD, Intel, Hygon) end to end on simulated hosts (tests/common/drm.rs):
//! real runc with the shim, what the container sees checked from inside it; `accel-ctk list`
//! (order, filtering, topology), `cdi generate` validated against the CDI schema, and the
//! NFD labels file. Needs root, runc, busybox; fails (never skips) without them.

mod common;

use std::path::Path;

use common::drm::{self, DrmHost, DRM_MAJOR};
use common::*;
use serde_json::Value;

/// A container with `env` on `sim` (profiles `names` installed), probed with `probe`.
fn run(sim: &SimRoot, names: &[&str], env: &[&str], probe: &Probe) -> (Report, Bundle, Runc) {
    let mut b = Bundle::busybox();
    for kv in env {
        b.env(kv);
    }
    b.sh(&probe.script());
    let runc = Runc::new(sim);
    drm::install_profiles(&runc, sim, names);
    let id = runc.id("drm");
    let out = runc.run(&b, &id);
    assert_eq!(out.code, 0, "{out:#?}\n{}", runc.shim_log());
    (Report::parse(&out.stdout), b, runc)
}

/// What opening a fake DRM node gives: ENXIO with no DRM driver in this kernel.
fn assert_no_driver_open(r: &Report, node: &str) {
    let got = r.open(node);
    if drm::host_has_drm() {
        assert!(
            matches!(&got, Open::Other(t) if t.contains("No such device")),
            "{node}: {got:?}\n{}",
            r.raw
        );
    } else {
        assert_eq!(got, Open::Enxio, "{node}\n{}", r.raw);
    }
}

fn probe_dri() -> Probe {
    Probe::new().ls("/dev").ls("/dev/dri")
}

#[test]
fn amd_index_is_pci_order_and_the_display_gpu_is_never_offered() {
    require_root();
    let sim = SimRoot::builder().build();
    let host = drm::amd_node(&sim);
    let gpus = host.offered("0x1002", "amdgpu");
    assert_eq!(gpus.len(), 8);
    // Index 5 is 0000:84:00.0, whose numbers the reverse probe made card7/renderD135.
    let five = gpus[5];
    assert_eq!((five.bdf.as_str(), five.card), ("0000:84:00.0", Some(7)));
    let probe = probe_dri()
        .open(&gpus[1].render_node())
        .open(&five.render_node())
        .open(&five.card_node())
        .open("/dev/kfd")
        .open("/dev/dri/renderD128");
    let (r, b, _runc) = run(&sim, &["amd"], &["AMD_VISIBLE_DEVICES=1,5"], &probe);
    r.assert_extra_dev(&["dri", "kfd"]);
    assert_eq!(
        r.ls("/dev/dri"),
        names(&["card2", "renderD130", "card7", "renderD135"]),
        "{}",
        r.raw
    );
    for node in [gpus[1].render_node(), five.render_node(), five.card_node()] {
        assert_no_driver_open(&r, &node);
    }
    assert_eq!(r.open("/dev/kfd"), Open::Enxio, "{}", r.raw);
    assert_eq!(r.open("/dev/dri/renderD128"), Open::Absent, "{}", r.raw);

    // The cgroup rules: DRM's 226 for the GPUs' nodes, kfd's dynamic major read from /dev.
    let spec = b.read_spec();
    let mut rules: Vec<(u64, u64)> = spec["linux"]["resources"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["allow"] == true && r["major"].is_u64())
        .map(|r| (r["major"].as_u64().unwrap(), r["minor"].as_u64().unwrap()))
        .collect();
    rules.sort();
    let kfd = u64::from(host.kfd_major.unwrap());
    let d = u64::from(DRM_MAJOR);
    let mut want = vec![(d, 2), (d, 7), (d, 130), (d, 135), (kfd, 0)];
    want.sort();
    assert_eq!(rules, want);
}

#[test]
fn amd_unique_ids_and_ranges_select_the_same_gpus() {
    require_root();
    let sim = SimRoot::builder().build();
    let host = drm::amd_node(&sim);
    let gpus = host.offered("0x1002", "amdgpu");
    let (_, unique) = gpus[6].kfd.unwrap();
    let env = format!("AMD_VISIBLE_DEVICES=0-1,0x{unique:x}");
    let (r, _, _runc) = run(&sim, &["amd"], &[&env], &probe_dri());
    let want: Vec<String> = [gpus[0], gpus[1], gpus[6]]
        .iter()
        .flat_map(|g| [g.render_node(), g.card_node()])
        .map(|n| n.trim_start_matches("/dev/dri/").to_string())
        .collect();
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(r.ls("/dev/dri"), names(&want), "{}", r.raw);

    // The display GPU's render node asked for by a path-like or index beyond: one clear line.
    let mut b = Bundle::busybox();
    b.env("AMD_VISIBLE_DEVICES=8").sh("true");
    let runc = Runc::new(&sim);
    drm::install_profiles(&runc, &sim, &["amd"]);
    let id = runc.id("drm-bad");
    let out = runc.run(&b, &id);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("AMD_VISIBLE_DEVICES: no device \"8\" on this node; it has 8"),
        "{}",
        out.stderr
    );
}

#[test]
fn intel_i915_and_xe_are_two_profiles_in_card_order() {
    require_root();
    let sim = SimRoot::builder().build();
    drm::intel_node(&sim);
    let (r, _, _runc) = run(
        &sim,
        &["intel", "intel-xe"],
        &["INTEL_VISIBLE_DEVICES=1", "INTEL_XE_VISIBLE_DEVICES=0"],
        &probe_dri().open("/dev/dri/renderD130"),
    );
    // i915 index 1 is card2 (card order: card0 integrated, card2 discrete); xe 0 is card1.
    assert_eq!(
        r.ls("/dev/dri"),
        names(&["card2", "renderD130", "card1", "renderD129"]),
        "{}",
        r.raw
    );
    assert_no_driver_open(&r, "/dev/dri/renderD130");
    r.assert_extra_dev(&["dri"]);
}

#[test]
fn hygon_gets_kfd_and_mkfd() {
    require_root();
    let sim = SimRoot::builder().build();
    let host = drm::hygon_node(&sim);
    let (r, _, _runc) = run(
        &sim,
        &["hygon"],
        &["HCU_VISIBLE_DEVICES=all"],
        &probe_dri().open("/dev/mkfd").open("/dev/kfd"),
    );
    assert_eq!(host.funcs.len(), 2);
    r.assert_extra_dev(&["dri", "kfd", "mkfd"]);
    assert_eq!(
        r.ls("/dev/dri"),
        names(&["card0", "renderD128", "card1", "renderD129"]),
        "{}",
        r.raw
    );
    assert_eq!(r.open("/dev/mkfd"), Open::Enxio, "{}", r.raw);
}

/// accel-ctk with `runc`'s config.
fn ctk(runc: &Runc, args: &[&str]) -> Out {
    output(
        std::process::Command::new(&*CTK)
            .args(args)
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", runc.config_path()),
    )
}

fn amd_runc(sim: &SimRoot) -> (DrmHost, Runc) {
    let host = drm::amd_node(sim);
    let runc = Runc::new(sim);
    drm::install_profiles(&runc, sim, &["amd", "intel", "hygon"]);
    (host, runc)
}

/// `cmd` under coreutils' `timeout`: a run that blocks (discovery opening a FIFO) ends after
/// 20 s with `timeout`'s exit code 124 instead of hanging the test.
fn within_20s(cmd: &mut std::process::Command) -> Out {
    let mut t = std::process::Command::new("timeout");
    t.arg("20").arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            t.env(k, v);
        }
    }
    let out = output(&mut t);
    assert_ne!(
        out.code, 124,
        "{cmd:?} did not finish within 20 s: {out:#?}"
    );
    out
}

/// `accel-ctk list --json` with `runc`'s config, within 20 s.
fn list_json(runc: &Runc) -> (Out, Value) {
    let out = within_20s(
        std::process::Command::new(&*CTK)
            .args(["list", "--json"])
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", runc.config_path()),
    );
    let v = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:#?}"));
    (out, v)
}

/// The listing's devices of `vendor`.
fn vendor_rows<'v>(v: &'v Value, vendor: &str) -> Vec<&'v Value> {
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["vendor"] == vendor)
        .collect()
}

/// Issue 32, class 6: a sysfs `vendor` that is a FIFO. Opened for reading, it blocks until
/// a writer comes, which none does: discovery, and with it every create for the vendor and
/// `accel-ctk list`, would hang. It is refused without being opened, naming the file.
#[test]
fn class6_drm_vendor_fifo_does_not_hang_discovery() {
    require_root();
    let sim = SimRoot::builder().build();
    let (host, runc) = amd_runc(&sim);
    let gpu = host.offered("0x1002", "amdgpu")[1].clone();
    let vendor = drm::sysfs_dir(sim.path(), &gpu).join("vendor");
    std::fs::remove_file(&vendor).unwrap();
    nix::unistd::mkfifo(&vendor, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let (out, v) = list_json(&runc);
    assert_eq!(out.code, 1, "{out:#?}");
    let errors = v["errors"].as_array().unwrap();
    let amd = errors
        .iter()
        .find(|e| e["vendor"] == "amd")
        .unwrap_or_else(|| panic!("no amd error: {out:#?}"));
    let msg = amd["error"].as_str().unwrap();
    assert!(
        msg.contains(&vendor.display().to_string())
            && msg.contains("a FIFO, not a regular file; not opened"),
        "{msg}"
    );
}

/// Issue 32, class 6: a sysfs `vendor` that is a character device is not opened (its
/// driver's open would run as root). strace shows every open of a `vendor` file: each is an
/// `O_PATH` lookup; the refusal names the file.
#[test]
fn class6_drm_vendor_char_device_not_opened() {
    require_root();
    let sim = SimRoot::builder().build();
    let (host, runc) = amd_runc(&sim);
    let gpu = host.offered("0x1002", "amdgpu")[1].clone();
    let vendor = drm::sysfs_dir(sim.path(), &gpu).join("vendor");
    std::fs::remove_file(&vendor).unwrap();
    mknod(&vendor, common::free_majors(1)[0], 0, 0o644);
    let trace = runc.scratch().join("list.strace");
    let out = within_20s(
        std::process::Command::new("strace")
            .args(["-f", "-qq", "-e", "trace=open,openat,openat2", "-o"])
            .arg(&trace)
            .arg(&*CTK)
            .args(["list", "--json"])
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", runc.config_path()),
    );
    let trace = std::fs::read_to_string(&trace).expect("strace's output (apt-get install strace)");
    let opens: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("/vendor\"") || l.contains("\"vendor\""))
        .collect();
    assert!(
        !opens.is_empty(),
        "no open of a vendor file traced:\n{trace}"
    );
    for l in opens {
        assert!(l.contains("O_PATH"), "a vendor file opened for real: {l}");
    }
    assert_eq!(out.code, 1, "{out:#?}");
    assert!(
        out.stderr.contains(&format!(
            "{}: a character device, not a regular file; not opened",
            vendor.display()
        )),
        "{out:#?}"
    );
}

/// Issue 32, class 6: sysfs files that are symlinks out of the driver root (`vendor`,
/// `numa_node`, a KFD node's `properties`) are resolved inside it, as the kernel would if the
/// root were `/`: the host files they name are never read.
#[test]
fn class6_drm_sysfs_symlink_out_of_root_not_followed() {
    require_root();
    let sim = SimRoot::builder().build();
    let (host, runc) = amd_runc(&sim);
    let gpus = host.offered("0x1002", "amdgpu");
    let outside = tempfile::tempdir().unwrap();
    let plant = |file: &Path, name: &str, text: &str| {
        let target = outside.path().join(name);
        std::fs::write(&target, text).unwrap();
        std::fs::remove_file(file).unwrap();
        std::os::unix::fs::symlink(&target, file).unwrap();
    };
    // GPU 1's vendor says AMD only outside the root; GPU 0's NUMA node is 7 only there; GPU
    // 2's KFD node names its render minor and a unique id only there.
    plant(
        &drm::sysfs_dir(sim.path(), gpus[1]).join("vendor"),
        "vendor",
        "0x1002\n",
    );
    plant(
        &drm::sysfs_dir(sim.path(), gpus[0]).join("numa_node"),
        "numa_node",
        "7\n",
    );
    let (node, _) = gpus[2].kfd.unwrap();
    plant(
        &sim.path().join(format!(
            "sys/class/kfd/kfd/topology/nodes/{node}/properties"
        )),
        "properties",
        &format!(
            "simd_count 1216\ndrm_render_minor {}\nunique_id 3735928559\n",
            gpus[2].render.unwrap()
        ),
    );
    let (out, v) = list_json(&runc);
    assert_eq!(out.code, 0, "{out:#?}");
    let amd = vendor_rows(&v, "amd");
    let buses: Vec<&str> = amd
        .iter()
        .map(|d| d["pci_bus_id"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = gpus
        .iter()
        .filter(|g| g.bdf != gpus[1].bdf)
        .map(|g| g.bdf.as_str())
        .collect();
    assert_eq!(buses, want, "{}", out.stdout);
    let row = |bdf: &str| *amd.iter().find(|d| d["pci_bus_id"] == bdf).unwrap();
    assert_eq!(
        row(&gpus[0].bdf)["numa_node"],
        Value::Null,
        "{}",
        out.stdout
    );
    assert_eq!(row(&gpus[2].bdf)["uuid"], Value::Null, "{}", out.stdout);
    assert!(!out.stdout.contains("0xdeadbeef"), "{}", out.stdout);
}

/// Issue 32, class 3: two GPUs whose KFD nodes report the same `unique_id`. That id names
/// neither: `accel-ctk list` shows it as not unique, with no `uuid`; a container asking for
/// it is refused rather than given one of the two.
#[test]
fn class3_duplicate_unique_id_is_not_a_key() {
    require_root();
    let sim = SimRoot::builder().build();
    let mut funcs = drm::amd_funcs();
    let shared = funcs[1].kfd.unwrap().1;
    let node = funcs[2].kfd.unwrap().0;
    funcs[2].kfd = Some((node, shared));
    let host = drm::build(sim.path(), funcs, true, &[]);
    let runc = Runc::new(&sim);
    drm::install_profiles(&runc, &sim, &["amd"]);
    let gpus = host.offered("0x1002", "amdgpu");
    let (out, v) = list_json(&runc);
    assert_eq!(out.code, 0, "{out:#?}");
    let amd = vendor_rows(&v, "amd");
    assert_eq!(amd.len(), 8, "{}", out.stdout);
    let id = format!("0x{shared:x}");
    for (d, g) in amd.iter().zip(&gpus) {
        if [&gpus[1].bdf, &gpus[2].bdf].contains(&&g.bdf) {
            assert_eq!(d["uuid"], Value::Null, "{d}");
            assert_eq!(d["duplicate_uuid"], id.as_str(), "{d}");
        } else {
            assert_eq!(
                d["uuid"],
                format!("0x{:x}", g.kfd.unwrap().1).as_str(),
                "{d}"
            );
            assert_eq!(d["duplicate_uuid"], Value::Null, "{d}");
        }
    }
    let table = ctk(&runc, &["list"]);
    assert!(
        table.stdout.contains(&format!("{id} (not unique)")),
        "{table:#?}"
    );

    let mut b = Bundle::busybox();
    b.env(&format!("AMD_VISIBLE_DEVICES={id}")).sh("true");
    let out = runc.run(&b, &runc.id("drm-dup"));
    assert_ne!(out.code, 0, "{out:#?}");
    assert!(
        out.stderr.contains(&format!("no device \"{id}\"")),
        "{}",
        out.stderr
    );
}

#[test]
fn list_shows_order_numa_and_switches() {
    require_root();
    let sim = SimRoot::builder().build();
    let (host, runc) = amd_runc(&sim);
    let out = ctk(&runc, &["list", "--json"]);
    assert_eq!(out.code, 0, "{out:#?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let amd: Vec<&Value> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["vendor"] == "amd")
        .collect();
    let want = host.offered("0x1002", "amdgpu");
    assert_eq!(amd.len(), 8, "{}", out.stdout);
    for (i, (d, g)) in amd.iter().zip(&want).enumerate() {
        assert_eq!(d["index"], i, "{d}");
        assert_eq!(d["pci_bus_id"], g.bdf.as_str(), "{d}");
        assert_eq!(d["numa_node"], g.numa, "{d}");
        assert_eq!(d["model"], "1002-74a1", "{d}");
        let switch = if g.bdf.as_str() < "0000:80" {
            "0000:01:00.0"
        } else {
            "0000:81:00.0"
        };
        assert_eq!(d["switch"], switch, "{d}");
    }
    // Neither the display GPU nor the vfio-bound AMD function, under any profile.
    assert!(!out.stdout.contains("0000:00:1f.0") && !out.stdout.contains("0000:c1:00.0"));
    assert!(
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["vendor"] == "amd"),
        "{}",
        out.stdout
    );
}

#[test]
fn cdi_generate_for_amd_passes_the_schema() {
    require_root();
    let sim = SimRoot::builder().build();
    let (host, runc) = amd_runc(&sim);
    let out = ctk(
        &runc,
        &["cdi", "generate", "--vendor", "amd", "--format", "json"],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    let spec: Value = serde_json::from_str(&out.stdout).unwrap();
    let schema: Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi-schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let v = jsonschema::options().build(&schema).unwrap();
    let errors: Vec<String> = v.iter_errors(&spec).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}\n{spec:#}");
    assert_eq!(spec["kind"], "amd.com/gpu");
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"0") && names.contains(&"7") && names.contains(&"all"));
    let seven = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "7")
        .unwrap();
    let g = host.offered("0x1002", "amdgpu")[7];
    let paths: Vec<&str> = seven["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, [g.render_node(), g.card_node()]);
    let shared: Vec<&str> = spec["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(shared, ["/dev/kfd"]);
}

/// The device plugin for AMD: under the stand-in kubelet (registration, ListAndWatch with
/// NUMA topology, preferred allocation by switch, health), and each strategy's Allocate
/// answer run through the runtime and real runc.
#[cfg(feature = "plugin")]
mod plugin {
    use super::*;
    use accel_container_runtime::config::Config;
    use accel_container_runtime::kubelet::proto::deviceplugin::*;
    use accel_container_runtime::plugin::allocate::Strategy;
    use accel_container_runtime::plugin::server::{self, Options};
    use accel_container_runtime::plugin::service;
    use common::grpc;
    use common::kubelet::{apply_answer, ids, rt, Kubelet};
    use std::path::PathBuf;
    use std::time::Duration;
    use tokio::sync::watch;

    fn amd_profile(runc: &Runc) -> accel_container_runtime::profile::Profile {
        Config::load(&runc.config_path())
            .unwrap()
            .profiles
            .into_iter()
            .find(|p| p.name == "amd")
            .unwrap()
    }

    #[test]
    fn stand_in_kubelet_lists_amd_gpus_with_topology_and_health() {
        require_root();
        let sim = SimRoot::builder().build();
        let (host, runc) = amd_runc(&sim);
        let gpus = host.offered("0x1002", "amdgpu");
        let profile = amd_profile(&runc);
        let scratch = tempfile::tempdir().unwrap();
        rt().block_on(async move {
            let mut kubelet = Kubelet::started();
            let mut opts = kubelet.plugin_options();
            opts.strategies = Strategy::ALL.to_vec();
            opts.cdi_dir = scratch.path().join("cdi");
            opts.poll = Duration::from_millis(100);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(server::run(vec![profile], opts, stop_rx));
            kubelet.wait_registrations(1).await;
            let reg = kubelet.registrations.lock().unwrap()[0].clone();
            assert_eq!(reg.resource_name, "amd.com/gpu");
            let ch = grpc::connect(&kubelet.dir().join(&reg.endpoint), "localhost")
                .await
                .unwrap();

            // The 8 GPUs by PCI address (AMD's device plugin's IDs), NUMA 0 then 1.
            let first = kubelet.updates.recv().await.unwrap();
            let got: Vec<(String, String, i64)> = first
                .devices
                .iter()
                .map(|d| {
                    let numa = d.topology.as_ref().unwrap().nodes[0].id;
                    (d.id.clone(), d.health.clone(), numa)
                })
                .collect();
            let want: Vec<(String, String, i64)> = gpus
                .iter()
                .map(|g| (g.bdf.clone(), HEALTHY.to_string(), i64::from(g.numa)))
                .collect();
            assert_eq!(got, want);

            // Two GPUs: behind one switch; with a GPU of the second switch, its neighbour.
            let all: Vec<String> = gpus.iter().map(|g| g.bdf.clone()).collect();
            let prefer = |must: Vec<String>| {
                let ch = ch.clone();
                let avail = all.clone();
                async move {
                    grpc::get_preferred(
                        &ch,
                        PreferredAllocationRequest {
                            container_requests: vec![ContainerPreferredAllocationRequest {
                                available_device_ids: avail,
                                must_include_device_ids: must,
                                allocation_size: 2,
                            }],
                        },
                    )
                    .await
                    .unwrap()
                    .container_responses[0]
                        .device_ids
                        .clone()
                }
            };
            assert_eq!(prefer(vec![]).await, ids(&["0000:03:00.0", "0000:04:00.0"]));
            let got = prefer(ids(&["0000:85:00.0"])).await;
            assert!(got.contains(&"0000:85:00.0".to_string()), "{got:?}");
            assert!(got.iter().all(|b| b.as_str() > "0000:80"), "{got:?}");

            // A render node gone: that GPU turns unhealthy, the others stay healthy.
            std::fs::remove_file(sim.path().join(&gpus[2].render_node()[1..])).unwrap();
            let update = tokio::time::timeout(Duration::from_secs(20), kubelet.updates.recv())
                .await
                .expect("an update after the node went")
                .unwrap();
            let unhealthy: Vec<&str> = update
                .devices
                .iter()
                .filter(|d| d.health != HEALTHY)
                .map(|d| d.id.as_str())
                .collect();
            assert_eq!(unhealthy, [gpus[2].bdf.as_str()]);
            stop.send(true).unwrap();
            task.await.unwrap().unwrap();
        });
    }

    /// `accel-device-plugin --nfd-labels`: the plugin keeps the feature file fresh, its
    /// expiry moving on with each rewrite.
    #[test]
    fn plugin_keeps_the_labels_file_fresh() {
        require_root();
        let sim = SimRoot::builder().build();
        let (_host, runc) = amd_runc(&sim);
        let kubelet_dir = runc.scratch().join("device-plugins");
        std::fs::create_dir_all(&kubelet_dir).unwrap();
        let file = runc.scratch().join("features.d/accel");
        /// Killed on drop, also when an assertion fails.
        struct Child(std::process::Child);
        impl Drop for Child {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = std::process::Command::new(binary(env!("CARGO_BIN_EXE_accel-device-plugin")))
            .args(["--kubelet-dir", kubelet_dir.to_str().unwrap()])
            .args([
                "--nfd-labels",
                file.to_str().unwrap(),
                "--nfd-labels-expiry",
                "3s",
            ])
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", runc.config_path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let child = Child(child);
        let expiry_of = |deadline: std::time::Instant, not: Option<&str>| loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let line = text
                    .lines()
                    .find(|l| l.starts_with("# +expiry-time="))
                    .map(str::to_string);
                if let Some(line) = line.filter(|l| Some(l.as_str()) != not) {
                    return (text, line);
                }
            }
            assert!(std::time::Instant::now() < deadline, "no (new) labels file");
            std::thread::sleep(Duration::from_millis(100));
        };
        let start = std::time::Instant::now();
        let (text, first) = expiry_of(start + Duration::from_secs(20), None);
        let (_, second) = expiry_of(start + Duration::from_secs(20), Some(&first));
        drop(child);
        let labels = nfd_parse(&text, std::time::SystemTime::now());
        assert_eq!(
            labels["feature.node.kubernetes.io/accel-amd.count"], "8",
            "{text}"
        );
        assert!(second > first, "{first} then {second}");
    }

    /// Issue 32, class 6: the device plugin's first discovery meets a `vendor` FIFO. It
    /// ends with one line naming the file, which the DaemonSet shows in its restarts,
    /// instead of hanging before it ever registers.
    #[test]
    fn class6_drm_vendor_fifo_does_not_hang_the_device_plugin() {
        require_root();
        let sim = SimRoot::builder().build();
        let (host, runc) = amd_runc(&sim);
        let gpu = host.offered("0x1002", "amdgpu")[3].clone();
        let vendor = drm::sysfs_dir(sim.path(), &gpu).join("vendor");
        std::fs::remove_file(&vendor).unwrap();
        nix::unistd::mkfifo(&vendor, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let kubelet_dir = runc.scratch().join("device-plugins");
        std::fs::create_dir_all(&kubelet_dir).unwrap();
        let out = within_20s(
            std::process::Command::new(binary(env!("CARGO_BIN_EXE_accel-device-plugin")))
                .arg("--kubelet-dir")
                .arg(&kubelet_dir)
                .env("ACCEL_CONTAINER_RUNTIME_CONFIG", runc.config_path()),
        );
        assert_eq!(out.code, 1, "{out:#?}");
        assert!(
            out.stderr.contains(&format!(
                "{}: a FIFO, not a regular file; not opened",
                vendor.display()
            )),
            "{out:#?}"
        );
    }

    /// Each strategy's answer for two GPUs, applied as containerd would and run: the
    /// container sees exactly their render/card nodes and /dev/kfd.
    #[test]
    fn allocate_answers_give_exactly_those_gpus_through_runtime_and_runc() {
        require_root();
        let sim = SimRoot::builder().build();
        let host = drm::amd_node(&sim);
        let gpus = host.offered("0x1002", "amdgpu");
        for (strategy, extra) in common::kubelet::STRATEGIES {
            let cdi_dir = tempfile::tempdir().unwrap();
            let extra = format!("{extra}\ncdi-spec-dirs = [{:?}]", cdi_dir.path());
            let runc = Runc::with_config(&sim, &extra);
            drm::install_profiles(&runc, &sim, &["amd"]);
            let profile = amd_profile(&runc);
            let mut opts = Options::new(PathBuf::from("/nonexistent"));
            opts.cdi_dir = cdi_dir.path().to_path_buf();
            server::write_cdi(&profile, &opts).unwrap();
            let plugin = service::Plugin::new(profile, vec![strategy]).unwrap();
            let answer = plugin
                .allocate(AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: ids(&[&gpus[6].bdf, &gpus[1].bdf]),
                    }],
                })
                .unwrap()
                .container_responses
                .remove(0);
            let mut b = Bundle::busybox();
            apply_answer(&mut b, &answer);
            b.sh(&probe_dri().open("/dev/kfd").script());
            let id = runc.id(&format!("amd-{}", strategy.as_str()));
            let out = runc.run(&b, &id);
            assert_eq!(out.code, 0, "{strategy:?}: {out:#?}\n{}", runc.shim_log());
            let r = Report::parse(&out.stdout);
            let want: Vec<String> = [gpus[1], gpus[6]]
                .iter()
                .flat_map(|g| [g.render_node(), g.card_node()])
                .map(|n| n.trim_start_matches("/dev/dri/").to_string())
                .collect();
            let want: Vec<&str> = want.iter().map(String::as_str).collect();
            assert_eq!(r.ls("/dev/dri"), names(&want), "{strategy:?}: {}", r.raw);
            assert_eq!(r.open("/dev/kfd"), Open::Enxio, "{strategy:?}: {}", r.raw);
        }
    }
}

#[test]
fn doctor_and_dev_char_links_cover_the_amd_nodes() {
    require_root();
    let sim = SimRoot::builder().build();
    let (host, runc) = amd_runc(&sim);
    let out = ctk(&runc, &["doctor", "--json"]);
    let findings: Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:#?}"));
    let amd = findings
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"].as_str().is_some_and(|c| c.contains("amd")))
        .unwrap_or_else(|| panic!("no amd finding: {findings:#}"));
    assert_eq!(amd["status"], "ok", "{amd}");
    assert!(
        amd["message"].as_str().unwrap().starts_with("8 device(s)"),
        "{amd}"
    );

    let dev = runc.scratch().join("dev");
    let out = ctk(
        &runc,
        &[
            "system",
            "create-dev-char-symlinks",
            "--dev-dir",
            dev.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    let kfd = host.kfd_major.unwrap();
    for g in host.offered("0x1002", "amdgpu") {
        for minor in [g.card.unwrap(), g.render.unwrap()] {
            let link = dev.join(format!("char/{DRM_MAJOR}:{minor}"));
            let target = std::fs::read_link(&link).unwrap_or_else(|e| panic!("{link:?}: {e}"));
            assert!(target.starts_with(sim.path()), "{target:?}");
        }
    }
    assert!(dev.join(format!("char/{kfd}:0")).is_symlink());
    // The display GPU's nodes are no profile's.
    assert!(!dev.join(format!("char/{DRM_MAJOR}:128")).exists());
    assert!(!dev.join(format!("char/{DRM_MAJOR}:0")).exists());
}

/// A local feature file read as NFD's `local` source reads it (source/local/local.go:
/// trimmed lines, `#` comments, `# +expiry-time=` RFC 3339 directive after which lines past
/// that time are dropped, `name=value` split at the first `=`, a bare name `true`), each
/// label then checked as Kubernetes checks one with NFD's default prefix.
fn nfd_parse(text: &str, now: std::time::SystemTime) -> std::collections::BTreeMap<String, String> {
    let mut expiry = now;
    let mut labels = std::collections::BTreeMap::new();
    for line in text.split('\n').map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(c) = line.strip_prefix('#') {
            if let Some(d) = c.strip_prefix(" +") {
                let (key, val) = d.split_once('=').expect("directive with a value");
                assert_eq!(key, "expiry-time", "{line}");
                expiry = humantime::parse_rfc3339(val.trim()).expect("RFC 3339 expiry");
            }
            continue;
        }
        if expiry < now {
            continue;
        }
        let (k, v) = line.split_once('=').unwrap_or((line, "true"));
        let valid = |s: &str, max: usize| {
            s.len() <= max
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        };
        assert!(!k.contains('/') && valid(k, 63), "label name {k:?}");
        assert!(v.is_empty() || valid(v, 63), "label value {v:?}");
        labels.insert(format!("feature.node.kubernetes.io/{k}"), v.to_string());
    }
    labels
}

#[test]
fn labels_file_is_what_nfd_reads_and_expires() {
    require_root();
    let sim = SimRoot::builder().build();
    let (_host, runc) = amd_runc(&sim);
    let dir = runc.scratch().join("features.d");
    let file = dir.join("accel-container-runtime");
    let out = ctk(
        &runc,
        &[
            "labels",
            "--output",
            file.to_str().unwrap(),
            "--expiry",
            "2h",
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    let text = std::fs::read_to_string(&file).unwrap();
    let now = std::time::SystemTime::now();
    let got = nfd_parse(&text, now);
    let p = "feature.node.kubernetes.io/accel-amd";
    let want: std::collections::BTreeMap<String, String> = [
        ("present", "true"),
        ("count", "8"),
        ("model", "1002-74a1"),
        ("numa-nodes", "0_1"),
        ("pcie-switches", "2"),
        ("pcie-switch-sizes", "4_4"),
        ("sharing", "none"),
    ]
    .iter()
    .map(|(k, v)| (format!("{p}.{k}"), v.to_string()))
    .collect();
    assert_eq!(got, want, "{text}");
    // Only the file itself: its temp file was renamed over it.
    assert_eq!(dir_names(&dir), names(&["accel-container-runtime"]));
    // Three hours on, NFD drops every label.
    assert!(nfd_parse(&text, now + std::time::Duration::from_secs(3 * 3600)).is_empty());

    // Shared: time-slicing with its replicas; written over the old file.
    let mut cfg = std::fs::read_to_string(runc.config_path()).unwrap();
    cfg = cfg.replace("[profiles.\"amd\"]\n", "[profiles.\"amd\"]\nreplicas = 4\n");
    std::fs::write(runc.config_path(), cfg).unwrap();
    let out = ctk(&runc, &["labels", "--output", file.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{out:#?}");
    let got = nfd_parse(&std::fs::read_to_string(&file).unwrap(), now);
    assert_eq!(got[&format!("{p}.sharing")], "time-slicing");
    assert_eq!(got[&format!("{p}.replicas")], "4");
}

/// kubelet's checkpoint names AMD GPUs by PCI address, as the plugin lists them: consistent
/// while those GPUs exist, stale once one is gone.
#[test]
fn checkpoint_ids_are_pci_addresses() {
    use accel_container_runtime::checkpoint::{kubelet_checksum, Checkpoint};
    require_root();
    let sim = SimRoot::builder().build();
    let (host, runc) = amd_runc(&sim);
    let bdfs: Vec<String> = host
        .offered("0x1002", "amdgpu")
        .iter()
        .map(|g| g.bdf.clone())
        .collect();
    let write = |dir: &Path, allocated: &str| {
        let json = serde_json::json!({"Data": {
            "PodDeviceEntries": [{"PodUID": "0c0ffee0-0000-4000-8000-000000000001",
                "ContainerName": "train", "ResourceName": "amd.com/gpu",
                "DeviceIDs": {"0": [allocated]}, "AllocResp": ""}],
            "RegisteredDevices": {"amd.com/gpu": bdfs}}, "Checksum": 0});
        let path = dir.join("kubelet_internal_checkpoint");
        let text = serde_json::to_vec(&json).unwrap();
        let sum = kubelet_checksum(&Checkpoint::parse(&text, &path).unwrap().data).unwrap();
        let text = String::from_utf8(text)
            .unwrap()
            .replace("\"Checksum\":0", &format!("\"Checksum\":{sum}"));
        std::fs::write(&path, text).unwrap();
        path
    };
    let dir = runc.scratch().join("kubelet");
    std::fs::create_dir_all(&dir).unwrap();
    let cp = write(&dir, &bdfs[3]);
    let check = |cp: &Path| {
        ctk(
            &runc,
            &[
                "checkpoint",
                "check",
                "--checkpoint",
                cp.to_str().unwrap(),
                "--resource",
                "amd.com/gpu",
            ],
        )
    };
    let out = check(&cp);
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(out.stdout.contains("\"consistent\""), "{}", out.stdout);
    // The GPU at 0000:06:00.0 leaves the node (its sysfs and nodes gone).
    std::fs::remove_file(sim.path().join("sys/class/drm/renderD132")).unwrap();
    let out = check(&cp);
    assert_eq!(out.code, 1, "{out:#?}");
    assert!(out.stdout.contains("\"stale\""), "{}", out.stdout);
}
