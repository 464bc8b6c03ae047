//! A profile's `[sharing]`: how the DRA driver offers each device besides whole (by capacity
//! and by partition) and the variables a share's containers get (docs/sharing.md). Read by the
//! DRA driver, which publishes the offers, and by the exporter, which maps a claim on a share
//! or part back to its device ([`crate::kubelet::names::offer_names`]); never by a create, so
//! its keys and checks live here, beside the daemons that read them, and not in
//! [`crate::profile`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::profile::{placeholders, Profile, ProfileError};

/// A profile's sharing on the DRA path: by capacity (one shareable device per physical
/// device, several claims each consuming part of its capacities) and by partition (fixed
/// parts of each device that consume its shared counters). Only what the vendor's stack
/// reads reaches a container: the variables of `env`, each from its documentation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Sharing {
    /// What holds a share's and a part's container to what it was granted, per mode:
    /// published as each shared or partitioned device's `enforcement` attribute (raised to
    /// `kernel` where the node's kernel enforces its memory, [`Sharing::enforcement_of`]).
    /// Both `advisory` where absent.
    #[serde(default)]
    pub enforcement: Option<Enforcement>,
    /// The key `enforcement` replaced (`enforced`: a vendor daemon's limits, `runtime`;
    /// `advisory`): still read, with a warning.
    #[serde(default)]
    pub limits: Option<Limits>,
    /// Each device's memory where discovery reads none (`32Gi`): the operator's statement of
    /// the node's model. Without either, a device is offered whole only.
    #[serde(default)]
    pub memory: Option<String>,
    /// By capacity: the shareable device's capacities and their request policies.
    #[serde(default)]
    pub capacity: Option<ShareCapacity>,
    /// By partition: each device cut into `count` equal parts, per entry.
    #[serde(default)]
    pub partitions: Vec<Partition>,
    /// Variables each share's and partition's containers get, as templates of what it was
    /// granted: `{memory}` (bytes), `{memory-mib}`, `{memory-gib}` (rounded down), `{cores}`
    /// (percent of the device's compute), `{slots}`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The old statement: `enforced` (by a vendor daemon) or `advisory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Limits {
    Enforced,
    Advisory,
}

impl Limits {
    /// Its rung: what `enforced` meant was a vendor daemon's limits.
    pub fn rung(self) -> Rung {
        match self {
            Limits::Enforced => Rung::Runtime,
            Limits::Advisory => Rung::Advisory,
        }
    }
}

/// A rung of the enforcement ladder, strongest first (docs/sharing.md): what holds a
/// container to the share or part it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rung {
    /// A real partition of the device (its own memory and compute, made by the device).
    Hardware,
    /// The kernel's limit: the dmem cgroup controller's `dmem.max` on the device's memory.
    Kernel,
    /// A vendor daemon's limits (MPS's control daemon), which a container cannot skip.
    Runtime,
    /// Variables only: a container that ignores them uses the whole device.
    Advisory,
}

impl Rung {
    /// The `enforcement` attribute's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Rung::Hardware => "hardware",
            Rung::Kernel => "kernel",
            Rung::Runtime => "runtime",
            Rung::Advisory => "advisory",
        }
    }

    /// The old `limits` attribute's value, still published beside `enforcement` for the
    /// selectors written against it: `advisory` for variables only, else `enforced`.
    pub fn limits(self) -> &'static str {
        match self {
            Rung::Advisory => "advisory",
            _ => "enforced",
        }
    }
}

/// What a profile's vendor stack reaches by itself, per mode: `capacity` for shares,
/// `partitions` for parts. `kernel` is not the profile's to say: each node verifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Enforcement {
    #[serde(default = "advisory")]
    pub capacity: Rung,
    #[serde(default = "advisory")]
    pub partitions: Rung,
}

fn advisory() -> Rung {
    Rung::Advisory
}

/// The capacities of a shareable device: memory (its whole memory), cores (100, percent of
/// its compute) and slots (claims at once), each present only where declared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ShareCapacity {
    #[serde(default)]
    pub memory: Option<Policy>,
    #[serde(default)]
    pub cores: Option<Policy>,
    /// At most this many claims share the device at once (each consumes one slot).
    #[serde(default)]
    pub slots: Option<u32>,
}

/// A capacity's request policy (the API's `requestPolicy`): a claim that names no amount
/// gets `default`; one that names an amount gets it rounded up to `min + n * step`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Policy {
    pub default: String,
    pub min: String,
    pub step: String,
}

/// Every device cut into `count` equal parts named `<device>-<name>-<k>`: each part has
/// 1/count of the memory and compute and its own place on the device.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Partition {
    pub name: String,
    pub count: u32,
}

/// The placeholders of a sharing variable's template.
pub const SHARING_PLACEHOLDERS: &[&str] = &["memory", "memory-mib", "memory-gib", "cores", "slots"];

/// The most slices a device is cut into (the API allows 32 counters per set: these and
/// `memory`).
pub const MAX_SLICES: u32 = 24;

impl Policy {
    /// `(default, min, step)` as whole numbers, checked against each other.
    pub fn parse(&self) -> Result<(u64, u64, u64), String> {
        let q = |what: &str, v: &str| crate::quantity::parse(v).map_err(|e| format!("{what}: {e}"));
        let (d, m, s) = (
            q("default", &self.default)?,
            q("min", &self.min)?,
            q("step", &self.step)?,
        );
        if s == 0 {
            return Err("step must be above 0".into());
        }
        if d < m || (d - m) % s != 0 {
            return Err(format!(
                "default {} must be min {} plus a whole number of steps {}",
                self.default, self.min, self.step
            ));
        }
        Ok((d, m, s))
    }
}

impl Sharing {
    /// `profile`'s `[sharing]`, checked, with a warning for each key it does not know; `None`
    /// where it declares none (or was loaded for a create, which keeps no such table).
    pub fn of(profile: &Profile) -> Result<(Option<Sharing>, Vec<String>), ProfileError> {
        let known = crate::keys::fields::<Sharing>()
            .iter()
            .chain(crate::keys::fields::<ShareCapacity>())
            .chain(crate::keys::fields::<Policy>())
            .chain(crate::keys::fields::<Partition>())
            .chain(crate::keys::fields::<Enforcement>())
            .copied()
            .collect::<Vec<_>>();
        let Some((s, mut warnings)) = profile.wings.read::<Sharing>("sharing", &known)? else {
            return Ok((None, Vec::new()));
        };
        if let Some(l) = s.limits {
            warnings.push(format!(
                "profile {}: sharing.limits is read as sharing.enforcement = {{ capacity = \"{r}\", partitions = \"{r}\" }}{}; write that instead",
                profile.name,
                if s.enforcement.is_some() { " unless enforcement is given, as here" } else { "" },
                r = l.rung().as_str(),
            ));
        }
        s.validate(&profile.visible_devices_env)
            .map_err(|msg| profile.wings.invalid(msg))?;
        Ok((Some(s), warnings))
    }

    /// What the profile states its vendor stack reaches for a share (`partition`: false) or
    /// a part (true): `enforcement`, else the old `limits`, else advisory.
    pub fn stated(&self, partition: bool) -> Rung {
        match (self.enforcement, self.limits) {
            (Some(e), _) if partition => e.partitions,
            (Some(e), _) => e.capacity,
            (None, Some(l)) => l.rung(),
            (None, None) => Rung::Advisory,
        }
    }

    /// The rung a share or part of a device reaches on this node: what the profile states,
    /// raised to `kernel` where the device's driver registered its memory with the dmem
    /// controller (`kernel_here`: [`crate::dmem::enforceable`] of the node's
    /// `dmem.capacity`), since the shim and the NRI plugin then write its `dmem.max`.
    /// Published as verified, not as claimed: a claim that selects `kernel` must get it.
    pub fn enforcement_of(&self, partition: bool, kernel_here: bool) -> Rung {
        let stated = self.stated(partition);
        if kernel_here {
            stated.min(Rung::Kernel)
        } else {
            stated
        }
    }

    /// The number of slices a device is cut into: the least common multiple of the
    /// partitions' counts (1 without partitions).
    pub fn slices(&self) -> u32 {
        fn gcd(a: u32, b: u32) -> u32 {
            if b == 0 {
                a
            } else {
                gcd(b, a % b)
            }
        }
        self.partitions
            .iter()
            .fold(1, |l, p| l / gcd(l, p.count) * p.count)
    }

    fn validate(&self, visible: &[String]) -> Result<(), String> {
        if let Some(e) = self.enforcement {
            for (mode, r) in [("capacity", e.capacity), ("partitions", e.partitions)] {
                if r == Rung::Kernel {
                    return Err(format!(
                        "sharing.enforcement.{mode}: \"kernel\" is not a profile's to state: each node publishes it where its kernel enforces the device's memory (dmem.capacity)"
                    ));
                }
            }
            if e.capacity == Rung::Hardware {
                return Err("sharing.enforcement.capacity: a share by capacity is never a hardware partition (hardware, runtime, advisory are for partitions; runtime or advisory for shares)".into());
            }
        }
        if let Some(m) = &self.memory {
            crate::quantity::parse(m).map_err(|e| format!("sharing.memory: {e}"))?;
        }
        if let Some(c) = &self.capacity {
            if let Some(p) = &c.memory {
                p.parse()
                    .map_err(|e| format!("sharing.capacity.memory: {e}"))?;
            }
            if let Some(p) = &c.cores {
                let (d, m, s) = p
                    .parse()
                    .map_err(|e| format!("sharing.capacity.cores: {e}"))?;
                if d > 100 || m + s > 100 {
                    return Err("sharing.capacity.cores: a percent of the device: default at most 100, min + step at most 100".into());
                }
            }
            if c.slots == Some(0) {
                return Err("sharing.capacity.slots must be at least 1".into());
            }
        }
        let mut names = BTreeSet::new();
        for p in &self.partitions {
            let label = !p.name.is_empty()
                && p.name.len() <= 16
                && p.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && p.name.as_bytes()[0].is_ascii_lowercase();
            if !label || p.name == "shared" {
                return Err(format!(
                    "sharing.partitions: name {:?} must be 1-16 of [a-z0-9], starting with a letter, and not \"shared\"",
                    p.name
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(format!("sharing.partitions: {} twice", p.name));
            }
            if !(2..=8).contains(&p.count) {
                return Err(format!(
                    "sharing.partitions {}: count must be 2 to 8",
                    p.name
                ));
            }
        }
        if self.slices() > MAX_SLICES {
            return Err(format!(
                "sharing.partitions: the counts need {} slices of a device, more than {MAX_SLICES}",
                self.slices()
            ));
        }
        for (name, template) in &self.env {
            let ok =
                name.bytes().enumerate().all(|(i, b)| {
                    b == b'_' || b.is_ascii_uppercase() || (i > 0 && b.is_ascii_digit())
                }) && !name.is_empty();
            if !ok || visible.contains(name) {
                return Err(format!(
                    "sharing.env: {name:?} must be an upper-case variable name and not a visible-devices variable"
                ));
            }
            for ph in placeholders(template).map_err(|e| format!("sharing.env {name}: {e}"))? {
                if !SHARING_PLACEHOLDERS.contains(&ph) {
                    return Err(format!("sharing.env {name}: unknown placeholder {{{ph}}}"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shipped profile's `[sharing]` reads and checks with no key it does not know.
    #[test]
    fn every_shipped_sharing_table_reads_with_no_unknown_keys() {
        let mut sharing = Vec::new();
        for p in crate::profile::shipped() {
            let (s, warnings) = Sharing::of(&p).unwrap();
            assert!(warnings.is_empty(), "{}: {warnings:?}", p.name);
            if s.is_some() {
                sharing.push(p.name);
            }
        }
        sharing.sort();
        assert_eq!(sharing, ["enflame", "nvidia"]);
    }

    fn sharing(table: &str) -> Result<(Option<Sharing>, Vec<String>), ProfileError> {
        let text = format!("name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{{index}}\"]\n[sharing]\n{table}");
        Sharing::of(&Profile::from_text(&text, "t").unwrap().0)
    }

    /// Each mode's statement, raised to `kernel` only where the node verified it, never
    /// lowered from `hardware`; nothing stated is advisory.
    #[test]
    fn enforcement_is_stated_per_mode_and_raised_to_kernel_where_verified() {
        let (s, w) =
            sharing("enforcement = { capacity = \"runtime\", partitions = \"hardware\" }\n")
                .unwrap();
        let s = s.unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(s.enforcement_of(false, false), Rung::Runtime);
        assert_eq!(s.enforcement_of(false, true), Rung::Kernel);
        assert_eq!(s.enforcement_of(true, true), Rung::Hardware);
        assert_eq!(s.enforcement_of(true, false).as_str(), "hardware");
        let (s, _) = sharing("").unwrap();
        let s = s.unwrap();
        assert_eq!(s.enforcement_of(false, false), Rung::Advisory);
        assert_eq!(s.enforcement_of(true, true), Rung::Kernel);
        assert_eq!(Rung::Advisory.limits(), "advisory");
        assert_eq!(Rung::Kernel.limits(), "enforced");
    }

    /// The old key is read as before, and said.
    #[test]
    fn the_old_limits_key_is_read_and_warned_of() {
        let (s, w) = sharing("limits = \"enforced\"\n").unwrap();
        assert_eq!(s.unwrap().stated(true), Rung::Runtime);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("sharing.limits is read as sharing.enforcement"),
            "{w:?}"
        );
        let (s, _) =
            sharing("limits = \"enforced\"\nenforcement = { capacity = \"advisory\" }\n").unwrap();
        assert_eq!(s.unwrap().stated(false), Rung::Advisory);
    }

    #[test]
    fn kernel_and_a_hardware_share_are_refused_as_statements() {
        for (t, says) in [
            (
                "enforcement = { capacity = \"kernel\" }\n",
                "not a profile's to state",
            ),
            (
                "enforcement = { partitions = \"kernel\" }\n",
                "sharing.enforcement.partitions",
            ),
            (
                "enforcement = { capacity = \"hardware\" }\n",
                "never a hardware partition",
            ),
            ("enforcement = { capacity = \"strict\" }\n", "strict"),
        ] {
            let e = sharing(t).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(says), "{t}: {e}");
        }
    }

    #[test]
    fn an_unknown_sharing_key_is_warned_of_with_the_nearest() {
        let text = "name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{index}\"]\n[sharing]\nmemroy = \"8Gi\"\n";
        let (p, unknown) = Profile::from_text(text, "t").unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        let (s, warnings) = Sharing::of(&p).unwrap();
        assert_eq!(s.unwrap().memory, None);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("sharing.memroy"), "{warnings:?}");
        assert!(warnings[0].contains("memory"), "{warnings:?}");
    }
}
