//! What replay knows about the heap at any instant, beyond the live blocks:
//! which allocator serves the program, where thread stacks are, which
//! anonymous mappings the program made itself, and which address regions
//! ever held a block (so an arena emptied by frees is still the allocator's).

use std::collections::BTreeMap;

use memgap_replay::{Change, Inherited, LiveSet, ThreadEvent};
use memgap_trace::EventKind;
use memgap_trace::records::Thread;
use rustc_hash::FxHashSet;

/// Granularity of "this region held heap blocks": 2 MiB.
const REGION_SHIFT: u32 = 21;
const RECENT_REGIONS: usize = 32;
/// pymalloc censuses kept for snapshots the replay still holds back: a
/// replay that computes every snapshot's ledger passes none to the state.
const CENSUSES_KEPT: usize = 8;

#[derive(Debug, Default)]
pub struct HeapState {
    pub live: LiveSet,
    pub allocator: String,
    pub stack_hints: Vec<u64>,
    /// Live anonymous mappings the program made with mmap: start → end.
    program_mappings: BTreeMap<u64, u64>,
    /// Mappings recorded with the call stack that made them (an allocator's
    /// own chunks of objects, pymalloc's arenas): start → (end, stack).
    mapping_stacks: BTreeMap<u64, (u64, u32)>,
    /// pymalloc as the recorder counted it at snapshots not yet passed,
    /// oldest first. Its METRICS record comes just before its snapshot, but
    /// the replay holds a snapshot back until a clock passes it, so the
    /// next snapshot's census can come first.
    python_censuses: std::collections::VecDeque<memgap_source_python::Census>,
    block_regions: FxHashSet<u64>,
    /// Regions known to be in `block_regions`, direct-mapped (region + 1,
    /// 0 for none): inserting each allocation's region into the set cost
    /// 38 instructions an allocation on a heap spread over a few regions.
    recent_regions: [u64; RECENT_REGIONS],
    /// What glibc's malloc_trim would find: tcaches, arenas' heaps, the
    /// program's own trims.
    pub glibc_trim: crate::glibc_trim::GlibcTrimModel,
    /// Replayed only for the ledger's rows (the gap at every snapshot): no
    /// model of malloc_trim is kept, so its ledgers are computed with
    /// `Detail::rows_alone`.
    rows_only: bool,
    /// `is_glibc()` for the allocator string at this address and length:
    /// asked on every event, compared once per string.
    glibc_for: Option<(usize, usize, bool)>,
    /// Walks of glibc's state a trace holds (`memgap watch`), by the time
    /// of the snapshot each goes with, oldest first.
    walks: std::collections::VecDeque<(u64, memgap_types::glibc_walk::WalkedHeap)>,
}

impl HeapState {
    /// A state for ledgers whose rows alone are wanted (see `rows_only`).
    pub(crate) fn for_rows_only() -> HeapState {
        HeapState { rows_only: true, ..HeapState::default() }
    }

    /// A new program image (exec): the old address space is gone. The
    /// allocator is kept until the new image's ALLOCATOR record replaces it.
    pub fn start_image(&mut self) {
        let allocator = std::mem::take(&mut self.allocator);
        *self = HeapState { allocator, rows_only: self.rows_only, ..HeapState::default() };
    }

    pub fn is_glibc(&self) -> bool {
        self.allocator.ends_with("/libc.so.6")
    }

    /// The program's own malloc_trim calls, for the trim forecast.
    pub fn metrics(&mut self, metrics: &memgap_trace::records::Metrics) {
        if metrics.source == crate::trim_marks::SOURCE && metrics.kind == crate::trim_marks::KIND {
            let bytes = |name: &str| metrics.get(name).filter(|v| v.is_finite() && *v >= 0.0).map_or(0, |v| v as u64);
            self.glibc_trim.trim_called(bytes("rss_before:bytes"), bytes("rss_after:bytes"));
        } else if let Some(census) = memgap_source_python::Census::from_metrics(metrics) {
            if self.python_censuses.len() == CENSUSES_KEPT {
                self.python_censuses.pop_front();
            }
            self.python_censuses.push_back(census);
        } else if let Some(walk) = memgap_types::glibc_walk::WalkedHeap::from_metrics(metrics) {
            self.walks.push_back(walk);
        }
    }

    /// The walk of glibc's state taken with `snapshot`, if the trace holds
    /// one: its in-use chunks are the live set replayed up to it.
    pub fn take_walk(&mut self, snapshot: &memgap_trace::records::Snapshot) -> Option<memgap_types::glibc_walk::WalkedHeap> {
        while self.walks.front().is_some_and(|&(time, _)| time < snapshot.time) {
            self.walks.pop_front();
        }
        if self.walks.front().is_none_or(|&(time, _)| time != snapshot.time) {
            return None;
        }
        let (_, mut walk) = self.walks.pop_front()?;
        self.live.order_by_address();
        walk.blocks = self.live.in_address_order().iter().map(|b| (b.addr, b.usable())).collect();
        walk.libc_path = self.allocator.clone();
        walk.snapshot = snapshot.clone();
        Some(walk)
    }

    /// pymalloc as the recorder counted it at the snapshot of `time`.
    pub fn python_census(&self, time: u64) -> Option<&memgap_source_python::Census> {
        self.python_censuses.iter().find(|c| c.snapshot_time == time)
    }

    /// The call stack that made the mapping starting at `start`, if it was
    /// recorded with one.
    pub fn mapping_stack(&self, start: u64) -> Option<u32> {
        self.mapping_stacks.get(&start).map(|&(_, stack)| stack)
    }

    /// A forked child's start: the parent's heap history up to the fork.
    pub fn inherit(&mut self, item: Inherited<'_>) {
        match item {
            Inherited::Event(event) => {
                self.apply(event);
            }
            Inherited::Thread(thread) => self.thread(thread),
            Inherited::Metrics(metrics) => self.metrics(metrics),
            Inherited::Snapshot(snapshot) => self.pass_snapshot(snapshot),
            // What the parent's own replay counted is not the child's.
            Inherited::End => {
                self.live.untracked_frees = 0;
                self.live.overlapping_allocations = 0;
            }
        }
    }

    pub fn thread(&mut self, thread: &Thread) {
        self.stack_hints.push(thread.stack_hint);
        self.glibc_trim.thread_started(thread.thread);
    }

    /// A snapshot no ledger is computed at: the one after the program's own
    /// malloc_trim still tells what that trim left.
    pub fn pass_snapshot(&mut self, snapshot: &memgap_trace::records::Snapshot) {
        while self.walks.front().is_some_and(|&(time, _)| time <= snapshot.time) {
            self.walks.pop_front();
        }
        while self.python_censuses.front().is_some_and(|c| c.snapshot_time <= snapshot.time) {
            self.python_censuses.pop_front();
        }
        if !self.rows_only && self.glibc_trim.trim_pending() && self.glibc_trim.trim_shown_by(snapshot.rss.vm_rss) && self.is_glibc() {
            self.live.order_by_address();
            let live = crate::extents::Extents::placed(self.live.in_address_order(), crate::glibc_trim::GLIBC_HEADER);
            let page = crate::page_walks::plausible_page_size(snapshot.page_size);
            let walks = crate::page_walks::PageWalks::of(snapshot, page, false);
            crate::glibc_trim::forecast(&mut self.glibc_trim, snapshot, live, page, |m| walks.by_page(m.start));
        }
    }

    pub fn apply(&mut self, event: &ThreadEvent) -> Change {
        let e = &event.event;
        match e.kind() {
            EventKind::Mmap => {
                const MAP_ANONYMOUS: u64 = 0x20;
                if e.extra & MAP_ANONYMOUS != 0 {
                    self.unmap(e.addr, e.size);
                    self.program_mappings.insert(e.addr, e.addr + e.size);
                    if e.stack != memgap_trace::event::NO_STACK {
                        self.mapping_stacks.insert(e.addr, (e.addr + e.size, e.stack));
                    }
                }
            }
            EventKind::Munmap => self.unmap(e.addr, e.size),
            EventKind::Mremap => {
                let was_ours = self.program_mappings.range(..=e.old_addr).next_back().is_some_and(|(_, &end)| end > e.old_addr);
                self.unmap(e.old_addr, e.extra);
                if was_ours {
                    self.program_mappings.insert(e.addr, e.addr + e.size);
                }
            }
            _ => {
                let change = self.live.apply(event);
                let key = (self.allocator.as_ptr() as usize, self.allocator.len());
                let glibc = match self.glibc_for {
                    Some((ptr, len, glibc)) if (ptr, len) == key => glibc,
                    _ => {
                        let glibc = self.is_glibc();
                        self.glibc_for = Some((key.0, key.1, glibc));
                        glibc
                    }
                };
                if glibc && !self.rows_only {
                    self.glibc_trim.observe(event, change);
                }
                if e.addr != 0 && e.kind().is_allocation() {
                    // An allocator that maps its memory through libc's mmap
                    // (jemalloc, tcmalloc, mimalloc) shows up as a program
                    // mmap until the first block lands in it.
                    if !self.program_mappings.is_empty()
                        && let Some((start, _)) = self.program_mapping_at(e.addr)
                    {
                        self.program_mappings.remove(&start);
                    }
                    let region = e.addr >> REGION_SHIFT;
                    let recent = &mut self.recent_regions[region as usize % RECENT_REGIONS];
                    if *recent != region + 1 {
                        *recent = region + 1;
                        self.block_regions.insert(region);
                    }
                }
                return change;
            }
        }
        Change::None
    }

    /// Removes [start, start+len) from the program's mappings, splitting
    /// any mapping it cuts.
    fn unmap(&mut self, start: u64, len: u64) {
        let end = start.saturating_add(len);
        if !self.mapping_stacks.is_empty() {
            let gone: Vec<u64> = self.mapping_stacks.range(..end).rev().take_while(|&(_, &(e, _))| e > start).map(|(&s, _)| s).collect();
            for s in gone {
                self.mapping_stacks.remove(&s);
            }
        }
        let overlapping: Vec<(u64, u64)> =
            self.program_mappings.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.program_mappings.remove(&s);
            if s < start {
                self.program_mappings.insert(s, start);
            }
            if e > end {
                self.program_mappings.insert(end, e);
            }
        }
    }

    pub fn program_mapping_at(&self, addr: u64) -> Option<(u64, u64)> {
        self.program_mappings.range(..=addr).next_back().filter(|&(_, &end)| end > addr).map(|(&s, &e)| (s, e))
    }

    /// The program's own mappings overlapping `[start, end)`.
    pub fn program_mappings_in(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.program_mappings.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect()
    }

    /// Marks `[start, end)` as the allocator's, as if blocks had been there
    /// (a heap a walk of the allocator's state found).
    pub fn held_blocks(&mut self, start: u64, end: u64) {
        for region in start >> REGION_SHIFT..=end.saturating_sub(1) >> REGION_SHIFT {
            self.block_regions.insert(region);
        }
    }

    pub fn ever_held_blocks(&self, start: u64, end: u64) -> bool {
        let regions = start >> REGION_SHIFT..=(end.saturating_sub(1)) >> REGION_SHIFT;
        // A huge (corrupt) range: the regions known are fewer.
        if regions.end() - regions.start() > self.block_regions.len() as u64 {
            return self.block_regions.iter().any(|r| regions.contains(r));
        }
        regions.into_iter().any(|r| self.block_regions.contains(&r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::Event;

    fn ev(kind: EventKind, addr: u64, size: u64, old_addr: u64, extra: u64) -> ThreadEvent {
        ThreadEvent { thread: 1, tid: 1, event: Event { kind: Some(kind), addr, size, old_addr, extra, ..Event::default() } }
    }

    #[test]
    fn tracks_program_mappings_through_partial_unmaps() {
        let mut state = HeapState::default();
        state.apply(&ev(EventKind::Mmap, 0x10000, 0x10000, 0, 0x22));
        state.apply(&ev(EventKind::Munmap, 0x14000, 0x4000, 0, 0));
        assert_eq!(state.program_mapping_at(0x11000), Some((0x10000, 0x14000)));
        assert_eq!(state.program_mapping_at(0x15000), None);
        assert_eq!(state.program_mapping_at(0x19000), Some((0x18000, 0x20000)));
        state.apply(&ev(EventKind::Mremap, 0x50000, 0x8000, 0x18000, 0x8000));
        assert_eq!(state.program_mapping_at(0x19000), None);
        assert_eq!(state.program_mapping_at(0x57000), Some((0x50000, 0x58000)));
        // A file mapping is not anonymous memory of the program's.
        state.apply(&ev(EventKind::Mmap, 0x90000, 0x1000, 0, 0x2));
        assert_eq!(state.program_mapping_at(0x90000), None);
    }

    #[test]
    fn a_mapping_recorded_with_its_stack_keeps_it_until_unmapped() {
        let mut state = HeapState::default();
        let mut arena = ev(EventKind::Mmap, 0x100000, 0x100000, 0, 0x22);
        arena.event.stack = 7;
        state.apply(&arena);
        state.apply(&ev(EventKind::Mmap, 0x300000, 0x100000, 0, 0x22));
        assert_eq!((state.mapping_stack(0x100000), state.mapping_stack(0x300000)), (Some(7), None));
        state.apply(&ev(EventKind::Munmap, 0x100000, 0x100000, 0, 0));
        assert_eq!(state.mapping_stack(0x100000), None);
    }

    /// The replay holds a snapshot back until a clock passes it; by then the
    /// next snapshot's census may have come, and each snapshot still finds its own.
    #[test]
    fn each_snapshot_finds_its_own_pymalloc_census_when_the_next_came_first() {
        let census = |snapshot_time: u64, arenas: u64| memgap_source_python::Census { snapshot_time, arenas, ..Default::default() };
        let snapshot = |time: u64| memgap_trace::records::Snapshot { time, ..Default::default() };
        let mut state = HeapState::default();
        state.metrics(&census(927, 52).to_metrics(1));
        state.metrics(&census(930, 53).to_metrics(2));
        assert_eq!(state.python_census(927).map(|c| c.arenas), Some(52));
        assert_eq!(state.python_census(930).map(|c| c.arenas), Some(53));
        state.pass_snapshot(&snapshot(930));
        assert!(state.python_census(927).is_none() && state.python_census(930).is_none());
        // A replay that never passes its snapshots to the state keeps only the latest few.
        for time in 0..100 {
            state.metrics(&census(time, 1).to_metrics(time));
        }
        assert_eq!(state.python_censuses.len(), CENSUSES_KEPT);
        assert!(state.python_census(99).is_some());
    }

    #[test]
    fn remembers_regions_that_held_blocks() {
        let mut state = HeapState::default();
        state.apply(&ev(EventKind::Malloc, 0x7f00_0040_0000, 64, 0, 0));
        state.apply(&ev(EventKind::Free, 0x7f00_0040_0000, 0, 0, 0));
        assert!(state.ever_held_blocks(0x7f00_0000_0000, 0x7f00_0400_0000));
        assert!(!state.ever_held_blocks(0x5000_0000, 0x5001_0000));
    }
}
