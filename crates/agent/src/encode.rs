//! The records nearly every hook writes (a free; an allocation without
//! alignment, with or without a stack id it defined before), byte for byte
//! as [`RawEncoder`](memgap_trace::event::RawEncoder) writes them, in fewer
//! instructions and without branching on each varint's length: a varint
//! of up to four bytes (every address delta within 128 MiB, every size
//! below 256 MiB) is spread into its bytes with shifts and masks and
//! stored in one four-byte write, a longer one (below 2^56) in one
//! eight-byte write. The bytes such a write puts past the varint's end
//! lie within the record's room and are overwritten by the next field,
//! or lie past the published length. Other records go through
//! `RawEncoder`, which the tests below compare these with.

use memgap_trace::event::{DeltaState, EventKind};
use memgap_trace::varint::{self, zigzag};

/// The record header's flags (`memgap_trace::event`'s layout).
const SAME_TIME: u8 = 0x10;
const CPU_CHANGED: u8 = 0x20;
const HAS_STACK: u8 = 0x40;

/// Bytes of a varint below 2^28, by the value's leading zeros as a u32
/// (of `value | 1`), and the continuation bits of those bytes.
const SHORT_LEN: [u8; 32] = {
    let mut len = [0u8; 32];
    let mut zeros = 0;
    while zeros < 32 {
        len[zeros] = (32 - zeros as u32).div_ceil(7) as u8;
        zeros += 1;
    }
    len
};
const SHORT_CONTINUATION: [u32; 5] = [0, 0, 0x80, 0x8080, 0x80_8080];

/// Writes `value` as a LEB128 varint at `out`, returns the end.
///
/// # Safety
/// `out` is valid for [`varint::MAX_VARINT_LEN`] bytes of writes.
#[inline(always)]
unsafe fn write_varint(out: *mut u8, value: u64) -> *mut u8 {
    // SAFETY: (all three) the caller's room of MAX_VARINT_LEN bytes holds a
    // 4- or 8-byte write at `out`, and any varint.
    unsafe {
        if value < 1 << 28 {
            let value = value as u32;
            // The 7-bit groups, one a byte: 14-bit halves into 16-bit lanes,
            // then 7-bit groups into bytes.
            let spread = (value & 0x3fff) | ((value & 0x0fff_c000) << 2);
            let spread = (spread & 0x007f_007f) | ((spread & 0x3f80_3f80) << 1);
            let len = SHORT_LEN[(value | 1).leading_zeros() as usize] as usize;
            // A continuation bit in every byte but the last.
            core::ptr::write_unaligned(out as *mut u32, (spread | SHORT_CONTINUATION[len]).to_le());
            out.add(len)
        } else {
            write_long_varint(out, value)
        }
    }
}

/// [`write_varint`] of a value that is most often below 128 (a size
/// difference, a CPU, a stack id): one byte, or any varint.
///
/// # Safety
/// As [`write_varint`].
#[inline(always)]
unsafe fn write_small_varint(out: *mut u8, value: u64) -> *mut u8 {
    // SAFETY: the caller's room, as `write_varint`'s.
    unsafe {
        if value < 0x80 {
            *out = value as u8;
            out.add(1)
        } else {
            write_varint(out, value)
        }
    }
}

/// A varint of 2^28 or more: an 8-byte write below 2^56.
///
/// # Safety
/// As [`write_varint`].
#[cold]
#[inline(never)]
unsafe fn write_long_varint(out: *mut u8, value: u64) -> *mut u8 {
    if value >= 1 << 56 {
        // SAFETY: the caller's room, as `write_varint`'s.
        return unsafe { varint::write_raw(out, value) };
    }
    let spread = (value & 0x0fff_ffff) | ((value & 0x00ff_ffff_f000_0000) << 4);
    let spread = (spread & 0x0000_3fff_0000_3fff) | ((spread & 0x0fff_c000_0fff_c000) << 2);
    let spread = (spread & 0x007f_007f_007f_007f) | ((spread & 0x3f80_3f80_3f80_3f80) << 1);
    let len = (64 - value.leading_zeros()).div_ceil(7);
    let continuation = 0x0080_8080_8080_8080u64 >> (8 * (8 - len));
    // SAFETY: the caller's room of MAX_VARINT_LEN bytes holds 8 at `out`.
    unsafe {
        core::ptr::write_unaligned(out as *mut u64, (spread | continuation).to_le());
        out.add(len as usize)
    }
}

/// The header's time and CPU part, and the fields after the header.
///
/// # Safety
/// `out` is valid for a whole record's writes.
#[inline(always)]
unsafe fn time_and_cpu(state: &mut DeltaState, out: *mut u8, time: u64, cpu: u32) -> (u8, *mut u8) {
    // SAFETY: the caller's room for a whole record, of which these fields are the start.
    unsafe {
        let mut flags = SAME_TIME;
        let mut p = out.add(1);
        if time != state.time {
            flags = 0;
            p = write_varint(p, zigzag(time.wrapping_sub(state.time) as i64));
            state.time = time;
        }
        if cpu != state.cpu {
            flags |= CPU_CHANGED;
            p = write_small_varint(p, u64::from(cpu));
            state.cpu = cpu;
        }
        (flags, p)
    }
}

/// A free, as `RawEncoder::encode` writes it.
///
/// # Safety
/// `out` is valid for [`memgap_trace::event::MAX_RECORD_LEN`] bytes of writes.
#[inline(always)]
pub unsafe fn free(state: &mut DeltaState, out: *mut u8, time: u64, cpu: u32, addr: u64) -> *mut u8 {
    // SAFETY: the caller's MAX_RECORD_LEN bytes hold the header and three varints.
    unsafe {
        let (flags, p) = time_and_cpu(state, out, time, cpu);
        *out = flags | EventKind::Free as u8;
        let p = write_varint(p, zigzag(addr.wrapping_sub(state.addr) as i64));
        state.addr = addr;
        p
    }
}

/// An allocation without alignment (malloc, calloc, valloc, pvalloc), as
/// `RawEncoder::encode_with_stack` writes it with no new stack: `stack`
/// is 0 (none) or an id the thread defined before.
///
/// # Safety
/// `out` is valid for [`memgap_trace::event::MAX_RECORD_LEN`] bytes of writes.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // The hook's values from its registers: no struct to build and read back.
pub unsafe fn allocation(
    state: &mut DeltaState,
    out: *mut u8,
    kind: EventKind,
    time: u64,
    cpu: u32,
    addr: u64,
    size: u64,
    usable: u64,
    stack: u32,
) -> *mut u8 {
    debug_assert!(matches!(kind, EventKind::Malloc | EventKind::Calloc | EventKind::Valloc | EventKind::Pvalloc));
    // SAFETY: the caller's MAX_RECORD_LEN bytes hold the header and up to seven varints.
    unsafe {
        let (flags, p) = time_and_cpu(state, out, time, cpu);
        *out = flags | kind as u8 | if stack != 0 { HAS_STACK } else { 0 };
        let p = write_varint(p, zigzag(addr.wrapping_sub(state.addr) as i64));
        state.addr = addr;
        let p = write_varint(p, size);
        let p = write_small_varint(p, zigzag(usable.wrapping_sub(size) as i64));
        if stack != 0 { write_small_varint(p, u64::from(stack)) } else { p }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::event::{Event, MAX_RECORD_LEN, RawEncoder};

    /// Values around every varint length's edges, and zigzag's.
    fn values() -> Vec<u64> {
        let mut values = vec![0, 1, 2, 0x7f, 0x80, 0x81, u64::MAX, u64::MAX - 1, 1 << 63];
        for bits in 1..64 {
            let edge = 1u64 << bits;
            values.extend([edge - 1, edge, edge + 1, edge | (edge >> 1), (edge - 1) ^ 0x55]);
        }
        values
    }

    #[test]
    fn varints_are_leb128() {
        for value in values() {
            let writers: &[unsafe fn(*mut u8, u64) -> *mut u8] =
                if value >= 1 << 28 { &[write_varint, write_small_varint, write_long_varint] } else { &[write_varint, write_small_varint] };
            for write in writers {
                let (mut ours, mut theirs) = ([0xaau8; 16], [0xaau8; 16]);
                // SAFETY: 16 bytes each, more than MAX_VARINT_LEN.
                let (end, their_end) = unsafe { (write(ours.as_mut_ptr(), value), varint::write_raw(theirs.as_mut_ptr(), value)) };
                let len = end as usize - ours.as_ptr() as usize;
                assert_eq!(len, their_end as usize - theirs.as_ptr() as usize, "length of {value:#x}");
                assert_eq!(ours[..len], theirs[..len], "bytes of {value:#x}");
            }
        }
    }

    /// Encodes `events` one after another with `ours` and with RawEncoder
    /// (from the same delta state) and compares the bytes.
    fn same_bytes(events: &[Event], ours: impl Fn(&mut DeltaState, *mut u8, &Event) -> *mut u8) {
        let (mut our_state, mut their_state) = (DeltaState::default(), DeltaState::default());
        let (mut our_bytes, mut their_bytes) = (Vec::new(), Vec::new());
        for event in events {
            let (mut a, mut b) = ([0u8; MAX_RECORD_LEN], [0u8; MAX_RECORD_LEN]);
            let end = ours(&mut our_state, a.as_mut_ptr(), event);
            // SAFETY: MAX_RECORD_LEN bytes.
            let their_end = unsafe { RawEncoder::encode(&mut their_state, b.as_mut_ptr(), event) };
            let (ours, theirs) = (&a[..end as usize - a.as_ptr() as usize], &b[..their_end as usize - b.as_ptr() as usize]);
            assert_eq!(ours, theirs, "{event:?}");
            assert_eq!(our_state, their_state, "{event:?}");
            our_bytes.extend_from_slice(ours);
            their_bytes.extend_from_slice(theirs);
        }
        assert_eq!(our_bytes, their_bytes);
    }

    fn events(kinds: &[EventKind], with_stack: bool) -> Vec<Event> {
        let values = values();
        let mut events = Vec::new();
        for (i, &value) in values.iter().enumerate() {
            let other = values[(i * 7 + 3) % values.len()];
            for &kind in kinds {
                events.push(Event {
                    time: if i % 3 == 0 { value } else { (i / 3) as u64 },
                    kind: Some(kind),
                    cpu: if i % 5 == 0 { value as u32 } else { (i % 2) as u32 },
                    addr: value,
                    size: other,
                    usable: if i % 2 == 0 { other.wrapping_add(8) } else { value },
                    stack: if with_stack && kind != EventKind::Free { (other as u32).max(1) } else { 0 },
                    ..Event::default()
                });
            }
        }
        events
    }

    #[test]
    fn frees_are_encoded_as_the_trace_crate_encodes_them() {
        // SAFETY: `same_bytes` gives MAX_RECORD_LEN bytes.
        same_bytes(&events(&[EventKind::Free], false), |state, out, e| unsafe { free(state, out, e.time, e.cpu, e.addr) });
    }

    #[test]
    fn allocations_are_encoded_as_the_trace_crate_encodes_them() {
        let kinds = [EventKind::Malloc, EventKind::Calloc, EventKind::Valloc, EventKind::Pvalloc, EventKind::Free];
        for with_stack in [false, true] {
            // SAFETY: `same_bytes` gives MAX_RECORD_LEN bytes.
            same_bytes(&events(&kinds, with_stack), |state, out, e| unsafe {
                match e.kind() {
                    EventKind::Free => free(state, out, e.time, e.cpu, e.addr),
                    kind => allocation(state, out, kind, e.time, e.cpu, e.addr, e.size, e.usable, e.stack),
                }
            });
        }
    }
}
