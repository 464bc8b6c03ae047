//! accel-device-plugin against a kubelet stand-in: a `v1beta1.Registration` server on a temp
//! `kubelet.sock` that records registrations, dials the plugin's endpoint and drives it as
//! kubelet does (options, ListAndWatch, GetPreferredAllocation, Allocate), over a simulated
//! Enflame host whose sysfs has the bridge chains of Enflame's PCIe-switch example.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use accel_container_runtime::config::Config;
use accel_container_runtime::kubelet::host_root::HostRoot;
use accel_container_runtime::kubelet::proto::deviceplugin::*;
use accel_container_runtime::plugin::allocate::Strategy;
use accel_container_runtime::plugin::server::{self, Options};
use accel_container_runtime::plugin::service;
use common::grpc::{self, ALLOCATE, GET_OPTIONS};
use common::kubelet::{
    apply_answer, config, enflame_host, ids, rt, seed, shuffled, Kubelet, Plugin,
};
use common::{binary, mknod, SimRoot};
use tokio::sync::watch;

#[test]
fn stand_in_kubelet_drives_the_plugin() {
    let (sim, major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.strategies = Strategy::ALL.to_vec();
        opts.cdi_dir = scratch.path().join("cdi");
        let plugin = Plugin::enflame(cfg, opts);

        // Registration: served before registering, one socket named in the request.
        kubelet.wait_registrations(1).await;
        let reg = kubelet.registrations.lock().unwrap()[0].clone();
        assert_eq!(reg.version, "v1beta1");
        assert_eq!(reg.resource_name, "enflame.com/gcu");
        assert_eq!(reg.endpoint, "accel-enflame-com-gcu.sock");
        assert!(reg.options.unwrap().get_preferred_allocation_available);
        let sock = kubelet.dir().join(&reg.endpoint);
        let ch = grpc::connect(&sock, "localhost").await.unwrap();
        assert!(
            grpc::get_options(&ch)
                .await
                .unwrap()
                .get_preferred_allocation_available
        );

        // A kubelet before 1.26: `:authority` is the socket path (gRPC-go's default), first
        // indexed into the HPACK table, then named by index.
        let answers = old_kubelet_calls(
            &sock,
            &[
                (GET_OPTIONS, prost::Message::encode_to_vec(&Empty {})),
                (
                    ALLOCATE,
                    prost::Message::encode_to_vec(&AllocateRequest {
                        container_requests: vec![ContainerAllocateRequest {
                            devices_ids: ids(&["GCU-2"]),
                        }],
                    }),
                ),
            ],
        )
        .await;
        assert_eq!(answers[0].0, "0", "GetDevicePluginOptions: grpc-status");
        let options: DevicePluginOptions = prost::Message::decode(&answers[0].1[..]).unwrap();
        assert!(options.get_preferred_allocation_available);
        assert_eq!(answers[1].0, "0", "Allocate: grpc-status");
        let allocated: AllocateResponse = prost::Message::decode(&answers[1].1[..]).unwrap();
        assert_eq!(
            allocated.container_responses[0].envs["ENFLAME_VISIBLE_DEVICES"],
            "2"
        );

        // ListAndWatch: 8 healthy devices with their NUMA nodes.
        let first = kubelet.updates.recv().await.unwrap();
        let got: Vec<(String, String, i64)> = first
            .devices
            .iter()
            .map(|d| {
                (
                    d.id.clone(),
                    d.health.clone(),
                    d.topology.as_ref().unwrap().nodes[0].id,
                )
            })
            .collect();
        let want: Vec<(String, String, i64)> = (0..8)
            .map(|i| (format!("GCU-{i}"), HEALTHY.to_string(), i / 4))
            .collect();
        assert_eq!(got, want);

        // Enflame's example: {0,1}, then {4,5}; must_include pulls toward its switch. kubelet
        // sends the free IDs in Go's map order, another at every call: {0,1} and {4,5} are
        // equally good, and the lower indexes must win every time (issue 22: 18 to 17 in 35
        // tries under a real kubelet).
        let all: Vec<String> = (0..8).map(|i| format!("GCU-{i}")).collect();
        let prefer = |avail: Vec<String>, must: Vec<String>, n: i32| {
            let ch = ch.clone();
            async move {
                let mut answers = std::collections::BTreeSet::new();
                for _ in 0..40 {
                    let seed = seed();
                    let got = grpc::get_preferred(
                        &ch,
                        PreferredAllocationRequest {
                            container_requests: vec![ContainerPreferredAllocationRequest {
                                available_device_ids: shuffled(&avail, seed),
                                must_include_device_ids: must.clone(),
                                allocation_size: n,
                            }],
                        },
                    )
                    .await
                    .unwrap()
                    .container_responses[0]
                        .device_ids
                        .clone();
                    answers.insert(got);
                }
                assert_eq!(
                    answers.len(),
                    1,
                    "one answer whatever the order: {answers:?}"
                );
                answers.pop_first().unwrap()
            }
        };
        assert_eq!(
            prefer(all.clone(), vec![], 2).await,
            ids(&["GCU-0", "GCU-1"])
        );
        assert_eq!(
            prefer(all[2..].to_vec(), vec![], 2).await,
            ids(&["GCU-4", "GCU-5"])
        );
        assert_eq!(
            prefer(all.clone(), ids(&["GCU-5"]), 2).await,
            ids(&["GCU-4", "GCU-5"])
        );
        // Lone devices: the lowest indexes, whatever the order.
        assert_eq!(
            prefer(ids(&["GCU-7", "GCU-6", "GCU-3", "GCU-2"]), vec![], 1).await,
            ids(&["GCU-2"])
        );
        // IDs beyond what the plugin lists are refused without work, with a reason.
        let many: Vec<String> = (0..10_000).map(|i| format!("GCU-{i}")).collect();
        let e = grpc::get_preferred(
            &ch,
            PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_ids: many.clone(),
                    must_include_device_ids: vec![],
                    allocation_size: 2,
                }],
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.message(), "10000 device IDs offered, 8 listed");
        let e = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest { devices_ids: many }],
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.message(), "10000 device IDs asked for, 8 offered");

        // Allocate: every strategy, the same answer for the same IDs.
        let alloc = |v: Vec<String>| {
            let ch = ch.clone();
            async move {
                grpc::allocate(
                    &ch,
                    AllocateRequest {
                        container_requests: vec![ContainerAllocateRequest { devices_ids: v }],
                    },
                )
                .await
                .map(|r| r.container_responses[0].clone())
            }
        };
        let a = alloc(ids(&["GCU-1", "GCU-0"])).await.unwrap();
        assert_eq!(a.envs["ENFLAME_VISIBLE_DEVICES"], "0,1");
        let mounts: Vec<&str> = a.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(
            mounts,
            [
                "/var/run/enflame-container-devices/0",
                "/var/run/enflame-container-devices/1"
            ]
        );
        assert!(a
            .mounts
            .iter()
            .all(|m| m.host_path == "/dev/null" && m.read_only));
        let cdi: Vec<&str> = a.cdi_devices.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(cdi, ["enflame.com/gcu=0", "enflame.com/gcu=1"]);
        let nodes: Vec<&str> = a
            .devices
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        assert_eq!(nodes, ["/dev/gcu0", "/dev/gcu1", "/dev/gcuctl"]);
        assert_eq!(
            a.devices[0].host_path,
            sim.path().join("dev/gcu0").to_str().unwrap()
        );
        assert!(scratch.path().join("cdi/accel-enflame.json").exists());
        let err = alloc(ids(&["GCU-9"])).await.unwrap_err();
        assert!(err.message().contains("GCU-9"), "{err:?}");

        // 32 concurrent Allocates of different sets: each answers exactly its IDs.
        let sets: Vec<Vec<String>> = (0..32)
            .map(|i| {
                (0..8)
                    .filter(|b| (i + 1) & (1 << (b % 5)) != 0)
                    .map(|b| format!("GCU-{b}"))
                    .collect()
            })
            .collect();
        let answers = futures_join(sets.iter().cloned().map(alloc).collect()).await;
        for (set, ans) in sets.iter().zip(&answers) {
            let ans = ans.as_ref().unwrap();
            let mut want: Vec<String> = set
                .iter()
                .map(|s| s.trim_start_matches("GCU-").to_string())
                .collect();
            want.sort();
            assert_eq!(
                ans.envs["ENFLAME_VISIBLE_DEVICES"],
                want.join(","),
                "{set:?}"
            );
            assert_eq!(
                ans,
                &alloc(set.clone()).await.unwrap(),
                "same IDs, same answer"
            );
        }

        // Health: a deleted node is Unhealthy within a second, back Healthy when recreated.
        let node = sim.path().join("dev/gcu3");
        std::fs::remove_file(&node).unwrap();
        let took = kubelet
            .wait_health("GCU-3", UNHEALTHY, Duration::from_secs(1))
            .await;
        eprintln!("GCU-3 unhealthy after {took:?}");
        mknod(&node, major, 3, 0o666);
        kubelet
            .wait_health("GCU-3", HEALTHY, Duration::from_secs(1))
            .await;

        // The stream ends: exactly one new registration, no loop.
        let n = kubelet.count();
        drop(kubelet.drop_stream.lock().unwrap().take());
        kubelet.wait_registrations(n + 1).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(kubelet.count(), n + 1, "stream end: one registration");

        // kubelet restarts: the socket is served again, and answers.
        let n = kubelet.count();
        kubelet.restart(Duration::from_millis(100)).await;
        kubelet.wait_registrations(n + 1).await;
        assert!(sock.exists(), "socket served again");
        let ch = grpc::connect(&sock, "localhost").await.unwrap();
        assert_eq!(
            grpc::allocate(
                &ch,
                AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: ids(&["GCU-2"])
                    }]
                }
            )
            .await
            .unwrap()
            .container_responses[0]
                .envs["ENFLAME_VISIBLE_DEVICES"],
            "2"
        );

        // Shutdown removes the socket.
        plugin.stop().await;
        assert!(!sock.exists());
    });
}

/// kubelet restarts as kubelet does (stream ended, down a while, directory emptied,
/// kubelet.sock recreated): one registration each time, at once. Down long enough for the
/// plugin to be sleeping in its backoff when kubelet comes back: the events of the restart
/// queued during that sleep made a second registration (issue 22, 4), and the sleep made
/// it late (5).
#[test]
fn a_kubelet_restart_is_one_registration_at_once() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let plugin = Plugin::enflame(cfg, kubelet.plugin_options());
        kubelet.wait_registrations(1).await;
        for down in [1000, 300, 2500] {
            let n = kubelet.count();
            kubelet.restart(Duration::from_millis(down)).await;
            kubelet.wait_registrations(n + 1).await;
            let latency = kubelet.latency(n);
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(
                kubelet.count(),
                n + 1,
                "kubelet down {down} ms: one registration"
            );
            eprintln!("kubelet down {down} ms: registered {latency:?} after kubelet.sock");
            assert!(
                latency < Duration::from_millis(500),
                "kubelet down {down} ms: registered {latency:?} after kubelet.sock appeared"
            );
        }
        plugin.stop().await;
    });
}

/// Issue 36, an upgrade of the DaemonSet with surge: the new pod starts beside the old one
/// and registers once; kubelet takes its registration and ends the old one's stream, and the
/// old instance does not register again (the two would trade the resource for as long as
/// both run); the old one leaving takes only its own socket. kubelet owns allocation, so a
/// pod admitted meanwhile gets the IDs of one registration only.
#[test]
fn an_upgrade_registers_once_and_the_old_instance_stands_aside() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut old_opts = kubelet.plugin_options();
        old_opts.instance = Some("0ld-pod-uid".into());
        let mut new_opts = kubelet.plugin_options();
        new_opts.instance = Some("new-pod-uid".into());
        let old = Plugin::enflame(cfg.clone(), old_opts);
        kubelet.wait_registrations(1).await;
        let first = kubelet.registrations.lock().unwrap()[0].clone();
        assert_eq!(first.endpoint, "accel-enflame-com-gcu@0ld-pod-uid.sock");

        let new = Plugin::enflame(cfg, new_opts);
        kubelet.wait_registrations(2).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let endpoints: Vec<String> = kubelet
            .registrations
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.endpoint.clone())
            .collect();
        assert_eq!(
            endpoints,
            [
                "accel-enflame-com-gcu@0ld-pod-uid.sock",
                "accel-enflame-com-gcu@new-pod-uid.sock"
            ],
            "one registration each, the newer last"
        );

        // The newer one's stream is the live one: a device's health reaches kubelet.
        let gcu2 = sim.path().join("dev/gcu2");
        std::fs::rename(&gcu2, gcu2.with_extension("away")).unwrap();
        kubelet
            .wait_health("GCU-2", UNHEALTHY, Duration::from_secs(5))
            .await;
        std::fs::rename(gcu2.with_extension("away"), &gcu2).unwrap();

        old.stop().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(kubelet.count(), 2, "the old one leaving registers nothing");
        assert!(!kubelet.dir().join(&endpoints[0]).exists());
        assert!(kubelet.dir().join(&endpoints[1]).exists());
        let ch = grpc::connect(&kubelet.dir().join(&endpoints[1]), "localhost")
            .await
            .unwrap();
        let a = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&["GCU-3"]),
                }],
            },
        )
        .await
        .unwrap();
        assert_eq!(a.container_responses.len(), 1);
        new.stop().await;
    });
}

/// The plugin in its DaemonSet pod: the host's / mounted at some directory (`--host-root`),
/// profiles with the host's own driver-root (`/`). Devices and libraries are found under it,
/// and every path handed out (device specs, the CDI spec) is the host's, not the pod's.
#[test]
fn a_plugin_in_a_pod_reads_the_host_under_host_root() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("config.toml");
    std::fs::write(&path, "").unwrap();
    let cfg = Config::load(&path).unwrap();
    let root = sim.path().to_str().unwrap().to_string();
    rt().block_on(async move {
        let kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.strategies = vec![Strategy::DeviceSpecs, Strategy::CdiCri];
        opts.cdi_dir = scratch.path().join("cdi");
        opts.host_root = HostRoot::new(sim.path().to_path_buf());
        let plugin = Plugin::enflame(cfg, opts);
        kubelet.wait_registrations(1).await;
        let reg = kubelet.registrations.lock().unwrap()[0].clone();
        let ch = grpc::connect(&kubelet.dir().join(&reg.endpoint), "localhost")
            .await
            .unwrap();
        let a = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&["GCU-2"]),
                }],
            },
        )
        .await
        .unwrap();
        let hosts: Vec<&str> = a.container_responses[0]
            .devices
            .iter()
            .map(|d| d.host_path.as_str())
            .collect();
        assert_eq!(hosts, ["/dev/gcu2", "/dev/gcuctl"]);
        let spec = std::fs::read_to_string(scratch.path().join("cdi/accel-enflame.json")).unwrap();
        assert!(!spec.contains(&root), "pod paths in the CDI spec: {spec}");
        assert!(
            spec.contains("\"hostPath\": \"/usr/lib/x86_64-linux-gnu/libefml.so.1"),
            "{spec}"
        );
        plugin.stop().await;
    });
}

/// cdi-cri where the plugin cannot see the driver's libraries (its pod given /dev only):
/// the plugin stops with the reason instead of writing a spec without them (issue 22, 7).
#[test]
fn a_plugin_that_cannot_see_the_libraries_writes_no_cdi_spec() {
    let sim = SimRoot::builder().enflame(2).build();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.strategies = vec![Strategy::CdiCri];
        opts.cdi_dir = scratch.path().join("cdi");
        let (_stop, rx) = watch::channel(false);
        let profiles = cfg
            .profiles
            .into_iter()
            .filter(|p| p.name == "enflame")
            .collect();
        let e = server::run(profiles, opts, rx).await.unwrap_err();
        assert!(
            format!("{e:#}").contains("no enflame driver library found under"),
            "{e:#}"
        );
        assert!(!scratch.path().join("cdi/accel-enflame.json").exists());
        assert_eq!(kubelet.count(), 0);
    });
}

/// A node boots with the plugin first: no kubelet.sock for seconds, so the plugin backs off.
/// kubelet admits the pods it finds about 60 ms after it listens, and a device pod admitted
/// before the plugin registers is refused for good: the plugin must register the moment
/// kubelet.sock appears, not at its next retry (issue 22, 5: up to 30 s late).
#[test]
fn a_plugin_started_before_kubelet_registers_when_kubelet_sock_appears() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::new();
        let plugin = Plugin::enflame(cfg, kubelet.plugin_options());
        // Many retries in: the plugin is sleeping its longest wait so far.
        tokio::time::sleep(Duration::from_millis(4000)).await;
        assert_eq!(kubelet.count(), 0);
        kubelet.start();
        kubelet.wait_registrations(1).await;
        let latency = kubelet.latency(0);
        eprintln!("plugin first: registered {latency:?} after kubelet.sock");
        assert!(
            latency < Duration::from_millis(500),
            "registered {latency:?} after kubelet.sock appeared"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(kubelet.count(), 1, "one registration");
        plugin.stop().await;
    });
}

/// The plugin's socket is 0600 whatever the umask: anyone who can connect can call
/// Allocate (issue 22, 10). The binary, started under umask 0.
#[test]
fn the_plugin_socket_is_private_under_any_umask() {
    use std::os::unix::fs::PermissionsExt;
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"umask 000; exec "$0" --kubelet-dir "$1""#)
            .arg(binary(env!("CARGO_BIN_EXE_accel-device-plugin")))
            .arg(kubelet.dir())
            .env(
                "ACCEL_CONTAINER_RUNTIME_CONFIG",
                scratch.path().join("config.toml"),
            )
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        kubelet.wait_registrations(1).await;
        // Watched: the plugin has its answer to the registration (and logged it).
        kubelet.updates.recv().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let reg = kubelet.registrations.lock().unwrap()[0].clone();
        let mode = std::fs::metadata(kubelet.dir().join(&reg.endpoint))
            .unwrap()
            .permissions()
            .mode();
        child.kill().unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
        // Profiles whose driver is not installed here (nvidia, and every file profile) are
        // no reason for a line at each start (issue 22, 10).
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(!log.contains("cannot watch"), "{log}");
        assert!(log.contains("enflame.com/gcu: registered"), "{log}");
    });
}

/// Unary calls on one connection as a kubelet before 1.26 makes them: gRPC-go's default
/// `:authority`, the socket path, indexed into the HPACK table by the first request
/// (literal with incremental indexing, static name 1) and named by index (62) in the others.
/// tonic's and hyper's clients refuse such an authority, so the frames are written here.
/// Returns each call's grpc-status and message.
async fn old_kubelet_calls(sock: &Path, calls: &[(&str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }
    fn lit(b: &[u8]) -> Vec<u8> {
        let mut v = loona_hpack::encoder::encode_integer(b.len(), 7);
        v.extend_from_slice(b);
        v
    }
    let (settings, headers, data, end_stream, end_headers) = (0x4, 0x1, 0x0, 0x1, 0x4);
    let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(settings, 0, 0, &[]));
    for (i, (path, msg)) in calls.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        if i == 0 {
            block.push(0x41);
            block.extend(lit(sock.as_os_str().as_bytes()));
        } else {
            block.push(0xbe);
        }
        block.push(0x04); // :path, literal without indexing
        block.extend(lit(path.as_bytes()));
        block.extend([0x0f, 0x10]); // content-type (static 31), literal without indexing
        block.extend(lit(b"application/grpc"));
        block.push(0x00);
        block.extend(lit(b"te"));
        block.extend(lit(b"trailers"));
        out.extend(frame(headers, end_headers, stream, &block));
        let mut body = vec![0];
        body.extend((msg.len() as u32).to_be_bytes());
        body.extend(msg);
        out.extend(frame(data, end_stream, stream, &body));
    }
    s.write_all(&out).await.unwrap();

    let mut dec = loona_hpack::Decoder::new();
    let mut answers = vec![(String::new(), Vec::new()); calls.len()];
    let mut ended = 0;
    let read = async {
        while ended < calls.len() {
            let mut head = [0u8; 9];
            s.read_exact(&mut head).await.unwrap();
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0; len];
            s.read_exact(&mut payload).await.unwrap();
            let call = (stream as usize).saturating_sub(1) / 2;
            match kind {
                0x4 if flags & 0x1 == 0 => {
                    s.write_all(&frame(settings, 0x1, 0, &[])).await.unwrap()
                }
                0x3 => panic!("stream {stream} reset: {payload:?}"),
                0x7 => panic!("GOAWAY: {}", String::from_utf8_lossy(&payload)),
                0x1 => {
                    assert_eq!(flags & end_headers, end_headers, "one-frame header blocks");
                    for (n, v) in dec.decode(&payload).unwrap() {
                        if n == b"grpc-status" {
                            answers[call].0 = String::from_utf8(v).unwrap();
                        }
                    }
                }
                0x0 => answers[call].1.extend(payload),
                _ => {}
            }
            if (kind == headers || kind == data) && flags & end_stream != 0 {
                ended += 1;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("answers within 10 s");
    for (_, msg) in &mut answers {
        assert!(msg.len() >= 5, "a gRPC message: {msg:?}");
        msg.drain(..5);
    }
    answers
}

/// The device names the plugin's CDI spec lists, and the spec file's inode (a rewrite is a
/// rename onto it, so a new inode).
fn cdi_spec(path: &Path) -> (Vec<String>, u64) {
    use std::os::unix::fs::MetadataExt;
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let names = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    (names, std::fs::metadata(path).unwrap().ino())
}

/// Waits until the CDI spec lists device `name` (or no longer does).
async fn wait_cdi(path: &Path, name: &str, listed: bool) -> (Vec<String>, u64) {
    let t = Instant::now();
    loop {
        let (names, ino) = cdi_spec(path);
        if names.iter().any(|n| n == name) == listed {
            return (names, ino);
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "CDI spec: {name} listed {listed}: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A device node deleted, recreated, and a new device appearing: each change is pushed on
/// ListAndWatch and rewrites the plugin's CDI spec, which is left alone while nothing changes.
#[test]
fn device_changes_rewrite_the_cdi_spec_and_are_pushed() {
    let (sim, major) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.strategies = vec![Strategy::CdiCri];
        opts.cdi_dir = scratch.path().join("cdi");
        opts.poll = Duration::from_millis(100);
        let plugin = Plugin::enflame(cfg, opts);
        kubelet.wait_registrations(1).await;
        let first = kubelet.updates.recv().await.unwrap();
        assert_eq!(first.devices.len(), 8);
        let spec = scratch.path().join("cdi/accel-enflame.json");
        let (names, ino) = cdi_spec(&spec);
        assert!(names.contains(&"3".to_string()), "{names:?}");

        // Nothing changes over several polls: the spec is not rewritten.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(cdi_spec(&spec).1, ino, "rewritten with nothing changed");

        // A node deleted: Unhealthy, and gone from the spec (a container naming it would
        // get a clear CDI error rather than a missing node).
        let node = sim.path().join("dev/gcu3");
        std::fs::remove_file(&node).unwrap();
        kubelet
            .wait_health("GCU-3", UNHEALTHY, Duration::from_secs(1))
            .await;
        let (_, ino_gone) = wait_cdi(&spec, "3", false).await;
        assert_ne!(ino_gone, ino);

        // Recreated: Healthy, and back in the spec.
        mknod(&node, major, 3, 0o666);
        kubelet
            .wait_health("GCU-3", HEALTHY, Duration::from_secs(1))
            .await;
        wait_cdi(&spec, "3", true).await;

        // A device appears (no sysfs: no topology): pushed with the others, in the spec
        // before kubelet hears of it, and Allocate answers for it.
        mknod(&sim.path().join("dev/gcu8"), major, 8, 0o666);
        let t = Instant::now();
        let update = loop {
            let m = tokio::time::timeout(Duration::from_secs(1), kubelet.updates.recv())
                .await
                .expect("GCU-8 pushed within a second")
                .unwrap();
            if m.devices.iter().any(|d| d.id == "GCU-8") {
                break m;
            }
        };
        eprintln!("GCU-8 pushed after {:?}", t.elapsed());
        let (names, ino) = cdi_spec(&spec);
        assert!(names.contains(&"8".to_string()), "{names:?}");
        assert_eq!(update.devices.len(), 9);
        let new = update.devices.iter().find(|d| d.id == "GCU-8").unwrap();
        assert_eq!(
            (new.health.as_str(), new.topology.as_ref()),
            (HEALTHY, None)
        );
        let reg = kubelet.registrations.lock().unwrap()[0].clone();
        let ch = grpc::connect(&kubelet.dir().join(&reg.endpoint), "localhost")
            .await
            .unwrap();
        let a = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&["GCU-8"]),
                }],
            },
        )
        .await
        .unwrap();
        assert_eq!(
            a.container_responses[0].cdi_devices[0].name,
            "enflame.com/gcu=8"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(cdi_spec(&spec).1, ino, "rewritten with nothing changed");

        plugin.stop().await;
    });
}

/// A profile with no device at start (a driver still loading) is served and registered once
/// its first device appears, not before.
#[test]
fn a_profile_registers_when_its_first_device_appears() {
    let (sim, major) = enflame_host();
    for n in 0..8 {
        std::fs::remove_file(sim.path().join(format!("dev/gcu{n}"))).unwrap();
    }
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let mut opts = kubelet.plugin_options();
        opts.poll = Duration::from_millis(100);
        let plugin = Plugin::enflame(cfg, opts);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(kubelet.count(), 0, "registered with no device");
        assert!(!kubelet.dir().join("accel-enflame-com-gcu.sock").exists());

        mknod(&sim.path().join("dev/gcu5"), major, 5, 0o666);
        kubelet.wait_registrations(1).await;
        let first = kubelet.updates.recv().await.unwrap();
        let got: Vec<(&str, &str)> = first
            .devices
            .iter()
            .map(|d| (d.id.as_str(), d.health.as_str()))
            .collect();
        assert_eq!(got, [("GCU-5", HEALTHY)]);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(kubelet.count(), 1);

        plugin.stop().await;
    });
}

async fn futures_join<T: Send + 'static>(
    futs: Vec<impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[test]
fn missing_kubelet_dir_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("device-plugins");
    let err = rt()
        .block_on(server::run(
            Vec::new(),
            Options::new(missing.clone()),
            watch::channel(false).1,
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
}

/// Each strategy's answer for GCU-1 and GCU-3, put into a bundle as containerd would and run
/// through our runtime and real runc: the container sees exactly gcu1, gcu3 and gcuctl.
#[test]
fn allocate_answers_give_exactly_those_devices_through_runtime_and_runc() {
    use common::{assert_enflame_1_3, Bundle, Probe, Report, Runc};
    let sim = SimRoot::standard();
    for (strategy, extra) in common::kubelet::STRATEGIES {
        let cdi_dir = tempfile::tempdir().unwrap();
        let extra = format!("{extra}\ncdi-spec-dirs = [{:?}]", cdi_dir.path());
        let runc = Runc::with_config(&sim, &extra);
        let cfg = Config::load(&runc.config_path()).unwrap();
        let profile = cfg
            .profiles
            .into_iter()
            .find(|p| p.name == "enflame")
            .unwrap();
        // The plugin's own CDI spec, as it writes it at start.
        let mut opts = Options::new(PathBuf::from("/nonexistent"));
        opts.cdi_dir = cdi_dir.path().to_path_buf();
        server::write_cdi(&profile, &opts).unwrap();
        let plugin = service::Plugin::new(profile, vec![strategy]).unwrap();
        let answer = plugin
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&["GCU-3", "GCU-1"]),
                }],
            })
            .unwrap()
            .container_responses
            .remove(0);
        let mut b = Bundle::busybox();
        apply_answer(&mut b, &answer);
        let probe = Probe::new()
            .ls("/dev")
            .open("/dev/gcu1")
            .open("/dev/gcu3")
            .open("/dev/gcuctl")
            .open("/dev/gcu0");
        b.sh(&probe.script());
        let id = runc.id(&format!("dp-{}", strategy.as_str()));
        let out = runc.run(&b, &id);
        out.ok();
        let r = Report::parse(&out.stdout);
        assert_enflame_1_3(&r, &format!("{strategy:?}: "));
    }
}

/// `accel-device-plugin` as its DaemonSet runs it: `--kubelet-dir` and `--instance` given,
/// POD_UID unset, the config of `scratch`, its log kept in a file; killed on drop.
struct PluginProcess {
    child: std::process::Child,
    log: PathBuf,
}

impl PluginProcess {
    fn spawn(scratch: &Path, kubelet_dir: &Path, instance: &str) -> PluginProcess {
        Self::spawn_with(scratch, kubelet_dir, instance, &[])
    }

    /// [`PluginProcess::spawn`] with `args` added.
    fn spawn_with(
        scratch: &Path,
        kubelet_dir: &Path,
        instance: &str,
        args: &[&str],
    ) -> PluginProcess {
        let log = scratch.join(format!("plugin-{instance}.log"));
        let child = std::process::Command::new(binary(env!("CARGO_BIN_EXE_accel-device-plugin")))
            .arg("--kubelet-dir")
            .arg(kubelet_dir)
            .args(["--instance", instance])
            .args(args)
            .env(
                "ACCEL_CONTAINER_RUNTIME_CONFIG",
                scratch.join("config.toml"),
            )
            .env_remove("POD_UID")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        PluginProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        common::sh_ok(std::process::Command::new("kill").args([sig, &self.child.id().to_string()]));
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The endpoints kubelet was given, in order.
fn endpoints(kubelet: &Kubelet) -> Vec<String> {
    kubelet
        .registrations
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.endpoint.clone())
        .collect()
}

/// Registration `n` (0-based) within `limit`, with the logs of `plugins` when it does not come.
async fn wait_registration(
    kubelet: &Kubelet,
    n: usize,
    limit: Duration,
    plugins: &[&PluginProcess],
) {
    let t = Instant::now();
    while kubelet.count() <= n {
        if t.elapsed() > limit {
            let logs: Vec<String> = plugins.iter().map(|p| p.log()).collect();
            panic!(
                "no registration {} within {limit:?}; endpoints {:?}; logs:\n{}",
                n + 1,
                endpoints(kubelet),
                logs.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 42, item 1: a kubelet root a few characters longer than `/var/lib/kubelet` (k0s'
/// and other distributions') makes the plugin's socket path 100-107 bytes: it fits a socket
/// address (108 bytes with the NUL), but the socket was bound under `.<name>.<pid>.tmp`
/// beside it, which does not, and the plugin never served. Here the path is 107 bytes; an
/// instance name that does not fit is hashed; where no name fits, the plugin exits naming
/// the directory.
#[test]
fn a_plugin_socket_path_that_fits_bound_through_a_path_that_does_not() {
    use std::os::unix::ffi::OsStrExt;
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    let uid = "6b1f3c2e-0d4a-4c8e-9f7a-1a2b3c4d5e6f";
    let name = format!("accel-enflame-com-gcu@{uid}.sock");
    // kubelet's directory under a longer name: a link to the stand-in's.
    let links = tempfile::tempdir().unwrap();
    let name_len = name.len();
    let pad = |extra: usize| {
        let n = 107 - name_len - 1 - links.path().as_os_str().len() - 1 + extra;
        links.path().join("k".repeat(n))
    };
    rt().block_on(async move {
        let kubelet = Kubelet::started();
        let dir = pad(0);
        std::os::unix::fs::symlink(kubelet.dir(), &dir).unwrap();
        assert_eq!(dir.join(&name).as_os_str().len(), 107);
        let plugin = PluginProcess::spawn(scratch.path(), &dir, uid);
        wait_registration(&kubelet, 0, Duration::from_secs(10), &[&plugin]).await;
        assert_eq!(endpoints(&kubelet), [name.as_str()]);
        let ch = grpc::connect(&kubelet.dir().join(&name), "localhost")
            .await
            .unwrap();
        assert!(grpc::get_options(&ch).await.is_ok());
        drop(plugin);

        // 10 bytes longer: the instance does not fit, its hash does.
        let dir = pad(10);
        std::os::unix::fs::symlink(kubelet.dir(), &dir).unwrap();
        let plugin = PluginProcess::spawn(scratch.path(), &dir, uid);
        wait_registration(&kubelet, 1, Duration::from_secs(10), &[&plugin]).await;
        let hashed = endpoints(&kubelet)[1].clone();
        assert!(
            hashed.starts_with("accel-enflame-com-gcu@") && !hashed.contains(uid),
            "{hashed}"
        );
        assert!(dir.join(&hashed).as_os_str().len() <= 107);
        drop(plugin);

        // 50 bytes longer: no name fits; the plugin says which directory is too long.
        let dir = pad(50);
        std::os::unix::fs::symlink(kubelet.dir(), &dir).unwrap();
        let mut plugin = PluginProcess::spawn(scratch.path(), &dir, uid);
        let t = Instant::now();
        let status = loop {
            if let Some(s) = plugin.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "still running 10 s on with no socket name that fits:\n{}",
                plugin.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let log = plugin.log();
        assert!(!status.success(), "{log}");
        eprintln!("no name fits: {}", log.trim_end());
        let shown = String::from_utf8_lossy(dir.as_os_str().as_bytes()).into_owned();
        assert!(log.contains(&shown) && log.contains("too long"), "{log}");
        assert_eq!(kubelet.count(), 2, "{log}");
    });
}

/// Issue 42, item 10: the old instance of an upgrade stood aside for any newer instance's
/// socket file, also one a dead instance left (bound, its process gone), and the resource
/// went unserved for good. It stands aside only for a newer instance that answers, and
/// takes the resource back when that one stops answering (stopped: its socket still takes
/// connections, nothing answers on them). Both instances are the real binary.
#[test]
fn the_old_instance_stands_aside_only_for_a_newer_one_that_answers() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let old_name = "accel-enflame-com-gcu@0ld-pod-uid.sock";
        let new_name = "accel-enflame-com-gcu@new-pod-uid.sock";
        let old = PluginProcess::spawn(scratch.path(), kubelet.dir(), "0ld-pod-uid");
        wait_registration(&kubelet, 0, Duration::from_secs(10), &[&old]).await;
        kubelet.updates.recv().await.unwrap();

        // A newer instance's socket left by a process gone; kubelet ends the old one's stream.
        let stale = kubelet
            .dir()
            .join("accel-enflame-com-gcu@dead-pod-uid.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        drop(kubelet.drop_stream.lock().unwrap().take());
        wait_registration(&kubelet, 1, Duration::from_secs(10), &[&old]).await;
        assert_eq!(endpoints(&kubelet), [old_name, old_name]);

        // A live newer instance: it registers, and the old one stands aside.
        let new = PluginProcess::spawn(scratch.path(), kubelet.dir(), "new-pod-uid");
        wait_registration(&kubelet, 2, Duration::from_secs(10), &[&old, &new]).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            endpoints(&kubelet),
            [old_name, old_name, new_name],
            "{}",
            old.log()
        );

        // The newer one stops answering: the old one registers again.
        new.signal("-STOP");
        let t = Instant::now();
        wait_registration(&kubelet, 3, Duration::from_secs(10), &[&old]).await;
        eprintln!(
            "the old instance took over {:?} after the newer stopped",
            t.elapsed()
        );
        assert_eq!(endpoints(&kubelet)[3], old_name);
        // Gone for good, its socket left behind: the old one keeps the resource.
        new.signal("-KILL");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(kubelet.count(), 4, "{}", old.log());
        assert!(kubelet.dir().join(new_name).exists());
        let ch = grpc::connect(&kubelet.dir().join(old_name), "localhost")
            .await
            .unwrap();
        assert!(grpc::get_options(&ch).await.is_ok());
    });
}

/// The next ListAndWatch message that `pred` accepts, within `limit`, with the plugin's log
/// when none comes.
async fn next_update(
    kubelet: &mut Kubelet,
    plugin: &PluginProcess,
    what: &str,
    limit: Duration,
    pred: impl Fn(&ListAndWatchResponse) -> bool,
) -> (ListAndWatchResponse, Duration) {
    let t = Instant::now();
    loop {
        let left = limit.checked_sub(t.elapsed()).unwrap_or_default();
        match tokio::time::timeout(left, kubelet.updates.recv()).await {
            Ok(Some(m)) if pred(&m) => return (m, t.elapsed()),
            Ok(Some(_)) => {}
            _ => panic!("{what}: not within {limit:?}; log:\n{}", plugin.log()),
        }
    }
}

/// Each device's health in a ListAndWatch message, by ID.
fn health_of(m: &ListAndWatchResponse) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = m
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect();
    v.sort();
    v
}

/// Issue 41: the plugin's health comes from the health engine's sysfs signals, not only from
/// the nodes. Two GCUs with known PCI functions and old AER counts (no failure); GCU-1's
/// fatal count rises: Unhealthy within the health interval while GCU-2 stays Healthy,
/// Allocate refuses it naming why and a preferred allocation never picks it; GCU-2's
/// non-fatal count rises: said in the log, kept Healthy; GCU-1's function removed and brought
/// back with its counts at zero: Healthy again, not before the hold-down.
#[test]
fn a_device_whose_aer_fatal_count_rises_is_unhealthy_until_its_function_comes_back() {
    let (sim, _) = enflame_host();
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    // enflame_sysfs: GCU n is PCI function 0000:1n:00.0.
    let function = |n: u32| common::health::gcu_function(sim.path(), n);
    let aer = |dir: &Path, fatal: u64, nonfatal: u64| {
        common::health::aer_fatal(dir, fatal);
        common::health::aer_nonfatal(dir, nonfatal);
    };
    let (one, two) = (function(1), function(2));
    aer(&one, 3, 0);
    aer(&two, 3, 0);
    const HOLD_DOWN: Duration = Duration::from_secs(2);
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let plugin = PluginProcess::spawn_with(
            scratch.path(),
            kubelet.dir(),
            "health",
            &[
                "--poll-seconds=0.1",
                "--health-interval-seconds=0.2",
                "--health-hold-down-seconds=2",
            ],
        );
        wait_registration(&kubelet, 0, Duration::from_secs(10), &[&plugin]).await;
        let first = kubelet.updates.recv().await.unwrap();
        assert_eq!(first.devices.len(), 8);
        assert!(
            first.devices.iter().all(|d| d.health == HEALTHY),
            "old counts are no failure: {:?}",
            health_of(&first)
        );

        aer(&one, 4, 0);
        let (m, took) = next_update(
            &mut kubelet,
            &plugin,
            "GCU-1 Unhealthy",
            Duration::from_secs(2),
            |m| {
                m.devices
                    .iter()
                    .any(|d| d.id == "GCU-1" && d.health == UNHEALTHY)
            },
        )
        .await;
        eprintln!("GCU-1 Unhealthy after {took:?}");
        let sick: Vec<String> = health_of(&m)
            .into_iter()
            .filter(|(_, h)| h != HEALTHY)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(sick, ["GCU-1"], "the other devices stay Healthy");

        let ch = grpc::connect(
            &kubelet.dir().join("accel-enflame-com-gcu@health.sock"),
            "localhost",
        )
        .await
        .unwrap();
        let e = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&["GCU-1"]),
                }],
            },
        )
        .await
        .unwrap_err();
        assert_eq!(
            e.message(),
            "[\"GCU-1\"] device \"GCU-1\" is unhealthy (1 fatal PCIe (AER) error(s) on \
             0000:11:00.0 since it was first read); not allocated"
        );
        // GCU-0 and GCU-1 share a switch: the pair a preferred choice of two would take.
        let p = grpc::get_preferred(
            &ch,
            PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_ids: ids(&["GCU-0", "GCU-1", "GCU-2", "GCU-3"]),
                    must_include_device_ids: Vec::new(),
                    allocation_size: 3,
                }],
            },
        )
        .await
        .unwrap();
        let mut got = p.container_responses[0].device_ids.clone();
        got.sort();
        assert_eq!(got, ["GCU-0", "GCU-2", "GCU-3"]);

        // Non-fatal errors on GCU-2: said, kept Healthy.
        aer(&two, 3, 5);
        let t = Instant::now();
        while !plugin.log().contains("has 5 non-fatal PCIe (AER) error(s)") {
            assert!(t.elapsed() < Duration::from_secs(2), "{}", plugin.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while let Ok(m) = kubelet.updates.try_recv() {
            assert!(
                m.devices
                    .iter()
                    .all(|d| d.id != "GCU-2" || d.health == HEALTHY),
                "{:?}",
                health_of(&m)
            );
        }

        // The function removed (a reset, a hot unplug): still Unhealthy, for that reason.
        let parked = scratch.path().join("parked-function");
        std::fs::rename(&one, &parked).unwrap();
        let t = Instant::now();
        while !plugin.log().contains("0000:11:00.0 is gone from sysfs") {
            assert!(t.elapsed() < Duration::from_secs(2), "{}", plugin.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Back, its counts at zero: Healthy once clear for the hold-down, not before.
        aer(&parked, 0, 0);
        std::fs::rename(&parked, &one).unwrap();
        let (m, took) = next_update(
            &mut kubelet,
            &plugin,
            "GCU-1 Healthy again",
            Duration::from_secs(6),
            |m| {
                m.devices
                    .iter()
                    .any(|d| d.id == "GCU-1" && d.health == HEALTHY)
            },
        )
        .await;
        eprintln!("GCU-1 Healthy again after {took:?}");
        assert!(took >= HOLD_DOWN - Duration::from_millis(100), "{took:?}");
        assert!(m.devices.iter().all(|d| d.health == HEALTHY));
        let log = plugin.log();
        assert_eq!(log.matches("is unhealthy: ").count(), 1, "{log}");
        assert_eq!(log.matches("is healthy again").count(), 1, "{log}");
        assert!(
            log.contains("has its PCI function 0000:11:00.0 back"),
            "{log}"
        );
        grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&["GCU-1"]),
                }],
            },
        )
        .await
        .unwrap();
    });
}

/// Issue 41: NVIDIA's signals through NVML (a stand-in library driven by a control file). An
/// application XID (13) on GPU 0 is logged and ignored; a critical one (79) makes it Unhealthy
/// within the interval, named by Allocate's refusal, the other GPU Healthy; NVML losing it and
/// reaching it again (a reset) brings it back Healthy after the hold-down, and not before.
#[test]
fn an_nvidia_gpu_with_a_critical_xid_is_unhealthy_until_it_is_reset() {
    let sim = SimRoot::builder()
        .nvidia(&[("0000:3b:00.0", 0), ("0000:af:00.0", 1)])
        .build();
    let control = common::nvml::stand_in(&sim, &[]);
    let scratch = tempfile::tempdir().unwrap();
    config(&sim, scratch.path(), "");
    let (zero, one) = (sim.gpus()[0].uuid.clone(), sim.gpus()[1].uuid.clone());
    const HOLD_DOWN: Duration = Duration::from_secs(1);
    rt().block_on(async move {
        let mut kubelet = Kubelet::started();
        let plugin = PluginProcess::spawn_with(
            scratch.path(),
            kubelet.dir(),
            "nvml",
            &[
                "--poll-seconds=0.1",
                "--health-interval-seconds=0.2",
                "--health-hold-down-seconds=1",
            ],
        );
        wait_registration(&kubelet, 0, Duration::from_secs(10), &[&plugin]).await;
        let first = kubelet.updates.recv().await.unwrap();
        assert_eq!(first.devices.len(), 2, "{:?}", health_of(&first));
        assert!(first.devices.iter().all(|d| d.health == HEALTHY));
        let sick = |m: &ListAndWatchResponse, id: &str| {
            m.devices
                .iter()
                .any(|d| d.id == id && d.health == UNHEALTHY)
        };

        common::nvml::write_control(&control, "xid 0 13 1\n");
        let t = Instant::now();
        while !plugin.log().contains("XID 13, an application error") {
            assert!(t.elapsed() < Duration::from_secs(3), "{}", plugin.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        while let Ok(m) = kubelet.updates.try_recv() {
            assert!(
                !sick(&m, &zero),
                "XID 13 is no GPU failure: {:?}",
                health_of(&m)
            );
        }

        common::nvml::write_control(&control, "xid 0 13 1\nxid 0 79 2\n");
        let (m, took) = next_update(
            &mut kubelet,
            &plugin,
            "GPU 0 Unhealthy on XID 79",
            Duration::from_secs(2),
            |m| sick(m, &zero),
        )
        .await;
        eprintln!("GPU 0 Unhealthy after {took:?}");
        assert!(!sick(&m, &one), "{:?}", health_of(&m));
        let ch = grpc::connect(
            &kubelet.dir().join("accel-nvidia-com-gpu@nvml.sock"),
            "localhost",
        )
        .await
        .unwrap();
        let e = grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&[zero.as_str()]),
                }],
            },
        )
        .await
        .unwrap_err();
        assert!(
            e.message()
                .contains("is unhealthy (XID 79 on GPU 0000:3b:00.0)"),
            "{}",
            e.message()
        );

        // A reset: NVML loses the GPU, then reaches it again.
        common::nvml::write_control(&control, "xid 0 13 1\nxid 0 79 2\nlost 0\n");
        let t = Instant::now();
        while !plugin.log().contains("NVML_ERROR_GPU_IS_LOST") {
            assert!(t.elapsed() < Duration::from_secs(3), "{}", plugin.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while kubelet.updates.try_recv().is_ok() {}
        common::nvml::write_control(&control, "xid 0 13 1\nxid 0 79 2\n");
        let (m, took) = next_update(
            &mut kubelet,
            &plugin,
            "GPU 0 Healthy after its reset",
            Duration::from_secs(4),
            |m| !sick(m, &zero),
        )
        .await;
        eprintln!("GPU 0 Healthy again after {took:?}");
        assert!(took >= HOLD_DOWN - Duration::from_millis(100), "{took:?}");
        assert!(m.devices.iter().all(|d| d.health == HEALTHY));
        let log = plugin.log();
        assert!(
            log.contains("GPU 0000:3b:00.0 answers NVML again (reset)"),
            "{log}"
        );
        assert_eq!(log.matches("is healthy again").count(), 1, "{log}");
        assert!(!log.contains("0000:af:00.0 is"), "{log}");
        grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&[zero.as_str()]),
                }],
            },
        )
        .await
        .unwrap();
    });
}
