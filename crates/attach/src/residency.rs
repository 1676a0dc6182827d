//! A snapshot of another process's memory, as the agent takes of its own:
//! RSS, every mapping's smaps figures, and which pages of each private
//! anonymous mapping are resident (the present bit of /proc/PID/pagemap,
//! readable without privilege for a process of the same user). Used for
//! programs the agent cannot enter (Go) and for processes memgap attaches to.

use std::fs::File;
use std::os::unix::fs::FileExt;

use memgap_trace::records::{Residency, Rss, Snapshot, SnapshotReason};

use crate::error::AttachError;
use crate::procfs;

/// pagemap entry bit 63: the page is present in RAM.
const PRESENT: u64 = 1 << 63;
/// Bit 56: mapped by this process only. A private anonymous page that is
/// present but not exclusive is the shared zero page (memory read before it
/// was ever written), which RSS does not count — or a page shared with a
/// forked child, which is rare for the programs this reads.
const EXCLUSIVE: u64 = 1 << 56;

/// The clock of traces written outside the agent, as inside it.
pub use memgap_trace::clock::monotonic_ns;

/// VmRSS and its parts, timed now.
pub fn rss(pid: u32) -> Result<Rss, AttachError> {
    let time = monotonic_ns();
    Ok(Rss { time, ..procfs::status(pid)?.rss })
}

/// Everything a SNAPSHOT record holds, read from /proc/PID.
pub fn snapshot(pid: u32, reason: SnapshotReason) -> Result<Snapshot, AttachError> {
    let started = monotonic_ns();
    let before = procfs::status(pid)?.rss;
    let mut mappings = procfs::mappings(pid)?;
    // SAFETY: no precondition.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let pagemap = File::open(format!("/proc/{pid}/pagemap")).ok();
    let mut entries: Vec<u8> = Vec::new();
    for mapping in mappings.iter_mut().filter(|m| m.is_private_writable_anonymous()) {
        mapping.residency = match &pagemap {
            Some(file) if mapping.rss > 0 => {
                let pages = ((mapping.end - mapping.start) / page_size) as usize;
                entries.resize(pages * 8, 0);
                match file.read_exact_at(&mut entries, mapping.start / page_size * 8) {
                    Ok(()) => {
                        let mut bits = vec![0u8; pages.div_ceil(8)];
                        for (i, entry) in entries.chunks_exact(8).enumerate() {
                            if u64::from_le_bytes(entry.try_into().unwrap()) & (PRESENT | EXCLUSIVE) == PRESENT | EXCLUSIVE {
                                bits[i / 8] |= 1 << (i % 8);
                            }
                        }
                        Residency::Bitmap(bits)
                    }
                    // The mapping went away while we read: its smaps Rss stands.
                    Err(_) => Residency::Unknown,
                }
            }
            Some(_) => Residency::None,
            None => Residency::Unknown,
        };
    }
    let after = procfs::status(pid)?.rss;
    let time = monotonic_ns();
    Ok(Snapshot {
        time,
        reason,
        rss: Rss { time: started, ..before },
        vm_rss_after: after.vm_rss,
        page_size,
        mappings,
        agent_ranges: Vec::new(),
        cost_ns: time - started,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_touched_pages_are_resident() {
        let len = 64 * 4096;
        // SAFETY: a new private anonymous mapping the kernel places: it replaces nothing.
        let area = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        } as *mut u8;
        assert!(!area.is_null());
        for page in (0..64).step_by(2) {
            // SAFETY: inside the 64 pages just mapped, writable.
            unsafe { *area.add(page * 4096) = 1 };
        }
        // Pages only read map the shared zero page: not resident in RSS terms.
        // SAFETY: inside the mapping, readable.
        let read: u8 = (1..64).step_by(2).map(|page| unsafe { std::ptr::read_volatile(area.add(page * 4096)) }).sum();
        assert_eq!(read, 0);
        let start = area as u64;
        let pattern = || {
            let snapshot = snapshot(std::process::id(), SnapshotReason::Requested).unwrap();
            assert!(snapshot.vm_rss_after > 0 && snapshot.rss.vm_rss > 0);
            let mapping = snapshot.mappings.iter().find(|m| m.start <= start && start < m.end).expect("our mapping").clone();
            let first = ((start - mapping.start) / 4096) as usize;
            (0..64).map(|page| mapping.residency.is_resident(first + page)).collect::<Vec<bool>>()
        };
        let expected: Vec<bool> = (0..64).map(|page| page % 2 == 0).collect();
        // Another test forking meanwhile shares our pages with its child
        // until the child execs: look again then.
        let mut seen = pattern();
        for _ in 0..50 {
            if seen == expected {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            seen = pattern();
        }
        assert_eq!(seen, expected);
        // SAFETY: the test's own mapping, unused from here on.
        unsafe { libc::munmap(area.cast(), len) };
    }
}
