//! The names kubelet's DRA path knows drivers and devices by: a profile's driver name
//! (`gcu.enflame.com` from its `cdi-kind` `enflame.com/gcu`, the style NVIDIA's and AMD's
//! drivers use) and its devices' names in a ResourceSlice (DNS labels made from what each
//! device keeps: `gcu-3` for `/dev/gcu3`, `gpu-0` for NVIDIA's minor 0 as NVIDIA's driver
//! names it, `gpu-0000-c3-00-0` for a DRM-class device's PCI function; never a position, which
//! the scheduler would count for whatever device comes to stand there). The DRA driver
//! publishes them, `accel-ctk list` shows them, the exporter maps claims back with them.

use crate::discovery::Key;
use crate::profile::Profile;

/// Whether `s` is a DNS label: lower-case letters, digits and `-`, 1 to 63 characters,
/// starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS subdomain of at most `max` characters (labels joined by dots).
pub fn is_dns_subdomain(s: &str, max: usize) -> bool {
    s.len() <= max && s.split('.').all(is_dns_label)
}

/// The driver name of `profile`: `override_name` when given, else the profile's `cdi-kind`
/// turned around (`vendor.com/class` → `class.vendor.com`). A name that is not a DNS
/// subdomain of at most 63 characters (the API's rule for `spec.driver`) is an error.
pub fn driver_name(profile: &Profile, override_name: Option<&str>) -> Result<String, String> {
    let name = match override_name {
        Some(n) => n.to_string(),
        None => {
            let kind = profile.cdi_kind.as_deref().ok_or_else(|| {
                format!(
                    "profile {}: no cdi-kind to derive a driver name from (pass --driver-name {}=<name>)",
                    profile.name, profile.name
                )
            })?;
            let (vendor, class) = kind.split_once('/').unwrap_or((kind, ""));
            let class = dns_label(class);
            if class.is_empty() {
                vendor.to_ascii_lowercase()
            } else {
                format!("{class}.{}", vendor.to_ascii_lowercase())
            }
        }
    };
    if !is_dns_subdomain(&name, 63) {
        return Err(format!(
            "profile {}: driver name {name:?} is not a DNS subdomain of at most 63 characters",
            profile.name
        ));
    }
    Ok(name)
}

/// `s` as a DNS label's characters: lower case, anything else than a letter or digit a `-`.
pub fn dns_label(s: &str) -> String {
    crate::discovery::dns_chars(s).trim_matches('-').to_string()
}

/// The device's name in the DRA driver's ResourceSlices (and so in claims' allocations), from
/// what it keeps: `<class>-<key>` (`gcu-3`, `gpu-0000-c3-00-0`), the class from `cdi-kind`, else the profile's name. At most 63
/// characters: the class is cut to 50, a key's label is at most 12.
pub fn device_name(profile: &Profile, key: &Key) -> String {
    let class = profile
        .cdi_kind
        .as_deref()
        .and_then(|k| k.split_once('/'))
        .map(|(_, c)| dns_label(c))
        .filter(|c| !c.is_empty() && c.len() <= 50)
        .unwrap_or_else(|| {
            let mut l = dns_label(&profile.name);
            l.truncate(50);
            l.trim_end_matches('-').to_string()
        });
    format!("{class}-{}", key.label())
}

/// The names of the shares and parts of device `whole` that a profile's `[sharing]`
/// declares (docs/sharing.md): `<whole>-shared` where it shares by capacity, then
/// `<whole>-<partition>-<k>` for each partition. The DRA driver publishes them where the
/// device's memory is known; the exporter maps a claim on any of them back to the device.
pub fn offer_names(sharing: Option<&super::sharing::Sharing>, whole: &str) -> Vec<String> {
    let Some(s) = sharing else {
        return Vec::new();
    };
    let mut out: Vec<String> = s
        .capacity
        .iter()
        .map(|_| format!("{whole}-shared"))
        .collect();
    for p in &s.partitions {
        out.extend((0..p.count).map(|k| format!("{whole}-{}-{k}", p.name)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_follow_the_cdi_kind() {
        let mut p = crate::config::Config::builtin()
            .profiles
            .into_iter()
            .find(|p| p.name == "nvidia")
            .unwrap();
        assert_eq!(driver_name(&p, None).unwrap(), "gpu.nvidia.com");
        assert_eq!(
            driver_name(&p, Some("gpu.example.com")).unwrap(),
            "gpu.example.com"
        );
        let e = driver_name(&p, Some("Bad_Name")).unwrap_err();
        assert!(e.contains("\"Bad_Name\" is not a DNS subdomain"), "{e}");
        p.cdi_kind = None;
        assert!(driver_name(&p, None).unwrap_err().contains("no cdi-kind"));
    }

    #[test]
    fn device_names_are_made_of_what_a_device_keeps() {
        let p = crate::config::builtin_nvidia();
        assert_eq!(device_name(&p, &Key::Number(3)), "gpu-3");
        assert_eq!(
            device_name(&p, &Key::Bus("0000:C3:00.0".into())),
            "gpu-0000-c3-00-0"
        );
        let mut q = p.clone();
        q.cdi_kind = None;
        q.name = "Vendor_X".into();
        assert_eq!(device_name(&q, &Key::Number(0)), "vendor-x-0");
    }
}
