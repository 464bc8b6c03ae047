//! The driver's run loop: per profile with devices on this node, a driver (name, claims,
//! device table), its DRA socket and then its registration socket in kubelet's plugin
//! registry, and every poll its devices discovered again, their health checked by the profile's
//! health engine ([`crate::health`]) and the pool republished when anything changed
//! (unhealthy devices tainted, and refused by prepare's decision).
//! Taints are what act on health (KEP-4680); kubelet's health service (`DRAResourceHealth`,
//! served on the DRA socket) gets every device's health at each check, which kubelet shows in
//! the pod's status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::health::Health;
use crate::kubelet::host_root::HostRoot;
use crate::kubelet::proto::dra::{
    self, Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::kubelet::proto::health::{
    self, DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
};
use crate::kubelet::proto::registration::registration_server::{Registration, RegistrationServer};
use crate::kubelet::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse, DRA_PLUGIN_TYPE,
    PLUGINS_DIR, PLUGINS_REGISTRY,
};
use crate::kubelet::sharing::Sharing;
use crate::kubelet::socket::{self, DirTooLong, Serving};
use crate::profile::Profile;

use super::claims::{ClaimRef, Claims, Prepared};
use super::publish::Publisher;
use super::slices::{self, Pool};
use super::table::{self, DraDevice};

/// The services this plugin serves, newest first: kubelet 1.34+ takes the first DRAPlugin it
/// knows, 1.32–1.33 take v1beta1; a kubelet with the health gate watches the first
/// DRAResourceHealth it knows. Unknown entries are skipped by every kubelet.
pub const SUPPORTED_VERSIONS: [&str; 5] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1beta1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
];

/// The health updates of a `NodeWatchResources` stream.
pub type HealthStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>,
>;

#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error("cannot listen on {}: {source}", path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Name(String),
    #[error(transparent)]
    SocketDir(#[from] DirTooLong),
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    #[error("cannot open the claim records in {}: {source}", path.display())]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct Options {
    /// This node's name: the pool's name and the slices' `nodeName`.
    pub node: String,
    /// kubelet's plugin registry (`<driver>-reg.sock` goes there).
    pub registry_dir: PathBuf,
    /// The plugins' directory (`<driver>/dra.sock`).
    pub plugins_dir: PathBuf,
    pub cdi_dir: PathBuf,
    /// Per-claim records, `<driver>/<uid>.json` under it.
    pub state_dir: PathBuf,
    pub library_dir: PathBuf,
    pub host_root: HostRoot,
    /// The host's cgroup v2 root as this process reaches it (under `host_root`): its
    /// `dmem.capacity` says which devices' shares reach `kernel` (src/dmem.rs).
    pub cgroup_root: PathBuf,
    /// Where each share's memory is kept by pod for the shim and the NRI plugin
    /// (config.toml's `dmem-grants-dir`).
    pub dmem_grants_dir: PathBuf,
    /// Devices and health are looked at this often.
    pub poll: Duration,
    /// How often the health engine reads each device's sysfs signals, and its hold-down.
    pub health: crate::health::Settings,
    /// The effect of an unhealthy device's taint, by severity (`--taint-no-execute`).
    pub taint_effects: super::taints::Effects,
    /// Driver names by profile name, where not derived from the profile.
    pub driver_names: BTreeMap<String, String>,
    /// Where this boot's id is read ([`super::claims::BOOT_ID`]): records say which boot
    /// they were made in.
    pub boot_id_file: PathBuf,
    /// This instance's own name (the pod's UID under the DaemonSet), where two instances may
    /// run at once (a rolling update): each then registers its own sockets, and kubelet calls
    /// the newer. `None`: one instance, the sockets named as kubelet's plugin helper names
    /// them.
    pub instance: Option<String>,
}

/// The DRA socket and the registration socket of `driver`'s instance: `dra.sock` and
/// `<driver>-reg.sock`, or with an instance `dra-<instance>.sock` and
/// `<driver>-<instance>-reg.sock` (as kubelet's rolling-update helper names them), the
/// instance replaced by a hash of it where the path would not fit a socket address; an
/// error naming the directory where no name fits.
pub fn socket_paths(opts: &Options, driver: &str) -> Result<(PathBuf, PathBuf), DirTooLong> {
    let dra = socket::place(
        &opts.plugins_dir.join(driver),
        opts.instance.as_deref(),
        |i| match i {
            None => "dra.sock".into(),
            Some(i) => format!("dra-{i}.sock"),
        },
    )?;
    let reg = socket::place(&opts.registry_dir, opts.instance.as_deref(), |i| match i {
        None => format!("{driver}-reg.sock"),
        Some(i) => format!("{driver}-{i}-reg.sock"),
    })?;
    Ok((dra, reg))
}

impl Options {
    pub fn new(node: String) -> Options {
        Options {
            node,
            registry_dir: PLUGINS_REGISTRY.into(),
            plugins_dir: PLUGINS_DIR.into(),
            cdi_dir: "/var/run/cdi".into(),
            state_dir: "/var/lib/accel-dra-driver".into(),
            library_dir: crate::spec::MULTIARCH_LIBRARY_DIR.into(),
            host_root: HostRoot::default(),
            cgroup_root: crate::dmem::DEFAULT_CGROUP_ROOT.into(),
            dmem_grants_dir: crate::dmem::DEFAULT_GRANTS_DIR.into(),
            poll: Duration::from_secs(2),
            health: crate::health::Settings::default(),
            taint_effects: super::taints::Effects::default(),
            driver_names: BTreeMap::new(),
            boot_id_file: super::claims::BOOT_ID.into(),
            instance: None,
        }
    }
}

/// Whether a status write refused for a credential that names no node was said (once per
/// process: every claim's is refused alike).
static NODE_CREDENTIAL_SAID: AtomicBool = AtomicBool::new(false);

/// Where the API server refused a claim's status because the driver's credential is not tied
/// to the claim's node (Kubernetes 1.36 then asks for `arbitrary-node:patch` on
/// `resourceclaims/driver`, or the shipped policy finds no node in the token): what is
/// missing and where the set-up is told.
pub fn forbidden_for_no_node(e: &kube::Error) -> Option<String> {
    let kube::Error::Api(status) = e else {
        return None;
    };
    let m = &status.message;
    // Forbidden (RBAC) or Invalid (a policy's denial, a field refused by validation).
    let refused = matches!(status.code, 403 | 422);
    (refused && (m.contains("arbitrary-node") || m.contains("names no node"))).then(|| {
        format!(
            "the API server refuses it because this driver's credential is not tied to \
                 the claim's node ({}); outside a pod, run the driver with a token bound to \
                 its Node and --token-file (docs/dra.md, \"Running the driver from \
                 systemd\"); further refusals are logged at debug",
            m.chars()
                .take(300)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect::<String>()
        )
    })
}

/// One profile's driver, as the gRPC services see it.
pub struct Driver {
    pub profile: Profile,
    /// The profile's `[sharing]`, read when the driver starts.
    pub sharing: Option<Sharing>,
    pub name: String,
    pub claims: Claims,
    pub table: RwLock<Vec<DraDevice>>,
    pub endpoint: PathBuf,
    /// Every device's health at the last check (sent again at each check).
    health: watch::Sender<NodeWatchResourcesResponse>,
    /// kubelet's staleness timeout for those updates: a few checks.
    health_timeout: i64,
    /// The profile's health engine.
    monitor: crate::health::Monitor,
    client: Client,
}

impl Driver {
    pub fn new(
        profile: Profile,
        name: String,
        client: Client,
        opts: &Options,
    ) -> Result<Driver, DraError> {
        let state = opts.state_dir.join(&name);
        let claims = Claims::open(
            name.clone(),
            opts.node.clone(),
            opts.cdi_dir.clone(),
            state.clone(),
            opts.library_dir.clone(),
            opts.host_root.clone(),
            super::claims::boot_id(&opts.boot_id_file),
        )
        .map_err(|source| DraError::State {
            path: state,
            source,
        })?
        .with_dmem(opts.dmem_grants_dir.clone(), opts.cgroup_root.clone());
        let (sharing, mut warnings) = Sharing::of(&profile)?;
        warnings.extend(crate::health::wing::HealthWing::of(&profile)?.1);
        for w in warnings {
            log::warn!("{w}");
        }
        Ok(Driver {
            endpoint: socket_paths(opts, &name)?.0,
            profile,
            sharing,
            name,
            claims,
            table: RwLock::new(Vec::new()),
            health: watch::Sender::new(NodeWatchResourcesResponse::default()),
            health_timeout: i64::try_from(opts.poll.as_secs().saturating_mul(3))
                .unwrap_or(i64::MAX)
                .max(30),
            monitor: crate::health::Monitor::new(opts.health).with_nvml(),
            client,
        })
    }

    /// Every device's health now, for kubelet: `health` per device of `table`, each
    /// unhealthy one with why.
    fn report_health(&self, pool: &str, table: &[DraDevice], health: &[Health]) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        // Every published device: a share or a part is as healthy as its device.
        let offers = super::offers::offers(self.sharing.as_ref(), table);
        let devices = offers
            .iter()
            .map(|o| {
                let i = table.iter().position(|d| d.name == o.parent.name);
                (
                    o,
                    i.and_then(|i| health.get(i)).and_then(Health::reason_text),
                )
            })
            .map(|(o, why)| DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: pool.to_string(),
                    device_name: o.name.clone(),
                }),
                health: if why.is_none() {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                } as i32,
                last_updated_time: now,
                health_check_timeout_seconds: self.health_timeout,
                message: why.unwrap_or_default().chars().take(1024).collect(),
            })
            .collect();
        self.health
            .send_replace(NodeWatchResourcesResponse { devices });
    }

    pub fn table(&self) -> Vec<DraDevice> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The claim's `status.devices` for `devices` (KEP-4817), so `kubectl describe
    /// resourceclaim` shows what the container got: a `Ready` condition, and as data what
    /// the device is (UUID, PCI bus id, model, the nodes the container gets, the driver's
    /// version). Written by server-side apply under the driver's own field manager, so other
    /// drivers' entries stay; a failure is said and changes nothing else (the claim is
    /// prepared; kubelet does not read this).
    async fn write_status(&self, api: &Api<ResourceClaim>, r: &ClaimRef, devices: &[Prepared]) {
        let table = self.table();
        let version = crate::discovery::driver_version(&self.profile);
        // metav1.Time: RFC 3339 in whole seconds.
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let offers = super::offers::offers(self.sharing.as_ref(), &table);
        let entries: Vec<serde_json::Value> = devices
            .iter()
            .map(|p| {
                // A share or a part: what its physical device is.
                let dev = offers.iter().find(|o| o.name == p.device).map(|o| o.parent);
                let mut data = serde_json::Map::new();
                let mut put = |k: &str, v: Option<String>| {
                    if let Some(v) = v {
                        data.insert(k.into(), v.into());
                    }
                };
                put("uuid", dev.and_then(|d| d.dev.uuid.clone()));
                put("pciBusID", dev.and_then(|d| d.dev.pci_bus_id.clone()));
                put("model", dev.and_then(|d| d.dev.model.clone()));
                put("driverVersion", version.clone());
                if let Some(d) = dev {
                    data.insert(
                        "nodes".into(),
                        d.dev
                            .nodes
                            .iter()
                            .map(|n| n.path.to_string_lossy().into_owned())
                            .collect::<Vec<_>>()
                            .into(),
                    );
                }
                let mut e = serde_json::json!({
                    "driver": self.name,
                    "pool": p.pool,
                    "device": p.device,
                    "conditions": [{
                        "type": "Ready",
                        "status": "True",
                        "reason": "Prepared",
                        "message": format!("prepared on node {}", p.pool),
                        "lastTransitionTime": now,
                    }],
                    "data": data,
                });
                if let Some(share) = &p.share_id {
                    e["shareID"] = share.clone().into();
                }
                e
            })
            .collect();
        let patch = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "status": {"devices": entries},
        });
        let pp = kube::api::PatchParams::apply(&super::slices::status_manager(&self.name)).force();
        if let Err(e) = api
            .patch_status(&r.name, &pp, &kube::api::Patch::Apply(&patch))
            .await
        {
            match forbidden_for_no_node(&e) {
                // Every claim's status is refused alike: said once, in full.
                Some(why) if !NODE_CREDENTIAL_SAID.swap(true, Ordering::Relaxed) => {
                    log::error!("{}: {r}: cannot write its status.devices: {why}", self.name)
                }
                Some(_) => log::debug!("{}: {r}: status.devices refused: {e}", self.name),
                None => log::warn!("{}: {r}: cannot write its status.devices: {e}", self.name),
            }
        }
    }

    async fn prepare_one(self: &Arc<Self>, c: Claim) -> NodePrepareResourceResponse {
        let started = std::time::Instant::now();
        let r = ClaimRef {
            namespace: c.namespace,
            name: c.name,
            uid: c.uid,
        };
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &r.namespace);
        let result = match api.get(&r.name).await {
            Err(e) => Err(format!("{r}: cannot read it from the API server: {e}")),
            Ok(claim) => {
                let me = Arc::clone(self);
                let r2 = r.clone();
                tokio::task::spawn_blocking(move || {
                    me.claims
                        .prepare(&me.profile, me.sharing.as_ref(), &me.table(), &r2, &claim)
                })
                .await
                .unwrap_or_else(|e| Err(format!("{r}: prepare failed: {e}")))
            }
        };
        crate::kubelet::metrics::dra().claim(
            &self.name,
            "prepare",
            started,
            result.as_ref().err().map(String::as_str),
        );
        match result {
            Ok(devices) => {
                log::info!("{}: {r} prepared: {} device(s)", self.name, devices.len());
                self.write_status(&api, &r, &devices).await;
                NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| Device {
                            request_names: d.request_names,
                            pool_name: d.pool,
                            device_name: d.device,
                            cdi_device_ids: d.cdi_device_ids,
                            share_id: d.share_id,
                        })
                        .collect(),
                    error: String::new(),
                }
            }
            Err(error) => {
                log::warn!("{}: {error}", self.name);
                NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error,
                }
            }
        }
    }
}

impl Driver {
    /// NodePrepareResources: every claim prepared on its own task, each answered.
    pub async fn prepare(
        self: Arc<Self>,
        req: NodePrepareResourcesRequest,
    ) -> NodePrepareResourcesResponse {
        let mut set = tokio::task::JoinSet::new();
        for c in req.claims {
            let me = Arc::clone(&self);
            set.spawn(async move {
                let uid = c.uid.clone();
                (uid, me.prepare_one(c).await)
            });
        }
        let mut claims = std::collections::HashMap::new();
        while let Some(done) = set.join_next().await {
            if let Ok((uid, resp)) = done {
                claims.insert(uid, resp);
            }
        }
        NodePrepareResourcesResponse { claims }
    }

    /// NodeUnprepareResources: an unknown claim is unprepared already.
    pub async fn unprepare(
        self: Arc<Self>,
        req: NodeUnprepareResourcesRequest,
    ) -> NodeUnprepareResourcesResponse {
        let me = Arc::clone(&self);
        let claims = tokio::task::spawn_blocking(move || {
            req.claims
                .into_iter()
                .map(|c| {
                    let started = std::time::Instant::now();
                    let error = me.claims.unprepare(&c.uid).err().unwrap_or_default();
                    let failed = (!error.is_empty()).then_some(error.as_str());
                    crate::kubelet::metrics::dra().claim(&me.name, "unprepare", started, failed);
                    if error.is_empty() {
                        log::info!(
                            "{}: claim {}/{} ({}) unprepared",
                            me.name,
                            c.namespace,
                            c.name,
                            c.uid
                        );
                    } else {
                        log::warn!("{}: {error}", me.name);
                    }
                    (c.uid, NodeUnprepareResourceResponse { error })
                })
                .collect()
        })
        .await
        .unwrap_or_default();
        NodeUnprepareResourcesResponse { claims }
    }

    /// Every device's health now, then again at each check.
    pub fn watch_health(&self) -> HealthStream {
        log::info!("{}: kubelet watches the devices' health", self.name);
        let updates = tokio_stream::wrappers::WatchStream::new(self.health.subscribe());
        Box::pin(tokio_stream::StreamExt::map(updates, Ok))
    }

    pub fn info(&self) -> PluginInfo {
        PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: self.name.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub fn registration_status(&self, s: RegistrationStatus) {
        crate::kubelet::metrics::dra().registration(&self.name, s.plugin_registered);
        if s.plugin_registered {
            log::info!("{}: registered with kubelet", self.name);
        } else {
            log::warn!(
                "{}: kubelet refused the registration: {}",
                self.name,
                s.error
            );
        }
    }
}

/// The gRPC face of a driver: tonic's generated services over it.
#[derive(Clone)]
pub struct Served(pub Arc<Driver>);

/// The DRA plugin service under one of its packages (the same messages).
macro_rules! dra_service {
    ($service:path) => {
        #[tonic::async_trait]
        impl $service for Served {
            async fn node_prepare_resources(
                &self,
                req: Request<NodePrepareResourcesRequest>,
            ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
                Ok(Response::new(
                    Arc::clone(&self.0).prepare(req.into_inner()).await,
                ))
            }

            async fn node_unprepare_resources(
                &self,
                req: Request<NodeUnprepareResourcesRequest>,
            ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
                Ok(Response::new(
                    Arc::clone(&self.0).unprepare(req.into_inner()).await,
                ))
            }
        }
    };
}

dra_service!(dra::v1::dra_plugin_server::DraPlugin);
dra_service!(dra::v1beta1::dra_plugin_server::DraPlugin);

/// The health service under one of its packages (the same messages).
macro_rules! health_service {
    ($service:path) => {
        #[tonic::async_trait]
        impl $service for Served {
            type NodeWatchResourcesStream = HealthStream;

            async fn node_watch_resources(
                &self,
                _: Request<NodeWatchResourcesRequest>,
            ) -> Result<Response<HealthStream>, Status> {
                Ok(Response::new(self.0.watch_health()))
            }
        }
    };
}

health_service!(health::v1::dra_resource_health_server::DraResourceHealth);
health_service!(health::v1beta1::dra_resource_health_server::DraResourceHealth);
health_service!(health::v1alpha1::dra_resource_health_server::DraResourceHealth);

#[tonic::async_trait]
impl Registration for Served {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.0.info()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.0.registration_status(req.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A running driver, its sockets and its publisher.
struct Running {
    driver: Arc<Driver>,
    /// The DRA socket and the registration socket: removed when dropped.
    _serving: [Serving; 2],
    publisher: Publisher,
    /// What the last look found: the pool's counter sets and devices, and the driver's
    /// version.
    contents: slices::Contents,
    driver_version: Option<String>,
    /// When each unhealthy device's taint was added.
    stamps: super::taints::Stamps,
    /// After a failed publish: when to try again, and the wait after that one.
    retry: Option<(tokio::time::Instant, Duration)>,
}

/// The first wait before a failed publish is tried again; each failure doubles it, up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(30);

impl Running {
    /// Makes the API server's copy of the pool what the last look found. A write that fails
    /// is tried again after a backoff ([`Running::retry`]), not only at the next change.
    async fn publish(&mut self, node: &str) {
        let pool = Pool {
            driver: &self.driver.name,
            node,
            vendor: &self.driver.profile.name,
            driver_version: self.driver_version.as_deref(),
        };
        match self.publisher.publish(&pool, &self.contents).await {
            Ok(true) => {
                log::info!(
                    "{}: published {} device(s), pool generation {}",
                    self.driver.name,
                    self.contents.devices.len(),
                    self.publisher.generation()
                );
                self.retry = None;
            }
            Ok(false) => self.retry = None,
            // The watch says why it has not listed yet; its first list wakes the loop.
            Err(super::publish::PublishError::NotWatching) => {}
            Err(e) => {
                let wait = self
                    .retry
                    .map_or(RETRY_FIRST, |(_, w)| (w * 2).min(RETRY_MAX));
                log::warn!(
                    "{}: cannot publish the ResourceSlices (trying again in {:.1} s): {e}",
                    self.driver.name,
                    wait.as_secs_f64()
                );
                self.retry = Some((tokio::time::Instant::now() + wait, wait));
            }
        }
    }
}

/// Starts `profile`'s driver: claim records loaded, DRA socket served, then the registration
/// socket (kubelet dials the DRA socket as soon as it sees the registration). The sockets
/// are served until the handles returned are dropped.
pub fn start(
    profile: Profile,
    client: Client,
    opts: &Options,
) -> Result<(Arc<Driver>, [Serving; 2]), DraError> {
    let name = crate::kubelet::names::driver_name(
        &profile,
        opts.driver_names.get(&profile.name).map(String::as_str),
    )
    .map_err(DraError::Name)?;
    let driver = Arc::new(Driver::new(profile, name, client, opts)?);
    let served = Served(Arc::clone(&driver));
    fn listen(path: &Path) -> impl FnOnce(std::io::Error) -> DraError + '_ {
        move |source| DraError::Listen {
            path: path.to_path_buf(),
            source,
        }
    }
    let routes = tonic::service::Routes::new(dra::v1::dra_plugin_server::DraPluginServer::new(
        served.clone(),
    ))
    .add_service(dra::v1beta1::dra_plugin_server::DraPluginServer::new(
        served.clone(),
    ))
    .add_service(
        health::v1::dra_resource_health_server::DraResourceHealthServer::new(served.clone()),
    )
    .add_service(
        health::v1beta1::dra_resource_health_server::DraResourceHealthServer::new(served.clone()),
    )
    .add_service(
        health::v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(served.clone()),
    );
    let reg = socket_paths(opts, &driver.name)?.1;
    for path in [&driver.endpoint, &reg] {
        if let Some(dir) = path.parent() {
            crate::atomic::make_dirs(dir).map_err(listen(path))?;
        }
    }
    let dra = socket::serve(routes, &driver.endpoint).map_err(listen(&driver.endpoint))?;
    let routes = tonic::service::Routes::new(RegistrationServer::new(served));
    let registration = socket::serve(routes, &reg).map_err(listen(&reg))?;
    log::info!(
        "{}: serving {} and {}; {} claim(s) prepared before",
        driver.name,
        driver.endpoint.display(),
        reg.display(),
        driver.claims.prepared().len()
    );
    Ok((driver, [dra, registration]))
}

/// Looks at `driver`'s devices now and publishes them where the API server's copy differs.
async fn refresh(run: &mut Running, opts: &Options, table: Vec<DraDevice>) {
    let p = &run.driver.profile;
    run.driver_version = crate::discovery::driver_version(p);
    let pool = Pool {
        driver: &run.driver.name,
        node: &opts.node,
        vendor: &p.name,
        driver_version: run.driver_version.as_deref(),
    };
    let subjects: Vec<_> = table.iter().map(|d| d.dev.subject()).collect();
    let health = run.driver.monitor.check_all(p, &subjects);
    drop(subjects);
    let named: Vec<(&str, Option<&crate::health::Reason>)> = table
        .iter()
        .zip(&health)
        .map(|(d, h)| (d.name.as_str(), h.reason()))
        .collect();
    let taints = run
        .stamps
        .taints(&run.driver.name, &opts.taint_effects, &named);
    drop(named);
    run.driver.claims.set_health(
        table
            .iter()
            .zip(&health)
            .map(|(d, h)| {
                let h = match h.reason_text() {
                    None => super::decide::Health::Healthy,
                    Some(why) => super::decide::Health::Unhealthy(why.to_string()),
                };
                (d.name.clone(), h)
            })
            .collect(),
    );
    // Read each poll: a driver loaded after the daemon started registers its regions then.
    let dmem = match run.driver.sharing {
        Some(_) => crate::dmem::read_capacity(&opts.cgroup_root),
        None => String::new(),
    };
    run.contents = slices::contents(&pool, run.driver.sharing.as_ref(), &table, &taints, &dmem);
    run.driver.report_health(&opts.node, &table, &health);
    *run.driver.table.write().unwrap_or_else(|e| e.into_inner()) = table;
    run.publish(&opts.node).await;
}

/// Runs every profile's driver until `stop` turns true. Profiles without devices now are
/// looked at again each poll and start when their devices appear.
pub async fn run(
    profiles: Vec<Profile>,
    client: Client,
    opts: Options,
    mut stop: watch::Receiver<bool>,
) -> Result<(), DraError> {
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let changed = Arc::new(tokio::sync::Notify::new());
    loop {
        for p in &profiles {
            let table = match table::discover(p) {
                Ok(t) => t,
                Err(e) => {
                    log::warn!("{}: {e}", p.name);
                    continue;
                }
            };
            if !running.contains_key(&p.name) {
                if table.is_empty() {
                    continue;
                }
                let (driver, serving) = start(p.clone(), client.clone(), &opts)?;
                let publisher = Publisher::new(
                    client.clone(),
                    &driver.name,
                    &opts.node,
                    Arc::clone(&changed),
                );
                running.insert(
                    p.name.clone(),
                    Running {
                        driver,
                        _serving: serving,
                        publisher,
                        contents: slices::Contents::default(),
                        driver_version: None,
                        stamps: Default::default(),
                        retry: None,
                    },
                );
            }
            let Some(run) = running.get_mut(&p.name) else {
                continue;
            };
            refresh(run, &opts, table).await;
        }
        // Until the next look, a watch event (a slice written, deleted or changed by anyone)
        // only has the pools compared again with what the last look found.
        // A publish that failed is tried again at its backoff's end, if that comes first.
        let next = tokio::time::sleep(opts.poll);
        tokio::pin!(next);
        let stopping = loop {
            let retry = running
                .values()
                .filter_map(|r| r.retry.map(|(at, _)| at))
                .min();
            let woken = tokio::select! {
                _ = &mut next => false,
                _ = changed.notified() => true,
                _ = tokio::time::sleep_until(retry.unwrap_or_else(tokio::time::Instant::now)),
                    if retry.is_some() => true,
                _ = stop.wait_for(|s| *s) => break true,
            };
            if !woken {
                break false;
            }
            for run in running.values_mut() {
                run.publish(&opts.node).await;
            }
        };
        if stopping {
            break;
        }
    }
    // The servers stop and their sockets go with the handles.
    drop(running);
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}
