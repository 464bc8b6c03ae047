//! `accel-device-plugin`: kubelet's device plugin for every vendor profile in the runtime's
//! config. Built only with the `plugin` feature, so the runtime never links its gRPC stack.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use accel_container_runtime::config::Config;
use accel_container_runtime::kubelet::daemon;
use accel_container_runtime::kubelet::proto::deviceplugin::DEVICE_PLUGIN_PATH;
use accel_container_runtime::plugin::allocate::Strategy;
use accel_container_runtime::plugin::server::{run, Options};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "accel-device-plugin",
    version,
    about = "Kubernetes device plugin for every accel-container-runtime vendor profile"
)]
struct Args {
    /// kubelet's device-plugin directory (kubelet.sock and the plugin sockets).
    #[arg(long, default_value = DEVICE_PLUGIN_PATH)]
    kubelet_dir: PathBuf,
    /// How Allocate hands devices over, comma-separated: envvar, volume-mounts, cdi-cri,
    /// cdi-annotations, device-specs. The default never relies on a variable an image can
    /// set (pair it with the runtime's accept-envvar-unprivileged = false).
    #[arg(long, value_delimiter = ',', default_value = "volume-mounts,device-specs", value_parser = parse_strategy)]
    strategy: Vec<Strategy>,
    /// Directory for the CDI spec that the cdi-* strategies name.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Where the host's `/` is mounted in this container (the DaemonSet mounts it read-only
    /// at /host): every profile's driver-root and dev-root are read under it, and the paths
    /// handed to kubelet and written in CDI specs are the host's. `/` when run on the host.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// This instance's name, where an upgrade runs two at once (default: the variable POD_UID,
    /// which the DaemonSet sets from metadata.uid): its socket carries it, and the older
    /// instance does not register while the newer answers.
    #[arg(long)]
    instance: Option<String>,
    /// Seconds between health polls (inotify reports changes at once; this is the fallback).
    #[arg(long, default_value_t = 1.0)]
    poll_seconds: f64,
    #[command(flatten)]
    health: daemon::HealthArgs,
    /// Also keep node labels in this Node Feature Discovery feature file (as `accel-ctk
    /// labels` writes them), rewritten every third of --nfd-labels-expiry.
    #[arg(long)]
    nfd_labels: Option<PathBuf>,
    /// How long NFD keeps the labels once this plugin stops rewriting them.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    nfd_labels_expiry: Duration,
    /// Serve the plugin's own metrics (registrations, Allocate counts and latency, failures,
    /// health transitions) at http://<address>/metrics (docs/exporter.md). Off by default.
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| {
        format!("unknown strategy {s:?} (envvar, volume-mounts, cdi-cri, cdi-annotations, device-specs)")
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    daemon::main("accel-device-plugin", || main_inner(args))
}

fn main_inner(args: Args) -> anyhow::Result<()> {
    let config = Config::load(&accel_container_runtime::config::path())?;
    if config.accept_envvar_unprivileged && !args.strategy.contains(&Strategy::Envvar) {
        log::warn!(
            "the runtime's config accepts <VENDOR>_VISIBLE_DEVICES from unprivileged \
             containers (accept-envvar-unprivileged = true): an image that sets \
             NVIDIA_VISIBLE_DEVICES=all sees every device whatever the pod requested; set \
             accept-envvar-unprivileged = false and accept-container-devices-as-mounts = true",
        );
    }
    let mut opts = Options::new(args.kubelet_dir);
    opts.strategies = args.strategy;
    opts.cdi_dir = args.cdi_dir;
    opts.host_root = daemon::host_root(args.host_root)?;
    if let Some(path) = args.nfd_labels {
        let mut seen = config.clone();
        seen.profiles = daemon::host_profiles(seen.profiles, &opts.host_root);
        let every = (args.nfd_labels_expiry / 3).max(Duration::from_secs(1));
        std::thread::spawn(move || loop {
            match accel_container_runtime::ctk::labels::write(&seen, &path, args.nfd_labels_expiry)
            {
                Ok(errors) => {
                    for e in errors {
                        log::warn!("labels: {e} (its labels are left out)");
                    }
                }
                Err(e) => log::warn!("labels: {e:#}"),
            }
            std::thread::sleep(every);
        });
    }
    if let Some(d) = config.container_library_dir.clone() {
        opts.library_dir = d;
    }
    opts.poll = Duration::from_secs_f64(args.poll_seconds.clamp(0.05, 60.0));
    opts.health = args.health.settings()?;
    opts.instance = daemon::instance(args.instance)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let metrics_address = args.metrics_address;
    rt.block_on(async move {
        let stop = daemon::stop_on_signals()?;
        if let Some(addr) = metrics_address {
            use accel_container_runtime::kubelet::metrics;
            metrics::plugin();
            let bound = metrics::serve(addr, metrics::daemon_render(), stop.clone()).await?;
            log::info!("metrics at http://{bound}/metrics");
        }
        anyhow::Ok(run(config.profiles, opts, stop).await?)
    })
}
