//! kubelet's DRA plugin service (`k8s.io.kubelet.pkg.apis.dra.v1` and `…v1beta1`, the same
//! messages on the wire but for `Device.share_id`, which v1beta1 peers skip) and the plugin
//! registration service (`pluginregistration`), as prost messages written from the documented
//! protos (message names, field numbers and types); no `protoc` involved.
//!
//! The health service (`DRAResourceHealth`, KEP-4680) is the same messages under three packages:
//! `v1alpha1` (kubelet 1.34-1.36), `v1beta1` and `v1` (1.37); kubelet calls it when the
//! registration lists it.
//!
//! Ref: k8s.io/kubelet/pkg/apis/dra/v1/api.proto, dra/v1beta1/api.proto,
//! dra-health/v1/api.proto (and its v1alpha1, v1beta1), pluginregistration/v1/api.proto;
//! KEP-4381, KEP-4680.

use std::collections::HashMap;

pub const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
pub const UNPREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
pub const PREPARE_V1BETA1: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
pub const UNPREPARE_V1BETA1: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";
pub const WATCH_HEALTH_V1: &str = "/v1.DRAResourceHealth/NodeWatchResources";
pub const WATCH_HEALTH_V1BETA1: &str = "/v1beta1.DRAResourceHealth/NodeWatchResources";
pub const WATCH_HEALTH_V1ALPHA1: &str = "/v1alpha1.DRAResourceHealth/NodeWatchResources";
pub const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
pub const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";

/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// The services this plugin serves, newest first: kubelet 1.34+ takes the first DRAPlugin it
/// knows, 1.32–1.33 take v1beta1; a kubelet with the health gate watches the first
/// DRAResourceHealth it knows. Unknown entries are skipped by every kubelet.
pub const SUPPORTED_VERSIONS: [&str; 5] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1beta1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
];
/// kubelet's plugin registry (inotify-watched) and the plugins' own directory.
pub const PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry";
pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Claim {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesResponse {
    /// Claim UID → result; every claim of the request has one.
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodePrepareResourceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourceResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
    /// Non-empty: this claim failed; kubelet retries it.
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Device {
    #[prost(string, repeated, tag = "1")]
    pub request_names: Vec<String>,
    #[prost(string, tag = "2")]
    pub pool_name: String,
    #[prost(string, tag = "3")]
    pub device_name: String,
    #[prost(string, repeated, tag = "4")]
    pub cdi_device_ids: Vec<String>,
    /// v1 only (1.35+): the share of a device allocated more than once.
    #[prost(string, tag = "5")]
    pub share_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesResponse {
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodeUnprepareResourceResponse>,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct NodeUnprepareResourceResponse {
    #[prost(string, tag = "1")]
    pub error: String,
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct InfoRequest {}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PluginInfo {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub name: String,
    /// Absolute path of the DRA socket.
    #[prost(string, tag = "3")]
    pub endpoint: String,
    #[prost(string, repeated, tag = "4")]
    pub supported_versions: Vec<String>,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RegistrationStatus {
    #[prost(bool, tag = "1")]
    pub plugin_registered: bool,
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct RegistrationStatusResponse {}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct NodeWatchResourcesRequest {}

/// `HealthStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum HealthStatus {
    Unknown = 0,
    Healthy = 1,
    Unhealthy = 2,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DeviceIdentifier {
    #[prost(string, tag = "1")]
    pub pool_name: String,
    #[prost(string, tag = "2")]
    pub device_name: String,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DeviceHealth {
    #[prost(message, optional, tag = "1")]
    pub device: Option<DeviceIdentifier>,
    #[prost(enumeration = "HealthStatus", tag = "2")]
    pub health: i32,
    /// Unix seconds of the check.
    #[prost(int64, tag = "3")]
    pub last_updated_time: i64,
    /// kubelet turns the device Unknown when no update came for this long (0: its default,
    /// 30 s). v1alpha1 kubelets skip it.
    #[prost(int64, tag = "4")]
    pub health_check_timeout_seconds: i64,
    /// Why, for an unhealthy device (at most 1024 characters). v1alpha1 kubelets skip it.
    #[prost(string, tag = "5")]
    pub message: String,
}

/// Every device of the driver: kubelet reconciles its cache with the whole list.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct NodeWatchResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<DeviceHealth>,
}
