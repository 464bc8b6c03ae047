//! `NVIDIA_REQUIRE_*`: what an image says it needs from the host driver, checked before a
//! container is made.
//!
//! Grammar, as NVIDIA documents it for its toolkit ("Environment variables (OCI spec)" in the
//! container toolkit docs): in one variable, **space-separated** constraints are **ORed**
//! and **comma-separated** ones are **ANDed**; several `NVIDIA_REQUIRE_*` variables are ANDed.
//! A constraint is `<key><op><value>` with key `cuda`, `driver`, `arch` or `brand` and op one
//! of `=`, `==`, `!=`, `<`, `<=`, `>`, `>=`. So CUDA images' value
//! `cuda>=12.4 brand=tesla,driver>=470,driver<471 ...` reads: a driver supporting CUDA 12.4,
//! *or* a Tesla on the 470 branch (which runs newer CUDA through the compat libraries).
//! An image from before the variable existed (`CUDA_VERSION=X.Y.Z`, no `NVIDIA_REQUIRE_CUDA`)
//! needs `cuda>=X.Y`, as libnvidia-container treats such images. `NVIDIA_DISABLE_REQUIRE`
//! true skips every check.
//!
//! The host's CUDA version is never obtained by loading `libcuda` into the runtime (that
//! would run driver code, and whatever the driver root holds, in a process that then execs
//! runc). It is looked up in the profile's table of the minimum driver of each CUDA release
//! (NVIDIA's CUDA toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions"),
//! from the driver version the profile's `version-file` gives. `arch` and `brand` need the
//! GPUs' properties from NVML, which the runtime does not load either: a constraint on them is
//! unmet, so an alternative that needs one can only be met by another alternative (for CUDA
//! images, `cuda>=`). The names here come from the profile; the function is pure.
//! Ref: NVIDIA container toolkit docs, docker-specialized.html "NVIDIA_REQUIRE_*";
//! <https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/> Table 3.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use crate::quote::quote;

/// What the host offers, for [`check`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// The driver version (`550.54.14`).
    pub driver: Option<String>,
    /// The highest CUDA version it runs (`12.4`).
    pub cuda: Option<String>,
}

impl Host {
    /// `cuda` from `driver` through a table of minimum driver (key) per CUDA version (value).
    pub fn from_driver(driver: Option<String>, cuda_by_driver: &BTreeMap<String, String>) -> Host {
        let cuda = driver
            .as_deref()
            .and_then(|d| cuda_for_driver(d, cuda_by_driver));
        Host { driver, cuda }
    }

    fn describe(&self) -> String {
        match (&self.driver, &self.cuda) {
            (Some(d), Some(c)) => format!("this host has driver {d}, which supports CUDA {c}"),
            (Some(d), None) => format!("this host has driver {d}, whose CUDA version is unknown"),
            (None, _) => "this host's driver version is unknown".to_string(),
        }
    }
}

/// The highest CUDA version whose minimum driver is at most `driver`.
pub fn cuda_for_driver(driver: &str, table: &BTreeMap<String, String>) -> Option<String> {
    table
        .iter()
        .filter(|(min, _)| compare_versions(driver, min) != Ordering::Less)
        .map(|(_, cuda)| cuda)
        .max_by(|a, b| compare_versions(a, b))
        .cloned()
}

/// Dotted numbers compared part by part, a missing part as 0 (`12.4` == `12.4.0`); a part
/// that is not a number compares as 0.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let parts = |s: &str| -> Vec<u64> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    let (a, b) = (parts(a), parts(b));
    for i in 0..a.len().max(b.len()) {
        let o = a.get(i).unwrap_or(&0).cmp(b.get(i).unwrap_or(&0));
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequireError {
    #[error("{var}={value}: {msg}")]
    Invalid {
        var: String,
        value: String,
        msg: String,
    },
    #[error("{var}={value}: not met: {host} (set NVIDIA_DISABLE_REQUIRE=true to skip)")]
    Unmet {
        var: String,
        value: String,
        host: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One `key op value`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Constraint<'a> {
    key: &'a str,
    op: Op,
    value: &'a str,
}

const KEYS: [&str; 4] = ["cuda", "driver", "arch", "brand"];

fn parse_constraint(text: &str) -> Result<Constraint<'_>, String> {
    let at = text
        .find(['=', '!', '<', '>'])
        .ok_or_else(|| format!("constraint {} has no operator", quote(text)))?;
    let (key, rest) = text.split_at(at);
    let (op, value) = [
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("=", Op::Eq),
        ("<", Op::Lt),
        (">", Op::Gt),
    ]
    .iter()
    .find_map(|(s, op)| Some((*op, rest.strip_prefix(s)?)))
    .ok_or_else(|| format!("constraint {} has a bad operator", quote(text)))?;
    if !KEYS.contains(&key) {
        return Err(format!(
            "constraint {} names unknown {}; known: {}",
            quote(text),
            quote(key),
            KEYS.join(", ")
        ));
    }
    if value.is_empty() || value.contains(['=', '!', '<', '>']) {
        return Err(format!("constraint {} has a bad value", quote(text)));
    }
    let versioned = matches!(key, "cuda" | "driver" | "arch");
    if versioned
        && !value
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "constraint {}: {} is not a dotted number",
            quote(text),
            quote(value)
        ));
    }
    if key == "brand" && !matches!(op, Op::Eq | Op::Ne) {
        return Err(format!(
            "constraint {}: brand takes only = or !=",
            quote(text)
        ));
    }
    Ok(Constraint { key, op, value })
}

impl Constraint<'_> {
    fn met(&self, host: &Host) -> bool {
        let have = match self.key {
            "cuda" => host.cuda.as_deref(),
            "driver" => host.driver.as_deref(),
            // arch and brand come from NVML, which the runtime never loads (module docs).
            _ => None,
        };
        let Some(have) = have else {
            return false;
        };
        let o = compare_versions(have, self.value);
        match self.op {
            Op::Eq => o == Ordering::Equal,
            Op::Ne => o != Ordering::Equal,
            Op::Lt => o == Ordering::Less,
            Op::Le => o != Ordering::Greater,
            Op::Gt => o == Ordering::Greater,
            Op::Ge => o != Ordering::Less,
        }
    }
}

/// Whether one variable's expression is met: any space-separated alternative whose
/// comma-separated constraints all hold. The whole value is checked for syntax first, so a
/// typo is an error even when an earlier alternative is met.
fn expression_met(value: &str, host: &Host) -> Result<bool, String> {
    let mut alternatives = Vec::new();
    for alt in value.split_ascii_whitespace() {
        let constraints: Vec<Constraint<'_>> = alt
            .split(',')
            .map(parse_constraint)
            .collect::<Result<_, _>>()?;
        alternatives.push(constraints);
    }
    if alternatives.is_empty() {
        return Ok(true);
    }
    Ok(alternatives
        .iter()
        .any(|all| all.iter().all(|c| c.met(host))))
}

/// The names `check` reads: a prefix (`NVIDIA_REQUIRE_`), the switch that disables the
/// checks, and the legacy CUDA version variable.
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    pub prefix: &'a str,
    pub disable: Option<&'a str>,
    pub legacy_cuda: Option<&'a str>,
}

/// Checks every requirement in `env` (the container's variables, last value per name)
/// against `host`. Variables are checked in name order, so the error is the same every time.
/// Linear in the size of `env` (n log n for the sort of the names): one map of each name's
/// last value, never a scan of `env` per name (issue 23, class 2).
pub fn check(names: Names<'_>, env: &[(&str, &str)], host: &Host) -> Result<(), RequireError> {
    let last: HashMap<&str, &str> = env.iter().copied().collect();
    let get = |name: &str| last.get(name).copied();
    if let Some(d) = names.disable.and_then(get) {
        // Go's strconv.ParseBool, as NVIDIA's toolkit reads it.
        if matches!(d, "1" | "t" | "T" | "true" | "TRUE" | "True") {
            return Ok(());
        }
    }
    let mut vars: Vec<&str> = last
        .keys()
        .copied()
        .filter(|k| k.len() > names.prefix.len() && k.starts_with(names.prefix))
        .collect();
    vars.sort_unstable();
    let mut checks: Vec<(String, String)> = vars
        .iter()
        .filter_map(|k| Some((k.to_string(), get(k)?.to_string())))
        .collect();
    let require_cuda = format!("{}CUDA", names.prefix);
    if !vars.contains(&require_cuda.as_str()) {
        if let Some((var, version)) = names
            .legacy_cuda
            .and_then(|v| Some((v, get(v)?)))
            .filter(|(_, v)| !v.is_empty())
        {
            let mut parts = version.split('.');
            let (Some(major), minor) = (parts.next(), parts.next()) else {
                unreachable!("split yields at least one part");
            };
            checks.push((
                var.to_string(),
                format!("cuda>={major}.{}", minor.unwrap_or("0")),
            ));
        }
    }
    for (var, value) in checks {
        let shown = quote(&value);
        match expression_met(&value, host) {
            Ok(true) => {}
            Ok(false) => {
                return Err(RequireError::Unmet {
                    var,
                    value: shown,
                    host: host.describe(),
                })
            }
            Err(msg) => {
                return Err(RequireError::Invalid {
                    var,
                    value: shown,
                    msg,
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVIDIA: Names<'static> = Names {
        prefix: "NVIDIA_REQUIRE_",
        disable: Some("NVIDIA_DISABLE_REQUIRE"),
        legacy_cuda: Some("CUDA_VERSION"),
    };

    fn table() -> BTreeMap<String, String> {
        [
            ("470.42.01", "11.4"),
            ("525.60.13", "12.0"),
            ("550.54.14", "12.4"),
            ("555.42.02", "12.5"),
            ("570.26", "12.8"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    }

    fn host(driver: &str) -> Host {
        Host::from_driver(Some(driver.into()), &table())
    }

    const CUDA_IMAGE: &str = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471";

    #[test]
    fn host_cuda_is_the_newest_release_the_driver_reaches() {
        assert_eq!(host("550.54.14").cuda.as_deref(), Some("12.4"));
        assert_eq!(host("550.54.13").cuda.as_deref(), Some("12.0"));
        assert_eq!(host("575.51.03").cuda.as_deref(), Some("12.8"));
        assert_eq!(host("470.256.02").cuda.as_deref(), Some("11.4"));
        assert_eq!(host("460.1").cuda, None);
        assert_eq!(compare_versions("12.4", "12.4.0"), Ordering::Equal);
        assert_eq!(compare_versions("12.10", "12.9"), Ordering::Greater);
    }

    #[test]
    fn each_form_met_and_unmet() {
        let h = host("550.54.14");
        for (value, met) in [
            ("cuda>=12.4", true),
            ("cuda>=12.5", false),
            ("cuda>12.3", true),
            ("cuda<12.4", false),
            ("cuda<=12.4.0", true),
            ("cuda=12.4", true),
            ("cuda==12.4", true),
            ("cuda!=12.4", false),
            ("driver>=550", true),
            ("driver>=550,driver<551", true),
            ("driver>=550,driver<550.54", false),
            // OR across spaces: the second alternative holds.
            ("cuda>=13.0 driver>=550", true),
            // brand is never known without NVML: its alternatives never hold alone.
            ("brand=tesla", false),
            ("brand!=tesla", false),
            (CUDA_IMAGE, true),
            ("", true),
            ("   ", true),
        ] {
            assert_eq!(expression_met(value, &h), Ok(met), "{value:?}");
        }
        // A 470 Tesla host is refused for a 12.4 image (brand unknown here), and a 525 host
        // as well: no alternative holds.
        assert_eq!(expression_met(CUDA_IMAGE, &host("470.42.01")), Ok(false));
        assert_eq!(expression_met(CUDA_IMAGE, &host("525.60.13")), Ok(false));
        // Unknown host: nothing version-based holds.
        assert_eq!(expression_met("cuda>=1.0", &Host::default()), Ok(false));
    }

    #[test]
    fn syntax_errors_name_the_constraint() {
        let h = host("550.54.14");
        for (value, says) in [
            ("cuda", "has no operator"),
            ("cuda=>12", "has a bad value"),
            ("gpu>=1", "names unknown \"gpu\""),
            ("cuda>=12.x", "is not a dotted number"),
            ("cuda>=", "has a bad value"),
            ("brand>=tesla", "brand takes only"),
            ("cuda>=12.4 cuda>=", "has a bad value"),
            ("cuda>=12.4,,driver>=1", "has no operator"),
        ] {
            let e = expression_met(value, &h).unwrap_err();
            assert!(e.contains(says), "{value:?}: {e}");
        }
    }

    #[test]
    fn variables_are_anded_disable_and_legacy() {
        let h = host("550.54.14");
        let ok = |env: &[(&str, &str)]| check(NVIDIA, env, &h);
        assert_eq!(ok(&[("NVIDIA_REQUIRE_CUDA", CUDA_IMAGE)]), Ok(()));
        let e = ok(&[
            ("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"),
            ("NVIDIA_REQUIRE_DRIVER", "driver>=560"),
        ])
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "NVIDIA_REQUIRE_DRIVER=\"driver>=560\": not met: this host has driver 550.54.14, which supports CUDA 12.4 (set NVIDIA_DISABLE_REQUIRE=true to skip)"
        );
        let unmet = [("NVIDIA_REQUIRE_CUDA", "cuda>=12.8")];
        assert!(ok(&unmet).is_err());
        for off in ["true", "1", "True"] {
            let env = [unmet[0], ("NVIDIA_DISABLE_REQUIRE", off)];
            assert_eq!(ok(&env), Ok(()), "{off}");
        }
        let env = [unmet[0], ("NVIDIA_DISABLE_REQUIRE", "false")];
        assert!(ok(&env).is_err());
        // The last value of a repeated name counts, as in the container.
        let env = [unmet[0], ("NVIDIA_REQUIRE_CUDA", "cuda>=12.0")];
        assert_eq!(ok(&env), Ok(()));
        // Legacy images: CUDA_VERSION alone means cuda>=major.minor.
        let e = ok(&[("CUDA_VERSION", "12.8.1")]).unwrap_err().to_string();
        assert!(e.starts_with("CUDA_VERSION=\"cuda>=12.8\": not met"), "{e}");
        assert_eq!(ok(&[("CUDA_VERSION", "12.4.1")]), Ok(()));
        assert_eq!(
            ok(&[
                ("CUDA_VERSION", "12.8.1"),
                ("NVIDIA_REQUIRE_CUDA", "cuda>=12.0")
            ]),
            Ok(())
        );
        // A prefix alone is not a requirement; a bad value is quoted short and escaped.
        assert_eq!(ok(&[("NVIDIA_REQUIRE_", "junk")]), Ok(()));
        let long = format!("gpu\n{}", "x".repeat(500));
        let e = ok(&[("NVIDIA_REQUIRE_X", &long)]).unwrap_err().to_string();
        assert!(!e.contains('\n') && e.len() < 700, "{e}");
    }
}
