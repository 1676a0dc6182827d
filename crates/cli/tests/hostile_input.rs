//! Readers that always finish: traces whose chunks are well framed (right
//! magic, right checksums) but whose records lie, and files that are not
//! traces at all (devices, FIFOs, a huge sparse file). Every command must
//! answer or refuse in one line, in bounded time; a command still running
//! after the bound is killed and the test fails.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use memgap_trace::TraceWriter;
use memgap_trace::event::{Event, EventKind, encode_all};
use memgap_trace::numa::{MappingPlacement, NumaNode, Placement, Topology};
use memgap_trace::records::{EventsPiece, Mapping, Process, Record, Residency, Rss, Snapshot, SnapshotReason};

/// Far above what any of these inputs needs (milliseconds), far below a hang.
const BOUND: Duration = Duration::from_secs(30);

/// Runs memgap with a deadline; kills it and fails past the deadline.
fn memgap_within_bound(dir: &Path, args: &[&str]) -> Output {
    let mut child = memgap_cmd(dir, args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start memgap");
    let stdout = read_in_background(child.stdout.take().unwrap());
    let stderr = read_in_background(child.stderr.take().unwrap());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() };
        }
        if started.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("memgap {} did not finish within {BOUND:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn malloc(time: u64, addr: u64, size: u64) -> Event {
    Event { time, kind: Some(EventKind::Malloc), addr, size, usable: size, ..Event::default() }
}

fn write_trace(path: &Path, events: &[Event], snapshot: Snapshot, extra: Vec<Record<'_>>) {
    let mut writer = TraceWriter::create(path, 1).unwrap();
    let bytes = encode_all(events);
    let mut records = vec![
        Record::Process(Process { pid: 4242, page_size: 4096, exe: "/x".into(), argv: vec!["x".into()], ..Process::default() }),
        Record::Events(EventsPiece { thread: 1, tid: 4242, buffer: 0, offset: 0, records: &bytes }),
        Record::Snapshot(snapshot),
    ];
    records.extend(extra);
    writer.write(&records).unwrap();
}

fn heap_snapshot(start: u64, end: u64) -> Snapshot {
    let rss = Rss { time: 100, vm_rss: end - start, rss_anon: end - start, ..Rss::default() };
    let heap = Mapping {
        start,
        end,
        perms: "rw-p".into(),
        name: "[heap]".into(),
        rss: end - start,
        anonymous: end - start,
        residency: Residency::All,
        ..Mapping::default()
    };
    Snapshot {
        time: 100,
        reason: SnapshotReason::Exit,
        rss,
        vm_rss_after: end - start,
        page_size: 4096,
        mappings: vec![heap],
        ..Snapshot::default()
    }
}

/// Every command that reads a trace, as a user would run it.
fn every_reader(dir: &Path, trace: &str) {
    let commands: [&[&str]; 10] = [
        &["summary", trace],
        &["ledger", trace, "--json"],
        &["ledger", trace, "--at", "end", "--mappings"],
        &["map", trace, "--color", "never"],
        &["blame", trace, "--json", "--per-stack"],
        &["timeline", trace, "--json"],
        &["report", trace, "-o", "r.html"],
        &["export", trace, "--pprof", "p.pb.gz", "--folded", "f.txt"],
        &["flamegraph", trace, "-o", "f.svg"],
        &["numa", trace, "--json"],
    ];
    for args in commands {
        let out = memgap_within_bound(dir, args);
        // An answer, or one line saying why not; never a crash.
        if !out.status.success() {
            let line = assert_one_line_failure(&out);
            assert!(line.starts_with("memgap: "), "{}: {line}", args.join(" "));
        }
    }
}

/// Blocks that overlap (impossible in a real run) sorted so that one lying
/// wholly below the heap is taken for one of the heap's: its page range,
/// computed from the heap's start, wrapped to 2^52 pages.
#[test]
fn a_block_below_its_mapping() {
    let (_tmp, dir) = tempdir();
    let (start, end) = (0x40000, 0x50000);
    // In address order: three blocks reaching into the heap, one wholly
    // below it, one inside. The binary search for the heap's first block
    // lands on the first of them, so the one below comes with it.
    let events = [
        malloc(1, 0x1000, 0x47000),
        malloc(2, 0x1800, 0x3f800),
        malloc(3, 0x1c00, 0x40400),
        malloc(4, 0x2000, 0x10),
        malloc(5, 0x44000, 0x100),
    ];
    let mut snapshot = heap_snapshot(start, end);
    // Residency as mincore gives it: one bit per page of the mapping.
    snapshot.mappings[0].residency = Residency::Bitmap(vec![0xff, 0xff]);
    write_trace(&dir.join("t.mgt"), &events, snapshot, Vec::new());
    every_reader(&dir, "t.mgt");
}

/// A block whose size is near the 57-bit limit of addresses, on a machine
/// with NUMA placement: walked page by page, 2^45 steps.
#[test]
fn a_block_of_2_to_the_57_bytes_with_numa_placement() {
    let (_tmp, dir) = tempdir();
    let (start, end) = (0x40000, 0x80000);
    let events = [malloc(1, 0x40000, (1 << 57) - 0x40000 - 1), malloc(2, 0x41000, 64)];
    let topology = Topology {
        nodes: vec![
            NumaNode { id: 0, cpus: vec![0], memory_bytes: 1 << 30, distances: vec![10, 21] },
            NumaNode { id: 1, cpus: vec![1], memory_bytes: 1 << 30, distances: vec![21, 10] },
        ],
    };
    let placement = Placement {
        time: 100,
        page_size: 4096,
        stride: 1,
        mappings: vec![MappingPlacement { start, pages: 64, runs: vec![(0, 32), (1, 32)] }],
        ..Placement::default()
    };
    write_trace(&dir.join("t.mgt"), &events, heap_snapshot(start, end), vec![Record::Topology(topology), Record::Placement(placement)]);
    every_reader(&dir, "t.mgt");
    let out = memgap_within_bound(&dir, &["numa", "t.mgt", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Not traces: a FIFO nobody writes to, devices that never end, a 4 GiB
/// sparse file. One line each, at once, without reading them whole.
#[test]
fn files_that_are_not_traces() {
    let (_tmp, dir) = tempdir();
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let sparse = dir.join("sparse");
    std::fs::File::create(&sparse).unwrap().set_len(4 << 30).unwrap();
    for input in [arg(&fifo), "/dev/zero", "/dev/urandom", "/dev/null", arg(&sparse)] {
        for args in
            [vec!["summary", input], vec!["ledger", input], vec!["report", input, "-o", "r.html"], vec!["ghc", input], vec!["numa", input]]
        {
            let out = memgap_within_bound(&dir, &args);
            let line = assert_one_line_failure(&out);
            assert!(!line.contains("is empty") || input == "/dev/null", "{}: {line}", args.join(" "));
            if input != arg(&sparse) {
                assert!(line.contains("not a regular file"), "{}: {line}", args.join(" "));
            }
        }
    }
    // The sparse file was refused by its first bytes, not read whole: no
    // child of this test ever grew near its size.
    let out = memgap_within_bound(&dir, &["ghc", arg(&sparse)]);
    assert!(text(&out.stderr).contains("not a GHC eventlog"), "{}", text(&out.stderr));
    // SAFETY: rusage is plain data, valid all zero.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is ours to write.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) }, 0);
    assert!(usage.ru_maxrss < 512 * 1024, "a child peaked at {} KiB", usage.ru_maxrss);
}
