//! memgap's recorder: a library loaded into the traced program with
//! `LD_PRELOAD` (by `memgap run`). It stands in for the malloc family and
//! the mmap family, forwards every call to the allocator the program would
//! have used, and records one event per call into a per-thread buffer in
//! memory shared with the recorder (`memgap run`), which writes the trace
//! from its own process. No thread and no file descriptor of memgap's stay
//! in the program.
//!
//! Not for: analysis of any kind. Symbolization, replay and every number
//! shown to users happen later, in other processes.
//!
//! Rules inside the traced program: never allocate through the program's
//! allocator, never take a lock per event, never change what the program
//! sees (results, errno, signals, exit status, descriptors, threads), and
//! when recording cannot go on, stop and let the program run (the recorder
//! says why).

extern crate alloc;

mod area;
mod buffers;
mod clock;
mod encode;
pub mod hooks;
mod loader;
mod own_memory;
mod process;
mod python;
mod python_frames;
mod real;
mod recorder;
mod stacks;
mod sys;
mod trim_calls;
mod unwind;
mod walk_memo;

#[global_allocator]
static OWN_MEMORY: own_memory::OwnMemory = own_memory::OwnMemory;

extern "C" fn on_load() {
    recorder::on_load();
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
