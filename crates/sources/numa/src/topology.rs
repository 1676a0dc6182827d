//! The machine's NUMA nodes from sysfs: `<root>/nodeN/cpulist` (`0-3,8-11`),
//! `distance` (the SLIT row, local = 10) and `meminfo` (`Node N MemTotal: K kB`).

use std::path::{Path, PathBuf};

use memgap_types::numa::{Node, Topology};

use crate::NumaError;

/// Where the kernel shows the nodes.
pub const SYSFS_NODES: &str = "/sys/devices/system/node";

/// Reads the nodes under `root` (normally [`SYSFS_NODES`]).
pub fn read(root: &Path) -> Result<Topology, NumaError> {
    let entries = std::fs::read_dir(root).map_err(|source| NumaError::Io { path: root.to_path_buf(), source })?;
    let mut ids: Vec<u32> = entries.flatten().filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok()).collect();
    ids.sort_unstable();
    if ids.is_empty() {
        return Err(NumaError::NoNodes(root.to_path_buf()));
    }
    let mut topology = Topology::default();
    for id in ids {
        let dir = root.join(format!("node{id}"));
        let cpus = parse_cpulist(&read_text(&dir.join("cpulist"))?).ok_or_else(|| malformed(&dir.join("cpulist")))?;
        let meminfo = read_text(&dir.join("meminfo")).unwrap_or_default();
        let distance_path = dir.join("distance");
        let distances = read_text(&distance_path)?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| malformed(&distance_path))?;
        topology.nodes.push(Node { id, cpus, memory_bytes: mem_total(&meminfo).unwrap_or(0) });
        topology.distances.push(distances);
    }
    Ok(topology)
}

/// This machine's topology; one node holding every online CPU when the
/// kernel shows none (built without NUMA).
pub fn this_machine() -> Topology {
    read(Path::new(SYSFS_NODES)).unwrap_or_else(|_| {
        let cpus =
            std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|t| parse_cpulist(&t)).unwrap_or_else(|| vec![0]);
        Topology { nodes: vec![Node { id: 0, cpus, memory_bytes: 0 }], distances: vec![vec![10]] }
    })
}

/// `0-3,8,10-11` → [0, 1, 2, 3, 8, 10, 11]; an empty list (a memory-only
/// node) is empty.
pub fn parse_cpulist(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 20 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// `Node 0 MemTotal:  10840280 kB` → bytes.
pub fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let (_, rest) = line.split_once("MemTotal:")?;
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kib * 1024)
    })
}

fn read_text(path: &Path) -> Result<String, NumaError> {
    std::fs::read_to_string(path).map_err(|source| NumaError::Io { path: path.to_path_buf(), source })
}

fn malformed(path: &Path) -> NumaError {
    NumaError::Malformed { path: path.to_path_buf(), text: std::fs::read_to_string(path).unwrap_or_default().trim().to_string() }
}

/// The fixture trees beside this crate: `tests/fixtures/numa/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/numa").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpulist("\n"), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn two_nodes() {
        let t = read(&fixture("2-nodes")).unwrap();
        assert_eq!(
            t.nodes.iter().map(|n| (n.id, n.cpus.clone(), n.memory_bytes)).collect::<Vec<_>>(),
            vec![(0, vec![0, 1], 8 << 30), (1, vec![2, 3], 8 << 30)]
        );
        assert_eq!(t.distances, vec![vec![10, 21], vec![21, 10]]);
        assert_eq!(t.index_of_cpu(3), Some(1));
    }

    #[test]
    fn four_nodes_with_a_memory_only_node() {
        let t = read(&fixture("4-nodes")).unwrap();
        assert_eq!(t.nodes.len(), 4);
        assert_eq!(t.nodes[1].cpus, vec![4, 5, 6, 7, 12, 13, 14, 15]);
        assert!(t.nodes[3].cpus.is_empty());
        assert_eq!(t.distances[0], vec![10, 12, 20, 20]);
        assert_eq!(t.distance(3, 2), 12);
    }

    #[test]
    fn the_papers_eight_nodes() {
        let t = read(&fixture("8-nodes")).unwrap();
        assert_eq!(t.nodes.len(), 8);
        assert!(t.nodes.iter().all(|n| n.cpus.len() == 8 && n.memory_bytes == 64 << 30));
        assert_eq!(t.index_of_cpu(63), Some(7));
        let mut distances: Vec<u32> = t.distances.iter().flatten().copied().collect();
        distances.sort_unstable();
        distances.dedup();
        assert_eq!(distances, vec![10, 16, 22]);
        for i in 0..8 {
            assert_eq!(t.distance(i, i), 10);
            for j in 0..8 {
                assert_eq!(t.distance(i, j), t.distance(j, i));
            }
        }
        assert_eq!(t.distances[0], vec![10, 16, 16, 22, 16, 22, 16, 22]);
    }

    #[test]
    fn errors_name_the_file() {
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(read(empty.path()), Err(NumaError::NoNodes(_))));
        let broken = tempfile::tempdir().unwrap();
        std::fs::create_dir(broken.path().join("node0")).unwrap();
        std::fs::write(broken.path().join("node0/cpulist"), "0-1\n").unwrap();
        std::fs::write(broken.path().join("node0/distance"), "10 x\n").unwrap();
        let error = read(broken.path()).unwrap_err().to_string();
        assert!(error.contains("node0/distance") && error.contains("10 x"), "{error}");
    }

    #[test]
    fn this_machine_has_a_node() {
        let t = this_machine();
        assert!(!t.nodes.is_empty() && t.nodes.iter().any(|n| !n.cpus.is_empty()));
    }
}
