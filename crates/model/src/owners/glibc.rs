//! glibc's malloc (ptmalloc2): the main arena in the brk heap, thread arenas
//! in 64 MiB-aligned heaps, an 8-byte size word before each block, and
//! malloc_trim. Remedies: a periodic malloc_trim (memgap's trim library),
//! fewer arenas, a fixed trim threshold.

use memgap_trace::records::Mapping;

use super::malloc::{Allocator, MallocOwner, finding_bytes};
use crate::glibc_trim::GLIBC_HEADER;
use crate::ledger::{Finding, HeapKind, HeapLedger, Ledger, MallocLayout, Remedy};

pub const NAME: &str = "glibc";

/// glibc keeps each heap in 64 MiB-aligned reservations (HEAP_MAX_SIZE).
pub(crate) const GLIBC_HEAP_ALIGN: u64 = 64 << 20;
/// Below this a remedy is not worth a run.
const WORTH_TRYING: u64 = 1 << 20;

#[derive(Default)]
pub struct GlibcMalloc;

pub type Glibc = MallocOwner<GlibcMalloc>;

impl MallocLayout for GlibcMalloc {
    fn block_header(&self) -> u64 {
        GLIBC_HEADER
    }

    fn heap_kind(&self, mapping: &Mapping) -> HeapKind {
        if mapping.name == "[heap]" {
            HeapKind::BrkHeap
        } else if mapping.start.is_multiple_of(GLIBC_HEAP_ALIGN) {
            HeapKind::Arena
        } else {
            HeapKind::Mapping
        }
    }

    fn trim_forecast(
        &self,
        trim: &mut crate::glibc_trim::GlibcTrimModel,
        snapshot: &memgap_trace::records::Snapshot,
        live: crate::extents::Extents,
        page: u64,
    ) -> crate::glibc_trim::TrimForecast {
        let walks = crate::page_walks::PageWalks::of(snapshot, page, false);
        crate::glibc_trim::forecast(trim, snapshot, live, page, |m| walks.by_page(m.start))
    }

    fn arenas(&self, heaps: &[HeapLedger]) -> u32 {
        1 + heaps.iter().filter(|h| h.kind == HeapKind::Arena).count() as u32
    }
}

impl Allocator for GlibcMalloc {
    const NAME: &'static str = NAME;

    fn serves(path: &str) -> bool {
        path.ends_with("/libc.so.6")
    }

    fn remedies(ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        let mut out = Vec::new();
        let retained = finding_bytes(findings, NAME, "retained");
        if retained == 0 {
            return out;
        }
        let trimmable = ledger.trim_would_return_bytes.min(retained);
        if trimmable >= WORTH_TRYING {
            out.push(Remedy::new(
                "glibc-trim",
                NAME,
                "call malloc_trim(0) every second without changing the program: memgap run --trim-only -- CMD (preloads libmemgap_trim.so)",
                &[("LD_PRELOAD", "libmemgap_trim.so")],
                trimmable,
            ));
        }
        // What fewer arenas can save that a trim cannot: free pages at the
        // thread arenas' tops and free space scattered over them. After a
        // burst, fewer arenas keep the same free pages, so the pages a trim
        // returns are not counted for it as well.
        let in_arenas: u64 = ledger
            .heaps
            .iter()
            .filter(|h| h.kind == HeapKind::Arena)
            .map(|h| h.retained - h.trimmable.min(h.retained) + h.fragmented)
            .sum();
        if ledger.arenas > 2 && in_arenas >= WORTH_TRYING {
            // Two arenas instead of n: the thread arenas' free space shrinks
            // about in proportion.
            let saving = in_arenas * u64::from(ledger.arenas - 2) / u64::from(ledger.arenas - 1);
            out.push(Remedy::new(
                "glibc-arena-max",
                NAME,
                "fewer arenas, so free memory is shared between threads: MALLOC_ARENA_MAX=2",
                &[("MALLOC_ARENA_MAX", "2")],
                saving,
            ));
        }
        let untrimmable = retained - trimmable;
        if untrimmable >= WORTH_TRYING {
            // Free memory at the top of a heap is given back by free() once
            // it passes the trim threshold, which glibc raises (up to 64 MiB)
            // each time a large mmapped block is freed; fixing both
            // thresholds keeps it at 128 KiB.
            out.push(Remedy::new(
                "glibc-trim-threshold",
                NAME,
                "fix glibc's trim and mmap thresholds at 128 KiB so free() gives back heap tops and large blocks: GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072:glibc.malloc.mmap_threshold=131072",
                &[("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072:glibc.malloc.mmap_threshold=131072")],
                untrimmable,
            ));
        }
        out
    }
}
