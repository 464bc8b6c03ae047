//! Reading a file whole with a size limit enforced while reading (issue 14, class 5).
//!
//! The limit is never taken from `fstat`: a procfs or sysfs file reports a size of 0 and may
//! produce more than any limit, and a regular file may grow between the stat and the read.
//! At most `limit + 1` bytes are read; one more than the limit is the refusal.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// The bytes of `reader` until its end, or an `InvalidData` error when there are more than
/// `limit`.
pub fn read(reader: impl Read, limit: u64) -> std::io::Result<Vec<u8>> {
    read_hinted(reader, limit, 0)
}

/// [`read`] into a buffer sized for `size_hint` bytes first (a regular file's `fstat` size):
/// one `read` call instead of one per doubling of the buffer. The hint only sizes the
/// buffer; the limit is still enforced on what is read.
pub fn read_hinted(reader: impl Read, limit: u64, size_hint: u64) -> std::io::Result<Vec<u8>> {
    let cap = size_hint.min(limit).saturating_add(1);
    let mut data = Vec::with_capacity(usize::try_from(cap).unwrap_or(0));
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("over the {limit} byte limit"),
        ));
    }
    Ok(data)
}

/// [`read`] of the file at `path` (opened as `File::open` does; the caller names the path in
/// its error, as with `fs::read`).
pub fn read_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    read(std::fs::File::open(path)?, limit)
}

/// [`read_file`] as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> std::io::Result<String> {
    text(read_file(path, limit)?)
}

/// Bytes read by [`read`] or [`read_hinted`] as UTF-8 text, refused as `fs::read_to_string`
/// refuses them.
pub fn text(data: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(data)
        .map_err(|_| Error::new(ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_enforced_on_what_is_read() {
        assert_eq!(read(&b"abcd"[..], 4).unwrap(), b"abcd");
        assert!(read(&b"abcde"[..], 4).is_err());
        // An endless source (what /dev/zero or a looping procfs file is) ends at the limit.
        let e = read(std::io::repeat(0), 1 << 16).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
    }

    #[test]
    fn a_file_reporting_size_zero_is_still_bounded() {
        // /proc/self/status: fstat says 0 bytes.
        let p = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(p).unwrap().len(), 0);
        assert!(read_text(p, 1 << 20).unwrap().contains("Pid:"));
        let e = read_file(p, 16).unwrap_err().to_string();
        assert!(e.contains("over the 16 byte limit"), "{e}");
    }
}
