//! The heap owners of the mallocs (glibc, jemalloc, tcmalloc, mimalloc), of
//! CPython and of Node, and what every owner shares.
//!
//! Each owner implements [`HeapOwner`](crate::ledger::HeapOwner) in a file
//! of its own; the list the ledger asks is `crate::registry`.

pub mod allocator_stats;
pub mod glibc;
pub mod jemalloc;
pub mod malloc;
pub mod mimalloc;
pub mod node;
pub mod python;
pub mod tcmalloc;

/// Seconds between `start_ns` and `ns`.
pub(crate) fn seconds_since(start_ns: u64, ns: u64) -> f64 {
    ns.saturating_sub(start_ns) as f64 / 1e9
}
