//! CRI-O: a drop-in file of its own under `/etc/crio/crio.conf.d/` (read after `crio.conf`,
//! in name order, so `99-` comes last) defining `[crio.runtime.runtimes.<name>]` and, when
//! asked, `[crio.runtime] default_runtime`. The operator's `crio.conf` is never edited;
//! unconfigure removes the drop-in once nothing else is in it.
//!
//! Ref: <https://github.com/cri-o/cri-o/blob/main/docs/crio.conf.5.md>

use std::path::PathBuf;

use toml_edit::{DocumentMut, Item, Table};

use super::{EditError, Registered, Registration};

const HEADER: &str =
    "# Written by `accel-ctk runtime configure`; removed by `accel-ctk runtime unconfigure`.\n";

pub const DROP_IN_DIR: &str = "/etc/crio/crio.conf.d";

/// `/etc/crio/crio.conf.d/99-<name>.conf`.
pub fn default_config(runtime_name: &str) -> PathBuf {
    PathBuf::from(DROP_IN_DIR).join(format!("99-{runtime_name}.conf"))
}

fn parse(text: &str) -> Result<DocumentMut, EditError> {
    text.parse::<DocumentMut>().map_err(EditError::Toml)
}

fn table_mut<'d>(root: &'d mut Table, path: &[&str]) -> Result<&'d mut Table, EditError> {
    let mut t = root;
    for (i, key) in path.iter().enumerate() {
        let entry = t.entry(key).or_insert_with(|| {
            let mut new = Table::new();
            new.set_implicit(true);
            Item::Table(new)
        });
        t = entry.as_table_mut().ok_or_else(|| {
            EditError::Layout(format!("`{}` is not a [table]", path[..=i].join(".")))
        })?;
    }
    Ok(t)
}

fn get<'d>(doc: &'d DocumentMut, path: &[&str]) -> Option<&'d Item> {
    path.iter()
        .try_fold(doc.as_item(), |item, key| item.as_table_like()?.get(key))
}

/// `current` (None: no drop-in yet) with the runtime defined.
pub fn configure(current: Option<&str>, reg: &Registration) -> Result<String, EditError> {
    let mut doc = parse(current.unwrap_or(""))?;
    let rt = table_mut(
        doc.as_table_mut(),
        &["crio", "runtime", "runtimes", &reg.name],
    )?;
    rt.set_implicit(false);
    for (key, value) in [
        ("runtime_path", reg.path.clone()),
        ("runtime_type", "oci".to_owned()),
        // Our shim passes `--root` through to runc; a root of its own keeps its containers'
        // state apart from those of the plain runc runtime.
        ("runtime_root", format!("/run/{}", reg.name)),
    ] {
        if rt.get(key).and_then(Item::as_str) != Some(value.as_str()) {
            rt.insert(key, toml_edit::value(value));
        }
    }
    if reg.set_as_default {
        let t = table_mut(doc.as_table_mut(), &["crio", "runtime"])?;
        if t.get("default_runtime").and_then(Item::as_str) != Some(reg.name.as_str()) {
            t.insert("default_runtime", toml_edit::value(reg.name.as_str()));
        }
    }
    Ok(match current {
        Some(_) => doc.to_string(),
        // Put ahead of the first table here: on its own, toml_edit would keep a comment-only
        // document's comment as trailing text, after the tables added to it.
        None => format!("{HEADER}{doc}"),
    })
}

/// `current` without the runtime `name` and without a default naming it (or with
/// `previous_default` instead).
pub fn unconfigure(
    current: &str,
    name: &str,
    previous_default: Option<&str>,
) -> Result<String, EditError> {
    let mut doc = parse(current)?;
    if let Some(Item::Table(runtimes)) = doc
        .get_mut("crio")
        .and_then(|c| c.get_mut("runtime"))
        .and_then(|r| r.get_mut("runtimes"))
    {
        runtimes.remove(name);
    }
    if let Some(Item::Table(rt)) = doc.get_mut("crio").and_then(|c| c.get_mut("runtime")) {
        if rt.get("default_runtime").and_then(Item::as_str) == Some(name) {
            match previous_default {
                Some(p) => {
                    rt.insert("default_runtime", toml_edit::value(p));
                }
                None => {
                    rt.remove("default_runtime");
                }
            }
        }
        // A header left with nothing under it would survive as an empty `[crio.runtime]`.
        if rt.iter().all(|(_, item)| item.is_table()) {
            rt.set_implicit(true);
        }
    }
    Ok(doc.to_string())
}

/// Whether the drop-in defines nothing at all any more (comments don't count).
pub fn is_empty(text: &str) -> bool {
    fn empty(t: &Table) -> bool {
        t.iter().all(|(_, item)| match item {
            Item::Table(sub) => empty(sub),
            Item::None => true,
            _ => false,
        })
    }
    parse(text).map(|d| empty(d.as_table())).unwrap_or(false)
}

pub fn registered(current: &str, name: &str) -> Result<Registered, EditError> {
    let doc = parse(current)?;
    let path = get(&doc, &["crio", "runtime", "runtimes", name, "runtime_path"])
        .and_then(Item::as_str)
        .map(str::to_owned);
    let is_default =
        get(&doc, &["crio", "runtime", "default_runtime"]).and_then(Item::as_str) == Some(name);
    Ok(Registered { path, is_default })
}

pub fn default_runtime(current: &str) -> Result<Option<String>, EditError> {
    let doc = parse(current)?;
    Ok(get(&doc, &["crio", "runtime", "default_runtime"])
        .and_then(Item::as_str)
        .map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::reg;

    #[test]
    fn drop_in_from_nothing() {
        let out = configure(None, &reg(true)).unwrap();
        assert_eq!(
            out,
            "# Written by `accel-ctk runtime configure`; removed by `accel-ctk runtime unconfigure`.\n\
             [crio.runtime]\ndefault_runtime = \"accel\"\n\n\
             [crio.runtime.runtimes.accel]\nruntime_path = \"/usr/bin/accel-container-runtime\"\nruntime_type = \"oci\"\nruntime_root = \"/run/accel\"\n"
        );
        let parsed: toml::Table = toml::from_str(&out).unwrap();
        assert_eq!(
            parsed["crio"]["runtime"]["runtimes"]["accel"]["runtime_path"].as_str(),
            Some("/usr/bin/accel-container-runtime")
        );
        assert_eq!(configure(Some(&out), &reg(true)).unwrap(), out);
        assert!(is_empty(&unconfigure(&out, "accel", None).unwrap()));
        assert_eq!(default_runtime(&out).unwrap().as_deref(), Some("accel"));
    }

    #[test]
    fn other_runtimes_in_the_drop_in_stay() {
        let text = "[crio.runtime.runtimes.crun]\nruntime_path = \"/usr/bin/crun\"\n";
        let out = configure(Some(text), &reg(false)).unwrap();
        assert!(registered(&out, "accel").unwrap().path.is_some());
        let back = unconfigure(&out, "accel", None).unwrap();
        assert_eq!(back, text);
        assert!(!is_empty(&back));
    }
}
