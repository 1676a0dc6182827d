//! rust_jemalloc: a Rust program whose allocator is jemalloc, linked in
//! statically (tikv-jemallocator, symbols prefixed `_rjem_`), so none of its
//! heap calls reach an LD_PRELOAD hook. It builds the heap of
//! ../rust_heap.rs, prints jemalloc's own `stats.allocated` and
//! `stats.resident`, then idles for the seconds given (default 0) and exits
//! without dropping what it holds.

use tikv_jemalloc_ctl::{epoch, stats};

#[path = "../../rust_heap.rs"]
mod rust_heap;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let heap = rust_heap::build();
    epoch::advance().expect("jemalloc epoch");
    let allocated = stats::allocated::read().expect("stats.allocated");
    let resident = stats::resident::read().expect("stats.resident");
    heap.report_and_idle(&[("jemalloc stats.allocated", allocated as u64), ("jemalloc stats.resident", resident as u64)]);
}
