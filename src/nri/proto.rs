//! NRI's plugin protocol and ttrpc's envelope as Rust: the messages prost generates at build
//! time from `proto/` (src/kubelet/proto/build.rs), and the names the methods are called by.

/// NRI's messages (`nri.pkg.api.v1alpha1`), only those the plugin reads or writes.
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/nri/nri.pkg.api.v1alpha1.rs"));

    /// The service the runtime serves (the plugin calls it).
    pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
    /// The service the plugin serves (the runtime calls it).
    pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
    /// NRI's `Event` number for CreateContainer; a subscription is the bit `1 << (event - 1)`.
    pub const CREATE_CONTAINER_EVENT: i32 = 4;

    /// `ConfigureResponse.events` subscribing to `events` only.
    pub fn event_mask(events: &[i32]) -> i32 {
        events.iter().fold(0, |m, e| m | (1 << (e - 1)))
    }
}

/// ttrpc's request and response envelope (`ttrpc`).
pub mod ttrpc {
    include!(concat!(env!("OUT_DIR"), "/nri/ttrpc.rs"));

    /// gRPC's status codes that ttrpc carries (google.golang.org/grpc/codes).
    pub const OK: i32 = 0;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const UNIMPLEMENTED: i32 = 12;
}

#[cfg(test)]
mod tests {
    use super::api::*;

    #[test]
    fn create_container_is_the_fourth_bit() {
        // NRI's own mask for "CreateContainer" alone (pkg/api/event.go: 1 << (e - 1)).
        assert_eq!(event_mask(&[CREATE_CONTAINER_EVENT]), 8);
        assert_eq!(event_mask(&[1, 4]), 9);
    }

    /// NRI's field numbers as the runtime reads them (pkg/api/api.proto): a number off here
    /// would make the runtime read another field, or none, silently.
    #[test]
    fn field_numbers_are_nris() {
        use prost::Message;
        let reg = RegisterPluginRequest {
            plugin_name: "a".into(),
            plugin_idx: "10".into(),
            nri_version: String::new(),
        };
        // Field 1 and 2, length-delimited: tags 0x0a and 0x12.
        assert_eq!(reg.encode_to_vec(), [0x0a, 1, b'a', 0x12, 2, b'1', b'0']);
        // ConfigureResponse.events is field 2, a varint: tag 0x10.
        let c = ConfigureResponse { events: 8 };
        assert_eq!(c.encode_to_vec(), [0x10, 8]);
        // CreateContainerResponse.adjust (1) > ContainerAdjustment.linux (6) >
        // LinuxContainerAdjustment.devices (1) > LinuxDevice.minor (4) = 3.
        let r = CreateContainerResponse {
            adjust: Some(ContainerAdjustment {
                linux: Some(LinuxContainerAdjustment {
                    devices: vec![LinuxDevice {
                        minor: 3,
                        ..LinuxDevice::default()
                    }],
                    resources: None,
                }),
                ..ContainerAdjustment::default()
            }),
            update: Vec::new(),
        };
        assert_eq!(r.encode_to_vec(), [0x0a, 6, 0x32, 4, 0x0a, 2, 0x20, 3]);
        // ContainerAdjustment.mounts is 3, Container.env 8, Container.linux 11.
        let m = ContainerAdjustment {
            mounts: vec![Mount::default()],
            ..ContainerAdjustment::default()
        };
        assert_eq!(m.encode_to_vec(), [0x1a, 0]);
        let c = Container {
            env: vec![String::new()],
            linux: Some(LinuxContainer::default()),
            ..Container::default()
        };
        assert_eq!(c.encode_to_vec(), [0x42, 0, 0x5a, 0]);
        // LinuxResources.devices is 7 and unified 6.
        let r = LinuxResources {
            devices: vec![LinuxDeviceCgroup::default()],
            ..LinuxResources::default()
        };
        assert_eq!(r.encode_to_vec(), [0x3a, 0]);
    }

    #[test]
    fn ttrpc_envelope_numbers_are_ttrpcs() {
        use super::ttrpc::*;
        use prost::Message;
        let r = Request {
            service: "s".into(),
            method: "m".into(),
            payload: vec![1],
            timeout_nano: 2,
            metadata: Vec::new(),
        };
        assert_eq!(
            r.encode_to_vec(),
            [0x0a, 1, b's', 0x12, 1, b'm', 0x1a, 1, 1, 0x20, 2]
        );
        let r = Response {
            status: Some(Status {
                code: 12,
                message: "x".into(),
            }),
            payload: vec![5],
        };
        assert_eq!(
            r.encode_to_vec(),
            [0x0a, 5, 0x08, 12, 0x12, 1, b'x', 0x12, 1, 5]
        );
    }
}
