//! `GODEBUG=gctrace=1` lines: one per GC cycle on the program's stderr.
//!
//! Go 1.19–1.20: `gc # @#s #%: #+#+# ms clock, #+#/#/#+# ms cpu, #->#-># MB, # MB goal, # P`;
//! Go 1.21 on add `# MB stacks, #MB globals` before `# P`; `(forced)` ends the
//! line of a cycle started by runtime.GC(). Sizes are whole MB (2^20 bytes).

use memgap_trace::records::Metrics;

use crate::names;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct GcLine {
    pub number: u64,
    /// Seconds since the program started.
    pub seconds: f64,
    /// Percent of CPU time spent in GC since the program started.
    pub cpu_percent: f64,
    pub heap_start_mb: u64,
    pub heap_end_mb: u64,
    /// Heap marked live by this cycle.
    pub live_mb: u64,
    pub goal_mb: u64,
    /// Go 1.21+.
    pub stacks_mb: Option<u64>,
    pub globals_mb: Option<u64>,
    pub procs: u64,
    pub forced: bool,
}

/// Could `line` (possibly not yet complete) be the start of a gctrace line?
/// Used to hold back a partial line until it is known not to be one.
pub fn may_start_line(partial: &[u8]) -> bool {
    partial.starts_with(b"gc ") || b"gc ".starts_with(partial)
}

/// Parses one line (without its newline); `None` if it is not a gctrace line.
pub fn parse(line: &str) -> Option<GcLine> {
    let rest = line.trim_end().strip_prefix("gc ")?;
    let (number, rest) = rest.split_once(' ')?;
    let number = number.parse().ok()?;
    let (at, rest) = rest.strip_prefix('@')?.split_once("s ")?;
    let seconds = at.parse().ok()?;
    let (percent, rest) = rest.split_once("%: ")?;
    let cpu_percent = percent.parse().ok()?;
    let mut gc = GcLine { number, seconds, cpu_percent, ..GcLine::default() };
    let (rest, forced) = match rest.strip_suffix(" (forced)") {
        Some(rest) => (rest, true),
        None => (rest, false),
    };
    gc.forced = forced;
    let mut fields = rest.split(", ");
    if !fields.next()?.ends_with(" ms clock") || !fields.next()?.ends_with(" ms cpu") {
        return None;
    }
    let heaps = fields.next()?.strip_suffix(" MB")?;
    let mut heaps = heaps.split("->").map(|n| n.parse::<u64>().ok());
    (gc.heap_start_mb, gc.heap_end_mb, gc.live_mb) = (heaps.next()??, heaps.next()??, heaps.next()??);
    gc.goal_mb = fields.next()?.strip_suffix(" MB goal")?.parse().ok()?;
    for field in fields {
        let mb = |suffix: &str| field.strip_suffix(suffix).and_then(|n| n.trim().parse::<u64>().ok());
        if let Some(p) = field.strip_suffix(" P").and_then(|n| n.parse().ok()) {
            gc.procs = p;
        } else if let Some(s) = mb("MB stacks") {
            gc.stacks_mb = Some(s);
        } else if let Some(g) = mb("MB globals") {
            gc.globals_mb = Some(g);
        } else {
            return None;
        }
    }
    (gc.procs > 0).then_some(gc)
}

impl GcLine {
    /// As a METRICS record of kind `gc`.
    pub fn to_metrics(&self, monotonic_ns: u64) -> Metrics {
        const MB: f64 = (1u64 << 20) as f64;
        let mut values = vec![
            (names::GCTRACE_CYCLE.to_string(), self.number as f64),
            (names::GCTRACE_SECONDS.to_string(), self.seconds),
            (names::GCTRACE_CPU_PERCENT.to_string(), self.cpu_percent),
            (names::GCTRACE_HEAP_START.to_string(), self.heap_start_mb as f64 * MB),
            (names::GCTRACE_HEAP_END.to_string(), self.heap_end_mb as f64 * MB),
            (names::GCTRACE_LIVE.to_string(), self.live_mb as f64 * MB),
            (names::GCTRACE_GOAL.to_string(), self.goal_mb as f64 * MB),
            (names::GCTRACE_PROCS.to_string(), self.procs as f64),
            (names::GCTRACE_FORCED.to_string(), if self.forced { 1.0 } else { 0.0 }),
        ];
        if let Some(stacks) = self.stacks_mb {
            values.push((names::GCTRACE_STACKS.to_string(), stacks as f64 * MB));
        }
        if let Some(globals) = self.globals_mb {
            values.push((names::GCTRACE_GLOBALS.to_string(), globals as f64 * MB));
        }
        Metrics { monotonic_ns, source: crate::SOURCE.into(), kind: memgap_trace::vocabulary::kind::GC.into(), values }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_1_19_line() {
        // From go1.19's runtime/extern.go format, as printed by go1.19.13.
        let gc = parse("gc 1 @0.012s 2%: 0.026+0.39+0.042 ms clock, 0.21+0.12/0.30/0.14+0.33 ms cpu, 4->4->0 MB, 5 MB goal, 8 P").unwrap();
        assert_eq!(
            gc,
            GcLine {
                number: 1,
                seconds: 0.012,
                cpu_percent: 2.0,
                heap_start_mb: 4,
                heap_end_mb: 4,
                live_mb: 0,
                goal_mb: 5,
                procs: 8,
                ..GcLine::default()
            }
        );
    }

    #[test]
    fn go_1_21_to_1_26_lines() {
        // go1.21.3 (the Go field report's version) and go1.26.8 print stacks and globals.
        let gc = parse("gc 14 @2.510s 0%: 0.018+1.2+0.003 ms clock, 0.14+0.31/2.1/4.6+0.025 ms cpu, 36->36->20 MB, 40 MB goal, 0 MB stacks, 0 MB globals, 8 P (forced)").unwrap();
        assert_eq!((gc.number, gc.heap_start_mb, gc.heap_end_mb, gc.live_mb, gc.goal_mb), (14, 36, 36, 20, 40));
        assert_eq!((gc.stacks_mb, gc.globals_mb, gc.procs, gc.forced), (Some(0), Some(0), 8, true));
        let gc = parse("gc 3 @0.001s 9%: 0.014+0.064+0.001 ms clock, 0.029+0/0.010/0.044+0.002 ms cpu, 12->12->12 MB, 15 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)").unwrap();
        assert_eq!((gc.live_mb, gc.goal_mb, gc.procs), (12, 15, 2));
        let gc = parse("gc 6 @0.044s 11%: 3.1+3.8+0.004 ms clock, 6.3+0/4.3/0.44+0.008 ms cpu, 64->64->8 MB, 81 MB goal, 1 MB stacks, 2MB globals, 2 P").unwrap();
        assert_eq!((gc.stacks_mb, gc.globals_mb, gc.forced), (Some(1), Some(2), false));
    }

    #[test]
    fn other_lines_are_not_gctrace() {
        for line in [
            "gc is great",
            "gc 1 @0.1s 2%: whatever",
            "scav 0 KiB work (bg), 7120 KiB work (eager), 16224 KiB now, 100% util (forced)",
            "",
            "gc 1 @0.012s 2%: 0.026+0.39+0.042 ms clock, 0.21+0.12/0.30/0.14+0.33 ms cpu, 4->4->0 MB, 5 MB goal, 8 P extra",
        ] {
            assert_eq!(parse(line), None, "{line}");
        }
    }

    #[test]
    fn partial_lines() {
        assert!(may_start_line(b""));
        assert!(may_start_line(b"g"));
        assert!(may_start_line(b"gc 12 @0.5s"));
        assert!(!may_start_line(b"go"));
        assert!(!may_start_line(b"Enter your name: "));
    }

    #[test]
    fn metrics_in_bytes() {
        let m = parse("gc 2 @0.5s 1%: 1+1+1 ms clock, 1+1/1/1+1 ms cpu, 3->4->2 MB, 5 MB goal, 2 P").unwrap().to_metrics(7);
        assert_eq!(m.get(names::GCTRACE_LIVE), Some(2.0 * 1048576.0));
        assert_eq!(m.get(names::GCTRACE_STACKS), None);
        assert_eq!((m.source.as_str(), m.kind.as_str(), m.monotonic_ns), ("go", "gc", 7));
    }
}
