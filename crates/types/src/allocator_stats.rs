//! An allocator's own statistics, read inside the process (jemalloc's
//! `mallctl`, tcmalloc's `MallocExtension_GetNumericProperty`, mimalloc's
//! `mi_process_info`) by `memgap run` at each snapshot and by `memgap
//! snapshot PID`, and their METRICS record in a trace. The model
//! (`memgap_model::owners::allocator_stats`) turns them into ledger rows.

use memgap_trace::records::Metrics;
use serde::{Deserialize, Serialize};

pub const KIND: &str = memgap_trace::vocabulary::kind::STATS;

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
}
