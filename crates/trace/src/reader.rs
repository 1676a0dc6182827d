//! Opens a trace file and walks its chunks, verifying each.

use std::fs::File;
use std::path::{Path, PathBuf};

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
        let file = File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(TraceError::NotATrace);
        }
        if meta.len() == 0 {
            return Err(TraceError::Empty);
        }
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

    /// Lets the kernel take back the mapped pages of the file below
    /// `offset`, a few MiB at a time from `dropped` on: a reader's memory
    /// then follows what it keeps, not the length of the trace. Returns
    /// the new start of what is still mapped in.
    fn drop_pages_before(&self, offset: usize, dropped: usize) -> usize {
        const STEP: usize = 8 << 20;
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
    pub fn for_each_chunk(&self, mut visit: impl FnMut(u64, &[u8]) -> Result<(), TraceError>) -> Result<Tail, TraceError> {
        let mut offset = FILE_HEADER_LEN;
        let mut dropped = 0;
        let mut scratch = Vec::new();
        loop {
            match read_chunk_into(&self.bytes, offset, &mut scratch)? {
                ChunkRef::Chunk { raw, next } => {
                    visit(offset as u64, raw)?;
                    offset = next;
                    dropped = self.drop_pages_before(offset, dropped);
                }
                ChunkRef::End(tail) => return Ok(tail),
            }
        }
    }
}
