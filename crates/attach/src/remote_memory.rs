//! Reading another process's memory (process_vm_readv), behind a trait so
//! that the heap walk can be tested on memory laid out by the test.

use std::io::IoSliceMut;

use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;

/// Memory of some address space, read whole or not at all.
pub trait Memory {
    /// Fills `buffer` from `address`; false if any byte is unreadable.
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool;

    fn word(&self, address: u64) -> Option<u64> {
        let mut bytes = [0u8; 8];
        self.read(address, &mut bytes).then(|| u64::from_le_bytes(bytes))
    }
}

/// The memory of process `pid` (the ptrace access check applies).
pub struct ProcessMemory {
    pub pid: u32,
    /// Bytes read so far.
    pub read_bytes: std::cell::Cell<u64>,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> ProcessMemory {
        ProcessMemory { pid, read_bytes: std::cell::Cell::new(0) }
    }
}

impl Memory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        if buffer.is_empty() {
            return true;
        }
        let len = buffer.len();
        let remote = [RemoteIoVec { base: address as usize, len }];
        let mut local = [IoSliceMut::new(buffer)];
        let done = process_vm_readv(Pid::from_raw(self.pid as i32), &mut local, &remote).is_ok_and(|n| n == len);
        self.read_bytes.set(self.read_bytes.get() + len as u64);
        done
    }
}

/// Ranges of a process's memory as they were at one instant (copied while
/// its threads were stopped), read afterwards while it runs on.
pub struct CopiedMemory {
    /// The ranges copied, by address, disjoint.
    ranges: Vec<(u64, u64)>,
    /// The pages that were in memory, in runs: (address, bytes, offset in
    /// `bytes`), by address. Pages between runs read as zeros.
    runs: Vec<(u64, u64, usize)>,
    bytes: memmap2::MmapMut,
    /// Bytes read from the process (its pages in memory).
    pub read_bytes: u64,
}

/// Memory for a copy, faulted in before the process is stopped so that the
/// stop pays only for the reading.
pub struct CopyBuffer(memmap2::MmapMut);

impl CopyBuffer {
    /// `bytes` of memory, every page already in place.
    pub fn populated(bytes: u64) -> Option<CopyBuffer> {
        memmap2::MmapOptions::new().len(bytes.max(1) as usize).populate().map_anon().ok().map(CopyBuffer)
    }
}

/// Pagemap bits: the page is in memory, or swapped out.
const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
/// Ranges read by one process_vm_readv (the kernel's IOV_MAX).
const RUNS_PER_READ: usize = 1024;

impl CopiedMemory {
    /// Copies `ranges` of process `pid` into `buffer` (or, when the pages
    /// in memory do not fit, into memory taken now, up to `budget` bytes):
    /// the pages in memory are read; a page that is not reads as zeros, as
    /// the kernel would give it for one never written; one swapped out fails
    /// the copy (reading it would bring it back in). `None` when a range
    /// cannot be read or the copy does not fit.
    pub fn copy(pid: u32, ranges: &[(u64, u64)], page_size: u64, buffer: CopyBuffer, budget: u64) -> Option<CopiedMemory> {
        use std::os::unix::fs::FileExt;
        let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok()?;
        let mut ranges: Vec<(u64, u64)> = ranges.iter().map(|&(s, e)| (s / page_size * page_size, e.next_multiple_of(page_size))).collect();
        ranges.sort_unstable();
        ranges.dedup();
        if ranges.windows(2).any(|pair| pair[1].0 < pair[0].1) {
            return None;
        }
        let mut runs: Vec<(u64, u64, usize)> = Vec::new();
        let mut entries = Vec::new();
        let mut copied = 0usize;
        for &(start, end) in &ranges {
            entries.resize(((end - start) / page_size * 8) as usize, 0);
            pagemap.read_exact_at(&mut entries, start / page_size * 8).ok()?;
            for (page, entry) in entries.chunks_exact(8).enumerate() {
                let entry = u64::from_le_bytes(entry.try_into().unwrap_or([0; 8]));
                if entry & SWAPPED != 0 {
                    return None;
                }
                if entry & PRESENT == 0 {
                    continue;
                }
                let at = start + page as u64 * page_size;
                match runs.last_mut() {
                    Some((run, len, _)) if *run + *len == at => *len += page_size,
                    _ => runs.push((at, page_size, copied)),
                }
                copied += page_size as usize;
            }
        }
        let mut bytes = buffer.0;
        if copied > bytes.len() {
            if copied as u64 > budget {
                return None;
            }
            bytes = memmap2::MmapOptions::new().len(copied).populate().map_anon().ok()?;
        }
        let pid = Pid::from_raw(pid as i32);
        let mut rest: &mut [u8] = &mut bytes[..copied];
        for batch in runs.chunks(RUNS_PER_READ) {
            let remote: Vec<RemoteIoVec> = batch.iter().map(|&(at, len, _)| RemoteIoVec { base: at as usize, len: len as usize }).collect();
            let wanted: usize = remote.iter().map(|r| r.len).sum();
            let (these, after) = std::mem::take(&mut rest).split_at_mut(wanted);
            rest = after;
            let mut local: Vec<IoSliceMut> = Vec::with_capacity(batch.len());
            let mut these = these;
            for remote in &remote {
                let (run, after) = std::mem::take(&mut these).split_at_mut(remote.len);
                local.push(IoSliceMut::new(run));
                these = after;
            }
            if !process_vm_readv(pid, &mut local, &remote).is_ok_and(|n| n == wanted) {
                return None;
            }
        }
        Some(CopiedMemory { ranges, runs, bytes, read_bytes: copied as u64 })
    }
}

impl Memory for CopiedMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        let end = address + buffer.len() as u64;
        let range = self.ranges.partition_point(|&(start, _)| start <= address);
        if range == 0 || end > self.ranges[range - 1].1 {
            return false;
        }
        buffer.fill(0);
        let mut run = self.runs.partition_point(|&(at, len, _)| at + len <= address);
        while let Some(&(at, len, offset)) = self.runs.get(run)
            && at < end
        {
            let (from, to) = (address.max(at), end.min(at + len));
            let source = offset + (from - at) as usize;
            buffer[(from - address) as usize..(to - address) as usize].copy_from_slice(&self.bytes[source..source + (to - from) as usize]);
            run += 1;
        }
        true
    }
}

/// Memory laid out by a test: regions of bytes at addresses.
#[cfg(test)]
#[derive(Default)]
pub struct FakeMemory {
    pub regions: Vec<(u64, Vec<u8>)>,
}

#[cfg(test)]
impl FakeMemory {
    pub fn put_word(&mut self, address: u64, value: u64) {
        let (start, bytes) = self.regions.iter_mut().find(|(s, b)| *s <= address && address + 8 <= *s + b.len() as u64).expect("mapped");
        let at = (address - *start) as usize;
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
}

#[cfg(test)]
impl Memory for FakeMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        let end = address + buffer.len() as u64;
        match self.regions.iter().find(|(s, b)| *s <= address && end <= *s + b.len() as u64) {
            Some((start, bytes)) => {
                let at = (address - start) as usize;
                buffer.copy_from_slice(&bytes[at..at + buffer.len()]);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_holds_the_pages_as_they_were_and_zeros_for_the_untouched() {
        const PAGE: u64 = 4096;
        let mut area = vec![0u8; 16 * PAGE as usize + PAGE as usize];
        let start = (area.as_ptr() as u64).next_multiple_of(PAGE);
        let offset = (start - area.as_ptr() as u64) as usize;
        for page in [0usize, 1, 5, 15] {
            area[offset + page * PAGE as usize + 7] = page as u8 + 1;
        }
        std::hint::black_box(&mut area);
        let ranges = [(start, start + 8 * PAGE), (start + 8 * PAGE, start + 16 * PAGE)];
        let copy = CopiedMemory::copy(std::process::id(), &ranges, PAGE, CopyBuffer::populated(PAGE).unwrap(), u64::MAX)
            .expect("our own memory copies");
        // Written afterwards: the copy keeps what was there.
        area[offset + 7] = 99;
        std::hint::black_box(&mut area);
        let byte = |at: u64| {
            let mut b = [0u8; 1];
            copy.read(at, &mut b).then_some(b[0])
        };
        assert_eq!(byte(start + 7), Some(1));
        assert_eq!(byte(start + 5 * PAGE + 7), Some(6));
        assert_eq!(byte(start + 15 * PAGE + 7), Some(16));
        assert_eq!(byte(start + 3 * PAGE + 7), Some(0));
        // A read beyond the copied ranges, or across their end, fails.
        assert_eq!(byte(start + 16 * PAGE), None);
        assert!(!copy.read(start + 16 * PAGE - 4, &mut [0u8; 8]));
        // Within one range, a read spans pages.
        let mut word = [0u8; 8];
        assert!(copy.read(start + PAGE - 4, &mut word));
        assert!(copy.read_bytes >= 4 * PAGE);
        // Nothing is copied past its budget, when the buffer is too small.
        assert!(CopiedMemory::copy(std::process::id(), &ranges, PAGE, CopyBuffer::populated(PAGE).unwrap(), PAGE).is_none());
    }
}
