//! An allocator's own statistics, for a malloc no hook sees: one linked
//! statically into the program (Rust's `tikv-jemallocator` and `mimalloc`
//! crates, C++ services with tcmalloc), whose calls never reach the agent.
//! Its figures are read inside the process (jemalloc's `mallctl`,
//! tcmalloc's `MallocExtension_GetNumericProperty`, mimalloc's
//! `mi_process_info`), by `memgap run` at each
//! snapshot (a METRICS record) and by `memgap snapshot PID`; each fills the
//! rows it can, and a figure the allocator does not give stays unknown.
//!
//! The rows, over the resident bytes of the anonymous mappings no other
//! owner took: live = allocated, fragmented = active − allocated (free
//! regions on pages holding live ones), runtime = the allocator's metadata,
//! retained = dirty pages (freed, still resident), lazy_free = smaps
//! LazyFree (jemalloc's muzzy pages). No per-block view (slack, blame):
//! there are no calls to hook. A release build of mimalloc counts only the
//! bytes it has committed: a figure shown beside the rows, which it cannot split.

pub use memgap_types::allocator_stats::{AllocatorStats, ArenaPages, KIND};

use crate::ledger::{Ledger, MappingClass, OwnerShare, Rows};

/// The rows filled from the allocator's figures, and which rows of a
/// ledger they leave unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsRows {
    pub rows: Rows,
    /// Resident bytes of the allocator's mappings the figures do not
    /// account for (the program's own mmaps among them).
    pub unaccounted: u64,
}

/// Splits `resident` bytes (the allocator's mappings, less their
/// `lazy` MADV_FREE'd bytes, counted apart) into rows, each clipped to
/// what is left: live, then metadata and dirty pages (touched, so
/// resident), then fragmented. jemalloc counts pages never touched
/// (a large calloc'd block) as active and resident: they come out of
/// fragmented, and the rows never exceed the resident bytes.
pub fn rows(stats: &AllocatorStats, resident: u64, lazy: u64) -> StatsRows {
    let mut left = resident;
    let mut take = |bytes: u64| {
        let taken = bytes.min(left);
        left -= taken;
        taken
    };
    let allocated = stats.allocated_bytes.unwrap_or(0);
    let metadata = stats.metadata_bytes.or_else(|| {
        let (resident, active, dirty) = (stats.resident_bytes?, stats.active_bytes?, stats.dirty_bytes?);
        Some(resident.saturating_sub(active + dirty))
    });
    let live = take(allocated);
    let runtime = take(metadata.unwrap_or(0));
    let retained = take(stats.dirty_bytes.unwrap_or(0));
    let fragmented = take(stats.active_bytes.map_or(0, |active| active.saturating_sub(allocated)));
    let rows = Rows { live, fragmented, runtime, retained, lazy_free: lazy, ..Rows::default() };
    StatsRows { rows, unaccounted: left }
}

/// Lays `stats` over a recorded ledger: the anonymous mappings the core
/// counted as the program's own mmaps (no hooked block in them) become the
/// allocator's share, split by its figures; what they do not account for
/// stays the program's. A trace without the program's mmaps (`memgap
/// watch` records none) leaves them unclassified: those are taken too
/// when the program's mmaps fall short of what the allocator holds.
pub fn attach(ledger: &mut Ledger, stats: &AllocatorStats, owner: &'static str) {
    let (mut resident, mut lazy, mut unclassified) = (0, 0, 0);
    let held = stats
        .resident_bytes
        .unwrap_or_else(|| stats.allocated_bytes.unwrap_or(0) + stats.metadata_bytes.unwrap_or(0) + stats.dirty_bytes.unwrap_or(0));
    for class in [MappingClass::ProgramMmap, MappingClass::Unclassified] {
        if class == MappingClass::Unclassified && resident >= held {
            break;
        }
        for index in 0..ledger.mappings.len() {
            if ledger.mappings[index].class != class {
                continue;
            }
            if let Some((counted, lazily_freed)) = ledger.reclaim(index, MappingClass::Heap) {
                resident += counted;
                lazy += lazily_freed;
                if class == MappingClass::Unclassified {
                    unclassified += counted;
                }
            }
        }
    }
    let split = rows(stats, resident, lazy);
    // What the figures do not account for goes back where it was counted.
    let back = split.unaccounted.min(unclassified);
    ledger.other_breakdown.unclassified += back;
    ledger.other_breakdown.program_mmap += split.unaccounted - back;
    ledger.owners.retain(|s| s.owner != owner);
    ledger.owners.push(OwnerShare {
        owner,
        rows: split.rows,
        released_bytes: stats.retained_bytes.unwrap_or(0),
        estimated: Some(format!(
            "from {owner}'s own statistics ({}, no hooked calls){}: {} not known",
            if stats.loaded_as_library { "read from outside" } else { "linked into the program" },
            stats
                .committed_only()
                .map_or(String::new(), |c| format!(", which count only the bytes it committed ({})", crate::human_bytes(c))),
            stats.unknown_rows().join(", ")
        )),
    });
    ledger.allocator = if stats.loaded_as_library { owner.to_string() } else { format!("{owner} (linked statically into the program)") };
    if let Some(arenas) = stats.arenas {
        ledger.arenas = arenas as u32;
    }
    ledger.set_section(owner, stats);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::OtherBreakdown;

    const MIB: u64 = 1 << 20;

    fn jemalloc() -> AllocatorStats {
        AllocatorStats {
            allocator: "jemalloc".into(),
            allocated_bytes: Some(30 * MIB),
            active_bytes: Some(40 * MIB),
            resident_bytes: Some(52 * MIB),
            metadata_bytes: Some(2 * MIB),
            dirty_bytes: Some(10 * MIB),
            muzzy_bytes: Some(0),
            retained_bytes: Some(100 * MIB),
            mapped_bytes: Some(60 * MIB),
            arenas: Some(4),
            arena_pages: vec![
                ArenaPages { arena: 0, dirty_bytes: 6 * MIB, muzzy_bytes: 0 },
                ArenaPages { arena: 3, dirty_bytes: 4 * MIB, muzzy_bytes: 0 },
            ],
            snapshot_time: 77,
            loaded_as_library: false,
        }
    }

    fn anonymous(start: u64, class: MappingClass, resident_bytes: u64) -> crate::ledger::MappingLedger {
        crate::ledger::MappingLedger {
            start,
            end: start + resident_bytes,
            perms: "rw-p".into(),
            name: String::new(),
            class,
            resident_bytes,
            lazy_free_bytes: 0,
        }
    }

    #[test]
    fn without_the_programs_mmaps_the_unclassified_mappings_are_the_allocators() {
        // A watch trace: no mmap of the program seen, the allocator's
        // extents unclassified, next to one mapping of the program's own.
        let mut ledger = Ledger {
            mappings: vec![
                anonymous(0x1000_0000, MappingClass::Unclassified, 40 * MIB),
                anonymous(0x2000_0000, MappingClass::Unclassified, 15 * MIB),
            ],
            other_breakdown: OtherBreakdown { unclassified: 55 * MIB, ..OtherBreakdown::default() },
            ..Ledger::default()
        };
        let stats = AllocatorStats { loaded_as_library: true, ..jemalloc() };
        attach(&mut ledger, &stats, "jemalloc");
        let share = ledger.share("jemalloc").expect("a jemalloc share");
        assert_eq!((share.rows.live, share.rows.fragmented, share.rows.retained), (30 * MIB, 10 * MIB, 10 * MIB));
        // The 3 MiB its figures do not account for stay unclassified.
        assert_eq!((ledger.other_breakdown.unclassified, ledger.other_breakdown.program_mmap), (3 * MIB, 0));
        assert_eq!(ledger.allocator, "jemalloc");

        // A recording of a statically linked one: its mmaps were seen, and
        // enough; the unclassified mapping is left alone.
        let mut ledger = Ledger {
            mappings: vec![
                anonymous(0x1000_0000, MappingClass::ProgramMmap, 55 * MIB),
                anonymous(0x2000_0000, MappingClass::Unclassified, MIB),
            ],
            other_breakdown: OtherBreakdown { program_mmap: 55 * MIB, unclassified: MIB, ..OtherBreakdown::default() },
            ..Ledger::default()
        };
        attach(&mut ledger, &jemalloc(), "jemalloc");
        assert_eq!(ledger.share("jemalloc").unwrap().rows.live, 30 * MIB);
        assert_eq!((ledger.other_breakdown.unclassified, ledger.other_breakdown.program_mmap), (MIB, 3 * MIB));
        assert_eq!(ledger.mappings[1].class, MappingClass::Unclassified);
        assert_eq!(ledger.allocator, "jemalloc (linked statically into the program)");
    }

    #[test]
    fn round_trips_through_a_metrics_record() {
        let stats = jemalloc();
        let m = stats.to_metrics(5);
        assert_eq!((m.source.as_str(), m.kind.as_str()), ("jemalloc", KIND));
        assert_eq!(AllocatorStats::from_metrics(&m, "jemalloc"), Some(stats));
        let library = AllocatorStats { loaded_as_library: true, ..jemalloc() };
        assert_eq!(AllocatorStats::from_metrics(&library.to_metrics(5), "jemalloc"), Some(library));
        assert_eq!(AllocatorStats::from_metrics(&m, "tcmalloc"), None);
        let partial = AllocatorStats { allocator: "mimalloc".into(), ..AllocatorStats::default() };
        assert_eq!(AllocatorStats::from_metrics(&partial.to_metrics(1), "mimalloc"), Some(partial));
        let committed = AllocatorStats { allocator: "mimalloc".into(), mapped_bytes: Some(32 * MIB), ..AllocatorStats::default() };
        assert_eq!(AllocatorStats::from_metrics(&committed.to_metrics(1), "mimalloc"), Some(committed));
    }

    #[test]
    fn rows_from_jemalloc_figures_fit_the_resident_bytes() {
        let s = jemalloc();
        let split = rows(&s, 55 * MIB, MIB);
        let r = split.rows;
        assert_eq!((r.live, r.fragmented, r.runtime, r.retained, r.lazy_free), (30 * MIB, 10 * MIB, 2 * MIB, 10 * MIB, MIB));
        assert_eq!(split.unaccounted, 3 * MIB);
        // Fewer resident bytes than the figures claim (untouched active
        // pages): fragmented gives way first.
        let r = rows(&s, 45 * MIB, 0).rows;
        assert_eq!((r.live, r.runtime, r.retained, r.fragmented), (30 * MIB, 2 * MIB, 10 * MIB, 3 * MIB));
        let r = rows(&s, 31 * MIB, 0).rows;
        assert_eq!((r.live, r.runtime, r.retained, r.fragmented), (30 * MIB, MIB, 0, 0));
        assert!(s.unknown_rows() == ["slack"]);
    }

    #[test]
    fn metadata_from_resident_when_not_given_and_unknown_rows_when_figures_lack() {
        let s = AllocatorStats { metadata_bytes: None, ..jemalloc() };
        assert_eq!(rows(&s, 100 * MIB, 0).rows.runtime, 2 * MIB);
        let commit_only = AllocatorStats { allocator: "mimalloc".into(), resident_bytes: Some(MIB), ..AllocatorStats::default() };
        assert_eq!(commit_only.unknown_rows(), ["slack", "live", "fragmented", "retained"]);
        assert_eq!(rows(&commit_only, MIB, 0).unaccounted, MIB);
        // mimalloc's committed bytes fill no row: committed pages need not be resident.
        let mimalloc = AllocatorStats { allocator: "mimalloc".into(), mapped_bytes: Some(32 * MIB), ..AllocatorStats::default() };
        assert_eq!((mimalloc.knows_live(), mimalloc.committed_only()), (false, Some(32 * MIB)));
        assert_eq!(mimalloc.unknown_rows(), ["slack", "live", "fragmented", "retained"]);
        assert_eq!(rows(&mimalloc, 20 * MIB, 0), StatsRows { rows: Rows::default(), unaccounted: 20 * MIB });
        assert_eq!(jemalloc().committed_only(), None);
    }
}
