//! Accounting: the ledger of a snapshot, every resident byte of the process
//! in exactly one row.
//!
//! At a snapshot, each mapping is accounted from its own figures: file-backed
//! and shared mappings by their smaps Rss (other), stacks as runtime, and each
//! private anonymous mapping page by page from its residency bitmap: pages of
//! memgap's own buffers and of the program's own mmaps are "other"; pages of
//! the allocator hold live bytes (live + slack + fragmented) or none
//! (retained, of which smaps LazyFree is moved to lazy_free). The rows are
//! then checked against VmRSS read at the same instant: the residual.

use memgap_trace::records::{Mapping, Residency, Snapshot};

use crate::extents::{BlockExtent, Extents};
use crate::glibc_trim::TrimForecast;
use crate::heap_state::HeapState;
use crate::ledger::{
    Finding, HeapKind, HeapLedger, HeapOwner, Ledger, ListedBlock, MallocLayout, MappingClass, MappingLedger, OtherBreakdown, OwnerShare,
    PageClass, PageMap, PageObjects, Remedy, Rows, SizeBucket, StackShare, reason_name,
};
use crate::owners::malloc::UNKNOWN_MALLOC;
use crate::page_walks::{PageWalks, plausible_page_size};

/// Blocks listed over all page maps of one ledger: about 8 bytes each in the
/// report, so a 1 GiB heap lists 4 per page and a 16 GiB heap none.
const LISTED_BLOCKS: u64 = 1 << 20;
/// Blocks listed per page at most.
const LISTED_PER_PAGE: u64 = 8;

/// What to compute besides the rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Detail {
    /// Page classes per heap mapping, for the page map.
    pub pages: bool,
    /// Shares per call stack, for blame.
    pub stacks: bool,
    /// The blocks on each page of the page maps (with `pages`).
    pub objects: bool,
    /// The rows alone, which the gap needs: no trim forecast and no
    /// fragmentation shared by size or stack, whatever else is asked.
    pub rows_alone: bool,
}

impl Detail {
    pub(crate) const ROWS_ALONE: Detail = Detail { pages: false, stacks: false, objects: false, rows_alone: true };
}

/// How far `rows` lies outside VmRSS read before and after the snapshot
/// (`after` = `before` + `moved`): its pages are read in between, so any
/// sum between the two readings is consistent.
fn residual(after: u64, moved: i64, rows: u64) -> i64 {
    let before = (after as i64 - moved).max(0) as u64;
    let (low, high) = (before.min(after), before.max(after));
    if rows < low {
        (low - rows) as i64
    } else if rows > high {
        -((rows - high) as i64)
    } else {
        0
    }
}

/// How blocks sit in memory when no registered owner recognised the
/// program's malloc: no header, no trim.
struct UnknownMalloc;

impl MallocLayout for UnknownMalloc {}

/// The ledger of `snapshot`, given the heap as replayed up to its instant
/// and the heap owners as they have seen the trace so far.
pub fn compute(state: &mut HeapState, snapshot: &Snapshot, detail: Detail, owners: &mut [Box<dyn HeapOwner>]) -> Ledger {
    let walks = PageWalks::of(snapshot, plausible_page_size(snapshot.page_size), detail.pages);
    compute_walking(state, snapshot, detail, owners, walks, LiveBlocks::Replayed)
}

/// Where a ledger's live blocks come from.
#[derive(Clone, Copy)]
pub(crate) enum LiveBlocks<'a> {
    /// The live set replay built from the trace's events.
    Replayed,
    /// The in-use blocks a walk of the allocator's state found, by address:
    /// (block address, usable bytes). Millions of them go straight into the
    /// page walk, without the live set's table.
    Walked(&'a [(u64, u64)]),
}

/// [`compute`] of a heap whose live blocks a walk found rather than replay.
pub(crate) fn compute_walked(
    state: &mut HeapState,
    snapshot: &Snapshot,
    detail: Detail,
    owners: &mut [Box<dyn HeapOwner>],
    blocks: &[(u64, u64)],
) -> Ledger {
    let walks = PageWalks::of(snapshot, plausible_page_size(snapshot.page_size), detail.pages);
    compute_walking(state, snapshot, detail, owners, walks, LiveBlocks::Walked(blocks))
}

/// [`compute`], classifying one by one the pages `walks` says.
fn compute_walking(
    state: &mut HeapState,
    snapshot: &Snapshot,
    detail: Detail,
    owners: &mut [Box<dyn HeapOwner>],
    walks: PageWalks,
    live: LiveBlocks,
) -> Ledger {
    let page = plausible_page_size(snapshot.page_size);
    let mut ledger = empty_ledger(state, snapshot);
    let claimed = claim_owned_mappings(owners, snapshot, &mut ledger);
    let owners = &*owners;
    let malloc = MallocInUse::of(owners, state, live);
    let header = malloc.layout.block_header();
    let extents = match live {
        LiveBlocks::Replayed => {
            state.live.order_by_address();
            Extents::placed(state.live.in_address_order(), header)
        }
        LiveBlocks::Walked(blocks) => Extents::walked(blocks, header),
    };
    ledger.live_blocks = extents.len() as u64;
    // Which free pages the allocator's trim would release.
    let trim = if detail.rows_alone {
        TrimForecast::default()
    } else {
        malloc.layout.trim_forecast(&mut state.glibc_trim, snapshot, extents, page)
    };
    let state = &*state;
    let mut walked_copy = Vec::new();
    let blocks = extents.walked_once(&mut walked_copy);
    let mut agent_ranges = snapshot.agent_ranges.clone();
    agent_ranges.sort_unstable();
    let listed_per_page = if detail.pages && detail.objects {
        let heap_pages: u64 = walks.pages.iter().flatten().sum();
        (LISTED_BLOCKS / heap_pages.max(1)).min(LISTED_PER_PAGE)
    } else {
        0
    };
    let mut accounting = SnapshotAccounting {
        state,
        snapshot,
        detail,
        page,
        walks: &walks,
        malloc: &malloc,
        blocks,
        trim: &trim,
        agent_ranges: &agent_ranges,
        listed_per_page,
        buckets: Vec::new(),
        stacks: rustc_hash::FxHashMap::default(),
        lazy_outside_heap: 0,
        merged: HeapLedger { name: "other allocator mappings".into(), kind: HeapKind::Mappings, ..HeapLedger::default() },
    };
    let mut previous: Option<&Mapping> = None;
    for (index, mapping) in snapshot.mappings.iter().enumerate() {
        if claimed[index] {
            continue;
        }
        // The .bss of an ELF object: anonymous, right after its data segment.
        let bss_of = previous.filter(|p| p.inode != 0 && p.end == mapping.start && p.perms.starts_with("rw")).map(|p| p.name.as_str());
        previous = Some(mapping);
        accounting.account(&mut ledger, index, mapping, bss_of);
    }
    let SnapshotAccounting { mut buckets, mut stacks, lazy_outside_heap, merged, .. } = accounting;
    if merged.mappings > 0 {
        ledger.heaps.push(merged);
    }
    add_malloc_share(&mut ledger, &malloc);
    // MADV_FREE'd pages of mappings nobody owns: counted, but in no owner's share.
    ledger.unowned_lazy_free_bytes = lazy_outside_heap;
    ledger.arenas = malloc.layout.arenas(&ledger.heaps);
    buckets.retain(|b| b.blocks > 0);
    ledger.fragmentation_by_size = buckets;
    if detail.stacks {
        python_arenas_to_stacks(state, snapshot.time, page, &mut stacks);
    }
    ledger.by_stack = stacks.into_values().map(|(share, _)| share).collect();
    ledger.mappings.sort_by_key(|m| m.start);
    finish(&mut ledger, owners);
    ledger
}

/// A ledger of `snapshot` with its header filled in and no rows yet.
fn empty_ledger(state: &HeapState, snapshot: &Snapshot) -> Ledger {
    // A program allocating fast moves RSS while the snapshot is taken. The
    // anonymous mappings, most of the sum, are read last (mincore), right
    // before VmRSS is read again: compare the rows with that reading.
    Ledger {
        rss_bytes: if snapshot.vm_rss_after > 0 { snapshot.vm_rss_after } else { snapshot.rss.vm_rss },
        snapshot_reason: reason_name(snapshot.reason),
        allocator: state.allocator.clone(),
        snapshot_cost_ms: snapshot.cost_ns as f64 / 1e6,
        rss_moved_bytes: if snapshot.vm_rss_after > 0 && snapshot.rss.vm_rss > 0 {
            snapshot.vm_rss_after as i64 - snapshot.rss.vm_rss as i64
        } else {
            0
        },
        ..Ledger::default()
    }
}

/// Lets the owners that know their mappings take them first; which of the
/// snapshot's mappings they took.
fn claim_owned_mappings(owners: &mut [Box<dyn HeapOwner>], snapshot: &Snapshot, ledger: &mut Ledger) -> Vec<bool> {
    let mut claimed = vec![false; snapshot.mappings.len()];
    for owner in owners.iter_mut().filter(|o| o.present()) {
        for index in owner.claim(snapshot, ledger) {
            if let Some(taken) = claimed.get_mut(index) {
                *taken = true;
            }
        }
    }
    claimed
}

/// The malloc whose blocks the live set holds.
struct MallocInUse<'a> {
    name: &'static str,
    layout: &'a dyn MallocLayout,
    /// A trace with blocks or an allocator no owner recognised is still a malloc's.
    present: bool,
}

impl<'a> MallocInUse<'a> {
    fn of(owners: &'a [Box<dyn HeapOwner>], state: &HeapState, live: LiveBlocks) -> MallocInUse<'a> {
        let recognised = owners.iter().filter(|o| o.present()).find_map(|o| o.malloc_layout().map(|layout| (o.name(), layout)));
        let any_live = match live {
            LiveBlocks::Replayed => !state.live.is_empty(),
            LiveBlocks::Walked(blocks) => !blocks.is_empty(),
        };
        let present = recognised.is_some() || !state.allocator.is_empty() || any_live;
        let (name, layout) = recognised.unwrap_or((UNKNOWN_MALLOC, &UnknownMalloc));
        MallocInUse { name, layout, present }
    }
}

/// What every mapping of one snapshot is accounted against, and the sums
/// that run over all of them.
struct SnapshotAccounting<'a> {
    state: &'a HeapState,
    snapshot: &'a Snapshot,
    detail: Detail,
    page: u64,
    walks: &'a PageWalks,
    malloc: &'a MallocInUse<'a>,
    /// Live block extents in address order, not overlapping.
    blocks: Extents<'a>,
    trim: &'a TrimForecast,
    /// memgap's own ranges, sorted.
    agent_ranges: &'a [(u64, u64)],
    listed_per_page: u64,
    buckets: Vec<SizeBucket>,
    stacks: StackShares,
    /// MADV_FREE'd bytes counted outside the allocator's mappings.
    lazy_outside_heap: u64,
    /// The allocator mappings that are neither a brk heap nor an arena, as one.
    merged: HeapLedger,
}

impl SnapshotAccounting<'_> {
    /// Puts one mapping (not claimed by an owner) into the ledger.
    fn account(&mut self, ledger: &mut Ledger, index: usize, mapping: &Mapping, bss_of: Option<&str>) {
        let mut entry = MappingLedger::of(mapping);
        let is_stack = mapping.name == "[stack]" || self.state.stack_hints.iter().any(|&hint| hint >= mapping.start && hint < mapping.end);
        if is_stack && mapping.perms.starts_with("rw") {
            ledger.stacks_bytes += mapping.rss;
            entry.class = MappingClass::Stack;
        } else if let Some(walked_pages) = self.walks.pages[index] {
            entry.class = self.account_anonymous(ledger, mapping, walked_pages, bss_of);
            entry.resident_bytes = mapping.residency.resident_in(0..(mapping.end - mapping.start) / self.page) * self.page;
        } else {
            entry.class = whole_mapping_class(mapping, &mut ledger.other_breakdown);
        }
        ledger.mappings.push(entry);
    }

    /// A private anonymous mapping, page by page: an allocator's (its heap
    /// rows, its page map) or another's (memgap's, the program's own mmap,
    /// static data, unclassified). Returns its class.
    fn account_anonymous(&mut self, ledger: &mut Ledger, mapping: &Mapping, walked_pages: u64, bss_of: Option<&str>) -> MappingClass {
        let (page, layout, blocks) = (self.page, self.malloc.layout, self.blocks);
        let mapping_blocks = blocks.within(mapping.start, mapping.end);
        let allocator_owned = self.malloc.present
            && (mapping.name == "[heap]"
                || !mapping_blocks.is_empty()
                || (bss_of.is_none() && self.state.ever_held_blocks(mapping.start, mapping.end)));
        let mut heap = HeapLedger {
            name: heap_name(mapping, layout),
            kind: layout.heap_kind(mapping),
            start: mapping.start,
            end: mapping.end,
            mappings: 1,
            ..HeapLedger::default()
        };
        let before = ledger.other_breakdown;
        let mut classifier = PageClassifier {
            mapping,
            page,
            trim: self.trim,
            allocator_owned,
            agent_ranges: self.agent_ranges,
            state: self.state,
            heap: &mut heap,
            other: &mut ledger.other_breakdown,
            python_arenas: self.state.python_census(self.snapshot.time),
        };
        let (pages, taken) = account_pages(&mut classifier, mapping_blocks, walked_pages);
        if allocator_owned && !self.detail.rows_alone {
            let (buckets, stacks, by_stack) = (&mut self.buckets, &mut self.stacks, self.detail.stacks);
            share_fragmentation(mapping, mapping_blocks, page, &taken, |block, share| {
                add_to_size_bucket(buckets, block, &share);
                if by_stack {
                    add_to_stack(stacks, mapping, block, &share);
                }
            });
        }
        // MADV_FREE'd pages are still resident and counted: they hold no
        // blocks, so they sit among the retained pages.
        let lazy = mapping.lazy_free.min(heap.retained);
        heap.retained -= lazy;
        heap.lazy_free += lazy;
        heap.trimmable = heap.trimmable.min(heap.retained);
        let other = &mut ledger.other_breakdown;
        let class = anonymous_class(other, &before, bss_of);
        self.lazy_outside_heap += move_lazy_free_out_of_other(other, &before, mapping.lazy_free - lazy);
        if !allocator_owned {
            return class;
        }
        if self.detail.pages {
            let objects = self.detail.objects.then(|| page_objects(mapping, mapping_blocks, page, pages.len(), self.listed_per_page));
            ledger.page_maps.push(PageMap {
                name: heap.name.clone(),
                start: mapping.start,
                page_size: page,
                pages,
                nodes: Vec::new(),
                objects,
            });
        }
        if heap.kind == HeapKind::Mapping {
            self.merged.mappings += 1;
            add_heap(&mut self.merged, &heap);
        } else {
            ledger.heaps.push(heap);
        }
        MappingClass::Heap
    }
}

/// The class of a mapping counted whole, by its smaps figures, into the
/// part of `other` it belongs to.
fn whole_mapping_class(mapping: &Mapping, other: &mut OtherBreakdown) -> MappingClass {
    let (part, class) = if is_memgap_file(&mapping.name) {
        (&mut other.agent, MappingClass::Memgap)
    } else if mapping.perms.ends_with('s') {
        (&mut other.shmem, MappingClass::Shmem)
    } else if mapping.inode != 0 {
        (&mut other.file, MappingClass::File)
    } else {
        (&mut other.unclassified, MappingClass::Other)
    };
    *part += mapping.rss;
    class
}

/// The class of an anonymous mapping's pages no allocator holds, from what
/// its page walk added to `other` since `before`: the .bss of memgap's agent
/// or of another object (moved from unclassified), memgap's buffers, the
/// program's own mmaps, or unclassified.
fn anonymous_class(other: &mut OtherBreakdown, before: &OtherBreakdown, bss_of: Option<&str>) -> MappingClass {
    let unaccounted = other.unclassified - before.unclassified;
    match bss_of {
        Some(name) if name.ends_with("/libmemgap_agent.so") => {
            other.unclassified -= unaccounted;
            other.agent += unaccounted;
            MappingClass::Memgap
        }
        Some(_) => {
            other.unclassified -= unaccounted;
            other.static_data += unaccounted;
            MappingClass::StaticData
        }
        None if other.agent > before.agent => MappingClass::Memgap,
        None if other.program_mmap > before.program_mmap => MappingClass::ProgramMmap,
        None => MappingClass::Unclassified,
    }
}

/// MADV_FREE'd pages outside the allocator's mappings (a runtime's own
/// mmaps): out of whichever part of `other` they were counted in since
/// `before`. Returns the bytes moved (up to `lazy`).
fn move_lazy_free_out_of_other(other: &mut OtherBreakdown, before: &OtherBreakdown, mut lazy: u64) -> u64 {
    let mut moved_total = 0;
    for (part, was) in [(&mut other.program_mmap, before.program_mmap), (&mut other.unclassified, before.unclassified)] {
        let moved = lazy.min(*part - was);
        *part -= moved;
        lazy -= moved;
        moved_total += moved;
    }
    moved_total
}

/// One live block into the histogram of fragmentation by block size (powers of two).
fn add_to_size_bucket(buckets: &mut Vec<SizeBucket>, block: &BlockExtent, share: &BlockShare) {
    let bucket = 64 - block.size.max(1).leading_zeros() as usize;
    if buckets.len() <= bucket {
        buckets.resize_with(bucket + 1, SizeBucket::default);
    }
    let entry = &mut buckets[bucket];
    entry.min_size = if bucket == 0 { 0 } else { 1 << (bucket - 1) };
    entry.max_size = (1u64 << bucket) - 1;
    entry.blocks += 1;
    entry.live_bytes += share.resident_live;
    entry.fragmented_bytes += share.fragmentation.round() as u64;
}

/// One live block of `mapping` into its call stack's share.
fn add_to_stack(stacks: &mut StackShares, mapping: &Mapping, block: &BlockExtent, share: &BlockShare) {
    let (s, counted_up_to) = stacks.entry(block.stack).or_insert((StackShare { stack: block.stack, ..StackShare::default() }, None));
    s.objects += 1;
    s.live_bytes += share.resident_live;
    s.taken_bytes += block.end - block.start;
    s.fragmentation_bytes += share.fragmentation;
    // Blocks come in address order: count each page once per stack.
    let from = match *counted_up_to {
        Some((start, last)) if start == mapping.start => share.first_page.max(last + 1),
        _ => share.first_page,
    };
    s.pages += mapping.residency.resident_in(from..share.last_page + 1);
    *counted_up_to = Some((mapping.start, share.last_page.max(from.saturating_sub(1))));
}

/// The heaps' totals: the trim figures, and the malloc's share of the rows.
fn add_malloc_share(ledger: &mut Ledger, malloc: &MallocInUse) {
    let mut heap_total = HeapLedger::default();
    for heap in &ledger.heaps {
        add_heap(&mut heap_total, heap);
    }
    ledger.trim_would_return_bytes = heap_total.trimmable;
    ledger.retained_not_trimmable_bytes = heap_total.retained - heap_total.trimmable;
    if malloc.present {
        let rows = Rows {
            live: heap_total.live,
            slack: heap_total.slack,
            fragmented: heap_total.fragmented,
            retained: heap_total.retained,
            lazy_free: heap_total.lazy_free,
            ..Rows::default()
        };
        ledger.owners.insert(0, OwnerShare { owner: malloc.name, rows, released_bytes: heap_total.released, estimated: None });
    }
}

/// Per stack: its share, and the last page counted (mapping start, page index).
type StackShares = rustc_hash::FxHashMap<u32, (StackShare, Option<(u64, u64)>)>;

/// pymalloc's arenas, each to the call stack that made pymalloc map it (the
/// Python line whose objects needed a new arena): its allocated blocks as
/// live, its free blocks and empty pools as fragmentation. Objects are not
/// recorded one by one, so the arena is the finest grain; a program that
/// grows a structure fills the arenas it makes, and the survivors that keep
/// them resident are mostly its own.
fn python_arenas_to_stacks(state: &HeapState, snapshot_time: u64, page: u64, stacks: &mut StackShares) {
    let Some(census) = state.python_census(snapshot_time) else { return };
    for arena in &census.arena_rows {
        // Arenas without one (recorded with --no-stacks): with the blocks that have none.
        let stack = state.mapping_stack(arena.address).unwrap_or(memgap_trace::event::NO_STACK);
        let (share, _) = stacks.entry(stack).or_insert((StackShare { stack, ..StackShare::default() }, None));
        share.objects += arena.allocated_blocks;
        share.live_bytes += arena.live_bytes;
        share.fragmentation_bytes += arena.fragmented_bytes as f64;
        share.taken_bytes += arena.live_bytes + arena.slack_bytes;
        share.pages += arena.resident_bytes().div_ceil(page);
    }
}

/// Sums the owners' shares, thread stacks and `other` into the rows, checks
/// them against VmRSS, asks the owners for findings and remedies, and
/// names the owner holding the gap. Called again after an owner lays a layer over the ledger.
pub fn finish(ledger: &mut Ledger, owners: &[Box<dyn HeapOwner>]) {
    let other = &ledger.other_breakdown;
    let memgap = other.agent;
    let mut rows = Rows {
        lazy_free: ledger.unowned_lazy_free_bytes,
        runtime: ledger.stacks_bytes,
        other: other.file + other.shmem + other.program_mmap + other.agent + other.static_data + other.unclassified,
        ..Rows::default()
    };
    let mut released = 0;
    for share in &ledger.owners {
        rows.add(&share.rows);
        released += share.released_bytes;
    }
    ledger.rows = rows;
    ledger.memgap_bytes = memgap.min(rows.other);
    ledger.program_rss_bytes = ledger.rss_bytes.saturating_sub(ledger.memgap_bytes);
    ledger.released_bytes = released;
    ledger.residual_bytes = residual(ledger.rss_bytes, ledger.rss_moved_bytes, rows.total());
    let present: Vec<&dyn HeapOwner> = owners.iter().filter(|o| o.present()).map(|o| o.as_ref()).collect();
    let mut findings: Vec<Finding> = present.iter().flat_map(|o| o.findings(ledger)).collect();
    findings.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.kind.cmp(b.kind)));
    let mut remedies: Vec<Remedy> = present.iter().flat_map(|o| o.remedies(ledger, &findings)).collect();
    // Best first: most saved; on a tie, one that needs no change to the code.
    remedies.sort_by(|a, b| {
        b.expected_savings_bytes.cmp(&a.expected_savings_bytes).then(a.env.is_empty().cmp(&b.env.is_empty())).then(a.id.cmp(b.id))
    });
    if let Some(measured) = &ledger.measured_remedies {
        crate::ledger::measured::rank(&mut remedies, measured);
    }
    ledger.findings = findings;
    ledger.remedies = remedies;
    // Rows no owner holds (other, stacks) are the core's.
    ledger.gap_owner =
        ledger.owners.iter().filter(|s| s.gap() > 0 || s.rows.live > 0).max_by_key(|s| (s.gap(), s.rows.live)).map(|s| s.owner);
}

fn add_heap(total: &mut HeapLedger, heap: &HeapLedger) {
    total.live += heap.live;
    total.slack += heap.slack;
    total.fragmented += heap.fragmented;
    total.retained += heap.retained;
    total.lazy_free += heap.lazy_free;
    total.released += heap.released;
    total.trimmable += heap.trimmable;
}

fn heap_name(mapping: &Mapping, layout: &dyn MallocLayout) -> String {
    match layout.heap_kind(mapping) {
        HeapKind::BrkHeap => "main arena ([heap])".to_string(),
        HeapKind::Arena => format!("arena heap @{:#x}", mapping.start),
        _ => format!("mapping @{:#x}", mapping.start),
    }
}

fn overlap(a_start: u64, a_end: u64, b_start: u64, b_end: u64) -> u64 {
    a_end.min(b_end).saturating_sub(a_start.max(b_start))
}

fn in_ranges(ranges: &[(u64, u64)], addr: u64) -> bool {
    let i = ranges.partition_point(|&(start, _)| start <= addr);
    i > 0 && addr < ranges[i - 1].0 + ranges[i - 1].1
}

/// Classifies the first `walked` pages of one private anonymous mapping
/// one by one (the page map), and the rest run by run: pages between two
/// places where anything changes (a block's edge, memgap's or the
/// program's own range, a trim range) are alike, so the work is bounded by
/// what the snapshot and the live set hold, not by the pages a mapping claims.
fn account_pages(classify: &mut PageClassifier, blocks: Extents, walked: u64) -> (Vec<PageClass>, Vec<u32>) {
    let (mapping, page) = (classify.mapping, classify.page);
    let all_pages = (mapping.end - mapping.start) / page;
    let count = walked.min(all_pages) as usize;
    let (taken, requested) =
        if classify.allocator_owned { bytes_taken_per_page(mapping, blocks, page, count) } else { (Vec::new(), Vec::new()) };
    let mut classes = Vec::with_capacity(taken.len());
    for i in 0..count {
        let (taken, requested) = (taken.get(i).copied().unwrap_or(0), requested.get(i).copied().unwrap_or(0));
        let resident = mapping.residency.is_resident(i);
        if let Some(class) = classify.pages(mapping.start + i as u64 * page, 1, resident, u64::from(taken), u64::from(requested)) {
            classes.push(class);
        }
    }
    if (count as u64) < all_pages {
        account_pages_run_by_run(classify, blocks, count as u64);
    }
    (classes, taken)
}

/// Bytes of each of the first `count` pages of `mapping` taken by block
/// extents, and by requested bytes.
fn bytes_taken_per_page(mapping: &Mapping, blocks: Extents, page: u64, count: usize) -> (Vec<u32>, Vec<u32>) {
    let mut taken = vec![0u32; count];
    let mut requested = vec![0u32; count];
    for b in blocks.iter() {
        for (i, ps) in pages_of(mapping, &b, page, count) {
            taken[i] += overlap(b.start, b.end, ps, ps + page) as u32;
            requested[i] += overlap(b.addr(), b.requested_end(), ps, ps + page) as u32;
        }
    }
    (taken, requested)
}

/// The pages, among the first `count` of `mapping`, that extent `b` lies
/// on: (index, start). None for an extent outside the mapping, as blocks of
/// a corrupt trace may be.
fn pages_of(mapping: &Mapping, b: &BlockExtent, page: u64, count: usize) -> impl Iterator<Item = (usize, u64)> {
    let outside = b.end <= mapping.start || b.start >= mapping.end || b.end <= b.start;
    let (first, end) = match outside {
        true => (0, 0),
        false => (
            (b.start.max(mapping.start) - mapping.start) / page,
            ((b.end.min(mapping.end) - 1 - mapping.start) / page + 1).min(count as u64),
        ),
    };
    let start = mapping.start;
    (first..end).map(move |i| (i as usize, start + i * page))
}

/// The pages of the mapping from page `from` on, past the walked ones:
/// resident as a whole (claimed) or not at all. The pages holding an edge
/// (of a block, of memgap's or the program's own ranges, of a trim range)
/// are classified alone; the pages between two of them are alike.
fn account_pages_run_by_run(classify: &mut PageClassifier, blocks: Extents, from: u64) {
    let (mapping, page, agent_ranges, state) = (classify.mapping, classify.page, classify.agent_ranges, classify.state);
    let all_pages = (mapping.end - mapping.start) / page;
    let page_start = |i: u64| mapping.start + i * page;
    let resident = matches!(mapping.residency, Residency::All);
    let tail = page_start(from);
    // The pages holding an edge, each kept once as it comes: the blocks' edges
    // come in address order, so this holds at most a number per page rather
    // than four per block.
    let mut special: Vec<u64> = Vec::new();
    let mut edge = |at: u64| {
        if at >= tail && at < mapping.end {
            let index = (at - mapping.start) / page;
            if special.last() != Some(&index) {
                special.push(index);
            }
        }
    };
    let blocks_from = blocks.partition_point(|b| b.end <= tail);
    for b in blocks.from(blocks_from).iter() {
        [b.start, b.addr(), b.requested_end(), b.end].into_iter().for_each(&mut edge);
    }
    let agents_from = agent_ranges
        .partition_point(|&(start, len)| start.saturating_add(len) <= tail)
        .min(agent_ranges.partition_point(|&(start, _)| start < mapping.end));
    for &(start, len) in &agent_ranges[agents_from..] {
        [start, start.saturating_add(len)].into_iter().for_each(&mut edge);
    }
    for (start, end) in state.program_mappings_in(tail, mapping.end) {
        [start, end].into_iter().for_each(&mut edge);
    }
    for &(start, end) in classify.trim.ranges_of(mapping.start) {
        [start, end].into_iter().for_each(&mut edge);
    }
    state.glibc_trim.left_by_last_trim_edges(tail, mapping.end).into_iter().for_each(&mut edge);
    special.sort_unstable();
    special.dedup();
    let mut at = from;
    for next in special.into_iter().chain([all_pages]) {
        if next > at {
            let (taken, requested) = page_taken(blocks, page_start(at), page);
            classify.pages(page_start(at), next - at, resident, taken, requested);
        }
        if next < all_pages {
            let (taken, requested) = page_taken(blocks, page_start(next), page);
            classify.pages(page_start(next), 1, resident, taken, requested);
        }
        at = next + 1;
    }
}

/// Bytes of the page at `start` taken by block extents and by requested
/// bytes (`blocks` in address order, not overlapping).
fn page_taken(blocks: Extents, start: u64, page: u64) -> (u64, u64) {
    let end = start + page;
    let first = blocks.partition_point(|b| b.end <= start);
    blocks.from(first).iter().take_while(|b| b.start < end).fold((0, 0), |(taken, requested), b| {
        (taken + overlap(b.start, b.end, start, end), requested + overlap(b.addr(), b.requested_end(), start, end))
    })
}

/// Puts pages of one mapping into the rows.
struct PageClassifier<'a> {
    mapping: &'a Mapping,
    page: u64,
    trim: &'a TrimForecast,
    allocator_owned: bool,
    agent_ranges: &'a [(u64, u64)],
    state: &'a HeapState,
    heap: &'a mut HeapLedger,
    other: &'a mut OtherBreakdown,
    /// pymalloc at this snapshot, for its arenas' pages.
    python_arenas: Option<&'a memgap_source_python::Census>,
}

impl PageClassifier<'_> {
    /// Counts `n` alike pages from `ps` on, each `resident` or not, with
    /// `taken` and `requested` bytes of blocks; their class (None for pages
    /// of a mapping the allocator does not own that are no one's).
    fn pages(&mut self, ps: u64, n: u64, resident: bool, taken: u64, requested: u64) -> Option<PageClass> {
        let (page, bytes) = (self.page, n * self.page);
        let resident_bytes = if resident { bytes } else { 0 };
        let class = if in_ranges(self.agent_ranges, ps) {
            self.other.agent += resident_bytes;
            PageClass::Agent
        } else if self.state.program_mapping_at(ps).is_some() {
            // A pymalloc arena's pages count as program mmaps until the
            // python owner takes them from there; drawn as its.
            self.other.program_mmap += resident_bytes;
            match self.python_arenas.and_then(|census| census.arena_at(ps)) {
                Some(_) if !resident => PageClass::NotResident,
                Some(arena) => PageClass::Python { fill: arena.fill() },
                None => PageClass::ProgramMmap,
            }
        } else if !self.allocator_owned {
            self.other.unclassified += resident_bytes;
            return None;
        } else if !resident {
            self.heap.released += bytes;
            PageClass::NotResident
        } else if taken > 0 {
            let taken_bytes = taken.min(page);
            let requested_bytes = requested.min(taken_bytes);
            self.heap.live += n * requested_bytes;
            self.heap.slack += n * (taken_bytes - requested_bytes);
            self.heap.fragmented += n * (page - taken_bytes);
            PageClass::Used { fill: (taken_bytes * 255 / page) as u8 }
        } else {
            self.heap.retained += bytes;
            // Other allocators do not implement malloc_trim.
            let trimmable = self.trim.releases(self.mapping.start, ps, page) && !self.state.glibc_trim.left_by_last_trim(ps);
            if trimmable {
                self.heap.trimmable += bytes;
            }
            PageClass::Free { trimmable }
        };
        Some(class)
    }
}

/// The live blocks on the first `count` pages of `mapping` (`blocks` in
/// address order), listing at most `per_page` of them per page.
fn page_objects(mapping: &Mapping, blocks: Extents, page: u64, count: usize, per_page: u64) -> PageObjects {
    let mut objects = PageObjects { live_bytes: vec![0; count], blocks: vec![0; count], listed: Vec::new() };
    for b in blocks.iter() {
        for (at, ps) in pages_of(mapping, &b, page, count) {
            objects.blocks[at] += 1;
            objects.live_bytes[at] += overlap(b.addr(), b.requested_end(), ps, ps + page) as u32;
            if u64::from(objects.blocks[at]) <= per_page {
                objects.listed.push(ListedBlock { page: at as u32, addr: b.addr(), size: b.size, stack: b.stack });
            }
        }
    }
    // Blocks that do not overlap come out in page order; a corrupt trace's may not.
    if !objects.listed.is_sorted_by_key(|b| b.page) {
        objects.listed.sort_by_key(|b| b.page);
    }
    objects
}

/// Shares each used page's free bytes among its blocks by the bytes each
/// takes there; calls `visit` with each block and what it holds.
fn share_fragmentation(mapping: &Mapping, blocks: Extents, page: u64, taken: &[u32], mut visit: impl FnMut(&BlockExtent, BlockShare)) {
    // The bytes taken on an unwalked page, asked again by each of the
    // blocks on it as they come in address order: the last page's is kept.
    let mut last_taken: Option<(u64, u64)> = None;
    let mut taken_on = |i: u64| match last_taken {
        Some((page_index, bytes)) if page_index == i => bytes,
        _ => {
            let bytes = page_taken(blocks, mapping.start + i * page, page).0;
            last_taken = Some((i, bytes));
            bytes
        }
    };
    for b in blocks.iter() {
        // Blocks of a corrupt trace may lie outside the mapping: the pages
        // walked are the mapping's classified ones (the rest are not
        // resident), never more.
        if b.end <= mapping.start || b.start >= mapping.end || b.end <= b.start {
            continue;
        }
        let first = (b.start.max(mapping.start) - mapping.start) / page;
        let last = (b.end.min(mapping.end) - 1 - mapping.start) / page;
        let (mut fragmentation, mut resident_live) = (0.0, 0);
        let mut share_page = |i: u64, taken_here: u64| {
            let ps = mapping.start + i * page;
            let on_page = overlap(b.start, b.end, ps, ps + page) as f64;
            let taken_here = (taken_here as f64).min(page as f64);
            fragmentation += on_page / taken_here * (page as f64 - taken_here);
        };
        let walked = taken.len() as u64;
        for i in first..(last + 1).min(walked) {
            let ps = mapping.start + i * page;
            if !mapping.residency.is_resident(i as usize) {
                continue;
            }
            share_page(i, u64::from(taken[i as usize]));
            resident_live += overlap(b.addr(), b.requested_end(), ps, ps + page);
        }
        if last >= walked && matches!(mapping.residency, Residency::All) {
            // Pages past the walked ones, resident as a whole: only a
            // block's first and last page can hold others' bytes or free
            // space; its requested bytes there count whole.
            let from = first.max(walked);
            share_page(from, taken_on(from));
            if last != from {
                share_page(last, taken_on(last));
            }
            resident_live += overlap(b.addr(), b.requested_end(), mapping.start + from * page, mapping.start + (last + 1) * page);
        }
        visit(&b, BlockShare { fragmentation, resident_live, first_page: first, last_page: last });
    }
}

/// One live block's part of a snapshot's ledger.
struct BlockShare {
    /// Its share of the free bytes on the resident pages it occupies.
    fragmentation: f64,
    /// Its requested bytes on resident pages: its part of the live row.
    /// A block the program has not touched all of holds less than its size.
    resident_live: u64,
    first_page: u64,
    last_page: u64,
}

/// memgap's agent library, or the area it shares with the recorder
/// (`<run dir>/<pid>.<n>.area`): memgap's, not the program's.
fn is_memgap_file(name: &str) -> bool {
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    if name.ends_with("/libmemgap_agent.so") {
        return true;
    }
    let mut parts = name.rsplit('/');
    let (file, dir) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    file.ends_with(memgap_trace::shared::AREA_SUFFIX) && dir.starts_with("memgap-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_walks::{CLAIMED_PAGES_PER_SNAPSHOT, MAX_PAGES_PER_MAPPING, UNLISTED_PAGES_PER_SNAPSHOT};
    use memgap_replay::ThreadEvent;
    use memgap_trace::records::{Residency, Rss};
    use memgap_trace::{Event, EventKind};
    use proptest::prelude::Strategy as _;

    const PAGE: u64 = 4096;
    const HEAP: u64 = 0x5555_0000_0000;

    fn glibc() -> Vec<Box<dyn HeapOwner>> {
        let mut owners = crate::registry::registered();
        owners.iter_mut().for_each(|o| o.allocator("/lib/x86_64-linux-gnu/libc.so.6"));
        owners
    }

    fn state_with(blocks: &[(u64, u64)]) -> HeapState {
        let mut state = HeapState::default();
        state.allocator = "/lib/x86_64-linux-gnu/libc.so.6".into();
        for &(addr, size) in blocks {
            let usable = (size + 8).max(32).next_multiple_of(16) - 8;
            let event = Event { kind: Some(EventKind::Malloc), addr, size, usable, ..Event::default() };
            state.apply(&ThreadEvent { thread: 1, tid: 1, event });
        }
        state
    }

    fn snapshot(pages: u64, residency: Residency, rss: u64) -> Snapshot {
        Snapshot {
            page_size: PAGE,
            rss: Rss { vm_rss: rss, ..Rss::default() },
            mappings: vec![Mapping {
                start: HEAP,
                end: HEAP + pages * PAGE,
                perms: "rw-p".into(),
                name: "[heap]".into(),
                rss: pages * PAGE,
                residency,
                ..Mapping::default()
            }],
            ..Snapshot::default()
        }
    }

    #[test]
    fn page_objects_list_each_pages_blocks_and_spanning_blocks_on_every_page() {
        // A block over pages 0-2, then two small blocks on page 2.
        let blocks = [(HEAP + 16, 2 * PAGE + 100), (HEAP + 2 * PAGE + 200, 40), (HEAP + 2 * PAGE + 300, 50)];
        let ledger = compute(
            &mut state_with(&blocks),
            &snapshot(4, Residency::All, 4 * PAGE),
            Detail { pages: true, objects: true, ..Detail::default() },
            &mut glibc(),
        );
        let objects = ledger.page_maps[0].objects.as_ref().expect("objects asked for");
        assert_eq!(objects.blocks, vec![1, 1, 3, 0]);
        assert_eq!(objects.live_bytes, vec![(PAGE - 16) as u32, PAGE as u32, (16 + 100 + 40 + 50) as u32, 0]);
        let listed: Vec<(u32, u64)> = objects.listed.iter().map(|b| (b.page, b.addr)).collect();
        assert_eq!(listed, vec![(0, HEAP + 16), (1, HEAP + 16), (2, HEAP + 16), (2, HEAP + 2 * PAGE + 200), (2, HEAP + 2 * PAGE + 300)]);
        let plain = compute(
            &mut state_with(&blocks),
            &snapshot(4, Residency::All, 4 * PAGE),
            Detail { pages: true, ..Detail::default() },
            &mut glibc(),
        );
        assert!(plain.page_maps[0].objects.is_none());
    }

    #[test]
    fn one_block_per_page_is_fragmented_and_rows_add_up() {
        // 16 pages, one 64-byte block at the start of each.
        let blocks: Vec<(u64, u64)> = (0..16).map(|i| (HEAP + 16 + i * PAGE, 64)).collect();
        let ledger = compute(
            &mut state_with(&blocks),
            &snapshot(16, Residency::All, 16 * PAGE),
            Detail { pages: true, stacks: true, objects: true, rows_alone: false },
            &mut glibc(),
        );
        assert_eq!(ledger.rows.live, 16 * 64);
        assert_eq!(ledger.rows.slack, 16 * 8 + 16 * 8, "8 bytes of header + 8 of rounding per block");
        assert_eq!(ledger.rows.fragmented, 16 * (PAGE - 80));
        assert_eq!(ledger.rows.retained, 0);
        assert_eq!(ledger.residual_bytes, 0);
        assert_eq!(ledger.page_maps[0].pages.len(), 16);
        let fragmented: u64 = ledger.fragmentation_by_size.iter().map(|b| b.fragmented_bytes).sum();
        assert!(fragmented.abs_diff(ledger.rows.fragmented) <= 16);
        let by_stack: f64 = ledger.by_stack.iter().map(|s| s.fragmentation_bytes).sum();
        assert!((by_stack - ledger.rows.fragmented as f64).abs() < 1.0);
    }

    /// A big block the program touched only in part holds its resident
    /// part in RSS: per stack and per size, live bytes add up to the live
    /// row, not to the blocks' sizes.
    #[test]
    fn live_bytes_per_stack_and_size_add_up_to_the_live_row() {
        // A 7-page block with pages 1, 3 and 4 not resident, then a small block.
        let blocks = [(HEAP + 16, 7 * PAGE - 100), (HEAP + 7 * PAGE + 16, 64)];
        let residency = Residency::Bitmap(vec![0b1110_0101]);
        let ledger = compute(
            &mut state_with(&blocks),
            &snapshot(8, residency, 5 * PAGE),
            Detail { stacks: true, ..Detail::default() },
            &mut glibc(),
        );
        // Pages 0, 2, 5 and 6 of the big block: its first 16 bytes are its header, its last 84 are past its end.
        assert_eq!(ledger.rows.live, (PAGE - 16) + PAGE + PAGE + (PAGE - 84) + 64);
        assert_eq!(ledger.by_stack.iter().map(|s| s.live_bytes).sum::<u64>(), ledger.rows.live);
        assert_eq!(ledger.fragmentation_by_size.iter().map(|b| b.live_bytes).sum::<u64>(), ledger.rows.live);
    }

    #[test]
    fn free_pages_between_blocks_are_retained_and_trimmable() {
        // A block on page 0 and one on page 9: pages 1..=8 are free. Page 1
        // starts within 40 bytes of the first block's end? No: the block ends
        // early in page 0, so pages 1..=8 are all trimmable.
        let blocks = [(HEAP + 16, 64), (HEAP + 9 * PAGE + 16, 64)];
        let ledger = compute(&mut state_with(&blocks), &snapshot(10, Residency::All, 10 * PAGE), Detail::default(), &mut glibc());
        assert_eq!(ledger.rows.retained, 8 * PAGE);
        assert_eq!(ledger.trim_would_return_bytes, 8 * PAGE);
        // Pages not resident are released, not in RSS.
        let bits = vec![0b0000_0011, 0b10];
        let ledger = compute(&mut state_with(&blocks), &snapshot(10, Residency::Bitmap(bits), 3 * PAGE), Detail::default(), &mut glibc());
        assert_eq!(ledger.rows.retained, PAGE);
        assert_eq!(ledger.released_bytes, 7 * PAGE);
        assert_eq!(ledger.residual_bytes, 0);
    }

    #[test]
    fn lazy_free_comes_out_of_retained() {
        let blocks = [(HEAP + 16, 64)];
        let mut snapshot = snapshot(4, Residency::All, 4 * PAGE);
        snapshot.mappings[0].lazy_free = 2 * PAGE;
        let ledger = compute(&mut state_with(&blocks), &snapshot, Detail::default(), &mut glibc());
        assert_eq!((ledger.rows.retained, ledger.rows.lazy_free), (PAGE, 2 * PAGE));
        assert_eq!(ledger.residual_bytes, 0);
    }

    /// A corrupt snapshot's mapping claims 2^26 pages with a one-byte
    /// bitmap: the pages listed are classified (and shown), the others are
    /// released in one count, and no more pages are walked than the
    /// snapshot's budget for unlisted ones.
    #[test]
    fn pages_past_a_short_bitmap_are_released_in_one_count() {
        let pages = MAX_PAGES_PER_MAPPING;
        let blocks = [(HEAP + 16, 64)];
        let snapshot = snapshot(pages, Residency::Bitmap(vec![0b0000_0011]), 2 * PAGE);
        let ledger = compute(
            &mut state_with(&blocks),
            &snapshot,
            Detail { pages: true, stacks: true, objects: true, rows_alone: false },
            &mut glibc(),
        );
        let walked = ledger.page_maps[0].pages.len() as u64;
        assert_eq!(walked, 8 + UNLISTED_PAGES_PER_SNAPSHOT);
        assert_eq!(ledger.page_maps[0].objects.as_ref().unwrap().blocks.len() as u64, walked);
        assert_eq!(ledger.rows.live + ledger.rows.slack + ledger.rows.fragmented + ledger.rows.retained, 2 * PAGE);
        assert_eq!(ledger.released_bytes, (pages - 2) * PAGE);
        assert_eq!(ledger.residual_bytes, 0);
        // memgap's own buffers in the unlisted part are not the heap's.
        let mut snapshot = snapshot;
        snapshot.agent_ranges = vec![(HEAP + (pages - 10) * PAGE, 4 * PAGE), (HEAP + (pages - 8) * PAGE + 1, 3 * PAGE)];
        let ledger = compute(&mut state_with(&blocks), &snapshot, Detail::default(), &mut glibc());
        assert_eq!(ledger.released_bytes, (pages - 2 - 6) * PAGE, "pages starting in the agent's ranges: 10 down to 5 from the end");
    }

    #[test]
    fn a_snapshot_walks_claimed_and_unlisted_pages_up_to_its_budgets() {
        let mapping = |start: u64, pages: u64, residency: Residency| Mapping {
            start,
            end: start + pages * PAGE,
            perms: "rw-p".into(),
            residency,
            ..Mapping::default()
        };
        let half = CLAIMED_PAGES_PER_SNAPSHOT / 2;
        let at = |i: u64| HEAP + i * (1 << 40);
        let snapshot = Snapshot {
            page_size: PAGE,
            mappings: vec![
                mapping(at(0), half, Residency::All),
                mapping(at(1), half, Residency::All),
                // Past the budget for pages claimed resident: counted run by run.
                mapping(at(2), 1, Residency::All),
                mapping(at(3), 64, Residency::Bitmap(vec![0xff; 8])),
                mapping(at(4), 64, Residency::Bitmap(vec![0xff])),
                mapping(at(5), UNLISTED_PAGES_PER_SNAPSHOT, Residency::None),
                mapping(at(6), 64, Residency::None),
                Mapping { name: "/lib/libc.so.6".into(), inode: 1, ..mapping(at(7), 64, Residency::Unknown) },
            ],
            ..Snapshot::default()
        };
        let walks = PageWalks::of(&snapshot, PAGE, true);
        let unlisted_left = UNLISTED_PAGES_PER_SNAPSHOT - 56;
        assert_eq!(walks.pages, vec![Some(half), Some(half), Some(0), Some(64), Some(64), Some(unlisted_left), Some(0), None]);
        assert!(walks.by_page(at(0)) && walks.by_page(at(2)) && !walks.by_page(at(7)));
        // A real snapshot's bitmaps and claims are walked in full.
        let real = Snapshot {
            mappings: vec![mapping(at(0), 1 << 20, Residency::All), mapping(at(1), 1 << 26, Residency::Bitmap(vec![1; 1 << 23]))],
            ..snapshot
        };
        assert_eq!(PageWalks::of(&real, PAGE, true).pages, vec![Some(1 << 20), Some(1 << 26)]);
        // Without page maps, only what bitmaps list.
        assert_eq!(PageWalks::of(&real, PAGE, false).pages, vec![Some(0), Some(1 << 26)]);
    }

    /// Blocks of a corrupt trace claiming the same pages are walked once:
    /// taken bytes never pass a page, the rows still add up.
    #[test]
    fn overlapping_blocks_are_walked_from_where_the_previous_ended() {
        let blocks: Vec<(u64, u64)> = (0..1000).map(|i| (HEAP + 16 + i * 16, 63 * PAGE)).collect();
        let ledger = compute(
            &mut state_with(&blocks),
            &snapshot(64, Residency::All, 64 * PAGE),
            Detail { pages: true, stacks: true, objects: true, rows_alone: false },
            &mut glibc(),
        );
        assert_eq!(ledger.live_blocks, 1000);
        assert_eq!(ledger.residual_bytes, 0);
        assert_eq!(ledger.rows.live + ledger.rows.slack + ledger.rows.fragmented + ledger.rows.retained, 64 * PAGE);
        let objects = ledger.page_maps[0].objects.as_ref().unwrap();
        // Each block is listed on the pages past where the previous one ended.
        assert!(objects.blocks.iter().sum::<u32>() <= 64 + 1000, "{:?}", objects.blocks);
    }

    proptest::proptest! {
        /// Pages counted run by run come to the same rows, shares per
        /// stack and per size as pages classified one by one.
        #[test]
        fn runs_of_pages_count_as_pages_one_by_one(
            pages in 1u64..48,
            residency in proptest::prop_oneof![
                proptest::strategy::Just(Residency::All),
                proptest::strategy::Just(Residency::None),
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8).prop_map(Residency::Bitmap),
            ],
            blocks in proptest::collection::vec((0u64..48 * PAGE, 1u64..3 * PAGE, 0u32..3), 0..40),
            agent in proptest::collection::vec((0u64..48, 1u64..4), 0..3),
            walked_share in 0.0f64..1.0,
            trim_before in proptest::prelude::any::<bool>(),
            brk_heap in proptest::prelude::any::<bool>(),
        ) {
            let state = || {
                let mut state = HeapState::default();
                state.allocator = "/lib/x86_64-linux-gnu/libc.so.6".into();
                for (i, &(offset, size, stack)) in blocks.iter().enumerate() {
                    let usable = (size + 8).max(32).next_multiple_of(16) - 8;
                    let event = Event { time: i as u64, kind: Some(EventKind::Malloc), addr: HEAP + 16 + offset / 16 * 16, size, usable, stack, ..Event::default() };
                    state.apply(&ThreadEvent { thread: 1, tid: 1, event });
                }
                if trim_before {
                    state.glibc_trim.trim_called(1 << 40, 0);
                }
                state
            };
            let mut snapshot = snapshot(pages, residency.clone(), pages * PAGE);
            if !brk_heap {
                snapshot.mappings[0].name = String::new();
            }
            snapshot.agent_ranges = agent.iter().map(|&(page, len)| (HEAP + page * PAGE, len * PAGE)).collect();
            let listed = match &residency {
                Residency::Bitmap(bits) => pages.min(bits.len() as u64 * 8),
                _ => 0,
            };
            let walked = listed + ((pages - listed) as f64 * walked_share) as u64;
            let walks = |n: u64| PageWalks { pages: vec![Some(n)], by_page: [HEAP].into_iter().collect() };
            let detail = Detail { stacks: true, ..Detail::default() };
            let one_by_one = compute_walking(&mut state(), &snapshot, detail, &mut glibc(), walks(pages), LiveBlocks::Replayed);
            let by_runs = compute_walking(&mut state(), &snapshot, detail, &mut glibc(), walks(walked), LiveBlocks::Replayed);
            proptest::prop_assert_eq!(&one_by_one.heaps, &by_runs.heaps);
            proptest::prop_assert_eq!(one_by_one.other_breakdown, by_runs.other_breakdown);
            proptest::prop_assert_eq!(one_by_one.rows, by_runs.rows);
            let sizes = |l: &Ledger| l.fragmentation_by_size.iter().map(|b| (b.blocks, b.live_bytes)).collect::<Vec<_>>();
            proptest::prop_assert_eq!(sizes(&one_by_one), sizes(&by_runs));
            let stacks = |l: &Ledger| {
                let mut s: Vec<(u32, u64, u64, u64, i64)> = l.by_stack.iter().map(|s| (s.stack, s.objects, s.live_bytes, s.pages, s.fragmentation_bytes.round() as i64)).collect();
                s.sort_unstable();
                s
            };
            proptest::prop_assert_eq!(stacks(&one_by_one), stacks(&by_runs));
        }
    }

    #[test]
    fn sparse_survivors_leave_free_pages() {
        let heap = HEAP;
        let mut state = HeapState::default();
        state.allocator = "/lib/x86_64-linux-gnu/libc.so.6".into();
        for i in 0..1000u64 {
            let event = Event { kind: Some(EventKind::Malloc), addr: heap + 0x2a0 + i * 5120, size: 64, usable: 72, ..Event::default() };
            state.apply(&ThreadEvent { thread: 1, tid: 1, event });
        }
        let pages = 1000 * 5120 / PAGE + 2;
        let snapshot = Snapshot {
            page_size: PAGE,
            rss: Rss { vm_rss: pages * PAGE, ..Rss::default() },
            mappings: vec![Mapping {
                start: heap,
                end: heap + pages * PAGE,
                perms: "rw-p".into(),
                name: "[heap]".into(),
                rss: pages * PAGE,
                residency: Residency::All,
                ..Mapping::default()
            }],
            ..Snapshot::default()
        };
        let ledger = compute(&mut state, &snapshot, Detail::default(), &mut glibc());
        let used_pages = (ledger.rows.live + ledger.rows.slack + ledger.rows.fragmented) / PAGE;
        assert!(used_pages <= 1020, "{used_pages} pages used by 1000 blocks: {:?}", ledger.rows);
    }
}
