//! The statistics of an allocator linked statically into the recorded
//! program (Rust's `tikv-jemallocator`, tcmalloc in a C++ service): its
//! calls never reach the agent's hooks, so at each snapshot the recorder
//! makes the program report its allocator's own figures, from outside, as
//! `memgap snapshot PID` does (one thread held for the calls, then let go).

use memgap_attach::allocator_stats::{LinkedAllocator, linked_allocator, read_stats};
use memgap_model::owners::allocator_stats::AllocatorStats;

pub struct LinkedAllocatorReader {
    allocator: LinkedAllocator,
    failure_noted: bool,
}

impl LinkedAllocatorReader {
    /// The allocator linked into the executable of `pid`, if any. One in a
    /// library is left alone: its calls go through the hooks.
    pub fn find(pid: u32) -> Option<LinkedAllocatorReader> {
        let mappings = memgap_attach::procfs::mappings(pid).ok()?;
        let allocator = linked_allocator(pid, &mappings).filter(|a| a.statically_linked)?;
        Some(LinkedAllocatorReader { allocator, failure_noted: false })
    }

    /// Its figures now; an allocator memgap cannot ask (mimalloc) is named
    /// with none. A failure is said once and leaves this snapshot without them.
    pub fn read(&mut self, pid: u32) -> Option<AllocatorStats> {
        let read = memgap_attach::procfs::mappings(pid).and_then(|mappings| read_stats(pid, &self.allocator, &mappings));
        match read {
            Ok(Some(stats)) => Some(stats),
            Ok(None) => Some(AllocatorStats { allocator: self.allocator.name.to_string(), ..AllocatorStats::default() }),
            Err(error) => {
                if !std::mem::replace(&mut self.failure_noted, true) {
                    eprintln!(
                        "memgap: {} is linked into the program; its statistics could not be read at a snapshot ({error}); its rows stay unknown there",
                        self.allocator.name
                    );
                }
                None
            }
        }
    }
}
