//! NUMA placement at snapshots: the node of every resident page of the
//! traced process's heap (private writable anonymous) mappings.
//!
//! Asked with move_pages(2) on the process's pid with `nodes = NULL`, which moves
//! nothing and reports each page's node (or -ENOENT for a page not present),
//! in batches through a raw syscall. Not get_mempolicy: that faults in the
//! zero page of an untouched address. Only the pages mincore found resident
//! are asked; past `MAX_QUERIED_PAGES` one page in k is asked and stands for
//! the k pages from it, so a snapshot's cost stays bounded on huge heaps.

use memgap_trace::numa::{MappingPlacement, NOT_PRESENT, Placement};
use memgap_trace::records::{Residency, Snapshot};

use memgap_attach::residency::monotonic_ns;

/// Pages asked per move_pages call.
const BATCH: usize = 1024;
/// Pages walked per window (the buffers below hold one window).
const WINDOW: usize = 65536;
/// Pages asked per snapshot at most: 1 GiB of 4 KiB pages.
const MAX_QUERIED_PAGES: u64 = 262_144;

pub struct Placer {
    pid: u32,
    /// Page addresses, laid out as the `void *` array move_pages reads.
    addresses: Vec<usize>,
    status: Vec<i32>,
    /// The errno that made move_pages unusable, once seen (ENOSYS, EPERM…).
    unusable: i32,
}

impl Placer {
    pub fn new(pid: u32) -> Self {
        Placer { pid, addresses: Vec::new(), status: Vec::new(), unusable: 0 }
    }

    pub fn place(&mut self, snapshot: &Snapshot) -> Placement {
        let started_ns = monotonic_ns();
        let page_size = snapshot.page_size.max(1);
        let heap = || snapshot.mappings.iter().filter(|m| m.is_private_writable_anonymous() && !matches!(m.residency, Residency::Unknown));
        let resident: u64 = heap().map(|m| resident_pages(&m.residency, (m.end - m.start) / page_size)).sum();
        let stride = resident.div_ceil(MAX_QUERIED_PAGES).max(1);
        let mut mappings = Vec::new();
        if self.unusable == 0 {
            for m in heap() {
                let pages = (m.end - m.start) / page_size;
                let runs = self.runs_of(m.start, pages, page_size, &m.residency, stride);
                if self.unusable != 0 {
                    mappings.clear();
                    break;
                }
                mappings.push(MappingPlacement { start: m.start, pages, runs });
            }
        }
        Placement {
            time: snapshot.time,
            page_size,
            stride: stride as u32,
            error: self.unusable,
            cost_ns: monotonic_ns() - started_ns,
            mappings,
        }
    }

    fn runs_of(&mut self, start: u64, pages: u64, page_size: u64, residency: &Residency, stride: u64) -> Vec<(i32, u64)> {
        let mut runs: Vec<(i32, u64)> = Vec::new();
        let mut push = |status: i32, count: u64| match runs.last_mut() {
            Some(last) if last.0 == status => last.1 += count,
            _ => runs.push((status, count)),
        };
        if matches!(residency, Residency::None) {
            push(NOT_PRESENT, pages);
            return runs;
        }
        // Resident pages seen so far in this mapping: every stride-th is asked.
        let mut seen = 0u64;
        let mut standing = NOT_PRESENT;
        let mut window_start = 0u64;
        while window_start < pages {
            let window = (pages - window_start).min(WINDOW as u64);
            // Pass 1: ask the node of the window's sampled resident pages.
            self.addresses.clear();
            let mut counter = seen;
            for i in window_start..window_start + window {
                if residency.is_resident(i as usize) {
                    if counter.is_multiple_of(stride) {
                        self.addresses.push((start + i * page_size) as usize);
                    }
                    counter += 1;
                }
            }
            self.ask();
            if self.unusable != 0 {
                return Vec::new();
            }
            // Pass 2: one status per page, in runs.
            let mut answer = 0;
            for i in window_start..window_start + window {
                if !residency.is_resident(i as usize) {
                    push(NOT_PRESENT, 1);
                    continue;
                }
                if seen.is_multiple_of(stride) {
                    standing = self.status[answer];
                    answer += 1;
                }
                seen += 1;
                push(standing, 1);
            }
            window_start += window;
        }
        runs
    }

    /// move_pages(0, n, addresses, NULL, status, 0) in batches.
    fn ask(&mut self) {
        self.status.clear();
        self.status.resize(self.addresses.len(), NOT_PRESENT);
        for (addresses, status) in self.addresses.chunks(BATCH).zip(self.status.chunks_mut(BATCH)) {
            // SAFETY: `addresses` and `status` are batches of the same length; with no
            // nodes, move_pages only reports where pages are.
            let result = unsafe {
                libc::syscall(
                    libc::SYS_move_pages,
                    self.pid as libc::pid_t,
                    addresses.len(),
                    addresses.as_ptr(),
                    core::ptr::null::<i32>(),
                    status.as_mut_ptr(),
                    0,
                )
            };
            if result < 0 {
                // SAFETY: the calling thread's errno.
                let errno = unsafe { *libc::__errno_location() };
                // Unusable for this process (no NUMA in the kernel, not
                // permitted): say so in the record and stop asking.
                self.unusable = errno.max(1);
                return;
            }
        }
    }
}

fn resident_pages(residency: &Residency, pages: u64) -> u64 {
    match residency {
        Residency::All => pages,
        Residency::Bitmap(bits) => bits.iter().map(|b| b.count_ones() as u64).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::records::Mapping;

    fn mapped(pages: usize, touch: impl Fn(usize) -> bool) -> (*mut u8, Residency) {
        let len = pages * 4096;
        // SAFETY: a new private anonymous mapping the kernel places: it replaces nothing.
        let mem = unsafe {
            libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        } as *mut u8;
        let mut bits = vec![0u8; pages.div_ceil(8)];
        for i in (0..pages).filter(|&i| touch(i)) {
            // SAFETY: inside the mapping just made, writable.
            unsafe { *mem.add(i * 4096) = 1 };
            bits[i / 8] |= 1 << (i % 8);
        }
        (mem, Residency::Bitmap(bits))
    }

    #[test]
    fn resident_pages_get_a_node_and_the_rest_not_present() {
        let (mem, residency) = mapped(64, |i| i % 4 == 0);
        let snapshot = Snapshot {
            page_size: 4096,
            mappings: vec![Mapping {
                start: mem as u64,
                end: mem as u64 + 64 * 4096,
                perms: "rw-p".into(),
                residency,
                ..Mapping::default()
            }],
            ..Snapshot::default()
        };
        let placement = Placer::new(std::process::id()).place(&snapshot);
        if placement.error == libc::ENOSYS {
            return; // a kernel built without NUMA
        }
        assert_eq!((placement.error, placement.stride, placement.mappings.len()), (0, 1, 1));
        let total: u64 = placement.mappings[0].runs.iter().map(|r| r.1).sum();
        assert_eq!(total, 64);
        let index = placement.index();
        for i in 0..64u64 {
            let status = index.status_of(mem as u64 + i * 4096).unwrap();
            assert_eq!(status >= 0, i % 4 == 0, "page {i}: {status}");
        }
        // SAFETY: the test's own mapping, unused from here on.
        unsafe { libc::munmap(mem as *mut libc::c_void, 64 * 4096) };
    }

    #[test]
    fn a_stride_stands_for_the_pages_after_it() {
        let (mem, residency) = mapped(10, |_| true);
        let mut placer = Placer::new(std::process::id());
        let runs = placer.runs_of(mem as u64, 10, 4096, &residency, 3);
        if placer.unusable != 0 {
            return;
        }
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 10);
        assert!(runs.iter().all(|r| r.0 >= 0), "{runs:?}");
        assert_eq!(placer.addresses.len(), 4); // pages 0, 3, 6, 9
        // SAFETY: the test's own mapping, unused from here on.
        unsafe { libc::munmap(mem as *mut libc::c_void, 10 * 4096) };
    }
}
