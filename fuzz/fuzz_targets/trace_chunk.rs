//! The inside of one chunk (after its checksum passed): records, and the
//! per-thread event encodings inside EVENTS records (the agent's) and
//! COMPACT_EVENTS records (the recorder's). In memory, so fast.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memgap_trace::compact::{self, CompactState};
use memgap_trace::event::{DeltaState, Event, decode_with_stack};
use memgap_trace::records::{Record, Records};
use memgap_trace::varint::Cursor;

fuzz_target!(|raw: &[u8]| {
    for record in Records::new(raw) {
        match record {
            Ok(Record::Events(piece)) => {
                let mut cursor = Cursor::new(piece.records);
                let mut state = DeltaState::default();
                let mut frames = Vec::new();
                while !cursor.is_empty() && decode_with_stack(&mut state, &mut cursor, &mut frames).is_ok() {}
            }
            Ok(Record::CompactEvents(piece)) => decode_compact(piece.records),
            _ => {}
        }
    }
    // The same bytes as one thread's event buffer.
    let mut cursor = Cursor::new(raw);
    let mut state = DeltaState::default();
    let mut frames = Vec::new();
    while !cursor.is_empty() && decode_with_stack(&mut state, &mut cursor, &mut frames).is_ok() {}
    decode_compact(raw);
});

fn decode_compact(bytes: &[u8]) {
    let (mut state, mut cursor, mut frames) = (CompactState::default(), Cursor::new(bytes), Vec::new());
    while !cursor.is_empty() && compact::decode_into(&mut state, &mut cursor, &mut frames, &mut Event::default()).is_ok() {}
}
