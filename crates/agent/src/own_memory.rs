//! The agent's own heap: size-classed free lists on anonymous mappings.
//!
//! The agent must never allocate from the program's allocator: that would
//! show up as program events, and an allocator that calls `sbrk` or `mmap`
//! while holding its own lock (tcmalloc does, at start-up) would deadlock
//! when our hook for that call allocates. glibc's `__libc_malloc` is no way
//! out either, since tcmalloc exports that name too. So the agent's few
//! allocations (thread states, the writer's buffers) come from here, in
//! mappings named "memgap" so the ledger can tell them apart.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::null_mut;

use crate::sys::{self, SpinLock};

const CLASSES: usize = 12; // 16 B .. 32 KiB
const LARGEST_CLASS: usize = 16 << (CLASSES - 1);
const SLAB_BYTES: usize = 256 * 1024;
const PAGE: usize = 4096;

struct FreeLists {
    heads: [*mut u8; CLASSES],
    /// Per class, the part of its newest slab not handed out yet: blocks are
    /// cut from it one at a time, so a slab's pages become resident only as
    /// the agent uses them (threading the whole slab onto the free list up
    /// front touched every page: 256 KiB resident per class in use).
    fresh: [(*mut u8, usize); CLASSES],
}

// SAFETY: the lists own the blocks and slabs their pointers lead to (each
// block is on a list or handed out, never both), memory of the agent's own
// mappings that no thread owns: moving the lists moves nothing thread-bound.
unsafe impl Send for FreeLists {}

static LISTS: SpinLock<FreeLists> = SpinLock::new(FreeLists { heads: [null_mut(); CLASSES], fresh: [(null_mut(), 0); CLASSES] });

fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size().max(layout.align()).max(16);
    (size <= LARGEST_CLASS).then(|| size.next_power_of_two().trailing_zeros() as usize - 4)
}

fn large_len(layout: Layout) -> usize {
    layout.size().next_multiple_of(PAGE)
}

impl FreeLists {
    /// A block of `class`: a freed one, else the next one of the class's
    /// newest slab; null when both are used up.
    fn take(&mut self, class: usize) -> *mut u8 {
        let block = 16 << class;
        let p = self.heads[class];
        if !p.is_null() {
            // SAFETY: a freed block on the list holds the next one's address in its
            // first word (written by `dealloc`), and blocks are at least 16 bytes.
            self.heads[class] = unsafe { (p as *mut *mut u8).read() };
            return p;
        }
        // Blocks of one class are cut at multiples of their size from
        // page-aligned slabs, so each is aligned to its size.
        let (next, left) = &mut self.fresh[class];
        if *left < block {
            return null_mut();
        }
        let p = *next;
        *next = p.wrapping_add(block);
        *left -= block;
        p
    }

    /// Makes `slab` the class's newest, unless another thread gave it one
    /// meanwhile: then false, and the caller keeps `slab`.
    ///
    /// # Safety
    /// `slab` is `SLAB_BYTES` of page-aligned writable memory that nothing
    /// else uses, for as long as the lists live.
    unsafe fn add_slab(&mut self, class: usize, slab: *mut u8) -> bool {
        let (next, left) = &mut self.fresh[class];
        if *left >= 16 << class {
            return false;
        }
        (*next, *left) = (slab, SLAB_BYTES);
        true
    }
}

pub struct OwnMemory;

// SAFETY: blocks come from the agent's own mappings, each handed out once
// until freed, sized and aligned for the layout's class (a power of two at
// least the size and the alignment, cut at multiples of itself from
// page-aligned slabs); larger layouts get whole mappings of their own, and
// alignments above a page get null.
unsafe impl GlobalAlloc for OwnMemory {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > PAGE {
            return null_mut();
        }
        let Some(class) = class_of(layout) else { return sys::mmap_anonymous(large_len(layout)) };
        loop {
            let block = LISTS.lock().take(class);
            if !block.is_null() {
                return block;
            }
            // A new slab is mapped outside the lock: mmap waits on the
            // kernel's lock of the address space, which a program starting
            // hundreds of threads (a stack mapping each) keeps busy, and
            // every other thread of the agent would wait behind it.
            let slab = sys::mmap_anonymous(SLAB_BYTES);
            if slab.is_null() {
                return null_mut();
            }
            // SAFETY: a fresh mapping of SLAB_BYTES, page-aligned, used by nothing yet.
            if !unsafe { LISTS.lock().add_slab(class, slab) } {
                sys::munmap(slab, SLAB_BYTES);
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(class) = class_of(layout) else { return sys::munmap(ptr, large_len(layout)) };
        let mut lists = LISTS.lock();
        // SAFETY: `ptr` is a block of this class that `alloc` handed out (the
        // caller's contract), at least 16 bytes, now ours again.
        unsafe { (ptr as *mut *mut u8).write(lists.heads[class]) };
        lists.heads[class] = ptr;
    }
}

/// In a fork child: a thread that held the lock at fork time is gone.
///
/// # Safety
/// Only in a fork child, as [`SpinLock::unlock_after_fork`] says.
pub unsafe fn unlock_after_fork() {
    // SAFETY: the caller's promise.
    unsafe { LISTS.unlock_after_fork() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_sizes_and_alignments() {
        assert_eq!(class_of(Layout::from_size_align(1, 1).unwrap()), Some(0));
        assert_eq!(class_of(Layout::from_size_align(17, 8).unwrap()), Some(1));
        assert_eq!(class_of(Layout::from_size_align(8, 64).unwrap()), Some(2));
        assert_eq!(class_of(Layout::from_size_align(32 * 1024, 8).unwrap()), Some(11));
        assert_eq!(class_of(Layout::from_size_align(32 * 1024 + 1, 8).unwrap()), None);
    }

    #[test]
    fn blocks_are_distinct_aligned_and_reused() {
        let layout = Layout::from_size_align(48, 16).unwrap();
        // SAFETY: a non-zero layout.
        let a = unsafe { OwnMemory.alloc(layout) };
        // SAFETY: as above.
        let b = unsafe { OwnMemory.alloc(layout) };
        assert!(!a.is_null() && !b.is_null() && a != b);
        assert_eq!(a as usize % 64, 0);
        // SAFETY: `a` came from `alloc` with this layout.
        unsafe { OwnMemory.dealloc(a, layout) };
        // SAFETY: a non-zero layout.
        assert_eq!(unsafe { OwnMemory.alloc(layout) }, a);
        let big = Layout::from_size_align(100_000, 8).unwrap();
        // SAFETY: a non-zero layout.
        let p = unsafe { OwnMemory.alloc(big) };
        // SAFETY: `p` is a fresh block of 100,000 bytes (null would have failed the test).
        unsafe { p.write_bytes(7, 100_000) };
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { OwnMemory.dealloc(p, big) };
    }

    #[test]
    fn a_slab_is_touched_only_where_blocks_are_handed_out() {
        // Slabs from a painted buffer: a page of the slab that nothing
        // wrote to would never become resident.
        const PAINT: u8 = 0x5a;
        let mut memory = vec![PAINT; 2 * SLAB_BYTES + PAGE];
        let base = memory.as_mut_ptr().wrapping_add(memory.as_ptr().align_offset(PAGE));
        let second = base.wrapping_add(SLAB_BYTES);
        let mut lists = FreeLists { heads: [null_mut(); CLASSES], fresh: [(null_mut(), 0); CLASSES] };
        let class = 9; // 8 KiB blocks, 32 to a slab
        assert!(lists.take(class).is_null(), "no slab yet");
        // SAFETY: the painted buffer's first page-aligned SLAB_BYTES part, which outlives `lists`.
        assert!(unsafe { lists.add_slab(class, base) });
        // SAFETY: its second part, likewise (and refused: the first has room).
        assert!(!unsafe { lists.add_slab(class, second) }, "a slab with room left is kept");
        let blocks: Vec<*mut u8> = (0..3).map(|_| lists.take(class)).collect();
        assert_eq!(blocks, [base, base.wrapping_add(8192), base.wrapping_add(16384)]);
        // SAFETY: the first three 8 KiB blocks of the first slab, inside `memory`.
        let untouched = unsafe { core::slice::from_raw_parts(base.wrapping_add(3 * 8192), SLAB_BYTES - 3 * 8192) };
        assert!(untouched.iter().all(|&b| b == PAINT), "the rest of the slab is not written");
        // A freed block is handed out again first; a used-up slab takes the next.
        // SAFETY: a block handed out above, at least 8 bytes, given back.
        unsafe { (blocks[1] as *mut *mut u8).write(lists.heads[class]) };
        lists.heads[class] = blocks[1];
        assert_eq!(lists.take(class), blocks[1]);
        for _ in 3..32 {
            assert!(!lists.take(class).is_null());
        }
        assert!(lists.take(class).is_null(), "the first slab is used up");
        // SAFETY: the painted buffer's second SLAB_BYTES part, unused so far.
        assert!(unsafe { lists.add_slab(class, second) });
        assert_eq!(lists.take(class), second);
    }

    #[test]
    fn threads_racing_for_new_slabs_get_distinct_blocks() {
        let layout = Layout::from_size_align(4096, 8).unwrap();
        let handed: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(move || {
                        // SAFETY: a non-zero layout; the blocks are only compared.
                        (0..200).map(|_| unsafe { OwnMemory.alloc(layout) } as usize).collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = handed.into_iter().flatten().collect();
        assert!(all.iter().all(|&p| p != 0 && p % 4096 == 0));
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "a block was handed out twice");
        for p in all {
            // SAFETY: each came from `alloc` with this layout, once.
            unsafe { OwnMemory.dealloc(p as *mut u8, layout) };
        }
    }
}
