//! A look at config.json's bytes before the profiles are parsed: most containers ask for no
//! device, and for them parsing the profiles costs more than the rest of the shim.
//!
//! It may only ever say [`Screen::Maybe`] or be certain. It is certain ([`Screen::Nothing`])
//! only where the bytes hold no escape at all: then every string any JSON reader decodes
//! from them, keys included, is a run of the bytes as they are, so an environment entry
//! `NAME=...` shows as the bytes `"NAME=`, an annotation key as `"cdi.k8s.io/...`. The same
//! holds for the TOML texts that name the variables profiles claim (config.toml, the
//! profile files, the built-ins): without a backslash or a multi-line string, a variable a
//! profile claims is written `"NAME"` or `'NAME'` there. Anything else (an escape, a name a
//! text quotes, docker's hook, a CDI annotation, bytes that do not start as a JSON object)
//! is `Maybe`, and the full read decides. Whether the bytes parse is runc's question: without
//! an escape, no reader can decode a name that is not in them. Duplicate keys and odd spacing change
//! which string wins, never which strings are there, so they cannot hide a request.
//! tests: `screen_never_skips_a_request_the_full_read_sees` (below) compares the two.

use crate::profile::Lengths;
use crate::spec::{CDI_ANNOTATION_PREFIX, DOCKER_GPU_HOOK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    /// Certainly nothing asked for: the spec is passed on unread and unwritten.
    Nothing,
    /// Perhaps something: the full read decides.
    Maybe,
}

/// Screens spec bytes against the texts that may name claimed variables.
pub fn screen<'t>(data: &[u8], texts: impl IntoIterator<Item = &'t str>) -> Screen {
    if memchr::memchr(b'\\', data).is_some()
        || data.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{')
        || memchr::memmem::find(data, DOCKER_GPU_HOOK.as_bytes()).is_some()
        || memchr::memmem::find(data, CDI_ANNOTATION_PREFIX.as_bytes()).is_some()
    {
        return Screen::Maybe;
    }
    // Linear in the spec, whatever it holds (issue 14, class 5: a pod's environment of a
    // million entries, or a string of a million `=`, must not make the screen quadratic).
    // Without an escape, an environment entry `NAME=...` shows as `"NAME=`, so a name is the
    // run from the last `"` to an `=` (the last quote is carried from one `=` to the next).
    // Names are compared with the texts' quoted runs by length first, and only runs and
    // names of a length both sides have are hashed: a growing run of `=` after one quote
    // makes names of a million lengths, of which only the few the texts have cost a hash.
    let names = || {
        let (mut scanned, mut quote) = (0, None);
        memchr::memchr_iter(b'=', data).filter_map(move |eq| {
            if let Some(q) = memchr::memrchr(b'"', &data[scanned..eq]) {
                quote = Some(scanned + q);
            }
            scanned = eq;
            quote
                .map(|q| &data[q + 1..eq])
                .filter(|name| !name.is_empty())
        })
    };
    let mut name_lengths = Lengths::default();
    names().for_each(|n| name_lengths.add(n.len(), false));
    // The texts' runs are root's (the spec's names are only looked up), so a fast
    // non-cryptographic hash cannot be flooded here (SipHash's cost: benches/BENCHMARKS.md).
    let mut runs = foldhash::HashSet::default();
    let mut run_lengths = Lengths::default();
    // Every text is looked at even when the spec has no name: a text the screen cannot read
    // plainly (an escape, a multi-line string) leaves it unsure.
    for t in texts {
        let unsure = crate::profile::may_quote(t.as_bytes(), |run| {
            if name_lengths.has(run.len()) {
                runs.insert(run);
                run_lengths.add(run.len(), true);
            }
            false
        });
        if unsure {
            return Screen::Maybe;
        }
    }
    if !runs.is_empty() && names().any(|n| run_lengths.has(n.len()) && runs.contains(n)) {
        return Screen::Maybe;
    }
    // No parse: what decides is which byte runs are there, and a grammar cannot add one. A
    // spec serde_json refuses but Go reads (invalid UTF-8, nesting deeper than serde_json's
    // limit) and that asks for nothing then reaches runc as it would without the shim.
    Screen::Nothing
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec;
    use proptest::prelude::*;

    const PROFILE: &str = "name = \"x\"\nvisible-devices-env = [\"NVIDIA_VISIBLE_DEVICES\", 'X_DEVS']\n# PATH is not quoted here\n";

    #[test]
    fn certain_only_without_escapes() {
        let s = |json: &str| screen(json.as_bytes(), [PROFILE]);
        assert_eq!(
            s(r#"{"process":{"env":["PATH=/bin","HOME=/"]}}"#),
            Screen::Nothing
        );
        assert_eq!(s(r#"{"process":{"env":["X_DEVS=1"]}}"#), Screen::Maybe);
        assert_eq!(
            s(r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#),
            Screen::Maybe
        );
        assert_eq!(
            s(r#"{"process":{"env":["PATH=/b\u0069n"]}}"#),
            Screen::Maybe
        );
        assert_eq!(
            s(r#"{"annotations":{"cdi.k8s.io/x":"a.com/b=c"}}"#),
            Screen::Maybe
        );
        // Bytes that do not parse but ask for nothing are runc's to refuse, as without the
        // shim; bytes that do not parse and may ask stay unsure.
        assert_eq!(s(r#"{"process":{"env":["PATH=/bin"]}"#), Screen::Nothing);
        assert_eq!(s(r#"{"process":{"env":["X_DEVS=1"]}"#), Screen::Maybe);
        // Invalid UTF-8: serde_json refuses it, Go reads it.
        assert_eq!(
            screen(b"{\"process\":{\"env\":[\"PATH=/\xff\"]}}", [PROFILE]),
            Screen::Nothing
        );
        assert_eq!(s(r#"["PATH=/bin"]"#), Screen::Maybe);
        // A text the screen cannot read plainly makes it unsure of everything.
        let escaped = "visible-devices-env = [\"A\\u005fB\"]";
        assert_eq!(
            screen(br#"{"process":{"env":["A_B=1"]}}"#, [escaped]),
            Screen::Maybe
        );
        assert_eq!(screen(b"{}", ["x = '''\nA'''"]), Screen::Maybe);
        // A claimed name with a quote in it, and a long one.
        assert_eq!(
            screen(br#"{"process":{"env":["A'B=1"]}}"#, ["v = [\"A'B\"]"]),
            Screen::Maybe
        );
        let long = "L".repeat(300);
        let spec = format!(r#"{{"process":{{"env":["{long}=1","{long}L=1"]}}}}"#);
        let text = format!("v = ['{long}']");
        assert_eq!(screen(spec.as_bytes(), [text.as_str()]), Screen::Maybe);
        let text = format!("v = ['{long}LL']");
        assert_eq!(screen(spec.as_bytes(), [text.as_str()]), Screen::Nothing);
    }

    /// A JSON string with some characters written as escapes (`\uXXXX`, `\/`).
    fn json_string(s: &str, escape: &[bool]) -> String {
        let mut out = String::from("\"");
        for (i, c) in s.chars().enumerate() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '/' if escape.get(i) == Some(&true) => out.push_str("\\/"),
                c if escape.get(i) == Some(&true) => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    fn arb_spec() -> impl Strategy<Value = String> {
        let names = prop::sample::select(vec![
            "PATH",
            "NVIDIA_VISIBLE_DEVICES",
            "X_DEVS",
            "NVIDIA_VISIBLE",
            "HOME",
        ]);
        let env = prop::collection::vec((names, "[a-z0-9,]{0,4}"), 0..4);
        let keys = prop::sample::select(vec!["cdi.k8s.io/p", "other", "cdi.k8s.io"]);
        let annotations = prop::collection::vec((keys, "[a-z.=/]{0,6}"), 0..3);
        let escapes = prop::collection::vec(any::<bool>(), 32);
        let space = prop::sample::select(vec!["", " ", "\n  ", "\t"]);
        (
            env,
            annotations,
            escapes,
            space,
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(env, annotations, esc, sp, dup, hook)| {
                let e = |s: &str| json_string(s, &esc);
                let entries: Vec<String> =
                    env.iter().map(|(n, v)| e(&format!("{n}={v}"))).collect();
                let mut members = vec![format!(
                    "{sp}{}{sp}:{sp}{{{sp}{}:[{}]}}",
                    e("process"),
                    e("env"),
                    entries.join(&format!(",{sp}"))
                )];
                if dup {
                    // A repeated key: the last one is what serde_json and runc read.
                    members.push(format!(
                        "{}:{{{}:[{}]}}",
                        e("process"),
                        e("env"),
                        e("PATH=/")
                    ));
                }
                let ann: Vec<String> = annotations
                    .iter()
                    .map(|(k, v)| format!("{}:{sp}{}", e(k), e(v)))
                    .collect();
                members.push(format!("{}:{{{}}}", e("annotations"), ann.join(",")));
                if hook {
                    members.push(format!(
                        "{}:{{{}:[{{{}:{}}}]}}",
                        e("hooks"),
                        e("prestart"),
                        e("path"),
                        e("/usr/bin/nvidia-container-runtime-hook")
                    ));
                }
                format!("{{{}{sp}}}", members.join(","))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn screen_never_skips_a_request_the_full_read_sees(spec in arb_spec()) {
            let (_, view) = spec::parse(spec.as_bytes()).unwrap();
            let asks = ["NVIDIA_VISIBLE_DEVICES", "X_DEVS"].iter().any(|n| view.env(n).is_some())
                || view.annotations.iter().any(|(k, _)| k.starts_with("cdi.k8s.io/"))
                || view.docker_gpu_hook;
            if asks {
                prop_assert_eq!(screen(spec.as_bytes(), [PROFILE]), Screen::Maybe, "{}", spec);
            }
        }
    }
}
