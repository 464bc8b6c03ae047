//! Kubernetes quantities (`8Gi`, `512Mi`, `100`, `1.5Gi`, `2k`) as whole numbers, for the
//! capacities a device is shared by: what a profile declares and what the scheduler writes in
//! a claim's `consumedCapacity`. Only quantities that are a whole number of units are taken
//! (`500m` of memory is not a count of bytes); anything else is refused, never rounded.
//!
//! Ref: k8s.io/apimachinery/pkg/api/resource (quantity.go: suffixes, canonical form).

/// `q` as a whole number, or why not (one phrase, for an error line that names the field).
pub fn parse(q: &str) -> Result<u64, String> {
    let shown = || crate::quote::quote(q);
    let bad = |why: &str| Err(format!("{} is not a quantity{why}", shown()));
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let scale: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => {
            return bad(" of whole units (the suffix is not one of Ki Mi Gi Ti Pi Ei k M G T P E)")
        }
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || frac.contains('.') || (number.contains('.') && frac.is_empty()) {
        return bad("");
    }
    if whole.len() + frac.len() > 30 {
        return bad(" this driver can count");
    }
    let Ok(digits) = format!("{whole}{frac}").parse::<u128>() else {
        return bad("");
    };
    let den = 10u128.pow(frac.len() as u32);
    let scaled = digits
        .checked_mul(scale)
        .filter(|n| n % den == 0)
        .map(|n| n / den);
    match scaled.and_then(|n| u64::try_from(n).ok()) {
        Some(n) => Ok(n),
        None if scaled.is_none() => bad(" of whole units"),
        None => bad(" this driver can count"),
    }
}

/// `n` bytes as the API writes a quantity: `16Gi` where a whole number of GiB, else `Mi`,
/// `Ki`, else a plain number.
pub fn bytes(n: u64) -> String {
    for (suffix, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        if n != 0 && n.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_quantities_parse_and_the_rest_is_refused() {
        for (q, want) in [
            ("0", 0),
            ("100", 100),
            ("8Gi", 8 << 30),
            ("1536Mi", 1536 << 20),
            ("1.5Gi", 1536 << 20),
            ("2k", 2000),
            ("32G", 32_000_000_000),
            ("0.5Ki", 512),
        ] {
            assert_eq!(parse(q), Ok(want), "{q}");
        }
        for q in [
            "",
            "Gi",
            "-1",
            "1.5",
            "500m",
            "1e3",
            "8 Gi",
            "8gi",
            "1..2",
            "1.",
            ".5Gi",
            "99999999999999999999999999999999",
            "16Ei",
            "0.3Ki",
        ] {
            assert!(parse(q).is_err(), "{q:?} parsed");
        }
        assert!(parse("16Ei").unwrap_err().contains("can count"));
        assert!(parse("1.5").unwrap_err().contains("whole units"));
    }

    #[test]
    fn bytes_are_written_in_the_largest_whole_binary_unit() {
        assert_eq!(bytes(32 << 30), "32Gi");
        assert_eq!(bytes(1536 << 20), "1536Mi");
        assert_eq!(bytes(1000), "1000");
        assert_eq!(bytes(0), "0");
        for n in [1u64, 1023, 8 << 30, 3 << 20, 5 << 40] {
            assert_eq!(parse(&bytes(n)), Ok(n));
        }
    }
}
