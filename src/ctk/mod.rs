//! `accel-ctk` subcommands, one module each. They sit above the runtime's modules and reuse
//! them (config, profiles, discovery, planning); nothing here is used by the runtime binary.

pub mod cdi;
pub mod checkpoint;
pub mod doctor;
pub mod labels;
pub mod list;
pub mod nri;
#[cfg(feature = "plugin")]
pub mod pods;
pub mod runtime;
pub mod system;

use anyhow::Context as _;

use crate::config::Config;

/// The runtime's config, as the runtime loads it, with its warnings (unknown keys with the
/// nearest known one, an unlistable profiles-dir) printed on stderr: a typo'd key must not be
/// silent just because this command ran instead of a container.
pub fn load_config() -> anyhow::Result<Config> {
    let cfg = Config::load(&crate::config::path()).context("loading the runtime's config")?;
    for w in &cfg.warnings {
        eprintln!("accel-ctk: warning: {w}");
    }
    Ok(cfg)
}

/// For a command that works without the config (`runtime configure`): its warnings, or why
/// it does not load (every container start would fail), on stderr; never an error.
pub fn warn_config() {
    if let Err(e) = load_config() {
        eprintln!(
            "accel-ctk: warning: {} (containers started through the runtime fail until it is corrected)",
            error_chain(&e)
        );
    }
}

/// The error and its causes as one `a: b: c` line, each cause once: many errors here already
/// print their source in their own message (`{path}: {source}`), and anyhow's `{:#}` would
/// repeat it.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(text.trim()) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

/// `rows` as a text table: each column as wide as its widest cell, two spaces between,
/// trailing spaces trimmed, one line per row.
pub fn columns<R: AsRef<[String]>>(rows: &[R]) -> String {
    let width = |c: usize| {
        rows.iter()
            .filter_map(|r| r.as_ref().get(c))
            .map(String::len)
            .max()
    };
    let widths: Vec<usize> = (0..rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0))
        .map(|c| width(c).unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .as_ref()
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("reading x: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn error_chain_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, "bad byte");
        let e = anyhow::Error::new(Repeats(io)).context("loading the config");
        assert_eq!(
            super::error_chain(&e),
            "loading the config: reading x: bad byte"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::error_chain(&plain), "outer: inner");
    }
}
