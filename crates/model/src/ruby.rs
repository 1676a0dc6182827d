//! The Ruby layer: what Ruby knows of its memory (its object pages, slots,
//! and the malloc'd data its objects own), laid over the malloc layer the
//! agent measures, so the verdict can say at which layer the bytes are lost.

use memgap_trace::records::{Metrics, Process};
use memgap_trace::vocabulary::kind;
use serde::{Deserialize, Serialize};

use crate::ledger::{Finding, GcMark, HeapOwner, Ledger, OwnerShare, Remedy, Rows};

pub const SOURCE: &str = memgap_trace::vocabulary::source::RUBY;
/// The owner is named as its source.
pub const NAME: &str = SOURCE;

/// Ruby's figures at one snapshot (its last sample before it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RubyLayer {
    pub version: String,
    /// When Ruby's figures were taken, seconds since the process started.
    pub sampled_at_seconds: f64,
    /// Why: `start`, `major_gc`, `sample` (after a minor GC), `exit`.
    pub sample_kind: String,
    pub slot_size: u64,
    pub page_size: u64,
    /// Object pages (each its own mmap in Ruby 3.1, counted by the malloc
    /// layer's ledger under other: program mmaps).
    pub object_pages: u64,
    pub object_pages_bytes: u64,
    pub live_slots: u64,
    pub live_slots_bytes: u64,
    /// Free and to-be-finalized slots on object pages: Ruby-page fragmentation.
    pub free_slots: u64,
    pub free_slots_bytes: u64,
    /// Page bytes that hold no slot (headers, alignment).
    pub page_overhead_bytes: u64,
    /// ObjectSpace.memsize_of_all: slots plus the malloc'd data live objects own.
    pub memsize_of_all_bytes: Option<u64>,
    /// memsize_of_all minus the live slots: object bodies in malloc.
    pub external_bytes: Option<u64>,
    /// What Ruby knows it holds: memsize_of_all, or the live slots without it.
    pub known_bytes: u64,
    pub gc_count: u64,
    pub major_gc_count: u64,
    pub compact_count: u64,
    /// Free slots as a share of the object pages' slots.
    pub free_slot_fraction: f64,
}

/// The layer from the last sample at or before `monotonic_ns` (all
/// `metrics` are Ruby's, in file order), with page and slot sizes from the
/// sampler's meta line (Ruby's own GC::INTERNAL_CONSTANTS).
pub fn layer_at(metrics: &[&Metrics], version: &str, start_monotonic_ns: u64, monotonic_ns: u64) -> Option<RubyLayer> {
    let meta = metrics
        .iter()
        .rev()
        .find(|m| m.kind == kind::META && m.monotonic_ns <= monotonic_ns)
        .or_else(|| metrics.iter().find(|m| m.kind == kind::META))?;
    let slot_size = meta.get("rvalue_size")? as u64;
    let page_size = meta.get("heap_page_size")? as u64;
    let sample = metrics.iter().filter(|m| m.kind != kind::META && m.monotonic_ns <= monotonic_ns).max_by_key(|m| m.monotonic_ns)?;
    // The last deep sample (with memsize_of_all) since the last major GC or start.
    let deep =
        metrics.iter().filter(|m| m.monotonic_ns <= monotonic_ns && m.get("memsize_of_all").is_some()).max_by_key(|m| m.monotonic_ns);
    let get = |name: &str| sample.get(name).unwrap_or(0.0).max(0.0) as u64;
    let object_pages = get("heap_allocated_pages");
    let live_slots = get("heap_live_slots");
    let free_slots = get("heap_free_slots") + get("heap_final_slots");
    let available = get("heap_available_slots");
    let live_slots_bytes = live_slots * slot_size;
    let memsize = deep.and_then(|m| m.get("memsize_of_all")).map(|v| v.max(0.0) as u64);
    let object_pages_bytes = object_pages * page_size;
    Some(RubyLayer {
        version: version.to_string(),
        sampled_at_seconds: sample.monotonic_ns.saturating_sub(start_monotonic_ns) as f64 / 1e9,
        sample_kind: sample.kind.clone(),
        slot_size,
        page_size,
        object_pages,
        object_pages_bytes,
        live_slots,
        live_slots_bytes,
        free_slots,
        free_slots_bytes: free_slots * slot_size,
        page_overhead_bytes: object_pages_bytes.saturating_sub(available * slot_size),
        memsize_of_all_bytes: memsize,
        external_bytes: memsize.map(|m| m.saturating_sub(live_slots_bytes)),
        known_bytes: memsize.unwrap_or(live_slots_bytes).max(live_slots_bytes),
        gc_count: get("count"),
        major_gc_count: get("major_gc_count"),
        compact_count: get("compact_count"),
        free_slot_fraction: if available > 0 { free_slots as f64 / available as f64 } else { 0.0 },
    })
}

/// Ruby as a heap owner: a layer over the malloc owner. Its samples are
/// appended to the trace at exit, so it lays its layer over each ledger
/// after the replay: its object pages (anonymous mmaps the program made,
/// which the core counts as `other`) become its share, and its headline
/// (what Ruby knows against what the kernel charges) opens the verdict.
#[derive(Debug, Default)]
pub struct RubyOwner {
    metrics: Vec<Metrics>,
    version: Option<String>,
    start_monotonic_ns: Option<u64>,
}

impl HeapOwner for RubyOwner {
    fn name(&self) -> &'static str {
        NAME
    }

    fn present(&self) -> bool {
        !self.metrics.is_empty()
    }

    fn process(&mut self, process: &Process) {
        self.start_monotonic_ns.get_or_insert(process.start_monotonic_ns);
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source == SOURCE {
            self.metrics.push(metrics.clone());
        }
    }

    fn note(&mut self, text: &str) {
        if let Some(version) = text.strip_prefix("ruby ") {
            self.version = Some(version.to_string());
        }
    }

    fn gc_marks(&self, start_ns: u64) -> Vec<GcMark> {
        self.metrics
            .iter()
            .filter(|m| m.kind == kind::MAJOR_GC)
            .map(|m| GcMark { seconds: crate::owners::seconds_since(start_ns, m.monotonic_ns), source: NAME.into(), major: true })
            .collect()
    }

    fn annotate(&self, ledger: &mut Ledger, taken: crate::ledger::owner::Taken) {
        let Some(monotonic_ns) = taken.monotonic_ns else { return };
        let refs: Vec<&Metrics> = self.metrics.iter().collect();
        let Some(layer) = layer_at(&refs, self.version.as_deref().unwrap_or(""), self.start_monotonic_ns.unwrap_or(0), monotonic_ns) else {
            return;
        };
        attach(ledger, &layer);
    }

    fn findings(&self, ledger: &Ledger) -> Vec<Finding> {
        let Some(part) = ledger.share(NAME) else { return Vec::new() };
        let bytes = part.rows.fragmented;
        if bytes == 0 {
            return Vec::new();
        }
        vec![Finding { kind: "free_slots", owner: NAME, bytes, share: crate::ledger::owner::share(bytes, ledger.rss_bytes) }]
    }

    fn remedies(&self, _ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        let free = crate::owners::malloc::finding_bytes(findings, NAME, "free_slots");
        if free < 1 << 20 {
            return Vec::new();
        }
        vec![Remedy::new(
            "ruby-compact",
            NAME,
            "move surviving objects together so whole object pages free up: GC.compact after a burst, or GC.auto_compact = true",
            &[],
            free,
        )]
    }
}

/// Adds the layer to the ledger: its section, and its object pages (out of
/// the program's anonymous mmaps in `other`) as its share: live slots,
/// free slots (fragmented) and page overhead (slack), in proportion to what
/// of the pages is resident.
pub fn attach(ledger: &mut Ledger, layer: &RubyLayer) {
    let resident = layer.object_pages_bytes.min(ledger.other_breakdown.program_mmap);
    ledger.other_breakdown.program_mmap -= resident;
    let whole = layer.object_pages_bytes.max(1);
    let part = |bytes: u64| (bytes as u128 * resident as u128 / whole as u128) as u64;
    let live = part(layer.live_slots_bytes);
    let fragmented = part(layer.free_slots_bytes).min(resident - live);
    let rows = Rows { live, fragmented, slack: resident - live - fragmented, ..Rows::default() };
    ledger.owners.push(OwnerShare { owner: NAME, rows, released_bytes: 0, estimated: None });
    ledger.set_section(NAME, layer);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(ns: u64, kind: &str, values: &[(&str, f64)]) -> Metrics {
        Metrics {
            monotonic_ns: ns,
            source: SOURCE.into(),
            kind: kind.into(),
            values: values.iter().map(|&(n, v)| (n.to_string(), v)).collect(),
        }
    }

    fn samples() -> Vec<Metrics> {
        vec![
            m(10, "meta", &[("rvalue_size", 40.0), ("heap_page_size", 16384.0)]),
            m(
                20,
                "major_gc",
                &[
                    ("heap_allocated_pages", 100.0),
                    ("heap_available_slots", 40900.0),
                    ("heap_live_slots", 400.0),
                    ("heap_free_slots", 40400.0),
                    ("heap_final_slots", 100.0),
                    ("memsize_of_all", 1_000_000.0),
                ],
            ),
            m(
                30,
                "sample",
                &[("heap_allocated_pages", 10.0), ("heap_available_slots", 4090.0), ("heap_live_slots", 4000.0), ("heap_free_slots", 90.0)],
            ),
        ]
    }

    #[test]
    fn takes_the_last_sample_before_the_snapshot() {
        let all = samples();
        let refs: Vec<&Metrics> = all.iter().collect();
        let layer = layer_at(&refs, "3.1.2", 0, 25).unwrap();
        assert_eq!(layer.object_pages_bytes, 100 * 16384);
        assert_eq!(layer.live_slots_bytes, 400 * 40);
        assert_eq!(layer.free_slots_bytes, 40500 * 40);
        assert_eq!(layer.page_overhead_bytes, 100 * 16384 - 40900 * 40);
        assert_eq!(layer.memsize_of_all_bytes, Some(1_000_000));
        assert_eq!(layer.external_bytes, Some(1_000_000 - 16_000));
        assert_eq!(layer.known_bytes, 1_000_000);
        let later = layer_at(&refs, "3.1.2", 0, 35).unwrap();
        assert_eq!((later.object_pages, later.sample_kind.as_str()), (10, "sample"));
        // The deep figure carries over until the next deep sample.
        assert_eq!(later.memsize_of_all_bytes, Some(1_000_000));
        assert!(layer_at(&refs, "3.1.2", 0, 15).is_none());
    }

    #[test]
    fn object_pages_leave_other_for_rubys_share() {
        let all = samples();
        let refs: Vec<&Metrics> = all.iter().collect();
        let layer = layer_at(&refs, "3.1.2", 0, 25).unwrap();
        let mut ledger = Ledger { rss_bytes: 4 << 20, ..Ledger::default() };
        ledger.other_breakdown.program_mmap = 3 << 20;
        attach(&mut ledger, &layer);
        let part = ledger.share(NAME).unwrap();
        // 100 pages of 16 KiB: all of them resident, out of the 3 MiB of program mmaps.
        assert_eq!(part.rows.total(), 100 * 16384);
        assert_eq!(ledger.other_breakdown.program_mmap, (3 << 20) - 100 * 16384);
        assert_eq!(part.rows.live, 400 * 40);
        assert_eq!(part.rows.fragmented, 40500 * 40);
    }
}
