//! The live heap: which blocks exist after each event.

use memgap_trace::EventKind;

use crate::ThreadEvent;
use crate::address_table::AddressTable;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Block {
    /// Bytes the program asked for.
    pub size: u64,
    pub time: u64,
    /// Usable bytes past the requested ones (0 when the allocator cannot
    /// say), up to 4 GiB: 32 bytes a block rather than 40, for the
    /// millions of a big heap.
    pub slack: u32,
    pub thread: u32,
    pub stack: u32,
    /// The CPU the allocating thread ran on.
    pub cpu: u32,
}

const _: () = assert!(std::mem::size_of::<Block>() == 32);

// SAFETY: integers only.
unsafe impl crate::address_table::ZeroIsValid for Block {}

impl Block {
    /// Bytes the allocator reports usable (at least the requested ones).
    pub fn usable(&self) -> u64 {
        self.size + u64::from(self.slack)
    }
}

/// A live block as the address-ordered view holds it: where it lies and
/// which stack made it, 24 bytes rather than the table's 40, for the
/// millions of a big heap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlacedBlock {
    pub addr: u64,
    /// Bytes the program asked for.
    pub size: u64,
    /// Usable bytes past the requested ones.
    pub slack: u32,
    pub stack: u32,
}

const _: () = assert!(std::mem::size_of::<PlacedBlock>() == 24);

impl PlacedBlock {
    fn of(addr: u64, block: &Block) -> PlacedBlock {
        PlacedBlock { addr, size: block.size, slack: block.slack, stack: block.stack }
    }

    pub fn usable(&self) -> u64 {
        self.size + u64::from(self.slack)
    }

    /// Where its usable bytes end.
    pub fn end(&self) -> u64 {
        self.addr + self.usable()
    }
}

/// What one event did to the live set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Allocated(Block),
    Freed(Block),
    Reallocated { old: Block, new: Block },
}

#[derive(Debug, Default)]
pub struct LiveSet {
    blocks: AddressTable<Block>,
    live_bytes: u64,
    /// Frees of blocks allocated before recording started (or whose event
    /// was lost): nothing to remove.
    pub untracked_frees: u64,
    /// Allocations at an address already live: the free in between was
    /// missed (or ordered after the allocation); the old block is dropped.
    pub overlapping_allocations: u64,
    ordered: Ordered,
}

/// The blocks in address order as of the last [`LiveSet::in_address_order`],
/// and the addresses added and removed since: the next call merges the
/// changes instead of sorting millions of blocks again.
#[derive(Debug, Default)]
struct Ordered {
    blocks: Vec<PlacedBlock>,
    added: Vec<u64>,
    removed: Vec<u64>,
    /// The log grew past what a fresh sort costs: the next call sorts.
    stale: bool,
}

impl Ordered {
    fn note(&mut self, added: Option<u64>, removed: Option<u64>, live: usize) {
        if self.stale {
            return;
        }
        self.added.extend(added);
        self.removed.extend(removed);
        if self.added.len() + self.removed.len() > live.max(1 << 16) {
            self.stale = true;
            self.added = Vec::new();
            self.removed = Vec::new();
        }
    }
}

impl LiveSet {
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.blocks.contains(addr)
    }

    /// Starts fetching into the CPU's cache what applying `event` will
    /// look up: the slots of the block it frees and of the one it
    /// allocates. Called some events ahead, this hides the cache misses
    /// that otherwise dominate a replay.
    #[inline]
    pub fn prefetch(&self, event: &ThreadEvent) {
        let e = &event.event;
        if matches!(e.kind(), EventKind::Realloc | EventKind::Reallocarray) {
            self.blocks.prefetch(e.old_addr);
        }
        self.blocks.prefetch(e.addr);
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    pub fn blocks(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.blocks.iter()
    }

    /// Forgets everything (a new process image after exec).
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.live_bytes = 0;
        self.ordered = Ordered::default();
    }

    /// Puts the address-ordered view ([`LiveSet::in_address_order`]) up to
    /// date. Between two calls it keeps a log of changes, so calling it at
    /// each snapshot costs a merge of what changed rather than a sort of
    /// everything.
    pub fn order_by_address(&mut self) {
        let ordered = &mut self.ordered;
        if ordered.stale || (ordered.blocks.is_empty() && !self.blocks.is_empty()) {
            ordered.blocks.clear();
            // Grown by doubling, the copy would leave its smaller buffers freed behind it.
            ordered.blocks.reserve_exact(self.blocks.len());
            ordered.blocks.extend(self.blocks.iter().map(|(addr, block)| PlacedBlock::of(addr, block)));
            ordered.blocks.sort_unstable_by_key(|b| b.addr);
        } else if !ordered.added.is_empty() || !ordered.removed.is_empty() {
            ordered.removed.sort_unstable();
            ordered.removed.dedup();
            let removed = &ordered.removed;
            if !removed.is_empty() {
                ordered.blocks.retain(|b| removed.binary_search(&b.addr).is_err());
            }
            ordered.added.sort_unstable();
            ordered.added.dedup();
            let added: Vec<PlacedBlock> =
                ordered.added.iter().filter_map(|&addr| self.blocks.get(addr).map(|block| PlacedBlock::of(addr, block))).collect();
            if !added.is_empty() {
                // Merged from the back into the grown vector, in place: a
                // second vector as long would double the report's peak
                // memory on a heap of millions of blocks.
                let blocks = &mut ordered.blocks;
                let (mut old, mut new) = (blocks.len(), added.len());
                blocks.resize(old + new, PlacedBlock::default());
                for at in (0..blocks.len()).rev() {
                    if new == 0 {
                        break;
                    }
                    blocks[at] = if old > 0 && blocks[old - 1].addr > added[new - 1].addr {
                        old -= 1;
                        blocks[old]
                    } else {
                        new -= 1;
                        added[new]
                    };
                }
            }
        }
        ordered.added.clear();
        ordered.removed.clear();
        ordered.stale = false;
    }

    /// Every live block in address order, as of the last
    /// [`LiveSet::order_by_address`]; the live set must not have changed since.
    pub fn in_address_order(&self) -> &[PlacedBlock] {
        let ordered = &self.ordered;
        assert!(
            !ordered.stale && ordered.added.is_empty() && ordered.removed.is_empty() && ordered.blocks.len() == self.blocks.len(),
            "the live set changed since it was last ordered by address"
        );
        &ordered.blocks
    }

    pub fn apply(&mut self, event: &ThreadEvent) -> Change {
        let e = &event.event;
        let kind = e.kind();
        let slack = u32::try_from(e.usable.saturating_sub(e.size)).unwrap_or(u32::MAX);
        let new_block = || Block { size: e.size, slack, time: e.time, thread: event.thread, stack: e.stack, cpu: e.cpu };
        match kind {
            EventKind::Free => self.remove(e.addr).map_or(Change::None, Change::Freed),
            EventKind::Realloc | EventKind::Reallocarray => {
                if e.addr == 0 {
                    // glibc's realloc(p, 0) frees p and returns NULL; any other
                    // NULL result is a failure that leaves p alive.
                    if e.size == 0 && e.old_addr != 0 {
                        return self.remove(e.old_addr).map_or(Change::None, Change::Freed);
                    }
                    return Change::None;
                }
                let old = if e.old_addr != 0 { self.remove(e.old_addr) } else { None };
                let new = new_block();
                self.insert(e.addr, new);
                match old {
                    Some(old) => Change::Reallocated { old, new },
                    None => Change::Allocated(new),
                }
            }
            kind if kind.is_allocation() => {
                if e.addr == 0 {
                    return Change::None;
                }
                let block = new_block();
                self.insert(e.addr, block);
                Change::Allocated(block)
            }
            _ => Change::None,
        }
    }

    // Sums wrap rather than overflow: only a corrupt trace holds sizes whose
    // sum exceeds u64, and adding and removing the same sizes stays exact.
    #[inline(always)]
    fn insert(&mut self, addr: u64, block: Block) {
        self.live_bytes = self.live_bytes.wrapping_add(block.size);
        let replaced = self.blocks.insert(addr, block);
        if let Some(old) = replaced {
            self.overlapping_allocations += 1;
            self.live_bytes = self.live_bytes.wrapping_sub(old.size);
        }
        self.ordered.note(Some(addr), replaced.map(|_| addr), self.blocks.len());
    }

    #[inline(always)]
    fn remove(&mut self, addr: u64) -> Option<Block> {
        match self.blocks.remove(addr) {
            Some(block) => {
                self.live_bytes = self.live_bytes.wrapping_sub(block.size);
                self.ordered.note(None, Some(addr), self.blocks.len());
                Some(block)
            }
            None => {
                self.untracked_frees += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::Event;
    use proptest::prelude::*;

    fn ev(kind: EventKind, addr: u64, size: u64, old_addr: u64) -> ThreadEvent {
        ThreadEvent { thread: 1, tid: 1, event: Event { kind: Some(kind), addr, size, old_addr, ..Event::default() } }
    }

    #[test]
    fn realloc_semantics() {
        let mut live = LiveSet::default();
        live.apply(&ev(EventKind::Malloc, 0x10, 100, 0));
        live.apply(&ev(EventKind::Realloc, 0x20, 300, 0x10));
        assert_eq!((live.live_bytes(), live.len()), (300, 1));
        live.apply(&ev(EventKind::Realloc, 0, 1 << 40, 0x20)); // failed: 0x20 stays
        assert_eq!(live.live_bytes(), 300);
        live.apply(&ev(EventKind::Realloc, 0, 0, 0x20)); // realloc(p, 0) frees
        assert_eq!((live.live_bytes(), live.len()), (0, 0));
        live.apply(&ev(EventKind::Realloc, 0x30, 8, 0)); // realloc(NULL, n) allocates
        assert_eq!(live.live_bytes(), 8);
    }

    #[test]
    fn usable_bytes_are_kept_up_to_4_gib_past_the_requested_ones() {
        let mut live = LiveSet::default();
        for (addr, size, usable) in [(0x10, 100, 104), (0x1000, 100, 0), (1 << 40, 1 << 33, (1 << 34) + 7)] {
            let event = Event { kind: Some(EventKind::Malloc), addr, size, usable, ..Event::default() };
            live.apply(&ThreadEvent { thread: 1, tid: 1, event });
        }
        let usable = |addr| live.blocks().find(|b| b.0 == addr).map(|b| b.1.usable());
        assert_eq!(usable(0x10), Some(104));
        assert_eq!(usable(0x1000), Some(100), "no usable size: the requested one");
        assert_eq!(usable(1 << 40), Some((1 << 33) + u64::from(u32::MAX)));
    }

    #[test]
    fn anomalies_are_counted_not_fatal() {
        let mut live = LiveSet::default();
        live.apply(&ev(EventKind::Free, 0x99, 0, 0));
        live.apply(&ev(EventKind::Malloc, 0x10, 5, 0));
        live.apply(&ev(EventKind::Malloc, 0x10, 7, 0));
        assert_eq!((live.untracked_frees, live.overlapping_allocations, live.live_bytes()), (1, 1, 7));
    }

    proptest! {
        /// The live set agrees with a straightforward model under any
        /// sequence of mallocs and frees.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((any::<bool>(), 0u64..32, 1u64..1000), 0..300)) {
            let mut live = LiveSet::default();
            let mut model = std::collections::HashMap::new();
            for (is_malloc, slot, size) in ops {
                let addr = 0x1000 + slot * 16;
                if is_malloc {
                    live.apply(&ev(EventKind::Malloc, addr, size, 0));
                    model.insert(addr, size);
                } else {
                    live.apply(&ev(EventKind::Free, addr, 0, 0));
                    model.remove(&addr);
                }
                prop_assert_eq!(live.live_bytes(), model.values().sum::<u64>());
                prop_assert_eq!(live.len(), model.len());
            }
        }

        /// The address-ordered view, asked for at any points between
        /// changes, is the live set sorted.
        #[test]
        fn address_order_follows_changes(ops in proptest::collection::vec((0u8..3, 0u64..64, 1u64..1000), 0..400)) {
            let mut live = LiveSet::default();
            for (op, slot, size) in ops {
                let addr = 0x1000 + slot * 16;
                match op {
                    0 => { live.apply(&ev(EventKind::Malloc, addr, size, 0)); }
                    1 => { live.apply(&ev(EventKind::Free, addr, 0, 0)); }
                    _ => {
                        let expected: Vec<(u64, u64)> = {
                            let mut all: Vec<(u64, u64)> = live.blocks().map(|(a, b)| (a, b.size)).collect();
                            all.sort_unstable();
                            all
                        };
                        live.order_by_address();
                        let ordered: Vec<(u64, u64)> = live.in_address_order().iter().map(|b| (b.addr, b.size)).collect();
                        prop_assert_eq!(ordered, expected);
                    }
                }
            }
        }
    }
}
