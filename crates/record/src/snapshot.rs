//! Snapshots: which pages of the process are resident, mapping by mapping.
//!
//! Taken by the writer thread (never by a program thread, except when the
//! program asks with `memgap_snapshot()`): one read of /proc/self/smaps for
//! every mapping's figures, then mincore(2) over each private writable
//! anonymous mapping for its page-by-page residency. Replay lays the live
//! heap at the same instant over it.

use alloc::vec::Vec;

use memgap_trace::records::{Mapping, Residency, Rss, Snapshot, SnapshotReason};

use crate::{clock, sys};

/// Pages examined per mincore call (256 MiB of address space).
const MINCORE_PAGES: usize = 65536;

pub struct Snapshotter {
    smaps: Vec<u8>,
    residency: Vec<u8>,
}

impl Snapshotter {
    pub fn new() -> Self {
        Snapshotter { smaps: Vec::new(), residency: Vec::new() }
    }

    /// `rss` was read just before; `read_rss_after` reads VmRSS again at the end.
    pub fn take(&mut self, reason: SnapshotReason, rss: Rss, read_rss_after: impl FnOnce() -> u64) -> Snapshot {
        let started_ns = clock::monotonic_ns();
        let time = clock::now();
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
            let ok = unsafe { libc::mincore(addr as *mut libc::c_void, count * page_size as usize, self.residency.as_mut_ptr()) } == 0;
            if !ok {
                // The mapping changed under us (unmapped meanwhile): count
                // what was seen so far, the rest as not resident.
                break;
            }
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

/// Parses /proc/self/smaps: a header line per mapping
/// (`start-end perms offset dev inode [name]`) followed by `Key: N kB` lines.
pub fn parse_smaps(text: &[u8]) -> Vec<Mapping> {
    let mut mappings: Vec<Mapping> = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let first = line.split(|&b| b == b' ').next().unwrap_or(&[]);
        if let Some(dash) = first.iter().position(|&b| b == b'-') {
            if let (Some(start), Some(end)) = (hex(&first[..dash]), hex(&first[dash + 1..])) {
                let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
                fields.next();
                let perms = fields.next().unwrap_or(&[]);
                let offset = fields.next().and_then(hex).unwrap_or(0);
                fields.next(); // device
                let inode = fields.next().and_then(decimal).unwrap_or(0);
                let name: Vec<u8> = fields.collect::<Vec<_>>().join(&b' ');
                mappings.push(Mapping {
                    start,
                    end,
                    perms: alloc::string::String::from_utf8_lossy(perms).into_owned(),
                    offset,
                    inode,
                    name: alloc::string::String::from_utf8_lossy(&name).into_owned(),
                    ..Mapping::default()
                });
                continue;
            }
        }
        let Some(mapping) = mappings.last_mut() else { continue };
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let kib = || line[colon + 1..].split(|&b| b == b' ').find(|f| !f.is_empty()).and_then(decimal).unwrap_or(0) * 1024;
        match &line[..colon] {
            b"Rss" => mapping.rss = kib(),
            b"Anonymous" => mapping.anonymous = kib(),
            b"LazyFree" => mapping.lazy_free = kib(),
            b"Swap" => mapping.swap = kib(),
            _ => {}
        }
    }
    mappings
}

fn hex(text: &[u8]) -> Option<u64> {
    u64::from_str_radix(core::str::from_utf8(text).ok()?, 16).ok()
}

fn decimal(text: &[u8]) -> Option<u64> {
    core::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_smaps() {
        let text = b"55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
Size:                132 kB\nRss:                   8 kB\nAnonymous:             8 kB\nLazyFree:              4 kB\nSwap:                  0 kB\n\
7f1c8a000000-7f1c8a021000 r-xp 00002000 fe:01 1234                       /usr/lib/x86_64-linux-gnu/libc.so.6\n\
Rss:                 100 kB\nVmFlags: rd ex mr mw me\n\
7f1c8b000000-7f1c8b001000 rw-p 00000000 00:00 0 \nRss: 4 kB\n";
        let maps = parse_smaps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!((maps[0].start, maps[0].end, maps[0].name.as_str()), (0x55d0c0a00000, 0x55d0c0a21000, "[heap]"));
        assert_eq!((maps[0].rss, maps[0].anonymous, maps[0].lazy_free), (8192, 8192, 4096));
        assert_eq!((maps[1].inode, maps[1].offset, maps[1].rss), (1234, 0x2000, 102400));
        assert_eq!(maps[1].name, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(maps[0].is_private_writable_anonymous() && !maps[1].is_private_writable_anonymous());
        assert!(maps[2].is_private_writable_anonymous() && maps[2].name.is_empty());
    }

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
}
