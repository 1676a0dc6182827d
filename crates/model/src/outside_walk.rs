//! The whole ledger of a running glibc process from outside: the chunks an
//! adapter (memgap-attach) found walking the process's malloc state, laid
//! over the page residency it read at the same instant, go through the very
//! code that makes a recording's ledger ([`crate::ledger::compute`]): the
//! in-use chunks become the live set, the chunks in the threads' tcaches and
//! the arenas' heaps feed the glibc trim forecast.
//!
//! What a walk cannot know is the size the program asked for: a chunk tells
//! only its usable bytes, so `live` counts usable bytes and `slack` only the
//! chunks' size words.

use memgap_replay::ThreadEvent;
use memgap_trace::records::Snapshot;
use memgap_trace::{Event, EventKind};
use serde::Serialize;

use crate::HeapState;
use crate::ledger::{self, Detail, Ledger};

/// One glibc arena as walked: its malloc_state and its heaps.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WalkedArena {
    /// Address of its `struct malloc_state`.
    pub state: u64,
    pub main: bool,
    /// The heaps' walked ranges `[first chunk's heap start, end)`, oldest
    /// first; the last holds the arena's top.
    pub heaps: Vec<(u64, u64)>,
    pub top: u64,
    pub top_size: u64,
    /// The arena's `system_mem`.
    pub system_bytes: u64,
}

/// What a walk of glibc's malloc state found, at the instant of `snapshot`.
#[derive(Debug, Clone, Default)]
pub struct WalkedHeap {
    /// libc's path in the process (names the allocator for the owners).
    pub libc_path: String,
    /// How main_arena was found: "debug info" or "heuristic".
    pub found_by: &'static str,
    pub arenas: Vec<WalkedArena>,
    /// In-use chunks the program holds: (block address, usable bytes), by address.
    pub blocks: Vec<(u64, u64)>,
    /// Free chunks sitting in some thread's tcache: (block address, chunk size).
    pub tcache: Vec<(u64, u64)>,
    /// Counts of the free chunks: in fastbins, in tcaches, in bins (binned
    /// chunks and the tops not counted).
    pub fastbin_chunks: u64,
    pub fastbin_bytes: u64,
    pub binned_chunks: u64,
    pub binned_bytes: u64,
    /// Chunks glibc mmapped for one block each (counted in `blocks`).
    pub mmapped_chunks: u64,
    /// The threads' tcache structures found (glibc's own, not the program's).
    pub tcaches: u64,
    /// Stack pointers of the threads, read while they were stopped.
    pub stack_pointers: Vec<u64>,
    pub snapshot: Snapshot,
    /// How long the process was stopped, in nanoseconds, and how many
    /// times it was stopped before the walk saw a consistent state.
    pub stopped_ns: u64,
    pub attempts: u32,
    /// Bytes of the process's memory read.
    pub read_bytes: u64,
}

/// How the walk went, beside the ledger in `memgap snapshot --json`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WalkSummary {
    pub found_by: &'static str,
    pub arenas: u32,
    pub heaps: u32,
    pub live_blocks: u64,
    pub tcache_chunks: u64,
    pub fastbin_chunks: u64,
    pub binned_chunks: u64,
    pub mmapped_chunks: u64,
    /// Heap bytes walked (from each heap's start to its top's end).
    pub heap_bytes: u64,
    pub read_bytes: u64,
    pub stopped_ms: f64,
    /// Stop time per GiB of heap walked.
    pub stopped_ms_per_gib: f64,
    pub attempts: u32,
}

impl WalkedHeap {
    pub fn summary(&self) -> WalkSummary {
        let heap_bytes: u64 = self.arenas.iter().flat_map(|a| &a.heaps).map(|&(s, e)| e - s).sum();
        let stopped_ms = self.stopped_ns as f64 / 1e6;
        WalkSummary {
            found_by: self.found_by,
            arenas: self.arenas.len() as u32,
            heaps: self.arenas.iter().map(|a| a.heaps.len() as u32).sum(),
            live_blocks: self.blocks.len() as u64,
            tcache_chunks: self.tcache.len() as u64,
            fastbin_chunks: self.fastbin_chunks,
            binned_chunks: self.binned_chunks,
            mmapped_chunks: self.mmapped_chunks,
            heap_bytes,
            read_bytes: self.read_bytes,
            stopped_ms,
            stopped_ms_per_gib: stopped_ms / (heap_bytes.max(1) as f64 / (1u64 << 30) as f64),
            attempts: self.attempts,
        }
    }
}

/// The heap as a replay would hold it at the walk's instant: the in-use
/// chunks as live blocks (one pseudo-thread per arena, oldest heap first),
/// the tcache chunks and the arenas' heaps in the trim model, the threads'
/// stacks as stack hints.
pub fn heap_state(walk: &WalkedHeap) -> HeapState {
    let mut state = HeapState::default();
    state.allocator = walk.libc_path.clone();
    state.stack_hints = walk.stack_pointers.clone();
    let arena_of =
        |addr: u64| walk.arenas.iter().position(|a| a.heaps.iter().any(|&(s, e)| s <= addr && addr < e)).map_or(0, |i| i as u32 + 1);
    for (index, arena) in walk.arenas.iter().enumerate() {
        let heaps: Vec<u64> = arena.heaps.iter().map(|&(start, _)| start).collect();
        if !arena.main {
            state.glibc_trim.walked_arena(&heaps, index as u32 + 1);
        }
        for &(start, end) in &arena.heaps {
            state.held_blocks(start, end);
        }
    }
    for &(addr, usable) in &walk.blocks {
        let event = Event { kind: Some(EventKind::Malloc), addr, size: usable, usable, ..Event::default() };
        let thread = arena_of(addr);
        state.apply(&ThreadEvent { thread, tid: thread, event });
    }
    for &(addr, size) in &walk.tcache {
        state.glibc_trim.walked_tcache_chunk(addr, size);
    }
    state
}

/// The ledger of the walked process: the same rows, trim forecast and page
/// maps as a recording's ledger at a snapshot.
pub fn walked_ledger(walk: &WalkedHeap, pages: bool) -> Ledger {
    let mut state = heap_state(walk);
    let mut owners = crate::owners::registered();
    owners.iter_mut().for_each(|o| o.allocator(&walk.libc_path));
    let detail = Detail { pages, ..Detail::default() };
    ledger::compute(&mut state, &walk.snapshot, detail, &mut owners)
}
