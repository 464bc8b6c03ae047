//! kubelet's device checkpoint reader and repair: any bytes, never a panic; an error names
//! the file. A repaired checkpoint parses again and carries kubelet's checksum of its data.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use accel_container_runtime::checkpoint::{self, Checkpoint};
use libfuzzer_sys::fuzz_target;

const PATH: &str = "/fuzz/kubelet_internal_checkpoint";

fuzz_target!(|data: &[u8]| {
    let path = Path::new(PATH);
    let cp = match Checkpoint::parse(data, path) {
        Ok(cp) => cp,
        Err(e) => {
            assert!(e.to_string().contains(PATH), "{e}");
            return;
        }
    };
    let _ = checkpoint::kubelet_checksum(&cp.data);
    let resources: Vec<String> = cp
        .data
        .registered_devices
        .iter()
        .flat_map(|m| m.keys().cloned())
        .collect();
    for r in &resources {
        let _ = cp.registered(r);
        let _ = cp.allocations(r);
    }
    // This "node" has only device "0" of every resource the checkpoint names.
    let found: BTreeMap<String, BTreeSet<String>> = resources
        .into_iter()
        .map(|r| (r, BTreeSet::from(["0".to_string()])))
        .collect();
    let _ = checkpoint::compare(&cp, &found);
    match checkpoint::repair(data, path, &found) {
        Ok(repaired) => {
            let again = Checkpoint::parse(&repaired.bytes, path).expect("repaired parses");
            assert!(checkpoint::kubelet_checksum(&again.data).is_some());
        }
        Err(e) => assert!(e.to_string().contains(PATH), "{e}"),
    }
});
