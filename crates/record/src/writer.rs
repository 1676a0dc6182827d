//! The writer thread: every round (10 ms by default) it copies out what each
//! thread committed, samples RSS, and every 100 ms (or 512 KiB) compresses the
//! collected records into one checksummed chunk and appends it to the trace.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};

use memgap_trace::framing;
use memgap_trace::records::{Clock, End, EndReason, Module, Record, Rss};

use crate::buffers::{self, Chunk, SLOTS, SLOTS_USED, ThreadState};
use crate::{clock, sys};

const FLUSH_BYTES: usize = 512 * 1024;
const FLUSH_INTERVAL_NS: u64 = 100_000_000;

pub struct Writer {
    fd: i32,
    path: Vec<u8>,
    status_fd: i32,
    raw: Vec<u8>,
    framed: Vec<u8>,
    last_flush_ns: u64,
    pub vm_hwm: u64,
    failed: bool,
}

static WAKE: AtomicU32 = AtomicU32::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

pub fn wake() {
    WAKE.fetch_add(1, Release);
    sys::futex_wake(&WAKE);
}

impl Writer {
    pub fn new(fd: i32, path: Vec<u8>) -> Writer {
        let status_fd = unsafe { libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        Writer { fd, path, status_fd, raw: Vec::with_capacity(FLUSH_BYTES + 128 * 1024), framed: Vec::new(), last_flush_ns: clock::monotonic_ns(), vm_hwm: 0, failed: false }
    }

    pub fn push(&mut self, record: &Record) {
        record.encode(&mut self.raw);
    }

    /// Copies out everything the threads committed and samples RSS.
    pub fn round(&mut self, last: bool) {
        let watermark = clock::now();
        for slot in &SLOTS[..SLOTS_USED.load(Acquire)] {
            let state = slot.load(Acquire);
            if !state.is_null() && self.drain_thread(state) {
                slot.store(core::ptr::null_mut(), Release);
                drop(unsafe { Box::from_raw(state) });
            }
            if self.raw.len() >= FLUSH_BYTES {
                self.flush();
            }
        }
        self.push(&Record::Clock(Clock { time: watermark, monotonic_ns: clock::monotonic_ns() }));
        self.sample_rss();
        if last || self.raw.len() >= FLUSH_BYTES || clock::monotonic_ns() - self.last_flush_ns >= FLUSH_INTERVAL_NS {
            self.flush();
        }
    }

    /// Emits the committed bytes of one thread's chunks; returns true when the
    /// thread has ended and all of it was written.
    fn drain_thread(&mut self, state: *mut ThreadState) -> bool {
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
                continue;
            }
            if closed {
                buffers::recycle(chunk);
                return true;
            }
            return false;
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
    }

    fn sample_rss(&mut self) {
        if self.status_fd < 0 {
            return;
        }
        let mut buf = [0u8; 4096];
        let n = unsafe { libc::pread(self.status_fd, buf.as_mut_ptr() as *mut c_void, buf.len(), 0) };
        if n <= 0 {
            return;
        }
        let mut rss = Rss { time: clock::now(), ..Rss::default() };
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
                Some(b"VmHWM") => self.vm_hwm = kib(),
                _ => {}
            }
        }
        self.push(&Record::Rss(rss));
    }

    pub fn flush(&mut self) {
        self.last_flush_ns = clock::monotonic_ns();
        if self.raw.is_empty() {
            return;
        }
        if !self.failed {
            framing::encode_chunk(&self.raw, &mut self.framed);
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

/// Starts the writer thread with every signal blocked, so that signals meant
/// for the program are never delivered to (or handled on) the agent's thread.
pub fn start_thread() -> bool {
    STOP.store(false, Relaxed);
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut thread: libc::pthread_t = 0;
        let started = libc::pthread_create(&mut thread, core::ptr::null(), writer_main, core::ptr::null_mut()) == 0;
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

extern "C" fn writer_main(_: *mut c_void) -> *mut c_void {
    buffers::mark_thread_untraced();
    unsafe { libc::prctl(libc::PR_SET_NAME, c"memgap-writer".as_ptr()) };
    let interval = crate::recorder::interval_ns();
    while !STOP.load(Acquire) {
        let seen = WAKE.load(Acquire);
        sys::futex_wait(&WAKE, seen, interval);
        if STOP.load(Acquire) {
            break;
        }
        crate::recorder::with_writer(|writer| writer.round(false));
    }
    core::ptr::null_mut()
}
