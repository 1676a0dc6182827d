//! A machine's NUMA topology and the memory samples taken on it, as the
//! kernel gives them (crate `memgap-source-numa` reads them), and the
//! locality arithmetic over those samples that a traced run (`memgap run
//! --numa`, the model) and an untraced one (`memgap compare`, crate
//! `memgap-measure`) share.

use std::collections::BTreeMap;

use memgap_trace::numa::{self as records, MemorySample, MemorySamples};
use serde::Serialize;

/// One node: its id (as the kernel numbers it), CPUs and memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    pub id: u32,
    pub cpus: Vec<u32>,
    pub memory_bytes: u64,
}

/// Nodes, in the kernel's order, and the distance matrix (SLIT: local 10),
/// indexed by position in `nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Topology {
    pub nodes: Vec<Node>,
    pub distances: Vec<Vec<u32>>,
}

impl Topology {
    pub fn from_record(record: &records::Topology) -> Topology {
        Topology {
            nodes: record.nodes.iter().map(|n| Node { id: n.id, cpus: n.cpus.clone(), memory_bytes: n.memory_bytes }).collect(),
            distances: record.nodes.iter().map(|n| n.distances.clone()).collect(),
        }
    }

    pub fn to_record(&self) -> records::Topology {
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| records::NumaNode {
                id: n.id,
                cpus: n.cpus.clone(),
                memory_bytes: n.memory_bytes,
                distances: self.distances.get(i).cloned().unwrap_or_default(),
            })
            .collect();
        records::Topology { nodes }
    }

    /// Position of the node holding `cpu`.
    pub fn index_of_cpu(&self, cpu: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.cpus.contains(&cpu))
    }

    /// Position of node `id`.
    pub fn index_of_node(&self, id: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Distance between the nodes at positions `from` and `to`; 10 (local)
    /// on the diagonal when sysfs gave no matrix.
    pub fn distance(&self, from: usize, to: usize) -> u32 {
        self.distances.get(from).and_then(|row| row.get(to)).copied().unwrap_or(if from == to { 10 } else { 20 })
    }
}

/// The node of the page holding an address.
pub trait PageNodes {
    fn node_of(&self, addr: u64) -> Option<u32>;
    /// An address above `addr` up to which `node_of` answers as it does for
    /// `addr`: by default the end of its page (of `page_size` bytes).
    fn same_node_until(&self, addr: u64, page_size: u64) -> u64 {
        ((addr / page_size) + 1).saturating_mul(page_size)
    }
}

impl PageNodes for memgap_trace::numa::PlacementIndex<'_> {
    fn node_of(&self, addr: u64) -> Option<u32> {
        self.status_of(addr).and_then(|s| u32::try_from(s).ok())
    }

    /// A run of pages at a time: a block's walk is bounded by the runs
    /// the trace holds, whatever size the block claims.
    fn same_node_until(&self, addr: u64, _page_size: u64) -> u64 {
        self.same_status_until(addr)
    }
}

impl<F: Fn(u64) -> Option<u32>> PageNodes for F {
    fn node_of(&self, addr: u64) -> Option<u32> {
        self(addr)
    }
}

/// Samples by the accessing CPU's node × the data's node.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AccessLocality {
    /// "access" (precise memory-access sampling) or "first-touch" (page
    /// faults: the CPU that first touched each page, and where it landed).
    pub kind: &'static str,
    /// The perf source: ibs-op, pebs-mem-loads, page-faults.
    pub source: String,
    /// nodes × nodes: sampled events × the sampling period.
    pub matrix: Vec<Vec<u64>>,
    pub by_distance: Vec<DistanceCount>,
    pub local_fraction: Option<f64>,
    /// Σ distance × events ÷ seconds (the paper's NUMA access rate when
    /// `kind` is "access"; the same sum over first touches otherwise).
    pub weighted_rate_per_second: Option<f64>,
    pub seconds: f64,
    pub samples: u64,
    /// Samples the kernel dropped.
    pub lost: u64,
    /// Samples whose page or CPU has no known node.
    pub unresolved: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DistanceCount {
    pub distance: u32,
    pub events: u64,
}

/// The paper's NUMA access rate: Σ distance × accesses ÷ seconds.
pub fn numa_access_rate(by_distance: &[DistanceCount], seconds: f64) -> Option<f64> {
    let weighted: u128 = by_distance.iter().map(|d| d.distance as u128 * d.events as u128).sum();
    (seconds > 0.0).then(|| weighted as f64 / seconds)
}

/// Builds the access (or first-touch) matrix from samples: the CPU's node
/// from the topology, the data's node from the sample (taken right after it)
/// or else from `pages`.
pub fn access_locality(topology: &Topology, kind: &'static str, batch: &SampleBatch, pages: &dyn PageNodes) -> AccessLocality {
    let n = topology.nodes.len();
    let mut matrix = vec![vec![0u64; n]; n];
    let mut unresolved = 0;
    for sample in &batch.samples {
        let data = u32::try_from(sample.node).ok().or_else(|| pages.node_of(sample.addr)).and_then(|id| topology.index_of_node(id));
        match (topology.index_of_cpu(sample.cpu), data) {
            (Some(cpu), Some(data)) => matrix[cpu][data] += batch.period.max(1),
            _ => unresolved += 1,
        }
    }
    let mut distances: BTreeMap<u32, u64> = BTreeMap::new();
    let (mut local, mut total) = (0u64, 0u64);
    for (i, row) in matrix.iter().enumerate() {
        for (j, &events) in row.iter().enumerate() {
            if events > 0 {
                *distances.entry(topology.distance(i, j)).or_default() += events;
            }
            total += events;
            if i == j {
                local += events;
            }
        }
    }
    let by_distance: Vec<DistanceCount> = distances.into_iter().map(|(distance, events)| DistanceCount { distance, events }).collect();
    AccessLocality {
        kind,
        source: batch.source.clone(),
        weighted_rate_per_second: numa_access_rate(&by_distance, batch.seconds),
        by_distance,
        local_fraction: (total > 0).then(|| local as f64 / total as f64),
        matrix,
        seconds: batch.seconds,
        samples: batch.samples.len() as u64,
        lost: batch.lost,
        unresolved,
    }
}

/// Every MEMORY_SAMPLES record of a process, merged.
#[derive(Debug, Clone, Default)]
pub struct SampleBatch {
    pub source: String,
    pub precise_unavailable: String,
    pub period: u64,
    pub seconds: f64,
    pub lost: u64,
    pub samples: Vec<MemorySample>,
}

impl SampleBatch {
    /// The samples of one sampling session, every process of it.
    pub fn from_record(record: &MemorySamples) -> SampleBatch {
        let mut batch = SampleBatch::default();
        batch.add(record, None);
        batch
    }

    /// `access` for precise memory-access samples, `first-touch` for page faults.
    pub fn kind(&self) -> &'static str {
        if self.is_precise() { "access" } else { "first-touch" }
    }

    /// Adds one record's samples: those of process `pid`, or all of them.
    pub fn add(&mut self, record: &MemorySamples, pid: Option<u32>) {
        if self.source.is_empty() {
            self.source = record.source.clone();
            self.precise_unavailable = record.precise_unavailable.clone();
            self.period = record.period;
        }
        self.seconds = self.seconds.max(record.end_ns.saturating_sub(record.start_ns) as f64 / 1e9);
        self.lost += record.lost;
        self.samples.extend(record.samples.iter().filter(|s| pid.is_none_or(|pid| s.pid == pid)));
    }

    pub fn is_precise(&self) -> bool {
        self.source == records::SOURCE_IBS_OP || self.source == records::SOURCE_PEBS_LOADS
    }
}
