//! The glibc heap of a running process, read consistently. First while it
//! runs, checked by the kernel's soft-dirty bits (see
//! [`read_optimistically`]); where that cannot be done, every thread is
//! stopped (ptrace seize + interrupt, no signal) while the page residency,
//! libc's state and where the heap lies are read and the heaps' pages in
//! memory are copied; the threads are let go and the copy is walked. A state
//! caught in the middle of a malloc (a thread stopped inside the allocator,
//! or a walk that does not add up) is let go and read again a moment later.
//! Without room for a copy, the heap is walked while the threads are
//! stopped. The process is never left stopped: dropping the stopped threads
//! detaches them, whatever happened.

use std::time::{Duration, Instant};

use memgap_trace::records::{Snapshot, SnapshotReason};
use memgap_types::glibc_walk::WalkedHeap;

use crate::error::AttachError;
use crate::glibc_state::{self, GlibcState};
use crate::glibc_walk::{self, HEAP_MAX, Layout, MP_SBRK_BASE, STATE_SIZE, WalkInput};
use crate::libc_image::{LibcImage, Whereabouts};
use crate::remote_memory::{CopiedMemory, CopyBuffer, Memory, ProcessMemory};
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
        let budget = copy_budget();
        let buffer = copy_buffer(pid, budget);
        let started = Instant::now();
        let Stopped { threads, stack_pointers, inside } = stop(pid, &libc)?;
        if inside && attempt <= OUTSIDE_MALLOC_TRIES {
            drop(threads);
            last_failure = "a thread was inside malloc each time".into();
            continue;
        }
        // The heaps copied, the walk goes on after the threads are let go;
        // without a copy it walks them stopped.
        let read = match (read_layout(pid, &memory, &located), buffer) {
            (Err(failure), _) => Read::Walked(Err(failure)),
            (Ok(reading), Some(buffer)) => {
                match CopiedMemory::copy(pid, &reading.layout.heaps(), reading.snapshot.page_size, buffer, budget) {
                    Some(copy) => Read::Copied(reading, copy),
                    None => Read::Walked(reading.walk(&memory)),
                }
            }
            (Ok(reading), None) => Read::Walked(reading.walk(&memory)),
        };
        drop(threads);
        let stopped_ns = started.elapsed().as_nanos() as u64;
        let (result, copied_bytes) = match read {
            Read::Walked(walked) => (walked, 0),
            Read::Copied(reading, copy) => (reading.walk(&copy), copy.read_bytes),
        };
        match result {
            Ok(mut heap) => {
                heap.stack_pointers = stack_pointers;
                heap.stopped_ns = stopped_ns;
                heap.attempts = attempt;
                heap.read_bytes = memory.read_bytes.get() + copied_bytes;
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

/// Reads the heap while the process runs, and stops it only to see that no
/// thread is inside malloc. The kernel's soft-dirty bits (cleared before the
/// walk, read after the stop) then tell whether any page the walk read was
/// written meanwhile: every page of the walked heaps, of the chunks glibc
/// mmapped and of main_arena and mp_. None was written from the clearing
/// until after the stop, so at the stop's instant the memory held what the
/// walk read, with no thread half-way through an update: a consistent state,
/// while the stop lasts only as long as stopping the threads and reading
/// their registers. The list of mappings is compared too (a chunk mmapped
/// or unmapped). `None`: the state changed [`OPTIMISTIC_TRIES`] times, or
/// the kernel keeps no soft-dirty bits; the caller reads it stopped.
fn read_optimistically(pid: u32, memory: &ProcessMemory, state: &GlibcState, libc: &LibcImage) -> Result<Option<WalkedHeap>, AttachError> {
    let located = Ok(state.clone());
    for attempt in 1..=OPTIMISTIC_TRIES {
        if !clear_soft_dirty(pid) {
            return Ok(None);
        }
        let maps_before = std::fs::read(format!("/proc/{pid}/maps")).unwrap_or_default();
        let Ok(mut heap) = read_layout(pid, memory, &located).and_then(|reading| reading.walk(memory)) else { continue };
        let started = Instant::now();
        let Stopped { threads, stack_pointers, inside } = stop(pid, libc)?;
        drop(threads);
        let stopped_ns = started.elapsed().as_nanos() as u64;
        let page_size = heap.snapshot.page_size.max(4096);
        let unchanged = !inside
            && soft_dirty_pages(pid, &read_ranges(&heap, state, page_size), page_size) == Some(0)
            && std::fs::read(format!("/proc/{pid}/maps")).is_ok_and(|maps| maps == maps_before);
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

/// The memory a walk read, by ranges: the arenas' heaps, main_arena, mp_,
/// and the header page of each chunk glibc mmapped.
fn read_ranges(heap: &WalkedHeap, state: &GlibcState, page_size: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = heap.arenas.iter().flat_map(|a| a.heaps.iter().copied()).collect();
    let in_a_heap = |addr: u64| ranges.iter().any(|&(start, end)| start <= addr && addr < end);
    let mmapped: Vec<(u64, u64)> = heap
        .blocks
        .iter()
        .filter(|&&(addr, _)| addr % page_size == 16 && !in_a_heap(addr))
        .map(|&(addr, _)| (addr - 16, addr - 16 + page_size))
        .collect();
    ranges.extend(mmapped);
    ranges.push((state.main_arena, state.main_arena + STATE_SIZE));
    if let Some(mp) = state.mp {
        ranges.push((mp, mp + 8 * 16));
    }
    ranges
}

/// Tries of [`read_optimistically`] before the heap is read stopped.
const OPTIMISTIC_TRIES: u32 = 3;

/// Clears the soft-dirty bits of every page of `pid` (the kernel then sets
/// a page's bit at its next write). Only bookkeeping: the program sees no
/// change, but a first write to each page takes a minor fault.
fn clear_soft_dirty(pid: u32) -> bool {
    soft_dirty_kept() && std::fs::write(format!("/proc/{pid}/clear_refs"), "4").is_ok()
}

/// Whether the kernel keeps soft-dirty bits (CONFIG_MEM_SOFT_DIRTY): one
/// without accepts the clearing but never sets a bit, so every page would
/// look unwritten. Tried once on a page of memgap's own: cleared, written,
/// its bit read back.
fn soft_dirty_kept() -> bool {
    static KEPT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KEPT.get_or_init(|| {
        let mut page = vec![0u8; 2 * 4096];
        let at = page.as_ptr() as u64;
        let first = at.next_multiple_of(4096);
        let index = (first - at) as usize;
        page[index] = 1;
        std::hint::black_box(&mut page);
        if std::fs::write("/proc/self/clear_refs", "4").is_err() {
            return false;
        }
        page[index] = 2;
        std::hint::black_box(&mut page);
        soft_dirty_pages(std::process::id(), &[(first, first + 1)], 4096) == Some(1)
    })
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

/// What was read while the threads were stopped.
enum Read {
    Walked(Result<WalkedHeap, Failure>),
    Copied(Reading, CopiedMemory),
}

/// What the walk needs besides the heaps' memory, read while every thread
/// is stopped: the page residency, libc's state, where the heap lies.
struct Reading {
    snapshot: Snapshot,
    state: GlibcState,
    sbrk_base: Option<u64>,
    tcache_key: Option<u64>,
    layout: Layout,
}

fn read_layout(pid: u32, memory: &ProcessMemory, located: &Result<GlibcState, String>) -> Result<Reading, Failure> {
    let snapshot = crate::residency::snapshot(pid, SnapshotReason::Requested).map_err(|e| Failure::Final(e.to_string()))?;
    let state = match located {
        Ok(state) => state.clone(),
        // The heuristic may have read a state changing under it: again, stopped.
        Err(_) => glibc_state::locate(pid, &snapshot.mappings, memory).map_err(Failure::Final)?,
    };
    let sbrk_base = state.mp.and_then(|mp| memory.word(mp + MP_SBRK_BASE)).filter(|&b| b != 0);
    let tcache_key = state.tcache_key_at.and_then(|at| memory.word(at));
    let mut reading = Reading { snapshot, state, sbrk_base, tcache_key, layout: Layout::default() };
    reading.layout = reading.with_input(|input| glibc_walk::layout(memory, input)).map_err(|e| Failure::Again(e.0))?;
    Ok(reading)
}

impl Reading {
    fn with_input<R>(&self, f: impl FnOnce(&WalkInput) -> R) -> R {
        let page_size = self.snapshot.page_size;
        let maps = &self.snapshot.mappings;
        let resident = |addr: u64| {
            let i = maps.partition_point(|m| m.start <= addr);
            i > 0 && {
                let m = &maps[i - 1];
                addr < m.end && m.residency.is_resident(((addr - m.start) / page_size) as usize)
            }
        };
        let input = WalkInput {
            main_arena: self.state.main_arena,
            sbrk_base: self.sbrk_base,
            tcache_key: self.tcache_key,
            mappings: maps,
            page_size,
            resident: &resident,
        };
        f(&input)
    }

    /// Walks the heap's chunks in `memory`: the process's own while it is
    /// stopped, or a copy of its heaps made then.
    fn walk(self, memory: &dyn Memory) -> Result<WalkedHeap, Failure> {
        let walk = self.with_input(|input| glibc_walk::walk_laid_out(memory, input, &self.layout)).map_err(|e| Failure::Again(e.0))?;
        // The walk fills what it reads from the heap; the rest is this reading's.
        Ok(WalkedHeap { libc_path: self.state.libc_path, found_by: self.state.found_by, snapshot: self.snapshot, ..walk })
    }
}

/// Memory for a copy of the heaps, taken before the process is stopped:
/// as much as `[heap]` and the mappings where thread arenas keep theirs
/// (64 MiB-aligned) have in memory, and an eighth more for what the heap
/// grows meanwhile. `None` past `budget` ([`copy_budget`]): the heap is
/// then walked stopped.
fn copy_buffer(pid: u32, budget: u64) -> Option<CopyBuffer> {
    let mappings = crate::procfs::mappings(pid).ok()?;
    let in_heaps: u64 = mappings
        .iter()
        .filter(|m| m.name == "[heap]" || (m.is_private_writable_anonymous() && m.start.is_multiple_of(HEAP_MAX)))
        .map(|m| m.rss)
        .sum();
    let bytes = in_heaps + in_heaps / 8;
    if bytes > budget {
        return None;
    }
    CopyBuffer::populated(bytes)
}

/// Memory memgap may take for a copy of the heaps: half of what the
/// machine has available, and half of the headroom under the memory limit
/// of memgap's own cgroup (which may be the program's), so that the copy
/// never presses on the program.
fn copy_budget() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let available_kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    let headroom = crate::cgroup::of_process(std::process::id())
        .and_then(|c| c.max_bytes.map(|max| max.saturating_sub(c.current_bytes)))
        .unwrap_or(u64::MAX);
    (available_kib * 1024).min(headroom) / 2
}
