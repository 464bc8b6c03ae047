//! accel-container-runtime: an OCI runtime shim that writes accelerator devices into the
//! bundle's `config.json` and then hands the untouched argv to the low-level runtime.
//!
//! Floors, lowest first (a module only uses those below it):
//! `edits` (the data the plan, CDI and the spec editor share), `argv`, `atomic`, `bounded`
//! (whole-file reads with a limit), `inroot` (paths that stay inside a root: openat2, or
//! its rules walked where the kernel lacks it), `keys` (known config keys), `quantity` (Kubernetes quantities as whole numbers), `quote` (container
//! text in messages), `trust` (files only root can write) →
//! `dmem` (the kernel's device-memory limit of a share: pure, and the DRA driver's grants
//! read as trusted files), `ldcache`, `rootfs` (the image's files, through `inroot`), `constraints` (an image's
//! `NVIDIA_REQUIRE_*` on the driver, pure) → `profile` → `config` → `discovery`, `libraries`,
//! `request` (the devices a container asks for), `vendortool` (a vendor CLI run in driver-root
//! with a time limit) → `facts` (what a plan needs of the host, gathered first), `topology` (where a device
//! sits: nodes, PCI, NUMA) → `plan` (pure: decides from facts), `checkpoint` (kubelet's
//! device checkpoint), `health` (each device's health from its nodes and sysfs signals, one
//! engine for the daemons and `accel-ctk`) → `devchar` (host /dev/char links), `loader` (the image's loader cache,
//! compat libraries, requirements), `pipeline` (one vendor's gather-then-plan, the same steps
//! for a create and a CDI spec) → `spec`, `engine` (engine config files; the NRI
//! plugin's check hook in a runtime spec) →
//! `doctor` (node checks) → `cdi` (CDI specs: generate, resolve, apply), `limits` (a
//! share's `dmem.max` written into its container's spec on create) → `create` (the
//! `create` command's straight line), `kubelet` (what the Kubernetes programs share: the node's
//! device table and the IDs and names kubelet knows devices by, kubelet's protocols compiled
//! from `.proto` files, sockets; its gRPC half only with the `plugin` feature) → `ctk`
//! (accel-ctk's subcommands), `plugin` (accel-device-plugin), `nri` (accel-nri-plugin: the create path's decision as an NRI
//! plugin, only with the `plugin` feature), `dra` (accel-dra-driver, only
//! with the `dra` feature), `exporter` (accel-exporter, only with the `exporter` feature),
//! side by side → binaries.

pub mod argv;
pub mod atomic;
pub mod bounded;
pub mod cdi;
pub mod checkpoint;
pub mod config;
pub mod constraints;
pub mod create;
pub mod ctk;
pub mod devchar;
pub mod discovery;
pub mod dmem;
pub mod doctor;
#[cfg(feature = "dra")]
pub mod dra;
pub mod edits;
pub mod engine;
pub mod exec;
#[cfg(feature = "exporter")]
pub mod exporter;
pub mod facts;
pub mod health;
pub mod inroot;
pub mod keys;
pub mod kubelet;
pub mod ldcache;
pub mod libraries;
pub mod limits;
pub mod loader;
pub mod logging;
#[cfg(feature = "plugin")]
pub mod nri;
pub mod pipeline;
pub mod plan;
pub mod plugin;
pub mod profile;
pub mod quantity;
pub mod quote;
pub mod request;
pub mod rootfs;
pub mod spec;
pub mod topology;
pub mod trust;
pub mod vendortool;
