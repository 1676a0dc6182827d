//! The summary of one trace: what `memgap summary` shows.

use std::collections::BTreeMap;
use std::path::Path;

use memgap_replay::{Change, Inherited, LiveSet, ThreadEvent, Visitor, replay};
use memgap_trace::records::{End, EndReason, Exit, Metrics, Module, Process, Rss};

use crate::ledger::RuntimeSummary;
use memgap_trace::{EventKind, TraceError};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SizeCount {
    pub size: u64,
    pub count: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub pid: u32,
    pub ppid: u32,
    /// The command line of the last program image, shell-quoted.
    pub command: String,
    pub argv: Vec<String>,
    pub exe: String,
    /// Program images in this process (1 + number of execs).
    pub images: u32,
    /// Exit status (128 + N when killed by signal N); null when unknown.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_seconds: f64,
    /// Calls by kind; every kind is present.
    pub events: BTreeMap<&'static str, u64>,
    pub total_events: u64,
    pub allocations: u64,
    /// Bytes requested by all successful allocations (realloc counts its new size).
    pub allocated_bytes: u64,
    pub peak_live_bytes: u64,
    pub peak_live_seconds: f64,
    /// Bytes requested and never freed (leaked, or freed after recording ended).
    pub live_bytes_at_end: u64,
    pub live_blocks_at_end: u64,
    pub peak_rss_bytes: u64,
    pub rss_at_end_bytes: u64,
    /// Threads that made at least one recorded call.
    pub threads: u32,
    pub top_sizes: Vec<SizeCount>,
    /// The trace does not reach the end of the process.
    pub truncated: bool,
    pub truncated_reason: Option<String>,
    pub dropped_events: u64,
    pub untracked_frees: u64,
    pub overlapping_allocations: u64,
    pub notes: Vec<String>,
    pub trace_bytes: u64,
    /// The runtime's own live heap and threads (Go, GHC), when it reported them.
    pub runtime: Option<RuntimeSummary>,
    /// A trace of `memgap watch`: its heap events are not the program's
    /// calls but the differences between this many walks of glibc's malloc
    /// state (blocks that appeared or went between two walks), so
    /// `allocations`, `allocated_bytes`, `events` and `top_sizes` count
    /// those. Absent in a recording.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synthesized_from_walks: Option<u64>,
    /// What recording cost in CPU time, when `memgap run` measured it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recording_cpu: Option<RecordingCpu>,
}

/// CPU time (user and system) during a recording: the program's own, its
/// hooks included, and memgap's recorder's beside it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RecordingCpu {
    pub program_seconds: f64,
    pub recorder_seconds: f64,
}

impl Summary {
    /// A runtime that keeps its own heap (Go, GHC) holds the program's live
    /// heap: its figures stand in the live heap's place (the malloc layer's
    /// are what the agent counted), and its threads where the agent saw none.
    fn with_runtime(mut self, runtime: Option<RuntimeSummary>) -> Summary {
        let Some(r) = runtime else { return self };
        self.peak_live_bytes = r.peak_live_bytes;
        self.peak_live_seconds = r.peak_live_seconds;
        self.live_bytes_at_end = r.live_bytes_at_end;
        if self.threads == 0 {
            self.threads = r.threads.unwrap_or(0);
        }
        self.runtime = Some(r);
        self
    }

    pub fn of_trace(path: &Path) -> Result<Summary, TraceError> {
        let mut builder = Builder::default();
        let outcome = replay(path, &mut builder)?;
        Ok(builder.finish(&outcome, path))
    }
}

impl Builder {
    /// The summary, once the replay is over (also used by report.rs).
    pub(crate) fn finish(self, outcome: &memgap_replay::Outcome, path: &Path) -> Summary {
        let mut b = self;
        let timeline = &outcome.timeline;
        b.owners.replayed(timeline);
        let runtime = b.owners.summary();
        let process = b.process.unwrap_or_default();
        let mut top_sizes: Vec<SizeCount> = b.sizes.counts().map(|(size, count)| SizeCount { size, count, bytes: size * count }).collect();
        top_sizes.sort_by(|a, b| b.count.cmp(&a.count).then(a.size.cmp(&b.size)));
        top_sizes.truncate(10);

        let ended = b.end.is_some_and(|end| end.reason == EndReason::Exit);
        let truncated_reason = if outcome.cut_short {
            Some("the file ends inside a chunk: the process was killed while writing".to_string())
        } else if b.end.is_some_and(|end| end.reason == EndReason::RecordingFailed) {
            Some("recording stopped before the process ended".to_string())
        } else if !ended {
            match b.exit {
                Some(exit) if exit.signal != 0 => Some(format!("the process was killed by signal {}", exit.signal)),
                _ => Some("the trace has no end record: the process was killed or is still running".to_string()),
            }
        } else {
            None
        };
        let exit_code = b.exit.map(|x| x.exit_code).or(b.end.and_then(|e| e.exit_code));
        let last_time = b.last_time.max(b.end.map_or(0, |e| e.time));
        let peak_rss = b.peak_rss.max(b.end.map_or(0, |e| e.vm_hwm));
        Summary {
            pid: process.pid,
            ppid: process.ppid,
            command: shell_join(&process.argv),
            argv: process.argv.clone(),
            exe: process.exe.clone(),
            images: b.images,
            exit_code,
            signal: b.exit.map(|x| x.signal).filter(|&s| s != 0),
            duration_seconds: if b.images > 0 { timeline.seconds(last_time) } else { 0.0 },
            events: EventKind::ALL.iter().enumerate().map(|(i, kind)| (kind.name(), b.counts[i])).collect(),
            total_events: b.counts.iter().sum(),
            allocations: b.allocations,
            allocated_bytes: b.allocated_bytes,
            peak_live_bytes: b.peak_live,
            peak_live_seconds: timeline.seconds(b.peak_live_time),
            live_bytes_at_end: b.live.live_bytes(),
            live_blocks_at_end: b.live.len() as u64,
            peak_rss_bytes: peak_rss,
            rss_at_end_bytes: b.last_rss,
            // The walks' differences are written as one pseudo-thread's: no thread of the program made them.
            threads: if b.walks > 0 { 0 } else { b.threads.len() as u32 },
            top_sizes,
            truncated: truncated_reason.is_some(),
            truncated_reason,
            dropped_events: b.end.map_or(0, |e| e.dropped_events),
            untracked_frees: b.live.untracked_frees,
            overlapping_allocations: b.live.overlapping_allocations,
            notes: b.notes,
            trace_bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            runtime: None,
            synthesized_from_walks: (b.walks > 0).then_some(b.walks),
            recording_cpu: b.exit.and_then(|x| x.cost).map(|cost| RecordingCpu {
                program_seconds: cost.program_cpu_ns as f64 / 1e9,
                recorder_seconds: cost.recorder_cpu_ns as f64 / 1e9,
            }),
        }
        .with_runtime(runtime)
    }
}

#[derive(Default)]
pub(crate) struct Builder {
    process: Option<Process>,
    images: u32,
    counts: [u64; EventKind::ALL.len()],
    allocations: u64,
    allocated_bytes: u64,
    pub(crate) live: LiveSet,
    peak_live: u64,
    peak_live_time: u64,
    peak_rss: u64,
    last_rss: u64,
    last_time: u64,
    threads: FxHashSet<(u32, u32)>,
    last_thread: Option<(u32, u32)>,
    sizes: SizeCounts,
    end: Option<End>,
    exit: Option<Exit>,
    notes: Vec<String>,
    /// Runtimes keep their own live heap (Go, GHC).
    owners: crate::registry::Owners,
    /// Walks of glibc's malloc state the trace holds (`memgap watch`).
    walks: u64,
}

impl Builder {
    /// Counts one event whose effect on the live heap is known: `change`, and
    /// `live_bytes` after it. The report's replay keeps one live set for
    /// the summary and the ledgers (`live` is then moved in at the end).
    #[inline(always)]
    pub(crate) fn count(&mut self, event: &ThreadEvent, change: Change, live_bytes: u64) {
        let e = &event.event;
        self.counts[e.kind() as usize - 1] += 1;
        self.last_time = self.last_time.max(e.time);
        let thread = (self.images, event.thread);
        if self.last_thread != Some(thread) {
            self.last_thread = Some(thread);
            self.threads.insert(thread);
        }
        if let Change::Allocated(block) | Change::Reallocated { new: block, .. } = change {
            self.allocations += 1;
            self.allocated_bytes = self.allocated_bytes.saturating_add(block.size);
            self.sizes.add(block.size);
            if live_bytes > self.peak_live {
                self.peak_live = live_bytes;
                self.peak_live_time = e.time;
            }
        }
    }
}

impl Builder {
    /// A forked child's heap starts as its parent's: `live_bytes` at the
    /// child's start (its peak, unless it allocates more).
    pub(crate) fn inherited_live(&mut self, live_bytes: u64) {
        if live_bytes > self.peak_live {
            self.peak_live = live_bytes;
            self.peak_live_time = self.process.as_ref().map_or(0, |p| p.start_time);
        }
    }
}

/// How many allocations asked for each size. Small sizes, nearly all of a
/// program's, are counted in an array, sparing a hash map lookup per
/// allocation.
#[derive(Default)]
struct SizeCounts {
    small: Vec<u64>,
    large: FxHashMap<u64, u64>,
}

impl SizeCounts {
    const SMALL: u64 = 4096;

    #[inline(always)]
    fn add(&mut self, size: u64) {
        if size < Self::SMALL {
            if self.small.is_empty() {
                self.small = vec![0; Self::SMALL as usize];
            }
            self.small[size as usize] += 1;
        } else {
            *self.large.entry(size).or_default() += 1;
        }
    }

    /// (size, count) for every size counted at least once.
    fn counts(self) -> impl Iterator<Item = (u64, u64)> {
        let small = self.small.into_iter().enumerate().filter(|&(_, count)| count > 0).map(|(size, count)| (size as u64, count));
        small.chain(self.large)
    }
}

impl Visitor for Builder {
    fn live_set(&self) -> Option<&LiveSet> {
        Some(&self.live)
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source == crate::outside_walk::WALK_SOURCE && metrics.kind == crate::outside_walk::WALK_KIND {
            self.walks += 1;
        }
        self.owners.metrics(metrics);
    }

    fn process(&mut self, process: &Process) {
        self.owners.process(process);
        self.images += 1;
        self.live.clear();
        self.end = None;
        self.process = Some(process.clone());
    }

    fn modules(&mut self, _modules: &[Module]) {}

    fn inherited(&mut self, item: Inherited<'_>) {
        match item {
            Inherited::Event(event) => {
                self.live.apply(event);
            }
            Inherited::End => {
                self.live.untracked_frees = 0;
                self.live.overlapping_allocations = 0;
                self.inherited_live(self.live.live_bytes());
            }
            _ => {}
        }
    }

    #[inline(always)]
    fn event(&mut self, event: &ThreadEvent) {
        let change = self.live.apply(event);
        let live_bytes = self.live.live_bytes();
        self.count(event, change, live_bytes);
    }

    fn rss(&mut self, rss: &Rss) {
        self.peak_rss = self.peak_rss.max(rss.vm_rss);
        self.last_rss = rss.vm_rss;
        self.last_time = self.last_time.max(rss.time);
    }

    fn note(&mut self, _time: u64, text: &str) {
        self.notes.push(text.to_string());
    }

    fn end(&mut self, end: &End) {
        self.end = Some(*end);
    }

    fn exit(&mut self, exit: &Exit) {
        self.exit = Some(*exit);
    }
}

/// Quotes arguments the way a POSIX shell would need them.
fn shell_join(argv: &[String]) -> String {
    let quote = |arg: &String| {
        let plain = !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
        if plain { arg.clone() } else { format!("'{}'", arg.replace('\'', r"'\''")) }
    };
    argv.iter().map(quote).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_like_a_shell() {
        let argv: Vec<String> = ["python3", "-c", "print('hi')", "a b", ""].iter().map(|s| s.to_string()).collect();
        assert_eq!(shell_join(&argv), r#"python3 -c 'print('\''hi'\'')' 'a b' ''"#);
    }
}
