//! `accel-exporter`: every profile's device metrics for Prometheus, each device labelled with
//! the pod, container and (for DRA) claim that hold it.
//!
//! Floors, on [`crate::kubelet`] (the device table, PodResources, the metrics endpoint):
//! `snapshot` (what a poll found: pure data) and `read` (the one in-root, regular-file-only,
//! bounded read) → `sources` (files, NVML, vendor CLIs: a profile's `[metrics]`) → `poll`
//! (one profile's devices, health and readings) and `attribution` (PodResources `List` →
//! holders) → `collect` (the last snapshot as metric families, built at each scrape) → this
//! module's [`run`] (a poller per profile on its own period, PodResources on its own, the
//! endpoint). It names devices as kubelet's two device APIs do ([`crate::kubelet::ids`],
//! [`crate::kubelet::names`]) so an allocation or a claim maps back to its device.
//!
//! A scrape renders what is in memory: it never opens a device file, loads a library or
//! runs a program. A poll that takes longer than its period is reported (`hung`), its
//! profile's readings dropped until it returns, and the next poll waits for it.

pub mod attribution;
pub mod collect;
pub mod poll;
pub mod read;
pub mod snapshot;
pub mod sources;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::kubelet::metrics::{self, Render};
use crate::kubelet::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use crate::kubelet::proto::podresources::{ListPodResourcesRequest, ListPodResourcesResponse};
use crate::profile::Profile;

use attribution::Holders;
use collect::{Exposition, State};
use poll::Poller;
use snapshot::Failure;

#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    /// kubelet's PodResources socket; `None`: no attribution.
    pub pod_resources: Option<PathBuf>,
    /// Each profile's sources are polled this often.
    pub poll: Duration,
    /// PodResources `List` is called this often (and less after a rate-limit refusal).
    pub pod_resources_poll: Duration,
    /// How long an answer's holders label devices when later `List`s fail; `None`: three
    /// `pod_resources_poll` periods.
    pub pod_resources_max_age: Option<Duration>,
    /// DRA driver names by profile, where not derived from the profile (as the DRA driver's
    /// `--driver-name`).
    pub driver_names: BTreeMap<String, String>,
    /// How often the health engine reads each device's sysfs signals, and its hold-down.
    pub health: crate::health::Settings,
}

impl Options {
    pub fn new(listen: SocketAddr) -> Options {
        Options {
            listen,
            pod_resources: Some(crate::kubelet::proto::podresources::SOCKET.into()),
            poll: Duration::from_secs(5),
            pod_resources_poll: Duration::from_secs(10),
            pod_resources_max_age: None,
            driver_names: BTreeMap::new(),
            health: crate::health::Settings::default(),
        }
    }

    /// [`Options::pod_resources_max_age`], its default filled in.
    pub fn holders_max_age(&self) -> Duration {
        self.pod_resources_max_age
            .unwrap_or(self.pod_resources_poll.saturating_mul(3))
    }
}

/// A registry whose one collector renders `state`.
pub fn registry(state: Arc<State>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(Exposition(state)));
    r
}

/// Polls one profile every `every` until `stop`, each poll on a blocking thread.
async fn poll_loop(
    poller: Poller,
    state: Arc<State>,
    every: Duration,
    health: crate::health::Settings,
    mut stop: watch::Receiver<bool>,
) {
    let name = poller.profile.name.clone();
    // One health engine for the profile: a poller made afresh keeps its baselines.
    let poller = poller.with_monitor(Arc::new(crate::health::Monitor::new(health).with_nvml()));
    let template = poller.fresh();
    let fresh = || template.fresh();
    let mut idle: Option<Poller> = Some(poller);
    type Polled = (Poller, (snapshot::ProfileSnapshot, Vec<Failure>));
    let mut job: Option<tokio::task::JoinHandle<Polled>> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => match idle.take() {
                Some(mut p) => job = Some(tokio::task::spawn_blocking(move || {
                    let r = p.poll();
                    (p, r)
                })),
                None => {
                    state.count(&name, &[Failure::new(
                        "poll",
                        None,
                        "hung",
                        format!("a poll has run for longer than the poll period ({every:?}); its readings are dropped until it returns"),
                    )]);
                    state.stale(&name);
                }
            },
            done = async { job.as_mut().expect("guarded").await }, if job.is_some() => {
                job = None;
                match done {
                    Ok((p, (snap, failed))) => {
                        state.count(&name, &failed);
                        state.polled(snap);
                        idle = Some(p);
                    }
                    Err(e) => {
                        log::error!("{name}: a poll failed: {e}");
                        idle = Some(fresh());
                    }
                }
            }
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// kubelet's `List`, with a receive limit far above gRPC's 4 MiB default (a node with many
/// pods answers more: dcgm-exporter #509) and a time limit; `Err` is the reason.
pub async fn list_pod_resources(
    socket: &std::path::Path,
) -> Result<ListPodResourcesResponse, &'static str> {
    const LIMIT: Duration = Duration::from_secs(10);
    if !socket.exists() {
        return Err("no-socket");
    }
    let ch = tokio::time::timeout(LIMIT, crate::kubelet::client::connect(socket, "localhost"))
        .await
        .map_err(|_| "timeout")?
        .map_err(|_| "unreachable")?;
    let mut client = PodResourcesListerClient::new(ch).max_decoding_message_size(256 << 20);
    match tokio::time::timeout(LIMIT, client.list(ListPodResourcesRequest {})).await {
        Err(_) => Err("timeout"),
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) if s.code() == tonic::Code::ResourceExhausted => Err("rate-limited"),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Err("unimplemented"),
        Ok(Err(_)) => Err("error"),
    }
}

/// Asks kubelet who holds what every `every` (doubling the wait, to 5 minutes, while it
/// refuses for its rate limit) until `stop`. Each failure reason, the holders' expiry and the
/// recovery are logged once.
async fn pod_resources_loop(
    socket: PathBuf,
    every: Duration,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    let mut wait = every;
    let mut said: Option<&'static str> = None;
    let mut said_dropped = false;
    let max_age = state.holders_max_age.unwrap_or(Duration::MAX);
    loop {
        let r = list_pod_resources(&socket).await;
        match &r {
            Ok(_) => {
                if said.is_some() {
                    log::info!("PodResources at {} answers again", socket.display());
                }
                wait = every;
                said = None;
                said_dropped = false;
            }
            Err(reason) => {
                if said != Some(*reason) {
                    let now = state.holders();
                    let kept = match now.age {
                        Some(age) if !now.expired && now.holders.count > 0 => format!(
                            "the pod labels of its answer of {:.1} s ago are kept until it is {:.1} s old, then dropped",
                            age.as_secs_f64(),
                            max_age.as_secs_f64()
                        ),
                        _ => "devices are exported without pod labels until it answers".into(),
                    };
                    log::warn!("PodResources at {}: {reason}; {kept}", socket.display());
                    said = Some(*reason);
                }
                if *reason == "rate-limited" {
                    wait = (wait * 2).min(Duration::from_secs(300));
                }
            }
        }
        state.pod_resources(r.map(|resp| Holders::from_list(&resp)));
        // Woken at the expiry too, so the log says when the labels went.
        let now = state.holders();
        let until_expiry = match now.age {
            Some(age) if now.stale && !now.expired => max_age.saturating_sub(age),
            _ => wait,
        };
        let nap = wait.min(until_expiry.saturating_add(Duration::from_millis(10)));
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = state.holders();
        if now.expired && !said_dropped {
            log::warn!(
                "PodResources at {} has not answered for {:.1} s: pod labels dropped until it answers",
                socket.display(),
                now.age.unwrap_or_default().as_secs_f64()
            );
            said_dropped = true;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait.saturating_sub(nap)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Runs the exporter for `profiles` (already under the host root) until `stop`: returns the
/// address it serves on once listening, with the tasks running.
pub async fn start(
    profiles: Vec<Profile>,
    opts: Options,
    stop: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, Arc<State>)> {
    let state = Arc::new(State::new(opts.holders_max_age()));
    let mut pollers = Vec::with_capacity(profiles.len());
    for p in profiles {
        let driver = opts.driver_names.get(&p.name).cloned();
        pollers.push(Poller::new(p, driver.as_deref()).map_err(std::io::Error::other)?);
    }
    for poller in pollers {
        tokio::spawn(poll_loop(
            poller,
            Arc::clone(&state),
            opts.poll,
            opts.health,
            stop.clone(),
        ));
    }
    if let Some(socket) = opts.pod_resources.clone() {
        tokio::spawn(pod_resources_loop(
            socket,
            opts.pod_resources_poll,
            Arc::clone(&state),
            stop.clone(),
        ));
    }
    let registry = Arc::new(registry(Arc::clone(&state)));
    let render: Render = Arc::new(move |f| metrics::encode(&registry, f));
    let bound = metrics::serve(opts.listen, render, stop).await?;
    Ok((bound, state))
}

/// [`start`], then waits for `stop`.
pub async fn run(
    profiles: Vec<Profile>,
    opts: Options,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let names: Vec<String> = profiles.iter().map(|p| p.name.clone()).collect();
    let (bound, _) = start(profiles, opts, stop.clone()).await?;
    log::info!(
        "serving http://{bound}/metrics for profiles {}",
        names.join(", ")
    );
    let _ = stop.wait_for(|s| *s).await;
    Ok(())
}
