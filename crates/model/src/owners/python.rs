//! CPython's pymalloc as a heap owner: its arenas (anonymous mmaps the
//! core counts as the program's own) become its share of the rows, split
//! from the pool headers `memgap run` read at the snapshot (see
//! memgap-source-python): allocated blocks → live, pool headers and pool
//! tails → slack, free blocks of used pools and empty pools of arenas that
//! still hold a used pool → fragmented, arenas with no used pool →
//! retained. What Python mallocs directly (large objects, buffers) stays
//! the malloc owner's. Remedies: `PYTHONMALLOC=malloc` (alone, and with
//! glibc's trim library when glibc serves the program), and changes to the
//! code that keep small long-lived objects from pinning arenas.

use memgap_source_python::Census;
use serde::{Deserialize, Serialize};

use super::malloc::{finding_bytes, row_findings};
use crate::ledger::owner::Taken;
use crate::ledger::{Finding, HeapOwner, Ledger, MappingClass, OwnerShare, Remedy, Rows};

/// The owner is named as its source.
pub const NAME: &str = memgap_trace::vocabulary::source::PYTHON;
/// Below this a remedy is not worth a run.
const WORTH_TRYING: u64 = 1 << 20;

/// One size class in the `python` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeClassSection {
    pub block_bytes: u64,
    pub blocks: u64,
    pub pools: u64,
    /// Allocated blocks ÷ the blocks their pools have room for.
    pub occupancy: f64,
}

/// The ledger's `python` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PythonSection {
    pub version: String,
    /// `pymalloc`, `malloc` (PYTHONMALLOC=malloc: no pymalloc layer),
    /// `debug` (PYTHONMALLOC=debug, `-X dev`: debug hooks, over pymalloc
    /// when arenas are counted), `custom` (hooks of another tool).
    pub allocator: String,
    /// CPython's own name for it (`pymalloc_debug`…).
    pub allocator_name: String,
    pub arenas: u64,
    pub arena_bytes: u64,
    pub pool_bytes: u64,
    pub resident_bytes: u64,
    pub pools_used: u64,
    pub pools_empty: u64,
    pub allocated_blocks: u64,
    pub allocated_blocks_bytes: u64,
    pub free_in_used_pools_bytes: u64,
    /// Pools whose header could not be read (their pages count as fragmented).
    pub unreadable_pools: u64,
    /// Resident bytes of empty pools in arenas that hold a used pool (part of
    /// the fragmented row): what pymalloc keeps and malloc could give back.
    pub empty_pool_bytes: u64,
    pub size_classes: Vec<SizeClassSection>,
}

#[derive(Debug, Default)]
pub struct PythonOwner {
    version: Option<String>,
    allocator_name: Option<String>,
    censuses: Vec<Census>,
}

impl PythonOwner {
    fn allocator(&self) -> &'static str {
        match self.allocator_name.as_deref() {
            Some("pymalloc") => "pymalloc",
            Some("malloc") => "malloc",
            Some("pymalloc_debug" | "malloc_debug") => "debug",
            Some(_) => "custom",
            None if !self.censuses.is_empty() => "pymalloc",
            None => "unknown",
        }
    }

    fn section(&self, census: Option<&Census>) -> PythonSection {
        let mut section = PythonSection {
            version: self.version.clone().unwrap_or_default(),
            allocator: self.allocator().to_string(),
            allocator_name: self.allocator_name.clone().unwrap_or_default(),
            ..PythonSection::default()
        };
        if let Some(c) = census {
            section.arenas = c.arenas;
            section.arena_bytes = c.arena_bytes;
            section.pool_bytes = c.pool_bytes;
            section.resident_bytes = c.resident_bytes;
            section.pools_used = c.pools_used;
            section.pools_empty = c.pools_empty;
            section.allocated_blocks = c.allocated_blocks;
            section.allocated_blocks_bytes = c.allocated_blocks_bytes;
            section.free_in_used_pools_bytes = c.free_in_used_pools_bytes;
            section.unreadable_pools = c.unreadable_pools;
            section.empty_pool_bytes = c.empty_pool_bytes;
            section.size_classes = c
                .size_classes
                .iter()
                .map(|s| SizeClassSection { block_bytes: s.block_bytes, blocks: s.blocks, pools: s.pools, occupancy: s.occupancy() })
                .collect();
        }
        section
    }
}

impl HeapOwner for PythonOwner {
    fn name(&self) -> &'static str {
        NAME
    }

    fn present(&self) -> bool {
        self.version.is_some() || !self.censuses.is_empty()
    }

    fn note(&mut self, text: &str) {
        if let Some(name) = text.strip_prefix("python allocator ") {
            self.allocator_name = Some(name.to_string());
        } else if let Some(version) = text.strip_prefix("python ") {
            self.version = Some(version.to_string());
        }
    }

    fn metrics(&mut self, metrics: &memgap_trace::records::Metrics) {
        if let Some(census) = Census::from_metrics(metrics) {
            self.censuses.push(census);
        }
    }

    fn describes_its_snapshot(&self, metrics: &memgap_trace::records::Metrics) -> bool {
        Census::from_metrics(metrics).is_some()
    }

    fn annotate(&self, ledger: &mut Ledger, taken: Taken) {
        let census = self.censuses.iter().rev().find(|c| c.snapshot_time == taken.time);
        if let Some(c) = census.filter(|c| c.arenas > 0) {
            attach(ledger, c);
        }
        ledger.set_section(NAME, &self.section(census));
    }

    fn findings(&self, ledger: &Ledger) -> Vec<Finding> {
        row_findings(ledger, NAME)
    }

    fn remedies(&self, ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        let fragmented = finding_bytes(findings, NAME, "fragmented");
        let section: Option<PythonSection> = ledger.section(NAME);
        // What malloc could give back that pymalloc cannot: pages of empty
        // pools and of empty arenas (malloc keeps the free blocks among
        // survivors just the same, and adds a header to each object).
        let kept = section.map_or(0, |s| s.empty_pool_bytes).min(fragmented) + finding_bytes(findings, NAME, "retained");
        let mut out = Vec::new();
        if fragmented >= WORTH_TRYING {
            out.push(Remedy::new(
                "python-object-lifetimes",
                NAME,
                "keep long-lived small objects apart from short-lived ones (build caches before the churn, or in a separate process), give classes with many instances __slots__, and hold numbers in array/bytes/numpy arrays rather than lists of objects",
                &[],
                fragmented,
            ));
        }
        if kept < WORTH_TRYING {
            return out;
        }
        if !ledger.allocator.ends_with("/libc.so.6") {
            // A malloc that returns free pages by itself (decay, purge).
            out.push(Remedy::new(
                "python-malloc",
                NAME,
                "let malloc serve Python's small objects instead of pymalloc, whose arenas go back to the kernel only when every pool in them is empty: PYTHONMALLOC=malloc",
                &[("PYTHONMALLOC", "malloc")],
                kept,
            ));
        } else {
            // glibc then holds the freed small blocks instead, between
            // survivors, and gives their pages back only to malloc_trim.
            out.push(Remedy::new(
                "python-malloc-trim",
                NAME,
                "PYTHONMALLOC=malloc with malloc_trim(0) every second (memgap run --trim-only), so glibc returns the pages the objects leave",
                &[("PYTHONMALLOC", "malloc"), ("LD_PRELOAD", "libmemgap_trim.so")],
                kept,
            ));
        }
        out
    }
}

/// pymalloc's arena pages leave `other` (program mmaps) for its share.
pub fn attach(ledger: &mut Ledger, census: &Census) {
    let resident = census.resident_bytes.min(ledger.other_breakdown.program_mmap);
    ledger.other_breakdown.program_mmap -= resident;
    let whole = census.resident_bytes.max(1);
    // All of it, unless the core counted fewer arena pages as program mmaps
    // (an arena mapped before the agent saw it): then in proportion.
    let part =
        |bytes: u64| if resident == census.resident_bytes { bytes } else { (bytes as u128 * resident as u128 / whole as u128) as u64 };
    let live = part(census.live_bytes);
    let slack = part(census.slack_bytes).min(resident - live);
    let retained = part(census.retained_bytes).min(resident - live - slack);
    let rows = Rows { live, slack, retained, fragmented: resident - live - slack - retained, ..Rows::default() };
    ledger.owners.push(OwnerShare {
        owner: NAME,
        rows,
        released_bytes: census.arena_bytes.saturating_sub(census.resident_bytes),
        estimated: None,
    });
    for entry in ledger.mappings.iter_mut().filter(|m| m.class == MappingClass::ProgramMmap) {
        if entry.end - entry.start <= census.arena_bytes && entry.resident_bytes <= census.resident_bytes {
            entry.class = MappingClass::PythonArenas;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census() -> Census {
        Census {
            arenas: 3,
            arena_bytes: 3 << 20,
            pool_bytes: 16 << 10,
            resident_bytes: 2 << 20,
            live_bytes: 300 << 10,
            slack_bytes: 10 << 10,
            fragmented_bytes: (1 << 20) - (310 << 10),
            retained_bytes: 1 << 20,
            allocated_blocks_bytes: 300 << 10,
            ..Census::default()
        }
    }

    #[test]
    fn arenas_leave_other_for_pythons_share_and_the_verdict_names_pymalloc() {
        let mut ledger = Ledger { rss_bytes: 4 << 20, ..Ledger::default() };
        ledger.other_breakdown.program_mmap = 3 << 20;
        let mut owner = PythonOwner::default();
        owner.note("python 3.11.2");
        owner.note("python allocator pymalloc");
        owner.censuses.push(Census { snapshot_time: 5, ..census() });
        // During the replay: CLOCK_MONOTONIC is not known yet, the census is.
        owner.annotate(&mut ledger, Taken { time: 5, monotonic_ns: None });
        let owners: Vec<Box<dyn HeapOwner>> = vec![Box::new(owner)];
        crate::accounting::finish(&mut ledger, &owners);
        let part = ledger.share(NAME).unwrap();
        assert_eq!(part.rows.total(), 2 << 20);
        assert_eq!(ledger.other_breakdown.program_mmap, 1 << 20);
        assert_eq!((part.rows.live, part.rows.retained), (300 << 10, 1 << 20));
        assert_eq!(part.released_bytes, 1 << 20);
        let section: PythonSection = ledger.section(NAME).unwrap();
        assert_eq!((section.allocator.as_str(), section.arenas, section.version.as_str()), ("pymalloc", 3, "3.11.2"));
        assert_eq!(ledger.gap_owner, Some(NAME));
        assert_eq!(ledger.remedies[0].env.get("PYTHONMALLOC").map(String::as_str), Some("malloc"));
        assert!(ledger.remedies.iter().all(|r| r.owner == NAME));
    }

    #[test]
    fn malloc_and_debug_allocators_are_named_and_add_no_layer_without_arenas() {
        let mut owner = PythonOwner::default();
        owner.note("python 3.11.2");
        owner.note("python allocator malloc");
        let mut ledger = Ledger { rss_bytes: 4 << 20, ..Ledger::default() };
        owner.annotate(&mut ledger, Taken { time: 5, monotonic_ns: Some(5) });
        assert!(ledger.share(NAME).is_none());
        assert_eq!(ledger.section::<PythonSection>(NAME).unwrap().allocator, "malloc");
        owner.note("python allocator pymalloc_debug");
        assert_eq!(owner.allocator(), "debug");
    }
}
