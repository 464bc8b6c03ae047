//! The device plugin service: [`Plugin`], one offer of one profile, with everything kubelet
//! calls on it. ListAndWatch is the device table and each device's health, pushed again as it
//! changes ([`Plugin::recheck`]); GetPreferredAllocation is the best-connected choice of the
//! offered devices, replicas spread; Allocate is the strategies' answer for each container.
//! Requests are bounded by the device table: IDs the plugin does not offer are refused or left
//! out before any work that grows with them.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

use crate::health::{Health, Monitor};
use crate::kubelet::host_root::HostRoot;
use crate::kubelet::proto::deviceplugin::device_plugin_server::DevicePlugin;
use crate::kubelet::proto::deviceplugin::*;
use crate::kubelet::socket::DirTooLong;
use crate::profile::Profile;

use super::allocate::{allocate, AllocateError, Strategy};
use super::devices::{self, replica_id, split_replica, DevicesError, Offer, PluginDevice};
use super::preferred::{choose, choose_replicas, Place};
use super::registration::Event;

/// Where and how the CDI spec the `cdi-*` answers name is written.
#[derive(Debug, Clone)]
pub struct CdiTarget {
    pub cdi_dir: std::path::PathBuf,
    /// Container directory for libraries in that spec.
    pub library_dir: std::path::PathBuf,
    pub host_root: HostRoot,
}

/// The CDI spec could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the CDI spec {}: {source}", path.display())]
pub struct CdiError {
    pub path: std::path::PathBuf,
    #[source]
    pub source: anyhow::Error,
}

impl CdiTarget {
    /// The CDI spec the `cdi-*` answers name, from the same generator as `accel-ctk cdi
    /// generate`, replaced atomically and only when its content changes. Returns whether it
    /// was written.
    pub fn write(&self, profile: &Profile) -> Result<bool, CdiError> {
        static LOCK: Mutex<()> = Mutex::new(());
        let _g = LOCK.lock();
        let path = self.cdi_dir.join(format!("accel-{}.json", profile.name));
        let err = |source: anyhow::Error| CdiError {
            path: path.clone(),
            source,
        };
        let spec = crate::cdi::generate::generate(
            profile,
            &crate::cdi::generate::Options {
                capabilities: None,
                library_dir: self.library_dir.clone(),
            },
        )
        .map_err(|e| err(e.into()))?;
        let spec = self.host_root.spec(spec);
        let text = serde_json::to_vec_pretty(&spec).map_err(|e| err(e.into()))?;
        // The spec in place is read no further than the new one's length: anything longer
        // differs, and a huge file there costs nothing.
        if crate::bounded::read_file(&path, text.len() as u64).is_ok_and(|old| old == text) {
            return Ok(false);
        }
        crate::atomic::make_dirs(&self.cdi_dir).map_err(|e| err(e.into()))?;
        crate::atomic::replace(&path, &text, 0o644).map_err(|e| err(e.into()))?;
        log::info!("{}: CDI spec written to {}", profile.name, path.display());
        Ok(true)
    }
}

/// What ListAndWatch reports: every device seen since start, and each one's health.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub table: Arc<Vec<PluginDevice>>,
    pub health: Vec<Health>,
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
    pub(super) state: watch::Sender<State>,
    pub(super) epoch: AtomicU64,
    pub(super) events: mpsc::UnboundedSender<Event>,
    /// Where the CDI spec the `cdi-*` answers name is kept current (None: not written).
    pub(super) cdi: Option<CdiTarget>,
    pub(super) host_root: HostRoot,
    /// This instance's name, where two may run at once ([`Plugin::place_socket`]).
    pub(super) instance: Option<String>,
    /// The socket's name in kubelet's directory.
    socket: String,
    /// The last re-discovery error logged, so a lasting one is logged once.
    last_error: Mutex<Option<String>>,
    /// The profile's health engine, shared by its offers.
    pub(super) monitor: Arc<Monitor>,
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
        let table = offer.select(&profile, crate::kubelet::ids::discover(&profile)?)?;
        Ok(Self::with_table(profile, offer, strategies, table, Self::own_monitor()).0)
    }

    /// A plugin over an already-built device table (benchmarks).
    pub fn from_table(
        profile: Profile,
        strategies: Vec<Strategy>,
        table: Vec<PluginDevice>,
    ) -> Plugin {
        let offer = Offer::all(&profile);
        Self::with_table(profile, offer, strategies, table, Self::own_monitor()).0
    }

    /// A health engine of the default settings, for a plugin not run by the server.
    fn own_monitor() -> Arc<Monitor> {
        Arc::new(Monitor::new(crate::health::Settings::default()))
    }

    /// Each device's health now, by the profile's engine.
    fn check(monitor: &Monitor, profile: &Profile, table: &[PluginDevice]) -> Vec<Health> {
        let subjects: Vec<_> = table.iter().map(|d| d.dev.subject()).collect();
        monitor.check(profile, &subjects)
    }

    pub(super) fn with_table(
        mut profile: Profile,
        offer: Offer,
        strategies: Vec<Strategy>,
        table: Vec<PluginDevice>,
        monitor: Arc<Monitor>,
    ) -> (Plugin, mpsc::UnboundedReceiver<Event>) {
        profile.resource_name = Some(offer.resource.clone());
        let health = Self::check(&monitor, &profile, &table);
        let (tx, rx) = mpsc::unbounded_channel();
        let mut plugin = Plugin {
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
            instance: None,
            socket: String::new(),
            last_error: Mutex::new(None),
            monitor,
        };
        plugin.socket = format!("{}.sock", plugin.socket_base());
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

    /// Whether each device of the table is healthy now (one snapshot with the table).
    fn healthy(&self) -> (Arc<Vec<PluginDevice>>, Vec<bool>) {
        let s = self.state.borrow();
        (
            Arc::clone(&s.table),
            s.health.iter().map(Health::is_healthy).collect(),
        )
    }

    /// Why one of device IDs `ids` cannot be given: the first that is unhealthy, with why.
    /// kubelet asks only for devices it was told are healthy; this covers the moment between
    /// a device failing and kubelet hearing of it.
    fn unhealthy_among(&self, ids: &[String]) -> Option<String> {
        let s = self.state.borrow();
        ids.iter().find_map(|id| {
            let t = s.table.iter().position(|d| d.id == *id)?;
            let why = s.health.get(t)?.reason_text()?;
            Some(format!(
                "device {:?} is unhealthy ({}); not allocated",
                id.chars().take(80).collect::<String>(),
                why.chars().take(300).collect::<String>()
            ))
        })
    }

    /// What the plugin tells kubelet it offers: GetPreferredAllocation, no PreStartContainer.
    pub fn options() -> DevicePluginOptions {
        DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }

    /// The socket's name in kubelet's directory (`accel-<resource>.sock` until
    /// [`Plugin::place_socket`]).
    pub fn socket_name(&self) -> String {
        self.socket.clone()
    }

    /// Names the socket for kubelet's directory `dir`: with an instance name (the pod's UID:
    /// two pods of one DaemonSet run at once during an upgrade),
    /// `accel-<resource>@<instance>.sock`, so neither takes the other's socket; the instance
    /// hashed where the path would not fit a socket address, an error where nothing fits.
    pub fn place_socket(&mut self, dir: &Path) -> Result<(), DirTooLong> {
        let base = self.socket_base();
        let path = crate::kubelet::socket::place(dir, self.instance.as_deref(), |i| match i {
            None => format!("{base}.sock"),
            Some(i) => format!("{base}@{i}.sock"),
        })?;
        self.socket = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        Ok(())
    }

    /// What every instance's socket for this resource is named from (`accel-<resource>`).
    pub fn socket_base(&self) -> String {
        format!("accel-{}", self.resource.replace(['/', '.'], "-"))
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
                            health: if h.is_healthy() { HEALTHY } else { UNHEALTHY }.into(),
                            topology: d.dev.place.numa.map(|n| TopologyInfo {
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
        let found = crate::kubelet::ids::discover(&self.profile)
            .and_then(|f| self.offer.select(&self.profile, f));
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
        let health = Self::check(&self.monitor, &self.profile, &table);
        let now = State {
            table,
            health,
            replicas: self.offer.replicas,
        };
        if *self.state.borrow() == now {
            return false;
        }
        if let Some(opts) = &self.cdi {
            if let Err(e) = opts.write(&self.profile) {
                log::warn!("{}: {e:#}", self.resource);
            }
        }
        self.state.send_if_modified(|old| {
            if *old == now {
                return false;
            }
            for (i, d) in now.table.iter().enumerate() {
                let is = now.health[i].is_healthy();
                match old.table.iter().position(|o| o.id == d.id) {
                    None => log::info!(
                        "{}: device {} appeared, {}",
                        self.resource,
                        d.id,
                        if is { HEALTHY } else { UNHEALTHY }
                    ),
                    Some(j) if old.health[j].is_healthy() != is => {
                        crate::kubelet::metrics::plugin().health_transition(&self.resource, is);
                        log::info!(
                            "{}: device {} is now {}",
                            self.resource,
                            d.id,
                            if is { HEALTHY } else { UNHEALTHY }
                        )
                    }
                    Some(_) => {}
                }
            }
            *old = now;
            true
        })
    }

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
        let (table, healthy) = self.healthy();
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
            // An unhealthy device is never chosen unless kubelet requires it (one an init
            // container of the pod holds).
            offered.retain(|&t| healthy[t] || r.must_include_device_ids.contains(&table[t].id));
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
            let places: Vec<Place> = offered
                .iter()
                .map(|&t| table[t].dev.place.clone())
                .collect();
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
            log::info!(
                "{}: GetPreferredAllocation of {} from {} offered ({} required): {}",
                self.resource,
                r.allocation_size,
                offered.len(),
                must.len(),
                shown(&ids)
            );
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
        let (table, healthy) = self.healthy();
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
            // Replicas of an unhealthy device are never chosen unless kubelet requires them.
            offered.retain(|&(t, k)| {
                healthy[t]
                    || r.must_include_device_ids
                        .contains(&replica_id(&table[t].id, k))
            });
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
            let places: Vec<Place> = devices
                .iter()
                .map(|&t| table[t].dev.place.clone())
                .collect();
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
            log::info!(
                "{}: GetPreferredAllocation of {} from {} offered replicas ({} required, {}): {}",
                self.resource,
                r.allocation_size,
                offered.len(),
                must.len(),
                policy.as_str(),
                shown(&ids)
            );
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
            let refused = |e: &dyn std::fmt::Display| {
                self.refused("Allocate", format!("{} {e}", shown(&r.devices_ids)))
            };
            let ids = self
                .device_ids(&table, &r.devices_ids)
                .map_err(|e| refused(&e))?;
            if let Some(why) = self.unhealthy_among(&ids) {
                return Err(refused(&why));
            }
            let mut answer =
                allocate(&self.profile, &table, &self.strategies, &ids).map_err(|e| refused(&e))?;
            if self.offer.replicas > 1 {
                if let Some(var) = &self.profile.replicas_env {
                    answer
                        .envs
                        .insert(var.clone(), self.offer.replicas.to_string());
                }
            }
            let answer = answer.to_host(&self.host_root);
            log::info!(
                "{}: Allocate {}: {} env, {} mounts, {} device nodes, {} CDI devices",
                self.resource,
                shown(&r.devices_ids),
                answer.envs.len(),
                answer.mounts.len(),
                answer.devices.len(),
                answer.cdi_devices.len() + answer.annotations.len()
            );
            out.container_responses.push(response(answer));
        }
        Ok(out)
    }

    fn refused(&self, call: &str, why: String) -> Status {
        log::warn!("{}: {call} refused: {why}", self.resource);
        Status::invalid_argument(why)
    }
}

/// A ListAndWatch stream. Ends with the stream: tells the registration loop which
/// registration's stream it was.
pub struct Watching {
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

/// The gRPC face of a plugin: tonic's generated `DevicePlugin` service over it.
pub struct Served(pub Arc<Plugin>);

#[tonic::async_trait]
impl DevicePlugin for Served {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(Plugin::options()))
    }

    type ListAndWatchStream = Watching;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Watching>, Status> {
        let p = &self.0;
        log::info!("{}: kubelet watches the devices", p.resource);
        Ok(Response::new(Watching {
            inner: tokio_stream::wrappers::WatchStream::new(p.state.subscribe()),
            epoch: p.epoch.load(Ordering::SeqCst),
            events: p.events.clone(),
        }))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        self.0.preferred(req.into_inner()).map(Response::new)
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let started = std::time::Instant::now();
        let r = self.0.allocate(req.into_inner());
        crate::kubelet::metrics::plugin().allocation(&self.0.resource, started, &r);
        r.map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// An answer as kubelet's message.
fn response(a: super::allocate::Answer) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: a.envs.into_iter().collect(),
        mounts: a
            .mounts
            .into_iter()
            .map(|m| Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: a
            .devices
            .into_iter()
            .map(|d| DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: a.annotations.into_iter().collect(),
        cdi_devices: a
            .cdi_devices
            .into_iter()
            .map(|name| CdiDevice { name })
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    use crate::kubelet::inventory::NodeDevice;
    use crate::plugin::allocate::Strategy;
    use crate::topology::Node;

    /// Eight GCUs, two switches of four under one root port each (device i under switch
    /// i / 4), as the seed's node.
    fn plugin(strategies: Vec<Strategy>) -> Plugin {
        plugin_with_sick(strategies, &[])
    }

    /// [`plugin`], each GCU healthy (its host node `/dev/null`, a character device of major
    /// 1 on every Linux) but those of `sick`, whose host node does not exist.
    fn plugin_with_sick(strategies: Vec<Strategy>, sick: &[u32]) -> Plugin {
        let table = (0..8u32)
            .map(|i| PluginDevice {
                id: format!("GCU-{i}"),
                dev: NodeDevice {
                    index: i,
                    name: i.to_string(),
                    nodes: vec![Node {
                        path: PathBuf::from(format!("/dev/gcu{i}")),
                        major: Some(1),
                        minor: Some(u64::from(i)),
                    }],
                    host_nodes: vec![PathBuf::from(if sick.contains(&i) {
                        "/nonexistent/gcu"
                    } else {
                        "/dev/null"
                    })],
                    place: Place {
                        numa: Some(i / 4),
                        root: Some("pci0000:00".into()),
                        bridges: vec![
                            format!("0000:0{}:01.0", i / 4),
                            format!("0000:1{}:00.0", i / 4),
                        ],
                    },
                    ..NodeDevice::numbered(i)
                },
            })
            .collect();
        let mut enflame = crate::config::Config::builtin()
            .profile("enflame")
            .unwrap()
            .clone();
        enflame.version_file = None;
        Plugin::from_table(enflame, strategies, table)
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn preferred(p: &Plugin, available: &[&str], must: &[&str], size: i32) -> Vec<String> {
        let req = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_ids: ids(available),
                must_include_device_ids: ids(must),
                allocation_size: size,
            }],
        };
        let mut got = p.preferred(req).unwrap().container_responses[0]
            .device_ids
            .clone();
        got.sort();
        got
    }

    /// kubelet sends the free IDs in Go's map order, different at every call: the answer is
    /// the same whatever the order, and stays under one switch.
    #[test]
    fn preferred_ignores_the_order_of_the_ids_and_keeps_a_switch_together() {
        let p = plugin(vec![Strategy::DeviceSpecs]);
        let order = [
            "GCU-5", "GCU-0", "GCU-7", "GCU-2", "GCU-6", "GCU-1", "GCU-4", "GCU-3",
        ];
        let mut reversed = order;
        reversed.reverse();
        let a = preferred(&p, &order, &[], 4);
        assert_eq!(a, ["GCU-0", "GCU-1", "GCU-2", "GCU-3"]);
        assert_eq!(preferred(&p, &reversed, &[], 4), a);
        assert_eq!(
            preferred(&p, &order, &["GCU-6"], 2),
            ["GCU-4", "GCU-6"],
            "the must-include device's switch"
        );
    }

    /// IDs the plugin does not offer are left out of a preferred choice, never chosen.
    #[test]
    fn preferred_leaves_out_ids_it_does_not_offer() {
        let p = plugin(vec![Strategy::DeviceSpecs]);
        let got = preferred(&p, &["GCU-99", "x\ny", "GCU-1", "GCU-2"], &[], 2);
        assert_eq!(got, ["GCU-1", "GCU-2"]);
    }

    fn allocate(p: &Plugin, devices: &[&str]) -> Result<AllocateResponse, Status> {
        p.allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids(devices),
            }],
        })
    }

    #[test]
    fn allocate_answers_each_container_with_exactly_its_nodes() {
        let p = plugin(vec![Strategy::DeviceSpecs]);
        let got = allocate(&p, &["GCU-3", "GCU-1"]).unwrap();
        let mut nodes: Vec<&str> = got.container_responses[0]
            .devices
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        nodes.sort();
        assert!(
            nodes.contains(&"/dev/gcu1") && nodes.contains(&"/dev/gcu3"),
            "{nodes:?}"
        );
        assert!(
            !nodes.iter().any(|n| ["/dev/gcu0", "/dev/gcu2"].contains(n)),
            "{nodes:?}"
        );
    }

    /// An ID the plugin never listed is refused with its name, quoted and cut; a request for
    /// more IDs than the table holds is refused before any work that grows with it.
    #[test]
    fn allocate_refuses_unknown_and_oversized_requests() {
        let p = plugin(vec![Strategy::DeviceSpecs]);
        let e = allocate(&p, &["GCU-1", "GCU-9\n"]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("GCU-9"), "{}", e.message());
        assert!(!e.message().contains('\n'), "{}", e.message());
        let many: Vec<String> = (0..100_000).map(|i| format!("GCU-{}", i % 8)).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let started = std::time::Instant::now();
        let e = allocate(&p, &many).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().len() < 400, "{}", e.message());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

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

    /// An unhealthy device is never chosen by a preferred allocation unless kubelet requires
    /// it, and Allocate refuses it naming why: kubelet may not have heard yet.
    #[test]
    fn unhealthy_devices_are_not_chosen_nor_allocated() {
        let p = plugin_with_sick(vec![Strategy::DeviceSpecs], &[1]);
        let all = ["GCU-0", "GCU-1", "GCU-2", "GCU-3"];
        let got = preferred(&p, &all, &[], 2);
        assert!(!got.contains(&"GCU-1".to_string()), "{got:?}");
        assert_eq!(preferred(&p, &all, &[], 3), ["GCU-0", "GCU-2", "GCU-3"]);
        assert_eq!(preferred(&p, &all, &["GCU-1"], 2), ["GCU-0", "GCU-1"]);
        let e = allocate(&p, &["GCU-0", "GCU-1"]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            e.message(),
            "[\"GCU-0\", \"GCU-1\"] device \"GCU-1\" is unhealthy (/nonexistent/gcu: does not \
             exist); not allocated"
        );
        allocate(&p, &["GCU-0", "GCU-2"]).unwrap();
    }
}
