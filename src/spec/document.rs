//! [`Document`]: config.json borrowed as its bytes, read in place and edited by splicing.
//!
//! The whole document is checked once with serde_json; the objects the shim goes into
//! (`process`, `linux`, `hooks`, `root` and two below them) are parsed into their members
//! (key, value text) in the same pass, and only the few values it reads are decoded. A
//! section an editor changes is parsed into a `serde_json::Value` on first use
//! ([`Document::section_mut`]), or, for an array only appended to, not parsed at all
//! ([`Document::append_unique`]: the new elements' JSON is spliced in after the last old
//! one). [`Document::to_bytes`] copies everything else byte for byte.
//!
//! A repeated key: runc's Go decoder and serde_json both take its last occurrence, and so do
//! every read and every edit here. Keys are compared unescaped (`"\u006cinux"` is `linux`).
//! What is checked but not decoded: a lone surrogate escape or a number out of f64's range
//! in a part the shim never reads passes, as it does in runc.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{
    Deserialize, DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};
use serde_json::{Map, Value};

use super::{scan, SpecError, DOCKER_GPU_HOOK};

#[derive(Debug)]
pub enum ParseError {
    Json(serde_json::Error),
    Shape(String),
}

/// An object's members in document order, keys unescaped. A repeated key is there each time
/// it was written; lookups ([`last`]) take the last.
type Members<'a> = Vec<(Cow<'a, str>, &'a str)>;

/// Objects whose members are parsed once, in [`Document::parse`]: the shape check and the
/// editors go through them (a parent is listed before its children).
const CACHED: [&[&str]; 6] = [
    &["process"],
    &["process", "user"],
    &["linux"],
    &["linux", "resources"],
    &["hooks"],
    &["root"],
];

/// config.json, borrowed from its bytes; see the module header.
///
/// Invariant: every section text (`&'a str`) held here is a slice of `src` (it is how a
/// section's byte span is known: its offset in `src`).
pub struct Document<'a> {
    src: &'a str,
    root: Members<'a>,
    objects: [Option<Members<'a>>; CACHED.len()],
    /// `process.env` decoded (`None`: an entry that is not a string).
    env: Vec<Option<Cow<'a, str>>>,
    /// `annotations` decoded, the last of a repeated key only, values that are strings only.
    annotations: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    edits: Vec<Edit<'a>>,
}

/// A section being edited: its value now, and where it goes in the bytes.
struct Edit<'a> {
    /// Keys from the root down to the section.
    path: Vec<&'static str>,
    at: At<'a>,
    /// The section now ([`At::Replace`], [`At::Insert`]).
    value: Value,
    /// For [`At::Replace`]: the number of elements or members it was parsed with (a
    /// different number: changed, without comparing it with the old value).
    parsed_len: Option<usize>,
    /// For [`At::Append`]: the elements added.
    added: Vec<Entry>,
    /// For [`At::Append`] to an array in the bytes: what [`Same`] sees of each of its
    /// elements (computed once).
    seen: Option<(Same, Vec<Seen>)>,
    /// For [`At::Append`] to an array in the bytes: the text of each element, split out when
    /// a [`Seen`] without its key needs comparing.
    texts: Vec<&'a str>,
}

enum At<'a> {
    /// The section was in the document: its bytes are replaced.
    Replace(&'a str),
    /// The key was missing: the member is inserted at this offset in `src`, right after the
    /// parent's last member (`first`: the parent had none, no comma before it) or `{`.
    Insert { offset: usize, first: bool },
    /// Elements added to an array, none of it parsed into values. `raw`: the array in the
    /// bytes, which stays as written; the new elements go at `offset`, right after its last
    /// element (`first`: it had none) or `[`. `None`: the array is missing, and is inserted
    /// as [`At::Insert`] does, holding only the new elements.
    Append {
        raw: Option<&'a str>,
        offset: usize,
        first: bool,
    },
}

/// When an element is already in an array ([`Entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Same {
    /// An object whose member of this name is the same string.
    Member(&'static str),
    /// An equal JSON value.
    Value,
}

impl Same {
    /// Whether element `v` is the same as one whose key is `key` (see [`Entry`]).
    fn matches(self, v: &Value, key: &Value) -> bool {
        match self {
            Same::Member(k) => key
                .as_str()
                .is_some_and(|key| member(v, k).and_then(Value::as_str) == Some(key)),
            Same::Value => json_eq(v, key),
        }
    }

    /// The key of each element of the array `raw` as written, in one pass: its member's
    /// string (`null` when it has none), or its value.
    fn raw_keys(self, raw: &str) -> Result<Vec<Seen>, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(raw);
        let seen = match self {
            Same::Member(k) => MemberOfEach(k)
                .deserialize(&mut de)?
                .into_iter()
                .map(|key| Seen {
                    fp: fingerprint(&key),
                    key: Some(key),
                })
                .collect(),
            // Values are not built for this, only their fingerprints: most differ.
            Same::Value => FpOfEach
                .deserialize(&mut de)?
                .into_iter()
                .map(|fp| Seen { fp, key: None })
                .collect(),
        };
        de.end()?;
        Ok(seen)
    }
}

/// What [`Same`] sees of an element in the bytes: its key's [`fingerprint`], and the key
/// (`None`: not built; the element is decoded when the fingerprint matches).
struct Seen {
    fp: u64,
    key: Option<Value>,
}

/// An element to append with [`Document::append_unique`]: its JSON, and what tells whether
/// the array already has it.
#[derive(Debug, Clone)]
pub struct Entry {
    same: Same,
    key: Value,
    /// [`fingerprint`] of `key`.
    fp: u64,
    json: String,
}

impl Entry {
    /// `entry`, already there when an element is an object whose member `name` is the string
    /// `value` (which must be `entry`'s own): a device by path, a mount by destination.
    pub fn by_member(
        name: &'static str,
        value: &str,
        entry: &impl serde::Serialize,
    ) -> Result<Entry, String> {
        let key = Value::from(value);
        Ok(Entry {
            same: Same::Member(name),
            fp: fingerprint(&key),
            key,
            json: serde_json::to_string(entry).map_err(|e| e.to_string())?,
        })
    }

    /// `value`, already there when an element is an equal value: a cgroup rule, a gid.
    pub fn by_value(value: Value) -> Entry {
        Entry {
            same: Same::Value,
            json: value.to_string(),
            fp: fingerprint(&value),
            key: value,
        }
    }

    fn to_value(&self) -> Result<Value, String> {
        serde_json::from_str(&self.json).map_err(|e| e.to_string())
    }

    /// Whether `self` and `other` are the same element for `self`'s rule.
    fn same_as(&self, other: &Entry) -> bool {
        if self.same == other.same {
            self.fp == other.fp && json_eq(&self.key, &other.key)
        } else {
            other
                .to_value()
                .is_ok_and(|v| self.same.matches(&v, &self.key))
        }
    }
}

/// A section found on a read: in the bytes, or in a section already edited.
enum Found<'d, 'a> {
    Raw(&'a str),
    Edited(&'d Value),
    /// An array (in the bytes, or missing) and the elements appended to it.
    Appended(Option<&'a str>, &'d [Entry]),
}

impl<'a> Document<'a> {
    /// Parses spec bytes (the whole document is checked to be JSON) and checks the parts
    /// the shim reads have the right JSON types.
    pub fn parse(data: &'a [u8]) -> Result<Document<'a>, ParseError> {
        // serde_json's own error (with its line and column) for what is not UTF-8.
        let Ok(src) = std::str::from_utf8(data) else {
            let e = serde_json::from_slice::<IgnoredAny>(data)
                .err()
                .unwrap_or_else(|| serde::de::Error::custom("not UTF-8"));
            return Err(ParseError::Json(e));
        };
        if !src.trim_start_matches(JSON_WS).starts_with('{') {
            // Not JSON at all is reported as such before "not an object".
            serde_json::from_str::<IgnoredAny>(src).map_err(ParseError::Json)?;
            return Err(ParseError::Shape(
                "the document is not a JSON object".into(),
            ));
        }
        // The whole text is checked here, once; the top level's members are delimited in the
        // same pass, and those of the few objects the shim goes into after it.
        let bytes = src.as_bytes();
        let start = bytes.len() - src.trim_start_matches(JSON_WS).len();
        let top_level = |key: &str| CACHED.iter().any(|c| c.len() == 1 && key == c[0]);
        let (top, mut nested, end) = scan::members_nesting(src, start, &mut Vec::new(), |k| {
            top_level(&k[1..k.len() - 1])
        })
        .map_err(|e| ParseError::Json(invalid(src, e)))?;
        if scan::ws(bytes, end) != bytes.len() {
            return Err(ParseError::Json(invalid(src, scan::Invalid(end))));
        }
        let root = decoded(top).map_err(ParseError::Json)?;
        let mut doc = Document {
            src,
            root,
            objects: Default::default(),
            env: Vec::new(),
            annotations: Vec::new(),
            edits: Vec::new(),
        };
        for (i, path) in CACHED.iter().enumerate() {
            if let Some(raw) = doc.raw(path) {
                // Split with the top level when it was the last occurrence of its key.
                let same = nested
                    .iter()
                    .rposition(|(j, _)| doc.root[*j].1.as_ptr() == raw.as_ptr());
                doc.objects[i] = match same {
                    Some(j) => Some(decoded(nested.swap_remove(j).1).map_err(ParseError::Json)?),
                    None => members(raw).map_err(ParseError::Json)?,
                };
            }
        }
        doc.check_shape().map_err(ParseError::Shape)?;
        // Decoded now, so that a string that does not decode (a lone surrogate escape) in
        // what the shim reads is a parse error naming the file.
        if let Some(raw) = doc.raw(&["process", "env"]) {
            doc.env = strings(raw).map_err(ParseError::Json)?;
        }
        if let Some(raw) = doc.raw(&["annotations"]) {
            let all = members(raw).map_err(ParseError::Json)?.unwrap_or_default();
            // The last of a repeated key counts; found from the end with a set, as a spec can
            // hold thousands of annotations (a search per key was quadratic).
            let mut seen = std::collections::HashSet::with_capacity(all.len());
            let mut last = vec![false; all.len()];
            for (i, (k, _)) in all.iter().enumerate().rev() {
                last[i] = seen.insert(k.as_ref());
            }
            for (i, (k, v)) in all.iter().enumerate() {
                if !last[i] {
                    continue;
                }
                let Str(v) = serde_json::from_str(v).map_err(ParseError::Json)?;
                if let Some(v) = v {
                    doc.annotations.push((k.clone(), v));
                }
            }
        }
        Ok(doc)
    }

    /// [`Document::parse`] of the bytes [`read_bytes`] got from `path`; errors name the file.
    pub fn parse_file(path: &Path, data: &'a [u8]) -> Result<Document<'a>, SpecError> {
        Document::parse(data).map_err(|e| match e {
            ParseError::Json(source) => SpecError::Json {
                path: path.into(),
                source,
            },
            ParseError::Shape(msg) => SpecError::Shape {
                path: path.into(),
                msg,
            },
        })
    }

    fn check_shape(&self) -> Result<(), String> {
        const CHECKS: [(&[&str], u8, &str); 14] = [
            (&["process"], b'{', "an object"),
            (&["process", "env"], b'[', "an array of strings"),
            (&["process", "user"], b'{', "an object"),
            (&["process", "user", "additionalGids"], b'[', "an array"),
            (&["linux"], b'{', "an object"),
            (&["linux", "devices"], b'[', "an array"),
            (&["linux", "resources"], b'{', "an object"),
            (&["linux", "resources", "devices"], b'[', "an array"),
            (&["mounts"], b'[', "an array"),
            (&["hooks"], b'{', "an object"),
            (&["hooks", "prestart"], b'[', "an array"),
            (&["annotations"], b'{', "an object"),
            (&["root"], b'{', "an object"),
            (&["root", "path"], b'"', "a string"),
        ];
        for (path, first, what) in CHECKS {
            match self.raw(path) {
                Some(raw) if raw.as_bytes().first() != Some(&first) => {
                    return Err(format!("`{}` must be {what}", path.join("/")));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The section at `path` as written (the last of a repeated key at each level); `None`
    /// when it is missing or a parent is not an object.
    fn raw(&self, path: &[&str]) -> Option<&'a str> {
        let (key, parent) = path.split_last()?;
        if parent.is_empty() {
            return last(&self.root, key);
        }
        if let Some(i) = CACHED.iter().position(|c| *c == parent) {
            return last(self.objects[i].as_ref()?, key);
        }
        last(&members(self.raw(parent)?).ok()??, key)
    }

    /// The section at `path` as it is now: an edited one (or inside one) if any, else as
    /// written.
    fn find(&self, path: &[&str]) -> Option<Found<'_, 'a>> {
        if let Some(e) = self.edits.iter().find(|e| path.starts_with(&e.path)) {
            if let At::Append { raw, .. } = e.at {
                // An array: nothing below it has a key.
                return (path.len() == e.path.len()).then_some(Found::Appended(raw, &e.added));
            }
            let mut v = &e.value;
            for k in &path[e.path.len()..] {
                v = v.as_object()?.get(*k)?;
            }
            return Some(Found::Edited(v));
        }
        self.raw(path).map(Found::Raw)
    }

    /// The strings of the array at `path` (non-strings skipped); empty when missing.
    fn strings_at(&self, path: &[&str]) -> Vec<Cow<'_, str>> {
        match self.find(path) {
            Some(Found::Edited(v)) => v
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(Cow::Borrowed)
                        .collect()
                })
                .unwrap_or_default(),
            // Undecodable entries (lone surrogate escapes) count as not strings.
            Some(Found::Raw(raw)) => strings(raw)
                .unwrap_or_default()
                .into_iter()
                .flatten()
                .collect(),
            Some(Found::Appended(raw, added)) => {
                let old = raw.and_then(|r| strings(r).ok()).unwrap_or_default();
                let mut all: Vec<Cow<'_, str>> = old.into_iter().flatten().collect();
                let added = added.iter().filter_map(|e| e.to_value().ok());
                all.extend(added.filter_map(|v| Some(Cow::Owned(v.as_str()?.to_string()))));
                all
            }
            None => Vec::new(),
        }
    }

    /// The value of `name` in `process.env` as the container sees it: runc sets the entries
    /// in order, so the last one wins (`docker run -e NVIDIA_VISIBLE_DEVICES=0 --gpus all`
    /// writes both). Entries without `=` are skipped.
    pub fn env(&self, name: &str) -> Option<&str> {
        match self.find(&["process", "env"]) {
            Some(Found::Edited(v)) => {
                last_env(v.as_array()?.iter().filter_map(Value::as_str), name)
            }
            Some(Found::Appended(..)) => {
                // Not on any create path: process.env is only edited whole (CDI).
                None
            }
            _ => last_env(self.env.iter().flatten().map(|e| e.as_ref()), name),
        }
    }

    /// Docker sets `CAP_SYS_ADMIN` in the bounding set only for `--privileged` (and NVIDIA's
    /// toolkit uses the same test).
    pub fn is_privileged(&self) -> bool {
        self.strings_at(&["process", "capabilities", "bounding"])
            .iter()
            .any(|c| c == "CAP_SYS_ADMIN")
    }

    /// Destinations of mounts in the spec (the volume-mount device list strategy reads them).
    pub fn mount_destinations(&self) -> Vec<Cow<'_, str>> {
        fn edited(v: &Value) -> Vec<Cow<'_, str>> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("destination")?.as_str())
                .map(Cow::Borrowed)
                .collect()
        }
        let raw = |raw: &'a str| -> Vec<Cow<'a, str>> {
            elements(raw)
                .into_iter()
                .filter_map(|m| string(last(&members(m).ok()??, "destination")?))
                .collect()
        };
        match self.find(&["mounts"]) {
            Some(Found::Edited(v)) => edited(v),
            Some(Found::Raw(r)) => raw(r),
            Some(Found::Appended(r, added)) => {
                let mut all = r.map(raw).unwrap_or_default();
                let added = Value::Array(added.iter().filter_map(|e| e.to_value().ok()).collect());
                all.extend(
                    edited(&added)
                        .into_iter()
                        .map(|d| Cow::Owned(d.into_owned())),
                );
                all
            }
            None => Vec::new(),
        }
    }

    /// The string-valued annotations (the last of a repeated key).
    pub fn annotations(&self) -> &[(Cow<'a, str>, Cow<'a, str>)] {
        &self.annotations
    }

    /// Whether `hooks.prestart` has docker's `--gpus` hook (a path named [`DOCKER_GPU_HOOK`]).
    fn has_docker_gpu_hook(&self) -> bool {
        let is_gpu_hook = |path: Option<&str>| {
            Path::new(path.unwrap_or_default())
                .file_name()
                .is_some_and(|n| n == DOCKER_GPU_HOOK)
        };
        match self.find(&["hooks", "prestart"]) {
            Some(Found::Edited(v)) => v.as_array().is_some_and(|hooks| {
                hooks
                    .iter()
                    .any(|h| is_gpu_hook(h.get("path").and_then(Value::as_str)))
            }),
            Some(Found::Raw(raw)) => elements(raw).into_iter().any(|h| {
                let path = members(h)
                    .ok()
                    .flatten()
                    .and_then(|m| string(last(&m, "path")?));
                is_gpu_hook(path.as_deref())
            }),
            Some(Found::Appended(..)) | None => false,
        }
    }

    /// Removes docker's `--gpus` prestart hook; true when one was there.
    pub fn remove_docker_gpu_hook(&mut self) -> bool {
        if !self.has_docker_gpu_hook() {
            return false;
        }
        let Ok(Value::Object(hooks)) = self.section_mut(&["hooks"], || Value::Object(Map::new()))
        else {
            return false;
        };
        let Some(prestart) = hooks.get_mut("prestart").and_then(Value::as_array_mut) else {
            return false;
        };
        let before = prestart.len();
        prestart.retain(|h| {
            let path = h.get("path").and_then(Value::as_str).unwrap_or_default();
            Path::new(path)
                .file_name()
                .is_none_or(|n| n != DOCKER_GPU_HOOK)
        });
        let removed = prestart.len() != before;
        if prestart.is_empty() && removed {
            hooks.remove("prestart");
        }
        removed
    }

    /// The container's rootfs on the host: `root.path`, relative to the bundle when relative.
    pub fn rootfs(&self, bundle: &Path) -> Option<PathBuf> {
        let path = match self.find(&["root", "path"])? {
            Found::Edited(v) => Cow::Borrowed(v.as_str()?),
            Found::Raw(raw) => string(raw)?,
            Found::Appended(..) => return None,
        };
        let p = Path::new(path.as_ref());
        Some(if p.is_absolute() {
            p.to_path_buf()
        } else {
            bundle.join(p)
        })
    }

    /// The section at `path`, to edit: parsed from the document on first use, created with
    /// `empty()` when missing (and its missing parents as objects; `process.user` as
    /// `{"uid": 0, "gid": 0}`, as runc needs both). Every later read and [`to_bytes`] see the
    /// edit.
    ///
    /// [`to_bytes`]: Document::to_bytes
    pub fn section_mut(
        &mut self,
        path: &[&'static str],
        empty: fn() -> Value,
    ) -> Result<&mut Value, String> {
        // Already edited, or inside a section that is.
        if let Some(i) = self.edits.iter().position(|e| path.starts_with(&e.path)) {
            let e = &mut self.edits[i];
            if let At::Append { raw, offset, first } = e.at {
                if e.path.len() != path.len() {
                    return Err(format!("`{}` is inside an array", path.join(".")));
                }
                // Appended to, now edited as a whole: the old elements, then the new.
                let err = |err: String| format!("`{}`: {err}", path.join("."));
                let mut all = match raw {
                    Some(raw) => serde_json::from_str(raw).map_err(|e| err(e.to_string()))?,
                    None => Vec::new(),
                };
                for a in e.added.drain(..) {
                    all.push(a.to_value().map_err(err)?);
                }
                e.value = Value::Array(all);
                e.at = match raw {
                    Some(raw) => At::Replace(raw),
                    None => At::Insert { offset, first },
                };
                e.parsed_len = None;
                e.seen = None;
                e.texts = Vec::new();
            }
            let depth = e.path.len();
            return descend(&mut e.value, path, depth, empty);
        }
        if self.edits.iter().any(|e| e.path.starts_with(path)) {
            return Err(format!(
                "`{}` cannot be edited whole after a part of it",
                path.join(".")
            ));
        }
        if path.is_empty() {
            return Err("an empty section path".into());
        }
        let mut parent: Option<&'a str> = None;
        let mut parent_members: Cow<'_, Members<'a>> = Cow::Borrowed(&self.root);
        for (depth, key) in path.iter().enumerate() {
            let here = &path[..=depth];
            match last(&parent_members, key) {
                Some(raw) if depth + 1 == path.len() => {
                    let value: Value = serde_json::from_str(raw)
                        .map_err(|e| format!("`{}`: {e}", path.join(".")))?;
                    let parsed_len = len(&value);
                    self.edits.push(Edit {
                        path: path.to_vec(),
                        at: At::Replace(raw),
                        value,
                        parsed_len,
                        added: Vec::new(),
                        seen: None,
                        texts: Vec::new(),
                    });
                    break;
                }
                Some(raw) => {
                    let cached = CACHED.iter().position(|c| *c == here);
                    parent_members =
                        match cached.and_then(|i| self.objects[i].as_ref()) {
                            Some(m) => Cow::Borrowed(m),
                            None => Cow::Owned(members(raw).ok().flatten().ok_or_else(|| {
                                format!("`{}` must be an object", here.join("."))
                            })?),
                        };
                    parent = Some(raw);
                }
                None => {
                    let at = match (parent_members.last(), parent) {
                        (Some((_, v)), _) => At::Insert {
                            offset: self.offset(v) + v.len(),
                            first: false,
                        },
                        (None, Some(p)) => At::Insert {
                            offset: self.offset(p) + 1,
                            first: true,
                        },
                        (None, None) => At::Insert {
                            offset: self.src.find('{').unwrap_or(0) + 1,
                            first: true,
                        },
                    };
                    let value = if depth + 1 == path.len() {
                        empty()
                    } else {
                        new_object(here)
                    };
                    self.edits.push(Edit {
                        path: here.to_vec(),
                        at,
                        value,
                        parsed_len: None,
                        added: Vec::new(),
                        seen: None,
                        texts: Vec::new(),
                    });
                    break;
                }
            }
        }
        let Some(e) = self.edits.last_mut() else {
            return Err(format!("`{}`: not found", path.join(".")));
        };
        let depth = e.path.len();
        descend(&mut e.value, path, depth, empty)
    }

    /// [`section_mut`](Document::section_mut) for an array section.
    pub fn array_mut(&mut self, path: &[&'static str]) -> Result<&mut Vec<Value>, String> {
        self.section_mut(path, || Value::Array(Vec::new()))?
            .as_array_mut()
            .ok_or_else(|| format!("`{}` must be an array", path.join(".")))
    }

    /// Appends `entry` to the array at `path` (created when missing, see
    /// [`section_mut`](Document::section_mut)) unless an element there is the same; true
    /// when appended. Nothing of the array is parsed into values for this: its elements stay
    /// as written and the new ones are spliced in after them.
    pub fn append_unique(&mut self, path: &[&'static str], entry: Entry) -> Result<bool, String> {
        let not_array = || format!("`{}` must be an array", path.join("."));
        let i = match self.edits.iter().position(|e| path.starts_with(&e.path)) {
            Some(i) if matches!(self.edits[i].at, At::Append { .. }) => {
                if self.edits[i].path.len() != path.len() {
                    return Err(format!("`{}` is inside an array", path.join(".")));
                }
                i
            }
            Some(_) => return self.push_value(path, entry),
            None => {
                let mut seen = None;
                let at = match self.raw(path) {
                    Some(raw) if raw.starts_with('[') => {
                        let keys = entry
                            .same
                            .raw_keys(raw)
                            .map_err(|e| format!("`{}`: {e}", path.join(".")))?;
                        // After the last element: the text before `]`, less whitespace.
                        let inside = raw[..raw.len() - 1].trim_end_matches(JSON_WS);
                        let (offset, first) = (self.offset(inside) + inside.len(), keys.is_empty());
                        seen = Some((entry.same, keys));
                        At::Append {
                            raw: Some(raw),
                            offset,
                            first,
                        }
                    }
                    Some(_) => return Err(not_array()),
                    None => match self.insertion_point(&path[..path.len().saturating_sub(1)]) {
                        Some((offset, first)) => At::Append {
                            raw: None,
                            offset,
                            first,
                        },
                        // A parent is missing too: created as values.
                        None => return self.push_value(path, entry),
                    },
                };
                self.edits.push(Edit {
                    path: path.to_vec(),
                    at,
                    value: Value::Null,
                    parsed_len: None,
                    added: Vec::new(),
                    seen,
                    texts: Vec::new(),
                });
                self.edits.len() - 1
            }
        };
        let e = &mut self.edits[i];
        if let At::Append { raw: Some(raw), .. } = e.at {
            if e.seen.as_ref().is_none_or(|(by, _)| *by != entry.same) {
                let seen = entry
                    .same
                    .raw_keys(raw)
                    .map_err(|err| format!("`{}`: {err}", path.join(".")))?;
                e.seen = Some((entry.same, seen));
            }
        }
        let Edit {
            at,
            seen,
            texts,
            added,
            ..
        } = e;
        let mut already = false;
        for (i, s) in seen.iter().flat_map(|(_, seen)| seen).enumerate() {
            if s.fp != entry.fp {
                continue;
            }
            already = match &s.key {
                Some(key) => json_eq(key, &entry.key),
                None => {
                    if let (true, At::Append { raw: Some(raw), .. }) = (texts.is_empty(), &at) {
                        *texts = elements(raw);
                    }
                    // Written as this editor writes it (a second create): equal without
                    // decoding.
                    texts.get(i).is_some_and(|t| {
                        *t == entry.json
                            || serde_json::from_str(t).is_ok_and(|v: Value| json_eq(&v, &entry.key))
                    })
                }
            };
            if already {
                break;
            }
        }
        if already || added.iter().any(|a| entry.same_as(a)) {
            return Ok(false);
        }
        e.added.push(entry);
        Ok(true)
    }

    /// [`append_unique`](Document::append_unique) into a section edited as a value.
    fn push_value(&mut self, path: &[&'static str], entry: Entry) -> Result<bool, String> {
        let value = entry.to_value()?;
        let array = self.array_mut(path)?;
        if array.iter().any(|v| entry.same.matches(v, &entry.key)) {
            return Ok(false);
        }
        array.push(value);
        Ok(true)
    }

    /// Where a new member of the object at `parent` goes (see [`At::Insert`]); `None` when
    /// that object is not in the bytes.
    fn insertion_point(&self, parent: &[&str]) -> Option<(usize, bool)> {
        let (members, open) = if parent.is_empty() {
            let open = self.src.find('{')?;
            (Cow::Borrowed(&self.root), open)
        } else {
            let raw = self.raw(parent)?;
            let members = match CACHED.iter().position(|c| *c == parent) {
                Some(i) => Cow::Borrowed(self.objects[i].as_ref()?),
                None => Cow::Owned(members(raw).ok()??),
            };
            (members, self.offset(raw))
        };
        Some(match members.last() {
            Some((_, v)) => (self.offset(v) + v.len(), false),
            None => (open + 1, true),
        })
    }

    /// Where `raw` starts in `src` (see the invariant on [`Document`]).
    fn offset(&self, raw: &str) -> usize {
        raw.as_ptr() as usize - self.src.as_ptr() as usize
    }

    /// The document with every edited section spliced in: a changed section replaces the
    /// bytes of the old one, a new one is inserted into its parent, everything else is the
    /// input byte for byte. With no change, exactly the input.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut order: Vec<(usize, &Edit<'a>)> = self
            .edits
            .iter()
            .map(|e| match e.at {
                At::Replace(raw) => (self.offset(raw), e),
                At::Insert { offset, .. } | At::Append { offset, .. } => (offset, e),
            })
            .collect();
        // Stable: members inserted at one place keep the order they were created in.
        order.sort_by_key(|(offset, _)| *offset);
        let mut out = Vec::with_capacity(self.src.len() + 4096);
        let mut copied = 0;
        let mut inserted_at = None;
        for (offset, e) in order {
            out.extend_from_slice(&self.src.as_bytes()[copied..offset]);
            copied = offset;
            match e.at {
                At::Replace(raw) => {
                    let mark = out.len();
                    write_json(&mut out, &e.value);
                    let old = raw.as_bytes();
                    // Not changed, only written differently (pretty-printed, escaped): keep
                    // the old bytes, so that an unchanged document is the input exactly.
                    if out[mark..] != *old
                        && len(&e.value) == e.parsed_len
                        && serde_json::from_str::<Value>(raw).is_ok_and(|v| v == e.value)
                    {
                        out.truncate(mark);
                    } else {
                        copied += old.len();
                    }
                }
                At::Insert { first, .. } => {
                    if !first || inserted_at == Some(offset) {
                        out.push(b',');
                    }
                    let key = e.path.last().copied().unwrap_or_default();
                    write_json(&mut out, &key);
                    out.push(b':');
                    write_json(&mut out, &e.value);
                    inserted_at = Some(offset);
                }
                At::Append {
                    raw: Some(_),
                    first,
                    ..
                } => {
                    for (i, a) in e.added.iter().enumerate() {
                        if !first || i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(a.json.as_bytes());
                    }
                }
                At::Append {
                    raw: None, first, ..
                } => {
                    if !first || inserted_at == Some(offset) {
                        out.push(b',');
                    }
                    let key = e.path.last().copied().unwrap_or_default();
                    write_json(&mut out, &key);
                    out.extend_from_slice(b":[");
                    for (i, a) in e.added.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(a.json.as_bytes());
                    }
                    out.push(b']');
                    inserted_at = Some(offset);
                }
            }
        }
        out.extend_from_slice(&self.src.as_bytes()[copied..]);
        out
    }
}

/// Goes from the edited value at `path[..depth]` down to `path`, creating what is missing.
fn descend<'v>(
    mut v: &'v mut Value,
    path: &[&'static str],
    depth: usize,
    empty: fn() -> Value,
) -> Result<&'v mut Value, String> {
    for d in depth..path.len() {
        let obj = v
            .as_object_mut()
            .ok_or_else(|| format!("`{}` must be an object", path[..d].join(".")))?;
        v = obj.entry(path[d]).or_insert_with(|| {
            if d + 1 == path.len() {
                empty()
            } else {
                new_object(&path[..=d])
            }
        });
    }
    Ok(v)
}

/// `a == b`, cheaper for objects with their keys in the same order (as the entries built
/// here always are): no hash lookups then, and the first differing value ends it (a key is
/// in an object once, so the same key with another value means unequal objects).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() {
                return false;
            }
            for ((kx, vx), (ky, vy)) in x.iter().zip(y) {
                if kx != ky {
                    return a == b;
                }
                if !json_eq(vx, vy) {
                    return false;
                }
            }
            true
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        _ => a == b,
    }
}

/// Equal values have equal fingerprints (object members in any order), so most unequal
/// elements are told apart without comparing them: an array of cgroup rules is compared
/// with each new rule. [`Fp`] gives the same of a value as written.
fn fingerprint(v: &Value) -> u64 {
    match v {
        Value::Null => 1,
        Value::Bool(b) => 2 + u64::from(*b),
        // The variants serde_json's number equality tells apart.
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => fp_u64(u),
            (None, Some(i)) => fp_i64(i),
            (None, None) => fp_f64(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => fp_str(s),
        Value::Array(a) => fp_array(a.iter().map(fingerprint)),
        Value::Object(o) => fp_object(o.iter().map(|(k, v)| (k.as_str(), fingerprint(v)))),
    }
}

fn mix(h: u64) -> u64 {
    let h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

fn fp_text(tag: u64, s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325 ^ tag, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn fp_u64(u: u64) -> u64 {
    mix(u ^ 3)
}

/// A negative integer (serde_json keeps a non-negative one as `u64`).
fn fp_i64(i: i64) -> u64 {
    if i >= 0 {
        fp_u64(i as u64)
    } else {
        mix((i as u64) ^ 4)
    }
}

fn fp_f64(f: f64) -> u64 {
    // 0.0 == -0.0.
    mix(if f == 0.0 { 5 } else { f.to_bits() ^ 6 })
}

fn fp_str(s: &str) -> u64 {
    fp_text(7, s)
}

fn fp_array(elements: impl Iterator<Item = u64>) -> u64 {
    elements.fold(8, |h, fp| mix(h.rotate_left(5) ^ fp))
}

/// Of members with distinct keys, in any order.
fn fp_object<'k>(members: impl Iterator<Item = (&'k str, u64)>) -> u64 {
    let (mut n, mut sum) = (0u64, 0u64);
    for (k, fp) in members {
        n += 1;
        sum = sum.wrapping_add(mix(fp_text(10, k) ^ fp.rotate_left(1)));
    }
    mix(sum ^ (9 + n))
}

/// [`fingerprint`] of each element of an array as written, without building values.
struct FpOfEach;

impl<'de> DeserializeSeed<'de> for FpOfEach {
    type Value = Vec<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for FpOfEach {
    type Value = Vec<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let mut out = Vec::new();
        while let Some(fp) = seq.next_element_seed(Fp)? {
            out.push(fp);
        }
        Ok(out)
    }
}

/// [`fingerprint`] of a value as written.
struct Fp;

impl<'de> DeserializeSeed<'de> for Fp {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Fp {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<u64, E> {
        Ok(1)
    }
    fn visit_bool<E>(self, b: bool) -> Result<u64, E> {
        Ok(2 + u64::from(b))
    }
    fn visit_u64<E>(self, u: u64) -> Result<u64, E> {
        Ok(fp_u64(u))
    }
    fn visit_i64<E>(self, i: i64) -> Result<u64, E> {
        Ok(fp_i64(i))
    }
    fn visit_f64<E>(self, f: f64) -> Result<u64, E> {
        Ok(fp_f64(f))
    }
    fn visit_str<E>(self, s: &str) -> Result<u64, E> {
        Ok(fp_str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut fps = Vec::new();
        while let Some(fp) = seq.next_element_seed(Fp)? {
            fps.push(fp);
        }
        Ok(fp_array(fps.into_iter()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut members: Vec<(Cow<'de, str>, u64)> = Vec::new();
        while let Some(Key(k)) = map.next_key()? {
            let fp = map.next_value_seed(Fp)?;
            // A repeated key: the last value, as a `Value` keeps.
            match members.iter_mut().find(|(seen, _)| *seen == k) {
                Some(m) => m.1 = fp,
                None => members.push((k, fp)),
            }
        }
        Ok(fp_object(members.iter().map(|(k, fp)| (k.as_ref(), *fp))))
    }
}

/// The member `key` of an object, found without hashing (the objects compared are small).
fn member<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.as_object()?
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// The number of elements or members.
fn len(v: &Value) -> Option<usize> {
    match v {
        Value::Array(a) => Some(a.len()),
        Value::Object(o) => Some(o.len()),
        _ => None,
    }
}

/// A parent section created for an edit below it.
fn new_object(path: &[&str]) -> Value {
    if path == ["process", "user"] {
        serde_json::json!({"uid": 0, "gid": 0})
    } else {
        Value::Object(Map::new())
    }
}

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Serializing a Value or a str into a Vec cannot fail: its keys are strings and the Vec
    // grows as needed.
    let _ = serde_json::to_writer(out, v);
}

fn last_env<'s>(entries: impl DoubleEndedIterator<Item = &'s str>, name: &str) -> Option<&'s str> {
    entries
        .rev()
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

/// The last member named `key`.
fn last<'a>(members: &Members<'a>, key: &str) -> Option<&'a str> {
    members
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
}

/// The members of `raw` when it is an object (`raw`: a value in the checked document, so
/// only a key that does not decode, a lone surrogate escape, is an error).
fn members(raw: &str) -> Result<Option<Members<'_>>, serde_json::Error> {
    if !raw.starts_with('{') {
        return Ok(None);
    }
    let (all, _) = scan::members(raw, 0, &mut Vec::new()).map_err(|e| invalid(raw, e))?;
    decoded(all).map(Some)
}

/// Members as the scanner delimits them, their keys decoded.
fn decoded(all: Vec<scan::Member<'_>>) -> Result<Members<'_>, serde_json::Error> {
    all.into_iter().map(|(k, v)| Ok((key(k)?, v))).collect()
}

/// A key (its text, quotes included) unescaped; borrowed when it has no escapes.
fn key(raw: &str) -> Result<Cow<'_, str>, serde_json::Error> {
    let inner = &raw[1..raw.len() - 1];
    if inner.contains('\\') {
        serde_json::from_str(raw).map(Cow::Owned)
    } else {
        Ok(Cow::Borrowed(inner))
    }
}

/// serde_json's error for `text`, where the scanner stopped at `at` (serde_json's message
/// has the line and column).
fn invalid(text: &str, at: scan::Invalid) -> serde_json::Error {
    serde_json::from_str::<IgnoredAny>(text)
        .err()
        .unwrap_or_else(|| serde_json::Error::custom(format!("not JSON at byte {}", at.0)))
}

/// The elements of `raw` when it is an array, else none.
fn elements(raw: &str) -> Vec<&str> {
    if !raw.starts_with('[') {
        return Vec::new();
    }
    scan::elements(raw, 0, &mut Vec::new()).map_or_else(|_| Vec::new(), |(all, _)| all)
}

/// The elements of an array decoded when strings.
fn strings(raw: &str) -> Result<Vec<Option<Cow<'_, str>>>, serde_json::Error> {
    if !raw.starts_with('[') {
        return Ok(Vec::new());
    }
    let all: Vec<Str<'_>> = serde_json::from_str(raw)?;
    Ok(all.into_iter().map(|s| s.0).collect())
}

/// `raw` decoded when it is a string that decodes.
fn string(raw: &str) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Str<'_>>(raw).ok()?.0
}

/// JSON's whitespace.
const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// Of each element of an array: the string of its member of this name (the last when
/// repeated), `null` when it has none or is not an object.
struct MemberOfEach(&'static str);

impl<'de> DeserializeSeed<'de> for MemberOfEach {
    type Value = Vec<Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Value>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for MemberOfEach {
    type Value = Vec<Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(MemberOf(self.0))? {
            out.push(v);
        }
        Ok(out)
    }
}

/// [`MemberOfEach`] of one element.
struct MemberOf(&'static str);

impl<'de> DeserializeSeed<'de> for MemberOf {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MemberOf {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut found = Value::Null;
        while let Some(Key(k)) = map.next_key()? {
            if k == self.0 {
                let Str(s) = map.next_value()?;
                found = s.map_or(Value::Null, |s| Value::from(s.as_ref()));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// An object key, borrowed from the bytes unless it has escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor).and_then(|s| {
            s.0.map(Key)
                .ok_or_else(|| serde::de::Error::custom("a key that is not a string"))
        })
    }
}

/// A value that is a string (borrowed unless it has escapes), or `None` for any other value.
struct Str<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrVisitor)
    }
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Str<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Str<'de>, E> {
        Ok(Str(Some(Cow::Borrowed(s))))
    }
    fn visit_str<E>(self, s: &str) -> Result<Str<'de>, E> {
        Ok(Str(Some(Cow::Owned(s.to_string()))))
    }
    fn visit_string<E>(self, s: String) -> Result<Str<'de>, E> {
        Ok(Str(Some(Cow::Owned(s))))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Str<'de>, E> {
        Ok(Str(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Str<'de>, E> {
        Ok(Str(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Str<'de>, E> {
        Ok(Str(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Str<'de>, E> {
        Ok(Str(None))
    }
    fn visit_unit<E>(self) -> Result<Str<'de>, E> {
        Ok(Str(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Str<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Str(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Str<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Str(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_eq_is_value_equality() {
        let pairs = [
            (
                json!({"a": 1, "b": [1, {"c": 2}]}),
                json!({"a": 1, "b": [1, {"c": 2}]}),
            ),
            (json!({"a": 1, "b": 2}), json!({"b": 2, "a": 1})),
            (json!({"a": 1, "b": 2}), json!({"b": 1, "a": 2})),
            (json!({"a": 1, "b": 2}), json!({"a": 1, "c": 2})),
            (json!({"a": 1}), json!({"a": 1.0})),
            (json!([1, 2]), json!([2, 1])),
            (
                json!({"a": {"x": 1, "y": 2}}),
                json!({"a": {"y": 2, "x": 1}}),
            ),
        ];
        for (a, b) in pairs {
            assert_eq!(json_eq(&a, &b), a == b, "{a} {b}");
            if a == b {
                assert_eq!(fingerprint(&a), fingerprint(&b), "{a} {b}");
            }
        }
        let zero: Value = serde_json::from_str("0.0").unwrap();
        let minus_zero: Value = serde_json::from_str("-0.0").unwrap();
        assert_eq!(zero, minus_zero);
        assert_eq!(fingerprint(&zero), fingerprint(&minus_zero));
        // Told apart: what differs in the rules compared in practice.
        let rule = |minor: u64| json!({"allow": true, "type": "c", "major": 195, "minor": minor, "access": "rwm"});
        assert_ne!(fingerprint(&rule(1)), fingerprint(&rule(2)));
        assert_ne!(fingerprint(&json!(1)), fingerprint(&json!(1.0)));
        // Of the text, without building the value: the same as of the value.
        for text in [
            "null",
            "true",
            "[1, -1, 1.5, -0.0, 0.0, 18446744073709551615, -9223372036854775808, 1e300]",
            r#"{"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"}"#,
            r#"{"b": [1, {"c": "\u0041"}], "a": {}, "a": {"x": [true, null]}}"#,
            r#"["\ud83d\ude00", "é", ""]"#,
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            let mut de = serde_json::Deserializer::from_str(text);
            assert_eq!(
                Fp.deserialize(&mut de).unwrap(),
                fingerprint(&value),
                "{text}"
            );
        }
    }
}
