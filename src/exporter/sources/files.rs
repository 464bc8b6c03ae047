//! Readings from files the kernel driver publishes (sysfs, hwmon): the profile's
//! `[[metrics.files]]`, each a path under driver-root with the device's placeholders, read by
//! [`crate::exporter::read`]'s rule.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::profile::MetricFile;
use crate::exporter::read::{self, MAX_ATTR};
use crate::exporter::snapshot::{Failure, Reading};
use crate::inroot::Root;

use super::DeviceRef;

const SOURCE: &str = "files";

/// The `hwmonN` directories found in one poll, by (directory, chip name): each is looked up
/// once per poll however many files name it.
#[derive(Debug, Default)]
pub struct HwmonCache(HashMap<(PathBuf, String), Option<String>>);

/// The `hwmonN` entry of `dir` whose `name` file reads `chip` (any, the first, when `chip` is
/// empty).
fn hwmon(root: &Root, dir: &Path, chip: &str, cache: &mut HwmonCache) -> Option<String> {
    cache
        .0
        .entry((dir.to_path_buf(), chip.to_string()))
        .or_insert_with(|| {
            crate::discovery::sorted_names_in(root, dir)
                .into_iter()
                .filter(|n| {
                    n.strip_prefix("hwmon")
                        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                })
                .find(|n| {
                    chip.is_empty()
                        || read::read_in_root(root, &dir.join(n).join("name"), MAX_ATTR)
                            .ok()
                            .and_then(|d| String::from_utf8(d).ok())
                            .is_some_and(|t| t.trim() == chip)
                })
        })
        .clone()
}

/// `template` with the device's values in place of its placeholders (checked when the
/// profile was loaded); `Err` names the value the device lacks.
pub fn expand(
    root: &Root,
    template: &str,
    dev: &DeviceRef<'_>,
    cache: &mut HwmonCache,
) -> Result<PathBuf, String> {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c);
        let ph = &rest[open + 1..close];
        rest = rest.get(close + 1..).unwrap_or("");
        let (name, arg) = ph.split_once(':').unwrap_or((ph, ""));
        let value = match name {
            "bus" => dev.pci_bus_id.map(str::to_string),
            "card" => dev.minor.map(|m| m.to_string()),
            "index" => Some(dev.index.to_string()),
            "hwmon" => hwmon(root, Path::new(&out), arg, cache),
            _ => None,
        };
        match value {
            // A value is one path component: a bus id or number never holds a `/`.
            Some(v) if !v.contains('/') && v != ".." => out.push_str(&v),
            _ => return Err(format!("no {{{ph}}} for this device")),
        }
    }
    out.push_str(rest);
    Ok(PathBuf::from(out))
}

/// Every file of `files` for device `dev`: its reading into `out`, or why not into `failed`.
pub fn read(
    root: &Root,
    files: &[MetricFile],
    dev: &DeviceRef<'_>,
    cache: &mut HwmonCache,
    out: &mut Vec<Reading>,
    failed: &mut Vec<Failure>,
) {
    for f in files {
        let path = match expand(root, &f.path, dev, cache) {
            Ok(p) => p,
            Err(_) if f.optional => continue,
            Err(why) => {
                failed.push(Failure::new(
                    SOURCE,
                    Some(f.metric),
                    "missing",
                    format!("{}: {why}", f.path),
                ));
                continue;
            }
        };
        match read::read_in_root(root, &path, MAX_ATTR) {
            Ok(data) => match read::number(&data) {
                Some(v) => out.push(Reading {
                    kind: f.metric,
                    label: f.label.clone(),
                    value: v * f.scale,
                }),
                None => failed.push(Failure::new(
                    SOURCE,
                    Some(f.metric),
                    "parse",
                    format!(
                        "{}: not a number: {}",
                        root.display(&path).display(),
                        crate::quote::quote(&String::from_utf8_lossy(&data[..data.len().min(64)]))
                    ),
                )),
            },
            Err(e) if e.reason == "missing" && f.optional => {}
            Err(e) => failed.push(Failure::new(SOURCE, Some(f.metric), e.reason, e.detail)),
        }
    }
}
