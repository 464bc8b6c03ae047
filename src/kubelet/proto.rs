//! kubelet's protocols as Rust: the messages, clients and servers that tonic-prost-build
//! generates at build time from the `.proto` files in `proto/` (see its `build.rs`), under
//! names that say which protocol each is. The gRPC method paths, and so the proto packages,
//! are kubelet's; the modules here are named for the protocol.

/// The device plugin API, v1beta1: `Registration` (kubelet's) and `DevicePlugin` (ours).
pub mod deviceplugin {
    include!(concat!(env!("OUT_DIR"), "/deviceplugin/v1beta1.rs"));

    pub const VERSION: &str = "v1beta1";
    pub const HEALTHY: &str = "Healthy";
    pub const UNHEALTHY: &str = "Unhealthy";
    /// kubelet's socket in [`DEVICE_PLUGIN_PATH`]; the plugins' sockets sit beside it.
    pub const KUBELET_SOCKET: &str = "kubelet.sock";
    pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";
}

/// kubelet's plugin registration (`pluginregistration`): how a DRA driver announces itself.
pub mod registration {
    include!(concat!(
        env!("OUT_DIR"),
        "/pluginregistration/pluginregistration.rs"
    ));

    /// `PluginInfo.type` of a DRA plugin.
    pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
    /// kubelet's plugin registry (inotify-watched) and the plugins' own directory.
    pub const PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry";
    pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
}

/// The DRA plugin service: `v1` (kubelet 1.34 and later) with the messages, `v1beta1`
/// (kubelet 1.32 and 1.33) over the same messages.
pub mod dra {
    pub mod v1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/dra/k8s.io.kubelet.pkg.apis.dra.v1.rs"
        ));
    }
    pub mod v1beta1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/dra/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs"
        ));
    }
    pub use v1::*;
}

/// The DRA health service (KEP-4680): `v1` with the messages, `v1beta1` and `v1alpha1`
/// (kubelet 1.34-1.36) over the same messages.
pub mod health {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/dra_health/v1.rs"));
    }
    pub mod v1beta1 {
        include!(concat!(env!("OUT_DIR"), "/dra_health/v1beta1.rs"));
    }
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/dra_health/v1alpha1.rs"));
    }
    pub use v1::*;
}

/// kubelet's PodResources API, v1 (`List`): which devices each container holds.
pub mod podresources {
    include!(concat!(env!("OUT_DIR"), "/podresources/v1.rs"));

    pub const SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
}

/// The part of the Container Runtime Interface (runtime.v1) that the CRI end-to-end test
/// drives as kubelet does; no product code calls it.
#[doc(hidden)]
pub mod cri {
    include!(concat!(env!("OUT_DIR"), "/cri/runtime.v1.rs"));
}
