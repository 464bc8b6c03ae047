//! A gRPC channel to a unix socket: how the device plugin reaches kubelet's registration
//! socket and `accel-ctk pods` its PodResources socket (and the tests' stand-in kubelet
//! reaches the plugins).

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// A channel to `socket`. The URI is a placeholder: the connector ignores it, and
/// `authority` is what the HTTP/2 `:authority` carries (kubelet since 1.26 sends
/// `localhost`).
pub async fn connect(socket: &Path, authority: &str) -> Result<Channel, tonic::transport::Error> {
    let socket: PathBuf = socket.into();
    Endpoint::try_from(format!("http://{authority}"))?
        .connect_timeout(std::time::Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}
