//! What each physical device is offered to the cluster as, from its profile's `[sharing]`:
//! whole (always), shared by capacity (`<device>-shared`, several claims each consuming part
//! of its memory, cores and slots), and its fixed partitions (`<device>-<name>-<k>`). Pure:
//! the slices are published from it and prepare checks allocations against it, so both read
//! one description.
//!
//! A device offered more than whole gets one counter set (named as the device): its memory
//! and one counter per slice of the device. The whole device and the shareable one consume
//! all of it; partition `k` of `count` consumes its own run of slices and its memory. So the
//! scheduler never gives a device whole and in parts at once, nor two overlapping parts, and
//! partitions pack (a half on slices 0-1, quarters on 2 and 3). The slices are the placement
//! a claim can choose with the `placement` attribute.
//!
//! Ref: KEP-4815 (partitionable devices), KEP-5075 (consumable capacity).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, DeviceCapacity,
    DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::kubelet::sharing::{Rung, Sharing};

use super::table::DraDevice;

/// What an offered device is of its physical device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Whole,
    /// Shared by capacity.
    Shared,
    /// Part `part` of `count` of partition `name`.
    Partition {
        name: String,
        count: u32,
        part: u32,
    },
}

impl Kind {
    /// The `sharing` attribute's value.
    pub fn mode(&self) -> &'static str {
        match self {
            Kind::Whole => "whole",
            Kind::Shared => "capacity",
            Kind::Partition { .. } => "partition",
        }
    }
}

/// One device as the slices name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer<'a> {
    pub name: String,
    pub parent: &'a DraDevice,
    pub kind: Kind,
    /// The device's memory (bytes) where known: what its shares and parts are cut from.
    pub memory: Option<u64>,
    /// The profile's `[sharing]` it was offered under.
    pub sharing: Option<&'a Sharing>,
}

/// The capacities a shareable device declares.
pub const MEMORY: &str = "memory";
pub const CORES: &str = "cores";
pub const SLOTS: &str = "slots";

/// One capacity of a shareable device: name, total, request policy `(default, min, step)`,
/// and how a quantity of it is written.
type Capacity = (
    &'static str,
    u64,
    Option<(u64, u64, u64)>,
    fn(u64) -> String,
);

/// The device's memory: what discovery read, else what the profile states.
pub fn memory_of(sharing: &Sharing, d: &DraDevice) -> Option<u64> {
    d.dev.memory.or_else(|| {
        sharing
            .memory
            .as_deref()
            .and_then(|m| crate::quantity::parse(m).ok())
    })
}

/// Whether `d` is offered more than whole (its memory known and a mode declared).
fn shared_at_all(sharing: &Sharing, memory: Option<u64>) -> bool {
    memory.is_some_and(|m| m > 0) && (sharing.capacity.is_some() || !sharing.partitions.is_empty())
}

/// Every device `table` offers under a profile's `sharing`, each physical device's offers
/// together, whole first.
pub fn offers<'a>(sharing: Option<&'a Sharing>, table: &'a [DraDevice]) -> Vec<Offer<'a>> {
    let mut out = Vec::with_capacity(table.len());
    for d in table {
        let memory = sharing.and_then(|s| memory_of(s, d));
        out.push(Offer {
            name: d.name.clone(),
            parent: d,
            kind: Kind::Whole,
            memory,
            sharing,
        });
        let Some(s) = sharing.filter(|s| shared_at_all(s, memory)) else {
            continue;
        };
        // The names come from kubelet::names, which the exporter maps claims back with: the
        // shareable device first, then each partition's parts in order.
        let mut names = crate::kubelet::names::offer_names(sharing, &d.name).into_iter();
        if s.capacity.is_some() {
            out.push(Offer {
                name: names.next().expect("a name per offer"),
                parent: d,
                kind: Kind::Shared,
                memory,
                sharing,
            });
        }
        for p in &s.partitions {
            for part in 0..p.count {
                out.push(Offer {
                    name: names.next().expect("a name per offer"),
                    parent: d,
                    kind: Kind::Partition {
                        name: p.name.clone(),
                        count: p.count,
                        part,
                    },
                    memory,
                    sharing,
                });
            }
        }
    }
    out
}

/// The counter set of `d`'s physical device, where it is offered more than whole under
/// `sharing`.
pub fn counter_set(sharing: Option<&Sharing>, d: &DraDevice) -> Option<CounterSet> {
    let s = sharing?;
    let memory = memory_of(s, d).filter(|_| shared_at_all(s, memory_of(s, d)))?;
    let mut counters = BTreeMap::from([(MEMORY.to_string(), counter(memory))]);
    for i in 0..s.slices() {
        counters.insert(slice_counter(i), counter(1));
    }
    Some(CounterSet {
        name: d.name.clone(),
        counters,
    })
}

fn counter(v: u64) -> Counter {
    Counter {
        value: Quantity(crate::quantity::bytes(v)),
    }
}

fn slice_counter(i: u32) -> String {
    format!("slice-{i}")
}

impl Offer<'_> {
    /// The slices of the device this offer holds: all of them but for a partition.
    pub fn slices(&self, sharing: &Sharing) -> std::ops::Range<u32> {
        let all = sharing.slices();
        match &self.kind {
            Kind::Partition { count, part, .. } => {
                let per = all / count;
                part * per..(part + 1) * per
            }
            _ => 0..all,
        }
    }

    /// What it takes of its device's counter set; `None` where the device has none.
    pub fn consumes(&self) -> Option<Vec<DeviceCounterConsumption>> {
        let s = self.sharing?;
        let memory = self.memory.filter(|_| shared_at_all(s, self.memory))?;
        let share = match &self.kind {
            Kind::Partition { count, .. } => memory / u64::from(*count),
            _ => memory,
        };
        let mut counters = BTreeMap::from([(MEMORY.to_string(), counter(share))]);
        for i in self.slices(s) {
            counters.insert(slice_counter(i), counter(1));
        }
        Some(vec![DeviceCounterConsumption {
            counter_set: self.parent.name.clone(),
            counters,
        }])
    }

    /// The capacities the profile declares for its shareable devices, as this device has
    /// them: name, total, request policy `(default, min, step)` and how a quantity of it is
    /// written. The one list both the slice ([`Offer::capacity`]) and prepare's accounting
    /// ([`Offer::totals`]) read.
    fn capacities(&self) -> Vec<Capacity> {
        let Some(c) = self.sharing.and_then(|s| s.capacity.as_ref()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let (Some(p), Some(m)) = (&c.memory, self.memory) {
            out.push((
                MEMORY,
                m,
                p.parse().ok(),
                crate::quantity::bytes as fn(u64) -> String,
            ));
        }
        if let Some(p) = &c.cores {
            out.push((CORES, 100, p.parse().ok(), |n: u64| n.to_string()));
        }
        if let Some(n) = c.slots {
            out.push((SLOTS, n.into(), Some((1, 1, 1)), |n: u64| n.to_string()));
        }
        out
    }

    /// The capacities a claim consumes part of: only on the shareable device, each with its
    /// total and request policy.
    pub fn capacity(&self) -> Option<BTreeMap<String, DeviceCapacity>> {
        if self.kind != Kind::Shared {
            return None;
        }
        self.sharing?.capacity.as_ref()?;
        let out = self
            .capacities()
            .into_iter()
            .map(|(name, total, policy, q)| {
                let request_policy = policy.map(|(default, min, step)| {
                    // The API wants max a whole number of steps above min, at most the total.
                    let max = min + (total.saturating_sub(min) / step) * step;
                    CapacityRequestPolicy {
                        default: Some(Quantity(q(default.min(max)))),
                        valid_range: Some(CapacityRequestPolicyRange {
                            min: Quantity(q(min)),
                            max: Some(Quantity(q(max))),
                            step: Some(Quantity(q(step))),
                        }),
                        valid_values: None,
                    }
                });
                let capacity = DeviceCapacity {
                    value: Quantity(q(total)),
                    request_policy,
                };
                (name.to_string(), capacity)
            })
            .collect();
        Some(out)
    }

    /// The capacities of the shareable device as numbers: name → total.
    pub fn totals(&self) -> BTreeMap<String, u64> {
        self.capacities()
            .into_iter()
            .map(|(name, total, ..)| (name.to_string(), total))
            .collect()
    }

    /// The rung that holds this offer's containers to what they are granted (its
    /// `enforcement` attribute): `None` for the whole device, which no one else holds; for a
    /// share or a part what the profile states, raised to `kernel` where the node's
    /// `dmem.capacity` (`dmem_capacity`, its text) lists a memory region of the device's PCI
    /// function.
    pub fn enforcement(&self, dmem_capacity: &str) -> Option<Rung> {
        let s = self.sharing?;
        let partition = match self.kind {
            Kind::Whole => return None,
            Kind::Shared => false,
            Kind::Partition { .. } => true,
        };
        let kernel_here = self
            .parent
            .dev
            .pci_bus_id
            .as_deref()
            .is_some_and(|bus| crate::dmem::enforceable(dmem_capacity, bus));
        Some(s.enforcement_of(partition, kernel_here))
    }

    /// What a partition is granted: its part of the memory and compute, one slot.
    pub fn partition_grant(&self) -> Grant {
        let Kind::Partition { count, .. } = &self.kind else {
            return Grant::default();
        };
        let count = u64::from(*count);
        Grant {
            memory: self.memory.map(|m| m / count),
            cores: Some(100 / count),
            slots: Some(1),
        }
    }
}

/// What one share or partition was granted, for its containers' variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub memory: Option<u64>,
    pub cores: Option<u64>,
    pub slots: Option<u64>,
}

/// The `NAME=value` variables `sharing.env` gives a container granted `g`. A variable whose
/// template names something not granted (cores on a device shared by memory only) is left
/// out, never given a made-up value.
pub fn env(sharing: &Sharing, g: &Grant) -> Vec<String> {
    sharing
        .env
        .iter()
        .filter_map(|(name, template)| {
            let mut out = String::new();
            let mut rest = template.as_str();
            while let Some(open) = rest.find('{') {
                let close = open + rest[open..].find('}')?;
                out.push_str(&rest[..open]);
                let v = match &rest[open + 1..close] {
                    "memory" => g.memory?,
                    "memory-mib" => g.memory? >> 20,
                    "memory-gib" => g.memory? >> 30,
                    "cores" => g.cores?,
                    "slots" => g.slots?,
                    _ => return None,
                };
                out.push_str(&v.to_string());
                rest = &rest[close + 1..];
            }
            out.push_str(rest);
            Some(format!("{name}={out}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::inventory::NodeDevice;

    /// The `[sharing]` of a profile with `sharing` as its tables.
    fn profile(sharing: &str) -> Option<Sharing> {
        let text = format!(
            "name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{{index}}\"]\n{sharing}"
        );
        let p = crate::profile::Profile::from_text(&text, "t").unwrap().0;
        Sharing::of(&p).unwrap().0
    }

    fn table(n: u32, memory: Option<u64>) -> Vec<DraDevice> {
        (0..n)
            .map(|i| DraDevice {
                name: format!("x-{i}"),
                dev: NodeDevice {
                    memory,
                    ..NodeDevice::numbered(i)
                },
            })
            .collect()
    }

    const ENFLAME_LIKE: &str = "[sharing]\nenforcement = { capacity = \"advisory\", partitions = \"advisory\" }\nmemory = \"32Gi\"\nenv = { MEM = \"{memory-gib}\", PCT = \"{cores}\", SUB = \"true\" }\n[sharing.capacity]\nmemory = { default = \"8Gi\", min = \"1Gi\", step = \"1Gi\" }\ncores = { default = \"25\", min = \"5\", step = \"5\" }\nslots = 16\n[[sharing.partitions]]\nname = \"half\"\ncount = 2\n[[sharing.partitions]]\nname = \"quarter\"\ncount = 4\n";

    #[test]
    fn a_device_is_offered_whole_shared_and_in_halves_and_quarters() {
        let p = profile(ENFLAME_LIKE);
        let t = table(2, None);
        let o = offers(p.as_ref(), &t);
        let names: Vec<&str> = o.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            names[..8],
            [
                "x-0",
                "x-0-shared",
                "x-0-half-0",
                "x-0-half-1",
                "x-0-quarter-0",
                "x-0-quarter-1",
                "x-0-quarter-2",
                "x-0-quarter-3"
            ]
        );
        assert_eq!(o.len(), 16);
        let s = p.as_ref().unwrap();
        assert_eq!(o[3].slices(s), 2..4);
        assert_eq!(o[6].slices(s), 2..3);
        assert_eq!(o[0].slices(s), 0..4);
        let set = counter_set(p.as_ref(), &t[0]).unwrap();
        assert_eq!(set.name, "x-0");
        assert_eq!(set.counters.len(), 5);
        assert_eq!(set.counters["memory"].value.0, "32Gi");
        let half = o[3].consumes().unwrap();
        assert_eq!(half[0].counter_set, "x-0");
        assert_eq!(
            half[0].counters.keys().collect::<Vec<_>>(),
            ["memory", "slice-2", "slice-3"]
        );
        assert_eq!(half[0].counters["memory"].value.0, "16Gi");
        assert_eq!(o[0].consumes().unwrap()[0].counters.len(), 5);
        let cap = o[1].capacity().unwrap();
        let mem = serde_json::to_value(&cap["memory"]).unwrap();
        assert_eq!(
            mem,
            serde_json::json!({"value": "32Gi", "requestPolicy": {"default": "8Gi", "validRange": {"min": "1Gi", "max": "32Gi", "step": "1Gi"}}})
        );
        assert_eq!(cap["cores"].value.0, "100");
        assert_eq!(cap["slots"].value.0, "16");
        assert!(o[0].capacity().is_none() && o[2].capacity().is_none());
        let g = o[7].partition_grant();
        assert_eq!(
            g,
            Grant {
                memory: Some(8 << 30),
                cores: Some(25),
                slots: Some(1)
            }
        );
        assert_eq!(env(s, &g), ["MEM=8", "PCT=25", "SUB=true"]);
        // Memory only: the cores variable is left out, not made up.
        let g = Grant {
            memory: Some(6 << 30),
            ..Grant::default()
        };
        assert_eq!(env(s, &g), ["MEM=6", "SUB=true"]);
    }

    /// A share or part reaches `kernel` only on a device whose PCI function has a `vram`
    /// region in `dmem.capacity`; the whole device carries no rung.
    #[test]
    fn shares_and_parts_are_kernel_enforced_only_where_their_device_has_a_region() {
        let p = profile(ENFLAME_LIKE);
        let mut t = table(2, None);
        t[0].dev.pci_bus_id = Some("0000:13:00.0".into());
        t[1].dev.pci_bus_id = Some("0000:14:00.0".into());
        let o = offers(p.as_ref(), &t);
        let capacity = "drm/0000:13:00.0/vram0 34359738368\ndrm/0000:14:00.0/system 1\n";
        let rung = |name: &str| {
            o.iter()
                .find(|x| x.name == name)
                .unwrap()
                .enforcement(capacity)
                .map(Rung::as_str)
        };
        assert_eq!(rung("x-0"), None);
        assert_eq!(rung("x-0-shared"), Some("kernel"));
        assert_eq!(rung("x-0-quarter-3"), Some("kernel"));
        assert_eq!(rung("x-1-shared"), Some("advisory"));
        assert_eq!(rung("x-1-half-0"), Some("advisory"));
        assert_eq!(o[1].enforcement("").map(Rung::as_str), Some("advisory"));
    }

    #[test]
    fn without_memory_or_a_mode_a_device_is_whole_only() {
        let no_memory = ENFLAME_LIKE.replace("memory = \"32Gi\"\n", "");
        let p = profile(&no_memory);
        let t = table(1, None);
        assert_eq!(offers(p.as_ref(), &t).len(), 1);
        assert!(counter_set(p.as_ref(), &t[0]).is_none());
        assert!(offers(p.as_ref(), &t)[0].consumes().is_none());
        // Discovery's reading stands in for the profile's.
        let t = table(1, Some(64 << 30));
        assert_eq!(offers(p.as_ref(), &t).len(), 8);
        assert_eq!(
            counter_set(p.as_ref(), &t[0]).unwrap().counters["memory"]
                .value
                .0,
            "64Gi"
        );
        let p = profile("");
        assert_eq!(offers(p.as_ref(), &t).len(), 1);
    }

    #[test]
    fn bad_sharing_tables_are_refused_naming_the_key() {
        for (bad, says) in [
            ("[sharing]\nlimits = \"maybe\"\n", "limits"),
            ("[sharing]\nlimits = \"advisory\"\nmemory = \"lots\"\n", "sharing.memory"),
            ("[sharing]\nlimits = \"advisory\"\n[sharing.capacity]\nmemory = { default = \"3Gi\", min = \"2Gi\", step = \"2Gi\" }\n", "min 2Gi plus"),
            ("[sharing]\nlimits = \"advisory\"\n[sharing.capacity]\ncores = { default = \"50\", min = \"100\", step = \"5\" }\n", "cores"),
            ("[sharing]\nlimits = \"advisory\"\n[[sharing.partitions]]\nname = \"Half\"\ncount = 2\n", "name \"Half\""),
            ("[sharing]\nlimits = \"advisory\"\n[[sharing.partitions]]\nname = \"x\"\ncount = 9\n", "2 to 8"),
            ("[sharing]\nlimits = \"advisory\"\n[[sharing.partitions]]\nname = \"a\"\ncount = 5\n[[sharing.partitions]]\nname = \"b\"\ncount = 7\n", "35 slices"),
            ("[sharing]\nlimits = \"advisory\"\nenv = { X = \"1\" }\n", "visible-devices"),
            ("[sharing]\nlimits = \"advisory\"\nenv = { MEM = \"{memory-tib}\" }\n", "unknown placeholder"),
        ] {
            let text = format!(
                "name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{{index}}\"]\n{bad}"
            );
            let (p, _) = crate::profile::Profile::from_text(&text, "t").unwrap();
            let err = Sharing::of(&p).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
