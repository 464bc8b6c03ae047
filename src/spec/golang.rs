//! The spec's keys as runc's Go decoder reads them (issue 14, class 4), and the size of its
//! lists (class 5).
//!
//! runc decodes config.json with Go's `encoding/json` into the runtime-spec structs. Two of
//! its rules differ from serde_json's `Value`, which [`super::View`] is read from:
//! - an object key matches a struct field "preferring an exact match but also accepting a
//!   case-insensitive match" (Ref: <https://pkg.go.dev/encoding/json#Unmarshal>), where
//!   case-insensitive is `bytes.EqualFold`, Unicode simple folding: `Process`, `ENV` and
//!   `\u212Aind` (KELVIN SIGN) are the fields `process`, `env` and `kind` to runc;
//! - a key given twice is decoded twice into the same field: a repeated object merges into
//!   the first, a repeated array or scalar replaces it. serde_json keeps only the last value.
//!
//! So `"capabilities": {"bounding": ["CAP_SYS_ADMIN"], "Bounding": ["CAP_KILL"]}` is
//! privileged to a reader that matches keys exactly and not to runc. Rather than reimplement
//! the merge, [`check`] refuses: in a spec that makes a request, every field on the paths the
//! shim decides from must be spelled exactly and once. Keys that name no field are ignored,
//! as Go ignores them. Annotations are a Go `map[string]string`, whose keys are not folded
//! (and whose repeated key keeps the last value, as serde_json does); a repeated one is
//! refused all the same, so that no reader of the spec can disagree about it.
//!
//! Everywhere else (sections the shim never reads: `linux.resources.memory`, `linux.seccomp`,
//! ...) a key spelled twice exactly is refused too (issue 23, class 4): runc merges the two
//! values, while the rewritten file, written from serde_json's map, would hold only the last,
//! and runc would then lose a memory limit or a seccomp rule it applies without the shim.
//! Case variants there are two keys to serde_json and are written back as they came, in
//! order, so runc reads the rewritten file as it read the original.

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Entries of `process.env`. Kubernetes' service links give a pod ~7 variables per service
/// in its namespace; a million leaves room for the largest clusters.
pub const MAX_ENV: usize = 1 << 20;
/// Entries of `mounts`, `linux.devices`, `linux.resources.devices`, `annotations`: real
/// specs have tens; 65536 is far beyond any and keeps the shim's per-entry checks cheap.
pub const MAX_ENTRIES: usize = 1 << 16;
/// Entries of `hooks.prestart`.
pub const MAX_HOOKS: usize = 1 << 12;

/// A section of the spec, as far as the shim reads it.
enum Shape {
    /// A Go struct: the fields the shim reads, each with its own shape.
    Struct(&'static [(&'static str, Shape)]),
    /// A Go slice of at most `max` entries of one shape.
    List(&'static Shape, usize),
    /// A Go map with string keys (`annotations`) of at most `max` entries.
    Map(usize),
    /// Anything else: read, not looked into.
    Leaf,
}

use Shape::{Leaf, List, Map, Struct};

const MOUNT: Shape = Struct(&[
    ("destination", Leaf),
    ("type", Leaf),
    ("source", Leaf),
    ("options", Leaf),
]);
const DEVICE: Shape = Struct(&[
    ("path", Leaf),
    ("type", Leaf),
    ("major", Leaf),
    ("minor", Leaf),
    ("fileMode", Leaf),
    ("uid", Leaf),
    ("gid", Leaf),
]);
const RULE: Shape = Struct(&[
    ("allow", Leaf),
    ("type", Leaf),
    ("major", Leaf),
    ("minor", Leaf),
    ("access", Leaf),
]);
const HOOK: Shape = Struct(&[
    ("path", Leaf),
    ("args", Leaf),
    ("env", Leaf),
    ("timeout", Leaf),
]);

/// The spec's root: every section the shim decides from or edits.
const SPEC: Shape = Struct(&[
    (
        "process",
        Struct(&[
            ("env", List(&Leaf, MAX_ENV)),
            ("capabilities", Struct(&[("bounding", Leaf)])),
            ("user", Struct(&[("additionalGids", Leaf)])),
        ]),
    ),
    (
        "linux",
        Struct(&[
            ("devices", List(&DEVICE, MAX_ENTRIES)),
            (
                "resources",
                Struct(&[("devices", List(&RULE, MAX_ENTRIES))]),
            ),
        ]),
    ),
    ("annotations", Map(MAX_ENTRIES)),
    ("root", Struct(&[("path", Leaf)])),
    ("hooks", Struct(&[("prestart", List(&HOOK, MAX_HOOKS))])),
    ("mounts", List(&MOUNT, MAX_ENTRIES)),
]);

/// Whether Go's `bytes.EqualFold` holds between `key` and the ASCII field name `field`.
/// Unicode simple folding joins an ASCII letter with its other case and with nothing else,
/// except `k` with U+212A KELVIN SIGN and `s` with U+017F LATIN SMALL LETTER LONG S.
pub fn go_fold_eq(key: &str, field: &str) -> bool {
    let mut chars = key.chars();
    for f in field.bytes() {
        let Some(c) = chars.next() else {
            return false;
        };
        let same = match c {
            '\u{212A}' => f.eq_ignore_ascii_case(&b'k'),
            '\u{017F}' => f.eq_ignore_ascii_case(&b's'),
            c if c.is_ascii() => (c as u8).eq_ignore_ascii_case(&f),
            _ => false,
        };
        if !same {
            return false;
        }
    }
    chars.next().is_none()
}

/// Checks spec bytes (already parsed by serde_json, so valid JSON within its nesting limit)
/// for keys runc would read differently from the shim and for lists over their limits. The
/// error is one line naming the key (quoted: it is the container's text) and where it is.
pub fn check(data: &[u8]) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(data);
    Walk {
        shape: &SPEC,
        at: At::Top,
    }
    .deserialize(&mut de)
    .map_err(|e| {
        // The walker's own messages carry no position; serde_json adds " at line L column C".
        let msg = e.to_string();
        match msg.rfind(" at line ") {
            Some(i) if e.is_data() => msg[..i].to_string(),
            _ => msg,
        }
    })
}

/// The refusal of a key given twice where runc merges the two values.
fn repeated(key: &str, place: &At<'_>) -> String {
    format!(
        "key {} repeated in {place} (runc merges the two, the rewritten spec would keep only the last); refused",
        crate::quote::quote(key)
    )
}

/// Where a value is in the spec, written out (`linux.seccomp.syscalls[3]`) only for a
/// message: a spec has hundreds of keys and list entries, and only a refusal names one.
#[derive(Clone, Copy)]
enum At<'p> {
    Top,
    Key(&'p At<'p>, &'p str),
    Index(&'p At<'p>, usize),
}

impl At<'_> {
    fn path(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            At::Top => Ok(()),
            At::Key(At::Top, name) => f.write_str(name),
            At::Key(parent, name) => {
                parent.path(f)?;
                write!(f, ".{name}")
            }
            At::Index(parent, n) => {
                parent.path(f)?;
                write!(f, "[{n}]")
            }
        }
    }
}

/// The place for a message: "the spec's top level" or the path in backquotes.
impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            At::Top => f.write_str("the spec's top level"),
            _ => {
                f.write_str("`")?;
                self.path(f)?;
                f.write_str("`")
            }
        }
    }
}

/// Reads one value of `shape` at `at`.
struct Walk<'p> {
    shape: &'static Shape,
    at: At<'p>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a spec section")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        use serde::de::Error;
        match self.shape {
            Struct(fields) => {
                let mut seen = 0u64;
                let mut seen_other: HashSet<String> = HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    let Some(i) = fields.iter().position(|(f, _)| go_fold_eq(&key, f)) else {
                        if seen_other.contains(&key) {
                            return Err(A::Error::custom(repeated(&key, &self.at)));
                        }
                        map.next_value_seed(Walk {
                            shape: &Leaf,
                            at: At::Key(&self.at, &key),
                        })?;
                        seen_other.insert(key);
                        continue;
                    };
                    let (field, shape) = &fields[i];
                    if key != *field {
                        return Err(A::Error::custom(format!(
                            "key {} in {} is `{field}` to runc (Go's encoding/json matches keys case-insensitively); refused: the spec would not be read as runc reads it",
                            crate::quote::quote(&key),
                            self.at
                        )));
                    }
                    let bit = 1u64 << i;
                    if seen & bit != 0 {
                        return Err(A::Error::custom(format!(
                            "key `{field}` repeated in {} (runc merges or replaces, the shim would read only one); refused",
                            self.at
                        )));
                    }
                    seen |= bit;
                    map.next_value_seed(Walk {
                        shape,
                        at: At::Key(&self.at, field),
                    })?;
                }
                Ok(())
            }
            Map(max) => {
                let mut keys = HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    if keys.len() == *max {
                        return Err(A::Error::custom(format!(
                            "{} has more than {max} entries; refused",
                            self.at
                        )));
                    }
                    if keys.contains(&key) {
                        return Err(A::Error::custom(format!(
                            "key {} repeated in {}; refused",
                            crate::quote::quote(&key),
                            self.at
                        )));
                    }
                    keys.insert(key);
                }
                Ok(())
            }
            // A section the shim does not look into: any key given twice is refused
            // (serde_json's nesting limit bounds the depth).
            Leaf => {
                let mut keys: HashSet<String> = HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if keys.contains(&key) {
                        return Err(A::Error::custom(repeated(&key, &self.at)));
                    }
                    map.next_value_seed(Walk {
                        shape: &Leaf,
                        at: At::Key(&self.at, &key),
                    })?;
                    keys.insert(key);
                }
                Ok(())
            }
            // The wrong kind of section (a map for a list): View::of judges types.
            _ => {
                while map.next_key::<IgnoredAny>()?.is_some() {
                    map.next_value::<IgnoredAny>()?;
                }
                Ok(())
            }
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        use serde::de::Error;
        let List(item, max) = self.shape else {
            if let Leaf = self.shape {
                let mut n = 0usize;
                while seq
                    .next_element_seed(Walk {
                        shape: &Leaf,
                        at: At::Index(&self.at, n),
                    })?
                    .is_some()
                {
                    n += 1;
                }
            } else {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
            }
            return Ok(());
        };
        let mut n = 0usize;
        loop {
            let more = match item {
                // Most entries (the environment) are not looked into: no path to build.
                Leaf => seq.next_element::<IgnoredAny>()?.is_some(),
                _ => seq
                    .next_element_seed(Walk {
                        shape: item,
                        at: At::Index(&self.at, n),
                    })?
                    .is_some(),
            };
            if !more {
                break;
            }
            n += 1;
            if n > *max {
                return Err(A::Error::custom(format!(
                    "{} has more than {max} entries; refused",
                    self.at
                )));
            }
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_is_go_s_bytes_equal_fold_for_ascii_field_names() {
        // What Go's bytes.EqualFold says of each pair (unicode.SimpleFold orbits: k K U+212A,
        // s S U+017F; I and i only with each other, not with U+0130 or U+0131).
        for (key, field, want) in [
            ("bounding", "bounding", true),
            ("Bounding", "bounding", true),
            ("BOUNDING", "bounding", true),
            ("fileMode", "filemode", true),
            ("mount\u{17f}", "mounts", true),
            ("hoo\u{212a}s", "hooks", true),
            ("\u{17f}ource", "source", true),
            ("l\u{131}nux", "linux", false),
            ("L\u{130}NUX", "linux", false),
            ("mounts ", "mounts", false),
            ("mount", "mounts", false),
            ("env_", "env", false),
            ("\u{212a}", "s", false),
            ("", "env", false),
        ] {
            assert_eq!(go_fold_eq(key, field), want, "{key:?} {field:?}");
        }
    }

    #[test]
    fn spellings_runc_reads_otherwise_are_refused_naming_the_key() {
        for (spec, want) in [
            (
                r#"{"process":{"capabilities":{"bounding":["CAP_SYS_ADMIN"],"Bounding":["CAP_KILL"]}}}"#,
                "key \"Bounding\" in `process.capabilities` is `bounding` to runc",
            ),
            (
                r#"{"Process":{}}"#,
                "key \"Process\" in the spec's top level",
            ),
            (
                r#"{"linux":{"devices":[]},"linux":{}}"#,
                "key `linux` repeated in the spec's top level",
            ),
            (
                r#"{"mounts":[{"destination":"/a","Destination":"/b"}]}"#,
                "`mounts[0]`",
            ),
            (
                r#"{"hooks":{"prestart":[{},{"path":"/a","pat\u0068":"/b"}]}}"#,
                "key `path` repeated in `hooks.prestart[1]`",
            ),
            (
                r#"{"linux":{"resources":{"devices":[{"ACCESS":"rwm"}]}}}"#,
                "`linux.resources.devices[0]`",
            ),
            (
                r#"{"annotations":{"a":"1","b":"","a":"2"}}"#,
                "key \"a\" repeated in `annotations`",
            ),
            // Issue 23, class 4: sections the shim never reads, where runc merges a repeated
            // object (a memory limit) and serde_json would keep the last.
            (
                r#"{"linux":{"resources":{"memory":{"limit":1048576},"memory":{"swap":0}}}}"#,
                "key \"memory\" repeated in `linux.resources` (runc merges the two",
            ),
            (
                r#"{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["a"],"action":"x","action":"y"}]}}}"#,
                "key \"action\" repeated in `linux.seccomp.syscalls[0]`",
            ),
            (
                r#"{"x":{"y":[[{"z":1,"z":2}]]}}"#,
                "key \"z\" repeated in `x.y[0][0]`",
            ),
            (
                r#"{"ociVersion":"1","ociVersion":"1"}"#,
                "key \"ociVersion\" repeated in the spec's top level",
            ),
        ] {
            let e = check(spec.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{spec}: {e}");
            assert!(!e.contains('\n') && !e.contains(" at line "), "{e}");
        }
        for fine in [
            r#"{}"#,
            r#"{"process":{"env":["A=1"],"Env2":1,"cwd":"/","CWD":"/x"},"x":1,"X":2}"#,
            r#"{"annotations":{"a":"1","A":"2"},"mounts":[1,"x",{"options":[1,1.5e400]}]}"#,
            r#"{"process":5,"linux":[],"root":{"path":"r"}}"#,
        ] {
            assert_eq!(check(fine.as_bytes()), Ok(()), "{fine}");
        }
    }

    #[test]
    fn lists_over_their_limit_are_refused() {
        let at = |n: usize| {
            format!(
                "{{\"linux\":{{\"devices\":[{}]}}}}",
                vec!["{}"; n].join(",")
            )
        };
        assert_eq!(check(at(MAX_ENTRIES).as_bytes()), Ok(()));
        let e = check(at(MAX_ENTRIES + 1).as_bytes()).unwrap_err();
        assert!(
            e.contains("`linux.devices` has more than 65536 entries"),
            "{e}"
        );
    }
}
