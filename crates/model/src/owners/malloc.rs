//! What every malloc owner shares: it is present when the agent found it
//! serving the program, its mappings are accounted page by page by the core
//! ledger from the live blocks, and its findings are the rows of its share.
//! Each allocator (glibc.rs, jemalloc.rs…) says how to recognise it, how its
//! blocks sit in memory, and which of its own knobs address each finding.

use memgap_trace::records::Metrics;

use super::allocator_stats::AllocatorStats;
use crate::ledger::owner::{Taken, share};
use crate::ledger::{Finding, HeapOwner, Ledger, MallocLayout, Remedy};

/// The owner name of the malloc nobody recognised.
pub const UNKNOWN_MALLOC: &str = "malloc";

/// A finding smaller than this share of RSS is left out.
const FINDING_MIN_SHARE: f64 = 0.01;

/// One malloc implementation.
pub trait Allocator: MallocLayout + Default {
    const NAME: &'static str;
    /// Whether the library at `path` (the agent's ALLOCATOR record) is this
    /// malloc: by default, its file name contains the allocator's name.
    fn serves(path: &str) -> bool {
        path.rsplit('/').next().is_some_and(|file| file.contains(Self::NAME))
    }
    /// Its own remedies for the findings (only knobs of this allocator).
    fn remedies(ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy>;
}

#[derive(Default)]
pub struct MallocOwner<A: Allocator> {
    allocator: A,
    present: bool,
    /// Its own figures at each snapshot (linked into the program, where no
    /// hook sees its calls, or mimalloc's committed bytes).
    stats: Vec<AllocatorStats>,
}

impl<A: Allocator> HeapOwner for MallocOwner<A> {
    fn name(&self) -> &'static str {
        A::NAME
    }

    fn present(&self) -> bool {
        self.present || !self.stats.is_empty()
    }

    fn allocator(&mut self, path: &str) {
        self.present = A::serves(path);
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if let Some(stats) = AllocatorStats::from_metrics(metrics, A::NAME) {
            self.stats.push(stats);
        }
    }

    fn describes_its_snapshot(&self, metrics: &Metrics) -> bool {
        AllocatorStats::from_metrics(metrics, A::NAME).is_some()
    }

    fn annotate(&self, ledger: &mut Ledger, taken: Taken) {
        let Some(at) = self.stats.iter().rposition(|s| s.snapshot_time == taken.time) else { return };
        if self.present {
            // Hooked: its blocks give the rows; its own figures go beside them.
            ledger.set_section(A::NAME, &self.stats[at]);
        } else {
            super::allocator_stats::attach(ledger, &self.stats[at], A::NAME);
        }
    }

    fn malloc_layout(&self) -> Option<&dyn MallocLayout> {
        // Linked statically, its blocks are not in the trace: the hooked
        // malloc (glibc's, for the few calls libc makes) lays out the heap.
        self.present.then_some(&self.allocator as &dyn MallocLayout)
    }

    fn findings(&self, ledger: &Ledger) -> Vec<Finding> {
        row_findings(ledger, A::NAME)
    }

    fn remedies(&self, ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        A::remedies(ledger, findings)
    }
}

/// An owner's gap rows as findings, each at least 1 % of RSS.
pub fn row_findings(ledger: &Ledger, owner: &'static str) -> Vec<Finding> {
    let Some(part) = ledger.share(owner) else { return Vec::new() };
    let r = &part.rows;
    [("fragmented", r.fragmented), ("retained", r.retained), ("lazy_free", r.lazy_free), ("slack", r.slack), ("runtime", r.runtime)]
        .into_iter()
        .map(|(kind, bytes)| Finding { kind, owner, bytes, share: share(bytes, ledger.rss_bytes) })
        .filter(|f| f.bytes > 0 && f.share >= FINDING_MIN_SHARE)
        .collect()
}

/// The bytes of `owner`'s finding of `kind` (0 without one).
pub fn finding_bytes(findings: &[Finding], owner: &str, kind: &str) -> u64 {
    findings.iter().find(|f| f.owner == owner && f.kind == kind).map_or(0, |f| f.bytes)
}
