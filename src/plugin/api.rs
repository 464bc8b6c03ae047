//! kubelet's device plugin API v1beta1 (package `v1beta1`) and, at the end, the PodResources v1
//! `List` that `accel-ctk pods` reads, as prost messages. Written from the documented API
//! (message names, field numbers and types); no `protoc` involved.
//!
//! Ref: k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 (api.proto, constants.go),
//! <https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/>

use std::collections::HashMap;

pub const VERSION: &str = "v1beta1";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
pub const KUBELET_SOCKET: &str = "kubelet.sock";
pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";

pub const REGISTER: &str = "/v1beta1.Registration/Register";
pub const GET_OPTIONS: &str = "/v1beta1.DevicePlugin/GetDevicePluginOptions";
pub const LIST_AND_WATCH: &str = "/v1beta1.DevicePlugin/ListAndWatch";
pub const GET_PREFERRED: &str = "/v1beta1.DevicePlugin/GetPreferredAllocation";
pub const ALLOCATE: &str = "/v1beta1.DevicePlugin/Allocate";
pub const PRE_START: &str = "/v1beta1.DevicePlugin/PreStartContainer";

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct DevicePluginOptions {
    #[prost(bool, tag = "1")]
    pub pre_start_required: bool,
    #[prost(bool, tag = "2")]
    pub get_preferred_allocation_available: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterRequest {
    #[prost(string, tag = "1")]
    pub version: String,
    /// The plugin socket's name, relative to kubelet's device-plugin directory.
    #[prost(string, tag = "2")]
    pub endpoint: String,
    #[prost(string, tag = "3")]
    pub resource_name: String,
    #[prost(message, optional, tag = "4")]
    pub options: Option<DevicePluginOptions>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListAndWatchResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub health: String,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreStartContainerRequest {
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct PreStartContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerPreferredAllocationRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationRequest {
    #[prost(string, repeated, tag = "1")]
    pub available_device_ids: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub must_include_device_ids: Vec<String>,
    #[prost(int32, tag = "3")]
    pub allocation_size: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerPreferredAllocationResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationResponse {
    #[prost(string, repeated, tag = "1")]
    pub device_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerAllocateRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateRequest {
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    /// Fully qualified: `vendor.com/class=name`.
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerAllocateResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateResponse {
    #[prost(map = "string, string", tag = "1")]
    pub envs: HashMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "3")]
    pub devices: Vec<DeviceSpec>,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: HashMap<String, String>,
    #[prost(message, repeated, tag = "5")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub read_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeviceSpec {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    /// cgroup permissions: `r`, `w`, `m`.
    #[prost(string, tag = "3")]
    pub permissions: String,
}

impl From<super::allocate::Answer> for ContainerAllocateResponse {
    fn from(a: super::allocate::Answer) -> Self {
        ContainerAllocateResponse {
            envs: a.envs.into_iter().collect(),
            mounts: a
                .mounts
                .into_iter()
                .map(|m| Mount {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            devices: a
                .devices
                .into_iter()
                .map(|d| DeviceSpec {
                    container_path: d.container_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
            annotations: a.annotations.into_iter().collect(),
            cdi_devices: a
                .cdi_devices
                .into_iter()
                .map(|name| CdiDevice { name })
                .collect(),
        }
    }
}

/// kubelet's PodResources API v1 (`List`, GA): which devices kubelet gave each container,
/// read by `accel-ctk pods`. Only the fields read here; prost skips the others (CPU IDs,
/// memory, dynamic resources).
///
/// Ref: k8s.io/kubelet/pkg/apis/podresources/v1 (api.proto),
/// <https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/#monitoring-device-plugin-resources>
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
pub const POD_RESOURCES_LIST: &str = "/v1.PodResourcesLister/List";

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct ListPodResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}
