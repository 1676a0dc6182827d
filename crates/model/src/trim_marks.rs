//! The program's own `malloc_trim` calls, for the timeline: the agent writes
//! one METRICS record (source `malloc`, kind `trim`) per call, with VmRSS
//! read just before and just after it.

use std::path::Path;

use memgap_trace::records::{Metrics, Process, Record, Records};
use memgap_trace::{TraceError, TraceFile};

pub const SOURCE: &str = memgap_trace::vocabulary::source::MALLOC;
pub const KIND: &str = memgap_trace::vocabulary::kind::TRIM;
/// The calls `memgap timeline` lists between its snapshot lines, at most
/// (the ones that released most): more would bury the snapshots.
pub const TIMELINE_MARKS: usize = 20;

/// One `malloc_trim` the program called.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrimMark {
    /// Seconds since the process started (its first image, as GC marks).
    pub seconds: f64,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
    /// The `pad` argument: bytes left untrimmed at the top of the main heap.
    pub pad_bytes: u64,
    /// malloc_trim's result: whether it gave any memory back.
    pub returned: bool,
}

impl TrimMark {
    /// What VmRSS lost over the call (0 when it grew).
    pub fn released_bytes(&self) -> u64 {
        self.rss_before_bytes.saturating_sub(self.rss_after_bytes)
    }
}

/// Gathers the trim marks of a trace, holding at most `limit` of them.
#[derive(Debug)]
pub struct TrimMarks {
    limit: usize,
    marks: Vec<TrimMark>,
    /// Every call seen, kept or not.
    pub calls: u64,
    start_monotonic_ns: Option<u64>,
}

impl TrimMarks {
    pub fn new(limit: usize) -> TrimMarks {
        TrimMarks { limit: limit.max(1), marks: Vec::new(), calls: 0, start_monotonic_ns: None }
    }

    pub fn process(&mut self, process: &Process) {
        self.start_monotonic_ns.get_or_insert(process.start_monotonic_ns);
    }

    pub fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source != SOURCE || metrics.kind != KIND {
            return;
        }
        let bytes = |name: &str| metrics.get(name).filter(|v| v.is_finite() && *v >= 0.0).map_or(0, |v| v as u64);
        let start = self.start_monotonic_ns.unwrap_or(0);
        self.calls += 1;
        self.marks.push(TrimMark {
            seconds: metrics.monotonic_ns.saturating_sub(start) as f64 / 1e9,
            rss_before_bytes: bytes("rss_before:bytes"),
            rss_after_bytes: bytes("rss_after:bytes"),
            pad_bytes: bytes("pad"),
            returned: metrics.get("returned").is_some_and(|r| r > 0.0),
        });
        // Thinned as they come, so a program trimming in a loop costs
        // bounded memory here too.
        if self.marks.len() >= 2 * self.limit {
            self.thin();
        }
    }

    /// Keeps the `limit` calls that released the most (the ones that move
    /// the RSS line), earliest first on ties.
    fn thin(&mut self) {
        if self.marks.len() <= self.limit {
            return;
        }
        self.marks.sort_by(|a, b| b.released_bytes().cmp(&a.released_bytes()).then(a.seconds.total_cmp(&b.seconds)));
        self.marks.truncate(self.limit);
    }

    /// The kept marks in time order.
    pub fn finish(mut self) -> Vec<TrimMark> {
        self.thin();
        self.marks.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        self.marks
    }
}

/// The trim marks of a trace without replaying its events (for `memgap
/// timeline`): METRICS records are read where they lie.
pub fn of_trace(path: &Path, limit: usize) -> Result<(Vec<TrimMark>, u64), TraceError> {
    let trace = TraceFile::open(path)?;
    let mut marks = TrimMarks::new(limit);
    trace.for_each_chunk(|_, chunk| {
        for record in Records::new(chunk).flatten() {
            match record {
                Record::Process(process) => marks.process(&process),
                Record::Metrics(metrics) => marks.metrics(&metrics),
                _ => {}
            }
        }
        Ok(())
    })?;
    let calls = marks.calls;
    Ok((marks.finish(), calls))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trim(ns: u64, before: f64, after: f64, returned: f64) -> Metrics {
        let values = [("rss_before:bytes", before), ("rss_after:bytes", after), ("pad", 4096.0), ("returned", returned)];
        Metrics {
            monotonic_ns: ns,
            source: SOURCE.into(),
            kind: KIND.into(),
            values: values.iter().map(|&(n, v)| (n.to_string(), v)).collect(),
        }
    }

    #[test]
    fn marks_carry_the_call_in_seconds_since_start() {
        let mut marks = TrimMarks::new(10);
        marks.process(&Process { start_monotonic_ns: 1_000_000_000, ..Process::default() });
        marks.metrics(&trim(3_500_000_000, 412.0 * 1048576.0, 38.0 * 1048576.0, 1.0));
        marks.metrics(&trim(2_000_000_000, 50.0 * 1048576.0, 51.0 * 1048576.0, 0.0));
        // Another source's or kind's figures are not trims.
        marks.metrics(&Metrics { source: "go".into(), ..trim(1, 1.0, 0.0, 1.0) });
        marks.metrics(&Metrics { kind: "gc".into(), ..trim(1, 1.0, 0.0, 1.0) });
        assert_eq!(marks.calls, 2);
        let kept = marks.finish();
        assert_eq!(
            kept,
            vec![
                TrimMark { seconds: 1.0, rss_before_bytes: 50 << 20, rss_after_bytes: 51 << 20, pad_bytes: 4096, returned: false },
                TrimMark { seconds: 2.5, rss_before_bytes: 412 << 20, rss_after_bytes: 38 << 20, pad_bytes: 4096, returned: true },
            ]
        );
        assert_eq!((kept[0].released_bytes(), kept[1].released_bytes()), (0, 374 << 20));
    }

    #[test]
    fn many_calls_keep_the_largest_releases_in_time_order() {
        let mut marks = TrimMarks::new(100);
        // 10,000 calls; every 100th released 1 GiB, the rest 1 MiB or nothing.
        for i in 0..10_000u64 {
            let released = if i % 100 == 0 { 1024.0 } else { (i % 2) as f64 };
            marks.metrics(&trim(i * 1_000_000, 2048.0 * 1048576.0, (2048.0 - released) * 1048576.0, 1.0));
        }
        assert_eq!(marks.calls, 10_000);
        assert!(marks.marks.len() < 200, "held while gathering: {}", marks.marks.len());
        let kept = marks.finish();
        assert_eq!(kept.len(), 100);
        assert!(kept.iter().all(|m| m.released_bytes() == 1 << 30), "the big releases are kept");
        assert!(kept.windows(2).all(|w| w[0].seconds < w[1].seconds), "in time order");
    }

    #[test]
    fn a_hostile_record_gives_zeros_not_a_panic() {
        let mut marks = TrimMarks::new(1);
        marks.metrics(&trim(5, f64::NAN, -1.0, f64::INFINITY));
        marks.metrics(&Metrics { values: Vec::new(), ..trim(6, 0.0, 0.0, 0.0) });
        let kept = marks.finish();
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].rss_before_bytes, kept[0].rss_after_bytes), (0, 0));
    }
}
