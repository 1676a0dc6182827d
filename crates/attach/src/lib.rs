//! Reading a running process from outside, with no agent in it: the
//! adapter behind `memgap snapshot PID` (procfs figures for the model's
//! `memgap_model::ProcessLedger`) and `memgap trim PID` (malloc_trim(0)
//! called inside the process through ptrace, on one thread held for the
//! length of the call).
//!
//! Not for: recording (the agent does that) or rendering (views).
//!
//! ```no_run
//! let reading = memgap_attach::read_process(1234)?;
//! let ledger = memgap_model::outside_ledger(&reading);
//! println!("heap: {} bytes of {} RSS", ledger.heap_bytes, ledger.rss_bytes);
//! # Ok::<(), memgap_attach::AttachError>(())
//! ```

#[cfg(target_arch = "x86_64")]
pub mod allocator_stats;
pub mod cgroup;
mod error;
#[cfg(target_arch = "x86_64")]
mod glibc_heap;
#[cfg(target_arch = "x86_64")]
mod glibc_state;
#[cfg(target_arch = "x86_64")]
mod glibc_walk;
mod go_layout;
pub mod go_runtime;
#[cfg(target_arch = "x86_64")]
mod libc_image;
pub mod modules;
pub mod procfs;
#[cfg(target_arch = "x86_64")]
mod remote_call;
mod remote_memory;
pub mod residency;
#[cfg(target_arch = "x86_64")]
mod stack_frames;
#[cfg(target_arch = "x86_64")]
mod tracee;
#[cfg(target_arch = "x86_64")]
mod trim;

pub use error::{AttachError, permission_cause};
#[cfg(target_arch = "x86_64")]
pub use glibc_heap::walk_glibc_heap;
pub use procfs::read_process;
#[cfg(target_arch = "x86_64")]
pub use trim::{TrimOptions, malloc_trim};

/// The walk reads glibc's x86-64 structures.
#[cfg(not(target_arch = "x86_64"))]
pub fn walk_glibc_heap(pid: u32) -> Result<memgap_types::glibc_walk::WalkedHeap, AttachError> {
    Err(AttachError::Unsuitable { pid, state: "cannot have its heap walked: memgap reads glibc's x86-64 malloc state only".into() })
}

/// `memgap trim` injects its call with the x86-64 calling convention.
#[cfg(not(target_arch = "x86_64"))]
pub fn malloc_trim(pid: u32, _options: &TrimOptions) -> Result<memgap_types::outside::TrimCall, AttachError> {
    Err(AttachError::Unsuitable { pid, state: "cannot be trimmed: memgap trim supports x86-64 only".into() })
}

#[cfg(not(target_arch = "x86_64"))]
#[derive(Debug, Clone, Default)]
pub struct TrimOptions {
    pub thread: Option<u32>,
    pub rounds: u32,
    pub pause: std::time::Duration,
    pub patience: std::time::Duration,
}
