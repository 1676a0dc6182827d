//! The statistics of an allocator linked statically into the recorded
//! program (Rust's `tikv-jemallocator` and `mimalloc`, tcmalloc in a C++
//! service): its calls never reach the agent's hooks, so at each snapshot
//! the recorder makes the program report its allocator's own figures, from
//! outside, as `memgap snapshot PID` does (one thread held for the calls,
//! then let go). A mimalloc loaded as a library is asked too: its calls are
//! hooked, but the bytes it has committed, its one figure, no block says.

use memgap_attach::allocator_stats::{LinkedAllocator, linked_allocator, read_stats};
use memgap_model::owners::allocator_stats::AllocatorStats;

pub struct LinkedAllocatorReader {
    allocator: LinkedAllocator,
    failure_noted: bool,
}

impl LinkedAllocatorReader {
    /// The allocator linked into the executable of `pid`, or a mimalloc
    /// library. jemalloc and tcmalloc libraries are left alone: the hooks
    /// see every block they hand out.
    pub fn find(pid: u32) -> Option<LinkedAllocatorReader> {
        let mappings = memgap_attach::procfs::mappings(pid).ok()?;
        let allocator = linked_allocator(pid, &mappings).filter(|a| a.statically_linked || a.name == "mimalloc")?;
        if let Some(why) = allocator.no_call_because() {
            eprintln!("memgap: {} is linked into the program, but {why}", allocator.name);
        }
        Some(LinkedAllocatorReader { allocator, failure_noted: false })
    }

    /// Its figures now; an allocator memgap cannot ask (a mimalloc whose
    /// `mi_process_info` the linker dropped or whose symbols were stripped)
    /// is named with none. A failure is said once and leaves this snapshot without them.
    pub fn read(&mut self, pid: u32) -> Option<AllocatorStats> {
        let read = memgap_attach::procfs::mappings(pid).and_then(|mappings| read_stats(pid, &self.allocator, &mappings));
        let loaded_as_library = !self.allocator.statically_linked;
        match read {
            Ok(Some(stats)) => Some(AllocatorStats { loaded_as_library, ..stats }),
            Ok(None) => Some(AllocatorStats { allocator: self.allocator.name.to_string(), loaded_as_library, ..AllocatorStats::default() }),
            Err(error) => {
                if !std::mem::replace(&mut self.failure_noted, true) {
                    eprintln!(
                        "memgap: {} is {}; its statistics could not be read at a snapshot ({error}); its figures stay unknown there",
                        self.allocator.name,
                        if self.allocator.statically_linked { "linked into the program" } else { "loaded" }
                    );
                }
                None
            }
        }
    }
}
