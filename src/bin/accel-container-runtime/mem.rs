//! memcpy for the musl build on x86_64. musl's is `rep movsq` plus a `movsb` loop for the
//! tail, microcoded instructions whose start-up dominates the short copies a create makes
//! (~1,000 of them, mostly under 64 bytes: names, paths, JSON pieces): perf put it at 8.5 %
//! of a create's time in the shim, the largest user-space symbol; this one made a create of
//! 8 GPUs ~0.045 ms faster (interleaved runs, medians of 2000). (musl's byte-at-a-time
//! memcmp, wrapped the same way, gave no measurable gain: left alone.)
//!
//! The link (src/build.rs, this binary only, musl x86_64 only) passes `--wrap=memcpy`: every
//! call to memcpy in the program, libc's own included, comes here; `__real_memcpy` is musl's.
//! Up to 64 bytes are copied with two to four overlapping loads and stores (what glibc's
//! x86_64 memcpy does), longer copies go to musl. No loop here, so the compiler has nothing
//! to turn back into a memcpy call (which would recurse).
use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};

extern "C" {
    fn __real_memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8;
}

/// # Safety
/// memcpy's contract: `src` readable and `dst` writable for `n` bytes, not overlapping.
#[no_mangle]
pub unsafe extern "C" fn __wrap_memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: every access below is inside [0, n) of its buffer (the caller's contract);
    // overlapping pieces of one copy write the same bytes twice.
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                let (a, b, c) = (*src, *src.add(n / 2), *src.add(n - 1));
                *dst = a;
                *dst.add(n / 2) = b;
                *dst.add(n - 1) = c;
            }
            4..=7 => {
                let a = src.cast::<u32>().read_unaligned();
                let b = src.add(n - 4).cast::<u32>().read_unaligned();
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            }
            8..=16 => {
                let a = src.cast::<u64>().read_unaligned();
                let b = src.add(n - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            }
            17..=32 => {
                let a = _mm_loadu_si128(src.cast::<__m128i>());
                let b = _mm_loadu_si128(src.add(n - 16).cast::<__m128i>());
                _mm_storeu_si128(dst.cast::<__m128i>(), a);
                _mm_storeu_si128(dst.add(n - 16).cast::<__m128i>(), b);
            }
            33..=64 => {
                let a = _mm_loadu_si128(src.cast::<__m128i>());
                let b = _mm_loadu_si128(src.add(16).cast::<__m128i>());
                let c = _mm_loadu_si128(src.add(n - 32).cast::<__m128i>());
                let d = _mm_loadu_si128(src.add(n - 16).cast::<__m128i>());
                _mm_storeu_si128(dst.cast::<__m128i>(), a);
                _mm_storeu_si128(dst.add(16).cast::<__m128i>(), b);
                _mm_storeu_si128(dst.add(n - 32).cast::<__m128i>(), c);
                _mm_storeu_si128(dst.add(n - 16).cast::<__m128i>(), d);
            }
            _ => return __real_memcpy(dst, src, n),
        }
        dst
    }
}

#[cfg(test)]
mod tests {
    use super::__wrap_memcpy;

    #[test]
    fn copies_every_length_at_every_offset_exactly() {
        let src: Vec<u8> = (0..200u8).collect();
        for n in 0..=130 {
            for off in 0..8 {
                let mut dst = vec![0xAAu8; 150];
                let ret =
                    unsafe { __wrap_memcpy(dst.as_mut_ptr().add(off), src.as_ptr().add(3), n) };
                assert_eq!(ret, unsafe { dst.as_mut_ptr().add(off) });
                assert_eq!(&dst[off..off + n], &src[3..3 + n], "n={n} off={off}");
                assert!(dst[..off].iter().all(|&b| b == 0xAA), "wrote before: n={n}");
                assert!(
                    dst[off + n..].iter().all(|&b| b == 0xAA),
                    "wrote after: n={n}"
                );
            }
        }
    }
}
