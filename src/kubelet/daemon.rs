//! What the device plugin's, the DRA driver's and the exporter's `main` share: logging to stderr
//! and one error line on the way out, the host's root given by `--host-root` and the profiles
//! seen through it, `--driver-name`, the instance name an upgrade's
//! two pods tell their sockets apart by, and the stop that SIGTERM
//! (the kubelet's and systemd's way to end a pod or unit) and SIGINT send.

use std::path::PathBuf;
use std::process::ExitCode;

use super::host_root::HostRoot;
use crate::profile::Profile;

/// Runs `inner` as the daemon `name`: its log on stderr, its error (with its causes) as the
/// last line and exit status 1.
pub fn main(name: &'static str, inner: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    crate::logging::init_stderr(name);
    match inner() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// `--host-root`: where the host's `/` is mounted in this container (`/` on the host).
pub fn host_root(dir: PathBuf) -> anyhow::Result<HostRoot> {
    if !dir.is_absolute() || !dir.is_dir() {
        anyhow::bail!(
            "--host-root {:?} is not an absolute path to a directory (mount the host's / there)",
            dir
        );
    }
    Ok(HostRoot::new(dir))
}

/// The configured profiles as seen from this container: their driver roots under the host's
/// root.
pub fn host_profiles(profiles: Vec<Profile>, host_root: &HostRoot) -> Vec<Profile> {
    profiles.into_iter().map(|p| host_root.rebase(p)).collect()
}

/// `--driver-name <profile>=<driver name>`, as the DRA driver and the exporter both take it.
pub fn driver_name_arg(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .ok_or_else(|| format!("{s:?} is not <profile>=<driver name>"))
}

/// `--instance`, else the variable POD_UID (the DaemonSets set it from `metadata.uid`): the
/// name an upgrade's old and new pod tell their sockets apart by. Letters, digits and `-`.
pub fn instance(arg: Option<String>) -> anyhow::Result<Option<String>> {
    let i = arg
        .or_else(|| std::env::var("POD_UID").ok())
        .filter(|i| !i.is_empty());
    if let Some(i) = &i {
        anyhow::ensure!(
            i.len() <= 128 && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "instance name {:?} is not letters, digits and '-' (at most 128)",
            i.chars().take(64).collect::<String>()
        );
    }
    Ok(i)
}

/// A flag that turns true at the first SIGTERM or SIGINT (sockets are removed, then the
/// daemon exits). Called inside the daemon's tokio runtime.
pub fn stop_on_signals() -> std::io::Result<tokio::sync::watch::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => log::info!("SIGTERM: removing sockets, exiting"),
            _ = int.recv() => log::info!("SIGINT: removing sockets, exiting"),
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// The health engine's flags, the same in every daemon (docs/health.md).
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Seconds between reads of each device's sysfs health signals (its PCI function, AER
    /// and RAS counters), made at the next check once passed.
    #[arg(long, default_value_t = 5.0)]
    pub health_interval_seconds: f64,
    /// Seconds every signal of a device must stay clear, after a hardware signal, before it
    /// is healthy again (0: at once).
    #[arg(long, default_value_t = 30.0)]
    pub health_hold_down_seconds: f64,
}

impl HealthArgs {
    /// The engine's settings, or the flag that is not a number of seconds.
    pub fn settings(&self) -> anyhow::Result<crate::health::Settings> {
        let secs = |what: &str, s: f64, least: f64| {
            std::time::Duration::try_from_secs_f64(s)
                .ok()
                .filter(|_| s >= least)
                .ok_or_else(|| {
                    anyhow::anyhow!("--{what} {s} is not a number of seconds of at least {least}")
                })
        };
        Ok(crate::health::Settings {
            interval: secs(
                "health-interval-seconds",
                self.health_interval_seconds,
                0.01,
            )?,
            hold_down: secs(
                "health-hold-down-seconds",
                self.health_hold_down_seconds,
                0.0,
            )?,
        })
    }
}
