//! The live blocks of a snapshot in address order, each from its header to
//! its usable end, read where they are already held (the live set's
//! address-ordered view, a walk's blocks) rather than copied: a heap of
//! millions of blocks is held once while its ledger is computed.

use memgap_replay::PlacedBlock;

/// One live block from its header to its usable end, with its requested
/// bytes at the front of its usable ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockExtent {
    pub start: u64,
    pub end: u64,
    /// Bytes the program asked for (the usable ones when a walk found it).
    pub size: u64,
    /// Usable bytes past the requested ones.
    pub slack: u32,
    pub stack: u32,
}

impl BlockExtent {
    /// `[start, end)` taken whole, by no known call stack.
    pub fn spanning(start: u64, end: u64) -> BlockExtent {
        BlockExtent { start, end, size: end - start, slack: 0, stack: memgap_trace::event::NO_STACK }
    }

    /// Where the requested bytes begin.
    pub fn addr(&self) -> u64 {
        self.end - u64::from(self.slack) - self.size
    }

    /// Where the requested bytes end.
    pub fn requested_end(&self) -> u64 {
        self.end - u64::from(self.slack)
    }
}

/// Live block extents in address order, a few words that point at where
/// the blocks are held.
#[derive(Debug, Clone, Copy)]
pub struct Extents<'a> {
    held: Held<'a>,
    /// Bytes in front of each block that belong to it.
    header: u64,
}

#[derive(Debug, Clone, Copy)]
enum Held<'a> {
    /// The replayed live set's address-ordered view.
    Placed(&'a [PlacedBlock]),
    /// Blocks a walk of the allocator found: (address, usable bytes). A
    /// walk knows no requested size: the usable bytes stand for it.
    Walked(&'a [(u64, u64)]),
    /// Extents made apart from their blocks (blocks that overlapped, walked once).
    Made(&'a [BlockExtent]),
}

impl Default for Extents<'_> {
    fn default() -> Self {
        Extents { held: Held::Made(&[]), header: 0 }
    }
}

impl<'a> Extents<'a> {
    /// The live set's blocks in address order, each with `header` bytes in front.
    pub fn placed(blocks: &'a [PlacedBlock], header: u64) -> Extents<'a> {
        Extents { held: Held::Placed(blocks), header }
    }

    /// A walk's blocks, (address, usable bytes) in address order, each with `header` bytes in front.
    pub fn walked(blocks: &'a [(u64, u64)], header: u64) -> Extents<'a> {
        Extents { held: Held::Walked(blocks), header }
    }

    /// Extents made apart, in address order.
    pub fn made(extents: &'a [BlockExtent]) -> Extents<'a> {
        Extents { held: Held::Made(extents), header: 0 }
    }

    pub fn len(&self) -> usize {
        match self.held {
            Held::Placed(blocks) => blocks.len(),
            Held::Walked(blocks) => blocks.len(),
            Held::Made(extents) => extents.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The extent at `index` (which must be below `len()`).
    #[inline]
    pub fn get(&self, index: usize) -> BlockExtent {
        match self.held {
            Held::Placed(blocks) => {
                let b = &blocks[index];
                BlockExtent { start: b.addr.saturating_sub(self.header), end: b.end(), size: b.size, slack: b.slack, stack: b.stack }
            }
            Held::Walked(blocks) => {
                let (addr, usable) = blocks[index];
                BlockExtent {
                    start: addr.saturating_sub(self.header),
                    end: addr + usable,
                    size: usable,
                    slack: 0,
                    stack: memgap_trace::event::NO_STACK,
                }
            }
            Held::Made(extents) => extents[index],
        }
    }

    pub fn iter(self) -> impl Iterator<Item = BlockExtent> + 'a {
        (0..self.len()).map(move |index| self.get(index))
    }

    /// The extents from `index` on.
    pub fn from(&self, index: usize) -> Extents<'a> {
        self.between(index, self.len())
    }

    /// The extents from `first` up to `end` (both at most `len()`).
    pub fn between(&self, first: usize, end: usize) -> Extents<'a> {
        let held = match self.held {
            Held::Placed(blocks) => Held::Placed(&blocks[first..end]),
            Held::Walked(blocks) => Held::Walked(&blocks[first..end]),
            Held::Made(extents) => Held::Made(&extents[first..end]),
        };
        Extents { held, header: self.header }
    }

    /// The index of the first extent for which `before` is false (as
    /// `slice::partition_point`: true for a prefix, false after).
    pub fn partition_point(&self, before: impl Fn(&BlockExtent) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let middle = low + (high - low) / 2;
            if before(&self.get(middle)) {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }

    /// The extents that overlap `[start, end)`.
    pub fn within(&self, start: u64, end: u64) -> Extents<'a> {
        let first = self.partition_point(|b| b.end <= start);
        let last = self.partition_point(|b| b.start < end);
        self.between(first, last.max(first))
    }

    /// The extents as page walks go over them: blocks of a corrupt trace
    /// that overlap walked from where the previous one ended, so that pages
    /// are walked once however many blocks claim them; empty ones left out.
    /// These extents themselves when none needs that (any trace but a
    /// corrupt one), else a copy made in `copy`.
    pub fn walked_once(self, copy: &'a mut Vec<BlockExtent>) -> Extents<'a> {
        if self.clipped().zip(self.iter()).all(|(walked, extent)| walked == Some(extent)) {
            return self;
        }
        copy.extend(self.clipped().flatten());
        Extents::made(copy)
    }

    /// Each extent from where the one walked before it ended; none for an
    /// extent left with nothing.
    fn clipped(self) -> impl Iterator<Item = Option<BlockExtent>> + 'a {
        let mut covered = 0;
        self.iter().map(move |mut b| {
            b.start = b.start.max(covered);
            (b.start < b.end).then(|| {
                covered = b.end;
                b
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(addr: u64, size: u64, slack: u32) -> PlacedBlock {
        PlacedBlock { addr, size, slack, stack: 7 }
    }

    #[test]
    fn a_placed_block_extends_from_its_header_to_its_usable_end() {
        let blocks = [placed(0x1010, 24, 8)];
        let extent = Extents::placed(&blocks, 8).get(0);
        assert_eq!((extent.start, extent.end, extent.addr(), extent.requested_end()), (0x1008, 0x1030, 0x1010, 0x1028));
        assert_eq!(extent.stack, 7);
        let walked = [(0x1010, 32)];
        let extent = Extents::walked(&walked, 8).get(0);
        assert_eq!((extent.start, extent.end, extent.addr(), extent.size), (0x1008, 0x1030, 0x1010, 32));
    }

    #[test]
    fn within_finds_the_extents_overlapping_a_range() {
        let blocks = [placed(0x1000, 16, 0), placed(0x2000, 16, 0), placed(0x3000, 16, 0)];
        let extents = Extents::placed(&blocks, 0);
        let starts = |e: Extents| e.iter().map(|b| b.start).collect::<Vec<_>>();
        assert_eq!(starts(extents.within(0x1008, 0x2001)), [0x1000, 0x2000]);
        assert_eq!(starts(extents.within(0x1010, 0x2000)), Vec::<u64>::new());
        assert_eq!(starts(extents.from(2)), [0x3000]);
    }

    #[test]
    fn overlapping_or_empty_extents_are_walked_once() {
        let clean = [placed(0x1000, 16, 0), placed(0x1010, 16, 0)];
        let mut copy = Vec::new();
        assert!(matches!(Extents::placed(&clean, 0).walked_once(&mut copy).held, Held::Placed(_)), "no copy of a clean heap");
        assert!(copy.is_empty());
        // The second starts inside the first; the third lies inside the second; the fourth is empty.
        let corrupt = [placed(0x1000, 32, 0), placed(0x1010, 64, 0), placed(0x1020, 16, 0), placed(0x2000, 0, 0)];
        let walked: Vec<(u64, u64)> = Extents::placed(&corrupt, 0).walked_once(&mut copy).iter().map(|b| (b.start, b.end)).collect();
        assert_eq!(walked, [(0x1000, 0x1020), (0x1020, 0x1050)]);
    }
}
