//! The heap owners memgap knows, and the list the ledger asks.
//!
//! Each owner implements [`HeapOwner`] in a file of its own; adding one
//! (CPython's pymalloc, V8) is that file and one line in [`registered`].

use memgap_trace::records::{Metrics, Process, Rss, Snapshot};

use crate::ledger::{self, GcMark, HeapOwner, Ledger};
use crate::{ghc, go, owners, ruby};

/// Every owner, each starting with nothing seen.
pub fn registered() -> Vec<Box<dyn HeapOwner>> {
    vec![
        Box::new(owners::glibc::Glibc::default()),
        Box::new(owners::jemalloc::Jemalloc::default()),
        Box::new(owners::tcmalloc::Tcmalloc::default()),
        Box::new(owners::mimalloc::Mimalloc::default()),
        Box::new(go::GoOwner::default()),
        Box::new(ghc::GhcOwner::default()),
        Box::new(ruby::RubyOwner::default()),
        Box::new(owners::python::PythonOwner::default()),
        Box::new(owners::node::NodeOwner::default()),
    ]
}

/// The owners as a replay feeds them.
pub struct Owners {
    pub list: Vec<Box<dyn HeapOwner>>,
    start_monotonic_ns: Option<u64>,
    /// What `memgap compare --remedies` measured beside the trace.
    pub measured_remedies: Option<std::sync::Arc<crate::ledger::measured::RemedyMeasurements>>,
    /// Figures laid over only after the replay were seen (see [`Owners::laid_over_late`]).
    late_figures: bool,
}

impl Default for Owners {
    fn default() -> Owners {
        Owners { list: registered(), start_monotonic_ns: None, measured_remedies: None, late_figures: false }
    }
}

impl Owners {
    pub fn process(&mut self, process: &Process) {
        self.start_monotonic_ns.get_or_insert(process.start_monotonic_ns);
        self.list.iter_mut().for_each(|o| o.process(process));
    }

    pub fn allocator(&mut self, path: &str) {
        self.list.iter_mut().for_each(|o| o.allocator(path));
    }

    pub fn metrics(&mut self, metrics: &Metrics) {
        self.late_figures |= self.laid_over_late(metrics);
        self.list.iter_mut().for_each(|o| o.metrics(metrics));
    }

    /// Whether figures laid over only after the replay were seen: until it
    /// is over, no ledger knows a runtime's gap.
    pub fn saw_late_figures(&self) -> bool {
        self.late_figures
    }

    pub fn note(&mut self, text: &str) {
        self.list.iter_mut().for_each(|o| o.note(text));
    }

    pub fn rss(&mut self, rss: &Rss) {
        self.list.iter_mut().for_each(|o| o.rss(rss));
    }

    pub fn snapshot_seen(&mut self, snapshot: &Snapshot) {
        self.list.iter_mut().for_each(|o| o.snapshot_seen(snapshot));
    }

    /// The first runtime with figures of its own for the summary.
    pub fn summary(&self) -> Option<ledger::RuntimeSummary> {
        self.list.iter().filter(|o| o.present()).find_map(|o| o.summary())
    }

    pub fn replayed(&mut self, timeline: &memgap_replay::Timeline) {
        self.list.iter_mut().for_each(|o| o.replayed(timeline));
    }

    /// Lays every owner's late layer over a ledger, then sums it up again.
    pub fn annotate(&self, ledger: &mut Ledger, taken: crate::ledger::owner::Taken) {
        for owner in self.list.iter().filter(|o| o.present()) {
            owner.annotate(ledger, taken);
        }
        ledger.measured_remedies = self.measured_remedies.clone();
        crate::accounting::finish(ledger, &self.list);
    }

    /// Whether `metrics` holds a runtime's figures that its owner lays over
    /// the ledgers only once the replay is over (they may come after the
    /// snapshot they concern: Node's, Ruby's, GHC's, Go's, a heap walk),
    /// rather than figures written just before the snapshot they describe
    /// (the pymalloc census, an allocator's own statistics).
    pub fn laid_over_late(&self, metrics: &Metrics) -> bool {
        metrics.source != crate::trim_marks::SOURCE && !self.list.iter().any(|o| o.describes_its_snapshot(metrics))
    }

    /// `ledger` with the figures that describe its snapshot (taken at trace
    /// time `time`) laid over, as a replay can before its end; without its
    /// page maps and stacks, which the layers do not change (`ledger` is
    /// left as it was). Its gap is a runtime's there when none of its
    /// figures come late (see [`Owners::laid_over_late`]).
    pub fn laid_over_in_time(&self, ledger: &mut Ledger, time: u64) -> Ledger {
        let (page_maps, by_stack) = (std::mem::take(&mut ledger.page_maps), std::mem::take(&mut ledger.by_stack));
        let mut laid = ledger.clone();
        (ledger.page_maps, ledger.by_stack) = (page_maps, by_stack);
        self.annotate(&mut laid, crate::ledger::owner::Taken { time, monotonic_ns: None });
        laid
    }

    /// The runtimes' collections, for the timeline. More than `limit` keeps
    /// the major ones and every k-th minor one.
    pub fn gc_marks(&self, limit: usize) -> Vec<GcMark> {
        let start = self.start_monotonic_ns.unwrap_or(0);
        let mut marks: Vec<GcMark> = self.list.iter().flat_map(|o| o.gc_marks(start)).collect();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gc(ns: u64, source: &str, kind: &str, generation: Option<f64>) -> Metrics {
        Metrics {
            monotonic_ns: ns,
            source: source.into(),
            kind: kind.into(),
            values: generation.map(|g| vec![("generation".to_string(), g)]).unwrap_or_default(),
        }
    }

    #[test]
    fn gc_marks_from_every_runtime_thinned_keeping_major_ones() {
        let mut owners = Owners::default();
        owners.process(&Process { start_monotonic_ns: 1_000_000_000, ..Process::default() });
        for m in [
            gc(3_000_000_000, "ruby", "major_gc", None),
            gc(1_500_000_000, "go", "gc", None),
            gc(2_000_000_000, "ruby", "sample", None),
            gc(2_500_000_000, "ghc", "gc", Some(0.0)),
        ] {
            owners.metrics(&m);
        }
        let marks = owners.gc_marks(100);
        assert_eq!(
            marks.iter().map(|m| (m.seconds, m.source.as_str(), m.major)).collect::<Vec<_>>(),
            vec![(0.5, "go", true), (1.5, "ghc", false), (2.0, "ruby", true)]
        );

        let mut many = Owners::default();
        for i in 0..1000 {
            many.metrics(&gc(i, "ghc", "gc", Some(if i % 100 == 0 { 1.0 } else { 0.0 })));
        }
        let thinned = many.gc_marks(110);
        assert!(thinned.len() <= 110, "{}", thinned.len());
        assert_eq!(thinned.iter().filter(|m| m.major).count(), 10);
    }

    /// The pymalloc census and an allocator's own statistics describe the
    /// snapshot they come before; a runtime's other figures and a heap walk
    /// are laid over after the replay; malloc_trim marks are no runtime's.
    #[test]
    fn figures_written_before_their_snapshot_are_not_late() {
        let owners = Owners::default();
        let census = memgap_source_python::Census { snapshot_time: 7, arenas: 2, ..Default::default() }.to_metrics(5);
        let stats = memgap_types::allocator_stats::AllocatorStats { allocator: "jemalloc".into(), snapshot_time: 7, ..Default::default() };
        assert!(!owners.laid_over_late(&census) && !owners.laid_over_late(&stats.to_metrics(5)));
        let figures = |source: &str, kind: &str| Metrics { source: source.into(), kind: kind.into(), ..Metrics::default() };
        assert!(owners.laid_over_late(&figures("node", "heap_space")) && owners.laid_over_late(&figures("ruby", "gc_stat")));
        assert!(owners.laid_over_late(&figures(memgap_types::glibc_walk::WALK_SOURCE, memgap_types::glibc_walk::WALK_KIND)));
        assert!(!owners.laid_over_late(&figures(crate::trim_marks::SOURCE, crate::trim_marks::KIND)));
    }
}
