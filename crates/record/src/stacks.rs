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
    /// The last captured stack. Here rather than on the program's stack:
    /// zeroing 2 KiB per allocation cost more than the unwinding it feeds.
    frames: alloc::boxed::Box<[u64]>,
}

impl ThreadStacks {
    pub fn new() -> Self {
        ThreadStacks {
            unwinder: ThreadUnwinder::new(),
            table: alloc::vec![Slot::default(); TABLE_SLOTS].into_boxed_slice(),
            next_id: 1,
            frames: alloc::vec![0; MAX_DEPTH].into_boxed_slice(),
        }
    }

    /// Captures the caller's caller's stack and interns it: its id (0:
    /// none) and, when the id is new, the depth of its frames (see
    /// [`Self::captured`]) to define it with; 0 otherwise. Walks are
    /// remembered under their id, so a repeated stack costs no unwinding.
    #[inline(always)]
    pub fn capture(&mut self) -> (u32, usize) {
        let depth = DEPTH.load(Relaxed);
        // With skip 0 the first address is the return into
        // append_allocation; the hook's comes next, then the program's.
        let skip = AGENT_FRAMES;
        let frame_pointers = match MODE.load(Relaxed) {
            DWARF => false,
            FRAME_POINTERS => true,
            _ => return (0, 0),
        };
        let frames = &mut self.frames[..depth];
        match self.unwinder.capture_remembered(frames, skip, frame_pointers) {
            Capture::Remembered(id) => (id, 0),
            Capture::Walked(0) => (0, 0),
            Capture::Walked(depth) => {
                let frames = core::mem::take(&mut self.frames);
                let (id, new) = self.intern(&frames[..depth]);
                self.frames = frames;
                self.unwinder.remember(id);
                (id, if new { depth } else { 0 })
            }
        }
    }

    /// The stack [`Self::capture`] took, `depth` frames deep.
    #[inline(always)]
    pub fn captured(&self, depth: usize) -> &[u64] {
        &self.frames[..depth]
    }

    /// The id of this stack, and whether it is new (must be defined).
    #[inline(always)]
    pub fn intern(&mut self, frames: &[u64]) -> (u32, bool) {
        let hash = frames.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &f| (h.rotate_left(5) ^ f).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)) | 1;
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
