//! `accel-dra-driver`: a Dynamic Resource Allocation driver for every vendor profile in the
//! runtime's config. Built only with the `dra` feature, so the runtime never links its API
//! client or gRPC stack.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use accel_container_runtime::config::Config;
use accel_container_runtime::dra::server::{run, Options};
use accel_container_runtime::dra::taints::Effects;
use accel_container_runtime::kubelet::daemon;
use accel_container_runtime::kubelet::proto::registration::{PLUGINS_DIR, PLUGINS_REGISTRY};
use anyhow::Context;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "accel-dra-driver",
    version,
    about = "Kubernetes DRA driver for every accel-container-runtime vendor profile"
)]
struct Args {
    /// This node's name (default: the variable NODE_NAME, which the DaemonSet sets from
    /// spec.nodeName).
    #[arg(long)]
    node_name: Option<String>,
    /// kubelet's plugin registry directory.
    #[arg(long, default_value = PLUGINS_REGISTRY)]
    registry_dir: PathBuf,
    /// Directory of the plugins' sockets (`<driver>/dra.sock`).
    #[arg(long, default_value = PLUGINS_DIR)]
    plugins_dir: PathBuf,
    /// Directory for the per-claim CDI specs.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Directory for the per-claim records (kept across restarts).
    #[arg(long, default_value = "/var/lib/accel-dra-driver")]
    state_dir: PathBuf,
    /// Where the host's `/` is mounted in this container (`/` on the host).
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// `<profile>=<driver name>`, repeatable: a driver name other than the derived one.
    #[arg(long = "driver-name", value_parser = daemon::driver_name_arg)]
    driver_names: Vec<(String, String)>,
    /// This instance's name, where a rolling update runs two at once (default: the variable
    /// POD_UID, which the DaemonSet sets from metadata.uid): its sockets carry it, and
    /// kubelet calls the newer instance.
    #[arg(long)]
    instance: Option<String>,
    /// Seconds between device and health checks.
    #[arg(long, default_value_t = 2.0)]
    poll_seconds: f64,
    #[command(flatten)]
    health: daemon::HealthArgs,
    /// Severities (comma-separated: gone, error, reported) whose taint is `NoExecute`, so
    /// pods holding such a device are evicted unless they tolerate it. Default: none, every
    /// taint is `NoSchedule` (docs/dra.md, "Health and taints").
    #[arg(long, default_value = "", value_parser = taint_effects)]
    taint_no_execute: Effects,
    /// Serve the driver's own metrics (registrations, prepare/unprepare counts and latency,
    /// failures, slice publishes) at http://<address>/metrics (docs/exporter.md). Off by
    /// default.
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
    /// Outside a pod (the systemd unit): the file of the token bound to this node's Node
    /// object that the kubeconfig's `tokenFile` names. The driver renews it before it
    /// expires (docs/dra.md, "Running the driver from systemd"). Not for the DaemonSet,
    /// whose pod's token kubelet renews.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

fn taint_effects(s: &str) -> Result<Effects, String> {
    Effects::parse(s)
}

fn seconds(what: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--{what} {s} is not a positive number of seconds"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    daemon::main("accel-dra-driver", || main_inner(args))
}

fn main_inner(args: Args) -> anyhow::Result<()> {
    let config = Config::load(&accel_container_runtime::config::path())?;
    let host_root = daemon::host_root(args.host_root)?;
    let profiles = daemon::host_profiles(config.profiles, &host_root);
    let node = match args.node_name {
        Some(n) => n,
        None => std::env::var("NODE_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .context("no node name: pass --node-name or set NODE_NAME")?,
    };
    let mut opts = Options::new(node);
    opts.registry_dir = args.registry_dir;
    opts.plugins_dir = args.plugins_dir;
    opts.cdi_dir = args.cdi_dir;
    opts.state_dir = args.state_dir;
    // Under the host's root: in the pod's own cgroup namespace, /sys/fs/cgroup is the pod's
    // cgroup, which has no dmem.capacity.
    opts.cgroup_root = host_root.path().join(
        config
            .cgroup_root
            .strip_prefix("/")
            .unwrap_or(&config.cgroup_root),
    );
    opts.dmem_grants_dir = config.dmem_grants_dir.clone();
    opts.host_root = host_root;
    opts.poll = seconds("poll-seconds", args.poll_seconds)?;
    opts.health = args.health.settings()?;
    opts.taint_effects = args.taint_no_execute;
    opts.instance = daemon::instance(args.instance)?;
    opts.driver_names = args.driver_names.into_iter().collect::<BTreeMap<_, _>>();
    let metrics_address = args.metrics_address;
    let token_file = args.token_file;
    if let Some(path) = &token_file {
        // Said at start rather than at the first refused write.
        let c = accel_container_runtime::dra::token::read(path, &opts.node)?;
        log::info!(
            "credential: the token of {}/{} bound to the Node {} in {}",
            c.namespace,
            c.account,
            opts.node,
            path.display()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .context("no Kubernetes API server configuration (in-cluster or KUBECONFIG)")?;
        let stop = daemon::stop_on_signals()?;
        if let Some(path) = token_file {
            use accel_container_runtime::dra::token;
            let node = opts.node.clone();
            tokio::spawn(token::keep_renewed(
                client.clone(),
                path,
                node,
                stop.clone(),
            ));
        }
        if let Some(addr) = metrics_address {
            use accel_container_runtime::kubelet::metrics;
            metrics::dra();
            let bound = metrics::serve(addr, metrics::daemon_render(), stop.clone())
                .await
                .with_context(|| format!("--metrics-address {addr}"))?;
            log::info!("metrics at http://{bound}/metrics");
        }
        run(profiles, client, opts, stop).await?;
        Ok(())
    })
}
