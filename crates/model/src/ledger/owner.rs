//! The interface every heap owner implements. A heap owner is an allocator
//! or runtime that holds memory of its own (glibc malloc, jemalloc, the Go
//! runtime, the GHC RTS, Ruby's object heap…): it claims the mappings it
//! owns and splits them into the ledger's rows, adds its own section to the
//! ledger (a JSON key of its name), its collections for the timeline, and
//! its findings and remedies. The core ledger knows owners only through
//! this trait; the list of owners is `crate::registry::registered`.
//!
//! An owner learns about the process as the trace replays (the `process`,
//! `allocator`, `metrics`, `note`, `rss` and `snapshot_seen` calls), takes
//! its mappings at each snapshot during the replay ([`HeapOwner::claim`]),
//! and, for figures a trace holds only after the snapshots (an RTS eventlog,
//! Ruby's samples are appended at exit), lays its layer over each ledger
//! afterwards ([`HeapOwner::annotate`], which can take mappings back from
//! `other` with [`Ledger::reclaim`]).

use std::collections::BTreeMap;

use memgap_trace::records::{Mapping, Metrics, Process, Rss, Snapshot};
use serde::{Deserialize, Serialize};

use super::{Ledger, Rows};

/// One garbage collection of the program's runtime.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GcMark {
    pub seconds: f64,
    pub source: String,
    pub major: bool,
}

/// One fact about where the gap sits, with its numbers; views write the
/// sentence. `kind`: `fragmented`, `retained`, `lazy_free`, `slack`,
/// `runtime`, `pinned_fragmentation`, `free_slots`, `sparse_size_classes`…
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    #[serde(deserialize_with = "super::stored::static_name")]
    pub kind: super::stored::Name,
    #[serde(deserialize_with = "super::stored::static_name")]
    pub owner: super::stored::Name,
    pub bytes: u64,
    /// bytes ÷ RSS.
    pub share: f64,
}

/// A change to try, for the allocator or runtime in use: the environment
/// to run the same program with (empty when it is a change to the code),
/// and what it should save.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Remedy {
    #[serde(deserialize_with = "super::stored::static_name")]
    pub id: super::stored::Name,
    #[serde(deserialize_with = "super::stored::static_name")]
    pub owner: super::stored::Name,
    pub description: String,
    pub env: BTreeMap<String, String>,
    pub expected_savings_bytes: u64,
    /// What `memgap compare --remedies` measured of it, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<super::measured::Measured>,
}

impl Remedy {
    pub fn new(
        id: &'static str,
        owner: &'static str,
        description: impl Into<String>,
        env: &[(&str, &str)],
        expected_savings_bytes: u64,
    ) -> Remedy {
        Remedy {
            id,
            owner,
            description: description.into(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            expected_savings_bytes,
            measured: None,
        }
    }
}

/// When a snapshot was taken: its time in the trace, and on CLOCK_MONOTONIC
/// once the replay is over (`None` while it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub time: u64,
    pub monotonic_ns: Option<u64>,
}

/// An owner's part of the rows (the headline rows are the sum of every
/// owner's part, plus thread stacks and `other`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OwnerShare {
    #[serde(deserialize_with = "super::stored::static_name")]
    pub owner: super::stored::Name,
    pub rows: Rows,
    /// Its address space not resident (returned, or never touched).
    pub released_bytes: u64,
    /// How its rows were obtained, when some are estimated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated: Option<String>,
}

impl OwnerShare {
    /// Bytes it holds beyond what the program uses: every row but live.
    pub fn gap(&self) -> u64 {
        self.rows.total() - self.rows.live
    }
}

/// How a malloc lays blocks out, for the page-by-page accounting of the
/// mappings that hold its blocks.
pub trait MallocLayout {
    /// Bytes in front of each block that belong to it (a size word).
    fn block_header(&self) -> u64 {
        0
    }
    /// The kind of heap `mapping` is, which names it in the per-heap table.
    fn heap_kind(&self, mapping: &Mapping) -> super::HeapKind {
        if mapping.name == "[heap]" { super::HeapKind::BrkHeap } else { super::HeapKind::Mapping }
    }
    /// Which resident pages holding no block the allocator's trim would
    /// release now, given the live block extents (`live`) in address
    /// order and what the replay has learned of the heaps and trims
    /// (`trim`). Allocators without a trim release none.
    fn trim_forecast(
        &self,
        _trim: &mut crate::glibc_trim::GlibcTrimModel,
        _snapshot: &Snapshot,
        _live: crate::extents::Extents,
        _page: u64,
    ) -> crate::glibc_trim::TrimForecast {
        crate::glibc_trim::TrimForecast::default()
    }
    /// How many arenas the heaps make (0: not counted).
    fn arenas(&self, _heaps: &[super::HeapLedger]) -> u32 {
        0
    }
}

pub trait HeapOwner {
    /// Its short name: the `owner` of its findings, remedies and share,
    /// and the JSON key of its section.
    fn name(&self) -> &'static str;
    /// It holds memory in this process (as far as the replay has seen).
    fn present(&self) -> bool;

    fn process(&mut self, _process: &Process) {}
    /// The malloc the agent found serving the program (its library path).
    fn allocator(&mut self, _path: &str) {}
    fn metrics(&mut self, _metrics: &Metrics) {}
    fn note(&mut self, _text: &str) {}
    fn rss(&mut self, _rss: &Rss) {}
    /// Every snapshot of the trace, wanted or not.
    fn snapshot_seen(&mut self, _snapshot: &Snapshot) {}
    /// The whole trace has been read: `timeline` turns its times into
    /// CLOCK_MONOTONIC nanoseconds.
    fn replayed(&mut self, _timeline: &memgap_replay::Timeline) {}

    /// When it is the program's malloc: how its blocks sit in memory (the
    /// core accounts the mappings holding blocks page by page, as its).
    fn malloc_layout(&self) -> Option<&dyn MallocLayout> {
        None
    }

    /// At a snapshot, during the replay: the indexes of the snapshot's
    /// mappings it owns, after splitting them into its share (pushed to
    /// `ledger.owners`) and their entries (pushed to `ledger.mappings`).
    fn claim(&mut self, _snapshot: &Snapshot, _ledger: &mut Ledger) -> Vec<usize> {
        Vec::new()
    }

    /// Lays its layer over the ledger of a snapshot `taken` then. Figures
    /// that describe a snapshot (written just before it) find it by its
    /// trace time, and are in by the time the replay reaches it; the others
    /// come later and find it by CLOCK_MONOTONIC, known after the replay.
    fn annotate(&self, _ledger: &mut Ledger, _taken: Taken) {}

    /// `metrics` holds its figures about the snapshot written just after
    /// it, which it lays over by that snapshot's trace time (so during the
    /// replay, as it reaches the snapshot).
    fn describes_its_snapshot(&self, _metrics: &Metrics) -> bool {
        false
    }

    /// Its collections, `start_ns` being the process start.
    fn gc_marks(&self, _start_ns: u64) -> Vec<GcMark> {
        Vec::new()
    }

    /// Where its part of the gap sits, with the numbers.
    fn findings(&self, _ledger: &Ledger) -> Vec<Finding> {
        Vec::new()
    }

    /// What to try for those findings, for this owner only.
    fn remedies(&self, _ledger: &Ledger, _findings: &[Finding]) -> Vec<Remedy> {
        Vec::new()
    }

    /// Its live heap and threads over the whole run, for `memgap summary`.
    fn summary(&self) -> Option<RuntimeSummary> {
        None
    }
}

/// A runtime's own figures for `memgap summary`: its live heap and threads
/// (the agent sees neither in a Go program, and only the RTS's own mallocs
/// in a GHC one).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RuntimeSummary {
    pub owner: &'static str,
    /// Where the figures come from (`runtime/metrics`, `gctrace`, `eventlog`).
    pub source: String,
    pub peak_live_bytes: u64,
    pub peak_live_seconds: f64,
    pub live_bytes_at_end: u64,
    /// Goroutines (Go), capabilities (GHC), as `threads_kind` says.
    pub threads: Option<u32>,
    pub threads_kind: &'static str,
}

/// bytes ÷ whole, 0 for an empty whole.
pub fn share(bytes: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { bytes as f64 / whole as f64 }
}
