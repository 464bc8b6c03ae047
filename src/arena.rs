//! The runtime binary's global allocator: a bump arena in `.bss`, and the C library's
//! allocator beyond it.
//!
//! A `create` lives about a millisecond and ends in `exec`, which frees everything at once; it
//! allocates a few hundred small blocks (keys, paths, entries) and frees most of them soon
//! after. With glibc's malloc that bookkeeping was a fifth of the create's instructions
//! (callgrind, benches/BENCHMARKS.md), and musl's returns memory to the kernel with munmap
//! on the way. Here an allocation is an add; a free gives the space back only when it is the
//! most recent block (a growing `Vec` or `String` then grows in place), otherwise the space
//! stays used until exec. Whatever does not fit, a 100 MB config.json or 10,000 devices,
//! goes to the C library's allocator as it would without the arena, so no input can exhaust
//! it. Untouched pages of the arena are never faulted in: they cost nothing. The pages about to
//! be used are filled in ahead, 64 KiB at a time, by one `madvise(MADV_POPULATE_WRITE)`
//! instead of a page fault each (a create of 8 GPUs went from 83 faults to 54, ~0.02 ms
//! less on the benchmark VM).
//!
//! Only the runtime binary installs it (`#[global_allocator]` in
//! `src/bin/accel-container-runtime.rs`); accel-ctk and the tests keep the system allocator.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Populated at a time: aligned so that every chunk starts on a page (madvise needs that).
const CHUNK: usize = 64 << 10;

#[repr(C, align(65536))]
struct Space<const N: usize>([u8; N]);

/// `N` bytes (a multiple of 64 KiB) handed out from the front; `next` is the offset of the
/// first free byte, `populated` the end of the chunks filled in ahead.
pub struct Arena<const N: usize> {
    space: UnsafeCell<Space<N>>,
    next: AtomicUsize,
    populated: AtomicUsize,
}

// SAFETY: the bytes are handed out through `next` alone, moved with compare-and-swap, so no
// two callers (threads) ever get overlapping blocks.
unsafe impl<const N: usize> Sync for Arena<N> {}

impl<const N: usize> Arena<N> {
    /// All zero, so a `static` one lies in `.bss`.
    pub const fn new() -> Self {
        assert!(N.is_multiple_of(CHUNK), "the arena is whole chunks");
        Arena {
            space: UnsafeCell::new(Space([0; N])),
            next: AtomicUsize::new(0),
            populated: AtomicUsize::new(0),
        }
    }

    fn base(&self) -> usize {
        self.space.get() as usize
    }

    /// The offset of `ptr` when it was handed out by the arena.
    fn offset(&self, ptr: *mut u8) -> Option<usize> {
        (ptr as usize)
            .checked_sub(self.base())
            .filter(|&off| off < N)
    }

    /// Bytes handed out so far (gaps left by frees included).
    pub fn used(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    fn bump(&self, layout: Layout) -> Option<*mut u8> {
        let base = self.base();
        let mut cur = self.next.load(Ordering::Relaxed);
        loop {
            let start = (base + cur).checked_next_multiple_of(layout.align())? - base;
            let end = start.checked_add(layout.size()).filter(|&end| end <= N)?;
            match self
                .next
                .compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    if end > self.populated.load(Ordering::Relaxed) {
                        self.populate(end);
                    }
                    return Some((base + start) as *mut u8);
                }
                Err(now) => cur = now,
            }
        }
    }
}

impl<const N: usize> Arena<N> {
    /// Fills in the chunks up to the one holding `end`, and the next. Only ever an
    /// optimization: a race between threads populates a chunk twice, a kernel without
    /// MADV_POPULATE_WRITE (before 5.14) says EINVAL once and the pages fault in one by one.
    #[cold]
    fn populate(&self, end: usize) {
        let from = self.populated.load(Ordering::Relaxed);
        let to = (end.next_multiple_of(CHUNK) + CHUNK).min(N);
        if to <= from {
            return;
        }
        self.populated.store(to, Ordering::Relaxed);
        // SAFETY: [from, to) lies inside the arena, and `from` is a multiple of CHUNK from a
        // CHUNK-aligned base: page aligned. Populating writes nothing the program can see.
        let rc = unsafe {
            libc::madvise(
                (self.base() + from) as *mut libc::c_void,
                to - from,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            self.populated.store(N, Ordering::Relaxed);
        }
    }
}

impl<const N: usize> Default for Arena<N> {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: blocks from `bump` are in bounds, aligned as asked and never handed out twice while
// live (`next` only moves back over the most recent block, on its free or its resize); every
// other block comes from and goes back to `System`, told apart by its address.
unsafe impl<const N: usize> GlobalAlloc for Arena<N> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.bump(layout) {
            Some(ptr) => ptr,
            // SAFETY: the caller's layout contract, passed on.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match self.offset(ptr) {
            Some(off) => {
                // Only the most recent block can be given back; a lost race means another
                // block came after it, and then it stays used, like any other.
                let _ = self.next.compare_exchange(
                    off + layout.size(),
                    off,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            // SAFETY: not the arena's, so `System` handed it out with this layout.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(off) = self.offset(ptr) else {
            // SAFETY: not the arena's, so `System` handed it out with this layout.
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        // The most recent block grows or shrinks where it is; any other shrinks where it is.
        if new_size <= layout.size() && off + layout.size() != self.used() {
            return ptr;
        }
        if off.checked_add(new_size).is_some_and(|end| end <= N)
            && self
                .next
                .compare_exchange(
                    off + layout.size(),
                    off + new_size,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return ptr;
        }
        // SAFETY: `realloc`'s contract makes this layout valid (size rounded to the alignment
        // does not overflow).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: the caller's layout contract, passed on.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct and at least this long.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn chunks_are_populated_ahead_once() {
        let arena: Box<Arena<{ 3 * CHUNK }>> = Box::default();
        let populated = || arena.populated.load(Ordering::Relaxed);
        assert_eq!(arena.base() % CHUNK, 0);
        unsafe { arena.alloc(layout(16, 8)) };
        assert_eq!(populated(), 2 * CHUNK, "the first chunk and the next");
        unsafe { arena.alloc(layout(CHUNK, 8)) };
        assert_eq!(populated(), 2 * CHUNK, "still inside: nothing to do");
        unsafe { arena.alloc(layout(CHUNK, 8)) };
        assert_eq!(populated(), 3 * CHUNK, "never past the end");
    }

    #[test]
    fn blocks_are_aligned_disjoint_and_keep_their_bytes() {
        let arena: Box<Arena<CHUNK>> = Box::default();
        let mut blocks = Vec::new();
        for (i, (size, align)) in [(1, 1), (3, 8), (24, 16), (7, 64), (100, 4)]
            .into_iter()
            .enumerate()
        {
            let l = layout(size, align);
            let p = unsafe { arena.alloc(l) };
            assert_eq!(p as usize % align, 0);
            assert!(
                arena.offset(p).is_some(),
                "small blocks come from the arena"
            );
            unsafe { p.write_bytes(i as u8 + 1, size) };
            blocks.push((p, l, i as u8 + 1));
        }
        for &(p, l, fill) in &blocks {
            let bytes = unsafe { std::slice::from_raw_parts(p, l.size()) };
            assert!(
                bytes.iter().all(|&b| b == fill),
                "a later block overwrote an earlier one"
            );
        }
    }

    #[test]
    fn only_the_most_recent_block_is_given_back() {
        let arena: Box<Arena<CHUNK>> = Box::default();
        let a = unsafe { arena.alloc(layout(100, 8)) };
        let b = unsafe { arena.alloc(layout(100, 8)) };
        let after_b = arena.used();
        unsafe { arena.dealloc(a, layout(100, 8)) };
        assert_eq!(
            arena.used(),
            after_b,
            "a block that is not the last stays used"
        );
        unsafe { arena.dealloc(b, layout(100, 8)) };
        assert_eq!(arena.used(), after_b - 100);
        let c = unsafe { arena.alloc(layout(100, 8)) };
        assert_eq!(c, b, "the freed space is handed out again");
    }

    #[test]
    fn the_last_block_grows_in_place_and_others_move_with_their_bytes() {
        let arena: Box<Arena<CHUNK>> = Box::default();
        let a = unsafe { arena.alloc(layout(16, 8)) };
        unsafe { a.write_bytes(7, 16) };
        let a2 = unsafe { arena.realloc(a, layout(16, 8), 64) };
        assert_eq!(a2, a, "the most recent block grows where it is");
        let b = unsafe { arena.alloc(layout(8, 8)) };
        let a3 = unsafe { arena.realloc(a2, layout(64, 8), 128) };
        assert_ne!(a3, a2, "a block with another after it must move");
        assert!(a3 as usize > b as usize);
        let bytes = unsafe { std::slice::from_raw_parts(a3, 16) };
        assert!(bytes.iter().all(|&x| x == 7), "realloc keeps the bytes");
    }

    #[test]
    fn a_block_that_is_not_the_last_shrinks_where_it_is() {
        let arena: Box<Arena<CHUNK>> = Box::default();
        let a = unsafe { arena.alloc(layout(64, 8)) };
        let _b = unsafe { arena.alloc(layout(8, 8)) };
        let used = arena.used();
        assert_eq!(unsafe { arena.realloc(a, layout(64, 8), 16) }, a);
        assert_eq!(arena.used(), used);
    }

    #[test]
    fn what_does_not_fit_goes_to_the_system_allocator_and_back() {
        let arena: Box<Arena<CHUNK>> = Box::default();
        let big = unsafe { arena.alloc(layout(CHUNK + 10, 8)) };
        assert!(!big.is_null());
        assert!(arena.offset(big).is_none(), "too big for the arena");
        assert_eq!(arena.used(), 0);
        let grown = unsafe { arena.realloc(big, layout(CHUNK + 10, 8), 2 * CHUNK) };
        assert!(arena.offset(grown).is_none());
        unsafe { arena.dealloc(grown, layout(2 * CHUNK, 8)) };
        // An arena block that outgrows the arena moves out of it, bytes and all.
        let small = unsafe { arena.alloc(layout(CHUNK - 100, 8)) };
        unsafe { small.write_bytes(9, CHUNK - 100) };
        let moved = unsafe { arena.realloc(small, layout(CHUNK - 100, 8), CHUNK + 100) };
        assert!(arena.offset(moved).is_none());
        assert!(unsafe { std::slice::from_raw_parts(moved, CHUNK - 100) }
            .iter()
            .all(|&x| x == 9));
        assert_eq!(
            arena.used(),
            0,
            "the moved block was the last: its space is back"
        );
        unsafe { arena.dealloc(moved, layout(CHUNK + 100, 8)) };
    }
}
