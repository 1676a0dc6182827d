//! The statistics of an allocator linked into a running process (jemalloc,
//! tcmalloc, mimalloc, statically or as a library), read by making the
//! process call the allocator's own introspection, as `memgap trim` calls
//! malloc_trim: jemalloc's `mallctl` (an `epoch` refresh, then `stats.*`),
//! tcmalloc's `MallocExtension_GetNumericProperty`, mimalloc's
//! `mi_process_info` (the one figure a release build of mimalloc keeps
//! without MI_STAT: the bytes it has committed). The strings and result
//! words of each call sit in a scratch area below the stopped thread's red
//! zone; one thread is held for all the calls, then let go.
//!
//! A thread is used only if none of its frames is in the allocator's code:
//! one stopped inside the allocator (or in a system call the allocator
//! made) may hold a lock the call would wait for forever. The frames are
//! walked with the unwind tables of the modules mapped; from a frame the
//! tables do not describe on, every word of its stack up to [`STACK_SCAN`]
//! above its stack pointer counts as a return address (stale words only
//! make the check refuse a thread it could have used: a walk is needed for
//! a program whose constructors called the allocator before `main`, which
//! leaves such words below `main`'s frame for good).

use std::time::Duration;

use memgap_trace::records::Mapping;
use memgap_types::allocator_stats::{AllocatorStats, ArenaPages};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::error::{AttachError, field};
use crate::modules::{file_name, open_mapped};
use crate::procfs::ThreadInfo;
use crate::remote_call;
use crate::stack_frames::StackFrames;
use crate::tracee::StoppedThread;
use crate::trim::{SIGSEGV_BIT, STACK_ROOM, TerminationSignalsBlocked, candidates};

/// How far above the stack pointer return addresses are looked for.
const STACK_SCAN: u64 = 128 << 10;
/// jemalloc's name for "all arenas merged" in `stats.arenas.<i>.*`.
const MALLCTL_ARENAS_ALL: u32 = 4096;
/// Arenas whose dirty and muzzy pages are read one by one.
const ARENAS_LISTED: u32 = 16;
/// Rounds over the threads before giving up, and the pause between them.
const ROUNDS: u32 = 20;
const PAUSE: Duration = Duration::from_millis(10);
/// How long one call may take: these calls take no lock for long.
const PATIENCE: Duration = Duration::from_secs(5);

/// An allocator found in a process's executable or libraries, with the
/// addresses memgap calls.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkedAllocator {
    /// "jemalloc", "tcmalloc" or "mimalloc".
    pub name: &'static str,
    /// The file it is in (the program itself when linked statically).
    pub file: String,
    pub statically_linked: bool,
    /// jemalloc's `mallctl` (whatever its prefix: `_rjem_`, `je_`, none).
    mallctl: Option<u64>,
    /// tcmalloc's `MallocExtension_GetNumericProperty`.
    numeric_property: Option<u64>,
    /// mimalloc's `mi_process_info`.
    process_info: Option<u64>,
    /// The allocator's code, from its lowest function to the end of its highest.
    code: (u64, u64),
}

impl LinkedAllocator {
    /// Why memgap has no call to ask this allocator for its figures, if it has none.
    pub fn no_call_because(&self) -> Option<String> {
        if self.mallctl.is_some() || self.numeric_property.is_some() || self.process_info.is_some() {
            return None;
        }
        let call = match self.name {
            "mimalloc" => "mi_process_info",
            "tcmalloc" => "MallocExtension_GetNumericProperty",
            _ => "mallctl",
        };
        Some(if self.code.0 > self.code.1 {
            format!("{} carries no symbols (stripped): {} cannot be found to call; its figures are not known", self.file, call)
        } else {
            format!("{} has no {call} (the linker leaves it out of a program that never calls it); its figures are not known", self.file)
        })
    }
}

/// The jemalloc prefixes: tikv-jemallocator's, jemalloc's own private
/// namespace (`--with-jemalloc-prefix=je_`), and none.
const JEMALLOC_PREFIXES: [&str; 3] = ["_rjem_", "je_", ""];

/// What an ELF image's symbol tables say about the allocator it defines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocatorSymbols {
    /// "jemalloc", "tcmalloc" or "mimalloc".
    pub name: &'static str,
    pub mallctl: Option<u64>,
    pub numeric_property: Option<u64>,
    pub process_info: Option<u64>,
    /// From its lowest function to the end of its highest.
    pub code: (u64, u64),
}

/// The allocator defined by an ELF image (its symbol tables), with its
/// addresses relocated by `base`.
pub fn allocator_in(data: &[u8], base: u64) -> Option<AllocatorSymbols> {
    let elf = object::File::parse(data).ok()?;
    let mut functions: Vec<(String, u64, u64)> = Vec::new();
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        if symbol.kind() != SymbolKind::Text || !symbol.is_definition() || symbol.address() == 0 {
            continue;
        }
        if let Ok(name) = symbol.name() {
            functions.push((name.to_string(), symbol.address(), symbol.size()));
        }
    }
    let find = |name: &str| functions.iter().find(|(n, ..)| n == name).map(|&(_, address, _)| address + base);
    let range = |belongs: &dyn Fn(&str) -> bool| {
        let mut code = (u64::MAX, 0);
        for (_, address, size) in functions.iter().filter(|(n, ..)| belongs(n)) {
            code.0 = code.0.min(address + base);
            code.1 = code.1.max(address + base + size.max(&1));
        }
        code
    };
    for prefix in JEMALLOC_PREFIXES {
        let (Some(mallctl), Some(_)) = (find(&format!("{prefix}mallctl")), find(&format!("{prefix}mallctlnametomib"))) else { continue };
        let private = format!("{prefix}je_");
        let code = range(&|n: &str| n.starts_with(&private) || (!prefix.is_empty() && n.starts_with(prefix)) || n.starts_with("je_"));
        return Some(AllocatorSymbols { name: "jemalloc", mallctl: Some(mallctl), numeric_property: None, process_info: None, code });
    }
    if let Some(numeric) = find("MallocExtension_GetNumericProperty") {
        let code = range(&|n: &str| n.contains("tcmalloc") || n.starts_with("tc_") || n.contains("MallocExtension"));
        return Some(AllocatorSymbols { name: "tcmalloc", mallctl: None, numeric_property: Some(numeric), process_info: None, code });
    }
    if find("tc_malloc").is_some() {
        let code = range(&|n: &str| n.contains("tcmalloc") || n.starts_with("tc_"));
        return Some(AllocatorSymbols { name: "tcmalloc", mallctl: None, numeric_property: None, process_info: None, code });
    }
    // The linker keeps only what the program reaches: Rust's `mimalloc`
    // crate calls `mi_malloc_aligned` and `mi_free`, never `mi_malloc`, and
    // keeps `mi_process_info` only when the program calls it. `mi_free` and
    // mimalloc's internal `_mi_` functions are in every build.
    let internal = || functions.iter().any(|(n, ..)| n.starts_with("_mi_"));
    let public = find("mi_stats_merge").is_some() || find("mi_process_info").is_some();
    if find("mi_free").is_some() && (public || internal()) {
        let code = range(&|n: &str| n.starts_with("mi_") || n.starts_with("_mi_"));
        return Some(AllocatorSymbols {
            name: "mimalloc",
            mallctl: None,
            numeric_property: None,
            process_info: find("mi_process_info"),
            code,
        });
    }
    // Stripped of its symbols, a static mimalloc still carries its messages.
    if functions.is_empty() && carries_mimallocs_messages(&elf) {
        return Some(AllocatorSymbols { name: "mimalloc", mallctl: None, numeric_property: None, process_info: None, code: (u64::MAX, 0) });
    }
    None
}

/// Whether the image's read-only data holds mimalloc's message about a bad
/// `MIMALLOC_*` variable (in every release since 1.6). Its second half is
/// kept reversed, so that memgap's own binary never holds the text whole.
fn carries_mimallocs_messages(elf: &object::File) -> bool {
    const HEAD: &[u8] = b"environment option mimalloc";
    const TAIL_REVERSED: &[u8] = b".eulav dilavni na sah s%_";
    let tail_follows = |rest: &[u8]| rest.len() >= TAIL_REVERSED.len() && rest.iter().zip(TAIL_REVERSED.iter().rev()).all(|(a, b)| a == b);
    elf.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".rodata")))
        .filter_map(|s| s.data().ok())
        .any(|data| data.windows(HEAD.len()).enumerate().any(|(at, window)| window == HEAD && tail_follows(&data[at + HEAD.len()..])))
}

/// Where the image mapped from `mapping` (its first mapping, offset 0) was
/// loaded: its address minus the ELF's lowest loaded address.
fn load_base(data: &[u8], mapping: &Mapping) -> Option<u64> {
    let elf = object::File::parse(data).ok()?;
    let lowest = elf.segments().filter(|s| s.file_range().0 == 0).map(|s| s.address()).min()?;
    Some(mapping.start.wrapping_sub(lowest & !0xfff))
}

/// The allocator linked into process `pid`: in its executable (statically
/// linked), else a jemalloc, tcmalloc or mimalloc library it maps.
pub fn linked_allocator(pid: u32, mappings: &[Mapping]) -> Option<LinkedAllocator> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok().map(|p| p.to_string_lossy().trim_end_matches(" (deleted)").to_string());
    let mut objects: Vec<&Mapping> = Vec::new();
    for mapping in mappings.iter().filter(|m| m.inode != 0 && m.offset == 0) {
        let is_exe = exe.as_deref().is_some_and(|exe| mapping.name.trim_end_matches(" (deleted)") == exe);
        let is_allocator_library = ["libjemalloc", "libtcmalloc", "libmimalloc"].iter().any(|p| file_name(mapping).starts_with(p));
        if (is_exe || is_allocator_library) && !objects.iter().any(|o| o.inode == mapping.inode) {
            objects.push(mapping);
        }
    }
    // The executable first: a static allocator serves the program's calls.
    objects.sort_by_key(|m| exe.as_deref() != Some(m.name.trim_end_matches(" (deleted)")));
    for mapping in objects {
        let Ok(data) = open_mapped(pid, mapping) else { continue };
        let Some(base) = load_base(&data, mapping) else { continue };
        if let Some(AllocatorSymbols { name, mallctl, numeric_property, process_info, code }) = allocator_in(&data, base) {
            let statically_linked = exe.as_deref() == Some(mapping.name.trim_end_matches(" (deleted)"));
            return Some(LinkedAllocator {
                name,
                file: mapping.name.clone(),
                statically_linked,
                mallctl,
                numeric_property,
                process_info,
                code,
            });
        }
    }
    None
}

/// Makes process `pid` report `allocator`'s statistics. `Ok(None)`: this
/// allocator has no introspection call memgap knows (a mimalloc whose
/// `mi_process_info` the linker left out).
pub fn read_stats(pid: u32, allocator: &LinkedAllocator, mappings: &[Mapping]) -> Result<Option<AllocatorStats>, AttachError> {
    if allocator.mallctl.is_none() && allocator.numeric_property.is_none() && allocator.process_info.is_none() {
        return Ok(None);
    }
    if mappings.iter().any(|m| m.start == 0) {
        return Err(AttachError::Unsuitable { pid, state: "has page 0 mapped, where memgap's call returns to".into() });
    }
    let frames = StackFrames::load(pid, mappings);
    let _signals = TerminationSignalsBlocked::new();
    let mut refusals = 0;
    for round in 0..ROUNDS {
        if round > 0 {
            std::thread::sleep(PAUSE);
        }
        for candidate in candidates(pid, None)? {
            match try_thread(pid, &candidate, allocator, mappings, &frames)? {
                Some(stats) => return Ok(Some(stats)),
                None => refusals += 1,
            }
        }
    }
    Err(AttachError::Failed(format!(
        "no thread of process {pid} was outside {} in {ROUNDS} rounds ({refusals} refusals); try again",
        allocator.name
    )))
}

/// Reads the statistics on `thread` if it is outside the allocator.
fn try_thread(
    pid: u32,
    thread: &ThreadInfo,
    allocator: &LinkedAllocator,
    mappings: &[Mapping],
    frames: &StackFrames,
) -> Result<Option<AllocatorStats>, AttachError> {
    let task = std::fs::read_to_string(format!("/proc/{pid}/task/{}/status", thread.tid)).unwrap_or_default();
    let mask = |key| field(&task, key).and_then(|v| u64::from_str_radix(v, 16).ok()).unwrap_or(0);
    if (mask("SigBlk") | mask("SigIgn")) & SIGSEGV_BIT != 0 {
        return Ok(None);
    }
    let Some(mut stopped) = StoppedThread::stop(pid, thread.tid)? else { return Ok(None) };
    let regs = stopped.registers()?;
    let stack = mappings.iter().find(|m| m.start <= regs.rsp && regs.rsp < m.end);
    let roomy = stack.is_some_and(|m| m.name == "[stack]" || regs.rsp - m.start >= STACK_ROOM);
    let inside = |address: u64| allocator.code.0 <= address && address < allocator.code.1;
    let stack_top = stack.map_or(regs.rsp, |m| m.end).min(regs.rsp.saturating_add(STACK_SCAN));
    if !roomy || in_allocator(pid, frames, &regs, stack_top, &inside) {
        stopped.detach()?;
        return Ok(None);
    }
    let stats = match (allocator.mallctl, allocator.numeric_property, allocator.process_info) {
        (Some(mallctl), ..) => jemalloc_stats(&mut stopped, mallctl),
        (None, Some(property), _) => tcmalloc_stats(&mut stopped, property),
        (None, None, Some(process_info)) => mimalloc_stats(&mut stopped, process_info),
        (None, None, None) => Ok(AllocatorStats::default()),
    };
    let detached = stopped.detach();
    let mut stats = stats?;
    detached?;
    stats.allocator = allocator.name.to_string();
    Ok(Some(stats))
}

/// Whether the stopped thread runs in the allocator or was called from it:
/// its frames walked with the modules' unwind tables, and where the walk
/// stops short, every word of the rest of its stack taken for a return
/// address.
fn in_allocator(pid: u32, frames: &StackFrames, regs: &libc::user_regs_struct, stack_top: u64, inside: &dyn Fn(u64) -> bool) -> bool {
    let words = stack_words(pid, regs.rsp, stack_top);
    let read = |at: u64| {
        let index = at.checked_sub(regs.rsp)? / 8;
        (at % 8 == regs.rsp % 8).then(|| words.get(index as usize).copied()).flatten()
    };
    let walk = frames.walk(regs.rip, regs.rsp, regs.rbp, read);
    if walk.pcs.iter().any(|&pc| inside(pc)) {
        return true;
    }
    walk.unwalked_from.is_some_and(|sp| words.iter().skip((sp.saturating_sub(regs.rsp) / 8) as usize).any(|&w| inside(w)))
}

/// The words of `pid`'s memory from `from` to `to`, read in one go.
fn stack_words(pid: u32, from: u64, to: u64) -> Vec<u64> {
    let len = to.saturating_sub(from) as usize & !7;
    let mut buffer = vec![0u8; len];
    let local = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: len };
    let remote = libc::iovec { iov_base: from as *mut libc::c_void, iov_len: len };
    // SAFETY: reads into our own buffer of `len` bytes.
    let read = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    buffer.truncate(read.max(0) as usize & !7);
    buffer.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect()
}

/// The scratch area of one call: a NUL-terminated name at 0, a result word
/// at [`VALUE`], its length at [`LENGTH`].
const VALUE: usize = 64;
const LENGTH: usize = 72;
const SCRATCH: usize = 80;

fn scratch_with(name: &str, value: u64, length: u64) -> Option<[u8; SCRATCH]> {
    if name.len() >= VALUE {
        return None;
    }
    let mut scratch = [0u8; SCRATCH];
    scratch[..name.len()].copy_from_slice(name.as_bytes());
    scratch[VALUE..LENGTH].copy_from_slice(&value.to_le_bytes());
    scratch[LENGTH..].copy_from_slice(&length.to_le_bytes());
    Some(scratch)
}

fn word_at(scratch: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(scratch[at..at + 8].try_into().expect("8 bytes"))
}

fn never_abandon(_: &StoppedThread, _: &libc::user_regs_struct) -> bool {
    false
}

/// `mallctl(name, &value, &length, write ? &value : NULL, write ? length : 0)`
/// with a `length`-byte value; None when jemalloc refuses the name (built
/// without statistics, an arena that does not exist).
fn mallctl(thread: &mut StoppedThread, function: u64, name: &str, length: u64, write: Option<u64>) -> Result<Option<u64>, AttachError> {
    let Some(mut scratch) = scratch_with(name, write.unwrap_or(0), length) else { return Ok(None) };
    let arguments = |base: u64| match write {
        Some(_) => vec![base, base + VALUE as u64, base + LENGTH as u64, base + VALUE as u64, length],
        None => vec![base, base + VALUE as u64, base + LENGTH as u64, 0, 0],
    };
    let returned = remote_call::call_with_scratch(thread, function, &mut scratch, &arguments, PATIENCE, &never_abandon)?;
    if returned.value as u32 != 0 || word_at(&scratch, LENGTH) != length {
        return Ok(None);
    }
    let value = word_at(&scratch, VALUE);
    Ok(Some(if length == 4 { value & 0xffff_ffff } else { value }))
}

fn jemalloc_stats(thread: &mut StoppedThread, function: u64) -> Result<AllocatorStats, AttachError> {
    // The statistics are a copy jemalloc refreshes when the epoch is advanced.
    if mallctl(thread, function, "epoch", 8, Some(1))?.is_none() {
        return Err(AttachError::Failed("jemalloc's mallctl(\"epoch\") failed: not jemalloc 3 or later?".into()));
    }
    let mut read = |name: &str| mallctl(thread, function, name, 8, None);
    let mut stats = AllocatorStats {
        allocated_bytes: read("stats.allocated")?,
        active_bytes: read("stats.active")?,
        resident_bytes: read("stats.resident")?,
        metadata_bytes: read("stats.metadata")?,
        retained_bytes: read("stats.retained")?,
        mapped_bytes: read("stats.mapped")?,
        ..AllocatorStats::default()
    };
    let page = read("arenas.page")?.unwrap_or(4096);
    let pages = |name: String, thread: &mut StoppedThread| mallctl(thread, function, &name, 8, None).map(|p| p.map(|p| p * page));
    stats.dirty_bytes = pages(format!("stats.arenas.{MALLCTL_ARENAS_ALL}.pdirty"), thread)?;
    stats.muzzy_bytes = pages(format!("stats.arenas.{MALLCTL_ARENAS_ALL}.pmuzzy"), thread)?;
    let arenas = mallctl(thread, function, "arenas.narenas", 4, None)?;
    stats.arenas = arenas;
    for arena in 0..arenas.unwrap_or(0).min(u64::from(ARENAS_LISTED)) as u32 {
        // Arenas not yet initialised have no statistics: skipped.
        let (Some(dirty), Some(muzzy)) =
            (pages(format!("stats.arenas.{arena}.pdirty"), thread)?, pages(format!("stats.arenas.{arena}.pmuzzy"), thread)?)
        else {
            continue;
        };
        stats.arena_pages.push(ArenaPages { arena, dirty_bytes: dirty, muzzy_bytes: muzzy });
    }
    Ok(stats)
}

/// gperftools' `MallocExtension_GetNumericProperty(name, &value)`, 1 on success.
fn tcmalloc_stats(thread: &mut StoppedThread, function: u64) -> Result<AllocatorStats, AttachError> {
    let mut property = |name: &str| -> Result<Option<u64>, AttachError> {
        let Some(mut scratch) = scratch_with(name, 0, 0) else { return Ok(None) };
        let arguments = |base: u64| vec![base, base + VALUE as u64];
        let returned = remote_call::call_with_scratch(thread, function, &mut scratch, &arguments, PATIENCE, &never_abandon)?;
        Ok((returned.value as u32 != 0).then(|| word_at(&scratch, VALUE)))
    };
    let allocated = property("generic.current_allocated_bytes")?;
    let heap_size = property("generic.heap_size")?;
    let free = property("tcmalloc.pageheap_free_bytes")?;
    let unmapped = property("tcmalloc.pageheap_unmapped_bytes")?;
    Ok(AllocatorStats {
        allocated_bytes: allocated,
        // What the heap holds mapped and resident, less its free spans: the
        // pages of objects, with the caches' free objects on them.
        active_bytes: match (heap_size, free, unmapped) {
            (Some(h), Some(f), Some(u)) => Some(h.saturating_sub(f + u)),
            _ => None,
        },
        resident_bytes: heap_size.zip(unmapped).map(|(h, u)| h.saturating_sub(u)),
        dirty_bytes: free,
        retained_bytes: unmapped,
        mapped_bytes: heap_size,
        ..AllocatorStats::default()
    })
}

/// mimalloc's `mi_process_info(elapsed, user, system, current_rss, peak_rss,
/// current_commit, peak_commit, page_faults)`, every pointer but
/// `current_commit` NULL (it skips those; the last two go on the stack).
/// That figure is its `_mi_stats_main.committed`, which mimalloc keeps in
/// every build: its OS layer counts each commit and decommit there, not in
/// a thread's own statistics. Its RSS figures are the kernel's (or, on
/// Linux, the commit again), so they are not asked for.
fn mimalloc_stats(thread: &mut StoppedThread, function: u64) -> Result<AllocatorStats, AttachError> {
    // A sentinel: a mimalloc that did not write it left the figure out.
    let mut scratch = [0xffu8; 8];
    let arguments = |base: u64| vec![0, 0, 0, 0, 0, base, 0, 0];
    remote_call::call_with_scratch(thread, function, &mut scratch, &arguments, PATIENCE, &never_abandon)?;
    let committed = Some(word_at(&scratch, 0)).filter(|&w| w != u64::MAX);
    Ok(AllocatorStats { mapped_bytes: committed, ..AllocatorStats::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_no_allocator_in_memgaps_own_test_binary() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(allocator_in(&exe, 0).map(|a| a.name), None);
    }

    #[test]
    fn scratch_holds_name_value_and_length() {
        let s = scratch_with("stats.allocated", 1, 8).unwrap();
        assert_eq!(&s[..16], b"stats.allocated\0");
        assert_eq!((word_at(&s, VALUE), word_at(&s, LENGTH)), (1, 8));
        assert!(scratch_with(&"x".repeat(VALUE), 0, 8).is_none());
    }
}
