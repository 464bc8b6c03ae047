//! The shim's own log file and the engine's runc-format log.
//!
//! Never stdout (runc's, parsed by containerd). Each line is one `write(2)` on an `O_APPEND`
//! descriptor, so lines from concurrent shims do not interleave. A log that cannot be opened
//! is skipped: logging must never be why a container fails.
//!
//! The shim's own log file is created 0640 (whatever the umask: the mode asked for is never
//! wider), opened with `O_NOFOLLOW` (a symlink planted at its path is not followed: nothing
//! is written), only when it is a regular file, and capped: a file over [`MAX_LOG_BYTES`] is
//! renamed to `<file>.1` (replacing the previous one) before the line is written, so the log
//! never holds more than twice the cap. packaging/logrotate adds time-based rotation.
//! Every line is passed through [`crate::quote::line`]: one line, control characters escaped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

struct FileLogger {
    path: PathBuf,
    level: log::LevelFilter,
}

impl log::Log for FileLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.level
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let line = format!(
                "{} {} accel-container-runtime[{}]: {}\n",
                rfc3339_now(),
                r.level(),
                std::process::id(),
                crate::quote::line(&r.args().to_string())
            );
            append_capped(&self.path, line.as_bytes());
        }
    }

    fn flush(&self) {}
}

static LOGGER: OnceLock<FileLogger> = OnceLock::new();

/// A daemon's log: one line per record on stderr (what `kubectl logs` and journald keep),
/// `<time> <program>: <message>`, warnings and errors marked.
struct StderrLogger {
    program: &'static str,
}

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let mark = match r.level() {
                log::Level::Error => "error: ",
                log::Level::Warn => "warning: ",
                _ => "",
            };
            let line = format!(
                "{} {}: {mark}{}\n",
                rfc3339_now(),
                self.program,
                crate::quote::line(&r.args().to_string())
            );
            // One write per line: lines of concurrent tasks do not interleave.
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}

static STDERR_LOGGER: OnceLock<StderrLogger> = OnceLock::new();

/// Installs the stderr logger for a daemon named `program` (once; later calls, or a logger
/// already set, are ignored).
pub fn init_stderr(program: &'static str) {
    let logger = STDERR_LOGGER.get_or_init(|| StderrLogger { program });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// Installs the file logger (once; later calls are ignored).
pub fn init(path: &Path, level: log::LevelFilter) {
    let logger = LOGGER.get_or_init(|| FileLogger {
        path: path.to_path_buf(),
        level,
    });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}

/// The size over which the shim's log is rotated to `<file>.1`.
pub const MAX_LOG_BYTES: u64 = 10 << 20;

/// The mode the shim's log is created with: root's, readable by the adm-style group.
pub const LOG_MODE: u32 = 0o640;

/// `path` opened to append: never through a symlink at its last component, never blocking
/// on a FIFO, and only when it is a regular file. A file that exists with a wider mode than
/// [`LOG_MODE`] is narrowed.
fn open_append(path: &Path) -> Option<std::fs::File> {
    use rustix::fs::{FileType, Mode, OFlags};
    // rustix, not OpenOptions: one openat(2), without the fcntl(F_SETFD) musl's open adds for
    // O_CLOEXEC.
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::APPEND
        | OFlags::CLOEXEC
        | OFlags::NOFOLLOW
        | OFlags::NONBLOCK
        | OFlags::NOCTTY;
    let fd = rustix::fs::open(path, flags, Mode::from_raw_mode(LOG_MODE)).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return None;
    }
    if st.st_mode & 0o7777 & !LOG_MODE != 0 {
        let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(st.st_mode & LOG_MODE));
    }
    Some(std::fs::File::from(fd))
}

/// Appends to the shim's log, first rotating it when it is over [`MAX_LOG_BYTES`].
fn append_capped(path: &Path, line: &[u8]) {
    let Some(mut file) = open_append(path) else {
        return;
    };
    let size = file.metadata().map_or(0, |m| m.len());
    if size.saturating_add(line.len() as u64) > MAX_LOG_BYTES {
        file = match rotate(path, &file) {
            Some(f) => f,
            None => file,
        };
    }
    let _ = file.write_all(line);
}

/// Renames the log at `path` (open as `file`) to `<path>.1`, under an exclusive lock on it so
/// that of shims racing here only one renames, and returns the new, empty log.
fn rotate(path: &Path, file: &std::fs::File) -> Option<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    rustix::fs::flock(file, rustix::fs::FlockOperation::LockExclusive).ok()?;
    let open = file.metadata().ok()?;
    // Still the file at `path`: another shim did not rotate it first.
    let at_path = std::fs::symlink_metadata(path).ok()?;
    if at_path.dev() == open.dev() && at_path.ino() == open.ino() {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(path, old).ok()?;
    }
    open_append(path)
}

/// Appends to a file the engine named (`--log`): as given, the engine owns it.
fn append(path: &Path, line: &[u8]) {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND | OFlags::CLOEXEC;
    if let Ok(fd) = rustix::fs::open(path, flags, Mode::from_raw_mode(0o644)) {
        let _ = std::fs::File::from(fd).write_all(line);
    }
}

/// Writes an error where the engine reads runc's: `--log FILE` as a JSON line
/// `{"level":"error","msg":...,"time":...}` with `--log-format json` (containerd reports the
/// last such line), else logrus's text form.
pub fn engine_error(log: Option<&Path>, json: bool, msg: &str) {
    let Some(path) = log else { return };
    let msg = &crate::quote::line(msg);
    let time = rfc3339_now();
    let line = if json {
        let mut s = serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string();
        s.push('\n');
        s
    } else {
        format!("time={time:?} level=error msg={msg:?}\n")
    };
    append(path, line.as_bytes());
}

/// UTC now as RFC 3339 with seconds (`2026-11-22T14:05:09Z`).
pub fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to civil date (Howard Hinnant's algorithm), valid far beyond any log's lifetime.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn log_is_0640_not_followed_and_capped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("shim.log");
        append_capped(&p, b"one\n");
        assert_eq!(mode(&p), 0o640);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        append_capped(&p, b"two\n");
        assert_eq!(mode(&p), 0o640);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");

        let target = d.path().join("target");
        std::fs::write(&target, "").unwrap();
        let link = d.path().join("link.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        append_capped(&link, b"x\n");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "");

        std::fs::write(&p, vec![b'a'; MAX_LOG_BYTES as usize]).unwrap();
        append_capped(&p, b"three\n");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "three\n");
        assert_eq!(
            std::fs::metadata(d.path().join("shim.log.1"))
                .unwrap()
                .len(),
            MAX_LOG_BYTES
        );
    }

    #[test]
    fn civil_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_356_309), "2026-11-22T14:05:09Z");
    }

    #[test]
    fn engine_json_line_is_runc_shaped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log.json");
        engine_error(Some(&p), true, "NVIDIA_VISIBLE_DEVICES: no device \"9\"");
        let text = std::fs::read_to_string(&p).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "NVIDIA_VISIBLE_DEVICES: no device \"9\"");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
    }
}
