//! `accel-ctk nri base-spec [--from FILE] [--plugin PATH]`: a runtime spec (`ctr oci spec`'s
//! output, on stdin or from FILE) written to stdout with accel-nri-plugin's check hook added
//! once (src/engine/checkhook.rs), for containerd's `base_runtime_spec` of each runtime
//! handler: on containerd 2.0 and 2.1, which cannot require an NRI plugin, the hook is what
//! refuses a container that asked for a device the plugin did not add (docs/nri-fail-closed.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::engine::checkhook;

/// A runtime spec is a few KiB.
const MAX_SPEC: u64 = 4 << 20;

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Add the check hook (`accel-nri-plugin check`, createRuntime) to a runtime spec.
    BaseSpec(Args),
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The spec to start from (default: stdin), e.g. `ctr oci spec`'s output.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// accel-nri-plugin's absolute path on the node, as runc runs it.
    #[arg(long, default_value = checkhook::DEFAULT_PATH)]
    pub plugin: String,
}

pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    let Cmd::BaseSpec(args) = cmd;
    let (data, shown) = match &args.from {
        Some(p) => (
            crate::bounded::read_file(p, MAX_SPEC)
                .with_context(|| format!("cannot read {}", p.display()))?,
            p.display().to_string(),
        ),
        None => (
            crate::bounded::read(std::io::stdin().lock(), MAX_SPEC)
                .context("cannot read the spec on stdin")?,
            "stdin".to_string(),
        ),
    };
    let out = base_spec(&data, &args.plugin).with_context(|| format!("the spec on {shown}"))?;
    std::io::stdout()
        .lock()
        .write_all(&out)
        .context("cannot write the spec")?;
    Ok(ExitCode::SUCCESS)
}

/// `data` (a runtime spec) with the hook, pretty-printed, keys in their order.
pub fn base_spec(data: &[u8], plugin: &str) -> anyhow::Result<Vec<u8>> {
    let mut doc: serde_json::Value =
        serde_json::from_slice(data).context("not a JSON runtime spec")?;
    checkhook::add(&mut doc, plugin).map_err(anyhow::Error::msg)?;
    let mut out = serde_json::to_vec_pretty(&doc).context("cannot serialize the spec")?;
    out.push(b'\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ctr_spec_gets_the_hook_once() {
        let spec = br#"{"ociVersion":"1.1.0","process":{"user":{"uid":0,"gid":0},"cwd":"/"},"root":{"path":"rootfs"},"linux":{"namespaces":[{"type":"pid"}]}}"#;
        let once = base_spec(spec, "/usr/bin/accel-nri-plugin").unwrap();
        let twice = base_spec(&once, "/usr/bin/accel-nri-plugin").unwrap();
        assert_eq!(once, twice);
        let doc: serde_json::Value = serde_json::from_slice(&once).unwrap();
        let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["ociVersion", "process", "root", "linux", "hooks"]);
        assert!(checkhook::present(&doc));
        assert!(base_spec(b"[1]", "/usr/bin/accel-nri-plugin").is_err());
        assert!(base_spec(b"{", "/usr/bin/accel-nri-plugin").is_err());
    }
}
