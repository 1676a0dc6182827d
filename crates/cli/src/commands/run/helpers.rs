//! Which processes of a run are worth a trace file. A wrapper (a pyenv
//! shim, a launcher script) runs helpers — subshells, `readlink`,
//! `basename`, other scripts — before it execs the program; each would
//! leave a trace of a few hundred calls. A process is such a helper, and
//! its trace is removed after the run, when all of these hold:
//!
//! - it is not the top process (whose trace `-o` names), and it ended
//!   before an ancestor's last exec: it ran while that ancestor was still a
//!   wrapper (a child of a program that never execs is that program's own);
//! - it ran to its end under the recorder (not cut short, not given up);
//! - it lived under a second, allocated under 1 MiB in all, and its RSS
//!   stayed under 64 MiB;
//! - its gap between RSS and the live heap is under 16 MiB or no larger
//!   than the top process's (every small process has a few MiB of code and
//!   libraries above its heap), and no process whose trace is kept
//!   descends from it (a forked child's replay reads its parent's trace).
//!
//! `memgap run --keep-all-traces` keeps every trace.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::recorder::Outcome;
use memgap_record::traces::RunTraces;

const HELPER_MAX_SECONDS: f64 = 1.0;
const HELPER_MAX_ALLOCATED_BYTES: u64 = 1 << 20;
const HELPER_MAX_PEAK_RSS_BYTES: u64 = 64 << 20;
/// A gap this large is worth its trace when it is the run's largest.
const NOTABLE_GAP_BYTES: u64 = 16 << 20;

/// Removes the traces of the run's short helpers; returns their pids.
/// `top_gap` gives the top process's gap, asked only when a helper's is notable.
pub fn leave_out(outcomes: &[Outcome], traces: &RunTraces, top_gap: impl FnOnce() -> u64) -> Vec<u32> {
    let by_pid: HashMap<u32, &Outcome> = outcomes.iter().map(|o| (o.pid, o)).collect();
    let ancestors = |pid: u32| {
        let mut chain = Vec::new();
        let mut at = by_pid.get(&pid).map(|o| o.ppid);
        while let Some(parent) = at.and_then(|p| by_pid.get(&p)) {
            if chain.contains(&parent.pid) || chain.len() > by_pid.len() {
                break;
            }
            chain.push(parent.pid);
            at = Some(parent.ppid);
        }
        chain
    };
    let ran_in_a_wrapper = |o: &Outcome| ancestors(o.pid).iter().any(|a| by_pid[a].execs_ns.last().is_some_and(|&exec| exec > o.ended_ns));
    let mut helpers: HashMap<u32, u64> = HashMap::new();
    for o in outcomes.iter().filter(|o| o.pid != traces.top_pid && o.trace.is_some() && !o.given_up && ran_in_a_wrapper(o)) {
        let Some((path, _)) = traces.open(o.pid) else { continue };
        if let Some(gap) = helper_gap(&path) {
            helpers.insert(o.pid, gap);
        }
    }
    if helpers.is_empty() {
        return Vec::new();
    }
    if helpers.values().any(|&gap| gap >= NOTABLE_GAP_BYTES) {
        let top_gap = top_gap();
        helpers.retain(|_, gap| *gap < NOTABLE_GAP_BYTES || *gap <= top_gap);
    }
    let needed: HashSet<u32> = outcomes.iter().filter(|o| !helpers.contains_key(&o.pid)).flat_map(|o| ancestors(o.pid)).collect();
    helpers.retain(|pid, _| !needed.contains(pid));
    let mut removed: Vec<u32> = Vec::new();
    for &pid in helpers.keys() {
        if let Some((path, _)) = traces.open(pid)
            && std::fs::remove_file(&path).is_ok()
        {
            removed.push(pid);
        }
    }
    removed.sort();
    removed
}

/// The gap of a trace that is a short helper's: whole, brief and small.
fn helper_gap(path: &Path) -> Option<u64> {
    let closing = memgap_model::closing(path).ok()?;
    let s = &closing.summary;
    let small = !s.truncated
        && s.duration_seconds < HELPER_MAX_SECONDS
        && s.allocated_bytes < HELPER_MAX_ALLOCATED_BYTES
        && s.peak_rss_bytes < HELPER_MAX_PEAK_RSS_BYTES;
    small.then(|| closing.moment.as_ref().map_or(0, memgap_model::gap_bytes))
}
