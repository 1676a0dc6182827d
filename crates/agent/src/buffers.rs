//! Per-thread event buffers: the only thing a traced thread touches on the
//! hot path.
//!
//! Each thread appends encoded events to its current 64 KiB chunk of the
//! area shared with the recorder (see [`memgap_trace::shared`]) and
//! publishes the committed length with a release store. When the chunk is
//! full it takes a free one and links it after the old one by number. The
//! recorder, in its own process, follows each thread's chain from the
//! thread's slot, copies out what is committed and frees a chunk once the
//! thread has moved past it. No lock is taken per event, nor per chunk.

use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

use memgap_trace::event::{DeltaState, Event, EventKind, MAX_RECORD_LEN, RawEncoder, max_record_len};
use memgap_trace::records::Record;
use memgap_trace::shared::{self, Area, CHUNK_DATA, CHUNK_FREE, CHUNK_OWNED, ChunkHeader, SLOT_FILLING, SLOT_FREE, SLOT_LIVE};

use crate::area;
use crate::stacks::ThreadStacks;
use crate::sys::{self, SpinLock};

/// Bytes of events a thread writes between two clock advances of its own
/// (tens of events): the replay orders the events of one time from several
/// threads by causality alone, a search that grows steeply with their
/// number, and many threads handing blocks to each other made some too
/// long for it at four times this.
const TICK_BYTES: usize = 512;

static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
/// In a fork child: the forking thread's number in the parent (low half)
/// and its thread id here (high half), 0 when none. That thread keeps its
/// number; the child's other threads are numbered past the parent's.
static CONTINUED_THREAD: AtomicU64 = AtomicU64::new(0);
/// Where the next search for a free chunk starts.
static TAKE_HINT: AtomicU32 = AtomicU32::new(0);
/// Events dropped before the area existed; the area's count after.
static DROPPED_EARLY: AtomicU64 = AtomicU64::new(0);

pub fn count_dropped(events: u64) {
    match area::get() {
        Some(area) => area.header().dropped.fetch_add(events, Relaxed),
        None => DROPPED_EARLY.fetch_add(events, Relaxed),
    };
}

/// A free chunk below the capacity, taken; `None` if all are taken.
fn try_take_chunk(area: Area) -> Option<u32> {
    let header = area.header();
    let capacity = header.capacity_chunks.load(Acquire).min(header.max_chunks.load(Relaxed));
    if capacity == 0 {
        return None;
    }
    let start = TAKE_HINT.load(Relaxed) % capacity;
    for step in 0..capacity {
        let index = (start + step) % capacity;
        let state = &area.chunk(index).state;
        if state.load(Relaxed) == CHUNK_FREE && state.compare_exchange(CHUNK_FREE, CHUNK_OWNED, Acquire, Relaxed).is_ok() {
            TAKE_HINT.store(index + 1, Relaxed);
            // More than half the chunks in use: have the recorder drain (or
            // grow the area) now rather than at its next round.
            if step * 2 > capacity {
                header.wants_more.store(1, Relaxed);
                area::wake_recorder(header);
            }
            return Some(index);
        }
    }
    None
}

/// How long a thread waiting for a chunk sleeps before it looks again.
const CHUNK_WAIT_NS: u64 = 20_000_000;
/// Waits no wake-up ended, between two searches for a free chunk anyway.
const QUIET_WAITS_BETWEEN_LOOKS: u32 = 10;
/// How long a thread waits for a chunk at most, even from a recorder that
/// still beats: past this, recording stops rather than the program.
const CHUNK_PATIENCE_NS: u64 = 10_000_000_000;

/// A fresh chunk; when every chunk is full the thread waits for the
/// recorder (back-pressure keeps memory bounded). `None` once recording has
/// stopped, or when the recorder stops answering; the caller then drops
/// the event.
fn take_chunk(thread: u32, tid: u32, seq: u32) -> Option<u32> {
    let area = area::get()?;
    let header = area.header();
    let mut last_beat = (0, 0);
    let mut waiting_since = 0;
    let mut look = true;
    let mut quiet_waits = 0;
    let index = loop {
        if look && let Some(index) = try_take_chunk(area) {
            break index;
        }
        if !crate::recorder::is_recording() {
            return None;
        }
        // Asleep until the recorder's next round frees or adds chunks (or a
        // while passes, to see whether it still lives): hundreds of threads
        // waiting must leave it the CPU.
        let freed = header.chunks_freed.0.load(Acquire);
        header.chunk_waiters.fetch_add(1, AcqRel);
        if let Some(index) = try_take_chunk(area) {
            header.chunk_waiters.fetch_sub(1, AcqRel);
            break index;
        }
        // One waiter wakes the recorder for all (each would, every wait, flood it).
        if header.wants_more.swap(1, AcqRel) == 0 {
            area::wake_recorder(header);
        }
        area::futex_wait(&header.chunks_freed.0, freed, CHUNK_WAIT_NS);
        header.chunk_waiters.fetch_sub(1, AcqRel);
        // Only the recorder frees or adds chunks, and it says so on the
        // word: a wait it ended early is worth a search of every chunk, a
        // wait that timed out only now and then (each search reads a page
        // per chunk, and hundreds of threads may be waiting).
        let woken = header.chunks_freed.0.load(Acquire) != freed;
        quiet_waits = if woken { 0 } else { quiet_waits + 1 };
        look = woken || quiet_waits % QUIET_WAITS_BETWEEN_LOOKS == 0;
        let now = crate::clock::monotonic_ns();
        if waiting_since == 0 {
            waiting_since = now;
        }
        if !area::recorder_alive(header, &mut last_beat) || now - waiting_since > CHUNK_PATIENCE_NS {
            crate::recorder::stop_recording();
            return None;
        }
    };
    let chunk = area.chunk(index);
    chunk.len.store(0, Relaxed);
    chunk.next.store(0, Relaxed);
    chunk.closed.store(0, Relaxed);
    chunk.emitted.store(0, Relaxed);
    chunk.thread.store(thread, Relaxed);
    chunk.tid.store(tid, Relaxed);
    chunk.seq.store(seq, Relaxed);
    chunk.taken_in_round.store(header.writer_round.0.load(Acquire), Relaxed);
    chunk.in_hook_since.store(0, Relaxed);
    chunk.live_bytes.store(0, Relaxed);
    Some(index)
}

// ---- the records channel ---------------------------------------------------

/// Where the agent's records (PROCESS, MODULES, NOTE, METRICS) go: a chain
/// of chunks like a thread's, read by the recorder as whole records.
struct Channel {
    chunk: Option<u32>,
    len: u32,
    seq: u32,
}

static CHANNEL: SpinLock<Channel> = SpinLock::new(Channel { chunk: None, len: 0, seq: 0 });

/// Appends `record` to the records channel; false if it could not be (no
/// area, or no chunk to be had).
pub fn push_record(record: &Record) -> bool {
    let Some(area) = area::get() else { return false };
    let mut bytes = Vec::new();
    record.encode(&mut bytes);
    let mut channel = CHANNEL.lock();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let index = match channel.chunk {
            Some(index) if (channel.len as usize) < CHUNK_DATA => index,
            previous => {
                let Some(fresh) = take_chunk(0, 0, channel.seq) else { return false };
                channel.seq += 1;
                match previous {
                    Some(previous) => area.chunk(previous).next.store(fresh + 1, Release),
                    None => area.header().records_first_chunk.store(fresh + 1, Release),
                }
                channel.chunk = Some(fresh);
                channel.len = 0;
                fresh
            }
        };
        let n = rest.len().min(CHUNK_DATA - channel.len as usize);
        // SAFETY: `index` is the channel's own chunk, taken above and below the
        // capacity, whose data is CHUNK_DATA bytes of the mapped area, and
        // `channel.len + n <= CHUNK_DATA`; `rest` is our own buffer, outside the area.
        unsafe { core::ptr::copy_nonoverlapping(rest.as_ptr(), area.chunk_data(index).add(channel.len as usize), n) };
        channel.len += n as u32;
        area.chunk(index).len.store(channel.len, Release);
        rest = &rest[n..];
    }
    true
}

// ---- the calling thread ----------------------------------------------------

const BUSY: usize = 1;
const GONE: usize = 2;
const IN_HOOK: usize = 3;

/// This thread's state, or what the thread is doing instead: `BUSY` while
/// the agent's own code runs on it (its calls into libc pass through
/// unrecorded), `IN_HOOK` from a hook's entry to its exit (a signal
/// handler's heap calls then wait in the thread's nested events, see
/// [`Nested`]), `GONE` once the thread's buffers were closed at thread exit.
///
/// On x86-64 it lives at a fixed offset from the thread pointer (the
/// initial-exec TLS model), read with one load: Rust's `thread_local!` in
/// a shared library calls `__tls_get_addr` at every access, 11
/// instructions and a call per event. The agent is only ever preloaded,
/// and the loader gives preloaded libraries static TLS. The second word is
/// the state itself whatever the first says, read only off the hot path;
/// the third, once the state is closed, where the thread's events would go
/// on (see [`revive_thread_state`]).
mod current {
    use super::ThreadState;

    #[cfg(target_arch = "x86_64")]
    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 3",
        ".globl memgap_current_thread_state",
        ".hidden memgap_current_thread_state",
        ".type memgap_current_thread_state, @tls_object",
        ".size memgap_current_thread_state, 24",
        "memgap_current_thread_state:",
        ".zero 24",
        ".popsection",
    );

    /// This thread's three words: the thread pointer plus the offset the
    /// loader wrote in the GOT.
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

    #[cfg(target_arch = "x86_64")]
    pub fn own() -> *mut ThreadState {
        // SAFETY: this thread's second 8-byte slot.
        unsafe { *slot().add(1) }
    }

    #[cfg(target_arch = "x86_64")]
    pub fn set_own(value: *mut ThreadState) {
        // SAFETY: this thread's second 8-byte slot.
        unsafe { *slot().add(1) = value }
    }

    #[cfg(target_arch = "x86_64")]
    pub fn ended() -> u64 {
        // SAFETY: this thread's third 8-byte slot.
        unsafe { *(slot().add(2) as *mut u64) }
    }

    #[cfg(target_arch = "x86_64")]
    pub fn set_ended(value: u64) {
        // SAFETY: this thread's third 8-byte slot.
        unsafe { *(slot().add(2) as *mut u64) = value }
    }

    #[cfg(not(target_arch = "x86_64"))]
    thread_local! {
        static CURRENT: core::cell::Cell<*mut ThreadState> = const { core::cell::Cell::new(core::ptr::null_mut()) };
        static OWN: core::cell::Cell<*mut ThreadState> = const { core::cell::Cell::new(core::ptr::null_mut()) };
        static ENDED: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn ended() -> u64 {
        ENDED.get()
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn set_ended(value: u64) {
        ENDED.set(value)
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

    #[cfg(not(target_arch = "x86_64"))]
    pub fn own() -> *mut ThreadState {
        OWN.get()
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn set_own(value: *mut ThreadState) {
        OWN.set(value)
    }
}

/// Whether `state` is a thread's state rather than a marker.
#[inline(always)]
fn is_state(state: *mut ThreadState) -> bool {
    state as usize > IN_HOOK
}

/// What a hook found on entry, given back on exit.
#[derive(Clone, Copy)]
pub struct Hook(*mut ThreadState);

/// A hook begins: from here until [`leave_hook`] the thread's heap calls
/// from a signal handler that interrupts it (or from the real allocator
/// itself, such as its mmaps) are kept aside and recorded after the hook's
/// own event, so a handler's reuse of an address the hook frees comes
/// after that free.
///
/// It also tells the recorder, through the thread's chunk, the oldest time
/// the hook's event may carry, before the hook reads that time: a thread
/// preempted between stamping an event and committing it would otherwise
/// commit it after the recorder promised readers every event that old
/// (see `ChunkHeader::in_hook_since`). A plain store, not a fence: it is
/// visible long before the recorder looks, a whole drain after the clock
/// moved on.
///
/// A thread's first hook makes the thread's state, so that its first
/// event is marked like the others; a hook after the state was closed, a
/// state for that hook alone.
#[inline(always)]
pub fn enter_hook() -> Hook {
    let mut state = current::get();
    if !is_state(state) {
        state = match state as usize {
            0 => new_thread_state(),
            GONE => revive_thread_state(),
            _ => return Hook(state),
        };
        if !is_state(state) {
            return Hook(state);
        }
    }
    current::set(IN_HOOK as *mut ThreadState);
    // SAFETY: a live state of this thread, and its current chunk.
    unsafe { (*(*state).chunk).in_hook_since.store(crate::clock::now() + 1, Relaxed) };
    core::sync::atomic::compiler_fence(SeqCst);
    Hook(state)
}

#[inline(always)]
pub fn leave_hook(hook: Hook) {
    let state = hook.0;
    if is_state(state) {
        current::set(state);
        // SAFETY: a live state of this thread.
        unsafe {
            if (*state).leave_work.load(Relaxed) {
                return finish_hook(state);
            }
            // After the events' length: a recorder that sees the hook over sees them.
            (*(*state).chunk).in_hook_since.store(0, Release);
        }
    }
}

/// The end of a hook with more to do: nested events to write, a revived
/// state to close.
#[cold]
#[inline(never)]
fn finish_hook(state: *mut ThreadState) {
    // SAFETY: the live state of this thread, which is no longer in the hook.
    unsafe {
        // Before the events are looked at: a handler's event after this sets it again.
        (*state).leave_work.store(false, Relaxed);
        if (*(*state).nested).len.load(Relaxed) != 0 {
            write_nested(state);
        }
        (*(*state).chunk).in_hook_since.store(0, Release);
        if (*state).revived {
            ThreadState::close(state);
        }
    }
}

/// Events of a signal handler that ran while its thread was in a hook,
/// written to the thread's chunk when the hook ends. Only that thread
/// touches them (a handler runs to its end before the code it interrupted
/// goes on), through shared references.
struct Nested {
    len: AtomicU32,
    events: [core::cell::UnsafeCell<Event>; NESTED_EVENTS],
}

const NESTED_EVENTS: usize = 32;

impl Nested {
    fn new() -> Nested {
        Nested { len: AtomicU32::new(0), events: core::array::from_fn(|_| core::cell::UnsafeCell::new(Event::default())) }
    }

    /// Keeps `event`; false when full. A handler interrupted by another
    /// handler has taken its place before the other writes.
    fn push(&self, event: &Event) -> bool {
        if self.len.load(Relaxed) as usize >= NESTED_EVENTS {
            return false;
        }
        let index = self.len.fetch_add(1, Relaxed) as usize;
        if index >= NESTED_EVENTS {
            return false;
        }
        // SAFETY: the place at `index` is this call's alone.
        unsafe { *self.events[index].get() = *event };
        core::sync::atomic::compiler_fence(Release);
        true
    }
}

/// Writes the nested events, in the order they happened, with the thread
/// in a hook again so that a handler arriving meanwhile adds to them.
#[cold]
#[inline(never)]
fn write_nested(state: *mut ThreadState) {
    current::set(IN_HOOK as *mut ThreadState);
    // SAFETY: this thread's own live state.
    let st = unsafe { &mut *state };
    // SAFETY: boxed with the state, freed only with it in `close`.
    let nested = unsafe { &*st.nested };
    let mut written = 0;
    loop {
        let len = nested.len.load(Acquire);
        for index in written..(len as usize).min(NESTED_EVENTS) {
            // SAFETY: a signal handler on this thread runs to its end before this loop
            // goes on, so the places below `len` are written, and handlers write only
            // at or past `len`.
            let event = unsafe { *nested.events[index].get() };
            st.write(&event);
        }
        written = len as usize;
        if nested.len.compare_exchange(len, 0, AcqRel, Relaxed).is_ok() {
            break;
        }
    }
    if written > NESTED_EVENTS {
        count_dropped((written - NESTED_EVENTS) as u64);
    }
    current::set(state);
}

/// Adds `bytes` (wrapping: a free adds minus its size) to the thread's
/// count of live bytes, which the recorder sums (see
/// `ChunkHeader::live_bytes`). A handler's calls inside a hook are not
/// counted: the signal is approximate.
#[inline(always)]
pub fn count_live(hook: Hook, bytes: u64) {
    let state = hook.0;
    if is_state(state) {
        // SAFETY: a live state of this thread, and its current chunk.
        let live = unsafe { &(*(*state).chunk).live_bytes };
        live.store(live.load(Relaxed).wrapping_add(bytes), Relaxed);
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

#[inline(always)]
pub fn append(hook: Hook, event: &Event) {
    // SAFETY: `append_encoded` calls `encode` only with MAX_RECORD_LEN bytes of
    // room at `out` (see `ThreadState::room`).
    append_encoded(hook, || *event, |delta, out| unsafe { RawEncoder::encode(delta, out, event) });
}

/// Appends the record `encode` writes (at most [`MAX_RECORD_LEN`] bytes);
/// `event` makes the same event for the slow path (the thread's first
/// event, or one it cannot record now). The hooks encode frees and plain
/// allocations from their fields with it, building no [`Event`].
#[inline(always)]
pub fn append_encoded(hook: Hook, event: impl FnOnce() -> Event, encode: impl FnOnce(&mut DeltaState, *mut u8) -> *mut u8) {
    let state = hook.0;
    if !is_state(state) {
        return append_slow(state, &event());
    }
    // SAFETY: `state` is this thread's live state (`is_state`), and only this
    // thread touches it: a signal handler interrupting the hook finds the thread
    // IN_HOOK and keeps its events aside. `room` makes the MAX_RECORD_LEN bytes
    // `encode` may write.
    unsafe {
        let st = &mut *state;
        if st.room(MAX_RECORD_LEN) {
            st.cursor = encode(&mut st.delta, st.cursor);
            st.publish();
        }
    }
}

/// Like [`append`], with the call stack of the allocation. Never inlined:
/// the unwinder skips a fixed number of agent frames (this and the hook).
#[inline(never)]
pub fn append_allocation(hook: Hook, event: &mut Event) {
    let mut state = hook.0;
    if state.is_null() {
        // The thread's first event: make its state here, so the unwinder
        // below still sees the same frames above it.
        state = new_thread_state();
    }
    if !is_state(state) {
        return append_slow(state, event);
    }
    // SAFETY: as in `append_encoded`: this thread's live state, touched only by
    // it; `st.errno` is this thread's errno; `room` makes the bytes the record
    // with its stack definition needs.
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
            st.cursor = match event.kind() {
                kind @ (EventKind::Malloc | EventKind::Calloc | EventKind::Valloc | EventKind::Pvalloc) if new_depth == 0 => {
                    let Event { time, cpu, addr, size, usable, stack, .. } = *event;
                    crate::encode::allocation(&mut st.delta, st.cursor, kind, time, cpu, addr, size, usable, stack)
                }
                _ => {
                    let definition = (new_depth > 0).then(|| st.stacks.as_deref().expect("made above").captured(new_depth));
                    RawEncoder::encode_with_stack(&mut st.delta, st.cursor, event, definition)
                }
            };
            st.publish();
        }
    }
}

#[cold]
fn append_slow(state: *mut ThreadState, event: &Event) {
    match state as usize {
        0 => {
            let state = new_thread_state();
            if state.is_null() {
                count_dropped(1);
            } else {
                // SAFETY: non-null, so a live state, made just now for this thread.
                unsafe { (*state).write(event) };
            }
        }
        IN_HOOK => {
            let own = current::own();
            // SAFETY: `own` is this thread's live state, its nested events boxed with it.
            if own.is_null() || !unsafe { &*(*own).nested }.push(event) {
                count_dropped(1);
            } else {
                // SAFETY: as above; the hook this handler interrupted reads it as it ends.
                unsafe { (*own).leave_work.store(true, Relaxed) };
            }
        }
        GONE => count_dropped(1),
        _ => {}
    }
}

/// Makes the calling thread's state (null if none can be had) and makes
/// it current.
#[cold]
fn new_thread_state() -> *mut ThreadState {
    make_current_state(None, null_mut())
}

/// A heap call of a thread whose state was closed: glibc frees after the
/// last key destructor round, such as the thread-local storage of cached
/// stacks a detached thread lets go of as it exits. Its events go on in the
/// thread's next buffer, under its number, in a state made for this one
/// hook and closed at its end; `GONE` if none can be had.
#[cold]
fn revive_thread_state() -> *mut ThreadState {
    match current::ended() {
        0 => GONE as *mut ThreadState,
        ended => make_current_state(Some((ended as u32, (ended >> 32) as u32)), GONE as *mut ThreadState),
    }
}

/// [`ThreadState::create`] with the thread marked busy and its errno kept;
/// the state made, or `otherwise`, is the thread's from then on.
fn make_current_state(revived: Option<(u32, u32)>, otherwise: *mut ThreadState) -> *mut ThreadState {
    current::set(BUSY as *mut ThreadState);
    // SAFETY: the calling thread's errno (valid for its whole life).
    let errno = unsafe { *libc::__errno_location() };
    let created = ThreadState::create(revived);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    current::set_own(created.unwrap_or(null_mut()));
    let state = created.unwrap_or(otherwise);
    current::set(state);
    state
}

/// The calling thread's state, if it has recorded anything.
pub fn current_state() -> *mut ThreadState {
    let state = current::get();
    if is_state(state) { state } else { null_mut() }
}

pub struct ThreadState {
    cursor: *mut u8,
    /// Where the thread next moves the clock on, or the end of the chunk's
    /// data if that comes first: a record is written only with room
    /// before it, so the hot path makes one comparison for both.
    end: *mut u8,
    data: *mut u8,
    /// The current chunk's header in the area, and its index.
    chunk: *const ChunkHeader,
    chunk_index: u32,
    delta: DeltaState,
    pub thread: u32,
    pub tid: u32,
    next_seq: u32,
    pub destructor_rounds: u32,
    /// Made for one hook after the thread's state was closed (see
    /// [`revive_thread_state`]), and closed again at its end.
    revived: bool,
    /// The hook has more to do as it ends (see [`finish_hook`]): one load
    /// on the hot path. Set by a signal handler on this thread too.
    leave_work: AtomicBool,
    /// The unwinder and stack ids, made at the thread's first allocation.
    stacks: Option<Box<ThreadStacks>>,
    /// The thread's errno, kept across each capture: asking libc where it
    /// is twice per allocation was 1.4 % of a python3 run's samples.
    errno: *mut i32,
    nested: *const Nested,
}

impl ThreadState {
    /// `revived`: the thread's number and next buffer, for a thread whose
    /// state was closed.
    fn create(revived: Option<(u32, u32)>) -> Option<*mut ThreadState> {
        let area = area::get()?;
        let tid = sys::gettid();
        let continued = CONTINUED_THREAD.load(Relaxed);
        let (thread, seq) = if let Some(revived) = revived {
            revived
        } else if continued != 0
            && (continued >> 32) as u32 == tid
            && CONTINUED_THREAD.compare_exchange(continued, 0, Relaxed, Relaxed).is_ok()
        {
            (continued as u32, 0)
        } else {
            (NEXT_THREAD.fetch_add(1, Relaxed), 0)
        };
        // The slot first: while the thread waits for its first chunk, the
        // recorder counts it among the live threads it backs a chunk for.
        let slot = claim_slot(&area)?;
        let Some(index) = take_chunk(thread, tid, seq) else {
            slot.state.store(SLOT_FREE, Release);
            return None;
        };
        let data = area.chunk_data(index);
        // An address on the thread's stack: the ledger counts its mapping as a stack.
        let stack_hint = &thread as *const u32 as u64;
        slot.thread.store(thread, Relaxed);
        slot.tid.store(tid, Relaxed);
        slot.stack_hint.store(stack_hint, Relaxed);
        slot.first_chunk.store(index + 1, Relaxed);
        slot.state.store(SLOT_LIVE, Release);
        let state = Box::into_raw(Box::new(ThreadState {
            cursor: data,
            // SAFETY: `data` starts a chunk's CHUNK_DATA bytes, and TICK_BYTES is less.
            end: unsafe { data.add(TICK_BYTES) },
            data,
            chunk: area.chunk(index),
            chunk_index: index,
            delta: DeltaState::default(),
            thread,
            tid,
            next_seq: seq + 1,
            destructor_rounds: 0,
            revived: revived.is_some(),
            leave_work: AtomicBool::new(revived.is_some()),
            stacks: None,
            // SAFETY: no precondition; the address of this thread's errno.
            errno: unsafe { libc::__errno_location() },
            nested: Box::into_raw(Box::new(Nested::new())),
        }));
        if revived.is_none() {
            crate::recorder::on_new_thread(state);
        }
        Some(state)
    }

    /// Makes sure `len` bytes fit in the current chunk, moving to a fresh
    /// one if not; false (the event is dropped and counted) if none can be had.
    #[inline(always)]
    fn room(&mut self, len: usize) -> bool {
        if (self.end as usize - self.cursor as usize) >= len || self.tick_or_next_chunk(len) {
            return true;
        }
        count_dropped(1);
        false
    }

    /// The thread wrote [`TICK_BYTES`] since it last moved the clock on, or
    /// filled its chunk. Moving the clock on makes its later events later
    /// than those before, so a round in which the recorder fell behind (as
    /// it does when threads outnumber cores) comes in short pieces a reader
    /// can order: a thread's events between two of its ticks, and what the
    /// other threads did meanwhile.
    #[cold]
    fn tick_or_next_chunk(&mut self, len: usize) -> bool {
        crate::clock::advance();
        // SAFETY: the end of the chunk's data, within the mapped area.
        let chunk_end = unsafe { self.data.add(CHUNK_DATA) };
        if (chunk_end as usize - self.cursor as usize) < len && !self.next_chunk() {
            return false;
        }
        // SAFETY: as above, for the chunk `next_chunk` may have moved to.
        let chunk_end = unsafe { self.data.add(CHUNK_DATA) };
        // Room for this record at least: one longer than a tick (a deep
        // stack's definition) must not leave the cursor past `end`.
        self.end = chunk_end.min(self.cursor.wrapping_add(TICK_BYTES.max(len)));
        true
    }

    /// Writes `event` with no stack (the slow paths).
    fn write(&mut self, event: &Event) {
        if self.room(MAX_RECORD_LEN) {
            // SAFETY: `room` made MAX_RECORD_LEN bytes at the cursor.
            self.cursor = unsafe { RawEncoder::encode(&mut self.delta, self.cursor, event) };
            self.publish();
        }
    }

    /// Makes the bytes written so far visible to the recorder.
    #[inline(always)]
    fn publish(&mut self) {
        // SAFETY: the current chunk's header, in the area, which stays mapped while
        // the thread's state lives (only a fork child unmaps it, forgetting the state).
        unsafe { (*self.chunk).len.store((self.cursor as usize - self.data as usize) as u32, Release) };
    }

    #[cold]
    fn next_chunk(&mut self) -> bool {
        let Some(area) = area::get() else { return false };
        // SAFETY: the calling thread's errno.
        let errno = unsafe { *libc::__errno_location() };
        let fresh = take_chunk(self.thread, self.tid, self.next_seq);
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        let Some(index) = fresh else { return false };
        crate::recorder::note_loader_changes();
        self.next_seq += 1;
        let fresh_chunk = area.chunk(index);
        // The hook's mark moves with the thread: on the fresh chunk before
        // the link, off the old one after, so a recorder that finds it gone
        // from the old chunk finds the link and the mark on the fresh one.
        // SAFETY: the old chunk's header: atomics in the area, which stays
        // mapped while the thread's state lives.
        unsafe {
            fresh_chunk.live_bytes.store((*self.chunk).live_bytes.load(Relaxed), Relaxed);
            fresh_chunk.in_hook_since.store((*self.chunk).in_hook_since.load(Relaxed), Relaxed);
            (*self.chunk).next.store(index + 1, Release);
            (*self.chunk).in_hook_since.store(0, Release);
        }
        self.chunk = fresh_chunk;
        self.chunk_index = index;
        self.data = area.chunk_data(index);
        self.cursor = self.data;
        self.delta = DeltaState::default();
        true
    }

    /// Thread exit: the recorder copies out the rest; the state is ours to free.
    ///
    /// # Safety
    /// `state` is the calling thread's live state, from `create`, and is
    /// not used after this.
    pub unsafe fn close(state: *mut ThreadState) {
        current::set(GONE as *mut ThreadState);
        current::set_own(null_mut());
        // SAFETY: `state` and its nested events are live boxes (the caller's
        // contract), freed below; no handler touches them any more, the thread
        // being GONE; `room` in `write` makes room in the chunk.
        unsafe {
            let nested = Box::from_raw((*state).nested as *mut Nested);
            let st = &mut *state;
            for event in nested.events.iter().take((nested.len.load(Acquire) as usize).min(NESTED_EVENTS)) {
                st.write(&*event.get());
            }
            (*st.chunk).closed.store(1, Release);
            current::set_ended(u64::from(st.thread) | u64::from(st.next_seq) << 32);
        }
        // SAFETY: made by `Box::into_raw` in `create`; nothing refers to it now.
        drop(unsafe { Box::from_raw(state) });
    }
}

/// The area's first free slot, taken for a new thread (`SLOT_FILLING`
/// until the thread publishes itself in it).
fn claim_slot(area: &Area) -> Option<&shared::ThreadSlot> {
    let header = area.header();
    for (i, slot) in header.slots.iter().enumerate() {
        if slot.state.load(Relaxed) == SLOT_FREE && slot.state.compare_exchange(SLOT_FREE, SLOT_FILLING, Acquire, Relaxed).is_ok() {
            header.threads_used.fetch_max(i as u32 + 1, AcqRel);
            return Some(slot);
        }
    }
    None
}

/// In a fork child only the forking thread survives, and the area is the
/// parent's: forget this thread's buffer and the records channel. The
/// thread keeps `forking_thread`, its number in the parent, if it had one.
///
/// # Safety
/// Only in a fork child, as [`SpinLock::unlock_after_fork`] says.
pub unsafe fn reset_after_fork(forking_thread: Option<u32>) {
    let continued = forking_thread.map_or(0, |thread| (u64::from(sys::gettid()) << 32) | u64::from(thread));
    CONTINUED_THREAD.store(continued, Relaxed);
    current::set(null_mut());
    current::set_own(null_mut());
    // SAFETY: the caller is the fork child's only thread.
    unsafe { CHANNEL.unlock_after_fork() };
    *CHANNEL.lock() = Channel { chunk: None, len: 0, seq: 0 };
    TAKE_HINT.store(0, Relaxed);
    DROPPED_EARLY.store(0, Relaxed);
}

#[allow(dead_code)]
const _: () = assert!(shared::CHUNK_DATA >= MAX_RECORD_LEN * 2);
