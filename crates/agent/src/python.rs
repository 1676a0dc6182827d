//! CPython's pymalloc. When the program is a CPython 3.8+ interpreter (its
//! API is in the global symbol scope: the executable exports it, or
//! libpython is loaded), the agent puts itself in front of pymalloc's arena
//! allocator with `PyObject_SetArenaAllocator` before the interpreter
//! starts, chaining to the allocator that was there. It keeps a table of
//! the live arenas and publishes where it is in the shared area; at each
//! snapshot the recorder reads the pool headers of those arenas from
//! outside (the counts pymalloc itself keeps), so nothing runs per object
//! allocation. Each arena's mmap is recorded with the call stack (Python
//! frames included) that needed the arena, so blame can give the arena's
//! blocks and free space to the line whose objects filled it.
//!
//! The object and mem domains are left alone on purpose: a wrapper there
//! makes CPython believe pymalloc is off (`sys._debugmallocstats()` then
//! prints nothing of it) and costs a hook call per Python object.

use core::ffi::{CStr, c_char, c_void};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

use memgap_trace::records::Record;

use crate::{area, buffers, clock};

/// Live arenas the table holds at most (64 GiB of 1 MiB arenas).
const SLOTS: usize = 1 << 16;

static ARENAS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Entries ever used: the recorder reads this many (mirrored in the area).
static USED: AtomicUsize = AtomicUsize::new(0);
static ARENA_BYTES: AtomicU64 = AtomicU64::new(0);
static POOL_BYTES: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static ALLOCATOR_NOTED: AtomicBool = AtomicBool::new(false);
static CURRENT_ALLOCATOR_NAME: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// CPython's `PyObjectArenaAllocator`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ArenaAllocator {
    ctx: *mut c_void,
    alloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize)>,
}

struct Previous(core::cell::UnsafeCell<ArenaAllocator>);
// SAFETY: written once in `install`, before the interpreter starts; read after.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(core::cell::UnsafeCell::new(ArenaAllocator { ctx: core::ptr::null_mut(), alloc: None, free: None }));

/// `name` in the global scope. A failed lookup leaves an error string
/// glibc mallocs and frees at the thread's next failed lookup (the
/// program's, recorded): the second `dlerror` frees it here, unrecorded
/// like its allocation.
fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; dlsym only looks it up.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if found.is_null() {
        // SAFETY: no precondition; the string dlerror returns is not used.
        unsafe {
            libc::dlerror();
            libc::dlerror();
        }
    }
    found
}

/// "3.11.2 (main, …)" → (3, 11) and "3.11.2".
fn parse_version(text: &[u8]) -> Option<((u32, u32), &[u8])> {
    let end = text.iter().position(|&b| b == b' ').unwrap_or(text.len());
    let number = &text[..end];
    let mut parts = number.split(|&b| b == b'.');
    let major: u32 = core::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let minor_digits: &[u8] = parts.next()?;
    let digits = minor_digits.iter().take_while(|b| b.is_ascii_digit()).count();
    let minor: u32 = core::str::from_utf8(&minor_digits[..digits]).ok()?.parse().ok()?;
    Some(((major, minor), number))
}

/// Hooks pymalloc's arenas when the process is CPython 3.8 or newer. Called
/// once, when the agent is loaded (before `main`, so before the first arena).
pub fn install() {
    if INSTALLED.load(Relaxed) {
        return;
    }
    let (get, set, version) = (symbol(c"PyObject_GetArenaAllocator"), symbol(c"PyObject_SetArenaAllocator"), symbol(c"Py_GetVersion"));
    if get.is_null() || set.is_null() || version.is_null() {
        return;
    }
    // SAFETY: CPython's `Py_GetVersion`, of this C type.
    let version: unsafe extern "C" fn() -> *const c_char = unsafe { core::mem::transmute(version) };
    // SAFETY: callable at any time: it formats a static buffer once.
    let text = unsafe { version() };
    if text.is_null() {
        return;
    }
    // SAFETY: Py_GetVersion returns a NUL-terminated static string.
    let text = unsafe { CStr::from_ptr(text) }.to_bytes();
    let Some(((major, minor), number)) = parse_version(text) else { return };
    if major != 3 || minor < 8 {
        return;
    }
    // 3.10 moved 64-bit builds to 1 MiB arenas of 16 KiB pools; before,
    // 256 KiB arenas of 4 KiB pools.
    let (arena, pool) = if minor >= 10 { (1 << 20, 16 << 10) } else { (256 << 10, 4 << 10) };
    ARENA_BYTES.store(arena, Relaxed);
    POOL_BYTES.store(pool, Relaxed);
    // SAFETY: CPython's `PyObject_GetArenaAllocator`, of this C type.
    let get: unsafe extern "C" fn(*mut ArenaAllocator) = unsafe { core::mem::transmute(get) };
    // SAFETY: CPython's `PyObject_SetArenaAllocator`, of this C type.
    let set: unsafe extern "C" fn(*const ArenaAllocator) = unsafe { core::mem::transmute(set) };
    let mut previous = ArenaAllocator { ctx: core::ptr::null_mut(), alloc: None, free: None };
    // SAFETY: `previous` is a `PyObjectArenaAllocator` (repr(C)) to write.
    unsafe { get(&mut previous) };
    if previous.alloc.is_none() || previous.free.is_none() {
        return;
    }
    // SAFETY: written here once, before `set` below lets CPython call
    // `arena_alloc`/`arena_free` (the only readers), at load time before `main`,
    // while the program has one thread.
    unsafe { *PREVIOUS.0.get() = previous };
    CURRENT_ALLOCATOR_NAME.store(symbol(c"_PyMem_GetCurrentAllocatorName"), Relaxed);
    let ours = ArenaAllocator { ctx: core::ptr::null_mut(), alloc: Some(arena_alloc), free: Some(arena_free) };
    // SAFETY: `ours` is a valid allocator; CPython copies it.
    unsafe { set(&ours) };
    crate::python_frames::install(major, minor, symbol);
    // SAFETY: written here once, before the Release store of INSTALLED; read only
    // after an Acquire load of it sees true.
    let version = unsafe { &mut *VERSION.0.get() };
    let len = number.len().min(version.0.len());
    version.0[..len].copy_from_slice(&number[..len]);
    version.1 = len;
    INSTALLED.store(true, Release);
    publish();
}

/// The interpreter's version ("3.11.2"), for each area's note.
struct Version(core::cell::UnsafeCell<([u8; 64], usize)>);
// SAFETY: written once in `install` before INSTALLED is set; read after.
unsafe impl Sync for Version {}
static VERSION: Version = Version(core::cell::UnsafeCell::new(([0; 64], 0)));

/// Tells the recorder where the arena table is, and notes the version and
/// allocator (again in each new area: a fork child keeps its parent's
/// interpreter and arenas).
pub fn publish() {
    if !INSTALLED.load(Acquire) {
        return;
    }
    let Some(area) = area::get() else { return };
    let note = {
        // SAFETY: INSTALLED is true (Acquire, above): VERSION is written and stays so.
        let version = unsafe { &*VERSION.0.get() };
        let mut note = alloc::string::String::from("python ");
        note.push_str(&alloc::string::String::from_utf8_lossy(&version.0[..version.1]));
        note
    };
    buffers::push_record(&Record::Note { time: clock::now(), text: note });
    if ALLOCATOR_NOTED.swap(false, AcqRel) {
        note_allocator();
    }
    let header = area.header();
    header.python_arena_bytes.store(ARENA_BYTES.load(Relaxed), Relaxed);
    header.python_pool_bytes.store(POOL_BYTES.load(Relaxed) as u32, Relaxed);
    header.python_arena_slots.store(USED.load(Relaxed) as u32, Relaxed);
    header.python_arenas.store(ARENAS.as_ptr() as u64, Release);
}

/// Records which allocator CPython runs with (`pymalloc`, `malloc`,
/// `pymalloc_debug`…: PYTHONMALLOC and `-X dev` choose it before the first
/// arena), once: at the first arena, or at exit for an interpreter that
/// never made one.
pub fn note_allocator() {
    if !INSTALLED.load(Acquire) || ALLOCATOR_NOTED.swap(true, AcqRel) {
        return;
    }
    let name = CURRENT_ALLOCATOR_NAME.load(Relaxed);
    let text = if name.is_null() {
        None
    } else {
        // SAFETY: CPython's `_PyMem_GetCurrentAllocatorName`, of this C type.
        let name: unsafe extern "C" fn() -> *const c_char = unsafe { core::mem::transmute(name) };
        // SAFETY: callable while the interpreter lives; it returns a static name.
        let text = unsafe { name() };
        // SAFETY: a NUL-terminated static string.
        (!text.is_null()).then(|| alloc::string::String::from_utf8_lossy(unsafe { CStr::from_ptr(text) }.to_bytes()).into_owned())
    };
    let mut note = alloc::string::String::from("python allocator ");
    note.push_str(text.as_deref().unwrap_or("custom"));
    buffers::push_record(&Record::Note { time: clock::now(), text: note });
}

/// The thread (`pthread_self`) in `arena_alloc` while the previous
/// allocator maps an arena, 0 when none; and the mapping (address, prot and
/// flags) the mmap hook saw it make.
static MAPPING_THREAD: AtomicUsize = AtomicUsize::new(0);
static MAPPED_ADDRESS: AtomicU64 = AtomicU64::new(0);
static MAPPED_EXTRA: AtomicU64 = AtomicU64::new(0);

/// For the mmap hook: whether this mapping is the arena this thread's
/// `arena_alloc` is making. Then the hook leaves it to `arena_alloc`, which
/// records it with the call stack that needed the arena (the Python line
/// whose objects fill it).
pub fn arena_mapped(address: u64, len: u64, extra: u64) -> bool {
    let thread = MAPPING_THREAD.load(Acquire);
    // SAFETY: no precondition.
    if thread == 0 || len != ARENA_BYTES.load(Relaxed) || thread != unsafe { libc::pthread_self() } as usize {
        return false;
    }
    MAPPED_EXTRA.store(extra, Relaxed);
    MAPPED_ADDRESS.store(address, Relaxed);
    true
}

/// Our `PyObjectArenaAllocator.alloc`: the previous one's, recorded.
///
/// # Safety
/// Called by CPython as an arena allocator's `alloc`, after `install`.
unsafe extern "C" fn arena_alloc(_ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: written once in `install` before CPython could call this.
    let previous = unsafe { *PREVIOUS.0.get() };
    let Some(alloc) = previous.alloc else { return core::ptr::null_mut() };
    // The arena allocator also serves other memory of the interpreter's
    // (3.11's frame stacks, in 16 KiB chunks and up): only pymalloc's
    // arenas, of exactly the arena size, hold pools.
    let is_arena = size as u64 == ARENA_BYTES.load(Relaxed);
    // One thread at a time (interpreters with a GIL each may race here: the
    // others' arenas are recorded by the mmap hook, without their stack).
    // SAFETY: no precondition.
    let me = unsafe { libc::pthread_self() } as usize;
    let watched = is_arena && crate::recorder::is_recording() && MAPPING_THREAD.compare_exchange(0, me, Acquire, Relaxed).is_ok();
    // SAFETY: the previous arena allocator, called as CPython calls ours.
    let address = unsafe { alloc(previous.ctx, size) };
    if watched {
        let mapped = MAPPED_ADDRESS.swap(0, Relaxed);
        let extra = MAPPED_EXTRA.load(Relaxed);
        MAPPING_THREAD.store(0, Release);
        if mapped != 0 {
            // SAFETY: the calling thread's errno.
            let errno = unsafe { *libc::__errno_location() };
            let hook = crate::buffers::enter_hook();
            crate::recorder::record_mapping_with_stack(hook, mapped, size as u64, extra);
            crate::buffers::leave_hook(hook);
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = errno };
        }
    }
    if !address.is_null() && is_arena {
        // SAFETY: the calling thread's errno.
        let errno = unsafe { *libc::__errno_location() };
        insert(address as u64);
        if !ALLOCATOR_NOTED.load(Relaxed) && crate::recorder::is_recording() {
            buffers::while_busy(note_allocator);
        }
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
    }
    address
}

/// Our `PyObjectArenaAllocator.free`.
///
/// # Safety
/// Called by CPython as an arena allocator's `free`: `address` is an arena
/// `arena_alloc` returned, of `size` bytes, no longer used.
unsafe extern "C" fn arena_free(_ctx: *mut c_void, address: *mut c_void, size: usize) {
    // SAFETY: written once in `install` before CPython could call this.
    let previous = unsafe { *PREVIOUS.0.get() };
    // Out of the table first: the recorder must not read an arena being unmapped.
    remove(address as u64);
    if let Some(free) = previous.free {
        // SAFETY: the previous allocator frees the arena it made, as CPython asks.
        unsafe { free(previous.ctx, address, size) };
    }
}

/// Each arena takes a free entry (compare-and-swap: interpreters with a GIL
/// each may allocate arenas at once); a full table leaves the arena out.
fn insert(address: u64) {
    for (index, slot) in ARENAS.iter().enumerate() {
        if slot.load(Relaxed) == 0 && slot.compare_exchange(0, address, Release, Relaxed).is_ok() {
            if USED.fetch_max(index + 1, Relaxed) < index + 1
                && let Some(area) = area::get()
            {
                area.header().python_arena_slots.fetch_max(index as u32 + 1, Relaxed);
            }
            return;
        }
    }
}

fn remove(address: u64) {
    let used = USED.load(Relaxed).min(SLOTS);
    for slot in &ARENAS[..used] {
        if slot.load(Relaxed) == address && slot.compare_exchange(address, 0, Release, Relaxed).is_ok() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_interpreter_version() {
        assert_eq!(parse_version(b"3.11.2 (main, Mar 13 2023, 12:18:29) [GCC 12.2.0]"), Some(((3, 11), &b"3.11.2"[..])));
        assert_eq!(parse_version(b"3.13.0rc1+ (heads/3.13)"), Some(((3, 13), &b"3.13.0rc1+"[..])));
        assert_eq!(parse_version(b"2.7.18"), Some(((2, 7), &b"2.7.18"[..])));
        assert_eq!(parse_version(b"garbage"), None);
    }

    #[test]
    fn arenas_come_and_go_in_the_table() {
        insert(0x7000_0000_0000);
        insert(0x7000_0010_0000);
        remove(0x7000_0000_0000);
        let live: alloc::vec::Vec<u64> = ARENAS[..USED.load(Relaxed)].iter().map(|s| s.load(Relaxed)).filter(|&a| a != 0).collect();
        assert_eq!(live, [0x7000_0010_0000]);
        insert(0x7000_0020_0000);
        assert_eq!(ARENAS[0].load(Relaxed), 0x7000_0020_0000, "a freed entry is reused");
    }
}
