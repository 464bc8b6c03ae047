//! The keys a config struct knows, and the nearest of them to a key it does not: so an
//! unknown-key warning can say "did you mean `log-level`?".
//!
//! The known keys come from the struct's own `Deserialize` (serde hands a struct's field
//! names to the deserializer), so they cannot drift from what is parsed.

use serde::de::{self, Deserialize, Visitor};

/// Stops at the first `deserialize_struct` and keeps its field names.
struct Fields(&'static [&'static str]);

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names collected")
    }
}
impl std::error::Error for Stop {}
impl de::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> de::Deserializer<'de> for &mut Fields {
    type Error = Stop;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.0 = fields;
        Err(Stop)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The keys of struct `T` as its `Deserialize` names them (after `rename_all`); empty for a
/// type that is not a plain struct.
pub fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut f = Fields(&[]);
    let _ = T::deserialize(&mut f);
    f.0
}

/// The known key closest to `key`, when it is close enough to be a slip (a few letters
/// wrong, left out, added or swapped).
pub fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), *k))
        .filter(|(d, k)| *d > 0 && *d <= 3.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The warning for an unknown key at `path` (dotted, as serde_ignored gives it) in `origin`,
/// naming the nearest of `known` (matched against the path's last part).
pub fn unknown_key(origin: &str, path: &str, known: &[&str]) -> String {
    let last = path.rsplit('.').next().unwrap_or(path);
    match nearest(last, known) {
        Some(k) => format!("{origin}: unknown key `{path}` ignored (did you mean `{k}`?)"),
        None => format!("{origin}: unknown key `{path}` ignored"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    #[allow(dead_code)]
    struct Sample {
        log_level: String,
        driver_root: String,
    }

    #[test]
    fn fields_come_from_deserialize() {
        assert_eq!(fields::<Sample>(), ["log-level", "driver-root"]);
        assert!(fields::<String>().is_empty());
    }

    #[test]
    fn nearest_key_for_slips_only() {
        let known = fields::<Sample>();
        assert_eq!(nearest("log-levl", known), Some("log-level"));
        assert_eq!(nearest("driver-rot", known), Some("driver-root"));
        assert_eq!(nearest("colour", known), None);
        assert_eq!(
            unknown_key("x.toml", "profiles.nvidia.driver-rot", known),
            "x.toml: unknown key `profiles.nvidia.driver-rot` ignored (did you mean `driver-root`?)"
        );
    }
}
