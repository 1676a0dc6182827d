//! Reading a running process from outside, with no agent in it: the
//! adapter behind `memgap snapshot PID` (procfs figures for the model's
//! [`memgap_model::ProcessLedger`]) and `memgap trim PID`.
//!
//! Not for: recording (the agent does that) or rendering (views).
//!
//! ```no_run
//! let reading = memgap_attach::read_process(1234)?;
//! let ledger = memgap_model::outside_ledger(&reading);
//! println!("heap: {} bytes of {} RSS", ledger.heap_bytes, ledger.rss_bytes);
//! # Ok::<(), memgap_attach::AttachError>(())
//! ```

pub mod cgroup;
mod error;
pub mod modules;
pub mod procfs;

pub use error::{AttachError, permission_cause};
pub use procfs::read_process;
