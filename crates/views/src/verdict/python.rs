//! A CPython program's verdict when pymalloc holds the gap.

pub use memgap_model::owners::python::NAME;
use memgap_model::owners::python::PythonSection;
use memgap_model::{Ledger, human_bytes};

pub fn verdict(ledger: &Ledger) -> Option<String> {
    let part = ledger.share(NAME)?;
    let section: PythonSection = ledger.section(NAME)?;
    let b = human_bytes;
    // Of the RSS the kernel reported, as in the ledger's table.
    let rss = ledger.rss_bytes.max(1);
    let r = &part.rows;
    let mut text = format!(
        "CPython {}'s pymalloc holds {} of RSS in {} arenas for {} of allocated blocks ({} objects and buffers of up to 512 bytes).",
        section.version,
        b(r.total()),
        section.arenas,
        b(section.allocated_blocks_bytes),
        section.allocated_blocks
    );
    if r.fragmented > 0 {
        text.push_str(&format!(
            " {} ({:.0}% of RSS) is free blocks and empty pools inside arenas that still hold live blocks: pymalloc returns an arena to the kernel only when every pool in it is empty, so a few survivors per arena keep it all.",
            b(r.fragmented),
            100.0 * r.fragmented as f64 / rss as f64
        ));
    }
    if r.retained > 0 {
        text.push_str(&format!(" {} is arenas that hold no block (pymalloc keeps the last one to avoid thrashing).", b(r.retained)));
    }
    text.push_str(&super::remedies_sentence(ledger));
    Some(text)
}
