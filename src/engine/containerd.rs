//! containerd's `/etc/containerd/config.toml`: a CRI runtime of type `io.containerd.runc.v2`
//! whose shim execs our binary (`options.BinaryName`) instead of runc.
//!
//! Edited with `toml_edit`, so the operator's comments, quoting and layout survive and the new
//! tables appear right after the file's other runtimes. The new runtime starts as a copy of
//! the `runc` runtime (its `options` too: `SystemdCgroup = true` must stay the same, or the
//! shim and kubelet disagree on the cgroup driver).
//!
//! Schemas, from the file's `version` key:
//! - 3 (containerd 2.x): `plugins."io.containerd.cri.v1.runtime".containerd`
//! - 2 (containerd 1.x): `plugins."io.containerd.grpc.v1.cri".containerd`
//! - no `version` key: schema 1, `plugins.cri.containerd`. containerd 1.x still reads it
//!   (older distribution and hand-written files), so it is edited in its own schema: same
//!   tables under another prefix; refusing would leave those nodes without a way to register,
//!   and rewriting to version 2 would touch every line of the operator's file. (containerd 2.x
//!   documents automatic conversion for version 2 only; a version-1 file there is a problem
//!   the node already has.) A file without `version` and without any `plugins` has no schema
//!   yet: it gets the installed containerd's (`version = 2` for 1.x or when none is
//!   installed, `3` for 2.x), as does a file written from nothing.
//!
//! Ref: <https://github.com/containerd/containerd/blob/main/docs/cri/config.md>

use toml_edit::{DocumentMut, Item, Table, Value};

use super::{EditError, Host, Registered, Registration};

pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";

const RUNC_V2: &str = "io.containerd.runc.v2";

/// The config schema of a file, which fixes where the CRI runtimes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schema {
    V1,
    V2,
    V3,
}

impl Schema {
    /// Key path of the table holding `runtimes` and `default_runtime_name`.
    fn cri_path(self) -> [&'static str; 3] {
        match self {
            Schema::V1 => ["plugins", "cri", "containerd"],
            Schema::V2 => ["plugins", "io.containerd.grpc.v1.cri", "containerd"],
            Schema::V3 => ["plugins", "io.containerd.cri.v1.runtime", "containerd"],
        }
    }

    /// The schema a new file gets for a containerd of major version `major`.
    pub fn for_major(major: Option<u32>) -> Schema {
        match major {
            Some(m) if m >= 2 => Schema::V3,
            _ => Schema::V2,
        }
    }
}

/// The major version of the `containerd` on PATH (`containerd --version`), if any.
pub fn installed_major() -> Option<u32> {
    let out = std::process::Command::new("containerd")
        .arg("--version")
        .output()
        .ok()?;
    parse_version_major(&String::from_utf8_lossy(&out.stdout))
}

/// `containerd github.com/containerd/containerd 1.6.20~ds1 ...` → 1;
/// `containerd github.com/containerd/containerd/v2 v2.0.0 ...` → 2.
pub fn parse_version_major(line: &str) -> Option<u32> {
    line.split_whitespace().skip(1).find_map(|tok| {
        let tok = tok.strip_prefix('v').unwrap_or(tok);
        let (major, rest) = tok.split_once('.')?;
        rest.starts_with(|c: char| c.is_ascii_digit())
            .then(|| major.parse().ok())
            .flatten()
    })
}

fn parse(text: &str) -> Result<DocumentMut, EditError> {
    text.parse::<DocumentMut>().map_err(EditError::Toml)
}

/// The schema `doc` is written in; `None` for a file that has not chosen one yet.
fn schema_of(doc: &DocumentMut) -> Result<Option<Schema>, EditError> {
    match doc.get("version") {
        None if doc.contains_key("plugins") => Ok(Some(Schema::V1)),
        None => Ok(None),
        Some(v) => match v.as_integer() {
            Some(1) => Ok(Some(Schema::V1)),
            Some(2) => Ok(Some(Schema::V2)),
            Some(3) => Ok(Some(Schema::V3)),
            _ => Err(EditError::Layout(format!(
                "version = {}: this tool knows config versions 1, 2 and 3",
                v.to_string().trim()
            ))),
        },
    }
}

fn dotted(path: &[&str]) -> String {
    path.iter()
        .map(|k| {
            if k.contains('.') {
                format!("\"{k}\"")
            } else {
                (*k).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The table at `path`, or `None` where the path stops; an entry on the way that is not a
/// `[table]` (an inline table, a value) is an error, since no header can be added under it.
fn table_at<'d>(root: &'d Table, path: &[&str]) -> Result<Option<&'d Table>, EditError> {
    let mut t = root;
    for (i, key) in path.iter().enumerate() {
        match t.get(key) {
            None => return Ok(None),
            Some(Item::Table(next)) => t = next,
            Some(_) => return Err(not_a_table(&path[..=i])),
        }
    }
    Ok(Some(t))
}

fn table_at_mut<'d>(
    root: &'d mut Table,
    path: &[&str],
    create: bool,
) -> Result<Option<&'d mut Table>, EditError> {
    let mut t = root;
    for (i, key) in path.iter().enumerate() {
        if !t.contains_key(key) {
            if !create {
                return Ok(None);
            }
            let mut new = Table::new();
            new.set_implicit(true);
            t.insert(key, Item::Table(new));
        }
        match t.get_mut(key) {
            Some(Item::Table(next)) => t = next,
            _ => return Err(not_a_table(&path[..=i])),
        }
    }
    Ok(Some(t))
}

fn not_a_table(path: &[&str]) -> EditError {
    EditError::Layout(format!(
        "`{}` is not a [table] (an inline table or a value); write it as a table header to let this tool add a runtime",
        dotted(path)
    ))
}

/// Replaces the value of `key` in `t`, keeping the comment and spacing around the old one.
fn set_value(t: &mut Table, key: &str, new: impl Into<Value>) {
    let mut new: Value = new.into();
    match t.get_mut(key) {
        Some(item @ Item::Value(_)) => {
            if let Item::Value(old) = &*item {
                if old.as_str().is_some() && old.as_str() == new.as_str() {
                    return;
                }
                *new.decor_mut() = old.decor().clone();
            }
            // Assigning through the entry keeps the key's own indentation.
            *item = Item::Value(new);
        }
        _ => {
            let (_, indent) = indents(t);
            t.insert(key, Item::Value(new));
            if let Some(mut k) = t.key_mut(key) {
                k.leaf_decor_mut().set_prefix(indent);
            }
        }
    }
}

/// A copy of `from`'s values (not its sub-tables), without their comments and spacing.
fn copy_values(from: &Table, into: &mut Table) {
    for (k, item) in from.iter() {
        if let Item::Value(v) = item {
            let mut v = v.clone();
            v.decor_mut().clear();
            into.insert(k, Item::Value(v));
        }
    }
}

/// Indentation of `t`'s header and of its first key: a new sibling table is laid out the same.
fn indents(t: &Table) -> (String, String) {
    let last_line_ws = |raw: Option<&toml_edit::RawString>| {
        let s = raw.and_then(|r| r.as_str()).unwrap_or("");
        let last = s.rsplit('\n').next().unwrap_or("");
        if last.chars().all(|c| c == ' ' || c == '\t') {
            last.to_owned()
        } else {
            String::new()
        }
    };
    let header = last_line_ws(t.decor().prefix());
    let key = t
        .iter()
        .find(|(_, item)| item.is_value())
        .and_then(|(k, _)| t.key(k))
        .map(|k| last_line_ws(k.leaf_decor().prefix()))
        .unwrap_or_default();
    (header, key)
}

/// A new table laid out like `like` (header and key indentation), holding `like`'s values
/// (not its sub-tables) without their comments.
fn table_like(like: Option<&Table>) -> (Table, String) {
    let mut t = Table::new();
    let Some(like) = like else {
        return (t, String::new());
    };
    copy_values(like, &mut t);
    let (header, key) = indents(like);
    t.decor_mut().set_prefix(format!("\n{header}"));
    (t, key)
}

fn indent_keys(t: &mut Table, indent: &str) {
    let keys: Vec<String> = t
        .iter()
        .filter(|(_, item)| item.is_value())
        .map(|(k, _)| k.to_owned())
        .collect();
    for k in keys {
        if let Some(mut key) = t.key_mut(&k) {
            key.leaf_decor_mut().set_prefix(indent);
        }
    }
}

/// `current` (None: no file) with the runtime registered.
pub fn configure(
    current: Option<&str>,
    reg: &Registration,
    host: &Host,
) -> Result<String, EditError> {
    let fresh;
    let text = match current {
        Some(t) => t,
        None => {
            fresh = format!(
                "# Written by `accel-ctk runtime configure`; containerd's defaults apply to everything not set here.\nversion = {}\n",
                match Schema::for_major(host.containerd_major) {
                    Schema::V3 => 3,
                    _ => 2,
                }
            );
            &fresh
        }
    };
    let mut doc = parse(text)?;
    let schema = match schema_of(&doc)? {
        Some(s) => s,
        None => {
            let s = Schema::for_major(host.containerd_major);
            doc.insert(
                "version",
                toml_edit::value(if s == Schema::V3 { 3 } else { 2 }),
            );
            s
        }
    };
    let cri = schema.cri_path();
    let root = doc.as_table_mut();
    let runtimes_path = [cri[0], cri[1], cri[2], "runtimes"];
    let runc = table_at(root, &[cri[0], cri[1], cri[2], "runtimes", "runc"])?.cloned();
    let default_name = table_at(root, &cri)?
        .and_then(|t| t.get("default_runtime_name"))
        .and_then(Item::as_str)
        .unwrap_or("runc")
        .to_owned();
    let runtimes =
        table_at_mut(root, &runtimes_path, true)?.ok_or_else(|| not_a_table(&runtimes_path))?;

    // containerd replaces (does not merge) its built-in runtimes with a file's `runtimes`
    // table: a file that had none would lose `runc` once ours is added, and the CRI plugin
    // does not start while `default_runtime_name` ("runc" unless set) names a missing one.
    // Only that case is ours to mend; a file that already lists runtimes is left as it is.
    if runtimes.is_empty() && default_name == "runc" && reg.name != "runc" {
        let mut plain = Table::new();
        plain.insert("runtime_type", toml_edit::value(RUNC_V2));
        runtimes.insert("runc", Item::Table(plain));
    }
    match runtimes.get_mut(&reg.name) {
        Some(Item::Table(rt)) => {
            // Already there: correct what we own, leave the rest as the operator made it.
            set_value(rt, "runtime_type", RUNC_V2);
            let opts = table_at_mut(rt, &["options"], true)?
                .ok_or_else(|| not_a_table(&[&reg.name, "options"]))?;
            if opts.is_implicit() {
                opts.set_implicit(false);
            }
            set_value(opts, "BinaryName", reg.path.as_str());
        }
        Some(_) => {
            let mut p = runtimes_path.to_vec();
            p.push(&reg.name);
            return Err(not_a_table(&p));
        }
        None => {
            let (mut rt, rt_indent) = table_like(runc.as_ref());
            let runc_opts = runc.as_ref().and_then(|r| r.get("options")?.as_table());
            let (mut opts, opts_indent) = table_like(runc_opts);
            rt.insert("runtime_type", toml_edit::value(RUNC_V2));
            opts.insert("BinaryName", toml_edit::value(reg.path.as_str()));
            indent_keys(&mut rt, &rt_indent);
            indent_keys(&mut opts, &opts_indent);
            rt.insert("options", Item::Table(opts));
            runtimes.insert(&reg.name, Item::Table(rt));
        }
    }
    if reg.set_as_default {
        let t = table_at_mut(root, &cri, true)?.ok_or_else(|| not_a_table(&cri))?;
        set_value(t, "default_runtime_name", reg.name.as_str());
    }
    let out = doc.to_string();
    // toml_edit prints an unchanged document as it read it; still, hand back the very input.
    Ok(if current == Some(out.as_str()) {
        text.to_owned()
    } else {
        out
    })
}

/// `current` without the runtime `name`; a `default_runtime_name` naming it becomes
/// `previous_default` or goes away.
pub fn unconfigure(
    current: &str,
    name: &str,
    previous_default: Option<&str>,
) -> Result<String, EditError> {
    let mut doc = parse(current)?;
    let Some(schema) = schema_of(&doc)? else {
        return Ok(current.to_owned());
    };
    let cri = schema.cri_path();
    let root = doc.as_table_mut();
    if let Some(runtimes) = table_at_mut(root, &[cri[0], cri[1], cri[2], "runtimes"], false)? {
        runtimes.remove(name);
    }
    if let Some(t) = table_at_mut(root, &cri, false)? {
        if t.get("default_runtime_name").and_then(Item::as_str) == Some(name) {
            match previous_default {
                Some(prev) => set_value(t, "default_runtime_name", prev),
                None => {
                    t.remove("default_runtime_name");
                }
            }
        }
    }
    Ok(doc.to_string())
}

pub fn registered(current: &str, name: &str) -> Result<Registered, EditError> {
    let doc = parse(current)?;
    let Some(schema) = schema_of(&doc)? else {
        return Ok(Registered::default());
    };
    let cri = schema.cri_path();
    let path = table_at(doc.as_table(), &[cri[0], cri[1], cri[2], "runtimes", name])?
        .and_then(|rt| rt.get("options"))
        .and_then(|o| o.get("BinaryName"))
        .and_then(Item::as_str)
        .map(str::to_owned);
    let is_default = default_of(&doc, schema)?.as_deref() == Some(name);
    Ok(Registered { path, is_default })
}

fn default_of(doc: &DocumentMut, schema: Schema) -> Result<Option<String>, EditError> {
    Ok(table_at(doc.as_table(), &schema.cri_path())?
        .and_then(|t| t.get("default_runtime_name"))
        .and_then(Item::as_str)
        .map(str::to_owned))
}

pub fn default_runtime(current: &str) -> Result<Option<String>, EditError> {
    let doc = parse(current)?;
    match schema_of(&doc)? {
        Some(schema) => default_of(&doc, schema),
        None => Ok(None),
    }
}

/// One CRI runtime as the file defines it (read-only, for `accel-ctk doctor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriRuntime {
    pub name: String,
    /// `options.BinaryName`: the binary the runc shim execs instead of `runc`.
    pub binary: Option<String>,
    /// `options.SystemdCgroup` (`None`: not set; containerd then uses cgroupfs).
    pub systemd_cgroup: Option<bool>,
}

/// The CRI runtimes of a file and where they live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriRuntimes {
    /// `None`: the file has not chosen a schema (no `version`, no `plugins`).
    pub schema: Option<Schema>,
    /// The table holding `runtimes`, as a TOML key path (`plugins."io.containerd.grpc.v1.cri".containerd`).
    pub table: String,
    /// `default_runtime_name`, or containerd's own default, `runc`.
    pub default: String,
    pub runtimes: Vec<CriRuntime>,
}

/// What `current` defines under its schema's CRI table.
pub fn cri_runtimes(current: &str, host: &Host) -> Result<CriRuntimes, EditError> {
    let doc = parse(current)?;
    let schema = schema_of(&doc)?;
    let cri = schema
        .unwrap_or(Schema::for_major(host.containerd_major))
        .cri_path();
    let table = table_at(doc.as_table(), &cri)?;
    let default = table
        .and_then(|t| t.get("default_runtime_name"))
        .and_then(Item::as_str)
        .unwrap_or("runc")
        .to_owned();
    let mut runtimes = Vec::new();
    if schema.is_some() {
        if let Some(rts) = table_at(doc.as_table(), &[cri[0], cri[1], cri[2], "runtimes"])? {
            for (name, item) in rts.iter() {
                let opts = item.as_table_like().and_then(|t| t.get("options"));
                let opt = |k: &str| opts.and_then(|o| o.as_table_like()).and_then(|o| o.get(k));
                runtimes.push(CriRuntime {
                    name: name.to_owned(),
                    binary: opt("BinaryName").and_then(Item::as_str).map(str::to_owned),
                    systemd_cgroup: opt("SystemdCgroup").and_then(Item::as_bool),
                });
            }
        }
    }
    Ok(CriRuntimes {
        schema,
        table: dotted(&cri),
        default,
        runtimes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::reg;

    const V2: &str = r#"version = 2

# the operator's runtime
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc" # keep me
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true

[metrics]
  address = "127.0.0.1:1338"
"#;

    #[test]
    fn cri_runtimes_for_doctor() {
        let out = configure(Some(V2), &reg(false), &Host::default()).unwrap();
        let c = cri_runtimes(&out, &Host::default()).unwrap();
        assert_eq!(c.schema, Some(Schema::V2));
        assert_eq!(c.table, "plugins.\"io.containerd.grpc.v1.cri\".containerd");
        assert_eq!(c.default, "runc");
        let accel = c.runtimes.iter().find(|r| r.name == "accel").unwrap();
        assert_eq!(
            accel.binary.as_deref(),
            Some("/usr/bin/accel-container-runtime")
        );
        assert_eq!(accel.systemd_cgroup, Some(true));
        let empty = cri_runtimes("", &Host::default()).unwrap();
        assert!(empty.schema.is_none() && empty.runtimes.is_empty());
    }

    #[test]
    fn version_lines() {
        assert_eq!(
            parse_version_major(
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
            ),
            Some(1)
        );
        assert_eq!(
            parse_version_major("containerd github.com/containerd/containerd/v2 v2.0.2 c507a0257"),
            Some(2)
        );
        assert_eq!(parse_version_major(""), None);
    }

    #[test]
    fn v2_copies_runc_options_and_keeps_the_rest() {
        let out = configure(Some(V2), &reg(true), &Host::default()).unwrap();
        assert!(
            out.starts_with(&V2[..V2.find("[metrics]").unwrap()].replace(
                "default_runtime_name = \"runc\" # keep me",
                "default_runtime_name = \"accel\" # keep me"
            ))
        );
        assert!(out.contains(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.accel.options]\n  SystemdCgroup = true\n  BinaryName = \"/usr/bin/accel-container-runtime\"\n"
        ));
        assert!(out.ends_with("[metrics]\n  address = \"127.0.0.1:1338\"\n"));
        assert_eq!(
            configure(Some(&out), &reg(true), &Host::default()).unwrap(),
            out
        );
        let back = unconfigure(&out, "accel", Some("runc")).unwrap();
        assert_eq!(back, V2);
    }

    #[test]
    fn missing_file_follows_installed_major() {
        let v2 = configure(None, &reg(false), &Host::default()).unwrap();
        assert!(v2.contains("version = 2\n"));
        assert!(v2.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.accel]"));
        let v3 = configure(
            None,
            &reg(false),
            &Host {
                containerd_major: Some(2),
            },
        )
        .unwrap();
        assert!(v3.contains("version = 3\n"));
        assert!(v3.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.accel]"));
    }

    #[test]
    fn schema_1_uses_plugins_cri() {
        let text = "[plugins.cri.containerd]\n  snapshotter = \"overlayfs\"\n";
        let out = configure(Some(text), &reg(false), &Host::default()).unwrap();
        assert!(out.contains("[plugins.cri.containerd.runtimes.accel.options]"));
        assert!(!out.contains("version"));
    }

    #[test]
    fn refuses_unknown_version_and_inline_tables() {
        assert!(matches!(
            configure(Some("version = 4\n"), &reg(false), &Host::default()),
            Err(EditError::Layout(_))
        ));
        let inline = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncontainerd = { snapshotter = \"overlayfs\" }\n";
        let err = configure(Some(inline), &reg(false), &Host::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("`plugins.\"io.containerd.grpc.v1.cri\".containerd` is not a [table]"),
            "{err}"
        );
        assert!(matches!(
            configure(
                Some("version = 2\n[plugins\n"),
                &reg(false),
                &Host::default()
            ),
            Err(EditError::Toml(_))
        ));
    }

    #[test]
    fn existing_entry_is_corrected_not_duplicated() {
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.accel]\n  runtime_type = \"io.containerd.runc.v2\"\n  privileged_without_host_devices = true\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.accel.options]\n  BinaryName = \"/old/path\" # old\n";
        let out = configure(Some(text), &reg(false), &Host::default()).unwrap();
        assert_eq!(
            out,
            text.replace("/old/path", "/usr/bin/accel-container-runtime")
        );
    }

    #[test]
    fn first_runtime_keeps_containerds_runc() {
        let out = configure(Some("version = 2\n"), &reg(false), &Host::default()).unwrap();
        assert!(out.contains(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\nruntime_type = \"io.containerd.runc.v2\"\n"
        ));
        // Another default named: runc is not needed, nothing is added for it.
        let other = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"crun\"\n";
        let out = configure(Some(other), &reg(false), &Host::default()).unwrap();
        assert!(!out.contains("runtimes.runc"), "{out}");
    }
}
