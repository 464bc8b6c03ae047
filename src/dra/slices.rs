//! The ResourceSlices (`resource.k8s.io/v1`) a profile's devices are published as: one pool
//! per node (named after the node), its devices in slices of at most 64 (the API's limit once
//! a device has taints), every slice of the pool carrying the pool's generation and count.
//!
//! Attributes (unprefixed ones are in the driver's own domain): `vendor`, `index`, `uuid`
//! where the vendor has one, `driverVersion`, `model` where known, `numaNode`, `pcieSwitch`
//! (so a claim can `matchAttribute` on it: no standard name exists), and the standard
//! `resource.kubernetes.io/pciBusID`, `resource.kubernetes.io/pcieRoot` and
//! `resource.kubernetes.io/numaNode`. An unhealthy device keeps its place and gets the taint
//! `<driver>/unhealthy` with effect `NoSchedule`, so claims already holding it stay
//! explainable and new ones avoid it (where the cluster has `DRADeviceTaints`).
//!
//! Ref: k8s.io/api/resource/v1 types.go (limits), k8s.io/dynamic-resource-allocation
//! deviceattribute (standard names), KEP-5055 (device taints).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names::STANDARD_DOMAIN;
use super::table::DraDevice;

/// Devices per slice: the API's limit for slices whose devices have taints.
pub const DEVICES_PER_SLICE: usize = 64;

/// The longest string attribute value the API accepts.
const MAX_STRING: usize = 64;

/// Label on every slice this driver writes, so it lists only its own.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "accel-dra-driver";

/// What one profile publishes on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool<'a> {
    pub driver: &'a str,
    pub node: &'a str,
    /// The profile's name (`vendor` attribute).
    pub vendor: &'a str,
    pub driver_version: Option<&'a str>,
}

fn string(s: &str) -> Option<DeviceAttribute> {
    (s.len() <= MAX_STRING).then(|| DeviceAttribute {
        string: Some(s.to_string()),
        ..DeviceAttribute::default()
    })
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..DeviceAttribute::default()
    }
}

/// The slice entry of one device.
pub fn device(pool: &Pool, d: &DraDevice, healthy: bool) -> Device {
    let mut a: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    let mut put = |k: &str, v: Option<DeviceAttribute>| {
        if let Some(v) = v {
            a.insert(k.to_string(), v);
        }
    };
    put("vendor", string(pool.vendor));
    put("index", Some(int(d.dev.index.into())));
    put("uuid", d.dev.uuid.as_deref().and_then(string));
    put("driverVersion", pool.driver_version.and_then(string));
    put("model", d.dev.model.as_deref().and_then(string));
    if let Some(p) = &d.dev.pci {
        put(&format!("{STANDARD_DOMAIN}/pciBusID"), string(&p.bus_id));
        put(
            &format!("{STANDARD_DOMAIN}/pcieRoot"),
            p.root.as_deref().and_then(string),
        );
        if let Some(n) = p.numa_node {
            put("numaNode", Some(int(n.into())));
            put(&format!("{STANDARD_DOMAIN}/numaNode"), Some(int(n.into())));
        }
    }
    put("pcieSwitch", d.dev.switch.as_deref().and_then(string));
    Device {
        name: d.name.clone(),
        attributes: Some(a),
        taints: (!healthy).then(|| {
            vec![DeviceTaint {
                key: format!("{}/unhealthy", pool.driver),
                value: None,
                effect: "NoSchedule".into(),
                time_added: None,
            }]
        }),
        ..Device::default()
    }
}

/// The longest object name the API accepts (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The name of slice `i` of the pool: `<node>-<driver>-<i>`. Where a long node name (node
/// names may have 253 characters, the driver's 63) makes that longer than the API accepts,
/// the node's name is cut and a hash of all of it put after, so every node's names stay
/// apart and each still fits (the API would refuse every publish forever).
pub fn slice_name(pool: &Pool, i: usize) -> String {
    let whole = format!("{}-{}-{i}", pool.node, pool.driver);
    if whole.len() <= MAX_NAME {
        return whole;
    }
    // FNV-1a: stable across versions and platforms (std's hasher is neither).
    let hash = pool.node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let tail = format!("-{hash:016x}-{}-{i}", pool.driver);
    let keep = MAX_NAME.saturating_sub(tail.len());
    // A node name is lower-case letters, digits, '-' and '.': cut on a character, and end
    // the cut on a letter or digit as a DNS label must.
    let head = pool.node[..keep.min(pool.node.len())].trim_end_matches(['-', '.']);
    format!("{head}{tail}")
}

/// The pool's slices at `generation`: none when there are no devices (the profile has
/// nothing on this node).
pub fn slices(pool: &Pool, devices: &[Device], generation: i64) -> Vec<ResourceSlice> {
    let chunks: Vec<&[Device]> = devices.chunks(DEVICES_PER_SLICE).collect();
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(pool, i)),
                labels: Some(BTreeMap::from([(MANAGED_BY.into(), MANAGER.into())])),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: pool.driver.to_string(),
                node_name: Some(pool.node.to_string()),
                pool: ResourcePool {
                    name: pool.node.to_string(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(chunk.to_vec()),
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::inventory::NodeDevice;
    use crate::topology::PciLocation;

    fn dev(i: u32) -> DraDevice {
        DraDevice {
            name: format!("gcu-{i}"),
            dev: NodeDevice {
                index: i,
                key: crate::discovery::Key::Number(i),
                name: i.to_string(),
                uuid: None,
                pci_bus_id: None,
                minor: None,
                // A name past the API's 64 characters is left out, not cut.
                model: match i {
                    0 => Some("NVIDIA H100 80GB HBM3".into()),
                    1 => Some("x".repeat(65)),
                    _ => None,
                },
                pci: Some(PciLocation {
                    bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
                    numa_node: Some(i / 4),
                    root: Some("pci0000:00".into()),
                    bridges: vec![],
                }),
                switch: (i < 2).then(|| "0000:01:00.0".to_string()),
                place: Default::default(),
                nodes: vec![],
                host_nodes: vec![],
            },
        }
    }

    /// Issue 32 class 10: a valid node name of 253 characters made every slice name longer
    /// than the API accepts.
    #[test]
    fn class10_slice_names_fit_any_valid_node_name() {
        let long = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(long.len(), 253);
        let other = format!("{}e", &long[..252]);
        for node in [long.as_str(), other.as_str(), "n1"] {
            let pool = Pool {
                driver: "i915.gpu.intel.com",
                node,
                vendor: "intel",
                driver_version: None,
            };
            for i in [0, 1, 12] {
                let name = slice_name(&pool, i);
                assert!(name.len() <= MAX_NAME, "{} characters: {name}", name.len());
                assert!(
                    super::super::names::is_dns_subdomain(&name, MAX_NAME),
                    "{name}"
                );
            }
        }
        let at = |node: &str| {
            slice_name(
                &Pool {
                    driver: "gcu.enflame.com",
                    node,
                    vendor: "enflame",
                    driver_version: None,
                },
                0,
            )
        };
        assert_ne!(at(&long), at(&other), "two nodes, one name");
        assert_eq!(at("n1"), "n1-gcu.enflame.com-0");
    }

    #[test]
    fn a_pool_of_65_devices_is_two_slices_of_one_generation() {
        let pool = Pool {
            driver: "gcu.enflame.com",
            node: "n1",
            vendor: "enflame",
            driver_version: Some("1.2.3.4"),
        };
        let devices: Vec<Device> = (0..65).map(|i| device(&pool, &dev(i), i != 3)).collect();
        let s = slices(&pool, &devices, 7);
        assert_eq!(s.len(), 2);
        for x in &s {
            assert_eq!(x.spec.pool.generation, 7);
            assert_eq!(x.spec.pool.resource_slice_count, 2);
            assert_eq!(x.spec.pool.name, "n1");
        }
        assert_eq!(s[0].spec.devices.as_ref().unwrap().len(), 64);
        let v = serde_json::to_value(&s[0]).unwrap();
        let d0 = &v["spec"]["devices"][0];
        assert_eq!(
            d0["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            "0000:10:00.0"
        );
        assert_eq!(d0["attributes"]["pcieSwitch"]["string"], "0000:01:00.0");
        assert_eq!(d0["attributes"]["index"]["int"], 0);
        assert_eq!(d0["attributes"]["model"]["string"], "NVIDIA H100 80GB HBM3");
        for i in [1, 2] {
            assert!(v["spec"]["devices"][i]["attributes"].get("model").is_none());
        }
        assert!(v["spec"]["devices"][2]["attributes"]
            .get("pcieSwitch")
            .is_none());
        assert_eq!(
            v["spec"]["devices"][3]["taints"][0]["key"],
            "gcu.enflame.com/unhealthy"
        );
        assert!(d0.get("taints").is_none());
        assert!(slices(&pool, &[], 1).is_empty());
    }
}
