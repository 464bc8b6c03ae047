//! Writing an `ld.so.cache` that glibc's loader and `ldconfig -p` read as their own.
//!
//! The loader finds a soname by binary search over the entry table (`search_cache` in
//! `elf/dl-cache.c`), so the table must be in exactly the order `ldconfig` writes: names in
//! *descending* order of `_dl_cache_libcmp` (bytes, except that runs of digits compare as
//! numbers: `libfoo.so.10` > `libfoo.so.9`), and among equal names higher `flags` first,
//! glibc-hwcaps entries before the others (by subdirectory name), then more legacy hwcap bits,
//! a higher hwcap, a higher OS version (`compare` in `elf/cache.c`). Entries that compare equal
//! keep the order they were given in, as `ldconfig`'s insertion does: the loader takes the
//! first usable one, so the caller's order is its precedence. Only the new format
//! (`glibc-ld.so.cache1.1`, glibc >= 2.32's default; every glibc since 2.2 reads it) is
//! written, in this machine's byte order, with an extension directory holding the
//! glibc-hwcaps subdirectory names (when entries use them) and the generator's name.
//! Ref: glibc `elf/cache.c` (`compare`, `save_cache`), `elf/dl-cache.c` (`search_cache`,
//! `_dl_cache_libcmp`), `sysdeps/generic/dl-cache.h` (layout, `cache_extension`).

use std::cmp::Ordering;

use super::{new_table_start, read_u32, slots, LdCacheError, Strings, HWCAP_EXTENSION, NEW_HEADER};
use super::{NEW_ENTRY, NEW_MAGIC};

/// `cache_extension_magic` in dl-cache.h: `(uint32_t) -358342284`.
const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
const TAG_GENERATOR: u32 = 0;
const TAG_GLIBC_HWCAPS: u32 = 1;
/// `cache_file_new_flags_endian_{little,big}`: the header byte saying which order the
/// numbers are in (glibc >= 2.33 refuses a cache of the other order).
const ENDIAN_FLAG: u8 = if cfg!(target_endian = "big") { 3 } else { 2 };
const GENERATOR: &str = concat!("accel-container-runtime ", env!("CARGO_PKG_VERSION"));
/// The bits of an extension entry's `hwcap` that index the subdirectory list.
const HWCAPS_INDEX_MASK: u64 = 0xffff_ffff;

/// One cache entry, owned, as read from an image or made for a library to add.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record {
    pub name: String,
    pub path: String,
    pub flags: i32,
    pub osversion: u32,
    /// Legacy hwcap bits; for an entry with `hwcaps_dir`, only its bits above the index
    /// (the ISA level and [`HWCAP_EXTENSION`]) are kept, the index is assigned on write.
    pub hwcap: u64,
    /// The glibc-hwcaps subdirectory (`x86-64-v3`) the entry belongs to.
    pub hwcaps_dir: Option<String>,
}

impl Record {
    /// A native libc6 library (the flags `ldconfig` gives it on this machine).
    pub fn native(name: &str, path: &str) -> Record {
        Record {
            name: name.to_string(),
            path: path.to_string(),
            flags: super::native_flags(),
            osversion: 0,
            hwcap: 0,
            hwcaps_dir: None,
        }
    }

    /// The hwcap `compare` sorts legacy entries by (zero for glibc-hwcaps entries).
    fn legacy_hwcap(&self) -> u64 {
        if self.hwcaps_dir.is_some() {
            0
        } else {
            self.hwcap
        }
    }
}

/// `_dl_cache_libcmp`: bytes, with runs of ASCII digits compared as numbers and a digit
/// greater than any other byte.
pub fn libcmp(a: &[u8], b: &[u8]) -> Ordering {
    let (mut i, mut j) = (0, 0);
    loop {
        let (Some(&x), y) = (a.get(i), b.get(j).copied()) else {
            // `a` ended: equal when `b` did too, else less (glibc returns `0 - *p2`).
            return if j < b.len() {
                Ordering::Less
            } else {
                Ordering::Equal
            };
        };
        let y = y.unwrap_or(0);
        match (x.is_ascii_digit(), y.is_ascii_digit()) {
            (true, true) => {
                let run = |s: &[u8], k: &mut usize| {
                    let mut v: u64 = 0;
                    while let Some(d) = s.get(*k).filter(|d| d.is_ascii_digit()) {
                        v = v.saturating_mul(10).saturating_add(u64::from(d - b'0'));
                        *k += 1;
                    }
                    v
                };
                let (va, vb) = (run(a, &mut i), run(b, &mut j));
                if va != vb {
                    return va.cmp(&vb);
                }
            }
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            (false, false) if x != y => return x.cmp(&y),
            (false, false) => {
                i += 1;
                j += 1;
            }
        }
    }
}

/// ldconfig's `compare`: `Less` means `a` comes first in the table.
fn compare(a: &Record, b: &Record) -> Ordering {
    libcmp(b.name.as_bytes(), a.name.as_bytes())
        .then(b.flags.cmp(&a.flags))
        .then_with(|| match (&a.hwcaps_dir, &b.hwcaps_dir) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then(
            b.legacy_hwcap()
                .count_ones()
                .cmp(&a.legacy_hwcap().count_ones()),
        )
        .then(b.legacy_hwcap().cmp(&a.legacy_hwcap()))
        .then(b.osversion.cmp(&a.osversion))
}

/// The glibc-hwcaps subdirectory names of an image's extension section, by index (empty when
/// it has none). A malformed extension is an error, as it is for `ldconfig -p`.
pub fn hwcaps_names(data: &[u8]) -> Result<Vec<String>, LdCacheError> {
    let bad = LdCacheError::Truncated("extension");
    let Some(start) = new_table_start(data)? else {
        return Ok(Vec::new());
    };
    let new = &data[start..];
    let offset = read_u32(new, 32).ok_or(LdCacheError::Truncated("header"))? as usize;
    if offset == 0 {
        return Ok(Vec::new());
    }
    if read_u32(data, offset) != Some(EXTENSION_MAGIC) {
        // ldconfig before 2.33 wrote no extension and left the field zero; anything else
        // that is not an extension is treated as none, as the loader does.
        return Ok(Vec::new());
    }
    let count = read_u32(data, offset + 4).ok_or(LdCacheError::Truncated("extension"))?;
    for k in 0..count.min(64) as usize {
        let at = offset + 8 + k * 16;
        let (Some(tag), Some(off), Some(size)) = (
            read_u32(data, at),
            read_u32(data, at + 8),
            read_u32(data, at + 12),
        ) else {
            return Err(bad);
        };
        if tag != TAG_GLIBC_HWCAPS {
            continue;
        }
        let (off, size) = (off as usize, size as usize);
        let array = data
            .get(
                off..off
                    .checked_add(size)
                    .ok_or(LdCacheError::Truncated("extension"))?,
            )
            .ok_or(LdCacheError::Truncated("extension"))?;
        let offsets: Vec<usize> = array
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes(w.try_into().expect("4 bytes")) as usize)
            .collect();
        let strings =
            Strings::new(data, offsets.clone()).ok_or(LdCacheError::Truncated("extension"))?;
        let bytes: usize = offsets.iter().map(|&o| strings.get(o).len()).sum();
        if offsets.len() > MAX_HWCAPS || bytes > MAX_STRING_BYTES {
            return Err(LdCacheError::TooLarge(format!(
                "{} glibc-hwcaps names of {bytes} bytes, over the limit of {MAX_HWCAPS} names and {MAX_STRING_BYTES} bytes",
                offsets.len()
            )));
        }
        let names: Vec<String> = offsets
            .iter()
            .map(|&o| String::from_utf8_lossy(&data[strings.get(o)]).into_owned())
            .collect();
        return Ok(names);
    }
    Ok(Vec::new())
}

/// Most entries [`records`] reads from one image, many times what a distribution's cache
/// lists.
pub const MAX_RECORDS: usize = 1 << 16;
/// Most bytes of strings [`records`] copies out of one image, each entry's name, path and
/// glibc-hwcaps subdirectory counted for that entry. Entries may share strings, so this, not
/// the file's size, bounds the memory the copies take and the size of a cache written from
/// them.
pub const MAX_STRING_BYTES: usize = 16 << 20;
/// Most glibc-hwcaps subdirectory names an image may list (glibc knows a handful per
/// architecture).
pub const MAX_HWCAPS: usize = 1024;

/// Every entry of an image as [`Record`]s, in the file's order. An entry naming a
/// glibc-hwcaps subdirectory the image does not list is dropped (the loader could never use
/// it either). An image over `MAX_RECORDS` entries or `MAX_STRING_BYTES` is refused
/// before anything is copied.
pub fn records(data: &[u8]) -> Result<Vec<Record>, LdCacheError> {
    let names = hwcaps_names(data)?;
    let slots = slots(data)?;
    let dir_of = |hwcap: u64| {
        (hwcap & HWCAP_EXTENSION != 0).then(|| names.get((hwcap & HWCAPS_INDEX_MASK) as usize))
    };
    let bytes: usize = slots
        .iter()
        .map(|s| {
            let dir = dir_of(s.hwcap).flatten().map_or(0, String::len);
            s.name.len() + s.path.len() + dir
        })
        .sum();
    if slots.len() > MAX_RECORDS || bytes > MAX_STRING_BYTES {
        return Err(LdCacheError::TooLarge(format!(
            "{} entries whose strings come to {bytes} bytes, over the limit of {MAX_RECORDS} entries and {MAX_STRING_BYTES} bytes",
            slots.len()
        )));
    }
    let mut out = Vec::with_capacity(slots.len());
    for slot in slots {
        let e = slot.entry(data);
        let hwcaps_dir = if e.hwcap & HWCAP_EXTENSION != 0 {
            match names.get((e.hwcap & HWCAPS_INDEX_MASK) as usize) {
                Some(n) => Some(n.clone()),
                None => continue,
            }
        } else {
            None
        };
        out.push(Record {
            name: e.name.to_string(),
            path: e.path.to_string_lossy().into_owned(),
            flags: e.flags,
            osversion: e.osversion,
            hwcap: e.hwcap,
            hwcaps_dir,
        });
    }
    Ok(out)
}

/// The offset of `s` in the string table that starts at `base`, appended once.
fn intern<'a>(
    s: &'a str,
    offsets: &mut std::collections::HashMap<&'a str, u32>,
    strings: &mut Vec<u8>,
    base: usize,
) -> u32 {
    if let Some(&o) = offsets.get(s) {
        return o;
    }
    let o = (base + strings.len()) as u32;
    strings.extend_from_slice(s.as_bytes());
    strings.push(0);
    offsets.insert(s, o);
    o
}

/// A new-format cache image of `records`: sorted as `ldconfig` sorts (ties keep the given
/// order: earlier wins in the loader), later copies of an entry dropped. Names or paths with a NUL
/// cannot be stored and are dropped.
pub fn write(mut records: Vec<Record>) -> Vec<u8> {
    // An entry's subdirectory index is reassigned below: it must not tell copies apart.
    for r in &mut records {
        if r.hwcaps_dir.is_some() {
            r.hwcap &= !HWCAPS_INDEX_MASK;
        }
    }
    let keep: Vec<bool> = {
        let mut seen = std::collections::HashSet::with_capacity(records.len());
        records
            .iter()
            .map(|r| !r.name.contains('\0') && !r.path.contains('\0') && seen.insert(r))
            .collect()
    };
    let mut keep = keep.into_iter();
    records.retain(|_| keep.next().unwrap_or(false));
    records.sort_by(compare);

    let mut dirs: Vec<&str> = records
        .iter()
        .filter_map(|r| r.hwcaps_dir.as_deref())
        .collect();
    dirs.sort_unstable();
    dirs.dedup();

    // Strings: each name and path once, after the table, NUL-terminated.
    let strings_at = NEW_HEADER + records.len() * NEW_ENTRY;
    let mut strings: Vec<u8> = Vec::new();
    let mut offsets: std::collections::HashMap<&str, u32> =
        std::collections::HashMap::with_capacity(records.len() * 2);
    let mut off_of = |s, strings: &mut Vec<u8>| intern(s, &mut offsets, strings, strings_at);
    let mut table = Vec::with_capacity(records.len() * NEW_ENTRY);
    for r in &records {
        let key = off_of(&r.name, &mut strings);
        let value = off_of(&r.path, &mut strings);
        let hwcap = match &r.hwcaps_dir {
            Some(d) => {
                let index = dirs.binary_search(&d.as_str()).expect("collected above") as u64;
                (r.hwcap & !HWCAPS_INDEX_MASK) | HWCAP_EXTENSION | index
            }
            None => r.hwcap,
        };
        table.extend_from_slice(&r.flags.to_ne_bytes());
        table.extend_from_slice(&key.to_ne_bytes());
        table.extend_from_slice(&value.to_ne_bytes());
        table.extend_from_slice(&r.osversion.to_ne_bytes());
        table.extend_from_slice(&hwcap.to_ne_bytes());
    }
    let dir_offsets: Vec<u32> = dirs.iter().map(|d| off_of(d, &mut strings)).collect();

    let strings_len = strings.len();
    let mut out = Vec::with_capacity(strings_at + strings_len + 128);
    out.extend_from_slice(NEW_MAGIC);
    out.extend_from_slice(&(records.len() as u32).to_ne_bytes());
    out.extend_from_slice(&(strings_len as u32).to_ne_bytes());
    out.push(ENDIAN_FLAG);
    out.extend_from_slice(&[0u8; 3]);
    let extension_at = (strings_at + strings_len).next_multiple_of(4);
    out.extend_from_slice(&(extension_at as u32).to_ne_bytes());
    out.extend_from_slice(&[0u8; 12]);
    out.extend_from_slice(&table);
    out.extend_from_slice(&strings);
    out.resize(extension_at, 0);

    // Extension directory: magic, count, sections; then their data.
    let sections = if dirs.is_empty() { 1 } else { 2 };
    let data_at = extension_at + 8 + sections * 16;
    let hwcaps_size = dir_offsets.len() * 4;
    let generator_at = data_at + hwcaps_size;
    out.extend_from_slice(&EXTENSION_MAGIC.to_ne_bytes());
    out.extend_from_slice(&(sections as u32).to_ne_bytes());
    let mut section = |tag: u32, offset: usize, size: usize| {
        for v in [tag, 0, offset as u32, size as u32] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
    };
    section(TAG_GENERATOR, generator_at, GENERATOR.len());
    if !dirs.is_empty() {
        section(TAG_GLIBC_HWCAPS, data_at, hwcaps_size);
    }
    for o in dir_offsets {
        out.extend_from_slice(&o.to_ne_bytes());
    }
    out.extend_from_slice(GENERATOR.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcmp_agrees_with_glibc_on_numbers_and_ends() {
        use Ordering::*;
        for (a, b, want) in [
            ("libfoo.so.10", "libfoo.so.9", Greater),
            ("libfoo.so.1", "libfoo.so.1", Equal),
            ("libfoo.so", "libfoo.so.1", Less),
            ("libfoo.so.1", "libfoo.so", Greater),
            ("lib9", "liba", Greater),
            ("liba", "lib9", Less),
            ("libA", "liba", Less),
            ("libc.so.6", "libcuda.so.1", Less),
            ("libx.so.01", "libx.so.1", Equal),
            ("", "", Equal),
            ("", "a", Less),
        ] {
            assert_eq!(libcmp(a.as_bytes(), b.as_bytes()), want, "{a} {b}");
            assert_eq!(
                libcmp(b.as_bytes(), a.as_bytes()),
                want.reverse(),
                "{b} {a}"
            );
        }
    }

    #[test]
    fn written_image_parses_back_sorted_with_ties_in_given_order() {
        let recs = vec![
            Record::native("libc.so.6", "/lib/libc.so.6"),
            Record::native("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"),
            Record::native("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            Record::native("libz.so.1", "/lib/libz.so.1"),
            Record::native("libfoo.so.10", "/lib/libfoo.so.10"),
            Record::native("libfoo.so.9", "/lib/libfoo.so.9"),
            Record::native("libc.so.6", "/lib/libc.so.6"),
        ];
        let img = write(recs);
        let back = records(&img).unwrap();
        let got: Vec<(&str, &str)> = back
            .iter()
            .map(|r| (r.name.as_str(), r.path.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("libz.so.1", "/lib/libz.so.1"),
                ("libfoo.so.10", "/lib/libfoo.so.10"),
                ("libfoo.so.9", "/lib/libfoo.so.9"),
                ("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"),
                ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                ("libc.so.6", "/lib/libc.so.6"),
            ]
        );
        assert!(back.iter().all(|r| r.flags == super::super::native_flags()));
        assert_eq!(img[28], ENDIAN_FLAG);
        assert!(img.ends_with(GENERATOR.as_bytes()));
    }

    #[test]
    fn hwcaps_entries_survive_a_rewrite_first_among_equals() {
        let mut v3 = Record::native("libm.so.6", "/usr/lib/glibc-hwcaps/x86-64-v3/libm.so.6");
        v3.hwcaps_dir = Some("x86-64-v3".into());
        v3.hwcap = HWCAP_EXTENSION;
        let mut v2 = v3.clone();
        v2.hwcaps_dir = Some("x86-64-v2".into());
        v2.path = "/usr/lib/glibc-hwcaps/x86-64-v2/libm.so.6".into();
        let plain = Record::native("libm.so.6", "/usr/lib/libm.so.6");
        let img = write(vec![plain.clone(), v3.clone(), v2.clone()]);
        assert_eq!(hwcaps_names(&img).unwrap(), ["x86-64-v2", "x86-64-v3"]);
        let back = records(&img).unwrap();
        let dirs: Vec<Option<&str>> = back.iter().map(|r| r.hwcaps_dir.as_deref()).collect();
        assert_eq!(dirs, [Some("x86-64-v2"), Some("x86-64-v3"), None]);
        // Rewriting what was read gives the same bytes.
        assert_eq!(write(back), img);
    }

    #[test]
    fn host_cache_rewritten_keeps_ldconfigs_order() {
        let data = std::fs::read("/etc/ld.so.cache").expect("/etc/ld.so.cache on a glibc host");
        let recs = records(&data).unwrap();
        let mut shuffled = recs.clone();
        shuffled.reverse();
        // Reversing swaps ties; ldconfig never writes two entries that compare equal except
        // for distinct paths of one soname, whose order it decides by directory: keep those.
        let rewritten = records(&write(recs.clone())).unwrap();
        assert_eq!(rewritten, recs);
        let sorted = records(&write(shuffled)).unwrap();
        let names = |v: &[Record]| v.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&sorted), names(&recs));
    }

    #[test]
    fn hostile_extension_is_an_error_not_a_panic() {
        let img = write(vec![Record::native("a.so.1", "/a")]);
        for cut in 0..img.len() {
            let _ = records(&img[..cut]);
        }
        // Whatever parses, written back, parses and rewrites to the same bytes (the fuzz
        // target's property, here on flipped bytes of a real cache).
        let host = std::fs::read("/etc/ld.so.cache").unwrap();
        for i in (0..host.len().min(4096)).step_by(61) {
            let mut m = host.clone();
            m[i] ^= 0x5a;
            if let Ok(r) = records(&m) {
                let w = write(r);
                assert_eq!(write(records(&w).unwrap()), w, "byte {i}");
            }
        }
        let mut bad = img.clone();
        let ext = u32::from_ne_bytes(bad[32..36].try_into().unwrap()) as usize;
        // Claim a hwcaps section far past the end.
        bad[ext + 4..ext + 8].copy_from_slice(&1u32.to_ne_bytes());
        bad[ext + 8..ext + 12].copy_from_slice(&TAG_GLIBC_HWCAPS.to_ne_bytes());
        bad[ext + 16..ext + 20].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(records(&bad).is_err());
    }
}
