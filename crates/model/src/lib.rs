//! The model: facts computed from a replayed trace, ready for any view.
//!
//! Each fact is a plain serializable struct built by a [`memgap_replay::Visitor`]:
//! the [`Summary`] of a run, and the [`Ledger`] (every resident byte in one
//! row, with the page map) at a snapshot; [`compare`] reduces runs of a
//! command under several allocators, measured from outside, to a comparison;
//! and, from outside with no recording, the [`ProcessLedger`] of a running
//! process (filled by an adapter that reads procfs). Views (terminal, JSON,
//! HTML) only format these structs.
//!
//! Not for: reading trace bytes (replay) or formatting (views).
//!
//! The modules depend on one another in one direction, as the data flows
//! (`tests/module_graph.rs` keeps it so): the replayed heap (`heap_state`);
//! the ledger's types and the owner interface (`ledger`); the owners that
//! implement it (`owners`, `go`, `ghc`, `ruby`); the computation of a ledger
//! at a snapshot (`accounting`); the list of owners a replay feeds
//! (`registry`); then what is built from ledgers (`outside_walk`, `summary`,
//! `snapshots`, `blame`, `numa`, `compare`, `report`).
//!
//! ```no_run
//! use memgap_model::{At, ledger_at};
//! let summary = memgap_model::Summary::of_trace("t.mgt".as_ref())?;
//! println!("peak live heap: {} bytes", summary.peak_live_bytes);
//! if let Some(ledger) = ledger_at("t.mgt".as_ref(), At::Gap, false)? {
//!     println!("gap held by {:?}: {:?}", ledger.gap_owner, ledger.findings.first());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod accounting;
pub mod blame;
pub mod compare;
pub mod extents;
pub mod facts;
#[cfg(test)]
mod fixtures;
pub mod ghc;
pub mod glibc_trim;
pub mod go;
mod heap_state;
pub mod ledger;
pub mod numa;
mod outside;
pub mod outside_walk;
pub mod owners;
mod page_walks;
pub mod registry;
pub mod report;
pub mod ruby;
pub mod series;
mod snapshots;
mod summary;
pub mod trim_marks;

pub use blame::{Blame, BlameEntry, BlameOptions, BlameOrder, blame};
pub use go::{GoLedger, GoSizeClass};
pub use heap_state::HeapState;
pub use ledger::{
    Finding, GcMark, HeapKind, HeapLedger, HeapOwner, Ledger, MappingClass, MappingLedger, Moment, OtherBreakdown, OwnerShare, PageClass,
    PageMap, Remedy, Rows, SizeBucket,
};
pub use outside::assess as assess_cgroup;
pub use outside::{
    CgroupMemory, Groups, HeapMapping, KnownRows, ProcessLedger, ProcfsReading, SmapsTotals, StatusRss, TrimCall, TrimReport, UNKNOWN_ROWS,
    outside_ledger, runtime_process_ledger, walked_process_ledger,
};
pub use series::SeriesPoint;
pub use snapshots::{At, Closing, MomentError, SnapshotInfo, Timeline, closing, gap_bytes, ledger_at, list as list_snapshots, timeline};
pub use summary::{RecordingCpu, SizeCount, Summary};
pub use trim_marks::TrimMark;

/// Binary units with three significant digits: `1.50 MiB`, `812 B`.
pub fn human_bytes(value: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if value < 1024 {
        return format!("{value} B");
    }
    let mut scaled = value as f64;
    let mut unit = 0;
    while scaled >= 1024.0 && unit < UNITS.len() - 1 {
        scaled /= 1024.0;
        unit += 1;
    }
    let digits = if scaled >= 100.0 {
        0
    } else if scaled >= 10.0 {
        1
    } else {
        2
    };
    format!("{scaled:.digits$} {}", UNITS[unit])
}
