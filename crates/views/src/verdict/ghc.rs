//! A GHC program's verdict: its megablocks, then the RTS report's finding.

use memgap_model::Ledger;
use memgap_model::ghc::GhcReport;
pub use memgap_model::ghc::NAME;

pub fn verdict(ledger: &Ledger) -> Option<String> {
    let report: GhcReport = ledger.section(NAME)?;
    let part = ledger.share(NAME)?;
    let b = memgap_model::human_bytes;
    let r = &part.rows;
    let opening = format!(
        "The GHC heap holds {} of live data (last major GC); its megablocks take {} of the {} RSS: fragmented {} (blocks not live: nursery, slop, dead neighbours in pinned blocks), retained {} (free megablocks), lazy_free {}.",
        b(r.live),
        b(r.total()),
        b(ledger.rss_bytes),
        b(r.fragmented),
        b(r.retained),
        b(r.lazy_free)
    );
    Some(format!("{opening} {}{}", crate::ghc::verdict(&report), super::remedies_sentence(ledger)))
}
