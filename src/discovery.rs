//! Finding a vendor's devices on the host, as the profile describes them.
//!
//! Discovery reads only host paths under the profile's `driver-root`/`dev-root`; nothing from
//! the container reaches it. It returns container-side node paths (`/dev/nvidia1`); the
//! host node for one is `Profile::under(dev_root, path)`.
//!
//! The driver's files (procfs, sysfs, its version file) are read by the rule the image's
//! files are read by ([`open_in_root`]): a FIFO, a device node or a symlink out of the root
//! planted where an attribute should be is refused or resolved inside the root, never opened
//! or followed (issue 32, class 6).
//!
//! A vendor's unique id (NVIDIA's GPU UUID, KFD's `unique_id`) is a device's name only where
//! no other device of the profile on this node reports the same one (issue 32, class 3): the
//! device plugin, CDI and the runtime's selection key devices by it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::buffer::spare_capacity;
use rustix::fs::{FileType, Mode, OFlags, RawDir};
use rustix::io::Errno;

use crate::inroot::{reopen, Root, Scope};
use crate::profile::{Discovery, Profile};

pub mod drm;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Malformed { path: PathBuf, msg: String },
    /// A node the profile names that must not be handed out (see [`host_node`]).
    #[error("{vendor}: refusing node {}: {msg}", path.display())]
    Node {
        vendor: String,
        path: PathBuf,
        msg: String,
    },
}

impl DiscoveryError {
    /// The path does not exist (an optional node is then left out).
    pub fn is_not_found(&self) -> bool {
        matches!(self, DiscoveryError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Whether a name is a PCI function address, `dddd:bb:dd.f` in lower-case hex (as sysfs names
/// them): topology walks them, DRM-class discovery finds a function by one.
pub fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && (b'0'..=b'7').contains(&b[11])
}

/// The host path of the profile's node `node` (a container path such as `/dev/nvidia0`),
/// resolved inside its dev-root by [`crate::inroot`] in [`Scope::Beneath`]: a symlink on the
/// way that leads out of dev-root (any absolute target, or `..` above it) is refused, as is
/// anything but a character device at the end, and, for a device's own node (`device`) where
/// the profile states `device-majors`, a major not in that list. The node is never opened.
pub fn host_node(profile: &Profile, node: &Path, device: bool) -> Result<PathBuf, DiscoveryError> {
    DevRoot::new(profile)
        .host_node(node, device)
        .map(|(host, _)| host)
}

/// A profile's dev-root, opened once for all the nodes a create looks up (a create of eight
/// GPUs looks up a dozen).
pub struct DevRoot<'p> {
    profile: &'p Profile,
    /// Why it cannot be opened, for each lookup to report.
    root: Result<Root, std::io::ErrorKind>,
}

impl<'p> DevRoot<'p> {
    pub fn new(profile: &'p Profile) -> Self {
        DevRoot {
            profile,
            root: Root::open(profile.dev_root()).map_err(|e| e.kind()),
        }
    }

    pub fn profile(&self) -> &'p Profile {
        self.profile
    }

    /// [`host_node`], with what `fstat` said of the node (a character device, not a link).
    pub fn host_node(
        &self,
        node: &Path,
        device: bool,
    ) -> Result<(PathBuf, rustix::fs::Stat), DiscoveryError> {
        let profile = self.profile;
        let refuse = |msg: String| DiscoveryError::Node {
            vendor: profile.name.clone(),
            path: node.to_path_buf(),
            msg,
        };
        let root = match &self.root {
            Ok(root) => root,
            Err(kind) => {
                return Err(DiscoveryError::Read {
                    path: profile.dev_root().to_path_buf(),
                    source: (*kind).into(),
                })
            }
        };
        let entry = match root.lookup(node, Scope::Beneath) {
            Ok(e) => e,
            Err(Errno::XDEV) => {
                return Err(refuse(format!(
                    "a symlink on its path leads out of {} (absolute, or above it)",
                    profile.dev_root().display()
                )))
            }
            Err(e) => {
                return Err(DiscoveryError::Read {
                    path: root.display(node),
                    source: e.into(),
                })
            }
        };
        let host = entry.host.clone();
        if entry.file_type() != rustix::fs::FileType::CharacterDevice {
            return Err(refuse(format!(
                "{} is not a character device",
                host.display()
            )));
        }
        let major = u64::from(rustix::fs::major(entry.stat.st_rdev));
        if device && !profile.device_majors.is_empty() && !profile.device_majors.contains(&major) {
            return Err(refuse(format!(
                "{} has major {major}, not one of the profile's device-majors {:?}",
                host.display(),
                profile.device_majors
            )));
        }
        Ok((host, entry.stat))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The number users select it by: PCI order for NVIDIA, the node number otherwise.
    pub index: u32,
    /// Container paths of its nodes; the first is the primary one.
    pub nodes: Vec<PathBuf>,
    /// The vendor's unique id, only where it is unique among the profile's devices on this
    /// node: a name the device plugin, CDI and the runtime may key it by.
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub minor: Option<u32>,
    /// Other names it answers to (`GCU-1`).
    pub aliases: Vec<String>,
    /// The product as the driver names it (NVIDIA's `Model:`). A DRM-class device's (its PCI
    /// `vendor-device` id) is not read by [`discover`], whose callers on the create path never
    /// use it: [`crate::topology::locate`] fills it ([`drm::model_of`]). `None` where unknown.
    pub model: Option<String>,
    /// The vendor's id when another device of the profile on this node reports the same one
    /// (`uuid` is then `None`): shown, never a name.
    pub duplicate_uuid: Option<String>,
}

/// What a device keeps for as long as it is on the node, whatever else comes and goes: the
/// number its driver gave its node and holds (NVIDIA's `Device Minor`; a device node's own
/// number, `/dev/gcu3`), else its PCI function. Every name that outlives the moment (a DRA
/// device name, a claim record) is made from it or from [`Device::stable_name`], never from
/// `index`, which for NVIDIA and DRM-class devices is a position in discovery's order and
/// shifts when a device leaves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Number(u32),
    Bus(String),
}

impl Key {
    /// As characters a DNS label allows: `3`, `0000-c3-00-0`.
    pub fn label(&self) -> String {
        match self {
            Key::Number(n) => n.to_string(),
            Key::Bus(b) => dns_chars(b),
        }
    }
}

/// `s` in the characters of a DNS label: lower-case letters and digits, anything else `-`.
pub fn dns_chars(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

impl Device {
    /// The device's [`Key`] under the profile's discovery.
    pub fn key(&self, discovery: &Discovery) -> Key {
        let bus = || Key::Bus(self.pci_bus_id.clone().unwrap_or_default());
        match discovery {
            Discovery::NvidiaProcfs { .. } => self.minor.map_or_else(bus, Key::Number),
            Discovery::DeviceNodes { .. } => Key::Number(self.index),
            Discovery::Drm { .. } => self
                .pci_bus_id
                .clone()
                .map_or(Key::Number(self.index), Key::Bus),
        }
    }

    /// The name the runtime, CDI specs and the device plugin's answers give the device, one
    /// the runtime's own discovery resolves to this device for as long as it is on the node:
    /// its UUID (unique on the node), else for a device found by its node that node's number
    /// (`/dev/gcu3` is `3`), else its PCI bus id (NVIDIA's and DRM-class discovery always
    /// read one).
    pub fn stable_name(&self, discovery: &Discovery) -> String {
        if let Some(u) = &self.uuid {
            return u.clone();
        }
        match (discovery, &self.pci_bus_id) {
            (Discovery::DeviceNodes { .. }, _) | (_, None) => self.index.to_string(),
            (_, Some(bus)) => bus.clone(),
        }
    }

    /// The id the vendor's Kubernetes device plugin registers for it, from a template such
    /// as `{uuid}` or `GCU-{index}`; `None` when the template needs a field the device lacks.
    pub fn plugin_id(&self, template: &str) -> Option<String> {
        let mut out = template.replace("{index}", &self.index.to_string());
        for (key, val) in [("{uuid}", &self.uuid), ("{bus}", &self.pci_bus_id)] {
            if out.contains(key) {
                out = out.replace(key, val.as_deref()?);
            }
        }
        if out.contains("{minor}") {
            out = out.replace("{minor}", &self.minor?.to_string());
        }
        Some(out)
    }
}

/// Every device the profile finds, ordered by index. No driver (no proc dir, no nodes) is an
/// empty list, not an error: the caller decides whether that matters.
pub fn discover(profile: &Profile) -> Result<Vec<Device>, DiscoveryError> {
    let mut found = discover_kind(profile)?;
    keep_unique_uuids(profile, &mut found);
    Ok(found)
}

fn discover_kind(profile: &Profile) -> Result<Vec<Device>, DiscoveryError> {
    match &profile.discovery {
        Discovery::NvidiaProcfs {
            proc_dir,
            node_template,
        } => nvidia_procfs(profile, proc_dir, node_template),
        Discovery::DeviceNodes {
            node_templates,
            aliases,
            ..
        } => device_nodes(profile, node_templates, aliases),
        Discovery::Drm {
            pci_vendors,
            drivers,
            order,
            kfd_topology,
            ..
        } => drm::discover(
            profile,
            &drm::Filter {
                pci_vendors,
                drivers,
                order: *order,
                kfd_topology: kfd_topology.as_deref(),
            },
        ),
    }
}

/// Where an id was seen on more than one device and said so: `(profile, id)`. A lasting
/// duplicate is logged once per process, not at each discovery of a polling daemon.
static DUPLICATES_SAID: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());

/// Moves each `uuid` that more than one of `devices` reports to `duplicate_uuid`: the device
/// plugin keys Allocate by it, the runtime selects by it, so an id two devices share would
/// hand out one for the other (issue 32, class 3). The devices keep their bus ids, minors and
/// indices.
fn keep_unique_uuids(profile: &Profile, devices: &mut [Device]) {
    let mut holders: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, d) in devices.iter().enumerate() {
        if let Some(u) = &d.uuid {
            holders.entry(u.clone()).or_default().push(i);
        }
    }
    for (id, at) in holders.into_iter().filter(|(_, at)| at.len() > 1) {
        let names: Vec<String> = at
            .iter()
            .map(|&i| {
                let d = &devices[i];
                match &d.pci_bus_id {
                    Some(bus) => format!("{} ({bus})", d.index),
                    None => d.index.to_string(),
                }
            })
            .collect();
        for i in at {
            devices[i].duplicate_uuid = devices[i].uuid.take();
        }
        let mut said = DUPLICATES_SAID.lock().unwrap_or_else(|e| e.into_inner());
        if said.insert((profile.name.clone(), id.clone())) {
            log::warn!(
                "{}: devices {} all report the id {}; it names none of them (not unique on this node): select them by PCI bus id",
                profile.name,
                names.join(", "),
                crate::quote::quote(&id)
            );
        }
    }
}

/// The regular file `rel` under `root`, opened for reading by the rule the image's files are
/// read by ([`crate::rootfs`]): resolved by [`crate::inroot`] in [`Scope::InRoot`] (as if the
/// root were `/`: no link leads out of it), found `O_PATH` (no driver's open runs for a
/// device node, a FIFO does not block), and opened for reading only once `fstat` says it is
/// a regular file, through that same fd. Every sysfs and procfs attribute is one. With its
/// size as `fstat` gives it, to size a buffer by.
pub fn open_in_root(root: &Root, rel: &Path) -> std::io::Result<(File, u64)> {
    let fd = root.open_at(rel, OFlags::PATH, Scope::InRoot)?;
    let st = rustix::fs::fstat(&fd)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(std::io::Error::other(format!(
            "{}, not a regular file; not opened",
            crate::rootfs::kind_name(kind)
        )));
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    Ok((File::from(reopen(&fd, OFlags::RDONLY)?), size))
}

/// [`open_in_root`], read whole: at most `limit` bytes ([`crate::bounded`]).
pub fn read_in_root(root: &Root, rel: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let (file, size) = open_in_root(root, rel)?;
    crate::bounded::read_hinted(file, limit, size)
}

/// The target of symlink `rel` under `root`, as text: its directory is resolved in the root
/// and the link itself read, never followed.
pub fn read_link_in_root(root: &Root, rel: &Path) -> std::io::Result<PathBuf> {
    let name = rel
        .file_name()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let parent = rel.parent().unwrap_or(Path::new("/"));
    let dir = root.open_at(parent, OFlags::PATH | OFlags::DIRECTORY, Scope::InRoot)?;
    let target = rustix::fs::readlinkat(&dir, name, Vec::new())?;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(
        target.into_bytes(),
    )))
}

/// Directory `rel` under `root` (resolved in it) opened to list it; `None` when it does not
/// exist.
fn open_dir_in(root: &Root, rel: &Path) -> Result<Option<OwnedFd>, DiscoveryError> {
    match root.open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY, Scope::InRoot) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(DiscoveryError::Read {
            path: root.display(rel),
            source: e.into(),
        }),
    }
}

/// The names in directory `rel` under `root`; none when it does not exist.
fn dir_names_in(root: &Root, rel: &Path) -> Result<Vec<String>, DiscoveryError> {
    match open_dir_in(root, rel)? {
        Some(fd) => dir_names(&fd, &root.display(rel)),
        None => Ok(Vec::new()),
    }
}

/// The names in directory `rel` under `root`, sorted; none when it cannot be read: for readers
/// that judge nothing by an unreadable directory (the exporter's hwmon look-up, the health
/// engine's RAS blocks).
pub fn sorted_names_in(root: &Root, rel: &Path) -> Vec<String> {
    let mut names = dir_names_in(root, rel).unwrap_or_default();
    names.sort();
    names
}

/// `dir` opened (`O_DIRECTORY`) to list it; `None` when it does not exist.
fn open_dir(dir: &Path) -> Result<Option<OwnedFd>, DiscoveryError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::open(dir, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(DiscoveryError::Read {
            path: dir.into(),
            source: e.into(),
        }),
    }
}

/// The names in the directory `fd` (named `dir` in errors), read with getdents64 into one
/// small buffer (`fs::read_dir` allocates per entry and stats the directory as well).
fn dir_names(fd: &OwnedFd, dir: &Path) -> Result<Vec<String>, DiscoveryError> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut entries = RawDir::new(fd, buf.spare_capacity_mut());
    let mut names = Vec::new();
    while let Some(e) = entries.next() {
        let e = e.map_err(|e| DiscoveryError::Read {
            path: dir.into(),
            source: e.into(),
        })?;
        match e.file_name().to_str() {
            Ok("." | "..") | Err(_) => {}
            Ok(n) => names.push(n.to_string()),
        }
    }
    Ok(names)
}

/// The names in `dir`; none when it does not exist.
fn read_dir_names(dir: &Path) -> Result<Vec<String>, DiscoveryError> {
    match open_dir(dir)? {
        Some(fd) => dir_names(&fd, dir),
        None => Ok(Vec::new()),
    }
}

/// A GPU's `information` is under 1 KiB.
const MAX_PROC_FILE: u64 = 1 << 20;

/// `file` (opened by [`open_in_root`]), read whole into `buf` (reused across files).
/// Procfs files report a size of 0, so there is no size to read up to: `fs::read_to_string`
/// reads those in growing probes from 32 bytes (five reads and a stat for one GPU's
/// `information`). A file that does not end within [`MAX_PROC_FILE`] is refused (class 5:
/// a procfs file's size is not known before it is read).
fn read_proc(file: File, buf: &mut Vec<u8>) -> std::io::Result<&str> {
    buf.clear();
    buf.reserve(4096);
    loop {
        if buf.len() as u64 > MAX_PROC_FILE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("over the {MAX_PROC_FILE} byte limit"),
            ));
        }
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity());
        }
        let room = buf.capacity() - buf.len();
        match rustix::io::read(&file, spare_capacity(buf)) {
            Ok(0) => break,
            // A read that leaves room is the end: the driver's `information` is a single_open
            // seq_file, whose whole text is made at once and handed out as far as the reader
            // has room, and a regular file (a simulated root) reads short only at its end.
            // That saves the read that would return 0, once per GPU.
            Ok(n) if n < room => break,
            Ok(_) => {}
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    std::str::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

fn nvidia_procfs(
    profile: &Profile,
    proc_dir: &Path,
    node_template: &str,
) -> Result<Vec<Device>, DiscoveryError> {
    let root = match Root::open(&profile.driver_root) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(DiscoveryError::Read {
                path: profile.driver_root.clone(),
                source,
            })
        }
    };
    let mut gpus = Vec::new();
    let mut buf = Vec::new();
    for bus in dir_names_in(&root, proc_dir)? {
        let rel = proc_dir.join(&bus).join("information");
        let path = || root.display(&rel);
        let text = open_in_root(&root, &rel)
            .and_then(|(file, _)| read_proc(file, &mut buf))
            .map_err(|source| DiscoveryError::Read {
                path: path(),
                source,
            })?;
        // `Key: \t value` lines; the first of each key counts.
        let (mut minor, mut uuid, mut bus_id, mut model) = (None, None, None, None);
        for (k, v) in text.lines().filter_map(|l| l.split_once(':')) {
            let slot = match k.trim() {
                "Device Minor" => &mut minor,
                "GPU UUID" => &mut uuid,
                "Bus Location" => &mut bus_id,
                "Model" => &mut model,
                _ => continue,
            };
            slot.get_or_insert(v.trim());
        }
        let minor = minor.ok_or_else(|| DiscoveryError::Malformed {
            path: path(),
            msg: "no `Device Minor` line".into(),
        })?;
        let minor: u32 = minor.parse().map_err(|_| DiscoveryError::Malformed {
            path: path(),
            msg: format!("`Device Minor` {minor:?} is not a number"),
        })?;
        let uuid = uuid
            .filter(|u| !u.is_empty() && !u.contains('/'))
            .map(str::to_string);
        let mut bus_id = bus_id.map_or(bus, str::to_string);
        bus_id.make_ascii_lowercase();
        let model = model.filter(|m| !m.is_empty()).map(str::to_string);
        gpus.push((bus_id, minor, uuid, model));
    }
    // nvidia-smi numbers GPUs in PCI bus order, which is what users mean by an index.
    gpus.sort();
    Ok(gpus
        .into_iter()
        .enumerate()
        .map(|(i, (bus, minor, uuid, model))| Device {
            index: i as u32,
            nodes: vec![PathBuf::from(
                node_template.replace("{minor}", &minor.to_string()),
            )],
            uuid,
            pci_bus_id: Some(bus),
            minor: Some(minor),
            aliases: Vec::new(),
            model,
            duplicate_uuid: None,
        })
        .collect())
}

fn device_nodes(
    profile: &Profile,
    templates: &[String],
    aliases: &[String],
) -> Result<Vec<Device>, DiscoveryError> {
    let primary = Path::new(&templates[0]);
    let (Some(parent), Some(file)) = (
        primary.parent(),
        primary.file_name().and_then(|f| f.to_str()),
    ) else {
        return Ok(Vec::new());
    };
    let (prefix, suffix) = file.split_once("{index}").unwrap_or((file, ""));
    let host_dir = Profile::under(profile.dev_root(), parent);
    let mut found: Vec<u32> = read_dir_names(&host_dir)?
        .iter()
        .filter_map(|n| {
            n.strip_prefix(prefix)?
                .strip_suffix(suffix)
                .map(str::to_string)
        })
        .filter(|num| {
            !num.is_empty()
                && num.bytes().all(|b| b.is_ascii_digit())
                && (num == "0" || !num.starts_with('0'))
        })
        .filter_map(|num| num.parse().ok())
        .filter(|n: &u32| is_device_node(&host_dir.join(format!("{prefix}{n}{suffix}"))))
        .collect();
    found.sort_unstable();
    Ok(found
        .into_iter()
        .map(|index| {
            let fill = |t: &String| t.replace("{index}", &index.to_string());
            let nodes = templates
                .iter()
                .enumerate()
                .map(|(i, t)| (i, PathBuf::from(fill(t))))
                .filter(|(i, p)| *i == 0 || is_device_node(&Profile::under(profile.dev_root(), p)))
                .map(|(_, p)| p)
                .collect();
            Device {
                index,
                nodes,
                uuid: None,
                pci_bus_id: None,
                minor: None,
                aliases: aliases.iter().map(fill).collect(),
                model: None,
                duplicate_uuid: None,
            }
        })
        .collect())
}

fn is_device_node(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p)
        .is_ok_and(|m| m.file_type().is_char_device() || m.file_type().is_block_device())
}

/// The driver version: the first dotted number in the profile's `version-file`.
pub fn driver_version(profile: &Profile) -> Option<String> {
    let rel = profile.version_file.as_deref()?;
    let root = Root::open(&profile.driver_root).ok()?;
    let text = crate::bounded::text(read_in_root(&root, rel, MAX_PROC_FILE).ok()?).ok()?;
    text.split_whitespace()
        .find(|t| {
            t.contains('.')
                && t.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn profile(name: &str, root: &Path) -> Profile {
        let mut p = Config::parse("", None)
            .unwrap()
            .profile(name)
            .unwrap()
            .clone();
        p.driver_root = root.to_path_buf();
        p
    }

    fn info(root: &Path, bus: &str, minor: u32, uuid: &str) {
        let d = root.join("proc/driver/nvidia/gpus").join(bus);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("information"),
            format!("Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nGPU UUID: \t\t {uuid}\nBus Location: \t\t {bus}\nDevice Minor: \t\t {minor}\n"),
        )
        .unwrap();
    }

    #[test]
    fn nvidia_index_follows_bus_order_not_minor() {
        let root = tempfile::tempdir().unwrap();
        info(root.path(), "0000:af:00.0", 0, "GPU-bbb");
        info(root.path(), "0000:3b:00.0", 3, "GPU-aaa");
        let devs = discover(&profile("nvidia", root.path())).unwrap();
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[0].nodes, [PathBuf::from("/dev/nvidia3")]);
        assert_eq!(devs[0].uuid.as_deref(), Some("GPU-aaa"));
        assert_eq!(devs[0].model.as_deref(), Some("NVIDIA H100"));
        assert_eq!(devs[1].index, 1);
        assert_eq!(devs[1].minor, Some(0));
        assert_eq!(devs[1].plugin_id("{uuid}").as_deref(), Some("GPU-bbb"));
    }

    /// Issue 32, class 3: two GPUs reporting one UUID are named by neither; both are still
    /// found, by bus id and minor.
    #[test]
    fn nvidia_uuid_two_gpus_share_is_no_name() {
        let root = tempfile::tempdir().unwrap();
        info(root.path(), "0000:3b:00.0", 0, "GPU-same");
        info(root.path(), "0000:af:00.0", 1, "GPU-same");
        info(root.path(), "0000:d8:00.0", 2, "GPU-own");
        let devs = discover(&profile("nvidia", root.path())).unwrap();
        let ids: Vec<(Option<&str>, Option<&str>)> = devs
            .iter()
            .map(|d| (d.uuid.as_deref(), d.duplicate_uuid.as_deref()))
            .collect();
        assert_eq!(
            ids,
            [
                (None, Some("GPU-same")),
                (None, Some("GPU-same")),
                (Some("GPU-own"), None)
            ]
        );
        assert_eq!(devs[1].plugin_id("{uuid}"), None);
        assert_eq!(devs[1].plugin_id("{bus}").as_deref(), Some("0000:af:00.0"));
    }

    /// Issue 32, class 6: the driver's files are read only when they are regular files inside
    /// the driver root. A FIFO is refused unopened (an open would block for good); a link to
    /// a host file resolves inside the root.
    #[test]
    fn nvidia_information_fifo_or_link_out_is_not_opened() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        info(&root, "0000:3b:00.0", 3, "GPU-aaa");
        let file = root.join("proc/driver/nvidia/gpus/0000:3b:00.0/information");
        std::fs::remove_file(&file).unwrap();
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let e = discover(&profile("nvidia", &root)).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "cannot read {}: a FIFO, not a regular file; not opened",
                file.display()
            )
        );
        std::fs::remove_file(&file).unwrap();
        info(t.path(), "0000:3b:00.0", 3, "GPU-host");
        std::os::unix::fs::symlink(
            t.path()
                .join("proc/driver/nvidia/gpus/0000:3b:00.0/information"),
            &file,
        )
        .unwrap();
        let e = discover(&profile("nvidia", &root)).unwrap_err();
        assert!(e.is_not_found(), "{e}");
        // The version file likewise.
        std::fs::write(
            t.path().join("proc/driver/nvidia/version"),
            "NVRM version: 550.54.14\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(
            t.path().join("proc/driver/nvidia/version"),
            root.join("proc/driver/nvidia/version"),
        )
        .unwrap();
        assert_eq!(driver_version(&profile("nvidia", &root)), None);
    }

    #[test]
    fn nvidia_malformed_information_names_file() {
        let root = tempfile::tempdir().unwrap();
        info(root.path(), "0000:3b:00.0", 3, "GPU-aaa");
        let p = root
            .path()
            .join("proc/driver/nvidia/gpus/0000:3b:00.0/information");
        std::fs::write(&p, "Device Minor: x\n").unwrap();
        let err = discover(&profile("nvidia", root.path()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("information") && err.contains("Device Minor"),
            "{err}"
        );
    }

    /// A file longer than the first read's room is read to its end.
    #[test]
    fn nvidia_long_information_is_read_whole() {
        let root = tempfile::tempdir().unwrap();
        info(root.path(), "0000:3b:00.0", 3, "GPU-aaa");
        let p = root
            .path()
            .join("proc/driver/nvidia/gpus/0000:3b:00.0/information");
        let filler = "Padding: x\n".repeat(1000);
        std::fs::write(&p, format!("{filler}GPU UUID: GPU-long\nDevice Minor: 7\n")).unwrap();
        let devs = discover(&profile("nvidia", root.path())).unwrap();
        assert_eq!(devs[0].minor, Some(7));
        assert_eq!(devs[0].uuid.as_deref(), Some("GPU-long"));
        // Without `Bus Location`, the directory's name is the bus id.
        assert_eq!(devs[0].pci_bus_id.as_deref(), Some("0000:3b:00.0"));
    }

    #[test]
    fn no_driver_is_empty() {
        let root = tempfile::tempdir().unwrap();
        assert!(discover(&profile("nvidia", root.path()))
            .unwrap()
            .is_empty());
        assert!(discover(&profile("enflame", root.path()))
            .unwrap()
            .is_empty());
        assert_eq!(driver_version(&profile("enflame", root.path())), None);
    }

    #[test]
    fn version_is_first_dotted_number() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proc/driver/nvidia")).unwrap();
        std::fs::write(
            root.path().join("proc/driver/nvidia/version"),
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0\n",
        )
        .unwrap();
        assert_eq!(
            driver_version(&profile("nvidia", root.path())).as_deref(),
            Some("550.54.14")
        );
    }

    /// Needs root for mknod; CI runs as root, and a non-root run fails here loudly.
    #[test]
    fn device_nodes_by_template() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("dev");
        std::fs::create_dir_all(dev.join("accel")).unwrap();
        let node = |p: PathBuf, minor| {
            mknod(
                &p,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(240, minor),
            )
            .unwrap_or_else(|e| panic!("mknod {} (tests need root): {e}", p.display()))
        };
        for n in [0, 1, 3, 10] {
            node(dev.join(format!("gcu{n}")), n);
        }
        node(dev.join("gcuctl"), 255);
        node(dev.join("gcu01"), 1);
        std::fs::write(dev.join("gcu7"), "not a node").unwrap();
        let devs = discover(&profile("enflame", root.path())).unwrap();
        let idx: Vec<u32> = devs.iter().map(|d| d.index).collect();
        assert_eq!(idx, [0, 1, 3, 10]);
        assert_eq!(devs[2].nodes, [PathBuf::from("/dev/gcu3")]);
        assert_eq!(devs[2].aliases, ["GCU-3"]);

        // Habana: a second template per device, added only where it exists.
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/profiles/habana.toml"
        ))
        .unwrap();
        let (mut habana, _) =
            Profile::from_table(toml::from_str(&text).unwrap(), "habana").unwrap();
        habana.driver_root = root.path().to_path_buf();
        node(dev.join("accel/accel0"), 0);
        node(dev.join("accel/accel_controlD0"), 1);
        node(dev.join("accel/accel1"), 2);
        let devs = discover(&habana).unwrap();
        assert_eq!(
            devs[0].nodes,
            [
                PathBuf::from("/dev/accel/accel0"),
                PathBuf::from("/dev/accel/accel_controlD0")
            ]
        );
        assert_eq!(devs[1].nodes, [PathBuf::from("/dev/accel/accel1")]);
    }

    /// Needs root (mknod).
    #[test]
    fn host_nodes_stay_inside_dev_root_and_are_char_devices() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("dev/sub")).unwrap();
        let mk = |p: &Path, kind, major| {
            mknod(p, kind, Mode::from_bits_truncate(0o666), makedev(major, 0)).unwrap()
        };
        mk(&root.join("dev/gcu0"), SFlag::S_IFCHR, 240);
        mk(&root.join("dev/gcu1"), SFlag::S_IFBLK, 240);
        mk(&root.join("dev/gcu2"), SFlag::S_IFCHR, 7);
        mk(&t.path().join("outside"), SFlag::S_IFCHR, 240);
        std::os::unix::fs::symlink("../gcu0", root.join("dev/sub/rel")).unwrap();
        std::os::unix::fs::symlink(root.join("dev/gcu0"), root.join("dev/abs-in")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), root.join("dev/abs-out")).unwrap();
        std::os::unix::fs::symlink("../../outside", root.join("dev/rel-out")).unwrap();
        let mut p = profile("enflame", &root);
        p.device_majors = vec![240];
        let node = |n: &str, device| host_node(&p, Path::new(n), device).map_err(|e| e.to_string());
        assert_eq!(
            node("/dev/gcu0", true).unwrap(),
            root.canonicalize().unwrap().join("dev/gcu0")
        );
        assert!(node("/dev/sub/rel", true).is_ok());
        // Any absolute link is refused, even one whose target lies inside: dev-root is not
        // `/` to the tree that made the link, so its target means nothing certain here.
        for link in ["/dev/abs-in", "/dev/abs-out", "/dev/rel-out"] {
            assert!(
                node(link, true).unwrap_err().contains("leads out of"),
                "{link}"
            );
        }
        assert!(node("/dev/gcu1", true)
            .unwrap_err()
            .contains("not a character device"));
        assert!(node("/dev/gcu2", true).unwrap_err().contains("major 7"));
        assert!(node("/dev/gcu2", false).is_ok());
        assert!(host_node(&p, Path::new("/dev/none"), true)
            .unwrap_err()
            .is_not_found());
    }

    #[test]
    fn plugin_id_templates() {
        let d = Device {
            index: 2,
            nodes: vec![],
            uuid: None,
            pci_bus_id: None,
            minor: None,
            aliases: vec![],
            model: None,
            duplicate_uuid: None,
        };
        assert_eq!(d.plugin_id("GCU-{index}").as_deref(), Some("GCU-2"));
        assert_eq!(d.plugin_id("{uuid}"), None);
    }
}
