//! A Ruby program's headline: what Ruby knows of against what the kernel
//! charges, and the layer (Ruby's object pages or malloc) that loses it.

use memgap_model::Ledger;
use memgap_model::ruby::{NAME, RubyLayer};

/// In front of the verdict whichever owner holds the gap.
pub fn headline(ledger: &Ledger) -> Option<String> {
    let layer: RubyLayer = ledger.section(NAME)?;
    Some(headline_of(ledger, &layer))
}

fn headline_of(l: &Ledger, ruby: &RubyLayer) -> String {
    let b = memgap_model::human_bytes;
    // memgap's own memory is not the program's: left out of the ratio and the gap.
    let program_rss = l.program_rss();
    // Shares of the RSS the kernel reported, as in the ledger's table.
    let rss = l.rss_bytes.max(1);
    let gap = program_rss.saturating_sub(ruby.known_bytes);
    let ruby_rows = l.share(NAME).map_or(0, |s| s.rows.retained + s.rows.fragmented + s.rows.lazy_free);
    let malloc_lost = (l.rows.retained + l.rows.fragmented + l.rows.lazy_free).saturating_sub(ruby_rows);
    let ruby_lost = ruby.free_slots_bytes + ruby.page_overhead_bytes;
    let opening = format!(
        "Ruby {} knows of {} (its live objects and the data they own); the kernel charges {}{}, {} more.",
        ruby.version,
        b(ruby.known_bytes),
        b(program_rss),
        super::times(program_rss, ruby.known_bytes),
        b(gap)
    );
    let layer = if malloc_lost >= ruby_lost {
        format!(
            "The difference sits in the malloc layer, below Ruby: {} ({:.0}% of RSS) is free memory glibc keeps (retained {}, fragmented {}), while Ruby's object pages waste only {}.",
            b(malloc_lost),
            100.0 * malloc_lost as f64 / rss as f64,
            b(l.rows.retained),
            b(l.rows.fragmented),
            b(ruby_lost)
        )
    } else {
        format!(
            "The difference sits in Ruby's own heap: {} of its {} object pages ({:.0}% of their slots) are free slots. Ruby returns a page only when \
             every slot on it is free, so survivors scattered over many pages keep them all. GC.compact (or GC.auto_compact = true) moves the survivors \
             together so whole pages free up.",
            b(ruby.free_slots_bytes),
            ruby.object_pages,
            100.0 * ruby.free_slot_fraction
        )
    };
    format!("{opening} {layer}")
}
