//! docker's `/etc/docker/daemon.json`: `runtimes.<name>.path` and, when asked,
//! `default-runtime`.
//!
//! The file is edited as a `serde_json::Value` with `preserve_order`, so every key, every
//! other runtime and the key order survive. JSON has no comments to keep; what cannot survive
//! a re-serialisation is layout, so the output uses the file's own indent (detected from its
//! first indented line) and its final newline, and a file that needs no change is returned
//! as it was, byte for byte.
//!
//! Ref: <https://docs.docker.com/reference/cli/dockerd/#configure-container-runtimes>

use serde::Serialize;
use serde_json::{Map, Value};

use super::{EditError, Registered, Registration};

pub const DEFAULT_CONFIG: &str = "/etc/docker/daemon.json";

const RUNTIMES: &str = "runtimes";
const DEFAULT_RUNTIME: &str = "default-runtime";

/// How the operator's file is laid out, so a rewrite looks like it.
struct Layout {
    indent: String,
    final_newline: bool,
}

impl Layout {
    fn of(text: Option<&str>) -> Layout {
        let Some(text) = text else {
            return Layout {
                indent: "  ".into(),
                final_newline: true,
            };
        };
        let indent = text
            .lines()
            .skip(1)
            .map(|l| &l[..l.len() - l.trim_start_matches([' ', '\t']).len()])
            .find(|ws| !ws.is_empty())
            .unwrap_or("  ");
        Layout {
            indent: indent.to_owned(),
            final_newline: text.is_empty() || text.ends_with('\n'),
        }
    }

    fn render(&self, root: &Map<String, Value>) -> String {
        let mut buf = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(self.indent.as_bytes());
        let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
        // Serialising a map of Values into memory cannot fail.
        root.serialize(&mut ser)
            .expect("serialising JSON into memory");
        let mut out = String::from_utf8(buf).expect("serde_json writes UTF-8");
        if self.final_newline {
            out.push('\n');
        }
        out
    }
}

fn parse(text: &str) -> Result<Map<String, Value>, EditError> {
    // dockerd accepts an empty daemon.json; so do we.
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text).map_err(EditError::Json)? {
        Value::Object(m) => Ok(m),
        _ => Err(EditError::Layout(
            "the top level is not a JSON object".into(),
        )),
    }
}

fn runtimes_of(root: &Map<String, Value>) -> Result<Option<&Map<String, Value>>, EditError> {
    match root.get(RUNTIMES) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(EditError::Layout(format!(
            "\"{RUNTIMES}\" is not an object"
        ))),
    }
}

/// `current` (None: no file) with `runtimes.<name>.path` and, if asked, `default-runtime`.
pub fn configure(current: Option<&str>, reg: &Registration) -> Result<String, EditError> {
    let original = current.map(parse).transpose()?.unwrap_or_default();
    let mut root = original.clone();
    let runtimes = root
        .entry(RUNTIMES)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| EditError::Layout(format!("\"{RUNTIMES}\" is not an object")))?;
    let entry = runtimes
        .entry(reg.name.clone())
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| {
            EditError::Layout(format!("\"{RUNTIMES}.{}\" is not an object", reg.name))
        })?;
    // Other keys of an existing entry (runtimeArgs) are the operator's: keep them.
    entry.insert("path".into(), Value::String(reg.path.clone()));
    if reg.set_as_default {
        root.insert(DEFAULT_RUNTIME.into(), Value::String(reg.name.clone()));
    }
    match current {
        Some(text) if root == original => Ok(text.to_owned()),
        _ => Ok(Layout::of(current).render(&root)),
    }
}

/// `current` without `runtimes.<name>`; a `default-runtime` naming it becomes
/// `previous_default` or goes away. An emptied `runtimes` goes too.
pub fn unconfigure(
    current: &str,
    name: &str,
    previous_default: Option<&str>,
) -> Result<String, EditError> {
    let original = parse(current)?;
    let mut root = original.clone();
    runtimes_of(&root)?;
    if let Some(Value::Object(runtimes)) = root.get_mut(RUNTIMES) {
        runtimes.shift_remove(name);
        if runtimes.is_empty() {
            root.shift_remove(RUNTIMES);
        }
    }
    if root.get(DEFAULT_RUNTIME).and_then(Value::as_str) == Some(name) {
        match previous_default {
            Some(prev) => {
                root.insert(DEFAULT_RUNTIME.into(), Value::String(prev.to_owned()));
            }
            None => {
                root.shift_remove(DEFAULT_RUNTIME);
            }
        }
    }
    if root == original {
        return Ok(current.to_owned());
    }
    Ok(Layout::of(Some(current)).render(&root))
}

pub fn registered(current: &str, name: &str) -> Result<Registered, EditError> {
    let root = parse(current)?;
    let path = runtimes_of(&root)?
        .and_then(|r| r.get(name))
        .and_then(|e| e.get("path"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let is_default = root.get(DEFAULT_RUNTIME).and_then(Value::as_str) == Some(name);
    Ok(Registered { path, is_default })
}

pub fn default_runtime(current: &str) -> Result<Option<String>, EditError> {
    Ok(parse(current)?
        .get(DEFAULT_RUNTIME)
        .and_then(Value::as_str)
        .map(str::to_owned))
}

/// Every `runtimes.<name>` with a `path`, in the file's order: read-only, for `accel-ctk doctor`.
pub fn runtimes(current: &str) -> Result<Vec<(String, String)>, EditError> {
    let root = parse(current)?;
    Ok(runtimes_of(&root)?
        .into_iter()
        .flatten()
        .filter_map(|(name, rt)| Some((name.clone(), rt.get("path")?.as_str()?.to_owned())))
        .collect())
}

/// The cgroup driver `exec-opts` sets (`native.cgroupdriver=systemd`), as dockerd reads it:
/// the last such option wins; `None` when the file sets none (dockerd then picks its default).
///
/// Ref: <https://docs.docker.com/engine/daemon/#configure-cgroup-driver>
pub fn cgroup_driver(current: &str) -> Result<Option<String>, EditError> {
    let root = parse(current)?;
    let opts = match root.get("exec-opts") {
        None => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(EditError::Layout("\"exec-opts\" is not an array".into())),
    };
    Ok(opts
        .iter()
        .filter_map(Value::as_str)
        .filter_map(|o| {
            let (k, v) = o.split_once('=')?;
            (k.trim() == "native.cgroupdriver").then(|| v.trim().to_owned())
        })
        .next_back())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::reg;

    #[test]
    fn missing_file_gets_two_space_layout() {
        assert_eq!(
            configure(None, &reg(false)).unwrap(),
            "{\n  \"runtimes\": {\n    \"accel\": {\n      \"path\": \"/usr/bin/accel-container-runtime\"\n    }\n  }\n}\n"
        );
    }

    #[test]
    fn keeps_order_indent_other_runtimes_and_args() {
        let text = "{\n\t\"runtimes\": {\n\t\t\"accel\": {\n\t\t\t\"path\": \"/old\",\n\t\t\t\"runtimeArgs\": [\"--debug\"]\n\t\t}\n\t},\n\t\"debug\": true\n}";
        let out = configure(Some(text), &reg(true)).unwrap();
        assert_eq!(
            out,
            "{\n\t\"runtimes\": {\n\t\t\"accel\": {\n\t\t\t\"path\": \"/usr/bin/accel-container-runtime\",\n\t\t\t\"runtimeArgs\": [\n\t\t\t\t\"--debug\"\n\t\t\t]\n\t\t}\n\t},\n\t\"debug\": true,\n\t\"default-runtime\": \"accel\"\n}"
        );
    }

    #[test]
    fn no_change_returns_the_bytes() {
        let text = "{\"runtimes\":{\"accel\":{\"path\":\"/usr/bin/accel-container-runtime\"}}}";
        assert_eq!(configure(Some(text), &reg(false)).unwrap(), text);
    }

    #[test]
    fn refuses_invalid_json_and_wrong_shapes() {
        assert!(matches!(
            configure(Some("{\"debug\": true,}"), &reg(false)),
            Err(EditError::Json(_))
        ));
        assert!(matches!(
            configure(Some("[]"), &reg(false)),
            Err(EditError::Layout(_))
        ));
        assert!(matches!(
            configure(Some("{\"runtimes\": []}"), &reg(false)),
            Err(EditError::Layout(_))
        ));
    }

    #[test]
    fn unconfigure_restores_previous_default_or_drops_it() {
        let text = configure(Some("{\"default-runtime\": \"runc\"}\n"), &reg(true)).unwrap();
        assert_eq!(
            unconfigure(&text, "accel", Some("runc")).unwrap(),
            "{\n  \"default-runtime\": \"runc\"\n}\n"
        );
        assert_eq!(unconfigure(&text, "accel", None).unwrap(), "{}\n");
        let r = registered(&text, "accel").unwrap();
        assert!(r.is_default);
        assert_eq!(r.path.as_deref(), Some("/usr/bin/accel-container-runtime"));
    }

    #[test]
    fn readers_for_doctor() {
        let text = r#"{"runtimes":{"a":{"path":"/x/a"},"b":{"runtimeArgs":[]}},"exec-opts":["native.cgroupdriver=cgroupfs","native.cgroupdriver = systemd"]}"#;
        assert_eq!(runtimes(text).unwrap(), [("a".into(), "/x/a".into())]);
        assert_eq!(cgroup_driver(text).unwrap().as_deref(), Some("systemd"));
        assert_eq!(cgroup_driver("{}").unwrap(), None);
        assert!(cgroup_driver(r#"{"exec-opts":"x"}"#).is_err());
    }

    #[test]
    fn empty_file_is_an_empty_object() {
        assert!(configure(Some(""), &reg(false))
            .unwrap()
            .contains("\"accel\""));
    }
}
