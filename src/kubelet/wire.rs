//! Every field number and method path of kubelet's protocols as this build compiled them
//! (`proto/*.proto`, read back from the descriptor set the build script keeps), held against
//! the numbers the APIs publish, written out below by hand from their documentation. A typo
//! in a `.proto` file (a number, a type, a package, a method name) fails here; a test that
//! talks to a stand-in built from the same files could not notice it.
//!
//! Ref: k8s.io/kubelet/pkg/apis: deviceplugin/v1beta1, pluginregistration/v1, dra/v1 and
//! v1beta1, dra-health/v1 (and v1alpha1), podresources/v1 (api.proto of each);
//! k8s.io/cri-api/pkg/apis/runtime/v1/api.proto.

use std::collections::BTreeSet;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};

/// (message, field, number, type) as the APIs document them. A type is the proto type, with
/// `repeated `/`optional ` before it where so; `map` for a map; `.Name` for a message or enum.
const FIELDS: &[(&str, &str, i32, &str)] = &[
    // Device plugin v1beta1.
    (
        "v1beta1.DevicePluginOptions",
        "pre_start_required",
        1,
        "bool",
    ),
    (
        "v1beta1.DevicePluginOptions",
        "get_preferred_allocation_available",
        2,
        "bool",
    ),
    ("v1beta1.RegisterRequest", "version", 1, "string"),
    ("v1beta1.RegisterRequest", "endpoint", 2, "string"),
    ("v1beta1.RegisterRequest", "resource_name", 3, "string"),
    (
        "v1beta1.RegisterRequest",
        "options",
        4,
        ".v1beta1.DevicePluginOptions",
    ),
    (
        "v1beta1.ListAndWatchResponse",
        "devices",
        1,
        "repeated .v1beta1.Device",
    ),
    (
        "v1beta1.TopologyInfo",
        "nodes",
        1,
        "repeated .v1beta1.NUMANode",
    ),
    ("v1beta1.NUMANode", "id", 1, "int64"),
    ("v1beta1.Device", "id", 1, "string"),
    ("v1beta1.Device", "health", 2, "string"),
    ("v1beta1.Device", "topology", 3, ".v1beta1.TopologyInfo"),
    (
        "v1beta1.PreStartContainerRequest",
        "devices_ids",
        1,
        "repeated string",
    ),
    (
        "v1beta1.PreferredAllocationRequest",
        "container_requests",
        1,
        "repeated .v1beta1.ContainerPreferredAllocationRequest",
    ),
    (
        "v1beta1.ContainerPreferredAllocationRequest",
        "available_device_ids",
        1,
        "repeated string",
    ),
    (
        "v1beta1.ContainerPreferredAllocationRequest",
        "must_include_device_ids",
        2,
        "repeated string",
    ),
    (
        "v1beta1.ContainerPreferredAllocationRequest",
        "allocation_size",
        3,
        "int32",
    ),
    (
        "v1beta1.PreferredAllocationResponse",
        "container_responses",
        1,
        "repeated .v1beta1.ContainerPreferredAllocationResponse",
    ),
    (
        "v1beta1.ContainerPreferredAllocationResponse",
        "device_ids",
        1,
        "repeated string",
    ),
    (
        "v1beta1.AllocateRequest",
        "container_requests",
        1,
        "repeated .v1beta1.ContainerAllocateRequest",
    ),
    (
        "v1beta1.ContainerAllocateRequest",
        "devices_ids",
        1,
        "repeated string",
    ),
    (
        "v1beta1.AllocateResponse",
        "container_responses",
        1,
        "repeated .v1beta1.ContainerAllocateResponse",
    ),
    ("v1beta1.ContainerAllocateResponse", "envs", 1, "map"),
    (
        "v1beta1.ContainerAllocateResponse",
        "mounts",
        2,
        "repeated .v1beta1.Mount",
    ),
    (
        "v1beta1.ContainerAllocateResponse",
        "devices",
        3,
        "repeated .v1beta1.DeviceSpec",
    ),
    ("v1beta1.ContainerAllocateResponse", "annotations", 4, "map"),
    (
        "v1beta1.ContainerAllocateResponse",
        "cdi_devices",
        5,
        "repeated .v1beta1.CDIDevice",
    ),
    ("v1beta1.Mount", "container_path", 1, "string"),
    ("v1beta1.Mount", "host_path", 2, "string"),
    ("v1beta1.Mount", "read_only", 3, "bool"),
    ("v1beta1.DeviceSpec", "container_path", 1, "string"),
    ("v1beta1.DeviceSpec", "host_path", 2, "string"),
    ("v1beta1.DeviceSpec", "permissions", 3, "string"),
    ("v1beta1.CDIDevice", "name", 1, "string"),
    // Plugin registration (package pluginregistration, the API's v1).
    ("pluginregistration.PluginInfo", "type", 1, "string"),
    ("pluginregistration.PluginInfo", "name", 2, "string"),
    ("pluginregistration.PluginInfo", "endpoint", 3, "string"),
    (
        "pluginregistration.PluginInfo",
        "supported_versions",
        4,
        "repeated string",
    ),
    (
        "pluginregistration.RegistrationStatus",
        "plugin_registered",
        1,
        "bool",
    ),
    (
        "pluginregistration.RegistrationStatus",
        "error",
        2,
        "string",
    ),
    // DRA v1 (v1beta1's service uses the same messages).
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.Claim",
        "namespace",
        1,
        "string",
    ),
    ("k8s.io.kubelet.pkg.apis.dra.v1.Claim", "uid", 2, "string"),
    ("k8s.io.kubelet.pkg.apis.dra.v1.Claim", "name", 3, "string"),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest",
        "claims",
        1,
        "repeated .k8s.io.kubelet.pkg.apis.dra.v1.Claim",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse",
        "claims",
        1,
        "map",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourceResponse",
        "devices",
        1,
        "repeated .k8s.io.kubelet.pkg.apis.dra.v1.Device",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourceResponse",
        "error",
        2,
        "string",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.Device",
        "request_names",
        1,
        "repeated string",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.Device",
        "pool_name",
        2,
        "string",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.Device",
        "device_name",
        3,
        "string",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.Device",
        "cdi_device_ids",
        4,
        "repeated string",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.Device",
        "share_id",
        5,
        "optional string",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesRequest",
        "claims",
        1,
        "repeated .k8s.io.kubelet.pkg.apis.dra.v1.Claim",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse",
        "claims",
        1,
        "map",
    ),
    (
        "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourceResponse",
        "error",
        1,
        "string",
    ),
    // DRA health v1 (v1beta1's and v1alpha1's services use the same messages).
    ("v1.DeviceIdentifier", "pool_name", 1, "string"),
    ("v1.DeviceIdentifier", "device_name", 2, "string"),
    ("v1.DeviceHealth", "device", 1, ".v1.DeviceIdentifier"),
    ("v1.DeviceHealth", "health", 2, ".v1.HealthStatus"),
    ("v1.DeviceHealth", "last_updated_time", 3, "int64"),
    (
        "v1.DeviceHealth",
        "health_check_timeout_seconds",
        4,
        "int64",
    ),
    ("v1.DeviceHealth", "message", 5, "string"),
    (
        "v1.NodeWatchResourcesResponse",
        "devices",
        1,
        "repeated .v1.DeviceHealth",
    ),
    // PodResources v1.
    (
        "v1.ListPodResourcesResponse",
        "pod_resources",
        1,
        "repeated .v1.PodResources",
    ),
    ("v1.PodResources", "name", 1, "string"),
    ("v1.PodResources", "namespace", 2, "string"),
    (
        "v1.PodResources",
        "containers",
        3,
        "repeated .v1.ContainerResources",
    ),
    ("v1.ContainerResources", "name", 1, "string"),
    (
        "v1.ContainerResources",
        "devices",
        2,
        "repeated .v1.ContainerDevices",
    ),
    (
        "v1.ContainerResources",
        "dynamic_resources",
        5,
        "repeated .v1.DynamicResource",
    ),
    ("v1.ContainerDevices", "resource_name", 1, "string"),
    ("v1.ContainerDevices", "device_ids", 2, "repeated string"),
    ("v1.ContainerDevices", "topology", 3, ".v1.TopologyInfo"),
    ("v1.TopologyInfo", "nodes", 1, "repeated .v1.NUMANode"),
    ("v1.NUMANode", "id", 1, "int64"),
    ("v1.DynamicResource", "claim_name", 2, "string"),
    ("v1.DynamicResource", "claim_namespace", 3, "string"),
    (
        "v1.DynamicResource",
        "claim_resources",
        4,
        "repeated .v1.ClaimResource",
    ),
    (
        "v1.ClaimResource",
        "cdi_devices",
        1,
        "repeated .v1.CDIDevice",
    ),
    ("v1.ClaimResource", "driver_name", 2, "string"),
    ("v1.ClaimResource", "pool_name", 3, "string"),
    ("v1.ClaimResource", "device_name", 4, "string"),
    ("v1.ClaimResource", "share_id", 5, "optional string"),
    ("v1.CDIDevice", "name", 1, "string"),
    // CRI runtime.v1: the part tests/e2e_cri.rs drives.
    ("runtime.v1.VersionRequest", "version", 1, "string"),
    ("runtime.v1.VersionResponse", "runtime_name", 2, "string"),
    ("runtime.v1.VersionResponse", "runtime_version", 3, "string"),
    (
        "runtime.v1.VersionResponse",
        "runtime_api_version",
        4,
        "string",
    ),
    ("runtime.v1.PodSandboxMetadata", "name", 1, "string"),
    ("runtime.v1.PodSandboxMetadata", "uid", 2, "string"),
    ("runtime.v1.PodSandboxMetadata", "namespace", 3, "string"),
    ("runtime.v1.PodSandboxMetadata", "attempt", 4, "uint32"),
    ("runtime.v1.IDMapping", "host_id", 1, "uint32"),
    ("runtime.v1.IDMapping", "container_id", 2, "uint32"),
    ("runtime.v1.IDMapping", "length", 3, "uint32"),
    (
        "runtime.v1.UserNamespace",
        "mode",
        1,
        ".runtime.v1.NamespaceMode",
    ),
    (
        "runtime.v1.UserNamespace",
        "uids",
        2,
        "repeated .runtime.v1.IDMapping",
    ),
    (
        "runtime.v1.UserNamespace",
        "gids",
        3,
        "repeated .runtime.v1.IDMapping",
    ),
    (
        "runtime.v1.NamespaceOption",
        "network",
        1,
        ".runtime.v1.NamespaceMode",
    ),
    (
        "runtime.v1.NamespaceOption",
        "pid",
        2,
        ".runtime.v1.NamespaceMode",
    ),
    (
        "runtime.v1.NamespaceOption",
        "ipc",
        3,
        ".runtime.v1.NamespaceMode",
    ),
    (
        "runtime.v1.NamespaceOption",
        "userns_options",
        5,
        ".runtime.v1.UserNamespace",
    ),
    (
        "runtime.v1.LinuxSandboxSecurityContext",
        "namespace_options",
        1,
        ".runtime.v1.NamespaceOption",
    ),
    (
        "runtime.v1.LinuxPodSandboxConfig",
        "cgroup_parent",
        1,
        "string",
    ),
    (
        "runtime.v1.LinuxPodSandboxConfig",
        "security_context",
        2,
        ".runtime.v1.LinuxSandboxSecurityContext",
    ),
    (
        "runtime.v1.PodSandboxConfig",
        "metadata",
        1,
        ".runtime.v1.PodSandboxMetadata",
    ),
    ("runtime.v1.PodSandboxConfig", "hostname", 2, "string"),
    ("runtime.v1.PodSandboxConfig", "log_directory", 3, "string"),
    ("runtime.v1.PodSandboxConfig", "annotations", 7, "map"),
    (
        "runtime.v1.PodSandboxConfig",
        "linux",
        8,
        ".runtime.v1.LinuxPodSandboxConfig",
    ),
    (
        "runtime.v1.RunPodSandboxRequest",
        "config",
        1,
        ".runtime.v1.PodSandboxConfig",
    ),
    (
        "runtime.v1.RunPodSandboxRequest",
        "runtime_handler",
        2,
        "string",
    ),
    (
        "runtime.v1.RunPodSandboxResponse",
        "pod_sandbox_id",
        1,
        "string",
    ),
    (
        "runtime.v1.PodSandboxIdRequest",
        "pod_sandbox_id",
        1,
        "string",
    ),
    ("runtime.v1.ContainerMetadata", "name", 1, "string"),
    ("runtime.v1.ContainerMetadata", "attempt", 2, "uint32"),
    ("runtime.v1.ImageSpec", "image", 1, "string"),
    ("runtime.v1.KeyValue", "key", 1, "string"),
    ("runtime.v1.KeyValue", "value", 2, "string"),
    ("runtime.v1.Mount", "container_path", 1, "string"),
    ("runtime.v1.Mount", "host_path", 2, "string"),
    ("runtime.v1.Mount", "readonly", 3, "bool"),
    ("runtime.v1.Device", "container_path", 1, "string"),
    ("runtime.v1.Device", "host_path", 2, "string"),
    ("runtime.v1.Device", "permissions", 3, "string"),
    ("runtime.v1.CDIDevice", "name", 1, "string"),
    (
        "runtime.v1.LinuxContainerResources",
        "cpu_period",
        1,
        "int64",
    ),
    (
        "runtime.v1.LinuxContainerResources",
        "cpu_quota",
        2,
        "int64",
    ),
    (
        "runtime.v1.LinuxContainerResources",
        "cpu_shares",
        3,
        "int64",
    ),
    (
        "runtime.v1.LinuxContainerResources",
        "memory_limit_in_bytes",
        4,
        "int64",
    ),
    (
        "runtime.v1.LinuxContainerResources",
        "oom_score_adj",
        5,
        "int64",
    ),
    (
        "runtime.v1.LinuxContainerResources",
        "cpuset_cpus",
        6,
        "string",
    ),
    (
        "runtime.v1.LinuxContainerResources",
        "cpuset_mems",
        7,
        "string",
    ),
    (
        "runtime.v1.LinuxContainerSecurityContext",
        "namespace_options",
        3,
        ".runtime.v1.NamespaceOption",
    ),
    (
        "runtime.v1.LinuxContainerConfig",
        "resources",
        1,
        ".runtime.v1.LinuxContainerResources",
    ),
    (
        "runtime.v1.LinuxContainerConfig",
        "security_context",
        2,
        ".runtime.v1.LinuxContainerSecurityContext",
    ),
    (
        "runtime.v1.ContainerConfig",
        "metadata",
        1,
        ".runtime.v1.ContainerMetadata",
    ),
    (
        "runtime.v1.ContainerConfig",
        "image",
        2,
        ".runtime.v1.ImageSpec",
    ),
    (
        "runtime.v1.ContainerConfig",
        "command",
        3,
        "repeated string",
    ),
    (
        "runtime.v1.ContainerConfig",
        "envs",
        6,
        "repeated .runtime.v1.KeyValue",
    ),
    (
        "runtime.v1.ContainerConfig",
        "mounts",
        7,
        "repeated .runtime.v1.Mount",
    ),
    (
        "runtime.v1.ContainerConfig",
        "devices",
        8,
        "repeated .runtime.v1.Device",
    ),
    ("runtime.v1.ContainerConfig", "annotations", 10, "map"),
    ("runtime.v1.ContainerConfig", "log_path", 11, "string"),
    (
        "runtime.v1.ContainerConfig",
        "linux",
        15,
        ".runtime.v1.LinuxContainerConfig",
    ),
    (
        "runtime.v1.ContainerConfig",
        "cdi_devices",
        17,
        "repeated .runtime.v1.CDIDevice",
    ),
    (
        "runtime.v1.CreateContainerRequest",
        "pod_sandbox_id",
        1,
        "string",
    ),
    (
        "runtime.v1.CreateContainerRequest",
        "config",
        2,
        ".runtime.v1.ContainerConfig",
    ),
    (
        "runtime.v1.CreateContainerRequest",
        "sandbox_config",
        3,
        ".runtime.v1.PodSandboxConfig",
    ),
    ("runtime.v1.ContainerIdMessage", "container_id", 1, "string"),
    ("runtime.v1.ExecSyncRequest", "container_id", 1, "string"),
    ("runtime.v1.ExecSyncRequest", "cmd", 2, "repeated string"),
    ("runtime.v1.ExecSyncRequest", "timeout", 3, "int64"),
    ("runtime.v1.ExecSyncResponse", "stdout", 1, "bytes"),
    ("runtime.v1.ExecSyncResponse", "stderr", 2, "bytes"),
    ("runtime.v1.ExecSyncResponse", "exit_code", 3, "int32"),
    (
        "runtime.v1.UpdateContainerResourcesRequest",
        "container_id",
        1,
        "string",
    ),
    (
        "runtime.v1.UpdateContainerResourcesRequest",
        "linux",
        2,
        ".runtime.v1.LinuxContainerResources",
    ),
];

/// Enum values as documented: (enum, value, number).
const ENUM_VALUES: &[(&str, &str, i32)] = &[
    ("v1.HealthStatus", "UNKNOWN", 0),
    ("v1.HealthStatus", "HEALTHY", 1),
    ("v1.HealthStatus", "UNHEALTHY", 2),
    ("runtime.v1.NamespaceMode", "POD", 0),
    ("runtime.v1.NamespaceMode", "CONTAINER", 1),
    ("runtime.v1.NamespaceMode", "NODE", 2),
    ("runtime.v1.NamespaceMode", "TARGET", 3),
];

/// Every gRPC method path kubelet (or containerd, for the CRI) calls or serves.
const METHODS: &[&str] = &[
    "/v1beta1.Registration/Register",
    "/v1beta1.DevicePlugin/GetDevicePluginOptions",
    "/v1beta1.DevicePlugin/ListAndWatch",
    "/v1beta1.DevicePlugin/GetPreferredAllocation",
    "/v1beta1.DevicePlugin/Allocate",
    "/v1beta1.DevicePlugin/PreStartContainer",
    "/pluginregistration.Registration/GetInfo",
    "/pluginregistration.Registration/NotifyRegistrationStatus",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    "/v1.DRAResourceHealth/NodeWatchResources",
    "/v1beta1.DRAResourceHealth/NodeWatchResources",
    "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    "/v1.PodResourcesLister/List",
    "/runtime.v1.RuntimeService/Version",
    "/runtime.v1.RuntimeService/RunPodSandbox",
    "/runtime.v1.RuntimeService/StopPodSandbox",
    "/runtime.v1.RuntimeService/RemovePodSandbox",
    "/runtime.v1.RuntimeService/CreateContainer",
    "/runtime.v1.RuntimeService/StartContainer",
    "/runtime.v1.RuntimeService/RemoveContainer",
    "/runtime.v1.RuntimeService/ExecSync",
    "/runtime.v1.RuntimeService/UpdateContainerResources",
];

fn compiled() -> prost_types::FileDescriptorSet {
    let bytes = include_bytes!(concat!(env!("OUT_DIR"), "/kubelet.fds"));
    prost_types::FileDescriptorSet::decode(&bytes[..]).expect("the build script's descriptor set")
}

fn type_of(f: &prost_types::FieldDescriptorProto, maps: &BTreeSet<String>) -> String {
    let base = match f.r#type() {
        Type::Message | Type::Enum => f.type_name().to_string(),
        Type::String => "string".into(),
        Type::Bool => "bool".into(),
        Type::Int64 => "int64".into(),
        Type::Int32 => "int32".into(),
        Type::Uint32 => "uint32".into(),
        Type::Bytes => "bytes".into(),
        other => format!("{other:?}"),
    };
    if maps.contains(f.type_name()) {
        return "map".into();
    }
    match f.label() {
        Label::Repeated => format!("repeated {base}"),
        _ if f.proto3_optional() => format!("optional {base}"),
        _ => base,
    }
}

/// Every field and enum value of `fds` that is not as documented, and every documented one
/// it lacks, one line each.
fn differences(fds: &prost_types::FileDescriptorSet) -> Vec<String> {
    let mut seen = BTreeSet::new();
    for file in &fds.file {
        let package = file.package().to_string();
        let maps: BTreeSet<String> = file
            .message_type
            .iter()
            .flat_map(|m| {
                let parent = format!(".{package}.{}", m.name());
                m.nested_type
                    .iter()
                    .filter(|n| n.options.as_ref().is_some_and(|o| o.map_entry()))
                    .map(move |n| format!("{parent}.{}", n.name()))
            })
            .collect();
        for m in &file.message_type {
            for f in &m.field {
                seen.insert(format!(
                    "{package}.{}.{} = {} ({})",
                    m.name(),
                    f.name(),
                    f.number(),
                    type_of(f, &maps)
                ));
            }
        }
        for e in &file.enum_type {
            for v in &e.value {
                seen.insert(format!(
                    "{package}.{}.{} = {}",
                    e.name(),
                    v.name(),
                    v.number()
                ));
            }
        }
    }
    let want: BTreeSet<String> = FIELDS
        .iter()
        .map(|(m, f, n, t)| format!("{m}.{f} = {n} ({t})"))
        .chain(ENUM_VALUES.iter().map(|(e, v, n)| format!("{e}.{v} = {n}")))
        .collect();
    let compiled = seen.difference(&want).map(|x| format!("compiled: {x}"));
    let documented = want.difference(&seen).map(|x| format!("documented: {x}"));
    compiled.chain(documented).collect()
}

#[test]
fn every_field_number_is_the_documented_one() {
    let diff = differences(&compiled());
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}

/// A wrong number in a `.proto` file shows: the same check of the compiled descriptors with
/// one number changed names that field.
#[test]
fn a_changed_number_is_noticed() {
    let mut fds = compiled();
    let field = fds
        .file
        .iter_mut()
        .flat_map(|f| f.message_type.iter_mut())
        .find(|m| m.name() == "ContainerAllocateResponse")
        .and_then(|m| m.field.iter_mut().find(|f| f.name() == "cdi_devices"))
        .expect("ContainerAllocateResponse.cdi_devices");
    field.number = Some(6);
    assert_eq!(
        differences(&fds),
        [
            "compiled: v1beta1.ContainerAllocateResponse.cdi_devices = 6 (repeated .v1beta1.CDIDevice)",
            "documented: v1beta1.ContainerAllocateResponse.cdi_devices = 5 (repeated .v1beta1.CDIDevice)",
        ]
    );
}

#[test]
fn every_method_path_is_the_documented_one() {
    let mut seen: Vec<String> = compiled()
        .file
        .iter()
        .flat_map(|f| {
            f.service.iter().flat_map(move |s| {
                s.method
                    .iter()
                    .map(move |m| format!("/{}.{}/{}", f.package(), s.name(), m.name()))
            })
        })
        .collect();
    seen.sort();
    seen.dedup();
    let mut want: Vec<String> = METHODS.iter().map(|m| m.to_string()).collect();
    want.sort();
    assert_eq!(seen, want);
}
