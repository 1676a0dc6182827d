//! What is read of a running process from outside, with no agent (crate
//! `memgap-attach` reads it): procfs, its memory cgroup, and the result of
//! a malloc_trim(0) made inside it.

use std::collections::BTreeMap;

use memgap_trace::records::{Mapping, Rss};
use serde::Serialize;

use crate::allocator_stats::AllocatorStats;

/// What procfs says about one process, as an adapter (memgap-attach) read it.
#[derive(Debug, Clone, Default)]
pub struct ProcfsReading {
    pub pid: u32,
    pub command: String,
    pub threads: u32,
    /// VmRSS, RssAnon, RssFile and RssShmem from /proc/PID/status.
    pub status: Rss,
    /// Every mapping with its smaps figures (no residency bitmaps).
    pub mappings: Vec<Mapping>,
    /// Stack pointers of the threads, where the kernel shows them.
    pub stack_pointers: Vec<u64>,
    /// Resident bytes per NUMA node, from numa_maps.
    pub numa: BTreeMap<u32, u64>,
    pub cgroup: Option<CgroupMemory>,
    /// Whose malloc the process calls: "glibc", "jemalloc", "tcmalloc",
    /// "mimalloc", or "unknown" (no libc.so.6: statically linked).
    pub allocator: String,
    /// The allocator's own statistics, read in the process (jemalloc,
    /// tcmalloc), and whether it is linked into the executable.
    pub allocator_stats: Option<AllocatorStats>,
    pub allocator_statically_linked: bool,
    /// Why the statistics of an allocator that has them could not be read.
    pub allocator_stats_error: Option<String>,
}

/// The memory cgroup a process runs in.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CgroupMemory {
    /// 2 (unified hierarchy) or 1 (the v1 memory controller).
    pub version: u8,
    pub path: String,
    /// memory.current (v1: memory.usage_in_bytes).
    pub current_bytes: u64,
    /// The lowest memory.max on the way up to the root; None when unlimited.
    pub max_bytes: Option<u64>,
    /// The cgroup whose limit that is.
    pub limit_path: Option<String>,
    /// From memory.stat, in bytes: anon, file, shmem, kernel, sock… (v1
    /// names are translated: total_rss → anon, total_cache → file).
    pub stat: BTreeMap<String, u64>,
    /// memory.events oom_kill (v2 only).
    pub oom_kills: Option<u64>,
    /// current ÷ max, in percent.
    pub used_percent: Option<f64>,
    /// max − current: how far the OOM killer is, before file pages are reclaimed.
    pub headroom_bytes: Option<u64>,
}

/// A malloc_trim(0) call made inside a running process (by memgap-attach).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TrimCall {
    /// How the call was made: "ptrace".
    pub method: String,
    /// The thread that made it.
    pub thread: u32,
    /// Rounds over the threads until one was outside the allocator.
    pub attempts: u32,
    /// malloc_trim's result: 1 if it released memory, 0 if not.
    #[serde(rename = "malloc_trim_returned")]
    pub returned: i32,
    pub call_seconds: f64,
}
