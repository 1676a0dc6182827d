//! The writer thread: every round (10 ms by default) it copies out what each
//! thread committed to the chunks it took before the round began, samples
//! RSS, and every 100 ms (or 512 KiB) compresses the collected records into
//! one checksummed chunk and appends it to the trace.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};

use memgap_trace::framing;
use memgap_trace::records::{Clock, End, EndReason, Module, Record, Rss, SnapshotReason, Thread};

use crate::buffers::{self, Chunk, SLOTS, SLOTS_USED, ThreadState};
use crate::placement::Placer;
use crate::snapshot::Snapshotter;
use crate::trim_calls::{self, TrimCall};
use crate::{clock, sys};

const FLUSH_BYTES: usize = 512 * 1024;
const FLUSH_INTERVAL_NS: u64 = 100_000_000;
/// A program's malloc_trim gets a snapshot after it, but no sooner than this
/// after the previous snapshot, nor than ten times that snapshot's cost: a
/// program trimming in a loop must not keep the writer snapshotting.
const TRIM_SNAPSHOT_GAP_NS: u64 = 100_000_000;

pub struct Writer {
    fd: i32,
    path: Vec<u8>,
    status_fd: i32,
    raw: Vec<u8>,
    framed: Vec<u8>,
    encoder: framing::ChunkEncoder,
    last_flush_ns: u64,
    pub vm_hwm: u64,
    failed: bool,
    snapshotter: Snapshotter,
    placer: Placer,
    snapshot_interval_ns: u64,
    last_snapshot_ns: u64,
    last_snapshot_cost_ns: u64,
    /// The program's malloc_trim calls, taken from their slots each round.
    trim_calls: Vec<TrimCall>,
    /// RSS at the largest snapshot so far; 5 % above it triggers another.
    snapshot_peak_rss: u64,
    /// `<trace>.snap`: `memgap snap PID` creates it, we remove it when done.
    request_path: Vec<u8>,
    /// The loader's (adds, subs) when modules were last recorded.
    loader_generation: (u64, u64),
}

/// How far a round took one thread's chunks.
#[derive(Debug, PartialEq, Eq)]
enum Drained {
    /// To the end of what the thread has committed.
    CaughtUp,
    /// To a chunk the thread took during the round.
    Behind,
    /// The thread has ended and all of it was written.
    Ended,
}

static WAKE: AtomicU32 = AtomicU32::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

pub fn wake() {
    WAKE.fetch_add(1, Release);
    sys::futex_wake(&WAKE);
}

impl Writer {
    pub fn new(fd: i32, path: Vec<u8>, snapshot_interval_ns: u64) -> Writer {
        let status_fd = unsafe { libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        let mut request_path = path.clone();
        request_path.extend_from_slice(b".snap\0");
        let now = clock::monotonic_ns();
        Writer {
            fd,
            path,
            status_fd,
            raw: Vec::with_capacity(FLUSH_BYTES + 128 * 1024),
            framed: Vec::new(),
            encoder: framing::ChunkEncoder::default(),
            last_flush_ns: now,
            vm_hwm: 0,
            failed: false,
            snapshotter: Snapshotter::new(),
            placer: Placer::new(),
            snapshot_interval_ns,
            last_snapshot_ns: now,
            last_snapshot_cost_ns: 0,
            trim_calls: Vec::new(),
            snapshot_peak_rss: 0,
            request_path,
            loader_generation: crate::process::loader_generation(),
        }
    }

    pub fn push(&mut self, record: &Record) {
        record.encode(&mut self.raw);
    }

    /// Copies out what the threads committed before the round began (all
    /// of it in the `last` round) and samples RSS. False when a thread took
    /// chunks during the round: they are due at once, in the next round.
    pub fn round(&mut self, last: bool) -> bool {
        // The chunks taken from here on wait for the next round, except in
        // the last, which takes everything. That keeps the CLOCK promise:
        // an event stamped before the previous round began was committed
        // (one round of slack) in a chunk taken before this one began.
        let round = buffers::WRITER_ROUND.fetch_add(1, AcqRel) + 1;
        let taken_before = if last { u64::MAX } else { round };
        let watermark = clock::advance();
        let mut caught_up = true;
        for slot in &SLOTS[..SLOTS_USED.load(Acquire)] {
            let state = slot.load(Acquire);
            if state.is_null() {
                continue;
            }
            match self.drain_thread(state, taken_before) {
                Drained::Ended => {
                    slot.store(core::ptr::null_mut(), Release);
                    drop(unsafe { Box::from_raw(state) });
                }
                Drained::Behind => caught_up = false,
                Drained::CaughtUp => {}
            }
        }
        self.push(&Record::Clock(Clock { time: watermark, monotonic_ns: clock::monotonic_ns() }));
        self.write_trim_calls();
        let rss = self.sample_rss();
        // A dlopen/dlclose since the last round: record the modules again
        // so stacks through the new code can be named.
        let generation = crate::process::loader_generation();
        if generation != self.loader_generation {
            self.loader_generation = generation;
            self.push(&Record::Modules(crate::process::loaded_modules()));
        }
        if !last {
            if let Some(reason) = self.snapshot_due(&rss) {
                self.snapshot(reason, rss);
            }
        }
        if last || self.raw.len() >= FLUSH_BYTES || clock::monotonic_ns() - self.last_flush_ns >= FLUSH_INTERVAL_NS {
            self.flush();
        }
        caught_up
    }

    /// Emits the committed bytes of one thread's chunks taken before round
    /// `taken_before`.
    fn drain_thread(&mut self, state: *mut ThreadState, taken_before: u64) -> Drained {
        let announced = unsafe { &mut *(*state).announced.get() };
        if !*announced {
            *announced = true;
            let (thread, tid, stack_hint) = unsafe { ((*state).thread, (*state).tid, (*state).stack_hint) };
            self.push(&Record::Thread(Thread { thread, tid, stack_hint }));
        }
        let head = unsafe { &mut *(*state).writer_head.get() };
        loop {
            let chunk = *head;
            let next = unsafe { (*chunk).next.load(Acquire) };
            let closed = unsafe { (*chunk).closed.load(Acquire) };
            // Loaded after `next`/`closed`: final if either was set.
            let len = unsafe { (*chunk).len.load(Acquire) };
            self.emit(chunk, len);
            if !next.is_null() {
                buffers::recycle(chunk);
                *head = next;
                if unsafe { (*next).taken_in_round } >= taken_before {
                    return Drained::Behind;
                }
                continue;
            }
            if closed {
                buffers::recycle(chunk);
                return Drained::Ended;
            }
            return Drained::CaughtUp;
        }
    }

    fn emit(&mut self, chunk: *mut Chunk, len: u32) {
        let emitted = unsafe { &mut *(*chunk).emitted.get() };
        if len <= *emitted {
            return;
        }
        let bytes = unsafe { core::slice::from_raw_parts(Chunk::data(chunk).add(*emitted as usize), (len - *emitted) as usize) };
        let (thread, tid, seq) = unsafe { ((*chunk).thread, (*chunk).tid, (*chunk).seq) };
        Record::encode_events(&mut self.raw, thread, tid, seq, *emitted, bytes);
        *emitted = len;
        // A thread may have filled many buffers since the last round; a
        // chunk must stay under the readers' limit (16 MiB).
        if self.raw.len() >= FLUSH_BYTES {
            self.flush();
        }
    }

    fn write_trim_calls(&mut self) {
        let mut calls = core::mem::take(&mut self.trim_calls);
        let lost = trim_calls::take(&mut calls);
        for call in &calls {
            self.push(&call.record());
        }
        calls.clear();
        self.trim_calls = calls;
        if lost > 0 {
            let text = format!("{lost} malloc_trim calls were not recorded: more than the agent holds between two writer rounds");
            self.push(&Record::Note { time: clock::now(), text });
        }
    }

    fn snapshot_due(&mut self, rss: &Rss) -> Option<SnapshotReason> {
        let requested = unsafe { libc::access(self.request_path.as_ptr() as *const libc::c_char, libc::F_OK) } == 0;
        if requested {
            return Some(SnapshotReason::Requested);
        }
        if rss.vm_rss * 100 > self.snapshot_peak_rss * 105 && rss.vm_rss > 0 {
            return Some(SnapshotReason::RssPeak);
        }
        // The program asked for it by trimming: the same reason as its
        // memgap_snapshot() (the trace format has no reason of its own for it).
        let since_last = clock::monotonic_ns() - self.last_snapshot_ns;
        if trim_calls::snapshot_wanted() && since_last >= TRIM_SNAPSHOT_GAP_NS.max(self.last_snapshot_cost_ns * 10) {
            return Some(SnapshotReason::Program);
        }
        let periodic = self.snapshot_interval_ns > 0 && since_last >= self.snapshot_interval_ns;
        periodic.then_some(SnapshotReason::Periodic)
    }

    /// Takes a snapshot now and writes it out at once (a request is answered
    /// only when its snapshot is on disk).
    pub fn snapshot(&mut self, reason: SnapshotReason, rss: Rss) {
        // Any snapshot from here on shows what an earlier trim did.
        trim_calls::take_snapshot_request();
        let status_fd = self.status_fd;
        let snapshot = self.snapshotter.take(reason, rss, || read_status(status_fd, &mut 0).vm_rss);
        self.last_snapshot_ns = clock::monotonic_ns();
        self.last_snapshot_cost_ns = snapshot.cost_ns;
        self.snapshot_peak_rss = self.snapshot_peak_rss.max(snapshot.rss.vm_rss);
        let placement = self.placer.place(&snapshot);
        self.push(&Record::Snapshot(snapshot));
        self.push(&Record::Placement(placement));
        self.flush();
        if reason == SnapshotReason::Requested {
            unsafe { libc::unlink(self.request_path.as_ptr() as *const libc::c_char) };
        }
    }

    /// The current RSS; also recorded as an RSS sample.
    pub fn sample_rss(&mut self) -> Rss {
        let rss = read_status(self.status_fd, &mut self.vm_hwm);
        self.push(&Record::Rss(rss));
        rss
    }

    pub fn flush(&mut self) {
        self.last_flush_ns = clock::monotonic_ns();
        if self.raw.is_empty() {
            return;
        }
        if !self.failed {
            self.encoder.encode(&self.raw, &mut self.framed);
            if let Err(errno) = sys::write_all(self.fd, &self.framed) {
                self.failed = true;
                crate::recorder::stop_recording();
                sys::log(&[b"recording stopped: cannot write ", &self.path, b": ", sys::errno_text(errno), b" (the program continues; the trace keeps what was written)"]);
            }
        }
        self.raw.clear();
    }

    /// The final round: everything committed, the modules, and the END record.
    pub fn finish(&mut self, reason: EndReason, exit_code: Option<i32>, modules: Vec<Module>) {
        self.round(true);
        let rss = self.sample_rss();
        self.snapshot(SnapshotReason::Exit, rss);
        self.push(&Record::Modules(modules));
        let end = End { time: clock::now(), reason, dropped_events: buffers::DROPPED.load(Relaxed), vm_hwm: self.vm_hwm, exit_code };
        self.push(&Record::End(end));
        self.flush();
        unsafe { libc::close(self.fd) };
        if self.status_fd >= 0 {
            unsafe { libc::close(self.status_fd) };
        }
    }
}

/// VmRSS, RssAnon, RssFile and RssShmem from /proc/self/status (`fd`), and
/// VmHWM into `vm_hwm`.
pub(crate) fn read_status(fd: i32, vm_hwm: &mut u64) -> Rss {
    let mut rss = Rss { time: clock::now(), ..Rss::default() };
    if fd < 0 {
        return rss;
    }
    let mut buf = [0u8; 4096];
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr() as *mut c_void, buf.len(), 0) };
    if n <= 0 {
        return rss;
    }
    for line in buf[..n as usize].split(|&b| b == b'\n') {
        let kib = || -> u64 {
            let digits = line.iter().skip_while(|b| !b.is_ascii_digit()).take_while(|b| b.is_ascii_digit());
            digits.fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0')) * 1024
        };
        match line.split(|&b| b == b':').next() {
            Some(b"VmRSS") => rss.vm_rss = kib(),
            Some(b"RssAnon") => rss.rss_anon = kib(),
            Some(b"RssFile") => rss.rss_file = kib(),
            Some(b"RssShmem") => rss.rss_shmem = kib(),
            Some(b"VmHWM") => *vm_hwm = kib(),
            _ => {}
        }
    }
    rss
}

/// Starts the writer thread.
pub fn start_thread() -> bool {
    STOP.store(false, Relaxed);
    spawn_quiet_thread(writer_main)
}

/// Starts a detached agent thread with every signal blocked, so that signals
/// meant for the program are never delivered to (or handled on) it.
pub fn spawn_quiet_thread(main: extern "C" fn(*mut c_void) -> *mut c_void) -> bool {
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut thread: libc::pthread_t = 0;
        let started = libc::pthread_create(&mut thread, core::ptr::null(), main, core::ptr::null_mut()) == 0;
        if started {
            libc::pthread_detach(thread);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        started
    }
}

pub fn stop_thread() {
    STOP.store(true, Release);
    wake();
}

/// The writer's stack is memgap's memory too.
fn register_own_stack() {
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) == 0 {
            let mut base: *mut c_void = core::ptr::null_mut();
            let mut size: usize = 0;
            if libc::pthread_attr_getstack(&attr, &mut base, &mut size) == 0 {
                sys::agent_ranges::add(base as u64, size as u64);
            }
            libc::pthread_attr_destroy(&mut attr);
        }
    }
}

extern "C" fn writer_main(_: *mut c_void) -> *mut c_void {
    buffers::mark_thread_untraced();
    unsafe { libc::prctl(libc::PR_SET_NAME, c"memgap-writer".as_ptr()) };
    register_own_stack();
    let interval = crate::recorder::interval_ns();
    let mut caught_up = true;
    while !STOP.load(Acquire) {
        if caught_up {
            let seen = WAKE.load(Acquire);
            sys::futex_wait(&WAKE, seen, interval);
            if STOP.load(Acquire) {
                break;
            }
        }
        caught_up = crate::recorder::with_writer(|writer| writer.round(false)).unwrap_or(true);
    }
    core::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_trace::event::{self, DeltaState, Event, EventKind};
    use memgap_trace::records::Records;
    use memgap_trace::varint::Cursor;

    /// (buffer, events) of each EVENTS record the writer has collected.
    fn pieces(raw: &[u8]) -> Vec<(u32, u64)> {
        Records::new(raw)
            .filter_map(|record| match record.unwrap() {
                Record::Events(piece) => {
                    let (mut state, mut cursor, mut events) = (DeltaState::default(), Cursor::new(piece.records), 0);
                    while !cursor.is_empty() {
                        event::decode(&mut state, &mut cursor).unwrap();
                        events += 1;
                    }
                    Some((piece.buffer, events))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_round_takes_only_the_chunks_taken_before_it_began() {
        std::thread::spawn(|| {
            let append = |from: u64, count: u64| {
                for i in from..from + count {
                    let event = Event { kind: Some(EventKind::Malloc), addr: 0x1000_0000 + i * 48, size: 32, usable: 40, time: clock::now(), ..Event::default() };
                    buffers::append(&event);
                }
            };
            // Over two chunks each (records of 4 bytes), while what the
            // writer collects stays below FLUSH_BYTES.
            append(0, 40_000);
            let state = buffers::current_state();
            let round = buffers::WRITER_ROUND.fetch_add(1, AcqRel) + 1;
            append(40_000, 40_000);

            let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) };
            let mut writer = Writer::new(null, b"/dev/null".to_vec(), 0);
            assert_eq!(writer.drain_thread(state, round), Drained::Behind);
            let first = pieces(&writer.raw);
            writer.raw.clear();
            buffers::ThreadState::close(state);
            assert_eq!(writer.drain_thread(state, u64::MAX), Drained::Ended);
            let rest = pieces(&writer.raw);

            // The round stopped at the first chunk taken after it began,
            // having emitted every chunk before it whole; the rest follows.
            let events = |pieces: &[(u32, u64)]| pieces.iter().map(|p| p.1).sum::<u64>();
            let (last_before, first_after) = (first.last().unwrap().0, rest.first().unwrap().0);
            assert_eq!(first_after, last_before + 1, "{first:?} then {rest:?}");
            assert!(first.len() >= 3 && (40_000..60_000).contains(&events(&first)), "{first:?}");
            assert_eq!(events(&first) + events(&rest), 80_000);
            unsafe { libc::close(null) };
        })
        .join()
        .unwrap();
    }
}
