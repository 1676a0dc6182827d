//! Everything the HTML report shows, gathered in one replay of the trace:
//! the summary, the ledger at every snapshot (page maps at a bounded set of
//! them: the chosen moment, the peak, the end and a few evenly spaced), the
//! RSS samples, the runtime's collections and the program's malloc_trim
//! calls, and blame at the chosen moment.

use std::path::Path;

use memgap_replay::{Inherited, ThreadEvent, Visitor, replay};
use memgap_trace::records::{End, Exit, Metrics, Module, Process, Rss, Snapshot, Thread};

use crate::accounting::Detail;
use crate::blame::{self, Blame, BlameOptions, BlameOrder, BlameVisitor};
use crate::ledger::owner::Taken;
use crate::ledger::{Ledger, Moment};
use crate::numa::{self, NumaOptions, NumaReport, NumaVisitor};
use crate::registry::Owners;
use crate::series::{SeriesBuilder, SeriesPoint};
use crate::snapshots::{self, At, GapFinder, GapsSeen, MomentError, SERIES_BUCKETS};
use crate::summary::{Builder, Summary};
use crate::trim_marks::{TrimMark, TrimMarks};

/// Snapshots with a page map besides the peak and the end.
const SPACED_PAGE_MAPS: usize = 12;
/// Pages kept over all page maps besides the peak's and the end's (one
/// byte each in the report): bounds memory and file size for huge heaps.
const PAGE_BUDGET: usize = 24 << 20;
/// RSS samples kept (the lowest and highest of each bucket of time).
const RSS_POINTS: usize = 4000;
/// The program's malloc_trim calls kept for the timeline (those that released most).
const TRIM_MARKS: usize = 2000;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RssSample {
    pub seconds: f64,
    pub vm_rss: u64,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub summary: Summary,
    /// The ledger at every snapshot, in time order; `page_maps` filled at
    /// the peak, the end and up to 12 others.
    pub snapshots: Vec<Ledger>,
    /// Index in `snapshots` of the one with the highest RSS.
    pub peak: usize,
    /// The snapshot the report is about (`--at`, the largest gap by default).
    pub moment: Moment,
    /// VmRSS over time, at most 4000 points.
    pub rss: Vec<RssSample>,
    /// The live heap after every heap event, reduced to the lowest and
    /// highest of each bucket of time; empty for a runtime with a heap of
    /// its own (Go, GHC).
    pub live_heap: Vec<SeriesPoint>,
    /// Blame at the moment, every site (unsorted beyond fragmentation order).
    pub blame: Option<Blame>,
    /// The runtime's garbage collections (Go, GHC, Ruby), at most 2000.
    pub gc_marks: Vec<crate::ledger::GcMark>,
    /// The program's own malloc_trim calls, at most 2000, in time order.
    pub trim_marks: Vec<TrimMark>,
    /// How many malloc_trim calls the program made, kept in `trim_marks` or not.
    pub trim_calls: u64,
    /// NUMA at the moment, when the trace holds a topology, placements or samples.
    pub numa: Option<NumaReport>,
    /// The GHC ledger when the trace holds a GHC program's eventlog.
    pub ghc: Option<crate::ghc::GhcReport>,
}

struct ReportVisitor {
    summary: Builder,
    blame: BlameVisitor,
    /// The snapshot the report is about; `None` while the largest gap is
    /// looked for in this replay, the moment then being the largest so far.
    moment: Option<usize>,
    /// The gap at every snapshot and the largest so far.
    gaps: GapFinder,
    /// A runtime accounts for its own heap: each snapshot's gap is its
    /// ledger's (while the moment is looked for, with the runtime's figures
    /// laid over, none of which come late), not malloc's from the live heap.
    gaps_in_ledgers: bool,
    peak: usize,
    last: usize,
    with_pages: Vec<usize>,
    pages_kept: usize,
    seen: usize,
    ledgers: Vec<(u64, Ledger)>,
    moment_ledger: Option<Ledger>,
    rss: Vec<(u64, u64)>,
    live_heap: SeriesBuilder,
    /// VmRSS as `memgap timeline` reduces it, for the facts.
    vm_rss: SeriesBuilder,
    owners: Owners,
    trims: TrimMarks,
    /// The calls `memgap timeline` lists, for the facts.
    timeline_trims: TrimMarks,
    numa: NumaVisitor,
}

impl ReportVisitor {
    /// A later snapshot has a larger gap: `index` keeps what any other
    /// snapshot keeps (its page map stays, without the blocks on each page,
    /// until [`settle_page_maps`] knows which are kept).
    fn no_longer_the_moment(&mut self, index: usize) {
        self.moment_ledger = None;
        self.no_longer_the_largest_gap(index);
    }

    /// `index` is no longer the largest gap: its page maps go unless kept for another reason.
    fn no_longer_the_largest_gap(&mut self, index: usize) {
        let Some((_, ledger)) = self.ledgers.get_mut(index) else { return };
        if index == self.peak || index == self.last || self.with_pages.binary_search(&index).is_ok() {
            for map in &mut ledger.page_maps {
                map.objects = None;
            }
        } else {
            // As a replay knowing the moment would: no page map, no stacks.
            ledger.page_maps = Vec::new();
            ledger.by_stack = Vec::new();
        }
    }
}

/// Keeps the page maps of the moment, the peak, the last snapshot and the
/// spaced ones within the budget, in time order, as a replay that knew the
/// moment from the start keeps them (when the moment was found during the
/// replay, each snapshot that was the largest gap for a while got one).
fn settle_page_maps(ledgers: &mut [(u64, Ledger)], moment: usize, peak: usize, last: usize, with_pages: &[usize]) {
    let mut kept = 0;
    for (index, (_, ledger)) in ledgers.iter_mut().enumerate() {
        let always = index == moment || index == peak || index == last;
        if !always && with_pages.binary_search(&index).is_ok() && kept < PAGE_BUDGET {
            kept += ledger.page_maps.iter().map(|m| m.pages.len()).sum::<usize>();
        } else if !always {
            ledger.page_maps = Vec::new();
        }
    }
}

impl Visitor for ReportVisitor {
    fn live_set(&self) -> Option<&memgap_replay::LiveSet> {
        Some(&self.blame.state.live)
    }

    fn metrics(&mut self, metrics: &Metrics) {
        self.owners.metrics(metrics);
        self.summary.metrics(metrics);
        self.trims.metrics(metrics);
        self.timeline_trims.metrics(metrics);
        self.blame.metrics(metrics);
    }

    fn clock(&mut self, clock: &memgap_trace::records::Clock) {
        self.blame.clock(clock);
    }

    fn process(&mut self, process: &Process) {
        self.owners.process(process);
        self.trims.process(process);
        self.timeline_trims.process(process);
        self.summary.process(process);
        self.blame.process(process);
        self.numa.process(process);
    }

    fn modules(&mut self, modules: &[Module]) {
        self.summary.modules(modules);
        self.blame.modules(modules);
        self.numa.modules(modules);
    }

    fn inherited(&mut self, item: Inherited<'_>) {
        self.blame.inherited(item);
        if let Inherited::End = item {
            self.summary.inherited_live(self.blame.state.live.live_bytes());
        }
    }

    fn event(&mut self, event: &ThreadEvent) {
        let change = self.blame.apply(event);
        self.summary.count(event, change, self.blame.state.live.live_bytes());
        self.live_heap.push(event.event.time, self.blame.state.live.live_bytes());
        self.numa.event(event);
    }

    fn topology(&mut self, topology: &memgap_trace::numa::Topology) {
        self.numa.topology(topology);
    }

    fn placement(&mut self, placement: &memgap_trace::numa::Placement) {
        // Taken right after the snapshot of the same time: its page map
        // gets each page's node.
        if let Some((time, ledger)) = self.ledgers.last_mut()
            && *time == placement.time
        {
            for map in &mut ledger.page_maps {
                map.place(placement);
            }
        }
        self.numa.placed(placement, &self.blame.state.live);
    }

    fn memory_samples(&mut self, samples: &memgap_trace::numa::MemorySamples) {
        self.numa.memory_samples(samples);
    }

    fn rss(&mut self, rss: &Rss) {
        self.summary.rss(rss);
        self.owners.rss(rss);
        self.rss.push((rss.time, rss.vm_rss));
        self.vm_rss.push(rss.time, rss.vm_rss);
    }

    fn snapshot(&mut self, snapshot: &Snapshot) {
        let index = self.seen;
        self.seen += 1;
        self.owners.snapshot_seen(snapshot);
        let kept = index == self.peak || index == self.last;
        let spaced_wanted = self.with_pages.binary_search(&index).is_ok() && self.pages_kept < PAGE_BUDGET;
        // Every snapshot's gap, for the facts too. A runtime's is its
        // ledger's: computed first, with the detail it needs unless it
        // turns out the largest gap so far.
        let previous = self.gaps.largest();
        let (larger, computed) = if self.moment.is_none() && self.gaps_in_ledgers {
            let pages = kept || spaced_wanted;
            let detail = Detail { pages, stacks: pages, ..Detail::default() };
            let mut ledger = snapshots::ledger_of(&mut self.blame.state, snapshot, detail, &mut self.owners.list);
            (self.gaps.note_gap(snapshots::gap_bytes(&self.owners.laid_over_in_time(&mut ledger, snapshot.time))), Some(ledger))
        } else {
            (self.gaps.note(snapshot, self.blame.state.live.live_bytes()), None)
        };
        let is_moment = match self.moment {
            Some(moment) => index == moment,
            None => {
                if larger {
                    if let Some(previous) = previous {
                        self.no_longer_the_moment(previous);
                    }
                    self.numa.want(index);
                }
                larger
            }
        };
        // With another moment, the largest gap's detail is kept for the
        // facts too (`--at gap` is the question asked most).
        let largest_gap = larger && self.moment.is_some() && !self.gaps_in_ledgers;
        if largest_gap && let Some(previous) = previous.filter(|&p| Some(p) != self.moment) {
            self.no_longer_the_largest_gap(previous);
        }
        self.numa.at_snapshot(snapshot);
        let always = is_moment || largest_gap || kept;
        let spaced = !always && spaced_wanted;
        // Call stacks wherever pages: blame there is then in the facts.
        let detail = Detail { pages: always || spaced, stacks: always || spaced, objects: is_moment, rows_alone: false };
        let ledger = match computed {
            Some(ledger) if !is_moment => ledger,
            computed => {
                drop(computed);
                snapshots::ledger_of(&mut self.blame.state, snapshot, detail, &mut self.owners.list)
            }
        };
        if spaced {
            self.pages_kept += ledger.page_maps.iter().map(|m| m.pages.len()).sum::<usize>();
        }
        if is_moment {
            self.moment_ledger = Some(ledger.clone());
        }
        self.ledgers.push((snapshot.time, ledger));
    }

    fn thread(&mut self, thread: &Thread) {
        self.summary.thread(thread);
        self.blame.thread(thread);
    }

    fn allocator(&mut self, path: &str) {
        self.summary.allocator(path);
        self.blame.allocator(path);
        self.owners.allocator(path);
    }

    fn stack(&mut self, id: u32, frames: &std::sync::Arc<[u64]>) {
        // The NUMA view's are blame's, handed over once blame is done with them.
        self.summary.stack(id, frames);
        self.blame.stack(id, frames);
    }

    fn python_code(&mut self, image: u32, code: &memgap_trace::python::PythonCode) {
        self.blame.python_code(image, code);
    }

    fn note(&mut self, time: u64, text: &str) {
        self.owners.note(text);
        self.summary.note(time, text);
    }

    fn end(&mut self, end: &End) {
        self.summary.end(end);
        self.blame.end(end);
    }

    fn exit(&mut self, exit: &Exit) {
        self.summary.exit(exit);
        self.blame.exit(exit);
    }
}

/// Snapshot indexes given page maps: the moment, the peak, the last, and
/// up to `SPACED_PAGE_MAPS` evenly spaced, sorted.
fn page_map_indexes(count: usize, moment: usize, peak: usize) -> Vec<usize> {
    if count == 0 {
        return Vec::new();
    }
    let mut chosen: Vec<usize> = (0..SPACED_PAGE_MAPS.min(count)).map(|i| i * count / SPACED_PAGE_MAPS.min(count)).collect();
    chosen.push(moment);
    chosen.push(peak);
    chosen.push(count - 1);
    chosen.sort_unstable();
    chosen.dedup();
    chosen
}

/// The lowest and highest sample of each of `points / 2` buckets of time.
fn downsample(samples: &[RssSample], points: usize) -> Vec<RssSample> {
    if samples.len() <= points {
        return samples.to_vec();
    }
    let buckets = points / 2;
    let mut kept = Vec::with_capacity(points);
    for bucket in 0..buckets {
        let part = &samples[bucket * samples.len() / buckets..(bucket + 1) * samples.len() / buckets];
        let (Some(low), Some(high)) = (part.iter().min_by_key(|s| s.vm_rss), part.iter().max_by_key(|s| s.vm_rss)) else { continue };
        let (first, second) = if low.seconds <= high.seconds { (low, high) } else { (high, low) };
        kept.push(*first);
        if second != first {
            kept.push(*second);
        }
    }
    kept
}

/// The report's data, about the moment `at`, in one replay (and one more
/// to find the largest gap of a trace whose gaps a runtime accounts for);
/// `None` when the trace has no snapshot.
pub fn report(path: &Path, at: At) -> Result<Option<Report>, MomentError> {
    report_with_names(path, at, false)
}

/// [`report`], with function names whole (`full_names`) or shortened.
pub fn report_with_names(path: &Path, at: At, full_names: bool) -> Result<Option<Report>, MomentError> {
    Ok(report_and_facts(path, at, full_names, false)?.map(|(report, _)| report))
}

/// A report, and the trace's facts when asked for.
pub type ReportAndFacts = (Report, Option<crate::facts::Facts>);

/// [`report_with_names`], and with `keep_facts` the trace's
/// [`facts`](crate::facts) learned by the same replay, for its index.
pub fn report_and_facts(path: &Path, at: At, full_names: bool, keep_facts: bool) -> Result<Option<ReportAndFacts>, MomentError> {
    let scan = snapshots::scan(path)?;
    scan.check(at)?;
    scan.replay_for(
        path,
        at,
        GapsSeen::InTime,
        || Ok(replay_report(path, &scan, at, None, full_names, keep_facts)?.map(Some)),
        |moment| match moment {
            Some(moment) => replay_report(path, &scan, at, Some(moment), full_names, keep_facts),
            None => Ok(None),
        },
    )
}

/// The report from one replay, about `moment`, or about the largest gap
/// found in it when `moment` is `None` (then `None` when the trace turned
/// out to need it known beforehand); with `keep_facts`, the facts too.
fn replay_report(
    path: &Path,
    scan: &snapshots::Scan,
    at: At,
    moment: Option<Moment>,
    full_names: bool,
    keep_facts: bool,
) -> Result<Option<ReportAndFacts>, MomentError> {
    let infos = &scan.snapshots;
    let peak = infos.iter().max_by_key(|s| (s.vm_rss, s.index)).map_or(0, |s| s.index);
    let known = moment.as_ref().map(|m| m.index);
    let mut v = ReportVisitor {
        summary: Builder::default(),
        blame: BlameVisitor::new(blame::DEFAULT_TEMPORARY_MS),
        moment: known,
        gaps: GapFinder::default(),
        gaps_in_ledgers: scan.runtime_metrics,
        peak,
        last: infos.len().saturating_sub(1),
        with_pages: page_map_indexes(infos.len(), known.unwrap_or(peak), peak),
        pages_kept: 0,
        seen: 0,
        ledgers: Vec::new(),
        moment_ledger: None,
        rss: Vec::new(),
        live_heap: SeriesBuilder::new(SERIES_BUCKETS),
        vm_rss: SeriesBuilder::new(SERIES_BUCKETS),
        owners: Owners::default(),
        trims: TrimMarks::new(TRIM_MARKS),
        timeline_trims: TrimMarks::new(crate::trim_marks::TIMELINE_MARKS),
        numa: NumaVisitor::embedded(known),
    };
    let outcome = replay(path, &mut v)?;
    let found_while_replaying = moment.is_none();
    let moment = match moment {
        Some(moment) => moment,
        None => {
            let Some(found) = v.gaps.moment(scan).filter(|_| !v.owners.saw_late_figures()) else { return Ok(None) };
            settle_page_maps(&mut v.ledgers, found.index, peak, v.last, &v.with_pages);
            found
        }
    };
    let timeline = &outcome.timeline;
    // A runtime with a heap of its own (Go, GHC): malloc's live heap is not the program's.
    let live_heap = if v.owners.summary().is_some() { Vec::new() } else { v.live_heap.finish(|time| timeline.seconds(time)) };
    v.owners.replayed(timeline);
    v.owners.measured_remedies = crate::ledger::measured::read_beside(path).map(std::sync::Arc::new);
    let mut snapshots: Vec<Ledger> = v
        .ledgers
        .drain(..)
        .map(|(time, mut ledger)| {
            ledger.at_seconds = timeline.seconds(time);
            v.owners.annotate(&mut ledger, Taken { time, monotonic_ns: Some(timeline.monotonic_ns(time)) });
            ledger
        })
        .collect();
    // A runtime's gaps laid over during the replay are checked against the
    // ledgers' final ones: any difference, and the moment is resolved first.
    if found_while_replaying && v.gaps_in_ledgers && !snapshots.iter().map(snapshots::gap_bytes).eq(v.gaps.gaps.iter().copied()) {
        return Ok(None);
    }
    // The live set's last uses before symbolizing, which is the report's
    // peak otherwise (debug sections decompressed beside the live set).
    let leaked = blame::StackFacts::leaked(&v.blame.state.live);
    v.summary.live = std::mem::take(&mut v.blame.state.live);
    let summary = v.summary.finish(&outcome, path);
    let stack_facts = blame::StackFacts::of(&v.blame, leaked);
    let blame = v.moment_ledger.as_ref().map(|ledger| {
        let options = BlameOptions {
            at,
            order: BlameOrder::Fragmentation,
            top: usize::MAX,
            per_stack: false,
            skip: Vec::new(),
            temporary_ms: blame::DEFAULT_TEMPORARY_MS,
            full_names,
        };
        let mut blame = blame::assemble(&stack_facts, snapshots.get(moment.index).map_or(0.0, |l| l.at_seconds), ledger, &options);
        blame.moment = Some(moment.clone());
        blame
    });
    let mut rss: Vec<RssSample> = v.rss.iter().map(|&(time, vm_rss)| RssSample { seconds: timeline.seconds(time), vm_rss }).collect();
    rss.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let gc_marks = v.owners.gc_marks(2000);
    let trim_calls = v.trims.calls;
    let trim_marks = v.trims.finish();
    v.numa.stacks = std::mem::take(&mut v.blame.stacks);
    let numa = v.numa.saw_anything().then(|| {
        let options = NumaOptions { at, machine_topology: None, top: 20 };
        let mut numa = numa::assemble(v.numa, snapshots.get(moment.index).map(|l| l.at_seconds), &options);
        numa.moment = Some(moment.clone());
        numa
    });
    let ghc = crate::ghc::report_of_trace(path)?;
    let numa = numa.map(|mut numa| {
        match &ghc {
            Some(ghc) => numa::add_ghc(&mut numa, ghc),
            None => numa.ghc_heap_bytes_by_node.clear(),
        }
        numa
    });
    let last = snapshots.len().saturating_sub(1);
    let moment = Moment { index: moment.index.min(last), ..moment };
    // The largest gap's page maps, when the moment is another: only for the facts.
    let largest_gap = v.gaps.largest().filter(|&index| !v.gaps_in_ledgers && index != moment.index && index != peak && index != last);
    let facts = keep_facts.then(|| {
        // What was computed at each: always at the moment, the largest gap,
        // the peak and the last; elsewhere, what the page budget kept.
        let computed: Vec<(bool, bool)> = snapshots
            .iter()
            .enumerate()
            .map(|(index, ledger)| {
                let always = index == moment.index || Some(index) == largest_gap || index == peak || index == last;
                (always || !ledger.page_maps.is_empty(), always || !ledger.by_stack.is_empty())
            })
            .collect();
        let seconds = |time| timeline.seconds(time);
        let timeline_facts = crate::facts::TimelineFacts {
            live_bytes: live_heap.clone(),
            vm_rss: v.vm_rss.finish(seconds),
            trims: v.timeline_trims.finish(),
            trim_calls,
            ghc: ghc.clone(),
        };
        crate::facts::encode(scan, &v.gaps.gaps, &snapshots, &computed, &stack_facts, &timeline_facts)
    });
    if let Some(ledger) = largest_gap.filter(|index| v.with_pages.binary_search(index).is_err()).and_then(|index| snapshots.get_mut(index))
    {
        ledger.page_maps = Vec::new();
    }
    let report = Report {
        summary,
        peak: peak.min(last),
        moment,
        snapshots,
        rss: downsample(&rss, RSS_POINTS),
        live_heap,
        blame,
        numa,
        ghc,
        gc_marks,
        trim_marks,
        trim_calls,
    };
    Ok(Some((report, facts)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_maps_at_peak_end_and_spaced() {
        assert_eq!(page_map_indexes(0, 0, 0), Vec::<usize>::new());
        assert_eq!(page_map_indexes(3, 1, 1), vec![0, 1, 2]);
        let chosen = page_map_indexes(1000, 212, 537);
        assert!(chosen.contains(&212) && chosen.contains(&537) && chosen.contains(&999) && chosen.contains(&0));
        assert!(chosen.len() <= SPACED_PAGE_MAPS + 3);
    }

    /// The report found the largest gap in its own replay: the same as the
    /// report replayed knowing it, on every recorded fixture.
    #[test]
    fn finding_the_moment_while_replaying_reports_the_same() {
        let (mut found_while_replaying, mut runtimes_found) = (0, Vec::new());
        for path in crate::fixtures::traces() {
            let scan = snapshots::scan(&path).unwrap();
            let Some(moment) = snapshots::resolve_scanned(&path, &scan, At::Gap).unwrap() else { continue };
            let known = replay_report(&path, &scan, At::Gap, Some(moment), false, false).unwrap().unwrap().0;
            if let Some((found, _)) = replay_report(&path, &scan, At::Gap, None, false, false).unwrap() {
                assert_eq!(format!("{found:?}"), format!("{known:?}"), "{}", path.display());
                found_while_replaying += 1;
                if scan.runtime_metrics {
                    assert!(!scan.late_figures, "{}: a runtime's late figures cannot give the gap while replaying", path.display());
                    runtimes_found.push(path.file_stem().unwrap().to_string_lossy().into_owned());
                }
            }
            let public = report(&path, At::Gap).unwrap().unwrap();
            assert_eq!(format!("{public:?}"), format!("{known:?}"), "{}", path.display());
        }
        assert!(found_while_replaying >= 3, "only {found_while_replaying} fixtures had their moment found while replaying");
        // The pymalloc census comes before its snapshot: one replay is enough.
        assert!(runtimes_found.iter().any(|name| name == "python"), "runtimes found while replaying: {runtimes_found:?}");
    }

    #[test]
    fn settling_keeps_page_maps_as_a_replay_knowing_the_moment() {
        let map = |pages: usize| crate::ledger::PageMap { pages: vec![crate::ledger::PageClass::NotResident; pages], ..Default::default() };
        let ledger = |pages: usize| Ledger { page_maps: vec![map(pages)], ..Ledger::default() };
        // Snapshots 0..6: moment 2, peak 4, last 5; spaced 0, 1, 3 within a budget reached after 1.
        let mut ledgers: Vec<(u64, Ledger)> = (0..6).map(|i| (i as u64, ledger(if i == 1 { PAGE_BUDGET } else { 10 }))).collect();
        settle_page_maps(&mut ledgers, 2, 4, 5, &[0, 1, 3]);
        let kept: Vec<bool> = ledgers.iter().map(|(_, l)| !l.page_maps.is_empty()).collect();
        assert_eq!(kept, [true, true, true, false, true, true]);
    }

    #[test]
    fn downsampling_keeps_extremes() {
        let samples: Vec<RssSample> =
            (0..10_000).map(|i| RssSample { seconds: i as f64, vm_rss: if i == 5000 { 99 } else { i % 7 } }).collect();
        let kept = downsample(&samples, 100);
        assert!(kept.len() <= 100);
        assert!(kept.iter().any(|s| s.vm_rss == 99));
        assert!(kept.windows(2).all(|w| w[0].seconds <= w[1].seconds));
    }
}
