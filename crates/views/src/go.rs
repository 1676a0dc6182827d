//! The Go section of `memgap ledger` (terminal) and the report's Go panel
//! (markup and script in src/report/go.html), for ledgers of Go programs.

use std::fmt::Write;

use memgap_model::GoLedger;
use memgap_model::go::GoSource;

use crate::format::{bytes, count};

/// Size classes listed in the terminal, most unused bytes first.
const CLASSES_SHOWN: usize = 8;

/// The report's Go panel: included only when a snapshot has Go data.
pub const PANEL: &str = include_str!("report/go.html");

/// Where the figures came from, in words (the terminal's and the report's).
pub fn source_text(source: GoSource) -> &'static str {
    match source {
        GoSource::RuntimeMetrics => "runtime/metrics from the helper package",
        GoSource::Memstats => "runtime.MemStats over HTTP",
        GoSource::ProcessMemory => "the runtime's accounting read from the process's memory",
        GoSource::Gctrace => "gctrace lines only",
        GoSource::None => "no runtime figures yet",
    }
}

/// Lines for the terminal ledger, after the rows.
pub fn section(g: &GoLedger) -> String {
    let mut out = String::new();
    let source = source_text(g.source);
    let _ = writeln!(
        out,
        "  Go {} — {source}{}:",
        g.version.as_deref().unwrap_or("(version unknown)"),
        match g.figures_age_seconds {
            Some(age) => format!(", {:.0} ms before the snapshot", age * 1000.0),
            None => String::new(),
        }
    );
    if g.exact {
        let _ = writeln!(
            out,
            "    heap objects {}, unused in spans {}, free spans {}, released {}, stacks {}; heap usage (HeapSys − HeapReleased) {}; runtime total {}.",
            bytes(g.heap_objects_bytes),
            bytes(g.heap_unused_bytes),
            bytes(g.heap_free_bytes),
            bytes(g.heap_released_bytes),
            bytes(g.heap_stacks_bytes),
            bytes(g.heap_usage_bytes),
            bytes(g.total_bytes)
        );
    } else if let Some(live) = g.last_gc_live_bytes {
        let _ = writeln!(out, "    the last GC marked {} live (whole MB); goal {}.", bytes(live), bytes(g.heap_goal_bytes.unwrap_or(0)));
    }
    let _ = writeln!(
        out,
        "    heap mappings: {} resident in {}; counted by the runtime but never touched {}; resident beyond its count {}.",
        bytes(g.heap_resident_bytes),
        g.heap_mappings,
        bytes(g.untouched_bytes),
        bytes(g.unaccounted_heap_bytes)
    );
    let mut facts = Vec::new();
    if let Some(cycles) = g.gc_cycles {
        facts.push(format!("{cycles} GC cycles"));
    }
    if let Some(goroutines) = g.goroutines {
        facts.push(format!("{goroutines} goroutines"));
    }
    if !facts.is_empty() {
        let _ = writeln!(out, "    {}.", facts.join(", "));
    }
    if !g.size_classes.is_empty() {
        let mut classes: Vec<_> = g.size_classes.iter().collect();
        classes.sort_by(|a, b| b.unused_bytes_estimate.cmp(&a.unused_bytes_estimate).then(b.live_bytes.cmp(&a.live_bytes)));
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "  {:>7} {:>9} {:>12} {:>10} {:>9} {:>9} {:>9} {:>10}",
            "class", "per span", "live objs", "live", "spans", "needed", "full", "unused"
        );
        for c in classes.iter().take(CLASSES_SHOWN) {
            let mark = if g.sparse_classes.contains(&c.size) { "  ← sparse" } else { "" };
            let _ = writeln!(
                out,
                "  {:>7} {:>9} {:>12} {:>10} {:>9} {:>9} {:>8.1}% {:>10}{mark}",
                format!("{} B", c.size),
                c.objects_per_span,
                count(c.live_objects),
                bytes(c.live_bytes),
                count(c.spans_estimate),
                count(c.spans_needed),
                c.occupancy * 100.0,
                bytes(c.unused_bytes_estimate)
            );
        }
        let _ = writeln!(
            out,
            "  (spans per class are estimated: between what the live objects need and what the class's peak needed, sharing the runtime's unused bytes)"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_model::GoSizeClass;

    #[test]
    fn lists_the_sparse_class_first() {
        let g = GoLedger {
            version: Some("go1.26.8".into()),
            source: GoSource::RuntimeMetrics,
            exact: true,
            heap_unused_bytes: 16 << 20,
            size_classes: vec![
                GoSizeClass {
                    size: 32,
                    objects_per_span: 256,
                    live_objects: 1 << 19,
                    live_bytes: 16 << 20,
                    spans_estimate: 2048,
                    spans_needed: 2048,
                    occupancy: 1.0,
                    ..GoSizeClass::default()
                },
                GoSizeClass {
                    size: 16,
                    objects_per_span: 504,
                    live_objects: 2048,
                    live_bytes: 32768,
                    spans_estimate: 2048,
                    spans_needed: 5,
                    occupancy: 0.002,
                    unused_bytes_estimate: 16 << 20,
                    ..GoSizeClass::default()
                },
            ],
            sparse_classes: vec![16],
            ..GoLedger::default()
        };
        let text = section(&g);
        assert!(text.contains("Go go1.26.8 — runtime/metrics"), "{text}");
        let sixteen = text.find("16 B").unwrap();
        assert!(sixteen < text.find("32 B").unwrap());
        assert!(text[sixteen..].lines().next().unwrap().contains("← sparse"), "{text}");
    }
}
