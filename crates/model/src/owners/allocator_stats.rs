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

use memgap_trace::records::Metrics;
use serde::{Deserialize, Serialize};

use crate::ledger::{Ledger, MappingClass, OwnerShare, Rows};

pub const KIND: &str = "stats";

/// What one allocator said about itself at one instant; None where it says nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorStats {
    /// "jemalloc", "tcmalloc" or "mimalloc".
    pub allocator: String,
    /// Bytes of live allocations (jemalloc `stats.allocated`, tcmalloc
    /// `generic.current_allocated_bytes`).
    pub allocated_bytes: Option<u64>,
    /// Bytes of pages holding live allocations (jemalloc `stats.active`).
    pub active_bytes: Option<u64>,
    /// What the allocator holds resident: metadata, active and dirty pages
    /// (jemalloc `stats.resident`, tcmalloc heap_size − unmapped).
    pub resident_bytes: Option<u64>,
    /// Its metadata (jemalloc `stats.metadata`).
    pub metadata_bytes: Option<u64>,
    /// Free pages still resident (jemalloc's dirty pages of every arena,
    /// tcmalloc `tcmalloc.pageheap_free_bytes`).
    pub dirty_bytes: Option<u64>,
    /// Pages returned with MADV_FREE (jemalloc's muzzy pages).
    pub muzzy_bytes: Option<u64>,
    /// Address space kept but not resident (jemalloc `stats.retained`,
    /// tcmalloc `tcmalloc.pageheap_unmapped_bytes`).
    pub retained_bytes: Option<u64>,
    /// Bytes in extents mapped for the heap (jemalloc `stats.mapped`,
    /// tcmalloc `generic.heap_size`, mimalloc's committed bytes, resident
    /// or not: the one figure a release build of mimalloc keeps).
    pub mapped_bytes: Option<u64>,
    pub arenas: Option<u64>,
    /// Per arena (jemalloc): index, dirty and muzzy bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arena_pages: Vec<ArenaPages>,
    /// The snapshot these figures go with (trace time; 0 outside a trace).
    #[serde(skip)]
    pub snapshot_time: u64,
    /// The allocator is a library the process loaded (LD_PRELOAD, linked
    /// against it), not code linked into the executable: `memgap watch`
    /// reads such a one's figures too, where a recording hooks its calls.
    #[serde(skip)]
    pub loaded_as_library: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaPages {
    pub arena: u32,
    pub dirty_bytes: u64,
    pub muzzy_bytes: u64,
}

/// The value saying the allocator is a loaded library (absent: linked into the executable).
const LOADED_AS_LIBRARY: &str = "loaded_as_library";

const FIELDS: [&str; 9] = ["allocated", "active", "resident", "metadata", "dirty", "muzzy", "retained", "mapped", "arenas"];

/// The rows filled from the allocator's figures, and which rows of a
/// ledger they leave unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsRows {
    pub rows: Rows,
    /// Resident bytes of the allocator's mappings the figures do not
    /// account for (the program's own mmaps among them).
    pub unaccounted: u64,
}

impl AllocatorStats {
    fn fields(&self) -> [Option<u64>; 9] {
        [
            self.allocated_bytes,
            self.active_bytes,
            self.resident_bytes,
            self.metadata_bytes,
            self.dirty_bytes,
            self.muzzy_bytes,
            self.retained_bytes,
            self.mapped_bytes,
            self.arenas,
        ]
    }

    /// As a METRICS record: source is the allocator, kind `stats`.
    pub fn to_metrics(&self, monotonic_ns: u64) -> Metrics {
        let mut values = vec![("snapshot_time".to_string(), self.snapshot_time as f64)];
        if self.loaded_as_library {
            values.push((LOADED_AS_LIBRARY.to_string(), 1.0));
        }
        values.extend(FIELDS.iter().zip(self.fields()).filter_map(|(name, v)| Some((name.to_string(), v? as f64))));
        for a in &self.arena_pages {
            values.push((format!("arena[{}]:dirty", a.arena), a.dirty_bytes as f64));
            values.push((format!("arena[{}]:muzzy", a.arena), a.muzzy_bytes as f64));
        }
        Metrics { monotonic_ns, source: self.allocator.clone(), kind: KIND.into(), values }
    }

    /// Read back from a METRICS record of `allocator` (None for any other).
    pub fn from_metrics(m: &Metrics, allocator: &str) -> Option<AllocatorStats> {
        if m.source != allocator || m.kind != KIND {
            return None;
        }
        let get = |name: &str| m.get(name).filter(|v| v.is_finite() && *v >= 0.0).map(|v| v as u64);
        let [allocated, active, resident, metadata, dirty, muzzy, retained, mapped, arenas] = FIELDS.map(get);
        let mut arena_pages: Vec<ArenaPages> = Vec::new();
        for (name, value) in &m.values {
            let Some((index, field)) = name.strip_prefix("arena[").and_then(|rest| rest.split_once("]:")) else { continue };
            let (Ok(arena), true) = (index.parse::<u32>(), value.is_finite() && *value >= 0.0) else { continue };
            let at = match arena_pages.iter().position(|a| a.arena == arena) {
                Some(at) => at,
                None => {
                    arena_pages.push(ArenaPages { arena, ..ArenaPages::default() });
                    arena_pages.len() - 1
                }
            };
            match field {
                "dirty" => arena_pages[at].dirty_bytes = *value as u64,
                "muzzy" => arena_pages[at].muzzy_bytes = *value as u64,
                _ => {}
            }
        }
        Some(AllocatorStats {
            allocator: allocator.to_string(),
            allocated_bytes: allocated,
            active_bytes: active,
            resident_bytes: resident,
            metadata_bytes: metadata,
            dirty_bytes: dirty,
            muzzy_bytes: muzzy,
            retained_bytes: retained,
            mapped_bytes: mapped,
            arenas,
            arena_pages,
            snapshot_time: get("snapshot_time").unwrap_or(0),
            loaded_as_library: get(LOADED_AS_LIBRARY).is_some_and(|v| v > 0),
        })
    }

    /// Whether the figures give the live row at all.
    pub fn knows_live(&self) -> bool {
        self.allocated_bytes.is_some()
    }

    /// The bytes the allocator has committed, when that is all its figures
    /// say (mimalloc): pages committed need not be resident, so they split
    /// no row.
    pub fn committed_only(&self) -> Option<u64> {
        if self.knows_live() || self.active_bytes.is_some() || self.dirty_bytes.is_some() {
            return None;
        }
        self.mapped_bytes
    }

    /// The ledger rows these figures fill and those they leave unknown.
    pub fn unknown_rows(&self) -> Vec<&'static str> {
        let mut unknown = vec!["slack"];
        if self.allocated_bytes.is_none() {
            unknown.push("live");
        }
        if self.allocated_bytes.is_none() || self.active_bytes.is_none() {
            unknown.push("fragmented");
        }
        if self.dirty_bytes.is_none() {
            unknown.push("retained");
        }
        unknown
    }

    /// Splits `resident` bytes (the allocator's mappings, less their
    /// `lazy` MADV_FREE'd bytes, counted apart) into rows, each clipped to
    /// what is left: live, then metadata and dirty pages (touched, so
    /// resident), then fragmented. jemalloc counts pages never touched
    /// (a large calloc'd block) as active and resident: they come out of
    /// fragmented, and the rows never exceed the resident bytes.
    pub fn rows(&self, resident: u64, lazy: u64) -> StatsRows {
        let mut left = resident;
        let mut take = |bytes: u64| {
            let taken = bytes.min(left);
            left -= taken;
            taken
        };
        let allocated = self.allocated_bytes.unwrap_or(0);
        let metadata = self.metadata_bytes.or_else(|| {
            let (resident, active, dirty) = (self.resident_bytes?, self.active_bytes?, self.dirty_bytes?);
            Some(resident.saturating_sub(active + dirty))
        });
        let live = take(allocated);
        let runtime = take(metadata.unwrap_or(0));
        let retained = take(self.dirty_bytes.unwrap_or(0));
        let fragmented = take(self.active_bytes.map_or(0, |active| active.saturating_sub(allocated)));
        let rows = Rows { live, fragmented, runtime, retained, lazy_free: lazy, ..Rows::default() };
        StatsRows { rows, unaccounted: left }
    }
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
    let split = stats.rows(resident, lazy);
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
        let split = s.rows(55 * MIB, MIB);
        let r = split.rows;
        assert_eq!((r.live, r.fragmented, r.runtime, r.retained, r.lazy_free), (30 * MIB, 10 * MIB, 2 * MIB, 10 * MIB, MIB));
        assert_eq!(split.unaccounted, 3 * MIB);
        // Fewer resident bytes than the figures claim (untouched active
        // pages): fragmented gives way first.
        let r = s.rows(45 * MIB, 0).rows;
        assert_eq!((r.live, r.runtime, r.retained, r.fragmented), (30 * MIB, 2 * MIB, 10 * MIB, 3 * MIB));
        let r = s.rows(31 * MIB, 0).rows;
        assert_eq!((r.live, r.runtime, r.retained, r.fragmented), (30 * MIB, MIB, 0, 0));
        assert!(s.unknown_rows() == ["slack"]);
    }

    #[test]
    fn metadata_from_resident_when_not_given_and_unknown_rows_when_figures_lack() {
        let s = AllocatorStats { metadata_bytes: None, ..jemalloc() };
        assert_eq!(s.rows(100 * MIB, 0).rows.runtime, 2 * MIB);
        let commit_only = AllocatorStats { allocator: "mimalloc".into(), resident_bytes: Some(MIB), ..AllocatorStats::default() };
        assert_eq!(commit_only.unknown_rows(), ["slack", "live", "fragmented", "retained"]);
        assert_eq!(commit_only.rows(MIB, 0).unaccounted, MIB);
        // mimalloc's committed bytes fill no row: committed pages need not be resident.
        let mimalloc = AllocatorStats { allocator: "mimalloc".into(), mapped_bytes: Some(32 * MIB), ..AllocatorStats::default() };
        assert_eq!((mimalloc.knows_live(), mimalloc.committed_only()), (false, Some(32 * MIB)));
        assert_eq!(mimalloc.unknown_rows(), ["slack", "live", "fragmented", "retained"]);
        assert_eq!(mimalloc.rows(20 * MIB, 0), StatsRows { rows: Rows::default(), unaccounted: 20 * MIB });
        assert_eq!(jemalloc().committed_only(), None);
    }
}
