//! `ld.so.cache` parsing: any bytes (a hostile or truncated driver root), never a panic, and
//! entries only from inside the buffer.
#![no_main]

use accel_container_runtime::ldcache;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = ldcache::parse(data) {
        for e in &entries {
            let _ = e.is_native();
            assert!(e.name.len() < data.len());
            assert!(e.path.as_os_str().len() < data.len());
        }
    }
});
