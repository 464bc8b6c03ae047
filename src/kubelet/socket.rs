//! Serving gRPC on a unix socket in one of kubelet's directories, as the device plugin and the
//! DRA driver both do: the socket bound so only root can connect, whatever the umask; every
//! connection through `authority`; the socket removed when its server stops, unless
//! another server has taken the name since.
//!
//! [`FileId`] tells one socket from another at the same path; it is pure and built without the
//! `plugin` feature, for the device plugin's registration state machine. So is [`place`],
//! which names a socket so that its path fits a socket address.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The longest path a unix socket address holds: `sun_path` is 108 bytes with its NUL.
pub const MAX_PATH: usize = 107;

/// No name of a socket fits a socket address in `dir`.
#[derive(Debug, thiserror::Error)]
#[error("directory {} is too long for a unix socket: with the shortest name, {shortest:?}, the path is {len} bytes, and a socket address holds at most {MAX_PATH}", dir.display())]
pub struct DirTooLong {
    pub dir: PathBuf,
    pub shortest: String,
    pub len: usize,
}

/// The socket in `dir` that `name` names for `instance` (`name(None)` without one): the
/// instance as given where the path fits a socket address, else a hash of it (16 hex
/// digits), which an upgrade's two pods (UIDs of one length) pick alike. `bind_private`
/// (feature `plugin`) binds no path longer than the one returned.
pub fn place(
    dir: &Path,
    instance: Option<&str>,
    name: impl Fn(Option<&str>) -> String,
) -> Result<PathBuf, DirTooLong> {
    let mut names = vec![name(instance)];
    if let Some(i) = instance {
        // FNV-1a: stable across versions and platforms (std's hasher is neither).
        let h = i.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        names.push(name(Some(&format!("{h:016x}"))));
    }
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    if let Some(p) = paths.iter().find(|p| p.as_os_str().len() <= MAX_PATH) {
        return Ok(p.clone());
    }
    let (shortest, path) = names
        .into_iter()
        .zip(paths)
        .min_by_key(|(_, p)| p.as_os_str().len())
        .unwrap_or_default();
    Err(DirTooLong {
        dir: dir.to_path_buf(),
        shortest,
        len: path.as_os_str().len(),
    })
}

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
    /// Whatever was at `path` is replaced. The temporary name is no longer than the final
    /// one, so a `path` that fits a socket address ([`super::place`]) is bound; a longer one
    /// is refused, as is a path bound meanwhile under the temporary name.
    pub fn bind_private(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
        use std::hash::{BuildHasher, Hasher};
        use std::os::unix::fs::PermissionsExt;
        let too_long = |p: &Path| {
            let n = p.as_os_str().len();
            (n > super::MAX_PATH).then(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "the socket path is {n} bytes, a socket address holds at most {}",
                        super::MAX_PATH
                    ),
                )
            })
        };
        if let Some(e) = too_long(path) {
            return Err(e);
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        // Another process may bind in the same directory at once (an upgrade's other pod,
        // maybe with the same pid in its own namespace): names are random, and one taken is
        // never removed, another is drawn.
        let mut tries = 0;
        let (tmp, listener) = loop {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.write_u32(tries);
            let tmp = path.with_file_name(temporary_name(&name, h.finish()));
            if let Some(e) = too_long(&tmp) {
                return Err(e);
            }
            match std::os::unix::net::UnixListener::bind(&tmp) {
                Ok(l) => break (tmp, l),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 8 => tries += 1,
                Err(e) => return Err(e),
            }
        };
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        listener.set_nonblocking(true)?;
        tokio::net::UnixListener::from_std(listener)
    }

    /// The name a socket is bound under before it is renamed to `name` in the same directory:
    /// hidden (kubelet's plugin watcher skips names starting with `.`), made of `random`, and
    /// never longer than `name` (of 2 bytes or more: it fits wherever `name` does); at most
    /// 17 bytes.
    fn temporary_name(name: &str, random: u64) -> String {
        let mut t = format!(".{random:016x}");
        t.truncate(name.len().clamp(2, t.len()));
        t
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin_name(i: Option<&str>) -> String {
        match i {
            None => "accel-x.sock".into(),
            Some(i) => format!("accel-x@{i}.sock"),
        }
    }

    /// Issue 42, item 1: the instance where the path fits, up to 107 bytes, its hash where
    /// only that fits, and the directory named where nothing does.
    #[test]
    fn socket_names_fit_a_socket_address_or_name_the_directory() {
        let uid = "6b1f3c2e-0d4a-4c8e-9f7a-1a2b3c4d5e6f";
        let full = plugin_name(Some(uid)).len();
        let hashed = plugin_name(Some("0123456789abcdef")).len();
        let dir = |n: usize| PathBuf::from(format!("/{}", "k".repeat(n - 1)));
        let at = |n: usize| place(&dir(n), Some(uid), plugin_name);
        let p = at(107 - full - 1).unwrap();
        assert_eq!(p.as_os_str().len(), 107);
        assert!(p.to_string_lossy().ends_with(&plugin_name(Some(uid))));
        let p = at(107 - full).unwrap();
        assert_eq!(p.as_os_str().len(), 107 - full + 1 + hashed);
        assert_eq!(
            p.file_name().unwrap().to_string_lossy(),
            "accel-x@86ca23cc49cda721.sock"
        );
        assert_eq!(at(107 - hashed - 1).unwrap().as_os_str().len(), 107);
        let e = at(107 - hashed).unwrap_err();
        assert_eq!(e.dir, dir(107 - hashed));
        assert_eq!(e.len, 108);
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "directory {} is too long",
                dir(107 - hashed).display()
            )) && msg.contains("\"accel-x@86ca23cc49cda721.sock\"")
                && msg.contains("108 bytes"),
            "{msg}"
        );
        // Without an instance, one name.
        assert_eq!(
            place(&dir(50), None, plugin_name).unwrap(),
            dir(50).join("accel-x.sock")
        );
        let e = place(&dir(107 - 12), None, plugin_name).unwrap_err();
        assert_eq!((e.shortest.as_str(), e.len), ("accel-x.sock", 108));
    }

    /// Issue 42, item 1: a socket path of 107 bytes, the most a socket address holds (108
    /// with its NUL), is bound whatever the socket's name, and only it is left in the
    /// directory (it was bound under `.<name>.<pid>.tmp` beside it, which does not fit).
    /// One byte more is refused before anything is bound.
    #[cfg(feature = "plugin")]
    #[test]
    fn socket_path_that_fits_bound_through_a_path_that_does_not() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in = rt.enter();
        let names = [
            "dra.sock",
            "gcu.enflame.com-reg.sock",
            "accel-enflame-com-gcu@6b1f3c2e-0d4a-4c8e-9f7a-1a2b3c4d5e6f.sock",
        ];
        for name in names {
            for len in [107, 108] {
                let base = tempfile::tempdir().unwrap();
                let pad = len - name.len() - 1 - base.path().as_os_str().len() - 1;
                let dir = base.path().join("d".repeat(pad));
                std::fs::create_dir(&dir).unwrap();
                let path = dir.join(name);
                assert_eq!(path.as_os_str().len(), len);
                let bound = bind_private(&path);
                let left: Vec<_> = std::fs::read_dir(&dir)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                if len == 107 {
                    let _l = bound.unwrap_or_else(|e| panic!("{name}, {len} bytes: {e}"));
                    let m = std::fs::metadata(&path).unwrap();
                    assert!(m.file_type().is_socket());
                    assert_eq!(m.permissions().mode() & 0o777, 0o600);
                    assert_eq!(left, [std::ffi::OsString::from(name)]);
                } else {
                    let e = bound
                        .err()
                        .unwrap_or_else(|| panic!("{name}: 108 bytes bound"));
                    assert!(e.to_string().contains("at most 107"), "{e}");
                    assert!(left.is_empty(), "{left:?}");
                }
            }
        }
    }
}
