//! One thread of another process, stopped under ptrace.
//!
//! PTRACE_SEIZE then PTRACE_INTERRUPT stops just that thread (the others run
//! on) without sending it a signal. Signals that arrive for it while it is
//! held are kept and sent again when it is let go, so the program still gets
//! them. Dropping a [`StoppedThread`] detaches it, whatever happened.

use std::time::{Duration, Instant};

use libc::user_regs_struct;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;

use crate::error::{AttachError, permission_cause};

/// The extended register state (x87, SSE, AVX…: XSAVE layout).
const NT_X86_XSTATE: libc::c_uint = 0x202;
/// The 512-byte FXSAVE area, for CPUs without XSAVE.
const NT_PRFPREG: libc::c_uint = 2;
/// Enough for every XSAVE component, AMX tiles included.
const XSTATE_MAX: usize = 64 << 10;
const PTRACE_EVENT_STOP: i32 = 128;

/// Why a held thread stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It was about to receive this signal (signal-delivery-stop).
    Signal(i32),
    /// PTRACE_INTERRUPT, or a group stop.
    Interrupted,
    /// It no longer exists (the process exited or was killed).
    Gone,
}

pub struct StoppedThread {
    pub pid: u32,
    pub tid: u32,
    /// Signals held back while we had the thread, to send again on detach.
    held_signals: Vec<i32>,
    /// Resumed since its last stop: it must be stopped again to detach.
    running: bool,
    detached: bool,
}

/// The saved extended registers: which regset, and its bytes.
pub struct ExtendedState(libc::c_uint, Vec<u8>);

impl StoppedThread {
    /// Seizes thread `tid` of `pid` and stops it. None if the thread is gone.
    pub fn stop(pid: u32, tid: u32) -> Result<Option<StoppedThread>, AttachError> {
        match ptrace::seize(Pid::from_raw(tid as i32), ptrace::Options::empty()) {
            Ok(()) => {}
            Err(Errno::ESRCH) => return Ok(None),
            Err(Errno::EPERM) => return Err(AttachError::NotPermitted { pid, action: "trace", cause: permission_cause(pid) }),
            Err(e) => return Err(AttachError::Failed(format!("cannot trace thread {tid} of process {pid}: {e}"))),
        }
        let mut thread = StoppedThread { pid, tid, held_signals: Vec::new(), running: true, detached: false };
        thread.ptrace_result("interrupt", ptrace::interrupt(thread.id()))?;
        loop {
            match thread.wait(None)? {
                Some(Stop::Interrupted) => return Ok(Some(thread)),
                Some(Stop::Signal(signal)) => {
                    thread.held_signals.push(signal);
                    thread.resume()?;
                }
                Some(Stop::Gone) => {
                    thread.detached = true;
                    return Ok(None);
                }
                None => unreachable!("waiting with no deadline"),
            }
        }
    }

    /// Seizes and stops every thread of `pid` (threads started meanwhile
    /// too): all are asked to stop first, then each stop is waited for.
    /// Threads that are gone are left out.
    pub fn stop_all(pid: u32) -> Result<Vec<StoppedThread>, AttachError> {
        let mut stopped: Vec<StoppedThread> = Vec::new();
        for _ in 0..64 {
            let fresh: Vec<u32> =
                crate::procfs::threads(pid).into_iter().map(|t| t.tid).filter(|tid| !stopped.iter().any(|s| s.tid == *tid)).collect();
            if fresh.is_empty() {
                return Ok(stopped);
            }
            let mut asked = Vec::new();
            for tid in fresh {
                match ptrace::seize(Pid::from_raw(tid as i32), ptrace::Options::empty()) {
                    Ok(()) => {}
                    Err(Errno::ESRCH) => continue,
                    Err(Errno::EPERM) => return Err(AttachError::NotPermitted { pid, action: "trace", cause: permission_cause(pid) }),
                    Err(e) => return Err(AttachError::Failed(format!("cannot trace thread {tid} of process {pid}: {e}"))),
                }
                let thread = StoppedThread { pid, tid, held_signals: Vec::new(), running: true, detached: false };
                match ptrace::interrupt(thread.id()) {
                    Ok(()) => asked.push(thread),
                    // Gone between the two calls: nothing to let go.
                    Err(_) => drop(thread),
                }
            }
            for mut thread in asked {
                loop {
                    match thread.wait(None)? {
                        Some(Stop::Interrupted) => {
                            stopped.push(thread);
                            break;
                        }
                        Some(Stop::Signal(signal)) => {
                            thread.held_signals.push(signal);
                            thread.resume()?;
                        }
                        Some(Stop::Gone) | None => {
                            thread.detached = true;
                            break;
                        }
                    }
                }
            }
        }
        Err(AttachError::Failed(format!("process {pid} kept starting threads while memgap stopped them")))
    }

    fn id(&self) -> Pid {
        Pid::from_raw(self.tid as i32)
    }

    fn ptrace_result<T>(&self, what: &str, result: nix::Result<T>) -> Result<T, AttachError> {
        result.map_err(|e| match e {
            Errno::ESRCH => AttachError::Failed(format!("thread {} of process {} disappeared during {what}", self.tid, self.pid)),
            e => AttachError::Failed(format!("ptrace {what} on thread {} of process {}: {e}", self.tid, self.pid)),
        })
    }

    pub fn registers(&self) -> Result<user_regs_struct, AttachError> {
        self.ptrace_result("GETREGS", ptrace::getregs(self.id()))
    }

    pub fn set_registers(&self, regs: user_regs_struct) -> Result<(), AttachError> {
        self.ptrace_result("SETREGS", ptrace::setregs(self.id(), regs))
    }

    /// The vector and floating-point registers, which the called function
    /// may use (glibc's memset does, with AVX).
    pub fn extended_state(&self) -> Result<ExtendedState, AttachError> {
        let mut buffer = vec![0u8; XSTATE_MAX];
        for kind in [NT_X86_XSTATE, NT_PRFPREG] {
            let mut iov = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() };
            // SAFETY: the kernel writes at most iov_len bytes into `buffer`.
            let result = unsafe {
                libc::ptrace(
                    libc::PTRACE_GETREGSET,
                    self.tid as libc::pid_t,
                    kind as usize as *mut libc::c_void,
                    &mut iov as *mut libc::iovec,
                )
            };
            if result == 0 {
                buffer.truncate(iov.iov_len);
                return Ok(ExtendedState(kind, buffer));
            }
        }
        let error = std::io::Error::last_os_error();
        Err(AttachError::Failed(format!("cannot read the vector registers of thread {} of process {}: {error}", self.tid, self.pid)))
    }

    pub fn set_extended_state(&self, state: &ExtendedState) -> Result<(), AttachError> {
        let mut bytes = state.1.clone();
        let mut iov = libc::iovec { iov_base: bytes.as_mut_ptr().cast(), iov_len: bytes.len() };
        // SAFETY: the kernel reads iov_len bytes from `bytes`.
        let result = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGSET,
                self.tid as libc::pid_t,
                state.0 as usize as *mut libc::c_void,
                &mut iov as *mut libc::iovec,
            )
        };
        if result != 0 {
            let error = std::io::Error::last_os_error();
            return Err(AttachError::Failed(format!(
                "cannot restore the vector registers of thread {} of process {}: {error}",
                self.tid, self.pid
            )));
        }
        Ok(())
    }

    /// The 8 bytes at `address` in the thread's memory.
    pub fn read_word(&self, address: u64) -> Option<u64> {
        ptrace::read(self.id(), address as ptrace::AddressType).ok().map(|word| word as u64)
    }

    pub fn write_word(&self, address: u64, value: u64) -> Result<(), AttachError> {
        self.ptrace_result("POKEDATA", ptrace::write(self.id(), address as ptrace::AddressType, value as i64))
    }

    /// Lets the thread run; a signal it was stopped for is not delivered
    /// (hold it with `hold_signal` first).
    pub fn resume(&mut self) -> Result<(), AttachError> {
        self.ptrace_result("CONT", ptrace::cont(self.id(), None))?;
        self.running = true;
        Ok(())
    }

    pub fn interrupt(&self) -> Result<(), AttachError> {
        self.ptrace_result("INTERRUPT", ptrace::interrupt(self.id()))
    }

    /// Waits for the thread's next stop, until `deadline` (None: for ever).
    pub fn wait(&mut self, deadline: Option<Instant>) -> Result<Option<Stop>, AttachError> {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status word. __WALL: the thread is not our child.
            let waited = unsafe { libc::waitpid(self.tid as libc::pid_t, &mut status, libc::__WALL | libc::WNOHANG) };
            if waited < 0 {
                let error = Errno::last();
                return if error == Errno::ECHILD {
                    Ok(Some(Stop::Gone))
                } else {
                    Err(AttachError::Failed(format!("waitpid on thread {}: {error}", self.tid)))
                };
            }
            if waited == 0 {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.detached = true;
                return Ok(Some(Stop::Gone));
            }
            if libc::WIFSTOPPED(status) {
                self.running = false;
                let signal = libc::WSTOPSIG(status);
                return Ok(Some(if status >> 16 == PTRACE_EVENT_STOP { Stop::Interrupted } else { Stop::Signal(signal) }));
            }
        }
    }

    /// Keeps `signal` to send again when the thread is let go.
    pub fn hold_signal(&mut self, signal: i32) {
        self.held_signals.push(signal);
    }

    /// Lets the thread go: detaches, then sends the signals held back.
    pub fn detach(mut self) -> Result<(), AttachError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), AttachError> {
        if self.detached {
            return Ok(());
        }
        if self.running {
            // PTRACE_DETACH needs a stopped tracee.
            self.interrupt()?;
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.running {
                match self.wait(Some(deadline))? {
                    Some(Stop::Signal(signal)) => {
                        self.hold_signal(signal);
                        self.resume()?;
                    }
                    Some(Stop::Interrupted) => {}
                    Some(Stop::Gone) => return Ok(()),
                    None => {
                        return Err(AttachError::Failed(format!(
                            "thread {} of process {} did not stop to be detached",
                            self.tid, self.pid
                        )));
                    }
                }
            }
        }
        self.detached = true;
        let result = ptrace::detach(self.id(), None);
        for &signal in &self.held_signals {
            // SAFETY: tgkill takes plain integers.
            unsafe { libc::tgkill(self.pid as libc::pid_t, self.tid as libc::pid_t, signal) };
        }
        match result {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(e) => Err(AttachError::Failed(format!("cannot detach from thread {} of process {}: {e}", self.tid, self.pid))),
        }
    }
}

impl Drop for StoppedThread {
    fn drop(&mut self) {
        let _ = self.release();
    }
}
