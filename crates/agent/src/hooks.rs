//! The exported functions that stand in for libc's: each calls the real
//! allocator, then appends one event. Frees and unmaps take their timestamp
//! before the real call and allocations after it, so an address handed from
//! one thread's free to another thread's malloc is ordered correctly;
//! reallocs read it on both sides (see `recorder::record_realloc`).

use core::ffi::c_void;

use memgap_trace::event::EventKind;
use memgap_trace::records::EndReason;

use crate::buffers::{enter_hook, leave_hook};
use crate::real::{self, bootstrap_alloc, bootstrap_size, is_bootstrap};
use crate::recorder::{self, record_alloc, record_free, record_mapping, record_realloc, recording};

/// # Safety
/// As libc's `malloc`; the program's code calls it through that symbol.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let Some(real) = real::real() else { return bootstrap_alloc(size, 16) };
    if !recording() {
        // SAFETY: the real allocator's malloc, called as the program called ours.
        return unsafe { (real.malloc)(size) };
    }
    let hook = enter_hook();
    // SAFETY: as above.
    let ptr = unsafe { (real.malloc)(size) };
    record_alloc(hook, EventKind::Malloc, ptr, size, core::ptr::null_mut(), 0);
    leave_hook(hook);
    ptr
}

/// # Safety
/// As libc's `free`: `ptr` is null or a live block of the program's heap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() || is_bootstrap(ptr) {
        return;
    }
    let Some(real) = real::real() else { return };
    if recording() {
        let hook = enter_hook();
        let time = recorder::now();
        let usable = recorder::freed_size(ptr);
        // SAFETY: `ptr` is a live block (the caller's contract) and not one of the
        // bootstrap arena's, so it is the real allocator's to free.
        unsafe { (real.free)(ptr) };
        record_free(hook, time, ptr, usable);
        leave_hook(hook);
    } else {
        // SAFETY: as above.
        unsafe { (real.free)(ptr) };
    }
}

/// # Safety
/// As libc's `calloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let Some(real) = real::real() else {
        return match count.checked_mul(size) {
            Some(total) => bootstrap_alloc(total, 16),
            None => core::ptr::null_mut(),
        };
    };
    if !recording() {
        // SAFETY: the real allocator's calloc, called as the program called ours.
        return unsafe { (real.calloc)(count, size) };
    }
    let hook = enter_hook();
    // SAFETY: as above.
    let ptr = unsafe { (real.calloc)(count, size) };
    record_alloc(hook, EventKind::Calloc, ptr, count.saturating_mul(size), core::ptr::null_mut(), 0);
    leave_hook(hook);
    ptr
}

/// # Safety
/// As libc's `realloc`: `ptr` is null or a live block of the program's heap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if is_bootstrap(ptr) {
        // SAFETY: our own malloc, whose only contract is libc's.
        let new = unsafe { malloc(size) };
        if !new.is_null() {
            // SAFETY: `ptr` is a live block (the caller's contract) in the arena,
            // so one `bootstrap_alloc` returned, of `bootstrap_size(ptr)` bytes;
            // `new` is a fresh block of at least `size`: both valid, and distinct.
            unsafe { core::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, bootstrap_size(ptr).min(size)) };
        }
        return new;
    }
    let Some(real) = real::real() else { return core::ptr::null_mut() };
    if !recording() {
        // SAFETY: `ptr` is a live block of the real allocator (not a bootstrap one).
        return unsafe { (real.realloc)(ptr, size) };
    }
    let hook = enter_hook();
    let before = recorder::now();
    let old_usable = recorder::freed_size(ptr);
    // SAFETY: as above.
    let new = unsafe { (real.realloc)(ptr, size) };
    record_realloc(hook, EventKind::Realloc, before, new, size, ptr, old_usable);
    leave_hook(hook);
    new
}

/// # Safety
/// As glibc's `reallocarray`: `ptr` is null or a live block of the program's heap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, count: usize, size: usize) -> *mut c_void {
    // Implemented on the real realloc (as glibc does), so it always reaches
    // the allocator that owns `ptr`, even one that lacks reallocarray.
    let Some(total) = count.checked_mul(size) else {
        // SAFETY: libc's errno of the calling thread, always valid.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    };
    if is_bootstrap(ptr) {
        // SAFETY: our own realloc, with the caller's `ptr`.
        return unsafe { realloc(ptr, total) };
    }
    let Some(real) = real::real() else { return core::ptr::null_mut() };
    if !recording() {
        // SAFETY: `ptr` is a live block of the real allocator (not a bootstrap one).
        return unsafe { (real.realloc)(ptr, total) };
    }
    let hook = enter_hook();
    let before = recorder::now();
    let old_usable = recorder::freed_size(ptr);
    // SAFETY: as above.
    let new = unsafe { (real.realloc)(ptr, total) };
    record_realloc(hook, EventKind::Reallocarray, before, new, total, ptr, old_usable);
    leave_hook(hook);
    new
}

/// # Safety
/// As libc's `posix_memalign`: `out` is valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    let Some(real) = real::real() else {
        let ptr = bootstrap_alloc(size, align);
        if ptr.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: `out` is writable (the caller's contract).
        unsafe { *out = ptr };
        return 0;
    };
    if !recording() {
        // SAFETY: the real allocator's, with the caller's arguments.
        return unsafe { (real.posix_memalign)(out, align, size) };
    }
    let hook = enter_hook();
    // SAFETY: as above.
    let result = unsafe { (real.posix_memalign)(out, align, size) };
    // SAFETY: the real call succeeded, so it wrote `*out`.
    let ptr = if result == 0 { unsafe { *out } } else { core::ptr::null_mut() };
    record_alloc(hook, EventKind::PosixMemalign, ptr, size, core::ptr::null_mut(), align);
    leave_hook(hook);
    result
}

macro_rules! aligned_hook {
    ($name:ident, $kind:expr) => {
        /// # Safety
        /// As libc's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(align: usize, size: usize) -> *mut c_void {
            let Some(real) = real::real() else { return bootstrap_alloc(size, align) };
            if !recording() {
                // SAFETY: the real allocator's, called as the program called ours.
                return unsafe { (real.$name)(align, size) };
            }
            let hook = enter_hook();
            // SAFETY: as above.
            let ptr = unsafe { (real.$name)(align, size) };
            record_alloc(hook, $kind, ptr, size, core::ptr::null_mut(), align);
            leave_hook(hook);
            ptr
        }
    };
}

aligned_hook!(aligned_alloc, EventKind::AlignedAlloc);
aligned_hook!(memalign, EventKind::Memalign);

macro_rules! page_aligned_hook {
    ($name:ident, $kind:expr) => {
        /// # Safety
        /// As libc's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            let Some(real) = real::real() else { return bootstrap_alloc(size, 4096) };
            if !recording() {
                // SAFETY: the real allocator's, called as the program called ours.
                return unsafe { (real.$name)(size) };
            }
            let hook = enter_hook();
            // SAFETY: as above.
            let ptr = unsafe { (real.$name)(size) };
            record_alloc(hook, $kind, ptr, size, core::ptr::null_mut(), 0);
            leave_hook(hook);
            ptr
        }
    };
}

page_aligned_hook!(valloc, EventKind::Valloc);
page_aligned_hook!(pvalloc, EventKind::Pvalloc);

/// # Safety
/// As libc's `malloc_usable_size`: `ptr` is null or a live block of the program's heap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    if is_bootstrap(ptr) {
        // SAFETY: a live block (the caller's contract) in the arena is one
        // `bootstrap_alloc` returned.
        return unsafe { bootstrap_size(ptr) };
    }
    match real::real() {
        // SAFETY: a live block of the real allocator (not a bootstrap one).
        Some(real) => unsafe { (real.malloc_usable_size)(ptr) },
        None => 0,
    }
}

/// The program's own trims are marked on the timeline: what VmRSS was
/// before and after (see `trim_calls`).
///
/// # Safety
/// As glibc's `malloc_trim`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_trim(pad: usize) -> i32 {
    let Some(real) = real::real() else { return 0 };
    // SAFETY: (both calls) the real allocator's malloc_trim, which takes any pad.
    if recording() { crate::trim_calls::measure(pad, || unsafe { (real.malloc_trim)(pad) }) } else { unsafe { (real.malloc_trim)(pad) } }
}

// ---- address-space calls the program makes through libc --------------------

fn set_errno_from(result: i64) -> i64 {
    if result < 0 && result > -4096 {
        // SAFETY: libc's errno of the calling thread, always valid.
        unsafe { *libc::__errno_location() = -result as i32 };
        return -1;
    }
    result
}

fn raw_syscall(number: i64, args: [i64; 6]) -> i64 {
    // libc::syscall already maps failures to -1/errno.
    // SAFETY: a raw system call; the kernel checks its arguments, and the
    // callers pass the program's own, as libc's wrapper would.
    unsafe { libc::syscall(number, args[0], args[1], args[2], args[3], args[4], args[5]) }
}

/// # Safety
/// As libc's `mmap`: a mapping over `addr` (with MAP_FIXED) replaces memory
/// the program must not be using.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, offset: i64) -> *mut c_void {
    let result = raw_syscall(libc::SYS_mmap, [addr as i64, len as i64, prot.into(), flags.into(), fd.into(), offset]);
    if result != -1 && recording() {
        let extra = (u64::from(prot as u32) << 32) | u64::from(flags as u32);
        if crate::python::arena_mapped(result as u64, len as u64, extra) {
            // The arena allocator records it, with the stack that needed it.
            return result as *mut c_void;
        }
        let hook = enter_hook();
        record_mapping(hook, recorder::now(), EventKind::Mmap, result as u64, len as u64, 0, extra);
        leave_hook(hook);
    }
    result as *mut c_void
}

/// # Safety
/// As libc's `mmap64`, the same function on 64-bit Linux.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, offset: i64) -> *mut c_void {
    // SAFETY: the caller's contract is `mmap`'s.
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

/// # Safety
/// As libc's `munmap`: the program no longer uses the range.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    if !recording() {
        return raw_syscall(libc::SYS_munmap, [addr as i64, len as i64, 0, 0, 0, 0]) as i32;
    }
    let hook = enter_hook();
    let time = recorder::now();
    let result = raw_syscall(libc::SYS_munmap, [addr as i64, len as i64, 0, 0, 0, 0]);
    if result == 0 {
        record_mapping(hook, time, EventKind::Munmap, addr as u64, len as u64, 0, 0);
    }
    leave_hook(hook);
    result as i32
}

/// `mremap` is variadic; on x86-64 and aarch64 the optional fifth argument
/// arrives in the same register a fixed fifth parameter would.
/// # Safety
/// As libc's `mremap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: i32, new_addr: *mut c_void) -> *mut c_void {
    let call = || raw_syscall(libc::SYS_mremap, [old as i64, old_len as i64, new_len as i64, flags.into(), new_addr as i64, 0]);
    if !recording() {
        return call() as *mut c_void;
    }
    let hook = enter_hook();
    let time = recorder::now();
    let result = call();
    if result != -1 {
        record_mapping(hook, time, EventKind::Mremap, result as u64, new_len as u64, old as u64, old_len as u64);
    }
    leave_hook(hook);
    result as *mut c_void
}

/// # Safety
/// As libc's `brk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> i32 {
    let Some(real) = real::real() else { return set_errno_from(-(libc::ENOMEM as i64)) as i32 };
    // SAFETY: libc's brk, with the caller's argument.
    let result = unsafe { (real.brk)(addr) };
    if result == 0 && recording() {
        let hook = enter_hook();
        record_mapping(hook, recorder::now(), EventKind::Brk, addr as u64, 0, addr as u64, 0);
        leave_hook(hook);
    }
    result
}

/// # Safety
/// As libc's `sbrk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sbrk(increment: isize) -> *mut c_void {
    let Some(real) = real::real() else { return set_errno_from(-(libc::ENOMEM as i64)) as *mut c_void };
    // SAFETY: libc's sbrk, with the caller's argument.
    let result = unsafe { (real.sbrk)(increment) };
    if result as isize != -1 && recording() {
        let hook = enter_hook();
        record_mapping(hook, recorder::now(), EventKind::Sbrk, result as u64, 0, 0, increment as u64);
        leave_hook(hook);
    }
    result
}

/// Lets a program take a snapshot at a point of its choosing (tests use it;
/// a program can find it with `dlsym(RTLD_DEFAULT, "memgap_snapshot")`).
#[unsafe(no_mangle)]
pub extern "C" fn memgap_snapshot() {
    recorder::program_snapshot();
}

// ---- exec: the new image continues the trace, in an area of its own -------

type Argv = *const *const libc::c_char;

unsafe extern "C" {
    static environ: Argv;
}

/// # Safety
/// As libc's `execve`: `path`, `argv` and `envp` as it requires.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(path: *const libc::c_char, argv: Argv, envp: Argv) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        // SAFETY: the caller's arguments, to libc's execve.
        Some(real) => unsafe { (real.execve)(path, argv, envp) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

/// # Safety
/// As libc's `execv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: Argv) -> i32 {
    // SAFETY: the caller's arguments, and the process's environment.
    unsafe { execve(path, argv, environ) }
}

/// # Safety
/// As glibc's `execvpe`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(file: *const libc::c_char, argv: Argv, envp: Argv) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        // SAFETY: the caller's arguments, to libc's execvpe.
        Some(real) => unsafe { (real.execvpe)(file, argv, envp) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

/// # Safety
/// As libc's `execvp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: Argv) -> i32 {
    // SAFETY: the caller's arguments, and the process's environment.
    unsafe { execvpe(file, argv, environ) }
}

/// # Safety
/// As libc's `fexecve`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(fd: i32, argv: Argv, envp: Argv) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        // SAFETY: the caller's arguments, to libc's fexecve.
        Some(real) => unsafe { (real.fexecve)(fd, argv, envp) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

/// # Safety
/// As libc's `execveat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execveat(dirfd: i32, path: *const libc::c_char, argv: Argv, envp: Argv, flags: i32) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        // SAFETY: the caller's arguments, to libc's execveat.
        Some(real) => unsafe { (real.execveat)(dirfd, path, argv, envp, flags) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

// ---- the loader --------------------------------------------------------------

/// Counted, so a fork knows whether the loader's lock is free (see `loader`).
///
/// # Safety
/// As libc's `dl_iterate_phdr`: `callback`, if any, takes `data` as given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dl_iterate_phdr(callback: Option<crate::loader::Callback>, data: *mut c_void) -> libc::c_int {
    crate::loader::program_iterate(callback, data)
}

// ---- process end -----------------------------------------------------------

/// # Safety
/// As libc's `exit`: the process ends.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exit(code: i32) -> ! {
    recorder::set_exit_code(code);
    match real::real() {
        // SAFETY: libc's exit (atexit handlers, stdio, then the end).
        Some(real) => unsafe { (real.exit)(code) },
        // SAFETY: our `_exit`, which ends the process.
        None => unsafe { _exit(code) },
    }
}

/// `_exit` skips atexit handlers, so the trace is finished here.
///
/// # Safety
/// As libc's `_exit`: the process ends without running atexit handlers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(code: i32) -> ! {
    recorder::set_exit_code(code);
    recorder::finish(EndReason::Exit);
    loop {
        // SAFETY: exit_group never returns; the loop satisfies the type.
        unsafe { libc::syscall(libc::SYS_exit_group, code) };
    }
}

/// # Safety
/// As libc's `_Exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(code: i32) -> ! {
    // SAFETY: the caller's contract is `_exit`'s.
    unsafe { _exit(code) }
}
