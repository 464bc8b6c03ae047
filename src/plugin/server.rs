//! The running plugin: one [`Plugin`] per offer of each profile that has a resource, its
//! socket served before it registers with kubelet, health pushed on ListAndWatch as it
//! changes, and registration as `registration` decides it (once per kubelet restart, at once
//! when kubelet's socket appears). Watching is `watch`'s; everything runs as tasks of one
//! tokio runtime.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::kubelet::host_root::HostRoot;
use crate::kubelet::inventory;
use crate::kubelet::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use crate::kubelet::proto::deviceplugin::device_plugin_server::DevicePluginServer;
use crate::kubelet::proto::deviceplugin::registration_client::RegistrationClient;
use crate::kubelet::proto::deviceplugin::{Empty, RegisterRequest, KUBELET_SOCKET, VERSION};
use crate::kubelet::socket::{self, Serving};
use crate::profile::Profile;

use super::allocate::Strategy;
use super::devices::{self, DevicesError};
use super::registration::{Action, Event, FileId, Registrar, Sockets};
pub use super::service::CdiError;
use super::service::{CdiTarget, Plugin, Served};
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
    #[error(transparent)]
    Cdi(#[from] CdiError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    SocketDir(#[from] crate::kubelet::socket::DirTooLong),
    /// The profile's `[health]` does not read.
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
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
    /// How often the health engine reads each device's sysfs signals, and its hold-down.
    pub health: crate::health::Settings,
    /// First wait between registration attempts while kubelet is away (and again after
    /// each kubelet event).
    pub min_backoff: Duration,
    /// Longest wait between registration attempts while kubelet is away.
    pub max_backoff: Duration,
    /// Where the host's `/` is in this container (see `host_root`).
    pub host_root: HostRoot,
    /// This instance's name (the pod's UID under the DaemonSet), where an upgrade runs two
    /// at once: each serves its own socket, and the older does not register while a newer
    /// one answers on its socket.
    pub instance: Option<String>,
}

impl Options {
    pub fn new(kubelet_dir: PathBuf) -> Options {
        Options {
            kubelet_dir,
            strategies: vec![Strategy::VolumeMounts, Strategy::DeviceSpecs],
            cdi_dir: PathBuf::from("/var/run/cdi"),
            library_dir: PathBuf::from(crate::spec::MULTIARCH_LIBRARY_DIR),
            poll: Duration::from_secs(1),
            health: crate::health::Settings::default(),
            min_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(30),
            host_root: HostRoot::default(),
            instance: None,
        }
    }
}

impl Options {
    fn cdi_target(&self) -> CdiTarget {
        CdiTarget {
            cdi_dir: self.cdi_dir.clone(),
            library_dir: self.library_dir.clone(),
            host_root: self.host_root.clone(),
        }
    }
}

/// Serves `plugin` on `path` (replacing whatever is there) until the result is dropped.
fn serve(plugin: &Arc<Plugin>, path: &Path) -> Result<Serving, PluginError> {
    let routes = tonic::service::Routes::new(DevicePluginServer::new(Served(Arc::clone(plugin))));
    socket::serve(routes, path).map_err(|source| PluginError::Listen {
        path: path.into(),
        source,
    })
}

async fn register_once(plugin: &Plugin, dir: &Path) -> Result<(), String> {
    let ch = crate::kubelet::client::connect(&dir.join(KUBELET_SOCKET), "localhost")
        .await
        .map_err(|e| format!("{e:#}"))?;
    RegistrationClient::new(ch)
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: plugin.socket_name(),
            resource_name: plugin.resource.clone(),
            options: Some(Plugin::options()),
        })
        .await
        .map(|_| ())
        .map_err(|s| s.message().to_string())
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
    let mut yielded = false;
    loop {
        // A newer instance of this plugin serving the resource (an upgrade's new pod): kubelet
        // took its registration and ended ours; registering again would take it back, and the
        // two would trade it for as long as both run. Ours waits while that one answers, and
        // takes the resource back when it stops (a socket a dead instance left is no reason).
        if let Some(newer) = newer_instance(&opts.kubelet_dir, &plugin, &path).await {
            if !yielded {
                log::info!(
                    "{}: a newer instance serves it ({newer}); not registering again while it answers",
                    plugin.resource
                );
                yielded = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(opts.max_backoff.min(RECHECK)) => {}
                ev = events.recv() => if ev.is_none() { return stop(server, &path) },
                _ = shutdown.wait_for(|s| *s) => return stop(server, &path),
            }
            continue;
        }
        if yielded {
            log::info!(
                "{}: no newer instance answers any more; registering again",
                plugin.resource
            );
            yielded = false;
        }
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
        crate::kubelet::metrics::plugin().registration(&plugin.resource, attempt.is_ok());
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

/// How often an instance standing aside looks whether the newer one still answers.
const RECHECK: Duration = Duration::from_secs(2);

/// How long a newer instance has to answer: a stopped process's socket still takes
/// connections, and nothing answers on them.
const ANSWER: Duration = Duration::from_secs(1);

/// Another instance of `plugin` in kubelet's directory, its socket made after ours (`own`),
/// that answers GetDevicePluginOptions within [`ANSWER`], by its socket's name; `None` when
/// there is none, or ours is not served yet.
async fn newer_instance(dir: &Path, plugin: &Plugin, own: &Path) -> Option<String> {
    for name in newer_sockets(dir, plugin, own) {
        if answers(&dir.join(&name)).await {
            return Some(name);
        }
    }
    None
}

/// The sockets of other instances of `plugin` in `dir` made after ours (`own`), by name.
fn newer_sockets(dir: &Path, plugin: &Plugin, own: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    if plugin.instance.is_none() {
        return Vec::new();
    }
    let (Ok(mine), Some(own_name), Ok(entries)) = (
        std::fs::symlink_metadata(own),
        own.file_name(),
        std::fs::read_dir(dir),
    ) else {
        return Vec::new();
    };
    let base = plugin.socket_base();
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != own_name)
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix(base.as_str())
                    .and_then(|r| r.strip_prefix('@'))
                    .is_some_and(|r| r.ends_with(".sock"))
            })
        })
        .filter(|e| {
            e.metadata().is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
                    && (m.ctime(), m.ctime_nsec()) > (mine.ctime(), mine.ctime_nsec())
            })
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Whether a device plugin answers on `socket` within [`ANSWER`].
async fn answers(socket: &Path) -> bool {
    let call = async {
        let ch = crate::kubelet::client::connect(socket, "localhost")
            .await
            .ok()?;
        DevicePluginClient::new(ch)
            .get_device_plugin_options(Empty {})
            .await
            .ok()
    };
    matches!(tokio::time::timeout(ANSWER, call).await, Ok(Some(_)))
}

/// Stops the server; its socket goes with it unless a newer plugin took the name since.
fn stop(server: Option<Serving>, _path: &Path) {
    drop(server);
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
        let (_, warnings) = crate::health::wing::HealthWing::of(&profile)?;
        for w in warnings {
            log::warn!("{w}");
        }
        let found = crate::kubelet::ids::discover(&profile)?;
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
        // One health engine for them all: a device's baselines and transitions are its own.
        let monitor = Arc::new(crate::health::Monitor::new(opts.health).with_nvml());
        for offer in devices::offers(&profile) {
            let table = offer.select(&profile, found.clone())?;
            let (mut plugin, rx) = Plugin::with_table(
                profile.clone(),
                offer,
                opts.strategies.clone(),
                table,
                Arc::clone(&monitor),
            );
            plugin.cdi = cdi.then(|| opts.cdi_target());
            plugin.host_root = opts.host_root.clone();
            plugin.instance = opts.instance.clone();
            plugin.place_socket(&opts.kubelet_dir)?;
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
        for f in inventory::watched_paths(&p.profile, p.table().iter().map(|d| &d.dev)) {
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

/// The CDI spec the `cdi-*` answers name, written for `profile` as [`CdiTarget::write`]
/// writes it. Returns whether it was written.
pub fn write_cdi(profile: &Profile, opts: &Options) -> Result<bool, PluginError> {
    Ok(opts.cdi_target().write(profile)?)
}
