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

use memgap_trace::records::{Metrics, Snapshot};
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
    /// Read while the process ran, the stop only checking that nothing
    /// the walk read was written meanwhile.
    pub optimistic: bool,
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
    /// "while running, checked stopped" or "stopped".
    pub read_while: &'static str,
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
            read_while: if self.optimistic { "running, checked stopped" } else { "stopped" },
        }
    }
}

/// What a replay would know besides the live set at the walk's instant:
/// the arenas' heaps (as regions that held blocks, and in the trim model,
/// one pseudo-thread per arena, oldest heap first), the tcache chunks, the
/// threads' stacks as stack hints. The in-use chunks stay the walk's
/// sorted list: [`walked_ledger_with`] hands them to the ledger as they are.
pub fn heap_state(walk: &WalkedHeap) -> HeapState {
    let mut state = HeapState::default();
    state.allocator = walk.libc_path.clone();
    state.stack_hints = walk.stack_pointers.clone();
    let mut heaps: Vec<(u64, u64)> = Vec::new();
    for (index, arena) in walk.arenas.iter().enumerate() {
        let starts: Vec<u64> = arena.heaps.iter().map(|&(start, _)| start).collect();
        if !arena.main {
            state.glibc_trim.walked_arena(&starts, index as u32 + 1);
        }
        for &(start, end) in &arena.heaps {
            state.held_blocks(start, end);
            heaps.push((start, end));
        }
    }
    heaps.sort_unstable();
    // Blocks outside every heap are chunks glibc mmapped for one block each:
    // their mappings held blocks too.
    let in_a_heap = |addr: u64| {
        let i = heaps.partition_point(|&(start, _)| start <= addr);
        i > 0 && addr < heaps[i - 1].1
    };
    for &(addr, usable) in walk.blocks.iter().filter(|&&(addr, _)| !in_a_heap(addr)) {
        state.held_blocks(addr, addr + usable.max(1));
    }
    for &(addr, size) in &walk.tcache {
        state.glibc_trim.walked_tcache_chunk(addr, size);
    }
    state
}

/// The ledger of the walked process: the same rows, trim forecast and page
/// maps as a recording's ledger at a snapshot.
pub fn walked_ledger(walk: &WalkedHeap, pages: bool) -> Ledger {
    walked_ledger_with(walk, Detail { pages, ..Detail::default() })
}

/// [`walked_ledger`] with the detail a command asks for.
pub fn walked_ledger_with(walk: &WalkedHeap, detail: Detail) -> Ledger {
    let mut state = heap_state(walk);
    let mut owners = crate::owners::registered();
    owners.iter_mut().for_each(|o| o.allocator(&walk.libc_path));
    if walk.blocks.is_sorted_by_key(|&(addr, _)| addr) {
        ledger::compute_walked(&mut state, &walk.snapshot, detail, &mut owners, &walk.blocks)
    } else {
        let mut blocks = walk.blocks.clone();
        blocks.sort_unstable();
        ledger::compute_walked(&mut state, &walk.snapshot, detail, &mut owners, &blocks)
    }
}

/// A walk kept in a trace (`memgap watch`): a METRICS record of this
/// source and kind carries everything the walk found but the in-use chunks
/// and the page residency; the chunks are malloc and free events bringing
/// the trace's live set to the walk's, and the residency is the SNAPSHOT of
/// the same time. Replay puts the three together again at that snapshot
/// and computes its ledger with [`walked_ledger`]: the rows are the walk's.
pub const WALK_SOURCE: &str = "glibc";
pub const WALK_KIND: &str = "walk";

impl WalkedHeap {
    /// The walk as a METRICS record (addresses are below 2^53, exact in f64).
    pub fn to_metrics(&self, monotonic_ns: u64) -> Metrics {
        let mut values: Vec<(String, f64)> = Vec::new();
        let mut put = |name: String, value: u64| values.push((name, value as f64));
        put("snapshot_time".into(), self.snapshot.time);
        put("found_by_debug_info".into(), u64::from(self.found_by == "debug info"));
        for (i, arena) in self.arenas.iter().enumerate() {
            put(format!("arena[{i}]:state"), arena.state);
            put(format!("arena[{i}]:main"), u64::from(arena.main));
            put(format!("arena[{i}]:top"), arena.top);
            put(format!("arena[{i}]:top_size"), arena.top_size);
            put(format!("arena[{i}]:system"), arena.system_bytes);
            for (j, &(start, end)) in arena.heaps.iter().enumerate() {
                put(format!("arena[{i}]:heap[{j}]:start"), start);
                put(format!("arena[{i}]:heap[{j}]:end"), end);
            }
        }
        for (k, &(addr, size)) in self.tcache.iter().enumerate() {
            put(format!("tcache[{k}]:addr"), addr);
            put(format!("tcache[{k}]:size"), size);
        }
        for (k, &sp) in self.stack_pointers.iter().enumerate() {
            put(format!("stack_pointer[{k}]"), sp);
        }
        for (name, value) in [
            ("fastbin_chunks", self.fastbin_chunks),
            ("fastbin_bytes", self.fastbin_bytes),
            ("binned_chunks", self.binned_chunks),
            ("binned_bytes", self.binned_bytes),
            ("mmapped_chunks", self.mmapped_chunks),
            ("tcaches", self.tcaches),
            ("stopped_ns", self.stopped_ns),
            ("attempts", u64::from(self.attempts)),
            ("read_bytes", self.read_bytes),
            ("read_running", u64::from(self.optimistic)),
        ] {
            put(name.into(), value);
        }
        Metrics { monotonic_ns, source: WALK_SOURCE.into(), kind: WALK_KIND.into(), values }
    }

    /// Read back from a METRICS record written by [`Self::to_metrics`]: the
    /// snapshot's time and the walk without its blocks, snapshot and libc path.
    pub fn from_metrics(m: &Metrics) -> Option<(u64, WalkedHeap)> {
        if m.source != WALK_SOURCE || m.kind != WALK_KIND {
            return None;
        }
        let number = |v: f64| (v.is_finite() && v >= 0.0 && v < 2f64.powi(63)).then_some(v as u64);
        let snapshot_time = number(m.get("snapshot_time")?)?;
        let mut walk = WalkedHeap {
            found_by: if m.get("found_by_debug_info").is_some_and(|v| v > 0.0) { "debug info" } else { "heuristic" },
            ..WalkedHeap::default()
        };
        let index = |text: &str| -> Option<(usize, String)> {
            let (i, rest) = text.split_once(']')?;
            Some((i.parse().ok()?, rest.to_string()))
        };
        let mut heaps: Vec<Vec<(u64, u64)>> = Vec::new();
        for (name, value) in &m.values {
            let Some(value) = number(*value) else { continue };
            if let Some((i, field)) = name.strip_prefix("arena[").and_then(index) {
                if i >= 4096 {
                    continue;
                }
                if walk.arenas.len() <= i {
                    walk.arenas.resize(i + 1, WalkedArena::default());
                    heaps.resize(i + 1, Vec::new());
                }
                let arena = &mut walk.arenas[i];
                match field.as_str() {
                    ":state" => arena.state = value,
                    ":main" => arena.main = value > 0,
                    ":top" => arena.top = value,
                    ":top_size" => arena.top_size = value,
                    ":system" => arena.system_bytes = value,
                    heap => {
                        let Some((j, end)) = heap.strip_prefix(":heap[").and_then(index) else { continue };
                        if j >= 4096 {
                            continue;
                        }
                        let list = &mut heaps[i];
                        if list.len() <= j {
                            list.resize(j + 1, (0, 0));
                        }
                        match end.as_str() {
                            ":start" => list[j].0 = value,
                            ":end" => list[j].1 = value,
                            _ => {}
                        }
                    }
                }
            } else if let Some((k, field)) = name.strip_prefix("tcache[").and_then(index) {
                if k >= 1 << 20 {
                    continue;
                }
                if walk.tcache.len() <= k {
                    walk.tcache.resize(k + 1, (0, 0));
                }
                match field.as_str() {
                    ":addr" => walk.tcache[k].0 = value,
                    ":size" => walk.tcache[k].1 = value,
                    _ => {}
                }
            } else if let Some((k, _)) = name.strip_prefix("stack_pointer[").and_then(index) {
                if k < 1 << 20 {
                    walk.stack_pointers.push(value);
                }
            } else {
                match name.as_str() {
                    "fastbin_chunks" => walk.fastbin_chunks = value,
                    "fastbin_bytes" => walk.fastbin_bytes = value,
                    "binned_chunks" => walk.binned_chunks = value,
                    "binned_bytes" => walk.binned_bytes = value,
                    "mmapped_chunks" => walk.mmapped_chunks = value,
                    "tcaches" => walk.tcaches = value,
                    "stopped_ns" => walk.stopped_ns = value,
                    "attempts" => walk.attempts = value.min(u64::from(u32::MAX)) as u32,
                    "read_bytes" => walk.read_bytes = value,
                    "read_running" => walk.optimistic = value != 0,
                    _ => {}
                }
            }
        }
        for (arena, heaps) in walk.arenas.iter_mut().zip(heaps) {
            arena.heaps = heaps.into_iter().filter(|&(start, end)| start < end).collect();
        }
        walk.tcache.retain(|&(addr, size)| addr != 0 && size != 0);
        Some((snapshot_time, walk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_replay::ThreadEvent;
    use memgap_trace::records::{Mapping, Residency};
    use memgap_trace::{Event, EventKind};

    const PAGE: u64 = 4096;
    const BRK: u64 = 0x5555_0000_0000;
    const ARENA_HEAP: u64 = 0x7f00_0000_0000;
    const MMAPPED: u64 = 0x7f10_0000_0000;
    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

    fn anonymous(start: u64, pages: u64, name: &str, residency: Residency) -> Mapping {
        Mapping {
            start,
            end: start + pages * PAGE,
            perms: "rw-p".into(),
            name: name.into(),
            rss: pages * PAGE,
            residency,
            ..Mapping::default()
        }
    }

    /// A main arena, a thread arena and one mmapped chunk, with strided
    /// survivors, free pages and tcache chunks.
    fn walk() -> WalkedHeap {
        let mut blocks = Vec::new();
        for i in 0..600u64 {
            if i % 7 == 0 || (200..260).contains(&i) {
                blocks.push((BRK + 0x290 + 16 + i * 1024, 1016));
            }
        }
        for i in 0..300u64 {
            if i % 3 != 0 {
                blocks.push((ARENA_HEAP + 0x8d0 + 16 + i * 48, 40));
            }
        }
        blocks.push((MMAPPED + 16, 64 * PAGE - 16));
        blocks.sort_unstable();
        // Pages 100..110 of the brk heap were given back.
        let mut bits = vec![0xffu8; 20];
        bits[12] = 0;
        bits[13] = 0b1100_0000;
        let snapshot = Snapshot {
            page_size: PAGE,
            mappings: vec![
                anonymous(BRK, 160, "[heap]", Residency::Bitmap(bits)),
                anonymous(ARENA_HEAP, 8, "", Residency::All),
                anonymous(ARENA_HEAP + 8 * PAGE, 16376, "", Residency::None),
                anonymous(MMAPPED, 64, "", Residency::All),
            ],
            ..Snapshot::default()
        };
        WalkedHeap {
            libc_path: LIBC.into(),
            found_by: "debug info",
            arenas: vec![
                WalkedArena { state: 0x7f20_0000_0000, main: true, heaps: vec![(BRK, BRK + 160 * PAGE)], ..WalkedArena::default() },
                WalkedArena {
                    state: ARENA_HEAP + 48,
                    main: false,
                    heaps: vec![(ARENA_HEAP, ARENA_HEAP + 8 * PAGE)],
                    ..WalkedArena::default()
                },
            ],
            blocks,
            tcache: vec![(BRK + 0x290 + 16 + 1024, 1040), (ARENA_HEAP + 0x8d0 + 16, 48)],
            stack_pointers: vec![0x7ffc_0000_0000],
            snapshot,
            ..WalkedHeap::default()
        }
    }

    /// The walk's blocks replayed as malloc events, one pseudo-thread per
    /// arena: the ledger a trace of the same heap would give.
    fn replayed_ledger(walk: &WalkedHeap) -> Ledger {
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
        let mut owners = crate::owners::registered();
        owners.iter_mut().for_each(|o| o.allocator(LIBC));
        ledger::compute(&mut state, &walk.snapshot, Detail { pages: true, ..Detail::default() }, &mut owners)
    }

    #[test]
    fn a_walked_ledger_is_the_ledger_of_its_blocks_replayed() {
        let walk = walk();
        let walked = walked_ledger(&walk, true);
        let replayed = replayed_ledger(&walk);
        assert!(walked.rows.live > 0 && walked.rows.fragmented > 0 && walked.trim_would_return_bytes > 0, "{:?}", walked.rows);
        assert_eq!(walked.rows, replayed.rows);
        assert_eq!(walked.heaps, replayed.heaps);
        assert_eq!(walked.live_blocks, walk.blocks.len() as u64);
        assert_eq!(walked.trim_would_return_bytes, replayed.trim_would_return_bytes);
        assert_eq!(serde_json::to_string(&walked).unwrap(), serde_json::to_string(&replayed).unwrap());
        // Blocks out of order (a corrupt record) give the same ledger.
        let mut shuffled = walk.clone();
        shuffled.blocks.reverse();
        assert_eq!(walked_ledger(&shuffled, true).rows, walked.rows);
    }

    #[test]
    fn a_walk_reads_back_from_its_metrics_record() {
        let walk = WalkedHeap {
            found_by: "debug info",
            arenas: vec![
                WalkedArena {
                    state: 0x7f00_1000,
                    main: true,
                    heaps: vec![(0x5555_0000, 0x5556_0000)],
                    top: 1,
                    top_size: 2,
                    system_bytes: 3,
                },
                WalkedArena {
                    state: 0x7e00_0000_0020,
                    main: false,
                    heaps: vec![(0x7e00_0000_08c0, 0x7e00_0400_0000), (0x7e00_0800_0020, 0x7e00_0900_0000)],
                    top: 0x7e00_0800_1000,
                    top_size: 4096,
                    system_bytes: 1 << 26,
                },
            ],
            blocks: vec![(0x5555_0010, 24)],
            tcache: vec![(0x5555_0400, 32), (0x5555_0800, 1040)],
            fastbin_chunks: 4,
            fastbin_bytes: 128,
            binned_chunks: 5,
            binned_bytes: 1 << 20,
            mmapped_chunks: 1,
            tcaches: 2,
            stack_pointers: vec![0x7ffd_0000_1000, 0x7e00_1000_0000],
            snapshot: Snapshot { time: 123_456_789, ..Snapshot::default() },
            stopped_ns: 9_000_000,
            attempts: 2,
            read_bytes: 65536,
            optimistic: true,
            libc_path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
        };
        let (time, back) = WalkedHeap::from_metrics(&walk.to_metrics(5)).expect("a walk record");
        assert_eq!(time, 123_456_789);
        assert_eq!(back.arenas, walk.arenas);
        assert_eq!((&back.tcache, &back.stack_pointers), (&walk.tcache, &walk.stack_pointers));
        assert_eq!(back.summary(), WalkSummary { live_blocks: 0, ..walk.summary() });
        // The blocks and the residency travel as events and the SNAPSHOT record.
        assert!(back.blocks.is_empty() && back.libc_path.is_empty());
        let other = Metrics { source: "glibc".into(), kind: "stats".into(), ..walk.to_metrics(5) };
        assert!(WalkedHeap::from_metrics(&other).is_none());
    }
}
