//! The model: facts computed from a replayed trace, ready for any view.
//!
//! Each fact is a plain serializable struct built by a [`memgap_replay::Visitor`];
//! views (terminal, JSON, HTML) only format these structs.
//!
//! Not for: reading trace bytes (replay) or formatting (views).
//!
//! ```no_run
//! let summary = memgap_model::Summary::of_trace("t.mgt".as_ref())?;
//! println!("peak live heap: {} bytes", summary.peak_live_bytes);
//! # Ok::<(), memgap_trace::TraceError>(())
//! ```

mod summary;

pub use summary::{SizeCount, Summary};
