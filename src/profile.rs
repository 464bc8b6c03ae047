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

// Shared with src/build.rs, which includes the file (a build script cannot use the crate).
mod quoted;
pub use quoted::{is_name_byte, quoted_names};

/// A profile compiled into the binary (the list, `BUILTIN`, is made by src/build.rs from
/// `config/profiles/`): its TOML text and, prepared from that text at build time, the same
/// table as static [`Data`] and the names the text quotes. Reading the data instead of parsing
/// the text is most of what makes `create` cheap; tests check both against the text.
#[derive(Debug)]
pub struct Builtin {
    /// File name under `config/profiles/`.
    pub file: &'static str,
    /// The profile's `name`.
    pub name: &'static str,
    pub text: &'static str,
    /// `text`'s table (keys sorted, comments gone): what is read at run time.
    pub data: &'static [(&'static str, Data)],
    /// [`quoted_names`] of `text`, sorted, without duplicates.
    pub quoted: &'static [&'static str],
}

include!(concat!(env!("OUT_DIR"), "/builtin_profiles.rs"));

impl Builtin {
    /// How errors and warnings name this profile.
    pub fn origin(&self) -> String {
        format!("built-in {}", self.file)
    }

    /// The profile's table: what `toml::from_str(self.text)` gives.
    pub fn table(&self) -> toml::Table {
        self.data
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_toml()))
            .collect()
    }

    /// What [`Profile::from_table`] gives for [`Builtin::table`], without building the table
    /// (all a create pays for a built-in that config.toml does not override).
    pub fn profile(&self) -> Result<(Profile, Vec<String>), ProfileError> {
        let origin = self.origin();
        let profile = self.deserialize(&origin)?;
        profile.validate(&origin)?;
        Ok((profile, Vec::new()))
    }

    /// What [`Profile::from_table`] gives for [`Builtin::table`] with `over` merged in
    /// ([`merge_tables`]), naming the result `origin`. A profile's fields are independent, so
    /// only those `over` sets (and those every profile needs) are deserialized from the merged
    /// table; the others are the built-in's own. Same profile, unknown keys and errors, for a
    /// fraction of the cost.
    pub fn profile_with(
        &self,
        over: toml::Table,
        origin: &str,
    ) -> Result<(Profile, Vec<String>), ProfileError> {
        /// Keys without a default: deserializing fails without them.
        const REQUIRED: [&str; 3] = ["name", "visible-devices-env", "discovery"];
        let mut table: toml::Table = self
            .data
            .iter()
            .filter(|(k, _)| over.contains_key(*k) || REQUIRED.contains(k))
            .map(|(k, v)| (k.to_string(), v.to_toml()))
            .collect();
        merge_tables(&mut table, over);
        let keys: Vec<String> = table.keys().cloned().collect();
        let (set, unknown) = Profile::deserialize_table(table, origin)?;
        let mut profile = self.deserialize(origin)?;
        profile.overlay(set, |k| keys.iter().any(|s| s == k));
        profile.validate(origin)?;
        Ok((profile, unknown))
    }

    /// The built-in's own profile, not validated. Unknown keys are not looked for: a
    /// built-in has none (test `prepared_builtins_equal_their_text`).
    fn deserialize(&self, origin: &str) -> Result<Profile, ProfileError> {
        Profile::deserialize(Data::Table(self.data)).map_err(|e| ProfileError::Invalid {
            origin: origin.to_string(),
            msg: e.to_string(),
        })
    }

    /// Whether the text holds `name` as a TOML string ([`quoted_in`]).
    pub fn quotes(&self, name: &str) -> bool {
        if name.bytes().all(is_name_byte) {
            self.quoted.binary_search(&name).is_ok()
        } else {
            quoted_in(self.text, name)
        }
    }
}

/// A TOML value as static data, for the built-in profiles (floats and dates: none there).
/// It is a serde [`Deserializer`](serde::Deserializer): borrowed strings, exact lengths, no
/// parsing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Data {
    Bool(bool),
    Integer(i64),
    String(&'static str),
    Array(&'static [Data]),
    Table(&'static [(&'static str, Data)]),
}

impl Data {
    pub fn to_toml(&self) -> toml::Value {
        match *self {
            Data::Bool(b) => toml::Value::Boolean(b),
            Data::Integer(i) => toml::Value::Integer(i),
            Data::String(s) => toml::Value::String(s.to_string()),
            Data::Array(a) => toml::Value::Array(a.iter().map(Data::to_toml).collect()),
            Data::Table(t) => toml::Value::Table(
                t.iter()
                    .map(|(k, v)| (k.to_string(), v.to_toml()))
                    .collect(),
            ),
        }
    }
}

impl<'de> serde::Deserializer<'de> for Data {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        use serde::de::value::{MapDeserializer, SeqDeserializer};
        match self {
            Data::Bool(b) => visitor.visit_bool(b),
            Data::Integer(i) => visitor.visit_i64(i),
            Data::String(s) => visitor.visit_borrowed_str(s),
            Data::Array(a) => {
                let mut seq = SeqDeserializer::new(a.iter().copied());
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Data::Table(t) => {
                let mut map = MapDeserializer::new(t.iter().copied());
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    /// Present means `Some`, as in TOML.
    fn deserialize_option<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_some(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

impl<'de> serde::de::IntoDeserializer<'de> for Data {
    type Deserializer = Data;

    fn into_deserializer(self) -> Data {
        self
    }
}

/// Whether `text` holds `name` between two equal quotes: a TOML string `"name"` or `'name'`
/// (or text that looks like one, in a comment: a false alarm costs only time).
pub fn quoted_in(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        matches!(
            (before, after),
            (Some('"'), Some('"')) | (Some('\''), Some('\''))
        )
    })
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
    /// Image requirements on the driver (`NVIDIA_REQUIRE_*`, src/require.rs).
    #[serde(default)]
    pub requirements: Option<Requirements>,
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
    keys.extend([
        "method",
        "proc-dir",
        "node-template",
        "node-templates",
        "aliases",
        "index-ranges",
    ]);
    keys
}

fn root() -> PathBuf {
    PathBuf::from("/")
}

impl Profile {
    /// Parses a profile table, returning it with the keys it did not know (dotted paths).
    pub fn from_table(
        table: toml::Table,
        origin: &str,
    ) -> Result<(Profile, Vec<String>), ProfileError> {
        let (profile, unknown) = Self::deserialize_table(table, origin)?;
        profile.validate(origin)?;
        Ok((profile, unknown))
    }

    /// [`Profile::from_table`] before validation.
    fn deserialize_table(
        table: toml::Table,
        origin: &str,
    ) -> Result<(Profile, Vec<String>), ProfileError> {
        let mut unknown = Vec::new();
        let value = toml::Value::Table(table);
        let profile: Profile =
            serde_ignored::deserialize(value, |path| unknown.push(path.to_string())).map_err(
                |source| ProfileError::Parse {
                    origin: origin.to_string(),
                    source,
                },
            )?;
        Ok((profile, unknown))
    }

    /// Moves into `self` each field of `from` whose key (as a profile table spells it) is
    /// `set`. Must name every field (test `overlay_moves_every_field`).
    fn overlay(&mut self, from: Profile, set: impl Fn(&str) -> bool) {
        macro_rules! overlay {
            ($($key:literal => $field:ident,)*) => {
                $(if set($key) { self.$field = from.$field; })*
            };
        }
        overlay! {
            "name" => name,
            "description" => description,
            "visible-devices-env" => visible_devices_env,
            "driver-root" => driver_root,
            "dev-root" => dev_root,
            "none-injects-driver" => none_injects_driver,
            "cdi-kind" => cdi_kind,
            "cdi-extra-kinds" => cdi_extra_kinds,
            "device-majors" => device_majors,
            "resource-name" => resource_name,
            "device-plugin-id" => device_plugin_id,
            "container-devices-mount-dir" => container_devices_mount_dir,
            "version-file" => version_file,
            "discovery" => discovery,
            "control-nodes" => control_nodes,
            "library-search-dirs" => library_search_dirs,
            "binary-search-dirs" => binary_search_dirs,
            "capabilities-env" => capabilities_env,
            "default-capabilities" => default_capabilities,
            "capabilities" => capabilities,
            "dev-links" => dev_links,
            "compat" => compat,
            "requirements" => requirements,
        }
    }

    /// Where the device nodes live on the host.
    pub fn dev_root(&self) -> &Path {
        self.dev_root.as_deref().unwrap_or(&self.driver_root)
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

/// True when a path has a `..` component: profile paths are joined under host roots.
pub fn has_dotdot(p: &Path) -> bool {
    // What `components()` calls ParentDir, without building the components (every path of
    // every profile is checked on each create).
    p.as_os_str()
        .as_bytes()
        .split(|&b| b == b'/')
        .any(|c| c == b"..")
}

/// Merges `over` into `base`: tables recursively, everything else replaced.
pub fn merge_tables(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builtin(name: &str) -> Profile {
        let text = BUILTIN.iter().find(|b| b.name == name).unwrap().text;
        let (p, unknown) = Profile::from_table(toml::from_str(text).unwrap(), name).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        p
    }

    /// What runs is the prepared form: it must be the TOML text's, so that an edit of
    /// config/profiles/*.toml can never silently diverge from it.
    #[test]
    fn prepared_builtins_equal_their_text() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/profiles");
        let names: Vec<&str> = BUILTIN.iter().map(|b| b.name).collect();
        assert_eq!(names, ["nvidia", "enflame"]);
        for b in BUILTIN {
            assert_eq!(std::fs::read_to_string(dir.join(b.file)).unwrap(), b.text);
            let table: toml::Table = toml::from_str(b.text).unwrap();
            assert_eq!(b.table(), table, "{}", b.file);
            assert_eq!(table["name"].as_str(), Some(b.name));
            let parsed = Profile::from_table(table, &b.origin()).unwrap();
            assert_eq!(b.profile().unwrap(), parsed, "{}", b.file);
            let mut quoted: Vec<&str> = quoted_names(b.text).collect();
            quoted.sort_unstable();
            quoted.dedup();
            assert_eq!(b.quoted, quoted, "{}", b.file);
        }
    }

    /// An override of a built-in gives what merging it into the whole table gives: profile,
    /// unknown keys, or error.
    #[test]
    fn profile_with_equals_merging_the_table() {
        let overrides = [
            "",
            "driver-root = \"/run/nvidia/driver\"",
            "driver-rot = \"/x\"\ndev-root = \"/dev-root\"",
            "name = \"other\"\nvisible-devices-env = [\"OTHER\"]",
            "[discovery]\nproc-dir = \"/sim/gpus\"",
            "[discovery]\nmethod = \"device-nodes\"\nnode-templates = [\"/dev/x{index}\"]",
            "[discovery]\nproc-dri = \"/x\"",
            "[capabilities.compute]\nlibraries = [\"libcuda\"]\nlibrarys = []",
            "[capabilities.mine]\nincludes = [\"compute\"]",
            "default-capabilities = [\"nothing\"]",
            "driver-root = 5",
            "capabilities = 5",
            "[discovery]\nproc-dir = [1]",
            "control-nodes = [\"/dev/../etc/shadow\"]",
            "driver-root = \"relative\"",
        ];
        for b in BUILTIN {
            for text in overrides {
                let over: toml::Table = toml::from_str(text).unwrap();
                let show = |r: Result<(Profile, Vec<String>), ProfileError>| match r {
                    Ok(built) => format!("{built:?}"),
                    Err(e) => format!("error: {e}"),
                };
                let mut table = b.table();
                merge_tables(&mut table, over.clone());
                assert_eq!(
                    show(b.profile_with(over, "o")),
                    show(Profile::from_table(table, "o")),
                    "{}: {text}",
                    b.file
                );
            }
        }
    }

    /// [`Profile::overlay`] moves each field by its key, and every field has one.
    #[test]
    fn overlay_moves_every_field() {
        let base = BUILTIN[0].profile().unwrap().0;
        let text = r#"
            name = "x"
            description = "x"
            visible-devices-env = ["X"]
            driver-root = "/x"
            dev-root = "/x"
            none-injects-driver = false
            cdi-kind = "x.com/x"
            cdi-extra-kinds = ["x.com/y"]
            device-majors = [1]
            resource-name = "x.com/x"
            device-plugin-id = "{index}"
            container-devices-mount-dir = "/x"
            version-file = "/x"
            control-nodes = ["/dev/x"]
            library-search-dirs = ["/x"]
            binary-search-dirs = ["/x"]
            capabilities-env = "X"
            default-capabilities = ["x"]
            dev-links = { "libx.so" = "libx.so.1" }
            [discovery]
            method = "device-nodes"
            node-templates = ["/dev/x{index}"]
            [capabilities.x]
            [compat]
            dir = "/x"
            version-library = "libx"
            libraries = ["libx"]
            [requirements]
            env-prefix = "X_REQUIRE_"
        "#;
        let other = Profile::from_table(toml::from_str(text).unwrap(), "x")
            .unwrap()
            .0;
        // Every field, `None` ones included.
        let keys: Vec<String> = match serde_json::to_value(&other).unwrap() {
            serde_json::Value::Object(m) => m.keys().cloned().collect(),
            v => panic!("{v}"),
        };
        for key in &keys {
            let mut p = base.clone();
            p.overlay(other.clone(), |k| k == key);
            assert_ne!(p, base, "{key} not moved");
        }
        let mut p = base.clone();
        p.overlay(other.clone(), |_| true);
        assert_eq!(p, other);
    }

    /// The static data reads as TOML does: options, nested tables, the tagged discovery,
    /// unknown keys, wrong types.
    #[test]
    fn data_deserializes_like_toml() {
        const DISCOVERY: Data = Data::Table(&[
            ("method", Data::String("device-nodes")),
            (
                "node-templates",
                Data::Array(&[Data::String("/dev/x{index}")]),
            ),
            ("index-ranges", Data::Bool(true)),
        ]);
        const CAPS: Data = Data::Table(&[(
            "c",
            Data::Table(&[("libraries", Data::Array(&[Data::String("libx")]))]),
        )]);
        const DATA: &[(&str, Data)] = &[
            ("capabilities", CAPS),
            ("dev-root", Data::String("/dev-root")),
            ("discovery", DISCOVERY),
            ("extra", Data::Integer(-3)),
            ("name", Data::String("x")),
            (
                "visible-devices-env",
                Data::Array(&[Data::String("X_DEVICES")]),
            ),
        ];
        let b = Builtin {
            file: "x.toml",
            name: "x",
            text: "",
            data: DATA,
            quoted: &[],
        };
        let from_toml = Profile::from_table(b.table(), &b.origin()).unwrap();
        assert_eq!(from_toml.1, ["extra"]);
        assert_eq!(from_toml.0.dev_root, Some(PathBuf::from("/dev-root")));
        // Unknown keys are looked for only in the text (a built-in has none).
        assert_eq!(b.profile().unwrap(), (from_toml.0, Vec::new()));

        const WRONG: &[(&str, Data)] = &[
            ("discovery", DISCOVERY),
            ("name", Data::Bool(true)),
            ("visible-devices-env", Data::Array(&[Data::String("X")])),
        ];
        let b = Builtin { data: WRONG, ..b };
        let err = b.profile().unwrap_err().to_string();
        assert!(err.contains("x.toml") && err.contains("boolean"), "{err}");
    }

    #[test]
    fn builtins_parse_with_no_unknown_keys() {
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
                "ascend",
                "cambricon",
                "enflame",
                "habana",
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
    fn unknown_keys_are_reported() {
        let mut t: toml::Table = toml::from_str(BUILTIN[1].text).unwrap();
        t.insert("driver-rot".into(), "/x".into());
        let (_, unknown) = Profile::from_table(t, "x").unwrap();
        assert_eq!(unknown, ["driver-rot"]);
    }

    #[test]
    fn merge_overrides_nested_keys_only() {
        let mut base: toml::Table = toml::from_str("a = 1\n[t]\nx = 1\ny = 2\n").unwrap();
        merge_tables(&mut base, toml::from_str("[t]\ny = 3\n").unwrap());
        assert_eq!(base["a"].as_integer(), Some(1));
        assert_eq!(base["t"]["x"].as_integer(), Some(1));
        assert_eq!(base["t"]["y"].as_integer(), Some(3));
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

    #[test]
    fn quoted_names_are_what_quoted_in_finds() {
        let text = "a = \"NV_X\"\nb = ['Y_1', \"Z\" ]\n# \"mixed' \"ab\"cd\" x\"\"\n";
        let names: Vec<&str> = quoted_names(text).collect();
        assert_eq!(names, ["NV_X", "Y_1", "Z", "ab", "cd"]);
        for n in &names {
            assert!(quoted_in(text, n), "{n}");
        }
        for n in ["NV", "mixed", "x", "b", "Y"] {
            assert!(!quoted_in(text, n) && !names.contains(&n), "{n}");
        }
    }
}
