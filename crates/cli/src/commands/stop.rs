//! Commands that run until interrupted (`attach`, `watch`): SIGINT or SIGTERM
//! only raises a flag their loop polls, so they finish the trace and exit.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

pub fn install_handler() {
    extern "C" fn stop(_: libc::c_int) {
        REQUESTED.store(true, Ordering::Relaxed);
    }
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only stores an atomic,
        // which is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = stop as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}
