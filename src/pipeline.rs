//! One vendor's gather-then-plan: the steps a container's create ([`crate::create`]) and
//! every CDI spec ([`crate::cdi::generate`]: `accel-ctk cdi generate`, the device plugin's
//! spec, a DRA claim's) take, in this order, so that the two cannot drift apart:
//!
//! 1. discovery (`discovery::discover`): the vendor's devices;
//! 2. the devices the plan covers: every one, those a create's variable names
//!    (`request::select`), or none (the driver alone); every device asked for and none found
//!    is refused ([`plan::refuse_no_devices`]);
//! 3. the capability groups ([`plan::capabilities`]);
//! 4. the host, looked at once ([`facts::gather`]): the driver root's `ld.so.cache`, the
//!    covered devices' nodes, the driver's control nodes, libraries and binaries;
//! 5. a spec without any of its driver's libraries is refused
//!    ([`plan::refuse_no_libraries`]);
//! 6. the plan, from those facts alone ([`plan::vendor`]): each device's nodes, the driver's
//!    edits and the dev links of its libraries.
//!
//! What differs between a create and a spec is what they ask (which devices, which
//! capabilities, the container's library directory) and [`Purpose`], which only the
//! refusals in `plan` look at. What a create does besides (the image's requirements, compat
//! libraries and loader cache, CDI names) is the image's side, which a spec has not.

use std::path::Path;

use crate::discovery::{self, Device, DiscoveryError};
use crate::facts;
use crate::plan::{self, BindMount, Plan, PlanError};
use crate::profile::Profile;
use crate::request::{self, RequestError};

pub use crate::plan::Purpose;

/// Which of the vendor's devices a plan covers.
#[derive(Debug, Clone, Copy)]
pub enum Wanted<'r> {
    /// Every device found: a create's `all`, every spec.
    All,
    /// The items of a create's variable `var` (devices only, CDI names apart).
    Items { var: &'r str, items: &'r [String] },
    /// None: the driver alone (`none`, where the profile injects the driver for it).
    DriverOnly,
}

/// What one vendor is asked for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'r> {
    pub profile: &'r Profile,
    pub wanted: Wanted<'r>,
    /// The capability variable's value; `None`: the profile's defaults.
    pub capabilities: Option<&'r str>,
    /// Where the container gets the driver's libraries.
    pub lib_dir: &'r Path,
    pub purpose: Purpose,
}

/// One vendor's plan.
#[derive(Debug, Default)]
pub struct Planned {
    /// Each covered device with its nodes, in the order they were asked for (index order
    /// for every device).
    pub devices: Vec<(Device, Plan)>,
    /// The driver's control and capability nodes, libraries and binaries.
    pub driver: Plan,
    /// Development names (`libcuda.so`) of the driver's libraries, from the same host files.
    pub dev_links: Vec<BindMount>,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    LdCache(#[from] facts::LdCacheError),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

impl PipelineError {
    /// Every device was asked for and none was found ([`plan::refuse_no_devices`]).
    pub fn is_no_devices(&self) -> bool {
        matches!(self, PipelineError::Plan(PlanError::NoDevices { .. }))
    }
}

/// The steps of the module's header, for one vendor.
pub fn run(ask: &Ask<'_>) -> Result<Planned, PipelineError> {
    let profile = ask.profile;
    let found = discovery::discover(profile)?;
    plan::refuse_no_devices(profile, matches!(ask.wanted, Wanted::All), found.len())?;
    let devices: Vec<&Device> = match ask.wanted {
        Wanted::All => found.iter().collect(),
        Wanted::Items { var, items } => {
            request::select(var, items, &found, profile.discovery.index_ranges())?
        }
        Wanted::DriverOnly => Vec::new(),
    };
    let caps = plan::capabilities(profile, ask.capabilities)?;
    let facts = facts::gather(profile, devices, caps)?;
    plan::refuse_no_libraries(ask.purpose, &facts)?;
    let planned = plan::vendor(&facts, ask.lib_dir)?;
    Ok(Planned {
        devices: facts
            .devices
            .iter()
            .map(|d| (*d).clone())
            .zip(planned.devices)
            .collect(),
        driver: planned.driver,
        dev_links: planned.dev_links,
    })
}

#[cfg(test)]
mod tests {
    //! Without root: a driver root with no devices (mknod needs root). The end-to-end suites
    //! (tests/cdi.rs: `cdi_injection_equals_variable_injection`) hold a create and a spec to
    //! the same edits on a simulated node.

    use super::*;

    /// The same host and the same ask, for a create and for a spec: every device asked and
    /// none found is refused by both, alike; the driver alone without any of its libraries
    /// is refused for a spec only.
    #[test]
    fn a_create_and_a_spec_differ_only_in_the_no_library_refusal() {
        let root = tempfile::tempdir().unwrap();
        let mut p = crate::config::builtin_nvidia();
        p.driver_root = root.path().to_path_buf();
        let items = ["0".to_string()];
        let ask = |wanted, purpose| Ask {
            profile: &p,
            wanted,
            capabilities: None,
            lib_dir: Path::new("/usr/lib64"),
            purpose,
        };
        for purpose in [Purpose::Create, Purpose::Spec] {
            let e = run(&ask(Wanted::All, purpose)).unwrap_err();
            assert!(e.is_no_devices(), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!(
                    "no nvidia devices found under {} (is the driver loaded?)",
                    root.path().display()
                )
            );
            let e = run(&ask(
                Wanted::Items {
                    var: "NVIDIA_VISIBLE_DEVICES",
                    items: &items,
                },
                purpose,
            ))
            .unwrap_err();
            assert!(matches!(e, PipelineError::Request(_)), "{e:?}");
        }
        let planned = run(&ask(Wanted::DriverOnly, Purpose::Create)).unwrap();
        assert!(planned.devices.is_empty() && planned.driver.is_empty());
        let e = run(&ask(Wanted::DriverOnly, Purpose::Spec)).unwrap_err();
        assert!(
            matches!(e, PipelineError::Plan(PlanError::NoLibraries { .. })),
            "{e:?}"
        );
    }
}
