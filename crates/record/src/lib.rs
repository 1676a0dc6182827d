//! memgap's recorder: a library loaded into the traced program with
//! `LD_PRELOAD` (by `memgap run`). It stands in for the malloc family and
//! the mmap family, forwards every call to the allocator the program would
//! have used, and records one event per call into a per-thread buffer; a
//! writer thread compresses the buffers into the trace file.
//!
//! Not for: analysis of any kind. Symbolization, replay and every number
//! shown to users happen later, in other processes.
//!
//! Rules inside the traced program: never allocate through the program's
//! allocator, never take a lock per event, never change what the program
//! sees (results, errno, signals, exit status), and when recording cannot
//! go on, say so once and let the program run.

extern crate alloc;

mod buffers;
mod clock;
pub mod hooks;
mod own_memory;
mod placement;
mod process;
mod real;
mod snapshot;
mod stacks;
mod recorder;
mod sys;
mod trim_calls;
mod unwind;
mod walk_memo;
mod writer;

#[global_allocator]
static OWN_MEMORY: own_memory::OwnMemory = own_memory::OwnMemory;

extern "C" fn on_load() {
    recorder::on_load();
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
