//! The recorder's life cycle: start (at the first heap call or at load,
//! whichever comes first), thread exit, fork, and the end of the process.

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering::*};

use memgap_trace::event::{Event, EventKind, RawEncoder};
use memgap_trace::framing::{self, FileHeader};
use memgap_trace::records::{EndReason, Record};

use crate::buffers::{self, ThreadState};
use crate::process::{self, Config};
use crate::sys::{self, SpinLock};
use crate::writer::{self, Writer};
use crate::{clock, real};

const UNSTARTED: u8 = 0;
const STARTING: u8 = 1;
const ON: u8 = 2;
const OFF: u8 = 3;

static PHASE: AtomicU8 = AtomicU8::new(UNSTARTED);
static FINISHED: AtomicBool = AtomicBool::new(false);
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
static INTERVAL_NS: AtomicU64 = AtomicU64::new(10_000_000);
static FOLLOW: AtomicBool = AtomicBool::new(true);
static USABLE_SIZE: AtomicU8 = AtomicU8::new(0);
const USABLE_UNKNOWN: u8 = 0;
const USABLE_GLIBC: u8 = 1;
const USABLE_CALL: u8 = 2;
static EXIT_CODE: AtomicI32 = AtomicI32::new(i32::MIN);
static THREAD_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// glibc runs pthread key destructors at most this many rounds.
const PTHREAD_DESTRUCTOR_ITERATIONS: u32 = 4;

struct WriterCell(UnsafeCell<Option<Writer>>);
// SAFETY: accessed only under WRITER_LOCK.
unsafe impl Sync for WriterCell {}
static WRITER_LOCK: SpinLock = SpinLock::new();
static WRITER: WriterCell = WriterCell(UnsafeCell::new(None));

struct ConfigCell(UnsafeCell<Option<Config>>);
// SAFETY: written once while PHASE is STARTING (or in a fork child, which has
// one thread), read afterwards.
unsafe impl Sync for ConfigCell {}
static CONFIG: ConfigCell = ConfigCell(UnsafeCell::new(None));

fn config() -> Option<&'static Config> {
    unsafe { (*CONFIG.0.get()).as_ref() }
}

#[inline(always)]
pub fn is_recording() -> bool {
    PHASE.load(Relaxed) == ON
}

/// Whether events should be recorded now; starts the recorder on first use.
#[inline(always)]
pub fn recording() -> bool {
    match PHASE.load(Relaxed) {
        ON => true,
        UNSTARTED => start(),
        _ => false,
    }
}

pub fn interval_ns() -> u64 {
    INTERVAL_NS.load(Relaxed)
}

pub fn stop_recording() {
    PHASE.store(OFF, Release);
}

pub fn with_writer<R>(f: impl FnOnce(&mut Writer) -> R) -> Option<R> {
    let _guard = WRITER_LOCK.lock();
    unsafe { (*WRITER.0.get()).as_mut() }.map(f)
}

#[cold]
fn start() -> bool {
    unsafe extern "C" {
        static environ: *const *const libc::c_char;
    }
    if unsafe { environ }.is_null() {
        // Too early in process start-up to read the environment: try later.
        return false;
    }
    if PHASE.compare_exchange(UNSTARTED, STARTING, AcqRel, Relaxed).is_err() {
        return PHASE.load(Acquire) == ON;
    }
    let started = buffers::while_busy(|| {
        let errno = unsafe { *libc::__errno_location() };
        let started = start_recording();
        unsafe { *libc::__errno_location() = errno };
        started
    });
    PHASE.store(if started { ON } else { OFF }, Release);
    started
}

fn start_recording() -> bool {
    let Some(config) = Config::from_env() else { return false };
    sys::current_cpu::init();
    INTERVAL_NS.store(config.interval_ns, Relaxed);
    FOLLOW.store(config.follow, Relaxed);
    crate::stacks::configure(config.stacks, config.stack_depth);
    buffers::set_buffer_limit(config.buffer_bytes);
    unsafe { *CONFIG.0.get() = Some(config) };
    open_trace(config_ref(), config_ref().is_top_process())
}

fn config_ref() -> &'static Config {
    config().expect("config is set before use")
}

/// Opens (or, after an exec of the same process, continues) this process's
/// trace and writes its PROCESS record.
fn open_trace(config: &Config, top: bool) -> bool {
    let pid = sys::getpid();
    OWNER_PID.store(pid, Relaxed);
    let mut path = process::trace_path(&config.output, pid, top);
    path.push(0);
    // No symlink as the trace itself: in a shared directory such as /tmp,
    // someone else could plant one at the predictable name and have us
    // truncate whatever it points to.
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // Owner only: a trace holds addresses, command lines and symbol names.
    let fd = unsafe { libc::open(path.as_ptr() as *const libc::c_char, flags, 0o600) };
    path.pop();
    if fd < 0 {
        let errno = unsafe { *libc::__errno_location() };
        sys::log(&[b"not recording: cannot create ", &path, b": ", sys::errno_text(errno)]);
        return false;
    }
    // Nor a file someone else made there for us to write into.
    let mut stat: libc::stat = unsafe { core::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut stat) } != 0 || stat.st_uid != unsafe { libc::geteuid() } {
        sys::log(&[b"not recording: ", &path, b" exists and belongs to another user"]);
        unsafe { libc::close(fd) };
        return false;
    }
    // The same run's trace already exists for this pid when an exec replaced
    // the previous program image: append to it as a new image.
    let mut existing = [0u8; framing::FILE_HEADER_LEN];
    let read = unsafe { libc::pread(fd, existing.as_mut_ptr() as *mut c_void, existing.len(), 0) };
    let continues = read == existing.len() as isize && FileHeader::decode(&existing).is_ok_and(|h| h.run_id == config.run_id);
    let mut bytes = Vec::new();
    if !continues && stat.st_size != 0 {
        // Not this run's file (an earlier run's, or anything else): never
        // written over. An empty one is the file `memgap run` made for us.
        sys::log(&[b"not recording: ", &path, b" already exists"]);
        unsafe { libc::close(fd) };
        return false;
    }
    if !continues {
        // The umask may have taken bits off the mode asked for.
        unsafe { libc::fchmod(fd, 0o600) };
        bytes.extend_from_slice(&FileHeader::new(config.run_id).encode());
    }
    let mut raw = Vec::new();
    Record::Process(process::describe(config, u32::from(continues), clock::now())).encode(&mut raw);
    let mut chunk = Vec::new();
    framing::encode_chunk(&raw, &mut chunk);
    bytes.extend_from_slice(&chunk);
    if let Err(errno) = sys::write_all(fd, &bytes) {
        sys::log(&[b"not recording: cannot write ", &path, b": ", sys::errno_text(errno)]);
        unsafe { libc::close(fd) };
        return false;
    }
    let _guard = WRITER_LOCK.lock();
    unsafe { *WRITER.0.get() = Some(Writer::new(fd, path, config.snapshot_interval_ns)) };
    true
}

/// Runs when the library is loaded, before `main`.
pub fn on_load() {
    let Some(real) = real::real() else { return };
    if !recording() {
        return;
    }
    buffers::while_busy(|| {
        let method = match real::usable_size_method(real) {
            real::UsableSize::Unknown => USABLE_UNKNOWN,
            real::UsableSize::GlibcHeader => USABLE_GLIBC,
            real::UsableSize::Call => USABLE_CALL,
        };
        USABLE_SIZE.store(method, Relaxed);
        let mut key: libc::pthread_key_t = 0;
        if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
            THREAD_KEY.store(key, Release);
            let main_state = buffers::current_state();
            if !main_state.is_null() {
                on_new_thread(main_state);
            }
        }
        unsafe {
            on_exit(at_exit, core::ptr::null_mut());
            libc::pthread_atfork(None, None, Some(on_fork_child));
        }
        if !FOLLOW.load(Relaxed) {
            process::remove_self_from_ld_preload();
        }
        with_writer(|w| {
            w.push(&Record::Modules(process::loaded_modules()));
            w.push(&Record::Allocator { path: real::module_path(real.malloc as *const c_void) });
        });
        warn_if_allocator_is_unreachable(real);
        if !writer::start_thread() {
            sys::log(&[b"not recording: cannot start the writer thread"]);
            stop_recording();
        }
    });
}

/// A program that defines `malloc` itself (a statically linked allocator)
/// wins over the preload: say so rather than show an empty trace.
fn warn_if_allocator_is_unreachable(real: &real::Real) {
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = crate::hooks::malloc as *const c_void;
    if !found.is_null() && found as *const c_void != ours {
        let _ = real;
        let note = "malloc is defined by the program itself ahead of memgap's agent; its heap calls are not visible";
        with_writer(|w| w.push(&Record::Note { time: clock::now(), text: note.into() }));
        sys::log(&[note.as_bytes()]);
    }
}

pub fn on_new_thread(state: *mut ThreadState) {
    let key = THREAD_KEY.load(Acquire);
    if key != u32::MAX {
        unsafe { libc::pthread_setspecific(key, state as *const c_void) };
    }
}

/// pthread key destructor. glibc runs key destructors up to four rounds, and
/// other libraries' destructors may free memory after ours: re-arm for the
/// later rounds and close the thread's buffers only in the last.
unsafe extern "C" fn on_thread_exit(value: *mut c_void) {
    let state = value as *mut ThreadState;
    unsafe {
        (*state).destructor_rounds += 1;
        if (*state).destructor_rounds < PTHREAD_DESTRUCTOR_ITERATIONS {
            libc::pthread_setspecific(THREAD_KEY.load(Relaxed), value);
            return;
        }
    }
    ThreadState::close(state);
}

unsafe extern "C" {
    /// glibc's atexit with the exit status: the only way to learn the status
    /// when `main` returns (libc then calls `exit` internally, not our hook).
    fn on_exit(handler: extern "C" fn(i32, *mut c_void), arg: *mut c_void) -> i32;
}

extern "C" fn at_exit(status: i32, _: *mut c_void) {
    set_exit_code(status);
    finish(EndReason::Exit);
}

/// `memgap_snapshot()`: the program asks for a snapshot at this point.
pub fn program_snapshot() {
    if PHASE.load(Acquire) != ON {
        return;
    }
    let errno = unsafe { *libc::__errno_location() };
    buffers::while_busy(|| {
        with_writer(|writer| {
            writer.round(false);
            let rss = writer.sample_rss();
            writer.snapshot(memgap_trace::records::SnapshotReason::Program, rss);
        })
    });
    unsafe { *libc::__errno_location() = errno };
}

/// Before an exec: write out everything buffered, since the new image
/// starts from nothing and continues this trace. If the exec fails,
/// recording simply goes on.
pub fn before_exec() {
    if PHASE.load(Acquire) != ON || sys::getpid() != OWNER_PID.load(Relaxed) {
        return;
    }
    let errno = unsafe { *libc::__errno_location() };
    buffers::while_busy(|| with_writer(|writer| writer.round(true)));
    unsafe { *libc::__errno_location() = errno };
}

pub fn set_exit_code(code: i32) {
    EXIT_CODE.store(code, Relaxed);
}

/// Writes everything still buffered and the END record; later events are
/// not recorded. Safe to call more than once, and from a vfork child (which
/// shares our memory but must not touch the parent's trace).
pub fn finish(reason: EndReason) {
    if PHASE.load(Acquire) != ON || sys::getpid() != OWNER_PID.load(Relaxed) {
        return;
    }
    if FINISHED.swap(true, AcqRel) {
        return;
    }
    buffers::while_busy(|| {
        writer::stop_thread();
        let modules = process::loaded_modules();
        let code = EXIT_CODE.load(Relaxed);
        let exit_code = (code != i32::MIN).then_some(code);
        // A writer stuck on a slow disk must not hang the program's exit.
        if let Some(_guard) = WRITER_LOCK.try_lock_for(2_000_000_000) {
            if let Some(writer) = unsafe { (*WRITER.0.get()).as_mut() } {
                PHASE.store(OFF, Release);
                writer.finish(reason, exit_code, modules);
            }
        }
        PHASE.store(OFF, Release);
    });
}

/// In the child of a fork: the parent's trace and threads are not ours.
/// Either stop (`--no-follow`) or start this process's own trace.
extern "C" fn on_fork_child() {
    if PHASE.load(Relaxed) != ON {
        return;
    }
    sys::agent_ranges::reset_lock();
    crate::own_memory::reset_after_fork();
    buffers::reset_after_fork();
    crate::trim_calls::reset_after_fork();
    WRITER_LOCK.reset();
    unsafe { *WRITER.0.get() = None };
    FINISHED.store(false, Relaxed);
    if !FOLLOW.load(Relaxed) {
        PHASE.store(OFF, Release);
        return;
    }
    buffers::while_busy(|| {
        if open_trace(config_ref(), false) {
            with_writer(|w| {
                w.push(&Record::Modules(process::loaded_modules()));
                if let Some(real) = real::real() {
                    w.push(&Record::Allocator { path: real::module_path(real.malloc as *const c_void) });
                }
            });
            if !writer::start_thread() {
                PHASE.store(OFF, Release);
            }
        } else {
            PHASE.store(OFF, Release);
        }
    });
}

// ---- event construction (called from the hooks) ---------------------------

#[inline(always)]
fn cpu() -> u32 {
    sys::current_cpu::get()
}

#[inline(always)]
pub fn now() -> u64 {
    clock::now()
}

/// A realloc read the round before the call (`before`) and reads it again
/// here. When a round began during the call, no one timestamp orders both
/// halves: the old block's free must not be later than a reuse of its
/// address (so `before`), the new block's allocation not earlier than the
/// free that made it available (so now). Then it is recorded as a free and
/// an allocation.
#[inline(always)]
pub fn record_realloc(kind: EventKind, before: u64, new: *mut c_void, size: usize, old: *mut c_void) {
    let frees_old = !old.is_null() && new != old && (!new.is_null() || size == 0);
    if frees_old && clock::now() != before {
        record_free(before, old);
        if !new.is_null() {
            record_alloc(kind, new, size, core::ptr::null_mut(), 0);
        }
    } else {
        record_alloc(kind, new, size, old, 0);
    }
}

#[inline(always)]
pub fn record_alloc(kind: EventKind, addr: *mut c_void, size: usize, old_addr: *mut c_void, align: usize) {
    let time = clock::now();
    let usable = match USABLE_SIZE.load(Relaxed) {
        _ if addr.is_null() => 0,
        USABLE_GLIBC => unsafe { real::glibc_usable_size(addr) },
        USABLE_CALL => real::real().map_or(0, |real| unsafe { (real.malloc_usable_size)(addr) }),
        _ => 0,
    };
    let cpu = cpu();
    let event = || Event {
        time,
        kind: Some(kind),
        cpu,
        addr: addr as u64,
        size: size as u64,
        usable: usable as u64,
        old_addr: old_addr as u64,
        extra: align as u64,
        stack: 0,
    };
    // A failed allocation or a realloc that freed (size 0) has no block to blame.
    if crate::stacks::enabled() && !addr.is_null() {
        buffers::append_allocation(&mut event());
    } else if matches!(kind, EventKind::Malloc | EventKind::Calloc | EventKind::Valloc | EventKind::Pvalloc) {
        buffers::append_encoded(event, |delta, out| unsafe { RawEncoder::encode_allocation(delta, out, kind, time, cpu, addr as u64, size as u64, usable as u64) });
    } else {
        buffers::append(&event());
    }
}

#[inline(always)]
pub fn record_free(time: u64, addr: *mut c_void) {
    let cpu = cpu();
    let event = || Event { time, kind: Some(EventKind::Free), cpu, addr: addr as u64, ..Event::default() };
    buffers::append_encoded(event, |delta, out| unsafe { RawEncoder::encode_free(delta, out, time, cpu, addr as u64) });
}

#[inline]
pub fn record_mapping(time: u64, kind: EventKind, addr: u64, size: u64, old_addr: u64, extra: u64) {
    buffers::append(&Event { time, kind: Some(kind), cpu: cpu(), addr, size, old_addr, extra, ..Event::default() });
}
