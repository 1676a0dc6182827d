//! The program's own `malloc_trim` calls. The hook asks the recorder for
//! VmRSS before and after the real call (the recorder reads
//! /proc/PID/status, so the program opens nothing) and records the figures
//! as a METRICS record (source `malloc`, kind `trim`); the recorder then
//! takes a snapshot, so the ledger shows what the trim changed.

use core::sync::atomic::Ordering::*;

use memgap_trace::records::{Metrics, Record};
use memgap_trace::shared::REQUEST_RSS;

use crate::{area, buffers, clock};

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
            source: memgap_trace::vocabulary::source::MALLOC.into(),
            kind: memgap_trace::vocabulary::kind::TRIM.into(),
            values: vec![
                ("rss_before:bytes".into(), self.rss_before as f64),
                ("rss_after:bytes".into(), self.rss_after as f64),
                ("pad".into(), self.pad as f64),
                ("returned".into(), f64::from(self.returned)),
            ],
        })
    }
}

/// Calls the real `malloc_trim` (`trim`) and records what it did. The
/// program sees the same result and errno as without us.
pub fn measure(pad: usize, trim: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    let rss_before = buffers::while_busy(|| area::request(REQUEST_RSS)).unwrap_or(0);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    let returned = trim();
    // SAFETY: as above.
    let errno = unsafe { *libc::__errno_location() };
    buffers::while_busy(|| {
        let rss_after = area::request(REQUEST_RSS).unwrap_or(0);
        let call = TrimCall { monotonic_ns: clock::monotonic_ns(), rss_before, rss_after, pad: pad as u64, returned };
        buffers::push_record(&call.record());
        if let Some(area) = area::get() {
            area.header().trims.fetch_add(1, Release);
            area::wake_recorder(area.header());
        }
    });
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    returned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_keeps_the_result_and_errno_of_the_real_one() {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = libc::EAGAIN };
        let returned = measure(128, || {
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            7
        });
        assert_eq!(returned, 7);
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, libc::ENOMEM, "the errno the real call left");
        let call = TrimCall { monotonic_ns: 5, rss_before: 400 << 20, rss_after: 40 << 20, pad: 0, returned: 1 };
        let Record::Metrics(m) = call.record() else { panic!("a METRICS record") };
        assert_eq!((m.source.as_str(), m.kind.as_str(), m.monotonic_ns), ("malloc", "trim", 5));
        assert_eq!(m.get("rss_before:bytes"), Some((400 << 20) as f64));
        assert_eq!(m.get("rss_after:bytes"), Some((40 << 20) as f64));
        assert_eq!(m.get("returned"), Some(1.0));
    }
}
