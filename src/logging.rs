//! The shim's own log file and the engine's runc-format log.
//!
//! Never stdout (runc's, parsed by containerd). Each line is one `write(2)` on an `O_APPEND`
//! descriptor, so lines from concurrent shims do not interleave. A log that cannot be opened
//! is skipped: logging must never be why a container fails.

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
                r.args()
            );
            append(&self.path, line.as_bytes());
        }
    }

    fn flush(&self) {}
}

static LOGGER: OnceLock<FileLogger> = OnceLock::new();

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

fn append(path: &Path, line: &[u8]) {
    use rustix::fs::{Mode, OFlags};
    // rustix, not OpenOptions: one openat(2), without musl's extra fcntl (src/read.rs).
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND | OFlags::CLOEXEC;
    if let Ok(fd) = rustix::fs::open(path, flags, Mode::from_raw_mode(0o666)) {
        let _ = std::fs::File::from(fd).write_all(line);
    }
}

/// Writes an error where the engine reads runc's: `--log FILE` as a JSON line
/// `{"level":"error","msg":...,"time":...}` with `--log-format json` (containerd reports the
/// last such line), else logrus's text form.
pub fn engine_error(log: Option<&Path>, json: bool, msg: &str) {
    let Some(path) = log else { return };
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
