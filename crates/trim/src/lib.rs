//! The trim remedy (`memgap run --trim-only`, `memgap compare`'s `trim`) as
//! a library of its own. Preloaded, it starts one thread that gives glibc's
//! free pages back to the kernel with malloc_trim(0) every interval
//! (`MEMGAP_TRIM_INTERVAL_MS`, default 1000), or only when the free bytes
//! glibc holds (mallinfo2) reach `MEMGAP_TRIM_THRESHOLD`.
//!
//! For production, so it interposes nothing: the program's own calls never
//! pass through it and cost what they cost without it. (Served by the agent,
//! whose hooks passed each call through, it cost an indirect call and two
//! atomic loads per malloc and free.) With another allocator than glibc's it
//! does nothing: only glibc has malloc_trim.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use memgap_trace::vocabulary::env::{self, EnvVar};

static INTERVAL_NS: AtomicU64 = AtomicU64::new(1_000_000_000);
static THRESHOLD_BYTES: AtomicU64 = AtomicU64::new(0);
/// `malloc_trim` and `mallinfo2` as found at load (0: not found).
static MALLOC_TRIM: AtomicU64 = AtomicU64::new(0);
static MALLINFO2: AtomicU64 = AtomicU64::new(0);

/// Runs when the library is loaded, before `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;

extern "C" fn on_load() {
    if !malloc_is_glibcs() {
        return;
    }
    let Some(malloc_trim) = symbol(c"malloc_trim") else { return };
    MALLOC_TRIM.store(malloc_trim as u64, Relaxed);
    MALLINFO2.store(symbol(c"mallinfo2").map_or(0, |f| f as u64), Relaxed);
    let interval_ms = env_number(env::TRIM_INTERVAL_MS).unwrap_or(1000).clamp(1, 3_600_000);
    INTERVAL_NS.store(interval_ms * 1_000_000, Relaxed);
    THRESHOLD_BYTES.store(env_number(env::TRIM_THRESHOLD).unwrap_or(0), Relaxed);
    if spawn_quiet_thread() {
        // The thread does not survive a fork: the child starts its own.
        // SAFETY: registers a plain `extern "C"` handler; no precondition.
        unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) };
    }
}

extern "C" fn on_fork_child() {
    spawn_quiet_thread();
}

/// Whether the `malloc` the program calls is glibc's (not jemalloc,
/// tcmalloc, mimalloc or the program's own).
fn malloc_is_glibcs() -> bool {
    let Some(mut malloc) = symbol(c"malloc") else { return false };
    // A program linked without -pie that takes malloc's address (Debian's
    // node) exports a PLT stub under its name, which dlsym finds first:
    // the malloc it calls is the next definition.
    if in_main_program(malloc) {
        // SAFETY: a NUL-terminated name; dlsym only looks it up.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc".as_ptr()) };
        if next.is_null() {
            return false;
        }
        malloc = next;
    }
    // SAFETY: `Dl_info` is plain pointers, valid all zero.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: `info` is ours to write; dladdr only looks `malloc` up.
    if unsafe { libc::dladdr(malloc, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr's NUL-terminated file name of a loaded module.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    path.rsplit(|&b| b == b'/').next().is_some_and(|file| file.starts_with(b"libc.so"))
}

/// Whether `address` lies in the program's executable (not a library).
fn in_main_program(address: *mut c_void) -> bool {
    let base_of = |at: *const c_void| {
        // SAFETY: as above.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::dladdr(at, &mut info) } != 0).then_some(info.dli_fbase)
    };
    // SAFETY: no precondition.
    let program_headers = unsafe { libc::getauxval(libc::AT_PHDR) } as *const c_void;
    !program_headers.is_null() && base_of(program_headers).is_some_and(|base| base_of(address) == Some(base))
}

fn symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: a NUL-terminated name; dlsym only looks it up.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!found.is_null()).then_some(found)
}

fn env_number(name: EnvVar) -> Option<u64> {
    // SAFETY: a NUL-terminated name.
    let value: *const c_char = unsafe { libc::getenv(name.c_name().as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: getenv's NUL-terminated string, read at load time before the
    // program could change the environment.
    unsafe { CStr::from_ptr(value) }.to_str().ok()?.parse().ok()
}

/// A detached thread with every signal blocked, so that none of the
/// program's signals is delivered to it.
fn spawn_quiet_thread() -> bool {
    // SAFETY: signal sets on our stack, filled before they are read; `thread`
    // is ours to write, and `trim_loop` is an `extern "C"` thread entry.
    unsafe {
        let (mut all, mut old): (libc::sigset_t, libc::sigset_t) = (core::mem::zeroed(), core::mem::zeroed());
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut thread: libc::pthread_t = 0;
        let started = libc::pthread_create(&mut thread, core::ptr::null(), trim_loop, core::ptr::null_mut()) == 0;
        if started {
            libc::pthread_detach(thread);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        started
    }
}

extern "C" fn trim_loop(_: *mut c_void) -> *mut c_void {
    // SAFETY: a static NUL-terminated name.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"memgap-trim".as_ptr()) };
    // SAFETY: found by name in the loaded libc, with these C signatures.
    let malloc_trim: extern "C" fn(usize) -> c_int = unsafe { core::mem::transmute(MALLOC_TRIM.load(Relaxed) as *const c_void) };
    let mallinfo2 = match MALLINFO2.load(Relaxed) {
        0 => None,
        // SAFETY: non-zero only when `init` found glibc's `mallinfo2`, of this C type.
        f => Some(unsafe { core::mem::transmute::<*const c_void, extern "C" fn() -> libc::mallinfo2>(f as *const c_void) }),
    };
    loop {
        let ns = INTERVAL_NS.load(Relaxed);
        let pause = libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
        // SAFETY: `pause` is a valid timespec; no remaining time is asked for.
        unsafe { libc::nanosleep(&pause, core::ptr::null_mut()) };
        let threshold = THRESHOLD_BYTES.load(Relaxed);
        // mallinfo2 walks every arena's bins: ask only when a threshold is
        // set (and, on a glibc without mallinfo2, trim every time).
        let worth_it = threshold == 0 || mallinfo2.is_none_or(|mallinfo2| mallinfo2().fordblks as u64 >= threshold);
        if worth_it {
            malloc_trim(0);
        }
    }
}
