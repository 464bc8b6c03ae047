//! The JSON scanner (`spec::scan`) against serde_json: any text, the same verdict (except
//! past serde_json's nesting limit, which Go and the scanner do not have), and for an object,
//! the same members with the same value texts.
#![no_main]

use std::fmt;

use accel_container_runtime::spec::scan;
use libfuzzer_sys::fuzz_target;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// An object's members as serde_json delimits them: (key decoded, value text).
struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = Vec<(String, &'de str)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
            out.push((k, v.get()));
        }
        Ok(out)
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let serde = serde_json::from_str::<serde::de::IgnoredAny>(text);
    if let Err(e) = &serde {
        if e.to_string().contains("recursion limit") {
            return;
        }
    }
    assert_eq!(scan::is_json(text), serde.is_ok(), "{text:?}");
    let start = scan::ws(text.as_bytes(), 0);
    if serde.is_ok() && text.as_bytes().get(start) == Some(&b'{') {
        let mut de = serde_json::Deserializer::from_str(text);
        let Ok(want) = de.deserialize_map(Members) else {
            return; // a key that does not decode (a lone surrogate): serde's verdict alone
        };
        let (got, _) = scan::members(text, start).unwrap();
        assert_eq!(got.len(), want.len());
        for ((key, value), (want_key, want_value)) in got.iter().zip(&want) {
            assert_eq!(serde_json::from_str::<String>(key).ok().as_ref(), Some(want_key));
            assert_eq!(value, want_value);
        }
    }
});
