//! Converts event times (writer rounds, TSC ticks of older traces, or
//! monotonic nanoseconds) to seconds since the process started, from the
//! CLOCK records in the trace. An event of round R maps to the moment R began.

use std::cell::{Cell, RefCell};

use memgap_trace::records::{CLOCK_MONOTONIC_NS, Clock, Process};

/// More than a conversion's rounding can be off by: a time whose segment
/// ends this much before another's bound is surely before it.
const ROUNDING_MARGIN_NS: u64 = 1_000_000;

/// Past this many segments between the times surely too long ago and
/// those surely recent enough, lifetimes are found by converting each time.
const MAX_SEGMENTS_BETWEEN: usize = 64;
/// Steps from the last place among the points before bisecting instead.
const NEAR_STEPS: usize = 4;

/// For [`Timeline::within_ns`]: the last (later time, limit, points known)
/// asked about, its conversion, the times before which every earlier one is
/// surely more than the limit before it and from which every one is surely
/// within it, and, for each segment in between (from `first_segment` on),
/// the first time within the limit once found.
#[derive(Debug, Clone)]
struct Lifetimes {
    asked: Option<(u64, u64, usize)>,
    later_ns: u64,
    surely_longer_before: u64,
    surely_within_from: u64,
    first_segment: usize,
    thresholds: Vec<Option<Option<u64>>>,
    /// How many points convert below the two bounds.
    below: usize,
    past: usize,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Lifetimes {
            asked: None,
            later_ns: 0,
            surely_longer_before: 0,
            surely_within_from: u64::MAX,
            first_segment: 0,
            thresholds: Vec::new(),
            below: 0,
            past: 0,
        }
    }
}

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
    /// For [`Timeline::within_ns`], asked many times with the same later time and limit.
    lifetimes: RefCell<Lifetimes>,
}

impl Timeline {
    pub fn start(&mut self, process: &Process) {
        self.points.clear();
        self.latest_segment.set(0);
        self.monotone = true;
        self.lifetimes.replace(Lifetimes::default());
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
        let mut lifetimes = self.lifetimes.borrow_mut();
        if lifetimes.asked != Some((later, limit_ns, self.points.len())) {
            let previous = std::mem::take(&mut *lifetimes);
            *lifetimes = self.lifetimes_before(later, limit_ns, previous);
        }
        if earlier >= lifetimes.surely_within_from {
            return true;
        }
        if earlier < lifetimes.surely_longer_before {
            return false;
        }
        if lifetimes.thresholds.is_empty() {
            return lifetimes.later_ns.saturating_sub(self.monotonic_ns(earlier)) <= limit_ns;
        }
        let first = lifetimes.first_segment;
        let segment = first + self.points[first..first + lifetimes.thresholds.len() - 1].partition_point(|&(t, _)| t <= earlier);
        let later_ns = lifetimes.later_ns;
        let threshold = *lifetimes.thresholds[segment - first].get_or_insert_with(|| {
            self.first_within(segment, later_ns.saturating_sub(limit_ns), |time| {
                later_ns.saturating_sub(self.in_segment(segment, time)) <= limit_ns
            })
        });
        threshold.is_some_and(|threshold| earlier >= threshold)
    }

    /// What [`Timeline::within_ns`] keeps for event time `later` and limit
    /// `limit_ns`; `previous` is what it kept for the time before, whose
    /// buffer is reused and whose places among the points are near the new.
    fn lifetimes_before(&self, later: u64, limit_ns: u64, previous: Lifetimes) -> Lifetimes {
        let later_ns = self.monotonic_ns(later);
        let mut thresholds = previous.thresholds;
        thresholds.clear();
        let mut lifetimes = Lifetimes { asked: Some((later, limit_ns, self.points.len())), later_ns, thresholds, ..Lifetimes::default() };
        if self.identity || !self.monotone {
            return lifetimes;
        }
        // Every time before a point whose conversion is below the bound converts below it too.
        let bound = later_ns.saturating_sub(limit_ns).saturating_sub(ROUNDING_MARGIN_NS);
        let below = self.points_below(bound, previous.below);
        lifetimes.surely_longer_before = below.checked_sub(1).map_or(0, |last| self.points[last].0);
        // And every time from a point whose conversion is past the bound converts past it too.
        let past = match later_ns.checked_sub(limit_ns) {
            None => 0,
            Some(bound) => self.points_below(bound.saturating_add(ROUNDING_MARGIN_NS), previous.past),
        };
        lifetimes.surely_within_from = self.points.get(past).map_or(u64::MAX, |&(time, _)| time);
        (lifetimes.below, lifetimes.past) = (below, past);
        // Times in between lie in the segments from `below` to `past`: a few, unless CLOCK records are dense.
        if past >= below && past - below < MAX_SEGMENTS_BETWEEN {
            lifetimes.first_segment = below;
            lifetimes.thresholds.resize(past - below + 1, None);
        }
        lifetimes
    }

    /// How many points convert below `bound_ns` (the points growing), found
    /// by stepping from `near` when it is close, else by bisecting.
    fn points_below(&self, bound_ns: u64, near: usize) -> usize {
        let points = &self.points;
        let mut at = near.min(points.len());
        for _ in 0..NEAR_STEPS {
            if at < points.len() && points[at].1 < bound_ns {
                at += 1;
            } else if at > 0 && points[at - 1].1 >= bound_ns {
                at -= 1;
            } else {
                return at;
            }
        }
        points.partition_point(|&(_, ns)| ns < bound_ns)
    }

    /// The first time of segment `segment` for which `within` holds (None:
    /// none), `within` holding from some time of the segment on: a
    /// segment's conversion grows with the time. The search starts where
    /// the segment's line reaches `bound_ns` and widens by doubling steps.
    fn first_within(&self, segment: usize, bound_ns: u64, within: impl Fn(u64) -> bool) -> Option<u64> {
        let mut low = segment.checked_sub(1).map_or(0, |before| self.points[before].0);
        let mut high = self.points.get(segment).map_or(u64::MAX, |&(time, _)| time - 1);
        if !within(high) {
            return None;
        }
        if let Some(((start, start_ns), rate)) = self.line(segment).filter(|&(_, rate)| rate > 0.0) {
            let guess = (start as f64 + (bound_ns as f64 - start_ns as f64) / rate).clamp(low as f64, high as f64) as u64;
            let guess = guess.clamp(low, high);
            let mut step = 1u64;
            if within(guess) {
                high = guess;
                while high > low {
                    let probe = high.saturating_sub(step).max(low);
                    if !within(probe) {
                        low = probe + 1;
                        break;
                    }
                    high = probe;
                    step = step.saturating_mul(2);
                }
            } else {
                low = guess + 1;
                while low < high {
                    let probe = low.saturating_add(step).min(high);
                    if within(probe) {
                        high = probe;
                        break;
                    }
                    low = probe + 1;
                    step = step.saturating_mul(2);
                }
            }
        }
        while low < high {
            let middle = low + (high - low) / 2;
            if within(middle) {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        Some(low)
    }

    /// The point a segment's conversion starts from and its rate (ns a
    /// tick); None for a single point.
    #[inline]
    fn line(&self, segment: usize) -> Option<((u64, u64), f64)> {
        let points = &self.points;
        let (a, b) = match (segment, points.len()) {
            (_, 1) => return None,
            (0, _) => (points[0], points[points.len() - 1]),
            (i, n) if i >= n => (points[0], points[n - 1]),
            (i, _) => (points[i - 1], points[i]),
        };
        let ticks = (b.0 - a.0) as f64;
        let ns = b.1.saturating_sub(a.1) as f64;
        Some((a, if ticks > 0.0 { ns / ticks } else { 0.0 }))
    }

    /// The conversion of `time` in segment `segment` (how many points are
    /// at or before it): linear between the points around it, and from the
    /// whole run's rate outside them.
    #[inline]
    fn in_segment(&self, segment: usize, time: u64) -> u64 {
        let Some((a, rate)) = self.line(segment) else { return self.points[0].1 };
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

    /// Points far apart next to the rounding margin, and many within it:
    /// lifetimes found from the points and from a segment's first time
    /// within the limit agree with subtracting conversions.
    #[test]
    fn lifetimes_found_per_segment_are_the_subtracted_ones() {
        for spacing_ns in [3_000_000, 20_000] {
            let mut timeline = Timeline::default();
            timeline.start(&Process { clock: CLOCK_TSC, start_time: 10, start_monotonic_ns: 7_000_000, ..Process::default() });
            for i in 1..200u64 {
                timeline.add(&Clock { time: 10 + i * 100, monotonic_ns: 7_000_000 + i * spacing_ns + (i % 7) * spacing_ns / 8 });
            }
            let searched = |timeline: &Timeline, time: u64| timeline.in_segment(timeline.points.partition_point(|&(t, _)| t <= time), time);
            for later in (0..21_000).step_by(331) {
                for limit in [0, 999_999, 1_000_000, 2_500_000, 30_000_000, 10_000_000_000] {
                    for earlier in (0..=later + 500).step_by(7) {
                        let subtracted = searched(&timeline, later).saturating_sub(searched(&timeline, earlier)) <= limit;
                        assert_eq!(timeline.within_ns(earlier, later, limit), subtracted, "{earlier} to {later} within {limit}");
                    }
                }
            }
        }
    }
}
