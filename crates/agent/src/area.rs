//! The area shared with the recorder (see `memgap_trace::shared`): made by
//! the agent itself, inside the run's private directory, mapped once and
//! its descriptor closed at once, so nothing of memgap stays in the
//! program's descriptor table. Every process image makes its own: after a
//! fork the child's events must not mix with the parent's, and an exec
//! leaves the old image's mapping behind.
//!
//! Talking to the recorder: the agent bumps `wake` (a futex shared between
//! the two processes), and for a request (a snapshot, VmRSS) waits on
//! `answered` while the recorder's heartbeat moves. A recorder that stops
//! answering for [`RECORDER_PATIENCE_NS`] is taken for dead: recording stops,
//! the program runs on.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

use memgap_trace::shared::{self, AGENT_RECORDING, Area, Header, RECORDER_GONE};

use crate::sys::{self, SpinLock};

/// How long the agent waits for a recorder whose heartbeat stands still.
pub const RECORDER_PATIENCE_NS: u64 = 1_000_000_000;
/// Under an address-space limit, the area takes at most this fraction of it.
const ADDRESS_SPACE_SHARE: u64 = 64;

static BASE: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());
static MAPPED_BYTES: AtomicU64 = AtomicU64::new(0);
/// One request to the recorder at a time, among this process's threads.
static REQUEST_LOCK: SpinLock<()> = SpinLock::new(());

/// The area of this process image, once made.
#[inline(always)]
pub fn get() -> Option<Area> {
    let base = BASE.load(Acquire);
    // SAFETY: BASE is only ever a mapping of a whole area, made by `create`, and
    // is cleared before that mapping goes (`forget_after_fork`).
    (!base.is_null()).then(|| unsafe { Area::from_base(base) })
}

/// Makes `<dir>/<pid>.<n>.area` (the first free n: an exec'd image finds
/// its predecessor's still there), with room for `budget_chunks` and one
/// chunk per thread slot beyond (address space only, until the recorder
/// backs them), the first chunks backed, and maps it. Errors are the errno
/// and what failed.
pub fn create(dir: &[u8], run_id: u64, budget_chunks: u32) -> Result<Area, (i32, &'static str)> {
    let pid = sys::getpid();
    let mut path = Vec::with_capacity(dir.len() + 32);
    let mut fd = -1;
    for n in 0..1000u32 {
        path.clear();
        path.extend_from_slice(dir);
        path.push(b'/');
        push_decimal(&mut path, pid);
        path.push(b'.');
        push_decimal(&mut path, n);
        path.extend_from_slice(shared::AREA_SUFFIX.as_bytes());
        path.push(0);
        // Owner only, never through a symlink, never someone else's file.
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: `path` is NUL-terminated; the kernel checks the rest.
        fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), flags, 0o600) } as i32;
        if fd >= 0 || sys::errno() != libc::EEXIST {
            break;
        }
    }
    if fd < 0 {
        return Err((sys::errno(), "create"));
    }
    // A file size limit (ulimit -f) below the buffers: smaller buffers, or
    // none. An address-space limit (ulimit -v): buffers of a small share of
    // it, so the program keeps nearly all of its own.
    let mut max_chunks = budget_chunks.saturating_add(shared::THREAD_SLOTS as u32);
    for (resource, share) in [(libc::RLIMIT_FSIZE, 1), (libc::RLIMIT_AS, ADDRESS_SPACE_SHARE)] {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `limit` is ours to write.
        if unsafe { libc::getrlimit(resource, &mut limit) } == 0 && limit.rlim_cur != libc::RLIM_INFINITY {
            let fitting = ((limit.rlim_cur / share) as usize).saturating_sub(shared::HEADER_BYTES) / shared::CHUNK_BYTES;
            max_chunks = max_chunks.min(fitting as u32);
        }
    }
    if max_chunks < 2 {
        // SAFETY: `path` is NUL-terminated, `fd` our own descriptor.
        unsafe {
            libc::syscall(libc::SYS_unlinkat, libc::AT_FDCWD, path.as_ptr(), 0);
            libc::syscall(libc::SYS_close, fd);
        }
        return Err((libc::EFBIG, "size"));
    }
    let bytes = shared::area_bytes(max_chunks);
    let initial = shared::area_bytes(shared::INITIAL_CHUNKS.min(max_chunks));
    let fail = |what| {
        let errno = sys::errno();
        // SAFETY: as above.
        unsafe {
            libc::syscall(libc::SYS_unlinkat, libc::AT_FDCWD, path.as_ptr(), 0);
            libc::syscall(libc::SYS_close, fd);
        }
        Err((errno, what))
    };
    // Backed up front (not just sized): a page of a full tmpfs touched
    // through the mapping would kill the program with SIGBUS.
    // SAFETY: `fd` is our own descriptor.
    let sized = sys::without_xfsz(|| unsafe { libc::syscall(libc::SYS_ftruncate, fd, bytes) } == 0);
    if !sized {
        return fail("size");
    }
    // SAFETY: as above.
    let reserved = sys::without_xfsz(|| unsafe { libc::syscall(libc::SYS_fallocate, fd, 0, 0i64, initial as i64) } == 0);
    if !reserved {
        return fail("reserve");
    }
    // SAFETY: a new shared mapping of our own file, placed by the kernel: it
    // replaces nothing of the program's.
    let addr = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            core::ptr::null_mut::<u8>(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd as i64,
            0i64,
        )
    };
    if addr == -1 || addr == 0 {
        return fail("map");
    }
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    sys::agent_ranges::add(addr as u64, bytes as u64);
    // SAFETY: `addr` maps the whole area, `bytes` long, which stays mapped
    // for the life of this process image.
    let area = unsafe { Area::from_base(addr as *mut u8) };
    let header = area.header();
    header.pid.store(pid, Relaxed);
    header.ppid.store(sys::getppid(), Relaxed);
    header.run_id.store(run_id, Relaxed);
    header.max_chunks.store(max_chunks, Relaxed);
    header.budget_chunks.store(budget_chunks.min(max_chunks), Relaxed);
    header.capacity_chunks.store(shared::INITIAL_CHUNKS.min(max_chunks), Relaxed);
    header.agent_address.store(addr as u64, Relaxed);
    header.created_ns.store(crate::clock::monotonic_ns(), Relaxed);
    header.agent_state.store(AGENT_RECORDING, Relaxed);
    header.magic.store(shared::AREA_MAGIC, Release);
    MAPPED_BYTES.store(bytes as u64, Relaxed);
    BASE.store(addr as *mut u8, Release);
    crate::clock::use_area(&header.clock.0);
    sys::agent_ranges::publish();
    Ok(area)
}

fn push_decimal(out: &mut Vec<u8>, value: u32) {
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    let mut v = value;
    loop {
        start -= 1;
        digits[start] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

/// In a fork child: the parent's area is the parent's. Unmapped here; the
/// child makes its own.
///
/// # Safety
/// Only in a fork child, as [`SpinLock::unlock_after_fork`] says.
pub unsafe fn forget_after_fork() {
    // SAFETY: the caller's promise.
    unsafe { REQUEST_LOCK.unlock_after_fork() };
    let base = BASE.swap(core::ptr::null_mut(), AcqRel);
    crate::clock::use_area(core::ptr::null());
    if !base.is_null() {
        let bytes = MAPPED_BYTES.load(Relaxed) as usize;
        // SAFETY: the area's own mapping, of MAPPED_BYTES; BASE no longer leads to it.
        unsafe { libc::syscall(libc::SYS_munmap, base, bytes) };
        sys::agent_ranges::remove(base as u64);
    }
}

/// Wakes the recorder (a futex word shared with it).
pub fn wake_recorder(header: &Header) {
    header.wake.0.fetch_add(1, Release);
    futex_wake(&header.wake.0);
}

/// Whether the recorder still answers: its heartbeat moved within the
/// patience, judged from `last` (the beat seen and when), which it updates.
pub fn recorder_alive(header: &Header, last: &mut (u64, u64)) -> bool {
    if header.recorder_state.load(Acquire) == RECORDER_GONE {
        return false;
    }
    let beat = header.heartbeat.0.load(Acquire);
    let now = crate::clock::monotonic_ns();
    if beat != last.0 || last.1 == 0 {
        *last = (beat, now);
        return true;
    }
    now - last.1 < RECORDER_PATIENCE_NS
}

/// Asks the recorder for `kind` and waits for the answer while it lives.
/// `None` when there is no recorder to ask or it stopped answering.
pub fn request(kind: u32) -> Option<u64> {
    let area = get()?;
    let header = area.header();
    let _guard = REQUEST_LOCK.try_lock_for(RECORDER_PATIENCE_NS)?;
    header.request_kind.store(kind, Relaxed);
    let seq = header.request_seq.load(Relaxed).wrapping_add(1);
    header.request_seq.store(seq, Release);
    wake_recorder(header);
    let mut last = (0, 0);
    loop {
        let answered = header.answered.0.load(Acquire);
        if answered == seq {
            return Some(header.answer_value.load(Acquire));
        }
        if !recorder_alive(header, &mut last) {
            return None;
        }
        futex_wait(&header.answered.0, answered, 20_000_000);
    }
}

/// Shared futexes (no FUTEX_PRIVATE_FLAG): the recorder is another process.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec { tv_sec: (timeout_ns / 1_000_000_000) as i64, tv_nsec: (timeout_ns % 1_000_000_000) as i64 };
    // SAFETY: `word` is a live atomic, `ts` a valid timespec.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts) };
}

pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live atomic.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}
