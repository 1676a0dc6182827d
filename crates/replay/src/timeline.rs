//! Converts event times (writer rounds, TSC ticks of older traces, or
//! monotonic nanoseconds) to seconds since the process started, from the
//! CLOCK records in the trace. An event of round R maps to the moment R began.

use std::cell::Cell;

use memgap_trace::records::{CLOCK_MONOTONIC_NS, Clock, Process};

/// More than a conversion's rounding can be off by: a time whose segment
/// ends this much before another's bound is surely before it.
const ROUNDING_MARGIN_NS: u64 = 1_000_000;

#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// (time, monotonic ns) pairs in time order.
    points: Vec<(u64, u64)>,
    start_ns: u64,
    identity: bool,
    /// The segment of `points` the latest time converted fell in: events
    /// come in time order, so the next one is almost always in it too, and
    /// the binary search is skipped.
    latest_segment: Cell<usize>,
    /// No CLOCK record went back in time: conversions grow with the time.
    monotone: bool,
    /// For [`Timeline::within_ns`]: the last (later time, limit, points
    /// known) asked about, its conversion, and the time before which every
    /// earlier one is surely more than the limit before it.
    surely_longer: Cell<(u64, u64, usize, u64, u64)>,
}

impl Timeline {
    pub fn start(&mut self, process: &Process) {
        self.points.clear();
        self.latest_segment.set(0);
        self.monotone = true;
        self.surely_longer.set((0, 0, 0, 0, 0));
        self.identity = process.clock == CLOCK_MONOTONIC_NS;
        self.start_ns = process.start_monotonic_ns;
        self.points.push((process.start_time, process.start_monotonic_ns));
    }

    pub fn add(&mut self, clock: &Clock) {
        if self.points.last().is_none_or(|&(time, _)| clock.time > time) {
            self.monotone &= self.points.last().is_none_or(|&(_, ns)| clock.monotonic_ns >= ns);
            self.points.push((clock.time, clock.monotonic_ns));
        }
    }

    /// Nanoseconds on CLOCK_MONOTONIC at event time `time`.
    pub fn monotonic_ns(&self, time: u64) -> u64 {
        if self.identity || self.points.is_empty() {
            return time;
        }
        let points = &self.points;
        let latest = self.latest_segment.get();
        let after_start = latest == 0 || points.get(latest - 1).is_some_and(|&(t, _)| t <= time);
        let before_end = points.get(latest).is_none_or(|&(t, _)| t > time);
        if after_start && before_end {
            return self.in_segment(latest, time);
        }
        let segment = points.partition_point(|&(t, _)| t <= time);
        // An earlier time (a freed block's allocation) leaves the latest segment for the next event.
        if segment >= latest {
            self.latest_segment.set(segment);
        }
        self.in_segment(segment, time)
    }

    /// Whether event time `later` is at most `limit_ns` after `earlier` on
    /// CLOCK_MONOTONIC: the difference of their conversions, without
    /// converting an `earlier` time that is surely too far back (asked for
    /// every freed block with the same `later` and `limit_ns` many times).
    pub fn within_ns(&self, earlier: u64, later: u64, limit_ns: u64) -> bool {
        let (asked, limit, known, mut later_ns, mut before) = self.surely_longer.get();
        if (asked, limit, known) != (later, limit_ns, self.points.len()) {
            later_ns = self.monotonic_ns(later);
            before = 0;
            if !self.identity && self.monotone {
                // Every time before a point whose conversion is below the bound converts below it too.
                let bound = later_ns.saturating_sub(limit_ns).saturating_sub(ROUNDING_MARGIN_NS);
                let below = self.points.partition_point(|&(_, ns)| ns < bound);
                before = below.checked_sub(1).map_or(0, |last| self.points[last].0);
            }
            self.surely_longer.set((later, limit_ns, self.points.len(), later_ns, before));
        }
        earlier >= before && later_ns.saturating_sub(self.monotonic_ns(earlier)) <= limit_ns
    }

    /// The conversion of `time` in segment `segment` (how many points are
    /// at or before it): linear between the points around it, and from the
    /// whole run's rate outside them.
    #[inline]
    fn in_segment(&self, segment: usize, time: u64) -> u64 {
        let points = &self.points;
        let (a, b) = match (segment, points.len()) {
            (_, 1) => return points[0].1,
            (0, _) => (points[0], points[points.len() - 1]),
            (i, n) if i >= n => (points[0], points[n - 1]),
            (i, _) => (points[i - 1], points[i]),
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

    #[test]
    fn the_remembered_segment_gives_what_a_fresh_search_gives() {
        let mut timeline = Timeline::default();
        timeline.start(&Process { clock: CLOCK_TSC, start_time: 100, start_monotonic_ns: 1_000, ..Process::default() });
        for i in 1..50u64 {
            timeline.add(&Clock { time: 100 + i * 1000, monotonic_ns: 1_000 + i * i * 700 });
        }
        // In order, back and forth, before the first point and past the last.
        let mut times: Vec<u64> = (0..60_000).step_by(37).collect();
        times.extend([0, 99, 100, 101, 49_100, 49_101, 1_100, 1_099, 70_000, 5, 30_000, 30_000, 29_999]);
        let searched = |timeline: &Timeline, time: u64| timeline.in_segment(timeline.points.partition_point(|&(t, _)| t <= time), time);
        // Each time twice: the second is read from what the first remembered.
        for time in times.iter().flat_map(|&t| [t, t]) {
            assert_eq!(timeline.monotonic_ns(time), searched(&timeline, time), "at {time}");
        }
        // A clock added after the last conversion: times past the old last point move.
        timeline.monotonic_ns(40_000);
        timeline.monotonic_ns(75_000);
        timeline.add(&Clock { time: 80_000, monotonic_ns: 9_000_000 });
        for time in [75_000, 40_000, 79_999, 90_000, 75_000] {
            assert_eq!(timeline.monotonic_ns(time), searched(&timeline, time), "at {time}");
        }
        // Lifetimes against a limit, as blame asks: the same as subtracting conversions.
        for later in (0..95_000).step_by(997) {
            for earlier in (0..=later).step_by(1013) {
                for limit in [0, 500, 20_000, 2_000_000, 9_000_000] {
                    let subtracted = searched(&timeline, later).saturating_sub(searched(&timeline, earlier)) <= limit;
                    assert_eq!(timeline.within_ns(earlier, later, limit), subtracted, "{earlier} to {later} within {limit}");
                }
            }
        }
    }
}
