//! Opening a file with one system call, and reading a regular file whole in one read(2) when
//! it is the size fstat gave.
//!
//! musl's `open` (under std's `File::open`) follows every O_CLOEXEC open with an
//! fcntl(F_SETFD) for kernels older than 2.6.23; [`open`] calls openat(2) directly.
//!
//! `fs::read` and `File::read_to_end` stat the file again, seek, and read until a read
//! returns 0: one read past the end. The create path reads config.json and the driver's
//! ld.so.cache this way on every create. A read of a regular file returns less than it had
//! room for only at the file's end, so a short read that leaves the data at the stat'ed size
//! is the end; a file that changed size since its stat reads on until a read returns 0.

use std::fs::File;
use std::path::Path;

pub use rustix::fs::OFlags;

/// `path` opened read-only and close-on-exec, with `extra` flags (O_NOFOLLOW, O_DIRECTORY...).
pub fn open(path: &Path, extra: OFlags) -> std::io::Result<File> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | extra,
        rustix::fs::Mode::empty(),
    )?;
    Ok(File::from(fd))
}

/// The bytes of the file at `path`, read as [`whole`] reads (no size limit).
pub fn bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = open(path, OFlags::empty())?;
    let size = rustix::fs::fstat(&file)?.st_size;
    whole(&file, u64::try_from(size).unwrap_or(0), u64::MAX)
}

/// The text of the file at `path`, read as [`bytes`] reads.
pub fn text(path: &Path) -> std::io::Result<String> {
    String::from_utf8(bytes(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
}

/// The whole of `file`, which fstat said is `size` bytes; more than `limit` bytes is an
/// error (a file that grew past it while read).
pub fn whole(file: &File, size: u64, limit: u64) -> std::io::Result<Vec<u8>> {
    use rustix::io::Errno;
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let mut data: Vec<u8> = Vec::new();
    // Room for one byte more than the size: a file that grew fills it and reads on.
    data.try_reserve_exact(size.saturating_add(1))
        .map_err(std::io::Error::other)?;
    loop {
        if data.len() == data.capacity() {
            data.try_reserve(data.capacity().max(4096))
                .map_err(std::io::Error::other)?;
        }
        let room = data.capacity() - data.len();
        match rustix::io::read(file, rustix::buffer::spare_capacity(&mut data)) {
            Ok(0) => break,
            Ok(n) if n < room && data.len() == size => break,
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        if data.len() as u64 > limit {
            return Err(std::io::Error::other(format!(
                "grew over the {limit} byte limit while read"
            )));
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_that_grew_or_shrank_since_its_stat() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        let text: Vec<u8> = (0..70_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&path, &text).unwrap();
        for stat_size in [0, 1, 4096, 69_999, 70_000, 70_001, 200_000] {
            let file = File::open(&path).unwrap();
            assert_eq!(
                whole(&file, stat_size, u64::MAX).unwrap(),
                text,
                "{stat_size}"
            );
        }
        let file = File::open(&path).unwrap();
        assert!(whole(&file, 10, 50_000).is_err());
        std::fs::write(&path, b"").unwrap();
        let file = File::open(&path).unwrap();
        assert!(whole(&file, 10, u64::MAX).unwrap().is_empty());
    }
}
