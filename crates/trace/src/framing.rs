//! File header and chunk framing.
//!
//! ```text
//! file   = header chunk*
//! header = "MEMGAPT\0" major:u16 minor:u16 header_len:u32 run_id:u64 flags:u32 crc32:u32   (32 bytes, LE)
//! chunk  = magic:u32 codec:u8 reserved:[u8;3] raw_len:u32 stored_len:u32 crc32:u32 payload
//! ```
//! The chunk CRC covers the first 16 header bytes and the stored payload, so a
//! chunk is either wholly intact or rejected. A chunk that runs past the end of
//! the file is the cut a SIGKILL leaves: everything before it stays readable.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::TraceError;

pub const FILE_MAGIC: [u8; 8] = *b"MEMGAPT\0";
pub const VERSION_MAJOR: u16 = 4;
pub const VERSION_MINOR: u16 = 0;
pub const FILE_HEADER_LEN: usize = 32;

pub const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"MGCK");
pub const CHUNK_HEADER_LEN: usize = 20;
/// Larger chunks are never written, so a larger length means corruption.
pub const MAX_CHUNK_RAW_LEN: usize = 16 << 20;

pub const CODEC_NONE: u8 = 0;
pub const CODEC_LZ4: u8 = 1;
pub const CODEC_ZSTD: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    pub major: u16,
    pub minor: u16,
    pub run_id: u64,
    pub flags: u32,
}

impl FileHeader {
    pub fn new(run_id: u64) -> Self {
        FileHeader { major: VERSION_MAJOR, minor: VERSION_MINOR, run_id, flags: 0 }
    }

    pub fn encode(&self) -> [u8; FILE_HEADER_LEN] {
        let mut out = [0u8; FILE_HEADER_LEN];
        out[0..8].copy_from_slice(&FILE_MAGIC);
        out[8..10].copy_from_slice(&self.major.to_le_bytes());
        out[10..12].copy_from_slice(&self.minor.to_le_bytes());
        out[12..16].copy_from_slice(&(FILE_HEADER_LEN as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.run_id.to_le_bytes());
        out[24..28].copy_from_slice(&self.flags.to_le_bytes());
        let crc = crc32fast::hash(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<FileHeader, TraceError> {
        if bytes.is_empty() {
            return Err(TraceError::Empty);
        }
        if bytes.len() < FILE_MAGIC.len() || bytes[0..8] != FILE_MAGIC {
            return Err(TraceError::NotATrace);
        }
        if bytes.len() < FILE_HEADER_LEN {
            return Err(TraceError::CutShort { offset: 0 });
        }
        let major = u16::from_le_bytes([bytes[8], bytes[9]]);
        let minor = u16::from_le_bytes([bytes[10], bytes[11]]);
        if major > VERSION_MAJOR {
            return Err(TraceError::NewerVersion { major, minor });
        }
        let crc = u32::from_le_bytes(bytes[28..32].try_into().unwrap());
        if crc != crc32fast::hash(&bytes[0..28]) {
            return Err(TraceError::Corrupt { offset: 0, what: "file header checksum mismatch" });
        }
        Ok(FileHeader {
            major,
            minor,
            run_id: u64::from_le_bytes(bytes[16..24].try_into().unwrap()),
            flags: u32::from_le_bytes(bytes[24..28].try_into().unwrap()),
        })
    }
}

/// Frames `raw` as one chunk (LZ4 when that is smaller) into `out`, which is
/// cleared first. `out` is reused across calls so the writer stops allocating
/// once warm.
pub fn encode_chunk(raw: &[u8], out: &mut Vec<u8>) {
    frame(raw, out, true);
}

/// The recorder's encoder, outside the traced program: zstd (trace format
/// 2.2), whose entropy coding shrinks the event records of a churning heap
/// by a fifth where LZ4 found a twentieth, at about LZ4's speed at level 1.
/// After a chunk zstd did not shrink by an eighth, the next few are stored
/// without trying, more after each such chunk in a row.
pub struct ChunkEncoder {
    /// Chunks still to store without trying to compress.
    stored_left: u32,
    /// Chunks tried in a row that did not shrink enough.
    misses: u32,
    /// Kept from chunk to chunk: a context costs more to make than a chunk to compress.
    compressor: Option<zstd::bulk::Compressor<'static>>,
}

/// zstd's fastest regular level: over 150 MB/s of event records on one
/// busy core of the 2-core VM, ten times what a churning program writes.
pub const ZSTD_LEVEL: i32 = 1;

impl Default for ChunkEncoder {
    fn default() -> Self {
        ChunkEncoder { stored_left: 0, misses: 0, compressor: zstd::bulk::Compressor::new(ZSTD_LEVEL).ok() }
    }
}

impl std::fmt::Debug for ChunkEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkEncoder").field("stored_left", &self.stored_left).field("misses", &self.misses).finish()
    }
}

/// Chunks stored untried after one that did not compress, doubling with
/// each miss in a row up to 63: a stream that starts compressing again is
/// noticed within 8 chunks (4 MiB in the agent), or 64 (32 MiB) after a
/// long incompressible stretch.
const STORE_AFTER_INCOMPRESSIBLE: u32 = 7;
const MAX_DOUBLINGS: u32 = 3;

impl ChunkEncoder {
    pub fn encode(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        if self.stored_left > 0 {
            self.stored_left -= 1;
            frame(raw, out, false);
            return;
        }
        let stored_len = match &mut self.compressor {
            Some(compressor) => frame_zstd(raw, out, compressor),
            None => frame(raw, out, true),
        };
        if stored_len * 8 > raw.len() * 7 {
            self.stored_left = ((STORE_AFTER_INCOMPRESSIBLE + 1) << self.misses.min(MAX_DOUBLINGS)) - 1;
            self.misses += 1;
        } else {
            self.misses = 0;
        }
    }
}

/// Frames `raw` into `out` with zstd when that is smaller, else stored.
fn frame_zstd(raw: &[u8], out: &mut Vec<u8>, compressor: &mut zstd::bulk::Compressor<'static>) -> usize {
    out.resize(CHUNK_HEADER_LEN + zstd::zstd_safe::compress_bound(raw.len()), 0);
    let compressed = compressor.compress_to_buffer(raw, &mut out[CHUNK_HEADER_LEN..]).unwrap_or(usize::MAX);
    if compressed >= raw.len() {
        return frame(raw, out, false);
    }
    out.truncate(CHUNK_HEADER_LEN + compressed);
    seal(out, CODEC_ZSTD, raw.len(), compressed);
    compressed
}

/// Frames `raw` into `out` (replacing what it held), compressed if `try_lz4`
/// and that is smaller; returns the length stored.
fn frame(raw: &[u8], out: &mut Vec<u8>, try_lz4: bool) -> usize {
    // Grown, not cleared: a reused `out` is zeroed only where it grows.
    let compressed = if try_lz4 {
        out.resize(CHUNK_HEADER_LEN + lz4_flex::block::get_maximum_output_size(raw.len()), 0);
        lz4_flex::block::compress_into(raw, &mut out[CHUNK_HEADER_LEN..]).unwrap_or(usize::MAX)
    } else {
        usize::MAX
    };
    let (codec, stored_len) = if compressed < raw.len() {
        (CODEC_LZ4, compressed)
    } else {
        out.truncate(CHUNK_HEADER_LEN);
        out.resize(CHUNK_HEADER_LEN, 0);
        out.extend_from_slice(raw);
        (CODEC_NONE, raw.len())
    };
    out.truncate(CHUNK_HEADER_LEN + stored_len);
    seal(out, codec, raw.len(), stored_len);
    stored_len
}

/// Writes the chunk header before the payload already in `out`.
fn seal(out: &mut [u8], codec: u8, raw_len: usize, stored_len: usize) {
    out[0..4].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
    out[4] = codec;
    out[5..8].fill(0);
    out[8..12].copy_from_slice(&(raw_len as u32).to_le_bytes());
    out[12..16].copy_from_slice(&(stored_len as u32).to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&out[0..16]);
    hasher.update(&out[CHUNK_HEADER_LEN..]);
    let crc = hasher.finalize();
    out[16..20].copy_from_slice(&crc.to_le_bytes());
}

/// What follows the last chunk that could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// The file ends exactly after a chunk.
    Clean,
    /// A chunk starts at `offset` but the file ends before it does (or the
    /// rest is zeros, as a crash can leave): the trace was cut there.
    CutShort { offset: u64 },
}

/// Outcome of reading the chunk at some offset.
pub enum ChunkAt {
    Chunk { raw: Vec<u8>, next: usize },
    End(Tail),
}

/// Reads and verifies the chunk at `offset` of `bytes` (the whole file).
pub fn read_chunk(bytes: &[u8], offset: usize) -> Result<ChunkAt, TraceError> {
    let mut scratch = Vec::new();
    Ok(match read_chunk_into(bytes, offset, &mut scratch)? {
        ChunkRef::Chunk { raw, next, .. } => ChunkAt::Chunk { raw: raw.to_vec(), next },
        ChunkRef::End(tail) => ChunkAt::End(tail),
    })
}

/// [`ChunkAt`] without a copy: the payload as stored in `bytes`, or
/// decompressed into the caller's scratch buffer.
pub enum ChunkRef<'a> {
    /// `raw` is in `scratch` when `decompressed`, else in `bytes`.
    Chunk {
        raw: &'a [u8],
        next: usize,
        decompressed: bool,
    },
    End(Tail),
}

/// [`read_chunk`] for a reader that walks every chunk: a stored payload
/// is handed on where it lies, and a compressed one is decompressed into
/// `scratch`, which keeps its allocation from chunk to chunk. A fresh
/// zeroed buffer and a copy per chunk were a twentieth of a replay.
pub fn read_chunk_into<'a>(bytes: &'a [u8], offset: usize, scratch: &'a mut Vec<u8>) -> Result<ChunkRef<'a>, TraceError> {
    let rest = &bytes[offset.min(bytes.len())..];
    if rest.is_empty() {
        return Ok(ChunkRef::End(Tail::Clean));
    }
    let cut = ChunkRef::End(Tail::CutShort { offset: offset as u64 });
    if rest.len() < CHUNK_HEADER_LEN {
        return Ok(cut);
    }
    let header = &rest[..CHUNK_HEADER_LEN];
    let magic = u32::from_le_bytes(header[0..4].try_into().unwrap());
    if magic != CHUNK_MAGIC {
        if rest.iter().all(|&b| b == 0) {
            return Ok(cut);
        }
        return Err(TraceError::Corrupt { offset: offset as u64, what: "bad chunk marker" });
    }
    let codec = header[4];
    let raw_len = u32::from_le_bytes(header[8..12].try_into().unwrap()) as usize;
    let stored_len = u32::from_le_bytes(header[12..16].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(header[16..20].try_into().unwrap());
    let bound = lz4_flex::block::get_maximum_output_size(raw_len).max(zstd::zstd_safe::compress_bound(raw_len));
    if raw_len > MAX_CHUNK_RAW_LEN || stored_len > bound {
        return Err(TraceError::Corrupt { offset: offset as u64, what: "impossible chunk length" });
    }
    if rest.len() < CHUNK_HEADER_LEN + stored_len {
        return Ok(cut);
    }
    let stored = &rest[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + stored_len];
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[0..16]);
    hasher.update(stored);
    if hasher.finalize() != crc {
        return Err(TraceError::Corrupt { offset: offset as u64, what: "chunk checksum mismatch" });
    }
    let raw: &[u8] = match codec {
        CODEC_NONE if stored_len == raw_len => stored,
        CODEC_LZ4 => {
            // Only what the last chunk did not reach is zeroed.
            scratch.resize(raw_len, 0);
            match lz4_flex::block::decompress_into(stored, scratch) {
                Ok(n) if n == raw_len => &scratch[..],
                _ => return Err(TraceError::Corrupt { offset: offset as u64, what: "chunk does not decompress" }),
            }
        }
        CODEC_ZSTD => {
            // The output cannot outgrow the buffer: a chunk claiming less than it holds fails.
            scratch.resize(raw_len, 0);
            match zstd::bulk::decompress_to_buffer(stored, &mut scratch[..]) {
                Ok(n) if n == raw_len => &scratch[..],
                _ => return Err(TraceError::Corrupt { offset: offset as u64, what: "chunk does not decompress" }),
            }
        }
        _ => return Err(TraceError::Corrupt { offset: offset as u64, what: "unknown chunk codec" }),
    };
    Ok(ChunkRef::Chunk { raw, next: offset + CHUNK_HEADER_LEN + stored_len, decompressed: codec != CODEC_NONE })
}

/// Where the chunk framed at `offset` ends, judged from its header alone;
/// `None` when no whole chunk starts there (end of file, or a cut).
fn chunk_end(bytes: &[u8], offset: usize) -> Option<usize> {
    let header = bytes.get(offset..offset + CHUNK_HEADER_LEN)?;
    if u32::from_le_bytes(header[0..4].try_into().unwrap()) != CHUNK_MAGIC {
        return None;
    }
    let stored_len = u32::from_le_bytes(header[12..16].try_into().unwrap()) as usize;
    let end = offset + CHUNK_HEADER_LEN + stored_len;
    (end <= bytes.len()).then_some(end)
}

/// Appends one chunk to an existing trace, first cutting off a partial chunk
/// left by a killed writer so the new chunk stays readable. Walks chunk
/// headers only, so a multi-gigabyte trace costs a page per chunk, not a
/// read of the file. Returns whether a partial chunk was cut.
///
/// Opens `path` as it is (no symlink followed); a caller that knows which
/// file its run created uses [`append_chunk_to`] on the file it opened with
/// [`crate::files::open_created`].
pub fn append_chunk(path: &Path, raw: &[u8]) -> Result<bool, TraceError> {
    let io_err = |e: io::Error| TraceError::Io { path: path.to_path_buf(), source: e };
    let mut file = File::options().read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).map_err(io_err)?;
    append_chunk_to(&mut file, path, raw)
}

/// [`append_chunk`] on an open file (`path` only names it in errors).
pub fn append_chunk_to(file: &mut File, path: &Path, raw: &[u8]) -> Result<bool, TraceError> {
    append_chunks_to(file, path, std::iter::once(raw))
}

/// Appends several chunks to an open trace, walking its chunk headers once
/// (see [`append_chunk`]). Returns whether a partial chunk was cut.
pub fn append_chunks_to<'a>(file: &mut File, path: &Path, raws: impl IntoIterator<Item = &'a [u8]>) -> Result<bool, TraceError> {
    let io_err = |e: io::Error| TraceError::Io { path: path.to_path_buf(), source: e };
    if !file.metadata().map_err(io_err)?.file_type().is_file() {
        return Err(TraceError::NotATrace);
    }
    file.seek(SeekFrom::Start(0)).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len() as usize;
    let end = {
        let mut header = [0u8; FILE_HEADER_LEN];
        let got = file.read(&mut header).map_err(io_err)?;
        FileHeader::decode(&header[..got])?;
        // SAFETY: the file is not written by anyone else while we append.
        let map = unsafe { memmap2::Mmap::map(&*file) }.map_err(io_err)?;
        let mut offset = FILE_HEADER_LEN;
        while let Some(next) = chunk_end(&map, offset) {
            offset = next;
        }
        offset
    };
    let cut = end < len;
    if cut {
        file.set_len(end as u64).map_err(io_err)?;
    }
    file.seek(SeekFrom::Start(end as u64)).map_err(io_err)?;
    let mut chunk = Vec::new();
    for raw in raws {
        encode_chunk(raw, &mut chunk);
        file.write_all(&chunk).map_err(io_err)?;
    }
    Ok(cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file_with(chunks: &[Vec<u8>]) -> Vec<u8> {
        let mut file = FileHeader::new(7).encode().to_vec();
        let mut scratch = Vec::new();
        for raw in chunks {
            encode_chunk(raw, &mut scratch);
            file.extend_from_slice(&scratch);
        }
        file
    }

    fn read_all(bytes: &[u8]) -> Result<(Vec<Vec<u8>>, Tail), TraceError> {
        FileHeader::decode(bytes)?;
        let mut offset = FILE_HEADER_LEN;
        let mut out = Vec::new();
        loop {
            match read_chunk(bytes, offset)? {
                ChunkAt::Chunk { raw, next } => {
                    out.push(raw);
                    offset = next;
                }
                ChunkAt::End(tail) => return Ok((out, tail)),
            }
        }
    }

    proptest! {
        #[test]
        fn chunks_round_trip(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..2000), 0..8)) {
            let file = file_with(&chunks);
            let (read, tail) = read_all(&file).unwrap();
            prop_assert_eq!(read, chunks);
            prop_assert_eq!(tail, Tail::Clean);
        }

        #[test]
        fn any_cut_keeps_the_complete_chunks(cut in 32usize..4000) {
            let chunks: Vec<Vec<u8>> = (0..6).map(|i| vec![i as u8; 300 + i * 50]).collect();
            let file = file_with(&chunks);
            let cut = cut.min(file.len());
            let (read, tail) = read_all(&file[..cut]).unwrap();
            prop_assert_eq!(&read[..], &chunks[..read.len()]);
            // A cut exactly between two chunks looks like a clean end.
            let at_boundary = file_with(&chunks[..read.len()]).len() == cut;
            prop_assert_eq!(matches!(tail, Tail::CutShort { .. }), !at_boundary);
        }

        #[test]
        fn flipped_bytes_are_detected_never_panic(pos in 0usize..3000, bit in 0u8..8) {
            let chunks: Vec<Vec<u8>> = (0..4).map(|i| (0..700).map(|j| (i * 7 + j) as u8).collect()).collect();
            let mut file = file_with(&chunks);
            let pos = pos % file.len();
            file[pos] ^= 1 << bit;
            if let Ok((read, _)) = read_all(&file) { prop_assert_ne!(read, chunks) }
        }
    }

    /// After a chunk that does not compress, the next seven are stored
    /// untried, then LZ4 is tried again; every frame reads back.
    #[test]
    fn a_chunk_encoder_stops_trying_to_compress_for_a_while_on_incompressible_data() {
        let mut rng = 7u64;
        let random: Vec<u8> = (0..65_536)
            .map(|_| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (rng >> 56) as u8
            })
            .collect();
        let zeros = vec![0u8; 65_536];
        let mut encoder = ChunkEncoder::default();
        let (mut codecs, mut file) = (Vec::new(), FileHeader::new(7).encode().to_vec());
        let mut frame = Vec::new();
        for raw in std::iter::once(&random).chain(std::iter::repeat_n(&zeros, 9)) {
            encoder.encode(raw, &mut frame);
            codecs.push(frame[4]);
            file.extend_from_slice(&frame);
        }
        let (n, z) = (CODEC_NONE, CODEC_ZSTD);
        assert_eq!(codecs, [n, n, n, n, n, n, n, n, z, z]);
        let (chunks, tail) = read_all(&file).unwrap();
        assert_eq!(tail, Tail::Clean);
        assert_eq!(chunks.len(), 10);
        assert!(chunks[0] == random && chunks[1..].iter().all(|c| *c == zeros));
    }

    /// `raw_len` bytes of which `repeated` in every 100 repeat the 100 before.
    fn partly_repetitive(raw_len: usize, repeated: usize) -> Vec<u8> {
        let mut rng = 11u64;
        let mut out = Vec::with_capacity(raw_len);
        while out.len() < raw_len {
            for i in 0..100 {
                let byte = if i >= 100 - repeated && out.len() >= 100 {
                    out[out.len() - 100]
                } else {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (rng >> 56) as u8
                };
                out.push(byte);
            }
        }
        out.truncate(raw_len);
        out
    }

    /// The recorder's zstd chunks and the LZ4 chunks of older traces read
    /// back in one file; a zstd chunk whose header claims fewer bytes than
    /// it holds is corrupt, not a larger allocation.
    #[test]
    fn zstd_and_lz4_chunks_read_back_and_a_lying_length_is_caught() {
        let raw = partly_repetitive(65_536, 40);
        let mut file = FileHeader::new(7).encode().to_vec();
        let (mut encoder, mut framed) = (ChunkEncoder::default(), Vec::new());
        encoder.encode(&raw, &mut framed);
        assert_eq!(framed[4], CODEC_ZSTD);
        let zstd_chunk = framed.clone();
        file.extend_from_slice(&framed);
        encode_chunk(&raw, &mut framed);
        assert_eq!(framed[4], CODEC_LZ4);
        file.extend_from_slice(&framed);
        let (chunks, tail) = read_all(&file).unwrap();
        assert_eq!((chunks, tail), (vec![raw.clone(), raw.clone()], Tail::Clean));
        assert!(zstd_chunk.len() < raw.len() * 7 / 10, "{} bytes", zstd_chunk.len());
        // A smaller raw length, the checksum made right.
        let mut lying = zstd_chunk.clone();
        let stored_len = lying.len() - CHUNK_HEADER_LEN;
        seal(&mut lying, CODEC_ZSTD, raw.len() - 1, stored_len);
        let mut file = FileHeader::new(7).encode().to_vec();
        file.extend_from_slice(&lying);
        assert!(matches!(read_all(&file), Err(TraceError::Corrupt { what: "chunk does not decompress", .. })));
    }

    /// A stream LZ4 shrinks by less than an eighth is stored untried after
    /// each chunk it tried; one it shrinks by more stays compressed.
    #[test]
    fn a_chunk_encoder_compresses_only_where_it_saves_an_eighth() {
        let (n, z) = (CODEC_NONE, CODEC_ZSTD);
        for (repeated, expected) in [(8, [z, n, n, n, n, n, n, n, z, n]), (40, [z; 10])] {
            let raw = partly_repetitive(65_536, repeated);
            let mut framed = Vec::new();
            let shrunk_to = frame(&raw, &mut framed, true);
            assert!(
                (repeated < 20) == (shrunk_to * 8 > raw.len() * 7) && shrunk_to < raw.len(),
                "{repeated}: LZ4 made {} bytes {shrunk_to}",
                raw.len()
            );
            let mut encoder = ChunkEncoder::default();
            let codecs: Vec<u8> = (0..10)
                .map(|_| {
                    encoder.encode(&raw, &mut framed);
                    framed[4]
                })
                .collect();
            assert_eq!(codecs, expected, "{repeated} bytes in 100 repeated");
        }
    }

    /// Each miss in a row doubles the chunks stored untried, up to 63; a
    /// chunk that compresses well ends the run.
    #[test]
    fn a_chunk_encoder_tries_less_often_the_longer_it_misses() {
        let (mild, good) = (partly_repetitive(65_536, 8), partly_repetitive(65_536, 40));
        // The chunks a fresh encoder tries LZ4 on (and stores compressed).
        let tried = |chunks: &mut dyn Iterator<Item = &Vec<u8>>| -> Vec<usize> {
            let (mut encoder, mut framed) = (ChunkEncoder::default(), Vec::new());
            chunks
                .enumerate()
                .filter(|(_, raw)| {
                    encoder.encode(raw, &mut framed);
                    framed[4] == CODEC_ZSTD
                })
                .map(|(i, _)| i)
                .collect()
        };
        assert_eq!(tried(&mut std::iter::repeat_n(&mild, 260)), [0, 8, 24, 56, 120, 184, 248]);
        let mut good_at_8 = (0..20).map(|i| if i == 8 { &good } else { &mild });
        assert_eq!(tried(&mut good_at_8), [0, 8, 9, 17], "after the good chunk at 8, a miss stores 7 untried again, not 15");
    }

    #[test]
    fn header_errors_are_specific() {
        assert!(matches!(FileHeader::decode(b""), Err(TraceError::Empty)));
        assert!(matches!(FileHeader::decode(b"#!/bin/sh\necho hi\n"), Err(TraceError::NotATrace)));
        let mut newer = FileHeader::new(1);
        newer.major = VERSION_MAJOR + 1;
        assert!(matches!(FileHeader::decode(&newer.encode()), Err(TraceError::NewerVersion { .. })));
        // The previous major version (agent-encoded events only) still reads.
        let previous = FileHeader { major: 2, minor: 2, run_id: 1, flags: 0 };
        assert_eq!(FileHeader::decode(&previous.encode()).unwrap(), previous);
    }

    #[test]
    fn append_repairs_a_cut_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mgt");
        let file = file_with(&[vec![1; 100], vec![2; 100]]);
        std::fs::write(&path, &file[..file.len() - 10]).unwrap();
        assert!(append_chunk(&path, &[3; 50]).unwrap());
        let (read, tail) = read_all(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(read, vec![vec![1; 100], vec![3; 50]]);
        assert_eq!(tail, Tail::Clean);
    }
}
