//! Runtime layers over the ledger, and the runtime's collections for the
//! timeline. Ruby's figures (METRICS records) are appended to the trace after
//! the process ends, so they are gathered during the replay and laid over
//! each snapshot's ledger afterwards. (Go's ledger is built from its figures
//! as they come: see `go.rs`.)

use memgap_trace::records::{Metrics, Process};

use crate::ledger::Ledger;
use crate::ruby;

/// One garbage collection of the program's runtime.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GcMark {
    pub seconds: f64,
    pub source: String,
    pub major: bool,
}

#[derive(Debug, Default)]
pub struct RuntimeFigures {
    metrics: Vec<Metrics>,
    ruby_version: Option<String>,
    start_monotonic_ns: Option<u64>,
}

impl RuntimeFigures {
    pub fn process(&mut self, process: &Process) {
        self.start_monotonic_ns.get_or_insert(process.start_monotonic_ns);
    }

    /// Keeps what the layers and the GC marks use: Ruby's samples and every
    /// runtime's collections (not, say, Go's per-class histograms).
    pub fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source == ruby::SOURCE || metrics.kind == "gc" {
            self.metrics.push(metrics.clone());
        }
    }

    pub fn note(&mut self, text: &str) {
        if let Some(version) = text.strip_prefix("ruby ") {
            self.ruby_version = Some(version.to_string());
        }
    }

    /// The runtime's garbage collections, for the timeline: every Go cycle
    /// (Go's collector is not generational), GHC collections (major: of the
    /// oldest generation collected, generation ≥ 1), and Ruby's major GCs.
    /// More than `limit` keeps the major ones and every k-th minor one.
    pub fn gc_marks(&self, limit: usize) -> Vec<GcMark> {
        let start = self.start_monotonic_ns.unwrap_or(0);
        let mut marks: Vec<GcMark> = self
            .metrics
            .iter()
            .filter_map(|m| {
                let major = match (m.source.as_str(), m.kind.as_str()) {
                    ("go", "gc") => true,
                    ("ghc", "gc") => m.get("generation").is_some_and(|g| g >= 1.0),
                    ("ruby", "major_gc") => true,
                    _ => return None,
                };
                Some(GcMark { seconds: m.monotonic_ns.saturating_sub(start) as f64 / 1e9, source: m.source.clone(), major })
            })
            .collect();
        marks.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        if marks.len() > limit {
            let minors = marks.iter().filter(|m| !m.major).count();
            let room = limit.saturating_sub(marks.len() - minors).max(1);
            let step = minors.div_ceil(room).max(1);
            let mut minor_index = 0;
            marks.retain(|m| {
                if m.major {
                    return true;
                }
                minor_index += 1;
                (minor_index - 1) % step == 0
            });
        }
        marks
    }

    /// Adds the runtime layers to a snapshot's ledger taken at `monotonic_ns`.
    pub fn annotate(&self, ledger: &mut Ledger, monotonic_ns: u64) {
        let ruby: Vec<&Metrics> = self.metrics.iter().filter(|m| m.source == ruby::SOURCE).collect();
        if !ruby.is_empty() {
            let version = self.ruby_version.as_deref().unwrap_or("");
            if let Some(layer) = ruby::layer_at(&ruby, version, self.start_monotonic_ns.unwrap_or(0), monotonic_ns) {
                ruby::attach(ledger, layer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gc(ns: u64, source: &str, kind: &str, generation: Option<f64>) -> Metrics {
        Metrics { monotonic_ns: ns, source: source.into(), kind: kind.into(), values: generation.map(|g| vec![("generation".to_string(), g)]).unwrap_or_default() }
    }

    #[test]
    fn gc_marks_from_every_runtime_thinned_keeping_major_ones() {
        let mut figures = RuntimeFigures::default();
        figures.process(&Process { start_monotonic_ns: 1_000_000_000, ..Process::default() });
        for m in [gc(3_000_000_000, "ruby", "major_gc", None), gc(1_500_000_000, "go", "gc", None), gc(2_000_000_000, "ruby", "sample", None), gc(2_500_000_000, "ghc", "gc", Some(0.0))] {
            figures.metrics(&m);
        }
        let marks = figures.gc_marks(100);
        assert_eq!(marks.iter().map(|m| (m.seconds, m.source.as_str(), m.major)).collect::<Vec<_>>(), vec![(0.5, "go", true), (1.5, "ghc", false), (2.0, "ruby", true)]);

        let mut many = RuntimeFigures::default();
        for i in 0..1000 {
            many.metrics(&gc(i, "ghc", "gc", Some(if i % 100 == 0 { 1.0 } else { 0.0 })));
        }
        let thinned = many.gc_marks(110);
        assert!(thinned.len() <= 110, "{}", thinned.len());
        assert_eq!(thinned.iter().filter(|m| m.major).count(), 10);
    }
}
