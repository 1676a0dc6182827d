//! The frames of a stopped thread, walked with the unwind tables
//! (`.eh_frame`) of every module the process has mapped: which code the
//! thread is in, and which functions called it. A word on the stack that
//! merely looks like a return address (left over from a call that has
//! returned, such as a constructor run before `main`) is not taken for a
//! frame; where the walk reaches code no module describes (the vDSO, JIT
//! code), what is left of the stack can only be scanned word by word.

use std::ops::Range;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Module, Unwinder};
use memgap_trace::records::Mapping;
use object::{Object, ObjectSegment};

use crate::libc_image::unwind_sections;
use crate::modules::open_mapped;

/// Frames walked at most: deeper stacks are scanned from there on.
const MAX_FRAMES: usize = 256;

pub struct StackFrames {
    unwinder: UnwinderX86_64<Vec<u8>>,
    /// The executable mappings of the modules added.
    code: Vec<Range<u64>>,
}

/// How far a walk got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    /// The instruction pointer, then each caller's call site (return address − 1).
    pub pcs: Vec<u64>,
    /// Where the walk stopped short of the stack's root: the stack pointer
    /// of the first frame it could not unwind.
    pub unwalked_from: Option<u64>,
}

impl StackFrames {
    /// The unwind tables of every ELF file `pid` maps with code in it.
    pub fn load(pid: u32, mappings: &[Mapping]) -> StackFrames {
        let mut unwinder = UnwinderX86_64::new();
        let mut code = Vec::new();
        let mut seen = Vec::new();
        for text in mappings.iter().filter(|m| m.inode != 0 && m.perms.contains('x')) {
            if seen.contains(&(text.inode, &text.name)) {
                continue;
            }
            seen.push((text.inode, &text.name));
            let Some(first) = mappings.iter().filter(|m| m.inode == text.inode && m.name == text.name).min_by_key(|m| m.offset) else {
                continue;
            };
            let Ok(data) = open_mapped(pid, first) else { continue };
            let Ok(elf) = object::File::parse(&*data) else { continue };
            // Load bias: run-time address = ELF address + base.
            let Some(lowest) = elf.segments().filter(|s| s.file_range().0 == first.offset).map(|s| s.address()).min() else { continue };
            let base = first.start.wrapping_sub(lowest & !0xfff);
            unwinder.add_module(Module::new(text.name.clone(), text.start..text.end, base, unwind_sections(&elf)));
            code.push(text.start..text.end);
        }
        StackFrames { unwinder, code }
    }

    /// Walks the thread whose registers are `ip`, `sp`, `bp`.
    pub fn walk(&self, ip: u64, sp: u64, bp: u64, mut read_word: impl FnMut(u64) -> Option<u64>) -> Walk {
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut address = FrameAddress::from_instruction_pointer(ip);
        let mut cache = CacheX86_64::new();
        let mut read_stack = |at: u64| read_word(at).ok_or(());
        let mut pcs = vec![ip];
        let stopped = |pcs: Vec<u64>, sp: u64| Walk { pcs, unwalked_from: Some(sp) };
        loop {
            let pc = *pcs.last().expect("one pc at least");
            // Code no module describes: framehop would guess with frame pointers.
            if pcs.len() > MAX_FRAMES || !self.code.iter().any(|r| r.contains(&pc)) {
                return stopped(pcs, regs.sp());
            }
            let sp_before = regs.sp();
            match self.unwinder.unwind_frame(address, &mut regs, &mut cache, &mut read_stack) {
                Ok(Some(return_address)) => {
                    // A caller's frame lies above its callee's.
                    let Some(next) = FrameAddress::from_return_address(return_address).filter(|_| regs.sp() > sp_before) else {
                        return stopped(pcs, sp_before);
                    };
                    pcs.push(return_address - 1);
                    address = next;
                }
                Ok(None) => return Walk { pcs, unwalked_from: None },
                Err(_) => return stopped(pcs, sp_before),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn registers_here() -> (u64, u64, u64) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers into locals; no memory is touched.
        unsafe {
            std::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp", ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp)
        };
        (ip, sp, bp)
    }

    #[test]
    fn walks_its_own_thread_to_the_root() {
        let pid = std::process::id();
        let frames = StackFrames::load(pid, &crate::procfs::mappings(pid).unwrap());
        let (ip, sp, bp) = registers_here();
        // SAFETY: the walk reads words of this thread's own live stack, above `sp`.
        let walk = frames.walk(ip, sp, bp, |at| (at >= sp).then(|| unsafe { std::ptr::read_volatile(at as *const u64) }));
        assert_eq!(walk.unwalked_from, None, "{walk:x?}");
        // This test's function is among the callers.
        let here = walks_its_own_thread_to_the_root as *const () as u64;
        assert!(walk.pcs.iter().any(|&pc| pc >= here && pc < here + 4096), "{walk:x?}");
        assert!(walk.pcs.len() >= 4, "{walk:x?}");
    }
}
