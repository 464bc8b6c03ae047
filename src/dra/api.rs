//! kubelet's DRA plugin service (`k8s.io.kubelet.pkg.apis.dra.v1` and `…v1beta1`, the same
//! messages on the wire but for `Device.share_id`, which v1beta1 peers skip) and the plugin
//! registration service (`pluginregistration`), as prost messages written from the documented
//! protos (message names, field numbers and types); no `protoc` involved.
//!
//! Ref: k8s.io/kubelet/pkg/apis/dra/v1/api.proto, dra/v1beta1/api.proto,
//! pluginregistration/v1/api.proto; KEP-4381.

use std::collections::HashMap;

pub const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
pub const UNPREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
pub const PREPARE_V1BETA1: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
pub const UNPREPARE_V1BETA1: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";
pub const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
pub const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";

/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// The services this plugin serves, newest first: kubelet 1.34+ takes the first it knows,
/// 1.32–1.33 take v1beta1.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
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
