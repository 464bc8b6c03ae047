//! The names a profile's driver goes by: its driver name (`gcu.enflame.com` from the
//! profile's `cdi-kind` `enflame.com/gcu`, the style NVIDIA's and AMD's drivers use), its
//! devices' names in a ResourceSlice (DNS labels made from what each device keeps: `gcu-3`
//! for `/dev/gcu3`, `gpu-0` for NVIDIA's minor 0 as NVIDIA's driver names it,
//! `gpu-0000-c3-00-0` for a DRM-class device's PCI function; never a position, which the
//! scheduler would count for whatever device comes to stand there), and the per-claim CDI
//! names (vendor `k8s.<driver>`, class `claim`, device `<claim UID>-<device>`, as the example
//! driver and NVIDIA's write them, so runtimes never see a name reused for other edits).

use crate::kubelet::inventory::dns_label as label;
pub use crate::kubelet::inventory::dra_name as device_name;
use crate::profile::Profile;

/// The standard attribute domain of Kubernetes (`resource.kubernetes.io/pciBusID`).
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

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
            let class = label(class);
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

/// The CDI kind of `driver`'s per-claim specs.
pub fn claim_kind(driver: &str) -> String {
    format!("k8s.{driver}/claim")
}

/// The fully-qualified CDI name of `device` in claim `uid`'s spec.
pub fn claim_cdi_id(driver: &str, uid: &str, device: &str) -> String {
    format!("{}={uid}-{device}", claim_kind(driver))
}

/// The file name of claim `uid`'s CDI spec (`k8s.gcu.enflame.com-claim_<uid>.json`).
pub fn claim_spec_file(driver: &str, uid: &str) -> String {
    format!("k8s.{driver}-claim_{uid}.json")
}

/// Whether a claim UID kubelet sent may name files: an API server's UIDs are RFC 4122
/// strings; anything else (a `/`, `..`) never reaches a path.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b.is_ascii_lowercase())
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
    fn uids_that_could_leave_a_directory_are_refused() {
        assert!(valid_uid("0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e2f"));
        for bad in ["", "../x", "a/b", "x.json", &"a".repeat(65)] {
            assert!(!valid_uid(bad), "{bad}");
        }
    }

    #[test]
    fn claim_names() {
        assert_eq!(
            claim_cdi_id("gcu.enflame.com", "u1", "gcu-0"),
            "k8s.gcu.enflame.com/claim=u1-gcu-0"
        );
        assert_eq!(
            claim_spec_file("gcu.enflame.com", "u1"),
            "k8s.gcu.enflame.com-claim_u1.json"
        );
    }
}
