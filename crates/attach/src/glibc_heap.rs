//! The glibc heap of a running process, read consistently: every thread is
//! stopped (ptrace seize + interrupt, no signal), the page residency and
//! the malloc state are read, and every thread is let go. A state caught
//! in the middle of a malloc (a thread stopped inside the allocator, or a
//! walk that does not add up) is let go and read again a moment later.
//! The process is never left stopped: dropping the stopped threads detaches
//! them, whatever happened.

use std::time::{Duration, Instant};

use memgap_model::outside_walk::WalkedHeap;
use memgap_trace::records::{Mapping, SnapshotReason};

use crate::error::AttachError;
use crate::glibc_state::{self, GlibcState};
use crate::glibc_walk::{self, MP_SBRK_BASE, STATE_SIZE, WalkInput};
use crate::libc_image::{LibcImage, Whereabouts};
use crate::remote_memory::{Memory, ProcessMemory};
use crate::tracee::StoppedThread;

/// Tries at most; in the first few, a thread inside the allocator makes
/// memgap let go and look again rather than walk (after them the walk goes
/// on: threads that never leave malloc for long would otherwise cost every
/// try, and a walk that does not add up is tried again anyway).
const ATTEMPTS: u32 = 20;
const OUTSIDE_MALLOC_TRIES: u32 = 3;

/// Walks the glibc heap of `pid`.
pub fn walk_glibc_heap(pid: u32) -> Result<WalkedHeap, AttachError> {
    let mappings = crate::procfs::mappings(pid)?;
    let memory = ProcessMemory::new(pid);
    let located = glibc_state::locate(pid, &mappings, &memory);
    if let Err(why) = &located
        && why.starts_with("glibc 2.")
    {
        return Err(AttachError::Failed(why.clone()));
    }
    let libc = LibcImage::load(pid, &mappings)?;
    if let Ok(state) = &located
        && let Some(heap) = read_optimistically(pid, &memory, state, &libc)?
    {
        return Ok(heap);
    }
    let mut last_failure = String::new();
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            std::thread::sleep(Duration::from_millis(u64::from(attempt.min(5))));
        }
        let started = Instant::now();
        let Stopped { threads, stack_pointers, inside } = stop(pid, &libc)?;
        if inside && attempt <= OUTSIDE_MALLOC_TRIES {
            drop(threads);
            last_failure = "a thread was inside malloc each time".into();
            continue;
        }
        let result = read_stopped(pid, &memory, &located, &mappings);
        drop(threads);
        let stopped_ns = started.elapsed().as_nanos() as u64;
        match result {
            Ok(mut heap) => {
                heap.stack_pointers = stack_pointers;
                heap.stopped_ns = stopped_ns;
                heap.attempts = attempt;
                heap.read_bytes = memory.read_bytes.get();
                return Ok(heap);
            }
            Err(failure) => {
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    return Err(gone(pid));
                }
                if let Failure::Final(why) = failure {
                    return Err(AttachError::Failed(why));
                }
                if let Failure::Again(why) = failure {
                    last_failure = why;
                }
            }
        }
    }
    Err(AttachError::Failed(format!("the heap kept changing under the walk, {ATTEMPTS} tries ({last_failure})")))
}

/// Reads the heap while the process runs, then stops it only to check that
/// nothing the walk read was written meanwhile: the kernel's soft-dirty bit
/// of every page of the walked heaps and of the pages holding main_arena and
/// mp_ (cleared before the walk), the list of mappings (an mmapped chunk
/// freed or made), and no thread inside malloc. The stop then lasts as long
/// as reading 8 bytes of /proc/PID/pagemap per heap page. `None`: the state
/// changed [`OPTIMISTIC_TRIES`] times, or the kernel keeps no soft-dirty
/// bits; the caller reads it stopped.
fn read_optimistically(pid: u32, memory: &ProcessMemory, state: &GlibcState, libc: &LibcImage) -> Result<Option<WalkedHeap>, AttachError> {
    let located = Ok(state.clone());
    for attempt in 1..=OPTIMISTIC_TRIES {
        if !clear_soft_dirty(pid) {
            return Ok(None);
        }
        let maps_before = std::fs::read(format!("/proc/{pid}/maps")).unwrap_or_default();
        let Ok(mut heap) = read_stopped(pid, memory, &located, &[]) else { continue };
        let started = Instant::now();
        let Stopped { threads, stack_pointers, inside } = stop(pid, libc)?;
        let mut pages: Vec<(u64, u64)> = heap.arenas.iter().flat_map(|a| a.heaps.iter().copied()).collect();
        pages.push((state.main_arena, state.main_arena + STATE_SIZE));
        if let Some(mp) = state.mp {
            pages.push((mp, mp + 8 * 16));
        }
        let unchanged = !inside
            && std::fs::read(format!("/proc/{pid}/maps")).is_ok_and(|maps| maps == maps_before)
            && soft_dirty_pages(pid, &pages, heap.snapshot.page_size.max(4096)) == Some(0);
        drop(threads);
        let stopped_ns = started.elapsed().as_nanos() as u64;
        if unchanged {
            heap.stack_pointers = stack_pointers;
            heap.stopped_ns = stopped_ns;
            heap.attempts = attempt;
            heap.read_bytes = memory.read_bytes.get();
            heap.optimistic = true;
            return Ok(Some(heap));
        }
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(gone(pid));
        }
    }
    Ok(None)
}

/// Tries of [`read_optimistically`] before the heap is read stopped.
const OPTIMISTIC_TRIES: u32 = 3;

/// Clears the soft-dirty bits of every page of `pid` (the kernel then sets
/// a page's bit at its next write). Only bookkeeping: the program sees no
/// change, but a first write to each page takes a minor fault.
fn clear_soft_dirty(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "4").is_ok()
}

/// How many pages of `ranges` were written since the soft-dirty bits were
/// cleared (pagemap bit 55); `None` if pagemap cannot be read.
fn soft_dirty_pages(pid: u32, ranges: &[(u64, u64)], page_size: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    const SOFT_DIRTY: u64 = 1 << 55;
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok()?;
    let mut dirty = 0;
    let mut buffer = Vec::new();
    for &(start, end) in ranges {
        let (first, last) = (start / page_size, end.div_ceil(page_size));
        buffer.resize(((last - first) * 8) as usize, 0);
        pagemap.read_exact_at(&mut buffer, first * 8).ok()?;
        dirty += buffer.chunks_exact(8).filter(|e| u64::from_le_bytes((*e).try_into().unwrap_or([0; 8])) & SOFT_DIRTY != 0).count() as u64;
    }
    Some(dirty)
}

/// Every thread of a process, stopped until this is dropped.
struct Stopped {
    threads: Vec<StoppedThread>,
    /// Each thread's stack pointer, read while it was stopped.
    stack_pointers: Vec<u64>,
    /// A thread is inside malloc: its state may be half-updated.
    inside: bool,
}

fn stop(pid: u32, libc: &LibcImage) -> Result<Stopped, AttachError> {
    let threads = StoppedThread::stop_all(pid)?;
    if threads.is_empty() {
        return Err(gone(pid));
    }
    let mut stack_pointers = Vec::new();
    let mut inside = false;
    for thread in &threads {
        let Ok(regs) = thread.registers() else { continue };
        stack_pointers.push(regs.rsp);
        inside |= libc.whereabouts(regs.rip, regs.rsp, regs.rbp, |at| thread.read_word(at)) == Whereabouts::InAllocator;
    }
    Ok(Stopped { threads, stack_pointers, inside })
}

fn gone(pid: u32) -> AttachError {
    AttachError::Failed(format!("process {pid} exited while memgap read its heap"))
}

enum Failure {
    /// Another try may see a consistent state.
    Again(String),
    /// It will not: not glibc's state as memgap knows it.
    Final(String),
}

/// Residency and the walk, while every thread is stopped.
fn read_stopped(
    pid: u32,
    memory: &ProcessMemory,
    located: &Result<GlibcState, String>,
    _mappings: &[Mapping],
) -> Result<WalkedHeap, Failure> {
    let snapshot = crate::residency::snapshot(pid, SnapshotReason::Requested).map_err(|e| Failure::Final(e.to_string()))?;
    let state = match located {
        Ok(state) => state.clone(),
        // The heuristic may have read a state changing under it: again, stopped.
        Err(_) => glibc_state::locate(pid, &snapshot.mappings, memory).map_err(Failure::Final)?,
    };
    let page_size = snapshot.page_size;
    let maps = &snapshot.mappings;
    let resident = |addr: u64| {
        let i = maps.partition_point(|m| m.start <= addr);
        i > 0 && {
            let m = &maps[i - 1];
            addr < m.end && m.residency.is_resident(((addr - m.start) / page_size) as usize)
        }
    };
    let sbrk_base = state.mp.and_then(|mp| memory.word(mp + MP_SBRK_BASE)).filter(|&b| b != 0);
    let tcache_key = state.tcache_key_at.and_then(|at| memory.word(at));
    let input = WalkInput { main_arena: state.main_arena, sbrk_base, tcache_key, mappings: maps, page_size, resident: &resident };
    let walk = glibc_walk::walk(memory, &input).map_err(|e| Failure::Again(e.0))?;
    Ok(WalkedHeap {
        libc_path: state.libc_path,
        found_by: state.found_by,
        arenas: walk.arenas,
        blocks: walk.blocks,
        tcache: walk.tcache,
        fastbin_chunks: walk.fastbin_chunks,
        fastbin_bytes: walk.fastbin_bytes,
        binned_chunks: walk.binned_chunks,
        binned_bytes: walk.binned_bytes,
        mmapped_chunks: walk.mmapped_chunks,
        tcaches: walk.tcaches,
        snapshot,
        ..WalkedHeap::default()
    })
}
