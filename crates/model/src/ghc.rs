//! The GHC ledger: a Haskell program's RSS split by the RTS's own layers
//! (OS → megablocks → blocks → objects), at every garbage collection, from
//! the METRICS records (source `ghc`) a GHC adapter wrote, the RSS samples
//! and the snapshots' smaps LazyFree. And the verdict: pinned fragmentation
//! (dead objects kept in pinned blocks by one live neighbour, and the RTS
//! then keeping (F+2)× that "live" data as free blocks) versus an RTS that
//! is only slow to give memory back (MADV_FREE).
//!
//! Rows at a GC, summing to the RSS sampled after it:
//!
//! | row | from |
//! |---|---|
//! | `live` | HEAP_LIVE (last major GC) |
//! | `heap_blocks_not_live` | blocks allocated − live: nursery, slop, dead objects in pinned blocks |
//! | `megablock_free` | free blocks inside the megablocks the RTS holds |
//! | `block_descriptors` | the first 16 KiB of every megablock (bdescr area) |
//! | `lazy_free` | smaps LazyFree: megablocks returned with MADV_FREE, counted until memory pressure |
//! | `non_heap` | RSS − heap size − lazy_free: code, C heap, stacks, RTS tables |
//!
//! Blocks allocated come from BLOCKS_SIZE (GHC ≥ 9.2) or, for older RTSs,
//! from GC_STATS_GHC's fragmentation figure, which ghc/ghc `rts/Stats.c`
//! computes as (megablocks × 252 − allocated blocks) × 4 KiB: the same
//! number, exactly.

use std::collections::BTreeMap;
use std::path::Path;

use memgap_replay::Timeline;
use memgap_trace::records::{Metrics, Record, Records};
/// The names of the RTS's figures, which also key [`GhcReport::rts_summary`].
pub use memgap_trace::vocabulary::ghc as names;
use memgap_trace::vocabulary::kind;
use memgap_trace::{TraceError, TraceFile};
use serde::{Deserialize, Serialize};

use crate::ledger::MappingClass;

/// Usable blocks per 1 MiB megablock (the first 16 KiB hold descriptors).
const BLOCKS_PER_MBLOCK: u64 = 252;
const BLOCK_BYTES: u64 = 4096;
const MBLOCK_BYTES: u64 = 1 << 20;
const CLOCK_SLACK_NS: u64 = 5_000_000;

/// What the model needs, on one clock (nanoseconds).
#[derive(Debug, Clone, Default)]
pub struct GhcInput {
    /// METRICS records with source `ghc`.
    pub metrics: Vec<Metrics>,
    /// (time, VmRSS) in time order.
    pub rss: Vec<(u64, u64)>,
    /// (time, smaps LazyFree summed over mappings) in time order.
    pub lazy_free: Vec<(u64, u64)>,
    /// Time zero of the report (process start).
    pub origin_ns: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GhcRows {
    pub live: u64,
    pub heap_blocks_not_live: i64,
    pub megablock_free: i64,
    pub block_descriptors: u64,
    /// None without smaps (an eventlog read on its own without LazyFree).
    pub lazy_free: Option<u64>,
    /// RSS − heap size − lazy_free; None without RSS.
    pub non_heap: Option<i64>,
}

impl GhcRows {
    pub fn named(&self) -> Vec<(&'static str, Option<i64>)> {
        vec![
            ("live", Some(self.live as i64)),
            ("heap_blocks_not_live", Some(self.heap_blocks_not_live)),
            ("megablock_free", Some(self.megablock_free)),
            ("block_descriptors", Some(self.block_descriptors as i64)),
            ("lazy_free", self.lazy_free.map(|v| v as i64)),
            ("non_heap", self.non_heap),
        ]
    }
}

/// Generations counted at most (`+RTS -G`; a corrupt eventlog may name any):
/// tables are indexed by generation.
const MAX_GENERATIONS: u32 = 256;

/// The ledger after one garbage collection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GhcPoint {
    pub seconds: f64,
    pub generation: Option<u32>,
    /// A collection of the oldest generation (live data measured now).
    pub major: bool,
    pub capability: Option<u32>,
    pub rss_bytes: Option<u64>,
    pub heap_size_bytes: u64,
    pub blocks_size_bytes: u64,
    /// BLOCKS_SIZE was in the log (GHC ≥ 9.2); else derived from GC_STATS_GHC.
    pub blocks_size_reported: bool,
    /// Live bytes as of the last major GC.
    pub live_bytes: u64,
    pub copied_bytes: u64,
    /// Major GCs: live bytes the GC did not copy, i.e. in pinned blocks and
    /// large objects, which never move (live − copied).
    pub unmoved_bytes: Option<u64>,
    /// smaps LazyFree of the snapshot used for this GC (see [`place_lazy_free`]).
    pub lazy_free_smaps_bytes: Option<u64>,
    /// Megablocks returned at this GC × 1 MiB (MEM_RETURN, GHC ≥ 9.2); not a
    /// row: once returned they leave RSS, or move to lazy_free.
    pub returned_bytes: Option<u64>,
    pub rows: GhcRows,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityGcs {
    /// None for collections logged outside any capability's buffer.
    pub capability: Option<u32>,
    /// Collections by generation collected: index = generation.
    pub by_generation: Vec<u64>,
}

/// One -hT census: how much of the profiled heap is ARR_WORDS (byte arrays,
/// where pinned ones count whole pinned blocks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinnedShare {
    pub seconds: f64,
    pub arr_words_bytes: u64,
    pub total_bytes: u64,
    pub share: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GhcVerdict {
    pub pinned_fragmentation: bool,
    pub lazy_free: bool,
    /// The GC the pinned-fragmentation finding rests on.
    pub at_seconds: Option<f64>,
    /// The most LazyFree while the program ran, and RSS then: what the
    /// lazy_free finding rests on (0 without it).
    pub lazy_free_bytes: u64,
    pub lazy_free_rss_bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GhcReport {
    pub ghc_version: Option<String>,
    pub collections: u64,
    pub major_collections: u64,
    /// Highest HEAP_LIVE (what `+RTS -s` calls maximum residency).
    pub max_live_bytes: u64,
    /// Highest HEAP_SIZE (what `+RTS -s` calls total memory in use).
    pub max_heap_size_bytes: u64,
    pub peak_rss_bytes: Option<u64>,
    pub gcs_per_capability: Vec<CapabilityGcs>,
    /// One point per GC.
    pub timeline: Vec<GhcPoint>,
    /// The major GC the pinned-fragmentation finding rests on, else the last
    /// major GC before the program's final one (its exit GC), if any.
    pub settled: Option<GhcPoint>,
    /// -hT censuses; empty without -hT.
    pub pinned_share: Vec<PinnedShare>,
    /// `+RTS -s` figures when the program printed them.
    pub rts_summary: BTreeMap<String, f64>,
    /// The last `-Dg` memory inventory when the program printed one.
    pub inventory: BTreeMap<String, f64>,
    pub verdict: GhcVerdict,
}

/// LazyFree for each point: from the snapshot nearest to it taken while
/// the heap had the same size (between the GC that set that size and the
/// next GC that changed it). LazyFree changes when the RTS returns
/// megablocks, at GCs that shrink the heap, or when the program touches
/// them again as the heap grows; a snapshot across such a change
/// describes another state. None where no snapshot fits.
///
/// `points` are (GC start, GC end, heap size). Snapshots closer than
/// [`CLOCK_SLACK_NS`] to the next change are left out: the eventlog's clock
/// is tied to the trace's through the wall clock, to a millisecond or so.
fn lazy_free_per_point(points: &[(u64, u64, u64)], snapshots: &[(u64, u64)]) -> Vec<Option<u64>> {
    let mut out = vec![None; points.len()];
    let mut start = 0;
    while start < points.len() {
        let heap = points[start].2;
        let end = (start..points.len()).find(|&i| points[i].2 != heap).unwrap_or(points.len());
        let from = points[start].1;
        let until = points.get(end).map_or(u64::MAX, |p| p.0.saturating_sub(CLOCK_SLACK_NS));
        let inside: Vec<(u64, u64)> = snapshots.iter().copied().filter(|&(t, _)| t >= from && t < until).collect();
        for i in start..end {
            out[i] = nearest(&inside, points[i].1);
        }
        start = end;
    }
    out
}

fn nearest(series: &[(u64, u64)], time: u64) -> Option<u64> {
    let i = series.partition_point(|&(t, _)| t < time);
    let after = series.get(i);
    let before = i.checked_sub(1).and_then(|j| series.get(j));
    match (before, after) {
        (Some(b), Some(a)) => Some(if time - b.0 <= a.0 - time { b.1 } else { a.1 }),
        (Some(x), None) | (None, Some(x)) => Some(x.1),
        (None, None) => None,
    }
}

/// Where LazyFree sits: first in RSS beyond the heap's megablocks (returned
/// megablocks), the rest in the free blocks of megablocks the RTS took back
/// from the OS and has not written since (those pages stay lazily free), so
/// it moves out of `megablock_free`. The rows then add up to RSS exactly;
/// LazyFree beyond both is not placed (`lazy_free_smaps_bytes` keeps it).
fn place_lazy_free(point: &mut GhcPoint) {
    let rows = &mut point.rows;
    let Some(rss) = point.rss_bytes else {
        rows.lazy_free = point.lazy_free_smaps_bytes;
        return;
    };
    let outside = (rss as i64 - point.heap_size_bytes as i64).max(0) as u64;
    let lazy = point.lazy_free_smaps_bytes.unwrap_or(0);
    let lazy_outside = lazy.min(outside);
    let lazy_in_heap = (lazy - lazy_outside).min(rows.megablock_free.max(0) as u64);
    rows.megablock_free -= lazy_in_heap as i64;
    rows.lazy_free = point.lazy_free_smaps_bytes.map(|_| lazy_outside + lazy_in_heap);
    rows.non_heap = Some(rss as i64 - point.heap_size_bytes as i64 - lazy_outside as i64);
}

/// The first RSS sample after `time` (the one that shows what a GC freed).
fn at_or_after(series: &[(u64, u64)], time: u64) -> Option<u64> {
    let i = series.partition_point(|&(t, _)| t < time);
    series.get(i).or_else(|| series.last()).map(|&(_, v)| v)
}

impl GhcReport {
    /// The last -hT census taken at or before `seconds` (a census runs
    /// inside a major GC, before the GC's end is logged), else the first.
    pub fn census_at(&self, seconds: f64) -> Option<&PinnedShare> {
        self.pinned_share.iter().rev().find(|c| c.seconds <= seconds).or(self.pinned_share.first())
    }

    /// The GC before `seconds`, whose figures hold until the next one.
    pub fn point_at(&self, seconds: f64) -> Option<&GhcPoint> {
        self.timeline.iter().rev().find(|p| p.seconds <= seconds).or(self.timeline.first())
    }

    /// The report as the ledger of a snapshot at `seconds` carries it:
    /// every figure of the run, but of its GCs and censuses only those the
    /// snapshot's rows and the verdict rest on. A program logs a GC every
    /// few milliseconds, and a copy of them all in every snapshot's ledger
    /// grew with GCs × snapshots.
    pub fn as_of(&self, seconds: f64) -> GhcReport {
        let pinned_at = self.verdict.at_seconds.filter(|_| self.verdict.pinned_fragmentation);
        let gc = self.point_at(seconds).map(|p| p.seconds);
        let timeline = self.timeline.iter().filter(|p| Some(p.seconds) == gc || Some(p.seconds) == pinned_at).cloned().collect();
        let censuses: Vec<f64> = [pinned_at, self.settled.as_ref().map(|p| p.seconds)]
            .into_iter()
            .flatten()
            .filter_map(|at| self.census_at(at))
            .map(|c| c.seconds)
            .collect();
        GhcReport {
            ghc_version: self.ghc_version.clone(),
            collections: self.collections,
            major_collections: self.major_collections,
            max_live_bytes: self.max_live_bytes,
            max_heap_size_bytes: self.max_heap_size_bytes,
            peak_rss_bytes: self.peak_rss_bytes,
            gcs_per_capability: self.gcs_per_capability.clone(),
            timeline,
            settled: self.settled.clone(),
            pinned_share: self.pinned_share.iter().filter(|c| censuses.contains(&c.seconds)).cloned().collect(),
            rts_summary: self.rts_summary.clone(),
            inventory: self.inventory.clone(),
            verdict: self.verdict.clone(),
        }
    }
}

/// Builds the report; None without GHC GC records, `-s` summary or `-Dg`
/// inventory.
pub fn report(input: &GhcInput) -> Option<GhcReport> {
    let ghc: Vec<&Metrics> = input.metrics.iter().filter(|m| m.source == NAME).collect();
    let seconds = |ns: u64| ns.saturating_sub(input.origin_ns) as f64 / 1e9;
    let mut out = GhcReport::default();
    if let Some(info) = ghc.iter().find(|m| m.kind == kind::INFO)
        && let (Some(major), Some(minor)) = (info.get(names::VERSION_MAJOR), info.get(names::VERSION_MINOR))
    {
        out.ghc_version = Some(format!("{major}.{minor}.{}", info.get(names::VERSION_PATCH).unwrap_or(0.0)));
    }
    let mut live = 0u64;
    let mut times = Vec::new();
    let mut by_cap: BTreeMap<Option<u32>, Vec<u64>> = BTreeMap::new();
    let max_generation = ghc
        .iter()
        .filter(|m| m.kind == kind::GC)
        .filter_map(|m| m.get(names::GENERATION))
        .filter(|&g| g < f64::from(MAX_GENERATIONS))
        .fold(0.0, f64::max) as u32;
    for gc in ghc.iter().filter(|m| m.kind == kind::GC) {
        let Some(heap_size) = gc.get(names::HEAP_SIZE_BYTES).map(|v| v as u64) else { continue };
        let generation = gc.get(names::GENERATION).map(|g| g as u32).filter(|&g| g < MAX_GENERATIONS);
        let capability = gc.get(names::CAPABILITY).map(|c| c as u32);
        out.collections += 1;
        let counts = by_cap.entry(capability).or_default();
        if let Some(generation) = generation {
            if counts.len() <= generation as usize {
                counts.resize(generation as usize + 1, 0);
            }
            counts[generation as usize] += 1;
        }
        let measured_live = gc.get(names::LIVE_BYTES).map(|v| v as u64);
        let major = measured_live.is_some() || (generation == Some(max_generation) && max_generation > 0);
        if let Some(l) = measured_live {
            live = l;
            out.max_live_bytes = out.max_live_bytes.max(l);
        }
        if major {
            out.major_collections += 1;
        }
        out.max_heap_size_bytes = out.max_heap_size_bytes.max(heap_size);
        let copied = gc.get(names::COPIED_BYTES).unwrap_or(0.0) as u64;
        let mblocks = heap_size / MBLOCK_BYTES;
        let descriptors = mblocks * (MBLOCK_BYTES - BLOCKS_PER_MBLOCK * BLOCK_BYTES);
        let (blocks, reported) = match (gc.get(names::BLOCKS_SIZE_BYTES), gc.get(names::FRAGMENTATION_BYTES)) {
            (Some(blocks), _) => (blocks as u64, true),
            (None, Some(frag)) => ((mblocks * BLOCKS_PER_MBLOCK * BLOCK_BYTES).saturating_sub(frag as u64), false),
            (None, None) => (heap_size - descriptors, false),
        };
        let rss = at_or_after(&input.rss, gc.monotonic_ns);
        let point = GhcPoint {
            seconds: seconds(gc.monotonic_ns),
            generation,
            major,
            capability,
            rss_bytes: rss,
            heap_size_bytes: heap_size,
            blocks_size_bytes: blocks,
            blocks_size_reported: reported,
            live_bytes: live,
            copied_bytes: copied,
            unmoved_bytes: measured_live.map(|l| l.saturating_sub(copied)),
            lazy_free_smaps_bytes: None,
            returned_bytes: gc.get(names::MEM_RETURNED_MBLOCKS).map(|m| m as u64 * MBLOCK_BYTES),
            rows: GhcRows {
                live,
                heap_blocks_not_live: blocks as i64 - live as i64,
                megablock_free: heap_size as i64 - blocks as i64 - descriptors as i64,
                block_descriptors: descriptors,
                lazy_free: None,
                non_heap: None,
            },
        };
        out.timeline.push(point);
        times.push((gc.monotonic_ns.saturating_sub(gc.get(names::DURATION_NS).unwrap_or(0.0) as u64), gc.monotonic_ns, heap_size));
    }
    for (point, lazy_free) in out.timeline.iter_mut().zip(lazy_free_per_point(&times, &input.lazy_free)) {
        point.lazy_free_smaps_bytes = lazy_free;
        place_lazy_free(point);
    }
    out.peak_rss_bytes = input.rss.iter().map(|&(_, v)| v).max();
    out.gcs_per_capability = by_cap.into_iter().map(|(capability, by_generation)| CapabilityGcs { capability, by_generation }).collect();
    let majors: Vec<&GhcPoint> = out.timeline.iter().filter(|p| p.unmoved_bytes.is_some()).collect();
    // The RTS collects once more at exit, when nothing is live any more.
    out.settled = match majors.len() {
        0 => None,
        1 => Some(majors[0].clone()),
        n => Some(majors[n - 2].clone()),
    };
    for census in ghc.iter().filter(|m| m.kind == kind::HEAP_PROFILE && m.get(names::BREAKDOWN) == Some(7.0)) {
        let labels = census.values.iter().filter(|(n, _)| n != names::BREAKDOWN && n != names::ERA);
        let total: f64 = labels.clone().map(|&(_, v)| v).sum();
        let arr_words = census.get("ARR_WORDS").unwrap_or(0.0);
        out.pinned_share.push(PinnedShare {
            seconds: seconds(census.monotonic_ns),
            arr_words_bytes: arr_words as u64,
            total_bytes: total as u64,
            share: if total > 0.0 { arr_words / total } else { 0.0 },
        });
    }
    for (kind, target) in [(kind::RTS_SUMMARY, &mut out.rts_summary), (kind::INVENTORY, &mut out.inventory)] {
        if let Some(m) = ghc.iter().rev().find(|m| m.kind == kind) {
            target.extend(m.values.iter().cloned());
        }
    }
    if out.timeline.is_empty() && out.rts_summary.is_empty() && out.inventory.is_empty() {
        return None;
    }
    out.verdict = verdict(&out);
    // The point a pinned-fragmentation finding rests on is the one to show.
    if let Some(at) = out.verdict.at_seconds {
        out.settled = out.timeline.iter().find(|p| p.seconds == at && p.unmoved_bytes.is_some()).cloned().or(out.settled);
    }
    Some(out)
}

/// Pinned fragmentation is judged at major GCs (live data measured, and
/// after a major copying GC every movable object is compacted): most of
/// the live bytes were not copied (they sit in pinned blocks or are large
/// objects), and the heap and RSS stay at least twice the live data. With
/// -hT, the ARR_WORDS share at the nearest census is quoted too.
fn verdict(report: &GhcReport) -> GhcVerdict {
    let mut verdict = GhcVerdict::default();
    let candidate = report
        .timeline
        .iter()
        .filter(|p| {
            let Some(unmoved) = p.unmoved_bytes else { return false };
            let live = p.live_bytes.max(1);
            let resident = p.rss_bytes.map(|rss| rss.saturating_sub(p.rows.lazy_free.unwrap_or(0)));
            unmoved >= 4 << 20 && unmoved * 2 >= live && p.heap_size_bytes >= 2 * live && resident.is_none_or(|r| r >= 2 * live)
        })
        .max_by_key(|p| p.heap_size_bytes.saturating_sub(p.copied_bytes));
    if let Some(p) = candidate {
        verdict.pinned_fragmentation = true;
        verdict.at_seconds = Some(p.seconds);
    }
    // LazyFree while the program ran (up to the settled major GC: the RTS's
    // final GC at exit frees everything, and says nothing about the run).
    let until = report.settled.as_ref().map_or(f64::INFINITY, |p| p.seconds);
    let lazy = report
        .timeline
        .iter()
        .filter(|p| p.seconds <= until)
        .filter_map(|p| Some((p.rows.lazy_free?, p.rss_bytes?)))
        .max_by_key(|&(lazy, _)| lazy);
    if let Some((lazy, rss)) = lazy.filter(|&(lazy, rss)| lazy >= 16 << 20 && lazy * 4 >= rss) {
        verdict.lazy_free = true;
        verdict.lazy_free_bytes = lazy;
        verdict.lazy_free_rss_bytes = rss;
    }
    verdict
}

/// Reads the GHC records, RSS samples and snapshot LazyFree of a trace.
/// None when the trace holds no GHC records.
pub fn report_of_trace(path: &Path) -> Result<Option<GhcReport>, TraceError> {
    let trace = TraceFile::open(path)?;
    let mut timeline = Timeline::default();
    let mut started = false;
    let mut origin_ns = 0;
    let mut metrics = Vec::new();
    let mut rss_times = Vec::new();
    let mut lazy_times = Vec::new();
    trace.for_each_chunk(|_, chunk| {
        for record in Records::new(chunk).flatten() {
            match record {
                Record::Process(p) if !started => {
                    timeline.start(&p);
                    origin_ns = p.start_monotonic_ns;
                    started = true;
                }
                Record::Clock(c) => timeline.add(&c),
                Record::Rss(r) => rss_times.push((r.time, r.vm_rss)),
                Record::Snapshot(s) => lazy_times.push((s.time, s.mappings.iter().map(|m| m.lazy_free).sum::<u64>())),
                Record::Metrics(m) if m.source == NAME => metrics.push(m),
                _ => {}
            }
        }
        Ok(())
    })?;
    if metrics.is_empty() {
        return Ok(None);
    }
    let convert = |series: Vec<(u64, u64)>| {
        let mut out: Vec<(u64, u64)> = series.into_iter().map(|(t, v)| (timeline.monotonic_ns(t), v)).collect();
        out.sort_by_key(|&(t, _)| t);
        out
    };
    let input = GhcInput { metrics, rss: convert(rss_times), lazy_free: convert(lazy_times), origin_ns };
    Ok(report(&input))
}

/// The owner is named as its source.
pub const NAME: &str = memgap_trace::vocabulary::source::GHC;
/// The RTS reserves its whole heap address space up front (1 TiB by
/// default, `-xr`), and commits megablocks inside it: a run of adjacent
/// anonymous mappings at least this large is the GHC heap.
const RESERVATION_MIN: u64 = 64 << 30;
/// Below this a remedy is not worth a run.
const WORTH_TRYING: u64 = 1 << 20;

/// The GHC RTS as a heap owner. Its figures (the eventlog) are appended to
/// the trace after the program ends, so it takes its megablocks back from
/// `other` after the replay and splits them by the GC before each snapshot.
#[derive(Debug, Default)]
pub struct GhcOwner {
    metrics: Vec<Metrics>,
    rss: Vec<(u64, u64)>,
    lazy_free: Vec<(u64, u64)>,
    origin_ns: Option<u64>,
    report: Option<GhcReport>,
}

impl crate::ledger::HeapOwner for GhcOwner {
    fn name(&self) -> &'static str {
        NAME
    }

    fn present(&self) -> bool {
        !self.metrics.is_empty()
    }

    fn process(&mut self, process: &memgap_trace::records::Process) {
        self.origin_ns.get_or_insert(process.start_monotonic_ns);
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source == NAME {
            self.metrics.push(metrics.clone());
        }
    }

    fn rss(&mut self, rss: &memgap_trace::records::Rss) {
        self.rss.push((rss.time, rss.vm_rss));
    }

    fn snapshot_seen(&mut self, snapshot: &memgap_trace::records::Snapshot) {
        self.lazy_free.push((snapshot.time, snapshot.mappings.iter().map(|m| m.lazy_free).sum()));
    }

    fn replayed(&mut self, timeline: &Timeline) {
        if self.metrics.is_empty() {
            return;
        }
        let convert = |series: &[(u64, u64)]| {
            let mut out: Vec<(u64, u64)> = series.iter().map(|&(t, v)| (timeline.monotonic_ns(t), v)).collect();
            out.sort_by_key(|&(t, _)| t);
            out
        };
        let input = GhcInput {
            metrics: std::mem::take(&mut self.metrics),
            rss: convert(&self.rss),
            lazy_free: convert(&self.lazy_free),
            origin_ns: self.origin_ns.unwrap_or(0),
        };
        self.report = report(&input);
        self.metrics = input.metrics;
    }

    fn summary(&self) -> Option<crate::ledger::RuntimeSummary> {
        let report = self.report.as_ref()?;
        let peak = report.timeline.iter().max_by_key(|p| p.live_bytes)?;
        let capabilities = report.gcs_per_capability.iter().filter(|c| c.capability.is_some()).count() as u32;
        Some(crate::ledger::RuntimeSummary {
            owner: NAME,
            source: "eventlog".into(),
            peak_live_bytes: peak.live_bytes,
            peak_live_seconds: peak.seconds,
            live_bytes_at_end: report.timeline.last().map_or(0, |p| p.live_bytes),
            threads: (capabilities > 0).then_some(capabilities),
            threads_kind: "capabilities",
        })
    }

    fn gc_marks(&self, start_ns: u64) -> Vec<crate::ledger::GcMark> {
        self.metrics
            .iter()
            .filter(|m| m.kind == kind::GC)
            .map(|m| crate::ledger::GcMark {
                seconds: crate::owners::seconds_since(start_ns, m.monotonic_ns),
                source: NAME.into(),
                major: m.get(names::GENERATION).is_some_and(|g| g >= 1.0),
            })
            .collect()
    }

    fn annotate(&self, ledger: &mut crate::ledger::Ledger, taken: crate::ledger::owner::Taken) {
        let (Some(report), Some(monotonic_ns)) = (&self.report, taken.monotonic_ns) else { return };
        let seconds = monotonic_ns.saturating_sub(self.origin_ns.unwrap_or(0)) as f64 / 1e9;
        ledger.set_section(NAME, &report.as_of(seconds));
        let point = report.point_at(seconds);
        let (mut counted, mut lazy) = (0, 0);
        for index in heap_mappings(&ledger.mappings) {
            if let Some((c, l)) = ledger.reclaim(index, MappingClass::GhcHeap) {
                counted += c;
                lazy += l;
            }
        }
        let mut rows = crate::ledger::Rows { lazy_free: lazy, ..crate::ledger::Rows::default() };
        let estimated = match point {
            Some(p) => {
                let mut left = counted;
                let mut take = |bytes: u64| {
                    let taken = bytes.min(left);
                    left -= taken;
                    taken
                };
                rows.live = take(p.live_bytes);
                rows.fragmented = take(p.blocks_size_bytes.saturating_sub(p.live_bytes));
                rows.runtime = take(p.rows.block_descriptors);
                rows.retained = left;
                None
            }
            None => {
                rows.retained = counted;
                Some("no GC was logged: the RTS's resident megablocks are all counted as retained".to_string())
            }
        };
        ledger.owners.push(crate::ledger::OwnerShare { owner: NAME, rows, released_bytes: 0, estimated });
    }

    fn findings(&self, ledger: &crate::ledger::Ledger) -> Vec<crate::ledger::Finding> {
        let mut out = crate::owners::malloc::row_findings(ledger, NAME);
        let (Some(report), Some(part)) = (&self.report, ledger.share(NAME)) else { return out };
        if report.verdict.pinned_fragmentation {
            let bytes = part.rows.fragmented + part.rows.retained;
            out.push(crate::ledger::Finding {
                kind: "pinned_fragmentation",
                owner: NAME,
                bytes,
                share: crate::ledger::owner::share(bytes, ledger.rss_bytes),
            });
        }
        out
    }

    fn remedies(&self, _ledger: &crate::ledger::Ledger, findings: &[crate::ledger::Finding]) -> Vec<crate::ledger::Remedy> {
        use crate::ledger::Remedy;
        let bytes = |kind: &str| crate::owners::malloc::finding_bytes(findings, NAME, kind);
        let mut out = Vec::new();
        let lazy = bytes("lazy_free");
        if lazy >= WORTH_TRYING {
            out.push(Remedy::new(
                "ghc-return-memory-at-once",
                NAME,
                "return freed megablocks with MADV_DONTNEED, so RSS falls at once: GHCRTS=--disable-delayed-os-memory-return",
                &[("GHCRTS", "--disable-delayed-os-memory-return")],
                lazy,
            ));
        }
        let retained = bytes("retained");
        if retained >= WORTH_TRYING {
            // The RTS keeps free megablocks in proportion to live data
            // (-F, default 2): -F1.2 keeps (1.2 + 1) / (2 + 1) of them.
            out.push(Remedy::new(
                "ghc-smaller-factor",
                NAME,
                "keep fewer free megablocks after a major GC: GHCRTS=-F1.2",
                &[("GHCRTS", "-F1.2")],
                retained * 4 / 15,
            ));
        }
        let pinned = bytes("pinned_fragmentation");
        if pinned >= WORTH_TRYING {
            out.push(Remedy::new(
                "ghc-unpin-survivors",
                NAME,
                "keep long-lived byte strings unpinned (ShortByteString, Data.Text >= 2) or copy the retained slices (Data.ByteString.copy)",
                &[],
                pinned,
            ));
        }
        out
    }
}

/// Indexes of the GHC heap's committed mappings: the read-write parts of a
/// run of adjacent anonymous mappings spanning at least [`RESERVATION_MIN`].
fn heap_mappings(mappings: &[crate::ledger::MappingLedger]) -> Vec<usize> {
    let anonymous = |m: &crate::ledger::MappingLedger| {
        m.name.is_empty()
            && m.perms.ends_with('p')
            && matches!(m.class, MappingClass::ProgramMmap | MappingClass::Unclassified | MappingClass::Other)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < mappings.len() {
        if !anonymous(&mappings[i]) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < mappings.len() && anonymous(&mappings[j]) && mappings[j].start == mappings[j - 1].end {
            j += 1;
        }
        if mappings[j - 1].end - mappings[i].start >= RESERVATION_MIN {
            out.extend((i..j).filter(|&k| mappings[k].perms.starts_with("rw")));
        }
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn gc(ns: u64, generation: u32, heap: u64, live: Option<u64>, copied: u64, frag: u64) -> Metrics {
        let mut values = vec![
            (names::CAPABILITY.to_string(), 0.0),
            (names::GENERATION.into(), generation as f64),
            (names::COPIED_BYTES.into(), copied as f64),
            (names::FRAGMENTATION_BYTES.into(), frag as f64),
            (names::HEAP_SIZE_BYTES.into(), heap as f64),
        ];
        if let Some(live) = live {
            values.push((names::LIVE_BYTES.into(), live as f64));
        }
        Metrics { monotonic_ns: ns, source: "ghc".into(), kind: kind::GC.into(), values }
    }

    /// Figures from a real 9.0.2 run of tests/programs/ghc/pinned.hs (n = 1 M).
    fn strip() -> GhcInput {
        GhcInput {
            metrics: vec![
                gc(1_000, 0, 4 * MB, None, 1_000_000, 900_000),
                gc(787_000_000, 1, 189 * MB, Some(111_963_920), 80_004_400, 81_084_416),
                gc(1_900_000_000, 1, 155 * MB, Some(39_963_800), 8_003_768, 118_788_096),
                gc(2_047_000_000, 1, 32 * MB, Some(44_376), 3_328, 31_862_784),
            ],
            rss: vec![(0, 10 * MB), (800_000_000, 196 * MB), (1_950_000_000, 170 * MB), (2_100_000_000, 171 * MB)],
            lazy_free: vec![(0, 0), (1_950_000_000, 10 * MB)],
            origin_ns: 0,
        }
    }

    #[test]
    fn rows_add_up_to_rss_and_blocks_come_from_the_fragmentation_figure() {
        let report = report(&strip()).unwrap();
        let p = &report.timeline[2];
        assert!(p.major && !p.blocks_size_reported);
        // (155 × 252 blocks − frag) × … : the RTS's own formula, inverted.
        assert_eq!(p.blocks_size_bytes, 155 * 252 * 4096 - 118_788_096);
        assert_eq!(p.rows.block_descriptors, 155 * 16384);
        assert_eq!(p.rows.megablock_free, 118_788_096);
        let sum: i64 = p.rows.named().iter().map(|(_, v)| v.unwrap()).sum();
        assert_eq!(sum, p.rss_bytes.unwrap() as i64);
        assert_eq!(p.unmoved_bytes, Some(39_963_800 - 8_003_768));
        assert_eq!((report.max_live_bytes, report.max_heap_size_bytes), (111_963_920, 189 * MB));
        assert_eq!(report.gcs_per_capability, vec![CapabilityGcs { capability: Some(0), by_generation: vec![1, 3] }]);
        assert_eq!(report.settled.as_ref().map(|p| p.live_bytes), Some(39_963_800));
    }

    #[test]
    fn strided_survivors_in_pinned_blocks_are_pinned_fragmentation() {
        let report = report(&strip()).unwrap();
        assert!(report.verdict.pinned_fragmentation, "{:?}", report.verdict);
        assert_eq!(report.verdict.at_seconds, Some(1.9));
        assert!(!report.verdict.lazy_free);
    }

    #[test]
    fn a_closure_type_census_is_quoted_from_before_the_gc() {
        let mut input = strip();
        let census = |ns: u64, arr: f64, other: f64| Metrics {
            monotonic_ns: ns,
            source: "ghc".into(),
            kind: kind::HEAP_PROFILE.into(),
            values: vec![(names::BREAKDOWN.into(), 7.0), (names::ERA.into(), 1.0), ("ARR_WORDS".into(), arr), (":".into(), other)],
        };
        input.metrics.extend([census(1_800_000_000, 32.0 * MB as f64, 8.0 * MB as f64), census(1_950_000_000, 1.0, 0.0)]);
        let report = report(&input).unwrap();
        assert_eq!(report.pinned_share.len(), 2);
        assert_eq!(report.census_at(1.9).map(|c| (c.share, c.arr_words_bytes)), Some((0.8, 32 * MB)));
    }

    #[test]
    fn contiguous_survivors_are_not() {
        let mut input = strip();
        input.metrics[2] = gc(1_900_000_000, 1, 45 * MB, Some(11_225_176), 8_003_720, 34_029_568);
        input.lazy_free = vec![(0, 0), (1_950_000_000, 120 * MB)];
        let report = report(&input).unwrap();
        assert!(!report.verdict.pinned_fragmentation, "{:?}", report.verdict);
        assert!(report.verdict.lazy_free, "{:?}", report.verdict);
        assert_eq!(report.verdict.lazy_free_bytes, 120 * MB);
        assert_eq!(report.timeline[2].rows.lazy_free, Some(120 * MB));
    }

    #[test]
    fn lazy_free_inside_the_heap_comes_out_of_megablock_free() {
        let mut point = GhcPoint {
            rss_bytes: Some(100 * MB),
            heap_size_bytes: 80 * MB,
            lazy_free_smaps_bytes: Some(50 * MB),
            rows: GhcRows {
                live: 20 * MB,
                heap_blocks_not_live: 0,
                megablock_free: 59 * MB as i64,
                block_descriptors: MB,
                ..GhcRows::default()
            },
            ..GhcPoint::default()
        };
        place_lazy_free(&mut point);
        assert_eq!((point.rows.lazy_free, point.rows.megablock_free, point.rows.non_heap), (Some(50 * MB), 29 * MB as i64, Some(0)));
        let sum: i64 = point.rows.named().iter().map(|(_, v)| v.unwrap()).sum();
        assert_eq!(sum, 100 * MB as i64);
    }

    #[test]
    fn blocks_size_events_of_ghc_9_2_are_used_as_reported() {
        let mut input = strip();
        input.metrics[2].values.push((names::BLOCKS_SIZE_BYTES.into(), 50.0 * MB as f64));
        input.metrics[2].values.push((names::MEM_RETURNED_MBLOCKS.into(), 3.0));
        let report = report(&input).unwrap();
        let p = &report.timeline[2];
        assert!(p.blocks_size_reported);
        assert_eq!(p.blocks_size_bytes, 50 * MB);
        assert_eq!(p.returned_bytes, Some(3 * MB));
        assert_eq!(p.rows.megablock_free, (155 * MB - 50 * MB - 155 * 16384) as i64);
    }

    #[test]
    fn lazy_free_comes_from_a_snapshot_at_the_same_heap_size() {
        let series = [(10, 1), (20, 2), (40, 4)];
        assert_eq!(
            [nearest(&series, 0), nearest(&series, 14), nearest(&series, 16), nearest(&series, 31), nearest(&series, 99)],
            [Some(1), Some(1), Some(2), Some(4), Some(4)]
        );
        assert_eq!(nearest(&[], 5), None);
        // GCs at 0, 10 (heap 5), 20, 30 (heap 3), 50 (heap 1); snapshots at 12 and 60.
        let ms = 1_000_000;
        let points = [(0, 0, 5), (10 * ms, 10 * ms, 5), (20 * ms, 20 * ms, 3), (30 * ms, 30 * ms, 3), (50 * ms, 50 * ms, 1)];
        assert_eq!(lazy_free_per_point(&points, &[(12 * ms, 7), (60 * ms, 9)]), vec![Some(7), Some(7), None, None, Some(9)]);
        // A snapshot just before the next GC may be after it: left out.
        assert_eq!(lazy_free_per_point(&points, &[(17 * ms, 7)]), vec![None, None, None, None, None]);
    }

    #[test]
    fn no_gc_records_no_report() {
        assert_eq!(report(&GhcInput::default()), None);
    }
}
