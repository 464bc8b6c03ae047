//! The stand-in kubelet's side of kubelet's protocols, over the clients and servers that the
//! library generates from its `.proto` files: the calls kubelet makes on a device plugin and on
//! a DRA driver, and the services kubelet serves (Registration, PodResources) answered by a
//! closure.

pub use accel_container_runtime::kubelet::client::connect;
use accel_container_runtime::kubelet::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use accel_container_runtime::kubelet::proto::deviceplugin::registration_server::{
    Registration, RegistrationServer,
};
use accel_container_runtime::kubelet::proto::deviceplugin::*;
use accel_container_runtime::kubelet::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use accel_container_runtime::kubelet::proto::podresources::{
    ListPodResourcesRequest, ListPodResourcesResponse,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// Method paths, for the tests that write kubelet's HTTP/2 frames themselves.
pub const GET_OPTIONS: &str = "/v1beta1.DevicePlugin/GetDevicePluginOptions";
pub const ALLOCATE: &str = "/v1beta1.DevicePlugin/Allocate";

pub async fn get_options(ch: &Channel) -> Result<DevicePluginOptions, Status> {
    DevicePluginClient::new(ch.clone())
        .get_device_plugin_options(Empty {})
        .await
        .map(Response::into_inner)
}

pub async fn get_preferred(
    ch: &Channel,
    req: PreferredAllocationRequest,
) -> Result<PreferredAllocationResponse, Status> {
    DevicePluginClient::new(ch.clone())
        .get_preferred_allocation(req)
        .await
        .map(Response::into_inner)
}

pub async fn allocate(ch: &Channel, req: AllocateRequest) -> Result<AllocateResponse, Status> {
    DevicePluginClient::new(ch.clone())
        .allocate(req)
        .await
        .map(Response::into_inner)
}

pub async fn list_and_watch(ch: &Channel) -> Result<Streaming<ListAndWatchResponse>, Status> {
    DevicePluginClient::new(ch.clone())
        .list_and_watch(Empty {})
        .await
        .map(Response::into_inner)
}

/// kubelet's `v1beta1.Registration`, each request answered by `f`.
pub struct Registrar<F>(F);

#[tonic::async_trait]
impl<F> Registration for Registrar<F>
where
    F: Fn(RegisterRequest) -> Result<(), Status> + Send + Sync + 'static,
{
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        (self.0)(req.into_inner()).map(|()| Response::new(Empty {}))
    }
}

pub fn registration_server<F>(f: F) -> RegistrationServer<Registrar<F>>
where
    F: Fn(RegisterRequest) -> Result<(), Status> + Send + Sync + 'static,
{
    RegistrationServer::new(Registrar(f))
}

/// kubelet's `v1.PodResourcesLister`, `List` answered with `f()`.
pub struct Lister<F>(F);

#[tonic::async_trait]
impl<F> PodResourcesLister for Lister<F>
where
    F: Fn() -> ListPodResourcesResponse + Send + Sync + 'static,
{
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new((self.0)()))
    }
}

pub fn pod_resources_server<F>(f: F) -> PodResourcesListerServer<Lister<F>>
where
    F: Fn() -> ListPodResourcesResponse + Send + Sync + 'static,
{
    PodResourcesListerServer::new(Lister(f))
}

/// kubelet's PodResources on `sock`, answering every List with `answer`, served on `rt` until
/// it shuts down.
pub fn serve_pod_resources(
    rt: &tokio::runtime::Runtime,
    sock: &std::path::Path,
    answer: ListPodResourcesResponse,
) {
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(sock) })
        .unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(pod_resources_server(move || answer.clone()))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
}

#[cfg(feature = "dra")]
pub use dra::*;

#[cfg(feature = "dra")]
mod dra {
    use super::*;
    use accel_container_runtime::kubelet::proto::dra::{
        self, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
        NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
    };
    use accel_container_runtime::kubelet::proto::health::{self, NodeWatchResourcesResponse};
    use accel_container_runtime::kubelet::proto::registration::registration_client::RegistrationClient;
    use accel_container_runtime::kubelet::proto::registration::{
        InfoRequest, PluginInfo, RegistrationStatus,
    };

    /// The DRA services' method paths: which version of a service a call goes to.
    pub const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
    pub const UNPREPARE_V1: &str =
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
    pub const PREPARE_V1BETA1: &str =
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
    pub const UNPREPARE_V1BETA1: &str =
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";
    pub const WATCH_HEALTH_V1: &str = "/v1.DRAResourceHealth/NodeWatchResources";
    pub const WATCH_HEALTH_V1BETA1: &str = "/v1beta1.DRAResourceHealth/NodeWatchResources";
    pub const WATCH_HEALTH_V1ALPHA1: &str = "/v1alpha1.DRAResourceHealth/NodeWatchResources";

    pub async fn get_info(ch: &Channel) -> Result<PluginInfo, Status> {
        RegistrationClient::new(ch.clone())
            .get_info(InfoRequest {})
            .await
            .map(Response::into_inner)
    }

    pub async fn notify(ch: &Channel, s: RegistrationStatus) -> Result<(), Status> {
        RegistrationClient::new(ch.clone())
            .notify_registration_status(s)
            .await
            .map(|_| ())
    }

    /// NodePrepareResources on the service `path` names ([`PREPARE_V1`], [`PREPARE_V1BETA1`]).
    pub async fn prepare(
        ch: &Channel,
        path: &str,
        req: NodePrepareResourcesRequest,
    ) -> Result<NodePrepareResourcesResponse, Status> {
        let r = match path {
            PREPARE_V1 => {
                dra::v1::dra_plugin_client::DraPluginClient::new(ch.clone())
                    .node_prepare_resources(req)
                    .await
            }
            PREPARE_V1BETA1 => {
                dra::v1beta1::dra_plugin_client::DraPluginClient::new(ch.clone())
                    .node_prepare_resources(req)
                    .await
            }
            other => panic!("not a NodePrepareResources path: {other}"),
        };
        r.map(Response::into_inner)
    }

    pub async fn unprepare(
        ch: &Channel,
        path: &str,
        req: NodeUnprepareResourcesRequest,
    ) -> Result<NodeUnprepareResourcesResponse, Status> {
        let r = match path {
            UNPREPARE_V1 => {
                dra::v1::dra_plugin_client::DraPluginClient::new(ch.clone())
                    .node_unprepare_resources(req)
                    .await
            }
            UNPREPARE_V1BETA1 => {
                dra::v1beta1::dra_plugin_client::DraPluginClient::new(ch.clone())
                    .node_unprepare_resources(req)
                    .await
            }
            other => panic!("not a NodeUnprepareResources path: {other}"),
        };
        r.map(Response::into_inner)
    }

    /// `NodeWatchResources` on the service `path` names (one of the `WATCH_HEALTH_*`).
    pub async fn watch_health(
        ch: &Channel,
        path: &str,
    ) -> Result<Streaming<NodeWatchResourcesResponse>, Status> {
        let req = health::NodeWatchResourcesRequest {};
        let r = match path {
            WATCH_HEALTH_V1 => {
                health::v1::dra_resource_health_client::DraResourceHealthClient::new(ch.clone())
                    .node_watch_resources(req)
                    .await
            }
            WATCH_HEALTH_V1BETA1 => {
                health::v1beta1::dra_resource_health_client::DraResourceHealthClient::new(
                    ch.clone(),
                )
                .node_watch_resources(req)
                .await
            }
            WATCH_HEALTH_V1ALPHA1 => {
                health::v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
                    ch.clone(),
                )
                .node_watch_resources(req)
                .await
            }
            other => panic!("not a NodeWatchResources path: {other}"),
        };
        r.map(Response::into_inner)
    }
}
