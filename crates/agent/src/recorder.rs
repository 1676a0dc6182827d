//! The agent's life cycle: start (at the first heap call or at load,
//! whichever comes first), thread exit, fork, exec, and the end of the
//! process. Everything but the hooks happens in the recorder, outside the
//! program; this only makes the shared area and talks to it.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering::*};

use memgap_trace::event::{Event, EventKind};
use memgap_trace::records::{EndReason, Fork, Record};
use memgap_trace::shared::{self, AGENT_FINISHED, AGENT_STOPPED, REQUEST_EXIT_SNAPSHOT, REQUEST_SNAPSHOT};

use crate::buffers::{self, Hook, ThreadState};
use crate::process::{self, Config};
use crate::{area, clock, real, sys};

const UNSTARTED: u8 = 0;
const STARTING: u8 = 1;
const ON: u8 = 2;
const OFF: u8 = 3;

static PHASE: AtomicU8 = AtomicU8::new(UNSTARTED);
static FINISHED: AtomicBool = AtomicBool::new(false);
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
static FOLLOW: AtomicBool = AtomicBool::new(true);
static USABLE_SIZE: AtomicU8 = AtomicU8::new(0);
const USABLE_UNKNOWN: u8 = 0;
const USABLE_GLIBC: u8 = 1;
const USABLE_CALL: u8 = 2;
/// The PROCESS record's `start_monotonic_ns` of this image: a fork child
/// names the image it was forked from by it.
static IMAGE_START_NS: AtomicU64 = AtomicU64::new(0);
static EXIT_CODE: AtomicI32 = AtomicI32::new(i32::MIN);
static THREAD_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// glibc runs pthread key destructors at most this many rounds.
const PTHREAD_DESTRUCTOR_ITERATIONS: u32 = 4;

/// Set once, by the one thread that moved PHASE to STARTING: the set never
/// waits (a `OnceLock` only waits for a racing initializer, and none can race).
static CONFIG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();

fn config() -> Option<&'static Config> {
    CONFIG.get()
}

#[inline(always)]
pub fn is_recording() -> bool {
    PHASE.load(Relaxed) == ON && in_own_image()
}

/// Whether events should be recorded now; starts the recorder on first use.
#[inline(always)]
pub fn recording() -> bool {
    match PHASE.load(Relaxed) {
        ON => in_own_image(),
        UNSTARTED => start(),
        _ => false,
    }
}

/// A word that reads 1 in the process image that made the area, on a page
/// the kernel wipes in a child it forks: a child made without our atfork
/// handler (`_Fork`, a raw clone) shares the parent's area and thread
/// buffers, and would write its events over the parent's.
static IMAGE_MARK: AtomicPtr<AtomicU32> = AtomicPtr::new(core::ptr::null_mut());

/// False in a child forked behind the agent's back: it records nothing and
/// touches nothing of its parent's area. PHASE stays ON there, as the
/// atfork child handler reads it: glibc's own fork may allocate in the
/// child before that handler marks the child's image.
#[inline(always)]
pub fn in_own_image() -> bool {
    let mark = IMAGE_MARK.load(Relaxed);
    // SAFETY: a non-null mark is the first word of a page mapped for good by `mark_image`.
    mark.is_null() || unsafe { &*mark }.load(Relaxed) != 0
}

/// Marks this image as the area's maker (see [`IMAGE_MARK`]); on a kernel
/// without MADV_WIPEONFORK no page is kept and nothing is checked.
fn mark_image() {
    let mut mark = IMAGE_MARK.load(Relaxed);
    if mark.is_null() {
        const PAGE: usize = 4096;
        let page = sys::mmap_anonymous(PAGE);
        if page.is_null() {
            return;
        }
        // SAFETY: advice on our own fresh mapping.
        if unsafe { libc::madvise(page as *mut c_void, PAGE, libc::MADV_WIPEONFORK) } != 0 {
            sys::munmap(page, PAGE);
            return;
        }
        mark = page as *mut AtomicU32;
        IMAGE_MARK.store(mark, Relaxed);
    }
    // SAFETY: as in `in_own_image`.
    unsafe { &*mark }.store(1, Release);
}

/// Stops recording for good (the recorder is gone or stalled); the
/// recorder, if it comes back, learns it from the area.
pub fn stop_recording() {
    PHASE.store(OFF, Release);
    if let Some(area) = area::get() {
        let _ = area.header().agent_state.compare_exchange(shared::AGENT_RECORDING, AGENT_STOPPED, AcqRel, Relaxed);
    }
}

#[cold]
fn start() -> bool {
    unsafe extern "C" {
        static environ: *const *const libc::c_char;
    }
    // SAFETY: reads libc's `environ` pointer (not what it points to); libc
    // sets it before any code of the program runs.
    if unsafe { environ }.is_null() {
        // Too early in process start-up to read the environment: try later.
        return false;
    }
    if PHASE.compare_exchange(UNSTARTED, STARTING, AcqRel, Relaxed).is_err() {
        return PHASE.load(Acquire) == ON;
    }
    let started = buffers::while_busy(|| {
        // SAFETY: the calling thread's errno.
        let errno = unsafe { *libc::__errno_location() };
        let started = start_recording();
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        started
    });
    PHASE.store(if started { ON } else { OFF }, Release);
    started
}

fn start_recording() -> bool {
    let Some(config) = Config::from_env() else { return false };
    sys::current_cpu::init();
    FOLLOW.store(config.follow, Relaxed);
    crate::stacks::configure(config.stacks, config.stack_depth);
    let _ = CONFIG.set(config);
    open_area(config_ref())
}

/// Whether `memgap run` wants Python frames in stacks (`--python-stacks`).
pub fn python_stacks_wanted() -> bool {
    config().is_some_and(|config| config.python_stacks)
}

fn config_ref() -> &'static Config {
    config().expect("config is set before use")
}

/// Makes this process image's area and puts its PROCESS record first. A
/// failure leaves the program alone: the recorder says that this process
/// left no trace.
fn open_area(config: &Config) -> bool {
    OWNER_PID.store(sys::getpid(), Relaxed);
    mark_image();
    if area::create(&config.area_dir, config.run_id, shared::chunks_for(config.buffer_bytes)).is_err() {
        return false;
    }
    crate::python::publish();
    let process = process::describe(config, 0, clock::now());
    IMAGE_START_NS.store(process.start_monotonic_ns, Relaxed);
    buffers::push_record(&Record::Process(process))
}

/// Runs when the library is loaded, before `main`.
pub fn on_load() {
    crate::loader::resolve();
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
        // SAFETY: `key` is ours to write; the destructor is an `extern "C"` fn.
        if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
            THREAD_KEY.store(key, Release);
            let main_state = buffers::current_state();
            if !main_state.is_null() {
                on_new_thread(main_state);
            }
        }
        // SAFETY: handlers of the right C types, each living as long as the process.
        unsafe {
            on_exit(at_exit, core::ptr::null_mut());
            libc::pthread_atfork(Some(on_fork_prepare), Some(on_fork_parent), Some(on_fork_child));
        }
        if !FOLLOW.load(Relaxed) {
            process::remove_self_from_ld_preload();
        }
        describe_image(real);
        crate::python::install();
    });
}

/// The loaded modules and the allocator, after the PROCESS record.
fn describe_image(real: &real::Real) {
    let (adds, subs) = crate::loader::counts().unwrap_or_default();
    LOADER_ADDS.store(adds, Relaxed);
    LOADER_SUBS.store(subs, Relaxed);
    buffers::push_record(&Record::Modules(process::loaded_modules()));
    buffers::push_record(&Record::Allocator { path: real::module_path(real.malloc as *const c_void) });
    warn_if_allocator_is_unreachable();
}

static LOADER_ADDS: AtomicU64 = AtomicU64::new(0);
static LOADER_SUBS: AtomicU64 = AtomicU64::new(0);

/// A dlopen/dlclose since the modules were last recorded: record them
/// again, so stacks through the new code can be named, and have the
/// unwinders read them again. Checked each time a thread moves to a fresh
/// chunk (there is no thread of ours to poll).
pub fn note_loader_changes() {
    let (adds, subs) = crate::loader::counts().unwrap_or_default();
    if LOADER_ADDS.swap(adds, Relaxed) != adds || LOADER_SUBS.swap(subs, Relaxed) != subs {
        crate::unwind::modules_changed();
        buffers::push_record(&Record::Modules(process::loaded_modules()));
    }
}

/// A program that defines `malloc` itself (a statically linked allocator)
/// wins over the preload: say so rather than show an empty trace.
fn warn_if_allocator_is_unreachable() {
    // SAFETY: a NUL-terminated name; dlsym only looks it up.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = crate::hooks::malloc as *const c_void;
    if !found.is_null() && !core::ptr::eq(found, ours) {
        let note = "malloc is defined by the program itself ahead of memgap's agent; its heap calls are not visible";
        buffers::push_record(&Record::Note { time: clock::now(), text: note.into() });
    }
}

pub fn on_new_thread(state: *mut ThreadState) {
    let key = THREAD_KEY.load(Acquire);
    if key != u32::MAX {
        // SAFETY: `key` was created by pthread_key_create; glibc only stores the value.
        unsafe { libc::pthread_setspecific(key, state as *const c_void) };
    }
}

/// pthread key destructor. glibc runs key destructors up to four rounds, and
/// other libraries' destructors may free memory after ours: re-arm for the
/// later rounds and close the thread's buffers only in the last.
///
/// # Safety
/// Called by glibc at thread exit with the value `on_new_thread` stored for
/// this thread: its live state.
unsafe extern "C" fn on_thread_exit(value: *mut c_void) {
    if !in_own_image() {
        // A child forked behind the agent's back: the buffers are its parent's.
        return;
    }
    let state = value as *mut ThreadState;
    // SAFETY: `value` is the state `on_new_thread` stored under this key for
    // this thread, still live: only the last round below closes it.
    unsafe {
        (*state).destructor_rounds += 1;
        if (*state).destructor_rounds < PTHREAD_DESTRUCTOR_ITERATIONS {
            libc::pthread_setspecific(THREAD_KEY.load(Relaxed), value);
            return;
        }
    }
    // SAFETY: the thread's live state, in its last destructor round: nothing
    // of this thread uses the state after this.
    unsafe { ThreadState::close(state) };
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

/// `memgap_snapshot()`: the program asks for a snapshot at this point; it
/// returns once the recorder took it (or there is no recorder to ask).
pub fn program_snapshot() {
    if PHASE.load(Acquire) != ON || sys::getpid() != OWNER_PID.load(Relaxed) {
        return;
    }
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    buffers::while_busy(|| area::request(REQUEST_SNAPSHOT));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Before an exec: everything committed is in the area already; the
/// recorder only learns that this image may be about to go.
pub fn before_exec() {
    if PHASE.load(Acquire) != ON || sys::getpid() != OWNER_PID.load(Relaxed) {
        return;
    }
    if let Some(area) = area::get() {
        area.header().exec_pending.store(1, Release);
    }
}

/// The exec failed: recording goes on in this image.
pub fn after_failed_exec() {
    if PHASE.load(Acquire) != ON || sys::getpid() != OWNER_PID.load(Relaxed) {
        return;
    }
    if let Some(area) = area::get() {
        area.header().exec_pending.store(0, Release);
    }
}

pub fn set_exit_code(code: i32) {
    EXIT_CODE.store(code, Relaxed);
}

/// The process ends: a last snapshot while its memory is still mapped, the
/// modules, the exit status; later events are not recorded. Safe to call
/// more than once, and from a vfork child (which shares our memory but
/// must not touch the parent's area).
pub fn finish(_reason: EndReason) {
    if PHASE.load(Acquire) != ON || sys::getpid() != OWNER_PID.load(Relaxed) {
        return;
    }
    if FINISHED.swap(true, AcqRel) {
        return;
    }
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    buffers::while_busy(|| {
        let Some(area) = area::get() else { return };
        crate::python::note_allocator();
        area::request(REQUEST_EXIT_SNAPSHOT);
        buffers::push_record(&Record::Modules(process::loaded_modules()));
        PHASE.store(OFF, Release);
        let header = area.header();
        let code = EXIT_CODE.load(Relaxed);
        if code != i32::MIN {
            header.exit_code.store(code, Relaxed);
            header.has_exit_code.store(1, Relaxed);
        }
        header.agent_state.store(AGENT_FINISHED, Release);
        area::wake_recorder(header);
    });
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

std::thread_local! {
    /// The fork this thread is making, in this image's clock (see
    /// [`on_fork_prepare`]); per thread, as two threads may fork at once.
    static FORK_TIME: core::cell::Cell<Option<u64>> = const { core::cell::Cell::new(None) };
}

/// In the parent, just before the fork: the clock moves on, so the fork
/// falls between the events stamped before (the child inherits their
/// effects) and those after. Registered first, this runs after every other
/// prepare handler, only glibc's own locking between it and the fork.
extern "C" fn on_fork_prepare() {
    crate::loader::before_fork();
    if PHASE.load(Relaxed) != ON || sys::getpid() != OWNER_PID.load(Relaxed) {
        return;
    }
    let time = clock::advance() - 1;
    let _ = FORK_TIME.try_with(|fork| fork.set(Some(time)));
}

/// In the parent, after the fork (made or not).
extern "C" fn on_fork_parent() {
    crate::loader::after_fork_in_parent();
}

/// In the child of a fork: the parent's area and threads are not ours.
/// Either stop (`--no-follow`) or make this process's own area, whose
/// FORK record names the parent's image and the fork's time in it: the
/// child's heap starts as the parent's was then. The forking thread keeps
/// its number, so readers continue its tcache.
extern "C" fn on_fork_child() {
    crate::loader::after_fork_in_child();
    if PHASE.load(Relaxed) != ON {
        return;
    }
    let fork_time = FORK_TIME.try_with(|fork| fork.take()).ok().flatten();
    let parent_pid = OWNER_PID.load(Relaxed);
    let parent_image_start_ns = IMAGE_START_NS.load(Relaxed);
    let forking = buffers::current_state();
    // SAFETY: non-null, so this thread's live state, copied into the child.
    let forking_thread = if forking.is_null() { None } else { Some(unsafe { (*forking).thread }) };
    // SAFETY: this is the fork child's only thread, and the agent never
    // forks inside its own locked sections: the guards the fork copied
    // belong to threads that do not exist here. (A program's signal handler
    // that forks while this thread is inside one is the exception no lock
    // can see: the child's agent state may then be torn, as it always could.)
    unsafe {
        sys::agent_ranges::unlock_after_fork();
        crate::own_memory::unlock_after_fork();
        buffers::reset_after_fork(forking_thread);
        area::forget_after_fork();
    }
    crate::python_frames::reset_after_fork();
    FINISHED.store(false, Relaxed);
    buffers::while_busy(|| {
        if !FOLLOW.load(Relaxed) || !open_area(config_ref()) {
            PHASE.store(OFF, Release);
            return;
        }
        if let Some(real) = real::real() {
            describe_image(real);
        }
        // After the ALLOCATOR record: readers then know how the inherited blocks are laid out.
        if let Some(time) = fork_time {
            buffers::push_record(&Record::Fork(Fork { parent_pid, parent_image_start_ns, time, parent_trace: String::new() }));
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
/// `old_usable`: the old block's size for the live count (see [`freed_size`]), read before the call.
#[inline(always)]
pub fn record_realloc(hook: Hook, kind: EventKind, before: u64, new: *mut c_void, size: usize, old: *mut c_void, old_usable: usize) {
    let frees_old = !old.is_null() && new != old && (!new.is_null() || size == 0);
    if frees_old && clock::now() != before {
        record_free(hook, before, old, old_usable);
        if !new.is_null() {
            record_alloc(hook, kind, new, size, core::ptr::null_mut(), 0);
        }
    } else {
        record_alloc(hook, kind, new, size, old, 0);
        // Freed, or resized in place; a failed realloc leaves it as it was.
        if !old.is_null() && (!new.is_null() || size == 0) {
            buffers::count_live(hook, 0u64.wrapping_sub(old_usable as u64));
        }
    }
}

/// The usable size of a live block of the real allocator (0 when the
/// agent has no way to know it).
#[inline(always)]
pub fn usable_size(addr: *mut c_void) -> usize {
    match USABLE_SIZE.load(Relaxed) {
        _ if addr.is_null() => 0,
        // SAFETY: USABLE_GLIBC means the real allocator is glibc's, and `addr` is
        // a live block of it that the hook just got.
        USABLE_GLIBC => unsafe { real::glibc_usable_size(addr) },
        // SAFETY: the real allocator's own function, on a live block of it.
        USABLE_CALL => real::real().map_or(0, |real| unsafe { (real.malloc_usable_size)(addr) }),
        _ => 0,
    }
}

/// The usable size of a block about to be freed, for the live count: read
/// from glibc's chunk header (the free reads it next), 0 under another
/// allocator, whose size lookup would be a call per free: there the count
/// only grows, and no snapshot is taken for a fall.
#[inline(always)]
pub fn freed_size(addr: *mut c_void) -> usize {
    if addr.is_null() || USABLE_SIZE.load(Relaxed) != USABLE_GLIBC {
        return 0;
    }
    // SAFETY: glibc is the real allocator, and `addr` is the live block about
    // to be freed (the caller's contract with the hook).
    unsafe { real::glibc_usable_size(addr) }
}

#[inline(always)]
pub fn record_alloc(hook: Hook, kind: EventKind, addr: *mut c_void, size: usize, old_addr: *mut c_void, align: usize) {
    let time = clock::now();
    let usable = usable_size(addr);
    buffers::count_live(hook, usable as u64);
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
        buffers::append_allocation(hook, &mut event());
    } else if matches!(kind, EventKind::Malloc | EventKind::Calloc | EventKind::Valloc | EventKind::Pvalloc) {
        // SAFETY: `append_encoded` calls this with MAX_RECORD_LEN bytes of room.
        buffers::append_encoded(
            hook,
            event,
            #[inline(always)]
            |delta, out| unsafe { crate::encode::allocation(delta, out, kind, time, cpu, addr as u64, size as u64, usable as u64, 0) },
        );
    } else {
        buffers::append(hook, &event());
    }
}

/// `usable`: the block's usable size, read before the call.
#[inline(always)]
pub fn record_free(hook: Hook, time: u64, addr: *mut c_void, usable: usize) {
    buffers::count_live(hook, 0u64.wrapping_sub(usable as u64));
    let cpu = cpu();
    let event = || Event { time, kind: Some(EventKind::Free), cpu, addr: addr as u64, ..Event::default() };
    // SAFETY: as above.
    buffers::append_encoded(
        hook,
        event,
        #[inline(always)]
        |delta, out| unsafe { crate::encode::free(delta, out, time, cpu, addr as u64) },
    );
}

#[inline]
pub fn record_mapping(hook: Hook, time: u64, kind: EventKind, addr: u64, size: u64, old_addr: u64, extra: u64) {
    buffers::append(hook, &Event { time, kind: Some(kind), cpu: cpu(), addr, size, old_addr, extra, ..Event::default() });
}

/// An mmap an allocator made to hold the program's objects (a pymalloc
/// arena), with the call stack that needed it: blame gives the mapping's
/// contents to that stack. Inlined into the hook, so the unwinder skips the
/// same agent frames as for an allocation.
#[inline(always)]
pub fn record_mapping_with_stack(hook: Hook, addr: u64, size: u64, extra: u64) {
    let mut event = Event { time: clock::now(), kind: Some(EventKind::Mmap), cpu: cpu(), addr, size, extra, ..Event::default() };
    if crate::stacks::enabled() {
        buffers::append_allocation(hook, &mut event);
    } else {
        buffers::append(hook, &event);
    }
}
