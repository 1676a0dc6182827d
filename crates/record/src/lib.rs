//! Starting and driving recordings from outside the program: what `memgap
//! run` does besides parsing its arguments and printing.
//!
//! - [`go`]: a Go program's recorder (the agent is not loaded: memgap
//!   writes the trace itself, from the runtime's own figures and the
//!   kernel's page residency);
//! - [`traces`]: the trace files of one run, made exclusively before the
//!   program starts, and the one way to append records to them after it;
//! - [`signals`]: signals for the program reach it while memgap waits;
//! - [`sys`]: the pipe the recorders share.
//!
//! Not for: what runs inside the program (the agent, `memgap-agent`), the
//! trace format (`memgap-trace`), reading a trace back or printing anything
//! but a recorder's own warnings.
//!
//! ```no_run
//! use memgap_record::go::{self, GoOutcome, GoRecording};
//! let command = ["./server".into()];
//! let binary = memgap_source_go::buildinfo::detect("./server".as_ref()).expect("a Go program");
//! let recording = GoRecording { command: &command, rss_interval_ms: 100, snapshot_interval_s: 1.0, quiet: false };
//! match go::record(&recording, &binary, "memgap-server.mgt".as_ref(), 1)? {
//!     GoOutcome::Recorded { trace, exit_code } => println!("{}: exit {exit_code}", trace.display()),
//!     other => eprintln!("{other:?}"),
//! }
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod go;
pub mod signals;
pub mod sys;
pub mod traces;
