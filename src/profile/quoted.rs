//! Names a text holds as TOML strings, as the start-up screen looks them up. Free of the
//! crate's other code: src/build.rs includes this file to prepare the built-in profiles'
//! names, so the build and the run time find the same ones.

/// Bytes of a variable name as engines write it in a spec's env (never escaped).
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Each run of name bytes (`[A-Za-z0-9_]`) in `text` with the same quote right before and
/// after it: every name `n` for which `profile::quoted_in(text, n)` holds.
pub fn quoted_names(text: &str) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    b.iter().enumerate().filter_map(move |(i, &q)| {
        if q != b'"' && q != b'\'' {
            return None;
        }
        let start = i + 1;
        let len = b[start..].iter().take_while(|&&c| is_name_byte(c)).count();
        // Name bytes are ASCII, so both ends are char boundaries.
        (len > 0 && b.get(start + len) == Some(&q)).then(|| &text[start..start + len])
    })
}
