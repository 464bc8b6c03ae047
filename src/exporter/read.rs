//! The exporter's one way to read a driver file: resolved in the driver root by
//! [`crate::inroot`] as if it were `/` (no link leads out of it), found `O_PATH` (a FIFO does
//! not block, no device driver's open runs), opened for reading only once `fstat` says it is a
//! regular file, through that same fd, and read with a limit ([`crate::bounded`]). The rule
//! discovery's driver files follow (issue 32, class 6); this is the one function to point at
//! discovery's own helper once both stand on the same floor.

use std::fs::File;
use std::path::Path;

use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;

use crate::inroot::{reopen, Root, Scope};

/// A sysfs or hwmon attribute is one number: a page is more than any holds.
pub const MAX_ATTR: u64 = 4096;

/// Why a read gave nothing, as the error counter's `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub reason: &'static str,
    pub detail: String,
}

/// The bytes of regular file `rel` (container-style) under `root`, at most `limit`.
pub fn read_in_root(root: &Root, rel: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let shown = || root.display(rel).display().to_string();
    let err = |reason, e: &dyn std::fmt::Display| ReadError {
        reason,
        detail: format!("{}: {e}", shown()),
    };
    let fd = root
        .open_at(rel, OFlags::PATH, Scope::InRoot)
        .map_err(|e| match e {
            Errno::NOENT | Errno::NOTDIR => err("missing", &e),
            _ => err("unreadable", &e),
        })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| err("unreadable", &e))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(err(
            "not-a-file",
            &format_args!("{}, not a regular file; not opened", kind_name(kind)),
        ));
    }
    let file = File::from(reopen(&fd, OFlags::RDONLY).map_err(|e| err("unreadable", &e))?);
    let size = u64::try_from(st.st_size).unwrap_or(0);
    crate::bounded::read_hinted(file, limit, size).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            err("too-large", &e)
        } else {
            err("unreadable", &e)
        }
    })
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "not a file",
    }
}

/// A file's text as one number: its first whitespace-separated token (sysfs attributes end
/// in a newline; amdgpu's are bare integers, i915's too).
pub fn number(data: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(data).ok()?;
    let v: f64 = text.split_whitespace().next()?.parse().ok()?;
    v.is_finite().then_some(v)
}
