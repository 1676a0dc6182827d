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
use core::cell::UnsafeCell;
use core::ptr::null_mut;

use crate::sys::{self, SpinLock};

const CLASSES: usize = 12; // 16 B .. 32 KiB
const LARGEST_CLASS: usize = 16 << (CLASSES - 1);
const SLAB_BYTES: usize = 256 * 1024;
const PAGE: usize = 4096;

struct FreeLists {
    heads: [*mut u8; CLASSES],
}

struct Lists(UnsafeCell<FreeLists>);
// SAFETY: only touched under LOCK (or by the single thread of a fork child).
unsafe impl Sync for Lists {}

static LOCK: SpinLock = SpinLock::new();
static LISTS: Lists = Lists(UnsafeCell::new(FreeLists { heads: [null_mut(); CLASSES] }));

fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size().max(layout.align()).max(16);
    (size <= LARGEST_CLASS).then(|| size.next_power_of_two().trailing_zeros() as usize - 4)
}

fn large_len(layout: Layout) -> usize {
    layout.size().next_multiple_of(PAGE)
}

pub struct OwnMemory;

unsafe impl GlobalAlloc for OwnMemory {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > PAGE {
            return null_mut();
        }
        let Some(class) = class_of(layout) else { return sys::mmap_anonymous(large_len(layout)) };
        let _guard = LOCK.lock();
        let lists = unsafe { &mut *LISTS.0.get() };
        if lists.heads[class].is_null() {
            // Blocks of one class are carved at multiples of their size from
            // page-aligned slabs, so each is aligned to its size.
            let slab = sys::mmap_anonymous(SLAB_BYTES);
            if slab.is_null() {
                return null_mut();
            }
            let block = 16 << class;
            for offset in (0..SLAB_BYTES).step_by(block).rev() {
                let p = unsafe { slab.add(offset) };
                unsafe { (p as *mut *mut u8).write(lists.heads[class]) };
                lists.heads[class] = p;
            }
        }
        let p = lists.heads[class];
        lists.heads[class] = unsafe { (p as *mut *mut u8).read() };
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(class) = class_of(layout) else { return sys::munmap(ptr, large_len(layout)) };
        let _guard = LOCK.lock();
        let lists = unsafe { &mut *LISTS.0.get() };
        unsafe { (ptr as *mut *mut u8).write(lists.heads[class]) };
        lists.heads[class] = ptr;
    }
}

/// In a fork child: a thread that held the lock at fork time is gone.
pub fn reset_after_fork() {
    LOCK.reset();
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
        let a = unsafe { OwnMemory.alloc(layout) };
        let b = unsafe { OwnMemory.alloc(layout) };
        assert!(!a.is_null() && !b.is_null() && a != b);
        assert_eq!(a as usize % 64, 0);
        unsafe { OwnMemory.dealloc(a, layout) };
        assert_eq!(unsafe { OwnMemory.alloc(layout) }, a);
        let big = Layout::from_size_align(100_000, 8).unwrap();
        let p = unsafe { OwnMemory.alloc(big) };
        unsafe { p.write_bytes(7, 100_000) };
        unsafe { OwnMemory.dealloc(p, big) };
    }
}
