//! [`Entry`]: an element the editor adds to one of the spec's arrays (a device node, a cgroup
//! rule, a mount, a gid), written straight as JSON text, and what tells whether the array
//! already has it.
//!
//! The text is what serializing the OCI runtime spec's typed structs gives (`LinuxDevice`,
//! `LinuxDeviceCgroup`, `Mount`: their field order and names, strings escaped as serde_json
//! escapes them), written without building those structs or a `serde_json::Value`: both the
//! variable path and CDI's edits take their entries from here. A rule's or a gid's
//! fingerprint is computed while it is written, from the same parts
//! ([`checked::Fingerprints`] gives the same of the text).
//! Ref: OCI runtime spec, config-linux.md (devices, resources.devices), config.md (mounts).

use std::ops::Range;
use std::path::Path;

use serde_json::Value;

use super::checked::{self, fp_bool, fp_i64, fp_str, fp_u64, ObjectFp};
use crate::plan::{BindMount, DeviceNode, NodeKind};

/// When an element is already in an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Same {
    /// An object whose member of this name is the same string.
    Member(&'static str),
    /// An equal JSON value.
    Value,
}

/// An element to append with [`Document::append_unique`](super::Document::append_unique):
/// its JSON, and what tells whether the array already has it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub(super) same: Same,
    /// For [`Same::Member`]: the member's string literal in `json` (quotes included).
    key: Range<usize>,
    /// Whether that literal has no escapes (compared byte for byte with another such).
    pub(super) key_plain: bool,
    /// For [`Same::Value`]: the fingerprint of the value.
    pub(super) fp: u64,
    pub(super) json: String,
}

impl Entry {
    /// The `linux.devices` entry for a node (`LinuxDevice`), already there when an element
    /// has the same `path`.
    pub fn device(n: &DeviceNode) -> Result<Entry, String> {
        let path = utf8(&n.path)?;
        let mut w = Writer::with_capacity(path.len() + 96, false);
        w.json.push('{');
        let key = w.str_member(r#""path":"#, path);
        w.str_member(r#""type":"#, device_type(n.kind));
        w.i64_member(r#""major":"#, n.major as i64);
        w.i64_member(r#""minor":"#, n.minor as i64);
        w.i64_member(r#""fileMode":"#, n.file_mode.into());
        w.i64_member(r#""uid":"#, n.uid.into());
        w.i64_member(r#""gid":"#, n.gid.into());
        w.json.push('}');
        Ok(w.by_member("path", key))
    }

    /// The `linux.resources.devices` allow rule for a node with the given cgroup access
    /// (`LinuxDeviceCgroup`), already there when an element is the same value.
    pub fn rule(n: &DeviceNode, access: &str) -> Entry {
        let mut w = Writer::with_capacity(access.len() + 72, true);
        w.json.push('{');
        w.bool_member(r#""allow":"#, true);
        w.str_member(r#""type":"#, device_type(n.kind));
        w.i64_member(r#""major":"#, n.major as i64);
        w.i64_member(r#""minor":"#, n.minor as i64);
        w.str_member(r#""access":"#, access);
        w.json.push('}');
        w.by_value()
    }

    /// A `mounts` entry (`Mount`), already there when an element has the same
    /// `destination`; `typ` `None` leaves the type out (runc then goes by the options).
    pub fn mount(
        m: &BindMount,
        typ: Option<&str>,
        options: &[impl AsRef<str>],
    ) -> Result<Entry, String> {
        let (dest, source) = (utf8(&m.destination)?, utf8(&m.source)?);
        let options_len: usize = options.iter().map(|o| o.as_ref().len() + 3).sum();
        let typ_len = typ.map_or(0, |t| t.len() + 10);
        let mut w = Writer::with_capacity(
            dest.len() + source.len() + options_len + typ_len + 48,
            false,
        );
        w.json.push('{');
        let key = w.str_member(r#""destination":"#, dest);
        if let Some(t) = typ {
            w.str_member(r#""type":"#, t);
        }
        w.str_member(r#""source":"#, source);
        w.name(r#""options":"#);
        w.json.push('[');
        for (i, o) in options.iter().enumerate() {
            if i > 0 {
                w.json.push(',');
            }
            w.string(o.as_ref());
        }
        w.json.push_str("]}");
        Ok(w.by_member("destination", key))
    }

    /// A `process.user.additionalGids` element, already there when an element is the
    /// same number.
    pub fn gid(g: u32) -> Entry {
        let mut w = Writer::with_capacity(10, false);
        w.int(g.into());
        Entry {
            same: Same::Value,
            key: 0..0,
            key_plain: true,
            fp: fp_u64(g.into()),
            json: w.json,
        }
    }

    /// `entry`, already there when an element is an object whose member `name` is the
    /// same string; `Err` when `entry` is not an object with such a string member.
    pub fn by_member(name: &'static str, entry: &impl serde::Serialize) -> Result<Entry, String> {
        let json = serde_json::to_string(entry).map_err(|e| e.to_string())?;
        let lit = checked::string_member(&json, name)
            .ok_or_else(|| format!("{json}: no string member `{name}`"))?;
        let start = lit.as_ptr() as usize - json.as_ptr() as usize;
        Ok(Entry {
            same: Same::Member(name),
            key: start..start + lit.len(),
            key_plain: checked::is_plain(lit),
            fp: 0,
            json,
        })
    }

    /// `value`, already there when an element is an equal value.
    pub fn by_value(value: &Value) -> Entry {
        let json = value.to_string();
        Entry {
            same: Same::Value,
            key: 0..0,
            key_plain: true,
            fp: checked::Fingerprints::default().of(&json),
            json,
        }
    }

    /// The entry's JSON text.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The entry as a value (for a section edited as a value, as CDI's replacing edits are).
    pub fn to_value(&self) -> Result<Value, String> {
        serde_json::from_str(&self.json).map_err(|e| e.to_string())
    }

    /// For [`Same::Member`]: the member's string literal.
    pub(super) fn key_literal(&self) -> &str {
        self.json.get(self.key.clone()).unwrap_or_default()
    }

    /// Whether the element `text` (JSON that serde_json accepts) is the same as `self`.
    pub(super) fn matches_text(&self, text: &str) -> bool {
        match self.same {
            Same::Member(name) => checked::string_member(text, name)
                .is_some_and(|lit| checked::same_string(lit, self.key_literal())),
            Same::Value => {
                checked::Fingerprints::default().of(text) == self.fp && self.equal_value(text)
            }
        }
    }

    /// For [`Same::Value`], after fingerprints matched: whether `text` is the same value
    /// (the same text, as a second create writes it, or decoded and compared).
    pub(super) fn equal_value(&self, text: &str) -> bool {
        text == self.json
            || matches!(
                (serde_json::from_str::<Value>(text), self.to_value()),
                (Ok(a), Ok(b)) if a == b
            )
    }

    /// Whether the element `v` is the same as `self`.
    pub(super) fn matches_value(&self, v: &Value) -> bool {
        match self.same {
            Same::Member(name) => {
                let key = checked::unescape(self.key_literal());
                let member = v.as_object().and_then(|o| o.get(name));
                key.is_some_and(|k| member.and_then(Value::as_str) == Some(&k))
            }
            Same::Value => self.to_value().is_ok_and(|own| *v == own),
        }
    }

    /// Whether `other` is the same element for `self`'s rule.
    pub(super) fn same_as(&self, other: &Entry) -> bool {
        match (self.same, other.same) {
            (Same::Member(a), Same::Member(b)) if a == b => {
                if self.key_plain && other.key_plain {
                    self.key_literal() == other.key_literal()
                } else {
                    checked::same_string(self.key_literal(), other.key_literal())
                }
            }
            (Same::Value, Same::Value) => self.fp == other.fp && self.equal_value(&other.json),
            _ => self.matches_text(&other.json),
        }
    }
}

/// A path written as a JSON string; serde_json refuses one that is not UTF-8 the same way.
fn utf8(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{}: path contains invalid UTF-8 characters", p.display()))
}

fn device_type(k: NodeKind) -> &'static str {
    match k {
        NodeKind::Char => "c",
        NodeKind::Block => "b",
    }
}

/// Writes one object's members as JSON text, and for an entry compared by value the
/// fingerprint of the members written.
struct Writer {
    json: String,
    /// Whether a member was written (the next one needs a comma).
    any: bool,
    /// `Some` for an entry compared by value.
    fp: Option<ObjectFp>,
}

impl Writer {
    fn with_capacity(n: usize, by_value: bool) -> Writer {
        Writer {
            json: String::with_capacity(n),
            any: false,
            fp: by_value.then(ObjectFp::default),
        }
    }

    /// A member's name (`"name":`, quotes and colon written with it) after a comma unless it
    /// is the first; the name itself.
    fn name(&mut self, quoted: &'static str) -> &'static str {
        if self.any {
            self.json.push(',');
        }
        self.any = true;
        self.json.push_str(quoted);
        quoted
            .get(1..quoted.len().saturating_sub(2))
            .unwrap_or_default()
    }

    /// A string, escaped as serde_json escapes it; where its literal is in the text.
    fn string(&mut self, s: &str) -> Range<usize> {
        let start = self.json.len();
        // serde_json escapes `"`, `\` and control characters only. Every byte is looked at
        // (no early end), which the compiler turns into a wide loop.
        let escape = s
            .bytes()
            .fold(false, |e, b| e | (b < 0x20) | (b == b'"') | (b == b'\\'));
        if escape {
            // Serializing a str cannot fail.
            self.json
                .push_str(&serde_json::to_string(s).unwrap_or_default());
        } else {
            self.json.push('"');
            self.json.push_str(s);
            self.json.push('"');
        }
        start..self.json.len()
    }

    fn int(&mut self, i: i64) {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut u = i.unsigned_abs();
        loop {
            at -= 1;
            digits[at] = b'0' + (u % 10) as u8;
            u /= 10;
            if u == 0 {
                break;
            }
        }
        if i < 0 {
            self.json.push('-');
        }
        for d in &digits[at..] {
            self.json.push(char::from(*d));
        }
    }

    fn str_member(&mut self, quoted: &'static str, value: &str) -> Range<usize> {
        let name = self.name(quoted);
        if let Some(fp) = &mut self.fp {
            fp.add(name, fp_str(value));
        }
        self.string(value)
    }

    fn i64_member(&mut self, quoted: &'static str, value: i64) {
        let name = self.name(quoted);
        if let Some(fp) = &mut self.fp {
            fp.add(name, fp_i64(value));
        }
        self.int(value);
    }

    fn bool_member(&mut self, quoted: &'static str, value: bool) {
        let name = self.name(quoted);
        if let Some(fp) = &mut self.fp {
            fp.add(name, fp_bool(value));
        }
        self.json.push_str(if value { "true" } else { "false" });
    }

    fn by_member(self, name: &'static str, key: Range<usize>) -> Entry {
        let key_plain = self.json.get(key.clone()).is_some_and(checked::is_plain);
        Entry {
            same: Same::Member(name),
            key,
            key_plain,
            fp: 0,
            json: self.json,
        }
    }

    fn by_value(self) -> Entry {
        Entry {
            same: Same::Value,
            key: 0..0,
            key_plain: true,
            fp: self.fp.unwrap_or_default().get(),
            json: self.json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{
        LinuxDeviceBuilder, LinuxDeviceCgroupBuilder, LinuxDeviceType, MountBuilder,
    };

    fn node(path: &str, kind: NodeKind, major: u64, minor: u64) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: path.into(),
            kind,
            major,
            minor,
            file_mode: 0o660,
            uid: 7,
            gid: u32::MAX,
        }
    }

    const ODD: [&str; 6] = [
        "/dev/nvidia0",
        "/dev/a\"b\\c",
        "/dev/new\nline\t\u{1}\u{1f}",
        "/dev/é/\u{7f}/\u{2028}",
        "",
        "/usr/lib64/libcuda.so.1",
    ];

    /// The text is what main wrote through oci-spec's structs, byte for byte.
    #[test]
    fn text_is_oci_specs_serialization() {
        for path in ODD {
            for (kind, typ) in [
                (NodeKind::Char, LinuxDeviceType::C),
                (NodeKind::Block, LinuxDeviceType::B),
            ] {
                for (major, minor) in [(195, 0), (0, 255), (u64::from(u32::MAX), 1 << 40)] {
                    let n = node(path, kind, major, minor);
                    let typed = LinuxDeviceBuilder::default()
                        .path(path)
                        .typ(typ)
                        .major(major as i64)
                        .minor(minor as i64)
                        .file_mode(n.file_mode)
                        .uid(n.uid)
                        .gid(n.gid)
                        .build()
                        .unwrap();
                    let want = serde_json::to_string(&typed).unwrap();
                    assert_eq!(Entry::device(&n).unwrap().json(), want);
                    for access in ["rwm", "r", "a\"\\\n"] {
                        let typed = LinuxDeviceCgroupBuilder::default()
                            .allow(true)
                            .typ(typ)
                            .major(major as i64)
                            .minor(minor as i64)
                            .access(access)
                            .build()
                            .unwrap();
                        // Through a Value, as main did (a Value keeps the struct's order).
                        let want = serde_json::to_value(&typed).unwrap().to_string();
                        assert_eq!(Entry::rule(&n, access).json(), want);
                    }
                }
            }
            let m = BindMount {
                source: format!("/drv{path}").into(),
                destination: path.into(),
            };
            let options = ["ro", "nosuid", "nodev", "bind"];
            for typ in [Some("bind"), None, Some("t\"")] {
                for opts in [&options[..], &[], &["x\"y"]] {
                    let mut b = MountBuilder::default()
                        .destination(&m.destination)
                        .source(&m.source)
                        .options(opts.iter().map(|o| o.to_string()).collect::<Vec<_>>());
                    if let Some(t) = typ {
                        b = b.typ(t);
                    }
                    let want = serde_json::to_string(&b.build().unwrap()).unwrap();
                    assert_eq!(Entry::mount(&m, typ, opts).unwrap().json(), want);
                }
            }
        }
        for g in [0, 44, u32::MAX] {
            assert_eq!(Entry::gid(g).json(), g.to_string());
        }
    }

    #[test]
    fn pinned_text_and_keys() {
        let n = node("/dev/nvidia1", NodeKind::Char, 195, 1);
        let d = Entry::device(&n).unwrap();
        assert_eq!(
            d.json(),
            r#"{"path":"/dev/nvidia1","type":"c","major":195,"minor":1,"fileMode":432,"uid":7,"gid":4294967295}"#
        );
        assert_eq!(d.key_literal(), r#""/dev/nvidia1""#);
        let r = Entry::rule(&n, "rwm");
        assert_eq!(
            r.json(),
            r#"{"allow":true,"type":"c","major":195,"minor":1,"access":"rwm"}"#
        );
        let m = BindMount {
            source: "/drv/lib\"x".into(),
            destination: "/usr/lib/a\\b".into(),
        };
        let m = Entry::mount(&m, Some("bind"), &["ro", "bind"]).unwrap();
        assert_eq!(
            m.json(),
            r#"{"destination":"/usr/lib/a\\b","type":"bind","source":"/drv/lib\"x","options":["ro","bind"]}"#
        );
        assert_eq!(m.key_literal(), r#""/usr/lib/a\\b""#);
        let by = Entry::by_member("destination", &m.to_value().unwrap()).unwrap();
        assert!(by.same_as(&m) && m.same_as(&by));
        assert!(Entry::by_member("path", &m.to_value().unwrap()).is_err());
    }

    /// A rule's fingerprint, computed while written, is the one its text has.
    #[test]
    fn fingerprint_is_the_texts() {
        for path in ODD {
            for access in ["rwm", "", "a\"\\\n\u{1}é"] {
                let n = node(path, NodeKind::Block, 7, 1 << 33);
                let r = Entry::rule(&n, access);
                assert_eq!(r.fp, checked::Fingerprints::default().of(&r.json), "{r:?}");
                assert!(r.same_as(&Entry::by_value(&r.to_value().unwrap())));
                assert!(r.matches_text(&r.json) && r.matches_value(&r.to_value().unwrap()));
            }
        }
        let g = Entry::gid(44);
        assert_eq!(g.fp, checked::Fingerprints::default().of("44"));
        assert!(g.matches_text("44") && !g.matches_text("44.0") && !g.matches_text("\"44\""));
    }

    #[test]
    fn a_path_that_is_not_utf8_is_an_error_naming_it() {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"/dev/x\xff");
        let mut n = node("/dev/x", NodeKind::Char, 1, 1);
        n.path = bad.into();
        let e = Entry::device(&n).unwrap_err();
        assert!(e.contains("/dev/x") && e.contains("UTF-8"), "{e}");
        let m = BindMount {
            source: bad.into(),
            destination: "/x".into(),
        };
        assert!(Entry::mount(&m, None, &["ro"]).is_err());
    }
}
