//! A Go program's verdict: spans, size classes and the scavenger.

use memgap_model::Ledger;
pub use memgap_model::go::NAME;
use memgap_model::go::{GoLedger, GoSizeClass, GoSource};

fn mib(bytes: u64) -> String {
    memgap_model::human_bytes(bytes)
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 * 100.0 / whole as f64 }
}

/// One paragraph for a Go program: the dominant row besides live, and the
/// remedies for it, with the numbers.
pub fn verdict(l: &Ledger) -> Option<String> {
    let g: GoLedger = l.section(NAME)?;
    let r = &l.rows;
    let rss = l.rss_bytes.max(1);
    let opening = format!(
        "The Go heap holds {} of objects; the kernel charges {} of RSS{}.",
        mib(r.live),
        mib(l.rss_bytes),
        super::times(l.rss_bytes, r.live)
    );
    if !g.exact {
        let why = match g.source {
            GoSource::Gctrace => format!(
                "Only gctrace is known, so the split is {}: live {}, fragmented {}, retained {}.",
                g.estimated.as_deref().unwrap_or("estimated"),
                mib(r.live),
                mib(r.fragmented),
                mib(r.retained)
            ),
            _ => format!("The runtime reported nothing yet; {}.", g.estimated.as_deref().unwrap_or("no GC had run")),
        };
        return Some(format!(
            "{opening} {why}{} For the exact split, import memgap.dev/go/memgap (it reports runtime/metrics to memgap run).",
            super::remedies_sentence(l)
        ));
    }
    let mut gap =
        [("fragmented", r.fragmented), ("retained", r.retained), ("lazy_free", r.lazy_free), ("runtime", r.runtime), ("other", r.other)];
    gap.sort_by_key(|row| std::cmp::Reverse(row.1));
    let (dominant, bytes) = gap[0];
    let share = percent(bytes, rss);
    if bytes < r.live / 4 {
        return Some(format!("{opening} Most of it is live objects: the runtime adds little. Shrinking RSS means holding less."));
    }
    let body = match dominant {
        "fragmented" => {
            let mut text = format!(
                "{share:.0}% of RSS ({}) is free slots in spans that still hold live objects: fragmentation. Go's GC does not move objects, so a span \
                 (8 KiB or more, one size class) is freed only when its last object dies.",
                mib(bytes)
            );
            let sparse: Vec<&GoSizeClass> = g.sparse_classes.iter().filter_map(|s| g.size_classes.iter().find(|c| c.size == *s)).collect();
            for class in sparse.iter().take(3) {
                text.push_str(&format!(
                    " {}-byte objects: {} live in about {} spans of {} ({:.1}% full, {} unused; packed they would need {} spans).",
                    class.size,
                    class.live_objects,
                    class.spans_estimate,
                    class.objects_per_span,
                    class.occupancy * 100.0,
                    mib(class.unused_bytes_estimate),
                    class.spans_needed
                ));
            }
            let saving: u64 = sparse.iter().map(|c| (c.spans_estimate - c.spans_needed) * c.span_bytes).sum();
            text.push_str(&format!(
                " Remedies: copy the survivors into new objects to compact them{}; use []T instead of []*T (one allocation instead of many small ones); \
                 allocate long-lived objects apart from short-lived ones (together, at one time, or in their own size class); shorten lifetimes so spans empty out.",
                if saving > 0 { format!(" (about {} back)", mib(saving)) } else { String::new() }
            ));
            text
        }
        "retained" => format!(
            "{share:.0}% of RSS ({}) is free spans the runtime keeps. The scavenger returns them over minutes; debug.FreeOSMemory() returns them at once, \
             and GOMEMLIMIT makes the scavenger return them as the limit nears.",
            mib(bytes)
        ),
        "lazy_free" => format!(
            "{share:.0}% of RSS ({}) was returned with MADV_FREE and is counted until the kernel needs it (GODEBUG=madvdontneed=0?). Nothing to fix.",
            mib(bytes)
        ),
        "runtime" => format!(
            "{share:.0}% of RSS ({}) is goroutine stacks ({}){} and the runtime's own structures.",
            mib(bytes),
            mib(g.heap_stacks_bytes),
            g.goroutines.map(|n| format!(" of {n} goroutines")).unwrap_or_default()
        ),
        _ => format!(
            "{share:.0}% of RSS ({}) is outside the Go heap: the binary and files {}, C memory (cgo) and other {}.",
            mib(bytes),
            mib(l.other_breakdown.file + l.other_breakdown.shmem),
            mib(l.other_breakdown.unclassified)
        ),
    };
    Some(format!("{opening} {body}"))
}
