//! Snapshots: which pages of the process are resident, mapping by mapping.
//!
//! Taken by the writer thread (never by a program thread, except when the
//! program asks with `memgap_snapshot()`): one read of /proc/self/smaps for
//! every mapping's figures, then mincore(2) over each private writable
//! anonymous mapping for its page-by-page residency. Replay lays the live
//! heap at the same instant over it.

use alloc::vec::Vec;

use memgap_trace::records::{Residency, Rss, Snapshot, SnapshotReason};
use memgap_trace::smaps::parse_smaps;

use crate::{clock, sys};

/// Pages examined per mincore call (256 MiB of address space).
const MINCORE_PAGES: usize = 65536;

pub struct Snapshotter {
    smaps: Vec<u8>,
    residency: Vec<u8>,
}

impl Snapshotter {
    pub fn new() -> Self {
        // Room for a few thousand mappings up front: growing the buffer while
        // smaps is read would unmap memory the text just described.
        Snapshotter { smaps: Vec::with_capacity(1 << 20), residency: Vec::new() }
    }

    /// `rss` was read just before; `read_rss_after` reads VmRSS again at the end.
    pub fn take(&mut self, reason: SnapshotReason, rss: Rss, read_rss_after: impl FnOnce() -> u64) -> Snapshot {
        let started_ns = clock::monotonic_ns();
        // Events from here on are later than the snapshot; those stamped
        // before the advance, earlier (program threads advance the clock
        // too, so the time read just before could be two behind).
        let time = clock::advance() - 1;
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        self.read_smaps();
        let mut mappings = parse_smaps(&self.smaps);
        for mapping in &mut mappings {
            if mapping.is_private_writable_anonymous() {
                mapping.residency = self.residency_of(mapping.start, mapping.end, page_size);
            }
        }
        let mut agent_ranges = Vec::new();
        sys::agent_ranges::copy_into(&mut agent_ranges);
        let vm_rss_after = read_rss_after();
        Snapshot { time, reason, rss: Rss { time, ..rss }, vm_rss_after, page_size, mappings, agent_ranges, cost_ns: clock::monotonic_ns() - started_ns }
    }

    fn read_smaps(&mut self) {
        self.smaps.clear();
        let fd = unsafe { libc::open(c"/proc/self/smaps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return;
        }
        loop {
            if self.smaps.capacity() - self.smaps.len() < 65536 {
                self.smaps.reserve(self.smaps.capacity().max(65536));
            }
            let spare = self.smaps.spare_capacity_mut();
            let n = unsafe { libc::read(fd, spare.as_mut_ptr() as *mut libc::c_void, spare.len()) };
            if n <= 0 {
                break;
            }
            unsafe { self.smaps.set_len(self.smaps.len() + n as usize) };
        }
        unsafe { libc::close(fd) };
    }

    fn residency_of(&mut self, start: u64, end: u64, page_size: u64) -> Residency {
        let pages = ((end - start) / page_size) as usize;
        let mut bits = alloc::vec![0u8; pages.div_ceil(8)];
        let mut resident = 0usize;
        self.residency.resize(MINCORE_PAGES.min(pages), 0);
        let mut page = 0usize;
        while page < pages {
            let count = MINCORE_PAGES.min(pages - page);
            let addr = start + page as u64 * page_size;
            mincore_around_holes(addr, page_size, &mut self.residency[..count]);
            for (i, &byte) in self.residency[..count].iter().enumerate() {
                if byte & 1 != 0 {
                    let p = page + i;
                    bits[p / 8] |= 1 << (p % 8);
                    resident += 1;
                }
            }
            page += count;
        }
        match resident {
            0 => Residency::None,
            n if n == pages => Residency::All,
            _ => Residency::Bitmap(bits),
        }
    }
}

/// mincore(2) over `residency.len()` pages from `addr`, where part of the
/// range may have been unmapped since smaps was read (the program's and the
/// agent's own mappings come and go): a failed range is halved until the
/// holes are found, and their pages read as not resident. Asking page by
/// page instead made ~50 000 calls per snapshot of a program that maps and
/// unmaps megabyte blocks, each taking the mmap lock its munmaps wait for.
fn mincore_around_holes(addr: u64, page_size: u64, residency: &mut [u8]) {
    if residency.is_empty() {
        return;
    }
    let ok = unsafe { libc::mincore(addr as *mut libc::c_void, residency.len() * page_size as usize, residency.as_mut_ptr()) } == 0;
    if ok {
        return;
    }
    if residency.len() == 1 {
        residency[0] = 0;
        return;
    }
    let half = residency.len() / 2;
    let (low, high) = residency.split_at_mut(half);
    mincore_around_holes(addr, page_size, low);
    mincore_around_holes(addr + half as u64 * page_size, page_size, high);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_of_own_memory() {
        let page = 4096u64;
        let len = 64 * page as usize;
        let mem = unsafe { libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) } as *mut u8;
        for i in (0..64).step_by(4) {
            unsafe { *mem.add(i * page as usize) = 1 };
        }
        let mut snapshotter = Snapshotter::new();
        let residency = snapshotter.residency_of(mem as u64, mem as u64 + len as u64, page);
        for i in 0..64 {
            assert_eq!(residency.is_resident(i), i % 4 == 0, "page {i}");
        }
        unsafe { libc::munmap(mem as *mut libc::c_void, len) };
    }

    #[test]
    fn pages_unmapped_since_smaps_read_as_not_resident_and_the_rest_still_count() {
        let page = 4096usize;
        let pages = 1000;
        let mem = unsafe { libc::mmap(core::ptr::null_mut(), pages * page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) } as *mut u8;
        for i in 0..pages {
            unsafe { *mem.add(i * page) = 1 };
        }
        // Two holes, one of them a single page.
        unsafe { libc::munmap(mem.add(100 * page) as *mut libc::c_void, 37 * page) };
        unsafe { libc::munmap(mem.add(700 * page) as *mut libc::c_void, page) };
        let mut snapshotter = Snapshotter::new();
        // Tests run on threads of one process, whose allocator maps and
        // unmaps memory: another test may map something into a hole while
        // it is measured (and unmap it again). Only a hole page unmapped
        // now is asked about, and a measurement that a mapping came and
        // went during is taken again.
        let mut byte = 0u8;
        let mut unmapped = |i: usize| unsafe { libc::mincore(mem.add(i * page) as *mut libc::c_void, page, &mut byte) } != 0;
        let mut wrong = Vec::new();
        for _ in 0..5 {
            let residency = snapshotter.residency_of(mem as u64, (mem as usize + pages * page) as u64, page as u64);
            for i in (0..pages).filter(|i| !(100..137).contains(i) && *i != 700) {
                assert!(residency.is_resident(i), "page {i}");
            }
            match (100..137).chain([700]).find(|&i| unmapped(i) && residency.is_resident(i)) {
                Some(i) => wrong.push(i),
                None => break,
            }
        }
        assert!(wrong.len() < 5, "unmapped pages read as resident in every measurement: {wrong:?}");
        // Only our pieces: another test's memory may sit in the holes now.
        for (first, end) in [(0, 100), (137, 700), (701, pages)] {
            unsafe { libc::munmap(mem.add(first * page) as *mut libc::c_void, (end - first) * page) };
        }
    }
}
