//! NUMA records: the machine's nodes (TOPOLOGY), the node of every resident
//! heap page at a snapshot (PLACEMENT, written by the agent right after its
//! SNAPSHOT), and sampled memory accesses or page faults (MEMORY_SAMPLES,
//! written by `memgap run --numa`). Older readers skip all three by tag.

use crate::varint::{self, Cursor, Malformed};

/// `move_pages` status of a page that is not present (never touched, or
/// not resident according to mincore: not queried).
pub const NOT_PRESENT: i32 = -libc_errno::ENOENT;
/// `move_pages` status of the zero page or an unmapped address.
pub const FAULT: i32 = -libc_errno::EFAULT;

mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EFAULT: i32 = 14;
}

/// One NUMA node as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: Vec<u32>,
    /// MemTotal of the node, in bytes.
    pub memory_bytes: u64,
    /// SLIT distances to every node, in the order of the record's nodes (local = 10).
    pub distances: Vec<u32>,
}

/// The nodes of the machine the trace was recorded on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    pub nodes: Vec<NumaNode>,
}

/// Where the pages of one mapping sit: runs of pages with the same status,
/// covering the mapping from its start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MappingPlacement {
    pub start: u64,
    pub pages: u64,
    /// (status, pages): a node number (≥ 0), or a negative errno from
    /// move_pages: [`NOT_PRESENT`], [`FAULT`].
    pub runs: Vec<(i32, u64)>,
}

/// The node of the resident pages of each private writable anonymous
/// mapping, taken with the snapshot of the same `time`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// The time of the SNAPSHOT this belongs to.
    pub time: u64,
    pub page_size: u64,
    /// 1: every resident page was asked; k: one resident page in k was, and
    /// its node stands for the k pages from it (the agent's cost bound).
    pub stride: u32,
    /// 0, or the errno that made move_pages unusable (ENOSYS: a kernel
    /// without NUMA; EPERM…); then `mappings` is empty.
    pub error: i32,
    pub cost_ns: u64,
    pub mappings: Vec<MappingPlacement>,
}

impl Placement {
    /// An index of the runs for looking up pages: a mapping's runs can number
    /// as many as its pages, and walking them for each page is quadratic in
    /// a big heap's pages.
    pub fn index(&self) -> PlacementIndex<'_> {
        let run_starts = self
            .mappings
            .iter()
            .map(|m| {
                let mut next = 0u64;
                m.runs
                    .iter()
                    .map(|&(_, count)| {
                        let start = next;
                        next = next.saturating_add(count);
                        start
                    })
                    .collect()
            })
            .collect();
        PlacementIndex { placement: self, run_starts }
    }
}

/// [`Placement::index`]: each page's status in O(log runs).
pub struct PlacementIndex<'a> {
    placement: &'a Placement,
    /// Per mapping, the first page of each run.
    run_starts: Vec<Vec<u64>>,
}

impl PlacementIndex<'_> {
    /// Where the status of the page holding `addr` may next differ: the end
    /// of its run of pages, or, outside every mapping's pages, the start of
    /// the next mapping (`u64::MAX` past the last). Always above `addr`
    /// unless `addr` is `u64::MAX`, so that a walk over any range takes one
    /// step per run or mapping it crosses, not one per page.
    pub fn same_status_until(&self, addr: u64) -> u64 {
        let placement = self.placement;
        let page_size = placement.page_size.max(1);
        let next_mapping = |i: usize| placement.mappings.get(i).map_or(u64::MAX, |m| m.start.max(addr.saturating_add(1)));
        let i = match placement.mappings.partition_point(|m| m.start <= addr).checked_sub(1) {
            Some(i) => i,
            None => return next_mapping(0),
        };
        let m = &placement.mappings[i];
        let page = (addr - m.start) / page_size;
        if page >= m.pages {
            return next_mapping(i + 1);
        }
        let starts = &self.run_starts[i];
        let end_page = match starts.partition_point(|&start| start <= page).checked_sub(1) {
            Some(run) if page - starts[run] < m.runs[run].1 => starts[run].saturating_add(m.runs[run].1),
            // Past the last run, or before the first: status unknown up to the mapping's end.
            Some(_) | None => starts.iter().copied().find(|&start| start > page).unwrap_or(m.pages),
        };
        let end_page = end_page.min(m.pages).max(page + 1);
        m.start.saturating_add(end_page.saturating_mul(page_size)).max(addr.saturating_add(1))
    }

    /// The status of the page holding `addr`, if a mapping covers it.
    pub fn status_of(&self, addr: u64) -> Option<i32> {
        let placement = self.placement;
        let i = placement.mappings.partition_point(|m| m.start <= addr).checked_sub(1)?;
        let m = &placement.mappings[i];
        let page = (addr - m.start) / placement.page_size.max(1);
        if page >= m.pages {
            return None;
        }
        let starts = &self.run_starts[i];
        let run = starts.partition_point(|&start| start <= page).checked_sub(1)?;
        let (status, count) = m.runs[run];
        (page - starts[run] < count).then_some(status)
    }
}

/// Where memory samples came from.
pub const SOURCE_PAGE_FAULTS: &str = "page-faults";
pub const SOURCE_IBS_OP: &str = "ibs-op";
pub const SOURCE_PEBS_LOADS: &str = "pebs-mem-loads";

/// One sampled memory access (precise sampling) or page fault (first touch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemorySample {
    pub monotonic_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub addr: u64,
    /// The page's node as `memgap run` saw it right after the sample, or a
    /// negative errno (the page was gone already).
    pub node: i32,
    /// PERF_SAMPLE_DATA_SRC (0 for page faults).
    pub data_source: u64,
}

/// A batch of samples of one run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemorySamples {
    /// [`SOURCE_PAGE_FAULTS`], [`SOURCE_IBS_OP`], [`SOURCE_PEBS_LOADS`].
    pub source: String,
    /// Why precise access sampling was not used (empty when it was).
    pub precise_unavailable: String,
    /// Each sample stands for this many events.
    pub period: u64,
    /// When sampling started and ended (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    pub end_ns: u64,
    /// Samples the kernel dropped (ring buffer full).
    pub lost: u64,
    pub samples: Vec<MemorySample>,
}

pub(crate) fn encode_topology(b: &mut Vec<u8>, t: &Topology) {
    varint::push(b, t.nodes.len() as u64);
    for n in &t.nodes {
        varint::push(b, n.id.into());
        varint::push(b, n.memory_bytes);
        varint::push(b, n.cpus.len() as u64);
        for &cpu in &n.cpus {
            varint::push(b, cpu.into());
        }
        varint::push(b, n.distances.len() as u64);
        for &d in &n.distances {
            varint::push(b, d.into());
        }
    }
}

fn u32_of(v: u64) -> Result<u32, Malformed> {
    u32::try_from(v).map_err(|_| Malformed)
}

fn i32_of(v: i64) -> Result<i32, Malformed> {
    i32::try_from(v).map_err(|_| Malformed)
}

/// A count read from the body: each item takes at least one byte, so a
/// larger count is corruption (and must not size an allocation).
fn count(c: &mut Cursor<'_>, body_len: usize) -> Result<u64, Malformed> {
    let n = c.varint()?;
    if n > body_len as u64 { Err(Malformed) } else { Ok(n) }
}

pub(crate) fn decode_topology(c: &mut Cursor<'_>, body_len: usize) -> Result<Topology, Malformed> {
    let mut nodes = Vec::new();
    for _ in 0..count(c, body_len)? {
        let id = u32_of(c.varint()?)?;
        let memory_bytes = c.varint()?;
        let cpus = (0..count(c, body_len)?).map(|_| c.varint().and_then(u32_of)).collect::<Result<_, _>>()?;
        let distances = (0..count(c, body_len)?).map(|_| c.varint().and_then(u32_of)).collect::<Result<_, _>>()?;
        nodes.push(NumaNode { id, cpus, memory_bytes, distances });
    }
    Ok(Topology { nodes })
}

pub(crate) fn encode_placement(b: &mut Vec<u8>, p: &Placement) {
    for v in [p.time, p.page_size, p.stride.into(), varint::zigzag(p.error.into()), p.cost_ns] {
        varint::push(b, v);
    }
    varint::push(b, p.mappings.len() as u64);
    for m in &p.mappings {
        varint::push(b, m.start);
        varint::push(b, m.pages);
        varint::push(b, m.runs.len() as u64);
        for &(status, pages) in &m.runs {
            varint::push(b, varint::zigzag(status.into()));
            varint::push(b, pages);
        }
    }
}

pub(crate) fn decode_placement(c: &mut Cursor<'_>, body_len: usize) -> Result<Placement, Malformed> {
    let time = c.varint()?;
    let page_size = c.varint()?;
    let stride = u32_of(c.varint()?)?;
    let error = i32_of(c.signed()?)?;
    let cost_ns = c.varint()?;
    let mut mappings = Vec::new();
    for _ in 0..count(c, body_len)? {
        let start = c.varint()?;
        let pages = c.varint()?;
        let mut runs = Vec::new();
        for _ in 0..count(c, body_len)? {
            runs.push((i32_of(c.signed()?)?, c.varint()?));
        }
        mappings.push(MappingPlacement { start, pages, runs });
    }
    Ok(Placement { time, page_size, stride, error, cost_ns, mappings })
}

pub(crate) fn encode_samples(b: &mut Vec<u8>, s: &MemorySamples) {
    varint::push_bytes(b, s.source.as_bytes());
    varint::push_bytes(b, s.precise_unavailable.as_bytes());
    for v in [s.period, s.start_ns, s.end_ns, s.lost, s.samples.len() as u64] {
        varint::push(b, v);
    }
    // Times and addresses as deltas to the previous sample's.
    let (mut time, mut addr) = (0u64, 0u64);
    for x in &s.samples {
        varint::push(b, varint::zigzag(x.monotonic_ns.wrapping_sub(time) as i64));
        varint::push(b, x.pid.into());
        varint::push(b, x.tid.into());
        varint::push(b, x.cpu.into());
        varint::push(b, varint::zigzag(x.addr.wrapping_sub(addr) as i64));
        varint::push(b, varint::zigzag(x.node.into()));
        varint::push(b, x.data_source);
        (time, addr) = (x.monotonic_ns, x.addr);
    }
}

pub(crate) fn decode_samples(c: &mut Cursor<'_>, body_len: usize) -> Result<MemorySamples, Malformed> {
    let source = c.string()?;
    let precise_unavailable = c.string()?;
    let (period, start_ns, end_ns, lost) = (c.varint()?, c.varint()?, c.varint()?, c.varint()?);
    let n = count(c, body_len)?;
    let mut samples = Vec::with_capacity(n as usize);
    let (mut time, mut addr) = (0u64, 0u64);
    for _ in 0..n {
        time = time.wrapping_add(c.signed()? as u64);
        let pid = u32_of(c.varint()?)?;
        let tid = u32_of(c.varint()?)?;
        let cpu = u32_of(c.varint()?)?;
        addr = addr.wrapping_add(c.signed()? as u64);
        let node = i32_of(c.signed()?)?;
        let data_source = c.varint()?;
        samples.push(MemorySample { monotonic_ns: time, pid, tid, cpu, addr, node, data_source });
    }
    Ok(MemorySamples { source, precise_unavailable, period, start_ns, end_ns, lost, samples })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The index agrees with walking the runs page by page.
        #[test]
        fn the_index_agrees_with_the_runs(runs in proptest::collection::vec((-14i32..4, 1u64..5), 0..60), extra in 0u64..4, probes in proptest::collection::vec(0u64..400, 1..50)) {
            let pages = runs.iter().map(|r| r.1).sum::<u64>() + extra;
            let placement = Placement { page_size: 4096, stride: 1, mappings: vec![MappingPlacement { start: 0x100000, pages, runs: runs.clone() }], ..Placement::default() };
            let index = placement.index();
            for probe in probes {
                let walked = runs.iter().flat_map(|&(status, count)| std::iter::repeat_n(status, count as usize)).nth(probe as usize).filter(|_| probe < pages);
                proptest::prop_assert_eq!(index.status_of(0x100000 + probe * 4096 + 7), walked);
            }
        }

        /// Every address up to `same_status_until` has the status of the
        /// first, and the walk by it never stands still.
        #[test]
        fn same_status_until_is_a_run_of_one_status(runs in proptest::collection::vec((-14i32..4, 1u64..5), 0..30), extra in 0u64..4, probes in proptest::collection::vec(0u64..200 * 4096, 1..30)) {
            let pages = runs.iter().map(|r| r.1).sum::<u64>() + extra;
            let placement = Placement { page_size: 4096, stride: 1, mappings: vec![MappingPlacement { start: 0x100000, pages, runs }], ..Placement::default() };
            let index = placement.index();
            for probe in probes {
                let until = index.same_status_until(probe);
                proptest::prop_assert!(until > probe);
                let status = index.status_of(probe);
                let mut at = probe;
                while at < until.min(probe + 300 * 4096) {
                    proptest::prop_assert_eq!(index.status_of(at), status, "at {:#x}, from {:#x} until {:#x}", at, probe, until);
                    at = (at / 4096 + 1) * 4096;
                }
            }
        }
    }

    #[test]
    fn status_of_finds_the_run() {
        let placement = Placement {
            page_size: 4096,
            stride: 1,
            mappings: vec![
                MappingPlacement { start: 0x10000, pages: 4, runs: vec![(0, 2), (NOT_PRESENT, 1), (1, 1)] },
                MappingPlacement { start: 0x40000, pages: 1, runs: vec![(3, 1)] },
            ],
            ..Placement::default()
        };
        let p = placement.index();
        assert_eq!(p.status_of(0xffff), None);
        assert_eq!(p.status_of(0x10000), Some(0));
        assert_eq!(p.status_of(0x11fff), Some(0));
        assert_eq!(p.status_of(0x12000), Some(NOT_PRESENT));
        assert_eq!(p.status_of(0x13abc), Some(1));
        assert_eq!(p.status_of(0x14000), None);
        assert_eq!(p.status_of(0x40010), Some(3));
    }
}
