//! `accel-ctk list [--json]`: every device each profile finds under its `driver-root`, with
//! its nodes, ids, NUMA node and the PCIe switch it shares with other devices.
//!
//! Discovery is the runtime's own (`discovery::discover`), so what this prints is what a
//! container asking for these indices would get. The JSON form is a contract for scripts:
//! `{"devices":[{vendor, index, nodes:[{path, major, minor}], uuid, pci_bus_id, numa_node,
//! pci_root, switch, driver_version, resource, replicas, model, duplicate_uuid, name,
//! stable_id, healthy, health_reason, health_severity, health_label, unhealthy_since}],
//! "errors":[{vendor, error}]}`; absent values are `null`, fields are only ever added.
//! `healthy`, `health_reason` (the whole line), `health_severity` (`gone`, `error`,
//! `reported`), `health_label` (the short name a DRA taint's value and the exporter's `reason`
//! label carry) and `unhealthy_since` (Unix seconds: this look's, as a one-shot command has
//! seen the device only now) are the health engine's verdict ([`crate::health`]) at this one look: its nodes and whether its PCI function reads
//! all ones; counts need a baseline from an earlier look, which a one-shot command has not. `name` is the device's stable name (`gpu-0` by NVIDIA's minor, `gcu-3`,
//! `gpu-0000-c3-00-0` by PCI function: the DRA driver's device name), `stable_id` what the
//! device plugin's answers and CDI specs name it by (its UUID, node number or PCI bus id);
//! neither changes when another device leaves the node, unlike `index` for NVIDIA and
//! DRM-class devices.
//! `resource` and `replicas` say how accel-device-plugin lists the device to kubelet
//! (`replicas` > 1: as `<id>::<k>`). `uuid` is set only where it is unique on the node; an
//! id several devices report is their `duplicate_uuid`, shown in the table as
//! `<id> (not unique)`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;

use crate::config::Config;
use crate::discovery::driver_version;
use crate::health::{Monitor, Settings, Subject};
use crate::topology::{discover_located, shared_switches, Node};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON (stable schema, see docs/operating.md) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub vendor: String,
    pub index: u32,
    pub nodes: Vec<Node>,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub numa_node: Option<u32>,
    /// Root complex (`pci0000:00`).
    pub pci_root: Option<String>,
    /// Upstream port of the nearest PCIe switch (bridge) shared with another listed device.
    pub switch: Option<String>,
    pub driver_version: Option<String>,
    /// The resource accel-device-plugin lists the device under (`None`: the profile names
    /// none).
    pub resource: Option<String>,
    /// Times the device is listed (its replicas); 1: whole.
    pub replicas: u32,
    /// See [`crate::discovery::Device::model`].
    pub model: Option<String>,
    /// See [`crate::discovery::Device::duplicate_uuid`].
    pub duplicate_uuid: Option<String>,
    /// The device's stable name ([`crate::kubelet::names::device_name`]).
    pub name: String,
    /// See [`crate::discovery::Device::stable_name`].
    pub stable_id: String,
    /// The health engine's verdict now, and why not.
    pub healthy: bool,
    pub health_reason: Option<String>,
    /// The reason's severity and short name ([`crate::health::Reason`]).
    pub health_severity: Option<&'static str>,
    pub health_label: Option<String>,
    /// Since when it has been unhealthy, in seconds since the Unix epoch.
    pub unhealthy_since: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Listing {
    pub devices: Vec<Row>,
    pub errors: Vec<VendorError>,
}

#[derive(Debug, Serialize)]
pub struct VendorError {
    pub vendor: String,
    pub error: String,
}

/// Discovers every profile's devices and works out which share a switch.
pub fn collect(config: &Config) -> Listing {
    let mut devices = Vec::new();
    let mut bridges = Vec::new();
    let mut errors = Vec::new();
    for profile in &config.profiles {
        let found = match discover_located(profile) {
            Ok(f) => f,
            Err(e) => {
                errors.push(VendorError {
                    vendor: profile.name.clone(),
                    error: e.to_string(),
                });
                continue;
            }
        };
        let version = driver_version(profile);
        let host_nodes: Vec<Vec<std::path::PathBuf>> = found
            .iter()
            .map(|d| {
                d.nodes
                    .iter()
                    .map(|n| crate::profile::Profile::under(profile.dev_root(), &n.path))
                    .collect()
            })
            .collect();
        let names: Vec<String> = found
            .iter()
            .map(|d| d.device.stable_name(&profile.discovery))
            .collect();
        let subjects: Vec<Subject<'_>> = found
            .iter()
            .zip(&host_nodes)
            .zip(&names)
            .map(|((d, host), name)| Subject {
                name,
                pci_bus_id: d
                    .pci
                    .as_ref()
                    .map(|p| p.bus_id.as_str())
                    .or(d.device.pci_bus_id.as_deref()),
                nodes: &d.nodes,
                host_nodes: host,
            })
            .collect();
        let health = Monitor::new(Settings::default())
            .without_tools()
            .check(profile, &subjects);
        drop(subjects);
        for (d, health) in found.into_iter().zip(health) {
            let shared = profile.shares(d.device.index);
            let resource = match (&profile.resource_name, &profile.shared_resource_name) {
                (Some(_), Some(s)) if shared => Some(s.clone()),
                (r, _) => r.clone(),
            };
            bridges.push(d.pci.as_ref().map(|p| p.bridges.clone()));
            let name =
                crate::kubelet::names::device_name(profile, &d.device.key(&profile.discovery));
            let stable_id = d.device.stable_name(&profile.discovery);
            devices.push(Row {
                name,
                stable_id,
                vendor: profile.name.clone(),
                index: d.device.index,
                nodes: d.nodes,
                uuid: d.device.uuid,
                model: d.device.model,
                duplicate_uuid: d.device.duplicate_uuid,
                pci_bus_id: d.device.pci_bus_id,
                numa_node: d.pci.as_ref().and_then(|p| p.numa_node),
                pci_root: d.pci.as_ref().and_then(|p| p.root.clone()),
                switch: None,
                driver_version: version.clone(),
                resource,
                replicas: if shared { profile.replicas } else { 1 },
                healthy: health.is_healthy(),
                health_reason: health.reason_text().map(str::to_string),
                health_severity: health.reason().map(|r| r.severity().as_str()),
                health_label: health.reason().map(|r| r.label()),
                unhealthy_since: health.since().map(|t| {
                    t.duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                }),
            });
        }
    }
    let refs: Vec<Option<&[String]>> = bridges.iter().map(|b| b.as_deref()).collect();
    for (row, sw) in devices.iter_mut().zip(shared_switches(&refs)) {
        row.switch = sw;
    }
    Listing { devices, errors }
}

fn or_dash(s: Option<String>) -> String {
    s.unwrap_or_else(|| "-".into())
}

/// The table, then a legend naming each switch and NUMA node with the devices under it.
pub fn table(listing: &Listing) -> String {
    let mut labels: BTreeMap<&str, String> = BTreeMap::new();
    for row in &listing.devices {
        if let Some(sw) = row.switch.as_deref() {
            let n = labels.len() + 1;
            labels.entry(sw).or_insert_with(|| format!("S{n}"));
        }
    }
    let header = [
        "VENDOR",
        "NAME",
        "IDX",
        "NODES",
        "UUID",
        "PCI BUS ID",
        "NUMA",
        "SWITCH",
        "DRIVER",
        "HEALTH",
    ];
    let mut rows: Vec<[String; 10]> = vec![header.map(String::from)];
    for r in &listing.devices {
        let nodes = r
            .nodes
            .iter()
            .map(|n| match (n.major, n.minor) {
                (Some(a), Some(b)) => format!("{} ({a}:{b})", n.path.display()),
                _ => format!("{} (missing)", n.path.display()),
            })
            .collect::<Vec<_>>()
            .join(", ");
        rows.push([
            r.vendor.clone(),
            r.name.clone(),
            r.index.to_string(),
            nodes,
            match (&r.uuid, &r.duplicate_uuid) {
                (Some(u), _) => u.clone(),
                (None, Some(d)) => format!("{d} (not unique)"),
                (None, None) => "-".into(),
            },
            or_dash(r.pci_bus_id.clone()),
            or_dash(r.numa_node.map(|n| n.to_string())),
            or_dash(r.switch.as_deref().map(|s| labels[s].clone())),
            or_dash(r.driver_version.clone()),
            match &r.health_reason {
                None => "healthy".into(),
                Some(why) => format!("{}: {}", unhealthy_since(r), crate::quote::line(why)),
            },
        ]);
    }
    let mut out = super::columns(&rows);
    let name = |r: &Row| r.name.clone();
    if !labels.is_empty() {
        out.push_str("\nPCIe switches (devices behind the same switch talk peer-to-peer without crossing the CPU):\n");
        for (sw, label) in &labels {
            let members: Vec<String> = listing
                .devices
                .iter()
                .filter(|r| r.switch.as_deref() == Some(sw))
                .map(name)
                .collect();
            let _ = writeln!(out, "  {label} = {sw}: {}", members.join(", "));
        }
    }
    let mut numa: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for r in &listing.devices {
        if let Some(n) = r.numa_node {
            numa.entry(n).or_default().push(name(r));
        }
    }
    if !numa.is_empty() {
        out.push_str("\nNUMA nodes (pin a container's CPUs to its devices' node):\n");
        for (n, members) in numa {
            let _ = writeln!(out, "  {n}: {}", members.join(", "));
        }
    }
    let mut shared: BTreeMap<(&str, u32), Vec<String>> = BTreeMap::new();
    for r in listing.devices.iter().filter(|r| r.replicas > 1) {
        let resource = r.resource.as_deref().unwrap_or("-");
        shared
            .entry((resource, r.replicas))
            .or_default()
            .push(name(r));
    }
    if !shared.is_empty() {
        out.push_str("\nShared devices (accel-device-plugin lists each as <id>::0.. replicas; pods given replicas of one device share its memory and compute, no isolation):\n");
        for ((resource, n), members) in shared {
            let _ = writeln!(
                out,
                "  {resource}, {n} replicas each: {}",
                members.join(", ")
            );
        }
    }
    out
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = super::load_config()?;
    let listing = collect(&config);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
    } else if listing.devices.is_empty() {
        let roots: Vec<String> = config
            .profiles
            .iter()
            .map(|p| format!("{} under {}", p.name, p.driver_root.display()))
            .collect();
        println!("no devices found ({})", roots.join("; "));
    } else {
        print!("{}", table(&listing));
    }
    for e in &listing.errors {
        eprintln!("accel-ctk: {}: {}", e.vendor, e.error);
    }
    Ok(if listing.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `unhealthy` and since when (RFC 3339, UTC), as the table and doctor show it.
pub fn unhealthy_since(r: &Row) -> String {
    match r.unhealthy_since {
        Some(secs) => format!(
            "unhealthy since {}",
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)
            )
        ),
        None => "unhealthy".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn row(vendor: &str, index: u32, switch: Option<&str>, numa: Option<u32>) -> Row {
        Row {
            vendor: vendor.into(),
            index,
            nodes: vec![Node {
                path: PathBuf::from(format!("/dev/x{index}")),
                major: Some(195),
                minor: Some(index as u64),
            }],
            uuid: None,
            pci_bus_id: None,
            numa_node: numa,
            pci_root: None,
            switch: switch.map(String::from),
            driver_version: Some("1.2".into()),
            resource: None,
            replicas: 1,
            model: None,
            duplicate_uuid: None,
            name: format!("{}-{index}", &vendor[..3]),
            stable_id: index.to_string(),
            healthy: true,
            health_reason: None,
            health_severity: None,
            health_label: None,
            unhealthy_since: None,
        }
    }

    #[test]
    fn table_shows_switch_groups_and_numa() {
        let listing = Listing {
            devices: vec![
                row("nvidia", 0, Some("0000:01:00.0"), Some(0)),
                row("nvidia", 1, Some("0000:01:00.0"), Some(0)),
                row("enflame", 0, None, Some(1)),
            ],
            errors: vec![],
        };
        let t = table(&listing);
        assert!(t.contains("/dev/x1 (195:1)"), "{t}");
        assert!(t.contains("S1 = 0000:01:00.0: nvi-0, nvi-1"), "{t}");
        assert!(t.contains("  0: nvi-0, nvi-1\n  1: enf-0"), "{t}");
        assert!(!t.contains("Shared devices"), "{t}");
    }

    /// The health column: `healthy`, or since when and why not in one line (a newline in it
    /// escaped).
    #[test]
    fn table_shows_each_devices_health() {
        let mut sick = row("nvidia", 1, None, None);
        sick.healthy = false;
        sick.health_reason = Some("PCI function 0000:04:00.0 reads all ones\nx".into());
        sick.unhealthy_since = Some(1_790_000_000);
        let t = table(&Listing {
            devices: vec![row("nvidia", 0, None, None), sick],
            errors: vec![],
        });
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].ends_with("HEALTH"), "{t}");
        assert!(lines[1].ends_with("  healthy"), "{t}");
        assert!(
            lines[2].ends_with(
                "  unhealthy since 2026-09-21T14:13:20Z: PCI function 0000:04:00.0 reads all \
                 ones\\nx"
            ),
            "{t}"
        );
    }

    #[test]
    fn table_marks_an_id_two_devices_report() {
        let mut a = row("amd", 0, None, None);
        a.duplicate_uuid = Some("0xabc".into());
        let mut b = row("amd", 1, None, None);
        b.uuid = Some("0xdef".into());
        let t = table(&Listing {
            devices: vec![a, b],
            errors: vec![],
        });
        assert!(t.contains("0xabc (not unique)"), "{t}");
        assert!(t.contains("0xdef ") && !t.contains("0xdef (not"), "{t}");
    }

    #[test]
    fn table_shows_shared_devices_and_their_replicas() {
        let shared = |index| {
            let mut r = row("enflame", index, None, Some(0));
            r.resource = Some("enflame.com/shared-gcu".into());
            r.replicas = 4;
            r
        };
        let listing = Listing {
            devices: vec![row("enflame", 0, None, Some(0)), shared(2), shared(3)],
            errors: vec![],
        };
        let t = table(&listing);
        assert!(
            t.contains("  enflame.com/shared-gcu, 4 replicas each: enf-2, enf-3\n"),
            "{t}"
        );
    }
}
