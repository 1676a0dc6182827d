//! The CPython source: what pymalloc holds, read at a snapshot from the
//! pool headers of its arenas (the same counts `sys._debugmallocstats()`
//! adds up), laid over the snapshot's page residency, and carried in the
//! trace as one METRICS record (source `python`, kind `pymalloc`).
//!
//! pymalloc (CPython's Objects/obmalloc.c) serves requests of up to 512
//! bytes from pools of one size class (multiples of 16 bytes on 64-bit),
//! carved out of arenas: 1 MiB arenas of 16 KiB pools since 3.10, 256 KiB
//! of 4 KiB before. A pool starts with a 48-byte header whose first word
//! counts its allocated blocks; an empty pool goes back to its arena's free
//! list, and an arena is unmapped only once all its pools are empty (and
//! not even then when it is the last arena with free pools).
//!
//! Not for: finding the arenas (the agent's table, read by `memgap run`) or
//! the ledger (memgap-model's CPython owner).

use memgap_trace::records::Metrics;

pub const SOURCE: &str = memgap_trace::vocabulary::source::PYTHON;
pub const KIND: &str = memgap_trace::vocabulary::kind::PYMALLOC;
/// `sizeof(struct pool_header)` rounded up to the 16-byte alignment (64-bit).
pub const POOL_OVERHEAD: u64 = 48;
/// Size classes are this many bytes apart on 64-bit builds (3.8 and later).
pub const ALIGNMENT: u64 = 16;
/// pymalloc serves requests of at most this many bytes.
pub const SMALL_REQUEST_THRESHOLD: u64 = 512;
const CLASSES: usize = (SMALL_REQUEST_THRESHOLD / ALIGNMENT) as usize;

/// The fields of a pool header the census needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolHeader {
    /// Allocated blocks.
    pub count: u32,
    /// Size class index: blocks of (szidx + 1) × 16 bytes.
    pub szidx: u32,
    /// 0 for a pool pymalloc never carved out (its arena's memory is still zero).
    pub maxnextoffset: u32,
}

impl PoolHeader {
    /// From the first [`POOL_OVERHEAD`] bytes of a pool (x86-64 layout:
    /// count, freeblock, nextpool, prevpool, arenaindex, szidx, nextoffset,
    /// maxnextoffset).
    pub fn parse(bytes: &[u8]) -> Option<PoolHeader> {
        let word = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        Some(PoolHeader { count: word(0)?, szidx: word(36)?, maxnextoffset: word(44)? })
    }
}

/// One size class of pymalloc at a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SizeClass {
    pub block_bytes: u64,
    /// Allocated blocks.
    pub blocks: u64,
    /// Pools of this class holding at least one block.
    pub pools: u64,
    /// Blocks those pools have room for.
    pub capacity: u64,
}

impl SizeClass {
    /// Allocated blocks ÷ the room of their pools.
    pub fn occupancy(&self) -> f64 {
        if self.capacity == 0 { 0.0 } else { self.blocks as f64 / self.capacity as f64 }
    }
}

/// One arena's resident bytes split into the ledger's rows, so they can be
/// given to the call stack that made pymalloc map the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaRows {
    pub address: u64,
    pub allocated_blocks: u64,
    pub live_bytes: u64,
    pub slack_bytes: u64,
    pub fragmented_bytes: u64,
    pub retained_bytes: u64,
}

impl ArenaRows {
    pub fn resident_bytes(&self) -> u64 {
        self.live_bytes + self.slack_bytes + self.fragmented_bytes + self.retained_bytes
    }

    /// How much of its resident bytes its allocated blocks take (0..=255);
    /// None when it holds no block.
    pub fn fill(&self) -> Option<u8> {
        let held = self.live_bytes + self.slack_bytes + self.fragmented_bytes;
        (self.live_bytes > 0).then(|| (self.live_bytes * 255 / held.max(1)).min(255) as u8)
    }
}

/// pymalloc at one snapshot: its figures, and its resident arena bytes
/// split into the ledger's rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Census {
    /// The snapshot's event time (its round), to find it again.
    pub snapshot_time: u64,
    pub arenas: u64,
    pub arena_bytes: u64,
    pub pool_bytes: u64,
    /// Arena bytes the kernel has resident.
    pub resident_bytes: u64,
    pub pools_used: u64,
    /// Pools carved out once and empty now.
    pub pools_empty: u64,
    pub allocated_blocks: u64,
    /// Σ allocated blocks × their class size: `sys._debugmallocstats()`'s
    /// "bytes in allocated blocks".
    pub allocated_blocks_bytes: u64,
    /// Free blocks in pools that hold allocated ones ("bytes in available blocks").
    pub free_in_used_pools_bytes: u64,
    /// Resident bytes: allocated blocks…
    pub live_bytes: u64,
    /// …pool headers and the tail of each used pool too short for a block…
    pub slack_bytes: u64,
    /// …free blocks of used pools, and empty pools in arenas that hold a used pool…
    pub fragmented_bytes: u64,
    /// …and arenas that hold no used pool (pymalloc keeps one such arena).
    pub retained_bytes: u64,
    /// Pools whose header could not be read or made no sense (their resident
    /// bytes are in `fragmented_bytes`).
    pub unreadable_pools: u64,
    /// The part of `fragmented_bytes` in empty pools (pymalloc never gives
    /// their pages back while their arena holds a used pool).
    pub empty_pool_bytes: u64,
    pub size_classes: Vec<SizeClass>,
    /// The same rows per arena, for arenas with resident pages, in address order.
    pub arena_rows: Vec<ArenaRows>,
}

/// Counts pymalloc's arenas: `resident(address)` says whether the page at
/// `address` is resident, `headers` reads the pool headers at the given
/// addresses (None where it could not).
pub fn census(
    arenas: &[u64],
    arena_bytes: u64,
    pool_bytes: u64,
    page_bytes: u64,
    resident: impl Fn(u64) -> bool,
    mut headers: impl FnMut(&[u64]) -> Vec<Option<PoolHeader>>,
) -> Census {
    let mut census =
        Census { arenas: arenas.len() as u64, arena_bytes: arenas.len() as u64 * arena_bytes, pool_bytes, ..Census::default() };
    if arena_bytes == 0 || pool_bytes <= POOL_OVERHEAD || !page_bytes.is_power_of_two() || !pool_bytes.is_multiple_of(page_bytes) {
        return census;
    }
    let mut classes = [SizeClass::default(); CLASSES];
    let resident_in = |start: u64, end: u64| (start..end).step_by(page_bytes as usize).filter(|&p| resident(p)).count() as u64 * page_bytes;
    for &arena in arenas {
        let before = (census.allocated_blocks, census.live_bytes, census.slack_bytes, census.fragmented_bytes, census.retained_bytes);
        let arena_end = arena + arena_bytes;
        let first_pool = arena.next_multiple_of(pool_bytes);
        let pools: Vec<u64> = (first_pool..arena_end).step_by(pool_bytes as usize).take_while(|p| p + pool_bytes <= arena_end).collect();
        // Headers only where the pool's first page is resident: reading a
        // page that is not would make it so.
        let readable: Vec<u64> = pools.iter().copied().filter(|&p| resident(p)).collect();
        let read = headers(&readable);
        let mut read = readable.iter().zip(read.into_iter().chain(std::iter::repeat(None)));
        // Arena bytes outside every pool (the part before the first aligned
        // pool, the tail after the last) hold nothing.
        let mut unused = resident_in(arena - arena % page_bytes, first_pool.min(arena_end));
        let mut holds_blocks = false;
        for &pool in &pools {
            let in_pool = resident_in(pool, pool + pool_bytes);
            census.resident_bytes += in_pool;
            if !resident(pool) {
                unused += in_pool;
                continue;
            }
            let header = read.next().and_then(|(_, h)| h);
            let Some(header) = header else {
                census.unreadable_pools += 1;
                census.fragmented_bytes += in_pool;
                continue;
            };
            if header.count == 0 {
                if header.maxnextoffset != 0 {
                    census.pools_empty += 1;
                }
                unused += in_pool;
                continue;
            }
            let block = (u64::from(header.szidx) + 1) * ALIGNMENT;
            let capacity = (pool_bytes - POOL_OVERHEAD) / block;
            if header.szidx as usize >= CLASSES || u64::from(header.count) > capacity {
                census.unreadable_pools += 1;
                census.fragmented_bytes += in_pool;
                continue;
            }
            holds_blocks = true;
            let allocated = u64::from(header.count) * block;
            let class = &mut classes[header.szidx as usize];
            class.block_bytes = block;
            class.blocks += u64::from(header.count);
            class.pools += 1;
            class.capacity += capacity;
            census.pools_used += 1;
            census.allocated_blocks += u64::from(header.count);
            census.allocated_blocks_bytes += allocated;
            census.free_in_used_pools_bytes += (capacity - u64::from(header.count)) * block;
            let live = allocated.min(in_pool);
            let slack = (POOL_OVERHEAD + (pool_bytes - POOL_OVERHEAD) % block).min(in_pool - live);
            census.live_bytes += live;
            census.slack_bytes += slack;
            census.fragmented_bytes += in_pool - live - slack;
        }
        let tail_start = pools.last().map_or(first_pool, |&p| p + pool_bytes).min(arena_end);
        unused += resident_in(tail_start.next_multiple_of(page_bytes), arena_end);
        census.resident_bytes += resident_in(arena - arena % page_bytes, first_pool.min(arena_end))
            + resident_in(tail_start.next_multiple_of(page_bytes), arena_end);
        if holds_blocks {
            census.fragmented_bytes += unused;
            census.empty_pool_bytes += unused;
        } else {
            census.retained_bytes += unused;
        }
        let rows = ArenaRows {
            address: arena,
            allocated_blocks: census.allocated_blocks - before.0,
            live_bytes: census.live_bytes - before.1,
            slack_bytes: census.slack_bytes - before.2,
            fragmented_bytes: census.fragmented_bytes - before.3,
            retained_bytes: census.retained_bytes - before.4,
        };
        if rows.resident_bytes() > 0 {
            census.arena_rows.push(rows);
        }
    }
    census.arena_rows.sort_by_key(|r| r.address);
    census.size_classes = classes.into_iter().filter(|c| c.pools > 0).collect();
    census
}

const FIELDS: [&str; 16] = [
    "snapshot_time",
    "arenas",
    "arena_bytes",
    "pool_bytes",
    "resident_bytes",
    "pools_used",
    "pools_empty",
    "allocated_blocks",
    "allocated_blocks_bytes",
    "free_in_used_pools_bytes",
    "live_bytes",
    "slack_bytes",
    "fragmented_bytes",
    "retained_bytes",
    "unreadable_pools",
    "empty_pool_bytes",
];

impl Census {
    /// The arena holding `address`, if it has resident pages.
    pub fn arena_at(&self, address: u64) -> Option<&ArenaRows> {
        let size = self.arena_bytes.checked_div(self.arenas).unwrap_or(0);
        let i = self.arena_rows.partition_point(|a| a.address <= address);
        self.arena_rows[..i].last().filter(|a| address < a.address + size)
    }

    fn fields(&self) -> [u64; 16] {
        [
            self.snapshot_time,
            self.arenas,
            self.arena_bytes,
            self.pool_bytes,
            self.resident_bytes,
            self.pools_used,
            self.pools_empty,
            self.allocated_blocks,
            self.allocated_blocks_bytes,
            self.free_in_used_pools_bytes,
            self.live_bytes,
            self.slack_bytes,
            self.fragmented_bytes,
            self.retained_bytes,
            self.unreadable_pools,
            self.empty_pool_bytes,
        ]
    }

    /// The METRICS record that carries it in the trace.
    pub fn to_metrics(&self, monotonic_ns: u64) -> Metrics {
        let mut values: Vec<(String, f64)> = FIELDS.iter().zip(self.fields()).map(|(name, v)| (name.to_string(), v as f64)).collect();
        for c in &self.size_classes {
            values.push((format!("class[{}]:blocks", c.block_bytes), c.blocks as f64));
            values.push((format!("class[{}]:pools", c.block_bytes), c.pools as f64));
            values.push((format!("class[{}]:capacity", c.block_bytes), c.capacity as f64));
        }
        for a in &self.arena_rows {
            for (field, value) in [
                ("blocks", a.allocated_blocks),
                ("live", a.live_bytes),
                ("slack", a.slack_bytes),
                ("fragmented", a.fragmented_bytes),
                ("retained", a.retained_bytes),
            ] {
                values.push((format!("arena[{:#x}]:{field}", a.address), value as f64));
            }
        }
        Metrics { monotonic_ns, source: SOURCE.into(), kind: KIND.into(), values }
    }

    /// Read back from a METRICS record (None for another kind of record).
    pub fn from_metrics(m: &Metrics) -> Option<Census> {
        if m.source != SOURCE || m.kind != KIND {
            return None;
        }
        let get = |name: &str| m.get(name).filter(|v| v.is_finite() && *v >= 0.0).map_or(0, |v| v as u64);
        let [
            snapshot_time,
            arenas,
            arena_bytes,
            pool_bytes,
            resident_bytes,
            pools_used,
            pools_empty,
            allocated_blocks,
            allocated_blocks_bytes,
            free_in_used_pools_bytes,
            live_bytes,
            slack_bytes,
            fragmented_bytes,
            retained_bytes,
            unreadable_pools,
            empty_pool_bytes,
        ] = FIELDS.map(get);
        let mut classes: Vec<SizeClass> = Vec::new();
        let mut arena_rows: Vec<ArenaRows> = Vec::new();
        for (name, value) in &m.values {
            if let Some((address, field)) = name.strip_prefix("arena[0x").and_then(|rest| rest.split_once("]:")) {
                let Ok(address) = u64::from_str_radix(address, 16) else { continue };
                let value = if value.is_finite() && *value >= 0.0 { *value as u64 } else { 0 };
                // Written arena by arena: a new address starts a new arena.
                if arena_rows.last().is_none_or(|a| a.address != address) {
                    arena_rows.push(ArenaRows { address, ..ArenaRows::default() });
                }
                let arena = arena_rows.last_mut().expect("just pushed");
                match field {
                    "blocks" => arena.allocated_blocks = value,
                    "live" => arena.live_bytes = value,
                    "slack" => arena.slack_bytes = value,
                    "fragmented" => arena.fragmented_bytes = value,
                    "retained" => arena.retained_bytes = value,
                    _ => {}
                }
                continue;
            }
            let Some((size, field)) = name.strip_prefix("class[").and_then(|rest| rest.split_once("]:")) else { continue };
            let Ok(block_bytes) = size.parse::<u64>() else { continue };
            let value = if value.is_finite() && *value >= 0.0 { *value as u64 } else { 0 };
            let class = match classes.iter_mut().find(|c| c.block_bytes == block_bytes) {
                Some(class) => class,
                None => {
                    classes.push(SizeClass { block_bytes, ..SizeClass::default() });
                    classes.last_mut().expect("just pushed")
                }
            };
            match field {
                "blocks" => class.blocks = value,
                "pools" => class.pools = value,
                "capacity" => class.capacity = value,
                _ => {}
            }
        }
        classes.sort_by_key(|c| c.block_bytes);
        arena_rows.sort_by_key(|a| a.address);
        arena_rows.dedup_by_key(|a| a.address);
        Some(Census {
            snapshot_time,
            arenas,
            arena_bytes,
            pool_bytes,
            resident_bytes,
            pools_used,
            pools_empty,
            allocated_blocks,
            allocated_blocks_bytes,
            free_in_used_pools_bytes,
            live_bytes,
            slack_bytes,
            fragmented_bytes,
            retained_bytes,
            unreadable_pools,
            empty_pool_bytes,
            size_classes: classes,
            arena_rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const PAGE: u64 = 4096;
    const POOL: u64 = 16 << 10;
    const ARENA: u64 = 1 << 20;

    fn header(count: u32, szidx: u32) -> PoolHeader {
        PoolHeader { count, szidx, maxnextoffset: 1 }
    }

    #[test]
    fn parses_the_x86_64_pool_header() {
        let mut bytes = [0u8; 48];
        bytes[0..4].copy_from_slice(&7u32.to_le_bytes());
        bytes[36..40].copy_from_slice(&3u32.to_le_bytes());
        bytes[44..48].copy_from_slice(&16320u32.to_le_bytes());
        assert_eq!(PoolHeader::parse(&bytes), Some(PoolHeader { count: 7, szidx: 3, maxnextoffset: 16320 }));
        assert_eq!(PoolHeader::parse(&bytes[..40]), None);
    }

    /// Two arenas: the first unaligned (so 63 pools), with a full pool of
    /// 64-byte blocks, a pool with one 512-byte block and an empty pool;
    /// the second holds no block (the empty arena pymalloc keeps).
    #[test]
    fn splits_arenas_into_rows_that_add_up_to_their_resident_pages() {
        let a = 0x7f00_0000_1000u64;
        let b = 0x7f00_0020_0000u64;
        let first = a.next_multiple_of(POOL);
        let pools: HashMap<u64, PoolHeader> = [
            (first, header(((POOL - 48) / 64) as u32, 3)),
            (first + POOL, header(1, 31)),
            (first + 2 * POOL, header(0, 5)),
            (b, PoolHeader { count: 0, szidx: 0, maxnextoffset: 0 }),
        ]
        .into();
        // Resident: the three pools of arena a whole, the first page of the
        // second pool's... all four pages; arena b's first pool's first page.
        let resident = |p: u64| (p >= first && p < first + 3 * POOL) || (p >= b && p < b + PAGE);
        let census = census(&[a, b], ARENA, POOL, PAGE, resident, |addrs| addrs.iter().map(|p| pools.get(p).copied()).collect());
        assert_eq!(census.arenas, 2);
        assert_eq!((census.pools_used, census.pools_empty), (2, 1));
        let full = (POOL - 48) / 64;
        assert_eq!(census.allocated_blocks, full + 1);
        assert_eq!(census.allocated_blocks_bytes, full * 64 + 512);
        assert_eq!(census.free_in_used_pools_bytes, ((POOL - 48) / 512 - 1) * 512);
        assert_eq!(census.resident_bytes, 3 * POOL + PAGE);
        assert_eq!(census.live_bytes, full * 64 + 512);
        assert_eq!(census.slack_bytes, 48 + (POOL - 48) % 64 + 48 + (POOL - 48) % 512);
        // The empty pool sits in an arena that holds blocks: fragmented.
        assert_eq!(census.fragmented_bytes, POOL - 512 - 48 - (POOL - 48) % 512 + POOL);
        assert_eq!(census.retained_bytes, PAGE);
        assert_eq!(census.empty_pool_bytes, POOL);
        assert_eq!(census.live_bytes + census.slack_bytes + census.fragmented_bytes + census.retained_bytes, census.resident_bytes);
        assert_eq!(
            census.size_classes.iter().map(|c| (c.block_bytes, c.blocks, c.pools)).collect::<Vec<_>>(),
            vec![(64, full, 1), (512, 1, 1)]
        );
        assert!((census.size_classes[0].occupancy() - 1.0).abs() < 1e-9);
        // Per arena: a's blocks and fragmentation, b's retained page.
        let [ra, rb] = census.arena_rows[..] else { panic!("{:?}", census.arena_rows) };
        assert_eq!(
            (ra.address, ra.allocated_blocks, ra.live_bytes, ra.fragmented_bytes),
            (a, full + 1, census.live_bytes, census.fragmented_bytes)
        );
        assert_eq!((rb.address, rb.retained_bytes, rb.live_bytes), (b, PAGE, 0));
        assert_eq!(census.arena_rows.iter().map(ArenaRows::resident_bytes).sum::<u64>(), census.resident_bytes);
        assert_eq!(census.arena_at(first + 5).map(|r| r.address), Some(a));
        assert_eq!(census.arena_at(b + ARENA - 1).map(|r| r.address), Some(b));
        assert_eq!(census.arena_at(b + ARENA), None);
        assert_eq!(census.arena_at(a - 1), None);
        assert!(ra.fill().is_some_and(|f| f > 0) && rb.fill().is_none());
    }

    #[test]
    fn nonsense_headers_are_counted_not_trusted() {
        let a = 0x7f00_0000_0000u64;
        let resident = |p: u64| p < a + POOL;
        let census = census(&[a], ARENA, POOL, PAGE, resident, |addrs| addrs.iter().map(|_| Some(header(100_000, 7))).collect());
        assert_eq!((census.unreadable_pools, census.allocated_blocks), (1, 0));
        assert_eq!(census.fragmented_bytes, POOL);
        let unread = super::census(&[a], ARENA, POOL, PAGE, resident, |_| Vec::new());
        assert_eq!((unread.unreadable_pools, unread.fragmented_bytes), (1, POOL));
    }

    #[test]
    fn goes_through_a_metrics_record_unchanged() {
        let a = 0x7f00_0000_0000u64;
        let mut census = census(&[a], ARENA, POOL, PAGE, |p| p < a + 2 * POOL, |addrs| addrs.iter().map(|_| Some(header(3, 1))).collect());
        census.snapshot_time = 42;
        assert_eq!(census.arena_rows.len(), 1);
        let back = Census::from_metrics(&census.to_metrics(7)).unwrap();
        assert_eq!(back, census);
        assert_eq!(back.size_classes[0].block_bytes, 32);
        assert!(Census::from_metrics(&Metrics { source: "ruby".into(), ..Metrics::default() }).is_none());
    }
}
