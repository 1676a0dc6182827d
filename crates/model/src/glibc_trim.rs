//! What glibc's `malloc_trim(0)` would give back now, page by page, as
//! glibc 2.36 (malloc/malloc.c, malloc/arena.c) does it:
//!
//! - `mtrim` first consolidates the fastbins (`malloc_consolidate`): every
//!   free chunk merges with its free neighbours, and a chunk next to an
//!   arena's top merges into that top. Chunks in a thread's tcache are in
//!   use as far as the arena knows: they merge with nothing.
//! - It then `madvise(MADV_DONTNEED)`s, in every arena, the whole pages of
//!   each binned free chunk from `chunk + sizeof(struct malloc_chunk)` on.
//! - Only the main arena's top is given back (`systrim`: the brk heap shrinks
//!   to `top + MINSIZE + 1`, rounded up to a page). A thread arena's top is
//!   not trimmed; its heaps shrink (`heap_trim`/`shrink_heap`) only when a
//!   free makes their top large, which the snapshot's residency already shows.
//! - An arena that outgrew one 64 MiB heap continues in a new one; the old
//!   heap's tail became an ordinary free chunk ended by fenceposts, so it is
//!   trimmed like any binned chunk.
//!
//! The model knows the live blocks; it also follows each thread's tcache
//! (up to 7 chunks per size class of at most 1040 bytes), and which heaps
//! form one arena (a thread's first block lands in its arena; an arena's
//! newest heap holds its top). After the program's own `malloc_trim`, the
//! pages the next snapshot still shows resident in what the model calls
//! trimmable are pages glibc would not return: they stay untrimmable until a
//! block on them is freed again.
//!
//! Not modelled: chunks `_int_malloc` moves from a bin into the tcache
//! ("stashing"), and thread exits (glibc then frees the thread's tcache).

use crate::extents::{BlockExtent, Extents};
use memgap_replay::{Block, Change, ThreadEvent};
use rustc_hash::{FxHashMap, FxHashSet};

/// The size word in front of a glibc block belongs to it.
pub(crate) const GLIBC_HEADER: u64 = 8;

/// glibc keeps each thread arena heap in a 64 MiB-aligned reservation (HEAP_MAX_SIZE).
pub(crate) const HEAP_ALIGN_SHIFT: u32 = 26;
/// `sizeof(struct malloc_chunk)`: mtrim keeps a free chunk's first 48 bytes.
const MALLOC_CHUNK_SIZE: u64 = 48;
/// systrim keeps `MINSIZE + 1` bytes of the main arena's top.
const TOP_KEPT: u64 = 32 + 1;
/// The fenceposts that end an arena's earlier heap take at least MINSIZE.
const FENCEPOSTS: u64 = 32;
/// Block extents run from a block's size word (8 bytes before it) to 8
/// bytes into the next chunk: chunk boundaries are 8 bytes before them.
const EXTENT_TO_CHUNK: u64 = 8;
/// tcache: 64 bins of chunk sizes 32..=1040 in 16-byte steps, 7 chunks each.
const TCACHE_BINS: u64 = 64;
const TCACHE_FILL_COUNT: u8 = 7;
const MINSIZE: u64 = 32;

/// Where a heap mapping sits in glibc's arenas: what its trailing free space is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapRole {
    /// The brk heap: its top is trimmed (systrim).
    MainArena,
    /// A thread arena's newest heap (or a mapping the model cannot place):
    /// its trailing free space is the arena's top, which stays.
    ArenaTop,
    /// An arena's earlier heap: its free tail is a binned chunk.
    EarlierHeap,
}

/// Address ranges malloc_trim(0) would release from one heap mapping, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrimRanges {
    ranges: Vec<(u64, u64)>,
}

impl TrimRanges {
    /// No page comes back (another allocator, or memory glibc does not own).
    pub fn none() -> TrimRanges {
        TrimRanges::default()
    }

    /// Whether the whole page `[start, start + page)` would be released.
    pub fn covers(&self, start: u64, page: u64) -> bool {
        let i = self.ranges.partition_point(|&(s, _)| s <= start);
        i > 0 && start + page <= self.ranges[i - 1].1
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }
}

/// The ranges malloc_trim(0) releases from the heap `[start, end)` whose
/// in-use chunk extents (`[chunk + 8, next chunk + 8)`, sorted by start, may
/// overlap) are `in_use`.
pub fn trim_ranges(role: HeapRole, start: u64, end: u64, in_use: impl IntoIterator<Item = (u64, u64)>, page: u64) -> TrimRanges {
    let mut ranges = Vec::new();
    let mut push = |from: u64, to: u64| {
        let (from, to) = (from.next_multiple_of(page), to - to % page);
        if to > from {
            ranges.push((from, to));
        }
    };
    // The heap's first chunk follows its header (heap_info and, in an
    // arena's first heap, the malloc_state): within the first page.
    let mut free_from = start;
    for (extent_start, extent_end) in in_use {
        let chunk = extent_start.saturating_sub(EXTENT_TO_CHUNK).max(start);
        if chunk >= end {
            break;
        }
        if chunk > free_from {
            push(free_from + MALLOC_CHUNK_SIZE, chunk);
        }
        free_from = free_from.max(extent_end.saturating_sub(EXTENT_TO_CHUNK));
    }
    if free_from < end {
        match role {
            HeapRole::MainArena => push(free_from + TOP_KEPT, end),
            HeapRole::EarlierHeap => push(free_from + MALLOC_CHUNK_SIZE, end.saturating_sub(FENCEPOSTS)),
            HeapRole::ArenaTop => {}
        }
    }
    TrimRanges { ranges }
}

/// What replay keeps for the forecast: each thread's tcache, which thread
/// started each 64 MiB heap, and what the program's last malloc_trim left.
#[derive(Debug, Default)]
pub struct GlibcTrimModel {
    /// tcache chunks by block address: (thread, chunk size).
    tcache_chunks: FxHashMap<u64, (u32, u64)>,
    /// Chunks per tcache bin, by thread slot: an array lookup per free,
    /// where a hash map of (thread, bin) was a large share of a replay's time.
    tcache_counts: Vec<[u8; TCACHE_BINS as usize]>,
    /// Each thread's slot in `tcache_counts`, and the last thread looked up.
    thread_slots: FxHashMap<u32, u32>,
    last_thread: Option<(u32, u32)>,
    /// How many tcache chunks have their address in each of these buckets:
    /// an allocation looks its address up only when its bucket holds one.
    tcache_filter: Vec<u16>,
    /// Per 64 MiB slot that received a block: (order of first block, thread).
    heap_births: FxHashMap<u64, (u64, u32)>,
    births: u64,
    /// Slots known to be in `heap_births` (slot + 1), direct-mapped.
    recent_slots: [u64; 8],
    /// Per thread, the slot of its first block: its arena.
    home_slots: FxHashMap<u32, u64>,
    /// Threads seen whose first block is still to come.
    homeless: FxHashSet<u32>,
    /// Pages the program's last malloc_trim left resident where the model
    /// says trim would release them.
    untrimmable_pages: ByteRanges,
    /// A malloc_trim call was recorded: the next snapshot shows what it left.
    trim_pending: bool,
    /// VmRSS before and after that call.
    trim_rss: (u64, u64),
    /// Pages freed since that call (they were not the trim's to return).
    freed_since_trim: ByteRanges,
}

impl GlibcTrimModel {
    /// A thread the agent saw: its first block tells its arena.
    pub fn thread_started(&mut self, thread: u32) {
        // A fork child's forking thread goes on in the parent's arena.
        if !self.home_slots.contains_key(&thread) {
            self.homeless.insert(thread);
        }
    }

    /// The program called malloc_trim; VmRSS was `rss_before` and `rss_after` around it.
    pub fn trim_called(&mut self, rss_before: u64, rss_after: u64) {
        self.trim_pending = true;
        self.trim_rss = (rss_before, rss_after);
        self.freed_since_trim = ByteRanges::default();
    }

    /// Follows one heap event of a glibc program (`change`: what it did to the live set).
    #[inline]
    pub fn observe(&mut self, event: &ThreadEvent, change: Change) {
        let thread = event.thread;
        match change {
            Change::None => {}
            Change::Allocated(block) => self.allocated(thread, event.event.addr, &block),
            Change::Freed(block) => self.freed(thread, freed_addr(event), &block),
            Change::Reallocated { old, new } => {
                let (addr, old_addr) = (event.event.addr, event.event.old_addr);
                self.allocated(thread, addr, &new);
                if addr != old_addr {
                    // _int_realloc copies and frees the old chunk through _int_free.
                    self.freed(thread, old_addr, &old);
                } else if let (Some(old_size), Some(new_size)) = (chunk_size(&old), chunk_size(&new))
                    && old_size >= new_size + MINSIZE
                {
                    // Shrunk in place: the remainder chunk is freed.
                    let remainder = addr + new_size;
                    self.put_in_tcache(thread, remainder, old_size - new_size);
                    self.note_freed(remainder - EXTENT_TO_CHUNK, remainder + old_size - new_size - EXTENT_TO_CHUNK);
                }
            }
        }
    }

    #[inline]
    fn allocated(&mut self, thread: u32, addr: u64, block: &Block) {
        if !self.tcache_filter.is_empty()
            && self.tcache_filter[filter_bucket(addr)] > 0
            && let Some((owner, size)) = self.tcache_chunks.remove(&addr)
        {
            self.tcache_filter[filter_bucket(addr)] -= 1;
            if let Some(&slot) = self.thread_slots.get(&owner) {
                let count = &mut self.tcache_counts[slot as usize][tcache_bin(size)];
                *count = count.saturating_sub(1);
            }
        }
        // A chunk glibc mmapped for itself says nothing of the arenas.
        if chunk_size(block).is_none() {
            return;
        }
        let slot = addr >> HEAP_ALIGN_SHIFT;
        let recent = &mut self.recent_slots[slot as usize % 8];
        if *recent != slot + 1 {
            *recent = slot + 1;
            let births = &mut self.births;
            self.heap_births.entry(slot).or_insert_with(|| {
                *births += 1;
                (*births, thread)
            });
        }
        if !self.homeless.is_empty() && self.homeless.remove(&thread) {
            self.home_slots.insert(thread, slot);
        }
    }

    #[inline]
    fn freed(&mut self, thread: u32, addr: u64, block: &Block) {
        if let Some(size) = chunk_size(block) {
            self.put_in_tcache(thread, addr, size);
        }
        self.note_freed(addr - EXTENT_TO_CHUNK, addr + block.usable());
    }

    /// `_int_free` puts a chunk of at most 1040 bytes in the freeing
    /// thread's tcache while its bin holds fewer than 7.
    #[inline]
    fn put_in_tcache(&mut self, thread: u32, addr: u64, size: u64) {
        if size < MINSIZE || (size - MINSIZE) / 16 >= TCACHE_BINS {
            return;
        }
        let Some(slot) = self.thread_slot(thread) else { return };
        let count = &mut self.tcache_counts[slot][tcache_bin(size)];
        if *count < TCACHE_FILL_COUNT && self.tcache_chunks.insert(addr, (thread, size)).is_none() {
            *count += 1;
            if self.tcache_filter.is_empty() {
                self.tcache_filter = vec![0; FILTER_BUCKETS];
            }
            self.tcache_filter[filter_bucket(addr)] += 1;
        }
    }

    /// The thread's slot in `tcache_counts`; none past [`MODELLED_THREADS`].
    #[inline]
    fn thread_slot(&mut self, thread: u32) -> Option<usize> {
        if let Some((last, slot)) = self.last_thread
            && last == thread
        {
            return Some(slot as usize);
        }
        let slot = match self.thread_slots.get(&thread) {
            Some(&slot) => slot,
            None if self.tcache_counts.len() < MODELLED_THREADS => {
                self.tcache_counts.push([0; TCACHE_BINS as usize]);
                let slot = (self.tcache_counts.len() - 1) as u32;
                self.thread_slots.insert(thread, slot);
                slot
            }
            None => return None,
        };
        self.last_thread = Some((thread, slot));
        Some(slot as usize)
    }

    #[inline]
    fn note_freed(&mut self, start: u64, end: u64) {
        if self.untrimmable_pages.is_empty() && !self.trim_pending {
            return;
        }
        // Pages are 4 KiB or larger: 4 KiB granules cover them all.
        let (start, end) = (start & !4095, end.saturating_add(4095) & !4095);
        self.untrimmable_pages.remove(start, end);
        if self.trim_pending {
            self.freed_since_trim.insert(start, end);
        }
    }

    /// An arena whose heaps a walk of glibc's state found (their starts,
    /// oldest first): the newest holds its top. `arena` names it as a
    /// thread would.
    pub fn walked_arena(&mut self, heaps: &[u64], arena: u32) {
        for &start in heaps {
            let slot = start >> HEAP_ALIGN_SHIFT;
            self.births += 1;
            self.heap_births.insert(slot, (self.births, arena));
        }
        if let Some(&first) = heaps.first() {
            self.home_slots.insert(arena, first >> HEAP_ALIGN_SHIFT);
        }
        self.recent_slots = [0; 8];
    }

    /// A chunk a walk found in some thread's tcache: block address and chunk size.
    pub fn walked_tcache_chunk(&mut self, addr: u64, size: u64) {
        self.tcache_chunks.insert(addr, (0, size));
    }

    /// The chunks in some thread's tcache, as block extents sorted by
    /// start, leaving out any a live block overlaps (the model lost track).
    pub fn tcache_extents(&self, live: Extents) -> Vec<BlockExtent> {
        let mut extents: Vec<BlockExtent> = self
            .tcache_chunks
            .iter()
            .map(|(&addr, &(_, size))| BlockExtent::spanning(addr - EXTENT_TO_CHUNK, addr - 2 * EXTENT_TO_CHUNK + size + EXTENT_TO_CHUNK))
            .collect();
        extents.sort_unstable_by_key(|e| (e.start, e.end));
        extents.retain(|chunk| {
            let i = live.partition_point(|b| b.end <= chunk.start);
            i == live.len() || live.get(i).start >= chunk.end
        });
        extents
    }

    /// The role of each 64 MiB-aligned heap among `arena_starts` (the
    /// snapshot's thread arena heaps): the newest heap of each arena holds
    /// its top.
    pub fn arena_roles(&mut self, arena_starts: &[u64]) -> FxHashMap<u64, HeapRole> {
        let slots: FxHashSet<u64> = arena_starts.iter().map(|&s| s >> HEAP_ALIGN_SHIFT).collect();
        // A heap no longer mapped is gone (heap_trim unmaps whole heaps): a
        // heap mapped there later is a new one.
        let before = self.heap_births.len();
        self.heap_births.retain(|slot, _| slots.contains(slot));
        if self.heap_births.len() != before {
            self.recent_slots = [0; 8];
        }
        let root = |slot: u64| {
            let mut slot = slot;
            for _ in 0..16 {
                let Some(&(_, thread)) = self.heap_births.get(&slot) else { break };
                match self.home_slots.get(&thread) {
                    Some(&home)
                        if home != slot
                            && self.heap_births.contains_key(&home)
                            && self.heap_births[&home].0 < self.heap_births[&slot].0 =>
                    {
                        slot = home
                    }
                    _ => break,
                }
            }
            slot
        };
        let mut newest: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
        for &slot in &slots {
            let Some(&(born, _)) = self.heap_births.get(&slot) else { continue };
            let entry = newest.entry(root(slot)).or_insert((born, slot));
            if born > entry.0 {
                *entry = (born, slot);
            }
        }
        arena_starts
            .iter()
            .map(|&start| {
                let slot = start >> HEAP_ALIGN_SHIFT;
                let role = match self.heap_births.get(&slot) {
                    Some(_) if newest.get(&root(slot)).is_some_and(|&(_, top)| top != slot) => HeapRole::EarlierHeap,
                    _ => HeapRole::ArenaTop,
                };
                (start, role)
            })
            .collect()
    }

    /// Whether the page at `start` is one the program's last malloc_trim left.
    pub fn left_by_last_trim(&self, start: u64) -> bool {
        !self.untrimmable_pages.is_empty() && self.untrimmable_pages.contains(start)
    }

    /// Where the pages the last malloc_trim left start and end within `[start, end)`.
    pub fn left_by_last_trim_edges(&self, start: u64, end: u64) -> Vec<u64> {
        self.untrimmable_pages.ranges.range(..end).rev().take_while(|&(_, &e)| e > start).flat_map(|(&s, &e)| [s, e]).collect()
    }

    /// Whether a malloc_trim call waits for the snapshot that shows what it left.
    pub fn trim_pending(&self) -> bool {
        self.trim_pending
    }

    /// Whether a snapshot at `rss` shows the pending trim done. The trim's
    /// record is read before snapshots the events hold back, so the one the
    /// program took just before its trim can come after it: a trim that
    /// returned memory is behind a snapshot nearer its VmRSS after than before.
    pub fn trim_shown_by(&self, rss: u64) -> bool {
        let (before, after) = self.trim_rss;
        before <= after + (1 << 20) || rss < before / 2 + after / 2
    }

    /// After a malloc_trim call: `resident_trimmable` are the address
    /// ranges (whole pages) the model calls trimmable that are still
    /// resident. Those not freed since the call are what glibc would not return.
    pub fn trim_seen(&mut self, resident_trimmable: impl IntoIterator<Item = (u64, u64)>) {
        self.untrimmable_pages = ByteRanges::default();
        for (start, end) in resident_trimmable {
            for (from, to) in self.freed_since_trim.gaps(start, end) {
                self.untrimmable_pages.insert(from, to);
            }
        }
        self.trim_pending = false;
        self.freed_since_trim = ByteRanges::default();
    }
}

/// The block a free or realloc(p, 0) released.
fn freed_addr(event: &ThreadEvent) -> u64 {
    if event.event.addr == 0 { event.event.old_addr } else { event.event.addr }
}

/// A glibc chunk's size from its block's usable bytes (`chunksize - 8`),
/// when that is a chunk size at all.
fn chunk_size(block: &Block) -> Option<u64> {
    let size = block.usable() + EXTENT_TO_CHUNK;
    (block.usable() > 0 && size >= MINSIZE && size.is_multiple_of(16)).then_some(size)
}

fn tcache_bin(chunk_size: u64) -> usize {
    ((chunk_size - MINSIZE) / 16) as usize
}

const FILTER_BUCKETS: usize = 1 << 16;
/// Threads whose tcache is followed (64 bytes each), so that a program
/// starting threads by the million costs bounded memory here.
const MODELLED_THREADS: usize = 1 << 16;

fn filter_bucket(addr: u64) -> usize {
    (addr >> 4) as usize % FILTER_BUCKETS
}

/// Disjoint address ranges, merged where they touch: pages marked by range
/// in one step, however many a (corrupt) block claims.
#[derive(Debug, Default)]
struct ByteRanges {
    /// start -> end.
    ranges: std::collections::BTreeMap<u64, u64>,
}

impl ByteRanges {
    fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    fn contains(&self, addr: u64) -> bool {
        self.ranges.range(..=addr).next_back().is_some_and(|(_, &end)| end > addr)
    }

    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        let touching: Vec<(u64, u64)> = self.ranges.range(..=end).rev().take_while(|&(_, &e)| e >= start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in touching {
            self.ranges.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
    }

    fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let cut: Vec<(u64, u64)> = self.ranges.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in cut {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, start);
            }
            if e > end {
                self.ranges.insert(end, e);
            }
        }
    }

    /// The parts of `[start, end)` no range covers.
    fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        let first = self.ranges.range(..=start).next_back().map_or(start, |(&s, _)| s);
        for (&s, &e) in self.ranges.range(first..end) {
            if s > at {
                out.push((at, s.min(end)));
            }
            at = at.max(e);
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
        out
    }
}

/// What malloc_trim(0) would release from each heap mapping of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct TrimForecast {
    /// By mapping start.
    heaps: FxHashMap<u64, TrimRanges>,
}

impl TrimForecast {
    /// Whether the page at `page_start` of the mapping at `mapping_start` would be released.
    pub fn releases(&self, mapping_start: u64, page_start: u64, page: u64) -> bool {
        self.heaps.get(&mapping_start).is_some_and(|ranges| ranges.covers(page_start, page))
    }

    /// The ranges released from the mapping at `mapping_start`.
    pub fn ranges_of(&self, mapping_start: u64) -> &[(u64, u64)] {
        self.heaps.get(&mapping_start).map_or(&[], |ranges| ranges.ranges())
    }
}

/// The 64 MiB-aligned heaps of `mapping` where `extents` start and end: a
/// heap inside one chunk releases nothing, the heaps where chunks start and
/// end are the ones that can.
fn edge_heaps(extents: Extents, mapping: &memgap_trace::records::Mapping) -> impl Iterator<Item = u64> {
    extents
        .within(mapping.start, mapping.end)
        .iter()
        .flat_map(|e| [e.start.max(mapping.start) >> HEAP_ALIGN_SHIFT, e.end.saturating_sub(1).min(mapping.end - 1) >> HEAP_ALIGN_SHIFT])
}

/// Two lists of extents sorted by start, as one list so sorted.
fn merged<'a>(a: Extents<'a>, b: Extents<'a>) -> impl Iterator<Item = (u64, u64)> + 'a {
    let spans = |extents: Extents<'a>| extents.iter().map(|e| (e.start, e.end)).peekable();
    let (mut a, mut b) = (spans(a), spans(b));
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x > y => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

/// The forecast for a glibc program's snapshot. `live` are the live blocks'
/// extents (`[block − 8, block + usable)`) sorted by start; `countable`
/// says which mappings are classified page by page.
pub fn forecast(
    model: &mut GlibcTrimModel,
    snapshot: &memgap_trace::records::Snapshot,
    live: Extents,
    page: u64,
    countable: impl Fn(&memgap_trace::records::Mapping) -> bool,
) -> TrimForecast {
    let mappings = &snapshot.mappings;
    const HEAP_MAX: u64 = 1 << HEAP_ALIGN_SHIFT;
    let heap_mappings: Vec<&memgap_trace::records::Mapping> =
        mappings.iter().filter(|m| m.is_private_writable_anonymous() && countable(m)).collect();
    let tcache = model.tcache_extents(live);
    let tcache = Extents::made(&tcache);
    // An arena's heaps (64 MiB-aligned) mapped next to each other show up as
    // one mapping: each is a heap of its own. Only heaps holding chunks or
    // born of a thread's block can release anything (the others are arena
    // tops with nothing below): those are the heaps looked at, so that a
    // huge mapping costs no more than its chunks.
    let mut births: Vec<u64> = model.heap_births.keys().copied().collect();
    births.sort_unstable();
    let mut heaps: Vec<(&memgap_trace::records::Mapping, u64, u64)> = Vec::new();
    for &mapping in &heap_mappings {
        if mapping.name == "[heap]" || mapping.start % HEAP_MAX != 0 {
            heaps.push((mapping, mapping.start, mapping.end));
            continue;
        }
        let (first_slot, end_slot) = (mapping.start >> HEAP_ALIGN_SHIFT, mapping.end.div_ceil(HEAP_MAX));
        let born = &births[births.partition_point(|&slot| slot < first_slot)..births.partition_point(|&slot| slot < end_slot)];
        let mut slots: Vec<u64> = born.iter().copied().chain(edge_heaps(live, mapping)).chain(edge_heaps(tcache, mapping)).collect();
        slots.sort_unstable();
        slots.dedup();
        for slot in slots {
            let start = slot << HEAP_ALIGN_SHIFT;
            heaps.push((mapping, start, (start + HEAP_MAX).min(mapping.end)));
        }
    }
    let arena_starts: Vec<u64> =
        heaps.iter().filter(|(m, start, _)| m.name != "[heap]" && start % HEAP_MAX == 0).map(|&(_, start, _)| start).collect();
    let roles = model.arena_roles(&arena_starts);
    let mut forecast = TrimForecast::default();
    for &(mapping, start, end) in &heaps {
        let role = if mapping.name == "[heap]" { HeapRole::MainArena } else { roles.get(&start).copied().unwrap_or(HeapRole::ArenaTop) };
        let (live_here, tcache_here) = (live.within(start, end), tcache.within(start, end));
        if live_here.is_empty() && tcache_here.is_empty() && role == HeapRole::ArenaTop {
            continue;
        }
        let ranges = trim_ranges(role, start, end, merged(live_here, tcache_here), page).ranges;
        forecast.heaps.entry(mapping.start).or_default().ranges.extend(ranges);
    }
    if model.trim_pending() && model.trim_shown_by(snapshot.rss.vm_rss) {
        // Run by run of resident pages: a huge free range costs no more
        // than the residency the snapshot holds for it.
        let mut left = Vec::new();
        for &mapping in &heap_mappings {
            let Some(ranges) = forecast.heaps.get(&mapping.start) else { continue };
            for &(start, end) in ranges.ranges() {
                let pages = (start - mapping.start) / page..(end - mapping.start) / page;
                left.extend(
                    mapping
                        .residency
                        .resident_runs(pages)
                        .into_iter()
                        .map(|run| (mapping.start + run.start * page, mapping.start + run.end * page)),
                );
            }
        }
        model.trim_seen(left);
    }
    forecast
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::{Event, EventKind};

    const PAGE: u64 = 4096;
    const ARENA: u64 = 0x7f00_0000_0000;

    /// A block extent of a chunk of `size` bytes at `chunk`.
    fn chunk(chunk: u64, size: u64) -> (u64, u64) {
        (chunk + 8, chunk + size + 8)
    }

    fn event(thread: u32, kind: EventKind, addr: u64, size: u64) -> ThreadEvent {
        // glibc: usable = chunk size - 8.
        let usable = (size + 8).max(32).next_multiple_of(16) - 8;
        ThreadEvent { thread, tid: thread, event: Event { kind: Some(kind), addr, size, usable, ..Event::default() } }
    }

    fn block(size: u64) -> Block {
        let usable = (size + 8).max(32).next_multiple_of(16) - 8;
        Block { size, slack: (usable - size) as u32, ..Block::default() }
    }

    #[test]
    fn binned_chunks_give_their_whole_pages_from_the_48th_byte_on() {
        // In use: a chunk at the start, one at 40 KiB; free between them.
        let in_use = [chunk(ARENA, 0x1000 - 16), chunk(ARENA + 40 * PAGE, 64)];
        let ranges = trim_ranges(HeapRole::ArenaTop, ARENA, ARENA + 64 * PAGE, in_use, PAGE);
        // The free chunk starts at 0x1000 - 16 + 0... = ARENA + 0xff0: its
        // first 48 bytes reach into page 1, so pages 2..40 come back.
        assert_eq!(ranges.ranges(), &[(ARENA + 2 * PAGE, ARENA + 40 * PAGE)]);
        // A thread arena's top (after the last chunk) stays.
        assert!(!ranges.covers(ARENA + 50 * PAGE, PAGE));
    }

    #[test]
    fn only_the_main_arena_top_is_trimmed_and_an_earlier_heap_tail_is_binned() {
        let in_use = [chunk(ARENA + 16, 64)];
        let top = |role| trim_ranges(role, ARENA, ARENA + 64 * PAGE, in_use, PAGE);
        // systrim keeps MINSIZE + 1 bytes of the top: page 1 on comes back.
        assert_eq!(top(HeapRole::MainArena).ranges(), &[(ARENA + PAGE, ARENA + 64 * PAGE)]);
        assert_eq!(top(HeapRole::ArenaTop).ranges(), &[]);
        // The fenceposts sit in the last page.
        assert_eq!(top(HeapRole::EarlierHeap).ranges(), &[(ARENA + PAGE, ARENA + 63 * PAGE)]);
    }

    #[test]
    fn a_tcache_chunk_keeps_free_space_from_merging_into_the_top() {
        let mut model = GlibcTrimModel::default();
        let blocks: Vec<u64> = (0..64).map(|i| ARENA + 0x1000 + i * 1024).collect();
        for &addr in &blocks {
            model.observe(&event(1, EventKind::Malloc, addr, 1000), Change::Allocated(block(1000)));
        }
        // Freed from the top down: the first seven freed (the highest) stay in
        // thread 1's tcache, the rest are free chunks below them.
        for &addr in blocks.iter().rev() {
            model.observe(&event(1, EventKind::Free, addr, 0), Change::Freed(block(1000)));
        }
        let tcache = model.tcache_extents(Extents::default());
        assert_eq!(tcache.len(), 7);
        assert_eq!(tcache[0].start, blocks[57] - 8);
        let ranges = trim_ranges(HeapRole::ArenaTop, ARENA, ARENA + 64 * PAGE, tcache.iter().map(|e| (e.start, e.end)), PAGE);
        // Free from the arena's first chunk to blocks[57]'s chunk: 57 KiB.
        assert_eq!(ranges.ranges(), &[(ARENA + PAGE, (blocks[57] - 16) & !(PAGE - 1))]);
        // Allocating a tcache chunk again takes it out.
        model.observe(&event(1, EventKind::Malloc, blocks[57], 1000), Change::Allocated(block(1000)));
        assert_eq!(model.tcache_extents(Extents::default()).len(), 6);
        // A chunk larger than 1040 bytes never goes to the tcache.
        model.observe(&event(1, EventKind::Free, ARENA + 0x100000, 0), Change::Freed(block(2000)));
        assert_eq!(model.tcache_extents(Extents::default()).len(), 6);
    }

    #[test]
    fn an_arenas_newest_heap_holds_its_top() {
        let mut model = GlibcTrimModel::default();
        let heap = |i: u64| ARENA + (8 - i) * (64 << 20);
        model.thread_started(2);
        // Thread 2's first block is mmapped (a big array): not its arena.
        let mut big = block(1 << 20);
        big.slack = 4096 - 16 - ((1 << 20) % 4096) as u32;
        model.observe(&event(2, EventKind::Malloc, 0x7e00_0000_0010, 1 << 20), Change::Allocated(big));
        for i in 0..3 {
            model.observe(&event(2, EventKind::Malloc, heap(i) + 0x1000, 100), Change::Allocated(block(100)));
        }
        // Thread 3 has an arena of its own, in one heap.
        model.thread_started(3);
        model.observe(&event(3, EventKind::Malloc, heap(5) + 0x1000, 100), Change::Allocated(block(100)));
        let roles = model.arena_roles(&[heap(0), heap(1), heap(2), heap(5)]);
        assert_eq!(roles[&heap(0)], HeapRole::EarlierHeap);
        assert_eq!(roles[&heap(1)], HeapRole::EarlierHeap);
        assert_eq!(roles[&heap(2)], HeapRole::ArenaTop);
        assert_eq!(roles[&heap(5)], HeapRole::ArenaTop);
    }

    #[test]
    fn what_a_recorded_trim_left_stays_until_freed_again() {
        let mut model = GlibcTrimModel::default();
        model.trim_called(100 << 20, 50 << 20);
        assert!(model.trim_pending());
        // A snapshot at VmRSS before the trim does not show it.
        assert!(!model.trim_shown_by(99 << 20));
        assert!(model.trim_shown_by(51 << 20));
        // Freed after the call: not the trim's to return.
        model.observe(&event(1, EventKind::Free, ARENA + 5 * PAGE + 16, 0), Change::Freed(block(5000)));
        model.trim_seen([(ARENA + 2 * PAGE, ARENA + 3 * PAGE), (ARENA + 5 * PAGE, ARENA + 6 * PAGE)]);
        assert!(!model.trim_pending());
        assert!(model.left_by_last_trim(ARENA + 2 * PAGE));
        assert!(!model.left_by_last_trim(ARENA + 5 * PAGE));
        // A block freed there again makes the page trimmable again.
        model.observe(&event(1, EventKind::Free, ARENA + 2 * PAGE + 16, 0), Change::Freed(block(100)));
        assert!(!model.left_by_last_trim(ARENA + 2 * PAGE));
    }

    /// A (corrupt) block of 2^50 bytes freed after a trim is marked in one
    /// range, not page by page; what the trim left is kept as ranges too.
    #[test]
    fn a_huge_block_freed_after_a_trim_is_one_range() {
        let mut model = GlibcTrimModel::default();
        model.trim_called(100 << 20, 50 << 20);
        let mut huge = block(1000);
        huge.size = 1 << 50;
        huge.slack = 0;
        model.observe(&event(1, EventKind::Free, ARENA + 16, 0), Change::Freed(huge));
        model.observe(&event(1, EventKind::Free, ARENA - 64 * PAGE + 16, 0), Change::Freed(block(100)));
        assert_eq!(model.freed_since_trim.ranges.len(), 2);
        // Resident and trimmable: 2^40 bytes below the arena, and over it.
        model.trim_seen([(ARENA - (1 << 40), ARENA), (ARENA + PAGE, ARENA + (1 << 52))]);
        assert_eq!(model.untrimmable_pages.ranges.len(), 3, "{:x?}", model.untrimmable_pages.ranges);
        assert!(model.left_by_last_trim(ARENA - PAGE) && model.left_by_last_trim(ARENA - 65 * PAGE));
        assert!(!model.left_by_last_trim(ARENA - 64 * PAGE) && !model.left_by_last_trim(ARENA + PAGE));
        model.observe(&event(1, EventKind::Free, ARENA - (1 << 39), 0), Change::Freed(huge));
        assert_eq!(model.untrimmable_pages.ranges.len(), 2, "the block ends below the third range");
        assert!(!model.left_by_last_trim(ARENA - 65 * PAGE) && model.left_by_last_trim(ARENA - (1 << 39) - 2 * PAGE));
    }

    #[test]
    fn byte_ranges_merge_cut_and_give_their_gaps() {
        let mut ranges = ByteRanges::default();
        ranges.insert(10, 20);
        ranges.insert(30, 40);
        ranges.insert(20, 25);
        assert_eq!(ranges.ranges.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(), vec![(10, 25), (30, 40)]);
        assert_eq!(ranges.gaps(0, 50), vec![(0, 10), (25, 30), (40, 50)]);
        assert_eq!(ranges.gaps(12, 35), vec![(25, 30)]);
        ranges.remove(15, 35);
        assert_eq!(ranges.ranges.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(), vec![(10, 15), (35, 40)]);
        assert!(ranges.contains(14) && !ranges.contains(15) && ranges.contains(35) && !ranges.contains(40));
    }
}
