//! `ld.so.cache` parsing: any bytes (a hostile or truncated driver root), never a panic,
//! entries only from inside the buffer, and the owned `Cache` the create path uses reads the
//! same entries as `parse`. An image's cache (the container's, also hostile) read as records
//! and written back parses, and writing what it reads again gives the same bytes.
#![no_main]

use accel_container_runtime::ldcache;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = ldcache::parse(data);
    let cache = ldcache::Cache::parse(data.to_vec());
    assert_eq!(parsed.is_ok(), cache.is_ok());
    if let (Ok(entries), Ok(cache)) = (parsed, cache) {
        assert!(cache.iter().eq(entries.iter().copied()));
        for e in &entries {
            let _ = e.is_native();
            assert!(e.name.len() < data.len());
            assert!(e.path.as_os_str().len() < data.len());
        }
    }
    if let Ok(records) = ldcache::records(data) {
        let written = ldcache::write(records);
        let back = ldcache::records(&written).expect("our own image parses");
        assert_eq!(ldcache::write(back), written);
    }
});
