//! Opens a trace file and walks its chunks, verifying each.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use memmap2::{Advice, Mmap, UncheckedAdvice};

use crate::TraceError;
use crate::framing::{ChunkRef, FILE_HEADER_LEN, FileHeader, Tail, read_chunk_into};

pub struct TraceFile {
    path: PathBuf,
    bytes: Mmap,
    header: FileHeader,
}

impl TraceFile {
    pub fn open(path: &Path) -> Result<TraceFile, TraceError> {
        let io_err = |source| TraceError::Io { path: path.to_path_buf(), source };
        crate::files::note_consulted(path);
        // A FIFO or a device would block or never end: only regular files.
        let file = crate::files::open_regular(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.len() == 0 {
            return Err(TraceError::Empty);
        }
        // The magic bytes first: a big file of something else is not mapped.
        let mut magic = [0u8; FILE_HEADER_LEN];
        let got = std::os::unix::fs::FileExt::read_at(&file, &mut magic, 0).map_err(io_err)?;
        FileHeader::decode(&magic[..got])?;
        // SAFETY: traces are append-only; a concurrent writer only adds bytes
        // past the length mapped here.
        let bytes = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        // Advice only: a kernel that refuses it reads the file all the same.
        let _ = bytes.advise(Advice::Sequential);
        let header = FileHeader::decode(&bytes)?;
        Ok(TraceFile { path: path.to_path_buf(), bytes, header })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> FileHeader {
        self.header
    }

    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.len() <= FILE_HEADER_LEN
    }

    /// The decompressed bytes of the chunk at `offset` (as `for_each_chunk`
    /// gave it), read again: a reader that let go of what it queued from a
    /// chunk reads it back here. The file's pages it read are let go again,
    /// so reading back does not bring the trace back into memory.
    pub fn chunk_at(&self, offset: u64) -> Result<Vec<u8>, TraceError> {
        let offset = usize::try_from(offset).unwrap_or(usize::MAX).max(FILE_HEADER_LEN);
        let mut scratch = Vec::new();
        let (raw, next) = match read_chunk_into(&self.bytes, offset, &mut scratch)? {
            ChunkRef::Chunk { raw, next, decompressed } => (if decompressed { None } else { Some(raw.to_vec()) }, next),
            ChunkRef::End(_) => return Err(TraceError::Corrupt { offset: offset as u64, what: "no chunk there" }),
        };
        let page = 4096;
        let (start, end) = (offset & !(page - 1), next.div_ceil(page) * page);
        // SAFETY: as in `drop_pages_before`: a read-only view of the file.
        let _ = unsafe { self.bytes.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end.min(self.bytes.len()) - start) };
        Ok(raw.unwrap_or(scratch))
    }

    /// Lets the kernel take back the mapped pages of the file below
    /// `offset`, a MiB at a time from `dropped` on: a reader's memory
    /// then follows what it keeps, not the length of the trace. Returns
    /// the new start of what is still mapped in.
    fn drop_pages_before(&self, offset: usize, dropped: usize) -> usize {
        const STEP: usize = 1 << 20;
        let end = offset & !(STEP - 1);
        if end <= dropped {
            return dropped;
        }
        // SAFETY: the mapping is a read-only view of the file: pages dropped
        // are read again from the file if touched, unchanged.
        let _ = unsafe { self.bytes.unchecked_advise_range(UncheckedAdvice::DontNeed, dropped, end - dropped) };
        end
    }

    /// Calls `visit` with each chunk's decompressed bytes and the chunk's file
    /// offset, in file order; returns how the file ends.
    ///
    /// A trace of some size is read ahead on a second thread, which checks
    /// each chunk and decompresses it while `visit` works on the one
    /// before: those were a tenth of a replay's time, on one core while
    /// the machine nearly always has another.
    pub fn for_each_chunk(&self, mut visit: impl FnMut(u64, &[u8]) -> Result<(), TraceError>) -> Result<Tail, TraceError> {
        let tail = self.for_each_chunk_until(|offset, raw| visit(offset, raw).map(|()| ControlFlow::Continue(())))?;
        Ok(tail.unwrap_or(Tail::Clean))
    }

    /// [`Self::for_each_chunk`] until `visit` breaks: then `None` (the rest
    /// of the file is not read).
    pub fn for_each_chunk_until(
        &self,
        mut visit: impl FnMut(u64, &[u8]) -> Result<ControlFlow<()>, TraceError>,
    ) -> Result<Option<Tail>, TraceError> {
        if self.bytes.len() < READ_AHEAD_MIN_BYTES {
            return self.for_each_chunk_here(visit);
        }
        std::thread::scope(|scope| {
            // Chunks go to the visitor through `ready`; their buffers come back through `spent`.
            let (ready_tx, ready) = mpsc::sync_channel::<Result<Ahead, TraceError>>(READ_AHEAD_CHUNKS);
            let (spent, spent_rx) = mpsc::channel::<Vec<u8>>();
            let reader = std::thread::Builder::new().name("memgap-read-ahead".into()).spawn_scoped(scope, move || {
                let mut offset = FILE_HEADER_LEN;
                loop {
                    let mut buffer = spent_rx.try_recv().unwrap_or_default();
                    let ahead = match read_chunk_into(&self.bytes, offset, &mut buffer) {
                        Ok(ChunkRef::Chunk { raw, next, decompressed }) => {
                            // Stored as is: the visitor reads it in the mapping.
                            let stored = (!decompressed).then(|| {
                                let start = raw.as_ptr() as usize - self.bytes.as_ptr() as usize;
                                start..start + raw.len()
                            });
                            let ahead = Ahead::Chunk { offset, next, stored, buffer };
                            offset = next;
                            Ok(ahead)
                        }
                        Ok(ChunkRef::End(tail)) => Ok(Ahead::End(tail)),
                        Err(error) => Err(error),
                    };
                    let last = !matches!(ahead, Ok(Ahead::Chunk { .. }));
                    // The visitor stopped (an error of its own): so does the reader.
                    if ready_tx.send(ahead).is_err() || last {
                        return;
                    }
                }
            });
            if reader.is_err() {
                // No thread to be had (a limit on processes): read here.
                return self.for_each_chunk_here(visit);
            }
            let mut dropped = 0;
            loop {
                let Ok(ahead) = ready.recv() else { unreachable!("the reader sends an end or an error before it stops") };
                match ahead? {
                    Ahead::Chunk { offset, next, stored, buffer } => {
                        let raw = match &stored {
                            Some(range) => &self.bytes[range.clone()],
                            None => &buffer[..],
                        };
                        if visit(offset as u64, raw)?.is_break() {
                            // Dropping `ready` stops the reader.
                            return Ok(None);
                        }
                        let _ = spent.send(buffer);
                        dropped = self.drop_pages_before(next, dropped);
                    }
                    Ahead::End(tail) => return Ok(Some(tail)),
                }
            }
        })
    }

    /// [`Self::for_each_chunk`] on the calling thread alone.
    fn for_each_chunk_here(
        &self,
        mut visit: impl FnMut(u64, &[u8]) -> Result<ControlFlow<()>, TraceError>,
    ) -> Result<Option<Tail>, TraceError> {
        let mut offset = FILE_HEADER_LEN;
        let mut dropped = 0;
        let mut scratch = Vec::new();
        loop {
            match read_chunk_into(&self.bytes, offset, &mut scratch)? {
                ChunkRef::Chunk { raw, next, .. } => {
                    if visit(offset as u64, raw)?.is_break() {
                        return Ok(None);
                    }
                    offset = next;
                    dropped = self.drop_pages_before(offset, dropped);
                }
                ChunkRef::End(tail) => return Ok(Some(tail)),
            }
        }
    }
}

/// Smaller traces are read on the calling thread: a thread costs more
/// than it saves on a few chunks.
const READ_AHEAD_MIN_BYTES: usize = 4 << 20;
/// Chunks checked and decompressed ahead of the visitor.
const READ_AHEAD_CHUNKS: usize = 2;

/// A chunk read ahead: `stored` is where its payload lies in the file when
/// it was not compressed, else the payload is `buffer`.
enum Ahead {
    Chunk { offset: usize, next: usize, stored: Option<std::ops::Range<usize>>, buffer: Vec<u8> },
    End(Tail),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing::encode_chunk;

    /// A trace over the read-ahead threshold: chunks that compress and
    /// chunks stored as they are, then `tail` bytes.
    fn trace(dir: &Path, tail: &[u8]) -> PathBuf {
        let mut file = FileHeader::new(1).encode().to_vec();
        let mut framed = Vec::new();
        let mut seed = 7u64;
        for i in 0..24usize {
            let raw: Vec<u8> = if i % 3 == 0 {
                vec![i as u8; 300_000 + i]
            } else {
                (0..400_000 + i)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (seed >> 56) as u8
                    })
                    .collect()
            };
            encode_chunk(&raw, &mut framed);
            file.extend_from_slice(&framed);
        }
        file.extend_from_slice(tail);
        assert!(file.len() > READ_AHEAD_MIN_BYTES);
        let path = dir.join("t.mgt");
        std::fs::write(&path, file).unwrap();
        path
    }

    /// What a chunk reader calls for each chunk: its offset and raw bytes.
    type ChunkVisitor<'a> = &'a mut dyn FnMut(u64, &[u8]) -> Result<(), TraceError>;

    /// The chunks a reader visited: offset and raw bytes.
    type Visited = Vec<(u64, Vec<u8>)>;

    fn chunks(read: impl FnOnce(ChunkVisitor) -> Result<Tail, TraceError>) -> (Visited, Result<Tail, String>) {
        let mut seen = Vec::new();
        let tail = read(&mut |offset, raw| {
            seen.push((offset, raw.to_vec()));
            Ok(())
        });
        (seen, tail.map_err(|e| e.to_string()))
    }

    #[test]
    fn reading_ahead_gives_what_reading_in_place_gives() {
        let dir = tempfile::tempdir().unwrap();
        for tail in [&b""[..], b"MGCK\x01\x00\x00\x00", &[0u8; 64], b"garbage that is not a chunk"] {
            let file = TraceFile::open(&trace(dir.path(), tail)).unwrap();
            let ahead = chunks(|visit| file.for_each_chunk(visit));
            let here = chunks(|visit| {
                file.for_each_chunk_here(|offset, raw| visit(offset, raw).map(|()| ControlFlow::Continue(())))
                    .map(|tail| tail.expect("read to the end"))
            });
            assert_eq!(ahead.0.len(), 24);
            assert_eq!(ahead, here, "tail {tail:?}");
        }
    }

    #[test]
    fn a_visitor_that_stops_stops_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let file = TraceFile::open(&trace(dir.path(), b"")).unwrap();
        let mut visited = 0;
        let result = file.for_each_chunk(|_, _| {
            visited += 1;
            if visited == 3 { Err(TraceError::NotATrace) } else { Ok(()) }
        });
        assert!(matches!(result, Err(TraceError::NotATrace)));
        assert_eq!(visited, 3);
    }

    #[test]
    fn a_visitor_that_breaks_reads_no_further() {
        let dir = tempfile::tempdir().unwrap();
        let file = TraceFile::open(&trace(dir.path(), b"")).unwrap();
        let mut visited = 0;
        let result = file.for_each_chunk_until(|_, _| {
            visited += 1;
            Ok(if visited == 5 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        });
        assert!(matches!(result, Ok(None)));
        assert_eq!(visited, 5);
    }
}
