//! A structural fuzzer run by `cargo test`: a trace shaped like a real one
//! (a heap with blocks over many pages, frees and reallocs, snapshots with
//! residency bitmaps, a NUMA topology and placement) has its decoded records
//! mutated and its chunks framed again with right checksums
//! ([`memgap_trace::mutate`]), so the mutations reach the replay and the
//! model. Every command's model path must finish within a bound per input
//! (it takes milliseconds), whatever the records say. `fuzz/` has the same
//! as a cargo-fuzz target (`trace_records`).

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use memgap_model::numa::NumaOptions;
use memgap_model::{At, BlameOptions, BlameOrder, Summary, blame, ledger_at, report, timeline};
use memgap_trace::TraceWriter;
use memgap_trace::event::{Event, EventKind, encode_all};
use memgap_trace::mutate::{Choices, mutate_trace};
use memgap_trace::numa::{MappingPlacement, NumaNode, Placement, Topology};
use memgap_trace::records::{EventsPiece, Mapping, Metrics, Process, Record, Residency, Rss, Snapshot, SnapshotReason};
use proptest::prelude::*;

const HEAP: (u64, u64) = (0x55_0000_0000, 0x55_0004_0000);
/// Far above what one input takes, far below a hang.
const BOUND: Duration = Duration::from_secs(20);

/// The same trace as the cargo-fuzz target's, so that its findings replay here.
fn base_trace() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgt");
    let mut writer = TraceWriter::create(&path, 1).unwrap();
    let mut events = Vec::new();
    let event = |time, kind, addr, size, old_addr| Event {
        time,
        kind: Some(kind),
        cpu: (time % 2) as u32,
        addr,
        size,
        usable: size + 8,
        old_addr,
        stack: (time % 3) as u32,
        ..Event::default()
    };
    for i in 0..64u64 {
        events.push(event(10 + i, EventKind::Malloc, HEAP.0 + i * 0x1000 + 16, 100 + i * 40, 0));
    }
    for i in (0..64u64).step_by(3) {
        events.push(event(100 + i, EventKind::Free, HEAP.0 + i * 0x1000 + 16, 0, 0));
    }
    events.push(event(200, EventKind::Realloc, HEAP.0 + 0x30000, 9000, HEAP.0 + 0x1000 + 16));
    let bytes = encode_all(&events);
    let heap = |time| {
        let (start, end) = HEAP;
        let mapping = Mapping {
            start,
            end,
            perms: "rw-p".into(),
            name: "[heap]".into(),
            rss: 0x30000,
            anonymous: 0x30000,
            residency: Residency::Bitmap(vec![0xff, 0xf7, 0xff, 0x3f, 0xff, 0, 0, 0]),
            ..Mapping::default()
        };
        let rss = Rss { time, vm_rss: 0x40000, ..Rss::default() };
        Snapshot {
            time,
            reason: SnapshotReason::RssPeak,
            rss,
            vm_rss_after: 0x40000,
            page_size: 4096,
            mappings: vec![mapping],
            ..Snapshot::default()
        }
    };
    let topology = Topology {
        nodes: vec![
            NumaNode { id: 0, cpus: vec![0], memory_bytes: 1 << 30, distances: vec![10, 21] },
            NumaNode { id: 1, cpus: vec![1], memory_bytes: 1 << 30, distances: vec![21, 10] },
        ],
    };
    let placement = Placement {
        time: 150,
        page_size: 4096,
        stride: 1,
        mappings: vec![MappingPlacement { start: HEAP.0, pages: 64, runs: vec![(0, 20), (-14, 4), (1, 40)] }],
        ..Placement::default()
    };
    writer
        .write(&[
            Record::Process(Process { pid: 7, page_size: 4096, exe: "/x".into(), argv: vec!["x".into()], ..Process::default() }),
            Record::Topology(topology),
        ])
        .unwrap();
    writer.write(&[Record::Events(EventsPiece { thread: 1, tid: 7, buffer: 0, offset: 0, records: &bytes[..bytes.len() / 2] })]).unwrap();
    writer.write(&[Record::Snapshot(heap(150)), Record::Placement(placement)]).unwrap();
    writer
        .write(&[Record::Events(EventsPiece {
            thread: 1,
            tid: 7,
            buffer: 0,
            offset: (bytes.len() / 2) as u32,
            records: &bytes[bytes.len() / 2..],
        })])
        .unwrap();
    let mut exit = heap(300);
    exit.reason = SnapshotReason::Exit;
    writer.write(&[Record::Snapshot(exit)]).unwrap();
    drop(writer);
    std::fs::read(&path).unwrap()
}

/// What every command reads from a trace: summary, ledger (with the page
/// maps of `map`), timeline, blame per stack (as `export` and `flamegraph`
/// use it), report, numa.
fn every_model_path(path: &Path) {
    let _ = Summary::of_trace(path);
    for at in [At::Peak, At::End, At::Seconds(0.0)] {
        let _ = ledger_at(path, at, true);
    }
    let _ = timeline(path);
    for order in [BlameOrder::Fragmentation, BlameOrder::Live, BlameOrder::Leaked, BlameOrder::Allocated, BlameOrder::Temporary] {
        let _ = blame(
            path,
            &BlameOptions {
                at: At::Peak,
                order,
                top: 10,
                per_stack: true,
                skip: Vec::new(),
                temporary_ms: memgap_model::blame::DEFAULT_TEMPORARY_MS,
                full_names: false,
            },
        );
    }
    let _ = report::report(path, At::Gap);
    let _ = memgap_model::numa::numa(path, &NumaOptions { at: At::Peak, machine_topology: None, top: 10 });
}

/// Runs every model path on `file` on a thread, failing past [`BOUND`].
fn within_bound(file: Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgt");
    std::fs::write(&path, &file).unwrap();
    let (done, finished) = mpsc::channel();
    let reading = path.clone();
    std::thread::spawn(move || {
        every_model_path(&reading);
        let _ = done.send(());
    });
    if finished.recv_timeout(BOUND).is_err() {
        let kept = std::env::temp_dir().join(format!("memgap-slow-input-{}.mgt", std::process::id()));
        let _ = std::fs::write(&kept, &file);
        panic!("the model did not finish within {BOUND:?} on a mutated trace (kept as {})", kept.display());
    }
}

#[test]
fn the_base_trace_reads() {
    let file = base_trace();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgt");
    std::fs::write(&path, &file).unwrap();
    let ledger = ledger_at(&path, At::End, true).unwrap().expect("a ledger");
    assert!(ledger.rows.live > 0);
    let numa = memgap_model::numa::numa(&path, &NumaOptions { at: At::Peak, machine_topology: None, top: 10 }).unwrap();
    assert_eq!(numa.nodes.len(), 2);
}

/// Inputs cargo-fuzz found slow (each took longer than its 10 s timeout).
const FOUND_BY_CARGO_FUZZ: &[&[u8]] = &[
    // A snapshot's [heap] claims 2^26 pages with a bitmap of a few bytes:
    // the ledger classified (and allocated for) every claimed page.
    &[112, 240, 0, 25, 0, 0, 58],
];

#[test]
fn inputs_cargo_fuzz_found_slow_are_read_in_bounded_time() {
    let base = base_trace();
    for input in FOUND_BY_CARGO_FUZZ {
        within_bound(mutate_trace(&base, &mut Choices::new(input)).expect("the base trace has a header"));
    }
}

/// A trace of `snapshots` snapshots of `mappings` (the same each time),
/// after `events`, with a malloc_trim call recorded before each snapshot.
fn trace_of(events: &[Event], mappings: &[Mapping], snapshots: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgt");
    let mut writer = TraceWriter::create(&path, 1).unwrap();
    let bytes = encode_all(events);
    writer
        .write(&[
            Record::Process(Process { pid: 7, page_size: 4096, exe: "/x".into(), argv: vec!["x".into()], ..Process::default() }),
            Record::Allocator { path: "/lib/x86_64-linux-gnu/libc.so.6".into() },
        ])
        .unwrap();
    writer.write(&[Record::Events(EventsPiece { thread: 1, tid: 7, buffer: 0, offset: 0, records: &bytes })]).unwrap();
    for i in 0..snapshots {
        let time = 1000 + i;
        let trim = Metrics {
            monotonic_ns: time,
            source: "malloc".into(),
            kind: "trim".into(),
            values: vec![("rss_before:bytes".into(), 1e12), ("rss_after:bytes".into(), 1.0)],
        };
        let rss = Rss { time, vm_rss: 0x40000, ..Rss::default() };
        let snapshot = Snapshot {
            time,
            reason: SnapshotReason::Periodic,
            rss,
            vm_rss_after: 0x40000,
            page_size: 4096,
            mappings: mappings.to_vec(),
            ..Snapshot::default()
        };
        writer.write(&[Record::Metrics(trim), Record::Snapshot(snapshot)]).unwrap();
    }
    drop(writer);
    std::fs::read(&path).unwrap()
}

/// Hostile traces made by hand like the ones cargo-fuzz found: mappings of
/// 2^26 pages (the most the ledger classifies page by page) whose
/// residency lists a few pages or none, blocks as large as the mapping,
/// many of them overlapping, freed after a malloc_trim; 200 snapshots each.
#[test]
fn huge_mappings_with_little_residency_are_read_in_bounded_time() {
    let heap = 0x7f00_0000_0000u64;
    let pages = 1u64 << 26;
    let event = |time, kind, addr, size| Event { time, kind: Some(kind), addr, size, usable: size + 8, ..Event::default() };
    let mut events: Vec<Event> = (0..2000u64).map(|i| event(10 + i, EventKind::Malloc, heap + 16 + i * 4096, pages * 4096 - 32)).collect();
    events.extend((0..1000u64).map(|i| event(5000 + i, EventKind::Free, heap + 16 + i * 4096, 0)));
    let mapping = |start: u64, residency: Residency| Mapping {
        start,
        end: start + pages * 4096,
        perms: "rw-p".into(),
        rss: 0x30000,
        anonymous: 0x30000,
        residency,
        ..Mapping::default()
    };
    let at = |i: u64| heap + i * (pages * 4096);
    for residency in [Residency::Bitmap(vec![0xff, 0x0f, 0x01]), Residency::None, Residency::Unknown] {
        let mappings = [mapping(at(0), residency.clone()), mapping(at(1), residency.clone()), mapping(at(2), residency)];
        within_bound(trace_of(&events, &mappings, 200));
    }
    // Claimed resident as a whole: each snapshot's page maps show a bounded
    // number of its pages, the rest are counted run by run.
    let mappings = [mapping(at(0), Residency::All), mapping(at(1), Residency::All), mapping(at(2), Residency::All)];
    within_bound(trace_of(&events, &mappings, 20));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn mutated_records_are_read_in_bounded_time(choices in proptest::collection::vec(any::<u8>(), 0..400)) {
        let base = base_trace();
        let mutated = mutate_trace(&base, &mut Choices::new(&choices)).expect("the base trace has a header");
        within_bound(mutated);
    }
}
