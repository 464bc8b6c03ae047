//! Serving gRPC on a unix socket in one of kubelet's directories, as the device plugin and the
//! DRA driver both do: the socket bound so only root can connect, whatever the umask; every
//! connection through [`super::authority`]; the socket removed when its server stops, unless
//! another server has taken the name since.
//!
//! [`FileId`] tells one socket from another at the same path; it is pure and built without the
//! `plugin` feature, for the device plugin's registration state machine.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// One file's identity: a socket recreated at the same path is another file even when the
/// file system hands out the same inode number again, as its change time differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl FileId {
    /// The identity of what is at `path` now (not following a symlink), if anything.
    pub fn of(path: &Path) -> Option<FileId> {
        let m = path.symlink_metadata().ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// A made-up identity (unit tests of what compares them).
    #[cfg(test)]
    pub(crate) fn test(ino: u64) -> FileId {
        FileId {
            dev: 1,
            ino,
            ctime: (0, 0),
        }
    }

    /// The same inode with another change time (unit tests).
    #[cfg(test)]
    pub(crate) fn changed(mut self) -> FileId {
        self.ctime.1 += 1;
        self
    }
}

#[cfg(feature = "plugin")]
pub use serving::{bind_private, serve, Serving};

#[cfg(feature = "plugin")]
mod serving {
    use std::path::{Path, PathBuf};

    use super::FileId;

    /// Binds a socket only root can connect to at `path`, whatever the umask: bound under a
    /// temporary name, made 0600, then renamed into place, so it is never reachable with
    /// looser permissions (anyone who can connect can call Allocate or prepare a claim).
    /// Whatever was at `path` is replaced.
    pub fn bind_private(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
        use std::os::unix::fs::PermissionsExt;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let listener = std::os::unix::net::UnixListener::bind(&tmp)?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        listener.set_nonblocking(true)?;
        tokio::net::UnixListener::from_std(listener)
    }

    /// A server on its socket: when dropped, the server is told to stop and the socket is
    /// removed at once (connections being served end on their own), unless another server
    /// has taken the name since.
    pub struct Serving {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        /// The socket as bound (`None`: it could not be looked at).
        pub id: Option<FileId>,
        pub path: PathBuf,
    }

    impl Drop for Serving {
        fn drop(&mut self) {
            if let Some(s) = self.stop.take() {
                let _ = s.send(());
            }
            if self.id.is_some() && self.id == FileId::of(&self.path) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }

    /// Serves `routes` on a socket bound at `path` by [`bind_private`] until the result is
    /// dropped. Every connection goes through the `:authority` rewrite: old kubelets send the
    /// socket path there, which h2 refuses.
    pub fn serve(routes: tonic::service::Routes, path: &Path) -> std::io::Result<Serving> {
        let listener = bind_private(path)?;
        let id = FileId::of(path);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let at = path.to_path_buf();
        tokio::spawn(async move {
            let incoming = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                |conn| conn.map(crate::kubelet::authority::Rewrite::new),
            );
            let stopped = async {
                let _ = rx.await;
            };
            if let Err(e) = tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
            {
                log::warn!("{}: server ended: {e}", at.display());
            }
        });
        Ok(Serving {
            stop: Some(tx),
            id,
            path: path.to_path_buf(),
        })
    }
}
