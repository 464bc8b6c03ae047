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
}
