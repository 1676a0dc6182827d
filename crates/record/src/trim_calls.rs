//! The program's own `malloc_trim` calls. The hook measures VmRSS around the
//! real call and leaves the figures in a fixed slot; the writer thread turns
//! them into METRICS records (source `malloc`, kind `trim`) and takes a
//! snapshot after them, so the ledger shows what the trim changed.
//!
//! Slots rather than the writer's lock: the hook must not wait for a writer
//! busy on a slow disk, and must not allocate.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, Ordering::*};

use memgap_trace::records::{Metrics, Record};

use crate::clock;

/// Calls held between two writer rounds (10 ms); more are counted as lost.
const SLOT_COUNT: usize = 64;

const EMPTY: u8 = 0;
const FILLING: u8 = 1;
const FULL: u8 = 2;

/// One call's figures, written by the hook between FILLING and FULL.
struct Slot {
    state: AtomicU8,
    monotonic_ns: AtomicU64,
    rss_before: AtomicU64,
    rss_after: AtomicU64,
    pad: AtomicU64,
    returned: AtomicI32,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU8::new(EMPTY),
            monotonic_ns: AtomicU64::new(0),
            rss_before: AtomicU64::new(0),
            rss_after: AtomicU64::new(0),
            pad: AtomicU64::new(0),
            returned: AtomicI32::new(0),
        }
    }
}

static SLOTS: [Slot; SLOT_COUNT] = [const { Slot::new() }; SLOT_COUNT];
static LOST: AtomicU64 = AtomicU64::new(0);
static SNAPSHOT_WANTED: AtomicBool = AtomicBool::new(false);

/// What one `malloc_trim` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimCall {
    /// CLOCK_MONOTONIC when the call returned.
    pub monotonic_ns: u64,
    pub rss_before: u64,
    pub rss_after: u64,
    pub pad: u64,
    /// malloc_trim's result: 1 if memory went back to the kernel, else 0.
    pub returned: i32,
}

impl TrimCall {
    pub fn record(&self) -> Record<'static> {
        Record::Metrics(Metrics {
            monotonic_ns: self.monotonic_ns,
            source: "malloc".into(),
            kind: "trim".into(),
            values: vec![
                ("rss_before:bytes".into(), self.rss_before as f64),
                ("rss_after:bytes".into(), self.rss_after as f64),
                ("pad".into(), self.pad as f64),
                ("returned".into(), f64::from(self.returned)),
            ],
        })
    }
}

/// Calls the real `malloc_trim` (`trim`) and keeps what it did for the
/// writer. The program sees the same result and errno as without us.
pub fn measure(pad: usize, trim: impl FnOnce() -> i32) -> i32 {
    let errno = unsafe { *libc::__errno_location() };
    let rss_before = vm_rss();
    unsafe { *libc::__errno_location() = errno };
    let returned = trim();
    let errno = unsafe { *libc::__errno_location() };
    let rss_after = vm_rss();
    publish(&TrimCall { monotonic_ns: clock::monotonic_ns(), rss_before, rss_after, pad: pad as u64, returned });
    crate::writer::wake();
    unsafe { *libc::__errno_location() = errno };
    returned
}

/// VmRSS now, 0 when /proc is unreadable. A fresh descriptor each time: one
/// kept open would, after a fork, still name the parent.
fn vm_rss() -> u64 {
    let fd = unsafe { libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return 0;
    }
    let rss = crate::writer::read_status(fd, &mut 0).vm_rss;
    unsafe { libc::close(fd) };
    rss
}

fn publish(call: &TrimCall) {
    for slot in &SLOTS {
        if slot.state.compare_exchange(EMPTY, FILLING, Acquire, Relaxed).is_ok() {
            slot.monotonic_ns.store(call.monotonic_ns, Relaxed);
            slot.rss_before.store(call.rss_before, Relaxed);
            slot.rss_after.store(call.rss_after, Relaxed);
            slot.pad.store(call.pad, Relaxed);
            slot.returned.store(call.returned, Relaxed);
            slot.state.store(FULL, Release);
            SNAPSHOT_WANTED.store(true, Release);
            return;
        }
    }
    LOST.fetch_add(1, Relaxed);
}

/// The calls published since the last time, oldest first, and how many
/// found no free slot meanwhile.
pub fn take(calls: &mut Vec<TrimCall>) -> u64 {
    for slot in &SLOTS {
        if slot.state.load(Acquire) == FULL {
            calls.push(TrimCall {
                monotonic_ns: slot.monotonic_ns.load(Relaxed),
                rss_before: slot.rss_before.load(Relaxed),
                rss_after: slot.rss_after.load(Relaxed),
                pad: slot.pad.load(Relaxed),
                returned: slot.returned.load(Relaxed),
            });
            slot.state.store(EMPTY, Release);
        }
    }
    calls.sort_by_key(|c| c.monotonic_ns);
    LOST.swap(0, Relaxed)
}

/// Whether a trim happened since the last call; the caller then snapshots.
pub fn take_snapshot_request() -> bool {
    SNAPSHOT_WANTED.swap(false, AcqRel)
}

pub fn snapshot_wanted() -> bool {
    SNAPSHOT_WANTED.load(Acquire)
}

/// In a fork child: calls still in the slots were the parent's, and a slot
/// being filled at the fork belonged to a thread the child does not have.
pub fn reset_after_fork() {
    for slot in &SLOTS {
        slot.state.store(EMPTY, Relaxed);
    }
    LOST.store(0, Relaxed);
    SNAPSHOT_WANTED.store(false, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the slots are process-wide.
    #[test]
    fn calls_reach_the_writer_in_time_order_and_overflow_is_counted() {
        reset_after_fork();
        unsafe { *libc::__errno_location() = libc::EAGAIN };
        let returned = measure(128, || {
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            7
        });
        assert_eq!(returned, 7);
        assert_eq!(unsafe { *libc::__errno_location() }, libc::ENOMEM, "the errno the real call left");
        let mut calls = Vec::new();
        assert_eq!(take(&mut calls), 0);
        assert_eq!((calls.len(), calls[0].pad, calls[0].returned), (1, 128, 7));
        assert!(calls[0].rss_before > 0 && calls[0].rss_after > 0, "{:?}", calls[0]);
        assert!(take_snapshot_request());

        let call = |ns: u64| TrimCall { monotonic_ns: ns, rss_before: 400 << 20, rss_after: 40 << 20, pad: 0, returned: 1 };
        publish(&call(20));
        publish(&call(10));
        assert!(take_snapshot_request());
        assert!(!take_snapshot_request());
        calls.clear();
        assert_eq!(take(&mut calls), 0);
        assert_eq!(calls, vec![call(10), call(20)]);
        calls.clear();
        assert_eq!(take(&mut calls), 0);
        assert!(calls.is_empty(), "each call is taken once");

        for ns in 0..SLOT_COUNT as u64 + 3 {
            publish(&call(ns));
        }
        assert_eq!(take(&mut calls), 3);
        assert_eq!(calls.len(), SLOT_COUNT);

        let Record::Metrics(m) = call(5).record() else { panic!("a METRICS record") };
        assert_eq!((m.source.as_str(), m.kind.as_str(), m.monotonic_ns), ("malloc", "trim", 5));
        assert_eq!(m.get("rss_before:bytes"), Some((400 << 20) as f64));
        assert_eq!(m.get("rss_after:bytes"), Some((40 << 20) as f64));
        assert_eq!(m.get("returned"), Some(1.0));
    }
}
