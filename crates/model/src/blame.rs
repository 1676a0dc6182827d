//! Blame: which call sites' surviving blocks keep mostly-empty pages resident.
//!
//! At a snapshot, every page's free bytes are shared among the blocks on it
//! by the bytes each takes (the ledger's fragmented row, split); summed per
//! call stack and per allocation site (the first frame outside memgap and
//! the allocator), that is each site's fragmentation cost: about what would
//! come back if its blocks were packed densely.
//!
//! Over the whole run, per site: every allocation, freed or not (count and
//! bytes), and the temporary ones (freed within a short window, heaptrack's
//! "most temporary"): churn that costs time in the allocator and shows in no
//! snapshot. Counted during the same replay, with one set of counters per
//! call stack.

use std::path::Path;
use std::sync::Arc;

use memgap_replay::{Change, Inherited, LiveSet, Outcome, ThreadEvent, Timeline, Visitor, replay};
use memgap_symbolize::python::{PythonCodes, is_python};
use memgap_symbolize::{Frame, Symbolizer, short_name};
use memgap_trace::python::{PythonCode, is_python_frame};
use memgap_trace::records::{Clock, Metrics, Module, Process, Rss, Snapshot, Thread};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

use crate::accounting::Detail;
use crate::heap_state::HeapState;
use crate::ledger::owner::Taken;
use crate::ledger::{Ledger, Moment};
use crate::snapshots::{self, At, GapFinder, GapsSeen, MomentError};

/// Frames that belong to memgap or to the allocator, not to the program:
/// the allocation site is the first frame past them. Matched against the
/// start of the function name.
pub const ALLOCATOR_FUNCTIONS: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "reallocarray",
    "__libc_",
    "operator new",
    "operator delete",
    "__rust_alloc",
    "__rust_realloc",
    "__rdl_",
    "__rg_",
    "alloc::alloc::",
    "alloc::raw_vec::",
    "<alloc::raw_vec::",
    "alloc::vec::Vec<T,A>::reserve",
    "std::sys::alloc",
    "__gnu_cxx::new_allocator",
    "__gnu_cxx::__new_allocator",
    "std::allocator",
    "std::__new_allocator",
    "std::allocator_traits",
    "ruby_xmalloc",
    "ruby_xcalloc",
    "ruby_xrealloc",
    "objspace_xmalloc",
    "PyMem_",
    "_PyMem_",
    "PyObject_Malloc",
    "_PyObject_Malloc",
    // Standard library containers and strings (C++, Rust): the site is the
    // program's code that used them.
    "std::",
    "__gnu_cxx::",
    "<std::",
    "alloc::",
    "<alloc::",
    "core::",
    "<core::",
];
const ALLOCATOR_MODULES: &[&str] = &["libmemgap_agent.so", "libjemalloc.so", "libtcmalloc", "libmimalloc.so"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlameOrder {
    #[default]
    Fragmentation,
    Live,
    Leaked,
    /// Bytes allocated over the whole run, freed or not.
    Allocated,
    /// Allocations freed within the temporary window.
    Temporary,
}

/// An allocation freed within this many milliseconds is temporary.
pub const DEFAULT_TEMPORARY_MS: u64 = 10;

impl std::str::FromStr for BlameOrder {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "fragmentation" => Ok(BlameOrder::Fragmentation),
            "live" => Ok(BlameOrder::Live),
            "leaked" => Ok(BlameOrder::Leaked),
            "allocated" => Ok(BlameOrder::Allocated),
            "temporary" => Ok(BlameOrder::Temporary),
            _ => Err(format!("'{text}' is not fragmentation, live, leaked, allocated or temporary")),
        }
    }
}

/// A call stack's frames, innermost first, each shared with every other
/// stack through it, the whole held once however many entries show it.
pub type Frames = Arc<[Arc<Frame>]>;

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct BlameEntry {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    /// The call stack, innermost first (for a site: its largest stack);
    /// its frames shared with every other stack that passes through them,
    /// and the whole stack with the facts it came from while no frame's
    /// name is shortened.
    pub stack: Frames,
    pub live_bytes: u64,
    pub objects: u64,
    pub fragmentation_bytes: u64,
    /// Live at the end of the run (never freed).
    pub leaked_bytes: u64,
    /// Every allocation of the whole run, freed or not (a realloc counts as one).
    pub allocations: u64,
    pub allocated_bytes: u64,
    /// Allocations freed within the temporary window, and their bytes.
    pub temporary_allocations: u64,
    pub temporary_bytes: u64,
    /// Resident pages holding its live blocks.
    pub pages: u64,
    /// Pages holding its blocks ÷ pages its blocks would fill if packed
    /// densely: 1 is dense; large means its survivors are spread thin.
    pub scatter: f64,
    /// Distinct call stacks merged into this entry.
    pub stacks: u32,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Blame {
    pub at_seconds: f64,
    pub snapshot_reason: &'static str,
    /// Which moment this is and why it was chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moment: Option<Moment>,
    pub rss_bytes: u64,
    /// The ledger's fragmented row: the sum of fragmentation_bytes.
    pub fragmented_bytes: u64,
    pub live_bytes: u64,
    /// Whether the trace has call stacks at all (`memgap run --no-stacks`).
    pub has_stacks: bool,
    /// Over the whole run, every site together.
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub temporary_allocations: u64,
    pub temporary_bytes: u64,
    pub temporary_ms: u64,
    pub entries: Vec<BlameEntry>,
    pub warnings: Vec<String>,
    /// Per call stack, unsorted and untruncated: for exports.
    #[serde(skip)]
    pub by_stack: Vec<BlameEntry>,
    /// Call stack id → its allocation site, as one line ("function (file:line)").
    #[serde(skip)]
    pub site_of_stack: FxHashMap<u32, String>,
    /// The sites with the most temporary allocations, most first.
    #[serde(skip)]
    pub churn: Vec<BlameEntry>,
    /// How `entries` are ordered.
    #[serde(skip)]
    pub order: BlameOrder,
    /// The program's executable among the modules: pprof's main mapping.
    #[serde(skip)]
    pub main_module: Option<Module>,
}

/// How many sites [`Blame::churn`] keeps.
pub const CHURN_TOP: usize = 20;

pub struct BlameOptions {
    pub at: At,
    pub order: BlameOrder,
    pub top: usize,
    /// One entry per full stack instead of per allocation site.
    pub per_stack: bool,
    /// More function-name prefixes to skip when looking for the site.
    pub skip: Vec<String>,
    /// Allocations freed within this many milliseconds are temporary.
    pub temporary_ms: u64,
    /// Function names as demangled, whole; by default C++ names are
    /// shortened (templates and argument lists collapsed, see
    /// [`memgap_symbolize::short_name`]).
    pub full_names: bool,
}

/// What blame needs of any replay; also the heap state of the report's
/// single replay (report.rs). Blame's own replay wraps it in [`OwnReplay`].
#[derive(Default)]
pub(crate) struct BlameVisitor {
    pub(crate) state: HeapState,
    pub(crate) stacks: FxHashMap<u32, Arc<[u64]>>,
    /// Per stack id (dense from 1, as the replay numbers them).
    churn: Vec<Churn>,
    /// A free at most this long after its allocation is temporary (ns).
    pub(crate) temporary_window_ns: u64,
    /// Event times to CLOCK_MONOTONIC, as the replay goes.
    timeline: Timeline,
    timeline_started: bool,
    /// The time the blocks inherited from a forking parent carry: they were
    /// not allocated in this process.
    inherited_time: Option<u64>,
    modules: Vec<Module>,
    exe: String,
    /// The code objects Python frames name.
    python: PythonCodes,
}

/// One call stack's allocations over the whole run.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Churn {
    allocations: u64,
    allocated_bytes: u64,
    temporary_allocations: u64,
    temporary_bytes: u64,
}

impl BlameVisitor {
    pub(crate) fn new(temporary_ms: u64) -> BlameVisitor {
        BlameVisitor { temporary_window_ns: temporary_ms.saturating_mul(1_000_000), ..BlameVisitor::default() }
    }

    #[inline]
    pub(crate) fn apply(&mut self, event: &ThreadEvent) -> Change {
        let change = self.state.apply(event);
        match change {
            Change::None => {}
            Change::Allocated(new) => self.allocated(&new),
            Change::Freed(old) => self.freed(&old, event.event.time),
            Change::Reallocated { old, new } => {
                self.freed(&old, event.event.time);
                self.allocated(&new);
            }
        }
        change
    }

    #[inline]
    fn churn_of(&mut self, stack: u32) -> &mut Churn {
        let stack = stack as usize;
        if stack >= self.churn.len() {
            self.churn.resize(stack + 1, Churn::default());
        }
        &mut self.churn[stack]
    }

    #[inline]
    fn allocated(&mut self, block: &memgap_replay::Block) {
        let churn = self.churn_of(block.stack);
        churn.allocations += 1;
        churn.allocated_bytes += block.size;
    }

    #[inline]
    fn freed(&mut self, block: &memgap_replay::Block, time: u64) {
        if self.inherited_time == Some(block.time) {
            return;
        }
        // Events of one round share a time: most short lives need no conversion.
        if time <= block.time || self.timeline.within_ns(block.time, time, self.temporary_window_ns) {
            let churn = self.churn_of(block.stack);
            churn.temporary_allocations += 1;
            churn.temporary_bytes += block.size;
        }
    }
}

impl Visitor for BlameVisitor {
    fn live_set(&self) -> Option<&LiveSet> {
        Some(&self.state.live)
    }

    fn process(&mut self, process: &Process) {
        self.state.start_image();
        if process.image == 0 || !self.timeline_started {
            self.timeline.start(process);
            self.timeline_started = true;
        }
        self.exe = process.exe.clone();
    }

    fn clock(&mut self, clock: &Clock) {
        self.timeline.add(clock);
    }

    fn modules(&mut self, modules: &[Module]) {
        for module in modules {
            if !self.modules.iter().any(|m| m.base == module.base && m.path == module.path) {
                self.modules.push(module.clone());
            }
        }
    }

    fn allocator(&mut self, path: &str) {
        self.state.allocator = path.to_string();
    }

    fn metrics(&mut self, metrics: &Metrics) {
        self.state.metrics(metrics);
    }

    fn thread(&mut self, thread: &Thread) {
        self.state.thread(thread);
    }

    fn stack(&mut self, id: u32, frames: &Arc<[u64]>) {
        self.stacks.insert(id, Arc::clone(frames));
    }

    fn python_code(&mut self, image: u32, code: &PythonCode) {
        self.python.add(image, code);
    }

    /// Inherited blocks keep the parent's stacks; they were not allocated here.
    fn inherited(&mut self, item: Inherited<'_>) {
        if let Inherited::Event(event) = &item {
            self.inherited_time = Some(event.event.time);
        }
        self.state.inherit(item);
    }

    fn event(&mut self, event: &ThreadEvent) {
        self.apply(event);
    }

    fn snapshot(&mut self, snapshot: &Snapshot) {
        self.state.pass_snapshot(snapshot);
    }
}

/// Blame's own replay: the heap's owners, and the ledger at the snapshot
/// wanted (the report keeps both its own way).
#[derive(Default)]
struct OwnReplay {
    blame: BlameVisitor,
    owners: crate::registry::Owners,
    wanted: usize,
    seen: usize,
    /// The ledger at the wanted snapshot, or, when finding the largest gap
    /// in this replay, at the largest so far.
    ledger: Option<(u64, Ledger)>,
    gap: Option<GapFinder>,
}

impl Visitor for OwnReplay {
    fn live_set(&self) -> Option<&LiveSet> {
        self.blame.live_set()
    }

    fn process(&mut self, process: &Process) {
        self.blame.process(process);
        self.owners.process(process);
    }

    fn clock(&mut self, clock: &Clock) {
        self.blame.clock(clock);
    }

    fn modules(&mut self, modules: &[Module]) {
        self.blame.modules(modules);
    }

    fn allocator(&mut self, path: &str) {
        self.blame.allocator(path);
        self.owners.allocator(path);
    }

    fn metrics(&mut self, metrics: &Metrics) {
        self.blame.metrics(metrics);
        self.owners.metrics(metrics);
    }

    fn note(&mut self, _time: u64, text: &str) {
        self.owners.note(text);
    }

    fn rss(&mut self, rss: &Rss) {
        self.owners.rss(rss);
    }

    fn thread(&mut self, thread: &Thread) {
        self.blame.thread(thread);
    }

    fn stack(&mut self, id: u32, frames: &Arc<[u64]>) {
        self.blame.stack(id, frames);
    }

    fn python_code(&mut self, image: u32, code: &PythonCode) {
        self.blame.python_code(image, code);
    }

    fn inherited(&mut self, item: Inherited<'_>) {
        self.blame.inherited(item);
    }

    fn event(&mut self, event: &ThreadEvent) {
        self.blame.event(event);
    }

    fn snapshot(&mut self, snapshot: &Snapshot) {
        self.owners.snapshot_seen(snapshot);
        let state = &mut self.blame.state;
        let wanted = match &mut self.gap {
            Some(finder) => finder.note_at(state, snapshot, &mut self.owners),
            None => self.seen == self.wanted,
        };
        if wanted {
            self.ledger = Some((
                snapshot.time,
                snapshots::ledger_of(state, snapshot, Detail { stacks: true, ..Detail::default() }, &mut self.owners.list),
            ));
        } else {
            self.blame.snapshot(snapshot);
        }
        self.seen += 1;
    }
}

pub fn blame(path: &Path, options: &BlameOptions) -> Result<Option<Blame>, MomentError> {
    let scan = snapshots::scan(path)?;
    scan.check(options.at)?;
    scan.replay_for(
        path,
        options.at,
        GapsSeen::InTime,
        || blame_at_largest_gap(path, &scan, options),
        |moment| blame_at_moment(path, moment, options),
    )
}

/// Blame at the largest gap, found in the replay that computes it; `None`
/// when the replay disagrees with the scan (then resolve first).
fn blame_at_largest_gap(path: &Path, scan: &snapshots::Scan, options: &BlameOptions) -> Result<Option<Option<Blame>>, MomentError> {
    let mut v = OwnReplay { gap: Some(GapFinder::for_scan(scan)), blame: BlameVisitor::new(options.temporary_ms), ..OwnReplay::default() };
    let outcome = replay(path, &mut v)?;
    v.owners.replayed(&outcome.timeline);
    let moment = v.gap.as_mut().and_then(|finder| {
        finder.settle(&v.owners, &outcome.timeline);
        finder.moment(scan)
    });
    Ok(moment.map(|moment| blame_replayed(v, &outcome, moment, options)))
}

/// Blame at `moment`, resolved before the replay.
fn blame_at_moment(path: &Path, moment: Option<Moment>, options: &BlameOptions) -> Result<Option<Blame>, MomentError> {
    let Some(moment) = moment else { return Ok(None) };
    let mut v = OwnReplay { wanted: moment.index, blame: BlameVisitor::new(options.temporary_ms), ..OwnReplay::default() };
    let outcome = replay(path, &mut v)?;
    v.owners.replayed(&outcome.timeline);
    Ok(blame_replayed(v, &outcome, moment, options))
}

/// Blame at `moment` once `v` has replayed the trace (its owners told so).
fn blame_replayed(mut v: OwnReplay, outcome: &Outcome, moment: Moment, options: &BlameOptions) -> Option<Blame> {
    let (time, mut ledger) = v.ledger.take()?;
    // The layers owners lay after the replay (pymalloc's arenas): in the
    // rows the header sums up.
    v.owners.annotate(&mut ledger, Taken { time, monotonic_ns: Some(outcome.timeline.monotonic_ns(time)) });
    // Freed before symbolizing, which needs memory of its own.
    let leaked = StackFacts::leaked(&std::mem::take(&mut v.blame.state.live));
    let mut blame = assemble(&StackFacts::of(&v.blame, leaked), outcome.timeline.seconds(time), &ledger, options);
    blame.moment = Some(moment);
    Some(blame)
}

/// What blame needs of a whole replay, whatever the snapshot and the
/// options: each call stack's frames, its bytes still live at the end, its
/// allocations over the run. Kept in the trace's index, so blame at any
/// snapshot whose ledger is known needs no replay.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StackFacts {
    /// Per call stack id: its frames, innermost first (Python's expanded),
    /// each distinct frame held once: a Python program's stacks repeat the
    /// interpreter's frames thousands of times.
    #[serde(with = "shared_frames")]
    frames: FxHashMap<u32, Frames>,
    /// Per stack, bytes live at the end, in the order the live set lists
    /// their first block (entries are ranked stably: the order counts).
    leaked: Vec<(u32, u64)>,
    /// Per stack with allocations or temporary ones, by stack id.
    churn: Vec<(u32, Churn)>,
    has_stacks: bool,
    temporary_ms: u64,
    warnings: Vec<String>,
    main_module: Option<(String, u64, u64, Vec<u8>)>,
}

impl StackFacts {
    /// Per stack, the bytes of `live` (the live set at the end), in the
    /// order the live set lists each stack's first block.
    pub(crate) fn leaked(live: &LiveSet) -> Vec<(u32, u64)> {
        let mut leaked: Vec<(u32, u64)> = Vec::new();
        let mut position: FxHashMap<u32, usize> = FxHashMap::default();
        for (_, block) in live.blocks() {
            let at = *position.entry(block.stack).or_insert_with(|| {
                leaked.push((block.stack, 0));
                leaked.len() - 1
            });
            leaked[at].1 += block.size;
        }
        leaked
    }

    /// The facts of the replay `v` has seen, its stacks symbolized, with
    /// `leaked` taken from its live set at the end (the caller may free the
    /// live set first: symbolizing needs memory of its own).
    pub(crate) fn of(v: &BlameVisitor, leaked: Vec<(u32, u64)>) -> StackFacts {
        let churn = v
            .churn
            .iter()
            .enumerate()
            .filter(|(_, churn)| churn.allocations > 0 || churn.temporary_allocations > 0)
            .map(|(stack, churn)| (stack as u32, *churn))
            .collect();
        let mut symbolizer = Symbolizer::new(&v.modules);
        let addresses = call_sites(v.stacks.values().flat_map(|frames| frames.iter().copied()).filter(|&ip| !is_python_frame(ip)));
        // Each distinct frame once: an address's and a Python value's are shared by every stack through them.
        let mut distinct = FxHashSet::default();
        let names: FxHashMap<u64, Vec<Arc<Frame>>> = addresses
            .iter()
            .copied()
            .zip(symbolizer.symbolize_many(&addresses))
            .map(|(address, frames)| (address, frames.into_iter().map(|frame| shared_frames::share(&mut distinct, frame)).collect()))
            .collect();
        let mut python_frames: FxHashMap<u64, Option<Arc<Frame>>> = FxHashMap::default();
        let frames = v
            .stacks
            .iter()
            .map(|(&id, ips)| {
                let native = |ip: u64| names.get(&ip.saturating_sub(1)).cloned().unwrap_or_default();
                let python = |value: u64| {
                    let frame = python_frames
                        .entry(value)
                        .or_insert_with(|| v.python.frame(value).map(|frame| shared_frames::share(&mut distinct, frame)));
                    frame.clone()
                };
                (id, Arc::from(v.python.expand(ips, native, python)))
            })
            .collect();
        let main_module = v.modules.iter().rev().find(|m| !v.exe.is_empty() && m.path == v.exe);
        StackFacts {
            frames,
            leaked,
            churn,
            has_stacks: !v.stacks.is_empty(),
            temporary_ms: v.temporary_window_ns / 1_000_000,
            warnings: symbolizer.warnings().iter().map(|w| w.to_string()).collect(),
            main_module: main_module.map(|m| (m.path.clone(), m.base, m.size, m.build_id.clone())),
        }
    }

    /// The window (ms) within which a freed allocation counted as temporary.
    pub fn temporary_ms(&self) -> u64 {
        self.temporary_ms
    }
}

/// Blame at the snapshot whose ledger (computed with stacks) is `ledger`,
/// from the facts of the whole replay (also used by report.rs and the index).
pub fn assemble(facts: &StackFacts, at_seconds: f64, ledger: &Ledger, options: &BlameOptions) -> Blame {
    let mut totals: FxHashMap<u32, Totals> = FxHashMap::default();
    for share in &ledger.by_stack {
        let t = totals.entry(share.stack).or_default();
        t.live_bytes += share.live_bytes;
        t.objects += share.objects;
        t.fragmentation_bytes += share.fragmentation_bytes;
        t.pages += share.pages;
        t.taken_bytes += share.taken_bytes;
    }
    for &(stack, bytes) in &facts.leaked {
        totals.entry(stack).or_default().leaked_bytes += bytes;
    }
    // Stacks with no block left at the snapshot count too: churn is
    // allocated and freed between snapshots.
    let mut all = Churn::default();
    for (stack, churn) in &facts.churn {
        let t = totals.entry(*stack).or_default();
        t.allocations += churn.allocations;
        t.allocated_bytes += churn.allocated_bytes;
        t.temporary_allocations += churn.temporary_allocations;
        t.temporary_bytes += churn.temporary_bytes;
        all.allocations += churn.allocations;
        all.allocated_bytes += churn.allocated_bytes;
        all.temporary_allocations += churn.temporary_allocations;
        all.temporary_bytes += churn.temporary_bytes;
    }

    let mut skip: Vec<&str> = ALLOCATOR_FUNCTIONS.to_vec();
    skip.extend(options.skip.iter().map(String::as_str));

    // Per stack: its frames and its allocation site.
    let mut site_of_stack = FxHashMap::default();
    let no_frames: Frames = Arc::from([]);
    let stacks: Vec<StackSums> = totals
        .into_iter()
        .map(|(id, t)| {
            let frames = facts.frames.get(&id).unwrap_or(&no_frames);
            // Under Python code, the line of Python that called into the interpreter's C.
            let site = frames
                .iter()
                .find(|frame| is_python(frame))
                .or_else(|| frames.iter().find(|frame| !is_allocator_frame(frame, &skip)))
                .or(frames.first())
                .cloned();
            if let Some(site) = &site {
                let label = if options.full_names || is_python(site) {
                    site_label(site)
                } else {
                    site_label(&Frame { function: site.function.as_deref().map(short_name), ..Frame::clone(site) })
                };
                site_of_stack.insert(id, label);
            }
            (frames, site, t)
        })
        .collect();
    let mut by_stack: Vec<BlameEntry> = stacks.iter().map(|(frames, site, t)| t.entry(site.as_deref(), Arc::clone(frames), 1)).collect();
    // Sites are told apart by their whole names; only then shortened.
    let all_entries = if options.per_stack { by_stack.clone() } else { merge_by_site(&stacks) };
    let mut churn = if options.per_stack {
        rank(merge_by_site(&stacks), BlameOrder::Temporary, CHURN_TOP)
    } else {
        rank(all_entries.clone(), BlameOrder::Temporary, CHURN_TOP)
    };
    let mut entries = rank(all_entries, options.order, options.top);
    if !options.full_names {
        let mut shortened = ShortNames::default();
        for entry in entries.iter_mut().chain(&mut by_stack).chain(&mut churn) {
            shortened.shorten(entry);
        }
    }
    let main_module = facts.main_module.as_ref().map(|(path, base, size, build_id)| Module {
        path: path.clone(),
        base: *base,
        size: *size,
        build_id: build_id.clone(),
    });
    Blame {
        at_seconds,
        snapshot_reason: ledger.snapshot_reason,
        moment: ledger.moment.clone(),
        rss_bytes: ledger.rss_bytes,
        fragmented_bytes: ledger.rows.fragmented,
        live_bytes: ledger.rows.live,
        has_stacks: facts.has_stacks,
        allocations: all.allocations,
        allocated_bytes: all.allocated_bytes,
        temporary_allocations: all.temporary_allocations,
        temporary_bytes: all.temporary_bytes,
        temporary_ms: facts.temporary_ms,
        entries,
        warnings: facts.warnings.clone(),
        by_stack,
        site_of_stack,
        churn,
        order: options.order,
        main_module,
    }
}

/// The first `top` entries by `order`; those with nothing of it left out.
fn rank(mut entries: Vec<BlameEntry>, order: BlameOrder, top: usize) -> Vec<BlameEntry> {
    let key = |e: &BlameEntry| match order {
        BlameOrder::Fragmentation => (e.fragmentation_bytes, e.live_bytes),
        BlameOrder::Live => (e.live_bytes, e.fragmentation_bytes),
        BlameOrder::Leaked => (e.leaked_bytes, e.live_bytes),
        BlameOrder::Allocated => (e.allocated_bytes, e.allocations),
        BlameOrder::Temporary => (e.temporary_allocations, e.temporary_bytes),
    };
    entries.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.function.cmp(&b.function)));
    entries.retain(|e| key(e) != (0, 0));
    entries.truncate(top);
    entries
}

/// The frames of `stack` from its allocation site outwards: memgap's and
/// the allocator's frames dropped as blame drops them (all kept when no
/// frame is the program's).
pub fn program_frames(stack: &[Arc<Frame>]) -> &[Arc<Frame>] {
    match stack.iter().position(|frame| !is_allocator_frame(frame, ALLOCATOR_FUNCTIONS)) {
        Some(site) => &stack[site..],
        None => stack,
    }
}

/// Function names in their short form, each whole name's and each
/// shared frame's computed once.
#[derive(Default)]
struct ShortNames {
    names: FxHashMap<String, String>,
    /// By the address of the frame with the whole name: the same frame with the short one.
    frames: FxHashMap<*const Frame, Arc<Frame>>,
}

impl ShortNames {
    fn short(&mut self, name: &mut String) {
        if let Some(known) = self.names.get(name.as_str()) {
            name.clone_from(known);
        } else {
            let s = short_name(name);
            self.names.insert(std::mem::replace(name, s.clone()), s);
        }
    }

    /// The entry's function names in their short form. Python frames (no
    /// module) keep their qualified names.
    fn shorten(&mut self, entry: &mut BlameEntry) {
        if let Some(function) = entry.function.as_mut().filter(|_| !entry.module.is_empty()) {
            self.short(function);
        }
        let shortened: Vec<Arc<Frame>> = entry.stack.iter().map(|frame| self.frame(frame)).collect();
        // A stack whose names are all short already stays the facts' own.
        if shortened.iter().zip(entry.stack.iter()).any(|(short, frame)| !Arc::ptr_eq(short, frame)) {
            entry.stack = shortened.into();
        }
    }

    /// `frame` with its function's short name: itself when that is its
    /// name already, or a Python frame's (qualified names are kept).
    fn frame(&mut self, frame: &Arc<Frame>) -> Arc<Frame> {
        if is_python(frame) || frame.function.is_none() {
            return frame.clone();
        }
        // The whole-named frames stay alive in the stack facts while
        // names are shortened, so an address names one frame throughout.
        if let Some(short) = self.frames.get(&Arc::as_ptr(frame)) {
            return short.clone();
        }
        let mut short = Frame::clone(frame);
        if let Some(function) = &mut short.function {
            self.short(function);
        }
        let short = if short.function == frame.function { frame.clone() } else { Arc::new(short) };
        self.frames.insert(Arc::as_ptr(frame), short.clone());
        short
    }
}

/// The stacks' frames stored once each: a table of the distinct frames,
/// and each stack as its frames' places in it.
mod shared_frames {
    use std::sync::Arc;

    use memgap_symbolize::Frame;
    use rustc_hash::{FxHashMap, FxHashSet};
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Frames;

    #[derive(Serialize, Deserialize)]
    struct Table {
        frames: Vec<Frame>,
        stacks: Vec<(u32, Vec<u32>)>,
    }

    /// `frame`, or the equal one already shared.
    pub(super) fn share(distinct: &mut FxHashSet<Arc<Frame>>, frame: Frame) -> Arc<Frame> {
        if let Some(shared) = distinct.get(&frame) {
            return shared.clone();
        }
        let shared = Arc::new(frame);
        distinct.insert(shared.clone());
        shared
    }

    pub(super) fn serialize<S: Serializer>(stacks: &FxHashMap<u32, Frames>, serializer: S) -> Result<S::Ok, S::Error> {
        let mut ids: Vec<u32> = stacks.keys().copied().collect();
        ids.sort_unstable();
        let mut places: FxHashMap<*const Frame, u32> = FxHashMap::default();
        let mut table = Table { frames: Vec::new(), stacks: Vec::with_capacity(ids.len()) };
        for id in ids {
            let places = stacks[&id]
                .iter()
                .map(|frame| {
                    *places.entry(Arc::as_ptr(frame)).or_insert_with(|| {
                        table.frames.push(Frame::clone(frame));
                        (table.frames.len() - 1) as u32
                    })
                })
                .collect();
            table.stacks.push((id, places));
        }
        table.serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<FxHashMap<u32, Frames>, D::Error> {
        let table = Table::deserialize(deserializer)?;
        let frames: Vec<Arc<Frame>> = table.frames.into_iter().map(Arc::new).collect();
        table
            .stacks
            .into_iter()
            .map(|(id, places)| {
                let stack = places.iter().map(|&place| frames.get(place as usize).cloned());
                Ok((id, stack.collect::<Option<Arc<[_]>>>().ok_or_else(|| D::Error::custom("a stack names a frame past the table"))?))
            })
            .collect()
    }
}

/// "function (file:line)", or the frame's own label when it has no source.
fn site_label(site: &Frame) -> String {
    match (&site.function, &site.file, site.line) {
        (Some(function), Some(file), Some(line)) => format!("{function} ({}:{line})", file.rsplit('/').next().unwrap_or(file)),
        (Some(function), _, _) => format!("{function} ({})", site.module.rsplit('/').next().unwrap_or(&site.module)),
        _ => site.label(),
    }
}

/// What the blocks of one stack (or site) add up to.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    live_bytes: u64,
    objects: u64,
    fragmentation_bytes: f64,
    pages: u64,
    taken_bytes: u64,
    leaked_bytes: u64,
    allocations: u64,
    allocated_bytes: u64,
    temporary_allocations: u64,
    temporary_bytes: u64,
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.live_bytes += other.live_bytes;
        self.objects += other.objects;
        self.fragmentation_bytes += other.fragmentation_bytes;
        self.pages += other.pages;
        self.taken_bytes += other.taken_bytes;
        self.leaked_bytes += other.leaked_bytes;
        self.allocations += other.allocations;
        self.allocated_bytes += other.allocated_bytes;
        self.temporary_allocations += other.temporary_allocations;
        self.temporary_bytes += other.temporary_bytes;
    }

    fn entry(&self, site: Option<&Frame>, stack: Frames, stacks: u32) -> BlameEntry {
        let dense_pages = (self.taken_bytes as f64 / 4096.0).ceil().max(1.0);
        BlameEntry {
            function: Some(site.map_or_else(|| "(no stack recorded)".to_string(), |f| f.function.clone().unwrap_or_else(|| f.label()))),
            file: site.and_then(|f| f.file.clone()),
            line: site.and_then(|f| f.line),
            module: site.map(|f| f.module.clone()).unwrap_or_default(),
            stack,
            live_bytes: self.live_bytes,
            objects: self.objects,
            fragmentation_bytes: self.fragmentation_bytes.round() as u64,
            leaked_bytes: self.leaked_bytes,
            allocations: self.allocations,
            allocated_bytes: self.allocated_bytes,
            temporary_allocations: self.temporary_allocations,
            temporary_bytes: self.temporary_bytes,
            pages: self.pages,
            scatter: if self.pages == 0 { 0.0 } else { self.pages as f64 / dense_pages },
            stacks,
        }
    }
}

/// A stack's frames (the facts' own), its allocation site among them, and what its blocks add up to.
type StackSums<'a> = (&'a Frames, Option<Arc<Frame>>, Totals);

type SiteKey = (Option<String>, Option<String>, Option<u32>, String);

/// One allocation site's sums, and the stack shown for it.
struct SiteSums<'a> {
    totals: Totals,
    stacks: u32,
    site: &'a Option<Arc<Frame>>,
    shown: &'a Frames,
    /// The shown stack's (bytes held, bytes allocated).
    shown_weight: (u64, u64),
}

/// Sums the stacks that share an allocation site; shows the site's largest stack.
fn merge_by_site(stacks: &[StackSums]) -> Vec<BlameEntry> {
    let mut sites: FxHashMap<SiteKey, SiteSums> = FxHashMap::default();
    for (frames, site, t) in stacks {
        let key = site.as_ref().map(|f| (f.function.clone(), f.file.clone(), f.line, f.module.clone())).unwrap_or_default();
        // The stack shown: the one holding most, else the one allocating most.
        let weight = (t.live_bytes + t.fragmentation_bytes as u64 + t.leaked_bytes, t.allocated_bytes);
        let sums = sites.entry(key).or_insert(SiteSums { totals: Totals::default(), stacks: 0, site, shown: frames, shown_weight: (0, 0) });
        sums.totals.add(t);
        sums.stacks += 1;
        if weight >= sums.shown_weight {
            (sums.shown, sums.shown_weight) = (frames, weight);
        }
    }
    sites.into_values().map(|sums| sums.totals.entry(sums.site.as_deref(), Arc::clone(sums.shown), sums.stacks)).collect()
}

/// The distinct addresses to symbolize for `return_addresses`, sorted: each
/// one less, inside the call that returns there. Gathered distinct as they
/// come: a program's stacks repeat the same few thousand many times.
pub(crate) fn call_sites(return_addresses: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let distinct: FxHashSet<u64> = return_addresses.into_iter().map(|ip| ip.saturating_sub(1)).collect();
    let mut addresses: Vec<u64> = distinct.into_iter().collect();
    addresses.sort_unstable();
    addresses
}

pub(crate) fn is_allocator_frame(frame: &Frame, skip: &[&str]) -> bool {
    ALLOCATOR_MODULES.iter().any(|m| frame.module.contains(m))
        || frame.file.as_deref().is_some_and(is_standard_library_source)
        || frame.function.as_deref().map(without_return_type).is_some_and(|f| skip.iter().any(|prefix| f.starts_with(prefix)))
}

/// A source file of a language's standard library: Rust's, as rustc
/// records it (`/rustc/COMMIT/library/alloc/src/…`, and the crates it is
/// built with, such as its HashMap's: `/rust/deps/hashbrown-0.16.1/…`), or
/// a C++ standard header (`…/include/c++/12/bits/…`). Code inlined from
/// them carries its short name only (`alloc`, `from_elem`, `do_alloc`,
/// `_M_realloc_insert`), which no name prefix tells from the program's own.
fn is_standard_library_source(file: &str) -> bool {
    let rust = file
        .strip_prefix("/rustc/")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(commit, rest)| commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()) && rest.starts_with("library/"));
    rust || file.starts_with("/rust/deps/") || file.contains("/include/c++/")
}

/// A demangled C++ function template's name starts with its return type
/// ("void std::vector<int>::_M_realloc_insert<int>(…)", "std::string
/// make_name(int)"): the name proper follows the last space outside angle
/// brackets before the argument list. Operators keep their whole name.
fn without_return_type(function: &str) -> &str {
    if function.contains("operator") {
        return function;
    }
    let mut depth = 0i32;
    let mut last_space = None;
    for (i, c) in function.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 => break,
            ' ' if depth == 0 => last_space = Some(i),
            _ => {}
        }
    }
    last_space.map_or(function, |i| &function[i + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest gap found in blame's own replay (a runtime's too, where
    /// its figures come in time): the same blame as when the moment is
    /// resolved first, on every recorded fixture where it applies.
    #[test]
    fn finding_the_largest_gap_while_replaying_blames_the_same() {
        for (path, scan) in crate::fixtures::gap_found_while_replaying(GapsSeen::InTime) {
            let options = BlameOptions {
                at: At::Gap,
                order: BlameOrder::Fragmentation,
                top: usize::MAX,
                per_stack: false,
                skip: Vec::new(),
                temporary_ms: DEFAULT_TEMPORARY_MS,
                full_names: false,
            };
            let once = blame_at_largest_gap(&path, &scan, &options).unwrap().expect("found while replaying");
            let moment = snapshots::resolve_scanned(&path, &scan, At::Gap).unwrap();
            let resolved = blame_at_moment(&path, moment, &options).unwrap();
            assert_eq!(format!("{once:?}"), format!("{resolved:?}"), "{}", path.display());
        }
    }

    #[test]
    fn code_inlined_from_a_standard_library_is_the_librarys_whatever_its_name() {
        let frame = |function: &str, file: &str| Frame {
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(95),
            module: "/usr/bin/prog".into(),
            module_offset: 0,
            inlined: true,
            address: 0,
        };
        let rust = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
        for (function, file) in [
            ("alloc", format!("{rust}/alloc/src/alloc.rs")),
            ("<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem", format!("{rust}/alloc/src/vec/spec_from_elem.rs")),
            ("grow_impl_runtime", format!("{rust}/alloc/src/alloc.rs")),
            ("do_alloc<…>", "/rust/deps/hashbrown-0.16.1/src/raw/alloc.rs".to_string()),
            ("_M_realloc_insert<int const&>", "/usr/include/c++/12/bits/vector.tcc".to_string()),
        ] {
            assert!(is_allocator_frame(&frame(function, &file), ALLOCATOR_FUNCTIONS), "{function} in {file}");
        }
        for (function, file) in [
            ("rehash<…>", "/work/main/crates/replay/src/address_table.rs"),
            ("rh::heap::build", "/tmp/rustc/library/heap.rs"),
            ("build", "/rustc/notacommit/library/heap.rs"),
            ("table::grow", "/home/me/include/table.h"),
        ] {
            assert!(!is_allocator_frame(&frame(function, file), ALLOCATOR_FUNCTIONS), "{function} in {file}");
        }
    }

    #[test]
    fn a_return_type_before_a_template_name_is_looked_past() {
        let frame = |f: &str| Frame {
            function: Some(f.into()),
            file: None,
            line: None,
            module: "/usr/bin/prog".into(),
            module_offset: 0,
            inlined: false,
            address: 0,
        };
        for library in [
            "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int> >, int const&)",
            "void std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::_M_construct<char const*>(char const*, char const*, std::forward_iterator_tag)",
            "operator new(unsigned long)",
            "std::vector<int, std::allocator<int> >::push_back(int const&)",
        ] {
            assert!(is_allocator_frame(&frame(library), ALLOCATOR_FUNCTIONS), "{library}");
        }
        for program in [
            "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > make_name(int)",
            "main",
            "(anonymous namespace)::build(int)",
            "unsigned long table::grow(unsigned long)",
            "cache::operator[](int)",
        ] {
            assert!(!is_allocator_frame(&frame(program), ALLOCATOR_FUNCTIONS), "{program}");
        }
    }

    /// Stacks that pass through the same frames keep one copy of each, in
    /// memory and in the index, and read back as they were.
    #[test]
    fn shared_frames_are_stored_once_and_read_back_as_they_were() {
        let frame = |function: &str, address: u64| Frame {
            function: Some(function.to_string()),
            file: Some("/src/interpreter.c".to_string()),
            line: Some(7),
            module: "/usr/bin/python3.11".to_string(),
            module_offset: address,
            inlined: false,
            address,
        };
        let mut distinct = FxHashSet::default();
        let mut frames = FxHashMap::default();
        for id in 1..=50u32 {
            let stack = [frame(&format!("leaf_{id}"), u64::from(id)), frame("_PyEval_EvalFrameDefault", 1000), frame("main", 2000)];
            frames.insert(id, stack.into_iter().map(|f| shared_frames::share(&mut distinct, f)).collect::<Arc<[_]>>());
        }
        assert!(Arc::ptr_eq(&frames[&1][1], &frames[&50][1]), "equal frames are one");
        let facts = StackFacts { frames, ..StackFacts::default() };
        let json = serde_json::to_string(&facts).unwrap();
        assert_eq!(json.matches("_PyEval_EvalFrameDefault").count(), 1, "{json}");
        let read: StackFacts = serde_json::from_str(&json).unwrap();
        assert_eq!(read.frames, facts.frames);
        assert!(Arc::ptr_eq(&read.frames[&7][2], &read.frames[&9][2]), "read back shared");

        let past_the_table = json.replacen("[1,[", "[1,[99999,", 1);
        assert_ne!(past_the_table, json);
        assert!(serde_json::from_str::<StackFacts>(&past_the_table).is_err(), "a place past the table is refused");
    }
}
