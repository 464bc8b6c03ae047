//! Readings from a vendor CLI (`[[metrics.commands]]`): the binary found in the profile's
//! binary-search-dirs under driver-root, run with a cleared environment, in its own process
//! group, chrooted into driver-root when that is not `/` (so it finds its libraries and
//! device nodes as on the host, and sees nothing of the exporter's container), and killed,
//! group and all, past its time limit. Its output is read up to a limit and parsed in the
//! declared format; anything else gives no value and a `parse` failure.

use std::time::Duration;

use super::profile::{CommandFormat, DeviceKey, MetricCommand};
use crate::exporter::snapshot::{Failure, Reading};
use crate::profile::Profile;
pub use crate::vendortool::{locate, run, MAX_OUTPUT};

use super::{normal_bus, DeviceRef};

fn source(c: &MetricCommand) -> String {
    format!("command {}", c.binary)
}

/// `arg` with the device's values in place of its placeholders.
fn expand(arg: &str, dev: &DeviceRef<'_>) -> Option<String> {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = open + rest[open..].find('}')?;
        let v = match &rest[open + 1..close] {
            "index" => dev.index.to_string(),
            "bus" => dev.pci_bus_id?.to_string(),
            "uuid" => dev.uuid?.to_string(),
            "minor" => dev.minor?.to_string(),
            _ => return None,
        };
        out.push_str(&v);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// A field's text as a number: its first token. Text with no digit (`N/A`, `[Not
/// Supported]`, `-`) is a value the device does not have: `Ok(None)`.
fn field(text: &str) -> Result<Option<f64>, ()> {
    let t = text.trim();
    if !t.bytes().any(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    let tok = t.split_whitespace().next().unwrap_or("");
    match tok.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(Some(v)),
        _ => Err(()),
    }
}

fn row_is(key: DeviceKey, text: &str, dev: &DeviceRef<'_>) -> bool {
    let text = text.trim();
    match key {
        DeviceKey::Index => text.parse::<u32>().ok() == Some(dev.index),
        DeviceKey::Minor => dev.minor.is_some() && text.parse::<u32>().ok() == dev.minor,
        DeviceKey::Uuid => dev.uuid.is_some_and(|u| u.eq_ignore_ascii_case(text)),
        DeviceKey::Bus => dev
            .pci_bus_id
            .is_some_and(|b| normal_bus(b) == normal_bus(text)),
    }
}

/// The readings of one device from output `text` in `c`'s format (for csv, its row).
fn parse(
    c: &MetricCommand,
    text: &str,
    dev: &DeviceRef<'_>,
    out: &mut Vec<Reading>,
    failed: &mut Vec<Failure>,
) {
    let bad = |failed: &mut Vec<Failure>, metric, detail: String| {
        failed.push(Failure::new(source(c), metric, "parse", detail));
    };
    let values: Vec<(usize, &str)> = match c.format {
        CommandFormat::Csv => {
            let (Some(key), Some(at)) = (c.key, c.key_column) else {
                return;
            };
            let row = text.lines().find_map(|l| {
                let cols: Vec<&str> = l.split(',').collect();
                cols.get(at)
                    .is_some_and(|k| row_is(key, k, dev))
                    .then_some(cols)
            });
            let Some(cols) = row else {
                bad(
                    failed,
                    None,
                    format!("no row for device {} in its output", dev.index),
                );
                return;
            };
            c.fields
                .iter()
                .enumerate()
                .filter_map(|(i, f)| Some((i, *cols.get(f.column?)?)))
                .collect()
        }
        CommandFormat::KeyValue => c
            .fields
            .iter()
            .enumerate()
            .filter_map(|(i, f)| {
                let want = f.key.as_deref()?;
                text.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == want).then_some((i, v))
                })
            })
            .collect(),
    };
    for (i, f) in c.fields.iter().enumerate() {
        let Some((_, text)) = values.iter().find(|(j, _)| *j == i) else {
            bad(
                failed,
                Some(f.metric),
                format!(
                    "device {}: no {} in its output",
                    dev.index,
                    f.key
                        .clone()
                        .unwrap_or_else(|| format!("column {}", f.column.unwrap_or(0)))
                ),
            );
            continue;
        };
        match field(text) {
            Ok(Some(v)) => out.push(Reading {
                kind: f.metric,
                label: f.label.clone(),
                value: v * f.scale,
            }),
            Ok(None) => {}
            Err(()) => bad(
                failed,
                Some(f.metric),
                format!(
                    "device {}: not a number: {}",
                    dev.index,
                    crate::quote::quote(text.trim())
                ),
            ),
        }
    }
}

/// Every command of the profile, for every device: readings into `out` (one list per device
/// of `devs`), failures into `failed`.
pub fn read(
    profile: &Profile,
    commands: &[MetricCommand],
    devs: &[DeviceRef<'_>],
    out: &mut [Vec<Reading>],
    failed: &mut Vec<Failure>,
) {
    for c in commands {
        let Some((program, chroot)) = locate(profile, &c.binary) else {
            failed.push(Failure::new(
                source(c),
                None,
                "not-found",
                format!(
                    "{} is in none of binary-search-dirs under {}",
                    c.binary,
                    profile.driver_root.display()
                ),
            ));
            continue;
        };
        let timeout = Duration::from_secs_f64(c.timeout_seconds);
        let per_device = c.args.iter().any(|a| a.contains('{'));
        let mut once: Option<Result<String, (&'static str, String)>> = None;
        for (dev, readings) in devs.iter().zip(out.iter_mut()) {
            let result = if per_device {
                let Some(args) = c
                    .args
                    .iter()
                    .map(|a| expand(a, dev))
                    .collect::<Option<Vec<_>>>()
                else {
                    failed.push(Failure::new(
                        source(c),
                        None,
                        "missing",
                        format!("device {} lacks a value its arguments name", dev.index),
                    ));
                    continue;
                };
                run(&program, chroot.as_deref(), &args, timeout)
                    .map(|d| String::from_utf8_lossy(&d).into_owned())
            } else {
                once.get_or_insert_with(|| {
                    run(&program, chroot.as_deref(), &c.args, timeout)
                        .map(|d| String::from_utf8_lossy(&d).into_owned())
                })
                .clone()
            };
            match result {
                Ok(text) => parse(c, &text, dev, readings, failed),
                Err((reason, detail)) => {
                    failed.push(Failure::new(source(c), None, reason, detail));
                    // One failed run for all devices is one failure, not one per device.
                    if !per_device {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exporter::sources::profile::{CommandField, MetricKind};
    use std::path::Path;

    fn csv() -> MetricCommand {
        MetricCommand {
            binary: "efsmi".into(),
            args: vec![],
            format: CommandFormat::Csv,
            key: Some(DeviceKey::Bus),
            key_column: Some(0),
            timeout_seconds: 1.0,
            fields: vec![
                CommandField {
                    metric: MetricKind::MemoryUsed,
                    label: None,
                    column: Some(1),
                    key: None,
                    scale: 2.0,
                },
                CommandField {
                    metric: MetricKind::Power,
                    label: None,
                    column: Some(2),
                    key: None,
                    scale: 1.0,
                },
            ],
        }
    }

    #[test]
    fn csv_rows_are_found_by_bus_and_bad_fields_fail_alone() {
        let dev = DeviceRef {
            index: 1,
            pci_bus_id: Some("0000:3b:00.0"),
            minor: None,
            uuid: None,
        };
        let (mut out, mut failed) = (Vec::new(), Vec::new());
        let text = "00000000:1A:00.0, 5, 7\n00000000:3B:00.0, 10, N/A\n";
        parse(&csv(), text, &dev, &mut out, &mut failed);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value, 20.0);
        assert!(failed.is_empty(), "{failed:?}");
        parse(
            &csv(),
            "0000:3b:00.0, 1x0, 3\n",
            &dev,
            &mut out,
            &mut failed,
        );
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].reason, "parse");
        assert_eq!(failed[0].metric, "memory-used");
        failed.clear();
        parse(&csv(), "garbage\n\0\u{7f}", &dev, &mut out, &mut failed);
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].detail.contains("no row"), "{failed:?}");
    }

    #[test]
    fn a_command_that_hangs_is_killed_at_its_limit() {
        let t = std::time::Instant::now();
        let e = run(
            Path::new("/bin/sh"),
            None,
            &["-c".into(), "sleep 30 & sleep 30".into()],
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert_eq!(e.0, "timeout", "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let e = run(
            Path::new("/bin/sh"),
            None,
            &["-c".into(), "exit 3".into()],
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert_eq!(e.0, "exit-status");
    }
}
