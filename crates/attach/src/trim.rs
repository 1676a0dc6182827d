//! Making a running process call glibc's `malloc_trim(0)`, with ptrace.
//!
//! Only the thread that makes the call is stopped; the others run on, so a
//! lock one of them holds is released as usual and the injected call just
//! waits for it. The chosen thread must not itself be inside the allocator
//! (it may hold an arena lock malloc_trim needs: a deadlock): its libc
//! frames are unwound and checked against malloc.c's code; a thread inside
//! is let go and another tried, and after a round of all threads, again
//! 20 ms later, up to 50 rounds.

use std::time::{Duration, Instant};

use memgap_trace::records::Mapping;
use memgap_types::outside::TrimCall;

use crate::error::{AttachError, field};
use crate::libc_image::{LibcImage, Whereabouts};
use crate::modules::{file_name, other_allocator, other_malloc_definers};
use crate::procfs::{self, ThreadInfo};
use crate::remote_call;
use crate::tracee::StoppedThread;

/// System calls that fail with EINTR when their thread is stopped and
/// resumed, even with no signal handler (signal(7)); threads blocked in one
/// are tried last. x86-64 numbers: semop, msgsnd, msgrcv, rt_sigtimedwait,
/// io_getevents, semtimedop, epoll_wait, epoll_pwait, io_pgetevents, epoll_pwait2.
const EINTR_ON_STOP: [i64; 10] = [65, 69, 70, 128, 208, 220, 232, 281, 333, 441];
/// Stack a thread must have below its stack pointer for the call.
pub(crate) const STACK_ROOM: u64 = 64 << 10;
pub(crate) const SIGSEGV_BIT: u64 = 1 << (libc::SIGSEGV - 1);

#[derive(Debug, Clone)]
pub struct TrimOptions {
    /// Call on this thread only.
    pub thread: Option<u32>,
    /// Rounds over all threads before giving up, and the pause between them.
    pub rounds: u32,
    pub pause: Duration,
    /// How long the call may take before memgap looks at why.
    pub patience: Duration,
}

impl Default for TrimOptions {
    fn default() -> Self {
        TrimOptions { thread: None, rounds: 50, pause: Duration::from_millis(20), patience: Duration::from_secs(10) }
    }
}

/// memgap trim runs code in the target: only in a process of the user who
/// runs memgap, or as root. CAP_SYS_PTRACE alone (a memgap binary given it
/// with setcap, a container granting it) would let the kernel permit more.
pub(crate) fn refuse_another_users_process(pid: u32) -> Result<(), AttachError> {
    // SAFETY: no precondition.
    let caller = unsafe { libc::getuid() };
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| AttachError::from_proc(pid, "read", &path, e))?;
    let uids = crate::error::field(&text, "Uid").unwrap_or("");
    match owner_refusal(caller, uids) {
        Some(cause) => Err(AttachError::NotPermitted { pid, action: "trim", cause }),
        None => Ok(()),
    }
}

/// Why a caller of real uid `caller` may not trim a process whose status
/// shows `uids` (real, effective, saved, filesystem), if it may not.
fn owner_refusal(caller: u32, uids: &str) -> Option<String> {
    if caller == 0 {
        return None;
    }
    let uids: Vec<&str> = uids.split_whitespace().collect();
    let caller_text = caller.to_string();
    if uids.len() == 4 && uids.iter().all(|&uid| uid == caller_text) {
        return None;
    }
    let owner = uids.first().copied().unwrap_or("?");
    let other = uids.iter().find(|&&uid| uid != caller_text).copied().unwrap_or(owner);
    Some(format!("it belongs to uid {other} and memgap runs as uid {caller}; memgap trim acts only on your own processes (or as root)"))
}

/// Makes process `pid` call malloc_trim(0) once.
pub fn malloc_trim(pid: u32, options: &TrimOptions) -> Result<TrimCall, AttachError> {
    let status = procfs::status(pid)?;
    let pid = if status.tgid != 0 { status.tgid } else { pid };
    refuse_another_users_process(pid)?;
    match status.state {
        'Z' | 'X' => return Err(AttachError::Zombie(pid)),
        'T' => return Err(AttachError::Unsuitable { pid, state: "is stopped (state T); let it continue first (kill -CONT)".into() }),
        _ if status.tracer_pid != 0 => {
            return Err(AttachError::Unsuitable {
                pid,
                state: format!("is already traced by process {} (a debugger?); detach it first", status.tracer_pid),
            });
        }
        _ => {}
    }
    let mappings = procfs::mappings(pid)?;
    if let Some((_, library)) = other_allocator(&mappings) {
        return Err(AttachError::NotGlibc { pid, library: file_name(library).to_string() });
    }
    if let Some(library) = other_malloc_definers(pid, &mappings).into_iter().next() {
        return Err(AttachError::NotGlibc { pid, library: format!("{library}, which defines malloc,") });
    }
    if mappings.iter().any(|m| m.start == 0) {
        return Err(AttachError::Unsuitable { pid, state: "has page 0 mapped, where memgap's call returns to".into() });
    }
    let libc = LibcImage::load(pid, &mappings)?;
    let _signals = TerminationSignalsBlocked::new();
    let started = Instant::now();
    let mut skipped: Vec<(Skip, u32)> = Vec::new();
    let mut rounds = 0;
    while rounds < options.rounds {
        rounds += 1;
        let mut worth_another_round = false;
        for candidate in candidates(pid, options.thread)? {
            match try_thread(pid, &candidate, &libc, &mappings, options)? {
                Ok(call) => return Ok(TrimCall { method: "ptrace".into(), thread: candidate.tid, attempts: rounds, ..call }),
                Err(skip) => {
                    worth_another_round |= skip.may_pass();
                    match skipped.iter_mut().find(|(s, _)| *s == skip) {
                        Some((_, count)) => *count += 1,
                        None => skipped.push((skip, 1)),
                    }
                }
            }
        }
        if !worth_another_round {
            break;
        }
        std::thread::sleep(options.pause);
    }
    let reasons: Vec<String> = skipped.iter().map(|(skip, count)| format!("{} {count}×", skip.describe())).collect();
    let again = if skipped.iter().any(|(skip, _)| skip.may_pass()) { "; try again" } else { "" };
    Err(AttachError::Failed(format!(
        "no thread of process {pid} could make the call in {rounds} round{} over {:.1} s ({}){again}",
        if rounds == 1 { "" } else { "s" },
        started.elapsed().as_secs_f64(),
        reasons.join(", ")
    )))
}

/// Why a thread was not used for the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    InAllocator,
    Unwinding,
    SignalBlocked,
    LittleStack,
    Gone,
}

impl Skip {
    fn describe(self) -> &'static str {
        match self {
            Skip::InAllocator => "inside glibc's allocator",
            Skip::Unwinding => "its libc frames could not be unwound",
            Skip::SignalBlocked => "SIGSEGV blocked or ignored",
            Skip::LittleStack => "too little stack",
            Skip::Gone => "the thread exited",
        }
    }

    /// Might the same thread do a moment later?
    fn may_pass(self) -> bool {
        matches!(self, Skip::InAllocator | Skip::Unwinding | Skip::Gone)
    }
}

/// The threads to try, best first: blocked in a system call that restarts
/// transparently, then running, then blocked where a stop causes EINTR.
pub(crate) fn candidates(pid: u32, only: Option<u32>) -> Result<Vec<ThreadInfo>, AttachError> {
    let mut threads = procfs::threads(pid);
    if let Some(tid) = only {
        threads.retain(|t| t.tid == tid);
        if threads.is_empty() {
            return Err(AttachError::Failed(format!("process {pid} has no thread {tid}")));
        }
    }
    threads.sort_by_key(|t| match t.syscall {
        Some(nr) if EINTR_ON_STOP.contains(&nr) => 2,
        Some(_) => 0,
        None => 1,
    });
    Ok(threads)
}

/// Calls malloc_trim on `thread` if it is a safe place to, else says why not.
fn try_thread(
    pid: u32,
    thread: &ThreadInfo,
    libc: &LibcImage,
    mappings: &[Mapping],
    options: &TrimOptions,
) -> Result<Result<TrimCall, Skip>, AttachError> {
    // A SIGSEGV blocked or ignored would be reset to its default by the
    // kernel when our call's return faults: leave such threads alone.
    let task = std::fs::read_to_string(format!("/proc/{pid}/task/{}/status", thread.tid)).unwrap_or_default();
    let mask = |key| field(&task, key).and_then(|v| u64::from_str_radix(v, 16).ok()).unwrap_or(0);
    if (mask("SigBlk") | mask("SigIgn")) & SIGSEGV_BIT != 0 {
        return Ok(Err(Skip::SignalBlocked));
    }
    let Some(mut stopped) = StoppedThread::stop(pid, thread.tid)? else { return Ok(Err(Skip::Gone)) };
    let regs = stopped.registers()?;
    let stack = mappings.iter().find(|m| m.start <= regs.rsp && regs.rsp < m.end);
    let skip = match libc.whereabouts(regs.rip, regs.rsp, regs.rbp, |at| stopped.read_word(at)) {
        Whereabouts::Outside if stack.is_some_and(|m| m.name == "[stack]" || regs.rsp - m.start >= STACK_ROOM) => None,
        Whereabouts::Outside => Some(Skip::LittleStack),
        Whereabouts::Unknown => Some(Skip::Unwinding),
        Whereabouts::InAllocator | Whereabouts::WaitingForLock => Some(Skip::InAllocator),
    };
    if let Some(skip) = skip {
        stopped.detach()?;
        return Ok(Err(skip));
    }
    let waiting_for_lock = |t: &StoppedThread, r: &libc::user_regs_struct| {
        libc.whereabouts(r.rip, r.rsp, r.rbp, |at| t.read_word(at)) == Whereabouts::WaitingForLock
    };
    let returned = remote_call::call(&mut stopped, libc.malloc_trim, &[0], options.patience, &waiting_for_lock);
    let detached = stopped.detach();
    let returned = returned?;
    detached?;
    Ok(Ok(TrimCall { returned: returned.value as u32 as i32, call_seconds: returned.duration.as_secs_f64(), ..TrimCall::default() }))
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT wait while memgap holds a thread:
/// dying then would let the kernel resume it in the middle of the call.
pub(crate) struct TerminationSignalsBlocked(libc::sigset_t);

impl TerminationSignalsBlocked {
    pub(crate) fn new() -> Self {
        // SAFETY: plain signal-set manipulation on local sets.
        unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut block);
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                libc::sigaddset(&mut block, signal);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut previous);
            TerminationSignalsBlocked(previous)
        }
    }
}

impl Drop for TerminationSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod owner_tests {
    use super::owner_refusal;

    #[test]
    fn only_own_processes_or_root() {
        assert_eq!(owner_refusal(0, "1000\t1000\t1000\t1000"), None);
        assert_eq!(owner_refusal(1000, "1000\t1000\t1000\t1000"), None);
        let other = owner_refusal(1000, "0\t0\t0\t0").unwrap();
        assert!(other.contains("belongs to uid 0") && other.contains("uid 1000"), "{other}");
        // A setuid program run by the caller: its effective uid is another's.
        assert!(owner_refusal(1000, "1000\t0\t0\t0").unwrap().contains("uid 0"));
        assert!(owner_refusal(1000, "").is_some());
    }
}
