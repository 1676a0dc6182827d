//! Reading a process's memory figures from /proc/PID, with no agent in it:
//! status (RSS counters), smaps (every mapping), numa_maps (pages per node),
//! each thread's stack pointer, and its memory cgroup. Works on a process in
//! another PID namespace (a container) by its host pid.

use memgap_trace::records::{Mapping, Rss};
use memgap_trace::smaps::parse_smaps;
use memgap_types::outside::ProcfsReading;
use std::collections::BTreeMap;

use crate::cgroup;
use crate::error::{AttachError, field};

/// The lines of /proc/PID/status memgap uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Status {
    pub name: String,
    /// R, S, D, T (stopped), t (traced), Z (zombie)…
    pub state: char,
    pub tgid: u32,
    pub tracer_pid: u32,
    pub threads: u32,
    pub rss: Rss,
}

pub fn parse_status(text: &str) -> Status {
    let number = |key| field(text, key).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let kib = |key| number(key).saturating_mul(1024);
    Status {
        name: field(text, "Name").unwrap_or("").to_string(),
        state: field(text, "State").and_then(|s| s.chars().next()).unwrap_or('?'),
        tgid: number("Tgid") as u32,
        tracer_pid: number("TracerPid") as u32,
        threads: number("Threads") as u32,
        rss: Rss { vm_rss: kib("VmRSS"), rss_anon: kib("RssAnon"), rss_file: kib("RssFile"), rss_shmem: kib("RssShmem"), ..Rss::default() },
    }
}

/// /proc/PID/status; a pid that is a thread of another process reads as that process.
pub fn status(pid: u32) -> Result<Status, AttachError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| AttachError::from_proc(pid, "read", &path, e))?;
    Ok(parse_status(&text))
}

/// Every mapping of `pid` with its smaps figures.
pub fn mappings(pid: u32) -> Result<Vec<Mapping>, AttachError> {
    let path = format!("/proc/{pid}/smaps");
    let text = std::fs::read(&path).map_err(|e| AttachError::from_proc(pid, "read the memory map of", &path, e))?;
    Ok(parse_smaps(&text))
}

/// Reads everything `memgap snapshot` shows about `pid`.
pub fn read_process(pid: u32) -> Result<ProcfsReading, AttachError> {
    read_process_reusing(pid, None)
}

/// An allocator's own statistics (or why they could not be read) as an
/// earlier reading of the same process got them.
#[derive(Debug, Clone, Default)]
pub struct KnownAllocatorStats {
    pub stats: Option<memgap_types::allocator_stats::AllocatorStats>,
    pub error: Option<String>,
}

/// [`read_process`], taking the allocator's statistics from `reuse` when
/// given instead of calling into the process for them (no ptrace stop).
pub fn read_process_reusing(pid: u32, reuse: Option<&KnownAllocatorStats>) -> Result<ProcfsReading, AttachError> {
    let first = status(pid)?;
    let pid = if first.tgid != 0 { first.tgid } else { pid };
    if first.state == 'Z' {
        return Err(AttachError::Zombie(pid));
    }
    // The allocator's own figures first: the call stops a thread briefly
    // and may touch pages, before smaps and VmRSS are read.
    let (linked, allocator_stats, allocator_stats_error) = linked_allocator_stats(pid, &first, reuse);
    let mappings = mappings(pid)?;
    // Read last, so that VmRSS and smaps are as close in time as they can be.
    let status = status(pid)?;
    Ok(ProcfsReading {
        pid,
        command: status.name.clone(),
        threads: status.threads,
        status: status.rss,
        allocator: match &linked {
            Some(linked) => linked.name.to_string(),
            None => crate::modules::allocator_of(&mappings).to_string(),
        },
        allocator_statically_linked: linked.as_ref().is_some_and(|l| l.statically_linked),
        allocator_stats,
        allocator_stats_error,
        mappings,
        stack_pointers: threads(pid).iter().filter_map(|t| t.stack_pointer).collect(),
        numa: std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).map(|text| parse_numa_maps(&text)).unwrap_or_default(),
        cgroup: cgroup::of_process(pid),
    })
}

/// The allocator linked into `pid` (statically or as a library) and its
/// own statistics, or why they could not be read.
#[cfg(target_arch = "x86_64")]
fn linked_allocator_stats(
    pid: u32,
    status: &Status,
    reuse: Option<&KnownAllocatorStats>,
) -> (Option<crate::allocator_stats::LinkedAllocator>, Option<memgap_types::allocator_stats::AllocatorStats>, Option<String>) {
    let Ok(mappings) = mappings(pid) else { return (None, None, None) };
    let Some(linked) = crate::allocator_stats::linked_allocator(pid, &mappings) else { return (None, None, None) };
    if let Some(known) = reuse {
        return (Some(linked), known.stats.clone(), known.error.clone());
    }
    if status.tracer_pid != 0 {
        let why = format!("process {pid} is traced by process {} (a debugger?)", status.tracer_pid);
        return (Some(linked), None, Some(why));
    }
    if let Err(refused) = crate::trim::refuse_another_users_process(pid) {
        return (Some(linked), None, Some(refused.to_string()));
    }
    match crate::allocator_stats::read_stats(pid, &linked, &mappings) {
        Ok(Some(stats)) => (Some(linked), Some(stats), None),
        Ok(None) => {
            let why = linked.no_call_because();
            (Some(linked), None, why)
        }
        Err(error) => (Some(linked), None, Some(error.to_string())),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn linked_allocator_stats(
    _pid: u32,
    _status: &Status,
    _reuse: Option<&KnownAllocatorStats>,
) -> (Option<NoLinkedAllocator>, Option<memgap_types::allocator_stats::AllocatorStats>, Option<String>) {
    (None, None, None)
}

#[cfg(not(target_arch = "x86_64"))]
struct NoLinkedAllocator {
    name: &'static str,
    statically_linked: bool,
}

/// Resident bytes per node: the `N<node>=<pages>` fields of every line,
/// in pages of that line's `kernelpagesize_kB`.
pub fn parse_numa_maps(text: &str) -> BTreeMap<u32, u64> {
    let mut nodes = BTreeMap::new();
    for line in text.lines() {
        let page_kib = line.split_whitespace().find_map(|f| f.strip_prefix("kernelpagesize_kB=")?.parse::<u64>().ok()).unwrap_or(4);
        for (node, pages) in line.split_whitespace().filter_map(|f| f.strip_prefix('N')?.split_once('=')) {
            if let (Ok(node), Ok(pages)) = (node.parse::<u32>(), pages.parse::<u64>()) {
                let bytes = pages.saturating_mul(page_kib).saturating_mul(1024);
                let total = nodes.entry(node).or_insert(0u64);
                *total = total.saturating_add(bytes);
            }
        }
    }
    nodes
}

/// One thread of a process, as /proc/PID/task/TID shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadInfo {
    pub tid: u32,
    pub state: char,
    /// The system call it is blocked in (-1: blocked outside one); None
    /// while it runs or when the kernel does not say.
    pub syscall: Option<i64>,
    pub stack_pointer: Option<u64>,
}

/// The threads of `pid`, main thread first.
pub fn threads(pid: u32) -> Vec<ThreadInfo> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut tids: Vec<u32> = entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable_by_key(|&tid| (tid != pid, tid));
    tids.into_iter()
        .map(|tid| {
            let task = format!("/proc/{pid}/task/{tid}");
            let state = std::fs::read_to_string(format!("{task}/status")).map(|s| parse_status(&s).state).unwrap_or('?');
            let (syscall, stack_pointer) =
                std::fs::read_to_string(format!("{task}/syscall")).map(|s| parse_syscall(&s)).unwrap_or((None, None));
            ThreadInfo { tid, state, syscall, stack_pointer }
        })
        .collect()
}

/// /proc/PID/task/TID/syscall: `running`, or `NR ARG1…ARG6 SP PC`, or `-1 SP PC`.
pub fn parse_syscall(text: &str) -> (Option<i64>, Option<u64>) {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() < 3 {
        return (None, None);
    }
    let hex = |f: &str| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok();
    (fields[0].parse().ok(), hex(fields[fields.len() - 2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let text = "Name:\tretainer\nState:\tS (sleeping)\nTgid:\t4242\nPid:\t4242\nTracerPid:\t0\nVmRSS:\t   86124 kB\nRssAnon:\t   80000 kB\n\
RssFile:\t    6000 kB\nRssShmem:\t     124 kB\nThreads:\t5\n";
        let s = parse_status(text);
        assert_eq!((s.name.as_str(), s.state, s.tgid, s.tracer_pid, s.threads), ("retainer", 'S', 4242, 0, 5));
        assert_eq!((s.rss.vm_rss, s.rss.rss_anon, s.rss.rss_file, s.rss.rss_shmem), (86124 * 1024, 80000 * 1024, 6000 * 1024, 124 * 1024));
    }

    #[test]
    fn parses_numa_maps() {
        let text = "55e9add12000 default heap anon=10 dirty=10 active=0 N0=10 kernelpagesize_kB=4\n\
7f0000000000 interleave:0-1 anon=512 dirty=512 N0=256 N1=256 kernelpagesize_kB=4\n\
7f1000000000 default file=/memfd:huge anon=1 dirty=1 N1=1 kernelpagesize_kB=2048\n\
7f2000000000 default file=/usr/lib/libc.so.6\n";
        let nodes = parse_numa_maps(text);
        assert_eq!(nodes.get(&0), Some(&(266 * 4096)));
        assert_eq!(nodes.get(&1), Some(&(256 * 4096 + (2 << 20))));
        assert_eq!(nodes.len(), 2);
    }

    #[test]
    fn parses_syscall_lines() {
        assert_eq!(parse_syscall("running\n"), (None, None));
        assert_eq!(parse_syscall("-1 0x7ffd1000 0x401000\n"), (Some(-1), Some(0x7ffd1000)));
        let blocked = "230 0x1 0x0 0x7ffe5c0a6f30 0x7ffe5c0a6f30 0x0 0x0 0x7ffe5c0a6f08 0x7f3b1a2e5b35\n";
        assert_eq!(parse_syscall(blocked), (Some(230), Some(0x7ffe5c0a6f08)));
    }

    #[test]
    fn reads_this_process() {
        let reading = read_process(std::process::id()).expect("read our own /proc");
        assert!(reading.status.vm_rss > 0 && !reading.mappings.is_empty());
        assert_eq!(reading.allocator, "glibc");
        let smaps_rss: u64 = reading.mappings.iter().map(|m| m.rss).sum();
        // Other tests in this process allocate meanwhile, and VmRSS lags
        // (per-CPU counters): only a unit mistake (kB for bytes) is wrong.
        let vm_rss = reading.status.vm_rss;
        assert!((vm_rss / 2..vm_rss * 2).contains(&smaps_rss), "smaps {smaps_rss} vs VmRSS {vm_rss}");
    }
}
