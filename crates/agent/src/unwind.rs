//! Call stacks of the calling thread, taken in the hooks at every allocation.
//!
//! [`ThreadUnwinder::capture`] walks the DWARF call frame information that
//! modules carry for exceptions (`.eh_frame`, indexed by `.eh_frame_hdr`) with
//! framehop, so programs need no frame pointers.
//! [`ThreadUnwinder::capture_frame_pointers`] (`--unwind fp`) follows the frame
//! pointer chain instead, after unwinding the agent's own frames by DWARF: this
//! crate keeps no frame pointers (the malloc hook uses rbp as an ordinary
//! register), so a plain rbp walk from here would miss the allocating function.
//!
//! Inside the traced program a warm capture must not fault, lock or allocate.
//! Every stack read is checked against the thread's stack, so a corrupt frame
//! ends the walk; unwind data is read in place from the loaded images;
//! framehop's `MustNotAllocateDuringUnwind` preallocates its per-thread rule
//! cache. A walk ends at the first return address outside known code. A thread
//! short of stack gets no frames. A thread on a stack it does not own (a
//! coroutine's, a `sigaltstack` handler's) is walked from a stack of the
//! agent's, reading the other stack through the kernel a page at a time:
//! how much room lies below its stack pointer is not known, nor whether all
//! of the mapping above stays mapped. Not covered: a module unloaded by another thread
//! in the middle of a walk that is reading its unwind data.
//!
//! Cost on the 2-vCPU development VM, x86-64, warm (noisy: ranges of runs), by
//! `cargo test --release -p memgap-agent unwind::tests::cost -- --ignored --nocapture`:
//! DWARF 80-150 ns for 10 frames, 340-540 ns for 40 (9-13 ns a frame); frame
//! pointers 30-50 ns and 100-150 ns (with `RUSTFLAGS=-Cforce-frame-pointers=yes`,
//! the test's frames standing for the program's). A thread's first capture
//! takes 30-100 µs; its unwinder then holds 40 KB (framehop's 25 KB unwind
//! context and 8 KB rule cache; 270 KB once its rule cache grows, see
//! `RuleCaches`) and the module list.

use alloc::string::String;
use alloc::vec::Vec;
use core::ffi::{c_int, c_void};
use core::ops::Range;
use core::sync::atomic::{AtomicU64, Ordering::*};

#[cfg(target_arch = "x86_64")]
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
#[cfg(target_arch = "x86_64")]
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind, Unwinder};

use crate::sys;
use crate::walk_memo::{REFUSED, Read, WalkMemo};

/// Bumped when the loader's module list changed; each capture compares it with one load.
static MODULES_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The loader loaded or unloaded a module (seen at a thread's fresh chunk):
/// unwinders rebuild their module list before their next capture, so none
/// keeps reading the unwind tables of a module dlclose unmapped.
pub fn modules_changed() {
    MODULES_GENERATION.fetch_add(1, Release);
}

/// Stack a walk needs below it, so a small thread stack never overflows: a
/// framehop rule-cache miss uses 8 KB, building its cache 8 KB (measured).
const WALK_STACK_ROOM: u64 = 16 << 10;
const CACHE_STACK_ROOM: u64 = 32 << 10;
/// The agent's own stack for walks from a stack the thread does not own,
/// above a guard page: the walk's needs and a signal handler's besides.
const OWN_STACK: usize = 256 << 10;
const PAGE: u64 = 4096;
/// How far above its stack pointer a stack the thread does not own is read.
const FOREIGN_SPAN: u64 = 1 << 20;
/// The mappings of the stacks not the thread's own that its walks last
/// came from: a program switches between many coroutines.
const FOREIGN_STACKS: usize = 64;
/// A walk that ends outside known code asks the loader, once in this many,
/// whether it mapped modules our dlopen hook never saw (glibc loads NSS and
/// iconv modules itself); asking takes the loader's lock.
const UNKNOWN_CODE_RECHECK: u32 = 1024;

/// One per thread, kept in the thread's state. `new` is cheap: the first
/// capture finds the stack, the modules, and builds framehop's cache.
#[derive(Default)]
pub struct ThreadUnwinder {
    stack: Option<StackBounds>,
    code: KnownCode,
    /// `MODULES_GENERATION` when the module list was built (None: never).
    generation: Option<u64>,
    #[cfg(target_arch = "x86_64")]
    dwarf: UnwinderX86_64<&'static [u8], MustNotAllocateDuringUnwind>,
    #[cfg(target_arch = "x86_64")]
    rules: RuleCaches,
    /// Counts module list rebuilds, for the walks remembered under it.
    modules_built: u64,
    memo: WalkMemo,
    /// For walks from stacks the thread does not own, made at the first.
    foreign: Option<alloc::boxed::Box<Foreign>>,
}

/// What [`ThreadUnwinder::capture_remembered`] found.
pub enum Capture {
    /// The walk is the one remembered under this token.
    Remembered(u32),
    /// A new walk, this many frames deep; [`ThreadUnwinder::remember`] it.
    Walked(usize),
}

/// framehop's rule cache: direct-mapped, 509 slots indexed by the lookup
/// address. A program whose hot stacks hold return addresses that share
/// slots (python3's interpreter: 15 % of its lookups missed) parses DWARF
/// again at every miss, about a microsecond. A thread that misses often
/// therefore gets `GROWN` caches, picked by the address bits above
/// framehop's slot: together one direct-mapped cache of 509 × `GROWN`
/// slots (python3: 0.006 % misses). Threads that hit keep one cache: each
/// costs 33 KB.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct RuleCaches {
    caches: Vec<CacheX86_64<MustNotAllocateDuringUnwind>>,
    /// Mirrors the single cache's slots (the address each last looked up)
    /// to count its misses, which framehop does not tell.
    shadow: Vec<u64>,
    lookups: u32,
    misses: u32,
    crowded: bool,
}

#[cfg(target_arch = "x86_64")]
const _: () = assert!(RuleCaches::GROWN.is_power_of_two(), "caches are picked with a mask");

#[cfg(target_arch = "x86_64")]
impl RuleCaches {
    const SLOTS: u64 = 509;
    const GROWN: usize = 8;
    /// Lookups per window, and the misses in a window (1 in 128) that grow.
    const WINDOW: u32 = 1 << 15;
    const CROWDED: u32 = Self::WINDOW / 128;

    fn cache_for(&mut self, lookup: u64) -> &mut CacheX86_64<MustNotAllocateDuringUnwind> {
        if self.caches.len() == 1 {
            self.watch(lookup);
        }
        // A mask, not a modulo: a division per frame showed in profiles.
        let mask = self.caches.len() - 1;
        &mut self.caches[((lookup / Self::SLOTS) as usize) & mask]
    }

    fn watch(&mut self, lookup: u64) {
        let slot = &mut self.shadow[(lookup % Self::SLOTS) as usize];
        if *slot != lookup {
            *slot = lookup;
            self.misses += 1;
        }
        self.lookups += 1;
        if self.lookups == Self::WINDOW {
            self.crowded = self.misses >= Self::CROWDED;
            (self.lookups, self.misses) = (0, 0);
        }
    }

    /// The single cache missed often in the last window.
    fn should_grow(&self) -> bool {
        self.crowded && self.caches.len() == 1
    }
}

#[derive(Clone, Copy)]
struct Registers {
    ip: u64,
    sp: u64,
    bp: u64,
}

/// The calling function's instruction, stack and frame pointers, read at one
/// point so that the unwind rule for `ip` describes `sp`. A macro: they must
/// be read in the function the walk starts from.
macro_rules! current_registers {
    () => {{
        let (ip, sp, bp): (u64, u64, u64);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: reads three registers into outputs; no memory, no stack.
        unsafe {
            core::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp",
                ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp, options(nomem, nostack, preserves_flags));
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        unsafe {
            core::arch::asm!("adr {ip}, .", "mov {sp}, sp", "mov {bp}, x29",
                ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp, options(nomem, nostack, preserves_flags));
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            (ip, sp, bp) = (0, 0, 0); // no stack holds 0: captures are empty
        }
        Registers { ip, sp, bp }
    }};
}

#[allow(dead_code)]
impl ThreadUnwinder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fills `out` with the calling thread's return addresses (each the
    /// instruction after a call), innermost first; with `skip` 0, `out[0]` is
    /// in the function that called `capture`. Returns how many were written.
    /// A thread's first capture reads /proc/self/maps and walks the
    /// loader's modules: call with the re-entrancy guard set. Architectures
    /// other than x86-64 walk frame pointers.
    #[inline(never)]
    pub fn capture(&mut self, out: &mut [u64], skip: usize) -> usize {
        let registers = current_registers!();
        self.walk(registers, out, skip, usize::MAX, Reading::Plain)
    }

    /// `capture` for programs built with frame pointers: the `skip` frames
    /// (which must be the agent's own) are unwound by DWARF, then the chain.
    #[inline(never)]
    pub fn capture_frame_pointers(&mut self, out: &mut [u64], skip: usize) -> usize {
        let registers = current_registers!();
        self.walk(registers, out, skip, skip.saturating_add(1), Reading::Plain)
    }

    /// `capture` (or, with `frame_pointers`, `capture_frame_pointers`)
    /// that recalls a walk remembered from the same place whose stack words
    /// still hold (see [`crate::walk_memo`]) instead of unwinding again.
    ///
    /// Inlined, so a recall costs no call and no frame of its own: the walk
    /// starts in the function this is inlined into (which must not itself
    /// be inlined), and with `skip` 0, `out[0]` is in that function's caller.
    #[inline(always)]
    pub fn capture_remembered(&mut self, out: &mut [u64], skip: usize, frame_pointers: bool) -> Capture {
        let registers = current_registers!();
        let dwarf_frames = if frame_pointers { skip.saturating_add(1) } else { usize::MAX };
        // Also when the stack is not the thread's own: recalls read the
        // stack in place, which only the thread's own allows.
        if !self.memo.begin() || !self.thread_stack().contains(registers.sp) {
            return self.walk_unremembered(registers, out, skip, dwarf_frames);
        }
        self.refresh_modules_if_changed();
        let modules = self.modules_built;
        let Registers { ip, sp, bp } = registers;
        // SAFETY: the memo only asks words that a walk from this stack
        // pointer on this thread's stack read within its bounds, which
        // are the same now (the stack is mapped from sp up to its top).
        let read = |at: u64| unsafe { core::ptr::read_volatile(at as *const u64) };
        if let Some(token) = self.memo.recall(ip, sp, bp, modules, read) {
            return Capture::Remembered(token);
        }
        self.walk_to_remember(registers, out, skip, dwarf_frames, modules)
    }

    /// A walk while remembering is paused. Out of line, as the next.
    #[cold]
    #[inline(never)]
    fn walk_unremembered(&mut self, registers: Registers, out: &mut [u64], skip: usize, dwarf_frames: usize) -> Capture {
        Capture::Walked(self.walk(registers, out, skip, dwarf_frames, Reading::Plain))
    }

    /// A walk [`Self::capture_remembered`] could not recall, made so that
    /// it can be next time. Out of line: the recall is the hot path, and
    /// this one's vectors and frees would crowd it.
    #[cold]
    #[inline(never)]
    fn walk_to_remember(&mut self, registers: Registers, out: &mut [u64], skip: usize, dwarf_frames: usize, modules: u64) -> Capture {
        let Registers { ip, sp, bp } = registers;
        let mut log = core::mem::take(&mut self.memo.log);
        log.clear();
        let depth = self.walk(registers, out, skip, dwarf_frames, Reading::Logged(&mut log));
        // Words that are not code (saved frame pointers: ordinary registers
        // in most code) change from call to call. The walk's twin reads them
        // poisoned, and the frame pointer too: if it reads the same words and
        // ends in the same frames, only the code words need checking later.
        let mut exact = core::mem::take(&mut self.memo.exact);
        exact.clear();
        exact.extend(log.iter().map(|&(at, value)| at & REFUSED != 0 || self.code.covers(value)));
        if let Some(last) = exact.last_mut() {
            *last = true; // the word that ended the walk, whatever it is
        }
        let mut twin_frames = core::mem::take(&mut self.memo.twin_frames);
        twin_frames.resize(out.len(), 0);
        let mut twin = Twin { reference: &log, exact: &exact, next: 0, diverged: false };
        let twin_depth = self.walk(Registers { bp: !bp, ..registers }, &mut twin_frames, skip, dwarf_frames, Reading::Twin(&mut twin));
        let independent = !twin.diverged && twin.next == log.len() && twin_frames[..twin_depth] == out[..depth];
        // A walk that found the module list stale rebuilt it: its twin ran
        // on another list, so it is not remembered.
        if self.modules_built == modules {
            self.memo.walked(ip, sp, bp, modules, &log, independent.then_some(exact.as_slice()));
        }
        (self.memo.log, self.memo.exact, self.memo.twin_frames) = (log, exact, twin_frames);
        Capture::Walked(depth)
    }

    /// Remembers the walk [`Self::capture_remembered`] just made under
    /// `token`, which later recalls of it return.
    pub fn remember(&mut self, token: u32) {
        self.memo.remember(token);
    }

    /// Unwinds `dwarf_frames` frames by DWARF, the rest by frame pointers,
    /// reading stack words as `reading` says.
    fn walk(&mut self, registers: Registers, out: &mut [u64], skip: usize, dwarf_frames: usize, reading: Reading) -> usize {
        let thread_stack = self.thread_stack();
        if out.is_empty() {
            return 0;
        }
        if !thread_stack.contains(registers.sp) {
            return self.walk_foreign(registers, out, skip, dwarf_frames);
        }
        self.refresh_modules_if_changed();
        let room = registers.sp - thread_stack.low;
        #[cfg(target_arch = "x86_64")]
        if self.rules.caches.is_empty() || self.rules.should_grow() {
            if room < CACHE_STACK_ROOM {
                return 0;
            }
            self.grow_rule_caches();
        }
        if room < WALK_STACK_ROOM {
            return 0;
        }
        // Frames lie above the walk's start; nothing below it is read.
        let stack = StackReader { bounds: StackBounds { low: registers.sp, high: thread_stack.high }, reading, window: None };
        self.walk_reading(registers, stack, out, skip, dwarf_frames)
    }

    fn walk_reading(&mut self, registers: Registers, mut stack: StackReader, out: &mut [u64], skip: usize, dwarf_frames: usize) -> usize {
        let mut frames = Frames { out, skip, written: 0 };
        #[cfg(target_arch = "x86_64")]
        let Some(registers) = self.walk_dwarf(registers, &mut stack, &mut frames, dwarf_frames) else {
            return frames.written;
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = dwarf_frames; // no DWARF walk here yet: frame pointers from the start
        self.walk_frame_pointers(registers.bp, registers.sp, &mut stack, &mut frames);
        frames.written
    }

    /// The thread's own stack, found at its first capture.
    #[inline(always)]
    fn thread_stack(&mut self) -> StackBounds {
        match self.stack {
            Some(stack) => stack,
            None => *self.stack.insert(StackBounds::of_current_thread()),
        }
    }

    /// A walk from a stack the thread does not own: on the agent's stack,
    /// reading the other through the kernel (see [`Window`]). No frames
    /// where the agent cannot switch stacks.
    #[cold]
    #[inline(never)]
    fn walk_foreign(&mut self, registers: Registers, out: &mut [u64], skip: usize, dwarf_frames: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let Some(mut foreign) = self.foreign.take().or_else(Foreign::new) else { return 0 };
            let top = foreign.stack_top();
            let mut written = 0;
            // Everything on the agent's stack, even the lookups.
            let walk = || {
                self.refresh_modules_if_changed();
                if self.rules.caches.is_empty() || self.rules.should_grow() {
                    self.grow_rule_caches();
                }
                let bounds = foreign.bounds_of(registers.sp);
                // The stack has changed since the last walk read it.
                foreign.window.forget();
                let stack = StackReader { bounds, reading: Reading::Plain, window: Some(&mut foreign.window) };
                written = self.walk_reading(registers, stack, out, skip, dwarf_frames);
            };
            // SAFETY: `top` is the 16-byte aligned top of the agent's stack,
            // which nothing else of this thread uses.
            unsafe { on_stack(top, walk) };
            self.foreign = Some(foreign);
            written
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (registers, out, skip, dwarf_frames);
            0
        }
    }

    /// The registers of the frame where frame pointers take over, or None
    /// once the walk is over.
    #[cfg(target_arch = "x86_64")]
    fn walk_dwarf(&mut self, registers: Registers, stack: &mut StackReader, frames: &mut Frames, mut budget: usize) -> Option<Registers> {
        let mut regs = UnwindRegsX86_64::new(registers.ip, registers.sp, registers.bp);
        let mut address = FrameAddress::from_instruction_pointer(registers.ip);
        let mut read_stack = |at: u64| stack.read(at);
        while budget > 0 {
            budget -= 1;
            let cache = self.rules.cache_for(address.address_for_lookup());
            let return_address = self.dwarf.unwind_frame(address, &mut regs, cache, &mut read_stack).ok().flatten()?;
            if !self.code.contains(return_address) || !frames.push(return_address) {
                return None;
            }
            address = FrameAddress::from_return_address(return_address)?;
        }
        Some(Registers { ip: regs.ip(), sp: regs.sp(), bp: regs.bp() })
    }

    /// Follows frame records (saved frame pointer, return address) from `bp`;
    /// each must lie above the last, so a corrupt chain cannot loop.
    fn walk_frame_pointers(&mut self, mut bp: u64, mut floor: u64, stack: &mut StackReader, frames: &mut Frames) {
        while bp >= floor {
            let (Ok(caller_bp), Ok(return_address)) = (stack.read(bp), stack.read(bp + 8)) else { return };
            if !self.code.contains(return_address) || !frames.push(return_address) {
                return;
            }
            (floor, bp) = (bp + 16, caller_bp);
        }
    }

    /// The first rule cache, or the caches of a thread that missed often.
    #[cfg(target_arch = "x86_64")]
    #[cold]
    fn grow_rule_caches(&mut self) {
        let rules = &mut self.rules;
        if rules.caches.is_empty() {
            rules.caches.push(CacheX86_64::new_in());
            rules.shadow = alloc::vec![0; RuleCaches::SLOTS as usize];
        } else {
            rules.caches.extend((1..RuleCaches::GROWN).map(|_| CacheX86_64::new_in()));
            rules.shadow = Vec::new();
        }
    }

    /// Rebuilds the module list when a dlopen/dlclose hook or the loader
    /// says it changed.
    #[inline(always)]
    fn refresh_modules_if_changed(&mut self) {
        if self.generation != Some(MODULES_GENERATION.load(Acquire)) || self.code.stale {
            self.refresh_modules();
        }
    }

    /// Rebuilds the module list from the loader's (the first capture, and
    /// after modules changed). Allocates, from the agent's own heap.
    #[cold]
    fn refresh_modules(&mut self) {
        self.modules_built += 1;
        self.generation = Some(MODULES_GENERATION.load(Acquire));
        let mut found = LoadedModules::default();
        crate::loader::agent_iterate(collect_module, &mut found as *mut LoadedModules as *mut c_void);
        found.code.sort_unstable_by_key(|range| range.start);
        self.code = KnownCode { ranges: found.code, loader_events: found.loader_events, ..KnownCode::default() };
        #[cfg(target_arch = "x86_64")]
        {
            self.dwarf = UnwinderX86_64::new();
            found.modules.into_iter().for_each(|module| self.dwarf.add_module(module));
        }
    }
}

/// The caller's `out`, after dropping the first `skip` addresses.
struct Frames<'a> {
    out: &'a mut [u64],
    skip: usize,
    written: usize,
}

impl Frames<'_> {
    /// false once `out` is full.
    fn push(&mut self, return_address: u64) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return true;
        }
        let Some(slot) = self.out.get_mut(self.written) else { return false };
        *slot = return_address;
        self.written += 1;
        self.written < self.out.len()
    }
}

/// A thread's stack: [low, high).
#[derive(Clone, Copy, Debug, PartialEq)]
struct StackBounds {
    low: u64,
    high: u64,
}

impl StackBounds {
    fn contains(self, address: u64) -> bool {
        self.low <= address && address < self.high
    }

    /// Whether an aligned word at `address` lies wholly on this stack.
    fn holds_word(self, address: u64) -> bool {
        self.low <= address && address <= self.high.saturating_sub(8) && address.is_multiple_of(8)
    }

    /// The aligned word at `address`, if it lies on this stack.
    fn read(self, address: u64) -> Result<u64, ()> {
        if !self.holds_word(address) {
            return Err(());
        }
        // SAFETY: a thread's stack is mapped from its stack pointer up to `high`.
        Ok(unsafe { core::ptr::read_volatile(address as *const u64) })
    }

    /// The calling thread's own stack, wherever its stack pointer is now
    /// (empty if unknown).
    #[cold]
    fn of_current_thread() -> StackBounds {
        let sp = current_registers!().sp;
        let main = StackBounds::of_main_thread();
        if main.contains(sp) {
            return main;
        }
        // Other threads: the mapping holding the stack pointer, or, when the
        // stack pointer is on a coroutine's stack, the one holding the
        // thread's control block, which glibc places at the top of the
        // thread's stack (the main thread's is elsewhere). Not
        // pthread_getattr_np: it takes the thread's lock and reallocs, and a
        // program may call realloc from inside it (Ruby does, at thread start).
        let unknown = StackBounds { low: 0, high: 0 };
        let Some((low, high)) = mapping_containing(sp) else { return unknown };
        let here = StackBounds { low, high };
        let Some(tp) = sys::thread_pointer().map(|tp| tp as u64) else { return here };
        if here.contains(tp) {
            return here;
        }
        if sys::gettid() == sys::getpid() {
            return main;
        }
        mapping_containing(tp).map_or(unknown, |(low, high)| StackBounds { low, high })
    }

    /// The main thread's stack: up to the page above `__libc_stack_end` (the
    /// stack pointer at process entry; argv and the environment lie above it
    /// on the same mapping), down as far as RLIMIT_STACK lets it grow, capped
    /// so that "unlimited" cannot claim other mappings.
    fn of_main_thread() -> StackBounds {
        unsafe extern "C" {
            static __libc_stack_end: *const c_void;
        }
        // SAFETY: reads the pointer glibc's start-up stored (not what it points to).
        let high = (unsafe { __libc_stack_end } as u64).next_multiple_of(4096);
        let mut limit = libc::rlimit64 { rlim_cur: 8 << 20, rlim_max: 0 };
        let keep = core::ptr::null::<libc::rlimit64>();
        // SAFETY: `limit` is ours to write; no new limit is set (`keep` is null).
        unsafe { libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_STACK, keep, &mut limit) };
        StackBounds { low: high.saturating_sub(limit.rlim_cur.min(4 << 30)), high }
    }
}

/// How a walk reads stack words.
enum Reading<'a, 'b> {
    Plain,
    /// Each word read is noted.
    Logged(&'a mut Vec<Read>),
    /// A remembered walk's twin: words not marked exact read poisoned.
    Twin(&'a mut Twin<'b>),
}

struct Twin<'a> {
    /// The words the walk read, and which of them the twin reads as they are.
    reference: &'a [Read],
    exact: &'a [bool],
    next: usize,
    /// The twin read a word the walk did not (at that point).
    diverged: bool,
}

struct StackReader<'a, 'b> {
    bounds: StackBounds,
    reading: Reading<'a, 'b>,
    /// Reads through the kernel, for a stack the thread does not own.
    window: Option<&'a mut Window>,
}

impl StackReader<'_, '_> {
    fn read(&mut self, address: u64) -> Result<u64, ()> {
        let word = match &mut self.window {
            None => self.bounds.read(address),
            Some(window) => window.read(self.bounds, address),
        };
        match &mut self.reading {
            Reading::Plain => word,
            Reading::Logged(log) => {
                log.push(match word {
                    Ok(value) => (address, value),
                    Err(()) => (address | REFUSED, 0),
                });
                word
            }
            Reading::Twin(twin) => {
                let i = twin.next;
                twin.next += 1;
                let same_place = twin.reference.get(i).is_some_and(|&(at, _)| at & !REFUSED == address);
                twin.diverged |= !same_place;
                match word {
                    Ok(value) if same_place && !twin.exact[i] => Ok(!value),
                    _ => word,
                }
            }
        }
    }
}

/// What walks from stacks the thread does not own need.
struct Foreign {
    /// The agent's stack for them: a guard page, then [`OWN_STACK`] bytes.
    stack: usize,
    /// Mappings of such stacks, each asked of the kernel once.
    mappings: [StackBounds; FOREIGN_STACKS],
    next: usize,
    window: Window,
}

// Walks from other stacks switch stacks, which only x86-64 does yet.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Foreign {
    fn new() -> Option<alloc::boxed::Box<Foreign>> {
        let stack = sys::mmap_anonymous(OWN_STACK + PAGE as usize);
        if stack.is_null() {
            return None;
        }
        // SAFETY: the first page of the mapping just made, ours alone.
        unsafe { libc::syscall(libc::SYS_mprotect, stack, PAGE, libc::PROT_NONE as libc::c_ulong) };
        // Made in place: this runs on the other stack, whose room is unknown.
        // SAFETY: every field is integers, for which zeros are valid.
        let mut foreign = unsafe { alloc::boxed::Box::<Foreign>::new_zeroed().assume_init() };
        foreign.stack = stack as usize;
        Some(foreign)
    }

    fn stack_top(&self) -> u64 {
        (self.stack + PAGE as usize + OWN_STACK) as u64
    }

    /// What a walk from `sp` may read: up to the end of its mapping, at
    /// most [`FOREIGN_SPAN`] above it.
    fn bounds_of(&mut self, sp: u64) -> StackBounds {
        let mapping = match self.mappings.iter().find(|m| m.contains(sp)) {
            Some(&mapping) => mapping,
            None => {
                let (low, high) = mapping_containing(sp).unwrap_or((sp, sp));
                self.mappings[self.next] = StackBounds { low, high };
                self.next = (self.next + 1) % FOREIGN_STACKS;
                StackBounds { low, high }
            }
        };
        StackBounds { low: sp, high: mapping.high.min(sp.saturating_add(FOREIGN_SPAN)) }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        sys::munmap(self.stack as *mut u8, OWN_STACK + PAGE as usize);
    }
}

/// A page of a stack the thread does not own, copied by the kernel
/// (`process_vm_readv` on our own process): a page unmapped or made
/// inaccessible since the walk began fails the read instead of faulting.
struct Window {
    base: u64,
    len: u64,
    words: [u64; PAGE as usize / 8],
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Window {
    fn forget(&mut self) {
        self.len = 0;
    }

    fn read(&mut self, bounds: StackBounds, address: u64) -> Result<u64, ()> {
        if !bounds.holds_word(address) {
            return Err(());
        }
        if !(self.base <= address && address < self.base + self.len) {
            self.fill(address & !(PAGE - 1), bounds.high)?;
            if address >= self.base + self.len {
                return Err(());
            }
        }
        Ok(self.words[((address - self.base) / 8) as usize])
    }

    /// Copies the page at `page`, not past `end`.
    fn fill(&mut self, page: u64, end: u64) -> Result<(), ()> {
        self.len = 0;
        let len = (end.saturating_sub(page) as usize).clamp(8, PAGE as usize);
        let local = libc::iovec { iov_base: self.words.as_mut_ptr() as *mut c_void, iov_len: len };
        let remote = libc::iovec { iov_base: page as *mut c_void, iov_len: len };
        // The pid is asked each time: a fork child must not read its parent.
        // Counts and flags are unsigned longs: each argument is passed whole.
        let (pid, count, flags) = (libc::c_long::from(sys::getpid()), 1 as libc::c_ulong, 0 as libc::c_ulong);
        // SAFETY: the kernel writes at most PAGE bytes into `words`, ours;
        // the remote side is only read, and checked by the kernel.
        let copied = unsafe { libc::syscall(libc::SYS_process_vm_readv, pid, &local, count, &remote, count, flags) };
        if copied <= 0 {
            return Err(());
        }
        (self.base, self.len) = (page, copied as u64 & !7);
        Ok(())
    }
}

/// Runs `f` on the stack whose top is `top`, then comes back.
///
/// # Safety
/// `top` is 16-byte aligned, the top of a mapped stack that nothing else
/// uses while `f` runs, with room for `f` (and for a signal handler).
#[cfg(target_arch = "x86_64")]
unsafe fn on_stack<F: FnOnce()>(top: u64, f: F) {
    extern "C" fn run<F: FnOnce()>(f: *mut Option<F>) {
        // SAFETY: the `Option` below, alive across the call.
        if let Some(f) = unsafe { (*f).take() } {
            f();
        }
    }
    let mut f = Some(f);
    // SAFETY: switches to `top` (the caller's contract), calls `run` by the C
    // ABI with the stack aligned as it requires, and restores the stack
    // pointer from r12, which the callee preserves.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {run}",
            "mov rsp, r12",
            top = in(reg) top,
            run = sym run::<F>,
            in("rdi") &mut f as *mut Option<F>,
            out("r12") _,
            clobber_abi("C"),
        );
    }
}

/// The [start, end) of the mapping holding `address`, from /proc/self/maps
/// read with raw system calls into a stack buffer (no allocation, no lock).
fn mapping_containing(address: u64) -> Option<(u64, u64)> {
    let fd =
        // SAFETY: a NUL-terminated path.
        unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) } as i32;
    if fd < 0 {
        return None;
    }
    let found = match query_mapping(fd, address) {
        Ok(found) => found,
        Err(()) => scan_mappings(fd, address),
    };
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    found
}

/// The kernel's `struct procmap_query` (linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 = 0xC068_6611;

/// The mapping holding `address`, asked of the kernel by address (one
/// lookup, where reading the maps file goes through every mapping: a
/// program starting hundreds of threads made that quadratic). `Err` where
/// the kernel has no such query (before 6.11).
fn query_mapping(maps: i32, address: u64) -> Result<Option<(u64, u64)>, ()> {
    let mut query = ProcmapQuery { size: core::mem::size_of::<ProcmapQuery>() as u64, query_addr: address, ..ProcmapQuery::default() };
    // SAFETY: `maps` is an open /proc/self/maps; `query` is the kernel's
    // struct, sized in its first word, with no name or build-id buffer.
    let result = unsafe { libc::syscall(libc::SYS_ioctl, maps, PROCMAP_QUERY, &mut query as *mut ProcmapQuery) };
    match result {
        0 => Ok(Some((query.vma_start, query.vma_end))),
        _ if crate::sys::errno() == libc::ENOENT => Ok(None),
        _ => Err(()),
    }
}

/// The mapping holding `address`, read line by line from the maps file `maps`.
fn scan_mappings(fd: i32, address: u64) -> Option<(u64, u64)> {
    let mut buf = [0u8; 4096];
    let mut filled = 0usize;
    let mut found = None;
    'read: loop {
        // SAFETY: `buf[filled..]` is writable for `buf.len() - filled` bytes.
        let n = unsafe { libc::syscall(libc::SYS_read, fd, buf[filled..].as_mut_ptr(), buf.len() - filled) };
        if n <= 0 {
            break;
        }
        filled += n as usize;
        let mut consumed = 0;
        while let Some(newline) = buf[consumed..filled].iter().position(|&b| b == b'\n') {
            let line = &buf[consumed..consumed + newline];
            consumed += newline + 1;
            let range = line.split(|&b| b == b' ').next().unwrap_or(&[]);
            let mut ends = range.split(|&b| b == b'-').map(|h| core::str::from_utf8(h).ok().and_then(|h| u64::from_str_radix(h, 16).ok()));
            if let (Some(Some(start)), Some(Some(end))) = (ends.next(), ends.next())
                && start <= address
                && address < end
            {
                found = Some((start, end));
                break 'read;
            }
        }
        // Keep the unfinished line; a line longer than the buffer is dropped.
        buf.copy_within(consumed..filled, 0);
        filled -= consumed;
        if filled == buf.len() {
            filled = 0;
        }
    }
    found
}

/// Executable ranges of the loaded modules, sorted, with the last one hit
/// (frames come in runs from one module).
#[derive(Default)]
struct KnownCode {
    ranges: Vec<Range<u64>>,
    last_hit: Range<u64>,
    /// The loader's dlpi_adds + dlpi_subs when `ranges` was built.
    loader_events: u64,
    misses: u32,
    /// The loader has changed modules since: rebuild before the next walk.
    stale: bool,
}

impl KnownCode {
    #[inline]
    fn contains(&mut self, address: u64) -> bool {
        self.last_hit.contains(&address) || self.search(address)
    }

    /// `contains`, without its bookkeeping: for words that may not be code.
    fn covers(&self, address: u64) -> bool {
        self.range_of(address).is_some()
    }

    fn range_of(&self, address: u64) -> Option<&Range<u64>> {
        let after = self.ranges.partition_point(|range| range.start <= address);
        after.checked_sub(1).map(|i| &self.ranges[i]).filter(|range| range.contains(&address))
    }

    fn search(&mut self, address: u64) -> bool {
        if let Some(range) = self.range_of(address) {
            self.last_hit = range.clone();
            return true;
        }
        self.misses = self.misses.wrapping_add(1);
        if self.misses % UNKNOWN_CODE_RECHECK == 1 && loader_events() != self.loader_events {
            self.stale = true;
        }
        false
    }
}

#[derive(Default)]
struct LoadedModules {
    code: Vec<Range<u64>>,
    loader_events: u64,
    #[cfg(target_arch = "x86_64")]
    modules: Vec<Module<&'static [u8]>>,
}

/// The loader's count of modules loaded and unloaded (their sum moves at each).
fn loader_events() -> u64 {
    crate::loader::counts().map_or(0, |(adds, subs)| adds.wrapping_add(subs))
}

/// dl_iterate_phdr callback: one module's executable ranges and, read in
/// place from its image, its unwind sections. ELF addresses are relative to
/// the module's load base.
///
/// # Safety
/// A dl_iterate_phdr callback: `info` valid for the call, `found` the
/// `LoadedModules` `refresh_modules` passes, borrowed by nothing else.
unsafe extern "C" fn collect_module(info: *mut libc::dl_phdr_info, size: usize, found: *mut c_void) -> c_int {
    // SAFETY: the callback's contract, just above.
    let (info, found) = unsafe { (&*info, &mut *(found as *mut LoadedModules)) };
    if let Some((adds, subs)) = crate::loader::counts_of(info, size) {
        found.loader_events = adds.wrapping_add(subs);
    }
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: the loader's `dlpi_phnum` program headers of this module (non-null).
    let headers = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
    let base = info.dlpi_addr;
    let mut text: Option<Range<u64>> = None;
    for header in headers.iter().filter(|h| h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_X != 0) {
        let range = header.p_vaddr..header.p_vaddr + header.p_memsz;
        found.code.push(base.wrapping_add(range.start)..base.wrapping_add(range.end));
        text = Some(text.map_or(range.clone(), |text| text.start.min(range.start)..text.end.max(range.end)));
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(text) = text {
        let mut sections = ExplicitModuleSectionInfo { text_svma: Some(text.clone()), ..Default::default() };
        if let Some(eh_frame_hdr) = headers.iter().find(|h| h.p_type == libc::PT_GNU_EH_FRAME) {
            add_eh_frame(&mut sections, headers, base, eh_frame_hdr);
        }
        let loaded_text = base.wrapping_add(text.start)..base.wrapping_add(text.end);
        found.modules.push(Module::new(String::new(), loaded_text, base, sections));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (text, String::new());
    0
}

/// `.eh_frame_hdr` (the PT_GNU_EH_FRAME segment) and the `.eh_frame` it
/// points to. The header does not say how long `.eh_frame` is: its slice
/// runs to the end of the loaded segment that holds it.
#[cfg(target_arch = "x86_64")]
fn add_eh_frame(
    sections: &mut ExplicitModuleSectionInfo<&'static [u8]>,
    headers: &[libc::Elf64_Phdr],
    base: u64,
    eh_frame_hdr: &libc::Elf64_Phdr,
) {
    let loaded_end = |at: u64| {
        let segment = headers.iter().find(|h| h.p_type == libc::PT_LOAD && h.p_vaddr <= at && at < h.p_vaddr + h.p_memsz);
        segment.map(|h| h.p_vaddr + h.p_memsz)
    };
    // SAFETY: slices of loaded segments, mapped until a dlclose, after which
    // the next fresh chunk of any thread calls modules_changed.
    let image = |range: &Range<u64>| unsafe {
        core::slice::from_raw_parts(base.wrapping_add(range.start) as *const u8, (range.end - range.start) as usize)
    };
    let hdr = eh_frame_hdr.p_vaddr..eh_frame_hdr.p_vaddr + eh_frame_hdr.p_memsz;
    if loaded_end(hdr.start).is_none_or(|end| end < hdr.end) {
        return;
    }
    let Some(start) = eh_frame_address(image(&hdr), base.wrapping_add(hdr.start)).map(|a| a.wrapping_sub(base)) else { return };
    let Some(end) = loaded_end(start) else { return };
    sections.eh_frame = Some(image(&(start..end)));
    sections.eh_frame_svma = Some(start..end);
    sections.eh_frame_hdr = Some(image(&hdr));
    sections.eh_frame_hdr_svma = Some(hdr);
}

/// Where `.eh_frame` starts, from the `eh_frame_ptr` field of an
/// `.eh_frame_hdr` at `hdr_address` (LSB 5.0, "Exception Frame Header").
fn eh_frame_address(hdr: &[u8], hdr_address: u64) -> Option<u64> {
    let [1, encoding, _, _, ref field @ ..] = *hdr else { return None };
    let bytes = |n: usize| field.get(..n).map(|b| b.iter().rev().fold(0u64, |value, &byte| value << 8 | u64::from(byte)));
    let value = match encoding & 0x0f {
        0x00 | 0x04 | 0x0c => bytes(8)?,        // absptr, udata8, sdata8
        0x03 => bytes(4)?,                      // udata4
        0x0b => bytes(4)? as u32 as i32 as u64, // sdata4
        _ => return None,                       // 0xff: omitted
    };
    match encoding & 0x70 {
        0x00 => Some(value),
        0x10 => Some(value.wrapping_add(hdr_address + 4)), // pcrel: from the field
        0x30 => Some(value.wrapping_add(hdr_address)),     // datarel: from the header
        _ => None,
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use core::hint::black_box;

    const DEPTH: usize = 30;

    // Mutually recursive: a correct walk alternates between their two call
    // sites. The work after each call keeps them off tail calls.
    #[inline(never)]
    fn ping(depth: usize, at_bottom: &mut dyn FnMut()) -> usize {
        black_box(if depth == 0 {
            at_bottom();
            0
        } else {
            pong(depth - 1, at_bottom)
        }) + 1
    }

    #[inline(never)]
    fn pong(depth: usize, at_bottom: &mut dyn FnMut()) -> usize {
        black_box(if depth == 0 {
            at_bottom();
            0
        } else {
            ping(depth - 1, at_bottom)
        }) + 2
    }

    fn capture_in_recursion(frame_pointers: bool, out: &mut [u64]) -> usize {
        let (mut unwinder, mut written) = (ThreadUnwinder::new(), 0);
        ping(DEPTH, &mut || {
            written = if frame_pointers { unwinder.capture_frame_pointers(out, 0) } else { unwinder.capture(out, 0) };
        });
        written
    }

    /// How many frames are in ping and pong, checking that they alternate and
    /// lie in this test binary's code.
    fn recursion_frames(frames: &[u64]) -> usize {
        let functions = [ping as *const () as u64, pong as *const () as u64];
        let in_recursion = |a: &&u64| functions.iter().any(|&f| **a > f && **a < f + 512);
        let chain: Vec<u64> = frames.iter().skip_while(|a| !in_recursion(a)).take_while(in_recursion).copied().collect();
        for window in chain.get(1..).unwrap_or_default().windows(3) {
            assert!(window[0] == window[2] && window[0] != window[1], "frames do not alternate: {chain:x?}");
        }
        let mut modules = ThreadUnwinder::new();
        modules.refresh_modules();
        let binary = modules.code.ranges.iter().find(|r| r.contains(&functions[0])).unwrap();
        assert!(frames.iter().take(DEPTH).all(|a| binary.contains(a)), "{frames:x?}");
        chain.len()
    }

    #[test]
    fn dwarf_walk_sees_every_recursive_frame() {
        // libtest runs each test on a thread of its own; one more for good measure.
        let capture = || {
            let mut out = [0u64; 128];
            let written = capture_in_recursion(false, &mut out);
            out[..written].to_vec()
        };
        for frames in [capture(), std::thread::spawn(capture).join().unwrap()] {
            assert!(recursion_frames(&frames) > DEPTH);
        }
    }

    /// A stack of the test's own, like a coroutine's: `f` runs on it.
    #[cfg(target_arch = "x86_64")]
    fn on_a_coroutine_stack(f: impl FnOnce()) {
        const SIZE: usize = 256 << 10;
        let stack = std::vec![0u64; SIZE / 8];
        let top = (stack.as_ptr() as u64 + SIZE as u64) & !15;
        // SAFETY: `stack` is ours, unused by anything else, and outlives the call.
        unsafe { on_stack(top, f) };
        drop(stack);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_walk_from_a_stack_the_thread_does_not_own_sees_its_frames() {
        let mut frames = Vec::new();
        on_a_coroutine_stack(|| {
            let mut out = [0u64; 128];
            let written = capture_in_recursion(false, &mut out);
            frames = out[..written].to_vec();
        });
        assert!(recursion_frames(&frames) > DEPTH, "{frames:x?}");
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_threads_own_stack_is_found_from_another_stack() {
        std::thread::spawn(|| {
            let local = 0u64;
            let own = mapping_containing(&local as *const u64 as u64).unwrap();
            let mut found = StackBounds { low: 0, high: 0 };
            on_a_coroutine_stack(|| found = StackBounds::of_current_thread());
            assert_eq!((found.low, found.high), own);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_window_read_of_a_page_gone_fails_rather_than_faults() {
        let pages = sys::mmap_anonymous(2 * PAGE as usize);
        // SAFETY: the two pages just mapped.
        unsafe { (pages as *mut u64).write(7) };
        let (low, high) = (pages as u64, pages as u64 + 2 * PAGE);
        let bounds = StackBounds { low, high };
        let mut window = Window { base: 0, len: 0, words: [0; PAGE as usize / 8] };
        assert_eq!(window.read(bounds, low), Ok(7));
        assert_eq!(window.read(bounds, low + PAGE - 8), Ok(0));
        assert_eq!(window.read(bounds, high), Err(()), "past the bounds");
        // SAFETY: the second of our two pages.
        unsafe { libc::munmap(pages.add(PAGE as usize) as *mut c_void, PAGE as usize) };
        assert_eq!(window.read(bounds, low + PAGE), Err(()));
        sys::munmap(pages, PAGE as usize);
    }

    #[test]
    fn a_small_thread_stack_gets_no_frames_rather_than_an_overflow() {
        let capture = || ThreadUnwinder::new().capture(&mut [0; 8], 0);
        assert_eq!(std::thread::Builder::new().stack_size(24 << 10).spawn(capture).unwrap().join().unwrap(), 0);
    }

    #[test]
    fn the_kernels_answer_and_the_maps_file_name_the_same_mapping() {
        let on_stack = 0u64;
        let on_heap = Box::new(0u64);
        let addresses = [&on_stack as *const u64 as u64, &*on_heap as *const u64 as u64, mapping_containing as *const () as u64, 0x1000];
        let maps = || std::fs::File::open("/proc/self/maps").unwrap();
        for address in addresses {
            let scanned = scan_mappings(std::os::fd::AsRawFd::as_raw_fd(&maps()), address);
            // Before Linux 6.11 there is no query: the scan answers alone.
            if let Ok(asked) = query_mapping(std::os::fd::AsRawFd::as_raw_fd(&maps()), address) {
                assert_eq!(asked, scanned, "{address:#x}");
            }
            assert_eq!(mapping_containing(address), scanned, "{address:#x}");
            assert_eq!(scanned.is_some(), address != 0x1000, "{address:#x}");
        }
    }

    #[test]
    fn main_thread_stack_is_the_stack_mapping() {
        // Tests run on other threads: check the bounds against /proc/self/maps.
        let main = StackBounds::of_main_thread();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|line| line.ends_with("[stack]")).unwrap();
        let (start, end) = line.split_once(' ').unwrap().0.split_once('-').unwrap();
        let mapping = u64::from_str_radix(start, 16).unwrap()..u64::from_str_radix(end, 16).unwrap();
        assert!(mapping.contains(&(main.high - 8)) && main.low <= mapping.start, "{main:x?} {mapping:x?}");
    }

    #[test]
    fn skip_drops_innermost_frames_and_out_caps_the_walk() {
        let mut unwinder = ThreadUnwinder::new();
        let (mut all, mut skipped, mut short) = ([0u64; 64], [0u64; 64], [0u64; 5]);
        ping(2 * DEPTH, &mut || {
            for (out, skip) in [(&mut all[..], 0), (&mut skipped[..], 3), (&mut short[..], 0)] {
                assert_eq!(unwinder.capture(out, skip), out.len());
            }
        });
        // Frame 0 may differ: the loop can be unrolled into three call sites.
        assert_eq!((all[3..40].to_vec(), &all[1..5]), (skipped[..37].to_vec(), &short[1..]));
    }

    /// Whether this build keeps frame pointers (-Cforce-frame-pointers=yes): then
    /// rbp here points at a frame record with the return address DWARF finds.
    #[inline(never)]
    fn frame_pointers_kept() -> bool {
        let (mut unwinder, mut out) = (ThreadUnwinder::new(), [0u64; 2]);
        let written = unwinder.capture(&mut out, 0);
        let here = current_registers!();
        written == 2 && here.bp >= here.sp && unwinder.stack.unwrap().read(here.bp + 8) == Ok(out[1])
    }

    #[test]
    fn frame_pointer_walk_matches_dwarf_when_the_build_keeps_frame_pointers() {
        let (mut dwarf, mut fp) = ([0u64; 128], [0u64; 128]);
        capture_in_recursion(false, &mut dwarf);
        let written = capture_in_recursion(true, &mut fp);
        if !frame_pointers_kept() {
            return eprintln!("built without frame pointers: only checked that the walk ends ({written} frames)");
        }
        assert!(recursion_frames(&fp[..written]) > DEPTH);
        assert_eq!(fp[1..=DEPTH + 1], dwarf[1..=DEPTH + 1]); // frame 0: two different calls
    }

    #[test]
    fn corrupt_frames_end_the_walk_without_faulting() {
        let (mut unwinder, mut out) = (ThreadUnwinder::new(), [0u64; 64]);
        assert!(unwinder.capture(&mut out, 0) > 0);
        let (here, top) = (current_registers!(), unwinder.stack.unwrap().high);
        let code = ping as *const () as u64 + 1;
        // A fake stack: garbage, plausible return addresses, a frame record pointing at itself.
        let mut fake = [0x4141_4141_4141_4141u64; 64];
        let fake_sp = fake.as_ptr() as u64;
        (fake[8], fake[10], fake[11], fake[20]) = (code, fake_sp + 80, code, code);
        black_box(&mut fake); // the walks read it through its address
        let starts = [
            (code, fake_sp, fake_sp + 80),
            (code, fake_sp, 0xdead_beef),
            (code, fake_sp + 4, fake_sp + 3),
            (0x10, fake_sp, fake_sp),
            (code, top - 8, top - 8),
            (code, here.sp, here.sp - 64),
            (code, 16, 16),
            (code, !7, !7),
        ];
        for (ip, sp, bp) in starts {
            for dwarf_frames in [0, 1, usize::MAX] {
                assert!(unwinder.walk(Registers { ip, sp, bp }, &mut out, 0, dwarf_frames, Reading::Plain) <= out.len());
            }
        }
        assert_eq!(unwinder.walk(Registers { ip: code, sp: fake_sp, bp: fake_sp + 80 }, &mut out, 0, 0, Reading::Plain), 1);

        // A real call with rbp overwritten and the stack pointer off its unwind
        // rule: both walks return the frames before the damage.
        struct Walks(ThreadUnwinder, [u64; 64], usize, usize);
        extern "C" fn capture_both(walks: &mut Walks) {
            walks.2 = walks.0.capture(&mut walks.1, 0);
            walks.3 = walks.0.capture_frame_pointers(&mut walks.1, 0);
        }
        let mut walks = Walks(ThreadUnwinder::new(), [0; 64], 0, 0);
        for garbage in [0xdead_beef_u64, fake_sp + 80, here.sp] {
            // SAFETY: a call with a garbage frame pointer, restored around it: rbp is
            // pushed and popped, the stack realigned, and `capture_both` is an
            // `extern "C"` fn taking `walks` in rdi, every C-clobbered register declared.
            unsafe {
                core::arch::asm!("push rbp", "sub rsp, 8", "mov rbp, {garbage}", "call {f}", "add rsp, 8", "pop rbp",
                    garbage = in(reg) garbage, f = sym capture_both, in("rdi") &mut walks, clobber_abi("C"));
            }
            assert!(walks.2 >= 1 && walks.3 >= 1);
        }
    }

    #[test]
    fn modules_changed_rebuilds_the_module_list() {
        let (mut unwinder, mut out) = (ThreadUnwinder::new(), [0u64; 8]);
        unwinder.capture(&mut out, 0);
        modules_changed();
        assert_ne!(unwinder.generation, Some(MODULES_GENERATION.load(Acquire)));
        assert!(unwinder.capture(&mut out, 0) > 0);
        assert_eq!(unwinder.generation, Some(MODULES_GENERATION.load(Acquire)));
        assert!(unwinder.code.ranges.len() >= 2); // this binary and libc at least
        // A module loaded behind the hooks' back: a walk ending in unknown code notices.
        (unwinder.code.loader_events, unwinder.code.misses) = (u64::MAX, 0);
        assert!(!unwinder.code.contains(0x10) && unwinder.code.stale);
        assert!(unwinder.capture(&mut out, 0) > 0);
        assert!(!unwinder.code.stale && unwinder.code.loader_events == loader_events());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn rule_caches_grow_when_return_addresses_share_slots() {
        let mut unwinder = ThreadUnwinder::new();
        unwinder.grow_rule_caches();
        // 64 addresses in 64 slots: a window of hits stays with one cache.
        for i in 0..u64::from(RuleCaches::WINDOW) {
            unwinder.rules.cache_for(0x40_0000 + (i % 64) * 16);
        }
        assert!(!unwinder.rules.should_grow());
        // Two addresses 509 apart share a slot and evict each other.
        for i in 0..u64::from(RuleCaches::WINDOW) {
            unwinder.rules.cache_for(0x40_0000 + (i % 2) * RuleCaches::SLOTS);
        }
        assert!(unwinder.rules.should_grow());
        unwinder.grow_rule_caches();
        assert_eq!(unwinder.rules.caches.len(), RuleCaches::GROWN);
        assert!(!unwinder.rules.should_grow());
        // The two now sit in different caches.
        let first = unwinder.rules.cache_for(0x40_0000) as *const _;
        assert_ne!(first, unwinder.rules.cache_for(0x40_0000 + RuleCaches::SLOTS) as *const _);
    }

    #[test]
    fn eh_frame_pointer_encodings() {
        // pcrel|sdata4, as ld writes it: -0x100 from the field at 0x1004.
        assert_eq!(eh_frame_address(&[1, 0x1b, 3, 0x3b, 0x00, 0xff, 0xff, 0xff], 0x1000), Some(0xf04));
        assert_eq!(eh_frame_address(&[1, 0x03, 0, 0, 0x10, 0, 0, 0], 0x1000), Some(0x10));
        assert_eq!(eh_frame_address(&[1, 0x33, 0, 0, 0x10, 0, 0, 0], 0x1000), Some(0x1010));
        assert_eq!(eh_frame_address(&[1, 0xff, 0, 0], 0x1000), None);
        assert_eq!(eh_frame_address(&[1, 0x1b, 3, 0x3b, 0], 0x1000), None);
    }

    /// Bytes of stack below the caller that `f` touched: paint, run, look.
    /// (Writes below the stack pointer: for the measurement only.)
    #[inline(never)]
    fn stack_used_by(f: &mut dyn FnMut()) -> u64 {
        const SPAN: u64 = 128 << 10;
        const PAINT: u64 = 0x5a5a_5a5a_5a5a_5a5a;
        let sp = current_registers!().sp;
        // SAFETY: the thread's own mapped stack below its live frames (256 bytes
        // down, past the red zone), which no frame uses until `f` runs; a test
        // measurement only.
        (sp - SPAN..sp - 256).step_by(8).for_each(|a| unsafe { (a as *mut u64).write_volatile(PAINT) });
        f();
        // SAFETY: the same words, just written.
        let untouched = (sp - SPAN..sp).step_by(8).take_while(|&a| unsafe { (a as *const u64).read_volatile() } == PAINT);
        SPAN - 8 * untouched.count() as u64
    }

    #[test]
    #[ignore = "measurement: cargo test --release -p memgap-agent unwind::tests::cost -- --ignored --nocapture"]
    fn cost() {
        const ROUNDS: u32 = 200_000;
        for (walk, frame_pointers) in [("DWARF", false), ("frame pointers", true)] {
            for frames in [10, 40] {
                let (mut unwinder, mut out) = (ThreadUnwinder::new(), [0u64; 40]);
                let capture = |unwinder: &mut ThreadUnwinder, out: &mut [u64]| {
                    if frame_pointers { unwinder.capture_frame_pointers(out, 0) } else { unwinder.capture(out, 0) }
                };
                let (mut first, mut warm, mut written, mut stack) = (0.0, 0.0, 0, 0);
                ping(50, &mut || {
                    let start = std::time::Instant::now();
                    capture(&mut unwinder, &mut out[..frames]);
                    first = start.elapsed().as_secs_f64() * 1e6;
                    let start = std::time::Instant::now();
                    for _ in 0..ROUNDS {
                        written = black_box(capture(&mut unwinder, &mut out[..frames]));
                    }
                    warm = start.elapsed().as_secs_f64() * 1e9 / f64::from(ROUNDS);
                    stack = stack_used_by(&mut || written = capture(&mut unwinder, &mut out[..frames]));
                });
                println!("{walk}, {written} frames: {warm:.0} ns warm, first capture {first:.0} µs, a miss uses {stack} bytes of stack");
            }
        }
        let mut unwinder = ThreadUnwinder::new();
        let stack = stack_used_by(&mut || unwinder.grow_rule_caches());
        println!("building framehop's cache uses {stack} bytes of stack");
    }
}
