//! GHC Haskell programs as a memgap source: the RTS eventlog (heap size,
//! blocks, live data, megablocks returned, GCs per capability, heap-profile
//! samples), the `+RTS -s` summary and the `-Dg` memory inventory, turned
//! into METRICS records (source `ghc`) that the model reads.
//!
//! Not for: deciding what the figures mean (model) or printing them (views).
//!
//! ```no_run
//! let bytes = std::fs::read("prog.eventlog")?;
//! let log = memgap_source_ghc::eventlog::parse(&bytes)?;
//! for metrics in memgap_source_ghc::metrics::to_metrics(&log, |ns| ns) {
//!     println!("{} at {} ns: {:?}", metrics.kind, metrics.monotonic_ns, metrics.values);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod detect;
pub mod eventlog;
pub mod metrics;
pub mod rts_text;
