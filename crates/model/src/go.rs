//! The ledger of a Go program, from what the Go runtime says about itself
//! (METRICS records of source `go`) laid over the page residency of a
//! snapshot.
//!
//! The runtime's classes map onto the rows: heap/objects → live
//! (size-class rounding is not known apart, so slack stays 0), heap/unused
//! → fragmented, heap/free → retained, heap/released → released (not
//! resident), heap/stacks and the runtime's own mappings → runtime. The
//! runtime counts memory it never touched as in use (fresh spans are known
//! to be zero and are not written), so its figures are checked against the
//! resident pages of the heap mappings: what the runtime counts but the
//! kernel does not hold comes off stacks, then fragmented, live, retained
//! (`untouched_bytes`); what the kernel holds beyond the runtime's count is
//! MADV_FREE'd (lazy_free) or retained (`unaccounted_heap_bytes`). Every
//! other mapping goes to runtime or other by its kind, and the rows are
//! checked against VmRSS like any ledger.
//!
//! Per size class, live objects come from the allocs-by-size and
//! frees-by-size histograms; spans in use per class are not published by
//! the runtime, so they are estimated: at least enough spans for the live
//! objects, at most one per live object and no more than the class's peak
//! ever needed, with the heap's unused bytes (known exactly) shared out
//! within those bounds. Objects per span come from the profiled runtime's
//! version (METRICS kind `size_classes`, written by memgap from it).

use std::collections::{BTreeMap, VecDeque};

use memgap_trace::records::{Mapping, Metrics, Residency, Snapshot};
use memgap_trace::vocabulary::{go as names, kind};
use serde::{Deserialize, Serialize};

use crate::ledger::owner::share;
use crate::ledger::{Finding, GcMark, HeapOwner, Ledger, MappingClass, MappingLedger, OwnerShare, Remedy, Rows};

/// The owner is named as its source.
pub const NAME: &str = memgap_trace::vocabulary::source::GO;
/// Below this a remedy is not worth a run.
const WORTH_TRYING: u64 = 1 << 20;

/// The Go heap grows in page-allocator chunks of 4 MiB (pallocChunkBytes).
const HEAP_CHUNK: u64 = 4 << 20;
/// A class counts as pathological when its spans are on average at most
/// this full and it leaves at least this much unused.
const LOW_OCCUPANCY: f64 = 0.25;
const LOW_OCCUPANCY_MIN_BYTES: u64 = 1 << 20;

/// Figures held back waiting for a snapshot (100 s of the helper's samples).
const MAX_PENDING: usize = 1000;

/// What the Go runtime has reported so far in a replay.
#[derive(Debug, Clone, Default)]
pub struct GoState {
    pending: VecDeque<Metrics>,
    seen: bool,
    version: Option<String>,
    /// The latest sample of runtime/metrics (or of MemStats restated so).
    values: BTreeMap<String, f64>,
    values_ns: u64,
    values_kind: String,
    last_gc: Option<Metrics>,
    /// Object size → (span bytes, objects per span).
    classes: BTreeMap<u64, (u64, u64)>,
    /// Object size → most live objects seen in one sample.
    peak_live: BTreeMap<u64, u64>,
}

impl GoState {
    pub fn add(&mut self, metrics: &Metrics) {
        if metrics.source == NAME {
            self.seen = true;
            self.pending.push_back(metrics.clone());
            // Snapshots reach the model at most a few writer rounds after the
            // figures around them; a reader that skips snapshots never
            // catches up, so the oldest figures are taken in here.
            while self.pending.len() > MAX_PENDING {
                let oldest = self.pending.pop_front().unwrap();
                self.apply(oldest);
            }
        }
    }

    pub fn is_go(&self) -> bool {
        self.seen
    }

    /// Takes in every figure reported up to `monotonic_ns`, in time order
    /// (snapshots may reach the model after figures reported later).
    pub fn catch_up(&mut self, monotonic_ns: u64) {
        self.pending.make_contiguous().sort_by_key(|m| m.monotonic_ns);
        while self.pending.front().is_some_and(|m| m.monotonic_ns <= monotonic_ns) {
            let metrics = self.pending.pop_front().unwrap();
            self.apply(metrics);
        }
    }

    fn apply(&mut self, metrics: Metrics) {
        match metrics.kind.as_str() {
            kind::BUILD => {
                self.version = metrics
                    .values
                    .iter()
                    .find_map(|(name, _)| names::parse_version_metric(name).map(str::to_string))
                    .or(self.version.take());
            }
            kind::SIZE_CLASSES => {
                let mut classes: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
                for (name, value) in &metrics.values {
                    let Some((what, size)) = names::parse_bucket(name) else { continue };
                    let entry = classes.entry(size as u64).or_default();
                    match what {
                        names::SPAN_BYTES => entry.0 = *value as u64,
                        names::OBJECTS_PER_SPAN => entry.1 = *value as u64,
                        _ => {}
                    }
                }
                self.classes = classes;
            }
            kind::GC => self.last_gc = Some(metrics),
            _ if metrics.get(names::HEAP_OBJECTS).is_some() => {
                self.values = metrics.values.into_iter().collect();
                self.values_ns = metrics.monotonic_ns;
                self.values_kind = metrics.kind;
                for (size, live) in live_by_class(&self.values) {
                    let peak = self.peak_live.entry(size).or_insert(0);
                    *peak = (*peak).max(live);
                }
            }
            _ => {}
        }
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).map(|&v| v.max(0.0) as u64)
    }
}

/// Live objects per object size: allocs-by-size − frees-by-size. A class of
/// `size` bytes is the bucket with upper bound size + 1 (runtime/metrics.go);
/// large objects (the `inf` bucket) are left out.
fn live_by_class(values: &BTreeMap<String, f64>) -> BTreeMap<u64, u64> {
    let mut allocs: BTreeMap<u64, f64> = BTreeMap::new();
    let mut frees: BTreeMap<u64, f64> = BTreeMap::new();
    for (name, &count) in values {
        let Some((histogram, upper)) = names::parse_bucket(name) else { continue };
        if !upper.is_finite() || upper < 2.0 {
            continue;
        }
        let size = upper as u64 - 1;
        match histogram {
            names::ALLOCS_BY_SIZE => *allocs.entry(size).or_default() += count,
            names::FREES_BY_SIZE => *frees.entry(size).or_default() += count,
            _ => {}
        }
    }
    allocs.into_iter().map(|(size, a)| (size, (a - frees.get(&size).copied().unwrap_or(0.0)).max(0.0) as u64)).collect()
}

/// One size class at a snapshot.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GoSizeClass {
    pub size: u64,
    pub span_bytes: u64,
    /// Objects a span of this class holds in the profiled runtime.
    pub objects_per_span: u64,
    pub live_objects: u64,
    pub live_bytes: u64,
    /// Most live objects seen in one sample up to this snapshot.
    pub peak_live_objects: u64,
    /// Spans the live objects need at least (packed densely).
    pub spans_needed: u64,
    /// Spans estimated in use (see the module doc).
    pub spans_estimate: u64,
    /// live objects ÷ (spans_estimate × objects_per_span).
    pub occupancy: f64,
    /// Free slots in those spans, in bytes.
    pub unused_bytes_estimate: u64,
}

/// Where a Go ledger's figures came from; its name is the JSON's `source`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GoSource {
    /// runtime/metrics, sampled by the helper package.
    RuntimeMetrics,
    /// The runtime's accounting read from the process's memory (`memgap
    /// snapshot PID`, `memgap watch`).
    ProcessMemory,
    /// runtime.MemStats over HTTP (`memgap attach`).
    Memstats,
    /// GODEBUG=gctrace=1 lines only.
    Gctrace,
    /// Nothing from the runtime yet: no GC had run.
    #[default]
    None,
}

impl GoSource {
    const NAMES: [(GoSource, &'static str); 5] = [
        (GoSource::RuntimeMetrics, "runtime/metrics"),
        (GoSource::ProcessMemory, "process memory"),
        (GoSource::Memstats, "memstats"),
        (GoSource::Gctrace, "gctrace"),
        (GoSource::None, "none"),
    ];

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(source, _)| *source == self).map_or("none", |(_, name)| name)
    }
}

impl Serialize for GoSource {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for GoSource {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        GoSource::NAMES
            .iter()
            .find(|(_, known)| *known == name)
            .map(|(source, _)| *source)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown Go source {name:?}")))
    }
}

/// What the Go runtime said, at a snapshot.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GoLedger {
    /// As runtime.Version() spells it, when known.
    pub version: Option<String>,
    pub source: GoSource,
    /// The runtime's own split of its heap is known (not gctrace only).
    pub exact: bool,
    /// Without the runtime's split: which rows are estimated, and from what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated: Option<String>,
    /// How old the runtime's figures are at the snapshot.
    pub figures_age_seconds: Option<f64>,
    pub heap_objects_bytes: u64,
    pub heap_unused_bytes: u64,
    pub heap_free_bytes: u64,
    pub heap_released_bytes: u64,
    pub heap_stacks_bytes: u64,
    /// heap objects + unused + free: MemStats' HeapSys − HeapReleased.
    pub heap_usage_bytes: u64,
    /// Everything the runtime mapped (MemStats.Sys).
    pub total_bytes: u64,
    /// Resident bytes of the Go heap mappings.
    pub heap_resident_bytes: u64,
    pub heap_mappings: u32,
    /// Counted in use by the runtime but not resident (never touched).
    pub untouched_bytes: u64,
    /// Resident in the heap mappings beyond the runtime's figures.
    pub unaccounted_heap_bytes: u64,
    pub gc_cycles: Option<u64>,
    pub goroutines: Option<u64>,
    pub heap_goal_bytes: Option<u64>,
    /// Heap marked live by the last GC (gctrace, whole MB).
    pub last_gc_live_bytes: Option<u64>,
    pub size_classes: Vec<GoSizeClass>,
    /// Classes with many spans at low occupancy, worst first (sizes).
    pub sparse_classes: Vec<u64>,
}

/// The Go heap: named by the runtime (Go 1.25+ on kernels with anonymous
/// mapping names), or, unnamed, a private anonymous mapping whose bounds are
/// whole 4 MiB page-allocator chunks.
fn is_go_heap(mapping: &Mapping, named: bool) -> bool {
    if named {
        return mapping.name == "[anon: Go: heap]";
    }
    mapping.is_private_writable_anonymous()
        && mapping.name.is_empty()
        && mapping.start.is_multiple_of(HEAP_CHUNK)
        && mapping.end.is_multiple_of(HEAP_CHUNK)
}

fn resident_bytes(mapping: &Mapping, page: u64) -> u64 {
    match &mapping.residency {
        Residency::Unknown => mapping.rss,
        residency => residency.resident_in(0..(mapping.end - mapping.start) / page) * page,
    }
}

/// The Go runtime as a heap owner: it claims the Go heap and the runtime's
/// own anonymous mappings, and splits them by what the runtime reported.
#[derive(Debug, Default)]
pub struct GoOwner {
    state: GoState,
    gc_times: Vec<u64>,
    start_ns: u64,
    summary: crate::ledger::RuntimeSummary,
    /// The live figure at end: (time, bytes, from runtime/metrics).
    last_live: Option<(u64, u64, bool)>,
}

impl GoOwner {
    /// Live heap and threads as the figures come (for the summary): heap
    /// objects from runtime/metrics, else what gctrace's GCs marked.
    fn count(&mut self, metrics: &Metrics) {
        let exact = metrics.get(names::HEAP_OBJECTS);
        let marked = if metrics.kind == kind::GC { metrics.get(names::GCTRACE_LIVE) } else { None };
        let have_exact = self.last_live.is_some_and(|(_, _, exact)| exact);
        let live = match (exact, marked) {
            (Some(bytes), _) => Some((bytes, true)),
            (None, Some(bytes)) if !have_exact => Some((bytes, false)),
            _ => None,
        };
        if let Some((bytes, exact)) = live {
            let bytes = bytes.max(0.0) as u64;
            let s = &mut self.summary;
            if bytes >= s.peak_live_bytes || (exact && s.source != GoSource::RuntimeMetrics.name()) {
                if exact && s.source != GoSource::RuntimeMetrics.name() {
                    s.peak_live_bytes = 0;
                }
                if bytes >= s.peak_live_bytes {
                    s.peak_live_bytes = bytes;
                    s.peak_live_seconds = crate::owners::seconds_since(self.start_ns, metrics.monotonic_ns);
                }
            }
            s.source = if exact { GoSource::RuntimeMetrics } else { GoSource::Gctrace }.name().into();
            self.last_live = Some((metrics.monotonic_ns, bytes, exact));
            s.live_bytes_at_end = bytes;
        }
        let threads = metrics
            .get(names::GOROUTINES)
            .map(|g| (g, "goroutines"))
            .or_else(|| metrics.get(names::GCTRACE_PROCS).map(|p| (p, "procs (GOMAXPROCS)")));
        if let Some((count, kind)) = threads {
            let count = count.max(0.0) as u32;
            if self.summary.threads_kind != "goroutines" || kind == "goroutines" {
                let previous = if self.summary.threads_kind == kind { self.summary.threads.unwrap_or(0) } else { 0 };
                self.summary.threads = Some(previous.max(count));
                self.summary.threads_kind = kind;
            }
        }
    }
}

impl HeapOwner for GoOwner {
    fn name(&self) -> &'static str {
        NAME
    }

    fn present(&self) -> bool {
        self.state.is_go()
    }

    fn process(&mut self, process: &memgap_trace::records::Process) {
        if self.start_ns == 0 {
            self.start_ns = process.start_monotonic_ns;
        }
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if metrics.source != NAME {
            return;
        }
        if metrics.kind == kind::GC {
            self.gc_times.push(metrics.monotonic_ns);
        }
        self.count(metrics);
        self.state.add(metrics);
    }

    fn summary(&self) -> Option<crate::ledger::RuntimeSummary> {
        self.last_live.map(|_| crate::ledger::RuntimeSummary { owner: NAME, ..self.summary.clone() })
    }

    fn claim(&mut self, snapshot: &Snapshot, ledger: &mut Ledger) -> Vec<usize> {
        self.state.catch_up(snapshot.time);
        claim(&self.state, snapshot, ledger)
    }

    fn gc_marks(&self, start_ns: u64) -> Vec<GcMark> {
        // Go's collector is not generational: every cycle is a full one.
        self.gc_times
            .iter()
            .map(|&ns| GcMark { seconds: crate::owners::seconds_since(start_ns, ns), source: NAME.into(), major: true })
            .collect()
    }

    fn findings(&self, ledger: &Ledger) -> Vec<Finding> {
        let mut out = crate::owners::malloc::row_findings(ledger, NAME);
        if let Some(g) = ledger.section::<GoLedger>(NAME) {
            let sparse: u64 = sparse_saving(&g);
            if sparse > 0 {
                out.push(Finding { kind: "sparse_size_classes", owner: NAME, bytes: sparse, share: share(sparse, ledger.rss_bytes) });
            }
        }
        out
    }

    fn remedies(&self, ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
        remedies(ledger, findings)
    }
}

/// What copying the survivors of sparse classes would give back.
fn sparse_saving(g: &GoLedger) -> u64 {
    g.sparse_classes
        .iter()
        .filter_map(|s| g.size_classes.iter().find(|c| c.size == *s))
        .map(|c| (c.spans_estimate - c.spans_needed) * c.span_bytes)
        .sum()
}

fn remedies(ledger: &Ledger, findings: &[Finding]) -> Vec<Remedy> {
    let Some(g) = ledger.section::<GoLedger>(NAME) else { return Vec::new() };
    let bytes = |kind: &str| crate::owners::malloc::finding_bytes(findings, NAME, kind);
    let (retained, fragmented, lazy) = (bytes("retained"), bytes("fragmented"), bytes("lazy_free"));
    let mut out = Vec::new();
    let live = ledger.share(NAME).map_or(0, |s| s.rows.live);
    if retained >= WORTH_TRYING {
        // A soft limit a little above what the heap uses makes the
        // scavenger return free spans as the heap nears it.
        let in_use = live + ledger.share(NAME).map_or(0, |s| s.rows.fragmented + s.rows.runtime);
        let limit = (in_use + in_use / 4).max(8 << 20).next_multiple_of(1 << 20);
        let limit_text = format!("{}MiB", limit >> 20);
        out.push(Remedy::new(
            "go-memlimit",
            NAME,
            format!("a soft memory limit, so the runtime returns free spans at its next collections: GOMEMLIMIT={limit_text}"),
            &[("GOMEMLIMIT", &limit_text)],
            retained,
        ));
        out.push(Remedy::new(
            "go-free-os-memory",
            NAME,
            "return free spans at once from the program after a burst: debug.FreeOSMemory()",
            &[],
            retained,
        ));
    }
    // GOGC sets the room the heap grows into past what the last collection
    // marked: at the default, as much again. A gctrace goal is the one of the
    // cycle that just ran, set from the heap before it, so after a burst is
    // freed it lies far above anything GOGC still governs.
    let goal_room = g.heap_goal_bytes.map_or(0, |goal| goal.saturating_sub(live));
    let goal_room = g.last_gc_live_bytes.map_or(goal_room, |marked| goal_room.min(marked));
    if retained + fragmented >= WORTH_TRYING && goal_room >= WORTH_TRYING {
        // GOGC=50 halves the room the heap grows into between collections.
        out.push(Remedy::new(
            "go-gogc",
            NAME,
            "collect more often, so the heap grows less past its live data: GOGC=50",
            &[("GOGC", "50")],
            goal_room / 2,
        ));
    }
    let sparse = sparse_saving(&g);
    if sparse >= WORTH_TRYING {
        out.push(Remedy::new(
            "go-compact-survivors",
            NAME,
            "copy the survivors of sparse size classes into new objects (or use []T instead of []*T) so their spans empty out",
            &[],
            sparse,
        ));
    }
    if lazy >= WORTH_TRYING {
        out.push(Remedy::new(
            "go-madvdontneed",
            NAME,
            "return memory with MADV_DONTNEED, so RSS falls at once: GODEBUG=madvdontneed=1",
            &[("GODEBUG", "madvdontneed=1")],
            lazy,
        ));
    }
    out
}

/// Takes the Go heap and the runtime's own mappings of `snapshot` (the
/// state must have caught up to it) into the ledger; returns their indexes.
fn claim(go: &GoState, snapshot: &Snapshot, ledger: &mut Ledger) -> Vec<usize> {
    let page = snapshot.page_size.max(1);
    let named = snapshot.mappings.iter().any(|m| m.name == "[anon: Go: heap]");
    let mut claimed = Vec::new();
    let (mut heap_resident, mut heap_lazy, mut heap_mappings, mut runtime_mapped) = (0, 0, 0u32, 0);
    for (index, mapping) in snapshot.mappings.iter().enumerate() {
        let mut entry = MappingLedger::of(mapping);
        entry.class = if is_go_heap(mapping, named) {
            entry.resident_bytes = resident_bytes(mapping, page);
            heap_resident += entry.resident_bytes;
            heap_lazy += mapping.lazy_free;
            heap_mappings += 1;
            MappingClass::Heap
        } else if mapping.is_private_writable_anonymous() && mapping.name != "[heap]" && mapping.name != "[stack]" {
            // The runtime's own structures (spans, GC bits, page allocator…).
            entry.resident_bytes = resident_bytes(mapping, page);
            runtime_mapped += entry.resident_bytes;
            MappingClass::Runtime
        } else {
            continue;
        };
        claimed.push(index);
        ledger.mappings.push(entry);
    }
    ledger.allocator = NAME.into();

    let mut g = GoLedger {
        version: go.version.clone(),
        heap_resident_bytes: heap_resident,
        heap_mappings,
        gc_cycles: go.get(names::GC_CYCLES).or_else(|| go.last_gc.as_ref().and_then(|m| m.get(names::GCTRACE_CYCLE)).map(|v| v as u64)),
        goroutines: go.get(names::GOROUTINES),
        heap_goal_bytes: go
            .get(names::HEAP_GOAL)
            .or_else(|| go.last_gc.as_ref().and_then(|m| m.get(names::GCTRACE_GOAL)).map(|v| v as u64)),
        last_gc_live_bytes: go.last_gc.as_ref().and_then(|m| m.get(names::GCTRACE_LIVE)).map(|v| v as u64),
        ..GoLedger::default()
    };
    let mut rows = Rows::default();
    let heap_stacks;
    if let Some(objects) = go.get(names::HEAP_OBJECTS) {
        g.source = match go.values_kind.as_str() {
            kind::MEMSTATS => GoSource::Memstats,
            kind::PROCESS_MEMORY => GoSource::ProcessMemory,
            _ => GoSource::RuntimeMetrics,
        };
        g.exact = true;
        g.figures_age_seconds = Some(snapshot.time.saturating_sub(go.values_ns) as f64 / 1e9);
        g.heap_objects_bytes = objects;
        g.heap_unused_bytes = go.get(names::HEAP_UNUSED).unwrap_or(0);
        g.heap_free_bytes = go.get(names::HEAP_FREE).unwrap_or(0);
        g.heap_released_bytes = go.get(names::HEAP_RELEASED).unwrap_or(0);
        g.heap_stacks_bytes = go.get(names::HEAP_STACKS).unwrap_or(0);
        g.total_bytes = go.get(names::TOTAL).unwrap_or(0);
        g.heap_usage_bytes = g.heap_objects_bytes + g.heap_unused_bytes + g.heap_free_bytes;
        let mut parts = [g.heap_stacks_bytes, g.heap_unused_bytes, g.heap_objects_bytes, g.heap_free_bytes];
        let claimed_bytes: u64 = parts.iter().sum();
        if heap_resident < claimed_bytes {
            // What the runtime never touched: the deep end of goroutine stacks
            // (a stack grows down into pages it may never reach), the
            // untouched tails of fresh spans (unused: fresh spans are known to
            // be zero and not written), objects never written (live), then
            // free pages.
            let mut deficit = claimed_bytes - heap_resident;
            g.untouched_bytes = deficit;
            for part in parts.iter_mut() {
                let cut = deficit.min(*part);
                *part -= cut;
                deficit -= cut;
            }
        }
        let [stacks, unused, objects, free] = parts;
        rows.live = objects;
        rows.fragmented = unused;
        rows.retained = free;
        heap_stacks = stacks;
        let extra = heap_resident.saturating_sub(claimed_bytes);
        g.unaccounted_heap_bytes = extra;
        rows.lazy_free = extra.min(heap_lazy);
        rows.retained += extra - rows.lazy_free;
    } else {
        heap_stacks = 0;
        rows.lazy_free = heap_lazy.min(heap_resident);
        let resident = heap_resident - rows.lazy_free;
        match (&go.last_gc, g.last_gc_live_bytes) {
            (Some(_), Some(live)) => {
                // gctrace only: the live heap the last GC marked; the rest
                // of the resident heap cannot be split, and is counted as
                // free spans (retained), though part of it may hold objects
                // allocated since that GC, up to the heap goal.
                g.source = GoSource::Gctrace;
                rows.live = live.min(resident);
                rows.retained = resident - rows.live;
                g.estimated = Some(format!(
                    "estimated from gctrace: live is what GC {} marked ({} MB, whole MB); the rest of the resident heap is counted as retained (free spans), though part of it may hold objects allocated since that GC (the heap goal was {} MB)",
                    g.gc_cycles.unwrap_or(0),
                    live >> 20,
                    g.heap_goal_bytes.unwrap_or(0) >> 20
                ));
            }
            _ => {
                // No collection yet: nothing was freed, so every resident heap
                // page holds objects allocated since the start.
                g.source = GoSource::None;
                rows.live = resident;
                g.estimated = Some("estimated: no GC had run, so every resident heap page holds objects allocated since the start (live, or garbage not yet collected)".into());
            }
        }
    }
    g.size_classes = size_classes(go, g.heap_unused_bytes);
    let mut sparse: Vec<&GoSizeClass> = g
        .size_classes
        .iter()
        .filter(|c| {
            c.spans_estimate >= 2 * c.spans_needed.max(1)
                && c.occupancy <= LOW_OCCUPANCY
                && c.unused_bytes_estimate >= LOW_OCCUPANCY_MIN_BYTES
        })
        .collect();
    sparse.sort_by_key(|c| std::cmp::Reverse(c.unused_bytes_estimate));
    g.sparse_classes = sparse.iter().map(|c| c.size).collect();

    rows.runtime = heap_stacks + runtime_mapped;
    ledger.owners.push(OwnerShare { owner: NAME, rows, released_bytes: g.heap_released_bytes, estimated: g.estimated.clone() });
    ledger.set_section(NAME, &g);
    claimed
}

/// Per class: live objects, spans needed and estimated, occupancy.
fn size_classes(go: &GoState, heap_unused: u64) -> Vec<GoSizeClass> {
    let live = live_by_class(&go.values);
    let mut classes: Vec<GoSizeClass> = live
        .iter()
        .filter(|&(_, &objects)| objects > 0)
        .map(|(&size, &objects)| {
            let (span_bytes, per_span) = go.classes.get(&size).copied().unwrap_or((0, 0));
            let peak = go.peak_live.get(&size).copied().unwrap_or(objects).max(objects);
            let needed = if per_span > 0 { objects.div_ceil(per_span) } else { 0 };
            GoSizeClass {
                size,
                span_bytes,
                objects_per_span: per_span,
                live_objects: objects,
                live_bytes: objects * size,
                peak_live_objects: peak,
                spans_needed: needed,
                spans_estimate: needed,
                ..GoSizeClass::default()
            }
        })
        .collect();
    // Spans per class lie between what the live objects need and the fewer
    // of one per live object and what the class's peak needed; share the
    // runtime's unused bytes out over that room.
    let room: Vec<u64> = classes
        .iter()
        .map(|c| {
            if c.objects_per_span == 0 {
                0
            } else {
                c.live_objects.min(c.peak_live_objects.div_ceil(c.objects_per_span)).max(c.spans_needed) - c.spans_needed
            }
        })
        .collect();
    let unused_at_least: u64 = classes.iter().map(|c| (c.spans_needed * c.span_bytes).saturating_sub(c.live_bytes)).sum();
    let room_bytes: u64 = classes.iter().zip(&room).map(|(c, r)| r * c.span_bytes).sum();
    let to_share = heap_unused.saturating_sub(unused_at_least).min(room_bytes);
    for (class, room) in classes.iter_mut().zip(room) {
        if room_bytes > 0 {
            class.spans_estimate += (room as f64 * to_share as f64 / room_bytes as f64).round() as u64;
        }
        let slots = class.spans_estimate * class.objects_per_span;
        class.occupancy = if slots > 0 { class.live_objects as f64 / slots as f64 } else { 0.0 };
        class.unused_bytes_estimate = (class.spans_estimate * class.span_bytes).saturating_sub(class.live_bytes);
    }
    classes
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::records::Rss;

    const MIB: u64 = 1 << 20;
    const HEAP: u64 = 0x3a9e_b8c0_0000;

    fn metrics(ns: u64, kind: &str, values: &[(&str, f64)]) -> Metrics {
        Metrics {
            monotonic_ns: ns,
            source: "go".into(),
            kind: kind.into(),
            values: values.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        }
    }

    fn ledger(go: &GoState, snapshot: &Snapshot) -> Ledger {
        let mut owners: Vec<Box<dyn HeapOwner>> = vec![Box::new(GoOwner { state: go.clone(), ..GoOwner::default() })];
        crate::accounting::compute(&mut crate::HeapState::default(), snapshot, crate::accounting::Detail::default(), &mut owners)
    }

    fn snapshot(time: u64, heap_pages: u64, resident_pages: u64, rss: u64) -> Snapshot {
        let mut bits = vec![0u8; (heap_pages as usize).div_ceil(8)];
        for i in 0..resident_pages as usize {
            bits[i / 8] |= 1 << (i % 8);
        }
        Snapshot {
            time,
            page_size: 4096,
            rss: Rss { vm_rss: rss, ..Rss::default() },
            mappings: vec![
                Mapping {
                    start: 0x400000,
                    end: 0x500000,
                    perms: "r-xp".into(),
                    inode: 7,
                    name: "/bin/prog".into(),
                    rss: MIB,
                    ..Mapping::default()
                },
                Mapping {
                    start: HEAP,
                    end: HEAP + heap_pages * 4096,
                    perms: "rw-p".into(),
                    rss: resident_pages * 4096,
                    residency: Residency::Bitmap(bits),
                    ..Mapping::default()
                },
                Mapping {
                    start: 0x7f00_0010_0000,
                    end: 0x7f00_0020_0000,
                    perms: "rw-p".into(),
                    rss: MIB,
                    residency: Residency::All,
                    ..Mapping::default()
                },
            ],
            ..Snapshot::default()
        }
    }

    fn step_512() -> GoState {
        let mut go = GoState::default();
        let classes = vec![("span_bytes[16]".to_string(), 8192.0), ("objects_per_span[16]".to_string(), 504.0)];
        go.add(&Metrics { monotonic_ns: 1, source: "go".into(), kind: "size_classes".into(), values: classes });
        go.add(&metrics(1, "build", &[("go_info{version=\"go1.26.8\"}", 1.0)]));
        // 1<<20 16-byte objects allocated, then all but every 512th freed.
        go.add(&metrics(
            2,
            "sample",
            &[(names::HEAP_OBJECTS, 16.0 * MIB as f64), (names::HEAP_UNUSED, 0.0), ("/gc/heap/allocs-by-size:bytes[17]", 1048576.0)],
        ));
        let unused = 2081.0 * 8192.0 - 2048.0 * 16.0;
        go.add(&metrics(
            3,
            "sample",
            &[
                (names::HEAP_OBJECTS, 2048.0 * 16.0),
                (names::HEAP_UNUSED, unused),
                (names::HEAP_FREE, MIB as f64),
                (names::HEAP_STACKS, 65536.0),
                ("/gc/heap/allocs-by-size:bytes[17]", 1048576.0),
                ("/gc/heap/frees-by-size:bytes[17]", 1048576.0 - 2048.0),
            ],
        ));
        go
    }

    #[test]
    fn rows_from_runtime_metrics_add_up_and_name_the_sparse_class() {
        let mut go = step_512();
        go.catch_up(10);
        let claimed = 2048 * 16 + (2081 * 8192 - 2048 * 16) + MIB + 65536;
        let rss = claimed.next_multiple_of(4096) + 2 * MIB;
        let l = ledger(&go, &snapshot(10, 8192, claimed.div_ceil(4096), rss));
        assert_eq!(l.rows.live, 2048 * 16);
        assert_eq!(l.rows.fragmented, 2081 * 8192 - 2048 * 16);
        assert_eq!(l.rows.retained, MIB + (claimed.next_multiple_of(4096) - claimed));
        assert_eq!(l.rows.runtime, 65536 + MIB);
        assert_eq!(l.rows.other, MIB);
        assert_eq!(l.residual_bytes, 0);
        let g = l.section::<GoLedger>(NAME).unwrap();
        assert_eq!((g.source, g.exact, g.version.as_deref()), (GoSource::RuntimeMetrics, true, Some("go1.26.8")));
        let class = &g.size_classes[0];
        assert_eq!((class.size, class.live_objects, class.peak_live_objects, class.spans_needed), (16, 2048, 1048576, 5));
        assert_eq!(class.spans_estimate, 2048, "one span per survivor: {class:?}");
        assert_eq!(g.sparse_classes, vec![16]);
        assert_eq!(l.gap_owner, Some(NAME));
    }

    #[test]
    fn memory_the_runtime_never_touched_is_not_counted() {
        let mut go = step_512();
        go.catch_up(10);
        // Only 1 MiB of the heap is resident.
        let l = ledger(&go, &snapshot(10, 8192, 256, 3 * MIB));
        let g = l.section::<GoLedger>(NAME).unwrap();
        assert_eq!(l.rows.live + l.rows.fragmented + l.rows.retained + l.rows.lazy_free + l.rows.runtime - MIB, MIB);
        assert!(g.untouched_bytes > 15 * MIB);
        assert_eq!(l.residual_bytes, 0);
    }

    #[test]
    fn figures_after_the_snapshot_are_not_used() {
        let mut go = step_512();
        go.catch_up(2);
        let l = ledger(&go, &snapshot(2, 8192, 4096, 20 * MIB));
        assert_eq!(l.rows.live, 16 * MIB);
        assert_eq!(l.rows.fragmented, 0);
    }

    #[test]
    fn gctrace_only_splits_live_from_the_rest() {
        let mut go = GoState::default();
        go.add(&metrics(1, "gc", &[(names::GCTRACE_LIVE, 2.0 * MIB as f64), (names::GCTRACE_CYCLE, 3.0)]));
        go.catch_up(5);
        let l = ledger(&go, &snapshot(5, 2048, 1024, 6 * MIB));
        assert_eq!((l.rows.live, l.rows.retained), (2 * MIB, 2 * MIB));
        let g = l.section::<GoLedger>(NAME).unwrap();
        assert_eq!((g.source, g.exact, g.gc_cycles), (GoSource::Gctrace, false, Some(3)));
    }

    #[test]
    fn after_a_freed_burst_the_soft_limit_comes_before_a_lower_gogc() {
        // The forced collection after a 148 MiB burst: 150->150->2 MB, 296 MB goal.
        let mut go = GoState::default();
        go.add(&metrics(
            1,
            "gc",
            &[(names::GCTRACE_LIVE, 2.0 * MIB as f64), (names::GCTRACE_GOAL, 296.0 * MIB as f64), (names::GCTRACE_CYCLE, 9.0)],
        ));
        go.catch_up(5);
        let l = ledger(&go, &snapshot(5, 40960, 38400, 152 * MIB));
        assert!(l.rows.retained >= 140 * MIB, "{:?}", l.rows);
        let first = &l.remedies[0];
        assert_eq!(first.id, "go-memlimit", "{:?}", l.remedies);
        let gogc = l.remedies.iter().find(|r| r.id == "go-gogc");
        assert!(gogc.is_none_or(|r| r.expected_savings_bytes <= MIB), "{gogc:?}");
    }
}
