//! mimalloc: no header; pages freed by the program are purged (reset or
//! decommitted) after a delay, and segments cached per thread.

use super::malloc::{Allocator, MallocOwner, finding_bytes};
use crate::ledger::{Finding, Ledger, MallocLayout, Remedy};

pub const NAME: &str = "mimalloc";
const WORTH_TRYING: u64 = 1 << 20;

#[derive(Default)]
pub struct MimallocMalloc;

pub type Mimalloc = MallocOwner<MimallocMalloc>;

impl MallocLayout for MimallocMalloc {}

impl Allocator for MimallocMalloc {
    const NAME: &'static str = NAME;

    fn remedies(_ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        let retained = finding_bytes(findings, NAME, "retained");
        let lazy = finding_bytes(findings, NAME, "lazy_free");
        let mut out = Vec::new();
        if retained + lazy >= WORTH_TRYING {
            // MIMALLOC_PURGE_* from mimalloc 2.1, MIMALLOC_RESET_* before.
            out.push(Remedy::new(
                "mimalloc-purge-delay",
                NAME,
                "purge free pages at once and decommit them: MIMALLOC_PURGE_DELAY=0 MIMALLOC_PURGE_DECOMMITS=1 (mimalloc < 2.1: MIMALLOC_RESET_DELAY=0 MIMALLOC_RESET_DECOMMITS=1)",
                &[("MIMALLOC_PURGE_DELAY", "0"), ("MIMALLOC_PURGE_DECOMMITS", "1"), ("MIMALLOC_RESET_DELAY", "0"), ("MIMALLOC_RESET_DECOMMITS", "1")],
                retained + lazy,
            ));
            out.push(Remedy::new(
                "mimalloc-collect-from-code",
                NAME,
                "collect from the program after a burst: mi_collect(true)",
                &[],
                retained,
            ));
        }
        out
    }
}
