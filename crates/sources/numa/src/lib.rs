//! NUMA facts read from the kernel, for the model (`memgap_model::numa`):
//!
//! - [`topology`]: nodes, CPUs, memory and distances from sysfs (the root
//!   is a parameter, so tests read fixture trees);
//! - [`numa_maps`]: resident pages per node of each mapping of any process
//!   (no agent needed);
//! - [`pages`]: the node of given pages of another process (move_pages);
//! - [`sampling`]: memory-access samples (AMD IBS op, Intel PEBS mem-loads)
//!   or, where the hardware cannot, page-fault samples, with perf_event_open;
//! - [`launch`]: those samples of a command from its first instruction.
//!
//! Not for: deciding what the numbers mean (the model) or showing them.
//!
//! ```no_run
//! let topology = memgap_source_numa::topology::read("/sys/devices/system/node".as_ref())?;
//! println!("{} nodes", topology.nodes.len());
//! # Ok::<(), memgap_source_numa::NumaError>(())
//! ```

pub mod launch;
pub mod numa_maps;
pub mod pages;
pub mod sampling;
pub mod topology;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum NumaError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: no node directories (a kernel without NUMA?)", .0.display())]
    NoNodes(PathBuf),
    #[error("{}: cannot read '{text}'", path.display())]
    Malformed { path: PathBuf, text: String },
}
