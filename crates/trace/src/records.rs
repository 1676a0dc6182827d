//! Records: the units inside a chunk. Each is `tag:u8 len:varint body`, so a
//! reader skips tags it does not know (newer minor versions add tags).

use crate::varint::{self, Cursor, Malformed};

pub const TAG_PROCESS: u8 = 1;
pub const TAG_MODULES: u8 = 2;
pub const TAG_EVENTS: u8 = 3;
pub const TAG_CLOCK: u8 = 4;
pub const TAG_RSS: u8 = 5;
pub const TAG_END: u8 = 6;
pub const TAG_EXIT: u8 = 7;
pub const TAG_NOTE: u8 = 8;
pub const TAG_SNAPSHOT: u8 = 9;
pub const TAG_THREAD: u8 = 10;
pub const TAG_ALLOCATOR: u8 = 11;
pub const TAG_METRICS: u8 = 12;
pub const TAG_FORK: u8 = 13;
pub const TAG_PYTHON_CODE: u8 = 14;
/// Heap events as the recorder re-encodes them (trace format 3, in columns since 4; see [`crate::compact`]).
pub const TAG_COMPACT_EVENTS: u8 = 15;
/// NUMA records (see [`crate::numa`]).
pub const TAG_TOPOLOGY: u8 = 20;
pub const TAG_PLACEMENT: u8 = 21;
pub const TAG_MEMORY_SAMPLES: u8 = 22;

/// How event times are counted.
pub const CLOCK_MONOTONIC_NS: u8 = 0;
/// x86 time-stamp counter; converted with the CLOCK records.
pub const CLOCK_TSC: u8 = 1;
/// The agent writer's round number (about 10 ms each); converted with the
/// CLOCK records.
pub const CLOCK_ROUNDS: u8 = 2;

/// One process image: written when the agent starts and again after each exec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub run_id: u64,
    /// 0 for the first image of this pid, +1 for each exec.
    pub image: u32,
    pub clock: u8,
    pub start_time: u64,
    pub start_monotonic_ns: u64,
    pub start_realtime_ns: u64,
    pub page_size: u64,
    pub cpu_count: u32,
    pub exe: String,
    pub argv: Vec<String>,
}

/// A forked child's origin, right after its PROCESS record: its heap at
/// the start is its parent's at the fork.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fork {
    pub parent_pid: u32,
    /// The forking image: its PROCESS record's `start_monotonic_ns`.
    pub parent_image_start_ns: u64,
    /// The fork in the parent's clock: it came after every event of the
    /// parent stamped this time or earlier, before every later one.
    pub time: u64,
    /// The parent's trace, a file name in the same directory as this trace
    /// (filled in by the recorder; empty when it did not know it).
    pub parent_trace: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Module {
    pub path: String,
    pub base: u64,
    pub size: u64,
    pub build_id: Vec<u8>,
}

/// A piece of one thread's events in the recorder's encoding
/// ([`crate::compact`]): the agent's records of `source_len` bytes at
/// `offset` of its buffer, decoded on their own.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompactEventsPiece<'a> {
    pub thread: u32,
    pub tid: u32,
    pub buffer: u32,
    /// Where the agent's records start in its buffer, and how many bytes
    /// they took there: a reader finds a lost piece by the gap.
    pub offset: u32,
    pub source_len: u32,
    pub records: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventsPiece<'a> {
    /// Unique per thread within a process image (thread ids get reused).
    pub thread: u32,
    pub tid: u32,
    /// Buffer number within the thread; delta state restarts with each buffer.
    pub buffer: u32,
    /// Byte offset of `records` within that buffer.
    pub offset: u32,
    pub records: &'a [u8],
}

/// A clock reading; also a watermark: every event whose time is earlier than
/// the previous CLOCK record's has been written before this record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clock {
    pub time: u64,
    pub monotonic_ns: u64,
}

/// Resident memory of the process, from /proc/self/status, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rss {
    pub time: u64,
    pub vm_rss: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub rss_shmem: u64,
}

/// Written by the agent when the process ends (exit, _exit) or execs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct End {
    pub time: u64,
    pub reason: EndReason,
    pub dropped_events: u64,
    pub vm_hwm: u64,
    /// Exit status when the agent saw it (a direct `exit`/`_exit` call).
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EndReason {
    #[default]
    Exit = 0,
    Exec = 1,
    RecordingFailed = 2,
}

/// Written by `memgap run` after reaping the process it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Exit {
    pub exit_code: i32,
    pub signal: i32,
    /// What recording cost, when `memgap run` measured it.
    pub cost: Option<RecordingCost>,
}

/// CPU time (user and system) of the program, hooks included, and of
/// memgap's own process while it recorded (the recorder and samplers):
/// what the program paid and what was paid beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordingCost {
    /// The program and the children it waited for.
    pub program_cpu_ns: u64,
    pub recorder_cpu_ns: u64,
}

/// Why a snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SnapshotReason {
    #[default]
    Periodic = 0,
    /// RSS passed the last snapshot's peak by more than 5 %.
    RssPeak = 1,
    Exit = 2,
    /// `memgap snap PID`.
    Requested = 3,
    /// The program called `memgap_snapshot()`.
    Program = 4,
    /// The live heap fell by a quarter or more from its high since the
    /// last snapshot (mass frees: RSS often stays, so no peak shows it).
    LiveDrop = 5,
}

/// How a mapping's pages are resident.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Residency {
    /// Not examined (not a private writable anonymous mapping).
    #[default]
    Unknown,
    All,
    None,
    /// One bit per page, least significant bit first.
    Bitmap(Vec<u8>),
}

impl Residency {
    pub fn is_resident(&self, page: usize) -> bool {
        match self {
            Residency::All => true,
            Residency::Bitmap(bits) => bits.get(page / 8).is_some_and(|b| b & (1 << (page % 8)) != 0),
            _ => false,
        }
    }

    /// How many pages of `pages` are resident, in time bounded by the
    /// bitmap, not by the range (a corrupt trace may claim any size).
    pub fn resident_in(&self, pages: core::ops::Range<u64>) -> u64 {
        match self {
            Residency::All => pages.end.saturating_sub(pages.start),
            Residency::Bitmap(bits) => {
                let end = pages.end.min(bits.len() as u64 * 8);
                (pages.start..end).filter(|&i| self.is_resident(i as usize)).count() as u64
            }
            _ => 0,
        }
    }

    /// The runs of resident pages within `pages`, as page ranges in order,
    /// in time bounded by the bitmap (whole bytes of 0 or 0xff in one step)
    /// and never by the range.
    pub fn resident_runs(&self, pages: core::ops::Range<u64>) -> Vec<core::ops::Range<u64>> {
        let mut runs: Vec<core::ops::Range<u64>> = Vec::new();
        match self {
            Residency::All if pages.start < pages.end => runs.push(pages),
            Residency::Bitmap(bits) => {
                let end = pages.end.min(bits.len() as u64 * 8);
                let mut page = pages.start;
                let mut push = |from: u64, to: u64| match runs.last_mut() {
                    Some(last) if last.end == from => last.end = to,
                    _ => runs.push(from..to),
                };
                while page < end {
                    let byte = bits[(page / 8) as usize];
                    let byte_end = ((page / 8 + 1) * 8).min(end);
                    if page.is_multiple_of(8) && (byte == 0 || byte == 0xff) {
                        if byte == 0xff {
                            push(page, byte_end);
                        }
                        page = byte_end;
                        continue;
                    }
                    if byte & (1 << (page % 8)) != 0 {
                        push(page, page + 1);
                    }
                    page += 1;
                }
            }
            _ => {}
        }
        runs
    }
}

/// One line of /proc/self/smaps with the fields the ledger needs, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// "rw-p" and so on.
    pub perms: String,
    pub offset: u64,
    pub inode: u64,
    /// Path, or a pseudo-name such as `[heap]` or `[stack]`; empty for anonymous.
    pub name: String,
    pub rss: u64,
    pub anonymous: u64,
    pub lazy_free: u64,
    pub swap: u64,
    pub residency: Residency,
}

impl Mapping {
    pub fn is_private_writable_anonymous(&self) -> bool {
        self.perms.starts_with("rw")
            && self.perms.ends_with('p')
            && self.inode == 0
            && (self.name.is_empty() || self.name == "[heap]" || self.name.starts_with("[anon:"))
    }
}

/// The process's memory at one instant: RSS counters, every mapping with
/// its smaps figures, and which pages of each anonymous mapping are resident.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub time: u64,
    pub reason: SnapshotReason,
    /// RSS read just before the snapshot…
    pub rss: Rss,
    /// …and VmRSS read just after it: a program allocating fast moves it.
    pub vm_rss_after: u64,
    pub page_size: u64,
    pub mappings: Vec<Mapping>,
    /// Address ranges holding memgap's own buffers (start, length).
    pub agent_ranges: Vec<(u64, u64)>,
    /// How long taking the snapshot stalled the writer, in nanoseconds.
    pub cost_ns: u64,
}

/// A thread seen by the agent; `stack_hint` is an address inside its stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Thread {
    pub thread: u32,
    pub tid: u32,
    pub stack_hint: u64,
}

/// Figures a runtime reports about its own memory (the Go runtime's
/// runtime/metrics or gctrace, the GHC eventlog, Ruby's GC.stat), written by
/// `memgap run` or an adapter beside the agent's records. Times are
/// CLOCK_MONOTONIC nanoseconds whatever clock the events use, because these
/// come from outside the agent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metrics {
    pub monotonic_ns: u64,
    /// Who measured: "go", "ghc", "ruby", …
    pub source: String,
    /// What the sample is: "sample", "gc", "memstats", …
    pub kind: String,
    /// Names as the runtime spells them (`/memory/classes/heap/free:bytes`,
    /// `heap_live_slots`); histogram buckets as `name[upper]`.
    pub values: Vec<(String, f64)>,
}

impl Metrics {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Record<'a> {
    Process(Process),
    Modules(Vec<Module>),
    Events(EventsPiece<'a>),
    CompactEvents(CompactEventsPiece<'a>),
    Clock(Clock),
    Rss(Rss),
    End(End),
    Exit(Exit),
    Note {
        time: u64,
        text: String,
    },
    Snapshot(Snapshot),
    Thread(Thread),
    /// The file that provides `malloc` to the program (glibc's libc.so.6, a
    /// jemalloc…), which tells readers how blocks are laid out.
    Allocator {
        path: String,
    },
    Metrics(Metrics),
    Fork(Fork),
    Topology(crate::numa::Topology),
    Placement(crate::numa::Placement),
    MemorySamples(crate::numa::MemorySamples),
    /// A Python code object that frames of this image's stacks name.
    PythonCode(crate::python::PythonCode),
    Unknown {
        tag: u8,
    },
}

/// Raw chunk bytes held before a new chunk starts (a chunk holds at most 16 MiB).
const APPENDED_CHUNK_BYTES: usize = 1 << 20;

/// Appends records to an existing trace (the samples and metrics memgap adds
/// after a run), in chunks of about 1 MiB; see [`crate::framing::append_chunk`].
pub fn append_records_to<'a>(
    file: &mut std::fs::File,
    path: &std::path::Path,
    records: impl IntoIterator<Item = Record<'a>>,
) -> Result<(), crate::TraceError> {
    let mut chunks = vec![Vec::new()];
    for record in records {
        if chunks.last().is_some_and(|raw| raw.len() >= APPENDED_CHUNK_BYTES) {
            chunks.push(Vec::new());
        }
        record.encode(chunks.last_mut().expect("one chunk at least"));
    }
    chunks.retain(|raw| !raw.is_empty());
    if !chunks.is_empty() {
        crate::framing::append_chunks_to(file, path, chunks.iter().map(Vec::as_slice))?;
    }
    Ok(())
}

fn frame(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    varint::push_bytes(out, body);
}

/// A piece of events as a record: `tag`, the body's length, the varints
/// `head`, then `records`, copied once (no body built apart: these are most
/// of a trace's bytes).
fn frame_piece(out: &mut Vec<u8>, tag: u8, head: &[u32], records: &[u8]) {
    let head_len: usize = head.iter().map(|&value| varint::encoded_len(value.into())).sum();
    out.push(tag);
    varint::push(out, (head_len + records.len()) as u64);
    for &value in head {
        varint::push(out, value.into());
    }
    out.extend_from_slice(records);
}

impl Record<'_> {
    /// Appends this record to a chunk being built.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Events(p) => frame_piece(out, TAG_EVENTS, &[p.thread, p.tid, p.buffer, p.offset], p.records),
            Record::CompactEvents(p) => {
                frame_piece(out, TAG_COMPACT_EVENTS, &[p.thread, p.tid, p.buffer, p.offset, p.source_len], p.records)
            }
            _ => {
                let mut body = Vec::new();
                let tag = self.encode_body(&mut body);
                frame(out, tag, &body);
            }
        }
    }

    /// Appends the body of a record other than a piece of events; returns its tag.
    fn encode_body(&self, b: &mut Vec<u8>) -> u8 {
        match self {
            Record::Process(p) => {
                for v in [
                    p.pid as u64,
                    p.ppid as u64,
                    p.run_id,
                    p.image as u64,
                    p.clock as u64,
                    p.start_time,
                    p.start_monotonic_ns,
                    p.start_realtime_ns,
                    p.page_size,
                    p.cpu_count as u64,
                ] {
                    varint::push(b, v);
                }
                varint::push_bytes(b, p.exe.as_bytes());
                varint::push(b, p.argv.len() as u64);
                for arg in &p.argv {
                    varint::push_bytes(b, arg.as_bytes());
                }
                TAG_PROCESS
            }
            Record::Modules(modules) => {
                varint::push(b, modules.len() as u64);
                for m in modules {
                    varint::push_bytes(b, m.path.as_bytes());
                    varint::push(b, m.base);
                    varint::push(b, m.size);
                    varint::push_bytes(b, &m.build_id);
                }
                TAG_MODULES
            }
            Record::Events(_) | Record::CompactEvents(_) => unreachable!("pieces of events are framed by `encode` itself"),
            Record::Clock(c) => {
                varint::push(b, c.time);
                varint::push(b, c.monotonic_ns);
                TAG_CLOCK
            }
            Record::Rss(r) => {
                for v in [r.time, r.vm_rss, r.rss_anon, r.rss_file, r.rss_shmem] {
                    varint::push(b, v);
                }
                TAG_RSS
            }
            Record::End(e) => {
                for v in [e.time, e.reason as u64, e.dropped_events, e.vm_hwm] {
                    varint::push(b, v);
                }
                match e.exit_code {
                    Some(code) => {
                        varint::push(b, 1);
                        varint::push(b, varint::zigzag(code.into()));
                    }
                    None => varint::push(b, 0),
                }
                TAG_END
            }
            Record::Exit(x) => {
                varint::push(b, varint::zigzag(x.exit_code.into()));
                varint::push(b, varint::zigzag(x.signal.into()));
                // Appended: readers that predate it stop before it.
                if let Some(cost) = x.cost {
                    varint::push(b, cost.program_cpu_ns);
                    varint::push(b, cost.recorder_cpu_ns);
                }
                TAG_EXIT
            }
            Record::Note { time, text } => {
                varint::push(b, *time);
                varint::push_bytes(b, text.as_bytes());
                TAG_NOTE
            }
            Record::Snapshot(snapshot) => {
                encode_snapshot(b, snapshot);
                TAG_SNAPSHOT
            }
            Record::Thread(t) => {
                for v in [t.thread as u64, t.tid as u64, t.stack_hint] {
                    varint::push(b, v);
                }
                TAG_THREAD
            }
            Record::Allocator { path } => {
                varint::push_bytes(b, path.as_bytes());
                TAG_ALLOCATOR
            }
            Record::Metrics(m) => {
                varint::push(b, m.monotonic_ns);
                varint::push_bytes(b, m.source.as_bytes());
                varint::push_bytes(b, m.kind.as_bytes());
                varint::push(b, m.values.len() as u64);
                for (name, value) in &m.values {
                    varint::push_bytes(b, name.as_bytes());
                    b.extend_from_slice(&value.to_le_bytes());
                }
                TAG_METRICS
            }
            Record::Fork(f) => {
                for v in [f.parent_pid as u64, f.parent_image_start_ns, f.time] {
                    varint::push(b, v);
                }
                varint::push_bytes(b, f.parent_trace.as_bytes());
                TAG_FORK
            }
            Record::Topology(t) => {
                crate::numa::encode_topology(b, t);
                TAG_TOPOLOGY
            }
            Record::Placement(p) => {
                crate::numa::encode_placement(b, p);
                TAG_PLACEMENT
            }
            Record::MemorySamples(s) => {
                crate::numa::encode_samples(b, s);
                TAG_MEMORY_SAMPLES
            }
            Record::PythonCode(code) => {
                for v in [code.id as u64, code.first_line as u64, code.line_table_format as u64] {
                    varint::push(b, v);
                }
                varint::push_bytes(b, code.file.as_bytes());
                varint::push_bytes(b, code.qualified_name.as_bytes());
                varint::push_bytes(b, &code.line_table);
                TAG_PYTHON_CODE
            }
            Record::Unknown { tag } => *tag,
        }
    }

    /// The header of an EVENTS record; the agent writes it in front of raw
    /// records it already holds, without building a `Record`.
    pub fn encode_events_header(out: &mut Vec<u8>, thread: u32, tid: u32, buffer: u32, offset: u32) {
        for v in [thread, tid, buffer, offset] {
            varint::push(out, v.into());
        }
    }

    /// Appends an EVENTS record whose body is the header plus `records`.
    pub fn encode_events(out: &mut Vec<u8>, thread: u32, tid: u32, buffer: u32, offset: u32, records: &[u8]) {
        frame_piece(out, TAG_EVENTS, &[thread, tid, buffer, offset], records);
    }
}

fn encode_snapshot(b: &mut Vec<u8>, s: &Snapshot) {
    for v in
        [s.time, s.reason as u64, s.rss.vm_rss, s.rss.rss_anon, s.rss.rss_file, s.rss.rss_shmem, s.vm_rss_after, s.page_size, s.cost_ns]
    {
        varint::push(b, v);
    }
    varint::push(b, s.mappings.len() as u64);
    for m in &s.mappings {
        for v in [m.start, m.end - m.start, m.offset, m.inode, m.rss, m.anonymous, m.lazy_free, m.swap] {
            varint::push(b, v);
        }
        varint::push_bytes(b, m.perms.as_bytes());
        varint::push_bytes(b, m.name.as_bytes());
        match &m.residency {
            Residency::Unknown => varint::push(b, 0),
            Residency::All => varint::push(b, 1),
            Residency::None => varint::push(b, 2),
            Residency::Bitmap(bits) => {
                varint::push(b, 3);
                varint::push_bytes(b, bits);
            }
        }
    }
    varint::push(b, s.agent_ranges.len() as u64);
    for &(start, len) in &s.agent_ranges {
        varint::push(b, start);
        varint::push(b, len);
    }
}

fn decode_snapshot(c: &mut Cursor<'_>) -> Result<Snapshot, Malformed> {
    let time = c.varint()?;
    let reason = match c.varint()? {
        0 => SnapshotReason::Periodic,
        1 => SnapshotReason::RssPeak,
        2 => SnapshotReason::Exit,
        3 => SnapshotReason::Requested,
        4 => SnapshotReason::Program,
        5 => SnapshotReason::LiveDrop,
        _ => return Err(Malformed),
    };
    let rss = plausible_rss(Rss { time, vm_rss: c.varint()?, rss_anon: c.varint()?, rss_file: c.varint()?, rss_shmem: c.varint()? })?;
    let vm_rss_after = c.varint()?;
    let page_size = c.varint()?;
    let cost_ns = c.varint()?;
    let count = c.varint()?;
    let mut mappings = Vec::new();
    for _ in 0..count {
        let start = c.varint()?;
        let len = c.varint()?;
        let mut m = Mapping { start, end: start.checked_add(len).ok_or(Malformed)?, ..Mapping::default() };
        m.offset = c.varint()?;
        m.inode = c.varint()?;
        m.rss = c.varint()?;
        m.anonymous = c.varint()?;
        m.lazy_free = c.varint()?;
        m.swap = c.varint()?;
        m.perms = c.string()?;
        m.name = c.string()?;
        m.residency = match c.varint()? {
            0 => Residency::Unknown,
            1 => Residency::All,
            2 => Residency::None,
            3 => Residency::Bitmap(c.bytes()?.to_vec()),
            _ => return Err(Malformed),
        };
        // As smaps shows them: in address order, apart, and no figure above
        // the mapping's size. Every later sum of them then fits in a u64.
        // ([vsyscall] sits at 0xffffffffff600000: no address limit here.)
        let size = m.end - m.start;
        let apart = mappings.last().is_none_or(|previous: &Mapping| previous.end <= m.start);
        if !apart || [m.rss, m.anonymous, m.lazy_free, m.swap].iter().any(|&figure| figure > size) {
            return Err(Malformed);
        }
        mappings.push(m);
    }
    let ranges = c.varint()?;
    let mut agent_ranges = Vec::new();
    for _ in 0..ranges {
        agent_ranges.push((c.varint()?, c.varint()?));
    }
    Ok(Snapshot { time, reason, rss, vm_rss_after, page_size, mappings, agent_ranges, cost_ns })
}

/// No process holds more memory than the 57-bit address space of x86-64 and
/// arm64 with 5-level page tables.
pub const ADDRESS_LIMIT: u64 = 1 << 57;

fn plausible_rss(rss: Rss) -> Result<Rss, Malformed> {
    let figures = [rss.vm_rss, rss.rss_anon, rss.rss_file, rss.rss_shmem];
    if figures.iter().any(|&figure| figure > ADDRESS_LIMIT) {
        return Err(Malformed);
    }
    Ok(rss)
}

fn u32_of(v: u64) -> Result<u32, Malformed> {
    u32::try_from(v).map_err(|_| Malformed)
}

fn i32_of(v: u64) -> Result<i32, Malformed> {
    i32::try_from(varint::unzigzag(v)).map_err(|_| Malformed)
}

/// Iterates the records of one decompressed chunk.
pub struct Records<'a> {
    cursor: Cursor<'a>,
}

impl<'a> Records<'a> {
    pub fn new(chunk: &'a [u8]) -> Self {
        Records { cursor: Cursor::new(chunk) }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.cursor.is_empty() {
            return None;
        }
        let parsed = (|| {
            let tag = self.cursor.u8()?;
            let body = self.cursor.bytes()?;
            decode_body(tag, body)
        })();
        if parsed.is_err() {
            self.cursor.rest();
        }
        Some(parsed)
    }
}

fn decode_body(tag: u8, body: &[u8]) -> Result<Record<'_>, Malformed> {
    let mut c = Cursor::new(body);
    Ok(match tag {
        TAG_PROCESS => {
            let mut p = Process {
                pid: u32_of(c.varint()?)?,
                ppid: u32_of(c.varint()?)?,
                run_id: c.varint()?,
                image: u32_of(c.varint()?)?,
                clock: u8::try_from(c.varint()?).map_err(|_| Malformed)?,
                start_time: c.varint()?,
                start_monotonic_ns: c.varint()?,
                start_realtime_ns: c.varint()?,
                page_size: c.varint()?,
                cpu_count: u32_of(c.varint()?)?,
                exe: c.string()?,
                argv: Vec::new(),
            };
            let argc = c.varint()?;
            for _ in 0..argc {
                p.argv.push(c.string()?);
            }
            Record::Process(p)
        }
        TAG_MODULES => {
            let count = c.varint()?;
            let mut modules = Vec::new();
            for _ in 0..count {
                modules.push(Module { path: c.string()?, base: c.varint()?, size: c.varint()?, build_id: c.bytes()?.to_vec() });
            }
            Record::Modules(modules)
        }
        TAG_EVENTS => Record::Events(EventsPiece {
            thread: u32_of(c.varint()?)?,
            tid: u32_of(c.varint()?)?,
            buffer: u32_of(c.varint()?)?,
            offset: u32_of(c.varint()?)?,
            records: c.rest(),
        }),
        TAG_COMPACT_EVENTS => Record::CompactEvents(CompactEventsPiece {
            thread: u32_of(c.varint()?)?,
            tid: u32_of(c.varint()?)?,
            buffer: u32_of(c.varint()?)?,
            offset: u32_of(c.varint()?)?,
            source_len: u32_of(c.varint()?)?,
            records: c.rest(),
        }),
        TAG_CLOCK => Record::Clock(Clock { time: c.varint()?, monotonic_ns: c.varint()? }),
        TAG_RSS => Record::Rss(plausible_rss(Rss {
            time: c.varint()?,
            vm_rss: c.varint()?,
            rss_anon: c.varint()?,
            rss_file: c.varint()?,
            rss_shmem: c.varint()?,
        })?),
        TAG_END => {
            let time = c.varint()?;
            let reason = match c.varint()? {
                0 => EndReason::Exit,
                1 => EndReason::Exec,
                2 => EndReason::RecordingFailed,
                _ => return Err(Malformed),
            };
            let dropped_events = c.varint()?;
            let vm_hwm = c.varint()?;
            let exit_code = if c.varint()? == 1 { Some(i32_of(c.varint()?)?) } else { None };
            Record::End(End { time, reason, dropped_events, vm_hwm, exit_code })
        }
        TAG_EXIT => {
            let (exit_code, signal) = (i32_of(c.varint()?)?, i32_of(c.varint()?)?);
            let cost = match c.is_empty() {
                true => None,
                false => Some(RecordingCost { program_cpu_ns: c.varint()?, recorder_cpu_ns: c.varint()? }),
            };
            Record::Exit(Exit { exit_code, signal, cost })
        }
        TAG_NOTE => Record::Note { time: c.varint()?, text: c.string()? },
        TAG_SNAPSHOT => Record::Snapshot(decode_snapshot(&mut c)?),
        TAG_THREAD => Record::Thread(Thread { thread: u32_of(c.varint()?)?, tid: u32_of(c.varint()?)?, stack_hint: c.varint()? }),
        TAG_ALLOCATOR => Record::Allocator { path: c.string()? },
        TAG_METRICS => {
            let monotonic_ns = c.varint()?;
            let source = c.string()?;
            let kind = c.string()?;
            let count = c.varint()?;
            // Each value takes at least 9 bytes: a count beyond the body is corruption.
            if count > body.len() as u64 / 9 {
                return Err(Malformed);
            }
            let mut values = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let name = c.string()?;
                let value = f64::from_le_bytes(c.take(8)?.try_into().map_err(|_| Malformed)?);
                values.push((name, value));
            }
            Record::Metrics(Metrics { monotonic_ns, source, kind, values })
        }
        TAG_FORK => Record::Fork(Fork {
            parent_pid: u32_of(c.varint()?)?,
            parent_image_start_ns: c.varint()?,
            time: c.varint()?,
            parent_trace: c.string()?,
        }),
        TAG_TOPOLOGY => Record::Topology(crate::numa::decode_topology(&mut c, body.len())?),
        TAG_PLACEMENT => Record::Placement(crate::numa::decode_placement(&mut c, body.len())?),
        TAG_MEMORY_SAMPLES => Record::MemorySamples(crate::numa::decode_samples(&mut c, body.len())?),
        TAG_PYTHON_CODE => Record::PythonCode(crate::python::PythonCode {
            id: u32_of(c.varint()?)?,
            first_line: u32_of(c.varint()?)?,
            line_table_format: u8::try_from(c.varint()?).map_err(|_| Malformed)?,
            file: c.string()?,
            qualified_name: c.string()?,
            line_table: c.bytes()?.to_vec(),
        }),
        tag => Record::Unknown { tag },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_records_are_read_back_in_chunks_of_about_a_mebibyte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mgt");
        std::fs::write(&path, crate::framing::FileHeader::new(7).encode()).unwrap();
        let note = |i: u64| Record::Note { time: i, text: format!("{i:01000}") };
        let mut file = std::fs::File::options().read(true).write(true).open(&path).unwrap();
        append_records_to(&mut file, &path, (0..3000).map(note)).unwrap();
        append_records_to(&mut file, &path, std::iter::empty()).unwrap();
        append_records_to(&mut file, &path, [note(3000)]).unwrap();
        let (mut chunks, mut times) = (0, Vec::new());
        crate::TraceFile::open(&path)
            .unwrap()
            .for_each_chunk(|_, raw| {
                chunks += 1;
                assert!(raw.len() < APPENDED_CHUNK_BYTES + 2048);
                times.extend(Records::new(raw).map(|r| match r.unwrap() {
                    Record::Note { time, .. } => time,
                    other => panic!("{other:?}"),
                }));
                Ok(())
            })
            .unwrap();
        assert_eq!(times, (0..=3000).collect::<Vec<_>>());
        assert_eq!(chunks, 4);
    }

    #[test]
    fn resident_pages_of_a_range_past_the_bitmap() {
        let bitmap = Residency::Bitmap(vec![0b1010_0101, 0b0000_0001]);
        assert_eq!(bitmap.resident_in(0..u64::MAX), 5);
        assert_eq!(bitmap.resident_in(1..8), 3);
        assert_eq!(bitmap.resident_in(9..u64::MAX), 0);
        assert_eq!(Residency::All.resident_in(2..5), 3);
        assert_eq!(bitmap.resident_runs(0..16), vec![0..1, 2..3, 5..6, 7..9]);
        assert_eq!(bitmap.resident_runs(1..6), vec![2..3, 5..6]);
        assert_eq!(Residency::Bitmap(vec![0xff, 0xff, 0x0f, 0, 0x80]).resident_runs(3..1 << 40), vec![3..20, 39..40]);
        assert_eq!(Residency::All.resident_runs(2..5), vec![2..5]);
        assert_eq!(Residency::None.resident_runs(0..1 << 40), vec![]);
        assert_eq!(Residency::Unknown.resident_in(0..9), 0);
    }

    #[test]
    fn every_record_round_trips() {
        let records = vec![
            Record::Process(Process {
                pid: 42,
                ppid: 1,
                run_id: u64::MAX,
                image: 1,
                clock: CLOCK_TSC,
                start_time: 5,
                start_monotonic_ns: 6,
                start_realtime_ns: 7,
                page_size: 4096,
                cpu_count: 2,
                exe: "/bin/true".into(),
                argv: vec!["true".into(), "ä b".into()],
            }),
            Record::Modules(vec![Module { path: "/lib/libc.so.6".into(), base: 0x7f00_0000_0000, size: 4096, build_id: vec![1, 2, 3] }]),
            Record::Events(EventsPiece { thread: 3, tid: 1234, buffer: 9, offset: 100, records: &[1, 2, 3] }),
            Record::CompactEvents(CompactEventsPiece { thread: 3, tid: 1234, buffer: 9, offset: 103, source_len: 7, records: &[4, 5] }),
            Record::Clock(Clock { time: 10, monotonic_ns: 20 }),
            Record::Rss(Rss { time: 1, vm_rss: 2, rss_anon: 3, rss_file: 4, rss_shmem: 5 }),
            Record::End(End { time: 9, reason: EndReason::Exec, dropped_events: 3, vm_hwm: 1 << 30, exit_code: Some(-1) }),
            Record::Exit(Exit { exit_code: 137, signal: 9, cost: None }),
            Record::Exit(Exit { exit_code: 0, signal: 0, cost: Some(RecordingCost { program_cpu_ns: 1 << 40, recorder_cpu_ns: 0 }) }),
            Record::Note { time: 1, text: "recording stopped".into() },
            Record::Snapshot(Snapshot {
                time: 77,
                reason: SnapshotReason::RssPeak,
                rss: Rss { time: 77, vm_rss: 8192, rss_anon: 4096, rss_file: 4096, rss_shmem: 0 },
                vm_rss_after: 12288,
                page_size: 4096,
                mappings: vec![
                    Mapping {
                        start: 0x1000,
                        end: 0x5000,
                        perms: "rw-p".into(),
                        name: "[heap]".into(),
                        rss: 8192,
                        anonymous: 8192,
                        residency: Residency::Bitmap(vec![0b1010]),
                        ..Mapping::default()
                    },
                    Mapping {
                        start: 0x9000,
                        end: 0xa000,
                        perms: "r-xp".into(),
                        inode: 12,
                        name: "/bin/x".into(),
                        residency: Residency::Unknown,
                        ..Mapping::default()
                    },
                    Mapping {
                        start: 0xa000,
                        end: 0xb000,
                        perms: "rw-p".into(),
                        residency: Residency::All,
                        lazy_free: 4096,
                        ..Mapping::default()
                    },
                ],
                agent_ranges: vec![(0x100000, 65536)],
                cost_ns: 12345,
            }),
            Record::Thread(Thread { thread: 2, tid: 99, stack_hint: 0x7fff_0000 }),
            Record::Allocator { path: "/lib/x86_64-linux-gnu/libc.so.6".into() },
            Record::Metrics(Metrics {
                monotonic_ns: 123,
                source: "go".into(),
                kind: "sample".into(),
                values: vec![("/memory/classes/heap/free:bytes".into(), 8192.0), ("x[16]".into(), 0.5)],
            }),
            Record::Fork(Fork { parent_pid: 41, parent_image_start_ns: 6, time: 1234, parent_trace: "t.mgt".into() }),
            Record::Topology(crate::numa::Topology {
                nodes: vec![
                    crate::numa::NumaNode { id: 0, cpus: vec![0, 1], memory_bytes: 1 << 30, distances: vec![10, 21] },
                    crate::numa::NumaNode { id: 1, cpus: vec![2, 3], memory_bytes: 1 << 30, distances: vec![21, 10] },
                ],
            }),
            Record::Placement(crate::numa::Placement {
                time: 77,
                page_size: 4096,
                stride: 1,
                error: 0,
                cost_ns: 5,
                mappings: vec![crate::numa::MappingPlacement {
                    start: 0x1000,
                    pages: 4,
                    runs: vec![(crate::numa::NOT_PRESENT, 1), (1, 3)],
                }],
            }),
            Record::MemorySamples(crate::numa::MemorySamples {
                source: crate::numa::SOURCE_PAGE_FAULTS.into(),
                precise_unavailable: "no PMU".into(),
                period: 1,
                start_ns: 10,
                end_ns: 90,
                lost: 2,
                samples: vec![
                    crate::numa::MemorySample { monotonic_ns: 50, pid: 7, tid: 8, cpu: 1, addr: 0x7f00_0000_1000, node: 0, data_source: 0 },
                    crate::numa::MemorySample {
                        monotonic_ns: 40,
                        pid: 7,
                        tid: 9,
                        cpu: 0,
                        addr: 0x1000,
                        node: crate::numa::FAULT,
                        data_source: 3,
                    },
                ],
            }),
            Record::PythonCode(crate::python::PythonCode {
                id: 3,
                first_line: 18,
                line_table_format: crate::python::LINE_TABLE_CPYTHON_311,
                file: "/srv/cache.py".into(),
                qualified_name: "Cache.build.<locals>.<dictcomp>".into(),
                line_table: vec![0x80, 0x00, 0xd8, 0x04],
            }),
        ];
        let mut chunk = Vec::new();
        for r in &records {
            r.encode(&mut chunk);
        }
        Record::encode_events(&mut chunk, 3, 1234, 9, 100, &[1, 2, 3]);
        let decoded: Vec<Record> = Records::new(&chunk).map(Result::unwrap).collect();
        assert_eq!(&decoded[..records.len()], &records[..]);
        assert_eq!(decoded[records.len()], records[2]);
    }

    #[test]
    fn unknown_tags_are_skipped() {
        let mut chunk = Vec::new();
        frame(&mut chunk, 200, &[9, 9, 9]);
        Record::Clock(Clock { time: 1, monotonic_ns: 2 }).encode(&mut chunk);
        let decoded: Vec<Record> = Records::new(&chunk).map(Result::unwrap).collect();
        assert_eq!(decoded, vec![Record::Unknown { tag: 200 }, Record::Clock(Clock { time: 1, monotonic_ns: 2 })]);
    }
}
