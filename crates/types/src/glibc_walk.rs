//! What a walk of a running process's glibc malloc state found, as plain
//! data: the arenas, the in-use and cached chunks, how long the process was
//! stopped. `memgap-attach` produces it; the model lays it over the page
//! residency (`memgap_model::outside_walk`); `memgap watch` keeps it in a
//! trace as a METRICS record ([`WalkedHeap::to_metrics`]).

use memgap_trace::records::{Metrics, Snapshot};
use serde::Serialize;

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

/// A walk kept in a trace (`memgap watch`): a METRICS record of this
/// source and kind carries everything the walk found but the in-use chunks
/// and the page residency; the chunks are malloc and free events bringing
/// the trace's live set to the walk's, and the residency is the SNAPSHOT of
/// the same time. Replay puts the three together again at that snapshot
/// and computes its ledger with `memgap_model::outside_walk::walked_ledger`: the rows are the walk's.
pub const WALK_SOURCE: &str = "glibc";
pub const WALK_KIND: &str = memgap_trace::vocabulary::kind::WALK;

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
