//! LEB128 varints, the integer encoding of every record in a trace.
//!
//! The writer side works on raw pointers because the agent encodes inside
//! malloc hooks and must neither allocate nor bounds-check per byte; the
//! caller guarantees room for [`MAX_VARINT_LEN`] bytes.

pub const MAX_VARINT_LEN: usize = 10;

/// Writes `value` at `out`, returns the pointer past the last byte written.
///
/// # Safety
/// `out` must be valid for [`MAX_VARINT_LEN`] bytes of writes.
#[inline(always)]
pub unsafe fn write_raw(mut out: *mut u8, mut value: u64) -> *mut u8 {
    // SAFETY: the caller's contract: MAX_VARINT_LEN bytes at `out`, the most
    // a u64 takes.
    unsafe {
        while value >= 0x80 {
            *out = (value as u8) | 0x80;
            out = out.add(1);
            value >>= 7;
        }
        *out = value as u8;
        out.add(1)
    }
}

#[inline(always)]
pub fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

#[inline(always)]
pub fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// How many bytes `value` takes as a varint.
pub fn encoded_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros()).div_ceil(7) as usize
}

pub fn push(out: &mut Vec<u8>, value: u64) {
    let mut bytes = [0u8; MAX_VARINT_LEN];
    // SAFETY: `bytes` is MAX_VARINT_LEN long.
    let end = unsafe { write_raw(bytes.as_mut_ptr(), value) };
    let len = end as usize - bytes.as_ptr() as usize;
    out.extend_from_slice(&bytes[..len]);
}

pub fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    push(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A bounds-checked reader over a record body; every read fails cleanly on
/// malformed input instead of panicking.
#[derive(Clone)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    /// A cursor at `pos` in `bytes` (at the end if `pos` is past it).
    pub fn at(bytes: &'a [u8], pos: usize) -> Self {
        Cursor { bytes, pos: pos.min(bytes.len()) }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    /// All the bytes the cursor reads, before its position too.
    pub(crate) fn all(&self) -> &'a [u8] {
        self.bytes
    }

    /// Moves to `pos` (at the end if past it).
    pub(crate) fn seek(&mut self, pos: usize) {
        self.pos = pos.min(self.bytes.len());
    }

    #[inline(always)]
    pub fn u8(&mut self) -> Result<u8, Malformed> {
        let byte = *self.bytes.get(self.pos).ok_or(Malformed)?;
        self.pos += 1;
        Ok(byte)
    }

    /// One-byte values (most deltas in a trace) take the inlined path.
    #[inline(always)]
    pub fn varint(&mut self) -> Result<u64, Malformed> {
        match self.bytes.get(self.pos) {
            Some(&byte) if byte < 0x80 => {
                self.pos += 1;
                Ok(u64::from(byte))
            }
            _ => self.long_varint(),
        }
    }

    /// Up to 8 bytes at once, without a branch per byte (how long an
    /// address delta is varies from record to record, which a per-byte
    /// loop pays for in mispredictions).
    #[inline(always)]
    fn long_varint(&mut self) -> Result<u64, Malformed> {
        if let Some((value, len)) = self.bytes.get(self.pos..self.pos + 8).and_then(varint_in_word) {
            self.pos += len;
            return Ok(value);
        }
        self.varint_bytewise()
    }

    #[inline(never)]
    fn varint_bytewise(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let byte = self.u8()?;
            if shift == 63 && byte > 1 {
                return Err(Malformed);
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
            if shift > 63 {
                return Err(Malformed);
            }
        }
    }

    #[inline(always)]
    pub fn signed(&mut self) -> Result<i64, Malformed> {
        self.varint().map(unzigzag)
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let len = usize::try_from(self.varint()?).map_err(|_| Malformed)?;
        let end = self.pos.checked_add(len).ok_or(Malformed)?;
        let slice = self.bytes.get(self.pos..end).ok_or(Malformed)?;
        self.pos = end;
        Ok(slice)
    }

    /// The next `len` bytes as they are.
    pub fn take(&mut self, len: usize) -> Result<&'a [u8], Malformed> {
        let end = self.pos.checked_add(len).ok_or(Malformed)?;
        let slice = self.bytes.get(self.pos..end).ok_or(Malformed)?;
        self.pos = end;
        Ok(slice)
    }

    pub fn string(&mut self) -> Result<String, Malformed> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.bytes[self.pos.min(self.bytes.len())..];
        self.pos = self.bytes.len();
        rest
    }
}

/// The varint the 8 bytes `chunk` start with, and its length; None when it
/// is longer.
#[inline(always)]
fn varint_in_word(chunk: &[u8]) -> Option<(u64, usize)> {
    let word = u64::from_le_bytes(chunk.try_into().ok()?);
    let ends = !word & 0x8080_8080_8080_8080;
    if ends == 0 {
        return None;
    }
    // The bytes up to the first without its high bit, their 7-bit groups
    // then packed together pairwise. Most long varints (address deltas,
    // sizes) end within 4 bytes: two steps on 32 bits, without the 64-bit
    // masks, do for them.
    let value = if ends as u32 != 0 {
        let ends = ends as u32;
        let mut value = word as u32 & (ends ^ (ends - 1)) & 0x7f7f_7f7f;
        value = (value & 0x007f_007f) | ((value & 0x7f00_7f00) >> 1);
        u64::from((value & 0x0000_3fff) | ((value & 0x3fff_0000) >> 2))
    } else {
        let mut value = word & (ends ^ (ends - 1)) & 0x7f7f_7f7f_7f7f_7f7f;
        value = (value & 0x007f_007f_007f_007f) | ((value & 0x7f00_7f00_7f00_7f00) >> 1);
        value = (value & 0x0000_3fff_0000_3fff) | ((value & 0x3fff_0000_3fff_0000) >> 2);
        (value & 0x0000_0000_0fff_ffff) | ((value & 0x0fff_ffff_0000_0000) >> 4)
    };
    Some((value, (ends.trailing_zeros() as usize + 1) / 8))
}

/// The varint at `*pos` of `bytes`, which must end before `end` (one of
/// several streams laid out in `bytes`), as [`Cursor::varint`] reads it;
/// `*pos` moves past it.
#[inline(always)]
pub(crate) fn varint_before(bytes: &[u8], pos: &mut usize, end: usize) -> Result<u64, Malformed> {
    let at = *pos;
    if at < end
        && let Some(&byte) = bytes.get(at)
        && byte < 0x80
    {
        *pos = at + 1;
        return Ok(u64::from(byte));
    }
    // The word may reach past `end`, into the next stream: only the varint must end before it.
    if let Some((value, len)) = bytes.get(at..at + 8).and_then(varint_in_word) {
        if at + len > end {
            return Err(Malformed);
        }
        *pos = at + len;
        return Ok(value);
    }
    let mut cursor = Cursor::at(bytes.get(..end).ok_or(Malformed)?, at);
    let value = cursor.varint_bytewise()?;
    *pos = cursor.position();
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_round_trip(values in proptest::collection::vec(any::<u64>(), 0..64)) {
            let mut out = Vec::new();
            for &v in &values {
                let before = out.len();
                push(&mut out, v);
                prop_assert_eq!(out.len() - before, encoded_len(v));
            }
            let mut cursor = Cursor::new(&out);
            for &v in &values { prop_assert_eq!(cursor.varint().unwrap(), v); }
            prop_assert!(cursor.is_empty());
        }

        #[test]
        fn zigzag_round_trips(v in any::<i64>()) {
            prop_assert_eq!(unzigzag(zigzag(v)), v);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut cursor = Cursor::new(&bytes);
            while cursor.varint().is_ok() {}
            let mut cursor = Cursor::new(&bytes);
            let _ = cursor.bytes();
        }
    }

    proptest! {
        /// Values of every length, read with and without 8 bytes after them.
        #[test]
        fn varints_round_trip_at_every_length(value in any::<u64>(), bits in 0u32..64, padding in 0usize..10) {
            let value = value >> bits;
            let mut out = Vec::new();
            push(&mut out, value);
            let len = out.len();
            out.extend(std::iter::repeat_n(0xffu8, padding));
            let mut cursor = Cursor::new(&out);
            prop_assert_eq!(cursor.varint(), Ok(value));
            prop_assert_eq!(cursor.position(), len);
        }
    }

    proptest! {
        /// Read from a stream that ends at `end` of a longer buffer: the
        /// same values as a cursor over the stream alone.
        #[test]
        fn varints_before_an_end_read_as_a_cursor_does(bytes in proptest::collection::vec(any::<u8>(), 0..40), end in 0usize..40) {
            let end = end.min(bytes.len());
            let (mut cursor, mut pos) = (Cursor::new(&bytes[..end]), 0);
            loop {
                let expected = cursor.varint();
                prop_assert_eq!(varint_before(&bytes, &mut pos, end), expected);
                if expected.is_err() {
                    break;
                }
                prop_assert_eq!(pos, cursor.position());
            }
        }
    }

    #[test]
    fn rejects_overlong_varints() {
        let bytes = [0xffu8; 11];
        assert_eq!(Cursor::new(&bytes).varint(), Err(Malformed));
    }
}
