//! Vendor profiles: everything the runtime knows about a vendor is data in one of these.
//!
//! NVIDIA and Enflame are compiled in from `config/profiles/*.toml`; other vendors are files in
//! `profiles-dir`; any key of any profile can be overridden from `config.toml`
//! `[profiles.<name>]`. Overrides are merged as TOML tables before deserializing, so a
//! profile is always validated as a whole.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A profile compiled into the binary: the text of its file under `config/profiles/`,
/// parsed like any profile file when a create needs it.
#[derive(Debug)]
pub struct Builtin {
    /// File name under `config/profiles/`.
    pub file: &'static str,
    /// The profile's `name` (test `builtins_parse_with_no_unknown_keys` checks it).
    pub name: &'static str,
    pub text: &'static str,
}

/// The built-in profiles; other vendors ship as files in `profiles-dir`.
pub const BUILTIN: &[Builtin] = &[
    Builtin {
        file: "nvidia.toml",
        name: "nvidia",
        text: include_str!("../config/profiles/nvidia.toml"),
    },
    Builtin {
        file: "enflame.toml",
        name: "enflame",
        text: include_str!("../config/profiles/enflame.toml"),
    },
];

impl Builtin {
    /// How errors and warnings name this profile.
    pub fn origin(&self) -> String {
        format!("built-in {}", self.file)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("profile {origin}: {source}")]
    Parse {
        origin: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("profile {origin}: {msg}")]
    Invalid { origin: String, msg: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Variables that select devices; the first one present in the container's env wins.
    pub visible_devices_env: Vec<String>,
    /// Host prefix of the driver's files (procfs/sysfs info, libraries, binaries).
    #[serde(default = "root")]
    pub driver_root: PathBuf,
    /// Host prefix of the device nodes; defaults to `driver-root`.
    #[serde(default)]
    pub dev_root: Option<PathBuf>,
    /// Whether `none` injects the driver (control nodes, libraries) without any device.
    #[serde(default)]
    pub none_injects_driver: bool,
    #[serde(default)]
    pub cdi_kind: Option<String>,
    /// CDI kinds other than `cdi-kind` that the vendor variable may name devices of
    /// (`nvidia.com/mig`); none by default, so a container's variable cannot reach another
    /// vendor's or a host-file spec.
    #[serde(default)]
    pub cdi_extra_kinds: Vec<String>,
    /// Majors a device's own node must have on the host (empty: not checked).
    #[serde(default)]
    pub device_majors: Vec<u64>,
    #[serde(default)]
    pub resource_name: Option<String>,
    /// How the vendor's device plugin names a device: `{index}`, `{uuid}`, `{minor}`, `{bus}`.
    #[serde(default)]
    pub device_plugin_id: Option<String>,
    /// Time-slicing: each shared device is offered to kubelet this many times, as
    /// `<id>::<k>` (k from 0); 1 offers every device once. Replicas share the device's memory
    /// and compute with no limit: information for the scheduler, not isolation.
    #[serde(default = "one")]
    pub replicas: u32,
    /// Where the replicas are offered: unset, under `resource-name` (every device shared);
    /// set, under this resource, with `shared-devices` shared and the others whole under
    /// `resource-name`, so whole-device and shared pods never meet on a device.
    #[serde(default)]
    pub shared_resource_name: Option<String>,
    /// Indexes of the devices shared under `shared-resource-name` (unset: all of them).
    #[serde(default)]
    pub shared_devices: Option<Vec<u32>>,
    /// How a request for several replicas is placed.
    #[serde(default)]
    pub replica_policy: ReplicaPolicy,
    /// A variable the vendor's software reads for how many replicas share its device, set
    /// in each container given replicas (none known today, so no built-in profile sets it).
    #[serde(default)]
    pub replicas_env: Option<String>,
    #[serde(default)]
    pub container_devices_mount_dir: Option<String>,
    /// File under driver-root whose first dotted number is the driver version.
    #[serde(default)]
    pub version_file: Option<PathBuf>,
    pub discovery: Discovery,
    /// Nodes every container of this vendor gets, each only when present on the host.
    #[serde(default)]
    pub control_nodes: Vec<PathBuf>,
    #[serde(default)]
    pub library_search_dirs: Vec<PathBuf>,
    #[serde(default)]
    pub binary_search_dirs: Vec<PathBuf>,
    /// Variable that selects capability groups; without it every group applies.
    #[serde(default)]
    pub capabilities_env: Option<String>,
    #[serde(default)]
    pub default_capabilities: Vec<String>,
    #[serde(default)]
    pub capabilities: BTreeMap<String, Capability>,
    /// Development names (`libcuda.so`) and the soname each stands for (`libcuda.so.1`):
    /// mounted from the same host file when that soname is mounted (src/loader.rs).
    #[serde(default)]
    pub dev_links: BTreeMap<String, String>,
    /// Newer driver libraries an image may carry (CUDA forward compatibility).
    #[serde(default)]
    pub compat: Option<Compat>,
    /// Image requirements on the driver (`NVIDIA_REQUIRE_*`, src/constraints.rs).
    #[serde(default)]
    pub requirements: Option<Requirements>,
    /// The tables only a daemon reads ([`WINGS`]), as written, each for the wing that reads
    /// it; empty where the loader was asked for what a create reads ([`Keep::Create`]).
    #[serde(skip)]
    pub wings: Wings,
}

/// Where a request for several replicas of shared devices lands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaPolicy {
    /// One replica per device while there are devices with free replicas, the least used
    /// devices first: a pod asking for 2 slices gets two devices' time, not one's twice
    /// (NVIDIA's users asked for this: gpu-operator #386, #491).
    #[default]
    Spread,
    /// All on as few devices as possible, the fullest that still fit first, leaving whole
    /// devices free for larger requests.
    Pack,
    /// A request for more than one replica fails (NVIDIA's `failRequestsGreaterThanOne`): a
    /// container that asks for 2 would otherwise believe it has more than one device's share.
    Strict,
}

impl ReplicaPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaPolicy::Spread => "spread",
            ReplicaPolicy::Pack => "pack",
            ReplicaPolicy::Strict => "strict",
        }
    }
}

/// Where an image carries forward-compatibility driver libraries (src/loader.rs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Compat {
    /// Directory in the image (`/usr/local/cuda/compat`).
    pub dir: PathBuf,
    /// Stem whose `<stem>.so.<version>` file gives the libraries' driver version (`libcuda`).
    pub version_library: String,
    /// Stems of the libraries that take precedence when the image's are newer.
    pub libraries: Vec<String>,
}

/// The variables an image states its requirements in, and the driver -> CUDA table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Requirements {
    /// Every variable with this prefix is a requirement (`NVIDIA_REQUIRE_`).
    pub env_prefix: String,
    /// A variable that, true, skips the checks (`NVIDIA_DISABLE_REQUIRE`).
    #[serde(default)]
    pub disable_env: Option<String>,
    /// A variable holding the image's CUDA version, checked as `cuda>=X.Y` when the image
    /// states no `<prefix>CUDA` (`CUDA_VERSION`).
    #[serde(default)]
    pub legacy_cuda_env: Option<String>,
    /// Minimum driver version (key) of each CUDA version (value).
    #[serde(default)]
    pub cuda_by_driver: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Discovery {
    /// NVIDIA's `/proc/driver/nvidia/gpus/<bus>/information`; index = PCI bus order.
    #[serde(rename_all = "kebab-case")]
    NvidiaProcfs {
        proc_dir: PathBuf,
        /// Container path of a GPU's node, `{minor}` replaced.
        node_template: String,
    },
    /// Devices are the nodes matching the first template; `{index}` is the device number.
    #[serde(rename_all = "kebab-case")]
    DeviceNodes {
        node_templates: Vec<String>,
        #[serde(default)]
        aliases: Vec<String>,
        /// Accept `a-b` ranges in the variable.
        #[serde(default)]
        index_ranges: bool,
    },
    /// DRM-class devices (AMD, Intel, Hygon, MetaX): each PCI function of the profile's
    /// vendors, bound to one of its drivers, that has a render node under `/sys/class/drm`;
    /// its nodes are `/dev/dri/renderD<M>` then `/dev/dri/card<N>` (src/discovery/drm.rs).
    #[serde(rename_all = "kebab-case")]
    Drm {
        /// PCI vendor ids (`0x1002`) whose functions count; another vendor's display GPU on
        /// the same node is never offered.
        pci_vendors: Vec<String>,
        /// Kernel drivers one of which must be bound (`amdgpu`); empty: any driver.
        #[serde(default)]
        drivers: Vec<String>,
        /// How the vendor's tools number devices.
        #[serde(default)]
        order: DrmOrder,
        /// KFD topology directory (`/sys/class/kfd/kfd/topology/nodes`) under driver-root:
        /// unique ids (`unique_id`, written `0x<hex>`) and the `kfd` order.
        #[serde(default)]
        kfd_topology: Option<PathBuf>,
        /// Accept `a-b` ranges in the variable.
        #[serde(default)]
        index_ranges: bool,
    },
}

/// Index order of DRM-class devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrmOrder {
    /// PCI address order of the functions.
    #[default]
    PciBus,
    /// KFD topology node order (GPU nodes only); devices KFD does not list come after, in
    /// PCI order.
    Kfd,
    /// DRM card number order (`card0` first).
    Card,
}

impl Discovery {
    /// Whether the variable accepts `a-b` ranges.
    pub fn index_ranges(&self) -> bool {
        match self {
            Discovery::NvidiaProcfs { .. } => false,
            Discovery::DeviceNodes { index_ranges, .. } | Discovery::Drm { index_ranges, .. } => {
                *index_ranges
            }
        }
    }

    /// The container path where the first node of each device appears, `{index}` standing
    /// for its number (what the device plugin watches).
    pub fn node_template(&self) -> Option<&str> {
        match self {
            Discovery::NvidiaProcfs { node_template, .. } => Some(node_template),
            Discovery::DeviceNodes { node_templates, .. } => {
                node_templates.first().map(String::as_str)
            }
            Discovery::Drm { .. } => Some("/dev/dri/renderD{index}"),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Capability {
    /// Other capability groups this one brings along.
    #[serde(default)]
    pub includes: Vec<String>,
    /// Library stems (`libcuda`): every soname `libcuda.so.*` found is mounted.
    #[serde(default)]
    pub libraries: Vec<String>,
    #[serde(default)]
    pub binaries: Vec<String>,
    /// Extra nodes (added when present).
    #[serde(default)]
    pub nodes: Vec<PathBuf>,
}

/// Every key a profile table can hold, at any depth (for "did you mean" in warnings).
/// `discovery`'s keys are listed by hand: its methods are an internally tagged enum, which
/// does not name its fields to a deserializer (test `known_keys_are_accepted`).
pub fn known_keys() -> Vec<&'static str> {
    let mut keys = crate::keys::fields::<Profile>().to_vec();
    keys.extend(crate::keys::fields::<Capability>());
    keys.extend(WINGS);
    keys.extend([
        "method",
        "proc-dir",
        "node-template",
        "node-templates",
        "aliases",
        "index-ranges",
        "pci-vendors",
        "drivers",
        "order",
        "kfd-topology",
    ]);
    keys
}

/// The tables of a profile that only a daemon reads, each by the wing beside it: the
/// exporter's `[metrics]` (src/exporter/sources/profile.rs), the DRA driver's `[sharing]`
/// (src/kubelet/sharing.rs) and the health engine's `[health]` (src/health/wing.rs). A create reads none of them: the loader drops them from the
/// parsed document before the profile is read ([`Keep::Create`]), so their keys and checks
/// cost a create nothing, and a mistake in one is said by the daemon that reads it.
pub const WINGS: &[&str] = &["health", "metrics", "sharing"];

/// Which of a profile's tables the loader keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// What a create reads: the [`WINGS`] are dropped unread.
    Create,
    /// Everything: the [`WINGS`] kept, as written, in [`Profile::wings`].
    All,
}

/// A profile's [`WINGS`] as written, for the wing that reads each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wings {
    /// How errors name the profile.
    origin: String,
    tables: BTreeMap<&'static str, toml::Value>,
}

impl Wings {
    /// Wing `name`'s table read into `T` with the warnings for its keys `T` does not know
    /// (`known`: every key a table of it may hold, for "did you mean"); `None` where the
    /// profile has none.
    pub fn read<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        known: &[&str],
    ) -> Result<Option<(T, Vec<String>)>, ProfileError> {
        let Some(value) = self.tables.get(name) else {
            return Ok(None);
        };
        let mut unknown = Vec::new();
        let t = serde_ignored::deserialize(value.clone(), |path| {
            unknown.push(format!("{name}.{path}"))
        })
        // Without the text, the error names the key it is about on a line of its own.
        .map_err(|e| {
            let shown = e.to_string();
            self.invalid(format!("{name}: {}", shown.trim_end().replace('\n', " ")))
        })?;
        let warnings = unknown
            .iter()
            .map(|k| crate::keys::unknown_key(&self.origin, k, known))
            .collect();
        Ok(Some((t, warnings)))
    }

    /// The wings this profile has a table for, as loaded.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.tables.keys().copied()
    }

    /// The error for a wing's table, naming the profile as the loader's errors do.
    pub fn invalid(&self, msg: String) -> ProfileError {
        ProfileError::Invalid {
            origin: self.origin.clone(),
            msg,
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from("/")
}

fn one() -> u32 {
    1
}

/// The most replicas a device may be offered as: kubelet lists every one on each
/// ListAndWatch, and device IDs stay within its 63 characters.
pub const MAX_REPLICAS: u32 = 1024;

impl Profile {
    /// Parses a profile table, returning it with the keys it did not know (dotted paths).
    pub fn from_table(
        table: toml::Table,
        origin: &str,
    ) -> Result<(Profile, Vec<String>), ProfileError> {
        // As text, so that profiles are read by one deserializer only (each one more is the
        // whole of Profile's reading code again, in the binary and in what a create touches).
        let text = toml::to_string(&table).map_err(|e| ProfileError::Invalid {
            origin: origin.to_string(),
            msg: e.to_string(),
        })?;
        Profile::from_text(&text, origin)
    }

    /// [`Profile::from_table`] of a profile's text.
    pub fn from_text(text: &str, origin: &str) -> Result<(Profile, Vec<String>), ProfileError> {
        Profile::from_document(parse_document(text, origin)?, origin, Keep::All)
    }

    /// [`Profile::from_table`] of a parsed profile file, keeping its [`WINGS`] or not. Every
    /// device create builds the profiles it may involve, so none goes through a
    /// [`toml::Table`] on the way: copying each key and value out of the text into a table
    /// and reading them again was a tenth of an 8-GPU create (benches/BENCHMARKS.md,
    /// "Profiles read without a table").
    pub fn from_document(
        mut doc: Spanned<DeTable<'_>>,
        origin: &str,
        keep: Keep,
    ) -> Result<(Profile, Vec<String>), ProfileError> {
        let mut wings = Wings {
            origin: origin.to_string(),
            tables: BTreeMap::new(),
        };
        for name in WINGS {
            let Some(table) = doc.get_mut().remove(*name) else {
                continue;
            };
            if keep == Keep::All {
                let value = toml::Value::deserialize(toml::de::ValueDeserializer::from(table))
                    .map_err(|source| ProfileError::Parse {
                        origin: origin.to_string(),
                        source,
                    })?;
                wings.tables.insert(name, value);
            }
        }
        let mut unknown = Vec::new();
        let mut profile: Profile =
            serde_ignored::deserialize(toml::de::Deserializer::from(doc), |path| {
                unknown.push(path.to_string())
            })
            .map_err(|source| ProfileError::Parse {
                origin: origin.to_string(),
                source,
            })?;
        profile.wings = wings;
        profile.validate(origin)?;
        Ok((profile, unknown))
    }

    /// Where the device nodes live on the host.
    pub fn dev_root(&self) -> &Path {
        self.dev_root.as_deref().unwrap_or(&self.driver_root)
    }

    /// Whether device `index` is offered as replicas (see `replicas`, `shared-devices`).
    pub fn shares(&self, index: u32) -> bool {
        self.replicas > 1
            && (self.shared_resource_name.is_none()
                || self
                    .shared_devices
                    .as_ref()
                    .is_none_or(|l| l.contains(&index)))
    }

    /// Joins a path from the profile (absolute, container-style) under a host root.
    pub fn under(root: &Path, path: &Path) -> PathBuf {
        root.join(path.strip_prefix("/").unwrap_or(path))
    }

    fn validate(&self, origin: &str) -> Result<(), ProfileError> {
        let invalid = |msg: String| {
            Err(ProfileError::Invalid {
                origin: origin.to_string(),
                msg,
            })
        };
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return invalid(format!(
                "name {:?} must be non-empty [A-Za-z0-9_-]",
                self.name
            ));
        }
        if self.visible_devices_env.is_empty() {
            return invalid("visible-devices-env is empty".into());
        }
        for kind in self.cdi_kind.iter().chain(&self.cdi_extra_kinds) {
            let valid = kind.split_once('/').is_some_and(|(v, c)| {
                !v.is_empty() && !c.is_empty() && !c.contains('/') && !kind.contains('=')
            });
            if !valid {
                return invalid(format!("CDI kind {kind:?} must be vendor/class"));
            }
        }
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return invalid(format!(
                "replicas = {} must be between 1 and {MAX_REPLICAS}",
                self.replicas
            ));
        }
        if let Some(shared) = &self.shared_resource_name {
            if self.replicas < 2 {
                return invalid(format!(
                    "shared-resource-name {shared:?} needs replicas of 2 or more"
                ));
            }
            if self.resource_name.as_deref() == Some(shared.as_str()) {
                return invalid(format!(
                    "shared-resource-name {shared:?} must differ from resource-name"
                ));
            }
        }
        if self.shared_devices.is_some() && self.shared_resource_name.is_none() {
            return invalid(
                "shared-devices needs shared-resource-name (without it every device is shared)"
                    .into(),
            );
        }
        for root in [Some(&self.driver_root), self.dev_root.as_ref()]
            .into_iter()
            .flatten()
        {
            if !root.is_absolute() || has_dotdot(root) {
                return invalid(format!(
                    "driver-root/dev-root {} must be an absolute path without '..'",
                    root.display()
                ));
            }
        }
        let mut paths: Vec<&Path> = self.control_nodes.iter().map(PathBuf::as_path).collect();
        paths.extend(self.library_search_dirs.iter().map(PathBuf::as_path));
        paths.extend(self.binary_search_dirs.iter().map(PathBuf::as_path));
        paths.extend(
            self.capabilities
                .values()
                .flat_map(|c| c.nodes.iter().map(PathBuf::as_path)),
        );
        paths.extend(self.version_file.as_deref());
        let templates: Vec<&str> = match &self.discovery {
            Discovery::NvidiaProcfs {
                proc_dir,
                node_template,
            } => {
                paths.push(proc_dir);
                vec![node_template.as_str()]
            }
            Discovery::DeviceNodes { node_templates, .. } => {
                if node_templates.is_empty() {
                    return invalid("discovery.node-templates is empty".into());
                }
                if !node_templates[0].contains("{index}") {
                    return invalid(format!(
                        "node template {:?} needs {{index}}",
                        node_templates[0]
                    ));
                }
                node_templates.iter().map(String::as_str).collect()
            }
            Discovery::Drm {
                pci_vendors,
                drivers,
                kfd_topology,
                ..
            } => {
                let hex4 = |v: &str| {
                    v.strip_prefix("0x")
                        .is_some_and(|h| h.len() == 4 && h.bytes().all(|b| b.is_ascii_hexdigit()))
                };
                if pci_vendors.is_empty() {
                    return invalid("discovery.pci-vendors is empty".into());
                }
                if let Some(v) = pci_vendors.iter().find(|v| !hex4(v)) {
                    return invalid(format!(
                        "discovery.pci-vendors {v:?} must be 0x and four hex digits"
                    ));
                }
                if let Some(d) = drivers.iter().find(|d| !plain_name(d)) {
                    return invalid(format!("discovery.drivers {d:?} must be a plain name"));
                }
                paths.extend(kfd_topology.as_deref());
                Vec::new()
            }
        };
        for t in templates {
            let p = Path::new(t);
            if !p.is_absolute() || has_dotdot(p) || !t.starts_with("/dev/") {
                return invalid(format!(
                    "node template {t:?} must be an absolute path under /dev without '..'"
                ));
            }
        }
        for p in paths {
            if !p.is_absolute() || has_dotdot(p) {
                return invalid(format!(
                    "path {} must be absolute without '..'",
                    p.display()
                ));
            }
        }
        for name in self
            .capabilities
            .values()
            .flat_map(|c| c.libraries.iter().chain(&c.binaries))
        {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return invalid(format!(
                    "library/binary name {name:?} must be a plain file name"
                ));
            }
        }
        let plain = |n: &str| !n.is_empty() && !n.contains('/') && n != "." && n != "..";
        for (dev, soname) in &self.dev_links {
            if !plain(dev) || !plain(soname) {
                return invalid(format!(
                    "dev-links {dev:?} = {soname:?}: both must be plain file names"
                ));
            }
        }
        if let Some(c) = &self.compat {
            if !c.dir.is_absolute() || has_dotdot(&c.dir) {
                return invalid(format!(
                    "compat.dir {} must be absolute without '..'",
                    c.dir.display()
                ));
            }
            if let Some(n) = c
                .libraries
                .iter()
                .chain([&c.version_library])
                .find(|n| !plain(n))
            {
                return invalid(format!("compat library {n:?} must be a plain file name"));
            }
        }
        for (cap, c) in &self.capabilities {
            for inc in &c.includes {
                if !self.capabilities.contains_key(inc) {
                    return invalid(format!("capability {cap} includes unknown {inc}"));
                }
            }
        }
        for cap in &self.default_capabilities {
            if !self.capabilities.contains_key(cap) {
                return invalid(format!("default-capabilities names unknown {cap}"));
            }
        }
        Ok(())
    }
}

/// The `{...}` placeholders of `text`, or why it is not well formed.
pub fn placeholders(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(['{', '}']) {
        if rest.as_bytes()[open] == b'}' {
            return Err(format!("{text:?}: a '}}' without '{{'"));
        }
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("{text:?}: a '{{' without '}}'"));
        };
        out.push(&rest[open + 1..open + close]);
        rest = &rest[open + close + 1..];
    }
    Ok(out)
}

/// Whether a profile or config.toml text may give one of the strings `is_name` accepts as a
/// TOML string (a variable a profile claims, a profile's name): `false` only when certain.
///
/// Without a backslash and a multi-line string (`"""`, `'''`), a TOML string is a basic
/// string that holds no `"` or a literal one that holds no `'`, so its text is the run of
/// bytes between two consecutive `"` or two consecutive `'` of the file (comments and the
/// runs between strings only add runs that are not strings). Every such run is offered to
/// `is_name`; any backslash or triple quote makes the answer `true`. Linear in the text.
/// Used by the create's screen (src/spec/screen.rs) and to skip parsing the profiles a
/// create cannot involve (src/config.rs).
pub fn may_quote<'t>(text: &'t [u8], mut is_name: impl FnMut(&'t [u8]) -> bool) -> bool {
    // One pass over the text for both quotes and the backslash: per quote, the last two
    // seen of that quote (`"""` is three in a row).
    let mut seen: [(Option<usize>, Option<usize>); 2] = [(None, None); 2];
    for at in memchr::memchr3_iter(b'"', b'\'', b'\\', text) {
        let (before, last) = match text[at] {
            b'"' => &mut seen[0],
            b'\'' => &mut seen[1],
            _ => return true,
        };
        if let Some(l) = *last {
            if at == l + 1 && before.map(|b| b + 1) == Some(l) {
                return true;
            }
            if is_name(&text[l + 1..at]) {
                return true;
            }
        }
        (*before, *last) = (*last, Some(at));
    }
    false
}

/// Replica `k` of device `id`, as the device plugin lists a shared device (NVIDIA's
/// plugin names time-sliced replicas the same way).
pub fn replica_id(id: &str, k: u32) -> String {
    format!("{id}::{k}")
}

/// Lengths of names or runs, to reject most of them before any hashing: a bitmap below 256
/// bytes. Longer ones are rare (a comment between two strings, a hostile spec's names): each
/// is kept where the caller says so (few, from root's texts), else only the longest, so
/// that a hostile spec costs no memory.
#[derive(Debug, Default)]
pub struct Lengths {
    short: [u64; 4],
    long: std::collections::HashSet<usize>,
    longest: usize,
}

impl Lengths {
    pub fn add(&mut self, n: usize, keep_long: bool) {
        match self.short.get_mut(n / 64) {
            Some(bits) => *bits |= 1 << (n % 64),
            None if keep_long => {
                self.long.insert(n);
            }
            None => self.longest = self.longest.max(n),
        }
    }

    /// Whether `n` may be one of the lengths added (where only the longest was kept: any up
    /// to it).
    pub fn has(&self, n: usize) -> bool {
        match self.short.get(n / 64) {
            Some(bits) => bits & (1 << (n % 64)) != 0,
            None => n <= self.longest || self.long.contains(&n),
        }
    }
}

/// Every profile file under `config/profiles/`, read with all its tables, for the tests of
/// the wings that read them.
#[cfg(test)]
pub(crate) fn shipped() -> Vec<Profile> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            Profile::from_text(&text, &path.display().to_string())
                .unwrap()
                .0
        })
        .collect()
}

/// A name that is one path component: not empty, no `/`, not `.` or `..`.
pub fn plain_name(n: &str) -> bool {
    !n.is_empty() && !n.contains('/') && n != "." && n != ".."
}

/// True when a path has a `..` component: profile paths are joined under host roots.
pub fn has_dotdot(p: &Path) -> bool {
    // What `components()` calls ParentDir, without building the components (every path of
    // every profile is checked on each create).
    p.as_os_str()
        .as_bytes()
        .split(|&b| b == b'/')
        .any(|c| c == b"..")
}

/// A profile file's text parsed, borrowing from it.
pub fn parse_document<'t>(
    text: &'t str,
    origin: &str,
) -> Result<Spanned<DeTable<'t>>, ProfileError> {
    DeTable::parse(text).map_err(|source| ProfileError::Parse {
        origin: origin.to_string(),
        source,
    })
}

/// A parsed profile file's `name`, where it is a string.
pub fn document_name<'d>(doc: &'d Spanned<DeTable<'_>>) -> Option<&'d str> {
    match doc.get_ref().get("name")?.get_ref() {
        DeValue::String(s) => Some(s),
        _ => None,
    }
}

/// Merges `over` into `base`: tables recursively, everything else replaced.
pub fn merge_documents<'a>(
    mut base: Spanned<DeTable<'a>>,
    over: Spanned<DeTable<'a>>,
) -> Spanned<DeTable<'a>> {
    fn merge<'a>(base: &mut DeTable<'a>, over: DeTable<'a>) {
        for (k, v) in over {
            let (span, v) = (v.span(), v.into_inner());
            match (base.get_mut(&**k.get_ref()).map(Spanned::get_mut), v) {
                (Some(DeValue::Table(b)), DeValue::Table(o)) => merge(b, o),
                (_, v) => {
                    base.insert(k, Spanned::new(span, v));
                }
            }
        }
    }
    merge(base.get_mut(), over.into_inner());
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn may_quote_is_sure_only_of_plain_strings() {
        let names = |text: &str, wanted: &[&str]| {
            may_quote(text.as_bytes(), |run| {
                wanted.iter().any(|w| w.as_bytes() == run)
            })
        };
        let text = "# PATH and \"it's\"\nname = 'x'\nvisible-devices-env = [\"A_B\", 'C']\n";
        assert!(names(text, &["A_B"]) && names(text, &["C"]) && names(text, &["x"]));
        assert!(!names(text, &["PATH", "A", "B", "name"]));
        // A name with a quote of the other kind is still a run.
        assert!(names("v = [\"A'B\"]", &["A'B"]));
        // Escapes and multi-line strings: never sure.
        assert!(names("v = [\"A\\u005fB\"]", &[]));
        assert!(names("v = \"\"\"\nA\"\"\"", &[]));
        assert!(names("v = '''A'''", &[]));
        // Two empty strings are no triple quote.
        assert!(!names("\"\" = 1\nb = ''\n", &["x"]));
        assert!(!names("", &[""]));
    }

    fn builtin(name: &str) -> Profile {
        let text = BUILTIN.iter().find(|b| b.name == name).unwrap().text;
        let (p, unknown) = Profile::from_table(toml::from_str(text).unwrap(), name).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        p
    }

    #[test]
    fn builtins_parse_with_no_unknown_keys() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles");
        for b in BUILTIN {
            assert_eq!(std::fs::read_to_string(dir.join(b.file)).unwrap(), b.text);
            let (p, unknown) = Profile::from_text(b.text, &b.origin()).unwrap();
            assert_eq!(p.name, b.name, "{}", b.file);
            assert!(unknown.is_empty(), "{}: {unknown:?}", b.file);
        }
        let nv = builtin("nvidia");
        assert_eq!(nv.visible_devices_env, ["NVIDIA_VISIBLE_DEVICES"]);
        assert!(matches!(nv.discovery, Discovery::NvidiaProcfs { .. }));
        assert!(nv.capabilities["compute"]
            .libraries
            .contains(&"libcuda".to_string()));
        let ef = builtin("enflame");
        assert_eq!(ef.control_nodes, [PathBuf::from("/dev/gcuctl")]);
    }

    #[test]
    fn every_shipped_profile_file_parses_with_no_unknown_keys() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let origin = path.display().to_string();
            let (p, unknown) =
                Profile::from_table(toml::from_str(&text).unwrap(), &origin).unwrap();
            assert!(unknown.is_empty(), "{origin}: {unknown:?}");
            assert_eq!(
                path.file_stem().unwrap().to_str(),
                Some(p.name.as_str()),
                "{origin}"
            );
            names.push(p.name);
        }
        names.sort();
        assert_eq!(
            names,
            [
                "amd",
                "ascend",
                "cambricon",
                "enflame",
                "habana",
                "hygon",
                "intel",
                "intel-xe",
                "metax",
                "mthreads",
                "nvidia"
            ]
        );
    }

    #[test]
    fn relative_driver_root_is_refused() {
        let mut t: toml::Table = toml::from_str(BUILTIN[1].text).unwrap();
        t.insert("driver-root".into(), "run/driver".into());
        let err = Profile::from_table(t, "x").unwrap_err().to_string();
        assert!(err.contains("driver-root"), "{err}");
    }

    #[test]
    fn dotdot_node_is_refused() {
        let mut t: toml::Table = toml::from_str(BUILTIN[1].text).unwrap();
        t.insert(
            "control-nodes".into(),
            toml::Value::Array(vec!["/dev/../etc/shadow".into()]),
        );
        let err = Profile::from_table(t, "x").unwrap_err().to_string();
        assert!(err.contains(".."), "{err}");
    }

    #[test]
    fn known_keys_are_accepted() {
        let keys = known_keys();
        assert!(keys.contains(&"driver-root") && keys.contains(&"libraries"));
        // Each discovery key is one its method parses without an unknown-key report.
        for (method, key, value) in [
            ("nvidia-procfs", "proc-dir", "\"/proc/driver/nvidia/gpus\""),
            ("nvidia-procfs", "node-template", "\"/dev/nvidia{minor}\""),
            ("device-nodes", "node-templates", "[\"/dev/x{index}\"]"),
            ("device-nodes", "aliases", "[]"),
            ("device-nodes", "index-ranges", "true"),
        ] {
            assert!(keys.contains(&key), "{key}");
            let base = match method {
                "nvidia-procfs" => "proc-dir = \"/p\"\nnode-template = \"/dev/n{minor}\"\n",
                _ => "node-templates = [\"/dev/x{index}\"]\n",
            };
            let text = format!(
                "name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"{method}\"\n{}{key} = {value}\n",
                base.lines().filter(|l| !l.starts_with(key)).map(|l| format!("{l}\n")).collect::<String>()
            );
            let (_, unknown) = Profile::from_table(toml::from_str(&text).unwrap(), "t").unwrap();
            assert!(unknown.is_empty(), "{key}: {unknown:?}");
        }
    }

    #[test]
    fn drm_discovery_is_checked() {
        let parse = |discovery: &str| {
            let text = format!(
                "name = \"x\"\nvisible-devices-env = [\"X\"]\n[discovery]\nmethod = \"drm\"\n{discovery}"
            );
            Profile::from_table(toml::from_str(&text).unwrap(), "t").map_err(|e| e.to_string())
        };
        let (p, unknown) = parse(
            "pci-vendors = [\"0x1002\"]\ndrivers = [\"amdgpu\"]\norder = \"kfd\"\nkfd-topology = \"/sys/class/kfd/kfd/topology/nodes\"\nindex-ranges = true\n",
        )
        .unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert!(p.discovery.index_ranges());
        assert_eq!(p.discovery.node_template(), Some("/dev/dri/renderD{index}"));
        for (bad, says) in [
            ("pci-vendors = []\n", "pci-vendors is empty"),
            ("pci-vendors = [\"1002\"]\n", "0x and four hex digits"),
            ("pci-vendors = [\"0x10020\"]\n", "0x and four hex digits"),
            (
                "pci-vendors = [\"0x1002\"]\ndrivers = [\"../amdgpu\"]\n",
                "plain name",
            ),
            (
                "pci-vendors = [\"0x1002\"]\nkfd-topology = \"sys/kfd\"\n",
                "absolute",
            ),
            (
                "pci-vendors = [\"0x1002\"]\norder = \"probe\"\n",
                "unknown variant",
            ),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_keys_are_reported() {
        let mut t: toml::Table = toml::from_str(BUILTIN[1].text).unwrap();
        t.insert("driver-rot".into(), "/x".into());
        let (_, unknown) = Profile::from_table(t, "x").unwrap();
        assert_eq!(unknown, ["driver-rot"]);
    }

    #[test]
    fn merge_overrides_nested_keys_only() {
        let base = "a = 1\nl = [1, 2]\n[t]\nx = 1\ny = 2\n[[p]]\nn = 1\n";
        let over = "l = [3]\nt.y = 3\nt.z = { u = 1 }\n[[p]]\nm = 2\n";
        let merged = merge_documents(
            parse_document(base, "b").unwrap(),
            parse_document(over, "o").unwrap(),
        );
        let got = toml::Table::deserialize(toml::de::Deserializer::from(merged)).unwrap();
        let want: toml::Table =
            toml::from_str("a = 1\nl = [3]\n[t]\nx = 1\ny = 3\nz = { u = 1 }\n[[p]]\nm = 2\n")
                .unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn unknown_key_inside_discovery_is_reported() {
        let mut t: toml::Table = toml::from_str(BUILTIN[1].text).unwrap();
        t["discovery"]
            .as_table_mut()
            .unwrap()
            .insert("node-tempaltes".into(), "x".into());
        match Profile::from_table(t, "x") {
            Ok((_, unknown)) => assert_eq!(unknown, ["discovery.node-tempaltes"]),
            Err(e) => assert!(e.to_string().contains("node-tempaltes"), "{e}"),
        }
    }
}
