//! Signals while memgap runs a program: those meant for the program reach
//! it, and memgap outlives the terminal's to finish the trace.

use std::sync::atomic::{AtomicI32, Ordering};

static CHILD_PID: AtomicI32 = AtomicI32::new(0);
/// A signal to pass on that came before the program's pid was known.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// SIGTERM, SIGHUP and SIGUSR1/2 sent to memgap go to the program. SIGINT and
/// SIGQUIT come from the terminal, which already sends them to the program:
/// memgap outlives them to finish the trace. Installed before the program
/// starts, so that a signal in between does not kill memgap and leave the
/// program running: one that comes before the program's pid is known waits
/// for [`child_started`].
pub fn forward_signals() {
    extern "C" fn forward(signal: libc::c_int) {
        let pid = CHILD_PID.load(Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill is async-signal-safe and has no memory precondition.
            unsafe { libc::kill(pid, signal) };
        } else {
            PENDING_SIGNAL.store(signal, Ordering::SeqCst);
        }
    }
    extern "C" fn ignore(_: libc::c_int) {}
    // SAFETY: a zeroed sigaction is valid; both handlers only call
    // async-signal-safe functions and atomics.
    let install = |signal: libc::c_int, handler: extern "C" fn(libc::c_int)| unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
    };
    for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
        install(signal, forward);
    }
    for signal in [libc::SIGINT, libc::SIGQUIT] {
        install(signal, ignore);
    }
}

/// The program runs as `pid`: signals go to it from now on, and one that
/// came while it was starting is sent now.
pub fn child_started(pid: u32) {
    CHILD_PID.store(pid as i32, Ordering::SeqCst);
    let pending = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
    if pending != 0 {
        // SAFETY: no memory precondition; `pid` is our child.
        unsafe { libc::kill(pid as i32, pending) };
    }
    // Past RLIMIT_FSIZE (`ulimit -f`) adding the exit status fails instead
    // of killing memgap. Set after the program started: it inherits no change.
    // SAFETY: no precondition.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}
