//! What the plugin watches, as tokio tasks over inotify: kubelet's directory (its socket
//! created, a plugin socket deleted) and the directories of the device nodes and driver
//! files (health). Both end when `shutdown` turns true.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchMask};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;

use super::registration::Event;
use crate::kubelet::proto::deviceplugin::KUBELET_SOCKET;

#[derive(Debug, thiserror::Error)]
#[error("cannot watch {}: {source}", path.display())]
pub struct WatchError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Sends each plugin (`(socket name, events)`) the events of kubelet's directory `dir`
/// that concern it. Fails only when the directory cannot be watched at all.
pub fn kubelet_dir(
    dir: &Path,
    sockets: Vec<(String, mpsc::UnboundedSender<Event>)>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), WatchError> {
    let err = |source| WatchError {
        path: dir.into(),
        source,
    };
    let ino = Inotify::init().map_err(err)?;
    ino.watches()
        .add(
            dir,
            WatchMask::CREATE | WatchMask::DELETE | WatchMask::MOVED_TO | WatchMask::MOVED_FROM,
        )
        .map_err(err)?;
    let mut events = ino.into_event_stream([0u8; 4096]).map_err(err)?;
    tokio::spawn(async move {
        loop {
            let e = tokio::select! {
                e = events.next() => e,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            let Some(Ok(e)) = e else { return };
            let Some(name) = e.name.as_deref().and_then(|n| n.to_str()) else {
                continue;
            };
            let created = e.mask.intersects(EventMask::CREATE | EventMask::MOVED_TO);
            for (sock, tx) in &sockets {
                if created && name == KUBELET_SOCKET {
                    let _ = tx.send(Event::KubeletSocket);
                } else if !created && name == sock {
                    let _ = tx.send(Event::OwnSocketDeleted);
                }
            }
        }
    });
    Ok(())
}

/// Calls `recheck` on every change in `dirs` and at least every `poll`. A directory that
/// does not exist (a profile whose driver is not installed) is left to the poll without a
/// word; one that exists but cannot be watched is returned, for the caller to report once.
pub fn health(
    dirs: &[PathBuf],
    poll: Duration,
    mut recheck: impl FnMut() + Send + 'static,
    mut shutdown: watch::Receiver<bool>,
) -> Vec<WatchError> {
    let mut unwatched = Vec::new();
    let ino = Inotify::init();
    let events = match ino {
        Ok(ino) => {
            for d in dirs.iter().filter(|d| d.is_dir()) {
                if let Err(source) = ino.watches().add(
                    d,
                    WatchMask::CREATE
                        | WatchMask::DELETE
                        | WatchMask::MOVED_FROM
                        | WatchMask::MOVED_TO
                        | WatchMask::ATTRIB,
                ) {
                    unwatched.push(WatchError {
                        path: d.clone(),
                        source,
                    });
                }
            }
            ino.into_event_stream([0u8; 4096]).ok()
        }
        Err(source) => {
            unwatched.push(WatchError {
                path: PathBuf::from("inotify"),
                source,
            });
            None
        }
    };
    tokio::spawn(async move {
        let mut events = events;
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                e = async {
                    match events.as_mut() {
                        Some(s) => s.next().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if e.is_none() {
                        events = None;
                    }
                }
                _ = shutdown.wait_for(|s| *s) => return,
            }
            // A driver loading makes a burst of events: the ones already queued are read
            // now, and one recheck answers them all.
            if let Some(s) = events.as_mut() {
                while let Ok(Some(_)) = tokio::time::timeout(Duration::ZERO, s.next()).await {}
            }
            recheck();
        }
    });
    unwatched
}
