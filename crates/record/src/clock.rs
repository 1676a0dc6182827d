//! Event timestamps.
//!
//! On x86-64 with an invariant TSC, events carry raw `rdtsc` ticks (about
//! 18 ns here against 31 ns for `clock_gettime`); the writer records CLOCK
//! pairs (ticks, CLOCK_MONOTONIC ns) from which readers convert. Elsewhere
//! events carry CLOCK_MONOTONIC nanoseconds directly.

use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

use memgap_trace::records::{CLOCK_MONOTONIC_NS, CLOCK_TSC};

static USE_TSC: AtomicBool = AtomicBool::new(false);

/// Chooses the clock; called once before the first event is recorded.
pub fn choose() {
    #[cfg(target_arch = "x86_64")]
    {
        let cpuinfo = crate::sys::read_file(c"/proc/cpuinfo");
        let flags = cpuinfo.split(|&b| b == b'\n').find(|line| line.starts_with(b"flags")).unwrap_or(&[]);
        let has = |flag: &[u8]| flags.split(|&b| b == b' ' || b == b'\t').any(|word| word == flag);
        USE_TSC.store(has(b"constant_tsc") && has(b"nonstop_tsc"), Relaxed);
    }
}

pub fn kind() -> u8 {
    if USE_TSC.load(Relaxed) { CLOCK_TSC } else { CLOCK_MONOTONIC_NS }
}

#[inline(always)]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if USE_TSC.load(Relaxed) {
        return unsafe { core::arch::x86_64::_rdtsc() };
    }
    monotonic_ns()
}

pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
