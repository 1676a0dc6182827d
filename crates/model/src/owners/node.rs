//! Node.js: V8's heap, a layer of its own beside the malloc layer.
//!
//! V8 maps its heap with libc's mmap, which the agent records: every heap
//! page (256 KiB, `kPageSize`), large-object page and the code range starts
//! on a 256 KiB boundary (`MemoryChunk` alignment), and Node itself maps no
//! anonymous memory. So the program's anonymous mmaps that start on such a
//! boundary are V8's. Its figures (process.memoryUsage(), the heap spaces)
//! come from memgap's sampler, appended to the trace at exit, so the owner
//! lays its layer over each ledger afterwards: it takes those mappings back
//! from `other` and splits their resident bytes with the spaces of every
//! isolate alive (main thread and workers) at their last sample: used →
//! live, available inside committed pages of old, code and large-object
//! spaces → fragmented, the rest (the unused semi-space, pages V8 pools or
//! has not filled) → retained. `external` and `arrayBuffers` live in malloc
//! blocks and stay in the malloc owner's rows.

use std::collections::BTreeMap;

use memgap_trace::records::{Metrics, Process};
use memgap_trace::vocabulary::kind;
use serde::{Deserialize, Serialize};

use crate::human_bytes;
use crate::ledger::owner::{Taken, share};
use crate::ledger::{Finding, GcMark, HeapOwner, Ledger, MappingClass, OwnerShare, Remedy, Rows};

/// The owner is named as its source.
pub const NAME: &str = SOURCE;
pub const SOURCE: &str = memgap_trace::vocabulary::source::NODE;
/// V8's MemoryChunk alignment (kPageSize on 64-bit builds).
pub const V8_CHUNK_ALIGN: u64 = 256 << 10;
/// The owners that serve malloc, where Buffers and external memory live.
pub const MALLOC_OWNERS: [&str; 5] =
    [super::glibc::NAME, super::jemalloc::NAME, super::tcmalloc::NAME, super::mimalloc::NAME, super::malloc::UNKNOWN_MALLOC];
/// Below this a finding or remedy is not worth a run.
const WORTH_TRYING: u64 = 1 << 20;
/// Resident V8 mappings and the spaces' physical sizes further apart than
/// this share (and 1 MiB) make the split an estimate.
const STALE_SHARE: f64 = 0.10;

/// One V8 heap space, summed over the isolates alive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpaceFigures {
    pub name: String,
    /// Committed (space_size).
    pub size: u64,
    pub used: u64,
    pub available: u64,
    pub physical: u64,
}

/// Garbage collections the sampler saw (PerformanceObserver `gc` entries),
/// summed over the isolates alive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GcCounts {
    pub minor: u64,
    pub major: u64,
    pub incremental: u64,
    pub weak_callbacks: u64,
    pub total_ms: f64,
}

/// What Node and V8 say at one snapshot (each isolate's last sample before it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeLayer {
    pub version: String,
    pub v8_version: String,
    /// The oldest of the samples used, seconds since the process started.
    pub sampled_at_seconds: f64,
    /// Why the main thread's sample was taken: `start`, `gc`, `major_gc`, `exit`.
    pub sample_kind: String,
    /// Isolates whose figures are summed (the main thread and live workers).
    pub isolates: u32,
    /// process.memoryUsage(), summed over the isolates (rss: the main thread's reading).
    pub heap_total_bytes: u64,
    pub heap_used_bytes: u64,
    pub external_bytes: u64,
    pub array_buffers_bytes: u64,
    pub rss_bytes: u64,
    /// v8.getHeapStatistics(): V8's own malloc'd memory, and the heap limit.
    pub malloced_bytes: u64,
    pub heap_size_limit_bytes: u64,
    pub spaces: Vec<SpaceFigures>,
    pub gcs: GcCounts,
    /// V8's mappings in the snapshot (anonymous mmaps of the program on 256 KiB boundaries).
    pub v8_mappings: u32,
    pub v8_resident_bytes: u64,
    /// The new space's committed bytes not in use (the idle semi-space and
    /// the free part of the active one).
    pub semi_space_unused_bytes: u64,
    /// Old-space bytes in use after the last major GC of the isolate that
    /// holds most (a limit such as --max-old-space-size applies per isolate).
    pub old_space_used_after_major_gc_bytes: Option<u64>,
    /// What the old spaces held more after their last major GC than after
    /// their first, summed over the isolates.
    pub old_space_growth_bytes: u64,
    /// The most array buffers (Buffers among them) the isolates held at one
    /// sample, up to this snapshot: what passed through malloc.
    pub array_buffers_peak_bytes: u64,
}

impl NodeLayer {
    pub fn space(&self, name: &str) -> Option<&SpaceFigures> {
        self.spaces.iter().find(|s| s.name == name)
    }
}

/// The samples of one isolate, in time order.
#[derive(Debug, Default)]
struct Isolate {
    samples: Vec<Metrics>,
}

/// Node as a heap owner (see the module's comment).
#[derive(Debug, Default)]
pub struct NodeOwner {
    isolates: BTreeMap<u64, Isolate>,
    version: Option<String>,
    v8_version: Option<String>,
    start_monotonic_ns: Option<u64>,
}

fn value(m: &Metrics, name: &str) -> u64 {
    m.get(name).filter(|v| v.is_finite() && *v >= 0.0).map_or(0, |v| v as u64)
}

impl NodeOwner {
    /// Each isolate's last sample at or before `monotonic_ns`; a worker whose
    /// last sample is its exit is gone.
    fn samples_at(&self, monotonic_ns: u64) -> Vec<(u64, &Metrics)> {
        self.isolates
            .iter()
            .filter_map(|(&thread, isolate)| {
                let last = isolate.samples.iter().rev().find(|m| m.monotonic_ns <= monotonic_ns)?;
                (thread == 0 || last.kind != kind::EXIT).then_some((thread, last))
            })
            .collect()
    }

    /// The most array-buffer bytes the isolates held at once (each isolate
    /// at its samples) up to `monotonic_ns`.
    fn array_buffers_peak(&self, monotonic_ns: u64) -> u64 {
        let mut current: BTreeMap<u64, u64> = BTreeMap::new();
        let mut samples: Vec<(u64, &Metrics)> = self
            .isolates
            .iter()
            .flat_map(|(&t, i)| i.samples.iter().map(move |m| (t, m)))
            .filter(|(_, m)| m.monotonic_ns <= monotonic_ns)
            .collect();
        samples.sort_by_key(|(_, m)| m.monotonic_ns);
        let mut peak = 0;
        for (thread, m) in samples {
            current.insert(thread, if m.kind == kind::EXIT && thread != 0 { 0 } else { value(m, "array_buffers") });
            peak = peak.max(current.values().sum());
        }
        peak
    }

    /// The layer at `monotonic_ns`, before it meets a ledger.
    pub fn layer_at(&self, monotonic_ns: u64) -> Option<NodeLayer> {
        let samples = self.samples_at(monotonic_ns);
        if samples.is_empty() {
            return None;
        }
        let start = self.start_monotonic_ns.unwrap_or(0);
        let mut layer = NodeLayer {
            version: self.version.clone().unwrap_or_default(),
            v8_version: self.v8_version.clone().unwrap_or_default(),
            isolates: samples.len() as u32,
            sampled_at_seconds: f64::INFINITY,
            ..NodeLayer::default()
        };
        let mut spaces: Vec<SpaceFigures> = Vec::new();
        for &(thread, m) in &samples {
            layer.sampled_at_seconds = layer.sampled_at_seconds.min(crate::owners::seconds_since(start, m.monotonic_ns));
            if thread == 0 || layer.sample_kind.is_empty() {
                layer.sample_kind = m.kind.clone();
                layer.rss_bytes = value(m, "rss");
            }
            layer.heap_total_bytes += value(m, "heap_total");
            layer.heap_used_bytes += value(m, "heap_used");
            layer.external_bytes += value(m, "external");
            layer.array_buffers_bytes += value(m, "array_buffers");
            layer.malloced_bytes += value(m, "malloced_memory");
            layer.heap_size_limit_bytes = layer.heap_size_limit_bytes.max(value(m, "heap_size_limit"));
            layer.gcs.minor += value(m, "gc_minor");
            layer.gcs.major += value(m, "gc_major");
            layer.gcs.incremental += value(m, "gc_incremental");
            layer.gcs.weak_callbacks += value(m, "gc_weak_callbacks");
            layer.gcs.total_ms += m.get("gc_ms").filter(|v| v.is_finite() && *v >= 0.0).unwrap_or(0.0);
            for (name, _) in &m.values {
                let Some(space) = name.strip_suffix(".size") else { continue };
                let figures = SpaceFigures {
                    name: space.to_string(),
                    size: value(m, name),
                    used: value(m, &format!("{space}.used")),
                    available: value(m, &format!("{space}.available")),
                    physical: value(m, &format!("{space}.physical")),
                };
                match spaces.iter_mut().find(|s| s.name == space) {
                    Some(s) => {
                        s.size += figures.size;
                        s.used += figures.used;
                        s.available += figures.available;
                        s.physical += figures.physical;
                    }
                    None => spaces.push(figures),
                }
            }
        }
        layer.semi_space_unused_bytes = spaces.iter().filter(|s| s.name == "new_space").map(|s| s.size.saturating_sub(s.used)).sum();
        layer.spaces = spaces;
        for isolate in self.isolates.values() {
            let majors: Vec<u64> = isolate
                .samples
                .iter()
                .filter(|m| m.kind == kind::MAJOR_GC && m.monotonic_ns <= monotonic_ns)
                .map(|m| value(m, "old_space.used"))
                .collect();
            if let (Some(&first), Some(&last)) = (majors.first(), majors.last()) {
                layer.old_space_used_after_major_gc_bytes = Some(layer.old_space_used_after_major_gc_bytes.unwrap_or(0).max(last));
                layer.old_space_growth_bytes += last.saturating_sub(first);
            }
        }
        layer.array_buffers_peak_bytes = self.array_buffers_peak(monotonic_ns).max(layer.array_buffers_bytes);
        Some(layer)
    }
}

/// Whether a space's free bytes inside its committed pages are fragmentation
/// (old, code, large-object spaces) rather than room kept for allocation
/// (the new space's semi-spaces).
fn fragments(space: &str) -> bool {
    !space.starts_with("new_")
}

impl HeapOwner for NodeOwner {
    fn name(&self) -> &'static str {
        NAME
    }

    fn present(&self) -> bool {
        !self.isolates.is_empty()
    }

    fn process(&mut self, process: &Process) {
        self.start_monotonic_ns.get_or_insert(process.start_monotonic_ns);
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source != SOURCE || metrics.kind == kind::META {
            return;
        }
        let thread = value(metrics, "thread");
        let isolate = self.isolates.entry(thread).or_default();
        let at = isolate.samples.partition_point(|m| m.monotonic_ns <= metrics.monotonic_ns);
        isolate.samples.insert(at, metrics.clone());
    }

    fn note(&mut self, text: &str) {
        if let Some(rest) = text.strip_prefix("node ") {
            let (version, v8) = match rest.split_once(" (V8 ") {
                Some((version, v8)) => (version, Some(v8.trim_end_matches(')'))),
                None => (rest, None),
            };
            self.version = Some(version.to_string());
            self.v8_version = v8.map(str::to_string);
        }
    }

    fn gc_marks(&self, start_ns: u64) -> Vec<GcMark> {
        self.isolates
            .values()
            .flat_map(|i| &i.samples)
            .filter(|m| m.kind == kind::MAJOR_GC)
            .map(|m| GcMark { seconds: crate::owners::seconds_since(start_ns, m.monotonic_ns), source: NAME.into(), major: true })
            .collect()
    }

    fn annotate(&self, ledger: &mut Ledger, taken: Taken) {
        if let Some(layer) = taken.monotonic_ns.and_then(|ns| self.layer_at(ns)) {
            attach(ledger, layer);
        }
    }

    fn findings(&self, ledger: &Ledger) -> Vec<Finding> {
        let (Some(part), Some(layer)) = (ledger.share(NAME), ledger.section::<NodeLayer>(NAME)) else { return Vec::new() };
        let mut out = Vec::new();
        let mut push = |kind: &'static str, bytes: u64| {
            if bytes >= WORTH_TRYING {
                out.push(Finding { kind, owner: NAME, bytes, share: share(bytes, ledger.rss_bytes) });
            }
        };
        // The idle semi-space, as far as it is resident, out of the retained row.
        let semi = layer.semi_space_unused_bytes.min(part.rows.retained);
        push("semi_space", semi);
        push("retained", part.rows.retained - semi);
        push("fragmented", part.rows.fragmented);
        push("v8_heap_growth", layer.old_space_growth_bytes);
        // Buffers and other external memory churn through malloc: its gap is
        // the malloc owner's finding; this one ties it to Node.
        let malloc_gap: u64 =
            ledger.owners.iter().filter(|s| MALLOC_OWNERS.contains(&s.owner)).map(|s| s.rows.fragmented + s.rows.retained).sum();
        if layer.array_buffers_peak_bytes >= WORTH_TRYING {
            push("buffer_churn", malloc_gap);
        }
        out
    }

    fn remedies(&self, ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        let Some(layer) = ledger.section::<NodeLayer>(NAME) else { return Vec::new() };
        let bytes = |kind: &str| crate::owners::malloc::finding_bytes(findings, NAME, kind);
        let mib = |b: u64| b.div_ceil(1 << 20);
        let mut out = Vec::new();
        let semi = bytes("semi_space");
        if semi >= WORTH_TRYING {
            // A semi-space of 1 MiB: the new space commits at most 2 of them.
            let saving = semi.saturating_sub(2 << 20).max(semi / 2);
            out.push(Remedy::new(
                "node-semi-space",
                NAME,
                "a smaller young generation, so less of it sits committed and unused between scavenges: NODE_OPTIONS=--max-semi-space-size=1 (MiB; more scavenges)",
                &[("NODE_OPTIONS", "--max-semi-space-size=1")],
                saving,
            ));
        }
        let old = layer.space("old_space");
        let old_slack = old.map_or(0, |s| s.size.saturating_sub(s.used));
        let growth = bytes("v8_heap_growth");
        if old_slack >= WORTH_TRYING || growth >= WORTH_TRYING {
            // Twice what survived the last major GC (at least 64 MiB): V8
            // collects harder as it nears the limit instead of growing.
            let live_old = layer.old_space_used_after_major_gc_bytes.or(old.map(|s| s.used)).unwrap_or(0);
            let limit = mib(live_old * 2).max(64);
            if limit * (1 << 20) < layer.heap_size_limit_bytes {
                out.push(Remedy::new(
                    "node-max-old-space-size",
                    NAME,
                    format!("cap V8's old space at {limit} MiB (twice what survived the last major GC), so it collects before it grows: NODE_OPTIONS=--max-old-space-size={limit}"),
                    &[("NODE_OPTIONS", &format!("--max-old-space-size={limit}"))],
                    old_slack,
                ));
            }
        }
        if growth >= WORTH_TRYING {
            out.push(Remedy::new(
                "node-heap-snapshots",
                NAME,
                format!(
                    "find what keeps growing: the old space held {} more after the last major GC than after the first; compare two heap snapshots (v8.writeHeapSnapshot(), or node --heapsnapshot-signal=SIGUSR2)",
                    human_bytes(growth)
                ),
                &[],
                growth,
            ));
        }
        let churn = bytes("buffer_churn");
        let on_glibc = ledger.owners.iter().any(|s| s.owner == super::glibc::NAME);
        if churn >= WORTH_TRYING && on_glibc {
            out.push(Remedy::new(
                "node-jemalloc",
                NAME,
                "serve Buffers and other external memory from jemalloc, which returns freed pages on its own: LD_PRELOAD=libjemalloc.so.2 (Debian: libjemalloc2)",
                &[("LD_PRELOAD", "libjemalloc.so.2")],
                churn,
            ));
        }
        out
    }
}

/// Adds the layer to the ledger: its section, and V8's mappings (taken back
/// from `other`) as its share.
pub fn attach(ledger: &mut Ledger, mut layer: NodeLayer) {
    let (mut resident, mut lazy, mut mappings) = (0, 0, 0);
    for index in 0..ledger.mappings.len() {
        let m = &ledger.mappings[index];
        if m.class != MappingClass::ProgramMmap || !m.start.is_multiple_of(V8_CHUNK_ALIGN) {
            continue;
        }
        if let Some((counted, lazily_freed)) = ledger.reclaim(index, MappingClass::V8Heap) {
            resident += counted;
            lazy += lazily_freed;
            mappings += 1;
        }
    }
    layer.v8_mappings = mappings;
    layer.v8_resident_bytes = resident + lazy;
    let used: u64 = layer.spaces.iter().map(|s| s.used).sum();
    let free_in_pages: u64 =
        layer.spaces.iter().filter(|s| fragments(&s.name)).map(|s| s.available.min(s.size.saturating_sub(s.used))).sum();
    let committed: u64 = layer.spaces.iter().map(|s| s.size).sum();
    let physical: u64 = layer.spaces.iter().map(|s| s.physical).sum();
    // V8 commits a page when it allocates into it: what its mappings hold
    // beyond the spaces' physical size at the sample was committed since,
    // for objects.
    let grown = resident.saturating_sub(physical);
    let live = (used + grown).min(resident);
    let fragmented = free_in_pages.min(resident - live);
    let rows = Rows { live, fragmented, retained: resident - live - fragmented, lazy_free: lazy, ..Rows::default() };
    let apart = resident.abs_diff(physical);
    let estimated = (apart > WORTH_TRYING && apart as f64 > STALE_SHARE * resident.max(1) as f64).then(|| {
        let since = if grown > 0 { format!("; the {} committed since are counted as live", human_bytes(grown)) } else { String::new() };
        format!(
            "V8's figures are from its last sample ({}, at {:.2} s): its spaces then held {} physical, its mappings hold {} resident at the snapshot{since}",
            layer.sample_kind.replace('_', " "),
            layer.sampled_at_seconds,
            human_bytes(physical),
            human_bytes(resident + lazy)
        )
    });
    ledger.owners.push(OwnerShare { owner: NAME, rows, released_bytes: committed.saturating_sub(resident + lazy), estimated });
    ledger.set_section(NAME, &layer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::MappingLedger;

    fn sample(ns: u64, kind: &str, thread: u64, values: &[(&str, f64)]) -> Metrics {
        let mut all = vec![("thread".to_string(), thread as f64)];
        all.extend(values.iter().map(|&(n, v)| (n.to_string(), v)));
        Metrics { monotonic_ns: ns, source: SOURCE.into(), kind: kind.into(), values: all }
    }

    const MIB: f64 = 1048576.0;

    fn owner() -> NodeOwner {
        let mut owner = NodeOwner::default();
        owner.note("node 20.20.2 (V8 11.3.244.8-node.33)");
        let main = |ns, kind, used_old: f64| {
            sample(
                ns,
                kind,
                0,
                &[
                    ("heap_total", 40.0 * MIB),
                    ("heap_used", 20.0 * MIB + used_old),
                    ("external", 30.0 * MIB),
                    ("array_buffers", 28.0 * MIB),
                    ("new_space.size", 16.0 * MIB),
                    ("new_space.used", 2.0 * MIB),
                    ("new_space.available", 6.0 * MIB),
                    ("new_space.physical", 16.0 * MIB),
                    ("old_space.size", 24.0 * MIB),
                    ("old_space.used", used_old),
                    ("old_space.available", 3.0 * MIB),
                    ("old_space.physical", 24.0 * MIB),
                ],
            )
        };
        for m in [main(100, "start", 1.0 * MIB), main(200, "major_gc", 10.0 * MIB), main(300, "exit", 18.0 * MIB)] {
            owner.metrics(&m);
        }
        owner.metrics(&sample(
            150,
            "start",
            1,
            &[
                ("heap_total", 4.0 * MIB),
                ("heap_used", 3.0 * MIB),
                ("old_space.size", 4.0 * MIB),
                ("old_space.used", 3.0 * MIB),
                ("old_space.available", 0.0),
                ("old_space.physical", 4.0 * MIB),
            ],
        ));
        owner.metrics(&sample(250, "exit", 1, &[("old_space.size", 0.0)]));
        owner
    }

    fn ledger_with_mappings() -> Ledger {
        let mut ledger = Ledger { rss_bytes: 100 << 20, ..Ledger::default() };
        let mut add = |start: u64, len: u64, class: MappingClass| {
            ledger.mappings.push(MappingLedger { start, end: start + len, class, resident_bytes: len, ..MappingLedger::default() });
            if class == MappingClass::ProgramMmap {
                ledger.other_breakdown.program_mmap += len;
            }
        };
        add(0x1000_0000, 40 << 20, MappingClass::ProgramMmap);
        // Not on a V8 chunk boundary: an addon's mapping stays in other.
        add(0x2000_1000, 1 << 20, MappingClass::ProgramMmap);
        add(0x3000_0000, 8 << 20, MappingClass::Heap);
        ledger
    }

    #[test]
    fn sums_live_isolates_and_drops_exited_workers() {
        let owner = owner();
        let both = owner.layer_at(160).unwrap();
        assert_eq!((both.isolates, both.heap_total_bytes), (2, 44 << 20));
        assert_eq!(both.space("old_space").unwrap().used, (1 << 20) + (3 << 20));
        let after_worker = owner.layer_at(260).unwrap();
        assert_eq!((after_worker.isolates, after_worker.sample_kind.as_str()), (1, "major_gc"));
        assert_eq!(after_worker.old_space_used_after_major_gc_bytes, Some(10 << 20));
        assert_eq!(after_worker.semi_space_unused_bytes, 14 << 20);
        assert!(owner.layer_at(50).is_none());
        assert_eq!(owner.gc_marks(0).len(), 1);
    }

    #[test]
    fn claims_v8_chunks_out_of_other_and_splits_them() {
        let owner = owner();
        let mut ledger = ledger_with_mappings();
        owner.annotate(&mut ledger, Taken { time: 0, monotonic_ns: Some(260) });
        let part = ledger.share(NAME).unwrap();
        assert_eq!(part.rows.total(), 40 << 20);
        // Used: 2 MiB new + 10 MiB old; old space's 3 MiB available is
        // fragmentation, the new space's is not.
        assert_eq!(part.rows.live, 12 << 20);
        assert_eq!(part.rows.fragmented, 3 << 20);
        assert_eq!(part.rows.retained, 25 << 20);
        assert_eq!(ledger.other_breakdown.program_mmap, 1 << 20);
        let layer: NodeLayer = ledger.section(NAME).unwrap();
        assert_eq!((layer.v8_mappings, layer.v8_resident_bytes), (1, 40 << 20));
        assert_eq!((layer.external_bytes, layer.array_buffers_bytes), (30 << 20, 28 << 20));
        assert!(part.estimated.is_none(), "40 MiB resident against 40 MiB physical");
    }

    #[test]
    fn findings_and_remedies_name_only_knobs_that_apply() {
        let owner = owner();
        let mut ledger = ledger_with_mappings();
        ledger.owners.push(OwnerShare {
            owner: "glibc",
            rows: Rows { live: 2 << 20, fragmented: 20 << 20, retained: 10 << 20, ..Rows::default() },
            ..OwnerShare::default()
        });
        owner.annotate(&mut ledger, Taken { time: 0, monotonic_ns: Some(300) });
        let findings = owner.findings(&ledger);
        let kinds: Vec<&str> = findings.iter().map(|f| f.kind).collect();
        assert!(kinds.contains(&"semi_space") && kinds.contains(&"buffer_churn"), "{kinds:?}");
        assert_eq!(findings.iter().find(|f| f.kind == "buffer_churn").unwrap().bytes, 30 << 20);
        let remedies = owner.remedies(&ledger, &findings);
        let ids: Vec<&str> = remedies.iter().map(|r| r.id).collect();
        assert!(ids.contains(&"node-semi-space") && ids.contains(&"node-jemalloc"), "{ids:?}");
        // The heap limit is unknown (0): no cap is offered.
        assert!(!ids.contains(&"node-max-old-space-size"));
        // On jemalloc already, preloading it is no remedy.
        ledger.owners.retain(|s| s.owner != "glibc");
        ledger.owners.push(OwnerShare { owner: "jemalloc", rows: Rows { retained: 30 << 20, ..Rows::default() }, ..OwnerShare::default() });
        let ids: Vec<&str> = owner.remedies(&ledger, &owner.findings(&ledger)).iter().map(|r| r.id).collect();
        assert!(!ids.contains(&"node-jemalloc"), "{ids:?}");
    }
}
