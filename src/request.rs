//! What a `<VENDOR>_VISIBLE_DEVICES` value asks for, and which discovered devices that is.
//!
//! The grammar is deliberately strict: keywords are lower case (`all`, `none`, `void`), items
//! are separated by a bare comma, and an item with whitespace, an empty item, or an item that
//! names no device is an error naming the variable, the item and what exists. A container that
//! asked for something wrong must not start with less than it asked for.

use crate::discovery::Device;

/// More items than any node has devices is a mistake or an attack; refuse it early.
pub const MAX_ITEMS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Unset, empty or `void`: nothing is injected.
    Nothing,
    /// `none`: the driver (control nodes, libraries) without devices, where the profile says so.
    DriverOnly,
    All,
    /// Items as written, deduplicated, in order. Fully-qualified CDI names are kept apart.
    Items {
        devices: Vec<String>,
        cdi: Vec<String>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("{var}={value}: {msg}")]
    Syntax {
        var: String,
        value: String,
        msg: String,
    },
    #[error("{var}: no device {item} on this node{hint}; {available}")]
    NoSuchDevice {
        var: String,
        item: String,
        /// Why the item might have been meant otherwise (`ALL`: keywords are lower case).
        hint: String,
        available: String,
    },
    #[error("{var}: {item} matches more than one device ({matches}); give the full UUID")]
    Ambiguous {
        var: String,
        item: String,
        matches: String,
    },
}

/// `nvidia.com/gpu=0`: vendor/class=name, as CDI defines a fully-qualified device name.
pub fn is_cdi_name(item: &str) -> bool {
    match item.split_once('=') {
        Some((kind, name)) => {
            kind.split_once('/')
                .is_some_and(|(v, c)| !v.is_empty() && !c.is_empty())
                && !name.is_empty()
        }
        None => false,
    }
}

/// The device ID and replica number of a device plugin's replica `<id>::<k>` (time-slicing:
/// NVIDIA's plugin and ours list a shared device once per replica), `k` a plain decimal.
pub fn split_replica(id: &str) -> Option<(&str, u32)> {
    let (base, k) = id.rsplit_once("::")?;
    if base.is_empty() || index(k).is_none() {
        return None;
    }
    Some((base, k.parse().ok()?))
}

/// Container text in a message: cut and escaped (src/quote.rs).
fn shorten(value: &str) -> String {
    crate::quote::quote(value)
}

/// The device ids a vendor's device-list mounts name (`<dir>/<id>`), as NVIDIA's toolkit reads
/// them: only a bind mount of `/dev/null` counts. A pod cannot make one without a hostPath
/// volume, while an ordinary volume (emptyDir, tmpfs, an image path) at the same destination
/// is any pod's to declare. The keywords `all`, `none` and `void` never come from mounts: a
/// device plugin names devices one by one.
pub fn device_list_from_mounts(dir: &str, mounts: &[serde_json::Value]) -> Vec<String> {
    let str_of =
        |m: &serde_json::Value, k: &str| m.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let mut ids: Vec<String> = Vec::new();
    // A spec may hold tens of thousands of mounts: a set keeps the dedup linear in them.
    let mut seen = std::collections::HashSet::new();
    for m in mounts {
        let (Some(dest), Some(source)) = (str_of(m, "destination"), str_of(m, "source")) else {
            continue;
        };
        let is_bind = str_of(m, "type").as_deref() == Some("bind")
            || m.get("options")
                .and_then(|o| o.as_array())
                .is_some_and(|o| {
                    o.iter()
                        .any(|o| matches!(o.as_str(), Some("bind" | "rbind")))
                });
        if source != "/dev/null" || !is_bind {
            continue;
        }
        let Ok(id) = std::path::Path::new(&dest).strip_prefix(dir) else {
            continue;
        };
        let Some(id) = id.to_str() else { continue };
        if id.is_empty() || id.contains('/') || matches!(id, "all" | "none" | "void") {
            continue;
        }
        if seen.insert(id.to_string()) {
            ids.push(id.to_string());
        }
    }
    ids
}

pub fn parse(var: &str, value: &str) -> Result<Request, RequestError> {
    let syntax = |msg: String| RequestError::Syntax {
        var: var.to_string(),
        value: shorten(value),
        msg,
    };
    match value {
        "" | "void" => return Ok(Request::Nothing),
        "none" => return Ok(Request::DriverOnly),
        "all" => return Ok(Request::All),
        _ => {}
    }
    let items: Vec<&str> = value.split(',').collect();
    if items.len() > MAX_ITEMS {
        return Err(syntax(format!(
            "{} items, at most {MAX_ITEMS} allowed",
            items.len()
        )));
    }
    let (mut devices, mut cdi) = (Vec::new(), Vec::new());
    for item in items {
        if item.is_empty() {
            return Err(syntax(
                "empty item (two commas in a row, or a comma at an end)".into(),
            ));
        }
        if item.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(syntax(format!(
                "item {} contains whitespace or a control character",
                shorten(item)
            )));
        }
        if matches!(item, "all" | "none" | "void") {
            return Err(syntax(format!(
                "{item:?} cannot be combined with other items"
            )));
        }
        let list = if is_cdi_name(item) {
            &mut cdi
        } else {
            &mut devices
        };
        if !list.iter().any(|i| i == item) {
            list.push(item.to_string());
        }
    }
    Ok(Request::Items { devices, cdi })
}

/// Resolves items to devices. `ranges` accepts `a-b` (Ascend).
pub fn select<'d>(
    var: &str,
    items: &[String],
    devices: &'d [Device],
    ranges: bool,
) -> Result<Vec<&'d Device>, RequestError> {
    let mut out: Vec<&Device> = Vec::new();
    let mut push = |d: &'d Device| {
        if !out.iter().any(|o| o.index == d.index) {
            out.push(d);
        }
    };
    let no_such = |item: &str| RequestError::NoSuchDevice {
        var: var.into(),
        item: shorten(item),
        hint: ["all", "none", "void"]
            .iter()
            .find(|k| k.eq_ignore_ascii_case(item))
            .map(|k| format!(" (keywords are lower case: {k:?})"))
            .unwrap_or_default(),
        available: available(devices),
    };
    for item in items {
        // A replica is its device, wherever a device ID is accepted.
        let item = split_replica(item).map_or(item.as_str(), |(base, _)| base);
        if ranges {
            if let Some((a, b)) = item
                .split_once('-')
                .and_then(|(a, b)| Some((index(a)?, index(b)?)))
            {
                if a > b {
                    return Err(no_such(item));
                }
                for i in a..=b {
                    push(
                        devices
                            .iter()
                            .find(|d| d.index == i)
                            .ok_or_else(|| no_such(&i.to_string()))?,
                    );
                }
                continue;
            }
        }
        if let Some(i) = index(item) {
            push(
                devices
                    .iter()
                    .find(|d| d.index == i)
                    .ok_or_else(|| no_such(item))?,
            );
            continue;
        }
        let exact = devices.iter().find(|d| {
            d.uuid.as_deref() == Some(item)
                || d.aliases.iter().any(|a| a == item)
                || d.pci_bus_id
                    .as_deref()
                    .is_some_and(|b| b.eq_ignore_ascii_case(item))
        });
        if let Some(d) = exact {
            push(d);
            continue;
        }
        // A unique UUID prefix (as nvidia-smi accepts) selects that GPU; two is an error.
        let by_prefix: Vec<&Device> = devices
            .iter()
            .filter(|d| item.len() >= 8 && d.uuid.as_deref().is_some_and(|u| u.starts_with(item)))
            .collect();
        match by_prefix.as_slice() {
            [d] => push(d),
            [] => return Err(no_such(item)),
            many => {
                return Err(RequestError::Ambiguous {
                    var: var.into(),
                    item: shorten(item),
                    matches: many
                        .iter()
                        .filter_map(|d| d.uuid.clone())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        }
    }
    Ok(out)
}

/// Plain decimal index without sign or leading zeros; anything else is not an index.
fn index(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

fn available(devices: &[Device]) -> String {
    if devices.is_empty() {
        return "none were found (is the driver loaded? check driver-root)".into();
    }
    let list: Vec<String> = devices
        .iter()
        .map(|d| match &d.uuid {
            Some(u) => format!("{} {u}", d.index),
            None => d.index.to_string(),
        })
        .collect();
    format!("it has {}: {}", devices.len(), list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn gpus() -> Vec<Device> {
        ["GPU-aaaa1111-0000", "GPU-aaaa2222-0000"]
            .iter()
            .enumerate()
            .map(|(i, u)| Device {
                index: i as u32,
                nodes: vec![PathBuf::from(format!("/dev/nvidia{i}"))],
                uuid: Some(u.to_string()),
                pci_bus_id: Some(format!("0000:0{i}:00.0")),
                minor: Some(i as u32),
                aliases: vec![format!("GCU-{i}")],
                model: None,
                duplicate_uuid: None,
            })
            .collect()
    }

    fn sel(v: &str) -> Result<Vec<u32>, RequestError> {
        let devs = gpus();
        match parse("V", v)? {
            Request::Items { devices, .. } => Ok(select("V", &devices, &devs, true)?
                .iter()
                .map(|d| d.index)
                .collect()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keywords() {
        assert_eq!(parse("V", ""), Ok(Request::Nothing));
        assert_eq!(parse("V", "void"), Ok(Request::Nothing));
        assert_eq!(parse("V", "none"), Ok(Request::DriverOnly));
        assert_eq!(parse("V", "all"), Ok(Request::All));
    }

    #[test]
    fn indices_uuids_mixed_and_deduplicated() {
        assert_eq!(sel("1").unwrap(), [1]);
        assert_eq!(sel("1,0,1").unwrap(), [1, 0]);
        assert_eq!(sel("GPU-aaaa2222-0000,0").unwrap(), [1, 0]);
        assert_eq!(sel("GPU-aaaa2222").unwrap(), [1]);
        assert_eq!(sel("GCU-1").unwrap(), [1]);
        assert_eq!(sel("0-1").unwrap(), [0, 1]);
    }

    #[test]
    fn replicas_are_their_devices() {
        assert_eq!(sel("GPU-aaaa2222-0000::2").unwrap(), [1]);
        assert_eq!(sel("1::0,GCU-0::3,1::1").unwrap(), [1, 0]);
        assert_eq!(split_replica("GCU-4::12"), Some(("GCU-4", 12)));
        for v in ["::1", "1::", "1::01", "1::-1", "1::a", "1:2"] {
            assert_eq!(split_replica(v), None, "{v}");
        }
        let e = sel("9::1").unwrap_err().to_string();
        assert!(e.starts_with("V: no device \"9\""), "{e}");
    }

    #[test]
    fn hostile_values_are_errors() {
        for v in [
            "9",
            "-1",
            "99999999999999999999",
            "../../etc",
            "/dev/sda",
            "ALL",
            "01",
            "GPU-ffff",
            "1-0",
            "0-5",
        ] {
            let e = sel(v).unwrap_err().to_string();
            assert!(e.starts_with("V: no device"), "{v}: {e}");
        }
        for v in ["0,,1", " 0", "0,", "all,0", "0\n1"] {
            assert!(
                matches!(parse("V", v), Err(RequestError::Syntax { .. })),
                "{v}"
            );
        }
        let many = vec!["0"; 10_000].join(",");
        assert!(parse("V", &many)
            .unwrap_err()
            .to_string()
            .contains("10000 items"));
        assert!(matches!(
            sel("GPU-aaaa"),
            Err(RequestError::Ambiguous { .. })
        ));
    }

    #[test]
    fn error_names_what_exists() {
        let e = sel("9").unwrap_err().to_string();
        assert_eq!(
            e,
            "V: no device \"9\" on this node; it has 2: 0 GPU-aaaa1111-0000, 1 GPU-aaaa2222-0000"
        );
        let e = sel("ALL").unwrap_err().to_string();
        assert_eq!(
            e,
            "V: no device \"ALL\" on this node (keywords are lower case: \"all\"); it has 2: 0 GPU-aaaa1111-0000, 1 GPU-aaaa2222-0000"
        );
    }

    #[test]
    fn device_lists_come_from_dev_null_binds_only() {
        let dir = "/var/run/nvidia-container-devices";
        let m = |dest: &str, ty: &str, source: &str, opts: &[&str]| serde_json::json!({"destination": format!("{dir}/{dest}"), "type": ty, "source": source, "options": opts});
        let mounts = [
            m("0", "bind", "/dev/null", &["rbind", "ro"]),
            m("1", "none", "/dev/null", &["rbind"]),
            m("2", "tmpfs", "tmpfs", &["nosuid"]),
            m(
                "3",
                "bind",
                "/var/lib/kubelet/pods/x/volumes/empty",
                &["rbind"],
            ),
            m("all", "bind", "/dev/null", &["rbind"]),
            m("none", "bind", "/dev/null", &["rbind"]),
            m("4", "tmpfs", "/dev/null", &[]),
            m("0", "bind", "/dev/null", &["rbind"]),
        ];
        assert_eq!(device_list_from_mounts(dir, &mounts), ["0", "1"]);
    }

    #[test]
    fn cdi_names_are_set_apart() {
        assert_eq!(
            parse("V", "nvidia.com/gpu=0,1"),
            Ok(Request::Items {
                devices: vec!["1".into()],
                cdi: vec!["nvidia.com/gpu=0".into()]
            })
        );
    }
}
