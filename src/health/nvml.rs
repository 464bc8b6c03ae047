//! NVIDIA's signals through NVML, for the health engine: XID and double-bit ECC events from
//! one event set waited on by one thread per [`Watch`] (never one per GPU), and, polled at the
//! engine's interval, the volatile uncorrected ECC count against its first reading, the
//! remapped-rows state and `NVML_ERROR_GPU_IS_LOST` from any call on the GPU.
//!
//! The library is found in the driver root as the runtime finds the driver's libraries,
//! opened there, checked a regular file and loaded through that open file
//! (`/proc/self/fd/N`, [`open`]), so what was checked is what runs. Its functions are looked up
//! once, before `nvmlInit`: one the engine needs to do anything (`REQUIRED`) missing refuses
//! the library; any other missing is said once and its signal is not read, the GPU then
//! judged by the others.
//!
//! When a GPU comes back: an XID (or a double-bit ECC event) holds it until it is reset (a
//! call on it answers "GPU is lost" and a later look-up reaches it again: its handle is opened
//! afresh and its ECC count baselined again) or the driver is reloaded (NVML answers
//! "uninitialised" and is initialised again), or, where the operator sets
//! `xid-clear-seconds`, after that long. The polled signals clear as soon as they read clear.
//!
//! A failed wait is not a GPU failure: it is said once, and waited on again after a second.
//!
//! One initialisation per process where it can: a library already initialised in this
//! process (the exporter's NVML metrics, loaded from the same file first: the dynamic loader
//! maps one file once, so both hold the same library) is used as it is, never initialised
//! again; this engine shuts down only what it initialised itself (at a start on an
//! uninitialised library, or again after a driver reload). NVML counts its initialisations,
//! so either way each `nvmlInit` is paired with one `nvmlShutdown`.
//!
//! Ref: NVML API Reference Guide, Event Handling Methods, Device Queries (ECC, remapped rows),
//! Return values (`nvmlReturn_t`).

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void, CString, OsStr};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{FileType, Mode, OFlags};

use super::reason::{Kind, Problem};
use super::wing::NvmlHealth;
use crate::libraries::{libraries, Resolver};
use crate::profile::Profile;

/// `nvmlReturn_t` values the engine tells apart.
const SUCCESS: c_int = 0;
const ERROR_UNINITIALIZED: c_int = 1;
const ERROR_NOT_SUPPORTED: c_int = 3;
const ERROR_DRIVER_NOT_LOADED: c_int = 9;
const ERROR_TIMEOUT: c_int = 10;
const ERROR_GPU_IS_LOST: c_int = 15;

/// `nvmlEventType*`.
const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
const EVENT_XID_CRITICAL: u64 = 0x8;
/// `NVML_MEMORY_ERROR_TYPE_UNCORRECTED`, `NVML_VOLATILE_ECC`.
const UNCORRECTED: c_int = 1;
const VOLATILE: c_int = 0;

/// How long one wait lasts: what a stop waits for at most.
const WAIT_MS: c_uint = 500;

type Device = *mut c_void;
type EventSet = *mut c_void;

/// `nvmlEventData_t`.
#[repr(C)]
struct EventData {
    device: Device,
    event_type: u64,
    event_data: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// A library opened in a driver root and loaded through its open file.
pub struct Opened {
    pub lib: libloading::Library,
    /// The open file the library was loaded through: `path` names it while it is open.
    pub fd: OwnedFd,
    /// `/proc/self/fd/N`, for a second loader of the same file (nvml-wrapper).
    pub path: String,
    /// The library's path on the host, for messages.
    pub shown: String,
}

/// Loads `library` from `profile`'s driver root (see the module's doc). The error is a reason
/// word (the exporter's failure reasons) and one line.
pub fn open(profile: &Profile, library: &str) -> Result<Opened, (&'static str, String)> {
    let stem = library.split(".so").next().unwrap_or(library);
    let cache = crate::ldcache::load(&profile.driver_root).unwrap_or_default();
    let mut resolver = Resolver::new(&profile.driver_root);
    let found = libraries(profile, &[stem], &cache, &mut resolver)
        .into_iter()
        .find(|f| f.name == library)
        .ok_or_else(|| {
            (
                "not-found",
                format!(
                    "{library} is neither in {}/etc/ld.so.cache nor in library-search-dirs",
                    profile.driver_root.display()
                ),
            )
        })?;
    let shown = found.host.display().to_string();
    let fd = rustix::fs::open(
        &found.host,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ("unreadable", format!("{shown}: {e}")))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| ("unreadable", format!("{shown}: {e}")))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(("not-a-file", format!("{shown}: not a regular file")));
    }
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    // SAFETY: loading runs the library's initialisers: the driver's NVML, found as the
    // runtime finds the driver's libraries and checked a regular file above.
    let lib = unsafe { libloading::Library::new(OsStr::new(&path)) }
        .map_err(|e| ("nvml-error", format!("{shown}: {e}")))?;
    Ok(Opened {
        lib,
        fd,
        path,
        shown,
    })
}

/// The names of `names` that `lib` lacks.
pub fn lacking(lib: &libloading::Library, names: &[&[u8]]) -> Vec<String> {
    names
        .iter()
        .filter(|name| {
            // SAFETY: only the address is looked up, never called.
            unsafe { lib.get::<unsafe extern "C" fn()>(name) }.is_err()
        })
        .map(|name| String::from_utf8_lossy(&name[..name.len() - 1]).into_owned())
        .collect()
}

/// The functions without which the engine can read nothing, or not shut NVML down.
const REQUIRED: [&[u8]; 3] = [
    b"nvmlInit_v2\0",
    b"nvmlShutdown\0",
    b"nvmlDeviceGetHandleByPciBusId_v2\0",
];

/// NVML's functions the engine calls; the optional ones `None` where the library lacks them.
struct Api {
    init: unsafe extern "C" fn() -> c_int,
    shutdown: unsafe extern "C" fn() -> c_int,
    by_bus: unsafe extern "C" fn(*const c_char, *mut Device) -> c_int,
    set_create: Option<unsafe extern "C" fn(*mut EventSet) -> c_int>,
    supported: Option<unsafe extern "C" fn(Device, *mut u64) -> c_int>,
    register: Option<unsafe extern "C" fn(Device, u64, EventSet) -> c_int>,
    wait: Option<unsafe extern "C" fn(EventSet, *mut EventData, c_uint) -> c_int>,
    set_free: Option<unsafe extern "C" fn(EventSet) -> c_int>,
    ecc: Option<unsafe extern "C" fn(Device, c_int, c_int, *mut u64) -> c_int>,
    remapped: Option<
        unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint, *mut c_uint, *mut c_uint) -> c_int,
    >,
    error_string: Option<unsafe extern "C" fn(c_int) -> *const c_char>,
    /// Keeps every pointer above valid; last, so it is dropped after them.
    _lib: libloading::Library,
}

/// `lib`'s function `name` (NUL-terminated), `None` where it lacks it.
///
/// # Safety
/// `T` must be the function's C signature.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Option<T> {
    // SAFETY: the caller gives the signature; the pointer is kept beside `lib`.
    unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
}

impl Api {
    fn error(&self, rc: c_int) -> String {
        let text = self.error_string.and_then(|f| {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string or NULL.
            let p = unsafe { f(rc) };
            (!p.is_null()).then(|| {
                // SAFETY: non-null, NUL-terminated, static in the library.
                let s = unsafe { std::ffi::CStr::from_ptr(p) };
                s.to_string_lossy().chars().take(80).collect::<String>()
            })
        });
        match text {
            Some(t) => format!("NVML error {rc}: {t}"),
            None => format!("NVML error {rc}"),
        }
    }
}

/// What is kept of one GPU, by its PCI bus id.
#[derive(Debug, Default)]
struct Gpu {
    /// Its handle (a pointer NVML owns, kept as an address), once looked up.
    handle: Option<usize>,
    /// Its handle is in the event set.
    registered: bool,
    /// A call on it answered "GPU is lost" and no look-up has reached it since.
    lost: bool,
    /// The XID or double-bit ECC event that holds it, and when it came.
    event: Option<(Problem, Instant)>,
    ecc_base: Option<u64>,
    /// What the last poll found wrong (ECC, remapped rows).
    polled: Vec<Problem>,
    /// What of it was said once (a signal it cannot give).
    said: HashSet<&'static str>,
}

struct Shared {
    api: Api,
    /// The `nvmlInit` calls this engine made (each undone by one `nvmlShutdown` when dropped).
    inits: std::sync::atomic::AtomicU32,
    cfg: NvmlHealth,
    profile: String,
    gpus: Mutex<HashMap<String, Gpu>>,
    /// NVML answered "uninitialised" (a driver reload): initialise it again.
    reinit: AtomicBool,
    stop: AtomicBool,
}

/// One profile's NVML for the health engine (see the module's doc); shut down when dropped.
pub struct Watch {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("profile", &self.shared.profile)
            .field("events", &self.thread.is_some())
            .finish()
    }
}

/// A GPU's handle from NVML's address.
fn device(addr: usize) -> Device {
    addr as Device
}

impl Watch {
    /// Loads `cfg.library` from `profile`'s driver root, initialises it and starts the event
    /// thread where the library has what events need. One line on error.
    pub fn start(profile: &Profile, cfg: &NvmlHealth) -> Result<Watch, String> {
        let opened = open(profile, &cfg.library).map_err(|(_, e)| e)?;
        let missing = lacking(&opened.lib, &REQUIRED);
        if !missing.is_empty() {
            return Err(format!(
                "{} lacks {}: refused, never initialised",
                opened.shown,
                missing.join(", ")
            ));
        }
        let lib = &opened.lib;
        // SAFETY: each signature is NVML's (nvml.h); REQUIRED were found just above.
        let api = unsafe {
            Api {
                init: symbol(lib, b"nvmlInit_v2\0").ok_or("nvmlInit_v2")?,
                shutdown: symbol(lib, b"nvmlShutdown\0").ok_or("nvmlShutdown")?,
                by_bus: symbol(lib, b"nvmlDeviceGetHandleByPciBusId_v2\0")
                    .ok_or("nvmlDeviceGetHandleByPciBusId_v2")?,
                set_create: symbol(lib, b"nvmlEventSetCreate\0"),
                supported: symbol(lib, b"nvmlDeviceGetSupportedEventTypes\0"),
                register: symbol(lib, b"nvmlDeviceRegisterEvents\0"),
                wait: symbol(lib, b"nvmlEventSetWait_v2\0"),
                set_free: symbol(lib, b"nvmlEventSetFree\0"),
                ecc: symbol(lib, b"nvmlDeviceGetTotalEccErrors\0"),
                remapped: symbol(lib, b"nvmlDeviceGetRemappedRows\0"),
                error_string: symbol(lib, b"nvmlErrorString\0"),
                _lib: opened.lib,
            }
        };
        let mut unread = Vec::new();
        for (name, there, wanted) in [
            ("nvmlEventSetCreate", api.set_create.is_some(), true),
            ("nvmlDeviceRegisterEvents", api.register.is_some(), true),
            ("nvmlEventSetWait_v2", api.wait.is_some(), true),
            ("nvmlEventSetFree", api.set_free.is_some(), true),
            ("nvmlDeviceGetTotalEccErrors", api.ecc.is_some(), cfg.ecc),
            (
                "nvmlDeviceGetRemappedRows",
                api.remapped.is_some(),
                cfg.remapped_rows,
            ),
        ] {
            if wanted && !there {
                unread.push(name);
            }
        }
        // A look-up that answers anything but "uninitialised" says another holder in this
        // process (the exporter's metrics) initialised this same library: use it as it is.
        let probe = c"0000:00:00.0";
        let mut d: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated bus id and a place for the handle; NVML answers
        // NVML_ERROR_UNINITIALIZED to any call made before nvmlInit.
        let shared_init = unsafe { (api.by_bus)(probe.as_ptr(), &mut d) } != ERROR_UNINITIALIZED;
        if !shared_init {
            // SAFETY: nvmlInit_v2 takes nothing.
            let rc = unsafe { (api.init)() };
            if rc != SUCCESS {
                return Err(format!("{}: nvmlInit_v2: {}", opened.shown, api.error(rc)));
            }
        }
        drop(opened.fd);
        if !unread.is_empty() {
            log::warn!(
                "{}: {} lacks {}: the signals they give are not read (XID events need all four \
                 event functions); each GPU judged by the others",
                profile.name,
                opened.shown,
                unread.join(", ")
            );
        }
        let events = api.set_create.is_some()
            && api.register.is_some()
            && api.wait.is_some()
            && api.set_free.is_some();
        let shared = Arc::new(Shared {
            api,
            inits: std::sync::atomic::AtomicU32::new(u32::from(!shared_init)),
            cfg: cfg.clone(),
            profile: profile.name.clone(),
            gpus: Mutex::new(HashMap::new()),
            reinit: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let thread = if events {
            let s = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name("nvml-events".into())
                    .spawn(move || s.events())
                    .map_err(|e| format!("{}: the NVML event thread: {e}", profile.name))?,
            )
        } else {
            None
        };
        log::info!(
            "{}: NVML health from {} (XIDs ignored: {:?}){}",
            profile.name,
            shared.cfg.library,
            shared.cfg.xid_ignore,
            if shared_init {
                "; initialised already in this process, used as it is"
            } else {
                ""
            }
        );
        Ok(Watch { shared, thread })
    }

    /// GPU `bdf`'s NVML problems now, empty when clear. `poll`: read its ECC count and
    /// remapped rows (the engine's interval has passed); else only what the events said and
    /// what the last poll found lost.
    pub fn read(&self, bdf: &str, poll: bool) -> Vec<Problem> {
        self.shared.read(bdf, poll)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Only what this engine initialised: a library it found initialised is its holder's.
        for _ in 0..self.shared.inits.load(Ordering::SeqCst) {
            // SAFETY: initialised by this engine; no thread of it calls NVML any more.
            unsafe { (self.shared.api.shutdown)() };
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Gpu>> {
        self.gpus.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self, bdf: &str, poll: bool) -> Vec<Problem> {
        let api = &self.api;
        if poll && self.reinit.swap(false, Ordering::SeqCst) {
            // SAFETY: nvmlInit_v2 takes nothing; NVML counts its initialisations.
            let rc = unsafe { (api.init)() };
            if rc == SUCCESS {
                self.inits.fetch_add(1, Ordering::SeqCst);
                log::info!(
                    "{}: NVML initialised again (the driver reloaded): XIDs cleared, ECC \
                     counted afresh",
                    self.profile
                );
                self.lock().clear();
            } else {
                self.reinit.store(true, Ordering::SeqCst);
            }
        }
        let mut gpus = self.lock();
        let g = gpus.entry(bdf.to_string()).or_default();
        let mut problems: Vec<Problem> = Vec::new();
        if poll && g.handle.is_none() {
            let Ok(c) = CString::new(bdf) else {
                return problems;
            };
            let mut d: Device = std::ptr::null_mut();
            // SAFETY: a NUL-terminated bus id and a place for the handle.
            let rc = unsafe { (api.by_bus)(c.as_ptr(), &mut d) };
            match rc {
                SUCCESS => {
                    if g.lost {
                        log::info!(
                            "{}: GPU {bdf} answers NVML again (reset): its XIDs cleared, its \
                             ECC count counted from now",
                            self.profile
                        );
                        g.event = None;
                        g.ecc_base = None;
                        g.lost = false;
                    }
                    g.handle = Some(d as usize);
                    g.registered = false;
                }
                ERROR_GPU_IS_LOST => self.lost(g, bdf),
                e => self.failed(g, "lookup", bdf, "looked up", e),
            }
        }
        if poll {
            let mut found = Vec::new();
            if let Some(h) = g.handle {
                self.poll(g, bdf, h, &mut found);
            }
            g.polled = found;
        }
        if !g.lost {
            problems.extend(g.polled.iter().cloned());
        }
        if g.lost {
            problems.insert(
                0,
                Problem::new(
                    Kind::GpuLost,
                    format!("GPU {bdf} is lost to NVML (NVML_ERROR_GPU_IS_LOST)"),
                ),
            );
        }
        if let Some((reason, at)) = &g.event {
            let after = self.cfg.xid_clear_seconds.map(Duration::from_secs);
            if after.is_some_and(|a| at.elapsed() >= a) {
                log::info!(
                    "{}: GPU {bdf}: {} cleared after xid-clear-seconds",
                    self.profile,
                    reason.text
                );
                g.event = None;
            } else {
                problems.insert(0, reason.clone());
            }
        }
        problems
    }

    /// An NVML answer that is no signal, said once per GPU and call.
    fn failed(&self, g: &mut Gpu, what: &'static str, bdf: &str, did: &str, rc: c_int) {
        if rc == ERROR_UNINITIALIZED || rc == ERROR_DRIVER_NOT_LOADED {
            self.reinit.store(true, Ordering::SeqCst);
        }
        if g.said.insert(what) {
            log::warn!(
                "{}: GPU {bdf} could not be {did} through NVML ({}); judged by its other signals",
                self.profile,
                self.api.error(rc)
            );
        }
    }

    fn lost(&self, g: &mut Gpu, bdf: &str) {
        if !g.lost {
            log::warn!("{}: GPU {bdf}: NVML_ERROR_GPU_IS_LOST", self.profile);
        }
        g.lost = true;
        g.handle = None;
        g.registered = false;
    }

    fn poll(&self, g: &mut Gpu, bdf: &str, h: usize, problems: &mut Vec<Problem>) {
        let api = &self.api;
        if let (true, Some(ecc)) = (self.cfg.ecc, api.ecc) {
            let mut n = 0u64;
            // SAFETY: a handle NVML gave and a place for the count.
            match unsafe { ecc(device(h), UNCORRECTED, VOLATILE, &mut n) } {
                SUCCESS => match g.ecc_base {
                    Some(b) if n > b => problems.push(Problem::new(
                        Kind::Ecc,
                        format!(
                            "{} uncorrected ECC error(s) on GPU {bdf} since it was first read \
                             (volatile count {n})",
                            n - b
                        ),
                    )),
                    _ => g.ecc_base = Some(n),
                },
                ERROR_NOT_SUPPORTED => {}
                ERROR_GPU_IS_LOST => return self.lost(g, bdf),
                e => self.failed(g, "ecc", bdf, "read its ECC count", e),
            }
        }
        if let (true, Some(remapped)) = (self.cfg.remapped_rows, api.remapped) {
            let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
            // SAFETY: a handle NVML gave and four places for the answers.
            match unsafe { remapped(device(h), &mut corr, &mut unc, &mut pending, &mut failure) } {
                SUCCESS => {
                    if failure != 0 {
                        problems.push(Problem::new(
                            Kind::RowRemap,
                            format!("row remapping failed on GPU {bdf}"),
                        ));
                    } else if pending != 0 {
                        problems.push(Problem::new(
                            Kind::RowRemap,
                            format!("row remapping pending on GPU {bdf} (it needs a reset)"),
                        ));
                    }
                }
                ERROR_NOT_SUPPORTED => {}
                ERROR_GPU_IS_LOST => self.lost(g, bdf),
                e => self.failed(g, "remap", bdf, "read its remapped rows", e),
            }
        }
    }

    /// The event thread: registers each GPU looked up since, then waits.
    fn events(&self) {
        let api = &self.api;
        let (Some(create), Some(register), Some(wait), Some(free)) =
            (api.set_create, api.register, api.wait, api.set_free)
        else {
            return;
        };
        let mut set: EventSet = std::ptr::null_mut();
        // SAFETY: a place for the set.
        let rc = unsafe { create(&mut set) };
        if rc != SUCCESS {
            log::warn!(
                "{}: no NVML event set ({}): XIDs not read; each GPU judged by its polled \
                 signals",
                self.profile,
                api.error(rc)
            );
            return;
        }
        let mut failing = false;
        while !self.stop.load(Ordering::SeqCst) {
            self.register(register, set);
            let mut data = EventData {
                device: std::ptr::null_mut(),
                event_type: 0,
                event_data: 0,
                gpu_instance_id: 0,
                compute_instance_id: 0,
            };
            // SAFETY: the set created above and a place for one event.
            let rc = unsafe { wait(set, &mut data, WAIT_MS) };
            match rc {
                SUCCESS | ERROR_TIMEOUT => {
                    if failing {
                        log::info!("{}: NVML events are read again", self.profile);
                        failing = false;
                    }
                    if rc == SUCCESS {
                        self.event(&data);
                    }
                }
                e => {
                    if !failing {
                        log::warn!(
                            "{}: waiting for NVML events failed ({}): no GPU is judged by it; \
                             waiting again every second",
                            self.profile,
                            api.error(e)
                        );
                        failing = true;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        // SAFETY: the set created above, waited on by no one now.
        unsafe { free(set) };
    }

    fn register(
        &self,
        register: unsafe extern "C" fn(Device, u64, EventSet) -> c_int,
        set: EventSet,
    ) {
        let mut gpus = self.lock();
        for (bdf, g) in gpus.iter_mut() {
            let Some(h) = g.handle.filter(|_| !g.registered) else {
                continue;
            };
            g.registered = true;
            let mut types = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC;
            if let Some(supported) = self.api.supported {
                let mut t = 0u64;
                // SAFETY: a handle NVML gave and a place for the mask.
                if unsafe { supported(device(h), &mut t) } == SUCCESS {
                    types &= t;
                }
            }
            if types == 0 {
                if g.said.insert("events") {
                    log::warn!(
                        "{}: GPU {bdf} reports no XID or ECC events; judged by its polled \
                         signals",
                        self.profile
                    );
                }
                continue;
            }
            // SAFETY: a handle NVML gave, the set created by this thread.
            let rc = unsafe { register(device(h), types, set) };
            match rc {
                SUCCESS => {}
                ERROR_GPU_IS_LOST => self.lost(g, bdf),
                e => {
                    if g.said.insert("events") {
                        log::warn!(
                            "{}: GPU {bdf}: its events could not be registered ({}); judged by \
                             its polled signals",
                            self.profile,
                            self.api.error(e)
                        );
                    }
                }
            }
        }
    }

    fn event(&self, data: &EventData) {
        let mut gpus = self.lock();
        let Some((bdf, g)) = gpus
            .iter_mut()
            .find(|(_, g)| g.handle == Some(data.device as usize))
        else {
            log::warn!(
                "{}: an NVML event (type {:#x}, data {}) for a GPU not watched: ignored",
                self.profile,
                data.event_type,
                data.event_data
            );
            return;
        };
        let reason = if data.event_type & EVENT_XID_CRITICAL != 0 {
            let xid = data.event_data;
            if self.cfg.xid_ignore.contains(&xid) {
                log::info!(
                    "{}: GPU {bdf}: XID {xid}, an application error (xid-ignore): kept healthy",
                    self.profile
                );
                return;
            }
            Problem::new(Kind::Xid(xid), format!("XID {xid} on GPU {bdf}"))
        } else if data.event_type & EVENT_DOUBLE_BIT_ECC != 0 {
            Problem::new(Kind::Ecc, format!("double-bit ECC error on GPU {bdf}"))
        } else {
            return;
        };
        log::warn!("{}: {}", self.profile, reason.text);
        g.event = Some((reason, Instant::now()));
    }
}
