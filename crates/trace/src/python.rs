//! Python frames in call stacks. The agent appends the Python frames the
//! interpreter was running to an allocation's native return addresses, each
//! as one 64-bit value no return address can take (bit 63 is set: kernel
//! space), so a stack stays a list of `u64` and readers of format 2.0 see
//! them as addresses no module covers. Each names a code object by the id a
//! PYTHON_CODE record of the same image describes (file, qualified name,
//! first line, line table), and the instruction it was at.
//!
//! ```text
//! bits 63..56  0xF9
//! bit  55      entry: the interpreter was entered from C for this frame (the
//!              outermost Python frame of one run of the eval loop)
//! bits 54..48  image (0 as the agent writes it; the replay sets it to the
//!              image's number, so ids of two images of one trace differ)
//! bits 47..24  code id (from 1)
//! bits 23..0   instruction index (in code units) + 1; 0 when unknown
//! ```

const TAG: u64 = 0xF9 << 56;
const TAG_MASK: u64 = 0xFF << 56;
const ENTRY: u64 = 1 << 55;
const IMAGE_SHIFT: u32 = 48;
const IMAGE_MASK: u64 = 0x7F << IMAGE_SHIFT;
const CODE_SHIFT: u32 = 24;
/// Code ids the encoding can carry.
pub const MAX_CODE_ID: u32 = (1 << 24) - 1;
const INSTRUCTION_MASK: u64 = (1 << 24) - 1;

/// The line table's encoding, by the interpreter that wrote it.
pub const LINE_TABLE_CPYTHON_311: u8 = 1;

/// One Python frame of a stack, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonFrame {
    pub image: u8,
    pub code: u32,
    /// The instruction (code units from the code's start), when known.
    pub instruction: Option<u32>,
    pub entry: bool,
}

/// The value standing for a Python frame in a stack.
#[inline(always)]
pub const fn encode_frame(code: u32, instruction: Option<u32>, entry: bool) -> u64 {
    let instruction = match instruction {
        Some(i) if (i as u64) < INSTRUCTION_MASK => i as u64 + 1,
        _ => 0,
    };
    TAG | if entry { ENTRY } else { 0 } | ((code as u64 & MAX_CODE_ID as u64) << CODE_SHIFT) | instruction
}

pub fn is_python_frame(frame: u64) -> bool {
    frame & TAG_MASK == TAG
}

pub fn decode_frame(frame: u64) -> Option<PythonFrame> {
    if !is_python_frame(frame) {
        return None;
    }
    let instruction = frame & INSTRUCTION_MASK;
    Some(PythonFrame {
        image: ((frame & IMAGE_MASK) >> IMAGE_SHIFT) as u8,
        code: ((frame >> CODE_SHIFT) & MAX_CODE_ID as u64) as u32,
        instruction: (instruction != 0).then(|| instruction as u32 - 1),
        entry: frame & ENTRY != 0,
    })
}

/// `frame` (if a Python frame) marked as of image `image` (mod 128).
pub fn with_image(frame: u64, image: u32) -> u64 {
    if !is_python_frame(frame) {
        return frame;
    }
    (frame & !IMAGE_MASK) | (((image as u64) & 0x7F) << IMAGE_SHIFT)
}

/// A code object the agent saw in a stack: what names its frames.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PythonCode {
    pub id: u32,
    pub first_line: u32,
    /// [`LINE_TABLE_CPYTHON_311`]; readers that do not know the format use `first_line`.
    pub line_table_format: u8,
    pub file: String,
    pub qualified_name: String,
    pub line_table: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_frames_round_trip_and_are_never_addresses() {
        let frame = encode_frame(42, Some(17), true);
        assert!(is_python_frame(frame));
        assert_eq!(decode_frame(frame), Some(PythonFrame { image: 0, code: 42, instruction: Some(17), entry: true }));
        let moved = with_image(frame, 3);
        assert_eq!(decode_frame(moved), Some(PythonFrame { image: 3, code: 42, instruction: Some(17), entry: true }));
        assert_eq!(
            decode_frame(encode_frame(MAX_CODE_ID, None, false)),
            Some(PythonFrame { image: 0, code: MAX_CODE_ID, instruction: None, entry: false })
        );
        for address in [0x5555_5555_1234u64, 0x7fff_ffff_f000, 0x00ff_ffff_ffff_ffff, 0] {
            assert!(!is_python_frame(address));
            assert_eq!(with_image(address, 5), address);
        }
    }
}
