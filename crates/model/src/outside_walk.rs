//! The whole ledger of a running glibc process from outside: the chunks an
//! adapter (memgap-attach) found walking the process's malloc state, laid
//! over the page residency it read at the same instant, go through the very
//! code that makes a recording's ledger ([`crate::accounting::compute`]): the
//! in-use chunks become the live set, the chunks in the threads' tcaches and
//! the arenas' heaps feed the glibc trim forecast.
//!
//! What a walk cannot know is the size the program asked for: a chunk tells
//! only its usable bytes, so `live` counts usable bytes and `slack` only the
//! chunks' size words.

use crate::HeapState;
use crate::accounting::{self, Detail};
use crate::ledger::Ledger;

pub use memgap_types::glibc_walk::{WALK_KIND, WALK_SOURCE, WalkSummary, WalkedArena, WalkedHeap};

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
    let mut owners = crate::registry::registered();
    owners.iter_mut().for_each(|o| o.allocator(&walk.libc_path));
    if walk.blocks.is_sorted_by_key(|&(addr, _)| addr) {
        accounting::compute_walked(&mut state, &walk.snapshot, detail, &mut owners, &walk.blocks)
    } else {
        let mut blocks = walk.blocks.clone();
        blocks.sort_unstable();
        accounting::compute_walked(&mut state, &walk.snapshot, detail, &mut owners, &blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_replay::ThreadEvent;
    use memgap_trace::records::{Mapping, Metrics, Residency, Snapshot};
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
        let mut owners = crate::registry::registered();
        owners.iter_mut().for_each(|o| o.allocator(LIBC));
        accounting::compute(&mut state, &walk.snapshot, Detail { pages: true, ..Detail::default() }, &mut owners)
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
