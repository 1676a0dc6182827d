//! The resident memory of a process and all its descendants, from /proc.

use std::collections::HashMap;
use std::fs;
use std::time::{Duration, Instant};

/// Without /proc/PID/task/TID/children (a kernel built without
/// CONFIG_PROC_CHILDREN) finding descendants means reading every
/// /proc/*/stat, about a millisecond: done this often, not every sample.
const FULL_SCAN_INTERVAL: Duration = Duration::from_millis(100);

pub struct ProcessTree {
    root: u32,
    descendants: Vec<u32>,
    has_children_files: bool,
    last_full_scan: Option<Instant>,
    page_size: u64,
}

impl ProcessTree {
    pub fn new(root: u32) -> ProcessTree {
        let has_children_files = fs::metadata(format!("/proc/{root}/task/{root}/children")).is_ok();
        // SAFETY: sysconf only reads a constant of the system.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        ProcessTree { root, descendants: Vec::new(), has_children_files, last_full_scan: None, page_size }
    }

    /// VmRSS of the root plus that of every descendant alive now; `None`
    /// once the root has exited (the kernel detaches its memory before
    /// tearing it down, so a reading is never of a half-freed process).
    pub fn rss_bytes(&mut self) -> Option<u64> {
        let root_bytes = self.resident_bytes(self.root);
        if root_bytes == 0 {
            return None;
        }
        self.refresh_descendants();
        Some(root_bytes + self.descendants.iter().map(|&pid| self.resident_bytes(pid)).sum::<u64>())
    }

    fn refresh_descendants(&mut self) {
        if self.has_children_files {
            self.descendants = descendants_from_children_files(self.root);
        } else if self.last_full_scan.is_none_or(|at| at.elapsed() >= FULL_SCAN_INTERVAL) {
            self.descendants = descendants_from_full_scan(self.root);
            self.last_full_scan = Some(Instant::now());
        }
    }

    /// The second field of statm (resident pages) is the sum VmRSS shows
    /// (RssAnon + RssFile + RssShmem), and cheaper to parse than status.
    /// A process that has exited counts zero.
    fn resident_bytes(&self, pid: u32) -> u64 {
        let Ok(statm) = fs::read_to_string(format!("/proc/{pid}/statm")) else { return 0 };
        statm.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()).map_or(0, |pages| pages * self.page_size)
    }
}

fn descendants_from_children_files(root: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut pending = vec![root];
    while let Some(pid) = pending.pop() {
        // Children are listed under the thread that created them.
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for task in tasks.flatten() {
            let Ok(children) = fs::read_to_string(task.path().join("children")) else { continue };
            for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                found.push(child);
                pending.push(child);
            }
        }
    }
    found
}

fn descendants_from_full_scan(root: u32) -> Vec<u32> {
    let mut children_of: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        if let Some(parent) = parent_pid(pid) {
            children_of.entry(parent).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut pending = vec![root];
    while let Some(pid) = pending.pop() {
        for &child in children_of.get(&pid).into_iter().flatten() {
            found.push(child);
            pending.push(child);
        }
    }
    found
}

/// "pid (comm) state ppid …": comm may hold spaces and parentheses, so the
/// fields are counted from the last ')'.
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn counts_grandchildren_both_ways() {
        // sh starts a sleep and waits for it: the tree is sh and sleep.
        let mut sh = Command::new("sh").args(["-c", "sleep 2 & wait"]).stdout(Stdio::null()).spawn().unwrap();
        let root = sh.id();
        let deadline = Instant::now() + Duration::from_secs(2);
        while descendants_from_full_scan(root).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let scanned = descendants_from_full_scan(root);
        assert_eq!(scanned.len(), 1, "the sleep under sh");
        if fs::metadata(format!("/proc/{root}/task/{root}/children")).is_ok() {
            assert_eq!(descendants_from_children_files(root), scanned);
        }
        let mut tree = ProcessTree::new(root);
        let with_sleep = tree.rss_bytes().expect("sh is running");
        assert!(with_sleep > tree.resident_bytes(root), "the tree counts more than its root");
        // SAFETY: no memory precondition; the target is the sleep this test started.
        unsafe { libc::kill(scanned[0] as i32, libc::SIGKILL) };
        sh.wait().unwrap();
    }

    #[test]
    fn a_missing_process_has_no_rss() {
        assert_eq!(ProcessTree::new(u32::MAX).rss_bytes(), None);
    }
}
