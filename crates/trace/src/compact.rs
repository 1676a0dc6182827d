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
//! Each piece decodes on its own (all state starts afresh with it). One record:
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

use crate::event::{self, DeltaState, Event, EventKind, MAX_FRAMES, NO_STACK};
use crate::varint::{Cursor, Malformed, zigzag};

const KIND_MASK: u8 = 0x0f;
const SAME_TIME: u8 = 0x10;
const CPU_CHANGED: u8 = 0x20;
const HAS_STACK: u8 = 0x40;
const REFERENCE: u8 = 0x80;

/// How many recent allocations and frees a reference may name (part of
/// the format: readers keep as many). A reference takes at most two varint
/// bytes.
const RECENT: usize = 1024;

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
        self.addresses[self.pushed % RECENT] = address;
        self.pushed += 1;
        self.pushes_by_hash[index_slot(address)] = self.pushed as u32;
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
}

impl CompactState {
    /// As a fresh state, keeping its buffers.
    pub fn reset(&mut self) {
        self.delta = DeltaState::default();
        self.allocations.clear();
        self.frees.clear();
    }
}

/// A block handed out by an allocation whose address may be a reference.
fn is_plain_allocation(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Malloc
            | EventKind::Calloc
            | EventKind::Valloc
            | EventKind::Pvalloc
            | EventKind::PosixMemalign
            | EventKind::AlignedAlloc
            | EventKind::Memalign
    )
}

fn has_alignment(kind: EventKind) -> bool {
    matches!(kind, EventKind::PosixMemalign | EventKind::AlignedAlloc | EventKind::Memalign)
}

/// A reference `back` takes no more bytes than the address's delta would.
fn shorter_than_delta(state: &CompactState, back: usize, address: u64) -> bool {
    varint_len(back as u64) <= varint_len(zigzag(address.wrapping_sub(state.delta.addr) as i64))
}

fn varint_len(value: u64) -> u32 {
    (64 - (value | 1).leading_zeros()).div_ceil(7)
}

/// Appends `value` as a varint; byte by byte, inlined: a call and a copy
/// per field were most of the recorder's cost per event.
#[inline(always)]
fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[inline(always)]
fn push_address(state: &mut CompactState, out: &mut Vec<u8>, value: u64) {
    put(out, zigzag(value.wrapping_sub(state.delta.addr) as i64));
    state.delta.addr = value;
}

#[inline(always)]
fn push_sizes(out: &mut Vec<u8>, size: u64, usable: u64) {
    put(out, size);
    put(out, zigzag(usable.wrapping_sub(usable_guess(size)) as i64));
}

/// The usable size glibc gives a request of `size` bytes from its heap:
/// the chunk (size and an 8-byte header, rounded up to 16 bytes, at least
/// 32) less its header. Only a guess the usable size is written against:
/// for glibc it is nearly always right (one byte, always the same, which
/// the chunk compression all but removes), for another allocator a few
/// bytes off.
fn usable_guess(size: u64) -> u64 {
    (size.wrapping_add(23) & !15).max(32) - 8
}

/// Appends `event` to `out`; `frames` when the event defines its stack id.
pub fn encode(state: &mut CompactState, out: &mut Vec<u8>, event: &Event, frames: Option<&[u64]>) {
    let kind = event.kind();
    // Room for the longest such record: the pushes below then never grow `out`.
    out.reserve(event::max_record_len(frames.map_or(0, <[u64]>::len)));
    let header_at = out.len();
    out.push(kind as u8);
    let mut header = kind as u8;
    if event.time == state.delta.time {
        header |= SAME_TIME;
    } else {
        put(out, zigzag(event.time.wrapping_sub(state.delta.time) as i64));
        state.delta.time = event.time;
    }
    if event.cpu != state.delta.cpu {
        header |= CPU_CHANGED;
        put(out, u64::from(event.cpu));
        state.delta.cpu = event.cpu;
    }
    if event.stack != NO_STACK {
        header |= HAS_STACK;
    }
    match kind {
        EventKind::Free => {
            match state.allocations.find(event.addr).filter(|&back| shorter_than_delta(state, back, event.addr)) {
                Some(back) => {
                    header |= REFERENCE;
                    put(out, back as u64);
                }
                None => push_address(state, out, event.addr),
            }
            state.frees.push(event.addr);
        }
        kind if is_plain_allocation(kind) => {
            // A failed call (address 0) is not a block to refer to later.
            match state.frees.find(event.addr).filter(|&back| event.addr != 0 && shorter_than_delta(state, back, event.addr)) {
                Some(back) => {
                    header |= REFERENCE;
                    put(out, back as u64);
                }
                None => push_address(state, out, event.addr),
            }
            push_sizes(out, event.size, event.usable);
            if has_alignment(kind) {
                put(out, event.extra);
            }
            if event.addr != 0 {
                state.allocations.push(event.addr);
            }
        }
        EventKind::Realloc | EventKind::Reallocarray => {
            push_address(state, out, event.old_addr);
            push_address(state, out, event.addr);
            push_sizes(out, event.size, event.usable);
        }
        EventKind::Mmap => {
            push_address(state, out, event.addr);
            put(out, event.size);
            put(out, event.extra);
        }
        EventKind::Munmap => {
            push_address(state, out, event.addr);
            put(out, event.size);
        }
        EventKind::Mremap => {
            push_address(state, out, event.old_addr);
            put(out, event.extra);
            push_address(state, out, event.addr);
            put(out, event.size);
        }
        EventKind::Brk => {
            push_address(state, out, event.old_addr);
            push_address(state, out, event.addr);
        }
        EventKind::Sbrk => {
            put(out, zigzag(event.extra as i64));
            push_address(state, out, event.addr);
        }
        _ => unreachable!("every other kind is a plain allocation"),
    }
    if event.stack != NO_STACK {
        let defines = frames.is_some();
        put(out, u64::from(event.stack) << 1 | u64::from(defines));
        if let Some(frames) = frames {
            put(out, frames.len() as u64);
            let mut previous = 0u64;
            for &frame in frames {
                put(out, zigzag(frame.wrapping_sub(previous) as i64));
                previous = frame;
            }
        }
    }
    out[header_at] = header;
}

/// Re-encodes the agent's records `agent_records` (decoded with the
/// agent's delta state `agent`, carried from the piece before in the same
/// buffer) into `out`, starting `state` afresh. Returns how many
/// bytes of `agent_records` it took: all of them, or those before the
/// first record that does not decode (the caller drops the rest).
pub fn transcode(
    agent: &mut DeltaState,
    state: &mut CompactState,
    agent_records: &[u8],
    out: &mut Vec<u8>,
    frames: &mut Vec<u64>,
) -> usize {
    state.reset();
    let mut cursor = Cursor::new(agent_records);
    let mut taken = 0;
    while !cursor.is_empty() {
        let mut event = Event::default();
        match event::decode_into(agent, &mut cursor, frames, &mut event) {
            Ok(defines) => encode(state, out, &event, defines.then_some(&frames[..])),
            Err(Malformed) => break,
        }
        taken = cursor.position();
    }
    taken
}

/// Decodes one record into `event`, which must be zeroed (as
/// [`Event::default`]); the inverse of [`encode`]. When the record defines
/// its stack, the frames are put in `frames` and true is returned.
#[inline]
pub fn decode_into(state: &mut CompactState, cursor: &mut Cursor<'_>, frames: &mut Vec<u64>, event: &mut Event) -> Result<bool, Malformed> {
    let header = cursor.u8()?;
    let kind = EventKind::from_u8(header & KIND_MASK).ok_or(Malformed)?;
    event.kind = Some(kind);
    if header & SAME_TIME == 0 {
        state.delta.time = state.delta.time.wrapping_add(cursor.signed()? as u64);
    }
    event.time = state.delta.time;
    if header & CPU_CHANGED != 0 {
        state.delta.cpu = u32::try_from(cursor.varint()?).map_err(|_| Malformed)?;
    }
    event.cpu = state.delta.cpu;
    let delta = |cursor: &mut Cursor<'_>, state: &mut CompactState| -> Result<u64, Malformed> {
        state.delta.addr = state.delta.addr.wrapping_add(cursor.signed()? as u64);
        Ok(state.delta.addr)
    };
    let referenced = header & REFERENCE != 0;
    match kind {
        EventKind::Free => {
            event.addr = if referenced { state.allocations.get(cursor.varint()?)? } else { delta(cursor, state)? };
            state.frees.push(event.addr);
        }
        kind if is_plain_allocation(kind) => {
            event.addr = if referenced { state.frees.get(cursor.varint()?)? } else { delta(cursor, state)? };
            event.size = cursor.varint()?;
            event.usable = usable_guess(event.size).wrapping_add(cursor.signed()? as u64);
            if has_alignment(kind) {
                event.extra = cursor.varint()?;
            }
            if event.addr != 0 {
                state.allocations.push(event.addr);
            }
        }
        _ if referenced => return Err(Malformed),
        EventKind::Realloc | EventKind::Reallocarray => {
            event.old_addr = delta(cursor, state)?;
            event.addr = delta(cursor, state)?;
            event.size = cursor.varint()?;
            event.usable = usable_guess(event.size).wrapping_add(cursor.signed()? as u64);
        }
        EventKind::Mmap => {
            event.addr = delta(cursor, state)?;
            event.size = cursor.varint()?;
            event.extra = cursor.varint()?;
        }
        EventKind::Munmap => {
            event.addr = delta(cursor, state)?;
            event.size = cursor.varint()?;
        }
        EventKind::Mremap => {
            event.old_addr = delta(cursor, state)?;
            event.extra = cursor.varint()?;
            event.addr = delta(cursor, state)?;
            event.size = cursor.varint()?;
        }
        EventKind::Brk => {
            event.old_addr = delta(cursor, state)?;
            event.addr = delta(cursor, state)?;
        }
        EventKind::Sbrk => {
            event.extra = cursor.signed()? as u64;
            event.addr = delta(cursor, state)?;
        }
        _ => return Err(Malformed),
    }
    let mut defines = false;
    if header & HAS_STACK != 0 {
        let value = cursor.varint()?;
        event.stack = u32::try_from(value >> 1).map_err(|_| Malformed)?;
        if event.stack == NO_STACK {
            return Err(Malformed);
        }
        defines = value & 1 != 0;
        if defines {
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
        let addresses = prop_oneof![Just(0u64), 0x5555_0000u64..0x5555_0400, any::<u64>()];
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
                    k if has_alignment(k) => e.old_addr = 0,
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
        /// transcode piece by piece and decode back to the same events.
        #[test]
        fn transcoded_pieces_decode_to_the_agents_events(
            events in proptest::collection::vec(arb_event(), 0..150),
            cuts in proptest::collection::vec(0usize..150, 0..4),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(events.len())).collect();
            cuts.push(events.len());
            cuts.sort_unstable();
            let (mut agent, mut frames, mut decoded) = (DeltaState::default(), Vec::new(), Vec::new());
            let whole = agent_records(&events);
            let (mut at, mut from) = (0, 0);
            for cut in cuts {
                // Where event `cut` starts in the agent's buffer.
                let end = agent_records(&events[..cut]).len();
                let mut piece = Vec::new();
                prop_assert_eq!(transcode(&mut agent, &mut CompactState::default(), &whole[at..end], &mut piece, &mut frames), end - at);
                decoded.extend(decode_all(&piece).unwrap());
                prop_assert_eq!(&decoded[..], &events[..cut], "from {}", from);
                (at, from) = (end, cut);
            }
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
        let taken = transcode(&mut DeltaState::default(), &mut CompactState::default(), &agent_records(&events), &mut out, &mut Vec::new());
        assert_eq!(taken, agent_records(&events).len());
        assert_eq!(decode_all(&out).unwrap(), events);
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
        assert_eq!(transcode(&mut DeltaState::default(), &mut CompactState::default(), &records, &mut out, &mut Vec::new()), good);
        assert_eq!(decode_all(&out).unwrap(), events);
    }
}
