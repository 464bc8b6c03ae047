//! The gRPC glue for the two v1beta1 services, written by hand over tonic's codegen
//! helpers (what `tonic-prost-build` would generate, without a build script): a router per
//! service that decodes with prost and hands each call to a plain async function, and the
//! client calls the plugin (Register) and the tests' stand-in kubelet make.

use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use super::api::*;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
pub type DeviceStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

/// What a device plugin answers; implemented by [`super::server::Plugin`].
pub trait DevicePlugin: Send + Sync + 'static {
    fn options(&self) -> DevicePluginOptions;
    fn list_and_watch(&self) -> DeviceStream;
    fn preferred(
        &self,
        req: PreferredAllocationRequest,
    ) -> Result<PreferredAllocationResponse, Status>;
    fn allocate(&self, req: AllocateRequest) -> Result<AllocateResponse, Status>;
}

/// `v1beta1.DevicePlugin` server over any [`DevicePlugin`].
pub struct DevicePluginServer<T>(pub Arc<T>);

impl<T> Clone for DevicePluginServer<T> {
    fn clone(&self) -> Self {
        DevicePluginServer(Arc::clone(&self.0))
    }
}

/// The answer to a method no service here has (the DRA driver's routers use it too).
pub(crate) fn unimplemented() -> http::Response<Body> {
    let mut r = http::Response::new(Body::default());
    r.headers_mut().insert(
        "grpc-status",
        http::HeaderValue::from(tonic::Code::Unimplemented as i32),
    );
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    r
}

/// A unary call answered by `f`.
async fn unary<Req, Resp, F>(req: http::Request<Body>, f: F) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(Req) -> Result<Resp, Status> + Send + Clone + 'static,
{
    let svc = tower::service_fn(move |r: Request<Req>| {
        let f = f.clone();
        async move { f(r.into_inner()).map(Response::new) }
    });
    tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default())
        .unary(svc, req)
        .await
}

impl<T: DevicePlugin> tower::Service<http::Request<Body>> for DevicePluginServer<T> {
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
                GET_OPTIONS => unary(req, move |_: Empty| Ok(p.options())).await,
                GET_PREFERRED => unary(req, move |r| p.preferred(r)).await,
                ALLOCATE => unary(req, move |r| p.allocate(r)).await,
                PRE_START => {
                    unary(req, |_: PreStartContainerRequest| {
                        Ok(PreStartContainerResponse {})
                    })
                    .await
                }
                LIST_AND_WATCH => {
                    let svc = tower::service_fn(move |_: Request<Empty>| {
                        let stream = p.list_and_watch();
                        async move { Ok::<_, Status>(Response::new(stream)) }
                    });
                    tonic::server::Grpc::new(ProstCodec::<ListAndWatchResponse, Empty>::default())
                        .server_streaming(svc, req)
                        .await
                }
                _ => unimplemented(),
            })
        })
    }
}

impl<T> tonic::server::NamedService for DevicePluginServer<T> {
    const NAME: &'static str = "v1beta1.DevicePlugin";
}

/// `v1beta1.Registration` server calling `f` for each request (the tests' stand-in kubelet).
#[derive(Clone)]
pub struct RegistrationServer<F>(pub F);

impl<F> tower::Service<http::Request<Body>> for RegistrationServer<F>
where
    F: Fn(RegisterRequest) -> Result<(), Status> + Clone + Send + Sync + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let f = self.0.clone();
        Box::pin(async move {
            Ok(match req.uri().path() {
                REGISTER => unary(req, move |r: RegisterRequest| f(r).map(|()| Empty {})).await,
                _ => unimplemented(),
            })
        })
    }
}

impl<F> tonic::server::NamedService for RegistrationServer<F> {
    const NAME: &'static str = "v1beta1.Registration";
}

/// `v1.PodResourcesLister` server answering `List` with `f()` (the tests' stand-in kubelet).
#[derive(Clone)]
pub struct PodResourcesServer<F>(pub F);

impl<F> tower::Service<http::Request<Body>> for PodResourcesServer<F>
where
    F: Fn() -> ListPodResourcesResponse + Clone + Send + Sync + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let f = self.0.clone();
        Box::pin(async move {
            Ok(match req.uri().path() {
                POD_RESOURCES_LIST => unary(req, move |_: ListPodResourcesRequest| Ok(f())).await,
                _ => unimplemented(),
            })
        })
    }
}

impl<F> tonic::server::NamedService for PodResourcesServer<F> {
    const NAME: &'static str = "v1.PodResourcesLister";
}

/// A channel to a unix socket. The URI is a placeholder: the connector ignores it, and
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

/// A unary client call of method `path` (the DRA driver's client calls and the CRI test's use
/// it too).
pub async fn call<Req, Resp>(ch: &Channel, path: &'static str, req: Req) -> Result<Resp, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    grpc.unary(
        Request::new(req),
        http::uri::PathAndQuery::from_static(path),
        ProstCodec::<Req, Resp>::default(),
    )
    .await
    .map(Response::into_inner)
}

pub async fn register(ch: &Channel, req: RegisterRequest) -> Result<(), Status> {
    call::<_, Empty>(ch, REGISTER, req).await.map(|_| ())
}

pub async fn get_options(ch: &Channel) -> Result<DevicePluginOptions, Status> {
    call(ch, GET_OPTIONS, Empty {}).await
}

pub async fn get_preferred(
    ch: &Channel,
    req: PreferredAllocationRequest,
) -> Result<PreferredAllocationResponse, Status> {
    call(ch, GET_PREFERRED, req).await
}

pub async fn allocate(ch: &Channel, req: AllocateRequest) -> Result<AllocateResponse, Status> {
    call(ch, ALLOCATE, req).await
}

/// A server-streaming client call of method `path` (the DRA driver's health watch uses it too).
pub(crate) async fn stream<Req, Resp>(
    ch: &Channel,
    path: &'static str,
    req: Req,
) -> Result<Streaming<Resp>, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    grpc.server_streaming(
        Request::new(req),
        http::uri::PathAndQuery::from_static(path),
        ProstCodec::<Req, Resp>::default(),
    )
    .await
    .map(Response::into_inner)
}

pub async fn list_and_watch(ch: &Channel) -> Result<Streaming<ListAndWatchResponse>, Status> {
    stream(ch, LIST_AND_WATCH, Empty {}).await
}

/// PodResources `List`: every pod's containers and the devices kubelet gave each.
pub async fn list_pod_resources(ch: &Channel) -> Result<ListPodResourcesResponse, Status> {
    call(ch, POD_RESOURCES_LIST, ListPodResourcesRequest {}).await
}
