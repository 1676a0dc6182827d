//! A walk of glibc's malloc state in another process's memory, as glibc 2.36
//! (malloc/malloc.c, malloc/arena.c) lays it out on x86-64:
//!
//! - Arenas: `main_arena` in libc's data, each thread arena's `struct
//!   malloc_state` right after the `heap_info` of its first heap; all on one
//!   ring through `next`.
//! - Heaps: the main arena's chunks run from `mp_.sbrk_base` (the start of
//!   `[heap]`) to the end of its top chunk. A thread arena's top lies in its
//!   newest heap (64 MiB-aligned, `heap_info` first); older heaps hang off
//!   `heap_info.prev` and end in fenceposts (chunks smaller than MINSIZE).
//! - A chunk is in use when the next chunk's PREV_INUSE bit says so, which
//!   also holds for free chunks kept in fastbins and tcaches: those are found
//!   by following the lists, whose `next` pointers are mangled
//!   (safe-linking: stored as `(address of the field >> 12) ^ pointer`).
//! - Each thread's `tcache_perthread_struct` is a chunk of its arena (glibc
//!   allocates it itself): recognised by its shape, its lists checked to
//!   their ends.
//! - Blocks glibc mmapped one by one sit in anonymous mappings of their own,
//!   each chunk headed by `prev_size 0, size | IS_MMAPPED`.

use memgap_trace::records::Mapping;
use memgap_types::glibc_walk::{WalkedArena, WalkedHeap};

use crate::remote_memory::Memory;

/// `struct malloc_state` (glibc 2.36, x86-64).
pub const STATE_SIZE: u64 = 2200;
const FASTBINS: u64 = 16;
const NFASTBINS: u64 = 10;
const TOP: u64 = 96;
const NEXT: u64 = 2160;
const SYSTEM_MEM: u64 = 2184;
/// `heap_info`: ar_ptr, prev, size, mprotect_size, pagesize, pad.
pub const HEAP_INFO_SIZE: u64 = 48;
const HEAP_INFO_PREV: u64 = 8;
const HEAP_INFO_SIZE_FIELD: u64 = 16;
/// HEAP_MAX_SIZE: thread arena heaps are this large and aligned to it.
pub const HEAP_MAX: u64 = 64 << 20;
/// `struct malloc_par` (`mp_`): sbrk_base.
pub const MP_SBRK_BASE: u64 = 96;
const PREV_INUSE: u64 = 1;
const IS_MMAPPED: u64 = 2;
const SIZE_BITS: u64 = 7;
const MINSIZE: u64 = 32;
const ALIGN: u64 = 16;
/// `tcache_perthread_struct`: 64 u16 counts then 64 pointers, in a chunk of 0x290 bytes.
const TCACHE_BINS: usize = 64;
const TCACHE_STRUCT: usize = 640;
const TCACHE_CHUNK: u64 = 0x290;
/// Arenas at most on the ring (glibc makes 8 per core at most).
const MAX_ARENAS: usize = 4096;
/// Chunks followed at most on one free list.
const MAX_LIST: u64 = 1 << 24;
/// Bytes read at a time while walking chunks.
const WINDOW: u64 = 256 << 10;

/// What the walk needs to know besides memory.
pub struct WalkInput<'a> {
    pub main_arena: u64,
    /// `mp_.sbrk_base`, when known (debug info); else `[heap]`'s start.
    pub sbrk_base: Option<u64>,
    /// The key glibc writes into tcache entries, when known.
    pub tcache_key: Option<u64>,
    pub mappings: &'a [Mapping],
    pub page_size: u64,
    /// Whether the page at an address is resident (pages that are not are
    /// not read, so the walk faults nothing in).
    pub resident: &'a dyn Fn(u64) -> bool,
}

/// Why a walk failed: the state is not glibc's as expected, or it changed
/// under the walk (then another try may succeed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkError(pub String);

impl std::fmt::Display for WalkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn fail<T>(text: String) -> Result<T, WalkError> {
    Err(WalkError(text))
}

/// A chunk seen on the way through a heap.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    at: u64,
    size: u64,
    in_use: bool,
}

/// Reads a region in windows, so a walk over many small chunks reads each
/// byte once and one over large chunks reads only their headers' pages.
struct Windowed<'m> {
    memory: &'m dyn Memory,
    start: u64,
    bytes: Vec<u8>,
}

impl Windowed<'_> {
    fn word(&mut self, address: u64, limit: u64, input: &WalkInput) -> Option<u64> {
        if address < self.start || address + 8 > self.start + self.bytes.len() as u64 {
            let page = input.page_size;
            let start = address & !(page - 1);
            let mut end = start + page;
            // Whole resident pages onwards, up to the window and the heap's end.
            let stop = (start + WINDOW).min(limit.next_multiple_of(page)).max(end);
            while end < stop && (input.resident)(end) {
                end += page;
            }
            self.bytes.resize((end - start) as usize, 0);
            if !self.memory.read(start, &mut self.bytes) {
                self.bytes.clear();
                return self.memory.word(address);
            }
            self.start = start;
        }
        let at = (address - self.start) as usize;
        Some(u64::from_le_bytes(self.bytes[at..at + 8].try_into().unwrap()))
    }
}

fn chunksize(word: u64) -> u64 {
    word & !SIZE_BITS
}

/// The pointer a safe-linked `next` field at `field` holds.
pub fn reveal(field: u64, stored: u64) -> u64 {
    (field >> 12) ^ stored
}

/// The first chunk of a thread arena's heap at `heap` (its malloc_state,
/// in the arena's first heap, comes first).
fn first_chunk(heap: u64, state: u64) -> u64 {
    let mut at = if state >= heap && state < heap + HEAP_MAX { state + STATE_SIZE } else { heap + HEAP_INFO_SIZE };
    let misalign = (at + 2 * 8) % ALIGN;
    if misalign > 0 {
        at += ALIGN - misalign;
    }
    at
}

/// Where a glibc heap lies: the arenas on the ring (their `malloc_state`
/// as read), each one's heaps, and the blocks glibc mmapped one by one. A
/// few words per arena and heap, and the first words of each anonymous
/// mapping: quick to read while the process is stopped, after which
/// everything else the walk reads lies in [`Layout::heaps`].
#[derive(Default)]
pub struct Layout {
    arenas: Vec<ArenaLayout>,
    /// (block address, usable bytes) of each chunk glibc mmapped for one block.
    mmapped: Vec<(u64, u64)>,
}

struct ArenaLayout {
    at: u64,
    state: Vec<u8>,
    main: bool,
    top: u64,
    top_size: u64,
    /// (heap start, first chunk, end, holds the top), oldest first.
    heaps: Vec<(u64, u64, u64, bool)>,
}

impl Layout {
    /// The memory the walk reads besides what the layout holds: every
    /// heap, from its start (a thread arena's `heap_info` and state) to its
    /// end (the top chunk's, or an older heap's fenceposts).
    pub fn heaps(&self) -> Vec<(u64, u64)> {
        self.arenas.iter().flat_map(|a| a.heaps.iter().map(|&(start, _, end, _)| (start, end))).collect()
    }
}

fn field(state: &[u8], offset: u64) -> u64 {
    u64::from_le_bytes(state[offset as usize..offset as usize + 8].try_into().unwrap())
}

/// Reads where the heap lies (see [`Layout`]).
pub fn layout(memory: &dyn Memory, input: &WalkInput) -> Result<Layout, WalkError> {
    let read_state = |at: u64| -> Result<Vec<u8>, WalkError> {
        let mut bytes = vec![0u8; STATE_SIZE as usize];
        if memory.read(at, &mut bytes) { Ok(bytes) } else { fail(format!("cannot read the malloc_state at {at:#x}")) }
    };
    // The ring of arenas.
    let mut arenas = Vec::new();
    let mut at = input.main_arena;
    loop {
        if arenas.len() >= MAX_ARENAS || at == 0 || arenas.iter().any(|a: &(u64, Vec<u8>)| a.0 == at) {
            return fail(format!("the arena list from {:#x} does not come back to main_arena", input.main_arena));
        }
        let state = read_state(at)?;
        let next = field(&state, NEXT);
        arenas.push((at, state));
        if next == input.main_arena {
            break;
        }
        at = next;
    }
    let brk_heap = input.mappings.iter().find(|m| m.name == "[heap]");
    let mut laid_out = Vec::new();
    for (index, (state_at, state)) in arenas.into_iter().enumerate() {
        let main = index == 0;
        let top = field(&state, TOP);
        let top_word = memory.word(top + 8).ok_or_else(|| WalkError(format!("cannot read the top chunk at {top:#x}")))?;
        let top_size = chunksize(top_word);
        let mut heaps: Vec<(u64, u64, u64, bool)> = Vec::new();
        if main {
            let Some(brk) = brk_heap else { return fail("no [heap] mapping: the main arena is not in the brk heap".into()) };
            if !(brk.start <= top && top < brk.end) {
                return fail(format!("main_arena's top {top:#x} lies outside [heap]"));
            }
            let base = input.sbrk_base.unwrap_or(brk.start);
            let misalign = (base + 16) % ALIGN;
            let first = if misalign > 0 { base + ALIGN - misalign } else { base };
            heaps.push((brk.start, first, top + top_size, true));
        } else {
            let mut heap = top & !(HEAP_MAX - 1);
            let mut holds_top = true;
            loop {
                let owner = memory.word(heap).ok_or_else(|| WalkError(format!("cannot read the heap_info at {heap:#x}")))?;
                if owner != state_at {
                    return fail(format!("the heap at {heap:#x} belongs to {owner:#x}, not to the arena at {state_at:#x}"));
                }
                let size = memory.word(heap + HEAP_INFO_SIZE_FIELD).unwrap_or(0);
                if size > HEAP_MAX {
                    return fail(format!("the heap at {heap:#x} claims {size} bytes"));
                }
                let end = if holds_top { top + top_size } else { heap + size };
                heaps.push((heap, first_chunk(heap, state_at), end, holds_top));
                let previous = memory.word(heap + HEAP_INFO_PREV).unwrap_or(0);
                if previous == 0 {
                    break;
                }
                if heaps.len() > (1 << 16) || heaps.iter().any(|h| h.0 == previous) || !previous.is_multiple_of(HEAP_MAX) {
                    return fail(format!("the heap list of the arena at {state_at:#x} does not end"));
                }
                heap = previous;
                holds_top = false;
            }
            heaps.reverse();
        }
        laid_out.push(ArenaLayout { at: state_at, state, main, top, top_size, heaps });
    }
    let heap_ranges: Vec<(u64, u64)> = laid_out.iter().flat_map(|a| a.heaps.iter().map(|&(s, _, e, _)| (s, e))).collect();
    Ok(Layout { mmapped: mmapped_blocks(memory, input, &heap_ranges), arenas: laid_out })
}

/// Blocks glibc mmapped for themselves, in the anonymous mappings that are not heaps.
fn mmapped_blocks(memory: &dyn Memory, input: &WalkInput, heap_ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut blocks = Vec::new();
    for mapping in input.mappings.iter().filter(|m| m.is_private_writable_anonymous() && m.name != "[heap]") {
        if heap_ranges.iter().any(|&(s, e)| s < mapping.end && mapping.start < e) || !(input.resident)(mapping.start) {
            continue;
        }
        let mut at = mapping.start;
        while at + 16 <= mapping.end {
            let (Some(prev_size), Some(word)) = (memory.word(at), memory.word(at + 8)) else { break };
            let size = chunksize(word);
            if prev_size != 0
                || word & SIZE_BITS != IS_MMAPPED
                || size < input.page_size
                || !size.is_multiple_of(input.page_size)
                || at + size > mapping.end
            {
                break;
            }
            blocks.push((at + 16, size - 16));
            at += size;
            if !(input.resident)(at) {
                break;
            }
        }
    }
    blocks
}

/// Walks glibc's malloc state from the heaps `layout` found, in `memory` as
/// it was when the layout was read: the arenas, chunks and bin counts of a
/// [`WalkedHeap`]; the caller adds the rest (libc, snapshot, how long the
/// process was stopped).
pub fn walk_laid_out(memory: &dyn Memory, input: &WalkInput, layout: &Layout) -> Result<WalkedHeap, WalkError> {
    let mut walk = WalkedHeap::default();
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut fastbin: Vec<u64> = Vec::new();
    for arena in &layout.arenas {
        let mut walked = WalkedArena {
            state: arena.at,
            main: arena.main,
            top: arena.top,
            top_size: arena.top_size,
            system_bytes: field(&arena.state, SYSTEM_MEM),
            heaps: Vec::new(),
        };
        for &(start, first, end, holds_top) in &arena.heaps {
            walk_heap(memory, input, first, end, holds_top.then_some(arena.top), &mut chunks)?;
            walked.heaps.push((start, end));
        }
        // Fastbins: chunk sizes 32, 48… in bin order.
        for bin in 0..NFASTBINS {
            let mut chunk = field(&arena.state, FASTBINS + bin * 8);
            let mut steps = 0;
            while chunk != 0 && steps < MAX_LIST && chunk.is_multiple_of(ALIGN) {
                let Some(word) = memory.word(chunk + 8) else { break };
                if chunksize(word) != (bin + 2) * 16 {
                    break;
                }
                fastbin.push(chunk);
                let Some(stored) = memory.word(chunk + 16) else { break };
                chunk = reveal(chunk + 16, stored);
                steps += 1;
            }
        }
        walk.arenas.push(walked);
    }
    chunks.sort_unstable_by_key(|c| c.at);
    fastbin.sort_unstable();
    fastbin.dedup();
    // The threads' tcaches: their own chunks, and the free chunks listed.
    let in_use_at = |addr: u64| chunks.binary_search_by_key(&addr, |c| c.at).ok().map(|i| chunks[i]).filter(|c| c.in_use);
    let heap_firsts: Vec<u64> = walk
        .arenas
        .iter()
        .flat_map(|a| {
            a.heaps.iter().map(move |&(start, _)| if a.main { input.sbrk_base.unwrap_or(start) } else { first_chunk(start, a.state) })
        })
        .collect();
    let mut tcache_structs: Vec<u64> = Vec::new();
    let mut tcache: Vec<(u64, u64)> = Vec::new();
    let mut key = input.tcache_key;
    for candidate in chunks.iter().filter(|c| c.in_use && c.size == TCACHE_CHUNK) {
        if let Some(entries) = tcache_lists(memory, candidate.at, &in_use_at, &mut key) {
            // An empty one looks like any zeroed block: only the chunk a
            // thread's first malloc made (a heap's first) is taken for one.
            if !entries.is_empty() || heap_firsts.contains(&candidate.at) {
                tcache_structs.push(candidate.at);
                tcache.extend(entries);
            }
        }
    }
    tcache.sort_unstable();
    tcache.dedup();
    walk.tcaches = tcache_structs.len() as u64;
    for chunk in &chunks {
        let free_listed = fastbin.binary_search(&chunk.at).is_ok();
        let cached = tcache.binary_search_by_key(&(chunk.at + 16), |&(a, _)| a).is_ok();
        if !chunk.in_use {
            walk.binned_chunks += 1;
            walk.binned_bytes += chunk.size;
        } else if free_listed {
            walk.fastbin_chunks += 1;
            walk.fastbin_bytes += chunk.size;
        } else if !cached && !tcache_structs.contains(&chunk.at) {
            walk.blocks.push((chunk.at + 16, chunk.size - 8));
        }
    }
    walk.tcache = tcache;
    walk.mmapped_chunks = layout.mmapped.len() as u64;
    walk.blocks.extend_from_slice(&layout.mmapped);
    walk.blocks.sort_unstable();
    Ok(walk)
}

/// Walks one heap's chunks from `first` to `end` (the top's end, or the
/// fenceposts of an older heap).
fn walk_heap(
    memory: &dyn Memory,
    input: &WalkInput,
    first: u64,
    end: u64,
    top: Option<u64>,
    chunks: &mut Vec<Chunk>,
) -> Result<(), WalkError> {
    let mut window = Windowed { memory, start: 0, bytes: Vec::new() };
    let mut at = first;
    let mut previous: Option<(u64, u64)> = None;
    loop {
        let word = window.word(at + 8, end, input).ok_or_else(|| WalkError(format!("cannot read the chunk at {at:#x}")))?;
        if let Some((p, size)) = previous {
            chunks.push(Chunk { at: p, size, in_use: word & PREV_INUSE != 0 });
        }
        let size = chunksize(word);
        if Some(at) == top {
            return Ok(());
        }
        if size < MINSIZE {
            // An older heap ends in fenceposts; a heap with its top never does.
            if top.is_none() && size.is_multiple_of(ALIGN) {
                return Ok(());
            }
            return fail(format!("a chunk of {size} bytes at {at:#x}: the heap changed under the walk or is corrupt"));
        }
        if !size.is_multiple_of(ALIGN) || at + size > end {
            return fail(format!("the chunk at {at:#x} ({size} bytes) runs past its heap's end {end:#x}"));
        }
        previous = Some((at, size));
        at += size;
        if at >= end {
            return if top.is_none() { Ok(()) } else { fail(format!("the walk passed the top chunk at {:#x}", top.unwrap_or(0))) };
        }
    }
}

/// The free chunks listed in the tcache whose chunk is at `chunk`, as
/// (block address, chunk size), if it is one: every count matches its
/// list, every listed chunk is an in-use-looking chunk of the bin's size
/// carrying the same key, and every list ends.
fn tcache_lists(
    memory: &dyn Memory,
    chunk: u64,
    in_use_at: &dyn Fn(u64) -> Option<Chunk>,
    key: &mut Option<u64>,
) -> Option<Vec<(u64, u64)>> {
    let mut bytes = [0u8; TCACHE_STRUCT];
    if !memory.read(chunk + 16, &mut bytes) {
        return None;
    }
    let count = |i: usize| u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u64;
    let entry = |i: usize| u64::from_le_bytes(bytes[128 + 8 * i..136 + 8 * i].try_into().unwrap());
    let mut listed = Vec::new();
    let mut seen_key = *key;
    for bin in 0..TCACHE_BINS {
        let (n, mut block) = (count(bin), entry(bin));
        if (n == 0) != (block == 0) {
            return None;
        }
        let size = MINSIZE + 16 * bin as u64;
        for _ in 0..n {
            if block % ALIGN != 0 || in_use_at(block - 16).is_none_or(|c| c.size != size) {
                return None;
            }
            let entry_key = memory.word(block + 8)?;
            match seen_key {
                Some(k) if k != entry_key => return None,
                _ => seen_key = Some(entry_key),
            }
            listed.push((block, size));
            block = reveal(block, memory.word(block)?);
        }
        if block != 0 {
            return None;
        }
    }
    *key = seen_key;
    Some(listed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote_memory::FakeMemory;

    const PAGE: u64 = 4096;
    const BINS: u64 = 112;
    const NBINS: u64 = 128;
    const LIBC_DATA: u64 = 0x7f00_1000_0000;
    const BRK: u64 = 0x5555_0000_0000;

    fn mapping(start: u64, end: u64, name: &str) -> Mapping {
        Mapping { start, end, perms: "rw-p".into(), name: name.into(), ..Mapping::default() }
    }

    /// A main arena in "libc's data" and a brk heap laid out as glibc would.
    struct Heap {
        memory: FakeMemory,
        at: u64,
    }

    impl Heap {
        fn new() -> Heap {
            let mut memory = FakeMemory::default();
            memory.regions.push((LIBC_DATA, vec![0; 4 * PAGE as usize]));
            memory.regions.push((BRK, vec![0; 64 * PAGE as usize]));
            let state = LIBC_DATA;
            memory.put_word(state + NEXT, state);
            // Every bin empty: pointing to itself.
            for bin in 1..NBINS {
                let own = state + BINS + (bin - 1) * 16 - 16;
                memory.put_word(state + BINS + (bin - 1) * 16, own);
                memory.put_word(state + BINS + (bin - 1) * 16 + 8, own);
            }
            Heap { memory, at: BRK }
        }

        /// Lays a chunk of `size` bytes next; `previous_in_use` is its P bit.
        fn chunk(&mut self, size: u64, previous_in_use: bool) -> u64 {
            let at = self.at;
            self.memory.put_word(at + 8, size | u64::from(previous_in_use));
            self.at += size;
            at
        }

        fn top(&mut self, previous_in_use: bool) {
            let size = BRK + 64 * PAGE - self.at;
            let top = self.chunk(size, previous_in_use);
            self.memory.put_word(LIBC_DATA + TOP, top);
        }

        fn walk(&self) -> Result<WalkedHeap, WalkError> {
            let mappings = [mapping(BRK, BRK + 64 * PAGE, "[heap]")];
            let resident = |_: u64| true;
            let input = WalkInput {
                main_arena: LIBC_DATA,
                sbrk_base: None,
                tcache_key: None,
                mappings: &mappings,
                page_size: PAGE,
                resident: &resident,
            };
            walk_laid_out(&self.memory, &input, &layout(&self.memory, &input)?)
        }
    }

    #[test]
    fn in_use_and_binned_chunks_of_the_main_arena() {
        let mut heap = Heap::new();
        let a = heap.chunk(0x100, true);
        let b = heap.chunk(0x200, true);
        // c is followed by a chunk whose P bit is clear: c is free (binned).
        let c = heap.chunk(0x400, true);
        let d = heap.chunk(0x40, false);
        heap.top(true);
        let walk = heap.walk().unwrap();
        assert_eq!(walk.blocks, vec![(a + 16, 0x100 - 8), (b + 16, 0x200 - 8), (d + 16, 0x40 - 8)]);
        assert_eq!((walk.binned_chunks, walk.binned_bytes), (1, 0x400));
        assert_eq!(walk.arenas.len(), 1);
        assert_eq!(walk.arenas[0].heaps, vec![(BRK, BRK + 64 * PAGE)]);
        assert!(!walk.blocks.iter().any(|&(addr, _)| addr == c + 16));
    }

    #[test]
    fn fastbin_and_tcache_chunks_are_free() {
        let mut heap = Heap::new();
        let tcache = heap.chunk(TCACHE_CHUNK, true);
        let fast1 = heap.chunk(0x20, true);
        let fast2 = heap.chunk(0x20, true);
        let cached = heap.chunk(0x30, true);
        let live = heap.chunk(0x30, true);
        heap.top(true);
        // fastbin 0 (32-byte chunks): fast2 -> fast1, safe-linked.
        heap.memory.put_word(LIBC_DATA + FASTBINS, fast2);
        heap.memory.put_word(fast2 + 16, ((fast2 + 16) >> 12) ^ fast1);
        heap.memory.put_word(fast1 + 16, (fast1 + 16) >> 12);
        // tcache bin 1 (48-byte chunks): one chunk, with the key.
        let block = cached + 16;
        heap.memory.put_word(tcache + 16, 1 << 16);
        heap.memory.put_word(tcache + 16 + 128 + 8, block);
        heap.memory.put_word(block, block >> 12);
        heap.memory.put_word(block + 8, 0xfeed_f00d);
        let walk = heap.walk().unwrap();
        assert_eq!(walk.blocks, vec![(live + 16, 0x28)]);
        assert_eq!(walk.tcache, vec![(block, 0x30)]);
        assert_eq!((walk.fastbin_chunks, walk.tcaches), (2, 1));
    }

    #[test]
    fn a_tcache_whose_list_does_not_end_is_a_block() {
        let mut heap = Heap::new();
        let looks_like = heap.chunk(TCACHE_CHUNK, true);
        let other = heap.chunk(0x30, true);
        heap.top(true);
        heap.memory.put_word(looks_like + 16, 1 << 16);
        heap.memory.put_word(looks_like + 16 + 128 + 8, other + 16);
        // Its next reveals to a non-null pointer: count and list disagree.
        heap.memory.put_word(other + 16, 0x1234_5670);
        let walk = heap.walk().unwrap();
        assert_eq!(walk.tcaches, 0);
        assert_eq!(walk.blocks.len(), 2);
    }

    #[test]
    fn a_chunk_running_past_the_heap_fails_the_walk() {
        let mut heap = Heap::new();
        heap.chunk(0x100, true);
        heap.chunk(128 * PAGE, true);
        heap.memory.put_word(LIBC_DATA + TOP, BRK + 32 * PAGE);
        heap.memory.put_word(BRK + 32 * PAGE + 8, (32 * PAGE) | 1);
        let error = heap.walk().unwrap_err();
        assert!(error.0.contains("runs past"), "{error}");
    }

    #[test]
    fn an_arena_ring_that_does_not_close_fails() {
        let mut heap = Heap::new();
        heap.chunk(0x100, true);
        heap.top(true);
        heap.memory.put_word(LIBC_DATA + NEXT, LIBC_DATA + PAGE);
        heap.memory.put_word(LIBC_DATA + PAGE + NEXT, LIBC_DATA + PAGE);
        assert!(heap.walk().unwrap_err().0.contains("does not come back"));
    }

    #[test]
    fn reveal_undoes_safe_linking() {
        let field = 0x5555_5555_9000u64;
        let target = 0x5555_5555_a2c0u64;
        assert_eq!(reveal(field, (field >> 12) ^ target), target);
        assert_eq!(reveal(field, field >> 12), 0);
    }

    #[test]
    fn a_thread_arenas_first_chunk_follows_its_state() {
        let heap = 0x7f00_0000_0000u64;
        assert_eq!(first_chunk(heap, heap + HEAP_INFO_SIZE), heap + 2256);
        assert_eq!(first_chunk(heap + HEAP_MAX, heap + HEAP_INFO_SIZE), heap + HEAP_MAX + HEAP_INFO_SIZE);
    }
}
