//! rust_mimalloc: a Rust program whose allocator is mimalloc, linked in
//! statically (the `mimalloc` crate, which compiles mimalloc's C source
//! into the program), so none of its heap calls reach an LD_PRELOAD hook.
//! It builds the heap of ../rust_heap.rs, prints what mimalloc itself says
//! it has committed (its `mi_process_info`, the figure `mi_stats_print`
//! shows as `committed`), then idles for the seconds given (default 0) and
//! exits without dropping what it holds.

#[path = "../../rust_heap.rs"]
mod rust_heap;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's own report of the process (mimalloc.h); NULL pointers are skipped.
    fn mi_process_info(
        elapsed_msecs: *mut usize,
        user_msecs: *mut usize,
        system_msecs: *mut usize,
        current_rss: *mut usize,
        peak_rss: *mut usize,
        current_commit: *mut usize,
        peak_commit: *mut usize,
        page_faults: *mut usize,
    );
}

fn main() {
    let heap = rust_heap::build();
    let (mut current, mut peak) = (0usize, 0usize);
    let null = std::ptr::null_mut();
    // SAFETY: every pointer is NULL or to a local usize, as mi_process_info takes them.
    unsafe { mi_process_info(null, null, null, null, null, &mut current, &mut peak, null) };
    heap.report_and_idle(&[("mimalloc committed", current as u64), ("mimalloc peak_committed", peak as u64)]);
}
