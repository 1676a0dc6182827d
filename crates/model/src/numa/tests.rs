use memgap_trace::numa::MemorySample;

use super::*;

/// The paper's machine (Figure 2): 8 nodes of 8 CPUs, distances 10/16/22.
pub(crate) fn paper_machine() -> Topology {
    let distances = [
        [10, 16, 16, 22, 16, 22, 16, 22],
        [16, 10, 22, 16, 16, 22, 22, 16],
        [16, 22, 10, 16, 16, 16, 16, 16],
        [22, 16, 16, 10, 16, 16, 22, 22],
        [16, 16, 16, 16, 10, 16, 16, 22],
        [22, 22, 16, 16, 16, 10, 22, 16],
        [16, 22, 16, 22, 16, 22, 10, 16],
        [22, 16, 16, 22, 22, 16, 16, 10],
    ];
    Topology {
        nodes: (0..8).map(|i| Node { id: i, cpus: (8 * i..8 * i + 8).collect(), memory_bytes: 64 << 30 }).collect(),
        distances: distances.iter().map(|row| row.to_vec()).collect(),
    }
}

fn two_nodes() -> Topology {
    Topology {
        nodes: vec![Node { id: 0, cpus: vec![0, 1], memory_bytes: 1 << 30 }, Node { id: 1, cpus: vec![2, 3], memory_bytes: 1 << 30 }],
        distances: vec![vec![10, 21], vec![21, 10]],
    }
}

fn block(size: u64, thread: u32, cpu: u32, stack: u32) -> Block {
    Block { size, slack: 0, time: 0, thread, stack, cpu }
}

#[test]
fn allocation_matrix_splits_blocks_by_page_and_puts_wandering_threads_in_their_own_row() {
    let topology = two_nodes();
    // Pages 0x1000, 0x2000 on node 0; 0x3000, 0x4000 on node 1; 0x5000 not present.
    let pages = |addr: u64| match addr >> 12 {
        1 | 2 => Some(0),
        3 | 4 => Some(1),
        _ => None,
    };
    let mut threads = ThreadNodes::default();
    threads.insert(1, BTreeSet::from([0])); // stayed on node 0
    threads.insert(2, BTreeSet::from([0, 1])); // ran on both
    let blocks = [
        (0x1000, block(4096, 1, 0, 7)), // node 0 page, allocated on node 0: local
        (0x2800, block(4096, 1, 1, 8)), // half on node 0 (local), half on node 1 (remote)
        (0x4000, block(100, 2, 2, 9)),  // node 1, allocated on node 1: local, multi-node row
        (0x4100, block(60, 2, 0, 9)),   // node 1, allocated on node 0: remote, multi-node row
        (0x5000, block(50, 2, 0, 9)),   // not present
    ];
    let locality = allocation_locality(&topology, &PlacedBytes::of(blocks.iter().map(|(a, b)| (*a, b)), &pages, 4096), &threads);
    assert_eq!(locality.rows, ["node 0", "node 1", "multi-node threads"]);
    assert_eq!(locality.matrix, vec![vec![4096 + 2048, 2048], vec![0, 0], vec![0, 160]]);
    assert_eq!((locality.local_bytes, locality.remote_bytes, locality.unplaced_bytes), (4096 + 2048 + 100, 2048 + 60, 50));
    assert_eq!(locality.by_stack[&7], (0, 4096));
    assert_eq!(locality.by_stack[&8], (2048, 4096));
    assert_eq!(locality.by_stack[&9], (60, 160));
    let expected = (4096.0 + 2048.0 + 100.0) / (4096.0 + 4096.0 + 160.0);
    assert!((locality.local_fraction().unwrap() - expected).abs() < 1e-12);
}

#[test]
fn a_thread_with_no_known_node_falls_back_to_its_cpu() {
    let topology = two_nodes();
    let blocks = [(0x3000u64, block(10, 5, 3, 0))];
    let locality =
        allocation_locality(&topology, &PlacedBytes::of(blocks.iter().map(|(a, b)| (*a, b)), &|_| Some(1), 4096), &ThreadNodes::default());
    assert_eq!(locality.matrix[1], vec![0, 10]);
    assert_eq!(locality.local_fraction(), Some(1.0));
}

#[test]
fn the_papers_worked_examples() {
    // 1223 × 10^9 weighted accesses: 52.3 G at distance 10, 30 G at 16, 10 G at 22.
    let by_distance = [
        DistanceCount { distance: 10, events: 52_300_000_000 },
        DistanceCount { distance: 16, events: 30_000_000_000 },
        DistanceCount { distance: 22, events: 10_000_000_000 },
    ];
    let rate = numa_access_rate(&by_distance, 13.91).unwrap();
    assert_eq!(format!("{:.1}", rate / 1e9), "87.9");
    assert_eq!(rate, 1223e9 / 13.91);
    assert_eq!(
        format!("{:.1}", numa_access_rate(&[DistanceCount { distance: 10, events: 159_100_000_000 }], 9.56).unwrap() / 1e9),
        "166.4"
    );
    assert_eq!(format!("{:.1}", numa_access_rate(&[DistanceCount { distance: 10, events: 25_500_000_000 }], 0.45).unwrap() / 1e9), "566.7");
    assert_eq!(numa_access_rate(&by_distance, 0.0), None);
}

fn sample(cpu: u32, addr: u64, node: i32) -> MemorySample {
    MemorySample { monotonic_ns: 0, pid: 1, tid: 1, cpu, addr, node, data_source: 0 }
}

#[test]
fn access_matrix_distances_and_rate_on_the_papers_machine() {
    let topology = paper_machine();
    // Data on node 7 (the unpinned main thread's node), read from nodes 0, 3 and 7.
    let batch = SampleBatch {
        source: records::SOURCE_IBS_OP.into(),
        period: 1000,
        seconds: 2.0,
        samples: vec![
            sample(0, 0x1000, 7),      // node 0 → 7: distance 22
            sample(1, 0x1000, 7),      // node 0 → 7: 22
            sample(24, 0x2000, 7),     // node 3 → 7: 22
            sample(63, 0x2000, 7),     // node 7 → 7: 10
            sample(57, 0x9000, -2),    // node 7 → resolver: node 6, distance 16
            sample(9, 0xdead000, -14), // node 1 → nowhere: unresolved
            sample(99, 0x1000, 7),     // no such CPU: unresolved
        ],
        ..SampleBatch::default()
    };
    let pages = |addr: u64| (addr == 0x9000).then_some(6);
    let a = access_locality(&topology, "access", &batch, &pages);
    let mut expected = vec![vec![0u64; 8]; 8];
    expected[0][7] = 2000;
    expected[3][7] = 1000;
    expected[7][7] = 1000;
    expected[7][6] = 1000;
    assert_eq!(a.matrix, expected);
    assert_eq!(
        a.by_distance,
        vec![
            DistanceCount { distance: 10, events: 1000 },
            DistanceCount { distance: 16, events: 1000 },
            DistanceCount { distance: 22, events: 3000 }
        ]
    );
    assert_eq!(a.unresolved, 2);
    assert_eq!(a.local_fraction, Some(0.2));
    // (10×1000 + 16×1000 + 22×3000) / 2 s
    assert_eq!(a.weighted_rate_per_second, Some(46_000.0));
    let (hot, share, basis) = hot_node(&topology, Some(&a), &[]);
    assert_eq!((hot, share, basis), (Some(7), Some(0.8), Some("accesses")));
}

#[test]
fn hot_node_from_resident_bytes_without_samples() {
    let topology = two_nodes();
    assert_eq!(hot_node(&topology, None, &[100, 300]), (Some(1), Some(0.75), Some("resident heap bytes")));
    assert_eq!(hot_node(&topology, None, &[0, 0]), (None, None, None));
}

#[test]
fn resident_bytes_leave_out_the_agents_own_mappings() {
    let topology = two_nodes();
    let placement = Placement {
        page_size: 4096,
        stride: 1,
        mappings: vec![
            records::MappingPlacement { start: 0x10000, pages: 4, runs: vec![(0, 1), (records::NOT_PRESENT, 1), (1, 2)] },
            records::MappingPlacement { start: 0x80000, pages: 2, runs: vec![(0, 2)] },
        ],
        ..Placement::default()
    };
    assert_eq!(resident_by_node(&topology, &placement, &[(0x80000, 0x2000)]), vec![4096, 8192]);
}

#[test]
fn topology_round_trips_through_its_record() {
    let topology = paper_machine();
    assert_eq!(Topology::from_record(&topology.to_record()), topology);
    assert_eq!(topology.index_of_cpu(63), Some(7));
    assert_eq!(topology.distance(2, 1), 22);
}

/// A whole trace on the paper's machine, written with TraceWriter and read
/// back through replay: an unpinned main thread (nodes 0 and 7) and a
/// thread pinned to node 3; IBS samples of two processes.
#[test]
fn a_recorded_trace_on_the_papers_machine() {
    use memgap_trace::records::{EventsPiece, Mapping, Record, Residency};
    use memgap_trace::{Event, EventKind, TraceWriter};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgt");
    let mut writer = TraceWriter::create(&path, 1).unwrap();
    let malloc = |time, cpu, addr, size| Event { time, kind: Some(EventKind::Malloc), cpu, addr, size, usable: size, ..Event::default() };
    let main_events = memgap_trace::event::encode_all(&[malloc(10, 0, 0x30000, 100), malloc(20, 60, 0x10000, 8192)]);
    let pinned_events = memgap_trace::event::encode_all(&[malloc(15, 24, 0x20000, 4096), malloc(16, 25, 0x21000, 4096)]);
    let snapshot = memgap_trace::records::Snapshot {
        time: 100,
        page_size: 4096,
        mappings: vec![Mapping { start: 0x10000, end: 0x40000, perms: "rw-p".into(), residency: Residency::All, ..Mapping::default() }],
        ..Default::default()
    };
    let placement = Placement {
        time: 100,
        page_size: 4096,
        stride: 1,
        mappings: vec![records::MappingPlacement {
            start: 0x10000,
            pages: 48,
            runs: vec![(7, 2), (records::NOT_PRESENT, 14), (3, 1), (0, 1), (records::NOT_PRESENT, 14), (0, 16)],
        }],
        ..Placement::default()
    };
    let sample = |pid, cpu, addr| MemorySample { monotonic_ns: 5, pid, tid: pid, cpu, addr, node: 7, data_source: 0 };
    let samples = MemorySamples {
        source: records::SOURCE_IBS_OP.into(),
        period: 65536,
        start_ns: 1_000_000_000,
        end_ns: 3_000_000_000,
        samples: vec![sample(100, 0, 0x10000), sample(100, 24, 0x10008), sample(100, 63, 0x11000), sample(999, 8, 0x10000)],
        ..MemorySamples::default()
    };
    writer
        .write(&[
            Record::Process(memgap_trace::records::Process { pid: 100, page_size: 4096, ..Default::default() }),
            Record::Topology(paper_machine().to_record()),
            Record::Events(EventsPiece { thread: 1, tid: 100, buffer: 0, offset: 0, records: &main_events }),
            Record::Events(EventsPiece { thread: 2, tid: 101, buffer: 0, offset: 0, records: &pinned_events }),
            Record::Snapshot(snapshot),
            Record::Placement(placement),
            Record::MemorySamples(samples),
        ])
        .unwrap();
    let report = numa(&path, &NumaOptions { at: At::End, machine_topology: None, top: 10 }).unwrap();
    assert_eq!(report.topology_source, "trace");
    assert_eq!(report.nodes.len(), 8);
    assert_eq!(report.multi_node_threads, 1);
    let mut expected = vec![vec![0u64; 8]; 9];
    expected[8][0] = 100; // main thread, block on a node-0 page
    expected[8][7] = 8192; // main thread, two pages on node 7
    expected[3][3] = 4096; // pinned thread, its first block on node 3…
    expected[3][0] = 4096; // …and its second on node 0: remote
    assert_eq!(report.allocation_matrix_bytes, expected);
    assert_eq!((report.allocation_local_bytes, report.allocation_remote_bytes), (100 + 8192 + 4096, 4096));
    assert_eq!(report.local_fraction, Some(12388.0 / 16484.0));
    assert_eq!(report.resident_bytes_by_node, vec![17 * 4096, 0, 0, 4096, 0, 0, 0, 2 * 4096]);
    assert_eq!(report.remote_by_site.iter().map(|s| s.remote_bytes).sum::<u64>(), 4096);

    // Pid 999's sample is another process's: left out.
    let mut access = vec![vec![0u64; 8]; 8];
    access[0][7] = 65536;
    access[3][7] = 65536;
    access[7][7] = 65536;
    assert_eq!(report.access_matrix, Some(access));
    assert!(report.access_unavailable_reason.is_none());
    // (22 + 22 + 10) × 65536 accesses in 2 s.
    assert_eq!(report.numa_access_rate, Some(54.0 * 65536.0 / 2.0));
    assert_eq!((report.hot_node, report.hot_node_share, report.hot_node_basis), (Some(7), Some(1.0), Some("accesses")));
}

#[test]
fn a_process_from_numa_maps() {
    let maps = vec![
        (0x1000, "default".to_string(), "heap".to_string(), BTreeMap::from([(0, 4096), (1, 8192)])),
        (0x9000, "bind:1".to_string(), String::new(), BTreeMap::from([(1, 4096)])),
        (0x7000, "default".to_string(), "file=/lib/libc.so.6".to_string(), BTreeMap::from([(0, 1 << 20)])),
        (0x8000, "default".to_string(), "stack".to_string(), BTreeMap::new()),
    ];
    let p = ProcessPlacement::new(7, two_nodes(), maps);
    assert_eq!(p.resident_bytes_by_node, vec![4096 + (1 << 20), 12288]);
    assert_eq!(p.heap_bytes_by_node, vec![4096, 12288]);
    assert_eq!(p.mappings.len(), 3);
}

#[test]
fn ghc_capabilities_land_on_nodes_by_numa_or_affinity() {
    // Three nodes of two CPUs each: node ids 0, 2, 4; CPUs 0-1, 2-3, 4-5.
    let nodes: Vec<Node> = (0..3).map(|i| Node { id: i * 2, cpus: vec![2 * i, 2 * i + 1], memory_bytes: 1 << 30 }).collect();
    let topology = Topology { nodes, distances: Vec::new() };
    let gcs: Vec<crate::ghc::CapabilityGcs> =
        (0..5).map(|cap| crate::ghc::CapabilityGcs { capability: Some(cap), by_generation: vec![10 + cap as u64, 1] }).collect();
    let point = |cap: u32, generation: u32, copied: u64| crate::ghc::GhcPoint {
        capability: Some(cap),
        generation: Some(generation),
        copied_bytes: copied,
        ..Default::default()
    };
    let timeline = vec![point(4, 0, 100), point(4, 0, 50), point(4, 1, 7), point(0, 1, 3)];
    let nodes_of = |caps: &[GhcCapabilityGcs]| caps.iter().map(|c| c.node).collect::<Vec<_>>();

    let numa = ghc_capability_nodes(&gcs, &timeline, &topology, Some("--numa"), Some(5));
    assert_eq!(nodes_of(&numa), vec![Some(0), Some(2), Some(4), Some(0), Some(2)]);
    assert_eq!(numa[4].gcs_by_generation, vec![14, 1]);
    assert_eq!(numa[4].copied_bytes_by_generation, vec![150, 7]);
    assert_eq!(numa[0].copied_bytes_by_generation, vec![0, 3]);

    // -qa -N3: capability n on CPUs n and n+3, on two nodes for n = 1 and 2.
    let affinity = ghc_capability_nodes(&gcs[..3], &timeline, &topology, Some("-qa"), Some(3));
    assert_eq!(nodes_of(&affinity), vec![None, None, None]);
    // -qa -N6: one CPU each.
    let six: Vec<crate::ghc::CapabilityGcs> =
        (0..6).map(|cap| crate::ghc::CapabilityGcs { capability: Some(cap), by_generation: vec![1] }).collect();
    let affinity = ghc_capability_nodes(&six, &timeline, &topology, Some("-qa"), Some(6));
    assert_eq!(nodes_of(&affinity), vec![Some(0), Some(0), Some(2), Some(2), Some(4), Some(4)]);
    let by_node = ghc_gcs_by_node(&affinity);
    assert_eq!(
        by_node.iter().map(|n| (n.node, n.gcs_by_generation.clone())).collect::<Vec<_>>(),
        vec![(0, vec![2]), (2, vec![2]), (4, vec![2])]
    );
    assert_eq!(by_node[0].copied_bytes_by_generation, vec![0, 3]);
    assert_eq!(by_node[2].copied_bytes_by_generation, vec![150, 7]);

    assert!(ghc_capability_nodes(&gcs, &timeline, &topology, None, Some(5)).iter().all(|c| c.node.is_none()));
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let rule = |a: &[&str]| ghc_node_rule(&ghc_rts_args(&argv(a)));
    assert_eq!(rule(&["prog", "+RTS", "-N4", "--numa", "-RTS", "x"]), Some("--numa"));
    assert_eq!(rule(&["prog", "+RTS", "--numa=3"]), Some("--numa"));
    assert_eq!(rule(&["prog", "+RTS", "-N2", "-qa"]), Some("-qa"));
    assert_eq!(rule(&["prog", "--numa"]), None);
    assert_eq!(rule(&["prog", "--RTS", "+RTS", "--numa"]), None);
    assert_eq!(ghc_capability_count(&ghc_rts_args(&argv(&["p", "+RTS", "-N", "-RTS"])), 6), Some(6));
    assert_eq!(ghc_capability_count(&ghc_rts_args(&argv(&["p", "+RTS", "-N2", "-RTS"])), 6), Some(2));
    assert_eq!(ghc_capability_count(&ghc_rts_args(&argv(&["p", "-N2"])), 6), None);
}

/// The largest gap found in the NUMA view's own replay (a runtime's too,
/// where its figures come in time): the same report as when the moment is
/// resolved first, on every recorded fixture where it applies.
#[test]
fn finding_the_largest_gap_while_replaying_reports_the_same() {
    for (path, scan) in crate::fixtures::gap_found_while_replaying(GapsSeen::InTime) {
        let options = NumaOptions { at: At::Gap, machine_topology: Some(two_nodes()), top: 20 };
        let (v, once) = replayed_at_largest_gap(&path, &scan).unwrap().expect("found while replaying");
        let moment = snapshots::resolve_scanned(&path, &scan, At::Gap).unwrap();
        assert_eq!(once.as_ref().map(|m| m.index), moment.as_ref().map(|m| m.index), "{}", path.display());
        let seconds = moment.as_ref().map(|m| m.seconds);
        let (resolved, _) = replayed_at_moment(&path, moment).unwrap();
        assert_eq!(
            format!("{:?}", assemble(v, seconds, &options)),
            format!("{:?}", assemble(resolved, seconds, &options)),
            "{}",
            path.display()
        );
    }
}
