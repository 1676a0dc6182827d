//! Terminal view of `memgap numa`: the topology, then the allocation and
//! access (or first-touch) matrices as tables whose cells are shaded by
//! their share of the largest cell (░ ▒ ▓ █), so a hot column stands out
//! without colour.

use std::fmt::Write;

use memgap_model::numa::{AccessLocality, NumaReport};

use crate::format::{bytes, count};

/// ' ' for nothing, then ░ ▒ ▓ █ by quarter of `max`.
pub fn shade(value: u64, max: u64) -> char {
    if value == 0 || max == 0 {
        return ' ';
    }
    match value.saturating_mul(4).div_ceil(max) {
        0 | 1 => '░',
        2 => '▒',
        3 => '▓',
        _ => '█',
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.1} %", fraction * 100.0)
}

/// Compact CPU list: [0,1,2,3,8] → "0-3,8".
pub fn cpu_ranges(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    if parts.is_empty() { "none".into() } else { parts.join(",") }
}

fn matrix(out: &mut String, rows: &[String], columns: &[String], cells: &[Vec<u64>], cell: impl Fn(u64) -> String) {
    let max = cells.iter().flatten().copied().max().unwrap_or(0);
    let texts: Vec<Vec<String>> = cells
        .iter()
        .map(|row| row.iter().map(|&v| if v == 0 { "·".into() } else { format!("{} {}", shade(v, max), cell(v)) }).collect())
        .collect();
    let label_width = rows.iter().map(|r| r.chars().count()).max().unwrap_or(0).max(4);
    let width = texts.iter().flatten().map(|t| t.chars().count()).chain(columns.iter().map(|c| c.chars().count())).max().unwrap_or(4);
    let _ = write!(out, "    {:label_width$}", "");
    for c in columns {
        let _ = write!(out, "  {c:>width$}");
    }
    out.push('\n');
    for (label, row) in rows.iter().zip(&texts) {
        let _ = write!(out, "    {label:label_width$}");
        for text in row {
            let _ = write!(out, "  {text:>width$}");
        }
        out.push('\n');
    }
}

pub fn numa(r: &NumaReport, title: &str) -> String {
    let mut out = String::new();
    let at = match (&r.moment, r.at_seconds) {
        (Some(moment), _) => format!(" — heap {}", moment.line()),
        (None, Some(s)) => format!(" — heap at {s:.2} s"),
        (None, None) => String::new(),
    };
    let _ = writeln!(out, "memgap numa — {title}{at}");
    let _ = writeln!(out, "\n  topology ({}): {} node{}", r.topology_source, r.nodes.len(), if r.nodes.len() == 1 { "" } else { "s" });
    let columns: Vec<String> = r.nodes.iter().map(|n| format!("node {}", n.id)).collect();
    for n in &r.nodes {
        let memory = if n.memory_bytes > 0 { bytes(n.memory_bytes) } else { "unknown".into() };
        let _ = writeln!(out, "    node {}: CPUs {}, memory {}", n.id, cpu_ranges(&n.cpus), memory);
    }
    if r.nodes.len() > 1 {
        let _ = writeln!(out, "  distances:");
        let cells: Vec<Vec<u64>> = r.distances.iter().map(|row| row.iter().map(|&d| d as u64).collect()).collect();
        matrix(&mut out, &columns, &columns, &cells, |d| d.to_string());
    }

    let _ = writeln!(out, "\n  allocation locality: live heap bytes by the allocating thread's node (rows) × the node of their pages");
    match &r.placement_unavailable_reason {
        Some(reason) => {
            let _ = writeln!(out, "    unavailable: {reason}");
        }
        None => {
            matrix(&mut out, &r.allocation_rows, &columns, &r.allocation_matrix_bytes, bytes);
            let resident: Vec<String> =
                r.nodes.iter().zip(&r.resident_bytes_by_node).map(|(n, &b)| format!("node {} {}", n.id, bytes(b))).collect();
            let cost = r.placement_cost_seconds.map(|s| format!(" (asked in {:.1} ms)", s * 1e3)).unwrap_or_default();
            let _ = writeln!(out, "    resident heap pages: {}{cost}", resident.join(", "));
            let local = r.local_fraction.map(percent).unwrap_or_else(|| "n/a".into());
            let _ = writeln!(
                out,
                "    local: {local} ({} on the allocating CPU's node, {} remote, {} on no node yet)",
                bytes(r.allocation_local_bytes),
                bytes(r.allocation_remote_bytes),
                bytes(r.allocation_unplaced_bytes)
            );
            if r.multi_node_threads > 0 {
                let _ = writeln!(out, "    {} thread(s) ran on more than one node (the multi-node row)", r.multi_node_threads);
            }
            if !r.remote_by_site.is_empty() {
                let _ = writeln!(out, "    placed remotely, by allocation site:");
                for site in &r.remote_by_site {
                    let location = match (&site.file, site.line) {
                        (Some(file), Some(line)) => format!(" ({}:{line})", file.rsplit('/').next().unwrap_or(file)),
                        _ => String::new(),
                    };
                    let _ = writeln!(
                        out,
                        "      {:>10} of {:>10}  {}{location}",
                        bytes(site.remote_bytes),
                        bytes(site.placed_bytes),
                        site.function.as_deref().unwrap_or("?")
                    );
                }
            }
        }
    }

    match &r.sampled {
        Some(s) => sampled(&mut out, r, s, &columns),
        None => {
            let _ = writeln!(out, "\n  access locality: unavailable: {}", r.access_unavailable_reason.as_deref().unwrap_or("no samples"));
        }
    }
    if let (Some(node), Some(share), Some(basis)) = (r.hot_node, r.hot_node_share, r.hot_node_basis) {
        let _ = writeln!(out, "\n  hot node: {node} ({} of {basis})", percent(share));
    }
    if !r.ghc_capabilities.is_empty() {
        let rule = r.ghc_capability_node_rule.map_or(String::new(), |rule| format!(", nodes by +RTS {rule}"));
        let _ = writeln!(out, "\n  GHC collections led per capability (by generation: count, bytes copied{rule}):");
        for c in &r.ghc_capabilities {
            let capability = c.capability.map_or("(none)".to_string(), |n| n.to_string());
            let node = c.node.map_or("-".to_string(), |n| format!("node {n}"));
            let _ = writeln!(
                out,
                "    capability {capability:<6} {node:<8} {}",
                ghc_generations(&c.gcs_by_generation, &c.copied_bytes_by_generation)
            );
        }
        for n in &r.ghc_gcs_by_node {
            let _ = writeln!(out, "    node {:<14} {}", n.node, ghc_generations(&n.gcs_by_generation, &n.copied_bytes_by_generation));
        }
    }
    if !r.ghc_heap_bytes_by_node.is_empty() {
        let placed: Vec<String> =
            r.nodes.iter().zip(&r.ghc_heap_bytes_by_node).map(|(n, &b)| format!("node {} {}", n.id, bytes(b))).collect();
        let _ = writeln!(out, "    GHC heap (megablocks) resident: {}", placed.join(", "));
    }
    for note in &r.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}

fn sampled(out: &mut String, r: &NumaReport, s: &AccessLocality, columns: &[String]) {
    if s.kind == "access" {
        let _ = writeln!(out, "\n  access locality ({}): sampled accesses by the accessing CPU's node (rows) × the data's node", s.source);
    } else {
        let _ = writeln!(out, "\n  access locality: unavailable: {}", r.access_unavailable_reason.as_deref().unwrap_or(""));
        let _ = writeln!(
            out,
            "  first-touch locality (page faults, not accesses): pages first touched by a CPU on node (rows) × the node they landed on"
        );
    }
    matrix(out, columns, columns, &s.matrix, count);
    let distances: Vec<String> = s.by_distance.iter().map(|d| format!("{}×{}", d.distance, count(d.events))).collect();
    let what = if s.kind == "access" { "accesses" } else { "first touches" };
    let _ = writeln!(out, "    {what} by distance: {}", if distances.is_empty() { "none".into() } else { distances.join(", ") });
    if let Some(local) = s.local_fraction {
        let _ = writeln!(out, "    local {what}: {}", percent(local));
    }
    if let Some(rate) = s.weighted_rate_per_second {
        let name = if s.kind == "access" { "NUMA access rate" } else { "first-touch rate (distance-weighted)" };
        let _ = writeln!(out, "    {name}: {:.3e} per second over {:.2} s", rate, s.seconds);
    }
    let _ = writeln!(out, "    {} samples, {} lost, {} without a node", count(s.samples), count(s.lost), count(s.unresolved));
}

/// `memgap numa --pid PID`: resident bytes per node, in total, of the heap,
/// and per mapping.
pub fn process(p: &memgap_model::numa::ProcessPlacement) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "memgap numa — process {} (numa_maps, no recording)", p.pid);
    for n in &p.nodes {
        let _ = writeln!(out, "  node {}: CPUs {}", n.id, cpu_ranges(&n.cpus));
    }
    let columns: Vec<String> = p.nodes.iter().map(|n| format!("node {}", n.id)).collect();
    let rows = vec!["all mappings".to_string(), "heap".to_string()];
    matrix(&mut out, &rows, &columns, &[p.resident_bytes_by_node.clone(), p.heap_bytes_by_node.clone()], bytes);
    let _ = writeln!(out, "  per mapping:");
    for m in &p.mappings {
        let nodes: Vec<String> = m.bytes_by_node.iter().map(|(id, b)| format!("N{id} {}", bytes(*b))).collect();
        let kind = if m.kind.is_empty() { "anonymous" } else { m.kind.as_str() };
        let _ = writeln!(out, "    {:>14x}  {:<14} {:<30} {}", m.start, m.policy, kind, nodes.join(", "));
    }
    out
}

/// "gen 0: 12 (3.1 MiB copied), gen 1: 2 (…)".
fn ghc_generations(gcs: &[u64], copied: &[u64]) -> String {
    let parts: Vec<String> =
        gcs.iter().enumerate().map(|(g, n)| format!("gen {g}: {n} ({} copied)", bytes(copied.get(g).copied().unwrap_or(0)))).collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shades_by_quarter() {
        assert_eq!([0, 1, 25, 26, 50, 51, 75, 76, 100].map(|v| shade(v, 100)), [' ', '░', '░', '▒', '▒', '▓', '▓', '█', '█']);
    }

    #[test]
    fn two_nodes_with_first_touches() {
        use memgap_model::numa::{AccessLocality, DistanceCount, Node, NumaReport};
        let nodes = vec![Node { id: 0, cpus: vec![0, 1], memory_bytes: 1 << 30 }, Node { id: 1, cpus: vec![2, 3], memory_bytes: 1 << 30 }];
        let report = NumaReport {
            topology_source: "trace",
            nodes,
            distances: vec![vec![10, 21], vec![21, 10]],
            allocation_rows: vec!["node 0".into(), "node 1".into(), "multi-node threads".into()],
            allocation_matrix_bytes: vec![vec![1 << 20, 0], vec![0, 0], vec![0, 64 << 20]],
            local_fraction: Some(0.5),
            resident_bytes_by_node: vec![1 << 20, 64 << 20],
            access_unavailable_reason: Some("no PMU here".into()),
            sampled: Some(AccessLocality {
                kind: "first-touch",
                source: "page-faults".into(),
                matrix: vec![vec![10, 90], vec![0, 0]],
                by_distance: vec![DistanceCount { distance: 10, events: 10 }, DistanceCount { distance: 21, events: 90 }],
                local_fraction: Some(0.1),
                samples: 100,
                ..AccessLocality::default()
            }),
            hot_node: Some(1),
            hot_node_share: Some(0.9),
            hot_node_basis: Some("first touches"),
            ..NumaReport::default()
        };
        let text = numa(&report, "t.mgt");
        assert!(text.contains("CPUs 2-3"), "{text}");
        assert!(text.lines().any(|l| l.trim_start().starts_with("multi-node threads") && l.trim_end().ends_with("█ 64.0 MiB")), "{text}");
        assert!(text.contains("░ 1.00 MiB"), "{text}");
        assert!(text.contains("access locality: unavailable: no PMU here"), "{text}");
        assert!(text.contains("first-touch locality (page faults, not accesses)"), "{text}");
        assert!(text.contains("first touches by distance: 10×10, 21×90"), "{text}");
        assert!(text.contains("hot node: 1 (90.0 % of first touches)"), "{text}");
        assert!(!text.contains("NUMA access rate"), "{text}");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_ranges(&[]), "none");
    }
}
