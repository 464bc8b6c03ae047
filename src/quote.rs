//! Text from the container (env values, annotation keys, mount paths) made safe to show in an
//! error or a log line: cut to [`MAX_BYTES`] with a marker saying how much was cut, and every
//! control character escaped, so a value cannot forge log lines, move the terminal's cursor or
//! fill a disk.
//!
//! [`quote`] is for one value inside a message; [`line()`] is the last pass over a whole line
//! before it leaves the process (stderr, the engine's `--log`, the shim's own log).

use std::fmt::Write;

/// How much of one quoted value is kept: enough for any real device list or path.
pub const MAX_BYTES: usize = 256;
/// How much of one message line is kept.
pub const MAX_LINE_BYTES: usize = 4096;

/// `value` in double quotes, escaped, cut at [`MAX_BYTES`] of escaped text with
/// `...(N more bytes)` after the closing quote.
pub fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_BYTES) + 2);
    out.push('"');
    let cut = escape_into(&mut out, value, MAX_BYTES, true);
    out.push('"');
    if cut > 0 {
        let _ = write!(out, "...({cut} more bytes)");
    }
    out
}

/// [`quote`] for bytes that may not be UTF-8 (invalid sequences become U+FFFD).
pub fn quote_bytes(value: &[u8]) -> String {
    quote(&String::from_utf8_lossy(value))
}

/// A whole message made one safe line: control characters (newlines included) escaped,
/// nothing else changed, cut after [`MAX_LINE_BYTES`] with a marker.
pub fn line(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(MAX_LINE_BYTES));
    let cut = escape_into(&mut out, msg, MAX_LINE_BYTES, false);
    if cut > 0 {
        let _ = write!(out, "...({cut} more bytes)");
    }
    out
}

/// Appends `s` escaped, up to `max` bytes of output (escapes count at their escaped length, so
/// a value of NULs cannot grow sixfold); returns how many bytes of `s` were left out.
fn escape_into(out: &mut String, s: &str, max: usize, quotes: bool) -> usize {
    let start = out.len();
    let mut buf = String::new();
    for (i, c) in s.char_indices() {
        buf.clear();
        match c {
            '"' | '\\' if quotes => {
                buf.push('\\');
                buf.push(c);
            }
            '\n' => buf.push_str("\\n"),
            '\r' => buf.push_str("\\r"),
            '\t' => buf.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(buf, "\\u{{{:x}}}", c as u32);
            }
            c => buf.push(c),
        }
        if out.len() - start + buf.len() > max {
            return s.len() - i;
        }
        out.push_str(&buf);
    }
    0
}

/// C0 and C1 controls, DEL, and the bidirectional overrides that make text read other than
/// it is (CVE-2021-42574's class).
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_quoted_and_escaped() {
        assert_eq!(quote("0,1"), "\"0,1\"");
        assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(
            quote("x\n\x1b[2J\u{7f}\u{85}"),
            "\"x\\n\\u{1b}[2J\\u{7f}\\u{85}\""
        );
        assert_eq!(quote("\u{202e}gpj.exe"), "\"\\u{202e}gpj.exe\"");
        assert_eq!(quote_bytes(b"a\xffb"), "\"a\u{fffd}b\"");
    }

    #[test]
    fn long_values_are_cut_with_a_marker() {
        let v = "x".repeat(10_000);
        let q = quote(&v);
        assert_eq!(
            q,
            format!("\"{}\"...(9744 more bytes)", "x".repeat(MAX_BYTES))
        );
        // Never inside a character.
        let v = format!("{}é", "x".repeat(MAX_BYTES - 1));
        assert_eq!(
            quote(&v),
            format!("\"{}\"...(2 more bytes)", "x".repeat(255))
        );
    }

    #[test]
    fn lines_keep_quotes_and_escape_controls() {
        assert_eq!(line("a \"b\"\nc\x07"), "a \"b\"\\nc\\u{7}");
        let long = "y".repeat(MAX_LINE_BYTES + 10);
        assert!(line(&long).ends_with("...(10 more bytes)"));
    }

    /// Found by the request_parse fuzz target: 256 NULs escaped to 1,280 bytes, so one quoted
    /// value made a 2.5 KB error line.
    #[test]
    fn escapes_count_toward_the_cut() {
        let q = quote(&"\0".repeat(1000));
        assert!(
            q.len() <= MAX_BYTES + 2 + "...(1000 more bytes)".len(),
            "{}",
            q.len()
        );
        assert_eq!(q, format!("\"{}\"...(949 more bytes)", "\\u{0}".repeat(51)));
    }
}
