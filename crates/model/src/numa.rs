//! NUMA: where the heap sits, who allocated it, and who touches it.
//!
//! Three facts, after the paper in the project's seeds (an 8-node machine on
//! which an unpinned main thread's allocations made one node take most
//! accesses):
//! - **allocation locality**: live bytes at a snapshot by the node of the
//!   allocating thread (row) and the node the page landed on (column); a
//!   thread whose events ran on more than one node gets the extra
//!   "multi-node threads" row. Per call site: the bytes placed on another
//!   node than the CPU that allocated them.
//! - **access locality** (precise memory sampling) or, where the hardware
//!   cannot sample memory accesses, **first-touch locality** from page-fault
//!   samples: node of the CPU × node of the page, counts by distance and the
//!   paper's NUMA access rate, Σ distance × accesses ÷ runtime.
//! - the topology: nodes, CPUs, memory, distances.
//!
//! The page → node resolver and the topology are inputs ([`PageNodes`],
//! [`Topology`]), so the arithmetic is tested on hand-made machines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use memgap_replay::{Block, Inherited, ThreadEvent, Visitor, replay};
use memgap_symbolize::{Frame, Symbolizer};
use memgap_trace::numa::{self as records, MemorySamples, Placement};
use memgap_trace::records::{Metrics, Module, Process, Rss, Snapshot, Thread};
use rustc_hash::FxHashMap;
use serde::Serialize;

pub use memgap_types::numa::{AccessLocality, DistanceCount, Node, PageNodes, SampleBatch, Topology, access_locality, numa_access_rate};

use crate::blame::{ALLOCATOR_FUNCTIONS, call_sites, is_allocator_frame};
use crate::heap_state::HeapState;
use crate::ledger::Moment;
use crate::registry::Owners;
use crate::snapshots::{self, At, GapFinder, GapsSeen, MomentError};

/// Live bytes by allocating thread's node × page's node.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AllocationLocality {
    /// One label per row: "node N" for threads that stayed on node N, then
    /// "multi-node threads".
    pub rows: Vec<String>,
    /// rows × nodes, in bytes.
    pub matrix: Vec<Vec<u64>>,
    /// On the node of the CPU that allocated them.
    pub local_bytes: u64,
    pub remote_bytes: u64,
    /// Live bytes on pages with no node (not resident, or not asked).
    pub unplaced_bytes: u64,
    /// Per call stack id: (remote bytes, placed bytes).
    #[serde(skip)]
    pub by_stack: FxHashMap<u32, (u64, u64)>,
}

impl AllocationLocality {
    pub fn local_fraction(&self) -> Option<f64> {
        let placed = self.local_bytes + self.remote_bytes;
        (placed > 0).then(|| self.local_bytes as f64 / placed as f64)
    }
}

/// The node positions each thread's events ran on, over the whole run.
pub type ThreadNodes = FxHashMap<u32, BTreeSet<usize>>;

/// The live blocks' bytes at a placement, split over the pages they cover
/// and summed by what the locality needs of each: (allocating thread,
/// call stack, CPU it allocated on, node of the page, `None` when not
/// placed). Far fewer entries than blocks, and taken while the replay is at
/// the placement, so no copy of the live set waits for the end.
#[derive(Debug, Default)]
pub struct PlacedBytes(FxHashMap<(u32, u32, u32, Option<u32>), u64>);

impl PlacedBytes {
    pub fn of<'a>(blocks: impl IntoIterator<Item = (u64, &'a Block)>, pages: &dyn PageNodes, page_size: u64) -> PlacedBytes {
        let mut placed = PlacedBytes::default();
        let page_size = page_size.max(1);
        for (addr, block) in blocks {
            let (mut at, end) = (addr, addr.saturating_add(block.size));
            while at < end {
                let piece_end = pages.same_node_until(at, page_size).min(end);
                if piece_end <= at {
                    break;
                }
                *placed.0.entry((block.thread, block.stack, block.cpu, pages.node_of(at))).or_default() += piece_end - at;
                at = piece_end;
            }
        }
        placed
    }
}

/// Tallies the placed bytes by (allocating thread's row, page's node).
pub fn allocation_locality(topology: &Topology, placed: &PlacedBytes, threads: &ThreadNodes) -> AllocationLocality {
    let n = topology.nodes.len();
    let mut rows: Vec<String> = topology.nodes.iter().map(|node| format!("node {}", node.id)).collect();
    rows.push("multi-node threads".into());
    let mut out = AllocationLocality { rows, matrix: vec![vec![0; n]; n + 1], ..AllocationLocality::default() };
    for (&(thread, stack, cpu, node), &bytes) in &placed.0 {
        let allocated_on = topology.index_of_cpu(cpu);
        let row = match threads.get(&thread) {
            Some(nodes) if nodes.len() > 1 => Some(n),
            Some(nodes) if nodes.len() == 1 => nodes.first().copied(),
            _ => allocated_on,
        };
        match node.and_then(|id| topology.index_of_node(id)) {
            Some(column) => {
                if let Some(row) = row {
                    out.matrix[row][column] += bytes;
                }
                let stack = out.by_stack.entry(stack).or_default();
                stack.1 += bytes;
                if allocated_on == Some(column) {
                    out.local_bytes += bytes;
                } else {
                    out.remote_bytes += bytes;
                    stack.0 += bytes;
                }
            }
            None => out.unplaced_bytes += bytes,
        }
    }
    out
}

/// A call site whose blocks sit on another node than the CPU that allocated them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RemoteSite {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    pub remote_bytes: u64,
    pub placed_bytes: u64,
}

/// Everything `memgap numa` shows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NumaReport {
    /// "trace" (recorded with the run) or "this machine" (an older trace).
    pub topology_source: &'static str,
    pub nodes: Vec<Node>,
    pub distances: Vec<Vec<u32>>,
    pub at_seconds: Option<f64>,
    /// Which moment this is and why it was chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moment: Option<Moment>,
    /// Why there is no placement (no snapshot, move_pages refused…).
    pub placement_unavailable_reason: Option<String>,
    /// Resident heap bytes on each node at the snapshot.
    pub resident_bytes_by_node: Vec<u64>,
    /// How long the agent's move_pages queries took at that snapshot.
    pub placement_cost_seconds: Option<f64>,
    pub allocation_rows: Vec<String>,
    pub allocation_matrix_bytes: Vec<Vec<u64>>,
    pub allocation_local_bytes: u64,
    pub allocation_remote_bytes: u64,
    pub allocation_unplaced_bytes: u64,
    /// Live bytes on the node of the CPU that allocated them ÷ placed live bytes.
    pub local_fraction: Option<f64>,
    /// The node taking the most accesses (or first touches, or else heap bytes)…
    pub hot_node: Option<u32>,
    /// …and its share of them.
    pub hot_node_share: Option<f64>,
    /// What `hot_node` was judged on: "accesses", "first touches" or "resident heap bytes".
    pub hot_node_basis: Option<&'static str>,
    pub remote_by_site: Vec<RemoteSite>,
    pub access_matrix: Option<Vec<Vec<u64>>>,
    pub access_unavailable_reason: Option<String>,
    pub numa_access_rate: Option<f64>,
    /// Access or first-touch locality from the samples (see `kind`).
    pub sampled: Option<AccessLocality>,
    /// Threads whose events ran on more than one node.
    pub multi_node_threads: u64,
    /// A GHC program's collections per capability and generation, with the
    /// node the RTS puts each capability on when it ran with `--numa`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ghc_capabilities: Vec<GhcCapabilityGcs>,
    /// How capabilities were tied to nodes: "--numa" (the RTS's own rule),
    /// "-qa" (each capability's thread bound to CPUs n, n+N, …) or None.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ghc_capability_node_rule: Option<&'static str>,
    /// The same collections summed per node (the paper's per-region GC table).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ghc_gcs_by_node: Vec<GhcNodeGcs>,
    /// Resident pages of the GHC heap (its megablocks) on each node, at the snapshot.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ghc_heap_bytes_by_node: Vec<u64>,
    /// The program's command line (a GHC program's RTS options).
    #[serde(skip)]
    pub argv: Vec<String>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GhcCapabilityGcs {
    pub capability: Option<u32>,
    /// The node of the capability: with `+RTS --numa` the RTS puts
    /// capability n on the n mod N-th node (its capNoToNumaNode); with
    /// `-qa` its thread runs on CPUs n, n+N, n+2N… (setThreadAffinity), the
    /// node of those CPUs when they share one; None otherwise.
    pub node: Option<u32>,
    /// Collections this capability led, by generation collected: index = generation.
    pub gcs_by_generation: Vec<u64>,
    /// Bytes those collections copied, by generation.
    pub copied_bytes_by_generation: Vec<u64>,
}

/// GHC collections led by the capabilities of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GhcNodeGcs {
    pub node: u32,
    pub gcs_by_generation: Vec<u64>,
    pub copied_bytes_by_generation: Vec<u64>,
}

/// Where the GHC RTS reserves its heap on 64-bit Linux (the two-step
/// allocator's default base, `+RTS -xb`) and how much it reserves at most:
/// megablocks are carved from this range.
const GHC_HEAP_BASE: u64 = 0x42_0000_0000;
const GHC_HEAP_RESERVATION: u64 = 1 << 40;

/// The RTS options of a GHC program's command line (`+RTS … -RTS`).
fn ghc_rts_args(argv: &[String]) -> Vec<&str> {
    let mut inside = false;
    let mut out = Vec::new();
    for arg in argv.iter().skip(1) {
        match arg.as_str() {
            "--RTS" => break,
            "+RTS" => inside = true,
            "-RTS" => inside = false,
            a if inside => out.push(a),
            _ => {}
        }
    }
    out
}

/// How the RTS tied capabilities to nodes, from its options.
fn ghc_node_rule(rts: &[&str]) -> Option<&'static str> {
    if rts.iter().any(|a| *a == "--numa" || a.starts_with("--numa=")) {
        Some("--numa")
    } else if rts.contains(&"-qa") {
        Some("-qa")
    } else {
        None
    }
}

/// The number of capabilities `-N<n>` asks for (`-N` alone: one per CPU).
fn ghc_capability_count(rts: &[&str], cpus: u32) -> Option<u32> {
    rts.iter().rev().find_map(|a| a.strip_prefix("-N")).map(|n| if n.is_empty() { cpus } else { n.parse().unwrap_or(cpus) })
}

/// Ties a GHC program's per-capability collections to nodes by `rule`
/// (None: no node) and sums the bytes each capability's collections copied.
/// `capabilities` is the `-N` count, else the highest capability seen + 1.
pub fn ghc_capability_nodes(
    gcs: &[crate::ghc::CapabilityGcs],
    timeline: &[crate::ghc::GhcPoint],
    topology: &Topology,
    rule: Option<&str>,
    capabilities: Option<u32>,
) -> Vec<GhcCapabilityGcs> {
    let count = capabilities.unwrap_or_else(|| gcs.iter().filter_map(|c| c.capability).max().map_or(1, |c| c.saturating_add(1))).max(1);
    let node_of = |cap: u32| -> Option<u32> {
        match rule {
            Some("--numa") if !topology.nodes.is_empty() => Some(topology.nodes[cap as usize % topology.nodes.len()].id),
            Some("-qa") => {
                // The CPUs listed, not every number up to the highest (a
                // corrupt topology may name CPU 2^32 - 1).
                let nodes: BTreeSet<usize> = topology
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| n.cpus.iter().any(|&cpu| cpu >= cap && (cpu - cap).is_multiple_of(count)))
                    .map(|(i, _)| i)
                    .collect();
                (nodes.len() == 1).then(|| topology.nodes[*nodes.first().unwrap()].id)
            }
            _ => None,
        }
    };
    gcs.iter()
        .map(|c| {
            let mut copied = vec![0u64; c.by_generation.len()];
            for point in timeline.iter().filter(|p| p.capability == c.capability) {
                let generation = point.generation.unwrap_or(0) as usize;
                if generation >= copied.len() {
                    copied.resize(generation + 1, 0);
                }
                copied[generation] = copied[generation].saturating_add(point.copied_bytes);
            }
            GhcCapabilityGcs {
                capability: c.capability,
                node: c.capability.and_then(node_of),
                gcs_by_generation: c.by_generation.clone(),
                copied_bytes_by_generation: copied,
            }
        })
        .collect()
}

/// The capabilities' collections summed per node, in node order.
pub fn ghc_gcs_by_node(capabilities: &[GhcCapabilityGcs]) -> Vec<GhcNodeGcs> {
    let mut by_node: BTreeMap<u32, GhcNodeGcs> = BTreeMap::new();
    for c in capabilities {
        let Some(node) = c.node else { continue };
        let entry = by_node.entry(node).or_insert_with(|| GhcNodeGcs {
            node,
            gcs_by_generation: Vec::new(),
            copied_bytes_by_generation: Vec::new(),
        });
        for (sums, values) in
            [(&mut entry.gcs_by_generation, &c.gcs_by_generation), (&mut entry.copied_bytes_by_generation, &c.copied_bytes_by_generation)]
        {
            if sums.len() < values.len() {
                sums.resize(values.len(), 0);
            }
            for (sum, value) in sums.iter_mut().zip(values) {
                *sum += value;
            }
        }
    }
    by_node.into_values().collect()
}

pub struct NumaOptions {
    pub at: At,
    /// Used when the trace carries no topology (recorded before it did).
    pub machine_topology: Option<Topology>,
    pub top: usize,
}

/// The agent's own memory: (start, length).
type AgentRanges = Vec<(u64, u64)>;
/// An allocation site: function, file, line, module.
type SiteKey = (Option<String>, Option<String>, Option<u32>, String);

/// Gathers what the NUMA report needs during a replay. On its own it keeps
/// its own heap state; inside the HTML report's single replay the host
/// tells it of each snapshot ([`NumaVisitor::at_snapshot`]) and hands it
/// the live set with each placement ([`NumaVisitor::placed`]).
#[derive(Default)]
pub(crate) struct NumaVisitor {
    /// None when embedded: the host owns the heap state.
    state: Option<HeapState>,
    pid: Option<u32>,
    /// The last image's command line (a GHC program's RTS options).
    argv: Vec<String>,
    wanted: Option<usize>,
    seen: usize,
    /// On its own, finding the largest gap in its replay (the snapshot with
    /// the largest gap so far is the wanted one): the finder, and the heap
    /// owners a runtime's gaps need.
    gap: Option<(GapFinder, Owners)>,
    topology: Option<Topology>,
    /// Per thread: the CPUs its events ran on.
    thread_cpus: FxHashMap<u32, BTreeSet<u32>>,
    /// The last (thread, CPU) seen: most events repeat it, and the report
    /// replays tens of millions of events.
    last_thread_cpu: Option<(u32, u32)>,
    /// The wanted snapshot's time and agent ranges, until its placement.
    at_snapshot: Option<(u64, AgentRanges)>,
    chosen: Option<(PlacedBytes, AgentRanges, Placement)>,
    last_placement: Option<Placement>,
    samples: SampleBatch,
    pub(crate) stacks: FxHashMap<u32, Arc<[u64]>>,
    modules: Vec<Module>,
}

impl NumaVisitor {
    pub(crate) fn embedded(wanted: Option<usize>) -> NumaVisitor {
        NumaVisitor { wanted, ..NumaVisitor::default() }
    }

    /// Makes snapshot `index` the wanted one instead (the report finds its
    /// moment as it replays): what was kept of the one before is dropped.
    pub(crate) fn want(&mut self, index: usize) {
        self.wanted = Some(index);
        self.at_snapshot = None;
        self.chosen = None;
    }

    /// A snapshot went by.
    pub(crate) fn at_snapshot(&mut self, snapshot: &Snapshot) {
        if Some(self.seen) == self.wanted {
            self.at_snapshot = Some((snapshot.time, snapshot.agent_ranges.clone()));
        }
        self.seen += 1;
    }

    /// A placement, with the live blocks at its instant. The replay hands
    /// it on right after the snapshot of the same time, before any later
    /// event, so they are the snapshot's: the wanted snapshot's are placed here.
    pub(crate) fn placed(&mut self, placement: &Placement, live: &memgap_replay::LiveSet) {
        if let Some((_, agent_ranges)) = self.at_snapshot.take_if(|(time, _)| *time == placement.time) {
            let placed = PlacedBytes::of(live.blocks(), &placement.index(), placement.page_size);
            self.chosen = Some((placed, agent_ranges, placement.clone()));
        }
        self.last_placement = Some(placement.clone());
    }

    /// Whether the trace holds anything NUMA (a topology, placements or samples).
    pub(crate) fn saw_anything(&self) -> bool {
        self.topology.is_some() || self.last_placement.is_some() || !self.samples.source.is_empty()
    }
}

impl Visitor for NumaVisitor {
    fn live_set(&self) -> Option<&memgap_replay::LiveSet> {
        self.state.as_ref().map(|state| &state.live)
    }

    fn process(&mut self, process: &Process) {
        if let Some(state) = &mut self.state {
            state.start_image();
        }
        if let Some((_, owners)) = &mut self.gap {
            owners.process(process);
        }
        self.pid.get_or_insert(process.pid);
        self.argv = process.argv.clone();
    }

    fn modules(&mut self, modules: &[Module]) {
        for module in modules {
            if !self.modules.iter().any(|m| m.base == module.base && m.path == module.path) {
                self.modules.push(module.clone());
            }
        }
    }

    fn allocator(&mut self, path: &str) {
        if let Some(state) = &mut self.state {
            state.allocator = path.to_string();
        }
        if let Some((_, owners)) = &mut self.gap {
            owners.allocator(path);
        }
    }

    fn metrics(&mut self, metrics: &Metrics) {
        if let Some(state) = &mut self.state {
            state.metrics(metrics);
        }
        if let Some((_, owners)) = &mut self.gap {
            owners.metrics(metrics);
        }
    }

    fn note(&mut self, _time: u64, text: &str) {
        if let Some((_, owners)) = &mut self.gap {
            owners.note(text);
        }
    }

    fn rss(&mut self, rss: &Rss) {
        if let Some((_, owners)) = &mut self.gap {
            owners.rss(rss);
        }
    }

    fn thread(&mut self, thread: &Thread) {
        if let Some(state) = &mut self.state {
            state.thread(thread);
        }
    }

    fn stack(&mut self, id: u32, frames: &Arc<[u64]>) {
        self.stacks.insert(id, Arc::clone(frames));
    }

    fn inherited(&mut self, item: Inherited<'_>) {
        if let Some(state) = &mut self.state {
            state.inherit(item);
        }
    }

    #[inline]
    fn event(&mut self, event: &ThreadEvent) {
        let pair = (event.thread, event.event.cpu);
        if self.last_thread_cpu != Some(pair) {
            self.last_thread_cpu = Some(pair);
            self.thread_cpus.entry(event.thread).or_default().insert(event.event.cpu);
        }
        if let Some(state) = &mut self.state {
            state.apply(event);
        }
    }

    fn snapshot(&mut self, snapshot: &Snapshot) {
        if let Some(mut state) = self.state.take() {
            let largest = self.gap.as_mut().is_some_and(|(finder, owners)| {
                owners.snapshot_seen(snapshot);
                finder.note_at(&mut state, snapshot, owners)
            });
            if largest {
                self.want(self.seen);
            }
            self.at_snapshot(snapshot);
            self.state = Some(state);
        }
    }

    fn placement(&mut self, placement: &Placement) {
        if let Some(state) = self.state.take() {
            self.placed(placement, &state.live);
            self.state = Some(state);
        }
    }

    fn topology(&mut self, topology: &records::Topology) {
        self.topology = Some(Topology::from_record(topology));
    }

    fn memory_samples(&mut self, samples: &MemorySamples) {
        self.samples.add(samples, self.pid);
    }
}

/// The NUMA report of a trace.
pub fn numa(path: &Path, options: &NumaOptions) -> Result<NumaReport, MomentError> {
    let scan = snapshots::scan(path)?;
    scan.check(options.at)?;
    let (v, moment) = scan.replay_for(
        path,
        options.at,
        GapsSeen::InTime,
        || replayed_at_largest_gap(path, &scan),
        |moment| replayed_at_moment(path, moment),
    )?;
    let mut report = assemble(v, moment.as_ref().map(|m| m.seconds), options);
    report.moment = moment;
    match crate::ghc::report_of_trace(path)? {
        Some(ghc) => add_ghc(&mut report, &ghc),
        None => report.ghc_heap_bytes_by_node.clear(),
    }
    Ok(report)
}

/// A visitor on its own, wanting snapshot `wanted` or finding the largest gap with `gap`.
fn alone(wanted: Option<usize>, gap: Option<GapFinder>) -> NumaVisitor {
    NumaVisitor {
        wanted,
        gap: gap.map(|finder| (finder, Owners::default())),
        // No ledger but the rows of one, for a runtime's gaps.
        state: Some(HeapState::for_rows_only()),
        ..NumaVisitor::default()
    }
}

/// The replay at the largest gap, found in it; `None` when the replay
/// disagrees with the scan (then resolve first).
fn replayed_at_largest_gap(path: &Path, scan: &snapshots::Scan) -> Result<Option<(NumaVisitor, Option<Moment>)>, MomentError> {
    let mut v = alone(None, Some(GapFinder::for_scan(scan)));
    let outcome = replay(path, &mut v)?;
    let moment = v.gap.as_mut().and_then(|(finder, owners)| {
        owners.replayed(&outcome.timeline);
        finder.settle(owners, &outcome.timeline);
        finder.moment(scan)
    });
    Ok(moment.map(|moment| (v, Some(moment))))
}

/// The replay at `moment`, resolved before it.
fn replayed_at_moment(path: &Path, moment: Option<Moment>) -> Result<(NumaVisitor, Option<Moment>), MomentError> {
    let mut v = alone(moment.as_ref().map(|m| m.index), None);
    replay(path, &mut v)?;
    Ok((v, moment))
}

/// A GHC program's collections per capability and per node, by the rule its
/// RTS options tie capabilities to nodes with.
pub fn add_ghc(report: &mut NumaReport, ghc: &crate::ghc::GhcReport) {
    let rts = ghc_rts_args(&report.argv);
    let rule = ghc_node_rule(&rts);
    let topology = Topology { nodes: report.nodes.clone(), distances: report.distances.clone() };
    let cpus = topology.nodes.iter().map(|n| n.cpus.len() as u32).sum();
    report.ghc_capabilities =
        ghc_capability_nodes(&ghc.gcs_per_capability, &ghc.timeline, &topology, rule, ghc_capability_count(&rts, cpus));
    report.ghc_gcs_by_node = ghc_gcs_by_node(&report.ghc_capabilities);
    report.ghc_capability_node_rule = rule;
    if rule.is_none() && !report.ghc_capabilities.is_empty() {
        report.notes.push(
            "GHC collections per capability are not tied to nodes: the program ran without +RTS --numa or -qa on its command line".into(),
        );
    }
}

/// The report from what the visitor gathered, once the replay is over.
pub(crate) fn assemble(v: NumaVisitor, at_seconds: Option<f64>, options: &NumaOptions) -> NumaReport {
    let mut v = v;
    let wanted = v.wanted;
    let mut report = NumaReport { topology_source: "trace", argv: std::mem::take(&mut v.argv), ..NumaReport::default() };
    let topology = match v.topology.take() {
        Some(t) => t,
        None => {
            report.topology_source = "this machine";
            report.notes.push("the trace carries no topology (recorded by an older memgap): this machine's is shown".into());
            options.machine_topology.clone().unwrap_or_default()
        }
    };
    let threads: ThreadNodes =
        v.thread_cpus.iter().map(|(&thread, cpus)| (thread, cpus.iter().filter_map(|&cpu| topology.index_of_cpu(cpu)).collect())).collect();
    report.multi_node_threads = threads.values().filter(|nodes| nodes.len() > 1).count() as u64;
    report.at_seconds = at_seconds;

    match &v.chosen {
        None if wanted.is_none() => report.placement_unavailable_reason = Some("the trace has no snapshot".into()),
        None => report.placement_unavailable_reason = Some("the snapshot has no placement record (recorded by an older memgap)".into()),
        Some((_, _, placement)) if placement.error != 0 => {
            report.placement_unavailable_reason =
                Some(format!("move_pages failed in the traced process: {}", std::io::Error::from_raw_os_error(placement.error)));
        }
        Some((placed, agent_ranges, placement)) => {
            report.resident_bytes_by_node = resident_by_node(&topology, placement, agent_ranges);
            report.ghc_heap_bytes_by_node = resident_by_node_in(&topology, placement, GHC_HEAP_BASE..GHC_HEAP_BASE + GHC_HEAP_RESERVATION);
            if report.ghc_heap_bytes_by_node.iter().all(|&b| b == 0) {
                report.ghc_heap_bytes_by_node.clear();
            }
            report.placement_cost_seconds = Some(placement.cost_ns as f64 / 1e9);
            let locality = allocation_locality(&topology, placed, &threads);
            report.local_fraction = locality.local_fraction();
            report.allocation_local_bytes = locality.local_bytes;
            report.allocation_remote_bytes = locality.remote_bytes;
            report.allocation_unplaced_bytes = locality.unplaced_bytes;
            report.remote_by_site = remote_sites(&v, &locality, options.top);
            report.allocation_rows = locality.rows;
            report.allocation_matrix_bytes = locality.matrix;
            if placement.stride > 1 {
                report.notes.push(format!("placement sampled one resident page in {} (the agent's cost bound)", placement.stride));
            }
        }
    }

    if v.samples.source.is_empty() {
        report.access_unavailable_reason = Some("no memory samples in the trace (record with `memgap run --numa`)".into());
    } else {
        let index = v.last_placement.as_ref().map(Placement::index);
        let fallback: &dyn PageNodes = match &index {
            Some(index) => index,
            None => &|_| None,
        };
        let kind = v.samples.kind();
        let sampled = access_locality(&topology, kind, &v.samples, fallback);
        if v.samples.is_precise() {
            report.access_matrix = Some(sampled.matrix.clone());
            report.numa_access_rate = sampled.weighted_rate_per_second;
        } else {
            report.access_unavailable_reason = Some(v.samples.precise_unavailable.clone());
        }
        report.sampled = Some(sampled);
    }
    (report.hot_node, report.hot_node_share, report.hot_node_basis) =
        hot_node(&topology, report.sampled.as_ref(), &report.resident_bytes_by_node);
    report.nodes = topology.nodes;
    report.distances = topology.distances;
    report
}

/// Resident heap bytes per node, leaving out mappings that are the agent's own.
fn resident_by_node(topology: &Topology, placement: &Placement, agent_ranges: &[(u64, u64)]) -> Vec<u64> {
    let mut out = vec![0u64; topology.nodes.len()];
    for m in &placement.mappings {
        let end = m.start.saturating_add(m.pages.saturating_mul(placement.page_size));
        if agent_ranges.iter().any(|&(start, len)| start <= m.start && end <= start + len) {
            continue;
        }
        for &(status, pages) in &m.runs {
            if let Some(i) = u32::try_from(status).ok().and_then(|id| topology.index_of_node(id)) {
                out[i] = out[i].saturating_add(pages.saturating_mul(placement.page_size));
            }
        }
    }
    out
}

/// Resident bytes per node of the mappings that start inside `range`.
fn resident_by_node_in(topology: &Topology, placement: &Placement, range: std::ops::Range<u64>) -> Vec<u64> {
    let mut out = vec![0u64; topology.nodes.len()];
    for m in placement.mappings.iter().filter(|m| range.contains(&m.start)) {
        for &(status, pages) in &m.runs {
            if let Some(i) = u32::try_from(status).ok().and_then(|id| topology.index_of_node(id)) {
                out[i] = out[i].saturating_add(pages.saturating_mul(placement.page_size));
            }
        }
    }
    out
}

/// The column with the largest total: of the sampled matrix if there is one,
/// else of the resident heap.
fn hot_node(topology: &Topology, sampled: Option<&AccessLocality>, resident: &[u64]) -> (Option<u32>, Option<f64>, Option<&'static str>) {
    let (columns, basis): (Vec<u64>, &'static str) = match sampled {
        Some(s) if s.matrix.iter().flatten().any(|&c| c > 0) => (
            (0..topology.nodes.len()).map(|j| s.matrix.iter().map(|row| row[j]).sum()).collect(),
            if s.kind == "access" { "accesses" } else { "first touches" },
        ),
        _ => (resident.to_vec(), "resident heap bytes"),
    };
    let total: u64 = columns.iter().sum();
    let Some((best, &value)) = columns.iter().enumerate().max_by_key(|&(i, &v)| (v, std::cmp::Reverse(i))) else {
        return (None, None, None);
    };
    if total == 0 {
        return (None, None, None);
    }
    (Some(topology.nodes[best].id), Some(value as f64 / total as f64), Some(basis))
}

/// Per allocation site (the first frame outside memgap and the allocator, as
/// in blame): bytes on a node other than the allocating CPU's.
fn remote_sites(v: &NumaVisitor, locality: &AllocationLocality, top: usize) -> Vec<RemoteSite> {
    let remote: Vec<(u32, (u64, u64))> = locality.by_stack.iter().filter(|(_, (remote, _))| *remote > 0).map(|(&s, &t)| (s, t)).collect();
    if remote.is_empty() {
        return Vec::new();
    }
    let mut symbolizer = Symbolizer::new(&v.modules);
    let addresses = call_sites(remote.iter().filter_map(|(id, _)| v.stacks.get(id)).flat_map(|frames| frames.iter().copied()));
    let names: FxHashMap<u64, Vec<Frame>> = addresses.iter().copied().zip(symbolizer.symbolize_many(&addresses)).collect();
    let mut sites: BTreeMap<SiteKey, (u64, u64)> = BTreeMap::new();
    for (id, (remote, placed)) in remote {
        let frames: Vec<Frame> = v
            .stacks
            .get(&id)
            .map(|ips| ips.iter().flat_map(|ip| names.get(&ip.saturating_sub(1)).cloned().unwrap_or_default()).collect())
            .unwrap_or_default();
        let site = frames.iter().find(|f| !is_allocator_frame(f, ALLOCATOR_FUNCTIONS)).or(frames.first());
        let key = match site {
            Some(f) => (Some(f.function.clone().unwrap_or_else(|| f.label())), f.file.clone(), f.line, f.module.clone()),
            None => (Some("(no stack recorded)".into()), None, None, String::new()),
        };
        let entry = sites.entry(key).or_default();
        entry.0 += remote;
        entry.1 += placed;
    }
    let mut out: Vec<RemoteSite> = sites
        .into_iter()
        .map(|((function, file, line, module), (remote_bytes, placed_bytes))| RemoteSite {
            function,
            file,
            line,
            module,
            remote_bytes,
            placed_bytes,
        })
        .collect();
    out.sort_by(|a, b| b.remote_bytes.cmp(&a.remote_bytes).then_with(|| a.function.cmp(&b.function)));
    out.truncate(top);
    out
}

/// A running process's pages per node, mapping by mapping (numa_maps).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProcessPlacement {
    pub pid: u32,
    pub nodes: Vec<Node>,
    pub distances: Vec<Vec<u32>>,
    /// Resident bytes per node (in `nodes` order), all mappings.
    pub resident_bytes_by_node: Vec<u64>,
    /// …of the heap: `[heap]` and anonymous mappings.
    pub heap_bytes_by_node: Vec<u64>,
    pub mappings: Vec<MappingPlacementBytes>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MappingPlacementBytes {
    pub start: u64,
    pub policy: String,
    /// heap, stack, huge, file=PATH, or empty (anonymous).
    pub kind: String,
    pub bytes_by_node: BTreeMap<u32, u64>,
}

impl ProcessPlacement {
    /// From numa_maps lines: (start, policy, kind, bytes by node id).
    pub fn new(pid: u32, topology: Topology, maps: Vec<(u64, String, String, BTreeMap<u32, u64>)>) -> ProcessPlacement {
        let n = topology.nodes.len();
        let mut out =
            ProcessPlacement { pid, resident_bytes_by_node: vec![0; n], heap_bytes_by_node: vec![0; n], ..ProcessPlacement::default() };
        for (start, policy, kind, bytes_by_node) in maps {
            let heap = kind == "heap" || kind.is_empty();
            for (&id, &bytes) in &bytes_by_node {
                if let Some(i) = topology.index_of_node(id) {
                    out.resident_bytes_by_node[i] += bytes;
                    if heap {
                        out.heap_bytes_by_node[i] += bytes;
                    }
                }
            }
            if !bytes_by_node.is_empty() {
                out.mappings.push(MappingPlacementBytes { start, policy, kind, bytes_by_node });
            }
        }
        out.nodes = topology.nodes;
        out.distances = topology.distances;
        out
    }
}

#[cfg(test)]
mod tests;
