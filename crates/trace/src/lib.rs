//! The memgap trace format: what the agent writes and every later stage reads.
//!
//! A trace is a file header followed by self-checking, LZ4-compressed chunks
//! ([`framing`]); a chunk holds tagged records ([`records`]); heap events
//! travel in per-thread, delta-encoded runs ([`event`]). The format is
//! documented for people in `docs/trace-format.md`.
//!
//! Not for: interpreting events (replay does that) or rendering anything.
//!
//! ```no_run
//! use memgap_trace::{TraceFile, records::{Records, Record}};
//! let trace = TraceFile::open("t.mgt".as_ref())?;
//! trace.for_each_chunk(|_, chunk| {
//!     for record in Records::new(chunk) {
//!         if let Ok(Record::Rss(rss)) = record { println!("{} bytes resident", rss.vm_rss); }
//!     }
//!     Ok(())
//! })?;
//! # Ok::<(), memgap_trace::TraceError>(())
//! ```

pub mod clock;
pub mod compact;
pub mod event;
pub mod files;
pub mod framing;
pub mod mutate;
pub mod numa;
pub mod python;
pub mod reader;
pub mod records;
pub mod shared;
pub mod smaps;
pub mod varint;
pub mod vocabulary;
pub mod writer;

pub use event::{Event, EventKind};
pub use framing::Tail;
pub use reader::TraceFile;
pub use writer::TraceWriter;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the file is empty (the program may have died before memgap could record anything)")]
    Empty,
    #[error("not a memgap trace")]
    NotATrace,
    #[error("written by a newer memgap (trace format {major}.{minor}; this memgap reads {}.x)", framing::VERSION_MAJOR)]
    NewerVersion { major: u16, minor: u16 },
    #[error("cut short at byte {offset}")]
    CutShort { offset: u64 },
    #[error("corrupt at byte {offset}: {what}")]
    Corrupt { offset: u64, what: &'static str },
}
