//! A Node program's verdict: V8's heap, and the headline that weighs it
//! against the malloc layer where Node's external memory lives.

pub use memgap_model::owners::node::NAME;
use memgap_model::owners::node::{MALLOC_OWNERS, NodeLayer};
use memgap_model::{Ledger, human_bytes};

/// In front of the verdict whichever owner holds the gap.
pub fn headline(ledger: &Ledger) -> Option<String> {
    let layer: NodeLayer = ledger.section(NAME)?;
    Some(headline_of(ledger, &layer))
}

pub fn verdict(ledger: &Ledger) -> Option<String> {
    let layer: NodeLayer = ledger.section(NAME)?;
    let part = ledger.share(NAME)?;
    let b = human_bytes;
    let mut text = format!(
        "V8's heap holds {} resident: {} in use, {} free inside its pages, {} committed but empty{}.",
        b(part.rows.total()),
        b(part.rows.live),
        b(part.rows.fragmented),
        b(part.rows.retained + part.rows.lazy_free),
        if layer.semi_space_unused_bytes > 0 {
            format!(" (of which the young generation's unused semi-space {})", b(layer.semi_space_unused_bytes.min(part.rows.retained)))
        } else {
            String::new()
        }
    );
    text.push_str(&super::remedies_sentence(ledger));
    Some(text)
}

fn headline_of(l: &Ledger, node: &NodeLayer) -> String {
    let b = human_bytes;
    let v8 = l.share(NAME).map_or(0, |s| s.rows.total());
    let malloc: u64 = l.owners.iter().filter(|s| MALLOC_OWNERS.contains(&s.owner)).map(|s| s.rows.total()).sum();
    format!(
        "Node {} (V8 {}): V8's heap holds {} of RSS {} ({} used by JavaScript objects); the malloc layer {}, where Node's external memory lives ({} external, {} of it array buffers and Buffers).",
        node.version,
        node.v8_version,
        b(v8),
        b(l.rss_bytes),
        b(node.heap_used_bytes),
        b(malloc),
        b(node.external_bytes),
        b(node.array_buffers_bytes)
    )
}
