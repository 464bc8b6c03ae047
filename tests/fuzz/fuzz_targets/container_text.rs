//! Issue 14's readers of container input that are not JSON or TOML grammars: runc's argv
//! (`argv::scan`), the device-list mounts (`request::device_list_from_mounts`) and the quoting
//! of container text in messages (`quote`). Any input, never a panic; quoted text is one line
//! without control characters and bounded; mount ids are never keywords or paths.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use accel_container_runtime::{argv, quote, request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // argv: NUL-separated arguments, as the kernel hands them over.
    let args: Vec<OsString> = data
        .split(|&b| b == 0)
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect();
    let inv = argv::scan(&args);
    assert!(!(inv.help && inv.creates()));

    let text = String::from_utf8_lossy(data);
    for out in [quote::quote(&text), quote::line(&text)] {
        assert!(!out.chars().any(char::is_control), "{out:?}");
        assert!(out.len() <= quote::MAX_LINE_BYTES * 10 + 64, "{} bytes", out.len());
    }
    assert!(quote::quote(&text).len() <= quote::MAX_BYTES * 10 + 64);

    if let Ok(serde_json::Value::Array(mounts)) = serde_json::from_slice(data) {
        for id in request::device_list_from_mounts("/var/run/accel-container-devices", &mounts) {
            assert!(!id.is_empty() && !id.contains('/'));
            assert!(!matches!(id.as_str(), "all" | "none" | "void"));
        }
    }
});
