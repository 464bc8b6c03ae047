//! Running a vendor's CLI (`efsmi`, `npu-smi`, ...) the way every daemon does: the binary found
//! in the profile's binary-search-dirs under driver-root, run with a cleared environment, in
//! its own process group, chrooted into driver-root when that is not `/` (so it finds its
//! libraries and device nodes as on the host, and sees nothing of the daemon's container),
//! and killed, group and all, past its time limit; its output read up to a limit. The
//! exporter's `[[metrics.commands]]` and the health engine's vendor tools both run here.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::inroot::Root;
use crate::libraries::{binaries, Resolver};
use crate::profile::Profile;

/// A CLI's output past this is refused (a table of a few dozen devices is a few KiB).
pub const MAX_OUTPUT: u64 = 1 << 20;

/// Where `binary` is: the program to exec and, when driver-root is not `/`, the root to
/// chroot into first (the program is then its path inside).
pub fn locate(profile: &Profile, binary: &str) -> Option<(PathBuf, Option<PathBuf>)> {
    let mut resolver = Resolver::new(&profile.driver_root);
    let found = binaries(profile, &[binary], &mut resolver)
        .into_iter()
        .next()?;
    if profile.driver_root == Path::new("/") {
        return Some((found.host, None));
    }
    let root = Root::open(&profile.driver_root).ok()?;
    let inside = root.rel_of(&found.host)?;
    Some((inside, Some(profile.driver_root.clone())))
}

/// Runs the program with `args`, its output within [`MAX_OUTPUT`] and its run within
/// `timeout`; `Err` is (reason, detail).
pub fn run(
    program: &Path,
    chroot: Option<&Path>,
    args: &[String],
    timeout: Duration,
) -> Result<Vec<u8>, (&'static str, String)> {
    let shown = program.display().to_string();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own group: a time-out kills whatever it started too.
        .process_group(0);
    if let Some(root) = chroot {
        let root = std::ffi::CString::new(root.as_os_str().as_encoded_bytes())
            .map_err(|_| ("unreadable", format!("{}: not a path", root.display())))?;
        // SAFETY: between fork and exec only async-signal-safe calls (chroot, chdir).
        unsafe {
            cmd.pre_exec(move || {
                if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| ("not-found", format!("{shown}: cannot run it: {e}")))?;
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut data = Vec::new();
        let r = (&mut stdout)
            .take(MAX_OUTPUT + 1)
            .read_to_end(&mut data)
            .map(|_| data);
        let _ = tx.send(r);
    });
    let kill = || {
        // SAFETY: a signal to the group the child leads.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    };
    let out = match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => {
            kill();
            let _ = child.wait();
            return Err((
                "timeout",
                format!("{shown}: still running after {timeout:?}; killed"),
            ));
        }
    };
    let data = match out {
        Ok(d) if d.len() as u64 > MAX_OUTPUT => {
            kill();
            let _ = child.wait();
            return Err((
                "too-large",
                format!("{shown}: more than {MAX_OUTPUT} bytes of output"),
            ));
        }
        Ok(d) => d,
        Err(e) => {
            kill();
            let _ = child.wait();
            return Err(("unreadable", format!("{shown}: reading its output: {e}")));
        }
    };
    // Its output ended; the program itself gets what is left of the limit to exit.
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => return Ok(data),
            Ok(Some(s)) => return Err(("exit-status", format!("{shown}: {s}"))),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            _ => {
                kill();
                let _ = child.wait();
                return Err((
                    "timeout",
                    format!("{shown}: closed its output but did not exit; killed"),
                ));
            }
        }
    }
}
