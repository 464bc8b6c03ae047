//! The running plugin: one socket per profile that has devices, served before it registers
//! with kubelet, health pushed on ListAndWatch as it changes, and registration as
//! `registration` decides it (once per kubelet restart, at once when kubelet's socket
//! appears). Watching is `watch`'s; everything runs as tasks of one tokio runtime.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::profile::Profile;

use super::allocate::Strategy;
use super::api::*;
use super::devices::{self, healthy, DevicesError, Offer, PluginDevice};
use super::grpc::{self, DevicePlugin, DevicePluginServer, DeviceStream};
use super::host_root::HostRoot;
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
    pub(super) host_root: HostRoot,
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
                    log::warn!(
                        "{}: cannot discover devices again ({e}); keeping the {} known",
                        self.resource,
                        known.len()
                    );
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
                log::warn!("{}: {e:#}", self.resource);
            }
        }
        self.state.send_if_modified(|old| {
            if *old == now {
                return false;
            }
            for (i, d) in now.table.iter().enumerate() {
                let is = now.health[i];
                match old.table.iter().position(|o| o.id == d.id) {
                    None => log::info!(
                        "{}: device {} appeared, {}",
                        self.resource,
                        d.id,
                        if is { HEALTHY } else { UNHEALTHY }
                    ),
                    Some(j) if old.health[j] != is => log::info!(
                        "{}: device {} is now {}",
                        self.resource,
                        d.id,
                        if is { HEALTHY } else { UNHEALTHY }
                    ),
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
        log::info!("{}: kubelet watches the devices", p.resource);
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
            log::warn!("server stopped: {e}");
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
                Err(e) => log::warn!("{}: {e}", plugin.resource),
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
                log::info!(
                    "{}: registered with kubelet as {} ({} devices, registration {epoch}, {} ms after start)",
                    plugin.resource,
                    plugin.socket_name(),
                    plugin.table().len(),
                    started.elapsed().as_millis()
                );
                None
            }
            Err(e) => {
                let wait = reg.failed();
                // A kubelet that stays away is said once, not at every retry.
                if last_failure.as_deref() != Some(e.as_str()) {
                    log::warn!(
                        "{}: kubelet not reachable ({e}); retrying with backoff up to {:?}, at once when {KUBELET_SOCKET} appears",
                        plugin.resource, opts.max_backoff
                    );
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
                    log::info!("{}: {ev:?}: registering again", plugin.resource);
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
            log::info!(
                "{}: no devices on this node yet; registering when one appears",
                profile.name
            );
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
        log::info!("no profile names a resource; idle");
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
        log::warn!("{e}; health is polled every {:?}", opts.poll);
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
    log::info!("{}: CDI spec written to {}", profile.name, path.display());
    Ok(true)
}
