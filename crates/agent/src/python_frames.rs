//! Python frames for allocation stacks, read from the interpreter's own
//! frame state when the allocating thread holds the GIL: CPython 3.11's
//! `tstate->cframe->current_frame` chain of `_PyInterpreterFrame`s, each
//! naming its code object and the instruction it is at. Nothing here calls
//! into the interpreter but two getters that read a pointer (no allocation,
//! no lock), and nothing writes to it.
//!
//! Each code object gets an id the first time a stack names it, and a
//! PYTHON_CODE record with its file, qualified name, first line and line
//! table (lines are resolved offline). A code object freed and another made
//! at its address is told apart by its first line, file, name and line
//! table: any of them differing gives a new id.
//!
//! Only layouts read from the interpreter's headers are walked: other
//! versions get no Python frames.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

use memgap_trace::python::{LINE_TABLE_CPYTHON_311, MAX_CODE_ID, PythonCode, encode_frame};
use memgap_trace::records::Record;

use crate::buffers;

/// Python frames kept per stack at most (the innermost).
pub const MAX_PYTHON_FRAMES: usize = 128;

/// Offsets in CPython 3.11's structures (x86-64; identical in Debian's
/// 3.11.2 and 3.11.7 built from source: Include/cpython/pystate.h,
/// Include/internal/pycore_frame.h, Include/cpython/code.h,
/// Include/cpython/unicodeobject.h, Include/cpython/bytesobject.h).
mod layout_311 {
    pub const OBJECT_TYPE: usize = 8;
    pub const VAR_SIZE: usize = 16;
    pub const TSTATE_CFRAME: usize = 56;
    pub const CFRAME_CURRENT_FRAME: usize = 8;
    pub const FRAME_CODE: usize = 32;
    pub const FRAME_PREVIOUS: usize = 48;
    pub const FRAME_PREV_INSTR: usize = 56;
    pub const FRAME_IS_ENTRY: usize = 68;
    pub const CODE_FIRST_LINE: usize = 72;
    pub const CODE_FILENAME: usize = 112;
    pub const CODE_QUALNAME: usize = 128;
    pub const CODE_LINETABLE: usize = 136;
    pub const CODE_UNITS: usize = 184;
    pub const UNICODE_LENGTH: usize = 16;
    pub const UNICODE_STATE: usize = 32;
    pub const UNICODE_ASCII_DATA: usize = 48;
    pub const UNICODE_COMPACT_DATA: usize = 72;
    pub const BYTES_DATA: usize = 32;
}
use layout_311::*;

static ENABLED: AtomicBool = AtomicBool::new(false);
static CURRENT_TSTATE: AtomicUsize = AtomicUsize::new(0);
static THIS_THREAD_TSTATE: AtomicUsize = AtomicUsize::new(0);
static CODE_TYPE: AtomicUsize = AtomicUsize::new(0);
static UNICODE_TYPE: AtomicUsize = AtomicUsize::new(0);
static BYTES_TYPE: AtomicUsize = AtomicUsize::new(0);

/// Turns Python frames on for a CPython `major.minor` whose layout is known.
pub fn install(major: u32, minor: u32, symbol: impl Fn(&core::ffi::CStr) -> *mut c_void) {
    if (major, minor) != (3, 11) || !crate::stacks::enabled() || !crate::recorder::python_stacks_wanted() {
        return;
    }
    let found = [
        (&CURRENT_TSTATE, symbol(c"_PyThreadState_UncheckedGet")),
        (&THIS_THREAD_TSTATE, symbol(c"PyGILState_GetThisThreadState")),
        (&CODE_TYPE, symbol(c"PyCode_Type")),
        (&UNICODE_TYPE, symbol(c"PyUnicode_Type")),
        (&BYTES_TYPE, symbol(c"PyBytes_Type")),
    ];
    if found.iter().any(|(_, address)| address.is_null()) {
        return;
    }
    for (cell, address) in found {
        cell.store(address as usize, Relaxed);
    }
    ENABLED.store(true, Release);
}

#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

#[inline(always)]
/// # Safety
/// `base + offset` is readable and aligned for `T`: a field of a live
/// interpreter object laid out as `layout_311` says.
unsafe fn read<T: Copy>(base: usize, offset: usize) -> T {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::read((base + offset) as *const T) }
}

/// The calling thread's Python frames, innermost first, as stack values
/// ([`encode_frame`]); 0 when it does not hold the GIL or runs no Python.
#[inline(never)]
pub fn capture(out: &mut [u64]) -> usize {
    if !enabled() {
        return 0;
    }
    // SAFETY: `install` stored CPython's `_PyThreadState_UncheckedGet` here
    // before ENABLED, a function of this C type.
    let current: unsafe extern "C" fn() -> usize = unsafe { core::mem::transmute(CURRENT_TSTATE.load(Relaxed)) };
    // SAFETY: as above, for `PyGILState_GetThisThreadState`.
    let this_thread: unsafe extern "C" fn() -> usize = unsafe { core::mem::transmute(THIS_THREAD_TSTATE.load(Relaxed)) };
    // The GIL's holder, and this thread's own state: equal only on the
    // thread holding the GIL, whose frames cannot change under it.
    // SAFETY: both getters only read a thread-local pointer; callable on any
    // thread, with or without the GIL.
    let tstate = unsafe { current() };
    // SAFETY: as above.
    if tstate == 0 || unsafe { this_thread() } != tstate {
        return 0;
    }
    let code_type = CODE_TYPE.load(Relaxed);
    // SAFETY: `tstate` is this thread's live PyThreadState and this thread holds
    // the GIL, so the interpreter's frames cannot change or go while we read them;
    // the offsets are 3.11's (`install` checked the version).
    let cframe: usize = unsafe { read(tstate, TSTATE_CFRAME) };
    if cframe == 0 {
        return 0;
    }
    // SAFETY: the live `_PyCFrame` of that thread state (non-null).
    let mut frame: usize = unsafe { read(cframe, CFRAME_CURRENT_FRAME) };
    let mut count = 0;
    while frame != 0 && count < out.len() {
        // SAFETY: a live `_PyInterpreterFrame` of the chain (non-null).
        let code: usize = unsafe { read(frame, FRAME_CODE) };
        // SAFETY: a frame's non-null code pointer is a live object, its type at OBJECT_TYPE.
        if code == 0 || unsafe { read::<usize>(code, OBJECT_TYPE) } != code_type {
            break;
        }
        // SAFETY: a live frame, as above.
        let prev_instr: usize = unsafe { read(frame, FRAME_PREV_INSTR) };
        let units = code + CODE_UNITS;
        // A frame being set up points one unit before its code.
        let instruction = (prev_instr >= units).then(|| ((prev_instr - units) / 2) as u32);
        // SAFETY: as above.
        let entry = unsafe { read::<u8>(frame, FRAME_IS_ENTRY) } != 0;
        let Some(id) = code_id(code) else { break };
        out[count] = encode_frame(id, instruction, entry);
        count += 1;
        // SAFETY: as above.
        frame = unsafe { read(frame, FRAME_PREVIOUS) };
    }
    count
}

// ---- code objects ---------------------------------------------------------

const CODE_SLOTS: usize = 1 << 14;
const PROBES: usize = 4;

/// A code object seen in a stack. Written only by the thread holding the
/// GIL (so one at a time); atomics only to keep every access defined.
struct CodeSlot {
    code: AtomicU64,
    fingerprint: AtomicU64,
    id: AtomicU32,
    /// The process generation it was recorded in (a fork child records its
    /// code objects again, into its own trace).
    generation: AtomicU32,
}

static CODES: [CodeSlot; CODE_SLOTS] =
    [const { CodeSlot { code: AtomicU64::new(0), fingerprint: AtomicU64::new(0), id: AtomicU32::new(0), generation: AtomicU32::new(0) } };
        CODE_SLOTS];
static NEXT_CODE_ID: AtomicU32 = AtomicU32::new(1);
static GENERATION: AtomicU32 = AtomicU32::new(1);

/// What tells two code objects at one address apart.
#[inline(always)]
fn fingerprint(code: usize) -> u64 {
    let (first_line, filename, qualname, linetable): (i32, usize, usize, usize) =
        // SAFETY: `code` is a live code object (its type checked by the caller), read
        // under the GIL.
        unsafe { (read(code, CODE_FIRST_LINE), read(code, CODE_FILENAME), read(code, CODE_QUALNAME), read(code, CODE_LINETABLE)) };
    (first_line as u32 as u64) ^ (filename as u64).rotate_left(13) ^ (qualname as u64).rotate_left(29) ^ (linetable as u64).rotate_left(43)
}

/// The id of the code object at `code`, recording it when new.
#[inline(always)]
fn code_id(code: usize) -> Option<u32> {
    let fingerprint = fingerprint(code);
    let generation = GENERATION.load(Relaxed);
    let home = ((code as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 50) as usize;
    let mut free = None;
    for probe in 0..PROBES {
        let slot = &CODES[(home + probe) % CODE_SLOTS];
        let address = slot.code.load(Relaxed);
        if address == code as u64 && slot.fingerprint.load(Relaxed) == fingerprint {
            let id = slot.id.load(Relaxed);
            if slot.generation.load(Relaxed) != generation {
                record_code(code, id);
                slot.generation.store(generation, Relaxed);
            }
            return Some(id);
        }
        if free.is_none() && (address == 0 || address == code as u64) {
            free = Some(slot);
        }
    }
    // A full neighbourhood gives its first slot to the newcomer: the one
    // evicted gets a new id if it comes back.
    let slot = free.unwrap_or(&CODES[home % CODE_SLOTS]);
    let id = NEXT_CODE_ID.fetch_add(1, Relaxed);
    if id > MAX_CODE_ID {
        return None;
    }
    record_code(code, id);
    slot.code.store(code as u64, Relaxed);
    slot.fingerprint.store(fingerprint, Relaxed);
    slot.id.store(id, Relaxed);
    slot.generation.store(generation, Relaxed);
    Some(id)
}

fn record_code(code: usize, id: u32) {
    // SAFETY: `code` is a live code object, read under the GIL (see `capture`).
    let first_line: i32 = unsafe { read(code, CODE_FIRST_LINE) };
    let record = PythonCode {
        id,
        first_line: first_line.max(0) as u32,
        line_table_format: LINE_TABLE_CPYTHON_311,
        // SAFETY: as above.
        file: unicode(unsafe { read(code, CODE_FILENAME) }).unwrap_or_default(),
        // SAFETY: as above.
        qualified_name: unicode(unsafe { read(code, CODE_QUALNAME) }).unwrap_or_default(),
        // SAFETY: as above.
        line_table: bytes(unsafe { read(code, CODE_LINETABLE) }).unwrap_or_default(),
    };
    buffers::push_record(&Record::PythonCode(record));
}

/// Longest file or function name kept, in characters.
const MAX_TEXT: usize = 4096;
/// Longest line table kept.
const MAX_LINE_TABLE: usize = 1 << 20;

/// A `str`'s text, for the compact forms every name and file name takes.
fn unicode(object: usize) -> Option<alloc::string::String> {
    // SAFETY: `object` is a non-null field of a live code object: a live object.
    if object == 0 || unsafe { read::<usize>(object, OBJECT_TYPE) } != UNICODE_TYPE.load(Relaxed) {
        return None;
    }
    // SAFETY: a live `str` (its type checked above).
    let length: isize = unsafe { read(object, UNICODE_LENGTH) };
    // SAFETY: as above.
    let state: u32 = unsafe { read(object, UNICODE_STATE) };
    let (kind, compact, ascii) = ((state >> 2) & 7, state & (1 << 5) != 0, state & (1 << 6) != 0);
    if !compact || length < 0 {
        return None;
    }
    let length = (length as usize).min(MAX_TEXT);
    let data = object + if ascii { UNICODE_ASCII_DATA } else { UNICODE_COMPACT_DATA };
    let mut text = alloc::string::String::with_capacity(length);
    for index in 0..length {
        let point: u32 = match kind {
            // SAFETY: a compact `str` keeps `length` code points of `kind` bytes at
            // `data`; `index < length`.
            1 => unsafe { read::<u8>(data, index) as u32 },
            // SAFETY: as above.
            2 => unsafe { read::<u16>(data, 2 * index) as u32 },
            // SAFETY: as above.
            4 => unsafe { read::<u32>(data, 4 * index) },
            _ => return None,
        };
        text.push(char::from_u32(point).unwrap_or(char::REPLACEMENT_CHARACTER));
    }
    Some(text)
}

fn bytes(object: usize) -> Option<alloc::vec::Vec<u8>> {
    // SAFETY: `object` is a non-null field of a live code object: a live object.
    if object == 0 || unsafe { read::<usize>(object, OBJECT_TYPE) } != BYTES_TYPE.load(Relaxed) {
        return None;
    }
    // SAFETY: a live `bytes` (its type checked above).
    let length: isize = unsafe { read(object, VAR_SIZE) };
    if length < 0 || length as usize > MAX_LINE_TABLE {
        return None;
    }
    // SAFETY: a `bytes` object keeps its `length` bytes at BYTES_DATA.
    let data = unsafe { core::slice::from_raw_parts((object + BYTES_DATA) as *const u8, length as usize) };
    Some(data.to_vec())
}

/// In a fork child: its trace is new, so code objects are recorded again
/// (under the ids they had, which the parent's stacks use too).
pub fn reset_after_fork() {
    GENERATION.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake 3.11 code object, `str` and `bytes` laid out as the interpreter lays them.
    #[repr(C, align(16))]
    struct Fake([u8; 256]);

    #[test]
    fn code_objects_are_named_once_and_a_reused_address_gets_a_new_id() {
        let (code_type, unicode_type, bytes_type) = (0x1000usize, 0x2000usize, 0x3000usize);
        CODE_TYPE.store(code_type, Relaxed);
        UNICODE_TYPE.store(unicode_type, Relaxed);
        BYTES_TYPE.store(bytes_type, Relaxed);
        let mut name = Fake([0; 256]);
        let put = |buf: &mut [u8], offset: usize, value: &[u8]| buf[offset..offset + value.len()].copy_from_slice(value);
        put(&mut name.0, OBJECT_TYPE, &unicode_type.to_le_bytes());
        put(&mut name.0, UNICODE_LENGTH, &4isize.to_le_bytes());
        put(&mut name.0, UNICODE_STATE, &((1u32 << 2) | (1 << 5) | (1 << 6) | (1 << 7)).to_le_bytes());
        put(&mut name.0, UNICODE_ASCII_DATA, b"grow");
        let mut table = Fake([0; 256]);
        put(&mut table.0, OBJECT_TYPE, &bytes_type.to_le_bytes());
        put(&mut table.0, VAR_SIZE, &2isize.to_le_bytes());
        put(&mut table.0, BYTES_DATA, &[0x80, 0x00]);
        assert_eq!(unicode(name.0.as_ptr() as usize).as_deref(), Some("grow"));
        assert_eq!(bytes(table.0.as_ptr() as usize), Some(vec![0x80, 0x00]));
        assert_eq!(unicode(table.0.as_ptr() as usize), None, "a bytes object is no str");

        let mut code = Fake([0; 256]);
        put(&mut code.0, OBJECT_TYPE, &code_type.to_le_bytes());
        put(&mut code.0, CODE_FIRST_LINE, &7i32.to_le_bytes());
        put(&mut code.0, CODE_FILENAME, &(name.0.as_ptr() as usize).to_le_bytes());
        put(&mut code.0, CODE_QUALNAME, &(name.0.as_ptr() as usize).to_le_bytes());
        put(&mut code.0, CODE_LINETABLE, &(table.0.as_ptr() as usize).to_le_bytes());
        let address = code.0.as_ptr() as usize;
        let first = code_id(address).unwrap();
        assert_eq!(code_id(address), Some(first), "the same code object keeps its id");
        // Freed, and another code object made at the same address.
        put(&mut code.0, CODE_FIRST_LINE, &30i32.to_le_bytes());
        let second = code_id(address).unwrap();
        assert_ne!(second, first);
        assert_eq!(code_id(address), Some(second));
    }
}
