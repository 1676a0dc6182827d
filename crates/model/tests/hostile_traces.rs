//! Hostile traces: well-framed chunks (right magic, right checksum) whose
//! records carry arbitrary values — impossible page sizes, mappings as
//! large as the address space, events with any kind, address and size,
//! garbage event bytes. Every reader of a trace (summary, ledger, timeline,
//! blame, report) must return a result or an error, never panic, and never
//! allocate by a length it was handed.

use memgap_model::{At, BlameOptions, BlameOrder, Summary, blame, closing, ledger_at, report, timeline};
use memgap_trace::TraceWriter;
use memgap_trace::event::{Event, EventKind, encode_all};
use memgap_trace::records::{
    Clock, End, EndReason, EventsPiece, Exit, Mapping, Metrics, Module, Process, Record, RecordingCost, Residency, Rss, Snapshot,
    SnapshotReason, Thread,
};
use proptest::prelude::*;

/// Values that break arithmetic: zero, one, page-ish, huge, the maximum.
fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(4096),
        Just(1 << 21),
        Just(1 << 40),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        0u64..1 << 16,
        any::<u64>()
    ]
}

fn address() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0x1000u64..0x10_0000, Just(0x5555_0000_0000), Just(u64::MAX - 4095), any::<u64>()]
}

fn event() -> impl Strategy<Value = Event> {
    (0u8..15, address(), hostile_u64(), hostile_u64(), address(), hostile_u64(), 0u64..1 << 40).prop_map(
        |(kind, addr, size, usable, old_addr, extra, time)| {
            let kind = EventKind::from_u8(kind).unwrap_or(EventKind::Malloc);
            Event { time, kind: Some(kind), cpu: 0, addr, size, usable, old_addr, extra, stack: 0 }
        },
    )
}

fn mapping() -> impl Strategy<Value = Mapping> {
    let perms = prop_oneof![Just("rw-p"), Just("r--p"), Just("---p"), Just("rw-s"), Just("")];
    let name = prop_oneof![Just(""), Just("[heap]"), Just("[stack]"), Just("[anon:memgap]"), Just("/usr/lib/libc.so.6")];
    let length = prop_oneof![Just(0u64), Just(4096), Just(1 << 20), Just(64 << 20), Just(1 << 40), Just(u64::MAX)];
    let residency = prop_oneof![
        Just(Residency::Unknown),
        Just(Residency::All),
        Just(Residency::None),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Residency::Bitmap)
    ];
    (address(), length, perms, name, hostile_u64(), hostile_u64(), residency).prop_map(
        |(start, length, perms, name, rss, anonymous, residency)| Mapping {
            start,
            end: start.saturating_add(length),
            perms: perms.into(),
            name: name.into(),
            rss,
            anonymous,
            residency,
            ..Mapping::default()
        },
    )
}

#[derive(Debug, Clone)]
enum Item {
    Events { thread: u32, buffer: u32, bytes: Vec<u8> },
    Record(Record<'static>),
}

fn item() -> impl Strategy<Value = Item> {
    let page_size = prop_oneof![Just(0u64), Just(1), Just(4096), Just(65536), Just(1 << 40), Just(u64::MAX)];
    prop_oneof![
        // Events the encoder made from any values…
        (0u32..3, 0u32..3, proptest::collection::vec(event(), 0..40)).prop_map(|(thread, buffer, events)| Item::Events {
            thread,
            buffer,
            bytes: encode_all(&events)
        }),
        // …and bytes no encoder made.
        (0u32..3, 0u32..3, proptest::collection::vec(any::<u8>(), 0..200)).prop_map(|(thread, buffer, bytes)| Item::Events {
            thread,
            buffer,
            bytes
        }),
        (page_size.clone(), 0u8..3, hostile_u64(), hostile_u64()).prop_map(|(page_size, clock, start_time, start_monotonic_ns)| {
            Item::Record(Record::Process(Process {
                pid: 7,
                page_size,
                clock,
                start_time,
                start_monotonic_ns,
                exe: "/bin/x".into(),
                argv: vec!["x".into()],
                ..Process::default()
            }))
        }),
        (hostile_u64(), hostile_u64()).prop_map(|(time, monotonic_ns)| Item::Record(Record::Clock(Clock { time, monotonic_ns }))),
        (hostile_u64(), hostile_u64(), hostile_u64()).prop_map(|(time, vm_rss, rss_anon)| Item::Record(Record::Rss(Rss {
            time,
            vm_rss: vm_rss % (1 << 58),
            rss_anon,
            rss_file: 0,
            rss_shmem: 0
        }))),
        (
            hostile_u64(),
            page_size,
            proptest::collection::vec(mapping(), 0..6),
            proptest::collection::vec((address(), hostile_u64()), 0..3),
            0u8..5,
            any::<bool>()
        )
            .prop_map(|(time, page_size, mut mappings, agent_ranges, reason, tidy)| {
                if tidy {
                    // As smaps would show them (the decoder refuses others):
                    // in order, apart, within the address space, figures
                    // within the size. The values inside stay hostile.
                    mappings.sort_by_key(|m| m.start);
                    let mut end = 0;
                    mappings.retain_mut(|m| {
                        m.end = m.end.min(1 << 57);
                        let keep = m.start >= end && m.end >= m.start;
                        if keep {
                            end = m.end;
                            let size = m.end - m.start;
                            m.rss = m.rss.min(size);
                            m.anonymous = m.anonymous.min(size);
                        }
                        keep
                    });
                }
                let reason = [
                    SnapshotReason::Periodic,
                    SnapshotReason::RssPeak,
                    SnapshotReason::Exit,
                    SnapshotReason::Requested,
                    SnapshotReason::Program,
                ][reason as usize];
                let rss = Rss { time, vm_rss: page_size % (1 << 58), ..Rss::default() };
                Item::Record(Record::Snapshot(Snapshot {
                    time,
                    reason,
                    rss,
                    vm_rss_after: 1 << 20,
                    page_size,
                    mappings,
                    agent_ranges,
                    cost_ns: 0,
                }))
            }),
        (0u32..4, any::<u32>(), address()).prop_map(|(thread, tid, stack_hint)| Item::Record(Record::Thread(Thread {
            thread,
            tid,
            stack_hint
        }))),
        (address(), hostile_u64()).prop_map(|(base, size)| Item::Record(Record::Modules(vec![Module {
            path: "/usr/lib/libc.so.6".into(),
            base,
            size,
            build_id: vec![1, 2]
        }]))),
        (hostile_u64(), hostile_u64(), any::<Option<i32>>()).prop_map(|(time, dropped_events, exit_code)| Item::Record(Record::End(End {
            time,
            reason: EndReason::Exit,
            dropped_events,
            vm_hwm: 0,
            exit_code
        }))),
        (any::<i32>(), any::<i32>(), any::<Option<(u64, u64)>>()).prop_map(|(exit_code, signal, cost)| {
            let cost = cost.map(|(program_cpu_ns, recorder_cpu_ns)| RecordingCost { program_cpu_ns, recorder_cpu_ns });
            Item::Record(Record::Exit(Exit { exit_code, signal, cost }))
        }),
        (hostile_u64(), any::<f64>()).prop_map(|(monotonic_ns, value)| Item::Record(Record::Metrics(Metrics {
            monotonic_ns,
            source: "go".into(),
            kind: "sample".into(),
            values: vec![("x".into(), value)]
        }))),
    ]
}

/// Writes the items as a trace, a few per chunk, and reads it every way memgap can.
fn read_every_way(items: &[Item], per_chunk: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgt");
    let mut writer = TraceWriter::create(&path, 1).unwrap();
    let mut offsets = std::collections::HashMap::new();
    for chunk in items.chunks(per_chunk.max(1)) {
        let records: Vec<Record<'_>> = chunk
            .iter()
            .map(|item| match item {
                Item::Record(record) => record.clone(),
                Item::Events { thread, buffer, bytes } => {
                    let offset = offsets.entry((*thread, *buffer)).or_insert(0u32);
                    let piece = Record::Events(EventsPiece {
                        thread: *thread,
                        tid: 100 + thread,
                        buffer: *buffer,
                        offset: *offset,
                        records: bytes,
                    });
                    *offset += bytes.len() as u32;
                    piece
                }
            })
            .collect();
        writer.write(&records).unwrap();
    }
    drop(writer);
    let _ = Summary::of_trace(&path);
    for at in [At::Gap, At::Peak, At::End, At::Seconds(0.5)] {
        let _ = ledger_at(&path, at, true);
    }
    let _ = timeline(&path);
    let options = BlameOptions {
        at: At::Peak,
        order: BlameOrder::Fragmentation,
        top: 10,
        per_stack: false,
        skip: Vec::new(),
        temporary_ms: memgap_model::blame::DEFAULT_TEMPORARY_MS,
        full_names: false,
    };
    let _ = blame(&path, &options);
    let report = report::report(&path, At::Gap);
    // `memgap run`'s single replay gives the report's summary (both count
    // from a live set that munmap and mmap also change) and the ledger
    // at the default moment.
    if let (Ok(Some(report)), Ok(ledger)) = (report, ledger_at(&path, At::Gap, false)) {
        let closing = closing(&path).expect("the other passes read the trace");
        assert_eq!(json(&closing.summary), json(&report.summary));
        assert_eq!(closing.moment.map(|l| json(&l)), ledger.map(|l| json(&l)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn hostile_records_never_panic(items in proptest::collection::vec(item(), 0..24), per_chunk in 1usize..6) {
        read_every_way(&items, per_chunk);
    }
}

/// The worst page size and mapping a snapshot can claim, together: the
/// ledger must not allocate one entry per claimed page.
#[test]
fn a_snapshot_claiming_the_whole_address_space_is_read_in_bounded_memory() {
    let process = Item::Record(Record::Process(Process { pid: 1, page_size: 1, exe: "/x".into(), ..Process::default() }));
    let heap = Mapping {
        start: 0x1000,
        end: u64::MAX - 4095,
        perms: "rw-p".into(),
        name: "[heap]".into(),
        residency: Residency::All,
        ..Mapping::default()
    };
    let events = Item::Events {
        thread: 1,
        buffer: 0,
        bytes: encode_all(&[Event {
            time: 1,
            kind: Some(EventKind::Malloc),
            addr: 0x2000,
            size: 1 << 40,
            usable: 1 << 40,
            ..Event::default()
        }]),
    };
    for page_size in [0, 1, 4096] {
        let snapshot = Snapshot { time: 2, reason: SnapshotReason::Exit, page_size, mappings: vec![heap.clone()], ..Snapshot::default() };
        read_every_way(&[process.clone(), events.clone(), Item::Record(Record::Snapshot(snapshot))], 3);
    }
}

/// A mapping as large as the user address space, which smaps can show (a
/// sanitizer's shadow memory, a runtime's reservation): counted whole, in
/// bounded time and memory, and the ledger still comes out.
#[test]
fn a_mapping_of_128_tib_is_counted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgt");
    let mut writer = TraceWriter::create(&path, 1).unwrap();
    let process = Record::Process(Process { pid: 1, page_size: 4096, exe: "/x".into(), ..Process::default() });
    let heap = Mapping {
        start: 0x1000,
        end: 1 << 47,
        perms: "rw-p".into(),
        name: "[heap]".into(),
        rss: 8192,
        anonymous: 8192,
        residency: Residency::All,
        ..Mapping::default()
    };
    let rss = Rss { time: 2, vm_rss: 8192, ..Rss::default() };
    let snapshot = Record::Snapshot(Snapshot {
        time: 2,
        reason: SnapshotReason::Exit,
        rss,
        vm_rss_after: 8192,
        page_size: 4096,
        mappings: vec![heap],
        ..Snapshot::default()
    });
    writer.write(&[process, snapshot]).unwrap();
    drop(writer);
    let ledger = ledger_at(&path, At::End, true).unwrap().expect("a ledger");
    assert_eq!(ledger.rss_bytes, 8192);
    assert_eq!(ledger.mappings.len(), 1);
    assert_eq!(ledger.mappings[0].class.as_str(), "other");
}

/// Compared as JSON: the types hold floats, and a NaN from hostile values
/// must compare equal to itself.
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("serializable")
}
