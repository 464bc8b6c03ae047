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

use serde::de::{Deserialize, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::checked;
use super::entry::{Entry, Same};
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
    /// For [`At::Append`] to an array in the bytes: its elements as written, with what
    /// [`Same`] sees of each (computed once).
    seen: Option<(Same, Vec<Seen<'a>>)>,
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

/// An element of an array in the bytes, and what [`Same`] sees of it.
struct Seen<'a> {
    text: &'a str,
    /// For [`Same::Member`]: the literal of the element's string member of that name.
    key: Option<&'a str>,
    /// Whether that literal has no escapes.
    key_plain: bool,
    /// For [`Same::Value`]: the element's fingerprint.
    fp: u64,
}

impl<'a> Seen<'a> {
    /// Each element of the array `raw` (in the bytes, so checked JSON), as `same` sees it.
    fn all(same: Same, raw: &'a str) -> Vec<Seen<'a>> {
        match same {
            Same::Member(name) => checked::elements_with_member(raw, name)
                .into_iter()
                .map(|(text, key)| Seen {
                    text,
                    key,
                    key_plain: key.is_some_and(checked::is_plain),
                    fp: 0,
                })
                .collect(),
            Same::Value => {
                let mut fps = checked::Fingerprints::default();
                checked::elements(raw)
                    .map(|text| Seen {
                        text,
                        key: None,
                        key_plain: false,
                        fp: fps.of(text),
                    })
                    .collect()
            }
        }
    }

    /// Whether `entry` is the same as this element.
    fn is(&self, entry: &Entry) -> bool {
        match entry.same {
            Same::Member(_) => self.key.is_some_and(|k| {
                if self.key_plain && entry.key_plain {
                    k == entry.key_literal()
                } else {
                    checked::same_string(k, entry.key_literal())
                }
            }),
            Same::Value => self.fp == entry.fp && entry.equal_value(self.text),
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
        // Split in the same pass: the top-level objects the shim goes into, and annotations
        // (read whole: a spec can hold thousands).
        let split =
            |key: &str| key == "annotations" || CACHED.iter().any(|c| c.len() == 1 && key == c[0]);
        let (top, mut nested, end) =
            scan::members_nesting(src, start, |k| split(&k[1..k.len() - 1]))
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
        // The members of `raw`: split with the top level when it was the last occurrence of
        // its key, else now.
        let mut members_of = |raw: &'a str| {
            let same = nested
                .iter()
                .rposition(|(j, _)| doc.root[*j].1.as_ptr() == raw.as_ptr());
            match same {
                Some(j) => decoded(nested.swap_remove(j).1).map(Some),
                None => members(raw),
            }
            .map_err(ParseError::Json)
        };
        for (i, path) in CACHED.iter().enumerate() {
            if let Some(raw) = doc.raw(path) {
                doc.objects[i] = members_of(raw)?;
            }
        }
        doc.check_shape().map_err(ParseError::Shape)?;
        // Decoded now, so that a string that does not decode (a lone surrogate escape) in
        // what the shim reads is a parse error naming the file.
        if let Some(raw) = doc.raw(&["process", "env"]) {
            doc.env = strings(raw).map_err(ParseError::Json)?;
        }
        if let Some(raw) = doc.raw(&["annotations"]) {
            let all = members_of(raw)?.unwrap_or_default();
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

    /// Every `NAME=value` entry of `process.env` in order (a name may repeat: the last counts),
    /// for checks that look at a family of names (`NVIDIA_REQUIRE_*`).
    pub fn env_entries(&self) -> Vec<(&str, &str)> {
        fn split(e: &str) -> Option<(&str, &str)> {
            e.split_once('=')
        }
        match self.find(&["process", "env"]) {
            Some(Found::Edited(v)) => v
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .filter_map(split)
                        .collect()
                })
                .unwrap_or_default(),
            Some(Found::Appended(..)) => Vec::new(),
            _ => self
                .env
                .iter()
                .flatten()
                .filter_map(|e| split(e.as_ref()))
                .collect(),
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
            checked::elements(raw)
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

    /// The spec's mounts as JSON values (an entry that does not decode is left out: it then
    /// counts for nothing), for the device-list mounts (`request::device_list_from_mounts`).
    pub fn mounts(&self) -> Vec<Value> {
        let raw = |raw: &str| -> Vec<Value> {
            checked::elements(raw)
                .filter_map(|m| serde_json::from_str(m).ok())
                .collect()
        };
        match self.find(&["mounts"]) {
            Some(Found::Edited(v)) => v.as_array().cloned().unwrap_or_default(),
            Some(Found::Raw(r)) => raw(r),
            Some(Found::Appended(r, added)) => {
                let mut all = r.map(raw).unwrap_or_default();
                all.extend(added.iter().filter_map(|e| e.to_value().ok()));
                all
            }
            None => Vec::new(),
        }
    }

    /// The string-valued annotations (the last of a repeated key).
    pub fn annotations(&self) -> &[(Cow<'a, str>, Cow<'a, str>)] {
        &self.annotations
    }

    /// Whether `hooks.prestart` has docker's `--gpus` hook (a path named [`DOCKER_GPU_HOOK`]):
    /// `None` when an entry does not decode, so it may be the hook.
    fn has_docker_gpu_hook(&self) -> Option<bool> {
        let is_gpu_hook = |path: Option<&str>| {
            Path::new(path.unwrap_or_default())
                .file_name()
                .is_some_and(|n| n == DOCKER_GPU_HOOK)
        };
        match self.find(&["hooks", "prestart"]) {
            Some(Found::Edited(v)) => Some(v.as_array().is_some_and(|hooks| {
                hooks
                    .iter()
                    .any(|h| is_gpu_hook(h.get("path").and_then(Value::as_str)))
            })),
            Some(Found::Raw(raw)) => {
                let mut found = Some(false);
                for h in checked::elements(raw) {
                    let Ok(Some(m)) = members(h) else {
                        found = None;
                        continue;
                    };
                    match last(&m, "path").map(|p| string(p).ok_or(())) {
                        Some(Ok(p)) if is_gpu_hook(Some(&p)) => return Some(true),
                        Some(Err(())) => found = None,
                        _ => {}
                    }
                }
                found
            }
            Some(Found::Appended(..)) | None => Some(false),
        }
    }

    /// Removes docker's `--gpus` prestart hook; true when one was there. An error when the
    /// hooks cannot be read well enough to be sure it is gone (issue 14, class 8): the hook
    /// would give the container devices past this runtime's checks, so it is never left in
    /// place because another field of the section did not decode.
    pub fn remove_docker_gpu_hook(&mut self) -> Result<bool, String> {
        let sure = self.has_docker_gpu_hook();
        if sure == Some(false) {
            return Ok(false);
        }
        let cannot = |why: String| {
            format!("hooks.prestart: cannot remove docker's --gpus hook ({DOCKER_GPU_HOOK}): {why}")
        };
        let hooks = match self.section_mut(&["hooks"], || Value::Object(Map::new())) {
            Ok(Value::Object(hooks)) => hooks,
            Ok(_) => return Err(cannot("`hooks` is not an object".into())),
            Err(e) => return Err(cannot(e)),
        };
        let Some(prestart) = hooks.get_mut("prestart").and_then(Value::as_array_mut) else {
            return Err(cannot("`prestart` is not an array".into()));
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
        Ok(removed)
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
                let at = match self.raw(path) {
                    Some(raw) if raw.starts_with('[') => {
                        // After the last element: the text before `]`, less whitespace.
                        let inside = raw[..raw.len() - 1].trim_end_matches(JSON_WS);
                        At::Append {
                            raw: Some(raw),
                            offset: self.offset(inside) + inside.len(),
                            first: inside == "[",
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
                    seen: None,
                });
                self.edits.len() - 1
            }
        };
        let e = &mut self.edits[i];
        if let At::Append { raw: Some(raw), .. } = e.at {
            if e.seen.as_ref().is_none_or(|(by, _)| *by != entry.same) {
                e.seen = Some((entry.same, Seen::all(entry.same, raw)));
            }
        }
        let there = |seen: &[Seen<'_>]| seen.iter().any(|s| s.is(&entry));
        if e.seen.as_ref().is_some_and(|(_, seen)| there(seen))
            || e.added.iter().any(|a| entry.same_as(a))
        {
            return Ok(false);
        }
        e.added.push(entry);
        Ok(true)
    }

    /// [`append_unique`](Document::append_unique) into a section edited as a value.
    fn push_value(&mut self, path: &[&'static str], entry: Entry) -> Result<bool, String> {
        let value = entry.to_value()?;
        let array = self.array_mut(path)?;
        if array.iter().any(|v| entry.matches_value(v)) {
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
        // The sections edited as values are serialized first, so that the output's size is
        // known and it is allocated once, at its size.
        let values: Vec<Option<Vec<u8>>> = order.iter().map(|(_, e)| value_text(e)).collect();
        let mut size = 0;
        self.splice(&order, &values, |b| size += b.len());
        let mut out = Vec::with_capacity(size);
        self.splice(&order, &values, |b| out.extend_from_slice(b));
        out
    }

    /// Passes the pieces of [`to_bytes`](Document::to_bytes)'s output to `put`, in order:
    /// `order` is the edits sorted by offset, `values` what [`value_text`] gave for each.
    fn splice(
        &self,
        order: &[(usize, &Edit<'a>)],
        values: &[Option<Vec<u8>>],
        mut put: impl FnMut(&[u8]),
    ) {
        let src = self.src.as_bytes();
        let mut copied = 0;
        let mut inserted_at = None;
        for ((offset, e), value) in order.iter().zip(values) {
            let offset = *offset;
            put(src.get(copied..offset).unwrap_or_default());
            copied = offset;
            match e.at {
                At::Replace(raw) => {
                    // `None`: not changed, the old bytes stay.
                    if let Some(v) = value {
                        put(v);
                        copied += raw.len();
                    }
                }
                At::Insert { first, .. } => {
                    put_key(&mut put, e, !first || inserted_at == Some(offset));
                    put(value.as_deref().unwrap_or_default());
                    inserted_at = Some(offset);
                }
                At::Append {
                    raw: Some(_),
                    first,
                    ..
                } => {
                    for (i, a) in e.added.iter().enumerate() {
                        if !first || i > 0 {
                            put(b",");
                        }
                        put(a.json.as_bytes());
                    }
                }
                At::Append {
                    raw: None, first, ..
                } => {
                    put_key(&mut put, e, !first || inserted_at == Some(offset));
                    put(b"[");
                    for (i, a) in e.added.iter().enumerate() {
                        if i > 0 {
                            put(b",");
                        }
                        put(a.json.as_bytes());
                    }
                    put(b"]");
                    inserted_at = Some(offset);
                }
            }
        }
        put(src.get(copied..).unwrap_or_default());
    }
}

/// The key of an inserted section and its colon, after a comma when `comma`.
fn put_key(put: &mut impl FnMut(&[u8]), e: &Edit<'_>, comma: bool) {
    if comma {
        put(b",");
    }
    let key = e.path.last().copied().unwrap_or_default();
    // The keys of sections are names without characters to escape; any other is escaped as
    // serde_json escapes it.
    if key.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        put(b"\"");
        put(key.as_bytes());
        put(b"\":");
    } else {
        put(&serde_json::to_vec(key).unwrap_or_default());
        put(b":");
    }
}

/// The text of a section edited as a value ([`At::Replace`], [`At::Insert`]); `None` for an
/// appended array, and for a replaced section not changed, only written differently
/// (pretty-printed, escaped): its old bytes stay, so that an unchanged document is the input
/// exactly.
fn value_text(e: &Edit<'_>) -> Option<Vec<u8>> {
    let text = match e.at {
        At::Append { .. } => return None,
        At::Replace(_) | At::Insert { .. } => {
            // Serializing a Value into a Vec cannot fail: its keys are strings.
            serde_json::to_vec(&e.value).unwrap_or_default()
        }
    };
    if let At::Replace(raw) = e.at {
        if text != raw.as_bytes()
            && len(&e.value) == e.parsed_len
            && serde_json::from_str::<Value>(raw).is_ok_and(|v| v == e.value)
        {
            return None;
        }
    }
    Some(text)
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
    let (all, _) = scan::members(raw, 0).map_err(|e| invalid(raw, e))?;
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
