//! The ledger: every resident byte of the process in exactly one row, with
//! the page map, each heap owner's share, the findings and the remedies.
//! These are the types; `accounting` computes a ledger at a snapshot, and
//! the owners (the interface in [`owner`]) fill their parts of it.

use std::collections::BTreeMap;

use memgap_trace::records::{Mapping, SnapshotReason};
use serde::{Deserialize, Serialize};

pub mod measured;
pub mod owner;
pub mod stored;

pub use owner::{Finding, GcMark, HeapOwner, MallocLayout, OwnerShare, Remedy, RuntimeSummary};

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rows {
    pub live: u64,
    pub slack: u64,
    pub fragmented: u64,
    pub retained: u64,
    pub lazy_free: u64,
    pub runtime: u64,
    pub other: u64,
}

impl Rows {
    pub fn total(&self) -> u64 {
        self.live + self.slack + self.fragmented + self.retained + self.lazy_free + self.runtime + self.other
    }

    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("live", self.live),
            ("slack", self.slack),
            ("fragmented", self.fragmented),
            ("retained", self.retained),
            ("lazy_free", self.lazy_free),
            ("runtime", self.runtime),
            ("other", self.other),
        ]
    }
}

/// What "other" is made of.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OtherBreakdown {
    /// File-backed pages: code, data and files the program maps.
    pub file: u64,
    /// Shared memory (tmpfs, SysV, shared anonymous).
    pub shmem: u64,
    /// Anonymous memory the program mapped itself with mmap.
    pub program_mmap: u64,
    /// memgap's own buffers and static data.
    pub agent: u64,
    /// Zero-initialised static data (.bss) of the program and its libraries.
    pub static_data: u64,
    /// Anonymous memory no layer accounts for (loader data, thread stacks
    /// of threads that never allocated…).
    pub unclassified: u64,
}

/// What kind of allocator mapping a heap is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeapKind {
    /// glibc's main arena, grown with brk.
    BrkHeap,
    /// A glibc thread arena's heap (aligned to its maximum size).
    Arena,
    /// Any other mapping holding blocks.
    #[default]
    Mapping,
    /// The other mappings, merged into one row.
    Mappings,
}

impl HeapKind {
    /// As the JSON and the tables spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            HeapKind::BrkHeap => "brk heap",
            HeapKind::Arena => "arena",
            HeapKind::Mapping => "mapping",
            HeapKind::Mappings => "mappings",
        }
    }
}

impl std::fmt::Display for HeapKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for HeapKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for HeapKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        [HeapKind::BrkHeap, HeapKind::Arena, HeapKind::Mapping, HeapKind::Mappings]
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("no heap kind {name:?}")))
    }
}

/// Where a mapping's resident bytes went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MappingClass {
    /// An allocator's mapping, split page by page into the heap rows.
    Heap,
    Stack,
    File,
    Shmem,
    /// memgap's own: the agent's buffers, static data and shared area.
    Memgap,
    /// The .bss of a program or library.
    StaticData,
    /// Anonymous memory the program mapped itself.
    ProgramMmap,
    /// Anonymous memory no layer accounts for.
    Unclassified,
    /// A mapping no finer class fits (non-anonymous, not file-backed).
    #[default]
    Other,
    /// A runtime's own structures (Go's spans, GC bits…).
    Runtime,
    GhcHeap,
    V8Heap,
    PythonArenas,
}

impl MappingClass {
    /// As the JSON and the tables spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            MappingClass::Heap => "heap",
            MappingClass::Stack => "stack",
            MappingClass::File => "file",
            MappingClass::Shmem => "shmem",
            MappingClass::Memgap => "memgap",
            MappingClass::StaticData => "static data",
            MappingClass::ProgramMmap => "program mmap",
            MappingClass::Unclassified => "unclassified",
            MappingClass::Other => "other",
            MappingClass::Runtime => "runtime",
            MappingClass::GhcHeap => "ghc heap",
            MappingClass::V8Heap => "v8 heap",
            MappingClass::PythonArenas => "python arenas",
        }
    }
}

impl std::fmt::Display for MappingClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for MappingClass {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for MappingClass {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use MappingClass::*;
        let name = String::deserialize(deserializer)?;
        [Heap, Stack, File, Shmem, Memgap, StaticData, ProgramMmap, Unclassified, Other, Runtime, GhcHeap, V8Heap, PythonArenas]
            .into_iter()
            .find(|class| class.as_str() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("no mapping class {name:?}")))
    }
}

/// One allocator mapping's share of the heap rows.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HeapLedger {
    pub name: String,
    pub kind: HeapKind,
    pub start: u64,
    pub end: u64,
    pub mappings: u32,
    pub live: u64,
    pub slack: u64,
    pub fragmented: u64,
    pub retained: u64,
    pub lazy_free: u64,
    pub released: u64,
    pub trimmable: u64,
}

/// How one mapping was accounted: the row it went to (or "heap" for
/// allocator mappings, split by page) and its resident bytes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MappingLedger {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub name: String,
    pub class: MappingClass,
    pub resident_bytes: u64,
    pub lazy_free_bytes: u64,
}

impl MappingLedger {
    /// The mapping as smaps gave it, its class still to be decided.
    pub fn of(mapping: &Mapping) -> MappingLedger {
        MappingLedger {
            start: mapping.start,
            end: mapping.end,
            perms: mapping.perms.clone(),
            name: mapping.name.clone(),
            resident_bytes: mapping.rss,
            lazy_free_bytes: mapping.lazy_free,
            ..MappingLedger::default()
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SizeBucket {
    /// Blocks of `min_size ..= max_size` requested bytes.
    pub min_size: u64,
    pub max_size: u64,
    pub blocks: u64,
    /// Their requested bytes on resident pages.
    pub live_bytes: u64,
    /// Free bytes on pages these blocks occupy, shared among the blocks of
    /// each page by the bytes they take there.
    pub fragmented_bytes: u64,
}

/// How a page of an allocator mapping was classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageClass {
    NotResident,
    /// Resident, holds blocks; `fill` = bytes taken by blocks, 0..=255 for the whole page.
    Used {
        fill: u8,
    },
    /// Resident, holds no block; `trimmable` if malloc_trim(0) would return it.
    Free {
        trimmable: bool,
    },
    Agent,
    ProgramMmap,
    /// Resident, in a pymalloc arena (the python owner's): `fill` is how
    /// much of the arena's resident bytes its allocated blocks take (0..=255),
    /// None for an arena that holds no block (retained).
    Python {
        fill: Option<u8>,
    },
}

#[derive(Debug, Clone, Default)]
pub struct PageMap {
    pub name: String,
    pub start: u64,
    pub page_size: u64,
    pub pages: Vec<PageClass>,
    /// The NUMA node of each page ([`NO_NODE`]: not resident or unknown);
    /// empty when the agent recorded no placement for this mapping.
    pub nodes: Vec<u8>,
    /// The live blocks on each page, when asked for ([`Detail::objects`](crate::accounting::Detail::objects)).
    pub objects: Option<PageObjects>,
}

/// The live blocks on the pages of one page map, for the report's hover.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PageObjects {
    /// Per page: requested bytes of the live blocks on it.
    pub live_bytes: Vec<u32>,
    /// Per page: how many live blocks touch it.
    pub blocks: Vec<u32>,
    /// Each page's first blocks in address order, by page; a block that
    /// spans pages is listed on each.
    pub listed: Vec<ListedBlock>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedBlock {
    pub page: u32,
    pub addr: u64,
    pub size: u64,
    pub stack: u32,
}

/// In [`PageMap::nodes`]: no node known for the page.
pub const NO_NODE: u8 = u8::MAX;

impl PageMap {
    /// Fills `nodes` from the placement the agent took with the snapshot.
    pub fn place(&mut self, placement: &memgap_trace::numa::Placement) {
        let Some(m) = placement.mappings.iter().find(|m| m.start == self.start) else { return };
        let mut nodes = Vec::with_capacity(self.pages.len());
        for &(status, count) in &m.runs {
            let node = u8::try_from(status).ok().filter(|&n| n != NO_NODE).unwrap_or(NO_NODE);
            let room = self.pages.len() - nodes.len();
            nodes.extend(std::iter::repeat_n(node, (count as usize).min(room)));
        }
        nodes.resize(self.pages.len(), NO_NODE);
        self.nodes = nodes;
    }
}

/// The snapshot a command looks at, and why that one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Moment {
    /// Position among the trace's snapshots, in time order.
    pub index: usize,
    pub seconds: f64,
    /// How it was chosen: "gap", "peak", "end" or "seconds" (`--at`).
    #[serde(deserialize_with = "stored::static_name")]
    pub chosen: stored::Name,
    /// Why this snapshot, in words.
    pub reason: String,
}

impl Moment {
    /// "at 2.41 s, the largest gap between RSS and the live heap; --at peak|end|SECONDS for others"
    pub fn line(&self) -> String {
        format!("at {:.2} s, {}; --at {} for others", self.seconds, self.reason, self.others())
    }

    /// The other `--at` choices, for the hint after the moment.
    pub fn others(&self) -> &'static str {
        match self.chosen {
            "gap" => "peak|end|SECONDS",
            "peak" => "gap|end|SECONDS",
            "end" => "gap|peak|SECONDS",
            _ => "gap|peak|end|SECONDS",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ledger {
    pub at_seconds: f64,
    #[serde(deserialize_with = "stored::static_name")]
    pub snapshot_reason: stored::Name,
    /// Which moment this is and why it was chosen (set when a command asked for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moment: Option<Moment>,
    pub rss_bytes: u64,
    pub rows: Rows,
    /// memgap's own resident memory, counted in the `other` row: the agent's
    /// buffers and heap, its static data and code, the area it shares with
    /// the recorder. The program would not have it without memgap.
    pub memgap_bytes: u64,
    /// RSS less memgap's own memory: what the program's gap is measured
    /// against (the verdicts' ratios and shares).
    pub program_rss_bytes: u64,
    /// What VmRSS before and after the snapshot cannot explain: how far the
    /// sum of the rows (read in between) lies outside the two readings; the
    /// distance to rss_bytes when they agree.
    pub residual_bytes: i64,
    /// VmRSS after the snapshot minus before: how far RSS moved while it
    /// was read (recorders retry when it moved by more than 1 %).
    pub rss_moved_bytes: i64,
    /// Allocator address space not resident (returned to the kernel, or never touched).
    pub released_bytes: u64,
    /// Retained bytes malloc_trim(0) would return now (whole free pages inside
    /// free chunks), computed from the live set.
    pub trim_would_return_bytes: u64,
    pub retained_not_trimmable_bytes: u64,
    pub allocator: String,
    /// glibc arenas seen in the mappings (the main one plus each 64 MiB heap).
    pub arenas: u32,
    pub live_blocks: u64,
    pub heaps: Vec<HeapLedger>,
    pub fragmentation_by_size: Vec<SizeBucket>,
    pub other_breakdown: OtherBreakdown,
    /// Thread stacks (all of runtime for programs that only use malloc).
    pub stacks_bytes: u64,
    /// Every mapping of the snapshot and where its bytes went.
    pub mappings: Vec<MappingLedger>,
    pub snapshot_cost_ms: f64,
    /// Each heap owner's part of the rows (the allocator, the runtime).
    pub owners: Vec<OwnerShare>,
    /// The owner holding most of the gap (RSS − live), whose verdict this is.
    #[serde(deserialize_with = "stored::static_name_or_none")]
    pub gap_owner: Option<stored::Name>,
    /// Where the gap sits, largest first.
    pub findings: Vec<Finding>,
    /// What to try, for the allocators and runtimes in use, best first.
    pub remedies: Vec<Remedy>,
    /// Each owner's own figures, under its name (`go`, `ghc`, `ruby`…).
    #[serde(flatten, deserialize_with = "stored::sections")]
    pub sections: BTreeMap<stored::Name, serde_json::Value>,
    /// LazyFree of mappings no owner took: in the lazy_free row, in no share.
    #[serde(skip)]
    pub unowned_lazy_free_bytes: u64,
    /// What `memgap compare --remedies` measured of the remedies, if it ran.
    #[serde(skip)]
    pub measured_remedies: Option<std::sync::Arc<measured::RemedyMeasurements>>,
    #[serde(skip)]
    pub page_maps: Vec<PageMap>,
    /// Per call stack (when asked for): what its live blocks take and cost.
    #[serde(skip)]
    pub by_stack: Vec<StackShare>,
}

/// What the live blocks of one call stack take at a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StackShare {
    pub stack: u32,
    pub objects: u64,
    /// Requested bytes on resident pages: summed over all stacks, the live row.
    pub live_bytes: u64,
    /// Free bytes on the pages these blocks occupy, shared among the blocks
    /// of each page by the bytes they take there: summed over all stacks, the
    /// fragmented row.
    pub fragmentation_bytes: f64,
    /// Resident pages holding at least one of these blocks.
    pub pages: u64,
    /// Bytes the blocks take on those pages (requested + slack).
    pub taken_bytes: u64,
}

pub fn reason_name(reason: SnapshotReason) -> &'static str {
    match reason {
        SnapshotReason::Periodic => "periodic",
        SnapshotReason::RssPeak => "rss peak",
        SnapshotReason::Exit => "exit",
        SnapshotReason::Requested => "requested",
        SnapshotReason::Program => "program",
        SnapshotReason::LiveDrop => "live drop",
    }
}

impl Ledger {
    /// RSS less memgap's own memory: the program's.
    pub fn program_rss(&self) -> u64 {
        self.rss_bytes.saturating_sub(self.memgap_bytes)
    }

    /// An owner's part of the rows.
    pub fn share(&self, owner: &str) -> Option<&OwnerShare> {
        self.owners.iter().find(|s| s.owner == owner)
    }

    /// An owner's section, read back as its type.
    pub fn section<T: serde::de::DeserializeOwned>(&self, owner: &str) -> Option<T> {
        self.sections.get(owner).and_then(|value| T::deserialize(value).ok())
    }

    pub fn set_section<T: Serialize>(&mut self, owner: &'static str, value: &T) {
        self.sections.insert(owner, serde_json::to_value(value).expect("model structs always serialize"));
    }

    /// Takes mapping `index` (of `self.mappings`) back from the row the core
    /// put it in (`other`, or lazy_free for its MADV_FREE'd pages), for an
    /// owner whose figures came after the snapshot. Returns its resident
    /// bytes not lazily freed, and its lazily freed ones; the owner must put
    /// both into its share, then call [`finish`].
    pub fn reclaim(&mut self, index: usize, class: MappingClass) -> Option<(u64, u64)> {
        let entry = self.mappings.get_mut(index)?;
        let other = &mut self.other_breakdown;
        let part = match entry.class {
            MappingClass::ProgramMmap => &mut other.program_mmap,
            MappingClass::Unclassified | MappingClass::Other => &mut other.unclassified,
            _ => return None,
        };
        let lazy = entry.lazy_free_bytes.min(entry.resident_bytes).min(self.unowned_lazy_free_bytes);
        let counted = (entry.resident_bytes - lazy).min(*part);
        *part -= counted;
        self.unowned_lazy_free_bytes -= lazy;
        entry.class = class;
        Some((counted, lazy))
    }
}

impl Rows {
    pub fn add(&mut self, other: &Rows) {
        self.live += other.live;
        self.slack += other.slack;
        self.fragmented += other.fragmented;
        self.retained += other.retained;
        self.lazy_free += other.lazy_free;
        self.runtime += other.runtime;
        self.other += other.other;
    }
}
