//! The per-claim CDI names (vendor `k8s.<driver>`, class `claim`, device `<claim
//! UID>-<device>`, as the example driver and NVIDIA's write them, so runtimes never see a name
//! reused for other edits) and the claim UIDs that may name files. The driver's and its
//! devices' names are kubelet's floor's ([`crate::kubelet::names`]).

/// The standard attribute domain of Kubernetes (`resource.kubernetes.io/pciBusID`).
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

/// The CDI kind of `driver`'s per-claim specs.
pub fn claim_kind(driver: &str) -> String {
    format!("k8s.{driver}/claim")
}

/// The fully-qualified CDI name of `device` in claim `uid`'s spec.
pub fn claim_cdi_id(driver: &str, uid: &str, device: &str) -> String {
    format!("{}={}", claim_kind(driver), claim_device_name(uid, device))
}

/// The name of claim `uid`'s device `device` in its CDI spec (`<uid>-gcu-3`).
pub fn claim_device_name(uid: &str, device: &str) -> String {
    format!("{uid}-{device}")
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
