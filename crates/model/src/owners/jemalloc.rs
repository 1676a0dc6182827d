//! jemalloc: no header; dirty pages (freed, still resident) wait
//! `dirty_decay_ms` (10 s) before they are purged, then as MADV_FREE'd
//! "muzzy" pages another `muzzy_decay_ms`; purging runs on allocation calls
//! unless a background thread does it. Remedies: its MALLOC_CONF knobs.

use super::malloc::{Allocator, MallocOwner, finding_bytes};
use crate::ledger::{Finding, Ledger, MallocLayout, Remedy};

pub const NAME: &str = "jemalloc";
const WORTH_TRYING: u64 = 1 << 20;

#[derive(Default)]
pub struct JemallocMalloc;

pub type Jemalloc = MallocOwner<JemallocMalloc>;

impl MallocLayout for JemallocMalloc {}

impl Allocator for JemallocMalloc {
    const NAME: &'static str = NAME;

    fn remedies(_ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        let retained = finding_bytes(findings, NAME, "retained");
        let lazy = finding_bytes(findings, NAME, "lazy_free");
        let mut out = Vec::new();
        if retained + lazy >= WORTH_TRYING {
            out.push(Remedy::new(
                "jemalloc-decay",
                NAME,
                "purge freed pages at once instead of after 10 s: MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0",
                &[("MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")],
                retained + lazy,
            ));
        }
        if retained >= WORTH_TRYING {
            out.push(Remedy::new(
                "jemalloc-background-thread",
                NAME,
                "let a background thread purge on time even when the program stops allocating: MALLOC_CONF=background_thread:true",
                &[("MALLOC_CONF", "background_thread:true")],
                retained / 2,
            ));
            out.push(Remedy::new(
                "jemalloc-purge-from-code",
                NAME,
                "purge from the program after a burst: mallctl(\"arena.4096.purge\", NULL, NULL, NULL, 0) (MALLCTL_ARENAS_ALL)",
                &[],
                retained,
            ));
        }
        let fragmented = finding_bytes(findings, NAME, "fragmented");
        if fragmented >= WORTH_TRYING {
            out.push(Remedy::new(
                "jemalloc-narenas",
                NAME,
                "one arena, so threads share partly filled slabs: MALLOC_CONF=narenas:1",
                &[("MALLOC_CONF", "narenas:1")],
                0,
            ));
        }
        out
    }
}
