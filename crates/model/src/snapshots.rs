//! Choosing snapshots and computing the ledger at them.

use std::path::Path;

use memgap_replay::{Inherited, LiveSet, ThreadEvent, Timeline, Visitor, replay};
use memgap_trace::TraceError;
use memgap_trace::TraceFile;
use memgap_trace::records::{End, Exit, Metrics, Process, Record, Records, Rss, Snapshot, Thread};

use crate::heap_state::HeapState;
use crate::ledger::{self, Ledger};
use crate::owners::Owners;
use crate::summary::{Builder, Summary};

/// Which snapshot to look at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum At {
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
            "peak" => Ok(At::Peak),
            "end" => Ok(At::End),
            _ => text
                .trim_end_matches('s')
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(At::Seconds)
                .ok_or_else(|| format!("'{text}' is not peak, end, or a number of seconds")),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    /// Position among the trace's snapshots, in time order.
    pub index: usize,
    pub seconds: f64,
    pub vm_rss: u64,
}

/// Lists the snapshots without replaying events (chunks are decompressed,
/// event records are not decoded).
pub fn list(path: &Path) -> Result<Vec<SnapshotInfo>, TraceError> {
    let trace = TraceFile::open(path)?;
    let mut timeline = Timeline::default();
    let mut found = Vec::new();
    let mut started = false;
    trace.for_each_chunk(|_, chunk| {
        for record in Records::new(chunk).flatten() {
            match record {
                Record::Process(p) if !started || p.image == 0 => {
                    timeline.start(&p);
                    started = true;
                }
                Record::Clock(c) => timeline.add(&c),
                Record::Snapshot(s) => found.push((s.time, if s.vm_rss_after > 0 { s.vm_rss_after } else { s.rss.vm_rss })),
                _ => {}
            }
        }
        Ok(())
    })?;
    found.sort_by_key(|&(time, _)| time);
    Ok(found.into_iter().enumerate().map(|(index, (time, vm_rss))| SnapshotInfo { index, seconds: timeline.seconds(time), vm_rss }).collect())
}

pub fn choose(snapshots: &[SnapshotInfo], at: At) -> Option<usize> {
    let best = match at {
        At::Peak => snapshots.iter().max_by_key(|s| (s.vm_rss, s.index)),
        At::End => snapshots.last(),
        At::Seconds(t) => snapshots.iter().min_by(|a, b| (a.seconds - t).abs().total_cmp(&(b.seconds - t).abs())),
    };
    best.map(|s| s.index)
}

/// Replays the trace and computes the ledger at the chosen snapshots.
struct LedgerVisitor<'a> {
    state: HeapState,
    wanted: &'a dyn Fn(usize) -> bool,
    want_pages: bool,
    seen: usize,
    ledgers: Vec<(u64, Ledger)>,
    owners: Owners,
    /// The summary too, counted from the same live set: `memgap run`
    /// prints both, and two replays took twice as long.
    summary: Option<Builder>,
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
    }

    fn rss(&mut self, rss: &Rss) {
        self.owners.rss(rss);
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
        if (self.wanted)(self.seen) {
            self.ledgers.push((snapshot.time, ledger::compute(&mut self.state, snapshot, ledger::Detail { pages: self.want_pages, ..ledger::Detail::default() }, &mut self.owners.list)));
        } else {
            self.state.pass_snapshot(snapshot);
        }
        self.seen += 1;
    }
}

fn ledgers(path: &Path, wanted: &dyn Fn(usize) -> bool, want_pages: bool) -> Result<Vec<Ledger>, TraceError> {
    Ok(ledgers_and_summary(path, wanted, want_pages, None)?.0)
}

fn ledgers_and_summary(path: &Path, wanted: &dyn Fn(usize) -> bool, want_pages: bool, summary: Option<Builder>) -> Result<(Vec<Ledger>, Option<Summary>), TraceError> {
    let mut visitor = LedgerVisitor { state: HeapState::default(), wanted, want_pages, seen: 0, ledgers: Vec::new(), owners: Owners::default(), summary };
    let outcome = replay(path, &mut visitor)?;
    let summary = visitor.summary.take().map(|mut summary| {
        summary.live = std::mem::take(&mut visitor.state.live);
        summary.finish(&outcome, path)
    });
    let mut owners = visitor.owners;
    owners.replayed(&outcome.timeline);
    owners.measured_remedies = crate::compare::measured::read_beside(path).map(std::sync::Arc::new);
    let ledgers = visitor
        .ledgers
        .into_iter()
        .map(|(time, mut ledger)| {
            ledger.at_seconds = outcome.timeline.seconds(time);
            owners.annotate(&mut ledger, outcome.timeline.monotonic_ns(time));
            ledger
        })
        .collect();
    Ok((ledgers, summary))
}

/// The ledger at one snapshot; `None` when the trace has no snapshot.
pub fn ledger_at(path: &Path, at: At, want_pages: bool) -> Result<Option<Ledger>, TraceError> {
    let Some(index) = choose(&list(path)?, at) else { return Ok(None) };
    Ok(ledgers(path, &|i| i == index, want_pages)?.pop())
}

/// The summary and the ledger at one snapshot (without page maps), from
/// one replay: what `memgap run` prints when the program ends.
pub fn summary_and_ledger_at(path: &Path, at: At) -> Result<(Summary, Option<Ledger>), TraceError> {
    let index = choose(&list(path)?, at);
    let (mut ledgers, summary) = ledgers_and_summary(path, &|i| Some(i) == index, false, Some(Builder::default()))?;
    Ok((summary.expect("a summary was asked for"), ledgers.pop()))
}

/// The ledger at every snapshot, in time order.
pub fn timeline(path: &Path) -> Result<Vec<Ledger>, TraceError> {
    ledgers(path, &|_| true, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_chooses() {
        assert_eq!("peak".parse::<At>(), Ok(At::Peak));
        assert_eq!("2.5".parse::<At>(), Ok(At::Seconds(2.5)));
        assert_eq!("3s".parse::<At>(), Ok(At::Seconds(3.0)));
        assert!("soon".parse::<At>().is_err());
        let snaps = [(0.0, 10), (1.0, 30), (2.0, 20)].iter().enumerate().map(|(index, &(seconds, vm_rss))| SnapshotInfo { index, seconds, vm_rss }).collect::<Vec<_>>();
        assert_eq!(choose(&snaps, At::Peak), Some(1));
        assert_eq!(choose(&snaps, At::End), Some(2));
        assert_eq!(choose(&snaps, At::Seconds(1.8)), Some(2));
        assert_eq!(choose(&[], At::End), None);
    }
}
