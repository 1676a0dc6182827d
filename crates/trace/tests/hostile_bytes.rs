//! No panic on arbitrary bytes, at every layer of the format: the file
//! header, chunk framing (also chunks whose checksum is right but whose
//! lengths lie), the records inside a chunk, and the event encoding. Each
//! layer returns an error or a value; none allocates by a length it read
//! before checking it against the bytes there are.

use memgap_trace::event::{DeltaState, decode_with_stack};
use memgap_trace::framing::{self, CHUNK_HEADER_LEN, CHUNK_MAGIC, ChunkAt, FILE_HEADER_LEN, FileHeader, read_chunk};
use memgap_trace::records::Records;
use memgap_trace::varint::Cursor;
use proptest::prelude::*;

/// Reads every chunk of `file` until the end or the first error.
fn read_file(file: &[u8]) {
    if FileHeader::decode(file).is_err() {
        return;
    }
    let mut offset = FILE_HEADER_LEN;
    while let Ok(ChunkAt::Chunk { raw, next }) = read_chunk(file, offset) {
        assert!(next > offset, "no progress at {offset}");
        read_records(&raw);
        offset = next;
    }
}

fn read_records(raw: &[u8]) {
    for record in Records::new(raw) {
        match record {
            Ok(memgap_trace::records::Record::Events(piece)) => read_events(piece.records),
            Ok(memgap_trace::records::Record::CompactEvents(piece)) => read_compact_events(piece.records),
            _ => {}
        }
    }
}

fn read_events(bytes: &[u8]) {
    let mut cursor = Cursor::new(bytes);
    let mut state = DeltaState::default();
    let mut frames = Vec::new();
    while !cursor.is_empty() && decode_with_stack(&mut state, &mut cursor, &mut frames).is_ok() {
        assert!(frames.len() as u64 <= memgap_trace::event::MAX_FRAMES);
    }
}

fn read_compact_events(bytes: &[u8]) {
    use memgap_trace::compact::{CompactState, decode_into};
    let (mut state, mut cursor, mut frames) = (CompactState::default(), Cursor::new(bytes), Vec::new());
    while !cursor.is_empty() && decode_into(&mut state, &mut cursor, &mut frames, &mut memgap_trace::Event::default()).is_ok() {
        assert!(frames.len() as u64 <= memgap_trace::event::MAX_FRAMES);
    }
}

/// A chunk header with a right checksum over whatever lengths and codec it claims.
fn lying_chunk(codec: u8, raw_len: u32, stored: &[u8], stored_len: u32) -> Vec<u8> {
    let mut chunk = Vec::new();
    chunk.extend_from_slice(&CHUNK_MAGIC.to_le_bytes());
    chunk.extend_from_slice(&[codec, 0, 0, 0]);
    chunk.extend_from_slice(&raw_len.to_le_bytes());
    chunk.extend_from_slice(&stored_len.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&chunk[..16]);
    hasher.update(&stored[..(stored_len as usize).min(stored.len())]);
    chunk.extend_from_slice(&hasher.finalize().to_le_bytes());
    assert_eq!(chunk.len(), CHUNK_HEADER_LEN);
    chunk.extend_from_slice(stored);
    chunk
}

fn header() -> Vec<u8> {
    FileHeader::new(1).encode().to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_files_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        read_file(&bytes);
        let mut with_header = header();
        with_header.extend_from_slice(&bytes);
        read_file(&with_header);
    }

    #[test]
    fn well_framed_garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut file = header();
        let mut chunk = Vec::new();
        framing::encode_chunk(&raw, &mut chunk);
        file.extend_from_slice(&chunk);
        read_file(&file);
    }

    #[test]
    fn chunks_with_lying_lengths_never_panic(
        codec in 0u8..3,
        raw_len in prop_oneof![Just(0u32), Just(u32::MAX), Just(16 << 20), Just((16 << 20) + 1), 0u32..4096],
        stored in proptest::collection::vec(any::<u8>(), 0..512),
        stored_len in prop_oneof![Just(0u32), Just(u32::MAX), 0u32..1024],
    ) {
        let mut file = header();
        file.extend_from_slice(&lying_chunk(codec, raw_len, &stored, stored_len));
        read_file(&file);
    }

    #[test]
    fn records_of_arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..1024)) {
        read_records(&raw);
    }

    #[test]
    fn records_with_known_tags_and_garbage_bodies_never_panic(
        records in proptest::collection::vec((0u8..16, proptest::collection::vec(any::<u8>(), 0..64)), 0..16)
    ) {
        // tag, then the body's length as a varint, then the body: the
        // framing every record has, around bodies no encoder made.
        let mut raw = Vec::new();
        for (tag, body) in &records {
            raw.push(*tag);
            memgap_trace::varint::push_bytes(&mut raw, body);
        }
        read_records(&raw);
    }

    #[test]
    fn events_of_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        read_events(&bytes);
        read_compact_events(&bytes);
    }
}
