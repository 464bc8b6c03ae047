//! `accel-ctk cdi generate` and `accel-ctk cdi list`.
//!
//! Config comes from `Config::load(&config::path())`, so `ACCEL_CONTAINER_RUNTIME_CONFIG` and
//! profile overrides (`driver-root`) apply exactly as for the runtime. Without `--vendor`, every
//! profile with a `cdi-kind` that finds devices gets a spec; several specs go to stdout as one
//! YAML stream, to `--output DIR` as one file per vendor (`<vendor>-<class>.<ext>`, CDI's
//! naming), and to `--output FILE` or JSON on stdout not at all (an error asks for
//! `--vendor`), since a CDI file holds one kind.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::cdi::generate::{self, GenerateError, Options};
use crate::cdi::model::Spec;
use crate::cdi::Registry;
use crate::config::Config;
use crate::profile::Profile;

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Write a CDI spec for the devices on this node (stdout unless --output).
    Generate(GenerateArgs),
    /// List the fully-qualified CDI device names in the configured cdi-spec-dirs.
    List,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Yaml,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Profile name (nvidia, enflame, ...); default: every profile that finds devices.
    #[arg(long)]
    pub vendor: Option<String>,
    /// File to write, or an existing directory (one file per vendor).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Output format; default: from the --output extension, else yaml.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Capability groups, as the vendor's capabilities variable takes them (`all`);
    /// default: the profile's defaults.
    #[arg(long)]
    pub capabilities: Option<String>,
    /// Container directory for libraries; default: config `container-library-dir`, else
    /// the Debian/Ubuntu multiarch directory.
    #[arg(long)]
    pub library_dir: Option<PathBuf>,
}

pub fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    let cfg = super::load_config()?;
    match cmd {
        Cmd::Generate(args) => generate_cmd(&cfg, &args),
        Cmd::List => list(&cfg),
    }
}

fn generate_cmd(cfg: &Config, args: &GenerateArgs) -> anyhow::Result<ExitCode> {
    let library_dir = match &args.library_dir {
        Some(d) if !d.is_absolute() || crate::profile::has_dotdot(d) => {
            bail!(
                "--library-dir {} must be absolute without '..'",
                d.display()
            )
        }
        Some(d) => d.clone(),
        None => cfg
            .container_library_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::spec::MULTIARCH_LIBRARY_DIR)),
    };
    let opts = Options {
        capabilities: args.capabilities.clone(),
        library_dir,
    };
    let specs = specs(cfg, args.vendor.as_deref(), &opts)?;
    let out_dir = args.output.as_deref().filter(|p| p.is_dir());
    let ext_format = args
        .output
        .as_deref()
        .filter(|_| out_dir.is_none())
        .and_then(|p| match p.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "yaml" => Some(Format::Yaml),
            _ => None,
        });
    if let (Some(f), Some(e), Some(path)) = (args.format, ext_format, &args.output) {
        if f != e {
            let f = if f == Format::Json { "json" } else { "yaml" };
            bail!(
                "--format {f} contradicts {}: CDI consumers choose the parser by extension",
                path.display()
            );
        }
    }
    let format = args.format.or(ext_format).unwrap_or(Format::Yaml);
    let names = || {
        specs
            .iter()
            .map(|(p, _)| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };

    if let Some(dir) = out_dir {
        for (_, spec) in &specs {
            let (vendor, class) = spec.vendor_class().unwrap_or(("unknown", "unknown"));
            let ext = if format == Format::Json {
                "json"
            } else {
                "yaml"
            };
            let path = dir.join(format!("{vendor}-{class}.{ext}"));
            write_file(&path, &render(std::slice::from_ref(spec), format)?)?;
            eprintln!("accel-ctk: wrote {} ({})", path.display(), spec.kind);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let several = specs.len() > 1;
    match &args.output {
        Some(path) if several => bail!(
            "found devices of {}: pass --vendor NAME for one file, or --output DIR for one file per vendor ({})",
            names(),
            path.display()
        ),
        Some(path) => {
            if ext_format.is_none() {
                eprintln!(
                    "accel-ctk: warning: {} does not end in .json or .yaml; CDI consumers skip it",
                    path.display()
                );
            }
            let only: Vec<Spec> = specs.into_iter().map(|(_, s)| s).collect();
            write_file(path, &render(&only, format)?)?;
            eprintln!("accel-ctk: wrote {} ({})", path.display(), only[0].kind);
        }
        None if several && format == Format::Json => bail!(
            "found devices of {}: JSON holds one spec; pass --vendor NAME, --format yaml, or --output DIR",
            names()
        ),
        None => {
            let all: Vec<Spec> = specs.into_iter().map(|(_, s)| s).collect();
            std::io::stdout()
                .write_all(render(&all, format)?.as_bytes())
                .context("writing to stdout")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The specs to write: the named vendor's (its errors are errors), or every profile with a
/// cdi-kind that finds devices.
fn specs<'c>(
    cfg: &'c Config,
    vendor: Option<&str>,
    opts: &Options,
) -> anyhow::Result<Vec<(&'c Profile, Spec)>> {
    if let Some(name) = vendor {
        let Some(profile) = cfg.profile(name) else {
            let known: Vec<&str> = cfg.profiles.iter().map(|p| p.name.as_str()).collect();
            bail!("no profile {name:?}; known: {}", known.join(", "));
        };
        return Ok(vec![(profile, generate::generate(profile, opts)?)]);
    }
    let mut out = Vec::new();
    let mut empty = Vec::new();
    for profile in cfg.profiles.iter().filter(|p| p.cdi_kind.is_some()) {
        match generate::generate(profile, opts) {
            Ok(spec) => out.push((profile, spec)),
            Err(GenerateError::NoDevices { .. }) => empty.push(profile.name.as_str()),
            Err(e) => return Err(e).context(format!("profile {}", profile.name)),
        }
    }
    if out.is_empty() {
        bail!("no devices found for any profile ({})", empty.join(", "));
    }
    Ok(out)
}

/// YAML: one document per spec (`---` before each); JSON: exactly one spec, pretty-printed.
fn render(specs: &[Spec], format: Format) -> anyhow::Result<String> {
    match format {
        Format::Json => {
            let [spec] = specs else {
                bail!("JSON holds one spec, {} given", specs.len());
            };
            Ok(serde_json::to_string_pretty(spec)? + "\n")
        }
        Format::Yaml => {
            let mut text = String::new();
            for s in specs {
                text.push_str("---\n");
                text.push_str(&serde_yaml_ng::to_string(s)?);
            }
            Ok(text)
        }
    }
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    crate::atomic::replace(path, text.as_bytes(), 0o644)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn list(cfg: &Config) -> anyhow::Result<ExitCode> {
    let reg = Registry::load(&cfg.cdi_spec_dirs);
    for (path, why) in &reg.invalid {
        eprintln!("accel-ctk: warning: skipped {}: {why}", path.display());
    }
    for (name, a, b) in reg.conflicts() {
        eprintln!(
            "accel-ctk: warning: {name} is defined by both {} and {}; it resolves to nothing",
            a.display(),
            b.display()
        );
    }
    let names = reg.names();
    if names.is_empty() {
        let dirs: Vec<String> = cfg
            .cdi_spec_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        // stderr: stdout stays a list of names (none) for scripts.
        eprintln!("accel-ctk: no CDI specs in {}", dirs.join(", "));
    }
    let mut stdout = std::io::stdout().lock();
    for name in names {
        writeln!(stdout, "{name}").context("writing to stdout")?;
    }
    Ok(ExitCode::SUCCESS)
}
