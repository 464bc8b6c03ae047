//! The gRPC glue of the DRA plugin and registration services, by hand over tonic's codegen
//! helpers as `plugin::grpc` does it: a router that decodes with prost and hands each call to
//! the driver, and the client calls kubelet makes (the tests' stand-in kubelet uses them).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::api::*;
use crate::plugin::grpc::{call, stream, unimplemented};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
/// The health updates of a `NodeWatchResources` stream.
pub type HealthStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

/// What a DRA kubelet plugin answers; implemented by [`super::server::Driver`].
pub trait DraPlugin: Send + Sync + 'static {
    fn prepare(
        self: Arc<Self>,
        req: NodePrepareResourcesRequest,
    ) -> impl Future<Output = NodePrepareResourcesResponse> + Send;
    fn unprepare(
        self: Arc<Self>,
        req: NodeUnprepareResourcesRequest,
    ) -> impl Future<Output = NodeUnprepareResourcesResponse> + Send;
    /// Every device's health now, then again at each check.
    fn watch_health(&self) -> HealthStream;
    fn info(&self) -> PluginInfo;
    fn registration_status(&self, status: RegistrationStatus);
}

async fn unary<Req, Resp, F, Fut>(req: http::Request<Body>, f: F) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(Req) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = Resp> + Send,
{
    let svc = tower::service_fn(move |r: Request<Req>| {
        let f = f.clone();
        async move { Ok::<_, Status>(Response::new(f(r.into_inner()).await)) }
    });
    tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default())
        .unary(svc, req)
        .await
}

/// The DRA service, v1 and v1beta1 (same messages), on the plugin's own socket.
pub struct DraServer<T>(pub Arc<T>);

impl<T> Clone for DraServer<T> {
    fn clone(&self) -> Self {
        DraServer(Arc::clone(&self.0))
    }
}

impl<T: DraPlugin> tower::Service<http::Request<Body>> for DraServer<T> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let p = Arc::clone(&self.0);
        Box::pin(async move {
            Ok(match req.uri().path() {
                PREPARE_V1 | PREPARE_V1BETA1 => {
                    unary(req, move |r: NodePrepareResourcesRequest| p.prepare(r)).await
                }
                UNPREPARE_V1 | UNPREPARE_V1BETA1 => {
                    unary(req, move |r: NodeUnprepareResourcesRequest| p.unprepare(r)).await
                }
                WATCH_HEALTH_V1 | WATCH_HEALTH_V1BETA1 | WATCH_HEALTH_V1ALPHA1 => {
                    let svc = tower::service_fn(move |_: Request<NodeWatchResourcesRequest>| {
                        let stream = p.watch_health();
                        async move { Ok::<_, Status>(Response::new(stream)) }
                    });
                    tonic::server::Grpc::new(ProstCodec::<
                        NodeWatchResourcesResponse,
                        NodeWatchResourcesRequest,
                    >::default())
                    .server_streaming(svc, req)
                    .await
                }
                _ => unimplemented(),
            })
        })
    }
}

impl<T> tonic::server::NamedService for DraServer<T> {
    const NAME: &'static str = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin";
}

/// The same service under its other names (the v1beta1 plugin service for kubelet 1.32–1.33,
/// the health service's three packages); tonic routes by name.
macro_rules! alias {
    ($ty:ident, $name:literal) => {
        pub struct $ty<T>(pub DraServer<T>);

        impl<T> Clone for $ty<T> {
            fn clone(&self) -> Self {
                $ty(self.0.clone())
            }
        }

        impl<T: DraPlugin> tower::Service<http::Request<Body>> for $ty<T> {
            type Response = http::Response<Body>;
            type Error = Infallible;
            type Future = BoxFuture<Result<Self::Response, Infallible>>;

            fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                self.0.poll_ready(cx)
            }

            fn call(&mut self, req: http::Request<Body>) -> Self::Future {
                self.0.call(req)
            }
        }

        impl<T> tonic::server::NamedService for $ty<T> {
            const NAME: &'static str = $name;
        }
    };
}

alias!(
    DraServerV1beta1,
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
);
alias!(HealthServerV1, "v1.DRAResourceHealth");
alias!(HealthServerV1beta1, "v1beta1.DRAResourceHealth");
alias!(HealthServerV1alpha1, "v1alpha1.DRAResourceHealth");

/// `pluginregistration.Registration` on the registry socket.
pub struct RegistrationServer<T>(pub Arc<T>);

impl<T> Clone for RegistrationServer<T> {
    fn clone(&self) -> Self {
        RegistrationServer(Arc::clone(&self.0))
    }
}

impl<T: DraPlugin> tower::Service<http::Request<Body>> for RegistrationServer<T> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let p = Arc::clone(&self.0);
        Box::pin(async move {
            Ok(match req.uri().path() {
                GET_INFO => unary(req, move |_: InfoRequest| async move { p.info() }).await,
                NOTIFY => {
                    unary(req, move |s: RegistrationStatus| async move {
                        p.registration_status(s);
                        RegistrationStatusResponse {}
                    })
                    .await
                }
                _ => unimplemented(),
            })
        })
    }
}

impl<T> tonic::server::NamedService for RegistrationServer<T> {
    const NAME: &'static str = "pluginregistration.Registration";
}

pub async fn get_info(ch: &Channel) -> Result<PluginInfo, Status> {
    call(ch, GET_INFO, InfoRequest {}).await
}

pub async fn notify(ch: &Channel, s: RegistrationStatus) -> Result<(), Status> {
    call::<_, RegistrationStatusResponse>(ch, NOTIFY, s)
        .await
        .map(|_| ())
}

/// NodePrepareResources on service `path` ([`PREPARE_V1`] or [`PREPARE_V1BETA1`]).
pub async fn prepare(
    ch: &Channel,
    path: &'static str,
    req: NodePrepareResourcesRequest,
) -> Result<NodePrepareResourcesResponse, Status> {
    call(ch, path, req).await
}

pub async fn unprepare(
    ch: &Channel,
    path: &'static str,
    req: NodeUnprepareResourcesRequest,
) -> Result<NodeUnprepareResourcesResponse, Status> {
    call(ch, path, req).await
}

/// `NodeWatchResources` on service `path` (one of the `WATCH_HEALTH_*`), as kubelet calls it.
pub async fn watch_health(
    ch: &Channel,
    path: &'static str,
) -> Result<tonic::codec::Streaming<NodeWatchResourcesResponse>, Status> {
    stream(ch, path, NodeWatchResourcesRequest {}).await
}
