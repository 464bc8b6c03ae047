//! Why a device is unhealthy, typed where its signal is read: each [`Problem`] is a [`Kind`]
//! (what failed, hence how bad: its [`Severity`], and its short name, a label value) and the
//! line the log shows. The DRA taint (its key's severity, its value), the exporter's `reason`
//! label, the daemons' logs and `accel-ctk list` all take the same [`Reason`], so no one reads
//! a severity back out of a sentence.
//!
//! Ref: k8s.io/api/resource/v1 types.go (`DeviceTaint`'s value is a label value: at most 63
//! characters of letters, digits, `-`, `_`, `.`, beginning and ending with a letter or digit).

/// How bad a device's failure is, worst last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// A vendor tool says the device is unhealthy; the kernel's signals are clear.
    Reported,
    /// An uncorrectable error (a fatal AER error, an amdgpu RAS `ue` count, an ECC or XID
    /// error, xe's survivability mode): the device is there and may fail any work.
    Error,
    /// The device is gone: fallen off the bus, its PCI function removed or bound to no
    /// driver of the profile's, its nodes or its driver gone. Nothing on it can run.
    Gone,
}

impl Severity {
    pub const ALL: [Severity; 3] = [Severity::Gone, Severity::Error, Severity::Reported];

    /// Its name: in the DRA taint's key, `--taint-no-execute`, `accel-ctk list --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Reported => "reported",
            Severity::Error => "error",
            Severity::Gone => "gone",
        }
    }

    pub fn parse(s: &str) -> Option<Severity> {
        Severity::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// What failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// The profile's version file is gone.
    DriverNotLoaded,
    /// A `/dev` node missing, not a character device, or of another major.
    DeviceNode,
    /// The PCI function, once seen, left sysfs.
    PciFunctionGone,
    /// The PCI function's config space reads all ones.
    FallenOffTheBus,
    /// The AER fatal count rose.
    AerFatal,
    /// An amdgpu RAS block's uncorrectable count rose; the block.
    RasUe(String),
    /// An NVIDIA XID not ignored.
    Xid(u64),
    /// A double-bit ECC event or the volatile uncorrected ECC count rose.
    Ecc,
    /// Row remapping pending or failed.
    RowRemap,
    /// NVML answers `GPU_IS_LOST`.
    GpuLost,
    /// A vendor tool reports the device unhealthy; the tool's binary.
    Tool(String),
    /// The PCI function is bound to no driver, or to another than the profile's.
    DriverUnbound,
    /// Intel's xe put the device in survivability mode: its firmware needs flashing.
    SurvivabilityMode,
}

impl Kind {
    pub fn severity(&self) -> Severity {
        match self {
            Kind::DriverNotLoaded
            | Kind::DeviceNode
            | Kind::PciFunctionGone
            | Kind::FallenOffTheBus
            | Kind::GpuLost
            | Kind::DriverUnbound => Severity::Gone,
            Kind::AerFatal
            | Kind::RasUe(_)
            | Kind::Xid(_)
            | Kind::Ecc
            | Kind::RowRemap
            | Kind::SurvivabilityMode => Severity::Error,
            Kind::Tool(_) => Severity::Reported,
        }
    }

    /// Its short name, a label value: the DRA taint's value, the exporter's `reason`.
    pub fn label(&self) -> String {
        let s = match self {
            Kind::DriverNotLoaded => "driver-not-loaded",
            Kind::DeviceNode => "device-node-gone",
            Kind::PciFunctionGone => "pci-function-gone",
            Kind::FallenOffTheBus => "fallen-off-the-bus",
            Kind::AerFatal => "aer-fatal",
            Kind::RasUe(block) => return label_value(&format!("ras-ue-{block}")),
            Kind::Xid(x) => return format!("xid-{x}"),
            Kind::Ecc => "ecc",
            Kind::RowRemap => "row-remap",
            Kind::GpuLost => "gpu-lost",
            Kind::Tool(binary) => return label_value(binary),
            Kind::DriverUnbound => "driver-unbound",
            Kind::SurvivabilityMode => "survivability-mode",
        };
        s.to_string()
    }
}

/// One signal that is not clear: what failed, and the line that says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: Kind,
    pub text: String,
}

impl Problem {
    pub fn new(kind: Kind, text: impl Into<String>) -> Problem {
        Problem {
            kind,
            text: text.into(),
        }
    }
}

/// Every signal of a device that is not clear, in the order the engine names them; never
/// empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    parts: Vec<Problem>,
    /// The parts' lines joined by `; `: made once, shown often.
    text: String,
}

impl Reason {
    /// `None` when `parts` is empty.
    pub fn new(parts: Vec<Problem>) -> Option<Reason> {
        if parts.is_empty() {
            return None;
        }
        let text = parts
            .iter()
            .map(|p| p.text.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        Some(Reason { parts, text })
    }

    pub fn parts(&self) -> &[Problem] {
        &self.parts
    }

    /// The whole line: the log's, `accel-ctk list`'s, the pod status'.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The worst part: the first of the worst severity.
    pub fn worst(&self) -> &Problem {
        let mut worst = &self.parts[0];
        for p in &self.parts[1..] {
            if p.kind.severity() > worst.kind.severity() {
                worst = p;
            }
        }
        worst
    }

    pub fn severity(&self) -> Severity {
        self.worst().kind.severity()
    }

    /// The worst part's short name.
    pub fn label(&self) -> String {
        self.worst().kind.label()
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The longest label value the API takes.
pub const MAX_LABEL: usize = 63;

/// `s` as a label value: lower-case letters, digits, `-` and `.`, at most 63 characters,
/// beginning and ending with a letter or digit; `unhealthy` where nothing is left.
pub fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_LABEL));
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_alphanumeric() || c == '.' {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
        if out.len() >= MAX_LABEL {
            break;
        }
    }
    let out = out.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if out.is_empty() {
        "unhealthy".into()
    } else {
        out.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind's severity and short name: the taint values and exporter labels operators
    /// alert on, so a change here is a change they see.
    #[test]
    fn each_kind_has_its_severity_and_label() {
        for (kind, sev, label) in [
            (Kind::FallenOffTheBus, Severity::Gone, "fallen-off-the-bus"),
            (Kind::PciFunctionGone, Severity::Gone, "pci-function-gone"),
            (Kind::DriverNotLoaded, Severity::Gone, "driver-not-loaded"),
            (Kind::DeviceNode, Severity::Gone, "device-node-gone"),
            (Kind::GpuLost, Severity::Gone, "gpu-lost"),
            (Kind::AerFatal, Severity::Error, "aer-fatal"),
            (Kind::RasUe("umc".into()), Severity::Error, "ras-ue-umc"),
            (
                Kind::RasUe("MM HUB!".into()),
                Severity::Error,
                "ras-ue-mm-hub",
            ),
            (Kind::Xid(79), Severity::Error, "xid-79"),
            (Kind::Ecc, Severity::Error, "ecc"),
            (Kind::RowRemap, Severity::Error, "row-remap"),
            (Kind::Tool("efsmi".into()), Severity::Reported, "efsmi"),
            (Kind::Tool("npu-smi".into()), Severity::Reported, "npu-smi"),
            (Kind::DriverUnbound, Severity::Gone, "driver-unbound"),
            (
                Kind::SurvivabilityMode,
                Severity::Error,
                "survivability-mode",
            ),
        ] {
            assert_eq!((kind.severity(), kind.label().as_str()), (sev, label));
        }
    }

    /// The worst part names the reason; of parts equally bad, the first.
    #[test]
    fn the_worst_part_names_the_reason() {
        assert_eq!(Reason::new(Vec::new()), None);
        let r = Reason::new(vec![
            Problem::new(Kind::Tool("npu-smi".into()), "npu-smi reports \"Warning\""),
            Problem::new(Kind::AerFatal, "1 fatal"),
            Problem::new(Kind::Xid(79), "XID 79"),
        ])
        .unwrap();
        assert_eq!(r.text(), "npu-smi reports \"Warning\"; 1 fatal; XID 79");
        assert_eq!(
            (r.severity(), r.label().as_str()),
            (Severity::Error, "aer-fatal")
        );
        let r = Reason::new(vec![
            Problem::new(Kind::AerFatal, "a"),
            Problem::new(Kind::FallenOffTheBus, "b"),
        ])
        .unwrap();
        assert_eq!(r.label(), "fallen-off-the-bus");
    }

    #[test]
    fn values_are_label_values() {
        assert_eq!(label_value("ras-ue-umc"), "ras-ue-umc");
        assert_eq!(label_value("Ras UE: \"MMHUB\"!"), "ras-ue-mmhub");
        assert_eq!(label_value("--"), "unhealthy");
        let long = label_value(&"ab-".repeat(40));
        assert!(long.len() <= MAX_LABEL && long.ends_with('b'), "{long}");
        assert_eq!(Severity::parse("gone"), Some(Severity::Gone));
        assert_eq!(Severity::parse("evict"), None);
    }
}
