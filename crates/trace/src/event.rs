//! Heap events and their per-thread encoding.
//!
//! Each thread appends records to its own buffer; a record is delta-encoded
//! against the previous record of the same buffer (time, address, CPU), so a
//! buffer decodes on its own once its start is known. Layout of one record:
//!
//! ```text
//! header u8      kind (bits 0-3) | SAME_TIME (bit 4) | CPU_CHANGED (bit 5) | HAS_STACK (bit 6) | NEW_STACK (bit 7)
//! time           zigzag varint, ticks since the previous record; only without
//!                SAME_TIME (format 1.0 never set it and always wrote the time)
//! cpu            varint, only when CPU_CHANGED
//! payload        kind-specific varints, see `EventKind`
//! stack          varint, only when HAS_STACK: the thread's id for the call stack
//! frames         only when NEW_STACK: count, then return addresses
//!                (innermost first), each a zigzag delta to the one before
//! ```
//! Addresses are zigzag deltas against the previous address field written.
//! A thread defines each stack id once, in the first event that uses it;
//! ids are per thread (the agent interns stacks without sharing state
//! between threads).

use crate::varint::{self, Cursor, Malformed, zigzag};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum EventKind {
    Malloc = 1,
    Calloc = 2,
    Realloc = 3,
    Free = 4,
    PosixMemalign = 5,
    AlignedAlloc = 6,
    Memalign = 7,
    Valloc = 8,
    Pvalloc = 9,
    Reallocarray = 10,
    Mmap = 11,
    Munmap = 12,
    Mremap = 13,
    Brk = 14,
    Sbrk = 15,
}

impl EventKind {
    pub const ALL: [EventKind; 15] = [
        EventKind::Malloc,
        EventKind::Calloc,
        EventKind::Realloc,
        EventKind::Free,
        EventKind::PosixMemalign,
        EventKind::AlignedAlloc,
        EventKind::Memalign,
        EventKind::Valloc,
        EventKind::Pvalloc,
        EventKind::Reallocarray,
        EventKind::Mmap,
        EventKind::Munmap,
        EventKind::Mremap,
        EventKind::Brk,
        EventKind::Sbrk,
    ];

    pub fn from_u8(value: u8) -> Option<EventKind> {
        EventKind::ALL.get(usize::from(value).wrapping_sub(1)).copied()
    }

    /// The name users know it by: the libc function that produced it.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Malloc => "malloc",
            EventKind::Calloc => "calloc",
            EventKind::Realloc => "realloc",
            EventKind::Free => "free",
            EventKind::PosixMemalign => "posix_memalign",
            EventKind::AlignedAlloc => "aligned_alloc",
            EventKind::Memalign => "memalign",
            EventKind::Valloc => "valloc",
            EventKind::Pvalloc => "pvalloc",
            EventKind::Reallocarray => "reallocarray",
            EventKind::Mmap => "mmap",
            EventKind::Munmap => "munmap",
            EventKind::Mremap => "mremap",
            EventKind::Brk => "brk",
            EventKind::Sbrk => "sbrk",
        }
    }

    /// True for calls that hand out a heap block (realloc counts: it may).
    pub fn is_allocation(self) -> bool {
        matches!(
            self,
            EventKind::Malloc
                | EventKind::Calloc
                | EventKind::Realloc
                | EventKind::PosixMemalign
                | EventKind::AlignedAlloc
                | EventKind::Memalign
                | EventKind::Valloc
                | EventKind::Pvalloc
                | EventKind::Reallocarray
        )
    }

    pub(crate) fn has_alignment(self) -> bool {
        matches!(self, EventKind::PosixMemalign | EventKind::AlignedAlloc | EventKind::Memalign)
    }
}

pub(crate) const KIND_MASK: u8 = 0x0f;
/// Events carry the writer's round: nearly every event has its predecessor's time.
pub(crate) const SAME_TIME: u8 = 0x10;
pub(crate) const CPU_CHANGED: u8 = 0x20;
pub(crate) const HAS_STACK: u8 = 0x40;
pub(crate) const NEW_STACK: u8 = 0x80;

/// No stack was recorded for this event.
pub const NO_STACK: u32 = 0;

/// One decoded event. Fields a kind does not use are zero.
///
/// | kind | addr | size | usable | old_addr | extra |
/// |---|---|---|---|---|---|
/// | malloc, calloc, valloc, pvalloc | block (0 = failed) | requested | usable | | |
/// | posix_memalign, aligned_alloc, memalign | block | requested | usable | | alignment |
/// | realloc, reallocarray | new block | requested | usable | old block | |
/// | free | block | | | | |
/// | mmap | mapping | length | | | prot << 32 \| flags |
/// | munmap | mapping | length | | | |
/// | mremap | new mapping | new length | | old mapping | old length |
/// | brk | new break (result) | | | requested break | |
/// | sbrk | old break (result) | | | | increment (two's complement) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Event {
    pub time: u64,
    pub kind: Option<EventKind>,
    pub cpu: u32,
    pub addr: u64,
    pub size: u64,
    pub usable: u64,
    pub old_addr: u64,
    pub extra: u64,
    pub stack: u32,
}

impl Event {
    pub fn kind(&self) -> EventKind {
        self.kind.unwrap_or(EventKind::Malloc)
    }
}

/// The largest encoded record without stack frames: header + 8 varints.
pub const MAX_RECORD_LEN: usize = 1 + 8 * varint::MAX_VARINT_LEN;

/// The largest encoded record defining a stack of `frames` frames.
pub const fn max_record_len(frames: usize) -> usize {
    MAX_RECORD_LEN + (1 + frames) * varint::MAX_VARINT_LEN
}

/// Delta state shared by the encoder and decoder of one buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeltaState {
    pub time: u64,
    pub addr: u64,
    pub cpu: u32,
}

/// Encodes events into a caller-owned buffer without allocating; used by the
/// agent on the hot path.
pub struct RawEncoder;

impl RawEncoder {
    /// Encodes `event` at `out`, returning the end pointer.
    ///
    /// # Safety
    /// `out` must be valid for [`MAX_RECORD_LEN`] bytes of writes.
    #[inline(always)]
    pub unsafe fn encode(state: &mut DeltaState, out: *mut u8, event: &Event) -> *mut u8 {
        // SAFETY: the caller's contract, which is `encode_with_stack`'s with no stack.
        unsafe { Self::encode_with_stack(state, out, event, None) }
    }

    /// Like [`encode`](Self::encode), and when `new_stack` is given, defines
    /// the event's stack id with those frames.
    ///
    /// # Safety
    /// `out` must be valid for [`max_record_len`]`(frames)` bytes of writes.
    #[inline(always)]
    pub unsafe fn encode_with_stack(state: &mut DeltaState, out: *mut u8, event: &Event, new_stack: Option<&[u64]>) -> *mut u8 {
        // SAFETY: the caller's contract: `out` has room for the longest such record,
        // and each write below stays within it.
        unsafe {
            let kind = event.kind();
            let (mut header, mut p) = time_and_cpu(state, out, event.time, event.cpu);
            header |= kind as u8;
            if new_stack.is_some() && event.stack != NO_STACK {
                header |= NEW_STACK;
            }
            if event.stack != NO_STACK {
                header |= HAS_STACK;
            }
            *out = header;
            match kind {
                EventKind::Free => p = address(state, p, event.addr),
                EventKind::Realloc | EventKind::Reallocarray => {
                    p = address(state, p, event.old_addr);
                    p = address(state, p, event.addr);
                    p = sizes(p, event.size, event.usable);
                }
                EventKind::Mmap => {
                    p = address(state, p, event.addr);
                    p = varint::write_raw(p, event.size);
                    p = varint::write_raw(p, event.extra);
                }
                EventKind::Munmap => {
                    p = address(state, p, event.addr);
                    p = varint::write_raw(p, event.size);
                }
                EventKind::Mremap => {
                    p = address(state, p, event.old_addr);
                    p = varint::write_raw(p, event.extra);
                    p = address(state, p, event.addr);
                    p = varint::write_raw(p, event.size);
                }
                EventKind::Brk => {
                    p = address(state, p, event.old_addr);
                    p = address(state, p, event.addr);
                }
                EventKind::Sbrk => {
                    p = varint::write_raw(p, zigzag(event.extra as i64));
                    p = address(state, p, event.addr);
                }
                _ => {
                    p = address(state, p, event.addr);
                    p = sizes(p, event.size, event.usable);
                    if kind.has_alignment() {
                        p = varint::write_raw(p, event.extra);
                    }
                }
            }
            if header & HAS_STACK != 0 {
                p = varint::write_raw(p, u64::from(event.stack));
            }
            if let (true, Some(frames)) = (header & NEW_STACK != 0, new_stack) {
                p = varint::write_raw(p, frames.len() as u64);
                let mut previous = 0u64;
                for &frame in frames {
                    p = varint::write_raw(p, zigzag(frame.wrapping_sub(previous) as i64));
                    previous = frame;
                }
            }
            p
        }
    }
}

/// Writes a record's time and CPU after its header byte at `out`; returns
/// the header's flags for them and where the payload goes.
///
/// # Safety
/// `out` is valid for the writes of a whole record (header, time, CPU).
#[inline(always)]
unsafe fn time_and_cpu(state: &mut DeltaState, out: *mut u8, time: u64, cpu: u32) -> (u8, *mut u8) {
    // SAFETY: the caller gives room for a whole record, of which this is the start.
    unsafe {
        let mut flags = 0;
        let mut p = out.add(1);
        if time == state.time {
            flags |= SAME_TIME;
        } else {
            p = varint::write_raw(p, zigzag(time.wrapping_sub(state.time) as i64));
            state.time = time;
        }
        if cpu != state.cpu {
            flags |= CPU_CHANGED;
            p = varint::write_raw(p, u64::from(cpu));
            state.cpu = cpu;
        }
        (flags, p)
    }
}

/// An address field: a zigzag delta against the previous address written.
///
/// # Safety
/// `p` is valid for [`varint::MAX_VARINT_LEN`] bytes of writes.
#[inline(always)]
unsafe fn address(state: &mut DeltaState, p: *mut u8, value: u64) -> *mut u8 {
    // SAFETY: the caller's contract: room for a varint at `p`.
    let end = unsafe { varint::write_raw(p, zigzag(value.wrapping_sub(state.addr) as i64)) };
    state.addr = value;
    end
}

/// A block's requested size, then its usable size as a zigzag difference.
///
/// # Safety
/// `p` is valid for two varints' bytes of writes.
#[inline(always)]
unsafe fn sizes(p: *mut u8, size: u64, usable: u64) -> *mut u8 {
    // SAFETY: the caller's contract: room for two varints at `p`.
    unsafe { varint::write_raw(varint::write_raw(p, size), zigzag(usable.wrapping_sub(size) as i64)) }
}

/// Decodes one record; the inverse of [`RawEncoder::encode`]. A stack
/// definition in the record is skipped.
pub fn decode(state: &mut DeltaState, cursor: &mut Cursor<'_>) -> Result<Event, Malformed> {
    decode_with_stack(state, cursor, &mut Vec::new()).map(|(event, _)| event)
}

/// Most frames a stack definition may have; more means corruption.
pub const MAX_FRAMES: u64 = 1024;

/// Decodes one record; when it defines its stack, the frames are put in
/// `frames` and the second value is true.
pub fn decode_with_stack(state: &mut DeltaState, cursor: &mut Cursor<'_>, frames: &mut Vec<u64>) -> Result<(Event, bool), Malformed> {
    let mut event = Event::default();
    decode_into(state, cursor, frames, &mut event).map(|defines_stack| (event, defines_stack))
}

/// [`decode_with_stack`] into a caller's event, which must be zeroed (as
/// [`Event::default`]): the replay decodes in place, saving a copy of the
/// event per record.
#[inline(always)]
pub fn decode_into(state: &mut DeltaState, cursor: &mut Cursor<'_>, frames: &mut Vec<u64>, event: &mut Event) -> Result<bool, Malformed> {
    let (header, kind) = decode_head(state, cursor, event)?;
    decode_payload(&mut Deltas, kind, cursor, &mut state.addr, event)?;
    if header & HAS_STACK != 0 {
        event.stack = u32::try_from(cursor.varint()?).map_err(|_| Malformed)?;
    }
    let defines_stack = header & NEW_STACK != 0;
    if defines_stack {
        decode_frames(cursor, frames)?;
    }
    Ok(defines_stack)
}

/// Decodes the head of a record, the part both encodings share (its header
/// byte's kind, the time and the CPU), into `event`; returns the header byte
/// and the kind.
#[inline(always)]
pub(crate) fn decode_head(state: &mut DeltaState, cursor: &mut Cursor<'_>, event: &mut Event) -> Result<(u8, EventKind), Malformed> {
    let header = cursor.u8()?;
    let kind = EventKind::from_u8(header & KIND_MASK).ok_or(Malformed)?;
    event.kind = Some(kind);
    if header & SAME_TIME == 0 {
        state.time = state.time.wrapping_add(cursor.signed()? as u64);
    }
    event.time = state.time;
    if header & CPU_CHANGED != 0 {
        state.cpu = u32::try_from(cursor.varint()?).map_err(|_| Malformed)?;
    }
    event.cpu = state.cpu;
    Ok((header, kind))
}

/// Where the agent's encoding and the recorder's ([`crate::compact`])
/// differ inside a payload; the rest of its layout, by kind, is
/// [`decode_payload`]'s, which both decode with.
pub(crate) trait BlockCoding {
    /// The block address of a free, from `cursor`; `last` is the address
    /// deltas are against.
    fn freed_block(&mut self, cursor: &mut Cursor<'_>, last: &mut u64) -> Result<u64, Malformed>;

    /// The block address of an allocation other than a realloc, as [`Self::freed_block`].
    fn allocated_block(&mut self, cursor: &mut Cursor<'_>, last: &mut u64) -> Result<u64, Malformed>;

    /// What a block's usable size is written as a difference to.
    fn usable_base(size: u64) -> u64;
}

/// The agent's encoding: every address a delta, usable against the size.
pub(crate) struct Deltas;

impl BlockCoding for Deltas {
    #[inline(always)]
    fn freed_block(&mut self, cursor: &mut Cursor<'_>, last: &mut u64) -> Result<u64, Malformed> {
        delta_address(cursor, last)
    }

    #[inline(always)]
    fn allocated_block(&mut self, cursor: &mut Cursor<'_>, last: &mut u64) -> Result<u64, Malformed> {
        delta_address(cursor, last)
    }

    #[inline(always)]
    fn usable_base(size: u64) -> u64 {
        size
    }
}

/// An address field written as a zigzag delta against `last`, which it becomes.
#[inline(always)]
pub(crate) fn delta_address(cursor: &mut Cursor<'_>, last: &mut u64) -> Result<u64, Malformed> {
    *last = last.wrapping_add(cursor.signed()? as u64);
    Ok(*last)
}

/// Decodes the payload of an event of `kind` into `event`; `last` is the
/// address deltas are against.
#[inline(always)]
pub(crate) fn decode_payload<C: BlockCoding>(
    coding: &mut C,
    kind: EventKind,
    cursor: &mut Cursor<'_>,
    last: &mut u64,
    event: &mut Event,
) -> Result<(), Malformed> {
    match kind {
        EventKind::Free => event.addr = coding.freed_block(cursor, last)?,
        EventKind::Realloc | EventKind::Reallocarray => {
            event.old_addr = delta_address(cursor, last)?;
            event.addr = delta_address(cursor, last)?;
            event.size = cursor.varint()?;
            event.usable = C::usable_base(event.size).wrapping_add(cursor.signed()? as u64);
        }
        EventKind::Mmap => {
            event.addr = delta_address(cursor, last)?;
            event.size = cursor.varint()?;
            event.extra = cursor.varint()?;
        }
        EventKind::Munmap => {
            event.addr = delta_address(cursor, last)?;
            event.size = cursor.varint()?;
        }
        EventKind::Mremap => {
            event.old_addr = delta_address(cursor, last)?;
            event.extra = cursor.varint()?;
            event.addr = delta_address(cursor, last)?;
            event.size = cursor.varint()?;
        }
        EventKind::Brk => {
            event.old_addr = delta_address(cursor, last)?;
            event.addr = delta_address(cursor, last)?;
        }
        EventKind::Sbrk => {
            event.extra = cursor.signed()? as u64;
            event.addr = delta_address(cursor, last)?;
        }
        _ => {
            event.addr = coding.allocated_block(cursor, last)?;
            event.size = cursor.varint()?;
            event.usable = C::usable_base(event.size).wrapping_add(cursor.signed()? as u64);
            if kind.has_alignment() {
                event.extra = cursor.varint()?;
            }
        }
    }
    Ok(())
}

/// A stack definition's frames (count, then zigzag deltas) into `frames`.
#[inline(always)]
pub(crate) fn decode_frames(cursor: &mut Cursor<'_>, frames: &mut Vec<u64>) -> Result<(), Malformed> {
    let count = cursor.varint()?;
    if count > MAX_FRAMES {
        return Err(Malformed);
    }
    frames.clear();
    let mut previous = 0u64;
    for _ in 0..count {
        previous = previous.wrapping_add(cursor.signed()? as u64);
        frames.push(previous);
    }
    Ok(())
}

/// Steps over a stack definition's frames, checking them as
/// [`decode_frames`] does, where their bytes are copied as they are.
#[inline(always)]
pub(crate) fn skip_frames(cursor: &mut Cursor<'_>) -> Result<(), Malformed> {
    let count = cursor.varint()?;
    if count > MAX_FRAMES {
        return Err(Malformed);
    }
    for _ in 0..count {
        cursor.varint()?;
    }
    Ok(())
}

/// Encodes a slice of events into a fresh buffer (tests and tools; the agent
/// uses [`RawEncoder`] directly).
pub fn encode_all(events: &[Event]) -> Vec<u8> {
    let mut state = DeltaState::default();
    let mut out = vec![0u8; events.len() * MAX_RECORD_LEN];
    let mut p = out.as_mut_ptr();
    for event in events {
        // SAFETY: `out` has MAX_RECORD_LEN bytes per event, and `p` advances by one record each.
        p = unsafe { RawEncoder::encode(&mut state, p, event) };
    }
    let len = p as usize - out.as_ptr() as usize;
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn normalized(kind: EventKind, mut e: Event) -> Event {
        e.kind = Some(kind);
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
        e
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        (1u8..=15, any::<u64>(), 0u32..512, any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
            |(k, time, cpu, addr, size, usable, old_addr, extra, stack)| {
                let kind = EventKind::from_u8(k).unwrap();
                normalized(kind, Event { time, kind: Some(kind), cpu, addr, size, usable, old_addr, extra, stack })
            },
        )
    }

    #[test]
    fn an_event_at_the_same_time_omits_it_and_format_1_0_records_still_decode() {
        let event = Event { time: 0, kind: Some(EventKind::Malloc), addr: 0x40, size: 24, usable: 24, ..Event::default() };
        let mut out = [0u8; MAX_RECORD_LEN];
        // SAFETY: `out` is MAX_RECORD_LEN bytes.
        let end = unsafe { RawEncoder::encode(&mut DeltaState::default(), out.as_mut_ptr(), &event) };
        // SAFETY: `end` points into `out`, at or after its start.
        let written = unsafe { end.offset_from(out.as_ptr()) } as usize;
        assert_eq!(&out[..written], &[EventKind::Malloc as u8 | SAME_TIME, 0x80, 0x01, 24, 0]);
        // 1.0 wrote the time delta (0 here) every time.
        let old = [EventKind::Malloc as u8, 0, 0x80, 0x01, 24, 0];
        let decoded = decode_with_stack(&mut DeltaState::default(), &mut Cursor::new(&old), &mut Vec::new()).unwrap().0;
        assert_eq!(decoded, event);
    }

    proptest! {
        #[test]
        fn records_round_trip(events in proptest::collection::vec(arb_event(), 0..200)) {
            let bytes = encode_all(&events);
            let mut cursor = Cursor::new(&bytes);
            let mut state = DeltaState::default();
            for expected in &events {
                prop_assert_eq!(&decode(&mut state, &mut cursor).unwrap(), expected);
            }
            prop_assert!(cursor.is_empty());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut cursor = Cursor::new(&bytes);
            let mut state = DeltaState::default();
            while decode(&mut state, &mut cursor).is_ok() {}
        }
    }

    #[test]
    fn stacks_are_defined_once_then_referenced() {
        let frames = [0x5555_1234u64, 0x5555_1000, 0x7fff_0000_1111];
        let event = Event { time: 5, kind: Some(EventKind::Malloc), addr: 0x1000, size: 8, usable: 24, stack: 3, ..Event::default() };
        let mut out = vec![0u8; 2 * max_record_len(frames.len())];
        let mut state = DeltaState::default();
        let mut p = out.as_mut_ptr();
        // SAFETY: `out` has room for two records, the first with these frames.
        p = unsafe { RawEncoder::encode_with_stack(&mut state, p, &event, Some(&frames)) };
        // SAFETY: as above; `p` is past the first record only.
        p = unsafe { RawEncoder::encode(&mut state, p, &Event { time: 9, ..event }) };
        let len = p as usize - out.as_ptr() as usize;
        let mut cursor = Cursor::new(&out[..len]);
        let mut state = DeltaState::default();
        let mut decoded = Vec::new();
        assert_eq!(decode_with_stack(&mut state, &mut cursor, &mut decoded).unwrap(), (event, true));
        assert_eq!(decoded, frames);
        let (second, defines) = decode_with_stack(&mut state, &mut cursor, &mut decoded).unwrap();
        assert_eq!((second.stack, second.time, defines), (3, 9, false));
        assert!(cursor.is_empty());
    }

    #[test]
    fn typical_malloc_is_compact() {
        let events: Vec<Event> = (0..100u64)
            .map(|i| Event {
                time: 1_000_000 + i * 40,
                kind: Some(EventKind::Malloc),
                addr: 0x5555_0000 + i * 48,
                size: 32,
                usable: 40,
                ..Event::default()
            })
            .collect();
        let bytes = encode_all(&events);
        assert!(bytes.len() / events.len() <= 6, "{} bytes per malloc", bytes.len() / events.len());
    }
}
