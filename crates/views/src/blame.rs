//! Terminal view of blame: the call sites whose live blocks cost the most.

use std::fmt::Write;

use memgap_model::{Blame, BlameOrder};

use crate::format::{bytes, count};

/// Given a `width`, the site column (and the stack) is cut to fit it.
pub fn blame(b: &Blame, title: &str, width: Option<usize>) -> String {
    // The numeric columns and their gaps before the site.
    const SITE_FROM: usize = 56;
    let cut = |text: String, room: usize| -> String {
        if text.chars().count() <= room {
            return text;
        }
        let mut kept: String = text.chars().take(room.saturating_sub(1)).collect();
        kept.push('…');
        kept
    };
    let frame_room = width.map_or(usize::MAX, |w| w.saturating_sub(4).max(16));
    let mut out = String::new();
    let _ = writeln!(out, "memgap blame — {title} — {}", crate::format::moment(b.moment.as_ref(), b.at_seconds, b.snapshot_reason));
    let _ = writeln!(
        out,
        "  RSS {}, live heap {}, fragmented {} (the sum of the fragmentation column)\n",
        bytes(b.rss_bytes),
        bytes(b.live_bytes),
        bytes(b.fragmented_bytes)
    );
    let churn = matches!(b.order, BlameOrder::Allocated | BlameOrder::Temporary);
    let site_from = if churn { SITE_FROM + 4 } else { SITE_FROM };
    let site_room = width.map_or(usize::MAX, |w| w.saturating_sub(site_from).max(8));
    if churn {
        let _ = writeln!(
            out,
            "  Over the whole run: {} allocations, {}; {} of them ({}) freed within {} ms (temporary)\n",
            count(b.allocations),
            bytes(b.allocated_bytes),
            count(b.temporary_allocations),
            bytes(b.temporary_bytes),
            b.temporary_ms
        );
    }
    if !b.has_stacks {
        let _ = writeln!(out, "  The trace has no call stacks (recorded with --no-stacks): everything is one entry.\n");
    }
    if churn {
        let _ = writeln!(out, "  {:>11} {:>10} {:>11} {:>10} {:>10}  site", "allocations", "allocated", "temporary", "temp bytes", "live");
    } else {
        let _ = writeln!(out, "  {:>11} {:>10} {:>10} {:>10} {:>7}  site", "fragmented", "live", "objects", "leaked", "scatter");
    }
    for e in &b.entries {
        let location = match (&e.file, e.line) {
            (Some(file), Some(line)) => format!(" ({}:{line})", short_path(file)),
            _ if !e.module.is_empty() => format!(" ({})", short_path(&e.module)),
            _ => String::new(),
        };
        let site = cut(format!("{}{location}", e.function.as_deref().unwrap_or("?")), site_room);
        if churn {
            let _ = writeln!(
                out,
                "  {:>11} {:>10} {:>11} {:>10} {:>10}  {site}",
                count(e.allocations),
                bytes(e.allocated_bytes),
                count(e.temporary_allocations),
                bytes(e.temporary_bytes),
                bytes(e.live_bytes),
            );
        } else {
            let _ = writeln!(
                out,
                "  {:>11} {:>10} {:>10} {:>10} {:>7.1}  {site}",
                bytes(e.fragmentation_bytes),
                bytes(e.live_bytes),
                count(e.objects),
                bytes(e.leaked_bytes),
                e.scatter,
            );
        }
    }
    if let Some(top) = b.entries.first() {
        let _ = writeln!(out, "\n  stack of the first entry:");
        for frame in top.stack.iter().take(16) {
            let _ = writeln!(out, "    {}", cut(frame.to_string(), frame_room));
        }
    }
    for warning in &b.warnings {
        let _ = writeln!(out, "  note: {warning}");
    }
    out
}

/// The last two components of a path: enough to recognise a file.
fn short_path(path: &str) -> &str {
    let mut slashes = path.rmatch_indices('/');
    match (slashes.next(), slashes.next()) {
        (Some(_), Some((i, _))) => &path[i + 1..],
        _ => path,
    }
}
