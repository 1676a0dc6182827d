//! Where glibc's malloc state is in another process: `main_arena`, `mp_`
//! and `tcache_key`, from libc's detached debug information (Debian's
//! libc6-dbg, found by build-id under /usr/lib/debug/.build-id, or the
//! directory `MEMGAP_DEBUG_DIR` names), or, without it, by looking through
//! libc's writable data for the one `struct malloc_state` that fits: its
//! empty bins point to themselves, the others and its top into the brk
//! heap, and its `next` ring closes through thread arenas that sit right
//! after a heap_info at a 64 MiB boundary.

use memgap_trace::records::Mapping;
use object::{Object, ObjectSegment, ObjectSymbol};

use crate::glibc_walk::{HEAP_INFO_SIZE, HEAP_MAX, STATE_SIZE};
use crate::modules::{is_libc, open_mapped};
use crate::remote_memory::Memory;

/// The glibc releases whose malloc structures the walk's offsets describe.
const LAYOUT_VERSIONS: std::ops::RangeInclusive<u32> = 35..=39;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlibcState {
    pub main_arena: u64,
    pub mp: Option<u64>,
    pub tcache_key_at: Option<u64>,
    /// "debug info" or "heuristic".
    pub found_by: &'static str,
    pub libc_path: String,
}

/// The default place of detached debug information.
const DEBUG_DIR: &str = "/usr/lib/debug";

/// Finds glibc's malloc state in process `pid`.
pub fn locate(pid: u32, mappings: &[Mapping], memory: &dyn Memory) -> Result<GlibcState, String> {
    let first = mappings.iter().filter(|m| is_libc(m)).min_by_key(|m| m.offset).ok_or("no libc.so.6 mapped")?;
    let libc_path = first.name.trim_end_matches(" (deleted)").to_string();
    let data = open_mapped(pid, first).map_err(|e| e.to_string())?;
    let elf = object::File::parse(&*data).map_err(|e| format!("{libc_path} is not an ELF file ({e})"))?;
    if let Some(minor) = glibc_minor_version(&data)
        && !LAYOUT_VERSIONS.contains(&minor)
    {
        return Err(format!(
            "glibc 2.{minor}: memgap knows the malloc state of glibc 2.{} to 2.{} only",
            LAYOUT_VERSIONS.start(),
            LAYOUT_VERSIONS.end()
        ));
    }
    let segment = elf.segments().find(|s| s.file_range().0 <= first.offset && first.offset < s.file_range().0 + s.file_range().1.max(1));
    let segment_address = segment.map_or(0, |s| s.address() + (first.offset - s.file_range().0)) & !0xfff;
    let base = first.start.wrapping_sub(segment_address);
    let debug_dir = std::env::var_os(memgap_trace::vocabulary::env::DEBUG_DIR).map_or_else(|| DEBUG_DIR.into(), std::path::PathBuf::from);
    if let Some(found) = elf.build_id().ok().flatten().and_then(|id| from_debug_info(&debug_dir, id)) {
        let (main_arena, mp, tcache_key) = found;
        return Ok(GlibcState {
            main_arena: main_arena + base,
            mp: Some(mp + base),
            tcache_key_at: tcache_key.map(|k| k + base),
            found_by: "debug info",
            libc_path,
        });
    }
    let main_arena = by_heuristic(mappings, &libc_path, memory)?;
    Ok(GlibcState { main_arena, mp: None, tcache_key_at: None, found_by: "heuristic", libc_path })
}

/// The minor version in libc's banner ("… release version 2.36.").
fn glibc_minor_version(data: &[u8]) -> Option<u32> {
    let marker = b"release version 2.";
    let at = data.windows(marker.len()).position(|w| w == marker)? + marker.len();
    let digits: String = data[at..].iter().take(3).take_while(|b| b.is_ascii_digit()).map(|&b| b as char).collect();
    digits.parse().ok()
}

/// main_arena, mp_ and tcache_key (ELF addresses) from the debug file of `build_id`.
fn from_debug_info(debug_dir: &std::path::Path, build_id: &[u8]) -> Option<(u64, u64, Option<u64>)> {
    let (first, rest) = build_id.split_first()?;
    let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    let path = debug_dir.join(".build-id").join(format!("{first:02x}")).join(format!("{hex}.debug"));
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a debug file on disk, mapped read-only.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let symbol = |name: &str| elf.symbols().find(|s| s.name() == Ok(name)).map(|s| s.address());
    Some((symbol("main_arena")?, symbol("mp_")?, symbol("tcache_key")))
}

/// The malloc_state in libc's writable data that fits, when exactly one does.
fn by_heuristic(mappings: &[Mapping], libc_path: &str, memory: &dyn Memory) -> Result<u64, String> {
    let brk = mappings.iter().find(|m| m.name == "[heap]").ok_or("no [heap] mapping, where the main arena's chunks would be")?;
    let anonymous = |addr: u64| mappings.iter().any(|m| m.start <= addr && addr < m.end && m.is_private_writable_anonymous());
    // libc's writable segment and the .bss right after it.
    let mut regions: Vec<(u64, u64)> = Vec::new();
    for (i, m) in mappings.iter().enumerate() {
        if m.name.trim_end_matches(" (deleted)") == libc_path && m.perms.starts_with("rw") {
            regions.push((m.start, m.end));
            if let Some(next) = mappings.get(i + 1).filter(|n| n.start == m.end && n.inode == 0 && n.perms.starts_with("rw")) {
                regions.push((next.start, next.end));
            }
        }
    }
    let mut found = Vec::new();
    for (start, end) in regions {
        let mut bytes = vec![0u8; (end - start) as usize];
        if !memory.read(start, &mut bytes) {
            continue;
        }
        let word = |offset: usize| u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap());
        for offset in (0..bytes.len().saturating_sub(STATE_SIZE as usize)).step_by(8) {
            let at = start + offset as u64;
            if fits(at, |field| word(offset + field as usize), brk, &anonymous, memory) {
                found.push(at);
            }
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err("found no malloc_state in libc's data (install libc6-dbg for its address)".into()),
        _ => Err(format!("{} places in libc's data look like main_arena (install libc6-dbg for its address)", found.len())),
    }
}

/// Whether the bytes at `at` (read through `field`) are the main arena's state.
fn fits(at: u64, field: impl Fn(u64) -> u64, brk: &Mapping, anonymous: &dyn Fn(u64) -> bool, memory: &dyn Memory) -> bool {
    const TOP: u64 = 96;
    const BINS: u64 = 112;
    const NEXT: u64 = 2160;
    const SYSTEM_MEM: u64 = 2184;
    let in_brk = |p: u64| brk.start <= p && p < brk.end;
    let top = field(TOP);
    if !in_brk(top) || !top.is_multiple_of(16) {
        return false;
    }
    let system_mem = field(SYSTEM_MEM);
    if system_mem == 0 || system_mem > brk.end - brk.start {
        return false;
    }
    // Each bin is empty (both ends on the bin itself) or lists chunks of the heap.
    for bin in 1..128u64 {
        let own = at + BINS + (bin - 1) * 16 - 16;
        let (fd, bk) = (field(BINS + (bin - 1) * 16), field(BINS + (bin - 1) * 16 + 8));
        let (empty, lists_heap_chunks) = (fd == own && bk == own, in_brk(fd) && in_brk(bk));
        if !empty && !lists_heap_chunks {
            return false;
        }
    }
    // The ring of arenas closes, through thread arenas placed as glibc places them.
    let mut next = field(NEXT);
    for _ in 0..4096 {
        if next == at {
            return true;
        }
        if next % HEAP_MAX != HEAP_INFO_SIZE || !anonymous(next) || memory.word(next - HEAP_INFO_SIZE) != Some(next) {
            return false;
        }
        match memory.word(next + NEXT) {
            Some(n) => next = n,
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_banners_version() {
        let banner = b"\0GNU C Library (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36.\n";
        assert_eq!(glibc_minor_version(banner), Some(36));
        assert_eq!(glibc_minor_version(b"no banner"), None);
    }
}
