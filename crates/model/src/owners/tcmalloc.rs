//! tcmalloc (gperftools): no header; freed objects wait in thread and
//! central caches, free spans in the page heap are released to the OS at
//! TCMALLOC_RELEASE_RATE (default 1), or at once with aggressive decommit.

use super::malloc::{Allocator, MallocOwner, finding_bytes};
use crate::ledger::{Finding, Ledger, MallocLayout, Remedy};

pub const NAME: &str = "tcmalloc";
const WORTH_TRYING: u64 = 1 << 20;

#[derive(Default)]
pub struct TcmallocMalloc;

pub type Tcmalloc = MallocOwner<TcmallocMalloc>;

impl MallocLayout for TcmallocMalloc {}

impl Allocator for TcmallocMalloc {
    const NAME: &'static str = NAME;

    fn remedies(_ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        let retained = finding_bytes(findings, NAME, "retained");
        let mut out = Vec::new();
        if retained >= WORTH_TRYING {
            out.push(Remedy::new(
                "tcmalloc-aggressive-decommit",
                NAME,
                "release free spans to the OS as soon as they are free: TCMALLOC_AGGRESSIVE_DECOMMIT=true",
                &[("TCMALLOC_AGGRESSIVE_DECOMMIT", "true")],
                retained,
            ));
            out.push(Remedy::new(
                "tcmalloc-release-rate",
                NAME,
                "release free spans ten times faster: TCMALLOC_RELEASE_RATE=10",
                &[("TCMALLOC_RELEASE_RATE", "10")],
                retained / 2,
            ));
            out.push(Remedy::new(
                "tcmalloc-release-from-code",
                NAME,
                "release from the program after a burst: MallocExtension::instance()->ReleaseFreeMemory()",
                &[],
                retained,
            ));
        }
        out
    }
}
