//! Per-thread event buffers: the only thing a traced thread touches on the
//! hot path.
//!
//! Each thread appends encoded events to its current 64 KiB chunk and
//! publishes the committed length with a release store. When the chunk is
//! full it links a fresh one after it. The writer thread follows each
//! thread's chain of chunks, copies out what is committed, and recycles a
//! chunk once the thread has moved past it. No lock is taken per event; the
//! pool lock is taken once per chunk.

use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

use memgap_trace::event::{DeltaState, Event, MAX_RECORD_LEN, RawEncoder, max_record_len};

use crate::stacks::ThreadStacks;

use crate::sys::{self, SpinLock};

pub const CHUNK_BYTES: usize = 64 * 1024;
const CHUNK_HEADER: usize = 64;
const CHUNK_DATA: usize = CHUNK_BYTES - CHUNK_HEADER;
/// Chunks a thread fills between two clock advances of its own (~40 k events).
const CHUNKS_PER_TICK: u32 = 4;
const CHUNKS_PER_BLOCK: usize = 16;
const BLOCK_BYTES: usize = CHUNK_BYTES * CHUNKS_PER_BLOCK;
const MAX_BLOCKS: usize = 16_384;
pub const MAX_THREADS: usize = 8192;

#[repr(C)]
pub struct Chunk {
    /// Bytes of `data` committed by the owning thread.
    pub len: AtomicU32,
    /// Set by the owner when its thread ended after this chunk.
    pub closed: AtomicBool,
    /// Set by the owner when it moved on; `len` is final from then on.
    pub next: AtomicPtr<Chunk>,
    pub thread: u32,
    pub tid: u32,
    pub seq: u32,
    /// The writer round during which the thread took this chunk (see
    /// [`WRITER_ROUND`]).
    pub taken_in_round: u64,
    /// How much of `data` the writer has copied out; the writer's alone.
    pub emitted: UnsafeCell<u32>,
    pool_next: *mut Chunk,
}

const _: () = assert!(core::mem::size_of::<Chunk>() <= CHUNK_HEADER);

impl Chunk {
    pub fn data(chunk: *mut Chunk) -> *mut u8 {
        unsafe { (chunk as *mut u8).add(CHUNK_HEADER) }
    }
}

pub struct ThreadState {
    cursor: *mut u8,
    /// End of the chunk's data: a record is written only with room for it.
    end: *mut u8,
    data: *mut u8,
    chunk: *mut Chunk,
    delta: DeltaState,
    pub thread: u32,
    pub tid: u32,
    next_seq: u32,
    pub destructor_rounds: u32,
    /// An address on the thread's stack: the ledger counts its mapping as a stack.
    pub stack_hint: u64,
    /// Whether the writer has written this thread's THREAD record; the writer's alone.
    pub announced: UnsafeCell<bool>,
    /// Oldest chunk the writer has not finished with; the writer's alone.
    pub writer_head: UnsafeCell<*mut Chunk>,
    /// The unwinder and stack ids, made at the thread's first allocation.
    stacks: Option<Box<ThreadStacks>>,
    /// The thread's errno, kept across each capture: asking libc where it
    /// is twice per allocation was 1.4 % of a python3 run's samples.
    errno: *mut i32,
}

// ---- global state ----------------------------------------------------------

pub static SLOTS: [AtomicPtr<ThreadState>; MAX_THREADS] = [const { AtomicPtr::new(null_mut()) }; MAX_THREADS];
pub static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Counts the writer's rounds. A round emits only the chunks taken before
/// it began: following each thread's chain to its end kept one round
/// going for as long as fast threads kept filling chunks, and a reader
/// holds a round's events in memory until the next CLOCK record.
pub static WRITER_ROUND: AtomicU64 = AtomicU64::new(0);

struct Pool {
    free: *mut Chunk,
    blocks: [*mut u8; MAX_BLOCKS],
    block_count: usize,
    limit_blocks: usize,
}

struct PoolCell(UnsafeCell<Pool>);
// SAFETY: only accessed under POOL_LOCK (or by the lone thread of a fork child).
unsafe impl Sync for PoolCell {}
static POOL_LOCK: SpinLock = SpinLock::new();
static POOL: PoolCell = PoolCell(UnsafeCell::new(Pool { free: null_mut(), blocks: [null_mut(); MAX_BLOCKS], block_count: 0, limit_blocks: crate::process::DEFAULT_BUFFER_MB as usize * (1 << 20) / BLOCK_BYTES }));
/// Chunks handed out and not yet recycled: the writer is woken when it grows.
pub static CHUNKS_IN_USE: AtomicUsize = AtomicUsize::new(0);

pub fn set_buffer_limit(bytes: usize) {
    let _guard = POOL_LOCK.lock();
    unsafe { (*POOL.0.get()).limit_blocks = (bytes / BLOCK_BYTES).clamp(1, MAX_BLOCKS) };
}

pub fn pool_capacity_chunks() -> usize {
    unsafe { (*POOL.0.get()).limit_blocks * CHUNKS_PER_BLOCK }
}

fn try_take_chunk() -> *mut Chunk {
    let _guard = POOL_LOCK.lock();
    let pool = unsafe { &mut *POOL.0.get() };
    if pool.free.is_null() && pool.block_count < pool.limit_blocks {
        let block = sys::mmap_anonymous(BLOCK_BYTES);
        if !block.is_null() {
            pool.blocks[pool.block_count] = block;
            pool.block_count += 1;
            for i in 0..CHUNKS_PER_BLOCK {
                let chunk = unsafe { block.add(i * CHUNK_BYTES) } as *mut Chunk;
                unsafe { (*chunk).pool_next = pool.free };
                pool.free = chunk;
            }
        }
    }
    let chunk = pool.free;
    if !chunk.is_null() {
        pool.free = unsafe { (*chunk).pool_next };
        CHUNKS_IN_USE.fetch_add(1, Relaxed);
    }
    chunk
}

/// A fresh chunk; when the pool is exhausted the thread waits for the writer
/// (back-pressure keeps memory bounded). `None` once recording has stopped
/// or the writer makes no progress for 10 s; the caller then drops the event.
fn take_chunk(thread: u32, tid: u32, seq: u32) -> Option<*mut Chunk> {
    let mut waited_ns = 0u64;
    let chunk = loop {
        let chunk = try_take_chunk();
        if !chunk.is_null() {
            break chunk;
        }
        if !crate::recorder::is_recording() || waited_ns > 10_000_000_000 {
            return None;
        }
        crate::writer::wake();
        sys::sleep_ns(200_000);
        waited_ns += 200_000;
    };
    unsafe {
        chunk.write(Chunk {
            len: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            next: AtomicPtr::new(null_mut()),
            thread,
            tid,
            seq,
            taken_in_round: WRITER_ROUND.load(Acquire),
            emitted: UnsafeCell::new(0),
            pool_next: null_mut(),
        });
    }
    if CHUNKS_IN_USE.load(Relaxed) * 2 > pool_capacity_chunks() {
        crate::writer::wake();
    }
    // A thread that filled a few chunks since moves the clock on: events
    // after it are later than those before, so a round in which the writer
    // fell behind (millions of events when threads outnumber cores) comes
    // in pieces a reader can order and hand on one at a time, instead of
    // one time it must hold whole.
    if seq % CHUNKS_PER_TICK == CHUNKS_PER_TICK - 1 {
        crate::clock::advance();
    }
    Some(chunk)
}

/// Called by the writer once it has copied out all of `chunk`.
pub fn recycle(chunk: *mut Chunk) {
    let _guard = POOL_LOCK.lock();
    let pool = unsafe { &mut *POOL.0.get() };
    unsafe { (*chunk).pool_next = pool.free };
    pool.free = chunk;
    CHUNKS_IN_USE.fetch_sub(1, Relaxed);
}

// ---- the calling thread ----------------------------------------------------

const BUSY: usize = 1;
const GONE: usize = 2;

/// This thread's state; `BUSY` while inside the agent (re-entrant calls
/// from a signal handler or from libc pass through unrecorded), `GONE`
/// once the thread's buffers were closed at thread exit.
///
/// On x86-64 it lives at a fixed offset from the thread pointer (the
/// initial-exec TLS model), read with one load: Rust's `thread_local!` in
/// a shared library calls `__tls_get_addr` at every access, 11
/// instructions and a call per event. The agent is only ever preloaded,
/// and the loader gives preloaded libraries static TLS.
mod current {
    use super::ThreadState;

    #[cfg(target_arch = "x86_64")]
    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 3",
        ".globl memgap_current_thread_state",
        ".hidden memgap_current_thread_state",
        ".type memgap_current_thread_state, @tls_object",
        ".size memgap_current_thread_state, 8",
        "memgap_current_thread_state:",
        ".zero 8",
        ".popsection",
    );

    /// This thread's slot: the thread pointer plus the offset the loader
    /// wrote in the GOT.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn slot() -> *mut *mut ThreadState {
        let offset: usize;
        // SAFETY: reads a GOT entry the loader filled at load time.
        unsafe {
            core::arch::asm!(
                "mov {offset}, qword ptr [rip + memgap_current_thread_state@GOTTPOFF]",
                offset = out(reg) offset,
                options(nostack, readonly, pure, preserves_flags),
            );
        }
        let thread_pointer = crate::sys::thread_pointer().unwrap_or_default();
        thread_pointer.wrapping_add(offset) as *mut *mut ThreadState
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub fn get() -> *mut ThreadState {
        // SAFETY: this thread's own 8-byte slot.
        unsafe { *slot() }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub fn set(value: *mut ThreadState) {
        // SAFETY: this thread's own 8-byte slot.
        unsafe { *slot() = value }
    }

    #[cfg(not(target_arch = "x86_64"))]
    thread_local! {
        static CURRENT: core::cell::Cell<*mut ThreadState> = const { core::cell::Cell::new(core::ptr::null_mut()) };
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub fn get() -> *mut ThreadState {
        CURRENT.get()
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub fn set(value: *mut ThreadState) {
        CURRENT.set(value)
    }
}

/// Runs `f` with this thread marked busy, so that allocations made by the
/// agent's own code on it are not recorded.
pub fn while_busy<R>(f: impl FnOnce() -> R) -> R {
    let previous = current::get();
    current::set(BUSY as *mut ThreadState);
    let result = f();
    current::set(previous);
    result
}

/// Marks the calling thread (the writer) as never recorded.
pub fn mark_thread_untraced() {
    current::set(BUSY as *mut ThreadState);
}

#[inline(always)]
pub fn append(event: &Event) {
    append_encoded(|| *event, |delta, out| unsafe { RawEncoder::encode(delta, out, event) });
}

/// Appends the record `encode` writes (at most [`MAX_RECORD_LEN`] bytes);
/// `event` makes the same event for the slow path (the thread's first
/// event, or one it cannot record). The hooks encode frees and plain
/// allocations from their fields with it, building no [`Event`].
#[inline(always)]
pub fn append_encoded(event: impl FnOnce() -> Event, encode: impl FnOnce(&mut DeltaState, *mut u8) -> *mut u8) {
    let state = current::get();
    if (state as usize) <= GONE {
        return append_slow(state, &event());
    }
    current::set(BUSY as *mut ThreadState);
    unsafe {
        let st = &mut *state;
        if st.room(MAX_RECORD_LEN) {
            st.cursor = encode(&mut st.delta, st.cursor);
            st.publish();
        }
    }
    current::set(state);
}

/// Like [`append`], with the call stack of the allocation. Never inlined:
/// the unwinder skips a fixed number of agent frames (this and the hook).
#[inline(never)]
pub fn append_allocation(event: &mut Event) {
    let mut state = current::get();
    if state.is_null() {
        // The thread's first event: make its state here, so the unwinder
        // below still sees the same frames above it.
        state = new_thread_state();
    }
    if (state as usize) <= GONE {
        return append_slow(state, event);
    }
    current::set(BUSY as *mut ThreadState);
    unsafe {
        let st = &mut *state;
        let stacks = st.stacks.get_or_insert_with(|| Box::new(ThreadStacks::new()));
        // A thread's first capture looks up its stack and the loaded
        // modules, which may set errno.
        let errno = *st.errno;
        let (id, new_depth) = stacks.capture();
        *st.errno = errno;
        event.stack = id;
        if st.room(max_record_len(new_depth)) {
            let definition = (new_depth > 0).then(|| st.stacks.as_deref().expect("made above").captured(new_depth));
            st.cursor = RawEncoder::encode_with_stack(&mut st.delta, st.cursor, event, definition);
            st.publish();
        }
    }
    current::set(state);
}

#[cold]
fn append_slow(state: *mut ThreadState, event: &Event) {
    if state as usize != 0 {
        if state as usize == GONE {
            DROPPED.fetch_add(1, Relaxed);
        }
        return;
    }
    let state = new_thread_state();
    if state.is_null() {
        DROPPED.fetch_add(1, Relaxed);
    } else {
        append(event);
    }
}

/// Makes the calling thread's state (null if none can be had) and makes
/// it current.
#[cold]
fn new_thread_state() -> *mut ThreadState {
    current::set(BUSY as *mut ThreadState);
    let errno = unsafe { *libc::__errno_location() };
    let created = ThreadState::create().unwrap_or(null_mut());
    unsafe { *libc::__errno_location() = errno };
    current::set(created);
    created
}

/// The calling thread's state, if it has recorded anything.
pub fn current_state() -> *mut ThreadState {
    let state = current::get();
    if (state as usize) <= GONE { null_mut() } else { state }
}

impl ThreadState {
    fn create() -> Option<*mut ThreadState> {
        let thread = NEXT_THREAD.fetch_add(1, Relaxed);
        let tid = sys::gettid();
        let chunk = take_chunk(thread, tid, 0)?;
        let data = Chunk::data(chunk);
        let state = Box::into_raw(Box::new(ThreadState {
            cursor: data,
            end: unsafe { data.add(CHUNK_DATA) },
            data,
            chunk,
            delta: DeltaState::default(),
            thread,
            tid,
            next_seq: 1,
            destructor_rounds: 0,
            stack_hint: &thread as *const u32 as u64,
            announced: UnsafeCell::new(false),
            writer_head: UnsafeCell::new(chunk),
            stacks: None,
            errno: unsafe { libc::__errno_location() },
        }));
        if !register(state) {
            recycle(chunk);
            drop(unsafe { Box::from_raw(state) });
            return None;
        }
        crate::recorder::on_new_thread(state);
        Some(state)
    }

    /// Makes sure `len` bytes fit in the current chunk, moving to a fresh
    /// one if not; false (the event is dropped and counted) if none can be had.
    #[inline(always)]
    fn room(&mut self, len: usize) -> bool {
        if (self.end as usize - self.cursor as usize) >= len || self.next_chunk() {
            return true;
        }
        DROPPED.fetch_add(1, Relaxed);
        false
    }

    /// Makes the bytes written so far visible to the writer.
    #[inline(always)]
    fn publish(&mut self) {
        unsafe { (*self.chunk).len.store((self.cursor as usize - self.data as usize) as u32, Release) };
    }

    #[cold]
    fn next_chunk(&mut self) -> bool {
        let errno = unsafe { *libc::__errno_location() };
        let fresh = take_chunk(self.thread, self.tid, self.next_seq);
        unsafe { *libc::__errno_location() = errno };
        let Some(chunk) = fresh else { return false };
        self.next_seq += 1;
        unsafe { (*self.chunk).next.store(chunk, Release) };
        self.chunk = chunk;
        self.data = Chunk::data(chunk);
        self.cursor = self.data;
        self.end = unsafe { self.data.add(CHUNK_DATA) };
        self.delta = DeltaState::default();
        true
    }

    /// Thread exit: the writer copies out the rest and frees the state.
    pub fn close(state: *mut ThreadState) {
        current::set(GONE as *mut ThreadState);
        unsafe { (*(*state).chunk).closed.store(true, Release) };
    }
}

fn register(state: *mut ThreadState) -> bool {
    for (i, slot) in SLOTS.iter().enumerate() {
        if slot.load(Relaxed).is_null() && slot.compare_exchange(null_mut(), state, AcqRel, Relaxed).is_ok() {
            SLOTS_USED.fetch_max(i + 1, AcqRel);
            return true;
        }
    }
    false
}

/// In a fork child only the forking thread survives, and the trace belongs
/// to the parent: forget every thread and buffer, and give the memory back.
pub fn reset_after_fork() {
    current::set(null_mut());
    for slot in &SLOTS {
        slot.store(null_mut(), Relaxed);
    }
    SLOTS_USED.store(0, Relaxed);
    DROPPED.store(0, Relaxed);
    POOL_LOCK.reset();
    let pool = unsafe { &mut *POOL.0.get() };
    for block in &mut pool.blocks[..pool.block_count] {
        sys::munmap(*block, BLOCK_BYTES);
        *block = null_mut();
    }
    pool.block_count = 0;
    pool.free = null_mut();
    CHUNKS_IN_USE.store(0, Relaxed);
}
