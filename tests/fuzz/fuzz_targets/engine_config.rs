//! The engine configuration readers and editors (docker's daemon.json, containerd's
//! config.toml, CRI-O's drop-in): any text, never a panic. Text one of them accepts and edits
//! must read back as registered, and unconfigure must take the registration out again.
#![no_main]

use accel_container_runtime::engine::{self, Host, Kind, Registration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let reg = Registration {
        name: "accel".into(),
        path: "/usr/bin/accel-container-runtime".into(),
        set_as_default: text.len() % 2 == 0,
    };
    for kind in [Kind::Docker, Kind::Containerd, Kind::Crio] {
        let _ = engine::registered(kind, text, "accel");
        let _ = engine::default_runtime(kind, text);
        let host = Host {
            containerd_major: Some(2),
        };
        let Ok(edited) = engine::configure_text(kind, Some(text), &reg, &host) else {
            continue;
        };
        let seen = engine::registered(kind, &edited, "accel")
            .unwrap_or_else(|e| panic!("{kind:?}: its own edit does not read back: {e}"));
        assert_eq!(seen.path.as_deref(), Some(reg.path.as_str()), "{kind:?}");
        if let Ok(undone) = engine::unconfigure_text(kind, &edited, "accel", None) {
            let seen = engine::registered(kind, &undone, "accel")
                .unwrap_or_else(|e| panic!("{kind:?}: unconfigured text does not read: {e}"));
            assert_eq!(seen.path, None, "{kind:?}");
        }
    }
    let _ = engine::docker::cgroup_driver(text);
});
