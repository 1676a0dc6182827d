//! The run's processes the agent is not in: a child whose environment lost
//! memgap's LD_PRELOAD, a statically linked child, or a traced process that
//! exec'd into one of those. They leave no trace; `memgap run` names them.
//!
//! Found from outside: the children of every process of the run
//! (`/proc/PID/task/TID/children`) and the processes themselves, checked
//! for the agent among their mappings.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::agent::AGENT_FILE;

/// How often the run's process tree is looked at.
const SCAN_INTERVAL: Duration = Duration::from_millis(50);
/// Between a fork or exec and its loader mapping the preloaded agent, a
/// process has no agent yet: it must be seen without it this long.
const GRACE: Duration = Duration::from_millis(200);

/// A process of the run that runs without the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untraced {
    pub pid: u32,
    pub command: String,
    pub why: &'static str,
}

#[derive(Default)]
pub struct Watch {
    /// When the next scan may start: SCAN_INTERVAL after the last, or ten
    /// times its length if longer (a process of thousands of threads has a
    /// children file per thread: reading them all every SCAN_INTERVAL took
    /// a fifth of the CPU the program itself needed).
    next_scan: Option<Instant>,
    /// Since when each process was seen without the agent.
    without_agent_since: HashMap<u32, Instant>,
    /// Named already (their children are looked at too).
    found: Vec<Untraced>,
    named: HashSet<u32>,
}

impl Watch {
    /// Looks at the processes `traced` (which have made areas) and their
    /// descendants, at most every SCAN_INTERVAL (see `next_scan`).
    pub fn scan(&mut self, traced: &[u32]) {
        let now = Instant::now();
        if self.next_scan.is_some_and(|next| now < next) {
            return;
        }
        self.look(traced, now);
        self.next_scan = Some(now + SCAN_INTERVAL.max(now.elapsed() * 10));
    }

    fn look(&mut self, traced: &[u32], now: Instant) {
        let mut to_visit: Vec<u32> = traced.to_vec();
        to_visit.extend(self.named.iter().copied());
        let mut visited = HashSet::new();
        let mut looked_at = HashSet::new();
        while let Some(pid) = to_visit.pop() {
            if !visited.insert(pid) {
                continue;
            }
            for child in children_of(pid) {
                if !traced.contains(&child) {
                    to_visit.push(child);
                }
            }
            if self.named.contains(&pid) {
                continue;
            }
            looked_at.insert(pid);
            match without_agent(pid) {
                Some(why) => {
                    let since = *self.without_agent_since.entry(pid).or_insert(now);
                    if now.duration_since(since) >= GRACE {
                        self.named.insert(pid);
                        self.found.push(Untraced { pid, command: super::recorder::command_of(pid), why });
                    }
                }
                None => {
                    self.without_agent_since.remove(&pid);
                }
            }
        }
        self.without_agent_since.retain(|pid, _| looked_at.contains(pid));
    }

    pub fn found(self) -> Vec<Untraced> {
        self.found
    }
}

/// The children of every thread of `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut children = Vec::new();
    for task in tasks.filter_map(Result::ok) {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            children.extend(list.split_ascii_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    children
}

/// Why the running process `pid` is without the agent, or None when it has
/// it (or is gone, or a zombie).
fn without_agent(pid: u32) -> Option<&'static str> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command's closing parenthesis.
    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
    if matches!(state, 'Z' | 'X' | 'x') {
        return None;
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    if maps.is_empty() || maps.contains(AGENT_FILE) {
        return None;
    }
    Some(why_without_agent(&maps, std::fs::read(format!("/proc/{pid}/environ")).ok().as_deref()))
}

/// From a process's mappings (without the agent) and its environment as
/// exec'd: why the loader did not load the agent.
fn why_without_agent(maps: &str, environ: Option<&[u8]>) -> &'static str {
    if !maps.lines().any(|line| line.rsplit('/').next().is_some_and(|file| file.starts_with("ld-linux") || file.starts_with("ld-musl"))) {
        return "statically linked: LD_PRELOAD does not apply";
    }
    let preload = environ.and_then(|env| env.split(|&b| b == 0).find_map(|var| var.strip_prefix(b"LD_PRELOAD=")));
    match preload {
        None => "its environment has no LD_PRELOAD",
        Some(value) if !value.windows(AGENT_FILE.len()).any(|w| w == AGENT_FILE.as_bytes()) => {
            "its LD_PRELOAD no longer names memgap's agent"
        }
        Some(_) => "the loader did not load the agent (a setuid program ignores LD_PRELOAD)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DYNAMIC: &str = "55d0a000-55d0b000 r--p 00000000 08:01 12 /usr/bin/cat\n7f00-7f01 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n";

    #[test]
    fn the_reason_is_read_from_the_mappings_and_the_environment() {
        assert_eq!(
            why_without_agent("00400000-00401000 r-xp 00000000 08:01 12 /tmp/hold_static\n", None),
            "statically linked: LD_PRELOAD does not apply"
        );
        assert_eq!(why_without_agent(DYNAMIC, Some(b"PATH=/bin\0HOME=/root\0")), "its environment has no LD_PRELOAD");
        assert_eq!(
            why_without_agent(DYNAMIC, Some(b"LD_PRELOAD=/usr/lib/libjemalloc.so.2\0")),
            "its LD_PRELOAD no longer names memgap's agent"
        );
        assert_eq!(
            why_without_agent(DYNAMIC, Some(b"LD_PRELOAD=/opt/memgap/libmemgap_agent.so\0")),
            "the loader did not load the agent (a setuid program ignores LD_PRELOAD)"
        );
    }

    #[test]
    fn a_process_without_the_agent_is_named_and_a_gone_one_is_not() {
        // This test binary has no agent.
        assert!(without_agent(std::process::id()).is_some());
        assert_eq!(without_agent(u32::MAX), None);
    }

    #[test]
    fn an_untraced_child_is_named_after_the_grace_and_once() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let mut watch = Watch::default();
        let parent = std::process::id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while watch.found.is_empty() && Instant::now() < deadline {
            watch.scan(&[parent]);
            std::thread::sleep(Duration::from_millis(10));
        }
        for _ in 0..20 {
            watch.next_scan = None;
            watch.scan(&[parent]);
        }
        let _ = child.kill();
        let _ = child.wait();
        // Other tests of this binary start children too.
        let found: Vec<Untraced> = watch.found().into_iter().filter(|u| u.pid == child.id()).collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].pid, found[0].command.as_str()), (child.id(), "sleep 5"));
    }
}
