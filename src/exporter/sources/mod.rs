//! The sources of device readings, as a profile's `[metrics]` declares them: files the kernel
//! driver publishes (`files`), NVIDIA's management library (`nvml`), vendor CLIs
//! (`command`); the table itself, its keys and checks (`profile`). Each gives readings for the devices it can and a [`Failure`] for each value it
//! could not give; none of them is ever called by a scrape.
//!
//! [`Failure`]: super::snapshot::Failure

pub mod command;
pub mod files;
pub mod nvml;
pub mod profile;

/// What the sources need of a device: the values its placeholders and lookups name.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRef<'a> {
    pub index: u32,
    pub pci_bus_id: Option<&'a str>,
    pub minor: Option<u32>,
    pub uuid: Option<&'a str>,
}

impl<'a> From<&'a crate::exporter::snapshot::Device> for DeviceRef<'a> {
    fn from(d: &'a crate::exporter::snapshot::Device) -> Self {
        DeviceRef {
            index: d.index,
            pci_bus_id: d.pci_bus_id.as_deref(),
            minor: d.minor,
            uuid: d.uuid.as_deref(),
        }
    }
}

/// A PCI bus id as `dddd:bb:dd.f` in lower case, whatever width the domain was written in
/// (NVML's `00000000:3B:00.0`, sysfs's `0000:3b:00.0`).
pub fn normal_bus(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => id,
        },
        _ => format!("0000:{id}"),
    }
}
