//! The allocator the program would have used without us.
//!
//! Each function is looked up with `dlsym(RTLD_NEXT)`, so a jemalloc,
//! tcmalloc or mimalloc preloaded after the agent, or linked by the program,
//! keeps serving the program. `dlsym` itself may call `calloc` before the
//! lookup is done; those few requests come from a static bootstrap arena
//! whose blocks are never handed back (freeing one is a no-op).

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering::*};

pub type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
pub type FreeFn = unsafe extern "C" fn(*mut c_void);
pub type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
pub type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
pub type AlignedFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> usize;
pub type TrimFn = unsafe extern "C" fn(usize) -> i32;
pub type BrkFn = unsafe extern "C" fn(*mut c_void) -> i32;
pub type SbrkFn = unsafe extern "C" fn(isize) -> *mut c_void;
pub type ExitFn = unsafe extern "C" fn(i32) -> !;
type Argv = *const *const libc::c_char;
pub type ExecveFn = unsafe extern "C" fn(*const libc::c_char, Argv, Argv) -> i32;
pub type FexecveFn = unsafe extern "C" fn(i32, Argv, Argv) -> i32;
pub type ExecveatFn = unsafe extern "C" fn(i32, *const libc::c_char, Argv, Argv, i32) -> i32;

pub struct Real {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub calloc: CallocFn,
    pub realloc: ReallocFn,
    pub posix_memalign: PosixMemalignFn,
    pub aligned_alloc: AlignedFn,
    pub memalign: AlignedFn,
    pub valloc: MallocFn,
    pub pvalloc: MallocFn,
    pub malloc_usable_size: UsableSizeFn,
    pub malloc_trim: TrimFn,
    pub brk: BrkFn,
    pub sbrk: SbrkFn,
    pub exit: ExitFn,
    pub execve: ExecveFn,
    pub execvpe: ExecveFn,
    pub fexecve: FexecveFn,
    pub execveat: ExecveatFn,
}

unsafe extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_valloc(size: usize) -> *mut c_void;
    fn __libc_pvalloc(size: usize) -> *mut c_void;
}

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const READY: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNRESOLVED);
static RESOLVER_TID: AtomicU32 = AtomicU32::new(0);

struct RealCell(UnsafeCell<Option<Real>>);
// SAFETY: written once by the resolving thread before STATE becomes READY
// (Release), read only after observing READY (Acquire).
unsafe impl Sync for RealCell {}
static REAL: RealCell = RealCell(UnsafeCell::new(None));

/// The real functions, or `None` while they are being looked up (the caller
/// then serves the request from the bootstrap arena).
#[inline(always)]
pub fn real() -> Option<&'static Real> {
    if STATE.load(Acquire) == READY {
        // SAFETY: see RealCell.
        return unsafe { (*REAL.0.get()).as_ref() };
    }
    resolve_slow()
}

#[cold]
fn resolve_slow() -> Option<&'static Real> {
    match STATE.compare_exchange(UNRESOLVED, RESOLVING, AcqRel, Acquire) {
        Ok(_) => {
            RESOLVER_TID.store(crate::sys::gettid(), Relaxed);
            // SAFETY: this thread alone moved STATE to RESOLVING, so it alone resolves.
            let real = unsafe { resolve_all() };
            // SAFETY: written by this thread alone (it moved STATE to RESOLVING), and
            // read by others only once they see READY.
            unsafe { *REAL.0.get() = Some(real) };
            STATE.store(READY, Release);
            // SAFETY: written just above; no one writes it again.
            unsafe { (*REAL.0.get()).as_ref() }
        }
        // SAFETY: STATE is READY (Acquire): written once, before, and never again.
        Err(READY) => unsafe { (*REAL.0.get()).as_ref() },
        Err(_) => {
            // A nested call from inside dlsym: bootstrap. Another thread: wait.
            if RESOLVER_TID.load(Relaxed) == crate::sys::gettid() {
                return None;
            }
            while STATE.load(Acquire) != READY {
                core::hint::spin_loop();
            }
            // SAFETY: as above.
            unsafe { (*REAL.0.get()).as_ref() }
        }
    }
}

/// # Safety
/// `dlsym(RTLD_NEXT)` from the agent's own code: callable once libc is up,
/// which it is before any code of the agent runs.
unsafe fn next(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `name` is NUL-terminated.
    let symbol = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!symbol.is_null()).then_some(symbol)
}

macro_rules! lookup {
    ($name:literal, $fallback:expr, $ty:ty) => {
        // SAFETY: `name` is a NUL-terminated literal.
        match unsafe { next($name) } {
            // SAFETY: the symbol of this name in the next object is the libc
            // function of the same name, whose C type `$ty` spells.
            Some(symbol) => unsafe { core::mem::transmute::<*mut c_void, $ty>(symbol) },
            None => $fallback,
        }
    };
}

/// # Safety
/// None: a stand-in for a missing function, `unsafe` to have its C type.
unsafe extern "C" fn unknown_usable_size(_: *mut c_void) -> usize {
    0
}

/// An allocator without malloc_trim: nothing was released, as glibc says.
///
/// # Safety
/// None, as `unknown_usable_size`.
unsafe extern "C" fn nothing_trimmed(_: usize) -> i32 {
    0
}

/// # Safety
/// None, as `unknown_usable_size`.
unsafe extern "C" fn no_brk(_: *mut c_void) -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOMEM };
    -1
}

/// # Safety
/// None, as `unknown_usable_size`.
unsafe extern "C" fn no_sbrk(_: isize) -> *mut c_void {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOMEM };
    usize::MAX as *mut c_void
}

/// # Safety
/// None, as `unknown_usable_size`.
unsafe extern "C" fn no_execve(_: *const libc::c_char, _: Argv, _: Argv) -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// # Safety
/// None, as `unknown_usable_size`.
unsafe extern "C" fn no_fexecve(_: i32, _: Argv, _: Argv) -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// # Safety
/// None, as `unknown_usable_size`.
unsafe extern "C" fn no_execveat(_: i32, _: *const libc::c_char, _: Argv, _: Argv, _: i32) -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// # Safety
/// None: ends the process, as `exit` without atexit handlers.
unsafe extern "C" fn exit_group(code: i32) -> ! {
    // SAFETY: ends the process; no precondition.
    unsafe { libc::syscall(libc::SYS_exit_group, code) };
    unreachable!()
}

/// The real functions, each by `dlsym(RTLD_NEXT)` or, when the next object
/// lacks it, glibc's internal name or a stand-in.
///
/// # Safety
/// As [`next`]; called once, by the thread that resolves.
unsafe fn resolve_all() -> Real {
    Real {
        malloc: lookup!(c"malloc", __libc_malloc, MallocFn),
        free: lookup!(c"free", __libc_free, FreeFn),
        calloc: lookup!(c"calloc", __libc_calloc, CallocFn),
        realloc: lookup!(c"realloc", __libc_realloc, ReallocFn),
        posix_memalign: lookup!(c"posix_memalign", posix_memalign_via_memalign, PosixMemalignFn),
        aligned_alloc: lookup!(c"aligned_alloc", __libc_memalign, AlignedFn),
        memalign: lookup!(c"memalign", __libc_memalign, AlignedFn),
        valloc: lookup!(c"valloc", __libc_valloc, MallocFn),
        pvalloc: lookup!(c"pvalloc", __libc_pvalloc, MallocFn),
        malloc_usable_size: lookup!(c"malloc_usable_size", unknown_usable_size, UsableSizeFn),
        malloc_trim: lookup!(c"malloc_trim", nothing_trimmed, TrimFn),
        brk: lookup!(c"brk", no_brk, BrkFn),
        sbrk: lookup!(c"sbrk", no_sbrk, SbrkFn),
        exit: lookup!(c"exit", exit_group, ExitFn),
        execve: lookup!(c"execve", no_execve, ExecveFn),
        execvpe: lookup!(c"execvpe", no_execve, ExecveFn),
        fexecve: lookup!(c"fexecve", no_fexecve, FexecveFn),
        execveat: lookup!(c"execveat", no_execveat, ExecveatFn),
    }
}

/// # Safety
/// As `posix_memalign`: `out` is writable.
unsafe extern "C" fn posix_memalign_via_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    // SAFETY: glibc's own memalign, with the caller's arguments.
    let ptr = unsafe { __libc_memalign(align, size) };
    if ptr.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: `out` is writable (posix_memalign's contract).
    unsafe { *out = ptr };
    0
}

/// How the usable size of a block is learned.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum UsableSize {
    Unknown,
    /// glibc: read the chunk header in front of the block. glibc's own
    /// malloc_usable_size also reads the next chunk's header, a cache miss
    /// that cost 22% of a malloc-heavy program's time here.
    GlibcHeader,
    /// Call the allocator's malloc_usable_size.
    Call,
}

/// The file a function was loaded from.
pub fn module_path(function: *const c_void) -> alloc::string::String {
    // SAFETY: `Dl_info` is plain pointers, for which zero is a valid value.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: `info` is ours to write; dladdr only looks `function` up.
    if unsafe { libc::dladdr(function, &mut info) } == 0 || info.dli_fname.is_null() {
        return alloc::string::String::new();
    }
    // SAFETY: dladdr's NUL-terminated file name, which lives as long as the module.
    alloc::string::String::from_utf8_lossy(unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes()).into_owned()
}

pub fn usable_size_method(real: &Real) -> UsableSize {
    let module_of = |f: *const c_void| {
        // SAFETY: as above.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::dladdr(f, &mut info) } == 0 {
            (core::ptr::null_mut(), core::ptr::null())
        } else {
            (info.dli_fbase, info.dli_fname)
        }
    };
    let (malloc_module, malloc_file) = module_of(real.malloc as *const c_void);
    if malloc_module.is_null() {
        return UsableSize::Unknown;
    }
    // SAFETY: dladdr's NUL-terminated file name of a loaded module.
    let file = if malloc_file.is_null() { &b""[..] } else { unsafe { CStr::from_ptr(malloc_file) }.to_bytes() };
    // By file name: tcmalloc exports glibc's internal names (__libc_malloc)
    // too, so comparing addresses with them proves nothing.
    if file.ends_with(b"/libc.so.6") {
        return UsableSize::GlibcHeader;
    }
    // When an allocator does not export malloc_usable_size, the next one
    // found is glibc's, which would read a foreign block's "header".
    if module_of(real.malloc_usable_size as *const c_void).0 == malloc_module { UsableSize::Call } else { UsableSize::Unknown }
}

/// glibc's chunk layout: the size word sits 8 bytes before the block, its low
/// three bits are flags, and bit 1 (IS_MMAPPED) means a 16-byte header.
///
/// # Safety
/// `ptr` must be a live block from glibc's malloc.
#[inline(always)]
pub unsafe fn glibc_usable_size(ptr: *mut c_void) -> usize {
    const IS_MMAPPED: usize = 2;
    // SAFETY: a live glibc block has its chunk's size word just before it.
    let size_word = unsafe { (ptr as *const usize).sub(1).read() };
    let chunk_size = size_word & !7;
    if size_word & IS_MMAPPED != 0 { chunk_size - 16 } else { chunk_size - 8 }
}

// ---- bootstrap arena -------------------------------------------------------

const BOOTSTRAP_BYTES: usize = 256 * 1024;
const BOOTSTRAP_HEADER: usize = 16;

#[repr(C, align(64))]
struct Arena(UnsafeCell<[u8; BOOTSTRAP_BYTES]>);
// SAFETY: space is handed out by an atomic bump pointer, each range once.
unsafe impl Sync for Arena {}
static ARENA: Arena = Arena(UnsafeCell::new([0; BOOTSTRAP_BYTES]));
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

fn arena_base() -> usize {
    ARENA.0.get() as usize
}

/// Memory for requests made while the real allocator is being looked up.
/// Zeroed (it is fresh static memory), so calloc needs nothing more.
pub fn bootstrap_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(BOOTSTRAP_HEADER);
    let mut used = ARENA_USED.load(Relaxed);
    loop {
        let start = (arena_base() + used + BOOTSTRAP_HEADER).next_multiple_of(align);
        let end = start.saturating_add(size);
        if end > arena_base() + BOOTSTRAP_BYTES {
            return core::ptr::null_mut();
        }
        match ARENA_USED.compare_exchange(used, end - arena_base(), AcqRel, Relaxed) {
            Ok(_) => {
                // SAFETY: the compare-exchange gave this call `start - BOOTSTRAP_HEADER ..
                // end`, inside the arena, with room for the header word (aligned to 16).
                unsafe { ((start - BOOTSTRAP_HEADER) as *mut usize).write(size) };
                return start as *mut c_void;
            }
            Err(now) => used = now,
        }
    }
}

#[inline(always)]
pub fn is_bootstrap(ptr: *mut c_void) -> bool {
    (ptr as usize).wrapping_sub(arena_base()) < BOOTSTRAP_BYTES
}

/// The size a bootstrap block was asked for.
///
/// # Safety
/// `ptr` is a block [`bootstrap_alloc`] returned.
pub unsafe fn bootstrap_size(ptr: *mut c_void) -> usize {
    // SAFETY: `ptr` is a block `bootstrap_alloc` returned (the caller's
    // contract): its size is in the header word before it.
    unsafe { ((ptr as usize - BOOTSTRAP_HEADER) as *const usize).read() }
}
