//! glibc's libc.so.6 as loaded in another process: where malloc_trim is,
//! which code belongs to the allocator, and how to unwind its frames.
//!
//! Addresses come from the library's ELF dynamic symbols plus the load bias
//! seen in /proc/PID/maps. Debian strips libc's static symbols, so the
//! allocator's internal functions (`_int_malloc`, `_int_free`,
//! `_mid_memalign`…) have no names; malloc.c is one object file, though, so
//! its code lies in one block: from the end of the exported function before
//! `malloc` and friends to the start of the first one after them.

use std::ops::Range;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use memgap_trace::records::Mapping;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::error::AttachError;
use crate::modules::{is_libc, open_mapped};

/// Functions of malloc.c that libc exports. While a thread runs in one, or
/// in the internal functions they call, it may hold an arena's lock.
const ALLOCATOR_FUNCTIONS: &[&str] = &[
    "malloc",
    "free",
    "cfree",
    "calloc",
    "realloc",
    "memalign",
    "aligned_alloc",
    "posix_memalign",
    "valloc",
    "pvalloc",
    "malloc_trim",
    "malloc_usable_size",
    "mallinfo",
    "mallinfo2",
    "malloc_stats",
    "malloc_info",
    "mallopt",
    "__libc_malloc",
    "__libc_free",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__libc_valloc",
    "__libc_pvalloc",
    "__libc_mallinfo",
    "__libc_mallopt",
    "__default_morecore",
    "malloc_get_state",
    "malloc_set_state",
];
/// fork holds every arena lock around the clone (glibc's atfork handling).
const FORK_FUNCTIONS: &[&str] = &["fork", "__libc_fork", "_Fork"];
/// Where a thread waits for a lock glibc's allocator takes (lll_lock).
const LOCK_WAIT_FUNCTIONS: &[&str] = &["__lll_lock_wait_private", "__lll_lock_wait"];
/// Larger than any malloc.c: past this, the block found is not one object.
const MAX_ALLOCATOR_BLOCK: u64 = 1 << 20;
/// Frames walked at most inside libc.
const MAX_FRAMES: usize = 64;

pub struct LibcImage {
    pub malloc_trim: u64,
    /// Run-time ranges of code that may hold an allocator lock.
    pub allocator_code: Vec<Range<u64>>,
    pub lock_wait_code: Vec<Range<u64>>,
    /// libc's executable mapping.
    pub text: Range<u64>,
    unwinder: UnwinderX86_64<Vec<u8>>,
}

/// Where a thread is, as far as the allocator is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whereabouts {
    /// No frame of the allocator (or fork) is on its stack.
    Outside,
    /// Running in the allocator: it may hold an arena lock.
    InAllocator,
    /// Waiting for an allocator lock, holding none of its own.
    WaitingForLock,
    /// Its libc frames could not be unwound.
    Unknown,
}

impl LibcImage {
    /// libc.so.6 as mapped in process `pid`.
    pub fn load(pid: u32, mappings: &[Mapping]) -> Result<LibcImage, AttachError> {
        let first = mappings.iter().filter(|m| is_libc(m)).min_by_key(|m| m.offset).ok_or(AttachError::Static(pid))?;
        let text = mappings.iter().find(|m| is_libc(m) && m.perms.contains('x')).map(|m| m.start..m.end).ok_or(AttachError::Static(pid))?;
        let path = first.name.trim_end_matches(" (deleted)").to_string();
        let data = open_mapped(pid, first)?;
        let bad = |why: String| AttachError::Failed(format!("{path} of process {pid}: {why}"));
        let elf = object::File::parse(&*data).map_err(|e| bad(format!("not an ELF file ({e})")))?;
        // The mapping at file offset `first.offset` starts at the segment holding that offset.
        let segment =
            elf.segments().find(|s| s.file_range().0 <= first.offset && first.offset < s.file_range().0 + s.file_range().1.max(1));
        let segment_address = segment.map_or(0, |s| s.address() + (first.offset - s.file_range().0)) & !0xfff;
        // Load bias: run-time address = ELF address + base.
        let base = first.start.wrapping_sub(segment_address);

        let mut functions: Vec<(Range<u64>, String)> = elf
            .dynamic_symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() > 0)
            .filter_map(|s| Some((s.address()..s.address() + s.size(), s.name().ok()?.to_string())))
            .collect();
        functions.sort_by_key(|(range, _)| range.start);
        let named = |names: &[&str]| -> Vec<Range<u64>> {
            functions.iter().filter(|(_, n)| names.contains(&n.as_str())).map(|(r, _)| r.clone()).collect()
        };
        let malloc_trim =
            named(&["malloc_trim"]).first().map(|r| r.start).ok_or_else(|| bad("no malloc_trim in its dynamic symbols".into()))?;
        let mut allocator_code = allocator_block(&functions).map_or_else(|| named(ALLOCATOR_FUNCTIONS), |block| vec![block]);
        allocator_code.extend(named(FORK_FUNCTIONS));
        let relocate = |ranges: Vec<Range<u64>>| ranges.into_iter().map(|r| r.start + base..r.end + base).collect::<Vec<_>>();

        let mut unwinder = UnwinderX86_64::new();
        unwinder.add_module(Module::new(path.clone(), text.clone(), base, unwind_sections(&elf)));
        Ok(LibcImage {
            malloc_trim: malloc_trim + base,
            allocator_code: relocate(allocator_code),
            lock_wait_code: relocate(named(LOCK_WAIT_FUNCTIONS)),
            text,
            unwinder,
        })
    }

    /// Where the thread whose registers are `ip`, `sp`, `bp` is: its libc
    /// frames, innermost first, walked with libc's unwind tables; the walk
    /// stops at the first frame outside libc (malloc calls no other module).
    pub fn whereabouts(&self, ip: u64, sp: u64, bp: u64, mut read_word: impl FnMut(u64) -> Option<u64>) -> Whereabouts {
        let in_any = |ranges: &[Range<u64>], pc: u64| ranges.iter().any(|r| r.contains(&pc));
        let mut pcs = Vec::new();
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut address = FrameAddress::from_instruction_pointer(ip);
        let mut cache = CacheX86_64::new();
        let mut read_stack = |at: u64| read_word(at).ok_or(());
        let mut pc = ip;
        while self.text.contains(&pc) {
            pcs.push(pc);
            if pcs.len() > MAX_FRAMES {
                return Whereabouts::Unknown;
            }
            match self.unwinder.unwind_frame(address, &mut regs, &mut cache, &mut read_stack) {
                Ok(Some(return_address)) => {
                    // The call instruction lies just before the return address.
                    pc = return_address - 1;
                    let Some(next) = FrameAddress::from_return_address(return_address) else { return Whereabouts::Unknown };
                    address = next;
                }
                Ok(None) => break,
                Err(_) => return Whereabouts::Unknown,
            }
        }
        match pcs.iter().position(|&pc| in_any(&self.allocator_code, pc)) {
            None => Whereabouts::Outside,
            Some(first) if first > 0 && pcs[..first].iter().all(|&pc| in_any(&self.lock_wait_code, pc)) => Whereabouts::WaitingForLock,
            Some(_) => Whereabouts::InAllocator,
        }
    }
}

/// The block of code between the exported functions around malloc.c's
/// (ELF addresses), or None if it does not look like one object file.
fn allocator_block(functions: &[(Range<u64>, String)]) -> Option<Range<u64>> {
    let is_allocator = |name: &str| ALLOCATOR_FUNCTIONS.contains(&name);
    let ours: Vec<&Range<u64>> = functions.iter().filter(|(_, n)| is_allocator(n)).map(|(r, _)| r).collect();
    let low = ours.iter().map(|r| r.start).min()?;
    let high = ours.iter().map(|r| r.end).max()?;
    let others = functions.iter().filter(|(r, n)| !is_allocator(n) && (r.end <= low || r.start >= high)).map(|(r, _)| r);
    let start = others.clone().filter(|r| r.end <= low).map(|r| r.end).max().unwrap_or(low);
    let end = others.filter(|r| r.start >= high).map(|r| r.start).min().unwrap_or(high);
    (end - start <= MAX_ALLOCATOR_BLOCK).then_some(start..end)
}

pub(crate) fn unwind_sections(elf: &object::File) -> ExplicitModuleSectionInfo<Vec<u8>> {
    let section = |name: &str| {
        let s = elf.section_by_name(name)?;
        Some((s.address()..s.address() + s.size(), s.data().ok()?.to_vec()))
    };
    let (text_svma, text) = section(".text").unzip();
    let (eh_frame_svma, eh_frame) = section(".eh_frame").unzip();
    let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr").unzip();
    let got_svma = elf.section_by_name(".got").map(|s| s.address()..s.address() + s.size());
    ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma,
        text,
        got_svma,
        eh_frame_svma,
        eh_frame,
        eh_frame_hdr_svma,
        eh_frame_hdr,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocator_block_stops_at_other_objects() {
        let f = |start: u64, end: u64, name: &str| (start..end, name.to_string());
        let functions = [f(0x100, 0x200, "timer_settime"), f(0x400, 0x500, "malloc"), f(0x600, 0x700, "free"), f(0x800, 0x900, "mcheck")];
        assert_eq!(allocator_block(&functions), Some(0x200..0x800));
        let spread = [f(0x100, 0x200, "malloc"), f(0x100 + 2 * MAX_ALLOCATOR_BLOCK, 0x300 + 2 * MAX_ALLOCATOR_BLOCK, "free")];
        assert_eq!(allocator_block(&spread), None);
    }

    #[test]
    fn our_own_libc() {
        let pid = std::process::id();
        let mappings = crate::procfs::mappings(pid).unwrap();
        let libc = LibcImage::load(pid, &mappings).expect("load our libc");
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        assert_eq!(libc.malloc_trim, malloc_trim as *const () as u64);
        let malloc_address = libc::malloc as *const () as u64;
        assert!(libc.allocator_code.iter().any(|r| r.contains(&malloc_address)));
        assert!(!libc.allocator_code.iter().any(|r| r.contains(&(libc::write as *const () as u64))));
        assert!(!libc.lock_wait_code.is_empty());
    }
}
