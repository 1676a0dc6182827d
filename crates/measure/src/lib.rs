//! Measuring a command from outside, with no agent: the RSS of its process
//! tree sampled from /proc over the run, its CPU time from `wait4`'s rusage,
//! its exit status, and a hash of its stdout; where asked, the NUMA
//! locality of its memory events (perf_event_open samples of its process
//! tree, [`memgap_source_numa::launch`]). `memgap compare` runs the same
//! command under several allocators with it.
//!
//! Not for: recording heap events (the agent, `crates/agent`) or comparing
//! runs (`memgap_model::compare`): this crate only produces a
//! [`memgap_types::compare::Run`] per run.
//!
//! ```no_run
//! use std::time::Duration;
//! let command = ["python3".into(), "-c".into(), "x = [0] * 10**7".into()];
//! let env = [("MALLOC_ARENA_MAX".to_string(), "2".to_string())];
//! let setup = memgap_measure::Setup { interval: Duration::from_millis(10), numa: None };
//! let run = memgap_measure::measure(&command, &env, &setup)?;
//! println!("{} samples, {:.2} s CPU, exit {}", run.samples.len(), run.cpu_seconds, run.exit_code);
//! # Ok::<(), memgap_measure::MeasureError>(())
//! ```

mod capture;
mod process_tree;
mod run;

pub use process_tree::ProcessTree;
pub use run::{Setup, measure};

#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error("{program}: command not found")]
    NotFound { program: String },
    #[error("{program}: permission denied")]
    PermissionDenied { program: String },
    #[error("cannot start {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
}

impl MeasureError {
    /// The exit status a shell gives for the same failure: 127 for a command
    /// that does not exist, 126 for one that cannot be executed.
    pub fn shell_exit_code(&self) -> Option<u8> {
        match self {
            MeasureError::NotFound { .. } => Some(127),
            MeasureError::PermissionDenied { .. } | MeasureError::Spawn { .. } => Some(126),
            MeasureError::Io { .. } => None,
        }
    }
}
