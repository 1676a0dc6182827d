//! For fuzzers: a structural mutation of a trace. The records of each chunk
//! are decoded, some are changed (a field of an event, a snapshot's mapping,
//! a NUMA placement, a page size), dropped or repeated, and the chunks are
//! framed again with right checksums, so that the mutations reach the
//! replay and the model instead of failing a checksum. The choices come from
//! a byte string (a fuzzer's input, or random bytes in a property test).

use crate::compact::{self, CompactState};
use crate::event::{self, DeltaState, Event, EventKind};
use crate::framing::{ChunkAt, FILE_HEADER_LEN, encode_chunk, read_chunk};
use crate::records::{CompactEventsPiece, EventsPiece, Record, Records, Residency};
use crate::varint::Cursor;

/// The fuzzer's choices, read one byte at a time (zeros once used up).
pub struct Choices<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Choices<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Choices { bytes, at: 0 }
    }

    fn byte(&mut self) -> u8 {
        let byte = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (usize::from(self.byte()) << 8 | usize::from(self.byte())) % n }
    }

    /// A value that breaks arithmetic, or one near `near`.
    fn value(&mut self, near: u64) -> u64 {
        let step = 4096u64.wrapping_mul(u64::from(self.byte()));
        match self.byte() % 12 {
            0 => 0,
            1 => 1,
            2 => 4095,
            3 => 4096,
            4 => (1 << 57) - 1 - u64::from(self.byte()),
            5 => u64::MAX,
            6 => u64::MAX / 2,
            7 => near.wrapping_sub(step),
            8 => near.wrapping_add(step),
            9 => near ^ (1 << (self.byte() % 64)),
            10 => near.wrapping_mul(2),
            _ => near,
        }
    }
}

/// `file` (a whole trace) with its records mutated as `choices` say, framed
/// again with right checksums; None when `file` has no readable header.
pub fn mutate_trace(file: &[u8], choices: &mut Choices) -> Option<Vec<u8>> {
    let header = file.get(..FILE_HEADER_LEN)?;
    crate::framing::FileHeader::decode(header).ok()?;
    let mut out = header.to_vec();
    let mut offset = FILE_HEADER_LEN;
    let mut framed = Vec::new();
    while let Ok(ChunkAt::Chunk { raw, next }) = read_chunk(file, offset) {
        offset = next;
        let mut mutated = Vec::with_capacity(raw.len());
        for record in Records::new(&raw).flatten() {
            mutate_record(record, choices, &mut mutated);
        }
        encode_chunk(&mutated, &mut framed);
        out.extend_from_slice(&framed);
    }
    Some(out)
}

/// Encodes `record`, changed, dropped or repeated, into `out`.
fn mutate_record(mut record: Record<'_>, choices: &mut Choices, out: &mut Vec<u8>) {
    match choices.byte() % 16 {
        0 => return,
        1 => record.encode(out),
        _ => {}
    }
    let mut events = match &record {
        Record::Events(piece) => decode_events(piece.records),
        Record::CompactEvents(piece) => decode_compact_events(piece.records),
        _ => Vec::new(),
    };
    match &mut record {
        Record::Events(_) | Record::CompactEvents(_) if !events.is_empty() => {
            let at = choices.below(events.len());
            mutate_event(&mut events[at], choices);
        }
        Record::Snapshot(snapshot) => {
            if choices.byte().is_multiple_of(4) {
                snapshot.page_size = choices.value(snapshot.page_size);
            }
            if !snapshot.mappings.is_empty() {
                let at = choices.below(snapshot.mappings.len());
                let mapping = &mut snapshot.mappings[at];
                match choices.byte() % 5 {
                    0 => mapping.start = choices.value(mapping.start),
                    1 => mapping.end = choices.value(mapping.end),
                    2 => {
                        mapping.residency =
                            [Residency::All, Residency::None, Residency::Unknown, Residency::Bitmap(vec![0xff; choices.below(4)])]
                                [choices.below(4)]
                            .clone()
                    }
                    3 => mapping.rss = choices.value(mapping.rss),
                    _ => mapping.name = ["[heap]", "", "[anon:memgap]", "[stack]"][choices.below(4)].into(),
                }
            }
        }
        Record::Placement(placement) => {
            if choices.byte().is_multiple_of(4) {
                placement.page_size = choices.value(placement.page_size);
            }
            if !placement.mappings.is_empty() {
                let at = choices.below(placement.mappings.len());
                let mapping = &mut placement.mappings[at];
                match choices.byte() % 3 {
                    0 => mapping.start = choices.value(mapping.start),
                    1 => mapping.pages = choices.value(mapping.pages),
                    _ => {
                        if !mapping.runs.is_empty() {
                            let run = choices.below(mapping.runs.len());
                            mapping.runs[run].1 = choices.value(mapping.runs[run].1);
                            mapping.runs[run].0 = i32::from(choices.byte() as i8 % 4);
                        }
                    }
                }
            }
        }
        Record::Process(process) => process.page_size = choices.value(process.page_size),
        _ => {}
    }
    if let Record::Events(piece) = &record {
        let bytes = event::encode_all(&events);
        Record::Events(EventsPiece { records: &bytes, ..*piece }).encode(out);
    } else if let Record::CompactEvents(piece) = &record {
        // In the piece's own layout: columns as the recorder writes them, or rows as format 3 did.
        let (mut state, mut bytes) = (CompactState::default(), Vec::new());
        if compact::in_columns(piece.records) {
            compact::encode_piece(&mut state, &mut bytes, events.iter().map(|event| (event, None)));
        } else {
            for event in &events {
                compact::encode(&mut state, &mut bytes, event, None);
            }
        }
        Record::CompactEvents(CompactEventsPiece { records: &bytes, ..*piece }).encode(out);
    } else {
        record.encode(out);
    }
}

/// The events of one piece, up to the first that does not decode (stack
/// definitions are left out: the stacks become unknown).
fn decode_events(bytes: &[u8]) -> Vec<Event> {
    let mut state = DeltaState::default();
    let mut cursor = Cursor::new(bytes);
    let mut events = Vec::new();
    while !cursor.is_empty() {
        match event::decode(&mut state, &mut cursor) {
            Ok(event) => events.push(event),
            Err(_) => break,
        }
    }
    events
}

/// [`decode_events`] for a piece in the recorder's encoding.
fn decode_compact_events(bytes: &[u8]) -> Vec<Event> {
    let (mut state, mut cursor, mut frames) = (CompactState::default(), Cursor::new(bytes), Vec::new());
    let mut events = Vec::new();
    while !cursor.is_empty() {
        let mut event = Event::default();
        match compact::decode_into(&mut state, &mut cursor, &mut frames, &mut event) {
            Ok(_) => events.push(event),
            Err(_) => break,
        }
    }
    events
}

fn mutate_event(event: &mut Event, choices: &mut Choices) {
    match choices.byte() % 6 {
        0 => event.addr = choices.value(event.addr),
        1 => event.size = choices.value(event.size),
        2 => event.usable = choices.value(event.usable),
        3 => event.kind = EventKind::from_u8(choices.byte() % 16).or(event.kind),
        4 => event.old_addr = choices.value(event.old_addr),
        _ => event.time = choices.value(event.time),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceWriter;
    use crate::records::Process;

    #[test]
    fn no_choices_keep_the_trace_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mgt");
        let bytes =
            event::encode_all(&[Event { time: 1, kind: Some(EventKind::Malloc), addr: 0x1000, size: 16, usable: 24, ..Event::default() }]);
        let mut writer = TraceWriter::create(&path, 1).unwrap();
        writer
            .write(&[
                Record::Process(Process { pid: 1, page_size: 4096, ..Process::default() }),
                Record::Events(EventsPiece { thread: 1, tid: 1, buffer: 0, offset: 0, records: &bytes }),
            ])
            .unwrap();
        drop(writer);
        let file = std::fs::read(&path).unwrap();
        let mutated = mutate_trace(&file, &mut Choices::new(&[])).unwrap();
        let ChunkAt::Chunk { raw, .. } = read_chunk(&mutated, FILE_HEADER_LEN).unwrap() else { panic!("no chunk") };
        assert!(raw.is_empty(), "zero choices drop every record");
        // Any choices: chunks that pass their checksums, records that decode.
        for seed in 0..200u32 {
            let choices: Vec<u8> = (0..64).map(|i| (seed.wrapping_mul(2654435761).rotate_left(i) >> 3) as u8).collect();
            let mutated = mutate_trace(&file, &mut Choices::new(&choices)).unwrap();
            let ChunkAt::Chunk { raw, next } = read_chunk(&mutated, FILE_HEADER_LEN).unwrap() else { panic!("no chunk") };
            assert_eq!(next, mutated.len());
            assert!(Records::new(&raw).all(|r| r.is_ok()));
        }
    }
}
