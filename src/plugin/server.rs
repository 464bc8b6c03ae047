//! The running plugin: one socket per profile that has devices, served before it registers
//! with kubelet, health pushed on ListAndWatch as it changes, and registration as
//! `registration` decides it (once per kubelet restart, at once when kubelet's socket
//! appears). Watching is `watch`'s; everything runs as tasks of one tokio runtime.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::profile::Profile;

use super::allocate::{allocate, AllocateError, Strategy};
use super::api::*;
use super::devices::{self, healthy, replica_id, split_replica, DevicesError, Offer, PluginDevice};
use super::grpc::{self, DevicePlugin, DevicePluginServer, DeviceStream};
use super::host_root::HostRoot;
use super::preferred::{choose, choose_replicas, Place};
use super::registration::{Action, Event, FileId, Registrar, Sockets};
use super::watch::WatchError;

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("kubelet's device-plugin directory {} does not exist (is this a Kubernetes node, and is it mounted into the plugin's pod?)", .0.display())]
    NoKubeletDir(PathBuf),
    #[error(transparent)]
    Devices(#[from] DevicesError),
    #[error("cannot listen on {}: {source}", path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the CDI spec {}: {source}", path.display())]
    Cdi {
        path: PathBuf,
        #[source]
        source: anyhow::Error,
    },
    #[error(transparent)]
    Watch(#[from] WatchError),
}

/// One line on stderr (what `kubectl logs` shows).
pub fn log(msg: &str) {
    eprintln!(
        "{} accel-device-plugin: {msg}",
        humantime::format_rfc3339_millis(SystemTime::now())
    );
}

#[derive(Debug, Clone)]
pub struct Options {
    pub kubelet_dir: PathBuf,
    pub strategies: Vec<Strategy>,
    /// Where the CDI spec the `cdi-*` answers name is written.
    pub cdi_dir: PathBuf,
    /// Container directory for libraries in that spec.
    pub library_dir: PathBuf,
    /// Health is re-checked at least this often, whatever inotify reports.
    pub poll: Duration,
    /// First wait between registration attempts while kubelet is away (and again after
    /// each kubelet event).
    pub min_backoff: Duration,
    /// Longest wait between registration attempts while kubelet is away.
    pub max_backoff: Duration,
    /// Where the host's `/` is in this container (see `host_root`).
    pub host_root: HostRoot,
}

impl Options {
    pub fn new(kubelet_dir: PathBuf) -> Options {
        Options {
            kubelet_dir,
            strategies: vec![Strategy::VolumeMounts, Strategy::DeviceSpecs],
            cdi_dir: PathBuf::from("/var/run/cdi"),
            library_dir: PathBuf::from(crate::spec::MULTIARCH_LIBRARY_DIR),
            poll: Duration::from_secs(1),
            min_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(30),
            host_root: HostRoot::default(),
        }
    }
}

/// What ListAndWatch reports: every device seen since start, and whether each is healthy.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub table: Arc<Vec<PluginDevice>>,
    pub health: Vec<bool>,
    /// Times each device is listed (its replicas share its health).
    pub replicas: u32,
}

/// The device plugin of one offer of a profile (its whole devices, or its shared ones).
pub struct Plugin {
    /// The profile, with `resource-name` the offer's resource (what Allocate's answers and
    /// errors name).
    pub profile: Profile,
    pub resource: String,
    pub offer: Offer,
    pub strategies: Vec<Strategy>,
    state: watch::Sender<State>,
    epoch: AtomicU64,
    events: mpsc::UnboundedSender<Event>,
    /// Where the CDI spec the `cdi-*` answers name is kept current (None: not written).
    cdi: Option<Options>,
    host_root: HostRoot,
    /// The last re-discovery error logged, so a lasting one is logged once.
    last_error: Mutex<Option<String>>,
}

impl Plugin {
    /// A plugin for `profile`'s first offer (for tests and benchmarks: no socket, no thread).
    pub fn new(profile: Profile, strategies: Vec<Strategy>) -> Result<Plugin, DevicesError> {
        let offer = devices::offers(&profile)
            .into_iter()
            .next()
            .unwrap_or_else(|| Offer::all(&profile));
        Self::offered(profile, offer, strategies)
    }

    /// A plugin for one offer of `profile` (tests: no socket, no thread).
    pub fn offered(
        profile: Profile,
        offer: Offer,
        strategies: Vec<Strategy>,
    ) -> Result<Plugin, DevicesError> {
        let table = offer.select(&profile, devices::discover(&profile)?)?;
        Ok(Self::with_table(profile, offer, strategies, table).0)
    }

    /// A plugin over an already-built device table (benchmarks).
    pub fn from_table(
        profile: Profile,
        strategies: Vec<Strategy>,
        table: Vec<PluginDevice>,
    ) -> Plugin {
        let offer = Offer::all(&profile);
        Self::with_table(profile, offer, strategies, table).0
    }

    fn with_table(
        mut profile: Profile,
        offer: Offer,
        strategies: Vec<Strategy>,
        table: Vec<PluginDevice>,
    ) -> (Plugin, mpsc::UnboundedReceiver<Event>) {
        profile.resource_name = Some(offer.resource.clone());
        let health = table.iter().map(|d| healthy(&profile, d)).collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let plugin = Plugin {
            resource: offer.resource.clone(),
            profile,
            strategies,
            state: watch::Sender::new(State {
                table: Arc::new(table),
                health,
                replicas: offer.replicas,
            }),
            offer,
            epoch: AtomicU64::new(0),
            events: tx,
            cdi: None,
            host_root: HostRoot::default(),
            last_error: Mutex::new(None),
        };
        (plugin, rx)
    }

    /// The devices known now (each Allocate and preferred choice reads one snapshot).
    pub fn table(&self) -> Arc<Vec<PluginDevice>> {
        Arc::clone(&self.state.borrow().table)
    }

    /// What the next ListAndWatch message says.
    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// The socket's name in kubelet's directory.
    pub fn socket_name(&self) -> String {
        format!("accel-{}.sock", self.resource.replace(['/', '.'], "-"))
    }

    fn devices(state: &State) -> ListAndWatchResponse {
        ListAndWatchResponse {
            devices: state
                .table
                .iter()
                .zip(&state.health)
                .flat_map(|(d, h)| {
                    devices::listed_ids(d, state.replicas)
                        .into_iter()
                        .map(move |id| Device {
                            id,
                            health: if *h { HEALTHY } else { UNHEALTHY }.into(),
                            topology: d.place.numa.map(|n| TopologyInfo {
                                nodes: vec![NumaNode { id: i64::from(n) }],
                            }),
                        })
                })
                .collect(),
        }
    }

    /// Discovers the devices again and re-checks each one's health; on a change, rewrites
    /// the CDI spec first (so a device kubelet hears of is already in it), then logs and
    /// pushes the change on ListAndWatch. Returns whether anything changed.
    ///
    /// A device once seen stays in the table: one whose node goes away is reported
    /// Unhealthy, not dropped (kubelet keeps counting it as allocated where it is), and keeps
    /// the major it was discovered with, so a node recreated with another major stays
    /// Unhealthy. Devices that appear are added.
    pub fn recheck(&self) -> bool {
        let known = self.table();
        let found =
            devices::discover(&self.profile).and_then(|f| self.offer.select(&self.profile, f));
        let table = match found {
            Ok(found) => {
                *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let new: Vec<PluginDevice> = found
                    .into_iter()
                    .filter(|f| !known.iter().any(|k| k.id == f.id))
                    .collect();
                if new.is_empty() {
                    known
                } else {
                    Arc::new(known.iter().cloned().chain(new).collect())
                }
            }
            Err(e) => {
                let e = e.to_string();
                let mut last = self.last_error.lock().unwrap_or_else(|e| e.into_inner());
                if last.as_deref() != Some(e.as_str()) {
                    log(&format!(
                        "{}: cannot discover devices again ({e}); keeping the {} known",
                        self.resource,
                        known.len()
                    ));
                    *last = Some(e);
                }
                known
            }
        };
        let health = table.iter().map(|d| healthy(&self.profile, d)).collect();
        let now = State {
            table,
            health,
            replicas: self.offer.replicas,
        };
        if *self.state.borrow() == now {
            return false;
        }
        if let Some(opts) = &self.cdi {
            if let Err(e) = write_cdi(&self.profile, opts) {
                log(&format!("{}: {e:#}", self.resource));
            }
        }
        self.state.send_if_modified(|old| {
            if *old == now {
                return false;
            }
            for (i, d) in now.table.iter().enumerate() {
                let is = now.health[i];
                match old.table.iter().position(|o| o.id == d.id) {
                    None => log(&format!(
                        "{}: device {} appeared, {}",
                        self.resource,
                        d.id,
                        if is { HEALTHY } else { UNHEALTHY }
                    )),
                    Some(j) if old.health[j] != is => log(&format!(
                        "{}: device {} is now {}",
                        self.resource,
                        d.id,
                        if is { HEALTHY } else { UNHEALTHY }
                    )),
                    Some(_) => {}
                }
            }
            *old = now;
            true
        })
    }
}

/// Ends with the stream: tells the registration loop which registration's stream it was.
struct Watching {
    inner: tokio_stream::wrappers::WatchStream<State>,
    epoch: u64,
    events: mpsc::UnboundedSender<Event>,
}

impl tokio_stream::Stream for Watching {
    type Item = Result<ListAndWatchResponse, Status>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.inner)
            .poll_next(cx)
            .map(|s| s.map(|s| Ok(Plugin::devices(&s))))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.events.send(Event::StreamEnded(self.epoch));
    }
}

/// The gRPC face of a plugin.
pub struct Served(pub Arc<Plugin>);

impl DevicePlugin for Served {
    fn options(&self) -> DevicePluginOptions {
        Self::options_static()
    }

    fn list_and_watch(&self) -> DeviceStream {
        let p = &self.0;
        log(&format!("{}: kubelet watches the devices", p.resource));
        Box::pin(Watching {
            inner: tokio_stream::wrappers::WatchStream::new(p.state.subscribe()),
            epoch: p.epoch.load(Ordering::SeqCst),
            events: p.events.clone(),
        })
    }

    fn preferred(
        &self,
        req: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, Status> {
        self.0.preferred(req)
    }

    fn allocate(&self, req: AllocateRequest) -> Result<AllocateResponse, Status> {
        self.0.allocate(req)
    }
}

/// At most this many device IDs in a log line; the rest are counted.
const LOGGED_IDS: usize = 8;

/// `ids` for a log line: the first few, quoted and escaped, and how many more.
fn shown(ids: &[String]) -> String {
    let mut out: Vec<String> = ids
        .iter()
        .take(LOGGED_IDS)
        .map(|i| format!("{:?}", i.chars().take(80).collect::<String>()))
        .collect();
    if ids.len() > LOGGED_IDS {
        out.push(format!("and {} more", ids.len() - LOGGED_IDS));
    }
    format!("[{}]", out.join(", "))
}

impl Plugin {
    /// The best-connected `allocation_size` of the offered devices. The offered IDs are
    /// taken in device-index order, whatever order kubelet sends them in (Go's map order,
    /// different at every call): equal choices then always fall to the lower indexes, so
    /// the same free devices give the same answer. IDs this plugin does not offer are left
    /// out, which also bounds the work to the device table.
    pub fn preferred(
        &self,
        req: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, Status> {
        if self.offer.replicas > 1 {
            return self.preferred_replicas(req);
        }
        let mut out = PreferredAllocationResponse::default();
        let table = self.table();
        for r in req.container_requests {
            // kubelet offers only IDs this plugin listed: a longer list is refused before
            // any per-ID work.
            let listed = r
                .available_device_ids
                .len()
                .max(r.must_include_device_ids.len());
            if listed > table.len() {
                return Err(self.refused(
                    "GetPreferredAllocation",
                    format!("{listed} device IDs offered, {} listed", table.len()),
                ));
            }
            let position = |id: &String| table.iter().position(|d| d.id == *id);
            let mut offered: Vec<usize> =
                r.available_device_ids.iter().filter_map(position).collect();
            offered.sort_unstable();
            offered.dedup();
            let mut must: Vec<usize> = Vec::new();
            for id in &r.must_include_device_ids {
                match position(id).and_then(|t| offered.binary_search(&t).ok()) {
                    Some(k) => must.push(k),
                    None => {
                        return Err(self.refused(
                            "GetPreferredAllocation",
                            format!(
                                "required device {:?} is not among the offered devices",
                                id.chars().take(80).collect::<String>()
                            ),
                        ))
                    }
                }
            }
            let places: Vec<Place> = offered.iter().map(|&t| table[t].place.clone()).collect();
            let size = usize::try_from(r.allocation_size).unwrap_or(usize::MAX);
            let chosen = choose(&places, &must, size).ok_or_else(|| {
                self.refused(
                    "GetPreferredAllocation",
                    format!(
                        "cannot choose {} of {} offered devices with {} required",
                        r.allocation_size,
                        offered.len(),
                        must.len()
                    ),
                )
            })?;
            let ids: Vec<String> = chosen
                .into_iter()
                .map(|k| table[offered[k]].id.clone())
                .collect();
            log(&format!(
                "{}: GetPreferredAllocation of {} from {} offered ({} required): {}",
                self.resource,
                r.allocation_size,
                offered.len(),
                must.len(),
                shown(&ids)
            ));
            out.container_responses
                .push(ContainerPreferredAllocationResponse { device_ids: ids });
        }
        Ok(out)
    }

    /// The replicas to give, by the profile's `replica-policy`: the offered replica IDs are
    /// grouped by device in device-index order (kubelet's order is Go's map order), the
    /// devices chosen, then the replicas on them.
    fn preferred_replicas(
        &self,
        req: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, Status> {
        let mut out = PreferredAllocationResponse::default();
        let table = self.table();
        let listed_ids = table.len() * self.offer.replicas as usize;
        let policy = self.profile.replica_policy;
        for r in req.container_requests {
            let listed = r
                .available_device_ids
                .len()
                .max(r.must_include_device_ids.len());
            if listed > listed_ids {
                return Err(self.refused(
                    "GetPreferredAllocation",
                    format!("{listed} device IDs offered, {listed_ids} listed"),
                ));
            }
            let mut offered: Vec<(usize, u32)> = r
                .available_device_ids
                .iter()
                .filter_map(|id| self.slot(&table, id))
                .collect();
            offered.sort_unstable();
            offered.dedup();
            // Offered devices in index order, each with its free replicas.
            let mut devices: Vec<usize> = Vec::new();
            let mut free: Vec<Vec<u32>> = Vec::new();
            for &(t, k) in &offered {
                if devices.last() != Some(&t) {
                    devices.push(t);
                    free.push(Vec::new());
                }
                if let Some(f) = free.last_mut() {
                    f.push(k);
                }
            }
            let mut must = Vec::new();
            for id in &r.must_include_device_ids {
                let slot = self
                    .slot(&table, id)
                    .filter(|s| offered.binary_search(s).is_ok())
                    .and_then(|(t, k)| Some((devices.binary_search(&t).ok()?, k)));
                match slot {
                    Some(s) => must.push(s),
                    None => {
                        return Err(self.refused(
                            "GetPreferredAllocation",
                            format!(
                                "required device {:?} is not among the offered devices",
                                id.chars().take(80).collect::<String>()
                            ),
                        ))
                    }
                }
            }
            let size = usize::try_from(r.allocation_size).unwrap_or(usize::MAX);
            if policy == crate::profile::ReplicaPolicy::Strict && size > 1 {
                return Err(self.refused(
                    "GetPreferredAllocation",
                    format!(
                        "replica-policy strict: at most 1 replica per container, {size} asked for"
                    ),
                ));
            }
            let places: Vec<Place> = devices.iter().map(|&t| table[t].place.clone()).collect();
            let chosen = choose_replicas(&places, &free, &must, size, policy).ok_or_else(|| {
                self.refused(
                    "GetPreferredAllocation",
                    format!(
                        "cannot choose {} of {} offered replicas with {} required",
                        r.allocation_size,
                        offered.len(),
                        must.len()
                    ),
                )
            })?;
            let ids: Vec<String> = chosen
                .into_iter()
                .map(|(d, k)| replica_id(&table[devices[d]].id, k))
                .collect();
            log(&format!(
                "{}: GetPreferredAllocation of {} from {} offered replicas ({} required, {}): {}",
                self.resource,
                r.allocation_size,
                offered.len(),
                must.len(),
                policy.as_str(),
                shown(&ids)
            ));
            out.container_responses
                .push(ContainerPreferredAllocationResponse { device_ids: ids });
        }
        Ok(out)
    }

    /// The table position and replica number of a replica ID this plugin lists.
    fn slot(&self, table: &[PluginDevice], id: &str) -> Option<(usize, u32)> {
        let (base, k) = split_replica(id)?;
        if k >= self.offer.replicas {
            return None;
        }
        Some((table.iter().position(|d| d.id == base)?, k))
    }

    /// The device IDs of the IDs kubelet allocated: a replica ID is its device's, so a
    /// container given two replicas of one device gets that device once. Err: an ID this
    /// plugin does not list (a whole device's ID among them: this plugin lists replicas).
    fn device_ids(
        &self,
        table: &[PluginDevice],
        ids: &[String],
    ) -> Result<Vec<String>, AllocateError> {
        if self.offer.replicas <= 1 {
            return Ok(ids.to_vec());
        }
        let mut out: Vec<String> = Vec::new();
        for id in ids {
            let Some((t, _)) = self.slot(table, id) else {
                return Err(AllocateError::Unknown(
                    id.chars().take(80).collect(),
                    self.resource.clone(),
                ));
            };
            if !out.contains(&table[t].id) {
                out.push(table[t].id.clone());
            }
        }
        Ok(out)
    }

    pub fn allocate(&self, req: AllocateRequest) -> Result<AllocateResponse, Status> {
        let mut out = AllocateResponse::default();
        let table = self.table();
        let listed = table.len() * self.offer.replicas as usize;
        for r in req.container_requests {
            // kubelet never asks for more than the plugin offers; a longer list is refused
            // before any per-ID work.
            if r.devices_ids.len() > listed {
                return Err(self.refused(
                    "Allocate",
                    format!(
                        "{} device IDs asked for, {listed} offered",
                        r.devices_ids.len(),
                    ),
                ));
            }
            if self.offer.replicas > 1
                && self.profile.replica_policy == crate::profile::ReplicaPolicy::Strict
                && r.devices_ids.len() > 1
            {
                return Err(self.refused(
                    "Allocate",
                    format!(
                        "{} replica-policy strict: at most 1 replica per container, {} asked for",
                        shown(&r.devices_ids),
                        r.devices_ids.len()
                    ),
                ));
            }
            let mut answer = self
                .device_ids(&table, &r.devices_ids)
                .and_then(|ids| allocate(&self.profile, &table, &self.strategies, &ids))
                .map_err(|e| self.refused("Allocate", format!("{} {e}", shown(&r.devices_ids))))?;
            if self.offer.replicas > 1 {
                if let Some(var) = &self.profile.replicas_env {
                    answer
                        .envs
                        .insert(var.clone(), self.offer.replicas.to_string());
                }
            }
            let answer = self.host_root.answer(answer);
            log(&format!(
                "{}: Allocate {}: {} env, {} mounts, {} device nodes, {} CDI devices",
                self.resource,
                shown(&r.devices_ids),
                answer.envs.len(),
                answer.mounts.len(),
                answer.devices.len(),
                answer.cdi_devices.len() + answer.annotations.len()
            ));
            out.container_responses.push(answer.into());
        }
        Ok(out)
    }

    fn refused(&self, call: &str, why: String) -> Status {
        log(&format!("{}: {call} refused: {why}", self.resource));
        Status::invalid_argument(why)
    }
}

/// The plugin's gRPC server on `listener` until `shutdown` completes (benchmarks call it too).
/// Every connection goes through the `:authority` rewrite: old kubelets send the socket path
/// there, which h2 refuses.
pub async fn serve_listener(
    plugin: Arc<Plugin>,
    listener: tokio::net::UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        |conn| conn.map(super::authority::Rewrite::new),
    );
    tonic::transport::Server::builder()
        .add_service(DevicePluginServer(Arc::new(Served(plugin))))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Binds a socket only root can connect to at `path`, whatever the umask: bound under a
/// temporary name, made 0600, then renamed into place, so it is never reachable with
/// looser permissions (anyone who can connect can call Allocate).
fn bind_private(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = std::os::unix::net::UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A plugin's server on its socket: stopped when dropped.
struct Serving {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    id: Option<FileId>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Serves `plugin` on `path` (replacing whatever is there) until the result is dropped.
fn serve(plugin: &Arc<Plugin>, path: &Path) -> Result<Serving, PluginError> {
    let listen_err = |source| PluginError::Listen {
        path: path.into(),
        source,
    };
    let listener = bind_private(path)
        .and_then(tokio::net::UnixListener::from_std)
        .map_err(listen_err)?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let plugin = Arc::clone(plugin);
    tokio::spawn(async move {
        let stopped = async {
            let _ = rx.await;
        };
        if let Err(e) = serve_listener(plugin, listener, stopped).await {
            log(&format!("server stopped: {e}"));
        }
    });
    Ok(Serving {
        stop: Some(tx),
        id: FileId::of(path),
    })
}

async fn register_once(plugin: &Plugin, dir: &Path) -> Result<(), String> {
    let ch = grpc::connect(&dir.join(KUBELET_SOCKET), "localhost")
        .await
        .map_err(|e| format!("{e:#}"))?;
    grpc::register(
        &ch,
        RegisterRequest {
            version: VERSION.into(),
            endpoint: plugin.socket_name(),
            resource_name: plugin.resource.clone(),
            options: Some(Served::options_static()),
        },
    )
    .await
    .map_err(|s| s.message().to_string())
}

impl Served {
    fn options_static() -> DevicePluginOptions {
        DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }
}

/// Registration loop of one plugin: serve, register, and wait for what `Registrar` says
/// calls for registering again; while kubelet is away, retry after its delays or at once on
/// a kubelet event.
async fn manage(
    plugin: Arc<Plugin>,
    mut events: mpsc::UnboundedReceiver<Event>,
    opts: Options,
    mut shutdown: watch::Receiver<bool>,
) {
    let path = opts.kubelet_dir.join(plugin.socket_name());
    let kubelet = opts.kubelet_dir.join(KUBELET_SOCKET);
    // A profile with no device yet (a driver still loading) registers once one appears.
    let mut state = plugin.state.subscribe();
    tokio::select! {
        r = state.wait_for(|s| !s.table.is_empty()) => if r.is_err() { return },
        _ = shutdown.wait_for(|s| *s) => return,
    }
    drop(state);
    let mut reg = Registrar::new(opts.min_backoff, opts.max_backoff);
    let mut server: Option<Serving> = None;
    let mut last_failure: Option<String> = None;
    let started = std::time::Instant::now();
    loop {
        if server
            .as_ref()
            .is_none_or(|s| s.id.is_none() || s.id != FileId::of(&path))
        {
            server = None;
            match serve(&plugin, &path) {
                Ok(s) => server = Some(s),
                Err(e) => log(&format!("{}: {e}", plugin.resource)),
            }
        }
        let epoch = reg.attempt();
        plugin.epoch.store(epoch, Ordering::SeqCst);
        // Never registered without a socket to dial (kubelet may have removed the one being
        // placed): kubelet would find no endpoint and drop the plugin.
        let attempt = match &server {
            Some(_) => register_once(&plugin, &opts.kubelet_dir).await,
            None => Err(format!("not serving {}", path.display())),
        };
        let wait = match attempt {
            Ok(()) => {
                let against = Sockets {
                    kubelet: FileId::of(&kubelet),
                    own: server.as_ref().and_then(|s| s.id),
                };
                reg.registered(epoch, against);
                last_failure = None;
                log(&format!(
                    "{}: registered with kubelet as {} ({} devices, registration {epoch}, {} ms after start)",
                    plugin.resource,
                    plugin.socket_name(),
                    plugin.table().len(),
                    started.elapsed().as_millis()
                ));
                None
            }
            Err(e) => {
                let wait = reg.failed();
                // A kubelet that stays away is said once, not at every retry.
                if last_failure.as_deref() != Some(e.as_str()) {
                    log(&format!(
                        "{}: kubelet not reachable ({e}); retrying with backoff up to {:?}, at once when {KUBELET_SOCKET} appears",
                        plugin.resource, opts.max_backoff
                    ));
                    last_failure = Some(e);
                }
                Some(wait)
            }
        };
        let backoff = async {
            match wait {
                Some(w) => tokio::time::sleep(w).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(backoff);
        loop {
            let ev = tokio::select! {
                _ = &mut backoff => break,
                ev = events.recv() => ev,
                _ = shutdown.wait_for(|s| *s) => return stop(server, &path),
            };
            let Some(ev) = ev else {
                return stop(server, &path);
            };
            let now = Sockets {
                kubelet: FileId::of(&kubelet),
                own: FileId::of(&path),
            };
            let was_registered = reg.is_registered();
            if reg.on_event(ev, now) == Action::Register {
                if was_registered {
                    log(&format!("{}: {ev:?}: registering again", plugin.resource));
                }
                break;
            }
        }
    }
}

fn stop(server: Option<Serving>, path: &Path) {
    let ours = server.as_ref().and_then(|s| s.id);
    drop(server);
    // Only our own socket: a newer plugin may have taken the name since.
    if ours.is_some() && ours == FileId::of(path) {
        let _ = std::fs::remove_file(path);
    }
}

/// Runs a plugin for each profile that has devices until `shutdown` turns true; removes
/// the sockets on the way out.
pub async fn run(
    profiles: Vec<Profile>,
    opts: Options,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PluginError> {
    if !opts.kubelet_dir.is_dir() {
        return Err(PluginError::NoKubeletDir(opts.kubelet_dir.clone()));
    }
    let cdi = opts
        .strategies
        .iter()
        .any(|s| matches!(s, Strategy::CdiCri | Strategy::CdiAnnotations));
    let mut plugins = Vec::new();
    for profile in profiles.into_iter().filter(|p| p.resource_name.is_some()) {
        let profile = opts.host_root.rebase(profile);
        let found = devices::discover(&profile)?;
        if found.is_empty() {
            log(&format!(
                "{}: no devices on this node yet; registering when one appears",
                profile.name
            ));
        } else if cdi {
            write_cdi(&profile, &opts)?;
        }
        // One plugin per offer: a shared resource is a resource of its own to kubelet, with
        // its own socket and registration, over devices the whole resource does not list.
        for offer in devices::offers(&profile) {
            let table = offer.select(&profile, found.clone())?;
            let (mut plugin, rx) =
                Plugin::with_table(profile.clone(), offer, opts.strategies.clone(), table);
            plugin.cdi = cdi.then(|| opts.clone());
            plugin.host_root = opts.host_root.clone();
            plugins.push((Arc::new(plugin), rx));
        }
    }
    if plugins.is_empty() {
        log("no profile names a resource; idle");
    }
    super::watch::kubelet_dir(
        &opts.kubelet_dir,
        plugins
            .iter()
            .map(|(p, _)| (p.socket_name(), p.events.clone()))
            .collect(),
        shutdown.clone(),
    )?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (p, _) in &plugins {
        for f in devices::watched_paths(&p.profile, &p.table()) {
            if let Some(d) = f.parent() {
                if !dirs.iter().any(|x| x == d) {
                    dirs.push(d.to_path_buf());
                }
            }
        }
    }
    let checked: Vec<Arc<Plugin>> = plugins.iter().map(|(p, _)| Arc::clone(p)).collect();
    for e in super::watch::health(
        &dirs,
        opts.poll,
        move || {
            for p in &checked {
                p.recheck();
            }
        },
        shutdown.clone(),
    ) {
        log(&format!("{e}; health is polled every {:?}", opts.poll));
    }
    let tasks: Vec<_> = plugins
        .into_iter()
        .map(|(p, rx)| tokio::spawn(manage(p, rx, opts.clone(), shutdown.clone())))
        .collect();
    let _ = shutdown.wait_for(|s| *s).await;
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// The CDI spec the `cdi-*` answers name, from the same generator as `accel-ctk cdi generate`,
/// replaced atomically and only when its content changes. Returns whether it was written.
pub fn write_cdi(profile: &Profile, opts: &Options) -> Result<bool, PluginError> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock();
    let path = opts.cdi_dir.join(format!("accel-{}.json", profile.name));
    let err = |source: anyhow::Error| PluginError::Cdi {
        path: path.clone(),
        source,
    };
    let spec = crate::cdi::generate::generate(
        profile,
        &crate::cdi::generate::Options {
            capabilities: None,
            library_dir: opts.library_dir.clone(),
        },
    )
    .map_err(|e| err(e.into()))?;
    let spec = opts.host_root.spec(spec);
    let text = serde_json::to_vec_pretty(&spec).map_err(|e| err(e.into()))?;
    // The spec in place is read no further than the new one's length: anything longer
    // differs, and a huge file there costs nothing.
    if crate::bounded::read_file(&path, text.len() as u64).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    std::fs::create_dir_all(&opts.cdi_dir).map_err(|e| err(e.into()))?;
    crate::atomic::replace(&path, &text, 0o644).map_err(|e| err(e.into()))?;
    log(&format!(
        "{}: CDI spec written to {}",
        profile.name,
        path.display()
    ));
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocate and preferred-allocation lines name at most 8 IDs, each cut and escaped
    /// (issue 22, 10: a 10,000-ID request logged 10,000 IDs).
    #[test]
    fn logged_id_lists_are_bounded_and_escaped() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("GCU-{i}")).collect();
        let line = shown(&ids);
        assert!(line.ends_with(", \"GCU-7\", and 9992 more]"), "{line}");
        assert!(line.len() < 200, "{line}");
        let odd = vec!["a\nb".to_string(), "x".repeat(500)];
        let line = shown(&odd);
        assert!(line.starts_with("[\"a\\nb\", \"xxx"), "{line}");
        assert!(!line.contains('\n') && line.len() < 100, "{line}");
        assert_eq!(shown(&[]), "[]");
    }
}
