//! The `<VENDOR>_VISIBLE_DEVICES` grammar and device selection: any value, never a panic; a
//! selection only ever names devices that exist, each once.
#![no_main]

use std::path::PathBuf;

use accel_container_runtime::discovery::Device;
use accel_container_runtime::request::{self, Request};
use libfuzzer_sys::fuzz_target;

fn devices() -> Vec<Device> {
    (0..4u32)
        .map(|i| Device {
            index: i * 2, // gaps, as device-node discovery can have
            nodes: vec![PathBuf::from(format!("/dev/accel{i}"))],
            uuid: Some(format!("GPU-{:08x}-0000-1111-2222-333333333333", i / 2)),
            pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x10 + i)),
            minor: Some(i),
            aliases: vec![format!("GCU-{i}")],
            model: None,
            duplicate_uuid: None,
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let devs = devices();
    match request::parse("ACCEL_VISIBLE_DEVICES", value) {
        Ok(Request::Items { devices: items, cdi }) => {
            assert!(items.len() + cdi.len() <= request::MAX_ITEMS);
            assert!(items.iter().chain(&cdi).all(|i| !i.is_empty() && !i.contains(',')));
            for ranges in [false, true] {
                if let Ok(sel) = request::select("ACCEL_VISIBLE_DEVICES", &items, &devs, ranges) {
                    let mut idx: Vec<u32> = sel.iter().map(|d| d.index).collect();
                    let n = idx.len();
                    idx.sort_unstable();
                    idx.dedup();
                    assert_eq!(idx.len(), n, "a device selected twice for {value:?}");
                    assert!(sel.iter().all(|d| devs.contains(d)));
                }
            }
        }
        Ok(_) => {}
        Err(e) => {
            // Errors are one line, and bounded whatever the input's size.
            let msg = e.to_string();
            assert!(!msg.contains('\n') || value.contains('\n'));
            assert!(msg.len() < 2048 + devs.len() * 128, "{} bytes", msg.len());
        }
    }
});
