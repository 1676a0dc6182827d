//! The shared area between the agent and the recorder: one file per traced
//! process image, mapped by both (the agent maps it once and keeps no
//! descriptor). The agent appends encoded events to chunks of it and
//! publishes committed lengths; the recorder (`memgap run`) drains them,
//! writes the trace, and hands chunks back.
//!
//! Layout: a header (control words, the agent's own address ranges, one slot
//! per thread) of [`HEADER_BYTES`], then chunks of [`CHUNK_BYTES`]. Links
//! between chunks are chunk numbers plus one (0: none), never pointers: the
//! two processes map the area at different addresses.
//!
//! Ownership of every word is single-writer except where noted: a chunk's
//! `state` goes FREE → OWNED by an agent thread's compare-exchange and back
//! to FREE by the recorder's store once it has drained the chunk.
//!
//! Not for: the trace file format ([`crate::records`]).

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

/// Names the layout below. An agent and a recorder of different layouts must
/// not share an area: each would wait on words the other never writes. The
/// number changes with any change to the header's or a chunk header's words
/// or to what they mean (`the_layout_is_the_one_the_magic_names` pins it).
pub const AREA_MAGIC: u64 = u64::from_le_bytes(*b"MGAREA03");
/// Every layout's magic begins so: an area of another memgap's agent.
pub const AREA_MAGIC_FAMILY: &[u8; 6] = b"MGAREA";
pub const CHUNK_BYTES: usize = 64 * 1024;
pub const CHUNK_HEADER: usize = 64;
pub const CHUNK_DATA: usize = CHUNK_BYTES - CHUNK_HEADER;
pub const THREAD_SLOTS: usize = 8192;
pub const AGENT_RANGES: usize = 8192;
/// Control words, ranges and slots, rounded up to a multiple of the chunk size.
pub const HEADER_BYTES: usize = 512 * 1024;
/// Chunks usable from the start; the recorder grows the area on demand.
pub const INITIAL_CHUNKS: u32 = 16;
/// The agent's buffers when `MEMGAP_BUFFER_MB` does not say otherwise.
pub const DEFAULT_BUFFER_MB: u64 = 32;
/// The file name of an area: `<pid>.<n>.area` inside the run's directory
/// (n: the first free number).
pub const AREA_SUFFIX: &str = ".area";

/// A chunk no thread holds.
pub const CHUNK_FREE: u32 = 0;
/// A chunk a thread took (and maybe filled); the recorder frees it.
pub const CHUNK_OWNED: u32 = 1;

pub const SLOT_FREE: u32 = 0;
pub const SLOT_FILLING: u32 = 1;
pub const SLOT_LIVE: u32 = 2;

/// The agent records.
pub const AGENT_RECORDING: u32 = 1;
/// The agent stopped recording (recorder gone or stalled; events dropped).
pub const AGENT_STOPPED: u32 = 2;
/// The agent saw the process end (exit or _exit): everything is committed.
pub const AGENT_FINISHED: u32 = 3;

pub const RECORDER_NONE: u32 = 0;
pub const RECORDER_ATTACHED: u32 = 1;
/// The recorder let go of the area (the run ended): the agent stops.
pub const RECORDER_GONE: u32 = 2;

/// What the agent asks of the recorder, one request at a time.
pub const REQUEST_NONE: u32 = 0;
/// `memgap_snapshot()`: a snapshot now.
pub const REQUEST_SNAPSHOT: u32 = 1;
/// The process is exiting: the last snapshot while its memory is mapped.
pub const REQUEST_EXIT_SNAPSHOT: u32 = 2;
/// VmRSS now (around a malloc_trim); the answer is in `answer_value`.
pub const REQUEST_RSS: u32 = 3;

/// One per thread (or the records channel).
#[repr(C)]
pub struct ThreadSlot {
    pub state: AtomicU32,
    /// Number + 1 of the thread's first chunk.
    pub first_chunk: AtomicU32,
    pub thread: AtomicU32,
    pub tid: AtomicU32,
    pub stack_hint: AtomicU64,
    pub _reserved: AtomicU64,
}

#[repr(C, align(64))]
pub struct Line<T>(pub T);

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub pid: AtomicU32,
    pub ppid: AtomicU32,
    pub run_id: AtomicU64,
    /// Chunks the area can ever hold (its file size).
    pub max_chunks: AtomicU32,
    /// Chunks the buffer budget allows. The recorder backs one more per
    /// live thread, up to `max_chunks`: each thread holds a chunk while it
    /// lives, so a thread that starts while others sit idle on theirs
    /// still finds one, however many threads there are.
    pub budget_chunks: AtomicU32,
    /// Chunks backed by the file now (the recorder grows it); an agent
    /// never touches a chunk past it.
    pub capacity_chunks: AtomicU32,
    /// Set by the agent when it found no free chunk below the capacity.
    pub wants_more: AtomicU32,
    pub agent_state: AtomicU32,
    pub recorder_state: AtomicU32,
    pub exit_code: AtomicI32,
    pub has_exit_code: AtomicU32,
    /// Set before an exec, cleared if it failed: the image may be gone.
    pub exec_pending: AtomicU32,
    pub dropped: AtomicU64,
    /// The agent's mapping of this area (its own memory in snapshots).
    pub agent_address: AtomicU64,
    pub threads_used: AtomicU32,
    /// The program's malloc_trim calls so far (the recorder snapshots after).
    pub trims: AtomicU32,
    /// CLOCK_MONOTONIC when the area was made: orders the images of one pid
    /// (file names are reused once the recorder removed an earlier image's).
    pub created_ns: AtomicU64,
    /// The event clock: rounds of the recorder (see the agent's clock).
    pub clock: Line<AtomicU64>,
    /// The recorder's round count; chunks remember the round they were taken in.
    pub writer_round: Line<AtomicU64>,
    /// Incremented by the recorder each round: the agent's sign of life.
    pub heartbeat: Line<AtomicU64>,
    /// Futex: the agent (or `memgap snap`) bumps it to wake the recorder.
    pub wake: Line<AtomicU32>,
    /// Futex: the recorder bumps it once a round freed or added chunks and
    /// `chunk_waiters` threads of the agent wait for one.
    pub chunks_freed: Line<AtomicU32>,
    pub chunk_waiters: AtomicU32,
    /// The agent's request (`REQUEST_*`) and its sequence number; the
    /// recorder copies the number to `answered` when done (a futex).
    pub request_kind: AtomicU32,
    pub request_seq: AtomicU32,
    pub answered: Line<AtomicU32>,
    pub answer_value: AtomicU64,
    /// `memgap snap PID` requests and the recorder's answers.
    pub snap_requests: AtomicU32,
    pub snap_answered: AtomicU32,
    /// The trace this area is written to (NUL-terminated), for `memgap snap`.
    pub trace_path: [u8; 1024],
    /// A seqlock over `ranges`: odd while the agent changes them.
    pub ranges_seq: Line<AtomicU32>,
    pub ranges_len: AtomicU32,
    pub ranges: [[AtomicU64; 2]; AGENT_RANGES],
    /// Number + 1 of the first chunk of the records channel (PROCESS,
    /// MODULES, NOTE and METRICS records the agent makes).
    pub records_first_chunk: AtomicU32,
    /// CPython's pymalloc, once the agent hooked its arena allocator: the
    /// address (in the program) of the agent's table of live arenas (one
    /// address per entry, 0 for none), its entries, and pymalloc's arena
    /// and pool sizes; all 0 in a process without CPython.
    pub python_arenas: AtomicU64,
    pub python_arena_slots: AtomicU32,
    pub python_pool_bytes: AtomicU32,
    pub python_arena_bytes: AtomicU64,
    pub slots: [ThreadSlot; THREAD_SLOTS],
}

const _: () = assert!(core::mem::size_of::<Header>() <= HEADER_BYTES);

#[repr(C)]
pub struct ChunkHeader {
    pub state: AtomicU32,
    /// Bytes of data committed by the owning thread.
    pub len: AtomicU32,
    /// Number + 1 of the next chunk of the same thread; `len` is final once set.
    pub next: AtomicU32,
    /// Set by the owner when its thread ended after this chunk.
    pub closed: AtomicU32,
    pub thread: AtomicU32,
    pub tid: AtomicU32,
    pub seq: AtomicU32,
    /// How much of the data the recorder has copied out (the recorder's).
    pub emitted: AtomicU32,
    pub taken_in_round: AtomicU64,
    /// The event clock + 1 when the owning thread entered the hook it is
    /// in, 0 when it is in none; kept on the thread's newest chunk (in the
    /// line the thread writes `len` to anyway). An event of that hook may
    /// carry a time that old and still be uncommitted: the recorder holds
    /// back its CLOCK records meanwhile (see the recorder's round).
    pub in_hook_since: AtomicU64,
    /// The thread's running count of usable bytes it allocated less those
    /// it freed (wrapping: a thread freeing others' blocks goes below
    /// zero), carried from chunk to chunk: summed over the threads, the
    /// live heap, which the recorder watches for falls.
    pub live_bytes: AtomicU64,
}

const _: () = assert!(core::mem::size_of::<ChunkHeader>() <= CHUNK_HEADER);

/// Bytes of an area holding `chunks` chunks.
pub const fn area_bytes(chunks: u32) -> usize {
    HEADER_BYTES + chunks as usize * CHUNK_BYTES
}

/// The largest chunk count for a buffer budget of `bytes`.
pub fn chunks_for(bytes: usize) -> u32 {
    (bytes / CHUNK_BYTES).clamp(INITIAL_CHUNKS as usize, 1 << 20) as u32
}

/// A mapped area, seen from either side.
#[derive(Clone, Copy)]
pub struct Area {
    base: *mut u8,
}

// SAFETY: every shared word is atomic; chunk data is read by the recorder
// only up to a length published with release ordering.
unsafe impl Send for Area {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Area {}

impl Area {
    /// # Safety
    /// `base` maps at least [`HEADER_BYTES`] of an area, and the chunks below
    /// `capacity_chunks` once that is read.
    pub unsafe fn from_base(base: *mut u8) -> Area {
        Area { base }
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn header(&self) -> &Header {
        // SAFETY: `from_base`'s contract: `base` maps at least HEADER_BYTES of an
        // area, which starts with the (repr(C), atomic) header.
        unsafe { &*(self.base as *const Header) }
    }

    /// Chunk `index` (not number): the caller keeps it below the capacity.
    pub fn chunk(&self, index: u32) -> &ChunkHeader {
        // SAFETY: within the mapped chunks only for `index` below the capacity, the
        // callers' duty (see the doc); a chunk starts with its atomic header.
        unsafe { &*(self.chunk_ptr(index) as *const ChunkHeader) }
    }

    pub fn chunk_ptr(&self, index: u32) -> *mut u8 {
        // SAFETY: as above: within the mapping for an index below the capacity.
        unsafe { self.base.add(HEADER_BYTES + index as usize * CHUNK_BYTES) }
    }

    pub fn chunk_data(&self, index: u32) -> *mut u8 {
        // SAFETY: as above; the data follows the chunk's header.
        unsafe { self.chunk_ptr(index).add(CHUNK_HEADER) }
    }

    /// The index of the chunk whose data starts at `data`.
    pub fn index_of_data(&self, data: *const u8) -> u32 {
        ((data as usize - self.base as usize - HEADER_BYTES - CHUNK_HEADER) / CHUNK_BYTES) as u32
    }

    /// The trace path the recorder wrote, if any.
    pub fn trace_path(&self) -> &[u8] {
        let path = &self.header().trace_path;
        let len = path.iter().position(|&b| b == 0).unwrap_or(path.len());
        &path[..len]
    }
}

/// Splits a stream of records (`tag len body`) into the complete ones and
/// the length of the partial record at its end.
pub fn complete_records_len(bytes: &[u8]) -> usize {
    let mut at = 0;
    loop {
        let Some(&_tag) = bytes.get(at) else { return at };
        let mut cursor = crate::varint::Cursor::new(&bytes[at + 1..]);
        let Ok(len) = cursor.varint() else { return at };
        let end = (at + 1 + cursor.position()).saturating_add(len as usize);
        if end > bytes.len() {
            return at;
        }
        at = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_the_one_the_magic_names() {
        // A failure here means the layout changed: give AREA_MAGIC the next
        // number, then update these figures.
        let layout = (
            core::mem::size_of::<Header>(),
            core::mem::offset_of!(Header, slots),
            core::mem::size_of::<ThreadSlot>(),
            core::mem::size_of::<ChunkHeader>(),
        );
        assert_eq!((AREA_MAGIC.to_le_bytes(), layout), (*b"MGAREA03", (395_008, 132_840, 32, 56)));
    }

    #[test]
    fn a_partial_record_at_the_end_is_left_for_later() {
        let mut raw = Vec::new();
        crate::records::Record::Note { time: 1, text: "one".into() }.encode(&mut raw);
        let whole = raw.len();
        crate::records::Record::Note { time: 2, text: "two two".into() }.encode(&mut raw);
        for cut in 0..raw.len() {
            let expected = if cut < whole {
                0
            } else if cut < raw.len() {
                whole
            } else {
                raw.len()
            };
            assert_eq!(complete_records_len(&raw[..cut]), expected, "cut at {cut}");
        }
        assert_eq!(complete_records_len(&raw), raw.len());
    }

    #[test]
    fn the_header_fits() {
        assert!(core::mem::size_of::<Header>() < HEADER_BYTES);
        assert_eq!(HEADER_BYTES % 4096, 0);
    }
}
