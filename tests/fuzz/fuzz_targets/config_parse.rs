//! config.toml and profile parsing: any text, never a panic; errors name the file. The text
//! is tried both as config.toml and as a profile file.
#![no_main]

use std::path::Path;

use accel_container_runtime::config::Config;
use accel_container_runtime::profile::Profile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Keep the fuzzer from listing arbitrary host directories as profiles-dir.
    if text.contains("profiles-dir") {
        return;
    }
    match Config::parse(text, Some(Path::new("/fuzz/config.toml"))) {
        Ok(c) => {
            for p in &c.profiles {
                assert!(p.driver_root.is_absolute());
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("/fuzz/config.toml") || msg.contains("profile"), "{msg}");
        }
    }
    if let Ok(table) = toml::from_str::<toml::Table>(text) {
        if let Ok((p, _unknown)) = Profile::from_table(table, "fuzz.toml") {
            assert!(p.driver_root.is_absolute());
            assert!(!p.visible_devices_env.is_empty());
        }
    }
});
