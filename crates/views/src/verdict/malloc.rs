//! The verdict when a malloc (glibc, jemalloc, tcmalloc, mimalloc) holds
//! the gap.

use memgap_model::{Ledger, human_bytes};

/// The mallocs whose verdict this is.
pub use memgap_model::owners::node::MALLOC_OWNERS as NAMES;

/// The malloc's verdict: the dominant row besides live, what it is, and its
/// remedies (only this allocator's).
pub fn verdict(l: &Ledger, owner: &str) -> String {
    // Of the RSS the kernel reported, as in the ledger's table.
    let rss = l.rss_bytes.max(1);
    let r = &l.rows;
    let heap_total = r.live + r.slack + r.fragmented + r.retained + r.lazy_free;
    let mut gap_rows = super::program_gap_rows(l);
    gap_rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    let (dominant, bytes) = gap_rows[0];
    let b = human_bytes;
    let opening = super::opening(l);
    let share = bytes as f64 * 100.0 / rss as f64;
    if bytes < r.live / 4 && r.live > heap_total / 2 {
        return format!("{opening} Most of it is live data: the allocator and runtime add little. Shrinking RSS means holding less.");
    }
    let body = match dominant {
        "fragmented" => format!(
            "{share:.0}% of RSS ({}) is free space on pages that still hold live blocks: fragmentation. The allocator cannot return a page while one block on it lives. \
             It usually comes from long-lived objects allocated among short-lived ones; separating them (arenas or pools per lifetime) or fewer and larger \
             objects helps. `memgap blame` names the call sites whose survivors pin the pages.",
            b(bytes)
        ),
        "retained" => {
            let arenas = if l.arenas > 1 { format!(" in {} {owner} arenas", l.arenas) } else { String::new() };
            let trim = if owner == memgap_model::owners::glibc::NAME {
                format!(
                    " malloc_trim(0) would return about {} of it now{}.",
                    b(l.trim_would_return_bytes),
                    if l.retained_not_trimmable_bytes > 0 {
                        format!("; {} sits where trim cannot reach (arena tops, tcache)", b(l.retained_not_trimmable_bytes))
                    } else {
                        String::new()
                    }
                )
            } else {
                String::new()
            };
            format!("{share:.0}% of RSS ({}) is free pages the allocator ({owner}) keeps{arenas}.{trim}", b(bytes))
        }
        "lazy_free" => format!(
            "{share:.0}% of RSS ({}) was returned with MADV_FREE and is still counted until the kernel needs the memory. Nothing to fix: it is reclaimed under pressure.",
            b(bytes)
        ),
        "slack" => format!(
            "{share:.0}% of RSS ({}) is allocator overhead inside live blocks (headers, alignment, size-class rounding). Fewer, larger objects help.",
            b(bytes)
        ),
        "runtime" => {
            format!("{share:.0}% of RSS ({}) is thread stacks and runtime metadata. Fewer threads or smaller stacks help.", b(bytes))
        }
        _ => super::other_sentence(l, share, bytes),
    };
    format!("{opening} {body}{}", super::remedies_sentence(l))
}
