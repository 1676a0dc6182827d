//! Converts event times (writer rounds, TSC ticks of older traces, or
//! monotonic nanoseconds) to seconds since the process started, from the
//! CLOCK records in the trace. An event of round R maps to the moment R began.

use memgap_trace::records::{CLOCK_MONOTONIC_NS, Clock, Process};

#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// (time, monotonic ns) pairs in time order.
    points: Vec<(u64, u64)>,
    start_ns: u64,
    identity: bool,
}

impl Timeline {
    pub fn start(&mut self, process: &Process) {
        self.points.clear();
        self.identity = process.clock == CLOCK_MONOTONIC_NS;
        self.start_ns = process.start_monotonic_ns;
        self.points.push((process.start_time, process.start_monotonic_ns));
    }

    pub fn add(&mut self, clock: &Clock) {
        if self.points.last().is_none_or(|&(time, _)| clock.time > time) {
            self.points.push((clock.time, clock.monotonic_ns));
        }
    }

    /// Nanoseconds on CLOCK_MONOTONIC at event time `time`.
    pub fn monotonic_ns(&self, time: u64) -> u64 {
        if self.identity || self.points.is_empty() {
            return time;
        }
        let i = self.points.partition_point(|&(t, _)| t <= time);
        let (a, b) = match (i, self.points.len()) {
            (_, 1) => return self.points[0].1,
            (0, _) => (self.points[0], self.points[self.points.len() - 1]),
            (i, n) if i >= n => (self.points[0], self.points[n - 1]),
            (i, _) => (self.points[i - 1], self.points[i]),
        };
        let ticks = (b.0 - a.0) as f64;
        let ns = b.1.saturating_sub(a.1) as f64;
        let rate = if ticks > 0.0 { ns / ticks } else { 0.0 };
        let offset = (time as f64 - a.0 as f64) * rate;
        (a.1 as f64 + offset).max(0.0) as u64
    }

    /// Seconds since the process image started.
    pub fn seconds(&self, time: u64) -> f64 {
        self.monotonic_ns(time).saturating_sub(self.start_ns) as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::records::CLOCK_TSC;

    #[test]
    fn interpolates_and_extrapolates_ticks() {
        let mut timeline = Timeline::default();
        timeline.start(&Process { clock: CLOCK_TSC, start_time: 1000, start_monotonic_ns: 5_000, ..Process::default() });
        timeline.add(&Clock { time: 3000, monotonic_ns: 6_000 });
        timeline.add(&Clock { time: 5000, monotonic_ns: 7_000 });
        assert_eq!(timeline.monotonic_ns(2000), 5_500);
        assert_eq!(timeline.monotonic_ns(7000), 8_000);
        assert!((timeline.seconds(5000) - 2e-6).abs() < 1e-12);
    }
}
