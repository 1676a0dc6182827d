//! The inside of one chunk (after its checksum passed): records, and the
//! per-thread event encoding inside EVENTS records. In memory, so fast.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memgap_trace::event::{DeltaState, decode_with_stack};
use memgap_trace::records::{Record, Records};
use memgap_trace::varint::Cursor;

fuzz_target!(|raw: &[u8]| {
    for record in Records::new(raw) {
        if let Ok(Record::Events(piece)) = record {
            let mut cursor = Cursor::new(piece.records);
            let mut state = DeltaState::default();
            let mut frames = Vec::new();
            while !cursor.is_empty() && decode_with_stack(&mut state, &mut cursor, &mut frames).is_ok() {}
        }
    }
    // The same bytes as one thread's event buffer.
    let mut cursor = Cursor::new(raw);
    let mut state = DeltaState::default();
    let mut frames = Vec::new();
    while !cursor.is_empty() && decode_with_stack(&mut state, &mut cursor, &mut frames).is_ok() {}
});
