//! What is measured of one run of a command from outside (crate
//! `memgap-measure`), for `memgap compare` to weigh.

use serde::Serialize;

use crate::numa::AccessLocality;

/// The process tree's RSS at one instant of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RssSample {
    pub seconds: f64,
    pub rss_bytes: u64,
}

/// What was measured of one run of the command.
#[derive(Debug, Clone)]
pub struct Run {
    pub samples: Vec<RssSample>,
    pub wall_seconds: f64,
    /// User + system time of the command and the children it reaped.
    pub cpu_seconds: f64,
    /// The kernel's high-water mark (ru_maxrss) of the largest process of the
    /// tree: exact where sampling could miss a short peak.
    pub max_rss_bytes: u64,
    /// The exit status, 128+N when signal N killed the command.
    pub exit_code: i32,
    pub stdout_hash: u64,
    pub stdout_bytes: u64,
    /// Its lines, when small enough to keep.
    pub stdout: Stdout,
    /// The end of what the command wrote to stderr, to explain a failure.
    pub stderr_tail: String,
    /// Its memory samples' locality when NUMA sampling was asked for, or
    /// why there are none.
    pub numa: Option<Result<RunLocality, String>>,
}

impl Default for Run {
    fn default() -> Run {
        Run {
            samples: Vec::new(),
            wall_seconds: 0.0,
            cpu_seconds: 0.0,
            max_rss_bytes: 0,
            exit_code: 0,
            stdout_hash: 0,
            stdout_bytes: 0,
            stdout: Stdout::Lines(Vec::new()),
            stderr_tail: String::new(),
            numa: None,
        }
    }
}

/// What the sampling of one run gave: the locality, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub struct RunLocality {
    pub locality: AccessLocality,
    /// Why precise access sampling was not used (empty when it was).
    pub access_unavailable_reason: String,
}

/// What a run printed on stdout, as far as it is kept.
#[derive(Debug, Clone, PartialEq)]
pub enum Stdout {
    Lines(Vec<String>),
    /// Too large to keep: only its hash.
    Hashed,
}
