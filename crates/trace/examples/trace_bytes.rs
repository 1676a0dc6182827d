//! Where a trace's bytes go: per record tag, per stream of the heap events'
//! pieces, and per event field (each field made constant in turn, the
//! events re-encoded and compressed as the recorder does; what a field
//! costs is what the trace saves without it), and what a compression
//! context reaching across chunks would save.
//!
//! `cargo run --release -p memgap-trace --example trace_bytes -- T.mgt [zstd level]`

use std::collections::BTreeMap;

use memgap_trace::compact::{self, CompactState};
use memgap_trace::records::{Record, Records};
use memgap_trace::varint::Cursor;
use memgap_trace::{Event, EventKind, TraceFile};

/// One piece's events, each with the frames of the stack it defines.
type Piece = Vec<(Event, Option<Vec<u64>>)>;

const STREAMS: [&str; 7] = ["times", "references", "addresses", "sizes", "others", "stacks", "headers"];

fn zstd_len(bytes: &[u8], level: i32) -> usize {
    zstd::bulk::compress(bytes, level).expect("zstd compresses").len()
}

/// A piece in columns split into its streams (None: a piece in rows).
fn streams(records: &[u8]) -> Option<Vec<&[u8]>> {
    let mut cursor = Cursor::new(records.strip_prefix(&[0])?);
    let lengths: Vec<usize> = (0..STREAMS.len() - 1).map(|_| cursor.varint().map(|l| l as usize)).collect::<Result<_, _>>().ok()?;
    let mut rest = cursor.rest();
    let mut out = Vec::new();
    for length in lengths {
        let (stream, after) = rest.split_at_checked(length)?;
        out.push(stream);
        rest = after;
    }
    out.push(rest);
    Some(out)
}

fn decode(records: &[u8]) -> Piece {
    let (mut state, mut cursor, mut frames) = (CompactState::default(), Cursor::new(records), Vec::new());
    let mut decoded = Vec::new();
    while !cursor.is_empty() {
        let mut event = Event::default();
        let defines = compact::decode_into(&mut state, &mut cursor, &mut frames, &mut event).expect("the trace's events decode");
        decoded.push((event, defines.then(|| frames.clone())));
    }
    decoded
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: trace_bytes TRACE [LEVEL]");
    let level: i32 = args.next().map_or(1, |l| l.parse().expect("a zstd level"));
    let trace = TraceFile::open(path.as_ref()).expect("the trace opens");
    let (mut by_tag, mut by_stream) = (BTreeMap::<String, (usize, usize)>::new(), [(0usize, 0usize); STREAMS.len()]);
    let mut chunks: Vec<Vec<Piece>> = Vec::new();
    let mut raw_chunks: Vec<Vec<u8>> = Vec::new();
    trace
        .for_each_chunk(|_, chunk| {
            raw_chunks.push(chunk.to_vec());
            let mut per_tag = BTreeMap::<String, Vec<u8>>::new();
            let mut per_stream: [Vec<u8>; STREAMS.len()] = Default::default();
            let mut pieces = Vec::new();
            for record in Records::new(chunk).flatten() {
                let name = format!("{record:?}").split(['(', ' ', '{']).next().unwrap_or_default().to_string();
                let bytes = per_tag.entry(name).or_default();
                if let Record::CompactEvents(piece) = &record {
                    pieces.push(decode(piece.records));
                    bytes.extend_from_slice(piece.records);
                    for (i, stream) in streams(piece.records).into_iter().flatten().enumerate() {
                        per_stream[i].extend_from_slice(stream);
                    }
                } else {
                    record.encode(bytes);
                }
            }
            for (name, bytes) in per_tag {
                let sizes = by_tag.entry(name).or_default();
                (sizes.0, sizes.1) = (sizes.0 + bytes.len(), sizes.1 + zstd_len(&bytes, level));
            }
            for (sizes, bytes) in by_stream.iter_mut().zip(&per_stream) {
                (sizes.0, sizes.1) = (sizes.0 + bytes.len(), sizes.1 + zstd_len(bytes, level));
            }
            chunks.push(pieces);
            Ok(())
        })
        .expect("the trace reads");
    let events = chunks.iter().flatten().map(Vec::len).sum::<usize>().max(1) as f64;
    println!("{path}: {} bytes, {events} events, {:.3} B/event", trace.len(), trace.len() as f64 / events);
    println!("records by tag, each tag's bytes of a chunk compressed together (zstd {level}), B/event:");
    for (name, (raw, compressed)) in &by_tag {
        println!("  {name:<16} raw {:>7.3}  compressed {:>7.3}", *raw as f64 / events, *compressed as f64 / events);
    }
    println!("streams of the pieces in columns, each stream of a chunk compressed together, B/event:");
    for (name, (raw, compressed)) in STREAMS.iter().zip(by_stream) {
        println!("  {name:<16} raw {:>7.3}  compressed {:>7.3}", raw as f64 / events, compressed as f64 / events);
    }
    fields(&chunks, level, events);
    across_chunks(&raw_chunks, level, events);
}

/// Each chunk is compressed on its own, so any chunk reads back alone. One
/// zstd stream over all of them, flushed after each, keeps its history from
/// chunk to chunk: the most a context shared across chunks could save.
fn across_chunks(raw_chunks: &[Vec<u8>], level: i32, events: f64) {
    use std::io::Write;
    let alone: usize = raw_chunks.iter().map(|raw| zstd_len(raw, level)).sum();
    let mut stream = zstd::stream::Encoder::new(Vec::new(), level).expect("a zstd stream");
    stream.set_parameter(zstd::zstd_safe::CParameter::WindowLog(23)).expect("an 8 MiB window");
    for raw in raw_chunks {
        stream.write_all(raw).expect("zstd compresses");
        stream.flush().expect("zstd flushes");
    }
    let streamed = stream.finish().expect("zstd finishes").len();
    println!("the chunks (zstd {level}), B/event:");
    println!("  each on its own  {:.3}", alone as f64 / events);
    println!("  one stream       {:.3}  (flushed after each chunk, 8 MiB window)", streamed as f64 / events);
}

/// What each field costs: the pieces re-encoded without it, compressed per chunk.
fn fields(chunks: &[Vec<Piece>], level: i32, events: f64) {
    type Change = fn(&mut Event);
    let variants: [(&str, Change); 8] = [
        ("as recorded", |_| {}),
        ("time", |e| e.time = 0),
        ("cpu", |e| e.cpu = 0),
        ("stack", |e| e.stack = 0),
        ("size", |e| (e.size, e.usable) = (0, 24)),
        ("usable", |e| e.usable = (e.size.wrapping_add(23) & !15).max(32) - 8),
        ("address", |e| (e.addr, e.old_addr) = (0, 0)),
        ("kind", |e| {
            if e.kind == Some(EventKind::Free) {
                (e.kind, e.size, e.usable) = (Some(EventKind::Malloc), 0, 24);
            }
        }),
    ];
    println!("events re-encoded with one field constant (zstd {level}), B/event:");
    let mut recorded = 0.0;
    for (name, change) in variants {
        let (mut state, mut compressed) = (CompactState::default(), 0);
        for pieces in chunks {
            let mut out = Vec::new();
            for piece in pieces.iter().filter(|p| !p.is_empty()) {
                let changed: Vec<(Event, Option<&[u64]>)> = piece
                    .iter()
                    .map(|(event, frames)| {
                        let mut event = *event;
                        change(&mut event);
                        (event, frames.as_deref().filter(|_| event.stack != 0))
                    })
                    .collect();
                compact::encode_piece(&mut state, &mut out, changed.iter().map(|(e, f)| (e, *f)));
            }
            compressed += zstd_len(&out, level);
        }
        let per_event = compressed as f64 / events;
        if name == "as recorded" {
            recorded = per_event;
            println!("  {name:<16} {per_event:.3}");
        } else {
            println!("  without {name:<8} {per_event:.3}  (the field costs {:.3})", recorded - per_event);
        }
    }
}
