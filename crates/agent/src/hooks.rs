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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let Some(real) = real::real() else { return bootstrap_alloc(size, 16) };
    if !recording() {
        return unsafe { (real.malloc)(size) };
    }
    let hook = enter_hook();
    let ptr = unsafe { (real.malloc)(size) };
    record_alloc(hook, EventKind::Malloc, ptr, size, core::ptr::null_mut(), 0);
    leave_hook(hook);
    ptr
}

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
        unsafe { (real.free)(ptr) };
        record_free(hook, time, ptr, usable);
        leave_hook(hook);
    } else {
        unsafe { (real.free)(ptr) };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let Some(real) = real::real() else {
        return match count.checked_mul(size) {
            Some(total) => bootstrap_alloc(total, 16),
            None => core::ptr::null_mut(),
        };
    };
    if !recording() {
        return unsafe { (real.calloc)(count, size) };
    }
    let hook = enter_hook();
    let ptr = unsafe { (real.calloc)(count, size) };
    record_alloc(hook, EventKind::Calloc, ptr, count.saturating_mul(size), core::ptr::null_mut(), 0);
    leave_hook(hook);
    ptr
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if is_bootstrap(ptr) {
        let new = unsafe { malloc(size) };
        if !new.is_null() {
            unsafe { core::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, bootstrap_size(ptr).min(size)) };
        }
        return new;
    }
    let Some(real) = real::real() else { return core::ptr::null_mut() };
    if !recording() {
        return unsafe { (real.realloc)(ptr, size) };
    }
    let hook = enter_hook();
    let before = recorder::now();
    let old_usable = recorder::freed_size(ptr);
    let new = unsafe { (real.realloc)(ptr, size) };
    record_realloc(hook, EventKind::Realloc, before, new, size, ptr, old_usable);
    leave_hook(hook);
    new
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, count: usize, size: usize) -> *mut c_void {
    // Implemented on the real realloc (as glibc does), so it always reaches
    // the allocator that owns `ptr`, even one that lacks reallocarray.
    let Some(total) = count.checked_mul(size) else {
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    };
    if is_bootstrap(ptr) {
        return unsafe { realloc(ptr, total) };
    }
    let Some(real) = real::real() else { return core::ptr::null_mut() };
    if !recording() {
        return unsafe { (real.realloc)(ptr, total) };
    }
    let hook = enter_hook();
    let before = recorder::now();
    let old_usable = recorder::freed_size(ptr);
    let new = unsafe { (real.realloc)(ptr, total) };
    record_realloc(hook, EventKind::Reallocarray, before, new, total, ptr, old_usable);
    leave_hook(hook);
    new
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    let Some(real) = real::real() else {
        let ptr = bootstrap_alloc(size, align);
        if ptr.is_null() {
            return libc::ENOMEM;
        }
        unsafe { *out = ptr };
        return 0;
    };
    if !recording() {
        return unsafe { (real.posix_memalign)(out, align, size) };
    }
    let hook = enter_hook();
    let result = unsafe { (real.posix_memalign)(out, align, size) };
    let ptr = if result == 0 { unsafe { *out } } else { core::ptr::null_mut() };
    record_alloc(hook, EventKind::PosixMemalign, ptr, size, core::ptr::null_mut(), align);
    leave_hook(hook);
    result
}

macro_rules! aligned_hook {
    ($name:ident, $kind:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(align: usize, size: usize) -> *mut c_void {
            let Some(real) = real::real() else { return bootstrap_alloc(size, align) };
            if !recording() {
                return unsafe { (real.$name)(align, size) };
            }
            let hook = enter_hook();
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
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            let Some(real) = real::real() else { return bootstrap_alloc(size, 4096) };
            if !recording() {
                return unsafe { (real.$name)(size) };
            }
            let hook = enter_hook();
            let ptr = unsafe { (real.$name)(size) };
            record_alloc(hook, $kind, ptr, size, core::ptr::null_mut(), 0);
            leave_hook(hook);
            ptr
        }
    };
}

page_aligned_hook!(valloc, EventKind::Valloc);
page_aligned_hook!(pvalloc, EventKind::Pvalloc);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    if is_bootstrap(ptr) {
        return bootstrap_size(ptr);
    }
    match real::real() {
        Some(real) => unsafe { (real.malloc_usable_size)(ptr) },
        None => 0,
    }
}

/// The program's own trims are marked on the timeline: what VmRSS was
/// before and after (see `trim_calls`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_trim(pad: usize) -> i32 {
    let Some(real) = real::real() else { return 0 };
    if recording() { crate::trim_calls::measure(pad, || unsafe { (real.malloc_trim)(pad) }) } else { unsafe { (real.malloc_trim)(pad) } }
}

// ---- address-space calls the program makes through libc --------------------

fn set_errno_from(result: i64) -> i64 {
    if result < 0 && result > -4096 {
        unsafe { *libc::__errno_location() = -result as i32 };
        return -1;
    }
    result
}

fn raw_syscall(number: i64, args: [i64; 6]) -> i64 {
    // libc::syscall already maps failures to -1/errno.
    unsafe { libc::syscall(number, args[0], args[1], args[2], args[3], args[4], args[5]) }
}

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, offset: i64) -> *mut c_void {
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> i32 {
    let Some(real) = real::real() else { return set_errno_from(-(libc::ENOMEM as i64)) as i32 };
    let result = unsafe { (real.brk)(addr) };
    if result == 0 && recording() {
        let hook = enter_hook();
        record_mapping(hook, recorder::now(), EventKind::Brk, addr as u64, 0, addr as u64, 0);
        leave_hook(hook);
    }
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn sbrk(increment: isize) -> *mut c_void {
    let Some(real) = real::real() else { return set_errno_from(-(libc::ENOMEM as i64)) as *mut c_void };
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(path: *const libc::c_char, argv: Argv, envp: Argv) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        Some(real) => unsafe { (real.execve)(path, argv, envp) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: Argv) -> i32 {
    unsafe { execve(path, argv, environ) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(file: *const libc::c_char, argv: Argv, envp: Argv) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        Some(real) => unsafe { (real.execvpe)(file, argv, envp) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: Argv) -> i32 {
    unsafe { execvpe(file, argv, environ) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(fd: i32, argv: Argv, envp: Argv) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        Some(real) => unsafe { (real.fexecve)(fd, argv, envp) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn execveat(dirfd: i32, path: *const libc::c_char, argv: Argv, envp: Argv, flags: i32) -> i32 {
    recorder::before_exec();
    let result = match real::real() {
        Some(real) => unsafe { (real.execveat)(dirfd, path, argv, envp, flags) },
        None => -1,
    };
    recorder::after_failed_exec();
    result
}

// ---- process end -----------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn exit(code: i32) -> ! {
    recorder::set_exit_code(code);
    match real::real() {
        Some(real) => unsafe { (real.exit)(code) },
        None => unsafe { _exit(code) },
    }
}

/// `_exit` skips atexit handlers, so the trace is finished here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(code: i32) -> ! {
    recorder::set_exit_code(code);
    recorder::finish(EndReason::Exit);
    loop {
        unsafe { libc::syscall(libc::SYS_exit_group, code) };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(code: i32) -> ! {
    unsafe { _exit(code) }
}
