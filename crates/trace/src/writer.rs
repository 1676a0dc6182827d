//! Writing a trace from an ordinary process: `memgap run` (for runtimes the
//! agent cannot see, such as Go) and the attach adapters. The agent has its
//! own writer, which may not allocate through the program's malloc.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::TraceError;
use crate::files;
use crate::framing::{FileHeader, encode_chunk};
use crate::records::Record;

/// A trace being written: each [`TraceWriter::write`] is one self-checking
/// chunk, so whatever was written survives the writer being killed.
pub struct TraceWriter {
    file: File,
    path: PathBuf,
    raw: Vec<u8>,
    chunk: Vec<u8>,
}

impl TraceWriter {
    /// Creates `path`, which must not exist, mode 0600 whatever the umask
    /// (traces hold addresses, command lines and symbol names); see
    /// [`crate::files::create_new`].
    pub fn create(path: &Path, run_id: u64) -> Result<TraceWriter, TraceError> {
        let (file, _) = files::create_new(path).map_err(|source| TraceError::Io { path: path.to_path_buf(), source })?;
        TraceWriter::from_created(file, path, run_id)
    }

    /// Writes the trace into `file`, a new empty file made for it (by
    /// [`crate::files::create_new`]) at `path`.
    pub fn from_created(mut file: File, path: &Path, run_id: u64) -> Result<TraceWriter, TraceError> {
        file.write_all(&FileHeader::new(run_id).encode()).map_err(|source| TraceError::Io { path: path.to_path_buf(), source })?;
        Ok(TraceWriter { file, path: path.to_path_buf(), raw: Vec::new(), chunk: Vec::new() })
    }

    /// Writes `records` as one chunk.
    pub fn write(&mut self, records: &[Record<'_>]) -> Result<(), TraceError> {
        if records.is_empty() {
            return Ok(());
        }
        self.raw.clear();
        for record in records {
            record.encode(&mut self.raw);
        }
        encode_chunk(&self.raw, &mut self.chunk);
        self.file.write_all(&self.chunk).map_err(|source| TraceError::Io { path: self.path.clone(), source })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceFile;
    use crate::records::{Metrics, Records, Rss};

    #[test]
    fn written_records_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mgt");
        let mut writer = TraceWriter::create(&path, 5).unwrap();
        let rss = Record::Rss(Rss { time: 1, vm_rss: 4096, ..Rss::default() });
        let metrics =
            Record::Metrics(Metrics { monotonic_ns: 2, source: "go".into(), kind: "gc".into(), values: vec![("heap".into(), 1.5)] });
        writer.write(std::slice::from_ref(&rss)).unwrap();
        writer.write(std::slice::from_ref(&metrics)).unwrap();
        drop(writer);
        let trace = TraceFile::open(&path).unwrap();
        assert_eq!(trace.header().run_id, 5);
        let mut seen = Vec::new();
        trace
            .for_each_chunk(|_, chunk| {
                seen.extend(Records::new(chunk).map(|r| format!("{:?}", r.unwrap())));
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, vec![format!("{rss:?}"), format!("{metrics:?}")]);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
