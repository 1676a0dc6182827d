//! Call stacks for allocations: captured by the thread's unwinder and
//! interned per thread, so each distinct stack is written to the trace once
//! (in the first event that uses it) and later events carry a small id.

use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Relaxed};

use crate::unwind::{Capture, ThreadUnwinder};

pub const MAX_DEPTH: usize = 256;
/// Agent frames above the program's call: the hook and `append_allocation`.
pub const AGENT_FRAMES: usize = 2;
const TABLE_SLOTS: usize = 4096;

const NONE: u8 = 0;
const DWARF: u8 = 1;
const FRAME_POINTERS: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(NONE);
static DEPTH: AtomicUsize = AtomicUsize::new(64);

pub fn configure(mode: crate::process::StackMode, depth: usize) {
    let mode = match mode {
        crate::process::StackMode::None => NONE,
        crate::process::StackMode::Dwarf => DWARF,
        crate::process::StackMode::FramePointers => FRAME_POINTERS,
    };
    MODE.store(mode, Relaxed);
    DEPTH.store(depth.clamp(1, MAX_DEPTH), Relaxed);
}

#[inline(always)]
pub fn enabled() -> bool {
    MODE.load(Relaxed) != NONE
}

#[derive(Clone, Copy, Default)]
struct Slot {
    hash: u64,
    id: u32,
}

/// One per thread.
pub struct ThreadStacks {
    unwinder: ThreadUnwinder,
    /// A cache from stack hash to id; a miss only costs a repeated definition.
    /// On the heap: thread stacks may be small.
    table: alloc::boxed::Box<[Slot]>,
    next_id: u32,
    /// Ids whose frames the trace has: a native stack first seen under
    /// Python frames is defined only with them.
    defined: alloc::vec::Vec<u64>,
    /// The last captured stack (native frames, then any Python frames).
    /// Here rather than on the program's stack: zeroing 2 KiB per
    /// allocation cost more than the unwinding it feeds.
    frames: alloc::boxed::Box<[u64]>,
    python: alloc::boxed::Box<[u64]>,
}

impl ThreadStacks {
    pub fn new() -> Self {
        ThreadStacks {
            unwinder: ThreadUnwinder::new(),
            table: alloc::vec![Slot::default(); TABLE_SLOTS].into_boxed_slice(),
            next_id: 1,
            defined: alloc::vec::Vec::new(),
            frames: alloc::vec![0; MAX_DEPTH + crate::python_frames::MAX_PYTHON_FRAMES].into_boxed_slice(),
            python: alloc::vec![0; crate::python_frames::MAX_PYTHON_FRAMES].into_boxed_slice(),
        }
    }

    /// Captures the caller's caller's stack and interns it: its id (0:
    /// none) and, when the id is new, the depth of its frames (see
    /// [`Self::captured`]) to define it with; 0 otherwise. Walks are
    /// remembered under their id, so a repeated stack costs no unwinding.
    /// A thread running Python code gets its Python frames after the
    /// native ones, under an id of their own.
    #[inline(always)]
    pub fn capture(&mut self) -> (u32, usize) {
        let depth = DEPTH.load(Relaxed);
        let frame_pointers = match MODE.load(Relaxed) {
            DWARF => false,
            FRAME_POINTERS => true,
            _ => return (0, 0),
        };
        let frames = &mut self.frames[..depth];
        // Inlined here, and so into append_allocation: its walk starts
        // there, so the agent's frames above the program's are the hook's alone.
        let captured = self.unwinder.capture_remembered(frames, AGENT_FRAMES - 1, frame_pointers);
        // Nearly every capture: a recalled walk whose stack the trace has,
        // in a thread that runs no Python code.
        if let Capture::Remembered(native) = captured
            && !crate::python_frames::enabled()
            && self.is_defined(native)
        {
            return (native, 0);
        }
        self.intern_capture(captured, depth, frame_pointers)
    }

    /// The rest of [`Self::capture`]: a new walk to intern and remember,
    /// a stack to define, Python frames. Out of line, so that the recall's
    /// path stays short in append_allocation.
    #[inline(never)]
    fn intern_capture(&mut self, captured: Capture, depth: usize, frame_pointers: bool) -> (u32, usize) {
        // A walk made again starts in its own function, called from here,
        // called from append_allocation: one frame more than the agent's two.
        let skip = AGENT_FRAMES + 1;
        let (native, walked) = match captured {
            Capture::Remembered(id) => (id, None),
            Capture::Walked(0) => (0, Some(0)),
            Capture::Walked(depth) => {
                let frames = core::mem::take(&mut self.frames);
                let (id, _) = self.intern(&frames[..depth]);
                self.frames = frames;
                self.unwinder.remember(id);
                (id, Some(depth))
            }
        };
        let python = if crate::python_frames::enabled() { crate::python_frames::capture(&mut self.python) } else { 0 };
        if python == 0 {
            if native == 0 || self.is_defined(native) {
                return (native, 0);
            }
            let depth = match walked {
                Some(depth) => depth,
                None => self.walk_again(depth, skip, frame_pointers),
            };
            self.set_defined(native);
            return (native, depth);
        }
        let hash = self.python[..python].iter().fold(0x6a09_e667_f3bc_c908u64 ^ native as u64, |h, &f| mix(h, f)) | 1;
        let (id, new) = self.intern_hash(hash);
        if !new && self.is_defined(id) {
            return (id, 0);
        }
        let native_depth = match walked {
            Some(depth) => depth,
            None if native == 0 => 0,
            None => self.walk_again(depth, skip, frame_pointers),
        };
        self.frames[native_depth..native_depth + python].copy_from_slice(&self.python[..python]);
        self.set_defined(id);
        (id, native_depth + python)
    }

    /// The native frames again, walked without the memo (which gave an id
    /// whose frames this capture needs).
    #[inline(always)]
    fn walk_again(&mut self, depth: usize, skip: usize, frame_pointers: bool) -> usize {
        let frames = &mut self.frames[..depth];
        if frame_pointers { self.unwinder.capture_frame_pointers(frames, skip) } else { self.unwinder.capture(frames, skip) }
    }

    #[inline(always)]
    fn is_defined(&self, id: u32) -> bool {
        self.defined.get(id as usize / 64).is_some_and(|word| word & (1 << (id % 64)) != 0)
    }

    fn set_defined(&mut self, id: u32) {
        let word = id as usize / 64;
        if word >= self.defined.len() {
            self.defined.resize(word + 1, 0);
        }
        self.defined[word] |= 1 << (id % 64);
    }

    /// The stack [`Self::capture`] took, `depth` frames deep.
    #[inline(always)]
    pub fn captured(&self, depth: usize) -> &[u64] {
        &self.frames[..depth]
    }

    /// The id of this stack, and whether it is new (must be defined).
    #[inline(always)]
    pub fn intern(&mut self, frames: &[u64]) -> (u32, bool) {
        let hash = frames.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &f| mix(h, f)) | 1;
        self.intern_hash(hash)
    }

    #[inline(always)]
    fn intern_hash(&mut self, hash: u64) -> (u32, bool) {
        let slot = &mut self.table[(hash >> 32) as usize % TABLE_SLOTS];
        if slot.hash == hash {
            return (slot.id, false);
        }
        let id = self.next_id;
        self.next_id += 1;
        *slot = Slot { hash, id };
        (id, true)
    }
}

#[inline(always)]
fn mix(hash: u64, frame: u64) -> u64 {
    (hash.rotate_left(5) ^ frame).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interns_repeated_stacks() {
        let mut stacks = Box::new(ThreadStacks::new());
        assert_eq!(stacks.intern(&[1, 2, 3]), (1, true));
        assert_eq!(stacks.intern(&[4, 5]), (2, true));
        assert_eq!(stacks.intern(&[1, 2, 3]), (1, false));
        assert_eq!(stacks.intern(&[3, 2, 1]), (3, true));
    }
}
