//! The ResourceSlices (`resource.k8s.io/v1`) a profile's devices are published as: one pool
//! per node (named after the node), its devices in slices of at most 128, or 64 once a device
//! has taints or consumes counters (the API's limits), every slice of the pool carrying the
//! pool's generation and count.
//!
//! Attributes (unprefixed ones are in the driver's own domain): `vendor`, `index`, `uuid`
//! where the vendor has one (unique on the node), `driverVersion` as a `version` (semver:
//! `580.65.06` is published as `580.65.6`, so `isGreaterThan(semver(...))` works) with the
//! vendor's own text in `driverVersionText` (a version that cannot be made semver is left out
//! of `driverVersion`, said once, never a refused slice), `model` where known, `numaNode`,
//! `pcieSwitch` (so a claim can `matchAttribute` on it: no standard name exists), and the
//! standard `resource.kubernetes.io/pciBusID`, `resource.kubernetes.io/pcieRoot` and
//! `resource.kubernetes.io/numaNode`. Capacity: `memory`, where discovery can read it. An unhealthy device keeps its place and gets its taint
//! ([`super::taints`]: `<driver>/<severity>=<reason>`, `NoSchedule` unless the operator asked
//! for `NoExecute`), its shares and parts the same one, so claims already holding it stay
//! explainable and new ones avoid it (where the cluster has `DRADeviceTaints`).
//!
//! Ref: k8s.io/api/resource/v1 types.go (limits), k8s.io/dynamic-resource-allocation
//! deviceattribute (standard names), KEP-5055 (device taints).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceTaint, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names::STANDARD_DOMAIN;
use super::offers::{self, Kind, Offer};
use super::table::DraDevice;
use crate::kubelet::sharing::Sharing;

/// Devices per slice: the API's limit.
pub const DEVICES_PER_SLICE: usize = 128;

/// Devices per slice once one of them has taints or consumes counters: the API's limit.
pub const DEVICES_PER_SLICE_LIMITED: usize = 64;

/// The longest string attribute value the API accepts.
const MAX_STRING: usize = 64;

/// Label on every slice this driver writes, so it lists only its own.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "accel-dra-driver";

/// The field manager of `driver`'s entries in a claim's `status.devices`. One per driver, not
/// [`MANAGER`]: server-side apply takes out of that list what a manager applied before and
/// leaves out now, so two of a node's drivers preparing one claim under one manager would each
/// remove the other's entries.
pub fn status_manager(driver: &str) -> String {
    format!("{MANAGER}/{driver}")
}

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

/// A driver version as semver 2.0.0, what the API's `version` attribute takes: up to three
/// dotted numbers, leading zeros dropped, missing parts 0 (`580.65.06` → `580.65.6`, `9.0` →
/// `9.0.0`). `None` for anything else (four parts, letters, a number past u64): a vendor's
/// version that is not one is left out rather than rejected with the whole slice.
pub fn semver(v: &str) -> Option<String> {
    let parts: Vec<&str> = v.split('.').collect();
    if parts.len() > 3 || v.len() > MAX_STRING {
        return None;
    }
    let mut nums = Vec::with_capacity(3);
    for p in parts {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nums.push(p.parse::<u64>().ok()?);
    }
    nums.resize(3, 0);
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

/// Says once per process that `version` of `driver` is published without `driverVersion`.
fn not_semver(driver: &str, version: &str) {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static SAID: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.insert((driver.to_string(), version.to_string())) {
        log::warn!(
            "{driver}: driver version {:?} is not semver (three dotted numbers); published as driverVersionText only",
            version.chars().take(64).collect::<String>()
        );
    }
}

/// A byte count as a Kubernetes quantity (`16Gi`).
fn bytes(b: u64) -> Quantity {
    Quantity(crate::quantity::bytes(b))
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..DeviceAttribute::default()
    }
}

/// The slice entry of one device, with its taint where it is unhealthy.
pub fn device(pool: &Pool, d: &DraDevice, taint: Option<&DeviceTaint>) -> Device {
    let mut a: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    let mut put = |k: &str, v: Option<DeviceAttribute>| {
        if let Some(v) = v {
            a.insert(k.to_string(), v);
        }
    };
    put("vendor", string(pool.vendor));
    put("index", Some(int(d.dev.index.into())));
    put("uuid", d.dev.uuid.as_deref().and_then(string));
    if let Some(v) = pool.driver_version {
        put("driverVersionText", string(v));
        match semver(v) {
            Some(sv) => put(
                "driverVersion",
                Some(DeviceAttribute {
                    version: Some(sv),
                    ..DeviceAttribute::default()
                }),
            ),
            None => not_semver(pool.driver, v),
        }
    }
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
    let capacity = d.dev.memory.map(|m| {
        BTreeMap::from([(
            "memory".to_string(),
            DeviceCapacity {
                value: bytes(m),
                ..DeviceCapacity::default()
            },
        )])
    });
    Device {
        name: d.name.clone(),
        attributes: Some(a),
        capacity,
        taints: taint.map(|t| vec![t.clone()]),
        ..Device::default()
    }
}

/// The slice entry of one offer of a profile with `[sharing]`: the physical device's
/// attributes and taint, and what it is of it (`sharing`: `whole`, `capacity` or
/// `partition`; for a part its `partition`, its first slice as `placement` and its `parent`;
/// for a share or part its `enforcement`, and as before it `limits`, `enforced` or
/// `advisory`), the counters it consumes, and for the shareable one
/// `allowMultipleAllocations` and its capacities. `dmem_capacity`: the node's
/// `dmem.capacity` text, where a share or part reaches `kernel` ([`Offer::enforcement`]).
pub fn offered(pool: &Pool, o: &Offer, taint: Option<&DeviceTaint>, dmem_capacity: &str) -> Device {
    let mut d = device(pool, o.parent, taint);
    let consumes = o.consumes();
    let (Some(sharing), Some(_)) = (o.sharing, &consumes) else {
        // Offered whole only: published as before sharing was declared.
        return d;
    };
    let a = d.attributes.get_or_insert_with(BTreeMap::new);
    a.insert("sharing".into(), string(o.kind.mode()).expect("short"));
    if o.kind != Kind::Whole {
        a.insert(
            "parent".into(),
            string(&o.parent.name).expect("a DNS label"),
        );
        if let Some(rung) = o.enforcement(dmem_capacity) {
            a.insert("enforcement".into(), string(rung.as_str()).expect("short"));
            a.insert("limits".into(), string(rung.limits()).expect("short"));
        }
    }
    if let Kind::Partition { name, count, .. } = &o.kind {
        a.insert("partition".into(), string(name).expect("16 characters"));
        a.insert("placement".into(), int(o.slices(sharing).start.into()));
        if let Some(m) = o.memory {
            d.capacity = Some(BTreeMap::from([(
                offers::MEMORY.to_string(),
                DeviceCapacity {
                    value: bytes(m / u64::from(*count)),
                    ..DeviceCapacity::default()
                },
            )]));
        }
    }
    if o.kind == Kind::Shared {
        d.allow_multiple_allocations = Some(true);
        d.capacity = o.capacity();
    }
    d.name = o.name.clone();
    d.consumes_counters = consumes;
    d
}

/// What one pool holds: the counter sets of its devices and the devices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Contents {
    pub counters: Vec<CounterSet>,
    pub devices: Vec<Device>,
}

/// The pool's contents for `table` (`taints` per device: `None` for a healthy one): every
/// offer of every device under the profile's `sharing`, each with its device's taint and,
/// for shares and parts, the enforcement this node's `dmem_capacity` allows.
pub fn contents(
    pool: &Pool,
    sharing: Option<&Sharing>,
    table: &[DraDevice],
    taints: &[Option<DeviceTaint>],
    dmem_capacity: &str,
) -> Contents {
    let taint = |o: &Offer| {
        table
            .iter()
            .position(|d| d.name == o.parent.name)
            .and_then(|i| taints.get(i))
            .and_then(Option::as_ref)
    };
    Contents {
        counters: table
            .iter()
            .filter_map(|d| offers::counter_set(sharing, d))
            .collect(),
        devices: offers::offers(sharing, table)
            .iter()
            .map(|o| offered(pool, o, taint(o), dmem_capacity))
            .collect(),
    }
}

/// Counter sets per slice: the API's limit.
pub const COUNTER_SETS_PER_SLICE: usize = 8;

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

/// How many devices each slice of `devices` may hold: 64 once any has taints or consumes
/// counters (the API refuses more then), else 128. One size for the whole pool, so a device
/// turning unhealthy splits the pool rather than leaving one slice over the limit.
pub fn per_slice(devices: &[Device]) -> usize {
    let limited = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty())
            || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    });
    if limited {
        DEVICES_PER_SLICE_LIMITED
    } else {
        DEVICES_PER_SLICE
    }
}

/// The pool's slices at `generation`: none when there are no devices (the profile has
/// nothing on this node). Counter sets come first, in slices of their own (from 1.35 a
/// slice holds counter sets or devices, never both), then the devices, [`per_slice`] in
/// each.
pub fn slices(pool: &Pool, c: &Contents, generation: i64) -> Vec<ResourceSlice> {
    if c.devices.is_empty() {
        return Vec::new();
    }
    let counters = c.counters.chunks(COUNTER_SETS_PER_SLICE);
    let devices = c.devices.chunks(per_slice(&c.devices));
    let count = (counters.len() + devices.len()) as i64;
    let make = |i: usize, sets: Option<&[CounterSet]>, devs: Option<&[Device]>| ResourceSlice {
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
            shared_counters: sets.map(<[CounterSet]>::to_vec),
            devices: devs.map(<[Device]>::to_vec),
            ..ResourceSliceSpec::default()
        },
    };
    counters
        .map(|sets| (Some(sets), None))
        .chain(devices.map(|devs| (None, Some(devs))))
        .enumerate()
        .map(|(i, (sets, devs))| make(i, sets, devs))
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
                memory: (i == 0).then_some(16 << 30),
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

    /// Issue 36: the driver version as the API's `version` takes it (semver.org 2.0.0), from
    /// what vendors print; anything else is left out.
    #[test]
    fn driver_versions_become_semver_or_nothing() {
        for (v, want) in [
            ("580.65.06", Some("580.65.6")),
            ("550.54.14", Some("550.54.14")),
            ("9.0", Some("9.0.0")),
            ("7", Some("7.0.0")),
            ("0.0.0", Some("0.0.0")),
            ("00012.000.0", Some("12.0.0")),
            ("1.2.3.4", None),
            ("6.8.5-rc1", None),
            ("1..2", None),
            ("", None),
            (".1.2", None),
            ("1.2.", None),
            ("v1.2.3", None),
            ("١.٢.٣", None),
            ("99999999999999999999.1.1", None),
            ("1.2.3\n", None),
        ] {
            assert_eq!(semver(v).as_deref(), want, "{v:?}");
        }
        assert_eq!(semver(&format!("1.2.{}", "3".repeat(70))), None);
    }

    #[test]
    fn memory_is_a_capacity_in_binary_units() {
        assert_eq!(bytes(16 << 30).0, "16Gi");
        assert_eq!(bytes(1536 << 20).0, "1536Mi");
        assert_eq!(bytes(1000).0, "1000");
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
                    crate::kubelet::names::is_dns_subdomain(&name, MAX_NAME),
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

    fn taint(driver: &str) -> DeviceTaint {
        let mut s = super::super::taints::Stamps::default();
        let why = crate::health::Reason::new(vec![crate::health::Problem::new(
            crate::health::Kind::AerFatal,
            "1 fatal PCIe (AER) error(s) on x",
        )]);
        s.taints(driver, &Default::default(), &[("x", why.as_ref())])[0]
            .clone()
            .unwrap()
    }

    /// 128 devices to a slice while none has a taint, 64 once one has (the API's limits):
    /// one device turning unhealthy splits the pool.
    #[test]
    fn slices_hold_128_devices_untainted_64_once_one_is_tainted() {
        let pool = Pool {
            driver: "gcu.enflame.com",
            node: "n1",
            vendor: "enflame",
            driver_version: None,
        };
        let t = taint(pool.driver);
        let sizes = |n: u32, tainted: Option<u32>| -> Vec<(usize, i64)> {
            let devices = (0..n)
                .map(|i| device(&pool, &dev(i), (Some(i) == tainted).then_some(&t)))
                .collect();
            let c = Contents {
                counters: Vec::new(),
                devices,
            };
            slices(&pool, &c, 1)
                .iter()
                .map(|s| {
                    (
                        s.spec.devices.as_ref().map_or(0, Vec::len),
                        s.spec.pool.resource_slice_count,
                    )
                })
                .collect()
        };
        assert_eq!(sizes(128, None), [(128, 1)]);
        assert_eq!(sizes(129, None), [(128, 2), (1, 2)]);
        assert_eq!(sizes(128, Some(100)), [(64, 2), (64, 2)]);
        assert_eq!(sizes(65, Some(0)), [(64, 2), (1, 2)]);
    }

    #[test]
    fn a_pool_of_65_devices_is_two_slices_of_one_generation() {
        let pool = Pool {
            driver: "gcu.enflame.com",
            node: "n1",
            vendor: "enflame",
            driver_version: Some("1.2.3.4"),
        };
        let t = taint(pool.driver);
        let devices: Vec<Device> = (0..65)
            .map(|i| device(&pool, &dev(i), (i == 3).then_some(&t)))
            .collect();
        let c = Contents {
            counters: Vec::new(),
            devices,
        };
        let s = slices(&pool, &c, 7);
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
        assert_eq!(d0["capacity"]["memory"]["value"], "16Gi");
        assert!(v["spec"]["devices"][1].get("capacity").is_none());
        // 1.2.3.4 is not semver: its text only.
        assert_eq!(d0["attributes"]["driverVersionText"]["string"], "1.2.3.4");
        assert!(d0["attributes"].get("driverVersion").is_none());
        assert_eq!(d0["attributes"]["model"]["string"], "NVIDIA H100 80GB HBM3");
        for i in [1, 2] {
            assert!(v["spec"]["devices"][i]["attributes"].get("model").is_none());
        }
        assert!(v["spec"]["devices"][2]["attributes"]
            .get("pcieSwitch")
            .is_none());
        assert_eq!(
            v["spec"]["devices"][3]["taints"][0]["key"],
            "gcu.enflame.com/error"
        );
        assert_eq!(v["spec"]["devices"][3]["taints"][0]["value"], "aer-fatal");
        assert!(d0.get("taints").is_none());
        assert!(slices(&pool, &Contents::default(), 1).is_empty());
    }
}
