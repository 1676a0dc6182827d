//! Event timestamps.
//!
//! Events carry the recorder's round number, not a clock reading: every
//! timestamp source a thread could read per event costs too much. `rdtsc`
//! waits here for the program's outstanding cache misses (two per
//! malloc/free pair took a churn loop from 0.20 s to 0.78 s), and
//! `clock_gettime` adds a call and a `rdtsc` of its own. The recorder advances
//! the round once per round and once before each snapshot, a thread every
//! few hundred bytes of events it writes (see `buffers::TICK_BYTES`), and
//! the recorder records a CLOCK pair (round, CLOCK_MONOTONIC ns) each round,
//! from which readers convert (times between two pairs are interpolated).
//! Events within one round are ordered by each thread's buffer and, across
//! threads, by the replay (see `memgap_replay::merge`). A thread marks on
//! its chunk when it enters a hook, before it reads the time, so the
//! recorder knows how old an event still to come may be (see
//! `buffers::enter_hook`).

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering::Relaxed};

use memgap_trace::records::CLOCK_ROUNDS;

/// The round before the area exists (or in a process that records nothing).
static LOCAL_ROUND: AtomicU64 = AtomicU64::new(0);
/// The round counter in the area shared with the recorder, which moves it.
static ROUND: AtomicPtr<AtomicU64> = AtomicPtr::new(&LOCAL_ROUND as *const AtomicU64 as *mut AtomicU64);

/// Counts rounds in the shared area's word from now on (`null`: locally).
pub fn use_area(round: *const AtomicU64) {
    let round = if round.is_null() { &LOCAL_ROUND as *const AtomicU64 } else { round };
    ROUND.store(round as *mut AtomicU64, Relaxed);
}

pub fn kind() -> u8 {
    CLOCK_ROUNDS
}

/// The current round: a plain load of a line the recorder stores to about
/// every 10 ms.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: points to a static or into the area, mapped for the process's life.
    unsafe { (*ROUND.load(Relaxed)).load(Relaxed) }
}

/// Starts a new round; events from here on carry the returned value.
pub fn advance() -> u64 {
    // SAFETY: as in `now`.
    unsafe { (*ROUND.load(Relaxed)).fetch_add(1, Relaxed) + 1 }
}

/// The trace's clocks, read as memgap's recorders outside the program read them.
pub use memgap_trace::clock::{monotonic_ns, realtime_ns};
