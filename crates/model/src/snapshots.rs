//! Choosing snapshots and computing the ledger at them.

use std::path::Path;

use memgap_replay::{Inherited, LiveSet, ThreadEvent, Timeline as EventClock, Visitor, replay};
use memgap_trace::TraceError;
use memgap_trace::TraceFile;
use memgap_trace::records::{End, Exit, Metrics, Process, Record, Records, Rss, Snapshot, Thread};

use crate::accounting::{self, Detail};
use crate::heap_state::HeapState;
use crate::ledger::owner::Taken;
use crate::ledger::{HeapOwner, Ledger, Moment};
use crate::registry::Owners;
use crate::series::{SeriesBuilder, SeriesPoint};
use crate::summary::{Builder, Summary};

/// Buckets of time of the live heap and VmRSS series (about one per pixel
/// of a wide screen; each gives its lowest and highest value).
pub const SERIES_BUCKETS: usize = 2000;

/// Which snapshot to look at. Every command that looks at one moment of a
/// trace resolves it here, with `Scan::moment` (directly or after finding the largest gap), so they all agree.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum At {
    /// The snapshot with the largest gap between RSS and the live heap
    /// (memgap's own buffers left out): where there is most to explain.
    #[default]
    Gap,
    /// The snapshot with the highest RSS.
    Peak,
    /// The last snapshot (at exit, for a process that ended normally).
    End,
    /// The snapshot nearest to this many seconds after start.
    Seconds(f64),
}

impl std::str::FromStr for At {
    type Err = String;

    fn from_str(text: &str) -> Result<At, String> {
        match text {
            "gap" => Ok(At::Gap),
            "peak" => Ok(At::Peak),
            "end" => Ok(At::End),
            _ => text
                .trim_end_matches('s')
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(At::Seconds)
                .ok_or_else(|| format!("'{text}' is not gap, peak, end, or a number of seconds")),
        }
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Gap => f.write_str("gap"),
            At::Peak => f.write_str("peak"),
            At::End => f.write_str("end"),
            At::Seconds(seconds) => write!(f, "{seconds}"),
        }
    }
}

/// Why a moment cannot be looked at.
#[derive(Debug)]
pub enum MomentError {
    Trace(TraceError),
    /// `--at SECONDS` after the trace's last record.
    PastTheEnd {
        asked: f64,
        ends: f64,
    },
}

impl std::fmt::Display for MomentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MomentError::Trace(error) => error.fmt(f),
            MomentError::PastTheEnd { asked, ends } => {
                write!(f, "--at {asked} is past the end of the trace ({ends:.2} s); ask for 0 to {ends:.2}, or gap, peak or end")
            }
        }
    }
}

impl std::error::Error for MomentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MomentError::Trace(error) => error.source(),
            MomentError::PastTheEnd { .. } => None,
        }
    }
}

impl From<TraceError> for MomentError {
    fn from(error: TraceError) -> MomentError {
        MomentError::Trace(error)
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotInfo {
    /// Position among the trace's snapshots, in time order.
    pub index: usize,
    pub seconds: f64,
    pub vm_rss: u64,
}

/// The snapshots of a trace and the time of its last record.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Scan {
    pub(crate) snapshots: Vec<SnapshotInfo>,
    end_seconds: f64,
    /// The trace holds a runtime's own metrics: its gaps come from the ledgers' owners.
    pub(crate) runtime_metrics: bool,
    /// Some of them are laid over only after the replay (see [`Owners::laid_over_late`]).
    #[serde(default)]
    pub(crate) late_figures: bool,
}

/// Lists the snapshots without replaying events (chunks are decompressed,
/// event records are not decoded).
pub fn list(path: &Path) -> Result<Vec<SnapshotInfo>, TraceError> {
    Ok(scan(path)?.snapshots)
}

pub(crate) fn scan(path: &Path) -> Result<Scan, TraceError> {
    let trace = TraceFile::open(path)?;
    let mut timeline = EventClock::default();
    let mut found = Vec::new();
    let mut started = false;
    let mut last_time = 0;
    let (mut runtime_metrics, mut late_figures) = (false, false);
    let owners = Owners::default();
    trace.for_each_chunk(|_, chunk| {
        for record in Records::new(chunk).flatten() {
            match record {
                Record::Process(p) if !started || p.image == 0 => {
                    timeline.start(&p);
                    started = true;
                }
                Record::Clock(c) => timeline.add(&c),
                Record::Snapshot(s) => {
                    last_time = last_time.max(s.time);
                    found.push((s.time, if s.vm_rss_after > 0 { s.vm_rss_after } else { s.rss.vm_rss }));
                }
                Record::Rss(r) => last_time = last_time.max(r.time),
                Record::End(e) => last_time = last_time.max(e.time),
                Record::Metrics(m) if m.source != crate::trim_marks::SOURCE => {
                    runtime_metrics = true;
                    late_figures |= owners.laid_over_late(&m);
                }
                _ => {}
            }
        }
        Ok(())
    })?;
    found.sort_by_key(|&(time, _)| time);
    let snapshots = found
        .into_iter()
        .enumerate()
        .map(|(index, (time, vm_rss))| SnapshotInfo { index, seconds: timeline.seconds(time), vm_rss })
        .collect();
    Ok(Scan { snapshots, end_seconds: timeline.seconds(last_time), runtime_metrics, late_figures })
}

/// The ledger at `snapshot` of a replay, given the heap as replayed up to
/// its instant and the heap owners as they have seen the trace so far.
/// Watched from outside (`memgap watch`): the ledger of the walk of glibc's
/// state taken with this snapshot, as `memgap snapshot PID` computed it.
pub(crate) fn ledger_of(state: &mut HeapState, snapshot: &Snapshot, detail: Detail, owners: &mut [Box<dyn HeapOwner>]) -> Ledger {
    if let Some(walk) = state.take_walk(snapshot) {
        return crate::outside_walk::walked_ledger_with(&walk, detail);
    }
    accounting::compute(state, snapshot, detail, owners)
}

/// The gap of a computed ledger: RSS less the live row and memgap's own memory.
pub fn gap_bytes(ledger: &Ledger) -> u64 {
    ledger.program_rss().saturating_sub(ledger.rows.live)
}

/// The resident bytes of memgap's own ranges at a snapshot (not their
/// length: the area shared with the recorder is reserved far larger than
/// what the agent has touched). A mapping inside a range counts its smaps
/// RSS; one the range only partly covers, its resident pages there.
fn agent_resident_bytes(snapshot: &Snapshot) -> u64 {
    let page = snapshot.page_size.max(1);
    // Disjoint and in order, so each mapping is looked at about once
    // (smaps lists mappings in address order).
    let mut ranges: Vec<(u64, u64)> = snapshot.agent_ranges.iter().map(|&(start, length)| (start, start.saturating_add(length))).collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let mappings = &snapshot.mappings;
    let mut resident = 0u64;
    for (start, end) in merged {
        let first = mappings.partition_point(|m| m.end <= start);
        for m in mappings[first..].iter().take_while(|m| m.start < end).filter(|m| m.end > start) {
            resident = resident.saturating_add(if m.start >= start && m.end <= end {
                m.rss
            } else {
                let (from, to) = (start.max(m.start), end.min(m.end));
                m.residency.resident_in((from - m.start) / page..(to - m.start).div_ceil(page)).saturating_mul(page)
            });
        }
    }
    resident
}

/// The gap at each snapshot without computing ledgers (a ledger classifies
/// every page; this pass only keeps the live set): VmRSS less the live heap
/// and the length of memgap's buffers. A runtime that reports its own live
/// heap (Go, GHC, Ruby, Node) is only known to the ledger's owners, so such
/// a trace is marked and its gaps come from the ledgers.
#[derive(Default)]
struct GapVisitor {
    state: HeapState,
    gaps: GapFinder,
    runtime_metrics: bool,
}

impl Visitor for GapVisitor {
    fn live_set(&self) -> Option<&LiveSet> {
        Some(&self.state.live)
    }

    fn process(&mut self, _process: &Process) {
        self.state.start_image();
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source != crate::trim_marks::SOURCE {
            self.runtime_metrics = true;
        }
    }

    fn allocator(&mut self, path: &str) {
        self.state.allocator = path.to_string();
    }

    fn thread(&mut self, thread: &Thread) {
        self.state.thread(thread);
    }

    fn inherited(&mut self, item: Inherited<'_>) {
        // The trim model is not needed here: only the live set.
        if !matches!(item, Inherited::Snapshot(_) | Inherited::Metrics(_)) {
            self.state.inherit(item);
        }
    }

    fn event(&mut self, event: &ThreadEvent) {
        self.state.apply(event);
    }

    fn snapshot(&mut self, snapshot: &Snapshot) {
        self.gaps.note(snapshot, self.state.live.live_bytes());
    }
}

/// The gap at `snapshot` with `live_bytes` in the live heap, as the
/// largest gap is chosen by (for a trace without a runtime's own metrics).
pub(crate) fn gap_at(snapshot: &Snapshot, live_bytes: u64) -> u64 {
    let rss = if snapshot.vm_rss_after > 0 { snapshot.vm_rss_after } else { snapshot.rss.vm_rss };
    rss.saturating_sub(live_bytes.saturating_add(agent_resident_bytes(snapshot)))
}

/// Finds the largest gap during the replay that uses it (one replay where
/// two were needed): the gap at each snapshot, and whether it is the
/// largest so far (the earliest of equals), whose ledger the replay keeps.
/// malloc's gap from the live heap (see [`GapVisitor`]), or a runtime's
/// from each snapshot's ledger when its figures come in time
/// ([`GapFinder::note_at`], [`GapFinder::note_gap`]).
#[derive(Debug, Default)]
pub(crate) struct GapFinder {
    pub(crate) gaps: Vec<u64>,
    largest: Option<(usize, u64)>,
    /// A runtime's gaps, noted by [`GapFinder::note_at`]: each snapshot's
    /// rows, by trace time, until [`GapFinder::settle`] checks the gaps
    /// against them with every figure laid over.
    rows: Option<Vec<(u64, Ledger)>>,
    /// The gaps noted may not be the final ledgers' (a runtime's, not yet
    /// settled, or settled and found different): [`GapFinder::moment`] then
    /// gives none.
    unconfirmed: bool,
}

impl GapFinder {
    /// A finder for [`GapFinder::note_at`] in a replay of the trace `scan`
    /// describes: a runtime's gaps where it has some, else malloc's.
    pub(crate) fn for_scan(scan: &Scan) -> GapFinder {
        GapFinder { rows: scan.runtime_metrics.then(Vec::new), unconfirmed: scan.runtime_metrics, ..GapFinder::default() }
    }

    /// Notes the gap at `snapshot`, the next one, as the replay's `state`
    /// and `owners` have it there: malloc's from the live heap, or a
    /// runtime's from the snapshot's rows with the figures that came in time
    /// laid over; true when it is the largest so far.
    pub(crate) fn note_at(&mut self, state: &mut HeapState, snapshot: &Snapshot, owners: &mut Owners) -> bool {
        let Some(rows) = &mut self.rows else { return self.note(snapshot, state.live.live_bytes()) };
        // Not `ledger_of`: a heap walk is a late figure, and the walk stays
        // for the ledger the replay may compute next.
        let mut ledger = accounting::compute(state, snapshot, Detail::ROWS_ALONE, &mut owners.list);
        let gap = gap_bytes(&owners.laid_over_in_time(&mut ledger, snapshot.time));
        rows.push((snapshot.time, ledger));
        self.note_gap(gap)
    }

    /// Once the replay is over, with the `owners` it fed (replayed) and its
    /// `clock`: a runtime's gaps noted while replaying are confirmed when no
    /// figure came late and every snapshot's ledger, all its figures laid
    /// over, has the gap noted.
    pub(crate) fn settle(&mut self, owners: &Owners, clock: &EventClock) {
        let Some(rows) = self.rows.take() else { return };
        let final_gaps = rows.into_iter().map(|(time, mut ledger)| {
            owners.annotate(&mut ledger, Taken { time, monotonic_ns: Some(clock.monotonic_ns(time)) });
            gap_bytes(&ledger)
        });
        self.unconfirmed = owners.saw_late_figures() || !final_gaps.eq(self.gaps.iter().copied());
    }

    /// Notes the gap at the next snapshot, with `live_bytes` in the live
    /// heap; true when it is the largest so far.
    pub(crate) fn note(&mut self, snapshot: &Snapshot, live_bytes: u64) -> bool {
        self.note_gap(gap_at(snapshot, live_bytes))
    }

    /// Notes `gap` at the next snapshot, computed elsewhere (a runtime's,
    /// from its ledger); true when it is the largest so far.
    pub(crate) fn note_gap(&mut self, gap: u64) -> bool {
        let index = self.gaps.len();
        self.gaps.push(gap);
        let larger = self.largest.is_none_or(|(_, largest)| gap > largest);
        if larger {
            self.largest = Some((index, gap));
        }
        larger
    }

    /// The snapshot with the largest gap so far.
    pub(crate) fn largest(&self) -> Option<usize> {
        self.largest.map(|(index, _)| index)
    }

    /// The moment `--at gap` names, once the replay is over (and settled):
    /// `None` when the snapshots seen are not the scan's or the gaps are not
    /// confirmed (then resolve it first, with `resolve_scanned`).
    pub(crate) fn moment(&self, scan: &Scan) -> Option<Moment> {
        let found = scan.moment(At::Gap, &self.gaps)?;
        (!self.unconfirmed && self.gaps.len() == scan.snapshots.len() && Some(found.index) == self.largest()).then_some(found)
    }
}

/// Which gaps a replay finding the largest one while it runs can see.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum GapsSeen {
    /// malloc's, from the live heap, and a runtime's where the replay
    /// computes every snapshot's rows and lays over the figures that come
    /// before their snapshot ([`GapFinder::note_at`]); the others come late
    /// (see [`Owners::laid_over_late`]).
    InTime,
    /// Also a runtime's: the replay keeps every ledger, and takes the gaps
    /// from them once the runtime's late figures are laid over them.
    EveryOwner,
}

impl Scan {
    /// One replay about the snapshot `at` names, where the largest gap is
    /// found in the replay itself when it can be (`seen` says whether the
    /// replay sees a runtime's gaps): `finding_gap` replays so and gives
    /// what it computed, or `None` when its snapshots were not the scan's.
    /// Else the moment is resolved first and `at_moment` replays for it.
    pub(crate) fn replay_for<T, E: From<TraceError>>(
        &self,
        path: &Path,
        at: At,
        seen: GapsSeen,
        finding_gap: impl FnOnce() -> Result<Option<T>, E>,
        at_moment: impl FnOnce(Option<Moment>) -> Result<T, E>,
    ) -> Result<T, E> {
        if self.gap_found_while_replaying(at, seen)
            && let Some(found) = finding_gap()?
        {
            return Ok(found);
        }
        at_moment(resolve_scanned(path, self, at)?)
    }

    pub(crate) fn gap_found_while_replaying(&self, at: At, seen: GapsSeen) -> bool {
        at == At::Gap && self.snapshots.len() > 1 && (seen == GapsSeen::EveryOwner || !self.late_figures)
    }
}

/// The gap at every snapshot, by index.
fn gaps(path: &Path, scan: &Scan) -> Result<Vec<u64>, TraceError> {
    // A runtime's gaps are known only to the ledgers; the scan may have said so already.
    if !scan.runtime_metrics {
        let mut visitor = GapVisitor::default();
        replay(path, &mut visitor)?;
        if !visitor.runtime_metrics {
            return Ok(visitor.gaps.gaps);
        }
    }
    Ok(ledgers(path, &|_| true, Depth::Rows)?.iter().map(gap_bytes).collect())
}

impl Scan {
    /// Refuses a time the trace does not reach (printed times are rounded
    /// to hundredths, so those count as reached).
    pub(crate) fn check(&self, at: At) -> Result<(), MomentError> {
        match at {
            At::Seconds(asked) if !self.snapshots.is_empty() && asked > self.end_seconds + 0.005 => {
                Err(MomentError::PastTheEnd { asked, ends: self.end_seconds })
            }
            _ => Ok(()),
        }
    }

    /// The moment `at` names; `gaps` (by snapshot index) is only read for `At::Gap`.
    pub(crate) fn moment(&self, at: At, gaps: &[u64]) -> Option<Moment> {
        let snapshots = &self.snapshots;
        let (best, chosen, reason) = match at {
            At::Gap if snapshots.len() == 1 => (snapshots.first(), "gap", "the only snapshot".to_string()),
            // The earliest of equal gaps: the moment the gap was first that large.
            At::Gap => (
                gaps.iter()
                    .take(snapshots.len())
                    .enumerate()
                    .max_by_key(|&(index, gap)| (*gap, std::cmp::Reverse(index)))
                    .and_then(|(index, _)| snapshots.get(index))
                    .or(snapshots.last()),
                "gap",
                "the largest gap between RSS and the live heap".to_string(),
            ),
            At::Peak => (snapshots.iter().max_by_key(|s| (s.vm_rss, s.index)), "peak", "the RSS peak".to_string()),
            At::End => (snapshots.last(), "end", "the last snapshot".to_string()),
            At::Seconds(t) => (
                snapshots.iter().min_by(|a, b| (a.seconds - t).abs().total_cmp(&(b.seconds - t).abs())),
                "seconds",
                format!("the snapshot nearest to {t} s"),
            ),
        };
        best.map(|s| Moment { index: s.index, seconds: s.seconds, chosen, reason })
    }
}

/// How much of each wanted ledger a replay computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// The rows alone, which the gap needs: no trim forecast, no
    /// fragmentation by size.
    Rows,
    /// The whole ledger, with its page maps or not.
    Whole { pages: bool },
}

/// Replays the trace and computes the ledger at the chosen snapshots.
struct LedgerVisitor<'a> {
    state: HeapState,
    wanted: &'a dyn Fn(usize) -> bool,
    depth: Depth,
    seen: usize,
    ledgers: Vec<(u64, Ledger)>,
    /// When finding the largest gap in this replay: the gaps, and the
    /// ledger at the largest so far.
    gap: Option<(GapFinder, Option<(u64, Ledger)>)>,
    owners: Owners,
    /// The summary too, counted from the same live set: `memgap run`
    /// prints both, and two replays took twice as long.
    summary: Option<Builder>,
    /// The live heap after every event and VmRSS at every sample, when asked for.
    series: Option<Series>,
}

struct Series {
    live: SeriesBuilder,
    vm_rss: SeriesBuilder,
}

impl Visitor for LedgerVisitor<'_> {
    fn live_set(&self) -> Option<&LiveSet> {
        Some(&self.state.live)
    }

    fn process(&mut self, process: &Process) {
        self.state.start_image();
        self.owners.process(process);
        if let Some(summary) = &mut self.summary {
            summary.process(process);
        }
    }

    fn metrics(&mut self, metrics: &Metrics) {
        self.state.metrics(metrics);
        self.owners.metrics(metrics);
        if let Some(summary) = &mut self.summary {
            summary.metrics(metrics);
        }
    }

    fn note(&mut self, time: u64, text: &str) {
        self.owners.note(text);
        if let Some(summary) = &mut self.summary {
            summary.note(time, text);
        }
    }

    fn allocator(&mut self, path: &str) {
        self.state.allocator = path.to_string();
        self.owners.allocator(path);
    }

    fn thread(&mut self, thread: &Thread) {
        self.state.thread(thread);
    }

    fn inherited(&mut self, item: Inherited<'_>) {
        self.state.inherit(item);
        if let (Inherited::End, Some(summary)) = (item, &mut self.summary) {
            summary.inherited_live(self.state.live.live_bytes());
        }
    }

    fn event(&mut self, event: &ThreadEvent) {
        let change = self.state.apply(event);
        if let Some(summary) = &mut self.summary {
            summary.count(event, change, self.state.live.live_bytes());
        }
        if let Some(series) = &mut self.series {
            series.live.push(event.event.time, self.state.live.live_bytes());
        }
    }

    fn rss(&mut self, rss: &Rss) {
        self.owners.rss(rss);
        if let Some(series) = &mut self.series {
            series.vm_rss.push(rss.time, rss.vm_rss);
        }
        if let Some(summary) = &mut self.summary {
            summary.rss(rss);
        }
    }

    fn end(&mut self, end: &End) {
        if let Some(summary) = &mut self.summary {
            summary.end(end);
        }
    }

    fn exit(&mut self, exit: &Exit) {
        if let Some(summary) = &mut self.summary {
            summary.exit(exit);
        }
    }

    fn snapshot(&mut self, snapshot: &Snapshot) {
        self.owners.snapshot_seen(snapshot);
        let largest_gap = self.gap.as_mut().is_some_and(|(finder, _)| finder.note_at(&mut self.state, snapshot, &mut self.owners));
        let wanted = (self.wanted)(self.seen);
        if wanted || largest_gap {
            let detail = match self.depth {
                Depth::Rows => Detail::ROWS_ALONE,
                Depth::Whole { pages } => Detail { pages, ..Detail::default() },
            };
            let ledger = ledger_of(&mut self.state, snapshot, detail, &mut self.owners.list);
            match &mut self.gap {
                Some((_, at_gap)) if largest_gap => {
                    if wanted {
                        self.ledgers.push((snapshot.time, ledger.clone()));
                    }
                    *at_gap = Some((snapshot.time, ledger));
                }
                _ => self.ledgers.push((snapshot.time, ledger)),
            }
        } else {
            self.state.pass_snapshot(snapshot);
        }
        self.seen += 1;
    }
}

fn ledgers(path: &Path, wanted: &dyn Fn(usize) -> bool, depth: Depth) -> Result<Vec<Ledger>, TraceError> {
    Ok(replay_ledgers(path, wanted, depth, None, false, None)?.ledgers)
}

struct Replayed {
    /// The wanted ledgers, in time order.
    ledgers: Vec<Ledger>,
    summary: Option<Summary>,
    series: Option<(Vec<SeriesPoint>, Vec<SeriesPoint>)>,
    /// When asked to find it: the gaps, and the ledger at the largest.
    gap: Option<(GapFinder, Option<Ledger>)>,
}

fn replay_ledgers(
    path: &Path,
    wanted: &dyn Fn(usize) -> bool,
    depth: Depth,
    summary: Option<Builder>,
    want_series: bool,
    find_gap: Option<GapFinder>,
) -> Result<Replayed, TraceError> {
    let series = want_series.then(|| Series { live: SeriesBuilder::new(SERIES_BUCKETS), vm_rss: SeriesBuilder::new(SERIES_BUCKETS) });
    let mut visitor = LedgerVisitor {
        state: if depth == Depth::Rows { HeapState::for_rows_only() } else { HeapState::default() },
        wanted,
        depth,
        seen: 0,
        ledgers: Vec::new(),
        gap: find_gap.map(|finder| (finder, None)),
        owners: Owners::default(),
        summary,
        series,
    };
    let outcome = replay(path, &mut visitor)?;
    let summary = visitor.summary.take().map(|mut summary| {
        summary.live = std::mem::take(&mut visitor.state.live);
        summary.finish(&outcome, path)
    });
    let series = visitor.series.take().map(|series| {
        let seconds = |time| outcome.timeline.seconds(time);
        // A runtime with a heap of its own (Go, GHC): malloc's live heap is not the program's.
        let live = if visitor.owners.summary().is_some() { Vec::new() } else { series.live.finish(seconds) };
        (live, series.vm_rss.finish(seconds))
    });
    let mut owners = visitor.owners;
    owners.replayed(&outcome.timeline);
    owners.measured_remedies = crate::ledger::measured::read_beside(path).map(std::sync::Arc::new);
    let finish = |(time, mut ledger): (u64, Ledger)| {
        ledger.at_seconds = outcome.timeline.seconds(time);
        owners.annotate(&mut ledger, Taken { time, monotonic_ns: Some(outcome.timeline.monotonic_ns(time)) });
        ledger
    };
    let ledgers = visitor.ledgers.into_iter().map(finish).collect();
    let gap = visitor.gap.map(|(mut finder, at_gap)| {
        finder.settle(&owners, &outcome.timeline);
        (finder, at_gap.map(finish))
    });
    Ok(Replayed { ledgers, summary, series, gap })
}

/// The ledger at one snapshot, with the moment it is; `None` when the
/// trace has no snapshot.
pub fn ledger_at(path: &Path, at: At, want_pages: bool) -> Result<Option<Ledger>, MomentError> {
    let scan = scan(path)?;
    scan.check(at)?;
    Ok(scan.replay_for(
        path,
        at,
        GapsSeen::EveryOwner,
        || Ok::<_, TraceError>(ledger_at_largest_gap(path, &scan, want_pages)?.map(Some)),
        |moment| ledger_at_moment(path, moment, want_pages),
    )?)
}

/// The ledger at the largest gap, found in the replay that computes it;
/// `None` when the replay disagrees with the scan (then resolve first).
fn ledger_at_largest_gap(path: &Path, scan: &Scan, want_pages: bool) -> Result<Option<Ledger>, TraceError> {
    // A runtime's gaps: without page maps, every ledger costs less than
    // each one's rows and the whole ledger wherever the gap grows (nearly
    // every snapshot, as a program grows). Page maps at every snapshot
    // would cost more than a second replay: where the figures come in time,
    // the rows give the gaps.
    if scan.runtime_metrics && (!want_pages || scan.late_figures) {
        let found = if want_pages { None } else { every_ledger(path, scan, None)? };
        return Ok(found.map(|(mut replayed, moment)| {
            let mut ledger = replayed.ledgers.swap_remove(moment.index);
            ledger.moment = Some(moment);
            ledger
        }));
    }
    let Some((finder, Some(mut ledger))) =
        replay_ledgers(path, &|_| false, Depth::Whole { pages: want_pages }, None, false, Some(GapFinder::for_scan(scan)))?.gap
    else {
        return Ok(None);
    };
    let Some(moment) = finder.moment(scan) else { return Ok(None) };
    ledger.moment = Some(moment);
    Ok(Some(ledger))
}

/// The ledger at `moment`, resolved before the replay.
fn ledger_at_moment(path: &Path, moment: Option<Moment>, want_pages: bool) -> Result<Option<Ledger>, TraceError> {
    let Some(moment) = moment else { return Ok(None) };
    let mut ledger = ledgers(path, &|i| i == moment.index, Depth::Whole { pages: want_pages })?.pop();
    if let Some(ledger) = &mut ledger {
        ledger.moment = Some(moment);
    }
    Ok(ledger)
}

pub(crate) fn resolve_scanned(path: &Path, scan: &Scan, at: At) -> Result<Option<Moment>, TraceError> {
    let gaps: Vec<u64> = if at == At::Gap && scan.snapshots.len() > 1 { gaps(path, scan)? } else { Vec::new() };
    Ok(scan.moment(at, &gaps))
}

/// What `memgap run` prints when the program ends, from one replay: the
/// summary, the ledger at the default moment, and the last one when that
/// is another snapshot.
pub struct Closing {
    pub summary: Summary,
    pub moment: Option<Ledger>,
    pub end: Option<Ledger>,
}

pub fn closing(path: &Path) -> Result<Closing, TraceError> {
    let scan = scan(path)?;
    scan.replay_for(
        path,
        At::Gap,
        GapsSeen::EveryOwner,
        || closing_at_largest_gap(path, &scan),
        |moment| closing_resolved(path, &scan, moment),
    )
}

/// [`closing`] in one replay that finds the largest gap; `None` when the
/// replay disagrees with the scan.
fn closing_at_largest_gap(path: &Path, scan: &Scan) -> Result<Option<Closing>, TraceError> {
    if scan.runtime_metrics {
        return closing_from_every_ledger(path, scan);
    }
    let last = scan.snapshots.len().checked_sub(1);
    let replayed = replay_ledgers(
        path,
        &|i| Some(i) == last,
        Depth::Whole { pages: false },
        Some(Builder::default()),
        false,
        Some(GapFinder::default()),
    )?;
    let summary = replayed.summary.expect("a summary was asked for");
    let Some((finder, Some(mut at_gap))) = replayed.gap else { return Ok(None) };
    let Some(moment) = finder.moment(scan) else { return Ok(None) };
    let end = if Some(moment.index) == last { None } else { replayed.ledgers.into_iter().next_back() };
    at_gap.moment = Some(moment);
    Ok(Some(Closing { summary, moment: Some(at_gap), end }))
}

/// [`closing`] of a trace whose gaps a runtime accounts for, in one replay (see [`every_ledger`]).
fn closing_from_every_ledger(path: &Path, scan: &Scan) -> Result<Option<Closing>, TraceError> {
    let Some((Replayed { mut ledgers, summary, .. }, moment)) = every_ledger(path, scan, Some(Builder::default()))? else {
        return Ok(None);
    };
    let end = (moment.index + 1 < ledgers.len()).then(|| ledgers.pop()).flatten();
    let mut at_moment = ledgers.swap_remove(moment.index);
    at_moment.moment = Some(moment);
    Ok(Some(Closing { summary: summary.expect("a summary was asked for"), moment: Some(at_moment), end }))
}

/// A trace whose gaps a runtime accounts for knows them only once the
/// runtime's late figures are laid over the ledgers: one replay keeping
/// every ledger (without page maps) gives them, and the largest gap among
/// them, as [`gaps`] chooses it; `None` when its snapshots are not the scan's.
fn every_ledger(path: &Path, scan: &Scan, summary: Option<Builder>) -> Result<Option<(Replayed, Moment)>, TraceError> {
    let replayed = replay_ledgers(path, &|_| true, Depth::Whole { pages: false }, summary, false, None)?;
    let gaps: Vec<u64> = replayed.ledgers.iter().map(gap_bytes).collect();
    let moment = scan.moment(At::Gap, &gaps).filter(|_| gaps.len() == scan.snapshots.len());
    Ok(moment.map(|moment| (replayed, moment)))
}

/// [`closing`], the largest gap (`moment`) resolved before the replay.
fn closing_resolved(path: &Path, scan: &Scan, moment: Option<Moment>) -> Result<Closing, TraceError> {
    let last = scan.snapshots.len().checked_sub(1);
    let wanted = |i: usize| Some(i) == moment.as_ref().map(|m| m.index) || Some(i) == last;
    let replayed = replay_ledgers(path, &wanted, Depth::Whole { pages: false }, Some(Builder::default()), false, None)?;
    let (mut ledgers, summary) = (replayed.ledgers, replayed.summary.expect("a summary was asked for"));
    let Some(moment) = moment else { return Ok(Closing { summary, moment: None, end: None }) };
    // In time order: the moment's ledger, then the last one when it is another.
    let end = if ledgers.len() > 1 { ledgers.pop() } else { None };
    let mut at_moment = ledgers.pop();
    if let Some(ledger) = &mut at_moment {
        ledger.moment = Some(moment);
    }
    Ok(Closing { summary, moment: at_moment, end })
}

/// The ledger at every snapshot, and the live heap and VmRSS between them.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The ledger at every snapshot, in time order.
    pub snapshots: Vec<Ledger>,
    /// The live heap (bytes the program holds from malloc) after every heap
    /// event, as `[seconds, bytes]`, at most two points per bucket of time
    /// (its lowest and highest). Empty for a runtime with a heap of its own
    /// (Go, GHC), whose live heap malloc does not see.
    pub live_bytes: Vec<SeriesPoint>,
    /// VmRSS at every sample, reduced the same way.
    pub vm_rss: Vec<SeriesPoint>,
}

/// The ledger at every snapshot, the live heap and VmRSS, in one replay.
pub fn timeline(path: &Path) -> Result<Timeline, TraceError> {
    let replayed = replay_ledgers(path, &|_| true, Depth::Whole { pages: false }, None, true, None)?;
    let (live_bytes, vm_rss) = replayed.series.unwrap_or_default();
    Ok(Timeline { snapshots: replayed.ledgers, live_bytes, vm_rss })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_chooses() {
        assert_eq!("peak".parse::<At>(), Ok(At::Peak));
        assert_eq!("gap".parse::<At>(), Ok(At::Gap));
        assert_eq!("2.5".parse::<At>(), Ok(At::Seconds(2.5)));
        assert_eq!("3s".parse::<At>(), Ok(At::Seconds(3.0)));
        assert!("soon".parse::<At>().is_err());
        assert_eq!(At::default(), At::Gap);
        for at in [At::Gap, At::Peak, At::End, At::Seconds(1.25)] {
            assert_eq!(at.to_string().parse::<At>(), Ok(at));
        }
        let snapshots = [(0.0, 10), (1.0, 30), (2.0, 20), (3.0, 15)]
            .iter()
            .enumerate()
            .map(|(index, &(seconds, vm_rss))| SnapshotInfo { index, seconds, vm_rss })
            .collect::<Vec<_>>();
        let scan = Scan { snapshots, end_seconds: 3.2, runtime_metrics: false, late_figures: false };
        let index = |at: At, gaps: &[u64]| scan.moment(at, gaps).map(|m| m.index);
        assert_eq!(index(At::Peak, &[]), Some(1));
        assert_eq!(index(At::End, &[]), Some(3));
        assert_eq!(index(At::Seconds(1.8), &[]), Some(2));
        // The largest gap, the earliest of equals; neither the peak nor the end here.
        assert_eq!(index(At::Gap, &[1, 5, 9, 9]), Some(2));
        assert_eq!(index(At::Gap, &[1, 5]), Some(1));
        let moment = scan.moment(At::Gap, &[1, 5, 9, 2]).unwrap();
        assert_eq!(moment.line(), "at 2.00 s, the largest gap between RSS and the live heap; --at peak|end|SECONDS for others");
        assert_eq!(
            Scan { snapshots: Vec::new(), end_seconds: 0.0, runtime_metrics: false, late_figures: false }.moment(At::Gap, &[]),
            None
        );
    }

    /// The largest gap found in the replay that computes its ledger (for a
    /// trace whose gaps a runtime accounts for, in one replay keeping every
    /// ledger): the same ledger (and closing) as when it is resolved first,
    /// on every recorded fixture where it applies.
    #[test]
    fn finding_the_largest_gap_while_replaying_gives_the_same_ledgers() {
        let (mut mallocs, mut runtimes, mut in_time_pages) = (0, 0, 0);
        for path in crate::fixtures::traces() {
            let scan = scan(&path).unwrap();
            if !scan.gap_found_while_replaying(At::Gap, GapsSeen::EveryOwner) {
                continue;
            }
            let moment = resolve_scanned(&path, &scan, At::Gap).unwrap();
            for pages in [false, true] {
                let once = ledger_at_largest_gap(&path, &scan, pages).unwrap();
                if scan.late_figures && pages {
                    assert!(once.is_none(), "page maps are asked of a replay that knows the moment");
                    continue;
                }
                in_time_pages += usize::from(scan.runtime_metrics && pages);
                let resolved = ledger_at_moment(&path, moment.clone(), pages).unwrap().unwrap();
                assert_eq!(format!("{:?}", once.expect("found while replaying")), format!("{resolved:?}"), "{}", path.display());
            }
            let once = closing_at_largest_gap(&path, &scan).unwrap().expect("found while replaying");
            let resolved = closing_resolved(&path, &scan, moment).unwrap();
            assert_eq!(format!("{:?}", (once.moment, once.end)), format!("{:?}", (resolved.moment, resolved.end)), "{}", path.display());
            assert_eq!(serde_json::to_string(&once.summary).unwrap(), serde_json::to_string(&resolved.summary).unwrap());
            *(if scan.runtime_metrics { &mut runtimes } else { &mut mallocs }) += 1;
        }
        assert!(mallocs >= 4, "only {mallocs} fixtures have several snapshots and malloc's live heap");
        assert!(runtimes >= 4, "only {runtimes} fixtures have several snapshots and a runtime's own heap");
        assert!(in_time_pages >= 1, "no fixture has several snapshots and a runtime's figures in time (Python's)");
    }

    #[test]
    fn a_time_past_the_end_is_refused() {
        let snapshots = vec![SnapshotInfo { index: 0, seconds: 0.5, vm_rss: 1 }, SnapshotInfo { index: 1, seconds: 2.0, vm_rss: 1 }];
        let scan = Scan { snapshots, end_seconds: 2.414, runtime_metrics: false, late_figures: false };
        assert!(scan.check(At::Seconds(2.414)).is_ok());
        assert!(scan.check(At::Seconds(2.418)).is_ok(), "2.42 as printed is the end");
        let refused = scan.check(At::Seconds(99.0)).unwrap_err();
        assert_eq!(refused.to_string(), "--at 99 is past the end of the trace (2.41 s); ask for 0 to 2.41, or gap, peak or end");
        assert!(scan.check(At::End).is_ok() && scan.check(At::Gap).is_ok());
    }

    /// A replay for the rows alone gives every snapshot the rows, and so
    /// the gap, of the whole ledger, without its trim forecast or its
    /// fragmentation by size.
    #[test]
    fn ledgers_of_rows_alone_have_the_whole_ledgers_rows() {
        let mut forecast_skipped = 0;
        for path in crate::fixtures::traces() {
            let whole = ledgers(&path, &|_| true, Depth::Whole { pages: false }).unwrap();
            let rows = ledgers(&path, &|_| true, Depth::Rows).unwrap();
            assert_eq!(rows.len(), whole.len(), "{}", path.display());
            for (rows, whole) in rows.iter().zip(&whole) {
                assert_eq!(format!("{:?}", rows.rows), format!("{:?}", whole.rows), "{}", path.display());
                assert_eq!(format!("{:?}", rows.owners), format!("{:?}", whole.owners), "{}", path.display());
                assert_eq!(gap_bytes(rows), gap_bytes(whole));
                assert!(rows.fragmentation_by_size.is_empty() && rows.heaps.iter().all(|h| h.trimmable == 0));
                forecast_skipped += usize::from(whole.heaps.iter().any(|h| h.trimmable > 0));
            }
        }
        assert!(forecast_skipped > 0, "no fixture has trimmable pages: the test shows nothing");
    }
}
