//! A native reader of glibc's `/etc/ld.so.cache`, so resolving libraries costs a file read,
//! not an `ldconfig -p` subprocess.
//!
//! Two layouts exist: the new format alone (`glibc-ld.so.cache1.1`, glibc >= 2.32 default) and
//! the old `ld.so-1.7.0` table followed by the new one (older distros). Only the new table is
//! read; its string offsets are relative to its own start. Entries borrow their strings from
//! the image: a distro's cache lists hundreds of libraries, of which a create wants a dozen,
//! so nothing is copied per entry.
//! Ref: glibc `elf/cache.c`, `sysdeps/generic/dl-cache.h`.

use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

mod write;
pub use write::{hwcaps_names, libcmp, records, write, Record};

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_ENTRY: usize = 12;
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;

const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_REQUIRED_MASK: i32 = 0xff00;
const FLAG_X8664_LIB64: i32 = 0x0300;
const FLAG_AARCH64_LIB64: i32 = 0x0a00;
/// An entry's `hwcap` names a glibc-hwcaps subdirectory (its low 32 bits index the
/// extension's list of names) instead of legacy hwcap bits. Ref: `dl-cache.h`.
pub const HWCAP_EXTENSION: u64 = 1 << 62;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LdCacheError {
    #[error("not an ld.so.cache (bad magic)")]
    BadMagic,
    #[error("truncated ld.so.cache: {0}")]
    Truncated(&'static str),
    #[error("{0}")]
    TooLarge(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The soname the loader looks up (`libcuda.so.1`).
    pub name: &'a str,
    /// Where it lives, as recorded (relative to the root ldconfig ran for).
    pub path: &'a Path,
    pub flags: i32,
    /// Minimum kernel version (ELF ABI note), 0 for none.
    pub osversion: u32,
    /// Legacy hwcap bits, or a glibc-hwcaps subdirectory index with [`HWCAP_EXTENSION`] set.
    pub hwcap: u64,
}

/// A cache image read from disk, checked once, with where each entry's strings are.
#[derive(Debug, Default)]
pub struct Cache {
    data: Vec<u8>,
    table: Vec<Slot>,
}

/// One entry as offsets into the image (valid, NUL-free; the name is UTF-8).
#[derive(Debug, Clone)]
struct Slot {
    flags: i32,
    osversion: u32,
    hwcap: u64,
    name: Range<usize>,
    path: Range<usize>,
}

impl Slot {
    /// `data` must be the image the slot was made from.
    fn entry<'a>(&self, data: &'a [u8]) -> Entry<'a> {
        let name = &data[self.name.clone()];
        Entry {
            // SAFETY: `slots` checked that this range of this image is UTF-8, and neither
            // `Cache` nor `parse` lets the image change after that. Checking again here would
            // cost more than the rest of a lookup: a create scans the entries once per library.
            name: unsafe { std::str::from_utf8_unchecked(name) },
            path: Path::new(OsStr::from_bytes(&data[self.path.clone()])),
            flags: self.flags,
            osversion: self.osversion,
            hwcap: self.hwcap,
        }
    }
}

impl Cache {
    /// Checks an image; the entries are then read with [`Cache::iter`].
    pub fn parse(data: Vec<u8>) -> Result<Cache, LdCacheError> {
        let table = slots(&data)?;
        Ok(Cache { data, table })
    }

    pub fn iter(&self) -> impl Iterator<Item = Entry<'_>> {
        self.table.iter().map(|s| s.entry(&self.data))
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// The `FLAG_REQUIRED_MASK` bits of libraries for the machine we are built for.
fn native_arch_flags() -> i32 {
    if cfg!(target_arch = "x86_64") {
        FLAG_X8664_LIB64
    } else if cfg!(target_arch = "aarch64") {
        FLAG_AARCH64_LIB64
    } else {
        0
    }
}

/// Parses a cache image; entries keep the file's order (glibc sorts them by name).
pub fn parse(data: &[u8]) -> Result<Vec<Entry<'_>>, LdCacheError> {
    Ok(slots(data)?.iter().map(|s| s.entry(data)).collect())
}

/// Where the new-format table starts: at 0, or after an old-format table; `None` for an
/// old-format-only cache.
fn new_table_start(data: &[u8]) -> Result<Option<usize>, LdCacheError> {
    if data.starts_with(NEW_MAGIC) {
        Ok(Some(0))
    } else if data.starts_with(OLD_MAGIC) {
        // Old header: magic (11 bytes, padded to 12) + nlibs u32, then nlibs entries.
        let n = read_u32(data, 12).ok_or(LdCacheError::Truncated("old header"))? as usize;
        let end = n
            .checked_mul(OLD_ENTRY)
            .and_then(|x| x.checked_add(16))
            .ok_or(LdCacheError::Truncated("old table"))?;
        let aligned = end
            .checked_add(7)
            .ok_or(LdCacheError::Truncated("old table"))?
            & !7;
        if data
            .get(aligned..)
            .is_some_and(|d| d.starts_with(NEW_MAGIC))
        {
            Ok(Some(aligned))
        } else if data.get(end..).is_some_and(|d| d.starts_with(NEW_MAGIC)) {
            Ok(Some(end))
        } else {
            Ok(None)
        }
    } else {
        Err(LdCacheError::BadMagic)
    }
}

/// The entries of an image as offsets, every string checked. Linear in the image's size
/// (issue 23, class 2): entries may share a string or point into the middle of one (glibc's
/// `ldconfig` stores a name as the tail of its path), so each string's end and UTF-8 check
/// come from one pass over the referenced strings, never from a scan per entry.
fn slots(data: &[u8]) -> Result<Vec<Slot>, LdCacheError> {
    let Some(start) = new_table_start(data)? else {
        // An old-format-only cache has no soname table we trust; treat as empty.
        return Ok(Vec::new());
    };
    let new = &data[start..];
    let nlibs = read_u32(new, 20).ok_or(LdCacheError::Truncated("header"))? as usize;
    if new.len() < NEW_HEADER {
        return Err(LdCacheError::Truncated("header"));
    }
    let table_end = nlibs
        .checked_mul(NEW_ENTRY)
        .and_then(|x| x.checked_add(NEW_HEADER))
        .filter(|&e| e <= new.len())
        .ok_or(LdCacheError::Truncated("entries"))?;
    let mut raw = Vec::with_capacity(nlibs);
    for off in (NEW_HEADER..table_end).step_by(NEW_ENTRY) {
        let flags = read_u32(new, off).ok_or(LdCacheError::Truncated("entry"))? as i32;
        let key = read_u32(new, off + 4).ok_or(LdCacheError::Truncated("entry"))? as usize;
        let value = read_u32(new, off + 8).ok_or(LdCacheError::Truncated("entry"))? as usize;
        let osversion = read_u32(new, off + 12).ok_or(LdCacheError::Truncated("entry"))?;
        let hwcap = new
            .get(off + 16..off + 24)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
            .ok_or(LdCacheError::Truncated("entry"))?;
        raw.push((flags, key, value, osversion, hwcap));
    }
    let strings = Strings::new(new, raw.iter().flat_map(|r| [r.1, r.2]).collect())
        .ok_or(LdCacheError::Truncated("string table"))?;
    let at = |off: usize| {
        let r = strings.get(off);
        start + r.start..start + r.end
    };
    Ok(raw
        .into_iter()
        .map(|(flags, key, value, osversion, hwcap)| Slot {
            flags,
            osversion,
            hwcap,
            name: at(key),
            path: at(value),
        })
        .collect())
}

/// NUL-terminated UTF-8 strings of `data` at a set of offsets, each checked once.
pub(crate) struct Strings {
    /// Sorted, distinct offsets and where each string ends (its NUL).
    offsets: Vec<(usize, usize)>,
}

impl Strings {
    /// `None` when a string has no NUL before the end of `data` or is not UTF-8. Offsets are
    /// taken in order: one that lies inside the string the previous one started (a tail of
    /// it) ends at the same NUL, and is UTF-8 when it starts on a character boundary of that
    /// string, already checked whole. So every byte is searched and checked at most once.
    pub(crate) fn new(data: &[u8], mut wanted: Vec<usize>) -> Option<Strings> {
        wanted.sort_unstable();
        wanted.dedup();
        let mut offsets = Vec::with_capacity(wanted.len());
        // The NUL ending the string that began at an earlier offset.
        let mut nul: Option<usize> = None;
        for off in wanted {
            let end = match nul {
                Some(n) if off <= n => {
                    if !is_char_boundary(data[off]) {
                        return None;
                    }
                    n
                }
                _ => {
                    let rest = data.get(off..)?;
                    let n = off + memchr::memchr(0, rest)?;
                    std::str::from_utf8(&data[off..n]).ok()?;
                    nul = Some(n);
                    n
                }
            };
            offsets.push((off, end));
        }
        Some(Strings { offsets })
    }

    /// The string at `off`, which must be one of the offsets given to [`Strings::new`].
    pub(crate) fn get(&self, off: usize) -> Range<usize> {
        let i = self
            .offsets
            .binary_search_by_key(&off, |&(o, _)| o)
            .expect("an offset given to Strings::new");
        off..self.offsets[i].1
    }
}

/// Whether a string of valid UTF-8 may start at this byte (it is not a continuation byte).
fn is_char_boundary(b: u8) -> bool {
    (b as i8) >= -0x40
}

/// Larger than any real cache (a full distribution's is a few hundred KiB).
pub const MAX_SIZE: u64 = 64 << 20;

/// Reads and parses `<root>/etc/ld.so.cache` (at most [`MAX_SIZE`] bytes, enforced while
/// reading); a missing file is an empty cache.
pub fn load(root: &Path) -> std::io::Result<Cache> {
    let path = root.join("etc/ld.so.cache");
    match crate::bounded::read_file(&path, MAX_SIZE) {
        Ok(data) => Cache::parse(data).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Cache::default()),
        Err(e) => Err(e),
    }
}

impl Entry<'_> {
    /// An ELF libc6 library for this machine's architecture.
    pub fn is_native(&self) -> bool {
        self.flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6
            && self.flags & FLAG_REQUIRED_MASK == native_arch_flags()
    }
}

fn read_u32(d: &[u8], off: usize) -> Option<u32> {
    let b = d.get(off..off.checked_add(4)?)?;
    Some(u32::from_ne_bytes(b.try_into().ok()?))
}

/// Builds a new-format cache image; used by tests, benches and fuzz seeds.
pub fn build(entries: &[(&str, &str, i32)]) -> Vec<u8> {
    let mut strings = Vec::new();
    let strings_at = NEW_HEADER + entries.len() * NEW_ENTRY;
    let mut table = Vec::new();
    for (name, path, flags) in entries {
        let key = strings_at + strings.len();
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
        let value = strings_at + strings.len();
        strings.extend_from_slice(path.as_bytes());
        strings.push(0);
        table.extend_from_slice(&flags.to_ne_bytes());
        table.extend_from_slice(&(key as u32).to_ne_bytes());
        table.extend_from_slice(&(value as u32).to_ne_bytes());
        table.extend_from_slice(&0u32.to_ne_bytes());
        table.extend_from_slice(&0u64.to_ne_bytes());
    }
    let mut out = Vec::new();
    out.extend_from_slice(NEW_MAGIC);
    out.extend_from_slice(&(entries.len() as u32).to_ne_bytes());
    out.extend_from_slice(&(strings.len() as u32).to_ne_bytes());
    out.extend_from_slice(&[0u8; 4]); // flags + padding
    out.extend_from_slice(&[0u8; 16]); // extension offset + unused
    out.extend_from_slice(&table);
    out.extend_from_slice(&strings);
    out
}

/// Flags of a native x86-64/aarch64 libc6 entry, for [`build`].
pub fn native_flags() -> i32 {
    FLAG_ELF_LIBC6 | native_arch_flags()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_synthetic() {
        let img = build(&[
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                native_flags(),
            ),
            ("libc.so.6", "/lib/libc.so.6", 0x0003),
        ]);
        let e = parse(&img).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "libcuda.so.1");
        assert!(e[0].is_native());
        assert!(!e[1].is_native() || native_arch_flags() == 0);
    }

    /// The file is read whole, small or spanning many reads; a missing one is an empty cache
    /// and a bad one an error naming it.
    #[test]
    fn load_reads_the_whole_file() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        std::fs::create_dir_all(&etc).unwrap();
        assert!(load(root.path()).unwrap().is_empty());
        for n in [1, 3000] {
            let names: Vec<(String, String)> = (0..n)
                .map(|i| (format!("lib{i}.so.1"), format!("/usr/lib/lib{i}.so.1")))
                .collect();
            let entries: Vec<(&str, &str, i32)> = names
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str(), native_flags()))
                .collect();
            let img = build(&entries);
            std::fs::write(etc.join("ld.so.cache"), &img).unwrap();
            let cache = load(root.path()).unwrap();
            assert_eq!(cache.len(), n, "{} bytes", img.len());
            assert_eq!(cache.data, img);
            let last = cache.iter().last().unwrap();
            assert_eq!(last.name, names[n - 1].0);
        }
        std::fs::write(etc.join("ld.so.cache"), "junk").unwrap();
        let e = load(root.path()).unwrap_err().to_string();
        assert!(
            e.contains("etc/ld.so.cache") && e.contains("bad magic"),
            "{e}"
        );
    }

    #[test]
    fn garbage_and_truncation_are_errors_not_panics() {
        assert_eq!(parse(b"hello"), Err(LdCacheError::BadMagic));
        let img = build(&[("a.so.1", "/a", native_flags())]);
        for cut in 0..img.len() {
            let _ = parse(&img[..cut]);
        }
        let mut huge = img.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse(&huge).is_err());
    }

    /// Strings shared between entries (a name that is the tail of a path, as `ldconfig`
    /// stores them, or one string for many entries) read as each entry's own; a string that
    /// starts inside a UTF-8 character, or runs to the end without a NUL, is an error.
    #[test]
    fn shared_strings_read_as_each_entry_s_own() {
        let mut img = build(&[("libz.so.1", "/usr/lib/libz.so.1", native_flags())]);
        let path_at = u32::from_ne_bytes(img[56..60].try_into().unwrap());
        let tail = path_at + "/usr/lib/".len() as u32;
        img[52..56].copy_from_slice(&tail.to_ne_bytes());
        let e = parse(&img).unwrap();
        assert_eq!(
            (e[0].name, e[0].path),
            ("libz.so.1", Path::new("/usr/lib/libz.so.1"))
        );
        let mut two = build(&[("a", "/b", native_flags()), ("c", "/d", native_flags())]);
        let key = two[52..56].to_vec();
        two[76..80].copy_from_slice(&key);
        two[80..84].copy_from_slice(&key);
        let e = parse(&two).unwrap();
        assert_eq!((e[1].name, e[1].path), ("a", Path::new("a")));
        let mut utf8 = build(&[("é.so", "/é.so", native_flags())]);
        let inside = u32::from_ne_bytes(utf8[52..56].try_into().unwrap()) + 1;
        utf8[52..56].copy_from_slice(&inside.to_ne_bytes());
        assert_eq!(parse(&utf8), Err(LdCacheError::Truncated("string table")));
        let mut open = build(&[("a", "/b", native_flags())]);
        open.pop();
        assert_eq!(parse(&open), Err(LdCacheError::Truncated("string table")));
    }

    /// The host's real cache agrees with `ldconfig -p` on what libc is.
    #[test]
    fn host_cache_lists_libc() {
        let Ok(data) = std::fs::read("/etc/ld.so.cache") else {
            panic!("/etc/ld.so.cache missing on a glibc host")
        };
        let e = parse(&data).unwrap();
        let libc = e
            .iter()
            .find(|e| e.name == "libc.so.6" && e.is_native())
            .expect("libc.so.6 in host cache");
        assert!(libc.path.to_string_lossy().ends_with("libc.so.6"));
        let out = std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .expect("ldconfig");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines = text.lines().filter(|l| l.starts_with('\t')).count();
        assert_eq!(lines, e.len(), "entry count differs from ldconfig -p");
    }
}
