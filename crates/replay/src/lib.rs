//! Replay: turns a trace back into one time-ordered story of the process.
//!
//! [`replay`] reads a trace file and hands a [`Visitor`] every item — process
//! images, heap events (merged across threads by time), RSS samples, the end
//! — in the order they happened. [`LiveSet`] applies heap events to give the
//! blocks alive at any instant. [`Timeline`] converts event times to seconds.
//! [`index::Opened`] keeps what was computed from a trace beside it, so the
//! same question is not replayed twice.
//!
//! Not for: deciding what the numbers mean (that is the model) or showing them.
//!
//! ```no_run
//! use memgap_replay::{replay, Visitor, ThreadEvent};
//! struct Count(u64);
//! impl Visitor for Count {
//!     fn event(&mut self, _: &ThreadEvent) { self.0 += 1; }
//! }
//! let mut count = Count(0);
//! let outcome = replay("t.mgt".as_ref(), &mut count)?;
//! println!("{} events, cut short: {}", count.0, outcome.cut_short);
//! # Ok::<(), memgap_trace::TraceError>(())
//! ```

mod address_table;
mod causal;
pub mod index;
mod inherit;
mod live;
mod merge;
mod timeline;

pub use inherit::Inherited;
pub use live::{Block, Change, LiveSet, PlacedBlock};
pub use merge::{Outcome, Progress, ThreadEvent, Visitor, on_progress, replay};
pub use timeline::Timeline;
