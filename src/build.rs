//! Prepares the built-in profiles for the create path, which runs on every container start.
//!
//! Parsing `config/profiles/{nvidia,enflame}.toml` with `toml` at run time was most of a
//! create's config cost (half of those files is comments). Here each is parsed once, at build
//! time, and `$OUT_DIR/builtin_profiles.rs` gets, besides the text itself, the same table as
//! static data (`profile::Data`: read at run time with no parsing at all) and the sorted names
//! the text holds as TOML strings (what `config::Quick` screens a spec with). `src/profile.rs`
//! includes that file; its tests check both forms against the text.

#[path = "profile/quoted.rs"]
mod quoted;

use std::fmt::Write as _;
use std::path::PathBuf;

/// The profiles compiled into the binary (files under config/profiles/).
const BUILTIN: &[&str] = &["nvidia.toml", "enflame.toml"];

fn main() {
    println!("cargo:rerun-if-changed=src/build.rs");
    println!("cargo:rerun-if-changed=src/profile/quoted.rs");
    // The runtime binary's memcpy (src/bin/accel-container-runtime/mem.rs).
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if env == "musl" && arch == "x86_64" {
        println!("cargo:rustc-link-arg-bin=accel-container-runtime=-Wl,--wrap=memcpy");
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let mut code = String::from(
        "/// Profiles compiled into the binary, prepared by src/build.rs.\n\
         pub const BUILTIN: &[Builtin] = &[\n",
    );
    for file in BUILTIN {
        let path = manifest.join("config/profiles").join(file);
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let table: toml::Table = toml::from_str(&text)
            .unwrap_or_else(|e| panic!("built-in profile {}: {e}", path.display()));
        let name = table
            .get("name")
            .and_then(toml::Value::as_str)
            .unwrap_or_else(|| panic!("built-in profile {}: no name", path.display()));
        let entries = entries(&table, &path.display().to_string());
        let include = path.to_str().expect("a UTF-8 source path");
        writeln!(
            code,
            "    Builtin {{\n        file: {file:?},\n        name: {name:?},\n        \
             text: include_str!({include:?}),\n        data: {entries},\n        \
             quoted: &{:?},\n    }},",
            quoted_names(&text)
        )
        .expect("writing to a String");
    }
    code.push_str("];\n");
    let dest = out.join("builtin_profiles.rs");
    std::fs::write(&dest, code).unwrap_or_else(|e| panic!("cannot write {}: {e}", dest.display()));
}

/// A table's entries as a `&[(key, profile::Data)]` expression.
fn entries(table: &toml::Table, origin: &str) -> String {
    let items: Vec<String> = table
        .iter()
        .map(|(k, v)| format!("({k:?}, {})", data(v, origin)))
        .collect();
    format!("&[{}]", items.join(", "))
}

fn data(value: &toml::Value, origin: &str) -> String {
    match value {
        toml::Value::String(s) => format!("Data::String({s:?})"),
        toml::Value::Integer(i) => format!("Data::Integer({i})"),
        toml::Value::Boolean(b) => format!("Data::Bool({b})"),
        toml::Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|v| data(v, origin)).collect();
            format!("Data::Array(&[{}])", items.join(", "))
        }
        toml::Value::Table(t) => format!("Data::Table({})", entries(t, origin)),
        // No profile key takes one; add a `profile::Data` variant when one does.
        toml::Value::Float(_) | toml::Value::Datetime(_) => {
            panic!("built-in profile {origin}: floats and dates are not supported")
        }
    }
}

/// What `profile::quoted_names` finds in the text at run time, sorted, without duplicates.
fn quoted_names(text: &str) -> Vec<&str> {
    let mut names: Vec<&str> = quoted::quoted_names(text).collect();
    names.sort_unstable();
    names.dedup();
    names
}
