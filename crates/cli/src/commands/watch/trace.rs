//! One watched process's trace: each reading of its outside ledger written
//! so that `timeline`, `ledger --at` and `report` read it as they read a
//! recording. A walked glibc heap goes in as three parts of the same
//! instant: a METRICS record with the walk's arenas and tcaches, malloc and
//! free events bringing the trace's live set to the walk's in-use chunks
//! (the differences since the previous walk, so a steady heap costs
//! nothing), and the SNAPSHOT with its page residency. An allocator that
//! reports itself (jemalloc, tcmalloc) gets its figures as `memgap run`'s
//! recorder writes them; a Go program gets the runtime's accounting read
//! from its memory as the METRICS records `memgap run` writes of it (the
//! build's version and size classes once), then the SNAPSHOT; a heap
//! nothing can split gets RSS samples only, and a note saying why: no row
//! is invented.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memgap_attach::residency::monotonic_ns;
use memgap_model::outside_walk::WalkedHeap;
use memgap_model::owners::allocator_stats::AllocatorStats;
use memgap_trace::TraceWriter;
use memgap_trace::event::{DeltaState, Event, EventKind, MAX_RECORD_LEN, RawEncoder};
use memgap_trace::records::{CLOCK_MONOTONIC_NS, Clock, End, EndReason, EventsPiece, Metrics, Process, Record, Rss, Snapshot};

/// The one pseudo-thread whose events carry the walks' differences.
const WALK_THREAD: u32 = 1;
/// Encoded event bytes per EVENTS record, and records per chunk: a chunk
/// stays far below the format's 16 MiB.
const PIECE_BYTES: usize = 1 << 20;
const PIECES_PER_CHUNK: usize = 4;

pub struct ProcessTrace {
    writer: TraceWriter,
    pid: u32,
    /// The in-use chunks the trace's events have made live, by address.
    blocks: Vec<(u64, u64)>,
    /// The events buffer of the next walk's differences.
    buffer: u32,
    allocator: Option<String>,
    /// The last reason given for a reading without a ledger.
    unsplit_because: Option<String>,
    /// RSS samples taken between readings, written with the next one.
    samples: Vec<Rss>,
    pub snapshots: u64,
    /// The build-describing METRICS written so far, by source and kind.
    described: HashMap<(String, String), Vec<(String, f64)>>,
    /// When the watch began (CLOCK_MONOTONIC ns): the trace's time zero.
    start: u64,
}

/// What one reading found, for the trace.
pub enum Content<'a> {
    Walked(&'a WalkedHeap),
    /// An allocator's own figures, with the residency read just after them.
    Stats(&'a AllocatorStats, &'a Snapshot),
    /// A runtime's own accounting (Go's), as a recording of it holds it,
    /// with the residency read just after it.
    Runtime(&'a [Metrics], &'a Snapshot),
    /// The heap could not be split: RSS only, and why.
    Unsplit(Rss, String),
}

impl ProcessTrace {
    /// Creates `path` (which must not exist; mode 0600) and writes the
    /// process's description.
    pub fn create(path: &Path, pid: u32, run_id: u64, exe: String, argv: Vec<String>) -> anyhow::Result<ProcessTrace> {
        let mut writer = TraceWriter::create(path, run_id)?;
        let start = monotonic_ns();
        let process = Record::Process(Process {
            pid,
            clock: CLOCK_MONOTONIC_NS,
            start_time: start,
            start_monotonic_ns: start,
            start_realtime_ns: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
            // SAFETY: no precondition.
            page_size: unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64,
            cpu_count: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
            exe,
            argv,
            ..Process::default()
        });
        let note = Record::Note {
            time: start,
            text: "watched from outside by memgap watch: no agent, no call stacks; heap events, where glibc's heap is walked, are the differences between walks of its malloc state, not the program's calls; other allocators and runtimes give their own figures at each walk".into(),
        };
        writer.write(&[process, note])?;
        Ok(ProcessTrace {
            writer,
            pid,
            blocks: Vec::new(),
            buffer: 0,
            allocator: None,
            unsplit_because: None,
            samples: Vec::new(),
            snapshots: 0,
            described: HashMap::new(),
            start,
        })
    }

    /// Seconds since the trace began.
    pub fn seconds(&self) -> f64 {
        monotonic_ns().saturating_sub(self.start) as f64 / 1e9
    }

    pub fn path(&self) -> PathBuf {
        self.writer.path().to_path_buf()
    }

    /// An RSS sample between readings.
    pub fn sample(&mut self, rss: Rss) {
        self.samples.push(rss);
    }

    /// Writes one reading; `notes` (marks, trims) go with it.
    pub fn reading(&mut self, content: Content<'_>, notes: &[String], extra: Vec<Metrics>) -> anyhow::Result<()> {
        let mut head: Vec<Record> = self.samples.drain(..).map(Record::Rss).collect();
        head.extend(extra.into_iter().map(Record::Metrics));
        let now = monotonic_ns();
        let mut tail: Vec<Record> = Vec::new();
        match content {
            Content::Walked(walk) => {
                if self.allocator.as_deref() != Some(walk.libc_path.as_str()) {
                    self.allocator = Some(walk.libc_path.clone());
                    head.push(Record::Allocator { path: walk.libc_path.clone() });
                }
                head.push(Record::Metrics(walk.to_metrics(now)));
                self.writer.write(&head)?;
                self.write_differences(walk)?;
                tail.push(Record::Snapshot(walk.snapshot.clone()));
                tail.push(Record::Rss(walk.snapshot.rss));
                self.snapshots += 1;
                self.unsplit_because = None;
            }
            Content::Stats(stats, snapshot) => {
                let mut stats = stats.clone();
                stats.snapshot_time = snapshot.time;
                self.writer.write(&head)?;
                tail.push(Record::Metrics(stats.to_metrics(now)));
                tail.push(Record::Snapshot(snapshot.clone()));
                tail.push(Record::Rss(snapshot.rss));
                self.snapshots += 1;
                self.unsplit_because = None;
            }
            Content::Runtime(metrics, snapshot) => {
                self.writer.write(&head)?;
                for m in metrics {
                    // What describes the build (version, size classes) is written once, as the recorder does.
                    let key = (m.source.clone(), m.kind.clone());
                    if m.source == memgap_source_go::SOURCE && memgap_source_go::VERSION_KINDS.contains(&m.kind.as_str()) {
                        if self.described.get(&key) == Some(&m.values) {
                            continue;
                        }
                        self.described.insert(key, m.values.clone());
                    }
                    tail.push(Record::Metrics(m.clone()));
                }
                tail.push(Record::Snapshot(snapshot.clone()));
                tail.push(Record::Rss(snapshot.rss));
                self.snapshots += 1;
                self.unsplit_because = None;
            }
            Content::Unsplit(rss, why) => {
                self.writer.write(&head)?;
                tail.push(Record::Rss(rss));
                if self.unsplit_because.as_deref() != Some(why.as_str()) {
                    tail.push(Record::Note {
                        time: rss.time,
                        text: format!("no ledger from here on until a reading splits the heap: {why}"),
                    });
                    self.unsplit_because = Some(why);
                }
            }
        }
        let time = monotonic_ns();
        tail.extend(notes.iter().map(|text| Record::Note { time, text: text.clone() }));
        tail.push(Record::Clock(Clock { time, monotonic_ns: time }));
        self.writer.write(&tail)?;
        Ok(())
    }

    /// Malloc and free events taking the trace's live set to the walk's
    /// in-use chunks, all at the walk's snapshot time (replay hands the
    /// snapshot over after the events of its time): frees first, so that a
    /// chunk split or merged since never overlaps a live one.
    fn write_differences(&mut self, walk: &WalkedHeap) -> anyhow::Result<()> {
        let mut now: Vec<(u64, u64)> = walk.blocks.clone();
        now.sort_unstable();
        now.dedup_by_key(|b| b.0);
        let (frees, mallocs) = differences(&self.blocks, &now);
        if frees.is_empty() && mallocs.is_empty() {
            self.blocks = now;
            return Ok(());
        }
        let time = walk.snapshot.time;
        let events = frees.iter().map(|&addr| Event { time, kind: Some(EventKind::Free), addr, ..Event::default() }).chain(
            mallocs.iter().map(|&(addr, usable)| Event {
                time,
                kind: Some(EventKind::Malloc),
                addr,
                size: usable,
                usable,
                ..Event::default()
            }),
        );
        let mut state = DeltaState::default();
        let mut pieces: Vec<Vec<u8>> = Vec::new();
        let mut piece: Vec<u8> = Vec::with_capacity(PIECE_BYTES + MAX_RECORD_LEN);
        let mut scratch = [0u8; MAX_RECORD_LEN];
        for event in events {
            // SAFETY: scratch holds MAX_RECORD_LEN bytes, the most one event without a stack takes.
            let end = unsafe { RawEncoder::encode(&mut state, scratch.as_mut_ptr(), &event) };
            let len = end as usize - scratch.as_ptr() as usize;
            piece.extend_from_slice(&scratch[..len]);
            if piece.len() >= PIECE_BYTES {
                pieces.push(std::mem::take(&mut piece));
            }
        }
        if !piece.is_empty() {
            pieces.push(piece);
        }
        let buffer = self.buffer;
        self.buffer += 1;
        let mut offset = 0u32;
        for group in pieces.chunks(PIECES_PER_CHUNK) {
            let mut records = Vec::with_capacity(group.len());
            for bytes in group {
                records.push(Record::Events(EventsPiece { thread: WALK_THREAD, tid: self.pid, buffer, offset, records: bytes }));
                offset = offset.wrapping_add(bytes.len() as u32);
            }
            self.writer.write(&records)?;
        }
        self.blocks = now;
        Ok(())
    }

    /// The last records: the trace ends here (the process exited, or the watch stopped).
    pub fn finish(mut self, why: &str) -> anyhow::Result<PathBuf> {
        let time = monotonic_ns();
        let mut records: Vec<Record> = self.samples.drain(..).map(Record::Rss).collect();
        records.push(Record::Note { time, text: why.to_string() });
        records.push(Record::Clock(Clock { time, monotonic_ns: time }));
        records.push(Record::End(End { time, reason: EndReason::Exit, ..End::default() }));
        self.writer.write(&records)?;
        Ok(self.path())
    }
}

/// The block addresses to free and the blocks to allocate to turn `before`
/// into `after` (both by address): a block whose size changed is both.
fn differences(before: &[(u64, u64)], after: &[(u64, u64)]) -> (Vec<u64>, Vec<(u64, u64)>) {
    let (mut frees, mut mallocs) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < before.len() || j < after.len() {
        match (before.get(i), after.get(j)) {
            (Some(&b), Some(&a)) if b == a => {
                i += 1;
                j += 1;
            }
            (Some(&b), Some(&a)) if b.0 == a.0 => {
                frees.push(b.0);
                mallocs.push(a);
                i += 1;
                j += 1;
            }
            (Some(&b), Some(&a)) if b.0 < a.0 => {
                frees.push(b.0);
                i += 1;
            }
            (Some(_), Some(&a)) => {
                mallocs.push(a);
                j += 1;
            }
            (Some(&b), None) => {
                frees.push(b.0);
                i += 1;
            }
            (None, Some(&a)) => {
                mallocs.push(a);
                j += 1;
            }
            (None, None) => break,
        }
    }
    (frees, mallocs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_free_what_went_and_allocate_what_came() {
        let before = [(0x100, 24), (0x200, 40), (0x300, 56)];
        let after = [(0x100, 24), (0x200, 72), (0x280, 8), (0x400, 16)];
        let (frees, mallocs) = differences(&before, &after);
        assert_eq!(frees, [0x200, 0x300]);
        assert_eq!(mallocs, [(0x200, 72), (0x280, 8), (0x400, 16)]);
        assert_eq!(differences(&after, &after), (vec![], vec![]));
    }
}
