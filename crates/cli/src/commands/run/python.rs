//! The CPython source in `memgap run`: at each snapshot of a process whose
//! agent hooked pymalloc's arenas, the recorder reads the agent's arena
//! table and the arenas' pool headers from the process's memory
//! (`process_vm_readv`, only on pages the snapshot found resident), and
//! writes what pymalloc holds as a METRICS record just before the snapshot.

use std::sync::atomic::Ordering::*;

use memgap_source_python::{Census, POOL_OVERHEAD, PoolHeader, census};
use memgap_trace::records::Mapping;
use memgap_trace::shared::Header;

/// Reads at most this many pieces per system call.
const IOV_BATCH: usize = 512;

/// pymalloc at this instant, or None when the process has no hooked CPython.
pub fn census_of(pid: u32, header: &Header, snapshot_time: u64, mappings: &[Mapping], page_bytes: u64) -> Option<Census> {
    let table = header.python_arenas.load(Acquire);
    if table == 0 {
        return None;
    }
    let slots = header.python_arena_slots.load(Relaxed) as usize;
    let arena_bytes = header.python_arena_bytes.load(Relaxed);
    let pool_bytes = u64::from(header.python_pool_bytes.load(Relaxed));
    let mut raw = vec![0u8; slots.min(1 << 16) * 8];
    let mut arenas: Vec<u64> = if raw.is_empty() {
        Vec::new()
    } else {
        let read = read_pieces(pid, &[(table, raw.len())], &mut raw);
        if read.first() != Some(&true) {
            return None;
        }
        raw.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes"))).filter(|&a| a != 0).collect()
    };
    arenas.sort_unstable();
    arenas.dedup();
    let resident = |address: u64| {
        let i = mappings.partition_point(|m| m.end <= address);
        mappings.get(i).filter(|m| m.start <= address).is_some_and(|m| m.residency.is_resident(((address - m.start) / page_bytes) as usize))
    };
    let headers = |pools: &[u64]| {
        let mut out = Vec::with_capacity(pools.len());
        for batch in pools.chunks(IOV_BATCH) {
            let mut buffer = vec![0u8; batch.len() * POOL_OVERHEAD as usize];
            let pieces: Vec<(u64, usize)> = batch.iter().map(|&p| (p, POOL_OVERHEAD as usize)).collect();
            let read = read_pieces(pid, &pieces, &mut buffer);
            for (i, ok) in read.into_iter().enumerate() {
                let bytes = &buffer[i * POOL_OVERHEAD as usize..(i + 1) * POOL_OVERHEAD as usize];
                out.push(if ok { PoolHeader::parse(bytes) } else { None });
            }
        }
        out
    };
    let mut census = census(&arenas, arena_bytes, pool_bytes, page_bytes, resident, headers);
    census.snapshot_time = snapshot_time;
    Some(census)
}

/// Reads each `(address, length)` piece of process `pid` into consecutive
/// parts of `buffer`; whether each piece was read whole.
fn read_pieces(pid: u32, pieces: &[(u64, usize)], buffer: &mut [u8]) -> Vec<bool> {
    let mut done = vec![false; pieces.len()];
    let mut start = 0;
    let mut offset = 0;
    while start < pieces.len() {
        let remote: Vec<libc::iovec> =
            pieces[start..].iter().map(|&(a, len)| libc::iovec { iov_base: a as *mut libc::c_void, iov_len: len }).collect();
        let total: usize = pieces[start..].iter().map(|p| p.1).sum();
        let local = libc::iovec { iov_base: buffer[offset..].as_mut_ptr() as *mut libc::c_void, iov_len: total };
        // SAFETY: the remote ranges are only read (by the kernel, in the other
        // process); `local` holds `total` bytes only because every caller sizes
        // `buffer` to the pieces' total length (not checked here).
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, remote.as_ptr(), remote.len() as libc::c_ulong, 0) };
        if n <= 0 {
            // The piece at `start` cannot be read (unmapped meanwhile): skip it.
            offset += pieces[start].1;
            start += 1;
            continue;
        }
        // A partial read stops at the first piece it could not read whole.
        let mut left = n as usize;
        while start < pieces.len() && left >= pieces[start].1 {
            left -= pieces[start].1;
            offset += pieces[start].1;
            done[start] = true;
            start += 1;
        }
        if start < pieces.len() {
            // The piece read in part is skipped.
            offset += pieces[start].1;
            start += 1;
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pieces_of_our_own_memory_and_skips_unmapped_ones() {
        let data: Vec<u8> = (0..200u8).collect();
        let base = data.as_ptr() as u64;
        let mut buffer = vec![0u8; 30];
        let done = read_pieces(std::process::id(), &[(base + 10, 10), (8, 10), (base + 100, 10)], &mut buffer);
        assert_eq!(done, vec![true, false, true]);
        assert_eq!(&buffer[..10], &data[10..20]);
        assert_eq!(&buffer[20..30], &data[100..110]);
    }
}
