//! Event timestamps.
//!
//! Events carry the writer's round number, not a clock reading: every
//! timestamp source a thread could read per event costs too much. `rdtsc`
//! waits here for the program's outstanding cache misses (two per
//! malloc/free pair took a churn loop from 0.20 s to 0.78 s), and
//! `clock_gettime` adds a call and a `rdtsc` of its own. The writer advances
//! the round once per round and once before each snapshot, a thread once
//! every few buffer chunks it fills (see `buffers::take_chunk`), and the
//! writer records a CLOCK pair (round, CLOCK_MONOTONIC ns) each round, from
//! which readers convert (times between two pairs are interpolated). Events
//! within one round are ordered by each thread's buffer and, across
//! threads, by the replay (see `memgap_replay::merge`).

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use memgap_trace::records::CLOCK_ROUNDS;

static ROUND: AtomicU64 = AtomicU64::new(0);

pub fn kind() -> u8 {
    CLOCK_ROUNDS
}

/// The current round: a plain load of a line only the writer stores to,
/// ten times less often than every 10 ms round.
#[inline(always)]
pub fn now() -> u64 {
    ROUND.load(Relaxed)
}

/// Starts a new round; events from here on carry the returned value.
pub fn advance() -> u64 {
    ROUND.fetch_add(1, Relaxed) + 1
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
