//! The running plugin: one socket per profile that has devices, served before it registers
//! with kubelet, health pushed on ListAndWatch as it changes, and re-registration exactly
//! once per kubelet event.
//!
//! kubelet never re-dials a plugin whose ListAndWatch ended (k/k #131013) and a restarted
//! kubelet deletes every socket in its directory and recreates `kubelet.sock`, so the plugin
//! registers again when `kubelet.sock` is created, when its own socket is deleted and when
//! the stream of its current registration ends. Events that arrive together (a restart is
//! all three) are debounced into one registration; a stream of an older registration ending
//! is expected (kubelet replaced it) and ignored, which is what keeps this from looping
//! (bottlerocket #4250). While kubelet is away, registration retries with backoff.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::profile::Profile;

use super::allocate::{allocate, Strategy};
use super::api::*;
use super::devices::{self, healthy, DevicesError, PluginDevice};
use super::grpc::{self, DevicePlugin, DevicePluginServer, DeviceStream};
use super::preferred::{choose, Place};

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
    #[error("cannot watch {}: {source}", path.display())]
    Watch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
    pub debounce: Duration,
    /// Longest wait between registration attempts while kubelet is away.
    pub max_backoff: Duration,
}

impl Options {
    pub fn new(kubelet_dir: PathBuf) -> Options {
        Options {
            kubelet_dir,
            strategies: vec![Strategy::VolumeMounts, Strategy::DeviceSpecs],
            cdi_dir: PathBuf::from("/var/run/cdi"),
            library_dir: PathBuf::from(crate::spec::MULTIARCH_LIBRARY_DIR),
            poll: Duration::from_secs(1),
            debounce: Duration::from_millis(300),
            max_backoff: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    KubeletSocket,
    OwnSocketDeleted,
    /// The ListAndWatch of this registration epoch ended.
    StreamEnded(u64),
}

/// What ListAndWatch reports: every device seen since start, and whether each is healthy.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub table: Arc<Vec<PluginDevice>>,
    pub health: Vec<bool>,
}

/// One profile's device plugin.
pub struct Plugin {
    pub profile: Profile,
    pub resource: String,
    pub strategies: Vec<Strategy>,
    state: watch::Sender<State>,
    epoch: AtomicU64,
    events: mpsc::UnboundedSender<Event>,
    /// Where the CDI spec the `cdi-*` answers name is kept current (None: not written).
    cdi: Option<Options>,
    /// The last re-discovery error logged, so a lasting one is logged once.
    last_error: Mutex<Option<String>>,
}

impl Plugin {
    /// A plugin for `profile`'s devices (for tests and benchmarks: no socket, no thread).
    pub fn new(profile: Profile, strategies: Vec<Strategy>) -> Result<Plugin, DevicesError> {
        let table = devices::discover(&profile)?;
        Ok(Self::with_table(profile, strategies, table).0)
    }

    /// A plugin over an already-built device table (benchmarks).
    pub fn from_table(
        profile: Profile,
        strategies: Vec<Strategy>,
        table: Vec<PluginDevice>,
    ) -> Plugin {
        Self::with_table(profile, strategies, table).0
    }

    fn with_table(
        profile: Profile,
        strategies: Vec<Strategy>,
        table: Vec<PluginDevice>,
    ) -> (Plugin, mpsc::UnboundedReceiver<Event>) {
        let health = table.iter().map(|d| healthy(&profile, d)).collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let plugin = Plugin {
            resource: profile.resource_name.clone().unwrap_or_default(),
            profile,
            strategies,
            state: watch::Sender::new(State {
                table: Arc::new(table),
                health,
            }),
            epoch: AtomicU64::new(0),
            events: tx,
            cdi: None,
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
                .map(|(d, h)| Device {
                    id: d.id.clone(),
                    health: if *h { HEALTHY } else { UNHEALTHY }.into(),
                    topology: d.place.numa.map(|n| TopologyInfo {
                        nodes: vec![NumaNode { id: i64::from(n) }],
                    }),
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
        let table = match devices::discover(&self.profile) {
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
        let now = State { table, health };
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
        DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
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

impl Plugin {
    pub fn preferred(
        &self,
        req: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, Status> {
        let mut out = PreferredAllocationResponse::default();
        let table = self.table();
        for r in req.container_requests {
            let place = |id: &String| {
                table
                    .iter()
                    .find(|d| d.id == *id)
                    .map(|d| d.place.clone())
                    .unwrap_or_default()
            };
            let places: Vec<Place> = r.available_device_ids.iter().map(place).collect();
            let must: Vec<usize> = r
                .must_include_device_ids
                .iter()
                .filter_map(|m| r.available_device_ids.iter().position(|a| a == m))
                .collect();
            let size = usize::try_from(r.allocation_size).unwrap_or(0);
            let chosen = choose(&places, &must, size).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{}: cannot choose {} of {} offered devices with {} required",
                    self.resource,
                    r.allocation_size,
                    r.available_device_ids.len(),
                    r.must_include_device_ids.len()
                ))
            })?;
            out.container_responses
                .push(ContainerPreferredAllocationResponse {
                    device_ids: chosen
                        .into_iter()
                        .map(|i| r.available_device_ids[i].clone())
                        .collect(),
                });
        }
        Ok(out)
    }

    pub fn allocate(&self, req: AllocateRequest) -> Result<AllocateResponse, Status> {
        let mut out = AllocateResponse::default();
        let table = self.table();
        for r in req.container_requests {
            let answer = allocate(&self.profile, &table, &self.strategies, &r.devices_ids)
                .map_err(|e| {
                    log(&format!(
                        "{}: Allocate {:?} refused: {e}",
                        self.resource, r.devices_ids
                    ));
                    Status::invalid_argument(e.to_string())
                })?;
            log(&format!(
                "{}: Allocate {:?}: {} env, {} mounts, {} device nodes, {} CDI devices",
                self.resource,
                r.devices_ids,
                answer.envs.len(),
                answer.mounts.len(),
                answer.devices.len(),
                answer.cdi_devices.len() + answer.annotations.len()
            ));
            out.container_responses.push(answer.into());
        }
        Ok(out)
    }
}

/// Watches device nodes (inotify on their directories, and on the driver's version file's)
/// and re-checks health on every event and at least every `poll`.
fn spawn_health(plugins: Vec<Arc<Plugin>>, poll: Duration, stop: Arc<AtomicBool>) {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for p in &plugins {
        for f in devices::watched_paths(&p.profile, &p.table()) {
            if let Some(d) = f.parent() {
                if !dirs.iter().any(|x| x == d) {
                    dirs.push(d.to_path_buf());
                }
            }
        }
    }
    std::thread::spawn(move || {
        use inotify::{Inotify, WatchMask};
        let ino = Inotify::init().ok();
        if let Some(ino) = &ino {
            for d in &dirs {
                if let Err(e) = ino.watches().add(
                    d,
                    WatchMask::CREATE
                        | WatchMask::DELETE
                        | WatchMask::MOVED_FROM
                        | WatchMask::MOVED_TO
                        | WatchMask::ATTRIB,
                ) {
                    log(&format!(
                        "cannot watch {} ({e}); polling every {poll:?}",
                        d.display()
                    ));
                }
            }
        }
        let mut ino = ino;
        let mut buf = [0u8; 4096];
        while !stop.load(Ordering::Relaxed) {
            wait_readable(ino.as_ref().map(|i| i.as_raw_fd()), poll);
            if let Some(i) = ino.as_mut() {
                while i.read_events(&mut buf).is_ok_and(|ev| ev.count() > 0) {}
            }
            for p in &plugins {
                p.recheck();
            }
        }
    });
}

fn wait_readable(fd: Option<i32>, timeout: Duration) {
    match fd {
        Some(fd) => {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
        }
        None => std::thread::sleep(timeout),
    }
}

/// Watches kubelet's directory: `kubelet.sock` created, a plugin socket deleted.
fn spawn_dir_watch(
    dir: &Path,
    sockets: Vec<(String, mpsc::UnboundedSender<Event>)>,
    stop: Arc<AtomicBool>,
) -> Result<(), PluginError> {
    use inotify::{Inotify, WatchMask};
    let watch_err = |source| PluginError::Watch {
        path: dir.into(),
        source,
    };
    let mut ino = Inotify::init().map_err(watch_err)?;
    ino.watches()
        .add(
            dir,
            WatchMask::CREATE | WatchMask::DELETE | WatchMask::MOVED_TO | WatchMask::MOVED_FROM,
        )
        .map_err(watch_err)?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while !stop.load(Ordering::Relaxed) {
            wait_readable(Some(ino.as_raw_fd()), Duration::from_millis(500));
            let Ok(events) = ino.read_events(&mut buf) else {
                continue;
            };
            for e in events {
                let Some(name) = e.name.and_then(|n| n.to_str()) else {
                    continue;
                };
                let created = e
                    .mask
                    .intersects(inotify::EventMask::CREATE | inotify::EventMask::MOVED_TO);
                for (sock, tx) in &sockets {
                    if created && name == KUBELET_SOCKET {
                        let _ = tx.send(Event::KubeletSocket);
                    } else if !created && name == sock {
                        let _ = tx.send(Event::OwnSocketDeleted);
                    }
                }
            }
        }
    });
    Ok(())
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

/// Serves `plugin` on `path` until `stop` fires (or the server fails).
fn serve(
    plugin: &Arc<Plugin>,
    path: &Path,
) -> Result<tokio::sync::oneshot::Sender<()>, PluginError> {
    if path.symlink_metadata().is_ok() {
        let _ = std::fs::remove_file(path);
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|source| PluginError::Listen {
        path: path.into(),
        source,
    })?;
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
    Ok(tx)
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

/// Registration loop of one plugin: serve, register (with backoff), then wait for the
/// next event that calls for registering again.
async fn manage(
    plugin: Arc<Plugin>,
    mut events: mpsc::UnboundedReceiver<Event>,
    opts: Options,
    mut shutdown: watch::Receiver<bool>,
) {
    let path = opts.kubelet_dir.join(plugin.socket_name());
    let mut server: Option<tokio::sync::oneshot::Sender<()>> = None;
    // A profile with no device yet (a driver still loading) registers once one appears.
    let mut state = plugin.state.subscribe();
    tokio::select! {
        r = state.wait_for(|s| !s.table.is_empty()) => if r.is_err() { return },
        _ = shutdown.changed() => return,
    }
    drop(state);
    loop {
        let mut delay = Duration::from_millis(200);
        loop {
            if server.is_none() || !path.exists() {
                if let Some(s) = server.take() {
                    let _ = s.send(());
                }
                match serve(&plugin, &path) {
                    Ok(s) => server = Some(s),
                    Err(e) => log(&format!("{}: {e}", plugin.resource)),
                }
            }
            let epoch = plugin.epoch.fetch_add(1, Ordering::SeqCst) + 1;
            match register_once(&plugin, &opts.kubelet_dir).await {
                Ok(()) => {
                    log(&format!(
                        "{}: registered with kubelet as {} ({} devices, registration {epoch})",
                        plugin.resource,
                        plugin.socket_name(),
                        plugin.table().len()
                    ));
                    break;
                }
                Err(e) => {
                    log(&format!(
                        "{}: kubelet not reachable ({e}); retrying in {delay:?}",
                        plugin.resource
                    ));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.changed() => return stop(server, &path),
                    }
                    delay = (delay * 2).min(opts.max_backoff);
                }
            }
        }
        // Wait for an event that calls for registering again.
        loop {
            let ev = tokio::select! {
                ev = events.recv() => ev,
                _ = shutdown.changed() => return stop(server, &path),
            };
            let Some(mut ev) = ev else {
                return stop(server, &path);
            };
            // A restart is several events; they become one registration.
            tokio::time::sleep(opts.debounce).await;
            let mut relevant = is_relevant(ev, &plugin);
            while let Ok(more) = events.try_recv() {
                ev = more;
                relevant |= is_relevant(ev, &plugin);
            }
            if relevant {
                log(&format!("{}: {ev:?}: registering again", plugin.resource));
                break;
            }
        }
    }
}

fn is_relevant(ev: Event, plugin: &Plugin) -> bool {
    match ev {
        Event::StreamEnded(e) => e == plugin.epoch.load(Ordering::SeqCst),
        Event::KubeletSocket | Event::OwnSocketDeleted => true,
    }
}

fn stop(server: Option<tokio::sync::oneshot::Sender<()>>, path: &Path) {
    if let Some(s) = server {
        let _ = s.send(());
    }
    let _ = std::fs::remove_file(path);
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
        let table = devices::discover(&profile)?;
        if table.is_empty() {
            log(&format!(
                "{}: no devices on this node yet; registering when one appears",
                profile.name
            ));
        } else if cdi {
            write_cdi(&profile, &opts)?;
        }
        let (mut plugin, rx) = Plugin::with_table(profile, opts.strategies.clone(), table);
        plugin.cdi = cdi.then(|| opts.clone());
        plugins.push((Arc::new(plugin), rx));
    }
    if plugins.is_empty() {
        log("no profile names a resource; idle");
    }
    let stop_threads = Arc::new(AtomicBool::new(false));
    spawn_health(
        plugins.iter().map(|(p, _)| Arc::clone(p)).collect(),
        opts.poll,
        Arc::clone(&stop_threads),
    );
    spawn_dir_watch(
        &opts.kubelet_dir,
        plugins
            .iter()
            .map(|(p, _)| (p.socket_name(), p.events.clone()))
            .collect(),
        Arc::clone(&stop_threads),
    )?;
    let tasks: Vec<_> = plugins
        .into_iter()
        .map(|(p, rx)| tokio::spawn(manage(p, rx, opts.clone(), shutdown.clone())))
        .collect();
    let _ = shutdown.wait_for(|s| *s).await;
    for t in tasks {
        let _ = t.await;
    }
    stop_threads.store(true, Ordering::Relaxed);
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
    let text = serde_json::to_vec_pretty(&spec).map_err(|e| err(e.into()))?;
    if std::fs::read(&path).is_ok_and(|old| old == text) {
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
