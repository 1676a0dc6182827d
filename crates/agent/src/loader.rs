//! The loader's lock across fork. `dl_iterate_phdr` holds glibc's
//! `dl_load_write_lock` for its whole walk, and glibc's fork does not reset
//! that lock in the child: a child forked while another thread was inside
//! blocks forever at its first `dl_iterate_phdr`, dlopen or dlclose.
//!
//! The agent walks the modules from every thread (at each fresh chunk, in
//! the unwinders) and in a fork child (its MODULES record). So a fork waits
//! until no walk of the agent's is inside the loader (they are short; at
//! most [`LOADER_PATIENCE_NS`]), and the walks asked for until it is made
//! are answered from the modules the loader last showed. The program's own
//! `dl_iterate_phdr` calls go through a hook that counts them and holds them
//! off during a fork, so the fork knows whether one was inside. A child
//! forked while one was (or after the patience ran out) never asks the
//! loader: the program itself would block at its first such call, and the
//! agent answers from its parent's last walk.
//!
//! dlopen is not hooked (the loader searches the RUNPATH of dlopen's caller,
//! which a hook would change), so a fork at the instant another thread's
//! dlopen links a new module into the list is not seen.

use alloc::vec::Vec;
use core::cell::Cell;
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering::*};

use crate::clock;
use crate::sys::{self, SpinLock};

/// How long a fork waits for the agent's walks to leave the loader.
pub const LOADER_PATIENCE_NS: u64 = 1_000_000_000;

pub type Callback = unsafe extern "C" fn(*mut libc::dl_phdr_info, usize, *mut c_void) -> c_int;
type IterateFn = unsafe extern "C" fn(Option<Callback>, *mut c_void) -> c_int;

/// Forks under way in this process (between their prepare and parent handlers).
static FORKS: AtomicU32 = AtomicU32::new(0);
/// The agent's walks inside `dl_iterate_phdr`.
static AGENT_INSIDE: AtomicU32 = AtomicU32::new(0);
/// The program's calls inside `dl_iterate_phdr`.
static PROGRAM_INSIDE: AtomicU32 = AtomicU32::new(0);
/// This process is a fork child whose loader lock may be held by a thread
/// that did not survive the fork.
static LOCK_MAYBE_HELD: AtomicBool = AtomicBool::new(false);
static REAL_ITERATE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

std::thread_local! {
    /// The program's calls of this thread inside `dl_iterate_phdr` (a
    /// callback may fork, or call it again).
    static PROGRAM_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The fork this thread is making may leave the lock held in the child.
    static LEAVES_LOCK_HELD: Cell<bool> = const { Cell::new(false) };
}

/// A module as the loader last showed it. Its name and program headers are
/// copies; its segments are read in place, as the loader's own entries are.
struct KnownModule {
    addr: u64,
    /// NUL-terminated.
    name: Vec<u8>,
    headers: Vec<libc::Elf64_Phdr>,
}

/// The modules of the loader's last walk, with its counts of objects
/// loaded and unloaded when it was taken.
struct KnownModules {
    events: Option<(u64, u64)>,
    modules: Vec<KnownModule>,
}

static KNOWN: SpinLock<KnownModules> = SpinLock::new(KnownModules { events: None, modules: Vec::new() });

/// Looks libc's `dl_iterate_phdr` up now, at load: dlsym is no call for a
/// signal handler that walks the modules (as profilers' unwinders do).
pub fn resolve() {
    real_iterate();
}

/// libc's `dl_iterate_phdr` (the next definition after the agent's hook).
fn real_iterate() -> Option<IterateFn> {
    let mut symbol = REAL_ITERATE.load(Acquire);
    if symbol.is_null() {
        // SAFETY: a NUL-terminated name; dlsym only looks it up.
        symbol = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dl_iterate_phdr".as_ptr()) };
        if symbol.is_null() {
            return None;
        }
        REAL_ITERATE.store(symbol, Release);
    }
    // SAFETY: the next object's `dl_iterate_phdr`, libc's, whose C type `IterateFn` spells.
    Some(unsafe { core::mem::transmute::<*mut c_void, IterateFn>(symbol) })
}

/// Walks the loaded modules for the agent, as `dl_iterate_phdr` does: the
/// loader's own list, or while it may not be asked (a fork under way, a
/// child whose loader lock may be held) the list of its last walk.
pub fn agent_iterate(callback: Callback, data: *mut c_void) {
    if !LOCK_MAYBE_HELD.load(Relaxed)
        && let Some(iterate) = real_iterate()
    {
        AGENT_INSIDE.fetch_add(1, SeqCst);
        let asked = FORKS.load(SeqCst) == 0;
        if asked {
            let mut walk = Walk { callback, data, started: false, stopped: false, remembering: None };
            // SAFETY: libc's dl_iterate_phdr; `walk_and_remember` takes `data` as the `Walk` passed here.
            unsafe { iterate(Some(walk_and_remember), &mut walk as *mut Walk as *mut c_void) };
            if let Some(known) = walk.remembering {
                *KNOWN.lock() = known;
            }
        }
        leave(&AGENT_INSIDE);
        if asked {
            return;
        }
    }
    replay(callback, data);
}

/// One walk of the agent's through the loader.
struct Walk {
    callback: Callback,
    data: *mut c_void,
    /// Past the first module, where the loader's counts are compared with the last walk's.
    started: bool,
    /// The agent's callback asked to stop.
    stopped: bool,
    /// The loader changed since its last walk: this one is remembered whole.
    remembering: Option<KnownModules>,
}

/// # Safety
/// A dl_iterate_phdr callback: `info` valid for the call, `walk` the `Walk`
/// `agent_iterate` passes, borrowed by nothing else.
unsafe extern "C" fn walk_and_remember(info: *mut libc::dl_phdr_info, size: usize, walk: *mut c_void) -> c_int {
    // SAFETY: the callback's contract, just above.
    let (entry, walk) = unsafe { (&*info, &mut *(walk as *mut Walk)) };
    if !core::mem::replace(&mut walk.started, true) {
        let events = counts_of(entry, size);
        if events.is_some() && KNOWN.lock().events != events {
            walk.remembering = Some(KnownModules { events, modules: Vec::new() });
        }
    }
    if let Some(known) = &mut walk.remembering {
        known.modules.push(KnownModule::of(entry));
    }
    if !walk.stopped {
        // SAFETY: the loader's entry, passed on to the agent's callback with its own data.
        walk.stopped = unsafe { (walk.callback)(info, size, walk.data) } != 0;
    }
    (walk.stopped && walk.remembering.is_none()) as c_int
}

/// The loader's counts of objects loaded and unloaded, from an entry of its
/// walk of `size` bytes (older loaders pass entries without them).
pub fn counts_of(entry: &libc::dl_phdr_info, size: usize) -> Option<(u64, u64)> {
    (size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_tls_modid)).then_some((entry.dlpi_adds, entry.dlpi_subs))
}

/// The loader's counts of objects loaded and unloaded so far: when they
/// move, the modules changed.
pub fn counts() -> Option<(u64, u64)> {
    /// # Safety
    /// A dl_iterate_phdr callback: `info` valid for the call, `found` the
    /// `Option<(u64, u64)>` `counts` passes.
    unsafe extern "C" fn first_module(info: *mut libc::dl_phdr_info, size: usize, found: *mut c_void) -> c_int {
        // SAFETY: the callback's contract, just above.
        unsafe { *(found as *mut Option<(u64, u64)>) = counts_of(&*info, size) };
        1
    }
    let mut found = None;
    agent_iterate(first_module, &mut found as *mut Option<(u64, u64)> as *mut c_void);
    found
}

impl KnownModule {
    fn of(entry: &libc::dl_phdr_info) -> KnownModule {
        let mut name = Vec::new();
        if !entry.dlpi_name.is_null() {
            // SAFETY: the loader's NUL-terminated module name.
            name.extend_from_slice(unsafe { core::ffi::CStr::from_ptr(entry.dlpi_name) }.to_bytes());
        }
        name.push(0);
        let headers = if entry.dlpi_phdr.is_null() {
            Vec::new()
        } else {
            // SAFETY: the loader's `dlpi_phnum` program headers of this module.
            unsafe { core::slice::from_raw_parts(entry.dlpi_phdr, entry.dlpi_phnum.into()) }.to_vec()
        };
        KnownModule { addr: entry.dlpi_addr, name, headers }
    }
}

/// The last walk, to `callback`, as the loader would have passed it.
fn replay(callback: Callback, data: *mut c_void) {
    let known = KNOWN.lock();
    let (adds, subs) = known.events.unwrap_or_default();
    for module in &known.modules {
        let mut entry = libc::dl_phdr_info {
            dlpi_addr: module.addr,
            dlpi_name: module.name.as_ptr() as *const c_char,
            dlpi_phdr: module.headers.as_ptr(),
            dlpi_phnum: module.headers.len() as u16,
            dlpi_adds: adds,
            dlpi_subs: subs,
            dlpi_tls_modid: 0,
            dlpi_tls_data: core::ptr::null_mut(),
        };
        // SAFETY: an entry as the loader made it, valid for the call; the
        // callback takes `data` as its caller passes it.
        if unsafe { callback(&mut entry, core::mem::size_of::<libc::dl_phdr_info>(), data) } != 0 {
            break;
        }
    }
}

/// The program's `dl_iterate_phdr`, counted, and held off while a fork is
/// under way (for at most the patience).
pub fn program_iterate(callback: Option<Callback>, data: *mut c_void) -> c_int {
    let Some(iterate) = real_iterate() else { return 0 };
    let since = clock::monotonic_ns();
    loop {
        PROGRAM_INSIDE.fetch_add(1, SeqCst);
        if FORKS.load(SeqCst) == 0 || clock::monotonic_ns() - since >= LOADER_PATIENCE_NS {
            break;
        }
        leave(&PROGRAM_INSIDE);
        sys::sleep_ns(20_000);
    }
    let _ = PROGRAM_DEPTH.try_with(|depth| depth.set(depth.get() + 1));
    // SAFETY: libc's dl_iterate_phdr, with the program's own arguments.
    let result = unsafe { iterate(callback, data) };
    let _ = PROGRAM_DEPTH.try_with(|depth| depth.set(depth.get().saturating_sub(1)));
    leave(&PROGRAM_INSIDE);
    result
}

/// Never below zero: a count reset in a fork child may meet a call that
/// was inside before the fork.
fn leave(count: &AtomicU32) {
    let _ = count.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
}

/// In the parent, before the fork: no agent walk may be inside the loader,
/// and none may enter, until the fork is made. Notes whether a program call
/// was inside (this thread's own too: a callback that forks holds the lock).
pub fn before_fork() {
    FORKS.fetch_add(1, SeqCst);
    let since = clock::monotonic_ns();
    let mut agent_left = AGENT_INSIDE.load(SeqCst) == 0;
    while !agent_left && clock::monotonic_ns() - since < LOADER_PATIENCE_NS {
        sys::sleep_ns(20_000);
        agent_left = AGENT_INSIDE.load(SeqCst) == 0;
    }
    let held = !agent_left || PROGRAM_INSIDE.load(SeqCst) > 0;
    let _ = LEAVES_LOCK_HELD.try_with(|flag| flag.set(held));
}

/// In the parent, after the fork (made or failed).
pub fn after_fork_in_parent() {
    leave(&FORKS);
}

/// In the child: only the forking thread is left, with its own calls.
pub fn after_fork_in_child() {
    FORKS.store(0, SeqCst);
    AGENT_INSIDE.store(0, SeqCst);
    PROGRAM_INSIDE.store(PROGRAM_DEPTH.try_with(Cell::get).unwrap_or(0), SeqCst);
    if LEAVES_LOCK_HELD.try_with(Cell::get).unwrap_or(true) {
        LOCK_MAYBE_HELD.store(true, SeqCst);
    }
    // SAFETY: this is the fork child's only thread, outside any guard of
    // KNOWN (no agent walk was inside at the fork, or it is not trusted).
    unsafe { KNOWN.unlock_after_fork() };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// # Safety
    /// A dl_iterate_phdr callback whose data is a `Vec<(u64, Vec<u8>, usize)>`.
    unsafe extern "C" fn list(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: the contract above.
        let (entry, found) = unsafe { (&*info, &mut *(data as *mut Vec<(u64, Vec<u8>, usize)>)) };
        // SAFETY: a NUL-terminated module name.
        let name = unsafe { core::ffi::CStr::from_ptr(entry.dlpi_name) }.to_bytes().to_vec();
        found.push((entry.dlpi_addr, name, entry.dlpi_phnum.into()));
        0
    }

    fn walked_by_agent() -> Vec<(u64, Vec<u8>, usize)> {
        let mut found = Vec::new();
        agent_iterate(list, &mut found as *mut _ as *mut c_void);
        found
    }

    fn walked_by_program() -> Vec<(u64, Vec<u8>, usize)> {
        let mut found = Vec::new();
        program_iterate(Some(list), &mut found as *mut _ as *mut c_void);
        found
    }

    // One test: the gate's state is the process's.
    #[test]
    fn forks_keep_the_agent_out_of_the_loader_and_it_answers_from_its_last_walk() {
        let live = walked_by_program();
        assert!(live.len() >= 2, "this binary and libc at least: {live:?}");
        assert_eq!(walked_by_agent(), live);
        // Marks the remembered walk, to tell an answer from it from the loader's.
        KNOWN.lock().modules.push(KnownModule { addr: 0x1000, name: b"remembered\0".to_vec(), headers: Vec::new() });
        let remembered: Vec<_> = live.iter().cloned().chain([(0x1000, b"remembered".to_vec(), 0)]).collect();
        assert_eq!(walked_by_agent(), live, "the loader's list while it may be asked");

        before_fork();
        assert!(!LEAVES_LOCK_HELD.with(Cell::get), "nothing was inside the loader");
        assert_eq!(walked_by_agent(), remembered, "no walk of the agent's enters the loader during a fork");
        after_fork_in_parent();
        assert_eq!(walked_by_agent(), live);

        // The program inside dl_iterate_phdr at the fork: the child never asks the loader.
        let other = std::thread::spawn(|| PROGRAM_INSIDE.fetch_add(1, SeqCst));
        other.join().unwrap();
        before_fork();
        assert!(LEAVES_LOCK_HELD.with(Cell::get));
        after_fork_in_child();
        assert_eq!(PROGRAM_INSIDE.load(SeqCst), 0, "the other thread's call did not survive the fork");
        assert_eq!(walked_by_agent(), remembered);
        // The program's own calls are the program's, as they would be without the agent.
        assert_eq!(walked_by_program(), live);

        LOCK_MAYBE_HELD.store(false, SeqCst);
        KNOWN.lock().events = None;
        assert_eq!(walked_by_agent(), live);
    }
}
