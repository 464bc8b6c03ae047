//! `accel-exporter`: every vendor profile's device metrics for Prometheus, attributed to the
//! pods that hold the devices. Built only with the `exporter` feature, so the runtime never
//! links its HTTP stack, gRPC client or NVML loader.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use accel_container_runtime::config::Config;
use accel_container_runtime::exporter::{run, Options};
use accel_container_runtime::kubelet::daemon;
use accel_container_runtime::kubelet::proto::podresources::SOCKET;
use anyhow::Context;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "accel-exporter",
    version,
    about = "Prometheus exporter for every accel-container-runtime vendor profile's devices, labelled with the pods that hold them"
)]
struct Args {
    /// Address and port to serve /metrics on.
    #[arg(long, default_value = "0.0.0.0:9477")]
    listen: SocketAddr,
    /// kubelet's PodResources socket (in a pod: mount its directory, not the socket).
    #[arg(long, default_value = SOCKET)]
    pod_resources_socket: PathBuf,
    /// Export devices without pod labels and never ask kubelet (a node without Kubernetes).
    #[arg(long)]
    no_pod_resources: bool,
    /// Where the host's `/` is mounted in this container (`/` on the host).
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Seconds between polls of each profile's sources (files, NVML, CLIs).
    #[arg(long, default_value_t = 5.0)]
    poll_seconds: f64,
    /// Seconds between PodResources List calls.
    #[arg(long, default_value_t = 10.0)]
    pod_resources_seconds: f64,
    /// Seconds the pod labels of PodResources' last answer are kept while later List calls
    /// fail; then devices are exported without them [default: 3 × --pod-resources-seconds].
    #[arg(long)]
    pod_resources_max_age_seconds: Option<f64>,
    /// `<profile>=<driver name>`, repeatable: the DRA driver's name where it is not derived
    /// from the profile (as accel-dra-driver's --driver-name).
    #[arg(long = "driver-name", value_parser = daemon::driver_name_arg)]
    driver_names: Vec<(String, String)>,
    #[command(flatten)]
    health: daemon::HealthArgs,
}

fn seconds(what: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| *d >= Duration::from_millis(10))
        .with_context(|| format!("--{what} {s} is not a number of seconds of at least 0.01"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    daemon::main("accel-exporter", || main_inner(args))
}

fn main_inner(args: Args) -> anyhow::Result<()> {
    let config = Config::load(&accel_container_runtime::config::path())?;
    let host_root = daemon::host_root(args.host_root)?;
    let profiles = daemon::host_profiles(config.profiles, &host_root);
    let mut opts = Options::new(args.listen);
    opts.pod_resources = (!args.no_pod_resources).then_some(args.pod_resources_socket);
    opts.poll = seconds("poll-seconds", args.poll_seconds)?;
    opts.pod_resources_poll = seconds("pod-resources-seconds", args.pod_resources_seconds)?;
    opts.pod_resources_max_age = args
        .pod_resources_max_age_seconds
        .map(|s| seconds("pod-resources-max-age-seconds", s))
        .transpose()?;
    opts.driver_names = args.driver_names.into_iter().collect::<BTreeMap<_, _>>();
    opts.health = args.health.settings()?;
    // Polls run on blocking threads; two workers serve the scrapes and PodResources.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let stop = daemon::stop_on_signals()?;
        run(profiles, opts, stop)
            .await
            .with_context(|| format!("serving on {}", args.listen))
    })
}
