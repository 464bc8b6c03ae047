//! The stand-in kubelet of the device-plugin tests: a `v1beta1.Registration` server on a temp
//! `kubelet.sock` that records registrations, dials each registered endpoint and watches it as
//! kubelet does, and can be restarted the way kubelet restarts. Also the simulated Enflame
//! host with the bridge chains of Enflame's PCIe-switch example.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::grpc;
use accel_container_runtime::config::Config;
use accel_container_runtime::kubelet::proto::deviceplugin::*;
use accel_container_runtime::plugin::allocate::Strategy;
use accel_container_runtime::plugin::server::{self, Options};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;

/// Enflame's guide: gcu0,gcu1 under one switch, gcu2 and gcu3 alone under their root ports,
/// gcu4,gcu5 under another switch, gcu6 and gcu7 alone; gcu0-3 on socket 0, gcu4-7 on 1.
pub fn enflame_sysfs(root: &Path, major: u32) {
    let chains: [(&[&str], u32); 8] = [
        (
            &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0"],
            0,
        ),
        (
            &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:10.0"],
            0,
        ),
        (&["pci0000:00", "0000:00:02.0"], 0),
        (&["pci0000:00", "0000:00:03.0"], 0),
        (
            &["pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82:08.0"],
            1,
        ),
        (
            &["pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82:10.0"],
            1,
        ),
        (&["pci0000:80", "0000:80:02.0"], 1),
        (&["pci0000:80", "0000:80:03.0"], 1),
    ];
    std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
    std::fs::create_dir_all(root.join("sys/dev/char")).unwrap();
    for (n, (chain, numa)) in chains.iter().enumerate() {
        let bdf = format!("0000:{:02x}:00.0", 0x10 + n);
        let rel: PathBuf = chain.iter().collect::<PathBuf>().join(&bdf);
        let real = root.join("sys/devices").join(&rel);
        std::fs::create_dir_all(real.join(format!("enflame/gcu{n}"))).unwrap();
        std::fs::write(real.join("numa_node"), format!("{numa}\n")).unwrap();
        symlink(
            Path::new("../../../devices").join(&rel),
            root.join("sys/bus/pci/devices").join(&bdf),
        )
        .unwrap();
        symlink(
            Path::new("../../devices")
                .join(&rel)
                .join(format!("enflame/gcu{n}")),
            root.join(format!("sys/dev/char/{major}:{n}")),
        )
        .unwrap();
    }
}

pub struct Kubelet {
    dir: tempfile::TempDir,
    pub registrations: Arc<Mutex<Vec<RegisterRequest>>>,
    /// Every ListAndWatch message the stand-in received, in order.
    pub updates: mpsc::UnboundedReceiver<ListAndWatchResponse>,
    updates_tx: mpsc::UnboundedSender<ListAndWatchResponse>,
    /// The stand-in's current server: aborted, and its `alive` flag cleared, when kubelet
    /// "dies" (a real kubelet's death closes its listener and every connection at once; a
    /// graceful shutdown would still serve a registration already on its way).
    server: Option<(tokio::task::JoinHandle<()>, Arc<AtomicBool>)>,
    /// Dropping this ends the stand-in's current ListAndWatch stream.
    pub drop_stream: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
    /// The other streams' (several plugins registered: each keeps its stream, as with
    /// kubelet); dropped at a restart.
    older_streams: Arc<Mutex<Vec<tokio::sync::oneshot::Sender<()>>>>,
    /// Per resource, what ends its endpoint's stream: a new registration of the resource
    /// replaces the endpoint, and kubelet stops the old one (devicemanager's endpoints map).
    endpoints: Arc<Mutex<std::collections::HashMap<String, tokio::sync::oneshot::Sender<()>>>>,
    /// When each registration arrived, in order.
    pub registered_at: Arc<Mutex<Vec<Instant>>>,
    /// When `kubelet.sock` was last created.
    pub socket_at: Option<Instant>,
}

impl Kubelet {
    pub fn new() -> Kubelet {
        let (tx, rx) = mpsc::unbounded_channel();
        Kubelet {
            dir: tempfile::tempdir().unwrap(),
            registrations: Arc::default(),
            updates: rx,
            updates_tx: tx,
            server: None,
            drop_stream: Arc::default(),
            older_streams: Arc::default(),
            endpoints: Arc::default(),
            registered_at: Arc::default(),
            socket_at: None,
        }
    }

    /// A new stand-in kubelet, serving Registration (see [`Kubelet::start`]).
    pub fn started() -> Kubelet {
        let mut k = Kubelet::new();
        k.start();
        k
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The plugin's options, its kubelet dir this kubelet's.
    pub fn plugin_options(&self) -> Options {
        Options::new(self.dir().to_path_buf())
    }

    /// Serves Registration on `kubelet.sock`; each registration dials the endpoint and
    /// watches it, as kubelet does.
    pub fn start(&mut self) {
        let sock = self.dir().join(KUBELET_SOCKET);
        let _ = std::fs::remove_file(&sock);
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        self.socket_at = Some(Instant::now());
        let regs = Arc::clone(&self.registrations);
        let times = Arc::clone(&self.registered_at);
        let dir = self.dir().to_path_buf();
        let tx = self.updates_tx.clone();
        let drop_stream = Arc::clone(&self.drop_stream);
        let older = Arc::clone(&self.older_streams);
        let endpoints = Arc::clone(&self.endpoints);
        let alive = Arc::new(AtomicBool::new(true));
        let serving = Arc::clone(&alive);
        let svc = grpc::registration_server(move |r: RegisterRequest| {
            if !serving.load(Ordering::SeqCst) {
                return Err(tonic::Status::unavailable("kubelet is gone"));
            }
            times.lock().unwrap().push(Instant::now());
            regs.lock().unwrap().push(r.clone());
            let (dir, tx, drop_stream) = (dir.clone(), tx.clone(), Arc::clone(&drop_stream));
            let older = Arc::clone(&older);
            let (replaced_tx, mut replaced) = tokio::sync::oneshot::channel::<()>();
            // The resource's previous endpoint is stopped: its stream ends.
            drop(
                endpoints
                    .lock()
                    .unwrap()
                    .insert(r.resource_name.clone(), replaced_tx),
            );
            tokio::spawn(async move {
                // A plugin gone since it registered: kubelet logs it and moves on.
                let Ok(ch) = grpc::connect(&dir.join(&r.endpoint), "localhost").await else {
                    return;
                };
                let Ok(mut stream) = grpc::list_and_watch(&ch).await else {
                    return;
                };
                let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel();
                if let Some(old) = drop_stream.lock().unwrap().replace(stop_tx) {
                    older.lock().unwrap().push(old);
                }
                loop {
                    tokio::select! {
                        m = stream.next() => match m {
                            Some(Ok(m)) => { let _ = tx.send(m); }
                            _ => break,
                        },
                        _ = &mut stop_rx => break,
                        _ = &mut replaced => break,
                    }
                }
            });
            Ok(())
        });
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
                .unwrap();
        });
        self.server = Some((task, alive));
    }

    /// A kubelet restart as kubelet makes one: the process ends (its registration server
    /// stops, the ListAndWatch stream ends, `kubelet.sock` is left behind), and `down` later
    /// the new kubelet empties its directory (the plugins' sockets and the stale
    /// `kubelet.sock`) and listens on a new `kubelet.sock`.
    pub async fn restart(&mut self, down: Duration) {
        self.die().await;
        drop(self.drop_stream.lock().unwrap().take());
        self.older_streams.lock().unwrap().clear();
        self.endpoints.lock().unwrap().clear();
        tokio::time::sleep(down).await;
        for e in std::fs::read_dir(self.dir()).unwrap() {
            // A plugin's socket may be renamed or removed meanwhile.
            let _ = std::fs::remove_file(e.unwrap().path());
        }
        self.start();
    }

    /// The registration server stops at once: its listener closed, a registration already
    /// accepted refused. `kubelet.sock` is left behind, as a killed kubelet leaves it.
    pub async fn die(&mut self) {
        if let Some((task, alive)) = self.server.take() {
            alive.store(false, Ordering::SeqCst);
            task.abort();
            let _ = task.await;
        }
    }

    /// How long the registration `n` (0-based) came after `kubelet.sock` was last created.
    pub fn latency(&self, n: usize) -> Duration {
        let at = self.registered_at.lock().unwrap()[n];
        at.saturating_duration_since(self.socket_at.unwrap())
    }

    pub fn count(&self) -> usize {
        self.registrations.lock().unwrap().len()
    }

    pub async fn wait_registrations(&self, n: usize) {
        let t = Instant::now();
        while self.count() < n {
            assert!(t.elapsed() < Duration::from_secs(10), "no registration {n}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The next update whose device `id` has `health`, within `limit`.
    pub async fn wait_health(&mut self, id: &str, health: &str, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            let left = limit.checked_sub(t.elapsed()).unwrap_or_default();
            let m = tokio::time::timeout(left, self.updates.recv())
                .await
                .unwrap_or_else(|_| panic!("{id} not {health} within {limit:?}"))
                .unwrap();
            if m.devices.iter().any(|d| d.id == id && d.health == health) {
                return t.elapsed();
            }
        }
    }
}

/// `ids` in a different order each call, as kubelet sends them (Go's map iteration order);
/// the seed is returned so a failure can name it.
pub fn shuffled(ids: &[String], seed: u64) -> Vec<String> {
    let mut v = ids.to_vec();
    let mut x = seed | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// A seed that differs between runs and calls.
pub fn seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
}

/// The enflame and nvidia profiles pointed at `sim`, with `keys` added to the enflame one
/// (the file is written in `scratch`).
pub fn config(sim: &super::SimRoot, scratch: &Path, keys: &str) -> Config {
    let path = scratch.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "[profiles.nvidia]\ndriver-root = \"{0}\"\n[profiles.enflame]\ndriver-root = \"{0}\"\n{keys}\n",
            sim.path().display()
        ),
    )
    .unwrap();
    Config::load(&path).unwrap()
}

/// The seed's 8 GCUs with one driver library (the CDI generator refuses a driver without).
pub fn enflame_host() -> (super::SimRoot, u32) {
    let sim = super::SimRoot::builder()
        .enflame(8)
        .library(super::LIB_DIR, "libefml.so.1.2.3", "libefml.so.1")
        .build();
    let major = sim.enflame_major().unwrap();
    enflame_sysfs(sim.path(), major);
    (sim, major)
}

/// The plugin serving `cfg`'s enflame profile with `opts`, a task on the test's runtime.
pub struct Plugin {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), server::PluginError>>,
}

impl Plugin {
    pub fn enflame(cfg: Config, opts: Options) -> Plugin {
        let (stop, stop_rx) = watch::channel(false);
        let profiles = cfg
            .profiles
            .into_iter()
            .filter(|p| p.name == "enflame")
            .collect();
        Plugin {
            stop,
            task: tokio::spawn(server::run(profiles, opts, stop_rx)),
        }
    }

    /// Asks it to stop; panics unless it ends without an error.
    pub async fn stop(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Every Allocate strategy, with the runtime config that takes its answer as kubelet hands it
/// over: the volume-mounts answer is device-list mounts, accepted only with
/// `accept-container-devices-as-mounts`; with it and with device-specs the variable of an
/// unprivileged container is not taken (`accept-envvar-unprivileged = false`).
pub const STRATEGIES: [(Strategy, &str); 5] = [
    (Strategy::Envvar, ""),
    (
        Strategy::VolumeMounts,
        "accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true",
    ),
    (Strategy::DeviceSpecs, "accept-envvar-unprivileged = false"),
    (Strategy::CdiCri, ""),
    (Strategy::CdiAnnotations, ""),
];

pub fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// What containerd does with one container's Allocate answer: envs into the process, mounts
/// as binds, device specs as nodes (major/minor from the host path) with cgroup rules,
/// annotations into the spec. CDI devices (`cdi_devices`), which containerd >= 1.7 resolves
/// from the CDI spec dirs itself, are handed here to our runtime's CDI resolver as a
/// `cdi.k8s.io/` annotation: the same spec file, the same edits.
pub fn apply_answer(b: &mut super::Bundle, a: &ContainerAllocateResponse) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    b.edit(|s| {
        let env = s["process"]["env"].as_array_mut().unwrap();
        let mut envs: Vec<_> = a.envs.iter().collect();
        envs.sort();
        for (k, v) in envs {
            env.push(format!("{k}={v}").into());
        }
        let mut annotations: Vec<(String, String)> = a
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !a.cdi_devices.is_empty() {
            let names: Vec<&str> = a.cdi_devices.iter().map(|c| c.name.as_str()).collect();
            annotations.push(("cdi.k8s.io/containerd-cri".into(), names.join(",")));
        }
        if !annotations.is_empty() {
            let obj = s
                .as_object_mut()
                .unwrap()
                .entry("annotations")
                .or_insert_with(|| serde_json::json!({}));
            for (k, v) in annotations {
                obj[k] = v.into();
            }
        }
        let mounts = s["mounts"].as_array_mut().unwrap();
        for m in &a.mounts {
            let mut opts = vec!["rbind"];
            if m.read_only {
                opts.push("ro");
            }
            mounts.push(serde_json::json!({
                "destination": m.container_path, "type": "bind",
                "source": m.host_path, "options": opts,
            }));
        }
        for d in &a.devices {
            let meta = std::fs::metadata(&d.host_path).unwrap();
            assert!(meta.file_type().is_char_device(), "{}", d.host_path);
            let (major, minor) = (
                nix::sys::stat::major(meta.rdev()),
                nix::sys::stat::minor(meta.rdev()),
            );
            let linux = s["linux"].as_object_mut().unwrap();
            let devices = linux
                .entry("devices")
                .or_insert_with(|| serde_json::json!([]));
            devices.as_array_mut().unwrap().push(serde_json::json!({
                "path": d.container_path, "type": "c", "major": major, "minor": minor,
                "fileMode": 0o666, "uid": 0, "gid": 0,
            }));
            let rules = linux
                .entry("resources")
                .or_insert_with(|| serde_json::json!({}))
                .as_object_mut()
                .unwrap()
                .entry("devices")
                .or_insert_with(|| serde_json::json!([]));
            rules.as_array_mut().unwrap().push(serde_json::json!({
                "allow": true, "type": "c", "major": major, "minor": minor, "access": d.permissions,
            }));
        }
    });
}
