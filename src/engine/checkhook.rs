//! The NRI plugin's check hook in a runtime spec: `accel-nri-plugin check` as an OCI
//! `createRuntime` hook, which the stock runc or crun runs for every container. Pure: a
//! document in, the document with the hook out ([`add`]), and whether a document has it
//! ([`present`]). `accel-ctk nri base-spec` writes the spec an engine starts every container
//! from (containerd's `base_runtime_spec`); doctor reads it back.
//!
//! Ref: OCI runtime spec, config.md "POSIX-platform Hooks" (`createRuntime`: run in the
//! runtime namespace after the container's namespaces exist, before pivot_root; a non-zero
//! exit fails the create).

use serde_json::{json, Map, Value};

/// The plugin's binary name: the hook's `args[0]`, and what [`present`] looks for.
pub const PLUGIN: &str = "accel-nri-plugin";
/// The installed plugin (the packages' path).
pub const DEFAULT_PATH: &str = "/usr/bin/accel-nri-plugin";
/// The subcommand the hook runs.
pub const CHECK: &str = "check";
/// The hook's whole environment: set, so none of the runtime's own leaks into it (runc and
/// crun give a hook exactly the `env` it names).
pub const ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Whether `hook` is the check hook: `args` of `[<…accel-nri-plugin>, "check", …]`, or a
/// `path` whose file name is the plugin's with `args[1] == "check"`.
fn is_check(hook: &Value) -> bool {
    let args: Vec<&str> = hook
        .get("args")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let named = |s: &str| s.rsplit('/').next() == Some(PLUGIN);
    let path = hook.get("path").and_then(Value::as_str).unwrap_or("");
    args.get(1) == Some(&CHECK) && (named(path) || args.first().is_some_and(|a| named(a)))
}

/// Whether `doc` (a runtime spec) has the check hook among its `createRuntime` hooks.
pub fn present(doc: &Value) -> bool {
    !paths(doc).is_empty()
}

/// The `path` of each check hook among `doc`'s `createRuntime` hooks: the binaries the
/// runtime will run for every container.
pub fn paths(doc: &Value) -> Vec<&str> {
    doc.pointer("/hooks/createRuntime")
        .and_then(Value::as_array)
        .map(|hooks| {
            hooks
                .iter()
                .filter(|h| is_check(h))
                .map(|h| h.get("path").and_then(Value::as_str).unwrap_or(""))
                .collect()
        })
        .unwrap_or_default()
}

/// `doc` with the check hook (`path` the plugin's binary) appended to `hooks.createRuntime`,
/// once: a document that has it already is left as it is (false). Every other key keeps its
/// place; `hooks` and `createRuntime` are made where missing. An error names the section of
/// the wrong JSON type.
pub fn add(doc: &mut Value, path: &str) -> Result<bool, String> {
    if !path.starts_with('/') {
        return Err(format!(
            "the plugin's path must be absolute (runc runs a hook by its path): {}",
            crate::quote::quote(path)
        ));
    }
    if present(doc) {
        return Ok(false);
    }
    let root = doc
        .as_object_mut()
        .ok_or("the runtime spec is not a JSON object")?;
    let hooks = root
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or("\"hooks\" is not an object")?;
    let list = hooks
        .entry("createRuntime")
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or("\"hooks.createRuntime\" is not an array")?;
    list.push(json!({"path": path, "args": [PLUGIN, CHECK], "env": [ENV]}));
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_hook_once_and_keeps_every_key_in_place() {
        let text = r#"{"ociVersion":"1.1.0","process":{"env":["A=1"]},"hooks":{"prestart":[{"path":"/x"}]},"zz":1}"#;
        let mut doc: Value = serde_json::from_str(text).unwrap();
        assert!(!present(&doc));
        assert!(add(&mut doc, DEFAULT_PATH).unwrap());
        assert!(present(&doc));
        let once = doc.clone();
        assert!(!add(&mut doc, "/opt/bin/accel-nri-plugin").unwrap());
        assert_eq!(doc, once);
        let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["ociVersion", "process", "hooks", "zz"]);
        assert_eq!(
            doc["hooks"]["createRuntime"][0],
            json!({"path": DEFAULT_PATH, "args": ["accel-nri-plugin", "check"], "env": [ENV]})
        );
        assert_eq!(doc["hooks"]["prestart"][0]["path"], "/x");
    }

    #[test]
    fn makes_the_sections_and_refuses_wrong_shapes() {
        let mut doc = json!({});
        assert!(add(&mut doc, DEFAULT_PATH).unwrap());
        assert!(present(&doc));
        for bad in [
            json!([]),
            json!({"hooks": []}),
            json!({"hooks": {"createRuntime": {}}}),
        ] {
            let mut d = bad.clone();
            assert!(add(&mut d, DEFAULT_PATH).is_err(), "{bad}");
            assert_eq!(d, bad);
        }
        assert!(add(&mut json!({}), "accel-nri-plugin").is_err());
        assert_eq!(paths(&doc), [DEFAULT_PATH]);
    }

    #[test]
    fn only_the_check_subcommand_counts() {
        let with = |hook: Value| json!({"hooks": {"createRuntime": [hook]}});
        assert!(present(&with(
            json!({"path": "/usr/local/bin/accel-nri-plugin", "args": ["x", "check"]})
        )));
        assert!(!present(&with(
            json!({"path": DEFAULT_PATH, "args": ["accel-nri-plugin"]})
        )));
        assert!(!present(&with(
            json!({"path": "/usr/bin/other", "args": ["other", "check"]})
        )));
        let prestart =
            json!({"hooks": {"prestart": [{"path": DEFAULT_PATH, "args": [PLUGIN, CHECK]}]}});
        assert!(!present(&prestart));
    }
}
