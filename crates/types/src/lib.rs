//! The figures memgap's adapters read, as plain data: what procfs and the
//! cgroup say of a running process, an allocator's own statistics, the
//! NUMA topology and memory samples, a run measured from outside.
//!
//! The adapters that read them (`memgap-attach`, `memgap-measure`,
//! `memgap-source-numa`) depend on this crate and on `memgap-trace`, not on
//! the model; the model (`memgap-model`) takes them as its inputs and
//! re-exports them where its users look for them.
//!
//! Not for: what the figures mean (ledgers, recommendations: the model) or
//! reading them (the adapters).
//!
//! ```
//! use memgap_types::numa::{Node, Topology};
//! let machine = Topology { nodes: vec![Node { id: 0, cpus: vec![0, 1], memory_bytes: 1 << 30 }], distances: vec![vec![10]] };
//! assert_eq!(machine.index_of_cpu(1), Some(0));
//! ```

pub mod allocator_stats;
pub mod compare;
pub mod glibc_walk;
pub mod numa;
pub mod outside;
