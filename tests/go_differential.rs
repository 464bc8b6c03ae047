//! Issue 14, class 4: the shim reads config.json as runc reads it, or refuses it.
//!
//! runc decodes the spec with Go's `encoding/json`; tests/go/specread is a small Go program
//! (standard library only, built here with the distro's `golang-go`) that decodes specs into
//! the runtime-spec shapes as runc's `loadSpec` does and prints what it saw of the parts the
//! shim decides from. This test generates specs with the spellings where the two readers
//! could part (case-variant keys, KELVIN SIGN and LONG S folding, escaped keys, repeated keys
//! and objects, nulls, wrong types) and checks each: the shim refuses it (`spec::parse` or
//! the check a spec that makes a request goes through, `spec::golang::check`), or runc
//! refuses it, or both saw the same thing.
//!
//! Go is required, never skipped: .ci/run installs `golang-go`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use accel_container_runtime::spec::{self, golang, View};
use serde_json::{json, Value};

/// Specs compared per run.
const SPECS: usize = 50_000;

/// The Go program, built once per test run into the target directory (once for both tests:
/// one `go build` must not replace the binary while the other test runs it).
fn specread() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(build_specread).clone()
}

fn build_specread() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/go/specread");
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go");
    let bin = work.join("specread");
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        // Offline and self-contained: no module downloads, no toolchain switch, caches here.
        .env("GOCACHE", work.join("cache"))
        .env("GOPATH", work.join("path"))
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `go` ({e}): install golang-go (.ci/run does); this test needs it")
        });
    assert!(
        out.status.success(),
        "go build tests/go/specread: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// A small deterministic generator (xorshift64*): the same specs every run, so a mismatch
/// found in CI is found again here.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// A JSON string literal for `s` (always valid JSON).
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A spelling of the field name `name` as an object key: mostly exact, else one that Go's
/// folding matches (case flips, K/s as U+212A/U+017F), one it does not (dotless i, a
/// trailing space), or an escape of a letter (the same key to every reader).
fn key(r: &mut Rng, name: &str) -> String {
    // Each key of a spec is drawn this way, so a variant at every few keys would leave
    // almost no spec that the shim reads: one key in twelve.
    if !r.one_in(12) {
        return lit(name);
    }
    let chars: Vec<char> = name.chars().collect();
    let i = r.below(chars.len().max(1));
    let mut out = String::from('"');
    for (j, c) in chars.iter().enumerate() {
        let c = *c;
        let changed = match r.below(6) {
            _ if j != i && !r.one_in(4) => None,
            0 | 1 => Some(if c.is_ascii_lowercase() {
                c.to_ascii_uppercase().to_string()
            } else {
                c.to_ascii_lowercase().to_string()
            }),
            2 if c.eq_ignore_ascii_case(&'k') => Some("\u{212A}".to_string()),
            2 if c.eq_ignore_ascii_case(&'s') => Some("\u{017F}".to_string()),
            3 if c == 'i' => Some("\u{131}".to_string()),
            4 => Some(format!("\\u{:04x}", c as u32)),
            _ => None,
        };
        out.push_str(&changed.unwrap_or_else(|| c.to_string()));
    }
    if r.one_in(30) {
        out.push(' ');
    }
    out.push('"');
    out
}

/// Spacing JSON allows between tokens (never a newline: specs travel one per line).
fn ws(r: &mut Rng) -> &'static str {
    ["", "", "", " ", "\t", " \r "][r.below(6)]
}

/// Draws a JSON value.
type Gen = fn(&mut Rng) -> String;

/// An object of `members` (name, value generator), each possibly left out, repeated, or
/// joined by noise keys.
fn object(r: &mut Rng, members: &[(&str, Gen)]) -> String {
    let mut parts = Vec::new();
    for (name, value) in members {
        let times = match r.below(30) {
            0..=8 => 0,
            9..=28 => 1,
            _ => 2,
        };
        for _ in 0..times {
            parts.push(format!("{}{}:{}{}", key(r, name), ws(r), ws(r), value(r)));
        }
    }
    if r.one_in(4) {
        parts.push(format!(
            "{}:1",
            lit(r.pick(&["x", "X-future", "ociVersion"]))
        ));
    }
    // Order matters to Go (which repeat wins): shuffle.
    for i in (1..parts.len()).rev() {
        let j = r.below(i + 1);
        parts.swap(i, j);
    }
    format!("{{{}{}}}", ws(r), parts.join(&format!(",{}", ws(r))))
}

/// Sometimes a value of the wrong JSON type instead of `good`.
fn or_odd(r: &mut Rng, good: impl FnOnce(&mut Rng) -> String) -> String {
    match r.below(40) {
        0 | 1 => "null".into(),
        2 => r
            .pick(&["1", "-2", "1.5", "true", "\"x\"", "[]", "{}"])
            .into(),
        _ => good(r),
    }
}

fn list(r: &mut Rng, item: Gen) -> String {
    or_odd(r, |r| {
        let n = r.below(4);
        let items: Vec<String> = (0..n).map(|_| item(r)).collect();
        format!("[{}]", items.join(","))
    })
}

fn string(r: &mut Rng, choices: &[&str]) -> String {
    match r.below(40) {
        0 | 1 => "null".into(),
        2 => "7".into(),
        _ => lit(r.pick(choices)),
    }
}

fn env_entry(r: &mut Rng) -> String {
    string(
        r,
        &[
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_VISIBLE_DEVICES=0",
            "PATH=/bin",
            "A=1",
            "NOEQUALS",
            "",
        ],
    )
}

fn cap(r: &mut Rng) -> String {
    string(r, &["CAP_SYS_ADMIN", "CAP_KILL", "CAP_CHOWN"])
}

fn caps(r: &mut Rng) -> String {
    or_odd(r, |r| {
        object(
            r,
            &[
                ("bounding", |r| list(r, cap)),
                ("effective", |r| list(r, cap)),
                ("permitted", |r| list(r, cap)),
                ("ambient", |r| list(r, cap)),
            ],
        )
    })
}

fn gid(r: &mut Rng) -> String {
    r.pick(&["0", "44", "44", "1000", "-1", "1.0", "4294967296", "null"])
        .into()
}

fn process(r: &mut Rng) -> String {
    or_odd(r, |r| {
        object(
            r,
            &[
                ("env", |r| list(r, env_entry)),
                ("capabilities", caps),
                ("user", |r| {
                    or_odd(r, |r| {
                        object(
                            r,
                            &[
                                ("uid", |r| r.pick(&["0", "1000"]).into()),
                                ("additionalGids", |r| list(r, gid)),
                            ],
                        )
                    })
                }),
                ("args", |r| list(r, |r| string(r, &["sh"]))),
                ("cwd", |r| string(r, &["/"])),
            ],
        )
    })
}

fn annotations(r: &mut Rng) -> String {
    or_odd(r, |r| {
        let n = r.below(4);
        let members: Vec<String> = (0..n)
            .map(|_| {
                format!(
                    "{}:{}",
                    lit(r.pick(&["cdi.k8s.io/a", "cdi.k8s.io/A", "a", "A", "\u{212A}"])),
                    string(r, &["nvidia.com/gpu=0", "x", ""])
                )
            })
            .collect();
        format!("{{{}}}", members.join(","))
    })
}

fn mount(r: &mut Rng) -> String {
    or_odd(r, |r| {
        object(
            r,
            &[
                ("destination", |r| {
                    string(
                        r,
                        &["/var/run/nvidia-container-devices/0", "/proc", "/data"],
                    )
                }),
                ("source", |r| string(r, &["/dev/null", "/tmp", "proc"])),
                ("type", |r| string(r, &["bind", "proc", "tmpfs"])),
                ("options", |r| {
                    list(r, |r| string(r, &["bind", "rbind", "ro", "nosuid"]))
                }),
            ],
        )
    })
}

fn device(r: &mut Rng) -> String {
    or_odd(r, |r| {
        object(
            r,
            &[
                ("path", |r| string(r, &["/dev/nvidia0", "/dev/fuse"])),
                ("type", |r| string(r, &["c", "b"])),
                ("major", |r| r.pick(&["195", "10", "-1", "1.5"]).into()),
                ("minor", |r| r.pick(&["0", "229"]).into()),
            ],
        )
    })
}

fn rule(r: &mut Rng) -> String {
    or_odd(r, |r| {
        object(
            r,
            &[
                ("allow", |r| r.pick(&["true", "false", "null", "1"]).into()),
                ("type", |r| string(r, &["c", "a"])),
                ("major", |r| r.pick(&["195", "null", "-1"]).into()),
                ("minor", |r| r.pick(&["0", "null"]).into()),
                ("access", |r| string(r, &["rwm", "r"])),
            ],
        )
    })
}

fn linux(r: &mut Rng) -> String {
    or_odd(r, |r| {
        object(
            r,
            &[
                ("devices", |r| list(r, device)),
                ("resources", |r| {
                    or_odd(r, |r| object(r, &[("devices", |r| list(r, rule))]))
                }),
                ("cgroupsPath", |r| string(r, &["/x"])),
            ],
        )
    })
}

fn hook(r: &mut Rng) -> String {
    or_odd(r, |r| {
        object(
            r,
            &[
                ("path", |r| {
                    string(
                        r,
                        &["/usr/bin/nvidia-container-runtime-hook", "/usr/bin/true"],
                    )
                }),
                ("args", |r| list(r, |r| string(r, &["prestart"]))),
            ],
        )
    })
}

fn spec_text(r: &mut Rng) -> String {
    object(
        r,
        &[
            ("ociVersion", |r| string(r, &["1.0.2"])),
            ("process", process),
            ("root", |r| {
                or_odd(r, |r| {
                    object(
                        r,
                        &[
                            ("path", |r| string(r, &["rootfs", "/r"])),
                            ("readonly", |r| r.pick(&["true", "false"]).into()),
                        ],
                    )
                })
            }),
            ("mounts", |r| list(r, mount)),
            ("hooks", |r| {
                or_odd(r, |r| {
                    object(
                        r,
                        &[
                            ("prestart", |r| list(r, hook)),
                            ("poststop", |r| list(r, hook)),
                        ],
                    )
                })
            }),
            ("annotations", annotations),
            ("linux", linux),
        ],
    )
}

/// A string field as the shim's code reads it, in Go's terms: missing or null is Go's zero
/// value "" (the shim's `as_str()` reads both as no value, and "" decides the same: no
/// destination, source or type the shim looks for is empty); a string is itself.
fn str_field(v: &Value, k: &str) -> Value {
    match v.get(k) {
        None | Some(Value::Null) => json!(""),
        Some(s) => s.clone(),
    }
}

fn array(v: Option<&Value>) -> Vec<Value> {
    v.and_then(Value::as_array).cloned().unwrap_or_default()
}

/// What the shim saw, in the shape tests/go/specread prints: the [`View`] the create path
/// decides from, and the sections `spec::apply` reads before it adds to them (by the exact
/// keys it reads them with).
fn shim_saw(doc: &Value, view: &View) -> Value {
    let mounts: Vec<Value> = view
        .mounts
        .iter()
        .map(|m| {
            json!({
                "destination": str_field(m, "destination"),
                "type": str_field(m, "type"),
                "source": str_field(m, "source"),
                // An option is only ever compared with "bind" and "rbind": null, Go's "",
                // is neither to either reader.
                "options": array(m.get("options")).iter().map(|o| if o.is_null() { json!("") } else { o.clone() }).collect::<Vec<_>>(),
            })
        })
        .collect();
    let devices: Vec<Value> = array(doc.pointer("/linux/devices"))
        .iter()
        .map(|d| str_field(d, "path"))
        .collect();
    let rules: Vec<Value> = array(doc.pointer("/linux/resources/devices"))
        .iter()
        .map(|r| {
            json!({
                "allow": r.get("allow").cloned().filter(|a| !a.is_null()).unwrap_or(json!(false)),
                "type": str_field(r, "type"),
                "major": r.get("major").cloned().unwrap_or(Value::Null),
                "minor": r.get("minor").cloned().unwrap_or(Value::Null),
                "access": str_field(r, "access"),
            })
        })
        .collect();
    let annotations: BTreeMap<&str, &str> = view
        .annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    json!({
        "env": view.env,
        "privileged": view.privileged,
        "additionalGids": array(doc.pointer("/process/user/additionalGids"))
            .iter()
            .map(|g| spec::go_gid(g).map_or_else(|| g.clone(), Value::from))
            .collect::<Vec<_>>(),
        "annotations": annotations,
        "root": view.root_path,
        "mounts": mounts,
        "devices": devices,
        "rules": rules,
        "docker_gpu_hook": view.docker_gpu_hook,
    })
}

/// Go's line, with the shim's two derived facts computed as the shim computes them.
fn go_saw(mut go: Value) -> Value {
    let obj = go.as_object_mut().unwrap();
    let bounding = obj.remove("bounding").unwrap();
    obj.insert(
        "privileged".into(),
        json!(bounding
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "CAP_SYS_ADMIN")),
    );
    let prestart = obj.remove("prestart").unwrap();
    obj.insert(
        "docker_gpu_hook".into(),
        json!(prestart.as_array().unwrap().iter().any(|p| {
            std::path::Path::new(p.as_str().unwrap())
                .file_name()
                .is_some_and(|n| n == spec::DOCKER_GPU_HOOK)
        })),
    );
    go
}

#[derive(Default, Debug)]
struct Tally {
    shim_refused: usize,
    runc_refused: usize,
    /// runc runs it, the shim refuses it: not a hole, but a container that may be refused.
    only_shim_refused: usize,
    same: usize,
}

/// Runs `specs` through Go and the shim; returns the tally and every mismatch.
fn compare(specs: &[String]) -> (Tally, Vec<String>) {
    let bin = specread();
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input: String = specs.iter().map(|s| format!("{s}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let lines: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap)
        .collect();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(lines.len(), specs.len(), "one line from Go per spec");

    let mut tally = Tally::default();
    let mut mismatches = Vec::new();
    for (text, line) in specs.iter().zip(&lines) {
        let go: Value = serde_json::from_str(line).unwrap();
        let runc_refuses = go.get("err").is_some();
        let shim = spec::parse(text.as_bytes())
            .ok()
            .filter(|_| golang::check(text.as_bytes()).is_ok());
        let Some((doc, view)) = shim else {
            tally.shim_refused += 1;
            tally.only_shim_refused += usize::from(!runc_refuses);
            continue;
        };
        if runc_refuses {
            tally.runc_refused += 1;
            continue;
        }
        let (shim, go) = (shim_saw(&doc, &view), go_saw(go));
        if shim == go {
            tally.same += 1;
        } else {
            mismatches.push(format!("spec {text}\n  shim {shim}\n  runc {go}"));
        }
    }
    (tally, mismatches)
}

#[test]
fn the_shim_sees_what_runc_sees_or_refuses() {
    let mut r = Rng(0x5eed_1234_abcd_0001);
    let specs: Vec<String> = (0..SPECS).map(|_| spec_text(&mut r)).collect();
    let (tally, mismatches) = compare(&specs);
    eprintln!("{SPECS} specs: {tally:?}");
    assert!(
        mismatches.is_empty(),
        "{} of {SPECS} specs read otherwise by the shim than by runc; first ones:\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(5)].join("\n")
    );
    // The generator must reach every outcome, or the comparison proves little.
    assert!(tally.same > SPECS / 10, "{tally:?}");
    assert!(tally.shim_refused > SPECS / 20, "{tally:?}");
    assert!(tally.runc_refused > SPECS / 20, "{tally:?}");
}

/// The spellings issue 14 names, and the ones the generator found, kept as fixed cases.
#[test]
fn known_spellings_are_refused_or_read_alike() {
    let specs: Vec<String> = [
        r#"{"process":{"capabilities":{"bounding":["CAP_SYS_ADMIN"],"Bounding":["CAP_KILL"]}}}"#,
        r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]},"Process":{"env":["A=1"]}}"#,
        r#"{"mounts":[{"destination":"/var/run/nvidia-container-devices/0","\u017Fource":"/dev/null","type":"bind"}]}"#,
        r#"{"hoo\u212As":{"prestart":[{"path":"/usr/bin/nvidia-container-runtime-hook"}]}}"#,
        r#"{"annotations":{"cdi.k8s.io/a":"x"},"annotations":{"b":"y"}}"#,
        r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"\u0065nv":["NVIDIA_VISIBLE_DEVICES=1"]}}"#,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (tally, mismatches) = compare(&specs);
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert_eq!(tally.shim_refused, specs.len(), "{tally:?}");
}
