//! The structural fuzzer: a trace shaped like a real one has its decoded
//! records mutated as the input says (memgap_trace::mutate) and its chunks
//! framed again with right checksums, so that every mutation reaches the
//! replay and the model; then every command's model path reads it. Run with
//! a per-input timeout (`-timeout=10`): a reader that spins is a finding.
//! `crates/model/tests/structural_fuzz.rs` runs the same under `cargo test`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use memgap_model::numa::NumaOptions;
use memgap_model::blame::DEFAULT_TEMPORARY_MS;
use memgap_model::{At, BlameOptions, BlameOrder};
use memgap_trace::TraceWriter;
use memgap_trace::event::{Event, EventKind, encode_all};
use memgap_trace::mutate::{Choices, mutate_trace};
use memgap_trace::numa::{MappingPlacement, NumaNode, Placement, Topology};
use memgap_trace::records::{EventsPiece, Mapping, Process, Record, Residency, Rss, Snapshot, SnapshotReason};

const HEAP: (u64, u64) = (0x55_0000_0000, 0x55_0004_0000);

/// Inputs are written in a private directory: a name in /tmp could be planted.
fn private_dir() -> &'static std::path::Path {
    static DIR: OnceLock<memgap_trace::files::PrivateDir> = OnceLock::new();
    DIR.get_or_init(|| memgap_trace::files::PrivateDir::in_temp_without_spaces("memgap-fuzz-").expect("a private temporary directory")).path()
}

fn base_trace() -> Vec<u8> {
    let path = private_dir().join("base.mgt");
    let mut writer = TraceWriter::create(&path, 1).expect("a temporary file");
    let event = |time: u64, kind, addr, size, old_addr| Event { time, kind: Some(kind), cpu: (time % 2) as u32, addr, size, usable: size + 8, old_addr, stack: (time % 3) as u32, ..Event::default() };
    let mut events: Vec<Event> = (0..64u64).map(|i| event(10 + i, EventKind::Malloc, HEAP.0 + i * 0x1000 + 16, 100 + i * 40, 0)).collect();
    events.extend((0..64u64).step_by(3).map(|i| event(100 + i, EventKind::Free, HEAP.0 + i * 0x1000 + 16, 0, 0)));
    events.push(event(200, EventKind::Realloc, HEAP.0 + 0x30000, 9000, HEAP.0 + 0x1000 + 16));
    let bytes = encode_all(&events);
    let snapshot = |time, reason| {
        let mapping = Mapping { start: HEAP.0, end: HEAP.1, perms: "rw-p".into(), name: "[heap]".into(), rss: 0x30000, anonymous: 0x30000, residency: Residency::Bitmap(vec![0xff, 0xf7, 0xff, 0x3f, 0xff, 0, 0, 0]), ..Mapping::default() };
        Snapshot { time, reason, rss: Rss { time, vm_rss: 0x40000, ..Rss::default() }, vm_rss_after: 0x40000, page_size: 4096, mappings: vec![mapping], ..Snapshot::default() }
    };
    let node = |id, cpu, distances| NumaNode { id, cpus: vec![cpu], memory_bytes: 1 << 30, distances };
    let topology = Topology { nodes: vec![node(0, 0, vec![10, 21]), node(1, 1, vec![21, 10])] };
    let placement = Placement { time: 150, page_size: 4096, stride: 1, mappings: vec![MappingPlacement { start: HEAP.0, pages: 64, runs: vec![(0, 20), (-14, 4), (1, 40)] }], ..Placement::default() };
    let half = bytes.len() / 2;
    let written = writer
        .write(&[Record::Process(Process { pid: 7, page_size: 4096, exe: "/x".into(), argv: vec!["x".into()], ..Process::default() }), Record::Topology(topology)])
        .and_then(|()| writer.write(&[Record::Events(EventsPiece { thread: 1, tid: 7, buffer: 0, offset: 0, records: &bytes[..half] })]))
        .and_then(|()| writer.write(&[Record::Snapshot(snapshot(150, SnapshotReason::RssPeak)), Record::Placement(placement)]))
        .and_then(|()| writer.write(&[Record::Events(EventsPiece { thread: 1, tid: 7, buffer: 0, offset: half as u32, records: &bytes[half..] })]))
        .and_then(|()| writer.write(&[Record::Snapshot(snapshot(300, SnapshotReason::Exit))]));
    written.expect("write the base trace");
    drop(writer);
    let file = std::fs::read(&path).expect("read the base trace");
    let _ = std::fs::remove_file(&path);
    file
}

fuzz_target!(|choices: &[u8]| {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    let base = BASE.get_or_init(base_trace);
    let Some(file) = mutate_trace(base, &mut Choices::new(choices)) else { return };
    let path = private_dir().join("input.mgt");
    std::fs::write(&path, &file).expect("write the input to a temporary file");
    let _ = memgap_model::Summary::of_trace(&path);
    for at in [At::Gap, At::Peak, At::End, At::Seconds(0.0)] {
        let _ = memgap_model::ledger_at(&path, at, true);
    }
    let _ = memgap_model::timeline(&path);
    for order in [BlameOrder::Fragmentation, BlameOrder::Live, BlameOrder::Leaked, BlameOrder::Allocated, BlameOrder::Temporary] {
        let _ = memgap_model::blame(&path, &BlameOptions { at: At::Peak, order, top: 10, per_stack: true, skip: Vec::new(), temporary_ms: DEFAULT_TEMPORARY_MS, full_names: false });
    }
    let _ = memgap_model::report::report(&path, At::Gap);
    let _ = memgap_model::numa::numa(&path, &NumaOptions { at: At::Peak, machine_topology: None, top: 10 });
});
