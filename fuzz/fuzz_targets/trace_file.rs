//! A whole trace file through every reader: framing, records, events, the
//! replay, and the model (summary, ledger, timeline, blame, report).
//!
//! The first byte chooses how the rest is used: odd, as the file itself
//! (header and framing under attack); even, as the raw content of chunks
//! framed with a right checksum (so the fuzzer reaches the records and the
//! replay instead of failing checksums). A chunk break is marked by the
//! bytes "\xffCHUNK".
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use memgap_model::blame::DEFAULT_TEMPORARY_MS;
use memgap_model::{At, BlameOptions, BlameOrder};
use memgap_trace::framing::{FileHeader, encode_chunk};

fn split_chunks(mut data: &[u8]) -> Vec<&[u8]> {
    const BREAK: &[u8] = b"\xffCHUNK";
    let mut chunks = Vec::new();
    while let Some(at) = data.windows(BREAK.len()).position(|w| w == BREAK) {
        chunks.push(&data[..at]);
        data = &data[at + BREAK.len()..];
    }
    chunks.push(data);
    chunks
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let file = if mode & 1 == 1 {
        rest.to_vec()
    } else {
        let mut file = FileHeader::new(1).encode().to_vec();
        let mut framed = Vec::new();
        for raw in split_chunks(rest) {
            encode_chunk(raw, &mut framed);
            file.extend_from_slice(&framed);
        }
        file
    };
    let path = std::env::temp_dir().join(format!("memgap-fuzz-{}.mgt", std::process::id()));
    std::fs::File::create(&path).and_then(|mut f| f.write_all(&file)).expect("write the input to a temporary file");
    let _ = memgap_model::Summary::of_trace(&path);
    for at in [At::Gap, At::Peak, At::End] {
        let _ = memgap_model::ledger_at(&path, at, true);
    }
    let _ = memgap_model::timeline(&path);
    for order in [BlameOrder::Fragmentation, BlameOrder::Temporary] {
        let options = BlameOptions { at: At::Gap, order, top: 10, per_stack: true, skip: Vec::new(), temporary_ms: DEFAULT_TEMPORARY_MS, full_names: false };
        let _ = memgap_model::blame(&path, &options);
    }
    let _ = memgap_model::report::report(&path, At::Gap);
    let _ = std::fs::remove_file(&path);
});
