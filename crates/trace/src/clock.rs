//! The clock of traces: CLOCK_MONOTONIC in nanoseconds, read the same way by
//! the agent inside the program and by memgap's recorders outside it, so
//! their times fall on one line.

/// Nanoseconds on CLOCK_MONOTONIC. Async-signal-safe and allocation-free
/// (the agent calls it inside malloc).
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME).
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec we own; both clocks
    // always exist, so it cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_does_not_go_back_and_realtime_is_now() {
        let (first, second) = (monotonic_ns(), monotonic_ns());
        assert!(first > 0 && second >= first);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert!(realtime_ns().abs_diff(now) < 60_000_000_000);
    }
}
