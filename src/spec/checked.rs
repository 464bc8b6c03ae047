//! Byte scans of JSON text that serde_json has already checked: an array's elements, an
//! object's members, a string's value, a value's fingerprint, without building values.
//!
//! The editor uses them to learn what an array in config.json already holds (each mount's
//! destination, each cgroup rule's fingerprint) from the document's bytes: the document was
//! checked whole by [`Document::parse`](super::Document::parse), and the entries compared
//! with it are written by [`super::entry`]. On such text the scans are exact; on any other
//! text their answers mean nothing, but they still never panic and always end (slices are
//! taken with `get`, every step moves forward).
//!
//! A string with escapes (rare in a spec) is decoded by serde_json; one that does not decode
//! (a lone surrogate escape, which the document check lets pass) equals no string.

use std::borrow::Cow;
use std::collections::HashMap;

use super::scan;

// The scanner's own steps ([`scan`]): on checked text they are exact, on any other they
// stop at the end.
use super::scan::ws as skip_ws;

fn string_end(b: &[u8], i: usize) -> usize {
    scan::string_end(b, i).unwrap_or(b.len())
}

fn value_end(b: &[u8], i: usize) -> usize {
    scan::value_end(b, i).unwrap_or(b.len())
}

/// The elements of the array `raw` (its text, from `[` to `]`), each as written; none when
/// `raw` is not an array.
pub fn elements(raw: &str) -> Elements<'_> {
    Elements {
        text: raw,
        at: if raw.starts_with('[') { 1 } else { raw.len() },
    }
}

pub struct Elements<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        let b = self.text.as_bytes();
        let start = skip_ws(b, self.at);
        if matches!(b.get(start), None | Some(b']')) {
            return None;
        }
        let end = value_end(b, start);
        let value = self.text.get(start..end).filter(|v| !v.is_empty());
        if value.is_none() {
            self.at = b.len();
            return None;
        }
        self.at = past_comma(b, end);
        value
    }
}

/// Where the next element or member starts after a value ending at `end`: past the comma
/// that follows it, or at the closing bracket.
fn past_comma(b: &[u8], end: usize) -> usize {
    let next = skip_ws(b, end);
    if b.get(next) == Some(&b',') {
        next + 1
    } else {
        next
    }
}

/// The members of the object `raw` (its text, from `{` to `}`): each key's string literal
/// (quotes and escapes as written) and its value as written; none when `raw` is not an
/// object.
pub fn members(raw: &str) -> Members<'_> {
    Members {
        text: raw,
        at: if raw.starts_with('{') { 1 } else { raw.len() },
    }
}

pub struct Members<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, &'a str);
    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        let b = self.text.as_bytes();
        let key = skip_ws(b, self.at);
        if b.get(key) == Some(&b'}') {
            // Stays here: [`Members::closed`] tells where the object ends.
            self.at = key;
            return None;
        }
        let member = (|| {
            if b.get(key) != Some(&b'"') {
                return None;
            }
            let key_end = string_end(b, key);
            let colon = skip_ws(b, key_end);
            if b.get(colon) != Some(&b':') {
                return None;
            }
            let start = skip_ws(b, colon + 1);
            let end = value_end(b, start);
            let value = self.text.get(start..end).filter(|v| !v.is_empty())?;
            Some((self.text.get(key..key_end)?, value, end))
        })();
        let Some((key, value, end)) = member else {
            self.at = b.len();
            return None;
        };
        self.at = past_comma(b, end);
        Some((key, value))
    }
}

impl Members<'_> {
    /// After the last member: the offset of the object's `}` in its text, when it ended
    /// there (on checked text, always).
    pub fn closed(&self) -> Option<usize> {
        (self.text.as_bytes().get(self.at) == Some(&b'}')).then_some(self.at)
    }
}

/// Each element of the array `raw` as written, with what [`string_member`] gives of it for
/// `name`, each element scanned once (an element's end and its members come from the same
/// pass); none when `raw` is not an array.
pub fn elements_with_member<'a>(raw: &'a str, name: &str) -> Vec<(&'a str, Option<&'a str>)> {
    let b = raw.as_bytes();
    let mut out = Vec::new();
    if !raw.starts_with('[') {
        return out;
    }
    let mut i = skip_ws(b, 1);
    while let Some(&c) = b.get(i) {
        if c == b']' {
            break;
        }
        let (end, found) = if c == b'{' {
            let mut m = members(&raw[i..]);
            let mut found = None;
            for (k, v) in m.by_ref() {
                if key_is(k, name) {
                    found = Some(v);
                }
            }
            match m.closed() {
                Some(close) => (i + close + 1, found.filter(|v| v.starts_with('"'))),
                None => break,
            }
        } else {
            (value_end(b, i), None)
        };
        if end <= i {
            break;
        }
        out.push((&raw[i..end], found));
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            _ => break,
        }
    }
    out
}

/// Whether the text has no backslash: a string literal without escapes. Every byte is
/// looked at (no early end), which the compiler turns into a wide loop.
pub fn is_plain(text: &str) -> bool {
    !text.bytes().fold(false, |any, b| any | (b == b'\\'))
}

/// What the string literal `lit` (with its quotes) holds; `None` when it is not a string or
/// does not decode.
pub fn unescape(lit: &str) -> Option<Cow<'_, str>> {
    let inner = lit.strip_prefix('"')?.strip_suffix('"')?;
    if is_plain(inner) {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(lit).ok().map(Cow::Owned)
}

/// Whether the string literals `a` and `b` hold the same string.
pub fn same_string(a: &str, b: &str) -> bool {
    if is_plain(a) && is_plain(b) {
        return a == b;
    }
    matches!((unescape(a), unescape(b)), (Some(x), Some(y)) if x == y)
}

/// Whether the key literal `lit` is `name`.
fn key_is(lit: &str, name: &str) -> bool {
    match lit.strip_prefix('"').and_then(|l| l.strip_suffix('"')) {
        Some(inner) if is_plain(inner) => inner == name,
        _ => unescape(lit).is_some_and(|k| k == name),
    }
}

/// The literal of the string member `name` of the object `raw`, the last when the key is
/// repeated (as serde_json and Go read it); `None` when `raw` is not an object, has no such
/// member, or that member is not a string.
pub fn string_member<'a>(raw: &'a str, name: &str) -> Option<&'a str> {
    let mut found = None;
    for (k, v) in members(raw) {
        if key_is(k, name) {
            found = Some(v);
        }
    }
    found.filter(|v| v.starts_with('"'))
}

/// Fingerprints of values as written ([`Fingerprints::of`]); it keeps one buffer for the
/// members of the objects being read, so that fingerprinting an array of small objects
/// allocates once.
#[derive(Default)]
pub struct Fingerprints<'a> {
    /// Of each member of the objects open: its key, the key's hash (compared first), and
    /// its value's fingerprint.
    members: Vec<(Cow<'a, str>, u64, u64)>,
}

/// Objects with more members than this find a repeated key through a hash map, not a scan.
const SCAN_MEMBERS: usize = 16;

impl<'a> Fingerprints<'a> {
    /// The fingerprint of the value `text`: equal values have equal fingerprints (object
    /// members in any order, the last of a repeated key, strings escaped or not, numbers as
    /// serde_json tells them apart), so most unequal values are told apart without decoding
    /// them. The same as [`fp_str`], [`fp_u64`], [`ObjectFp`] and the others give of a
    /// value's parts.
    pub fn of(&mut self, text: &'a str) -> u64 {
        self.value(text, 0).0
    }

    /// The fingerprint of the value at `i` and where it ends (each byte is read once,
    /// however deep the value).
    fn value(&mut self, text: &'a str, i: usize) -> (u64, usize) {
        let b = text.as_bytes();
        match b.get(i) {
            Some(b'[') => {
                let mut fp = ARRAY;
                let mut j = skip_ws(b, i + 1);
                while !matches!(b.get(j), None | Some(b']')) {
                    let (e, end) = self.value(text, j);
                    if end <= j {
                        break;
                    }
                    fp = fp_element(fp, e);
                    j = skip_ws(b, end);
                    if b.get(j) == Some(&b',') {
                        j = skip_ws(b, j + 1);
                    }
                }
                (fp, (j + 1).min(b.len()))
            }
            Some(b'{') => self.object(text, i),
            Some(c) => {
                let end = value_end(b, i);
                let fp = match c {
                    b'"' => match text.get(i..end).and_then(unescape) {
                        Some(s) => fp_str(&s),
                        None => UNDECODED,
                    },
                    b't' => fp_bool(true),
                    b'f' => fp_bool(false),
                    b'n' => NULL,
                    _ => text.get(i..end).map_or(UNDECODED, fp_number),
                };
                (fp, end)
            }
            None => (UNDECODED, i),
        }
    }

    /// [`Fingerprints::value`] of the object at `i`.
    fn object(&mut self, text: &'a str, i: usize) -> (u64, usize) {
        let b = text.as_bytes();
        let base = self.members.len();
        let mut index: Option<HashMap<Cow<'a, str>, usize>> = None;
        let mut j = skip_ws(b, i + 1);
        while b.get(j) == Some(&b'"') {
            let key_end = string_end(b, j);
            let colon = skip_ws(b, key_end);
            let Some(k) = text.get(j..key_end).filter(|_| b.get(colon) == Some(&b':')) else {
                break;
            };
            let start = skip_ws(b, colon + 1);
            let (fp, end) = self.value(text, start);
            if end <= start {
                break;
            }
            j = skip_ws(b, end);
            if b.get(j) == Some(&b',') {
                j = skip_ws(b, j + 1);
            }
            // A key that does not decode is told apart by its literal.
            let key = unescape(k).unwrap_or(Cow::Borrowed(k));
            let hash = fp_text(10, &key);
            let seen = match &index {
                Some(index) => index.get(&key).copied(),
                None => self.members[base..]
                    .iter()
                    .position(|(seen, h, _)| *h == hash && *seen == key)
                    .map(|p| base + p),
            };
            match seen {
                // A repeated key: the last value counts.
                Some(p) => self.members[p].2 = fp,
                None => {
                    if let Some(index) = &mut index {
                        index.insert(key.clone(), self.members.len());
                    }
                    self.members.push((key, hash, fp));
                    if index.is_none() && self.members.len() - base > SCAN_MEMBERS {
                        let all = self.members[base..].iter().enumerate();
                        index = Some(all.map(|(p, (k, ..))| (k.clone(), base + p)).collect());
                    }
                }
            }
        }
        let mut fp = ObjectFp::default();
        for (_, hash, value) in &self.members[base..] {
            fp.add_hashed(*hash, *value);
        }
        let fp = fp.get();
        self.members.truncate(base);
        (fp, (j + 1).min(b.len()))
    }
}

/// Of what does not decode (equal to no value the editor writes).
const UNDECODED: u64 = 0;
const NULL: u64 = 1;
const ARRAY: u64 = 8;

fn mix(h: u64) -> u64 {
    let h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

fn fp_text(tag: u64, s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325 ^ tag, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub fn fp_bool(b: bool) -> u64 {
    2 + u64::from(b)
}

pub fn fp_u64(u: u64) -> u64 {
    mix(u ^ 3)
}

/// An integer (serde_json keeps a non-negative one as `u64`, a negative one as `i64`).
pub fn fp_i64(i: i64) -> u64 {
    match u64::try_from(i) {
        Ok(u) => fp_u64(u),
        Err(_) => mix((i as u64) ^ 4),
    }
}

fn fp_f64(f: f64) -> u64 {
    // 0.0 == -0.0.
    mix(if f == 0.0 { 5 } else { f.to_bits() ^ 6 })
}

/// A number as written, as serde_json reads it: an integer as `u64` or `i64` when it fits,
/// else an `f64`.
fn fp_number(text: &str) -> u64 {
    let digits = text.bytes().try_fold(0u64, |u, c| {
        let d = c.checked_sub(b'0').filter(|d| *d < 10)?;
        u.checked_mul(10)?.checked_add(d.into())
    });
    if let Some(u) = digits.filter(|_| !text.is_empty()) {
        return fp_u64(u);
    }
    match serde_json::from_str::<serde_json::Number>(text) {
        Ok(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => fp_u64(u),
            (None, Some(i)) => fp_i64(i),
            (None, None) => fp_f64(n.as_f64().unwrap_or_default()),
        },
        Err(_) => UNDECODED,
    }
}

pub fn fp_str(s: &str) -> u64 {
    fp_text(7, s)
}

/// An array's fingerprint so far (starting from [`ARRAY`]) with one more element.
fn fp_element(h: u64, element: u64) -> u64 {
    mix(h.rotate_left(5) ^ element)
}

/// The fingerprint of an object, added to one member at a time (members with distinct
/// keys, in any order).
#[derive(Default)]
pub struct ObjectFp {
    n: u64,
    sum: u64,
}

impl ObjectFp {
    pub fn add(&mut self, key: &str, fp: u64) {
        self.add_hashed(fp_text(10, key), fp);
    }

    /// [`ObjectFp::add`] of a key whose `fp_text(10, key)` is `hash`.
    fn add_hashed(&mut self, hash: u64, fp: u64) {
        self.n += 1;
        self.sum = self.sum.wrapping_add(mix(hash ^ fp.rotate_left(1)));
    }

    pub fn get(&self) -> u64 {
        mix(self.sum ^ (9 + self.n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn fp(text: &str) -> u64 {
        Fingerprints::default().of(text)
    }

    #[test]
    fn elements_and_members_as_written() {
        let raw = r#"[ {"a" : "]}\"", "b":[1,{"c":[]}]} ,2, "x\\" ,[],{} , -1.5e3,null ]"#;
        let all: Vec<&str> = elements(raw).collect();
        assert_eq!(
            all,
            [
                r#"{"a" : "]}\"", "b":[1,{"c":[]}]}"#,
                "2",
                r#""x\\""#,
                "[]",
                "{}",
                "-1.5e3",
                "null"
            ]
        );
        let m: Vec<(&str, &str)> = members(all[0]).collect();
        assert_eq!(m, [(r#""a""#, r#""]}\"""#), (r#""b""#, r#"[1,{"c":[]}]"#)]);
        assert_eq!(elements("[ ]").count(), 0);
        assert_eq!(members("{ }").count(), 0);
        assert_eq!(elements("{}").count(), 0);
        assert_eq!(members("[]").count(), 0);
        // The same as serde_json's split, on every element.
        let want: Vec<Box<serde_json::value::RawValue>> = serde_json::from_str(raw).unwrap();
        let want: Vec<&str> = want.iter().map(|r| r.get()).collect();
        assert_eq!(all, want);
    }

    #[test]
    fn string_ends_found_at_any_offset() {
        // Quotes and backslashes at every place in and across the eight-byte steps.
        for len in 0..40 {
            for at in 0..len {
                for c in ['"', '\\'] {
                    let mut inner: Vec<char> = "é".repeat(len).chars().collect();
                    inner.truncate(len);
                    inner[at] = c;
                    if c == '\\' {
                        inner.insert(at + 1, 'n');
                    }
                    let inner: String = inner.into_iter().collect();
                    let lit = format!("\"{inner}\" , 1");
                    // Where serde_json ends the first value (a string).
                    let mut values =
                        serde_json::Deserializer::from_str(&lit).into_iter::<serde_json::Value>();
                    let Some(Ok(_)) = values.next() else {
                        continue;
                    };
                    let want = values.byte_offset();
                    assert_eq!(string_end(lit.as_bytes(), 0), want, "{lit}");
                }
            }
        }
        assert_eq!(string_end(b"\"abcdefghijklmnop", 0), 17);
    }

    #[test]
    fn any_bytes_end_without_panic() {
        for bad in [
            "[",
            "[,",
            "[1,",
            "{\"a\"",
            "{\"a\":",
            "{\"a\" 1}",
            "[\"\\",
            "[\"\\u",
            "{,}",
            "[}",
            "{\"\\",
            "\"",
            "[é,",
            "[\"é\\é\"]",
        ] {
            let _ = elements(bad).count();
            let _ = members(bad).count();
            let _ = string_member(bad, "a");
            let _ = fp(bad);
            for e in elements(bad) {
                let _ = fp(e);
            }
        }
    }

    #[test]
    fn elements_with_member_is_elements_then_string_member() {
        for raw in [
            "[]",
            "[ ]",
            r#"[{"destination":"/a"}]"#,
            r#"[ {"destination" : "/a" , "x":[1,{"destination":"/no"}]} , 3 , "s", {"d\u0065stination":"/b"},{} ,{"destination":1},{"destination":"/c","destination":"/d"}, [{"destination":"/e"}] ]"#,
            r#"[{"destination":"/a","destination":2}]"#,
            "{}",
            "1",
        ] {
            let want: Vec<(&str, Option<&str>)> = elements(raw)
                .map(|e| (e, string_member(e, "destination")))
                .collect();
            assert_eq!(elements_with_member(raw, "destination"), want, "{raw}");
        }
    }

    #[test]
    fn strings_are_compared_unescaped() {
        assert_eq!(unescape(r#""/dev/x""#).unwrap(), "/dev/x");
        assert_eq!(unescape(r#""\u002fdev\/x\n""#).unwrap(), "/dev/x\n");
        assert_eq!(unescape(r#""\ud800""#), None);
        assert_eq!(unescape("1"), None);
        assert!(same_string(r#""/a""#, r#""\u002fa""#));
        assert!(!same_string(r#""/a""#, r#""/b""#));
        assert!(!same_string(r#""\ud800""#, r#""\ud800""#));
        let obj = r#"{"destination":"/a","d\u0065stination":"/b","x":1}"#;
        assert_eq!(string_member(obj, "destination"), Some(r#""/b""#));
        assert_eq!(string_member(r#"{"path":"/a","path":1}"#, "path"), None);
        assert_eq!(
            string_member(r#"{"path":1,"path":"/a"}"#, "path"),
            Some(r#""/a""#)
        );
        assert_eq!(string_member(r#"["path","/a"]"#, "path"), None);
        assert_eq!(string_member(r#"{"paths":"/a"}"#, "path"), None);
    }

    #[test]
    fn equal_values_have_equal_fingerprints() {
        let equal = [
            (
                r#"{"allow":true,"type":"c","major":195,"minor":1,"access":"rwm"}"#,
                "{\n \"access\" : \"rw\\u006d\", \"minor\":1,\"major\":195,\"type\":\"c\",\"allow\":true}",
            ),
            (r#"{"a":1,"a":2}"#, r#"{"a":2}"#),
            (r#"{"a":{"x":[1,"y"]},"b":null}"#, r#"{"b":null,"a":{"x":[1,"\u0079"]}}"#),
            ("0.0", "-0.0"),
            ("-0", "0.0"),
            ("1e2", "100.0"),
            ("18446744073709551616", "1.8446744073709552e19"),
        ];
        let value = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        for (a, b) in equal {
            assert_eq!(value(a), value(b), "{a} {b}");
            assert_eq!(fp(a), fp(b), "{a} {b}");
        }
        let unequal = [
            ("1", "1.0"),
            ("1", "-1"),
            ("[1,2]", "[2,1]"),
            (r#"{"a":1}"#, r#"{"a":1,"b":1}"#),
            (r#"{"a":1,"b":2}"#, r#"{"a":2,"b":1}"#),
            (r#"{"a":2,"a":1}"#, r#"{"a":2}"#),
            (
                r#"{"allow":true,"type":"c","major":195,"minor":1,"access":"rwm"}"#,
                r#"{"allow":true,"type":"c","major":195,"minor":2,"access":"rwm"}"#,
            ),
            ("true", "false"),
            ("null", "0"),
            ("\"\"", "[]"),
        ];
        for (a, b) in unequal {
            assert_ne!(value(a), value(b), "{a} {b}");
            assert_ne!(fp(a), fp(b), "{a} {b}");
        }
        // A big object finds its repeated keys through the map.
        let keys: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
        let big = format!("{{{},\"k3\":\"x\"}}", keys.join(","));
        let mut reordered = keys.clone();
        reordered.reverse();
        reordered.retain(|k| !k.starts_with("\"k3\""));
        let same = format!("{{\"k3\":\"x\",{}}}", reordered.join(","));
        assert_eq!(fp(&big), fp(&same));
        // Of the parts: as the entry writer computes it.
        assert_eq!(fp(r#"{"a":"x","b":[1],"c":-2,"d":false}"#), {
            let mut fp = ObjectFp::default();
            fp.add("d", fp_bool(false));
            fp.add("b", fp_element(ARRAY, fp_u64(1)));
            fp.add("a", fp_str("x"));
            fp.add("c", fp_i64(-2));
            fp.get()
        });
    }
}
