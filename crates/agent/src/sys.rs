//! Raw system calls and logging for the agent.
//!
//! The agent exports `mmap` and friends itself, so its own mappings must not
//! go through libc's symbols; and it must not use stdio or `std::env` inside
//! hooks (they allocate or lock). Everything here is a bare syscall.

use core::ffi::c_void;

pub fn mmap_anonymous(len: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping, placed by the kernel: it
    // replaces nothing.
    let addr = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            core::ptr::null_mut::<c_void>(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1i64,
            0i64,
        )
    };
    if addr == -1 || addr == 0 {
        return core::ptr::null_mut();
    }
    agent_ranges::add(addr as u64, len as u64);
    // Name the mapping so smaps (and memgap's own ledger) can tell the
    // profiler's memory from the program's; older kernels refuse, harmlessly.
    const PR_SET_VMA: libc::c_int = 0x53564d41;
    const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
    // SAFETY: names the mapping just made; the name is a static C string.
    unsafe {
        libc::prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, addr as libc::c_ulong, len as libc::c_ulong, c"memgap".as_ptr());
    }
    addr as *mut u8
}

pub fn munmap(addr: *mut u8, len: usize) {
    // SAFETY: the caller's own mapping (one `mmap_anonymous` made), which nothing uses any more.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
    agent_ranges::remove(addr as u64);
}

/// The address ranges of the agent's own mappings, so the ledger can count
/// them apart from the program's memory (anonymous mappings cannot be named
/// on kernels without CONFIG_ANON_VMA_NAME, and the kernel may merge ours
/// with the program's).
pub mod agent_ranges {
    use super::SpinLock;

    /// As many as the area has room for: a program of thousands of threads
    /// has a few of the agent's mappings per thread.
    const MAX: usize = memgap_trace::shared::AGENT_RANGES;

    struct Table {
        ranges: [(u64, u64); MAX],
        len: usize,
    }

    static TABLE: SpinLock<Table> = SpinLock::new(Table { ranges: [(0, 0); MAX], len: 0 });

    pub fn add(start: u64, len: u64) {
        let mut table = TABLE.lock();
        if table.len < MAX {
            let at = table.len;
            table.ranges[at] = (start, len);
            table.len += 1;
            mirror(&table, at..at + 1);
        }
    }

    pub fn remove(start: u64) {
        let mut table = TABLE.lock();
        if let Some(i) = table.ranges[..table.len].iter().position(|r| r.0 == start) {
            let last = table.len - 1;
            table.ranges[i] = table.ranges[last];
            table.len = last;
            mirror(&table, i..i + 1);
        }
    }

    /// Copies the whole table into the shared area (once it exists).
    pub fn publish() {
        let table = TABLE.lock();
        mirror(&table, 0..table.len);
    }

    /// Copies the table's `changed` entries and its length into the shared
    /// area, where the recorder reads them at snapshots (under a sequence
    /// count: odd while they change). Only what changed: with thousands of
    /// entries, copying them all at every change kept the recorder's reads
    /// from ever finding them still.
    fn mirror(table: &Table, changed: core::ops::Range<usize>) {
        use core::sync::atomic::Ordering::*;
        let Some(area) = crate::area::get() else { return };
        let header = area.header();
        let seq = header.ranges_seq.0.load(Relaxed);
        header.ranges_seq.0.store(seq.wrapping_add(1), Relaxed);
        core::sync::atomic::fence(Release);
        for (slot, range) in header.ranges[changed.clone()].iter().zip(&table.ranges[changed]) {
            slot[0].store(range.0, Relaxed);
            slot[1].store(range.1, Relaxed);
        }
        header.ranges_len.store(table.len as u32, Relaxed);
        header.ranges_seq.0.store(seq.wrapping_add(2), Release);
    }

    /// In a fork child: the parent's buffers were unmapped, the rest stays.
    ///
    /// # Safety
    /// Only in a fork child, as [`SpinLock::unlock_after_fork`] says.
    pub unsafe fn unlock_after_fork() {
        // SAFETY: the caller's promise.
        unsafe { TABLE.unlock_after_fork() };
    }
}

pub fn errno() -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

pub fn gettid() -> u32 {
    // SAFETY: a system call without arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

pub fn getpid() -> u32 {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_getpid) as u32 }
}

pub fn getppid() -> u32 {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_getppid) as u32 }
}

/// Runs `f` (a system call that may grow a file) with SIGXFSZ blocked: past
/// RLIMIT_FSIZE its default action kills the program. One the call raised
/// is taken back, so the call only fails with EFBIG; one the program
/// already had pending stays pending.
pub fn without_xfsz<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: signal sets on our stack, initialized by sigemptyset (or written
    // by the kernel) before they are read; errno is the calling thread's.
    unsafe {
        let mut xfsz: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut xfsz);
        libc::sigaddset(&mut xfsz, libc::SIGXFSZ);
        libc::pthread_sigmask(libc::SIG_BLOCK, &xfsz, &mut old);
        let was_pending = xfsz_pending();
        let result = f();
        let errno_after = errno();
        if !was_pending && xfsz_pending() {
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            libc::sigtimedwait(&xfsz, core::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        *libc::__errno_location() = errno_after;
        result
    }
}

fn xfsz_pending() -> bool {
    // SAFETY: a signal set on our stack, written by sigpending before it is read.
    unsafe {
        let mut pending: libc::sigset_t = core::mem::zeroed();
        libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGXFSZ) == 1
    }
}

/// Sleeps without touching any libc state the program may hold.
pub fn sleep_ns(ns: u64) {
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
    // SAFETY: `ts` is a valid timespec; no remaining time is asked for.
    unsafe { libc::syscall(libc::SYS_nanosleep, &ts, core::ptr::null_mut::<libc::timespec>()) };
}

/// Reads a whole small file (such as /proc/self/cmdline) with raw syscalls.
pub fn read_file(path: &core::ffi::CStr) -> Vec<u8> {
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) } as i32;
    if fd < 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    out
}

/// A spin lock that owns what it guards, for the agent's rare slow paths
/// (its own heap, the records channel, the table of its mappings). Unlike
/// a futex-based mutex it never allocates, never sleeps on a word the
/// program could hold, and a fork child can take it back from the thread
/// that held it at the fork and is gone ([`SpinLock::unlock_after_fork`]).
pub struct SpinLock<T> {
    locked: core::sync::atomic::AtomicBool,
    value: core::cell::UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and `locked` lets one
// guard exist at a time, so sharing the lock hands `T` from thread to
// thread like a move: `T: Send` is what that needs (as for `Mutex`).
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock { locked: core::sync::atomic::AtomicBool::new(false), value: core::cell::UnsafeCell::new(value) }
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        use core::sync::atomic::Ordering::*;
        self.locked.compare_exchange_weak(false, true, Acquire, Relaxed).is_ok()
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        while !self.try_acquire() {
            spins += 1;
            if spins > 100 {
                sleep_ns(50_000);
            } else {
                core::hint::spin_loop();
            }
        }
        SpinGuard { lock: self, _not_sync_unless_t_is: core::marker::PhantomData }
    }

    /// Like `lock`, but gives up after `timeout_ns`.
    pub fn try_lock_for(&self, timeout_ns: u64) -> Option<SpinGuard<'_, T>> {
        let mut waited = 0u64;
        while !self.try_acquire() {
            if waited >= timeout_ns {
                return None;
            }
            sleep_ns(100_000);
            waited += 100_000;
        }
        Some(SpinGuard { lock: self, _not_sync_unless_t_is: core::marker::PhantomData })
    }

    /// Frees the lock whoever holds it: in a fork child, where the thread
    /// that held it at the fork does not exist.
    ///
    /// # Safety
    /// No guard of this lock may be alive in the calling process, other
    /// than ones that will never be used or dropped again (those of a
    /// thread the fork left behind): a fork child's only thread, outside
    /// any guard of its own, is such a caller.
    pub unsafe fn unlock_after_fork(&self) {
        self.locked.store(false, core::sync::atomic::Ordering::Release);
    }
}

/// The lock held: the guarded value through `Deref`/`DerefMut`; dropping
/// it releases the lock.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Shares `&T` across threads only when `T: Sync` (and moves the guard
    /// only when `T: Send`), as `&mut T` does.
    _not_sync_unless_t_is: core::marker::PhantomData<&'a mut T>,
}

impl<T> core::ops::Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard exists only while `locked` is held by it, so
        // no other reference to the value is alive.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> core::ops::DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only
        // reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, core::sync::atomic::Ordering::Release);
    }
}

/// The calling thread's thread pointer, where the architecture has one
/// the agent knows how to read.
#[inline(always)]
pub fn thread_pointer() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: on x86-64 Linux, fs:0 holds the thread pointer itself.
        unsafe { core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, pure, preserves_flags)) };
        Some(tp)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        unsafe { core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, pure, preserves_flags)) };
        Some(tp)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// The CPU the calling thread runs on, for every event. glibc (2.35+)
/// registers an rseq area per thread in which the kernel keeps `cpu_id`
/// current; reading it from the thread pointer is two loads, where calling
/// sched_getcpu (which reads the same field) cost 1.6 % of a churn run's
/// samples. Without rseq (older glibc, valgrind, the tunable off) the call
/// remains.
pub mod current_cpu {
    use core::sync::atomic::{AtomicIsize, Ordering::Relaxed};

    use super::thread_pointer;

    /// Offset of `cpu_id` from the thread pointer; `NONE` when unknown.
    static CPU_ID_OFFSET: AtomicIsize = AtomicIsize::new(NONE);
    const NONE: isize = isize::MIN;
    /// `struct rseq { u32 cpu_id_start; s32 cpu_id; ... }`
    const CPU_ID_FIELD: isize = 4;

    /// Looks glibc's rseq registration up; called once, before recording.
    pub fn init() {
        if thread_pointer().is_none() {
            return;
        }
        // Looked up rather than linked: the agent must load on a glibc
        // older than 2.35 too.
        // SAFETY: NUL-terminated names; dlsym only looks them up.
        let offset = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()) } as *const isize;
        // SAFETY: as above.
        let size = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()) } as *const u32;
        // SAFETY: glibc's `__rseq_size`, a u32 it exports (checked non-null).
        if offset.is_null() || size.is_null() || unsafe { *size } == 0 {
            return;
        }
        // SAFETY: glibc's `__rseq_offset`, an isize it exports (checked non-null).
        CPU_ID_OFFSET.store(unsafe { *offset } + CPU_ID_FIELD, Relaxed);
    }

    #[inline(always)]
    pub fn get() -> u32 {
        let offset = CPU_ID_OFFSET.load(Relaxed);
        if offset != NONE
            && let Some(tp) = thread_pointer()
        {
            // SAFETY: glibc placed this thread's rseq area at the thread
            // pointer plus __rseq_offset; the kernel writes cpu_id.
            let cpu = unsafe { core::ptr::read_volatile((tp as isize).wrapping_add(offset) as *const i32) };
            // Negative: this thread's registration failed.
            if cpu >= 0 {
                return cpu as u32;
            }
        }
        // SAFETY: no precondition.
        unsafe { libc::sched_getcpu() as u32 }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn agrees_with_sched_getcpu() {
            super::init();
            // A migration between the two reads is possible but rare; one
            // agreement in a few tries shows the field is the right one.
            // SAFETY: no precondition.
            let agrees = (0..100).any(|_| super::get() == unsafe { libc::sched_getcpu() } as u32);
            assert!(agrees);
            assert_ne!(super::CPU_ID_OFFSET.load(core::sync::atomic::Ordering::Relaxed), super::NONE, "glibc here registers rseq");
        }
    }
}

#[cfg(test)]
mod spin_lock_tests {
    use super::SpinLock;

    #[test]
    fn threads_contending_lose_no_update() {
        // A plain (non-atomic) counter and a pair that must stay equal: a
        // second holder would lose increments or see the pair torn.
        static COUNTS: SpinLock<(u64, u64)> = SpinLock::new((0, 0));
        const THREADS: u64 = 4;
        const ROUNDS: u64 = 20_000;
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..ROUNDS {
                        let mut counts = COUNTS.lock();
                        assert_eq!(counts.0, counts.1, "another thread was inside the lock");
                        counts.0 += 1;
                        std::hint::black_box(&mut *counts);
                        counts.1 += 1;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(*COUNTS.lock(), (THREADS * ROUNDS, THREADS * ROUNDS));
    }

    #[test]
    fn dropping_the_guard_releases_the_lock() {
        let lock = SpinLock::new(vec![1u8]);
        let mut guard = lock.lock();
        guard.push(2);
        assert!(lock.try_lock_for(0).is_none(), "held while the guard lives");
        assert!(lock.try_lock_for(300_000).is_none(), "still held after waiting");
        drop(guard);
        let again = lock.try_lock_for(0).expect("free once the guard is dropped");
        assert_eq!(*again, [1, 2]);
    }

    #[test]
    fn a_waiting_thread_gets_the_lock_when_the_holder_lets_go() {
        let lock = SpinLock::new(0u32);
        let guard = lock.lock();
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| *lock.lock() + 1);
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!waiter.is_finished(), "waits while the lock is held");
            drop(guard);
            assert_eq!(waiter.join().unwrap(), 1);
        });
    }

    #[test]
    fn unlock_after_fork_frees_a_lock_whose_holder_is_gone() {
        let lock = SpinLock::new(7u8);
        // A holder that will never drop its guard, as a thread the fork left behind.
        core::mem::forget(lock.lock());
        assert!(lock.try_lock_for(0).is_none());
        // SAFETY: the only guard is forgotten and never used again.
        unsafe { lock.unlock_after_fork() };
        assert_eq!(*lock.try_lock_for(0).expect("free again"), 7);
    }
}
