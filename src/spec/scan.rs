//! A strict JSON scanner: where a value in config.json's text ends, and whether the text is
//! JSON at all, without decoding anything.
//!
//! Every create checks the whole of config.json (docker's is 9 KB, mostly seccomp and
//! capability names the shim never reads). serde_json's `IgnoredAny` did that at ~25
//! instructions a byte, the largest single cost of a create; this does it at a few, by
//! scanning strings with a table. It only says where values end and whether the text
//! is valid: keys and values the shim reads are still decoded by serde_json, and an error is
//! reported with serde_json's own message (the caller runs it again on the bad text).
//!
//! The grammar is RFC 8259's, as strict as serde_json's (`tests/fuzz/fuzz_targets/
//! json_scan.rs` compares the two): no trailing commas, no leading zeros, no control
//! characters in strings, only JSON's escapes. Two differences, both where serde_json and Go
//! (runc) disagree: nesting is not limited to serde_json's 128 levels (Go has no such limit,
//! and nothing here recurses), and `\u` escapes are not paired (a lone surrogate passes,
//! as in Go and in serde_json's `IgnoredAny`).
//! The text must be UTF-8 already (`&str`): nothing here checks it again.

/// The text is not JSON: the offset of the first byte where it stops being so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid(pub usize);

/// Whether `s` is one JSON value, with only whitespace around it.
pub fn is_json(s: &str) -> bool {
    let b = s.as_bytes();
    value_end(b, ws(b, 0)).is_ok_and(|end| ws(b, end) == b.len())
}

/// The offset after JSON's whitespace from `i`.
#[inline]
pub fn ws(s: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = s.get(i) {
        i += 1;
    }
    i
}

/// The closing brackets of the arrays and objects a value is inside: the first 64 levels
/// in place (a spec nests 5 or 6 deep), deeper ones on the heap (JSON has no depth limit
/// here, and nothing recurses).
struct Open {
    near: [u8; 64],
    far: Vec<u8>,
    depth: usize,
}

impl Open {
    fn new() -> Open {
        Open {
            near: [0; 64],
            far: Vec::new(),
            depth: 0,
        }
    }
    fn push(&mut self, close: u8) {
        match self.near.get_mut(self.depth) {
            Some(slot) => *slot = close,
            None => self.far.push(close),
        }
        self.depth += 1;
    }
    fn last(&self) -> Option<u8> {
        let top = self.depth.checked_sub(1)?;
        self.near.get(top).or(self.far.last()).copied()
    }
    fn pop(&mut self) {
        if self.depth > self.near.len() {
            self.far.pop();
        }
        self.depth = self.depth.saturating_sub(1);
    }
}

/// Where the value starting at `i` ends (the offset after it), checking it is valid.
pub fn value_end(s: &[u8], mut i: usize) -> Result<usize, Invalid> {
    let mut stack = Open::new();
    loop {
        // One value at `i`; an array or object is entered, not skipped.
        match s.get(i) {
            Some(b'{') => {
                i = ws(s, i + 1);
                if s.get(i) == Some(&b'}') {
                    i += 1;
                } else {
                    stack.push(b'}');
                    i = after_key(s, i)?;
                    continue;
                }
            }
            Some(b'[') => {
                i = ws(s, i + 1);
                if s.get(i) == Some(&b']') {
                    i += 1;
                } else {
                    stack.push(b']');
                    continue;
                }
            }
            Some(b'"') => i = string_end(s, i)?,
            Some(b't') => i = literal_end(s, i, b"true")?,
            Some(b'f') => i = literal_end(s, i, b"false")?,
            Some(b'n') => i = literal_end(s, i, b"null")?,
            Some(b'-' | b'0'..=b'9') => i = number_end(s, i)?,
            _ => return Err(Invalid(i)),
        }
        // A value ended: a comma goes on to the next element (or member), a closing
        // bracket ends its container, which is a value that ended too.
        loop {
            let Some(close) = stack.last() else {
                return Ok(i);
            };
            i = ws(s, i);
            match s.get(i) {
                Some(b',') => {
                    i = ws(s, i + 1);
                    if close == b'}' {
                        i = after_key(s, i)?;
                    }
                    break;
                }
                Some(&c) if c == close => {
                    stack.pop();
                    i += 1;
                }
                _ => return Err(Invalid(i)),
            }
        }
    }
}

/// For an object member whose key starts at `i`: where its value starts (after the `:`).
fn after_key(s: &[u8], i: usize) -> Result<usize, Invalid> {
    if s.get(i) != Some(&b'"') {
        return Err(Invalid(i));
    }
    let i = ws(s, string_end(s, i)?);
    if s.get(i) != Some(&b':') {
        return Err(Invalid(i));
    }
    Ok(ws(s, i + 1))
}

/// The bytes that end a run of plain string content: `"`, `\\` and the control characters
/// (which must be escaped).
static STOPS: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Where the string whose opening quote is at `i` ends (after its closing quote).
/// Eight bytes at a time while none of them can stop the run, then byte by byte; not
/// `memchr`: config.json's strings are mostly short names (capabilities, syscalls), where
/// a call per run costs more than it saves.
pub fn string_end(s: &[u8], i: usize) -> Result<usize, Invalid> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte of `w` below `n` (n <= 0x80). A borrow starts only at such a
    // byte, so the lowest bit set is exact (higher ones may be false): it is the first stop.
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS;
    let mut at = i + 1;
    loop {
        while let Some(word) = s.get(at..at + 8) {
            let w = u64::from_le_bytes([
                word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
            ]);
            let stops = below(w, 0x20)
                | below(w ^ (ONES * u64::from(b'"')), 1)
                | below(w ^ (ONES * u64::from(b'\\')), 1);
            if stops != 0 {
                at += stops.trailing_zeros() as usize / 8;
                break;
            }
            at += 8;
        }
        // The last few bytes of the text, byte by byte (on a stop already, this stays).
        while s.get(at).is_some_and(|&b| !STOPS[b as usize]) {
            at += 1;
        }
        match s.get(at) {
            Some(b'"') => return Ok(at + 1),
            Some(b'\\') => {}
            _ => return Err(Invalid(at)),
        }
        at = match s.get(at + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at + 2,
            Some(b'u') => match s.get(at + 2..at + 6) {
                Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => at + 6,
                _ => return Err(Invalid(at)),
            },
            _ => return Err(Invalid(at)),
        };
    }
}

fn literal_end(s: &[u8], i: usize, word: &[u8]) -> Result<usize, Invalid> {
    match s.get(i..i + word.len()) {
        Some(w) if w == word => Ok(i + word.len()),
        _ => Err(Invalid(i)),
    }
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` from `i`. What follows is judged by the
/// caller: `01` ends after `0`, and the `1` is then not a comma.
fn number_end(s: &[u8], i: usize) -> Result<usize, Invalid> {
    let digits = |mut j: usize| {
        while s.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        j
    };
    let mut j = i + usize::from(s.get(i) == Some(&b'-'));
    j = match s.get(j) {
        Some(b'0') => j + 1,
        Some(b'1'..=b'9') => digits(j + 1),
        _ => return Err(Invalid(j)),
    };
    if s.get(j) == Some(&b'.') {
        let k = digits(j + 1);
        if k == j + 1 {
            return Err(Invalid(k));
        }
        j = k;
    }
    if let Some(b'e' | b'E') = s.get(j) {
        j += 1;
        if let Some(b'+' | b'-') = s.get(j) {
            j += 1;
        }
        let k = digits(j);
        if k == j {
            return Err(Invalid(k));
        }
        j = k;
    }
    Ok(j)
}

/// An object member as written: its key's text (quotes included, not decoded) and its
/// value's text.
pub type Member<'s> = (&'s str, &'s str);

/// The members of the object whose `{` is at `i`, and the offset after its `}`.
pub fn members(src: &str, i: usize) -> Result<(Vec<Member<'_>>, usize), Invalid> {
    members_nesting(src, i, |_| false).map(|(all, _, end)| (all, end))
}

/// Members of nested objects, each with the index of the member whose value it is.
pub type Nested<'s> = Vec<(usize, Vec<Member<'s>>)>;

/// [`members`], where the value of each member whose key text `nest` accepts is, when it is
/// an object, split into its own members in the same pass (not scanned twice).
pub fn members_nesting<'s>(
    src: &'s str,
    i: usize,
    nest: impl Fn(&str) -> bool,
) -> Result<(Vec<Member<'s>>, Nested<'s>, usize), Invalid> {
    let s = src.as_bytes();
    debug_assert_eq!(s.get(i), Some(&b'{'));
    let mut out = Vec::with_capacity(16);
    let mut nested = Vec::new();
    let mut i = ws(s, i + 1);
    if s.get(i) == Some(&b'}') {
        return Ok((out, nested, i + 1));
    }
    loop {
        if s.get(i) != Some(&b'"') {
            return Err(Invalid(i));
        }
        let key_end = string_end(s, i)?;
        let key = &src[i..key_end];
        let colon = ws(s, key_end);
        if s.get(colon) != Some(&b':') {
            return Err(Invalid(colon));
        }
        let start = ws(s, colon + 1);
        let end = if s.get(start) == Some(&b'{') && nest(key) {
            let (inner, end) = members(src, start)?;
            nested.push((out.len(), inner));
            end
        } else {
            value_end(s, start)?
        };
        out.push((key, &src[start..end]));
        i = ws(s, end);
        match s.get(i) {
            Some(b',') => i = ws(s, i + 1),
            Some(b'}') => return Ok((out, nested, i + 1)),
            _ => return Err(Invalid(i)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_ok(s: &str) -> bool {
        serde_json::from_str::<serde::de::IgnoredAny>(s).is_ok()
    }

    #[test]
    fn agrees_with_serde_json_on_valid_and_invalid_text() {
        let cases = [
            "{}",
            "[]",
            " {\"a\" : [1, -0, 0.5, -1.5e10, 2E-3, 1e+2, true, false, null, \"x\"] } ",
            r#"{"k":"\"\\\/\b\f\n\r\t\u00e9\uD834\uDD1E","":{}}"#,
            r#""\ud800""#,
            "\"\u{7f}é中\"",
            "0",
            "-0",
            "[[[[[]]]],{}]",
            "",
            " ",
            "{",
            "}",
            "[1,]",
            "{\"a\":1,}",
            "{,}",
            "[,1]",
            "{\"a\" 1}",
            "{\"a\":}",
            "{1:2}",
            "{'a':1}",
            "[01]",
            "[-]",
            "[1.]",
            "[.5]",
            "[1e]",
            "[1e+]",
            "[+1]",
            "[0x10]",
            "[NaN]",
            "[Infinity]",
            "[tru]",
            "[truex]",
            "[nul]",
            "\"a\nb\"",
            "\"a\tb\"",
            "\"\\x\"",
            "\"\\u12G4\"",
            "\"\\u12\"",
            "\"abc",
            "\"abc\\",
            "{} {}",
            "[1] x",
            "[1 2]",
            "{\"a\":1 \"b\":2}",
            "[\"a\"\"b\"]",
            "\u{feff}{}",
        ];
        for case in cases {
            assert_eq!(is_json(case), serde_ok(case), "{case:?}");
        }
    }

    #[test]
    fn deep_nesting_is_judged_without_recursion() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(is_json(&deep));
        let unclosed = "[{\"a\":".repeat(50_000);
        assert!(!is_json(&unclosed));
    }

    #[test]
    fn value_end_and_members_give_exact_spans() {
        let src = r#" {"a" : [1, {"b": "}]"}] , "c\"d":"x\\" ,"e":{}}  "#;
        let start = ws(src.as_bytes(), 0);
        let end = value_end(src.as_bytes(), start).unwrap();
        assert_eq!(&src[start..end], src.trim());
        let (members, after) = members(src, start).unwrap();
        assert_eq!(after, end);
        assert_eq!(
            members,
            [
                (r#""a""#, r#"[1, {"b": "}]"}]"#),
                (r#""c\"d""#, r#""x\\""#),
                (r#""e""#, "{}")
            ]
        );
        assert_eq!(
            value_end(b"[1, 2", 0),
            Err(Invalid(5)),
            "the offset where it stopped"
        );
    }
}
