//! What the agent learns about its process: configuration from the
//! environment `memgap run` prepared, the trace path, and the facts recorded
//! once per trace (command line, modules with build-ids).

use core::ffi::{CStr, c_char, c_int, c_void};

use memgap_trace::records::{Module, Process};

use memgap_trace::shared::DEFAULT_BUFFER_MB;
use memgap_trace::vocabulary::env as protocol;

use crate::{clock, sys};

/// Settings passed by `memgap run` through the environment.
pub struct Config {
    /// The run's private directory, where each process image makes its area.
    pub area_dir: Vec<u8>,
    pub run_id: u64,
    pub follow: bool,
    pub buffer_bytes: usize,
    pub stacks: StackMode,
    /// Frames kept per stack at most.
    pub stack_depth: usize,
    /// Python frames in stacks, when the process is a CPython the agent knows.
    pub python_stacks: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackMode {
    None,
    /// DWARF call frame information (.eh_frame): right for any code.
    Dwarf,
    /// Frame pointers: ~4x cheaper, for programs built with them.
    FramePointers,
}

fn env(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated.
    let value = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: getenv returned a NUL-terminated string of the environment, which
    // the agent reads before the program could change it (at start, or in a
    // fork child copying its parent's).
    (!value.is_null()).then(|| unsafe { CStr::from_ptr(value) }.to_bytes())
}

fn env_number(name: &CStr, radix: u32) -> Option<u64> {
    u64::from_str_radix(core::str::from_utf8(env(name)?).ok()?, radix).ok()
}

impl Config {
    /// `None` when the agent was loaded without `memgap run` (nothing to do)
    /// or the environment is not set up yet (very early in process start).
    pub fn from_env() -> Option<Config> {
        let area_dir = env(protocol::AREA_DIR.c_name())?.to_vec();
        if area_dir.is_empty() {
            return None;
        }
        Some(Config {
            area_dir,
            run_id: env_number(protocol::RUN_ID.c_name(), 16).unwrap_or(0),
            follow: env(protocol::FOLLOW.c_name()) != Some(protocol::FOLLOW_OFF.as_bytes()),
            stacks: match env(protocol::STACKS.c_name()) {
                Some(b"0") => StackMode::None,
                Some(mode) if mode == protocol::STACKS_NONE.as_bytes() => StackMode::None,
                Some(mode) if mode == protocol::STACKS_FRAME_POINTERS.as_bytes() => StackMode::FramePointers,
                _ => StackMode::Dwarf,
            },
            stack_depth: env_number(protocol::STACK_DEPTH.c_name(), 10).unwrap_or(64).clamp(1, 256) as usize,
            python_stacks: env(protocol::PYTHON_STACKS.c_name()) != Some(protocol::PYTHON_STACKS_OFF.as_bytes()),
            // Enough for bursts; more only adds to the program's RSS when
            // the recorder falls behind for good (4 threads on 2 CPUs: a 128
            // MiB pool filled up, and the run took no less time than with 32).
            buffer_bytes: (env_number(protocol::BUFFER_MB.c_name(), 10).unwrap_or(DEFAULT_BUFFER_MB).clamp(1, 16_384) as usize) << 20,
        })
    }
}

pub fn describe(config: &Config, image: u32, start_time: u64) -> Process {
    let cmdline = sys::read_file(c"/proc/self/cmdline");
    let argv = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let mut exe = [0u8; 4096];
    // SAFETY: `exe` is writable for its length; readlink writes no NUL.
    let n = unsafe { libc::readlink(c"/proc/self/exe".as_ptr(), exe.as_mut_ptr() as *mut c_char, exe.len()) };
    Process {
        pid: sys::getpid(),
        ppid: sys::getppid(),
        run_id: config.run_id,
        image,
        clock: clock::kind(),
        start_time,
        start_monotonic_ns: clock::monotonic_ns(),
        start_realtime_ns: clock::realtime_ns(),
        // SAFETY: no precondition.
        page_size: unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64,
        // SAFETY: no precondition.
        cpu_count: unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32,
        exe: if n > 0 { String::from_utf8_lossy(&exe[..n as usize]).into_owned() } else { String::new() },
        argv,
    }
}

/// Every loaded ELF object with its load address, extent and GNU build-id,
/// so stacks can be symbolized offline against the right files.
pub fn loaded_modules() -> Vec<Module> {
    let mut modules: Vec<Module> = Vec::new();
    crate::loader::agent_iterate(visit_module, &mut modules as *mut Vec<Module> as *mut c_void);
    modules
}

/// # Safety
/// A dl_iterate_phdr callback: `info` valid for the call, `data` the
/// `Vec<Module>` `loaded_modules` passes, borrowed by nothing else.
unsafe extern "C" fn visit_module(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `Vec<Module>` `loaded_modules` passes, borrowed by
    // nothing else during the iteration.
    let modules = unsafe { &mut *(data as *mut Vec<Module>) };
    // SAFETY: the loader passes a valid entry for the duration of the call.
    let info = unsafe { &*info };
    // SAFETY: the loader's NUL-terminated module name.
    let name = if info.dlpi_name.is_null() { &b""[..] } else { unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes() };
    let path = if name.is_empty() && modules.is_empty() {
        let mut exe = [0u8; 4096];
        // SAFETY: `exe` is writable for its length; readlink writes no NUL.
        let n = unsafe { libc::readlink(c"/proc/self/exe".as_ptr(), exe.as_mut_ptr() as *mut c_char, exe.len()) };
        String::from_utf8_lossy(&exe[..n.max(0) as usize]).into_owned()
    } else {
        String::from_utf8_lossy(name).into_owned()
    };
    // SAFETY: the loader's program headers of this module, `dlpi_phnum` of them.
    let headers = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let mut low = u64::MAX;
    let mut high = 0u64;
    let mut build_id = Vec::new();
    for header in headers {
        if header.p_type == libc::PT_LOAD {
            low = low.min(header.p_vaddr);
            high = high.max(header.p_vaddr + header.p_memsz);
        } else if header.p_type == libc::PT_NOTE && build_id.is_empty() {
            let start = (info.dlpi_addr + header.p_vaddr) as *const u8;
            // SAFETY: the module's PT_NOTE segment, inside one of its loaded segments.
            let notes = unsafe { core::slice::from_raw_parts(start, header.p_memsz as usize) };
            build_id = find_build_id(notes).unwrap_or_default();
        }
    }
    if low == u64::MAX {
        low = 0;
    }
    modules.push(Module { path, base: info.dlpi_addr + low, size: high.saturating_sub(low), build_id });
    0
}

/// Finds NT_GNU_BUILD_ID in a PT_NOTE segment (4-byte aligned note entries).
fn find_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |b: &[u8], i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
    while notes.len() >= 12 {
        let (name_len, desc_len, kind) = (word(notes, 0) as usize, word(notes, 4) as usize, word(notes, 8));
        let name_end = 12 + name_len.next_multiple_of(4);
        let desc_end = name_end + desc_len.next_multiple_of(4);
        if desc_end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && &notes[12..12 + name_len] == b"GNU\0" {
            return Some(notes[name_end..name_end + desc_len].to_vec());
        }
        notes = &notes[desc_end..];
    }
    None
}

/// Removes the agent from LD_PRELOAD in place (no allocation), so programs
/// this one starts run untraced (`--no-follow`).
pub fn remove_self_from_ld_preload() {
    // SAFETY: a NUL-terminated name.
    let value = unsafe { libc::getenv(c"LD_PRELOAD".as_ptr()) } as *mut u8;
    if value.is_null() {
        return;
    }
    // SAFETY: getenv's NUL-terminated string.
    let len = unsafe { libc::strlen(value as *const c_char) };
    // SAFETY: the environment string is writable memory of the process (the
    // initial stack, or what setenv allocated), `len` bytes before its NUL, and
    // the agent holds no other reference to it while it edits it.
    let bytes = unsafe { core::slice::from_raw_parts_mut(value, len) };
    let mut kept = 0;
    let mut start = 0;
    while start < len {
        let end = bytes[start..].iter().position(|&b| b == b':' || b == b' ').map_or(len, |i| start + i);
        let entry_is_agent = bytes[start..end].ends_with(b"libmemgap_agent.so");
        if !entry_is_agent && end > start {
            if kept > 0 {
                bytes[kept] = b':';
                kept += 1;
            }
            bytes.copy_within(start..end, kept);
            kept += end - start;
        }
        start = end + 1;
    }
    // SAFETY: `kept <= len`: at most the NUL's own place.
    unsafe { *value.add(kept) = 0 };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_our_own_build_id() {
        let modules = loaded_modules();
        assert!(modules.len() > 2);
        assert!(modules.iter().any(|m| m.path.contains("libc.so") && m.build_id.len() == 20));
    }
}
