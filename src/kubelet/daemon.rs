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
