//! The GHC RTS's figures as METRICS records of source `ghc` carry them
//! (memgap-source-ghc writes them from the eventlog, memgap-model reads
//! them), by record kind: [`INFO`](super::kind::INFO) once,
//! [`GC`](super::kind::GC) per collection, [`HEAP_PROFILE`](super::kind::HEAP_PROFILE)
//! per census.

// Kind `info`: the heap's parameters and the build.
pub const GENERATIONS: &str = "generations";
pub const MAX_HEAP_BYTES: &str = "max_heap_bytes";
pub const ALLOC_AREA_BYTES: &str = "alloc_area_bytes";
pub const MBLOCK_BYTES: &str = "mblock_bytes";
pub const BLOCK_BYTES: &str = "block_bytes";
pub const CAPABILITIES: &str = "capabilities";
pub const THREADS_CREATED: &str = "threads_created";
pub const VERSION_MAJOR: &str = "version_major";
pub const VERSION_MINOR: &str = "version_minor";
pub const VERSION_PATCH: &str = "version_patch";

// Kind `gc`: one collection, at its end.
/// Absent when the event came from no capability's buffer.
pub const CAPABILITY: &str = "capability";
pub const GENERATION: &str = "generation";
pub const DURATION_NS: &str = "duration_ns";
pub const ALLOCATED_BYTES: &str = "allocated_bytes";
pub const COPIED_BYTES: &str = "copied_bytes";
pub const SLOP_BYTES: &str = "slop_bytes";
/// Megablock capacity not in blocks.
pub const FRAGMENTATION_BYTES: &str = "fragmentation_bytes";
pub const PAR_THREADS: &str = "par_threads";
pub const HEAP_SIZE_BYTES: &str = "heap_size_bytes";
/// Major collections only.
pub const LIVE_BYTES: &str = "live_bytes";
pub const BLOCKS_SIZE_BYTES: &str = "blocks_size_bytes";
/// GHC 9.2 and later.
pub const MEM_CURRENT_MBLOCKS: &str = "mem_current_mblocks";
pub const MEM_NEEDED_MBLOCKS: &str = "mem_needed_mblocks";
pub const MEM_RETURNED_MBLOCKS: &str = "mem_returned_mblocks";

// Kind `heap_profile`: one census, then one value per label (closure type,
// type, cost-centre stack) in bytes.
/// The eventlog's breakdown code of the census.
pub const BREAKDOWN: &str = "breakdown";
pub const ERA: &str = "era";

// Kind `rts_summary`: the `+RTS -s` figures (with ALLOCATED_BYTES and
// COPIED_BYTES), then `gen<N>_collections` per generation.
pub const MAX_RESIDENCY_BYTES: &str = "max_residency_bytes";
pub const MAX_RESIDENCY_SAMPLES: &str = "max_residency_samples";
pub const MAX_SLOP_BYTES: &str = "max_slop_bytes";
pub const TOTAL_MEMORY_IN_USE_BYTES: &str = "total_memory_in_use_bytes";
pub const LOST_TO_FRAGMENTATION_BYTES: &str = "lost_to_fragmentation_bytes";
