//! From eventlog events to METRICS records (source `ghc`). The names below,
//! spelled in `memgap_trace::vocabulary::ghc`, are the contract with
//! `memgap_model::ghc`:
//!
//! - kind `info` (once): `generations`, `max_heap_bytes`, `alloc_area_bytes`,
//!   `mblock_bytes`, `block_bytes`, `capabilities`, `threads_created`,
//!   `version_major`, `version_minor`, `version_patch`.
//! - kind `gc` (one per collection, at its end): `capability` (absent when
//!   the event came from no capability's buffer), `generation`,
//!   `duration_ns`, `allocated_bytes`, `copied_bytes`, `slop_bytes`,
//!   `fragmentation_bytes` (megablock capacity not in blocks), `par_threads`,
//!   `heap_size_bytes`, and when the RTS wrote them: `live_bytes` (major
//!   GCs), `blocks_size_bytes`, `mem_current_mblocks`, `mem_needed_mblocks`,
//!   `mem_returned_mblocks` (GHC ≥ 9.2).
//! - kind `heap_profile` (one per census): `breakdown` (the
//!   [`Breakdown`](crate::eventlog::Breakdown) code), `era`, then one value
//!   per label (closure type, type, cost-centre stack) in bytes.

use std::collections::BTreeMap;

use memgap_trace::records::Metrics;
use memgap_trace::vocabulary::{ghc as names, kind};

use crate::eventlog::{Breakdown, Event, EventKind, Eventlog, NO_CAPABILITY};

pub const SOURCE: &str = memgap_trace::vocabulary::source::GHC;

/// One garbage collection, gathered from GC_START to the next GC_START.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collection {
    pub start_ns: u64,
    pub end_ns: u64,
    pub capability: u16,
    pub generation: Option<u16>,
    pub values: Vec<(&'static str, f64)>,
}

/// Groups the per-GC events. Events come in time order; the RTS writes a
/// GC's figures between its GC_START and the next one (9.0.2 order:
/// GC_START, HEAP_ALLOCATED, GC_STATS_GHC, GC_END, [HEAP_LIVE], HEAP_SIZE;
/// 9.2 adds BLOCKS_SIZE and MEM_RETURN), so this keys on ids, not order.
pub fn collections(log: &Eventlog) -> Vec<Collection> {
    let mut gcs: Vec<Collection> = Vec::new();
    let mut open = false;
    for event in &log.events {
        let Event { time_ns, cap, kind } = event;
        if let EventKind::GcStart = kind {
            gcs.push(Collection { start_ns: *time_ns, end_ns: *time_ns, capability: *cap, ..Collection::default() });
            open = true;
            continue;
        }
        let Some(gc) = gcs.last_mut().filter(|_| open) else { continue };
        let mut set = |name: &'static str, value: f64| {
            gc.values.retain(|(n, _)| *n != name);
            gc.values.push((name, value));
        };
        match *kind {
            EventKind::GcEnd => gc.end_ns = *time_ns,
            EventKind::HeapAllocated { bytes } => set(names::ALLOCATED_BYTES, bytes as f64),
            EventKind::GcStats { generation, copied_bytes, slop_bytes, fragmentation_bytes, par_threads, .. } => {
                gc.generation = Some(generation);
                set(names::COPIED_BYTES, copied_bytes as f64);
                set(names::SLOP_BYTES, slop_bytes as f64);
                set(names::FRAGMENTATION_BYTES, fragmentation_bytes as f64);
                set(names::PAR_THREADS, f64::from(par_threads));
            }
            EventKind::HeapLive { bytes } => set(names::LIVE_BYTES, bytes as f64),
            EventKind::HeapSize { bytes } => set(names::HEAP_SIZE_BYTES, bytes as f64),
            EventKind::BlocksSize { bytes } => set(names::BLOCKS_SIZE_BYTES, bytes as f64),
            EventKind::MemReturn { current_mblocks, needed_mblocks, returned_mblocks } => {
                set(names::MEM_CURRENT_MBLOCKS, f64::from(current_mblocks));
                set(names::MEM_NEEDED_MBLOCKS, f64::from(needed_mblocks));
                set(names::MEM_RETURNED_MBLOCKS, f64::from(returned_mblocks));
            }
            _ => {}
        }
    }
    gcs
}

/// One heap-profile census.
#[derive(Debug, Clone, PartialEq)]
pub struct Census {
    pub time_ns: u64,
    pub era: u64,
    pub breakdown: Option<Breakdown>,
    /// (label, bytes) in the order the RTS wrote them.
    pub residency: Vec<(String, u64)>,
}

pub fn censuses(log: &Eventlog) -> Vec<Census> {
    let mut breakdown = None;
    let mut cost_centres: BTreeMap<u32, String> = BTreeMap::new();
    let mut out = Vec::new();
    let mut current: Option<Census> = None;
    for event in &log.events {
        match &event.kind {
            EventKind::HeapProfBegin { breakdown: b, .. } => breakdown = Some(*b),
            EventKind::HeapProfCostCentre { id, label, module, .. } => {
                cost_centres.insert(*id, format!("{module}.{label}"));
            }
            EventKind::HeapProfSampleBegin { era } => {
                out.extend(current.take());
                current = Some(Census { time_ns: event.time_ns, era: *era, breakdown, residency: Vec::new() });
            }
            EventKind::HeapProfSampleString { residency_bytes, label, .. } => {
                if let Some(census) = current.as_mut() {
                    census.residency.push((label.clone(), *residency_bytes));
                }
            }
            EventKind::HeapProfSampleCostCentre { residency_bytes, stack, .. } => {
                if let Some(census) = current.as_mut() {
                    let names: Vec<String> =
                        stack.iter().map(|id| cost_centres.get(id).cloned().unwrap_or_else(|| format!("cc{id}"))).collect();
                    census.residency.push((names.join(" < "), *residency_bytes));
                }
            }
            EventKind::HeapProfSampleEnd { .. } => out.extend(current.take()),
            _ => {}
        }
    }
    out.extend(current);
    out
}

/// `(major, minor, patch)` from an RTS identifier such as `GHC-9.0.2 rts_l`.
pub fn ghc_version(rts_identifier: &str) -> Option<(u32, u32, u32)> {
    let version = rts_identifier.strip_prefix("GHC-")?.split_whitespace().next()?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next().flatten().unwrap_or(0)))
}

/// Every METRICS record of a log; `to_monotonic` maps the eventlog's
/// nanoseconds since RTS start to the trace's clock.
pub fn to_metrics(log: &Eventlog, to_monotonic: impl Fn(u64) -> u64) -> Vec<Metrics> {
    let record = |time_ns: u64, kind: &str, values: Vec<(String, f64)>| Metrics {
        monotonic_ns: to_monotonic(time_ns),
        source: SOURCE.into(),
        kind: kind.into(),
        values,
    };
    let mut out = Vec::new();
    let mut info: Vec<(String, f64)> = Vec::new();
    let mut info_time = 0;
    for event in &log.events {
        if let EventKind::HeapInfo { generations, max_heap_bytes, alloc_area_bytes, mblock_bytes, block_bytes } = event.kind {
            info_time = event.time_ns;
            info.extend([
                (names::GENERATIONS.into(), f64::from(generations)),
                (names::MAX_HEAP_BYTES.into(), max_heap_bytes as f64),
                (names::ALLOC_AREA_BYTES.into(), alloc_area_bytes as f64),
                (names::MBLOCK_BYTES.into(), mblock_bytes as f64),
                (names::BLOCK_BYTES.into(), block_bytes as f64),
            ]);
            break;
        }
    }
    let count = |f: fn(&EventKind) -> bool| log.events.iter().filter(|e| f(&e.kind)).count() as f64;
    info.push((names::CAPABILITIES.into(), count(|k| matches!(k, EventKind::CapCreate { .. }))));
    info.push((names::THREADS_CREATED.into(), count(|k| matches!(k, EventKind::CreateThread { .. }))));
    if let Some((major, minor, patch)) = log.rts_identifier().and_then(ghc_version) {
        info.extend([
            (names::VERSION_MAJOR.into(), f64::from(major)),
            (names::VERSION_MINOR.into(), f64::from(minor)),
            (names::VERSION_PATCH.into(), f64::from(patch)),
        ]);
    }
    out.push(record(info_time, kind::INFO, info));
    for gc in collections(log) {
        let mut values = Vec::new();
        if gc.capability != NO_CAPABILITY {
            values.push((names::CAPABILITY.to_string(), f64::from(gc.capability)));
        }
        if let Some(generation) = gc.generation {
            values.push((names::GENERATION.into(), f64::from(generation)));
        }
        values.push((names::DURATION_NS.into(), gc.end_ns.saturating_sub(gc.start_ns) as f64));
        values.extend(gc.values.iter().map(|&(n, v)| (n.to_string(), v)));
        out.push(record(gc.end_ns, kind::GC, values));
    }
    for census in censuses(log) {
        let mut values = vec![
            (names::BREAKDOWN.to_string(), census.breakdown.map_or(0.0, |b| f64::from(b.code()))),
            (names::ERA.into(), census.era as f64),
        ];
        values.extend(census.residency.into_iter().map(|(label, bytes)| (label, bytes as f64)));
        out.push(record(census.time_ns, kind::HEAP_PROFILE, values));
    }
    out
}

/// CLOCK_MONOTONIC nanoseconds of the RTS's time zero. The eventlog counts
/// from RTS start; its WALL_CLOCK_TIME event pairs one of its timestamps
/// with the epoch, and the trace's PROCESS record pairs the agent's start
/// with both clocks, so the offset follows without assuming the two
/// starts coincide. Without that event, the process start stands in.
pub fn rts_start_monotonic(log: &Eventlog, process_start_monotonic_ns: u64, process_start_realtime_ns: u64) -> u64 {
    let wall = log.events.iter().find_map(|e| match e.kind {
        EventKind::WallClockTime { seconds, nanoseconds } => {
            Some((e.time_ns, seconds.saturating_mul(1_000_000_000).saturating_add(u64::from(nanoseconds))))
        }
        _ => None,
    });
    match wall {
        Some((rts_ns, realtime_ns)) => {
            let rts_zero_realtime = realtime_ns as i128 - rts_ns as i128;
            let monotonic = process_start_monotonic_ns as i128 + (rts_zero_realtime - process_start_realtime_ns as i128);
            monotonic.clamp(0, u64::MAX as i128) as u64
        }
        None => process_start_monotonic_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eventlog::{build::LogBuilder, parse};

    fn two_gcs() -> Eventlog {
        let mut b = LogBuilder::new();
        let mut heap_info = 0u32.to_be_bytes().to_vec();
        heap_info.extend_from_slice(&2u16.to_be_bytes());
        for v in [0u64, 1 << 20, 1 << 20, 4096] {
            heap_info.extend_from_slice(&v.to_be_bytes());
        }
        b.event(52, 1, &heap_info);
        b.event(45, 1, &0u16.to_be_bytes());
        b.var_event(29, 1, b"\0\0\0\0GHC-9.2.8 rts_l\0");
        // A minor GC (9.0.2 layout) …
        b.event(9, 10, &[]).heap(49, 11, 1000).gc_stats(12, 0, 100, 10, 1 << 19).event(10, 13, &[]).heap(50, 14, 2 << 20);
        // … and a major one with the 9.2 events.
        b.block(20, 0, 10 + 22 + 68 + 10).event(9, 20, &[]).heap(49, 21, 2000).gc_stats(22, 1, 300, 30, 1 << 18).event(10, 25, &[]);
        b.heap(51, 26, 5000).heap(50, 27, 3 << 20).heap(91, 28, 2 << 20).mem_return(29, 3, 2, 1);
        parse(&b.end()).unwrap()
    }

    #[test]
    fn groups_events_by_collection() {
        let gcs = collections(&two_gcs());
        assert_eq!(gcs.len(), 2);
        assert_eq!((gcs[0].generation, gcs[0].start_ns, gcs[0].end_ns), (Some(0), 10, 13));
        assert_eq!(
            gcs[0].values,
            vec![
                (names::ALLOCATED_BYTES, 1000.0),
                (names::COPIED_BYTES, 100.0),
                (names::SLOP_BYTES, 10.0),
                (names::FRAGMENTATION_BYTES, 524288.0),
                (names::PAR_THREADS, 1.0),
                (names::HEAP_SIZE_BYTES, 2097152.0)
            ]
        );
        let major: BTreeMap<_, _> = gcs[1].values.iter().cloned().collect();
        assert_eq!(gcs[1].generation, Some(1));
        assert_eq!(major[names::LIVE_BYTES], 5000.0);
        assert_eq!(major[names::BLOCKS_SIZE_BYTES], 2097152.0);
        assert_eq!(
            (major[names::MEM_CURRENT_MBLOCKS], major[names::MEM_NEEDED_MBLOCKS], major[names::MEM_RETURNED_MBLOCKS]),
            (3.0, 2.0, 1.0)
        );
    }

    #[test]
    fn metrics_carry_info_gcs_and_shifted_times() {
        let metrics = to_metrics(&two_gcs(), |ns| ns + 1_000);
        assert!(metrics.iter().all(|m| m.source == "ghc"));
        let info = &metrics[0];
        assert_eq!(info.kind, kind::INFO);
        assert_eq!(
            (info.get(names::GENERATIONS), info.get(names::BLOCK_BYTES), info.get(names::CAPABILITIES)),
            (Some(2.0), Some(4096.0), Some(1.0))
        );
        assert_eq!(
            (info.get(names::VERSION_MAJOR), info.get(names::VERSION_MINOR), info.get(names::VERSION_PATCH)),
            (Some(9.0), Some(2.0), Some(8.0))
        );
        let gcs: Vec<&Metrics> = metrics.iter().filter(|m| m.kind == kind::GC).collect();
        assert_eq!(gcs.len(), 2);
        assert_eq!(gcs[1].monotonic_ns, 1_025);
        assert_eq!(
            (gcs[1].get(names::CAPABILITY), gcs[1].get(names::GENERATION), gcs[1].get(names::DURATION_NS)),
            (Some(0.0), Some(1.0), Some(5.0))
        );
        assert_eq!((gcs[0].get(names::LIVE_BYTES), gcs[0].get(names::CAPABILITY)), (None, None));
    }

    #[test]
    fn heap_profile_censuses_become_records() {
        let mut b = LogBuilder::new();
        b.var_event(160, 1, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0]);
        b.event(162, 5, &1u64.to_be_bytes()).sample_string(5, 8192, "ARR_WORDS").sample_string(5, 4096, ":").event(
            165,
            5,
            &1u64.to_be_bytes(),
        );
        let metrics = to_metrics(&parse(&b.end()).unwrap(), |ns| ns);
        let census = metrics.iter().find(|m| m.kind == kind::HEAP_PROFILE).unwrap();
        assert_eq!(
            census.values,
            vec![(names::BREAKDOWN.into(), 7.0), (names::ERA.into(), 1.0), ("ARR_WORDS".into(), 8192.0), (":".into(), 4096.0)]
        );
    }

    #[test]
    fn rts_time_zero_comes_from_the_wall_clock_event() {
        let mut b = LogBuilder::new();
        let mut p = 0u32.to_be_bytes().to_vec();
        p.extend_from_slice(&100u64.to_be_bytes());
        p.extend_from_slice(&500u32.to_be_bytes());
        let log = parse(&b.event(43, 2_000, &p).end()).unwrap();
        // Wall clock 100 s + 500 ns at RTS time 2000 ns: RTS zero is realtime 99_999_998_500.
        // The agent started at realtime 99_999_998_000 = monotonic 7_000.
        assert_eq!(rts_start_monotonic(&log, 7_000, 99_999_998_000), 7_500);
        assert_eq!(rts_start_monotonic(&parse(&LogBuilder::new().end()).unwrap(), 7_000, 1), 7_000);
    }

    #[test]
    fn versions() {
        assert_eq!(ghc_version("GHC-9.0.2 rts_l"), Some((9, 0, 2)));
        assert_eq!(ghc_version("GHC-9.10 rts_thr"), Some((9, 10, 0)));
        assert_eq!(ghc_version("nhc"), None);
    }
}
