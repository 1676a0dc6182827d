//! The trim remedy (`MEMGAP_MODE=trim`, `memgap run --trim-only`): no
//! recording at all, just a background thread that gives glibc's free pages
//! back to the kernel with malloc_trim(0), every interval, or only when the
//! free bytes glibc holds (mallinfo2) exceed a threshold.
//!
//! For production: the hooks pass every call straight through (two atomic
//! loads each), and nothing is written anywhere.

use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::sys;

static INTERVAL_NS: AtomicU64 = AtomicU64::new(1_000_000_000);
static THRESHOLD_BYTES: AtomicU64 = AtomicU64::new(0);
static RUNNING: AtomicBool = AtomicBool::new(false);

fn env_number(name: &CStr) -> Option<u64> {
    let value = unsafe { libc::getenv(name.as_ptr()) };
    if value.is_null() {
        return None;
    }
    unsafe { CStr::from_ptr(value) }.to_str().ok()?.parse().ok()
}

/// Whether the environment asks for the trim remedy instead of recording.
pub fn requested() -> bool {
    let mode = unsafe { libc::getenv(c"MEMGAP_MODE".as_ptr()) };
    !mode.is_null() && unsafe { CStr::from_ptr(mode) }.to_bytes() == b"trim"
}

/// Starts the trim thread (glibc only: other allocators have no malloc_trim).
pub fn start(allocator_is_glibc: bool) {
    if !allocator_is_glibc {
        return;
    }
    let interval_ms = env_number(c"MEMGAP_TRIM_INTERVAL_MS").unwrap_or(1000).clamp(1, 3_600_000);
    INTERVAL_NS.store(interval_ms * 1_000_000, Relaxed);
    THRESHOLD_BYTES.store(env_number(c"MEMGAP_TRIM_THRESHOLD").unwrap_or(0), Relaxed);
    RUNNING.store(crate::writer::spawn_quiet_thread(trim_loop), Relaxed);
}

/// The thread did not survive a fork: the child gets its own.
pub fn restart_after_fork() {
    if RUNNING.load(Relaxed) {
        crate::writer::spawn_quiet_thread(trim_loop);
    }
}

extern "C" fn trim_loop(_: *mut c_void) -> *mut c_void {
    crate::buffers::mark_thread_untraced();
    unsafe { libc::prctl(libc::PR_SET_NAME, c"memgap-trim".as_ptr()) };
    loop {
        sys::sleep_ns(INTERVAL_NS.load(Relaxed));
        let threshold = THRESHOLD_BYTES.load(Relaxed);
        // mallinfo2 walks every arena's bins: ask only when a threshold is set.
        if (threshold == 0 || unsafe { libc::mallinfo2() }.fordblks as u64 >= threshold)
            && let Some(real) = crate::real::real()
        {
            unsafe { (real.malloc_trim)(0) };
        }
    }
}
