//! The stand-in kubelet's side of DRA (tests/dra.rs, tests/e2e_cri.rs): the driver's library
//! code run as a task against the stand-in API server (`apiserver.rs`), registered as kubelet
//! registers it (GetInfo, NotifyRegistrationStatus, then a channel to the endpoint it was
//! given), and NodePrepareResources / NodeUnprepareResources as kubelet calls them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use accel_container_runtime::config::Config;
use accel_container_runtime::dra::server::{self, Options};
use accel_container_runtime::kubelet::proto::dra::*;
use accel_container_runtime::kubelet::proto::registration::{PluginInfo, RegistrationStatus};
use serde_json::Value;
use tokio::sync::watch;

use super::apiserver::ApiServer;
use super::grpc::{self, connect, UNPREPARE_V1};

/// The enflame profile's driver name (its `cdi-kind`, turned around).
pub const DRIVER: &str = "gcu.enflame.com";
pub const NODE: &str = "node-a";

/// A driver run: its dirs, and a way to stop it.
pub struct Driver {
    pub dir: tempfile::TempDir,
    cdi_dir: PathBuf,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), server::DraError>>,
}

/// Every directory of the driver under `dir` (kubelet's registry and plugins dirs, the CDI
/// dir, the claim records), polling the devices every `poll`.
pub fn options(dir: &Path, poll: Duration) -> Options {
    let mut o = Options::new(NODE.into());
    o.registry_dir = dir.join("plugins_registry");
    o.plugins_dir = dir.join("plugins");
    o.cdi_dir = dir.join("cdi");
    o.state_dir = dir.join("state");
    // Never the host's: a test puts a simulated dmem.capacity under `cgroup`.
    o.cgroup_root = dir.join("cgroup");
    o.dmem_grants_dir = dir.join("dmem");
    o.poll = poll;
    o
}

impl Driver {
    /// `cfg`'s profiles served with [`options`] under `dir`.
    pub fn start(cfg: &Config, api: &ApiServer, dir: tempfile::TempDir, poll: Duration) -> Driver {
        let opts = options(dir.path(), poll);
        Driver::start_with(cfg, api, dir, opts)
    }

    /// `cfg`'s profiles served in a fresh dir, polling every 100 ms, with the health engine's
    /// fast settings ([`super::health::fast`]): for tests that break a device and watch it
    /// tainted.
    pub fn watching_health(cfg: &Config, api: &ApiServer) -> Driver {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), Duration::from_millis(100));
        opts.health = super::health::fast();
        Driver::start_with(cfg, api, dir, opts)
    }

    /// `cfg`'s profiles served with `opts` (whose own dirs should be under `dir`, except where
    /// a test points one at the node's, as the CDI dir a container engine reads).
    pub fn start_with(
        cfg: &Config,
        api: &ApiServer,
        dir: tempfile::TempDir,
        opts: Options,
    ) -> Driver {
        let (stop, rx) = watch::channel(false);
        let cdi_dir = opts.cdi_dir.clone();
        let task = tokio::spawn(server::run(cfg.profiles.clone(), api.client(), opts, rx));
        Driver {
            dir,
            cdi_dir,
            stop,
            task,
        }
    }

    /// `cfg`'s profiles served in a fresh dir, once the driver has published and kubelet
    /// has registered it: the DRA channel kubelet calls.
    pub async fn serving(
        cfg: &Config,
        api: &ApiServer,
        poll: Duration,
    ) -> (Driver, tonic::transport::Channel) {
        let drv = Driver::start(cfg, api, tempfile::tempdir().unwrap(), poll);
        wait_slices(api, "publish", |s| !s.is_empty()).await;
        let (_, ch) = register(&drv.reg_socket()).await;
        (drv, ch)
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.cdi_dir.clone()
    }

    /// Where the claim `uid`'s CDI spec is written.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(format!("k8s.{DRIVER}-claim_{uid}.json"))
    }

    pub fn reg_socket(&self) -> PathBuf {
        self.dir
            .path()
            .join(format!("plugins_registry/{DRIVER}-reg.sock"))
    }

    /// Stops it; panics unless it ends without an error. Its dirs are handed back.
    pub async fn stop(self) -> tempfile::TempDir {
        self.stop.send(true).unwrap();
        self.task.await.unwrap().unwrap();
        self.dir
    }
}

/// What kubelet does on seeing `<driver>-reg.sock`: GetInfo, NotifyRegistrationStatus, then
/// a channel to the DRA endpoint it was given.
pub async fn register(reg: &Path) -> (PluginInfo, tonic::transport::Channel) {
    let start = Instant::now();
    while !reg.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no {}",
            reg.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ch = connect(reg, "localhost").await.unwrap();
    let info = grpc::get_info(&ch).await.unwrap();
    grpc::notify(
        &ch,
        RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        },
    )
    .await
    .unwrap();
    let dra = connect(Path::new(&info.endpoint), "localhost")
        .await
        .unwrap();
    (info, dra)
}

/// The driver's slices once `ok` holds of them (20 s at most).
pub async fn wait_slices(api: &ApiServer, what: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let s = api.slices_of(DRIVER);
        if ok(&s) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: slices now {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn claim(ns: &str, name: &str, uid: &str) -> Claim {
    Claim {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

pub async fn prepare(
    ch: &tonic::transport::Channel,
    path: &'static str,
    claims: Vec<Claim>,
) -> NodePrepareResourcesResponse {
    grpc::prepare(ch, path, NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
}

pub async fn unprepare(
    ch: &tonic::transport::Channel,
    claims: Vec<Claim>,
) -> NodeUnprepareResourcesResponse {
    grpc::unprepare(ch, UNPREPARE_V1, NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
}

/// The CDI device IDs of one claim's answer, in the order the driver gave them.
pub fn cdi_ids(got: &NodePrepareResourceResponse) -> Vec<String> {
    got.devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

/// JSON as CEL sees an object's fields: integers as `int` (serde_json's arbitrary precision,
/// which this crate turns on, would otherwise hand CEL its private number map). For the
/// admission policies' CEL (tests/dra.rs, tests/sharing.rs).
pub fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => n
            .as_i64()
            .map(cel::Value::Int)
            .unwrap_or_else(|| cel::Value::Float(n.as_f64().unwrap())),
        Value::String(s) => s.clone().into(),
        Value::Array(a) => a.iter().map(to_cel).collect::<Vec<_>>().into(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| (k.clone(), to_cel(v)))
            .collect::<std::collections::HashMap<String, cel::Value>>()
            .into(),
    }
}
