//! The recorder's encoding of heap events (trace format 3): the agent's
//! records ([`crate::event`]) re-encoded outside the program, where a
//! block's address is often named by where it sits among the thread's
//! recent calls instead of by its delta.
//!
//! A block freed soon after it was allocated, and a block handed out again
//! soon after it was freed (an allocator's per-thread caches are last in,
//! first out), are named by a one- or two-byte reference instead of an
//! address delta, when that is no longer. Every address stays recoverable: a
//! reference names an earlier event of the same piece.
//!
//! A piece is laid out in columns (trace format 4): each part of the
//! events (times, references, address deltas, sizes, the other payload,
//! stacks, header bytes) in a stream of its own, which the chunk's zstd
//! codes far better than the parts interleaved, each with its own
//! distribution. Address deltas are written in 16s, as blocks are 16-byte
//! aligned. Pieces in rows, as format 3 wrote them, still decode.
//!
//! Each piece decodes on its own (all state starts afresh with it). One record in rows:
//!
//! ```text
//! header u8      kind (bits 0-3) | SAME_TIME (bit 4) | CPU_CHANGED (bit 5) | HAS_STACK (bit 6) | REFERENCE (bit 7)
//! time           zigzag varint, ticks since the previous record; only without SAME_TIME
//! cpu            varint, only when CPU_CHANGED
//! payload        as in `event`, except the block's address of a free and of a
//!                malloc, calloc, valloc, pvalloc, posix_memalign, aligned_alloc or
//!                memalign: with REFERENCE, a varint n naming the (n+1)-th newest
//!                block of the piece's recent allocations (for a free) or recent
//!                frees (for an allocation); without it, a zigzag delta
//! stack          only with HAS_STACK: varint (id << 1 | defines), then, when it
//!                defines the id, the frame count and frames as in `event`
//! ```

use crate::event::{self, BlockCoding, CPU_CHANGED, DeltaState, Event, EventKind, HAS_STACK, NEW_STACK, NO_STACK, SAME_TIME};
use crate::varint::{self, Cursor, Malformed, zigzag};

/// The header's bits 0-6 are as in the agent's encoding; this one is the recorder's own.
const REFERENCE: u8 = 0x80;

/// How many recent allocations and frees a reference may name (part of
/// the format: readers keep as many). A reference takes at most two varint
/// bytes.
const RECENT: usize = 1024;
const _: () = assert!(RECENT <= 1 << 14, "a reference takes at most two varint bytes");

/// The last [`RECENT`] addresses of one kind of call, newest last.
#[derive(Clone)]
struct Recent {
    addresses: Box<[u64; RECENT]>,
    /// How many were pushed (the newest is at `(pushed - 1) % RECENT`).
    pushed: usize,
    /// The encoder's index: by a hash of the address, the push that last
    /// put an address with that hash (+1; 0: none). A slot two addresses
    /// share names the later; a lookup is checked against the ring.
    pushes_by_hash: Box<[u32; INDEX_SLOTS]>,
}

const INDEX_SLOTS: usize = 4 * RECENT;

impl Default for Recent {
    fn default() -> Self {
        Recent { addresses: Box::new([0; RECENT]), pushed: 0, pushes_by_hash: Box::new([0; INDEX_SLOTS]) }
    }
}

/// Blocks are 16-byte aligned: the bits above those, mixed (Fibonacci hashing).
fn index_slot(address: u64) -> usize {
    ((address >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - INDEX_SLOTS.trailing_zeros())) as usize
}

impl Recent {
    /// Starts afresh, as [`Default`] without giving up the buffers: what
    /// the index still holds names pushes of the new run only when the ring
    /// agrees (see `find`).
    fn clear(&mut self) {
        self.pushed = 0;
    }

    fn push(&mut self, address: u64) {
        self.push_decoded(address);
        self.pushes_by_hash[index_slot(address)] = self.pushed as u32;
    }

    /// [`Self::push`] without the index, which only the encoder reads: its
    /// store to a random place was a quarter of the decoder's time. An index
    /// that misses pushes still only names what the ring agrees with.
    #[inline(always)]
    fn push_decoded(&mut self, address: u64) {
        self.addresses[self.pushed % RECENT] = address;
        self.pushed += 1;
    }

    /// How many pushes back `address` was pushed last (0: the newest),
    /// when it is among the last [`RECENT`] and the index still names it.
    #[inline]
    fn find(&self, address: u64) -> Option<usize> {
        let pushed_as = self.pushes_by_hash[index_slot(address)] as usize;
        let back = self.pushed.wrapping_sub(pushed_as);
        (pushed_as != 0 && back < RECENT && self.addresses[(pushed_as - 1) % RECENT] == address).then_some(back)
    }

    fn get(&self, back: u64) -> Result<u64, Malformed> {
        let back = usize::try_from(back).map_err(|_| Malformed)?;
        if back >= self.pushed.min(RECENT) {
            return Err(Malformed);
        }
        Ok(self.addresses[(self.pushed - 1 - back) % RECENT])
    }
}

/// The state one piece's encoder and decoder share; a fresh one (or one
/// [`reset`](Self::reset)) per piece.
#[derive(Clone, Default)]
pub struct CompactState {
    delta: DeltaState,
    allocations: Recent,
    frees: Recent,
    /// The decoder's place in each stream of a piece in columns (None: in rows).
    columns: Option<Streams>,
    /// The encoder's streams of the piece it writes in columns.
    written: Box<[Vec<u8>; STREAMS]>,
}

impl CompactState {
    /// As a fresh state, keeping its buffers.
    pub fn reset(&mut self) {
        self.delta = DeltaState::default();
        self.allocations.clear();
        self.frees.clear();
        self.columns = None;
    }
}

/// The kinds whose block may be written as a reference: a free, and an
/// allocation other than a realloc.
#[inline(always)]
fn takes_references(kind: EventKind) -> bool {
    // One test of a bit per kind: the decoder asks at every reference.
    const KINDS: u16 = 1 << EventKind::Free as u8
        | 1 << EventKind::Malloc as u8
        | 1 << EventKind::Calloc as u8
        | 1 << EventKind::Valloc as u8
        | 1 << EventKind::Pvalloc as u8
        | 1 << EventKind::PosixMemalign as u8
        | 1 << EventKind::AlignedAlloc as u8
        | 1 << EventKind::Memalign as u8;
    KINDS & 1 << kind as u8 != 0
}

/// A reference `back` (below [`RECENT`]: one varint byte, or two from
/// 128) takes no more bytes than the address's delta to `last` would.
#[inline(always)]
fn shorter_than_delta(last: u64, back: usize, address: u64) -> bool {
    back < 0x80 || zigzag(address.wrapping_sub(last) as i64) >= 0x80
}

/// The usable size glibc gives a request of `size` bytes from its heap:
/// the chunk (size and an 8-byte header, rounded up to 16 bytes, at least
/// 32) less its header. Only a guess the usable size is written against:
/// for glibc it is nearly always right (one byte, always the same, which
/// the chunk compression all but removes), for another allocator a few
/// bytes off.
#[inline(always)]
fn usable_guess(size: u64) -> u64 {
    (size.wrapping_add(23) & !15).max(32) - 8
}

/// Appends `event` to `out` in rows; `frames` when the event defines its
/// stack id. The recorder writes columns ([`transcode`], [`encode_piece`]).
pub fn encode(state: &mut CompactState, out: &mut Vec<u8>, event: &Event, frames: Option<&[u64]>) {
    let defines = frames.is_some() && event.stack != NO_STACK;
    out.reserve(event::max_record_len(frames.map_or(0, <[u64]>::len)));
    // SAFETY: `out` has room past its length for the longest record with
    // these frames; the bytes written become part of its length.
    unsafe {
        let start = out.as_mut_ptr().add(out.len());
        let mut p = encode_raw(state, start, event, defines);
        if let (true, Some(frames)) = (defines, frames) {
            p = varint::write_raw(p, frames.len() as u64);
            let mut previous = 0u64;
            for &frame in frames {
                p = varint::write_raw(p, zigzag(frame.wrapping_sub(previous) as i64));
                previous = frame;
            }
        }
        out.set_len(out.len() + p.offset_from(start) as usize);
    }
}

/// Writes `event` at `out` up to its stack id (the frames, when `defines`,
/// are the caller's to write after it); returns the end. Raw writes: a
/// length check per byte pushed was most of the recorder's cost per event.
///
/// # Safety
/// `out` is valid for [`event::MAX_RECORD_LEN`] bytes of writes.
#[inline(always)]
unsafe fn encode_raw(state: &mut CompactState, out: *mut u8, event: &Event, defines: bool) -> *mut u8 {
    // SAFETY: the caller's contract: room for the longest record without
    // frames, a header byte and at most seven varints, as below.
    unsafe {
        let kind = event.kind();
        let mut header = kind as u8;
        let mut p = out.add(1);
        let delta = &mut state.delta;
        if event.time == delta.time {
            header |= SAME_TIME;
        } else {
            p = varint::write_raw(p, zigzag(event.time.wrapping_sub(delta.time) as i64));
            delta.time = event.time;
        }
        if event.cpu != delta.cpu {
            header |= CPU_CHANGED;
            p = varint::write_raw(p, u64::from(event.cpu));
            delta.cpu = event.cpu;
        }
        let address = |p: *mut u8, last: &mut u64, value: u64| {
            let end = varint::write_raw(p, zigzag(value.wrapping_sub(*last) as i64));
            *last = value;
            end
        };
        let sizes = |p: *mut u8, size: u64, usable: u64| {
            varint::write_raw(varint::write_raw(p, size), zigzag(usable.wrapping_sub(usable_guess(size)) as i64))
        };
        match kind {
            EventKind::Free => {
                match state.allocations.find(event.addr).filter(|&back| shorter_than_delta(delta.addr, back, event.addr)) {
                    Some(back) => {
                        header |= REFERENCE;
                        p = varint::write_raw(p, back as u64);
                    }
                    None => p = address(p, &mut delta.addr, event.addr),
                }
                state.frees.push(event.addr);
            }
            EventKind::Realloc | EventKind::Reallocarray => {
                p = address(p, &mut delta.addr, event.old_addr);
                p = address(p, &mut delta.addr, event.addr);
                p = sizes(p, event.size, event.usable);
            }
            EventKind::Mmap => {
                p = address(p, &mut delta.addr, event.addr);
                p = varint::write_raw(p, event.size);
                p = varint::write_raw(p, event.extra);
            }
            EventKind::Munmap => {
                p = address(p, &mut delta.addr, event.addr);
                p = varint::write_raw(p, event.size);
            }
            EventKind::Mremap => {
                p = address(p, &mut delta.addr, event.old_addr);
                p = varint::write_raw(p, event.extra);
                p = address(p, &mut delta.addr, event.addr);
                p = varint::write_raw(p, event.size);
            }
            EventKind::Brk => {
                p = address(p, &mut delta.addr, event.old_addr);
                p = address(p, &mut delta.addr, event.addr);
            }
            EventKind::Sbrk => {
                p = varint::write_raw(p, zigzag(event.extra as i64));
                p = address(p, &mut delta.addr, event.addr);
            }
            _ => {
                // A failed call (address 0) is not a block to refer to later.
                match state.frees.find(event.addr).filter(|&back| event.addr != 0 && shorter_than_delta(delta.addr, back, event.addr)) {
                    Some(back) => {
                        header |= REFERENCE;
                        p = varint::write_raw(p, back as u64);
                    }
                    None => p = address(p, &mut delta.addr, event.addr),
                }
                p = sizes(p, event.size, event.usable);
                if kind.has_alignment() {
                    p = varint::write_raw(p, event.extra);
                }
                if event.addr != 0 {
                    state.allocations.push(event.addr);
                }
            }
        }
        if event.stack != NO_STACK {
            header |= HAS_STACK;
            p = varint::write_raw(p, u64::from(event.stack) << 1 | u64::from(defines));
        }
        *out = header;
        p
    }
}

/// Re-encodes the agent's records `agent_records` (decoded with the
/// agent's delta state `agent`, carried from the piece before in the same
/// buffer) into `out` as one piece in columns, starting `state` afresh.
/// Returns how many bytes of `agent_records` it took: all of them, or those
/// before the first record that does not decode (the caller drops the
/// rest; nothing is written when that is all of them).
///
/// One pass per record: a stack definition's frames are the same bytes in
/// both encodings, so they are checked and copied, not decoded.
pub fn transcode(agent: &mut DeltaState, state: &mut CompactState, agent_records: &[u8], out: &mut Vec<u8>) -> usize {
    state.reset();
    let mut streams = std::mem::take(&mut state.written);
    streams.iter_mut().for_each(Vec::clear);
    let mut cursor = Cursor::new(agent_records);
    let mut taken = 0;
    'batches: while !cursor.is_empty() {
        // Room for a batch of records in every stream, and for the frames
        // of every stack the rest of the records define: one check per
        // batch instead of one per stream and record.
        for stream in streams.iter_mut() {
            stream.reserve(BATCH * event::MAX_RECORD_LEN);
        }
        let frames_left = agent_records.len() - taken;
        streams[STACKS].reserve(BATCH * event::MAX_RECORD_LEN + frames_left);
        let mut ends: [*mut u8; STREAMS] = std::array::from_fn(|i| {
            // SAFETY: the end of the stream's bytes, within its allocation.
            unsafe { streams[i].as_mut_ptr().add(streams[i].len()) }
        });
        let mut written = 0;
        let outcome = loop {
            if written == BATCH || cursor.is_empty() {
                break true;
            }
            let Ok((event, frames)) = decode_agent_record(agent, &mut cursor) else { break false };
            let frames = frames.map(|(from, to)| &agent_records[from..to]);
            // SAFETY: each stream has room for BATCH records past its
            // length (at most MAX_RECORD_LEN bytes each in any stream),
            // and the stacks' for the frames of the rest of the records.
            unsafe {
                encode_columns_raw(state, &mut ends, &event, frames.is_some());
                if let Some(frames) = frames {
                    std::ptr::copy_nonoverlapping(frames.as_ptr(), ends[STACKS], frames.len());
                    ends[STACKS] = ends[STACKS].add(frames.len());
                }
            }
            written += 1;
            taken = cursor.position();
        };
        for (stream, end) in streams.iter_mut().zip(ends) {
            // SAFETY: the bytes up to `end` were written above, within the capacity.
            unsafe { stream.set_len(end.offset_from(stream.as_ptr()) as usize) };
        }
        if !outcome {
            break 'batches;
        }
    }
    if taken > 0 {
        lay_out(&streams, out);
    }
    state.written = streams;
    taken
}

/// Records encoded per check of the streams' room in [`transcode`].
const BATCH: usize = 256;

/// Writes `events` (each with the frames of the stack it defines) into
/// `out` as one piece in columns, as [`transcode`] does from the agent's
/// records, starting `state` afresh; nothing when there are none.
pub fn encode_piece<'a>(state: &mut CompactState, out: &mut Vec<u8>, events: impl IntoIterator<Item = (&'a Event, Option<&'a [u64]>)>) {
    state.reset();
    let mut streams = std::mem::take(&mut state.written);
    streams.iter_mut().for_each(Vec::clear);
    for (event, frames) in events {
        let defines = frames.is_some() && event.stack != NO_STACK;
        let frames = frames.filter(|_| defines);
        for stream in streams.iter_mut() {
            stream.reserve(event::max_record_len(frames.map_or(0, <[u64]>::len)));
        }
        let mut ends: [*mut u8; STREAMS] = std::array::from_fn(|i| {
            // SAFETY: the end of the stream's bytes, within its allocation.
            unsafe { streams[i].as_mut_ptr().add(streams[i].len()) }
        });
        // SAFETY: each stream has room for the longest record with these
        // frames; the bytes written become part of its length.
        unsafe {
            encode_columns_raw(state, &mut ends, event, defines);
            if let Some(frames) = frames {
                let mut p = varint::write_raw(ends[STACKS], frames.len() as u64);
                let mut previous = 0u64;
                for &frame in frames {
                    p = varint::write_raw(p, zigzag(frame.wrapping_sub(previous) as i64));
                    previous = frame;
                }
                ends[STACKS] = p;
            }
            for (stream, end) in streams.iter_mut().zip(ends) {
                stream.set_len(end.offset_from(stream.as_ptr()) as usize);
            }
        }
    }
    if !streams[HEADERS].is_empty() {
        lay_out(&streams, out);
    }
    state.written = streams;
}

/// The streams of a piece in columns, in the order they are laid out.
const TIMES: usize = 0;
const REFERENCES: usize = 1;
const ADDRESSES: usize = 2;
const SIZES: usize = 3;
const OTHERS: usize = 4;
const STACKS: usize = 5;
const HEADERS: usize = 6;
const STREAMS: usize = 7;

/// The first byte of a piece in columns: no record in rows starts with it
/// (kind 0 is no kind).
const COLUMNS: u8 = 0;

/// Where each stream of a piece in columns is read up to, and where it ends
/// (offsets in the piece; the headers are the caller's cursor).
#[derive(Clone, Copy, Default)]
struct Streams {
    at: [usize; HEADERS],
    end: [usize; HEADERS],
}

/// `out` gets the piece: the marker, the lengths of the streams but the
/// last, the streams.
fn lay_out(streams: &[Vec<u8>; STREAMS], out: &mut Vec<u8>) {
    out.reserve(1 + HEADERS * varint::MAX_VARINT_LEN + streams.iter().map(Vec::len).sum::<usize>());
    out.push(COLUMNS);
    for stream in &streams[..HEADERS] {
        varint::push(out, stream.len() as u64);
    }
    for stream in streams.iter() {
        out.extend_from_slice(stream);
    }
}

/// An address field in columns: blocks are 16-byte aligned, so a delta
/// that is a multiple of 16 is written in 16s, shifted left one bit; any
/// other is a 1, then the zigzag delta.
///
/// # Safety
/// `p` is valid for two varints' bytes of writes.
#[inline(always)]
unsafe fn column_address(p: *mut u8, last: &mut u64, value: u64) -> *mut u8 {
    let delta = value.wrapping_sub(*last) as i64;
    *last = value;
    // SAFETY: the caller's contract: room for two varints at `p`.
    unsafe {
        if delta & 15 == 0 {
            varint::write_raw(p, zigzag(delta >> 4) << 1)
        } else {
            varint::write_raw(varint::write_raw(p, 1), zigzag(delta))
        }
    }
}

/// A reference `back` takes no more bytes than the address's delta to
/// `last` would, in columns.
#[inline(always)]
fn shorter_than_column_delta(last: u64, back: usize, address: u64) -> bool {
    let delta = address.wrapping_sub(last) as i64;
    back < 0x80 || delta & 15 != 0 || zigzag(delta >> 4) >= 0x40
}

/// Writes `event` into the streams at `ends` (each advanced past what it
/// got) up to its stack id (the frames, when `defines`, are the caller's
/// to write after it).
///
/// # Safety
/// Each of `ends` is valid for [`event::MAX_RECORD_LEN`] bytes of writes.
#[inline(always)]
unsafe fn encode_columns_raw(state: &mut CompactState, ends: &mut [*mut u8; STREAMS], event: &Event, defines: bool) {
    // SAFETY: the caller's contract: room in every stream for the longest
    // record without frames; no stream gets more than two varints per field.
    unsafe {
        let kind = event.kind();
        let mut header = kind as u8;
        let delta = &mut state.delta;
        if event.time == delta.time {
            header |= SAME_TIME;
        } else {
            ends[TIMES] = varint::write_raw(ends[TIMES], zigzag(event.time.wrapping_sub(delta.time) as i64));
            delta.time = event.time;
        }
        if event.cpu != delta.cpu {
            header |= CPU_CHANGED;
            ends[TIMES] = varint::write_raw(ends[TIMES], u64::from(event.cpu));
            delta.cpu = event.cpu;
        }
        let write = |ends: &mut [*mut u8; STREAMS], stream: usize, value: u64| ends[stream] = varint::write_raw(ends[stream], value);
        let address =
            |ends: &mut [*mut u8; STREAMS], last: &mut u64, value: u64| ends[ADDRESSES] = column_address(ends[ADDRESSES], last, value);
        let sizes = |ends: &mut [*mut u8; STREAMS], size: u64, usable: u64| {
            write(ends, SIZES, size);
            write(ends, OTHERS, zigzag(usable.wrapping_sub(usable_guess(size)) as i64));
        };
        match kind {
            EventKind::Free => {
                match state.allocations.find(event.addr).filter(|&back| shorter_than_column_delta(delta.addr, back, event.addr)) {
                    Some(back) => {
                        header |= REFERENCE;
                        write(ends, REFERENCES, back as u64);
                    }
                    None => address(ends, &mut delta.addr, event.addr),
                }
                state.frees.push(event.addr);
            }
            EventKind::Realloc | EventKind::Reallocarray => {
                address(ends, &mut delta.addr, event.old_addr);
                address(ends, &mut delta.addr, event.addr);
                sizes(ends, event.size, event.usable);
            }
            EventKind::Mmap => {
                address(ends, &mut delta.addr, event.addr);
                write(ends, SIZES, event.size);
                write(ends, OTHERS, event.extra);
            }
            EventKind::Munmap => {
                address(ends, &mut delta.addr, event.addr);
                write(ends, SIZES, event.size);
            }
            EventKind::Mremap => {
                address(ends, &mut delta.addr, event.old_addr);
                write(ends, OTHERS, event.extra);
                address(ends, &mut delta.addr, event.addr);
                write(ends, SIZES, event.size);
            }
            EventKind::Brk => {
                address(ends, &mut delta.addr, event.old_addr);
                address(ends, &mut delta.addr, event.addr);
            }
            EventKind::Sbrk => {
                write(ends, OTHERS, zigzag(event.extra as i64));
                address(ends, &mut delta.addr, event.addr);
            }
            _ => {
                // A failed call (address 0) is not a block to refer to later.
                match state
                    .frees
                    .find(event.addr)
                    .filter(|&back| event.addr != 0 && shorter_than_column_delta(delta.addr, back, event.addr))
                {
                    Some(back) => {
                        header |= REFERENCE;
                        write(ends, REFERENCES, back as u64);
                    }
                    None => address(ends, &mut delta.addr, event.addr),
                }
                sizes(ends, event.size, event.usable);
                if kind.has_alignment() {
                    write(ends, OTHERS, event.extra);
                }
                if event.addr != 0 {
                    state.allocations.push(event.addr);
                }
            }
        }
        if event.stack != NO_STACK {
            header |= HAS_STACK;
            write(ends, STACKS, u64::from(event.stack) << 1 | u64::from(defines));
        }
        *ends[HEADERS] = header;
        ends[HEADERS] = ends[HEADERS].add(1);
    }
}

/// Whether a piece's `records` are laid out in columns (else in rows).
pub fn in_columns(records: &[u8]) -> bool {
    records.first() == Some(&COLUMNS)
}

/// At the start of a piece (`cursor` at 0): a piece in columns has its
/// streams found and the cursor moved to its headers; one in rows is read
/// as it is.
#[inline(always)]
fn begin_piece(state: &mut CompactState, cursor: &mut Cursor<'_>) -> Result<(), Malformed> {
    state.columns = None;
    let bytes = cursor.all();
    if !in_columns(bytes) {
        return Ok(());
    }
    cursor.seek(1);
    let mut lengths = [0usize; HEADERS];
    for length in &mut lengths {
        *length = usize::try_from(cursor.varint()?).map_err(|_| Malformed)?;
    }
    let mut streams = Streams::default();
    let mut at = cursor.position();
    for (i, length) in lengths.into_iter().enumerate() {
        streams.at[i] = at;
        at = at.checked_add(length).filter(|&end| end <= bytes.len()).ok_or(Malformed)?;
        streams.end[i] = at;
    }
    cursor.seek(at);
    state.columns = Some(streams);
    Ok(())
}

/// A record's stack, written `value` (id << 1 | defines): its id into
/// `event`; whether the record defines it (its frames follow).
#[inline(always)]
fn stack_of(value: u64, event: &mut Event) -> Result<bool, Malformed> {
    event.stack = u32::try_from(value >> 1).map_err(|_| Malformed)?;
    if event.stack == NO_STACK {
        return Err(Malformed);
    }
    Ok(value & 1 != 0)
}

/// A piece's streams being read: its bytes, and where each stream is.
struct ColumnReader<'a, 'b> {
    bytes: &'a [u8],
    streams: &'b mut Streams,
}

impl ColumnReader<'_, '_> {
    /// The next varint of stream `i`.
    #[inline(always)]
    fn varint(&mut self, i: usize) -> Result<u64, Malformed> {
        varint::varint_before(self.bytes, &mut self.streams.at[i], self.streams.end[i])
    }

    #[inline(always)]
    fn signed(&mut self, i: usize) -> Result<i64, Malformed> {
        self.varint(i).map(varint::unzigzag)
    }

    /// Reads stream `i` with a cursor.
    #[inline(always)]
    fn with_cursor<T>(&mut self, i: usize, read: impl FnOnce(&mut Cursor<'_>) -> Result<T, Malformed>) -> Result<T, Malformed> {
        let mut cursor = Cursor::at(self.bytes.get(..self.streams.end[i]).ok_or(Malformed)?, self.streams.at[i]);
        let value = read(&mut cursor)?;
        self.streams.at[i] = cursor.position();
        Ok(value)
    }

    /// The inverse of [`column_address`].
    #[inline(always)]
    fn address(&mut self, last: &mut u64) -> Result<u64, Malformed> {
        let value = self.varint(ADDRESSES)?;
        let delta = match value {
            1 => self.signed(ADDRESSES)?,
            _ if value & 1 == 0 => varint::unzigzag(value >> 1) << 4,
            _ => return Err(Malformed),
        };
        *last = last.wrapping_add(delta as u64);
        Ok(*last)
    }

    /// A block: with a ring (the record has REFERENCE), the one the
    /// references stream names in it, else an address delta.
    #[inline(always)]
    fn block(&mut self, referenced: Option<&Recent>, last: &mut u64) -> Result<u64, Malformed> {
        match referenced {
            Some(ring) => ring.get(self.varint(REFERENCES)?),
            None => self.address(last),
        }
    }
}

/// [`decode_into`] for a record of a piece in columns: the header from
/// `cursor`, the rest from the streams.
#[inline(always)]
fn decode_column_record(
    state: &mut CompactState,
    cursor: &mut Cursor<'_>,
    frames: &mut Vec<u64>,
    event: &mut Event,
) -> Result<bool, Malformed> {
    let header = cursor.u8()?;
    let kind = EventKind::from_u8(header & event::KIND_MASK).ok_or(Malformed)?;
    event.kind = Some(kind);
    let Some(streams) = state.columns.as_mut() else { return Err(Malformed) };
    let mut columns = ColumnReader { bytes: cursor.all(), streams };
    let delta = &mut state.delta;
    if header & SAME_TIME == 0 {
        delta.time = delta.time.wrapping_add(columns.signed(TIMES)? as u64);
    }
    if header & CPU_CHANGED != 0 {
        delta.cpu = u32::try_from(columns.varint(TIMES)?).map_err(|_| Malformed)?;
    }
    event.time = delta.time;
    event.cpu = delta.cpu;
    let referenced = header & REFERENCE != 0;
    if referenced && !takes_references(kind) {
        return Err(Malformed);
    }
    let last = &mut delta.addr;
    match kind {
        EventKind::Free => {
            event.addr = columns.block(referenced.then_some(&state.allocations), last)?;
            state.frees.push_decoded(event.addr);
        }
        EventKind::Realloc | EventKind::Reallocarray => {
            event.old_addr = columns.address(last)?;
            event.addr = columns.address(last)?;
            event.size = columns.varint(SIZES)?;
            event.usable = usable_guess(event.size).wrapping_add(columns.signed(OTHERS)? as u64);
        }
        EventKind::Mmap => {
            event.addr = columns.address(last)?;
            event.size = columns.varint(SIZES)?;
            event.extra = columns.varint(OTHERS)?;
        }
        EventKind::Munmap => {
            event.addr = columns.address(last)?;
            event.size = columns.varint(SIZES)?;
        }
        EventKind::Mremap => {
            event.old_addr = columns.address(last)?;
            event.extra = columns.varint(OTHERS)?;
            event.addr = columns.address(last)?;
            event.size = columns.varint(SIZES)?;
        }
        EventKind::Brk => {
            event.old_addr = columns.address(last)?;
            event.addr = columns.address(last)?;
        }
        EventKind::Sbrk => {
            event.extra = columns.signed(OTHERS)? as u64;
            event.addr = columns.address(last)?;
        }
        _ => {
            event.addr = columns.block(referenced.then_some(&state.frees), last)?;
            event.size = columns.varint(SIZES)?;
            event.usable = usable_guess(event.size).wrapping_add(columns.signed(OTHERS)? as u64);
            if kind.has_alignment() {
                event.extra = columns.varint(OTHERS)?;
            }
            if event.addr != 0 {
                state.allocations.push_decoded(event.addr);
            }
        }
    }
    if header & HAS_STACK != 0 && stack_of(columns.varint(STACKS)?, event)? {
        columns.with_cursor(STACKS, |stacks| event::decode_frames(stacks, frames))?;
        return Ok(true);
    }
    Ok(false)
}

/// One of the agent's records, and where in the cursor's bytes the frames
/// of the stack it defines are (count included), when it defines one the
/// recorder's encoding names (a stack id other than none).
#[inline(always)]
fn decode_agent_record(agent: &mut DeltaState, cursor: &mut Cursor<'_>) -> Result<(Event, Option<(usize, usize)>), Malformed> {
    let mut event = Event::default();
    let (header, kind) = event::decode_head(agent, cursor, &mut event)?;
    event::decode_payload(&mut event::Deltas, kind, cursor, &mut agent.addr, &mut event)?;
    if header & HAS_STACK != 0 {
        event.stack = u32::try_from(cursor.varint()?).map_err(|_| Malformed)?;
    }
    let mut frames = None;
    if header & NEW_STACK != 0 {
        let from = cursor.position();
        event::skip_frames(cursor)?;
        frames = (event.stack != NO_STACK).then_some((from, cursor.position()));
    }
    Ok((event, frames))
}

/// The recorder's encoding of a block: a reference into the piece's recent
/// allocations (for a free) or frees (for an allocation), or a delta.
struct References<'a> {
    referenced: bool,
    allocations: &'a mut Recent,
    frees: &'a mut Recent,
}

impl BlockCoding for References<'_> {
    #[inline(always)]
    fn freed_block(&mut self, cursor: &mut Cursor<'_>, last: &mut u64) -> Result<u64, Malformed> {
        let addr = if self.referenced { self.allocations.get(cursor.varint()?)? } else { event::delta_address(cursor, last)? };
        self.frees.push_decoded(addr);
        Ok(addr)
    }

    #[inline(always)]
    fn allocated_block(&mut self, cursor: &mut Cursor<'_>, last: &mut u64) -> Result<u64, Malformed> {
        let addr = if self.referenced { self.frees.get(cursor.varint()?)? } else { event::delta_address(cursor, last)? };
        if addr != 0 {
            self.allocations.push_decoded(addr);
        }
        Ok(addr)
    }

    #[inline(always)]
    fn usable_base(size: u64) -> u64 {
        usable_guess(size)
    }
}

/// Decodes one record into `event`, which must be zeroed (as
/// [`Event::default`]); the inverse of [`encode`]. When the record defines
/// its stack, the frames are put in `frames` and true is returned. Only
/// the block references and the stack's id are the recorder's own: the rest
/// is decoded as the agent's records are.
#[inline]
pub fn decode_into(state: &mut CompactState, cursor: &mut Cursor<'_>, frames: &mut Vec<u64>, event: &mut Event) -> Result<bool, Malformed> {
    if cursor.position() == 0 {
        begin_piece(state, cursor)?;
    }
    if state.columns.is_some() {
        return decode_column_record(state, cursor, frames, event);
    }
    let (header, kind) = event::decode_head(&mut state.delta, cursor, event)?;
    let referenced = header & REFERENCE != 0;
    if referenced && !takes_references(kind) {
        return Err(Malformed);
    }
    let mut references = References { referenced, allocations: &mut state.allocations, frees: &mut state.frees };
    event::decode_payload(&mut references, kind, cursor, &mut state.delta.addr, event)?;
    let mut defines = false;
    if header & HAS_STACK != 0 {
        defines = stack_of(cursor.varint()?, event)?;
        if defines {
            event::decode_frames(cursor, frames)?;
        }
    }
    Ok(defines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An event, and the frames of the stack it defines.
    type WithFrames = (Event, Option<Vec<u64>>);

    /// Events as the agent records them: fields a kind does not use are zero.
    fn arb_event() -> impl Strategy<Value = WithFrames> {
        let addresses =
            prop_oneof![Just(0u64), 0x5555_0000u64..0x5555_0400, (0x5555_0000u64..0x5555_0400).prop_map(|a| a & !15), any::<u64>()];
        (
            1u8..=15,
            0u64..4,
            0u32..3,
            addresses,
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            0u32..4,
            proptest::collection::vec(any::<u64>(), 0..5),
            any::<bool>(),
        )
            .prop_map(|(k, time, cpu, addr, size, usable, old_addr, extra, stack, frames, defines)| {
                let kind = EventKind::from_u8(k).unwrap();
                let mut e = Event { time, kind: Some(kind), cpu, addr, size, usable, old_addr, extra, stack };
                match kind {
                    EventKind::Free => (e.size, e.usable, e.old_addr, e.extra) = (0, 0, 0, 0),
                    EventKind::Realloc | EventKind::Reallocarray => e.extra = 0,
                    EventKind::Mmap => (e.usable, e.old_addr) = (0, 0),
                    EventKind::Munmap => (e.usable, e.old_addr, e.extra) = (0, 0, 0),
                    EventKind::Mremap => e.usable = 0,
                    EventKind::Brk => (e.size, e.usable, e.extra) = (0, 0, 0),
                    EventKind::Sbrk => (e.size, e.usable, e.old_addr) = (0, 0, 0),
                    k if k.has_alignment() => e.old_addr = 0,
                    _ => (e.old_addr, e.extra) = (0, 0),
                }
                let frames = (defines && stack != NO_STACK).then_some(frames);
                (e, frames)
            })
    }

    /// The agent's encoding of `events`, as one buffer.
    fn agent_records(events: &[WithFrames]) -> Vec<u8> {
        let mut state = DeltaState::default();
        let mut out = vec![0u8; events.iter().map(|(_, f)| event::max_record_len(f.as_ref().map_or(0, Vec::len))).sum()];
        let mut p = out.as_mut_ptr();
        for (e, frames) in events {
            // SAFETY: `out` has room for every record, each at most its max_record_len.
            p = unsafe { event::RawEncoder::encode_with_stack(&mut state, p, e, frames.as_deref()) };
        }
        let len = p as usize - out.as_ptr() as usize;
        out.truncate(len);
        out
    }

    fn decode_all(bytes: &[u8]) -> Result<Vec<WithFrames>, Malformed> {
        let (mut state, mut cursor, mut frames) = (CompactState::default(), Cursor::new(bytes), Vec::new());
        let mut out = Vec::new();
        while !cursor.is_empty() {
            let mut e = Event::default();
            let defines = decode_into(&mut state, &mut cursor, &mut frames, &mut e)?;
            out.push((e, defines.then(|| frames.clone())));
        }
        Ok(out)
    }

    proptest! {
        /// The agent's records, cut into pieces anywhere between records,
        /// transcode piece by piece into what `encode` writes, and decode
        /// back to the same events.
        #[test]
        fn transcoded_pieces_decode_to_the_agents_events(
            events in proptest::collection::vec(arb_event(), 0..150),
            cuts in proptest::collection::vec(0usize..150, 0..4),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(events.len())).collect();
            cuts.push(events.len());
            cuts.sort_unstable();
            let (mut agent, mut decoded) = (DeltaState::default(), Vec::new());
            let whole = agent_records(&events);
            let (mut at, mut from) = (0, 0);
            for cut in cuts {
                // Where event `cut` starts in the agent's buffer.
                let end = agent_records(&events[..cut]).len();
                let mut piece = Vec::new();
                prop_assert_eq!(transcode(&mut agent, &mut CompactState::default(), &whole[at..end], &mut piece), end - at);
                decoded.extend(decode_all(&piece).unwrap());
                prop_assert_eq!(&decoded[..], &events[..cut], "from {}", from);
                // Frames copied as they are, the rest re-encoded: the same bytes as `encode_piece` writes.
                let mut encoded = Vec::new();
                encode_piece(&mut CompactState::default(), &mut encoded, events[from..cut].iter().map(|(e, f)| (e, f.as_deref())));
                prop_assert_eq!(&piece, &encoded);
                // The same events in rows decode alike.
                let mut rows = Vec::new();
                let mut state = CompactState::default();
                for (event, frames) in &events[from..cut] {
                    encode(&mut state, &mut rows, event, frames.as_deref());
                }
                prop_assert_eq!(&decode_all(&rows).unwrap()[..], &events[from..cut]);
                (at, from) = (end, cut);
            }
        }

        /// Bytes after the columns' marker: lengths past the piece, streams
        /// that end early, any header.
        #[test]
        fn garbage_in_columns_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let bytes: Vec<u8> = std::iter::once(COLUMNS).chain(bytes).collect();
            let (mut state, mut cursor, mut frames) = (CompactState::default(), Cursor::new(&bytes), Vec::new());
            while decode_into(&mut state, &mut cursor, &mut frames, &mut Event::default()).is_ok() && !cursor.is_empty() {}
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let (mut state, mut cursor, mut frames) = (CompactState::default(), Cursor::new(&bytes), Vec::new());
            while decode_into(&mut state, &mut cursor, &mut frames, &mut Event::default()).is_ok() && !cursor.is_empty() {}
        }

        /// Every strict prefix of an encoded record fails to decode, never
        /// yields an event.
        #[test]
        fn a_cut_record_is_an_error(event in arb_event()) {
            let mut bytes = Vec::new();
            encode(&mut CompactState::default(), &mut bytes, &event.0, event.1.as_deref());
            for len in 0..bytes.len() {
                let mut cursor = Cursor::new(&bytes[..len]);
                prop_assert!(decode_into(&mut CompactState::default(), &mut cursor, &mut Vec::new(), &mut Event::default()).is_err());
            }
        }
    }

    /// A free of a block allocated just before, and an allocation of a
    /// block freed just before, take one byte for the address, where the
    /// agent wrote a multi-byte delta.
    #[test]
    fn recent_blocks_are_named_by_reference() {
        let malloc = |addr, size| Event { kind: Some(EventKind::Malloc), addr, size, usable: size + 8, ..Event::default() };
        let free = |addr| Event { kind: Some(EventKind::Free), addr, ..Event::default() };
        let (a, b, c) = (0x5555_5555_0000u64, 0x5555_5600_0000u64, 0x7f00_0000_1000u64);
        let events = [malloc(a, 24), malloc(b, 24), malloc(c, 40), free(a), free(c), malloc(c, 40), free(b), malloc(a, 24)];
        let (mut state, mut out) = (CompactState::default(), Vec::new());
        let mut lengths = Vec::new();
        for e in &events {
            let before = out.len();
            encode(&mut state, &mut out, e, None);
            lengths.push(out.len() - before);
        }
        // header, reference, size, usable - size.
        assert_eq!(&lengths[3..], [2, 2, 4, 2, 4]);
        assert!(lengths[..3].iter().all(|&l| l > 4), "{lengths:?}");
        let decoded: Vec<Event> = decode_all(&out).unwrap().into_iter().map(|(e, _)| e).collect();
        assert_eq!(decoded, events);
    }

    /// A piece longer than the rings: references near and far, found
    /// through the encoder's index or not, after the rings wrapped.
    #[test]
    fn long_pieces_round_trip_across_the_rings_wrapping() {
        let mut rng = 3u64;
        let mut live: Vec<u64> = Vec::new();
        let mut events = Vec::new();
        for i in 0..20_000u64 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if live.len() > 2_000 || (!live.is_empty() && rng >> 63 == 1) {
                let at = (rng >> 20) as usize % live.len();
                let addr = live.swap_remove(at);
                events.push((Event { time: i / 7, kind: Some(EventKind::Free), addr, ..Event::default() }, None));
            } else {
                let addr = 0x5555_0000_0000 + (rng >> 40) % 4096 * 16;
                if live.contains(&addr) {
                    continue;
                }
                live.push(addr);
                let size = (rng >> 8) % 600;
                events.push((Event { time: i / 7, kind: Some(EventKind::Malloc), addr, size, usable: size + 8, ..Event::default() }, None));
            }
        }
        let mut out = Vec::new();
        let taken = transcode(&mut DeltaState::default(), &mut CompactState::default(), &agent_records(&events), &mut out);
        assert_eq!(taken, agent_records(&events).len());
        assert_eq!(decode_all(&out).unwrap(), events);
    }

    /// Random churn, as bench/workloads/churn.c does it: a random live block
    /// freed, one of a random size allocated. In columns the chunk's zstd
    /// codes it in far fewer bytes than in rows.
    #[test]
    fn columns_compress_better_than_rows() {
        let mut rng = 5u64;
        let mut next = || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            rng >> 33
        };
        let mut live: Vec<u64> = (0..10_000).map(|i| 0x5555_0000_0000 + i * 528).collect();
        let mut events = Vec::new();
        for i in 0..20_000u64 {
            let at = next() as usize % live.len();
            let freed = live[at];
            events.push(Event { time: i / 1000, kind: Some(EventKind::Free), addr: freed, ..Event::default() });
            let size = 16 + next() % 497;
            // Often the block just freed, else another slot of the heap.
            let addr = if next() % 2 == 0 { freed } else { 0x5555_0000_0000 + next() % 10_000 * 528 };
            live[at] = addr;
            events.push(Event {
                time: i / 1000,
                kind: Some(EventKind::Malloc),
                addr,
                size,
                usable: usable_guess(size),
                ..Event::default()
            });
        }
        let (mut rows, mut columns) = (Vec::new(), Vec::new());
        let mut state = CompactState::default();
        for event in &events {
            encode(&mut state, &mut rows, event, None);
        }
        encode_piece(&mut state, &mut columns, events.iter().map(|e| (e, None)));
        let decoded: Vec<Event> = decode_all(&columns).unwrap().into_iter().map(|(e, _)| e).collect();
        assert_eq!(decoded, events);
        let compressed = |bytes: &[u8]| zstd::bulk::compress(bytes, crate::framing::ZSTD_LEVEL).unwrap().len();
        let (rows, columns) = (compressed(&rows), compressed(&columns));
        assert!(columns * 10 < rows * 9, "rows {rows} bytes, columns {columns}");
    }

    /// A piece in columns whose streams end before its events do, or
    /// whose lengths run past it, is corrupt.
    #[test]
    fn columns_that_do_not_add_up_are_errors() {
        let malloc = Event { kind: Some(EventKind::Malloc), addr: 0x5555_0000_0010, size: 24, usable: 24, ..Event::default() };
        let mut piece = Vec::new();
        encode_piece(&mut CompactState::default(), &mut piece, [(&malloc, None), (&malloc, None)]);
        assert_eq!(decode_all(&piece).unwrap(), [(malloc, None), (malloc, None)]);
        // One more header byte than the streams have fields for.
        let mut longer = piece.clone();
        longer.push(EventKind::Malloc as u8 | SAME_TIME);
        assert!(decode_all(&longer).is_err());
        // The sizes stream claimed longer than the piece.
        assert!(piece.len() < 100);
        let mut past_the_end = piece.clone();
        past_the_end[1 + SIZES] = 100;
        assert!(decode_all(&past_the_end).is_err());
        // An odd address value other than 1.
        let mut odd = Vec::new();
        encode_piece(
            &mut CompactState::default(),
            &mut odd,
            [(&Event { kind: Some(EventKind::Free), addr: 0x30, ..Event::default() }, None)],
        );
        // The delta in 16s, 3, zigzagged (6) and shifted: 12.
        assert_eq!(odd[1 + HEADERS..], [12, EventKind::Free as u8 | SAME_TIME]);
        odd[1 + HEADERS] = 3;
        assert!(decode_all(&odd).is_err());
    }

    /// A reference beyond what the piece holds, or on a kind that takes
    /// none, is corrupt.
    #[test]
    fn impossible_references_are_errors() {
        for bytes in [[EventKind::Free as u8 | SAME_TIME | REFERENCE, 0], [EventKind::Munmap as u8 | SAME_TIME | REFERENCE, 0]] {
            let mut cursor = Cursor::new(&bytes);
            assert!(decode_into(&mut CompactState::default(), &mut cursor, &mut Vec::new(), &mut Event::default()).is_err());
        }
    }

    /// Agent records that stop decoding are cut there: what came before is
    /// transcoded, the rest is reported as not taken.
    #[test]
    fn transcoding_stops_at_a_malformed_agent_record() {
        let events: Vec<WithFrames> =
            (0..3).map(|i| (Event { kind: Some(EventKind::Free), addr: 0x1000 * (i + 1), ..Event::default() }, None)).collect();
        let mut records = agent_records(&events);
        let good = records.len();
        records.push(0); // kind 0 is no kind
        records.extend_from_slice(&agent_records(&events));
        let mut out = Vec::new();
        assert_eq!(transcode(&mut DeltaState::default(), &mut CompactState::default(), &records, &mut out), good);
        assert_eq!(decode_all(&out).unwrap(), events);
    }
}
