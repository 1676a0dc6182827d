//! Reading a trace in time order.
//!
//! Each thread's events sit in the file in that thread's order, but threads
//! interleave in pieces. Events are queued per thread and released in time
//! order up to a watermark: a CLOCK record promises that events older than
//! the previous CLOCK record are already in the file (the recorder holds a
//! CLOCK record back while a thread is still in a hook it entered that
//! early: preempted between stamping an event and committing it).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use memgap_trace::compact::{self, CompactState};
use memgap_trace::event::{self, DeltaState, Event};
use memgap_trace::numa::{MemorySamples, Placement, Topology};
use memgap_trace::python::PythonCode;
use memgap_trace::records::{
    Clock, CompactEventsPiece, End, EventsPiece, Exit, Fork, Metrics, Module, Process, Record, Records, Rss, Snapshot, Thread,
};
use memgap_trace::varint::Cursor;
use memgap_trace::{Tail, TraceError, TraceFile};
use rustc_hash::FxHashMap;

use crate::causal::RoundOrder;
use crate::inherit::{self, Cut, Inherited, Inheriting, Lineage};
use crate::{LiveSet, Timeline};

/// A heap event and the thread that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadEvent {
    /// Unique per thread within a process image.
    pub thread: u32,
    /// The kernel's thread id (reused by the kernel over time).
    pub tid: u32,
    pub event: Event,
}

/// Receives a trace's contents in time order. Every method has a default
/// that ignores the item, so a visitor implements only what it needs.
pub trait Visitor {
    /// A process image begins: the first, or a new one after an exec.
    fn process(&mut self, _process: &Process) {}
    fn modules(&mut self, _modules: &[Module]) {}
    /// A (round, CLOCK_MONOTONIC) pair, before the events it lets through:
    /// a visitor converting event times as it goes keeps a [`Timeline`].
    fn clock(&mut self, _clock: &Clock) {}
    fn event(&mut self, _event: &ThreadEvent) {}
    fn rss(&mut self, _rss: &Rss) {}
    /// Page residency at an instant; every event before it has been seen.
    fn snapshot(&mut self, _snapshot: &Snapshot) {}
    fn thread(&mut self, _thread: &Thread) {}
    /// The file that provides `malloc` to the program.
    fn allocator(&mut self, _path: &str) {}
    /// A runtime's own figures, in file order (times are monotonic ns, see
    /// [`Metrics`]), not merged with the events.
    fn metrics(&mut self, _metrics: &Metrics) {}
    /// The NUMA nodes of the machine that recorded the trace.
    fn topology(&mut self, _topology: &Topology) {}
    /// The node of each resident heap page, right after the snapshot it
    /// belongs to (same time).
    fn placement(&mut self, _placement: &Placement) {}
    /// Sampled memory accesses or page faults, in file order.
    fn memory_samples(&mut self, _samples: &MemorySamples) {}
    /// A call stack (return addresses, innermost first) under the id that
    /// events carry in `Event::stack`; always before the first such event.
    /// The frames are the replay's own, shared: a visitor keeping them keeps a clone of the `Arc`.
    fn stack(&mut self, _id: u32, _frames: &Arc<[u64]>) {}
    /// A Python code object that the Python frames of image `image`'s
    /// stacks name (see [`memgap_trace::python`]); file order, not merged.
    fn python_code(&mut self, _image: u32, _code: &PythonCode) {}
    fn note(&mut self, _time: u64, _text: &str) {}
    /// The agent's END record: the image ended (exit or exec) or recording failed.
    fn end(&mut self, _end: &End) {}
    /// A forked child's trace, right after its process: the parent's heap
    /// history up to the fork ([`Inherited`]), then [`Inherited::End`].
    /// Not the child's own calls: a visitor keeping the heap's state
    /// applies them, one counting calls does not count them.
    fn inherited(&mut self, _item: Inherited<'_>) {}
    /// How the process ended, as seen by `memgap run`; always last.
    fn exit(&mut self, _exit: &Exit) {}
    /// The live set, for a visitor that keeps one. The replay asks it which
    /// blocks are live to order events of one round from several threads by
    /// causality (see [`crate::causal`]; without it the replay guesses that
    /// a block freed in the round was live before it), and prefetches the
    /// blocks that coming frees will look up.
    fn live_set(&self) -> Option<&LiveSet> {
        None
    }
}

/// What the reader found besides the items.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The file ends inside a chunk (the writer was killed mid-write).
    pub cut_short: bool,
    /// Event bytes that could not be decoded because an earlier piece of the
    /// same buffer was missing.
    pub lost_bytes: u64,
    pub malformed_records: u64,
    pub events: u64,
    pub timeline: Timeline,
}

/// One thread's events not yet handed on. They wait encoded (a few bytes
/// each, where a decoded event takes 72): a writer that fell behind can put
/// tens of millions of events in one round, and all of them wait for the
/// next round's CLOCK record. A short window is decoded ahead.
struct ThreadQueue {
    thread: u32,
    tid: u32,
    /// The buffer and offset the next piece must continue.
    buffer: u32,
    next_offset: u32,
    encoded: VecDeque<EncodedPiece>,
    /// Bytes of `encoded` held in memory ([`PieceBytes::Held`]).
    held: usize,
    /// Decoding state at the end of `pending`.
    delta: DeltaState,
    /// The same for a piece in the recorder's encoding.
    compact: CompactState,
    /// The last piece queued was in the recorder's encoding.
    last_compact: bool,
    /// Decoded, in the thread's order, from `pending[head]` on (the ones
    /// before were handed on). A Vec rather than a VecDeque: events are
    /// decoded in place and handed on by reference, never copied.
    pending: Vec<ThreadEvent>,
    head: usize,
    stacks: StackIds,
}

/// A thread's own stack ids (dense, from 1) → ids unique in the trace.
#[derive(Default)]
struct StackIds(Vec<u32>);

impl StackIds {
    /// The trace's id for the thread's `local` id; a record that defines
    /// it (`decoding.frames` holds the frames) makes it known.
    #[inline]
    fn global_id(&mut self, local: u32, defines: bool, decoding: &mut Decoding, visitor: &mut impl Visitor) -> u32 {
        let local = local as usize;
        if defines {
            if decoding.image != 0 {
                // Python frames name code ids of their image.
                for frame in &mut decoding.frames {
                    *frame = memgap_trace::python::with_image(*frame, decoding.image);
                }
            }
            let id = match decoding.stack_ids.get(decoding.frames.as_slice()) {
                Some(&id) => id,
                None => {
                    let id = decoding.stack_ids.len() as u32 + 1;
                    let frames: Arc<[u64]> = Arc::from(decoding.frames.as_slice());
                    visitor.stack(id, &frames);
                    decoding.stack_ids.insert(frames, id);
                    id
                }
            };
            if local < MAX_THREAD_STACK_ID {
                if self.0.len() <= local {
                    self.0.resize(local + 1, event::NO_STACK);
                }
                self.0[local] = id;
            }
        }
        self.0.get(local).copied().unwrap_or(event::NO_STACK)
    }
}

struct EncodedPiece {
    bytes: PieceBytes,
    /// Decoded up to here.
    at: usize,
    /// The piece starts a buffer: the delta state restarts.
    starts_buffer: bool,
    /// In the recorder's encoding, which decodes each piece on its own.
    compact: bool,
}

/// A queued piece's bytes. Threads' pieces wait for the CLOCK record
/// that lets them through, and with many threads and a recorder that holds
/// CLOCK records back, what waits can be a good part of the trace: past
/// [`HELD_BYTES`] in all, pieces stay in the file and are read back when
/// their turn comes, so memory follows the threads, not the trace.
enum PieceBytes {
    /// Copied out of its chunk; counts towards [`HELD_BYTES`].
    Held(Vec<u8>),
    /// `len` bytes at `start` in the chunk at file offset `chunk`.
    InFile { chunk: u64, start: u32, len: u32 },
    /// Read back from the file, about to be decoded.
    Loaded(Vec<u8>),
}

impl PieceBytes {
    fn len(&self) -> usize {
        match self {
            PieceBytes::Held(bytes) | PieceBytes::Loaded(bytes) => bytes.len(),
            PieceBytes::InFile { len, .. } => *len as usize,
        }
    }

    /// Bytes counted towards [`HELD_BYTES`].
    fn held(&self) -> usize {
        if let PieceBytes::Held(bytes) = self { bytes.len() } else { 0 }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            PieceBytes::Held(bytes) | PieceBytes::Loaded(bytes) => bytes,
            PieceBytes::InFile { .. } => &[],
        }
    }
}

/// Encoded bytes the queues keep in memory before pieces are left in the file.
const HELD_BYTES: usize = 8 << 20;
/// Chunks read back kept at hand: the pieces of one round, from every
/// thread, lie in a few neighbouring chunks.
const CACHED_CHUNKS: usize = 8;

/// Where the pieces left in the file are read back from.
#[derive(Default)]
struct ChunkSource<'t> {
    trace: Option<&'t TraceFile>,
    /// [`HELD_BYTES`], but for tests.
    held_limit: usize,
    /// The chunk being read: its file offset, and the address and length
    /// of its bytes in memory.
    current: Option<(u64, usize, usize)>,
    /// Chunks read back, the most recent last.
    cache: Vec<(u64, Vec<u8>)>,
}

impl<'t> ChunkSource<'t> {
    fn new(trace: &'t TraceFile, held_limit: usize) -> ChunkSource<'t> {
        ChunkSource { trace: Some(trace), held_limit, ..ChunkSource::default() }
    }

    /// What a queue keeps of `records`, a piece of the current chunk, with `held` bytes already held.
    fn keep(&self, records: &[u8], held: usize) -> PieceBytes {
        if held + records.len() > self.held_limit
            && self.trace.is_some()
            && let Some((chunk, address, len)) = self.current
            && let Some(start) = (records.as_ptr() as usize).checked_sub(address)
            && start + records.len() <= len
            && let (Ok(start), Ok(len)) = (u32::try_from(start), u32::try_from(records.len()))
        {
            return PieceBytes::InFile { chunk, start, len };
        }
        PieceBytes::Held(records.to_vec())
    }

    /// The bytes of a piece left in the file; None if the file no longer has them.
    fn read_back(&mut self, chunk: u64, start: u32, len: u32) -> Option<Vec<u8>> {
        let at = match self.cache.iter().position(|(offset, _)| *offset == chunk) {
            Some(at) => at,
            None => {
                let bytes = self.trace?.chunk_at(chunk).ok()?;
                if self.cache.len() >= CACHED_CHUNKS {
                    self.cache.remove(0);
                }
                self.cache.push((chunk, bytes));
                self.cache.len() - 1
            }
        };
        let (start, len) = (start as usize, len as usize);
        self.cache[at].1.get(start..start + len).map(<[u8]>::to_vec)
    }
}

/// What decoding shares across threads.
#[derive(Default)]
struct Decoding {
    /// Every distinct call stack → its id (ids start at 1; 0 is "none").
    stack_ids: FxHashMap<Arc<[u64]>, u32>,
    frames: Vec<u64>,
    /// The current image's number (PROCESS `image`).
    image: u32,
}

/// A thread's stack ids from here on are taken for corruption and read as
/// no stack (the agent numbers each thread's stacks from 1, and the map is
/// a Vec indexed by them).
const MAX_THREAD_STACK_ID: usize = 1 << 24;

impl ThreadQueue {
    fn new(thread: u32, tid: u32) -> ThreadQueue {
        ThreadQueue {
            thread,
            tid,
            buffer: u32::MAX,
            next_offset: 0,
            encoded: VecDeque::new(),
            held: 0,
            delta: DeltaState::default(),
            compact: CompactState::default(),
            last_compact: false,
            pending: Vec::new(),
            head: 0,
            stacks: StackIds::default(),
        }
    }

    fn available(&self) -> usize {
        self.pending.len() - self.head
    }

    fn front(&self) -> Option<&ThreadEvent> {
        self.pending.get(self.head)
    }

    /// Takes the next event if it is older than `limit`.
    #[inline]
    fn take_before(&mut self, limit: u64) -> Option<&ThreadEvent> {
        let event = self.pending.get(self.head).filter(|e| e.event.time < limit)?;
        self.head += 1;
        Some(event)
    }

    /// Decodes until `want` events are pending or nothing is left.
    fn fill(&mut self, want: usize, decoding: &mut Decoding, chunks: &mut ChunkSource, outcome: &mut Outcome, visitor: &mut impl Visitor) {
        if self.available() >= want {
            return;
        }
        // What was handed on goes; the few not yet handed on move to the front.
        self.pending.drain(..self.head);
        self.head = 0;
        self.pending.reserve(want - self.pending.len());
        while self.pending.len() < want {
            let Some(piece) = self.encoded.front_mut() else { return };
            if let PieceBytes::InFile { chunk, start, len } = piece.bytes {
                // Read back as it comes up; a file that changed since
                // loses the piece, as a corrupt one would.
                piece.bytes = PieceBytes::Loaded(chunks.read_back(chunk, start, len).unwrap_or_default());
                if piece.bytes.len() != len as usize {
                    outcome.lost_bytes += u64::from(len);
                    piece.bytes = PieceBytes::InFile { chunk, start, len };
                    if piece.compact {
                        self.pop_front();
                    } else {
                        self.lose_rest_of_buffer(outcome);
                    }
                    continue;
                }
            }
            if piece.starts_buffer {
                self.delta = DeltaState::default();
                piece.starts_buffer = false;
            }
            if piece.compact && piece.at == 0 {
                self.compact.reset();
            }
            // One piece's records in one loop: the piece, its cursor and the
            // queue's room are looked up once, not per record.
            let mut cursor = Cursor::at(piece.bytes.bytes(), piece.at);
            let mut failed = false;
            while self.pending.len() < want && !cursor.is_empty() {
                prefetch_ahead(piece.bytes.bytes(), cursor.position());
                self.pending.push(ThreadEvent { thread: self.thread, tid: self.tid, event: Event::default() });
                let event = &mut self.pending.last_mut().expect("just pushed").event;
                let decoded = if piece.compact {
                    compact::decode_into(&mut self.compact, &mut cursor, &mut decoding.frames, event)
                } else {
                    event::decode_into(&mut self.delta, &mut cursor, &mut decoding.frames, event)
                };
                match decoded {
                    Ok(defines_stack) => {
                        if !event_is_plausible(event) {
                            // Beyond the address space: a corrupt trace (or a
                            // call that failed). Skipped; the next record
                            // decodes on from here.
                            outcome.malformed_records += 1;
                            self.pending.pop();
                            continue;
                        }
                        if event.stack != event::NO_STACK {
                            event.stack = self.stacks.global_id(event.stack, defines_stack, decoding, visitor);
                        }
                    }
                    Err(_) => {
                        self.pending.pop();
                        outcome.malformed_records += 1;
                        failed = true;
                        break;
                    }
                }
            }
            piece.at = cursor.position();
            if failed && piece.compact {
                // Pieces in the recorder's encoding decode on their own: only this one's rest is lost.
                outcome.lost_bytes += (piece.bytes.len() - piece.at) as u64;
                piece.at = piece.bytes.len();
            } else if failed {
                // The rest of this buffer cannot be decoded without the
                // record that failed: drop it, and what came after it.
                piece.at = piece.bytes.len();
                self.lose_rest_of_buffer(outcome);
                continue;
            }
            if self.encoded.front().is_some_and(|piece| piece.at == piece.bytes.len()) {
                self.pop_front();
            }
        }
    }

    /// Drops the front piece and the pieces after it in the same buffer
    /// (counted lost): they cannot be decoded without it.
    fn lose_rest_of_buffer(&mut self, outcome: &mut Outcome) {
        while let Some(next) = self.encoded.get(1).filter(|next| !next.starts_buffer) {
            outcome.lost_bytes += next.bytes.len() as u64;
            self.held -= next.bytes.held();
            self.encoded.remove(1);
        }
        if self.encoded.len() == 1 {
            self.buffer = u32::MAX;
        }
        self.pop_front();
    }

    fn pop_front(&mut self) {
        if let Some(piece) = self.encoded.pop_front() {
            self.held -= piece.bytes.held();
        }
    }

    /// The first `length` events pending.
    fn leading(&self, length: usize) -> &[ThreadEvent] {
        &self.pending[self.head..self.head + length]
    }

    /// Decodes until every event of time `time` or earlier is pending (a
    /// thread's events are in time order); returns how many lead the queue.
    fn decode_through(
        &mut self,
        time: u64,
        decoding: &mut Decoding,
        chunks: &mut ChunkSource,
        outcome: &mut Outcome,
        visitor: &mut impl Visitor,
    ) -> usize {
        let mut length = 0;
        loop {
            let pending = &self.pending[self.head..];
            length += pending[length..].iter().take_while(|e| e.event.time <= time).count();
            if length < pending.len() {
                return length;
            }
            let available = pending.len();
            self.fill(available + DECODE_AHEAD, decoding, chunks, outcome, visitor);
            if self.available() == available {
                return length;
            }
        }
    }
}

/// What the writer records between events, merged with them by time.
enum Sample {
    Rss(Rss),
    Snapshot(Box<Snapshot>),
    Placement(Box<Placement>),
}

impl Sample {
    fn time(&self) -> u64 {
        match self {
            Sample::Rss(r) => r.time,
            Sample::Snapshot(s) => s.time,
            Sample::Placement(p) => p.time,
        }
    }
}

struct Merger<'v, 't, V: Visitor> {
    visitor: &'v mut V,
    chunks: ChunkSource<'t>,
    threads: FxHashMap<u32, ThreadQueue>,
    /// RSS samples and snapshots, in the writer's (time) order.
    samples: VecDeque<Sample>,
    /// The events of one round from several threads, reused.
    batch: Vec<ThreadEvent>,
    /// The threads with events due in a release, reused.
    due: Vec<u32>,
    /// How many events of the round being released each due thread has.
    lengths: Vec<usize>,
    watermark: u64,
    exit: Option<Exit>,
    outcome: Outcome,
    decoding: Decoding,
    round_order: RoundOrder,
    lineage: Lineage,
}

/// Told how far a replay has read: (bytes of the trace read, its length).
pub type Progress = dyn Fn(u64, u64) + Send + Sync;

static PROGRESS: std::sync::OnceLock<Box<Progress>> = std::sync::OnceLock::new();

/// Sets, once per process, what every replay tells of its progress (the
/// `memgap` command draws a progress bar on a terminal).
pub fn on_progress(progress: Box<Progress>) {
    let _ = PROGRESS.set(progress);
}

/// Reads the trace at `path` and feeds `visitor` in time order.
pub fn replay<V: Visitor>(path: &Path, visitor: &mut V) -> Result<Outcome, TraceError> {
    replay_holding(path, visitor, HELD_BYTES)
}

/// [`replay`], with at most `held_limit` bytes of queued pieces in memory.
fn replay_holding<V: Visitor>(path: &Path, visitor: &mut V, held_limit: usize) -> Result<Outcome, TraceError> {
    let trace = TraceFile::open(path)?;
    let progress = PROGRESS.get();
    let total = trace.len();
    let lineage =
        Lineage { dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(), run_id: trace.header().run_id, ..Lineage::default() };
    let mut merger = Merger::new(visitor, Decoding::default(), lineage, ChunkSource::new(&trace, held_limit));
    let tail = trace.for_each_chunk(|offset, chunk| {
        if let Some(progress) = progress {
            progress(offset, total);
        }
        merger.chunks.current = Some((offset, chunk.as_ptr() as usize, chunk.len()));
        for record in Records::new(chunk) {
            match record {
                Ok(record) => merger.record(record),
                Err(_) => merger.outcome.malformed_records += 1,
            }
        }
        Ok(())
    })?;
    merger.release(u64::MAX);
    if let Some(exit) = merger.exit {
        merger.visitor.exit(&exit);
    }
    merger.outcome.cut_short = matches!(tail, Tail::CutShort { .. });
    if let Some(progress) = progress {
        progress(total, total);
    }
    Ok(merger.outcome)
}

impl<'v, 't, V: Visitor> Merger<'v, 't, V> {
    fn new(visitor: &'v mut V, decoding: Decoding, lineage: Lineage, chunks: ChunkSource<'t>) -> Merger<'v, 't, V> {
        Merger {
            visitor,
            chunks,
            threads: FxHashMap::default(),
            samples: VecDeque::new(),
            batch: Vec::new(),
            due: Vec::new(),
            lengths: Vec::new(),
            watermark: 0,
            exit: None,
            outcome: Outcome::default(),
            decoding,
            round_order: RoundOrder::default(),
            lineage,
        }
    }

    fn record(&mut self, record: Record<'_>) {
        match record {
            Record::Events(piece) => self.decode(piece),
            Record::CompactEvents(piece) => self.decode_compact(piece),
            Record::Clock(clock) => {
                self.outcome.timeline.add(&clock);
                self.visitor.clock(&clock);
                self.release(self.watermark);
                // Every event before the watermark is handed on: past the fork, done.
                if let Some(cut) = self.lineage.cut.as_mut().filter(|cut| cut.active && self.watermark > cut.time) {
                    cut.reached = true;
                }
                self.watermark = clock.time;
            }
            Record::Rss(rss) => self.samples.push_back(Sample::Rss(rss)),
            Record::Snapshot(snapshot) => self.samples.push_back(Sample::Snapshot(Box::new(snapshot))),
            Record::Thread(thread) => self.visitor.thread(&thread),
            Record::Allocator { path } => self.visitor.allocator(&path),
            Record::Metrics(metrics) => self.visitor.metrics(&metrics),
            Record::Topology(topology) => self.visitor.topology(&topology),
            Record::Placement(placement) => self.samples.push_back(Sample::Placement(Box::new(placement))),
            Record::MemorySamples(samples) => self.visitor.memory_samples(&samples),
            Record::Process(process) => {
                self.release(u64::MAX);
                if let Some(cut) = &mut self.lineage.cut {
                    if cut.active {
                        // The forking image ended (an exec) before the watermark passed the fork.
                        cut.reached = true;
                        return;
                    }
                    cut.active = cut.is_forking_image(&process);
                    cut.found |= cut.active;
                }
                self.threads.clear();
                if process.image == 0 || self.outcome.events == 0 {
                    self.outcome.timeline.start(&process);
                }
                self.lineage.image = Some((process.pid, process.start_time, process.start_monotonic_ns));
                self.decoding.image = process.image;
                self.visitor.process(&process);
            }
            Record::Fork(fork) => self.inherit(&fork),
            Record::Modules(modules) => self.visitor.modules(&modules),
            Record::End(end) => {
                self.release(u64::MAX);
                if let Some(cut) = self.lineage.cut.as_mut().filter(|cut| cut.active) {
                    cut.reached = true;
                }
                self.visitor.end(&end);
            }
            Record::Exit(exit) => self.exit = Some(exit),
            Record::Note { time, text } => self.visitor.note(time, &text),
            Record::PythonCode(code) => self.visitor.python_code(self.decoding.image, &code),
            Record::Unknown { .. } => {}
        }
    }

    /// Bytes the queues hold in memory.
    fn held(&self) -> usize {
        self.threads.values().map(|queue| queue.held).sum()
    }

    fn decode(&mut self, piece: EventsPiece<'_>) {
        let held = self.held();
        let queue = self.threads.entry(piece.thread).or_insert_with(|| ThreadQueue::new(piece.thread, piece.tid));
        // The agent's delta state does not go on from a piece in the recorder's encoding.
        let continues = piece.buffer == queue.buffer && piece.offset == queue.next_offset && !queue.last_compact;
        if !continues && piece.offset != 0 {
            self.outcome.lost_bytes += piece.records.len() as u64;
            return;
        }
        queue.buffer = piece.buffer;
        queue.next_offset = piece.offset.wrapping_add(piece.records.len() as u32);
        queue.last_compact = false;
        let bytes = self.chunks.keep(piece.records, held);
        queue.held += bytes.held();
        queue.encoded.push_back(EncodedPiece { bytes, at: 0, starts_buffer: !continues, compact: false });
    }

    /// A piece in the recorder's encoding: it decodes on its own, and its
    /// place in the agent's buffer tells whether one was lost before it.
    fn decode_compact(&mut self, piece: CompactEventsPiece<'_>) {
        let held = self.held();
        let queue = self.threads.entry(piece.thread).or_insert_with(|| ThreadQueue::new(piece.thread, piece.tid));
        let continues = piece.buffer == queue.buffer && piece.offset == queue.next_offset;
        if !continues && piece.offset != 0 {
            // What came before it in its buffer was not seen.
            let seen = if piece.buffer == queue.buffer && piece.offset > queue.next_offset { queue.next_offset } else { 0 };
            self.outcome.lost_bytes += u64::from(piece.offset - seen);
        }
        queue.buffer = piece.buffer;
        queue.next_offset = piece.offset.wrapping_add(piece.source_len);
        queue.last_compact = true;
        let bytes = self.chunks.keep(piece.records, held);
        queue.held += bytes.held();
        queue.encoded.push_back(EncodedPiece { bytes, at: 0, starts_buffer: false, compact: true });
    }

    /// A forked child's FORK record: its visitor gets the parent's heap at
    /// the fork. A parent's image other than the forking one inherits
    /// nothing (it is not handed on).
    fn inherit(&mut self, fork: &Fork) {
        let Some((pid, start_time, start_ns)) = self.lineage.image else { return };
        if self.lineage.cut.is_some_and(|cut| !cut.active) {
            return;
        }
        let inherited = self.read_parent(fork, start_time, start_ns);
        let failure = inherited.err().or_else(|| self.lineage.failure.take());
        if self.lineage.generation > 0 {
            self.lineage.failure = failure;
            return;
        }
        if let Some(why) = failure {
            self.visitor.note(start_time, &format!("process {pid} was forked from process {}, but {why}: the heap it inherited is not known (frees of inherited blocks count as untracked)", fork.parent_pid));
        }
        self.visitor.inherited(Inherited::End);
    }

    /// Replays the parent's trace up to the fork into [`Inheriting`].
    fn read_parent(&mut self, fork: &Fork, child_start_time: u64, child_start_ns: u64) -> Result<(), String> {
        if self.lineage.generation >= inherit::MAX_GENERATIONS {
            return Err(format!("its ancestry is longer than {} forks", inherit::MAX_GENERATIONS));
        }
        let path = inherit::parent_trace(&self.lineage.dir, fork)?;
        let trace = TraceFile::open(&path).map_err(|error| format!("its trace {} cannot be read ({error})", path.display()))?;
        if trace.header().run_id != self.lineage.run_id {
            return Err(format!("{} is the trace of another run", path.display()));
        }
        let cut = Cut::of(fork);
        let mut parent = Inheriting::new(&mut *self.visitor, cut, child_start_time, child_start_ns);
        let lineage = Lineage {
            dir: self.lineage.dir.clone(),
            run_id: self.lineage.run_id,
            generation: self.lineage.generation + 1,
            cut: Some(cut),
            ..Lineage::default()
        };
        let image = self.decoding.image;
        let mut merger =
            Merger::new(&mut parent, std::mem::take(&mut self.decoding), lineage, ChunkSource::new(&trace, self.chunks.held_limit));
        let read = trace.for_each_chunk_until(|offset, chunk| {
            merger.chunks.current = Some((offset, chunk.as_ptr() as usize, chunk.len()));
            for record in Records::new(chunk).flatten() {
                merger.record(record);
                if merger.lineage.cut.is_some_and(|cut| cut.reached) {
                    return Ok(std::ops::ControlFlow::Break(()));
                }
            }
            Ok(std::ops::ControlFlow::Continue(()))
        });
        merger.release(u64::MAX);
        let (found, failure) = (merger.lineage.cut.is_some_and(|cut| cut.found), merger.lineage.failure.take());
        self.decoding = std::mem::take(&mut merger.decoding);
        self.decoding.image = image;
        read.map_err(|error| format!("its trace {} cannot be read ({error})", path.display()))?;
        if !found {
            return Err(format!("its trace {} does not hold the image that forked", path.display()));
        }
        self.lineage.failure = failure;
        Ok(())
    }

    /// Hands the visitor every queued item older than `limit`, in time order.
    fn release(&mut self, limit: u64) {
        // Reading a parent: nothing after the fork.
        let limit = match self.lineage.cut {
            Some(cut) if cut.active => limit.min(cut.limit()),
            _ => limit,
        };
        let mut due = std::mem::take(&mut self.due);
        let Merger { threads, decoding, chunks, outcome, visitor, .. } = self;
        due.extend(threads.iter_mut().filter_map(|(&thread, queue)| {
            queue.fill(1, decoding, chunks, outcome, *visitor);
            queue.front().is_some_and(|e| e.event.time < limit).then_some(thread)
        }));
        if due.len() < 2 {
            let first = due.first().copied();
            due.clear();
            self.due = due;
            return self.release_one_thread(first, limit);
        }
        let mut batch = std::mem::take(&mut self.batch);
        // Round by round, the earliest first: a round is ordered and handed
        // on before the next is decoded, so what waits decoded is one round,
        // not every event up to `limit` (a writer that fell behind leaves
        // millions). Ordering a round asks the visitor which blocks are
        // live, so the rounds before it must have reached the visitor. A
        // sample goes after the events of its own time.
        loop {
            let Merger { threads, decoding, chunks, outcome, visitor, .. } = self;
            let mut time = None::<u64>;
            due.retain(|thread| {
                let queue = threads.get_mut(thread).expect("a due thread has a queue");
                queue.fill(1, decoding, chunks, outcome, *visitor);
                match queue.front() {
                    Some(e) if e.event.time < limit => {
                        let t = e.event.time;
                        time = Some(time.map_or(t, |earliest| earliest.min(t)));
                        true
                    }
                    _ => false,
                }
            });
            let Some(time) = time else { break };
            // Each thread's events of the round, decoded in its queue.
            let mut lengths = std::mem::take(&mut self.lengths);
            lengths.clear();
            lengths.extend(due.iter().map(|thread| {
                threads.get_mut(thread).expect("a due thread has a queue").decode_through(time, decoding, chunks, outcome, *visitor)
            }));
            self.release_samples_before(time);
            let Merger { threads, outcome, visitor, round_order, .. } = self;
            if round_order.runs_are_apart(due.iter().zip(&lengths).map(|(thread, &length)| threads[thread].leading(length))) {
                // Nothing to order across threads: each run goes straight
                // from its queue, in thread order, as the order would leave it.
                for (thread, &length) in due.iter().zip(&lengths) {
                    let queue = threads.get_mut(thread).expect("a due thread has a queue");
                    hand_on(*visitor, outcome, queue.leading(length));
                    queue.head += length;
                }
            } else {
                for (thread, &length) in due.iter().zip(&lengths) {
                    batch.extend_from_slice(threads[thread].leading(length));
                    threads.get_mut(thread).expect("a due thread has a queue").head += length;
                }
                let live = visitor.live_set();
                round_order.order(&mut batch, |addr| live.map(|live| live.contains(addr)));
                hand_on(*visitor, outcome, &batch);
                batch.clear();
            }
            self.lengths = lengths;
        }
        self.release_samples_before(limit);
        self.batch = batch;
        self.due = due;
    }

    /// Hands the visitor the samples (RSS, snapshots, placements) older than `limit`.
    fn release_samples_before(&mut self, limit: u64) {
        while self.samples.front().is_some_and(|r| r.time() < limit) {
            let sample = self.samples.pop_front().unwrap();
            dispatch(self.visitor, &sample);
        }
    }

    /// [`Self::release`] when at most one thread has events due: its
    /// events go straight from its queue, the samples merged in between
    /// (after the events of the same time, as the sort would place them).
    fn release_one_thread(&mut self, thread: Option<u32>, limit: u64) {
        if let Some(thread) = thread {
            let Merger { threads, decoding, chunks, outcome, visitor, samples, .. } = self;
            let queue = threads.get_mut(&thread).expect("a due thread has a queue");
            // The next sample's time, kept at hand: asking the queue of
            // samples at every event cost 16 instructions an event.
            let next_sample = |samples: &VecDeque<Sample>| samples.front().map_or(u64::MAX, Sample::time);
            let mut sample_time = next_sample(samples);
            loop {
                if queue.available() <= PREFETCH_DISTANCE {
                    queue.fill(DECODE_AHEAD, decoding, chunks, outcome, *visitor);
                }
                if let Some(ahead) = queue.pending.get(queue.head + PREFETCH_DISTANCE)
                    && let Some(live) = visitor.live_set()
                {
                    live.prefetch(ahead);
                }
                let Some(event) = queue.take_before(limit) else { break };
                if sample_time < event.event.time {
                    while samples.front().is_some_and(|r| r.time() < event.event.time) {
                        let sample = samples.pop_front().unwrap();
                        dispatch(*visitor, &sample);
                    }
                    sample_time = next_sample(samples);
                }
                outcome.events += 1;
                visitor.event(event);
            }
        }
        self.release_samples_before(limit);
    }
}

/// Hands the visitor `events` in order, asking the live set for each
/// block's slot some events ahead.
fn hand_on<V: Visitor>(visitor: &mut V, outcome: &mut Outcome, events: &[ThreadEvent]) {
    for (i, event) in events.iter().enumerate() {
        if let Some(ahead) = events.get(i + PREFETCH_DISTANCE)
            && let Some(live) = visitor.live_set()
        {
            live.prefetch(ahead);
        }
        outcome.events += 1;
        visitor.event(event);
    }
}

/// Asks for the encoded bytes a few cache lines past `at`: they were
/// queued a writer round ago, and the live set's lookups since have pushed
/// them out of the cache.
#[inline(always)]
fn prefetch_ahead(bytes: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching never faults; the address is only a hint.
    unsafe {
        core::arch::x86_64::_mm_prefetch(bytes.as_ptr().wrapping_add(at + 256).cast::<i8>(), core::arch::x86_64::_MM_HINT_T0);
    }
}

/// How many events ahead the replay asks for a block's cache line: enough
/// to cover a miss to memory at a few nanoseconds per event.
const PREFETCH_DISTANCE: usize = 16;
/// How many events one thread's release decodes at a time (at least
/// PREFETCH_DISTANCE + 1).
const DECODE_AHEAD: usize = 256;

fn dispatch<V: Visitor>(visitor: &mut V, sample: &Sample) {
    match sample {
        Sample::Rss(rss) => visitor.rss(rss),
        Sample::Snapshot(snapshot) => visitor.snapshot(snapshot),
        Sample::Placement(placement) => visitor.placement(placement),
    }
}

/// The highest user-space address (57 bits, x86-64 and arm64 with 5-level
/// page tables): a block or mapping reaching past it comes from a corrupt
/// trace, and would overflow the arithmetic of every later stage.
const ADDRESS_LIMIT: u64 = 1 << 57;

fn event_is_plausible(e: &Event) -> bool {
    let within = |addr: u64, len: u64| addr.checked_add(len).is_some_and(|end| end <= ADDRESS_LIMIT);
    let old_range = if e.kind() == event::EventKind::Mremap { within(e.old_addr, e.extra) } else { e.old_addr <= ADDRESS_LIMIT };
    within(e.addr, e.size) && within(e.addr, e.usable) && old_range
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::TraceWriter;
    use memgap_trace::event::{EventKind, MAX_RECORD_LEN, RawEncoder};
    use memgap_trace::records::Clock;

    /// Encodes `events` (kind, address, time) as one buffer's bytes.
    fn encoded(events: &[(EventKind, u64, u64)]) -> Vec<u8> {
        let (mut state, mut out) = (DeltaState::default(), vec![0u8; events.len() * MAX_RECORD_LEN]);
        let mut end = out.as_mut_ptr();
        for &(kind, addr, time) in events {
            let event = Event { kind: Some(kind), addr, size: 16, usable: 24, time, ..Event::default() };
            // SAFETY: `out` has MAX_RECORD_LEN bytes per event, and `end` advances by one record each.
            end = unsafe { RawEncoder::encode(&mut state, end, &event) };
        }
        let len = end as usize - out.as_ptr() as usize;
        out.truncate(len);
        out
    }

    #[derive(Default)]
    struct Seen(Vec<(u32, u64, u64)>);
    impl Visitor for Seen {
        fn event(&mut self, e: &ThreadEvent) {
            self.0.push((e.thread, e.event.time, e.event.addr));
        }
        /// Seen as thread 0's event at address 0.
        fn rss(&mut self, rss: &Rss) {
            self.0.push((0, rss.time, 0));
        }
    }

    /// Writes `chunks` to a trace file and replays it into `visitor`.
    fn replay_into(chunks: &[Vec<Record<'_>>], visitor: &mut impl Visitor) -> Outcome {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mgt");
        let mut writer = TraceWriter::create(&path, 1).unwrap();
        for records in chunks {
            writer.write(records).unwrap();
        }
        drop(writer);
        replay(&path, visitor).unwrap()
    }

    /// Every piece left in the file and read back when its turn comes
    /// replays as the pieces held in memory do.
    #[test]
    fn pieces_left_in_the_file_replay_as_held_ones() {
        use EventKind::{Free, Malloc};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mgt");
        let mut writer = TraceWriter::create(&path, 1).unwrap();
        // Two threads whose addresses interleave, in many pieces over many
        // chunks, released by CLOCK records that come late.
        let mut expected_events = 0;
        for round in 0..40u64 {
            let mut records = vec![clock(round * 10)];
            let mut pieces = Vec::new();
            for thread in 1..=2u32 {
                let base = 0x10_0000 * u64::from(thread) + round * 0x100;
                let time = round * 10 + 1;
                pieces.push((thread, encoded(&[(Malloc, base, time), (Malloc, base + 0x40, time), (Free, base, time + 1)])));
                expected_events += 3;
            }
            for (thread, bytes) in &pieces {
                records.push(Record::Events(EventsPiece {
                    thread: *thread,
                    tid: *thread,
                    buffer: round as u32,
                    offset: 0,
                    records: bytes,
                }));
            }
            writer.write(&records).unwrap();
        }
        writer.write(&[clock(1000), clock(1001)]).unwrap();
        drop(writer);
        let (mut held, mut in_file) = (Live::default(), Live::default());
        let held_outcome = replay(&path, &mut held).unwrap();
        let in_file_outcome = replay_holding(&path, &mut in_file, 0).unwrap();
        assert_eq!(held.1.len(), expected_events);
        assert_eq!(held.1, in_file.1);
        assert_eq!((held.0.len(), held.0.live_bytes()), (in_file.0.len(), in_file.0.live_bytes()));
        assert_eq!((held_outcome.events, held_outcome.lost_bytes), (in_file_outcome.events, in_file_outcome.lost_bytes));
        assert_eq!((in_file_outcome.lost_bytes, in_file_outcome.malformed_records), (0, 0));
    }

    fn replay_chunks(chunks: &[Vec<Record<'_>>]) -> (Vec<(u32, u64, u64)>, Outcome) {
        let mut seen = Seen::default();
        let outcome = replay_into(chunks, &mut seen);
        (seen.0, outcome)
    }

    fn events(thread: u32, buffer: u32, offset: u32, records: &[u8]) -> Record<'_> {
        Record::Events(EventsPiece { thread, tid: thread, buffer, offset, records })
    }

    fn clock(time: u64) -> Record<'static> {
        Record::Clock(Clock { time, monotonic_ns: time })
    }

    #[test]
    fn threads_merge_by_time_across_pieces_and_rounds() {
        use EventKind::{Free, Malloc};
        let a = encoded(&[(Malloc, 0x1000, 1), (Free, 0x1000, 2), (Malloc, 0x2000, 3)]);
        let b = encoded(&[(Malloc, 0x3000, 1), (Malloc, 0x4000, 3)]);
        // Thread 1's buffer arrives in two pieces (cut between records, as
        // the agent commits), the second a round later.
        let (a1, a2) = a.split_at(encoded(&[(Malloc, 0x1000, 1), (Free, 0x1000, 2)]).len());
        // An RSS sample of time 2 goes after the events of its time.
        let rss = Record::Rss(Rss { time: 2, ..Rss::default() });
        let (seen, outcome) = replay_chunks(&[
            vec![clock(1), events(1, 0, 0, a1), events(2, 0, 0, &b), rss, clock(2)],
            vec![events(1, 0, a1.len() as u32, a2), clock(4)],
        ]);
        assert_eq!(seen.iter().map(|e| e.1).collect::<Vec<_>>(), [1, 1, 2, 2, 3, 3]);
        assert_eq!(seen.iter().position(|e| e.0 == 0), Some(3), "{seen:?}");
        assert_eq!(seen.iter().filter(|e| e.0 == 1).map(|e| e.2).collect::<Vec<_>>(), [0x1000, 0x1000, 0x2000], "each thread's order");
        assert_eq!((outcome.events, outcome.lost_bytes, outcome.malformed_records), (5, 0, 0));
    }

    /// The recorder's pieces: each decodes on its own, so the one after a
    /// lost piece still replays, and the gap is counted; an agent's piece
    /// that claims to go on from a compact one cannot be decoded and is lost.
    #[test]
    fn compact_pieces_replay_as_the_agents_and_a_gap_loses_only_what_is_missing() {
        use EventKind::{Free, Malloc};
        let agent = encoded(&[(Malloc, 0x1000, 1), (Free, 0x1000, 2), (Malloc, 0x1000, 3), (Malloc, 0x2000, 4), (Free, 0x2000, 5)]);
        let cut = encoded(&[(Malloc, 0x1000, 1), (Free, 0x1000, 2)]).len();
        let mut delta = DeltaState::default();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        assert_eq!(compact::transcode(&mut delta, &mut CompactState::default(), &agent[..cut], &mut first), cut);
        assert_eq!(compact::transcode(&mut delta, &mut CompactState::default(), &agent[cut..], &mut second), agent.len() - cut);
        let piece = |offset: usize, source: usize, records| {
            Record::CompactEvents(CompactEventsPiece {
                thread: 1,
                tid: 1,
                buffer: 0,
                offset: offset as u32,
                source_len: source as u32,
                records,
            })
        };
        let whole = [vec![clock(1), piece(0, cut, &first), piece(cut, agent.len() - cut, &second), clock(9)]];
        let (seen, outcome) = replay_chunks(&whole);
        assert_eq!(seen, replay_chunks(&[vec![clock(1), events(1, 0, 0, &agent), clock(9)]]).0);
        assert_eq!(seen.iter().map(|e| e.2).collect::<Vec<_>>(), [0x1000, 0x1000, 0x1000, 0x2000, 0x2000]);
        assert_eq!((outcome.events, outcome.lost_bytes, outcome.malformed_records), (5, 0, 0));

        let without_first = [vec![clock(1), piece(cut, agent.len() - cut, &second), clock(9)]];
        let (seen, outcome) = replay_chunks(&without_first);
        assert_eq!(seen.iter().map(|e| e.1).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!((outcome.events, outcome.lost_bytes), (3, cut as u64));

        let agent_after_compact = [vec![clock(1), piece(0, cut, &first), events(1, 0, cut as u32, &agent[cut..]), clock(9)]];
        let (seen, outcome) = replay_chunks(&agent_after_compact);
        assert_eq!((seen.len(), outcome.lost_bytes), (2, (agent.len() - cut) as u64));
    }

    /// Applies events to a live set, which the replay asks to order rounds.
    #[derive(Default)]
    struct Live(LiveSet, Vec<(u32, u64)>);
    impl Visitor for Live {
        fn event(&mut self, e: &ThreadEvent) {
            self.0.apply(e);
            self.1.push((e.thread, e.event.time));
        }
        fn live_set(&self) -> Option<&LiveSet> {
            Some(&self.0)
        }
    }

    #[test]
    fn one_release_hands_on_several_rounds_each_in_causal_order() {
        use EventKind::{Free, Malloc};
        // An address passes between threads in rounds 2 and 3, both released
        // by the CLOCK at the end; within a round, each thread's events were
        // written before the other's use of the address.
        let a = encoded(&[(Malloc, 0x1000, 1), (Malloc, 0x2000, 2), (Free, 0x1000, 2), (Malloc, 0x1000, 3)]);
        let b = encoded(&[(Malloc, 0x1000, 2), (Free, 0x1000, 3), (Malloc, 0x5000, 4)]);
        let mut live = Live::default();
        let outcome = replay_into(&[vec![clock(1), events(2, 0, 0, &b), events(1, 0, 0, &a), clock(5)]], &mut live);
        assert_eq!(outcome.events, 7);
        assert_eq!(live.1.iter().map(|e| e.1).collect::<Vec<_>>(), [1, 2, 2, 2, 3, 3, 4], "time order");
        assert_eq!((live.0.untracked_frees, live.0.overlapping_allocations), (0, 0), "causal order within rounds");
        assert_eq!(live.0.len(), 3);
    }

    #[test]
    fn stack_ids_are_made_unique_in_the_trace_and_absurd_ones_read_as_none() {
        #[derive(Default)]
        struct Stacks(Vec<(u32, Vec<u64>)>, Vec<u32>);
        impl Visitor for Stacks {
            fn stack(&mut self, id: u32, frames: &Arc<[u64]>) {
                self.0.push((id, frames.to_vec()));
            }
            fn event(&mut self, e: &ThreadEvent) {
                self.1.push(e.event.stack);
            }
        }
        let encode = |events: &[(u32, &[u64])]| {
            let (mut state, mut out) = (DeltaState::default(), vec![0u8; 4096]);
            let mut end = out.as_mut_ptr();
            for (i, &(stack, frames)) in events.iter().enumerate() {
                let event = Event {
                    kind: Some(EventKind::Malloc),
                    addr: 0x1000 * (i as u64 + 1),
                    size: 16,
                    usable: 24,
                    time: 1,
                    stack,
                    ..Event::default()
                };
                // SAFETY: the test's few short stacks fit in `out`'s 4 KiB many times over.
                end = unsafe { RawEncoder::encode_with_stack(&mut state, end, &event, (!frames.is_empty()).then_some(frames)) };
            }
            let len = end as usize - out.as_ptr() as usize;
            out.truncate(len);
            out
        };
        // Two threads number the same stack 1 and 2; thread 2 also defines
        // an id past any real one.
        let a = encode(&[(1, &[0x10, 0x20]), (1, &[])]);
        let b = encode(&[(2, &[0x10, 0x20]), (1 << 30, &[0x30]), (1 << 30, &[]), (7, &[])]);
        let mut seen = Stacks::default();
        let outcome = replay_into(&[vec![clock(1), events(1, 0, 0, &a), events(2, 0, 0, &b), clock(5)]], &mut seen);
        assert_eq!(seen.0, [(1, vec![0x10, 0x20]), (2, vec![0x30])]);
        let mut stacks = seen.1.clone();
        stacks.sort_unstable();
        assert_eq!(stacks, [0, 0, 0, 1, 1, 1], "thread 2's id 2 is the trace's 1; 1<<30 and the undefined 7 are none");
        assert_eq!((outcome.events, outcome.malformed_records), (6, 0));
    }

    #[test]
    fn a_missing_piece_loses_the_rest_of_its_buffer_only() {
        use EventKind::Malloc;
        let first = encoded(&[(Malloc, 0x1000, 1), (Malloc, 0x1010, 1)]);
        let next = encoded(&[(Malloc, 0x5000, 2)]);
        let (seen, outcome) = replay_chunks(&[vec![
            events(1, 0, 0, &first[..3]),
            // The piece at 3.. is missing: what continues it cannot be decoded.
            events(1, 0, 40, &first[3..]),
            events(1, 1, 0, &next),
            clock(5),
            clock(6),
        ]]);
        assert_eq!(seen.iter().map(|e| e.2).collect::<Vec<_>>(), [0x5000]);
        assert_eq!(outcome.lost_bytes, (first.len() - 3) as u64);
        assert_eq!(outcome.malformed_records, 1, "the cut first piece ends inside a record");
    }

    #[test]
    fn a_corrupt_record_drops_the_rest_of_its_buffer_even_when_queued() {
        use EventKind::Malloc;
        let good = encoded(&[(Malloc, 0x1000, 1)]);
        let more = encoded(&[(Malloc, 0x2000, 1)]);
        let next = encoded(&[(Malloc, 0x5000, 2)]);
        let mut broken = good.clone();
        broken.push(0x0f); // kind 15 is sbrk; its varints run off the end
        let (seen, outcome) = replay_chunks(&[vec![
            events(1, 0, 0, &broken),
            events(1, 0, broken.len() as u32, &more),
            events(1, 1, 0, &next),
            clock(5),
            clock(6),
        ]]);
        assert_eq!(seen.iter().map(|e| e.2).collect::<Vec<_>>(), [0x1000, 0x5000]);
        assert_eq!((outcome.malformed_records, outcome.lost_bytes), (1, more.len() as u64));
    }
}
