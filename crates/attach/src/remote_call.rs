//! Calling a function inside another process, on one of its threads held by
//! ptrace (x86-64 System V ABI).
//!
//! The thread's registers (general and vector) and the stack word used are
//! saved; the call is set up below the red zone with a return address of 0,
//! so the function's `ret` faults at address 0 and the SIGSEGV stops the
//! thread before any handler sees it; then everything is put back as it was.
//! `orig_rax = -1` keeps the kernel from restarting an interrupted system
//! call in the middle of ours; the saved registers restart it afterwards.

use std::time::{Duration, Instant};

use libc::user_regs_struct;

use crate::error::AttachError;
use crate::tracee::{Stop, StoppedThread};

/// The System V red zone below the stack pointer, which leaf code may use.
const RED_ZONE: u64 = 128;
/// The direction flag, which the ABI wants clear at a call.
const DIRECTION_FLAG: u64 = 1 << 10;
/// Arguments past the sixth go on the stack; the call's frame leaves room
/// for this many between the return address and what the thread uses.
pub const STACK_ARGUMENTS: usize = 8;

/// What a call gave back.
#[derive(Debug, Clone, Copy)]
pub struct Returned {
    pub value: u64,
    pub duration: Duration,
}

/// Calls `function(arguments…)` on `thread`: the first six in registers,
/// up to [`STACK_ARGUMENTS`] more on the stack above the return address.
/// If it has not returned after `patience`, asks `can_abandon` (with the
/// thread stopped) whether leaving it there is harmless; if so, gives up,
/// otherwise waits again. The thread's state is restored on every path
/// where it still exists.
pub fn call(
    thread: &mut StoppedThread,
    function: u64,
    arguments: &[u64],
    patience: Duration,
    can_abandon: &dyn Fn(&StoppedThread, &user_regs_struct) -> bool,
) -> Result<Returned, AttachError> {
    let saved = thread.registers()?;
    call_below(thread, saved, saved.rsp - RED_ZONE, function, arguments, patience, can_abandon)
}

/// [`call`] with a scratch area the function reads and writes (strings to
/// pass, results to read back): `scratch` is copied below the stopped
/// thread's red zone, where the program keeps nothing (signal handlers use
/// it the same way), `arguments` are made from its address, and after the
/// call `scratch` holds what the function left there. The words it
/// covered are put back.
pub fn call_with_scratch(
    thread: &mut StoppedThread,
    function: u64,
    scratch: &mut [u8],
    arguments: &dyn Fn(u64) -> Vec<u64>,
    patience: Duration,
    can_abandon: &dyn Fn(&StoppedThread, &user_regs_struct) -> bool,
) -> Result<Returned, AttachError> {
    let saved = thread.registers()?;
    let words = scratch.len().div_ceil(8);
    let base = (saved.rsp - RED_ZONE - words as u64 * 8) & !15;
    let tid = thread.tid;
    let unreadable = || AttachError::Failed(format!("cannot read the stack of thread {tid}"));
    let mut before = Vec::with_capacity(words);
    for i in 0..words as u64 {
        before.push(thread.read_word(base + i * 8).ok_or_else(unreadable)?);
    }
    let write = |thread: &StoppedThread, bytes: &[u8]| -> Result<(), AttachError> {
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            thread.write_word(base + i as u64 * 8, u64::from_le_bytes(word))?;
        }
        Ok(())
    };
    let outcome = write(thread, scratch).and_then(|()| {
        let arguments = arguments(base);
        call_below(thread, saved, base, function, &arguments, patience, can_abandon)
    });
    if outcome.is_ok() {
        for (i, chunk) in scratch.chunks_mut(8).enumerate() {
            let word = thread.read_word(base + i as u64 * 8).ok_or_else(unreadable)?;
            chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
        }
    }
    let restored: Vec<u8> = before.iter().flat_map(|w| w.to_le_bytes()).collect();
    let restored = write(thread, &restored);
    let returned = outcome?;
    restored?;
    Ok(returned)
}

/// Makes the call with its frame below `lowest_in_use`.
fn call_below(
    thread: &mut StoppedThread,
    saved: user_regs_struct,
    lowest_in_use: u64,
    function: u64,
    arguments: &[u64],
    patience: Duration,
    can_abandon: &dyn Fn(&StoppedThread, &user_regs_struct) -> bool,
) -> Result<Returned, AttachError> {
    let (in_registers, on_stack) = arguments.split_at(arguments.len().min(6));
    if on_stack.len() > STACK_ARGUMENTS {
        return Err(AttachError::Failed(format!("a call with {} arguments: at most {} are passed", arguments.len(), 6 + STACK_ARGUMENTS)));
    }
    let saved_vector = thread.extended_state()?;
    // At a function's first instruction rsp + 8 is 16-aligned: the slot at
    // rsp holds the return address, the seventh argument is at rsp + 8.
    let return_slot = ((lowest_in_use - 256) & !15) - 8;
    let frame: Vec<u64> = std::iter::once(0).chain(on_stack.iter().copied()).collect();
    let mut saved_words = Vec::with_capacity(frame.len());
    for i in 0..frame.len() as u64 {
        let word = thread
            .read_word(return_slot + i * 8)
            .ok_or_else(|| AttachError::Failed(format!("cannot read the stack of thread {}", thread.tid)))?;
        saved_words.push(word);
    }
    let put_back = |thread: &StoppedThread| -> Result<(), AttachError> {
        for (i, &word) in saved_words.iter().enumerate() {
            thread.write_word(return_slot + i as u64 * 8, word)?;
        }
        Ok(())
    };
    for (i, &word) in frame.iter().enumerate() {
        if let Err(e) = thread.write_word(return_slot + i as u64 * 8, word) {
            put_back(thread)?;
            return Err(e);
        }
    }
    let mut regs = saved;
    regs.rip = function;
    let registers = [&mut regs.rdi, &mut regs.rsi, &mut regs.rdx, &mut regs.rcx, &mut regs.r8, &mut regs.r9];
    for (register, &value) in registers.into_iter().zip(in_registers) {
        *register = value;
    }
    regs.rsp = return_slot;
    regs.rax = 0;
    regs.orig_rax = u64::MAX;
    regs.eflags &= !DIRECTION_FLAG;
    let started = Instant::now();
    let outcome = thread.set_registers(regs).map_err(CallError::Failed).and_then(|()| run_until_return(thread, patience, can_abandon));
    let duration = started.elapsed();
    let ended = || AttachError::Failed(format!("process {} ended during the call", thread.pid));
    if matches!(outcome, Err(CallError::Gone)) {
        return Err(ended());
    }
    // Put everything back, whatever happened.
    let restored = thread.set_registers(saved).and_then(|()| thread.set_extended_state(&saved_vector)).and_then(|()| put_back(thread));
    let value = outcome.map_err(|e| match e {
        CallError::Failed(e) => e,
        CallError::Abandoned => AttachError::Failed(format!(
            "the call did not return within {:.1} s: it waits for an allocator lock (held by a thread stuck inside malloc?); it was abandoned, the process is as it was",
            duration.as_secs_f64()
        )),
        CallError::Gone => ended(),
    })?;
    restored?;
    Ok(Returned { value, duration })
}

enum CallError {
    Failed(AttachError),
    Abandoned,
    Gone,
}

impl From<AttachError> for CallError {
    fn from(e: AttachError) -> Self {
        CallError::Failed(e)
    }
}

/// Runs the thread until the call returns (a SIGSEGV at address 0); the
/// value it returned, in rax.
fn run_until_return(
    thread: &mut StoppedThread,
    patience: Duration,
    can_abandon: &dyn Fn(&StoppedThread, &user_regs_struct) -> bool,
) -> Result<u64, CallError> {
    thread.resume()?;
    let mut deadline = Instant::now() + patience;
    loop {
        match thread.wait(Some(deadline))? {
            Some(Stop::Gone) => return Err(CallError::Gone),
            Some(Stop::Signal(libc::SIGSEGV)) => return returned(thread),
            Some(Stop::Signal(signal)) => {
                thread.hold_signal(signal);
                thread.resume()?;
            }
            Some(Stop::Interrupted) => thread.resume()?,
            None => {
                thread.interrupt()?;
                let regs = loop {
                    match thread.wait(None)? {
                        Some(Stop::Gone) => return Err(CallError::Gone),
                        Some(Stop::Signal(libc::SIGSEGV)) => return returned(thread),
                        Some(Stop::Signal(signal)) => {
                            thread.hold_signal(signal);
                            thread.resume()?;
                        }
                        _ => break thread.registers()?,
                    }
                };
                if can_abandon(thread, &regs) {
                    return Err(CallError::Abandoned);
                }
                eprintln!("memgap: the call in thread {} still runs after {:.0} s; waiting", thread.tid, patience.as_secs_f64());
                thread.resume()?;
                deadline = Instant::now() + patience;
            }
        }
    }
}

/// At a SIGSEGV: the call's return (at address 0) and its value, or a crash.
fn returned(thread: &StoppedThread) -> Result<u64, CallError> {
    let regs = thread.registers()?;
    if regs.rip == 0 {
        return Ok(regs.rax);
    }
    Err(CallError::Failed(AttachError::Failed(format!(
        "the called function crashed (SIGSEGV at {:#x}) in thread {}; its registers were restored",
        regs.rip, thread.tid
    ))))
}
