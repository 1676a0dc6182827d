//! `memgap watch`: the outside ledger of each watched process, as one plain
//! line per reading (scripts, logs) or as a panel redrawn in place on a
//! terminal: the rows as bars and an RSS sparkline.

use std::fmt::Write;

use memgap_model::ProcessLedger;

use crate::format::bytes;
use crate::palette;

/// Levels of the sparkline, lowest to highest.
const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Bytes without the space, so that a line splits on spaces into `key=value`.
fn compact(value: u64) -> String {
    bytes(value).replace(' ', "")
}

/// One reading as one line: `seconds=1.20 pid=42 comm=app rss=96.1MiB live=… trim=… stopped=12ms`.
/// Rows not known are not printed: `unknown=` names them, `walk_failure=` says why.
pub fn line(seconds: f64, l: &ProcessLedger, mark: Option<&str>) -> String {
    let mut out = format!("seconds={seconds:.2} pid={} comm={} rss={}", l.pid, l.command.replace(' ', "_"), compact(l.rss_bytes));
    for (name, value) in l.rows.shown() {
        if !l.unknown_rows.contains(&name) {
            let _ = write!(out, " {name}={}", compact(value));
        }
    }
    if !l.unknown_rows.is_empty() {
        let _ = write!(out, " unknown={}", l.unknown_rows.join(","));
    }
    if let Some(trim) = l.trim_would_return_bytes {
        let _ = write!(out, " trim={}", compact(trim));
    }
    if let Some(walk) = &l.walk {
        let _ = write!(out, " stopped={:.1}ms", walk.stopped_ms);
    }
    if let Some(cgroup) = l.cgroup.as_ref().and_then(|c| c.used_percent) {
        let _ = write!(out, " cgroup={cgroup:.1}%");
    }
    if let Some(why) = &l.walk_failure {
        let _ = write!(out, " walk_failure={:?}", why);
    }
    if let Some(mark) = mark {
        let _ = write!(out, " mark={mark:?}");
    }
    out
}

/// The last `width` values as a sparkline, scaled from 0 to their highest.
pub fn sparkline(values: &[u64], width: usize) -> String {
    let shown = &values[values.len().saturating_sub(width)..];
    let top = shown.iter().copied().max().unwrap_or(0).max(1);
    shown.iter().map(|&v| SPARKS[((v as f64 / top as f64) * 7.0).round().clamp(0.0, 7.0) as usize]).collect()
}

/// One process on a terminal: a title with RSS and its sparkline, each row
/// as a bar of its share of RSS, and the trim forecast and the last mark.
pub fn panel(l: &ProcessLedger, rss_history: &[u64], mark: Option<&str>, width: usize, color: bool) -> String {
    let width = width.max(40);
    let mut out = String::new();
    let title = format!("pid {} ({})  RSS {}  ", l.pid, l.command, bytes(l.rss_bytes));
    let spark_width = width.saturating_sub(title.chars().count() + 1).min(60);
    let _ = writeln!(out, "{title}{}", sparkline(rss_history, spark_width));
    const LABEL: usize = 11;
    const VALUE: usize = 11;
    let bar_width = width.saturating_sub(LABEL + VALUE + 5).clamp(10, 60);
    let total = l.rss_bytes.max(l.rows.total()).max(1);
    for (name, value) in l.rows.shown() {
        if l.unknown_rows.contains(&name) {
            continue;
        }
        let cells = ((value as f64 / total as f64) * bar_width as f64).round() as usize;
        let bar = "█".repeat(cells.min(bar_width));
        let bar = if color { palette::paint(&bar, palette::row(name)) } else { bar };
        let _ = writeln!(out, "  {name:<LABEL$} {:>VALUE$} {bar}", bytes(value));
    }
    if !l.unknown_rows.is_empty() {
        let why = l.walk_failure.as_deref().unwrap_or("not known from outside for this allocator");
        let _ = writeln!(out, "  {} unknown: {why}", l.unknown_rows.join(", "));
    }
    let mut facts = Vec::new();
    if let Some(trim) = l.trim_would_return_bytes {
        facts.push(format!("malloc_trim(0) would return {}", bytes(trim)));
    }
    if let Some(walk) = &l.walk {
        facts.push(format!("stopped {:.1} ms", walk.stopped_ms));
    }
    if let Some(c) = &l.cgroup
        && let (Some(percent), Some(max)) = (c.used_percent, c.max_bytes)
    {
        facts.push(format!("cgroup at {percent:.0}% of {}", bytes(max)));
    }
    if let Some(mark) = mark {
        facts.push(mark.to_string());
    }
    if !facts.is_empty() {
        let _ = writeln!(out, "  {}", facts.join("; "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_model::KnownRows;

    fn walked() -> ProcessLedger {
        ProcessLedger {
            pid: 42,
            command: "stages".into(),
            rss_bytes: 100 << 20,
            rows: KnownRows {
                heap: 80 << 20,
                lazy_free: 0,
                runtime: 1 << 20,
                other: 19 << 20,
                live: Some(40 << 20),
                slack: Some(1 << 20),
                fragmented: Some(9 << 20),
                retained: Some(30 << 20),
            },
            trim_would_return_bytes: Some(28 << 20),
            ..ProcessLedger::default()
        }
    }

    #[test]
    fn a_line_gives_every_known_row_and_names_the_unknown_ones() {
        let text = line(1.5, &walked(), Some("rss crossed 64.0 MiB"));
        assert_eq!(
            text,
            "seconds=1.50 pid=42 comm=stages rss=100MiB live=40.0MiB slack=1.00MiB fragmented=9.00MiB retained=30.0MiB \
             lazy_free=0B runtime=1.00MiB other=19.0MiB trim=28.0MiB mark=\"rss crossed 64.0 MiB\""
        );
        let mut outside = walked();
        outside.rows.live = None;
        outside.unknown_rows = memgap_model::UNKNOWN_ROWS.to_vec();
        outside.trim_would_return_bytes = None;
        let text = line(2.0, &outside, None);
        assert!(text.contains(" heap=80.0MiB ") && text.ends_with(" unknown=live,slack,fragmented,retained"), "{text}");
        assert!(!text.contains("live="), "{text}");
    }

    #[test]
    fn bars_are_shares_of_rss_and_the_sparkline_scales_to_its_highest() {
        assert_eq!(sparkline(&[0, 50, 100], 10), "▁▅█");
        assert_eq!(sparkline(&[1, 2, 3, 4], 2), "▆█");
        let text = panel(&walked(), &[10, 20], None, 80, false);
        let live = text.lines().find(|l| l.trim_start().starts_with("live")).unwrap();
        let retained = text.lines().find(|l| l.trim_start().starts_with("retained")).unwrap();
        assert!(live.matches('█').count() > retained.matches('█').count(), "{text}");
        assert!(text.contains("malloc_trim(0) would return 28.0 MiB"), "{text}");
    }
}
