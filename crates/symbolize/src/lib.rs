//! Symbolization: names the code addresses a trace recorded (function,
//! source file and line, inlined frames included), offline, from the ELF
//! files of the modules the trace lists.
//!
//! For: the CLI and the views, after recording. Not for: the traced process
//! (it opens and parses files and allocates freely), nor unwinding: the agent
//! records addresses, this crate only names them.
//!
//! A module's symbols come from its separate debug file
//! (`/usr/lib/debug/.build-id/…`, `.gnu_debuglink`) or its own DWARF and
//! symbol tables, and are trusted only when the file's build-id matches the
//! recorded one; otherwise its frames show `module+offset` and
//! [`Symbolizer::warnings`] says why.
//!
//! Addresses are looked up exactly as given. A return address found on the
//! stack points after the call, possibly into the next line or function: pass
//! `return_address - 1`, which lies inside the call instruction.
//!
//! ```no_run
//! # fn show(modules: &[memgap_trace::records::Module], return_addresses: &[u64]) {
//! let mut symbolizer = memgap_symbolize::Symbolizer::new(modules);
//! let call_sites: Vec<u64> = return_addresses.iter().map(|address| address - 1).collect();
//! for frames in symbolizer.symbolize_many(&call_sites) {
//!     for frame in frames {
//!         println!("{frame}"); // "parse_config at /src/config.c:42", or "libfoo.so+0x1a2b"
//!     }
//! }
//! for warning in symbolizer.warnings() {
//!     eprintln!("memgap: {warning}");
//! }
//! # }
//! ```

mod module_files;
pub mod python;
mod short_name;

use std::fmt;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized};
use memgap_trace::records::Module;
use rustc_hash::FxHashMap;

use module_files::SymbolFile;
pub use module_files::{DEFAULT_DEBUG_DIRS, Warning};
pub use short_name::short_name;

/// One function at one address. An address inside inlined code gives several
/// frames: the inlined functions, innermost first, then the function they
/// were inlined into.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    /// Demangled (C++, Rust); `None` when no trusted symbol covers the address.
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The module's path as recorded; empty when no module contains the address.
    pub module: String,
    /// `address - module base` (the ELF virtual address for PIE executables
    /// and shared libraries); the address itself when no module contains it.
    pub module_offset: u64,
    /// This function was inlined into the next frame's.
    pub inlined: bool,
    pub address: u64,
}

impl AsRef<Frame> for Frame {
    fn as_ref(&self) -> &Frame {
        self
    }
}

impl Frame {
    /// A short name for stacks and flame graphs: the function, else
    /// `libfoo.so+0x1a2b` (module file name only), else the address.
    pub fn label(&self) -> String {
        if let Some(function) = &self.function {
            function.clone()
        } else if self.module.is_empty() {
            format!("{:#x}", self.address)
        } else {
            let file_name = Path::new(&self.module).file_name().map_or(self.module.as_str(), |name| name.to_str().unwrap_or(&self.module));
            format!("{file_name}+{:#x}", self.module_offset)
        }
    }

    fn unknown(address: u64, module: Option<&Module>) -> Frame {
        Frame {
            function: None,
            file: None,
            line: None,
            module: module.map_or_else(String::new, |module| module.path.clone()),
            module_offset: module.map_or(address, |module| address - module.base),
            inlined: false,
            address,
        }
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())?;
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, " at {file}:{line}"),
            (Some(file), None) => write!(f, " at {file}"),
            _ => Ok(()),
        }
    }
}

/// Names addresses of one process image (one list of modules). Keeps every
/// result, so a stack's frames are looked up once however many stacks share
/// them, and each module's files are checked and parsed once. Not `Send`
/// (blazesym's caches use `Rc`): make one per thread.
pub struct Symbolizer {
    /// Sorted by base.
    modules: Vec<ModuleState>,
    resolver: blazesym::symbolize::Symbolizer,
    frames_by_address: FxHashMap<u64, Vec<Frame>>,
    debug_dirs: Vec<PathBuf>,
    warnings: Vec<Warning>,
}

struct ModuleState {
    module: Module,
    symbols: ModuleSymbols,
}

enum ModuleSymbols {
    NotLookedUp,
    From(SymbolFile),
    /// Missing, mismatched, unreadable, or not a file: module+offset only.
    Untrusted,
}

impl Symbolizer {
    /// Looks for separate debug files in [`DEFAULT_DEBUG_DIRS`].
    pub fn new(modules: &[Module]) -> Self {
        Self::with_debug_dirs(modules, DEFAULT_DEBUG_DIRS)
    }

    /// `debug_dirs` replaces the default directories holding `.build-id/`
    /// trees and `.gnu_debuglink` targets (the module's own directory is
    /// always searched for the latter).
    pub fn with_debug_dirs(modules: &[Module], debug_dirs: &[impl AsRef<Path>]) -> Self {
        let debug_dirs: Vec<PathBuf> = debug_dirs.iter().map(|dir| dir.as_ref().to_path_buf()).collect();
        let mut modules: Vec<ModuleState> = modules
            .iter()
            .filter(|module| module.size > 0)
            .map(|module| ModuleState { module: module.clone(), symbols: ModuleSymbols::NotLookedUp })
            .collect();
        for state in &modules {
            memgap_trace::files::note_consulted(Path::new(&state.module.path));
        }
        modules.sort_by_key(|state| state.module.base);
        let resolver = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            // The files do not change while we read them.
            .enable_auto_reload(false)
            .set_debug_dirs(Some(&debug_dirs))
            .build();
        Symbolizer { modules, resolver, frames_by_address: FxHashMap::default(), debug_dirs, warnings: Vec::new() }
    }

    /// Frames for one address, innermost inlined frame first. Never fails: an
    /// address without a trusted symbol gives one frame with module+offset
    /// (or only the address, outside every module).
    pub fn symbolize(&mut self, address: u64) -> Vec<Frame> {
        self.symbolize_many(&[address]).pop().unwrap_or_default()
    }

    /// [`Symbolizer::symbolize`] for many addresses at once (all the stacks of
    /// a trace): each module's new addresses go to the resolver in one batch.
    pub fn symbolize_many(&mut self, addresses: &[u64]) -> Vec<Vec<Frame>> {
        let mut new_addresses: Vec<u64> =
            addresses.iter().copied().filter(|address| !self.frames_by_address.contains_key(address)).collect();
        new_addresses.sort_unstable();
        new_addresses.dedup();
        // Sorted addresses fall into modules (sorted by base) in runs.
        let located: Vec<(Option<usize>, u64)> = new_addresses.iter().map(|&address| (self.module_index(address), address)).collect();
        for run in located.chunk_by(|a, b| a.0 == b.0) {
            let run_addresses: Vec<u64> = run.iter().map(|&(_, address)| address).collect();
            match run[0].0 {
                Some(index) => self.symbolize_in_module(index, &run_addresses),
                None => {
                    for address in run_addresses {
                        self.frames_by_address.insert(address, vec![Frame::unknown(address, None)]);
                    }
                }
            }
        }
        addresses.iter().map(|address| self.frames_by_address[address].clone()).collect()
    }

    /// Why some modules' frames show only module+offset, one entry per module.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    fn module_index(&self, address: u64) -> Option<usize> {
        let after = self.modules.partition_point(|state| state.module.base <= address);
        let index = after.checked_sub(1)?;
        let module = &self.modules[index].module;
        (address - module.base < module.size).then_some(index)
    }

    fn symbolize_in_module(&mut self, index: usize, addresses: &[u64]) {
        let state = &mut self.modules[index];
        if let ModuleSymbols::NotLookedUp = state.symbols {
            state.symbols = match module_files::locate(&state.module, &self.debug_dirs) {
                Ok(Some(file)) => ModuleSymbols::From(file),
                Ok(None) => ModuleSymbols::Untrusted,
                Err(warning) => {
                    self.warnings.push(warning);
                    ModuleSymbols::Untrusted
                }
            };
        }
        let module = &state.module;
        let unknown = |address: u64| vec![Frame::unknown(address, Some(module))];
        let ModuleSymbols::From(file) = &state.symbols else {
            self.frames_by_address.extend(addresses.iter().map(|&address| (address, unknown(address))));
            return;
        };
        let virtual_addresses: Vec<u64> = addresses.iter().map(|&address| file.virtual_address(module, address)).collect();
        let source = Source::Elf(Elf::new(&file.path));
        match self.resolver.symbolize(&source, Input::VirtOffset(&virtual_addresses)) {
            Ok(results) => {
                for (&address, result) in addresses.iter().zip(results) {
                    let frames = match result {
                        Symbolized::Sym(symbol) => frames_of(symbol, module, address),
                        Symbolized::Unknown(_) => unknown(address),
                    };
                    self.frames_by_address.insert(address, frames);
                }
            }
            Err(error) => {
                self.warnings.push(Warning::Unreadable { module: module.path.clone(), reason: error.to_string() });
                self.frames_by_address.extend(addresses.iter().map(|&address| (address, unknown(address))));
                state.symbols = ModuleSymbols::Untrusted;
            }
        }
    }
}

/// blazesym lists inlined functions outermost first, each with its own code
/// location (for all but the innermost, the call site of the next one); the
/// symbol's own location is the call site of the first inlined function.
fn frames_of(symbol: blazesym::symbolize::Sym<'_>, module: &Module, address: u64) -> Vec<Frame> {
    let frame = |function: &str, code_info: Option<&CodeInfo>, inlined: bool| Frame {
        // glibc's internal aliases (`__GI___libc_malloc`) name the same code as
        // the symbol without the prefix, which is the one people know.
        function: Some(function.strip_prefix("__GI_").unwrap_or(function).to_string()),
        file: code_info.map(|info| info.to_path().display().to_string()),
        line: code_info.and_then(|info| info.line),
        module: module.path.clone(),
        module_offset: address - module.base,
        inlined,
        address,
    };
    let mut frames: Vec<Frame> =
        symbol.inlined.iter().rev().map(|inlined| frame(&inlined.name, inlined.code_info.as_ref(), true)).collect();
    frames.push(frame(&symbol.name, symbol.code_info.as_deref(), false));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(path: &str, base: u64, size: u64) -> Module {
        Module { path: path.to_string(), base, size, build_id: Vec::new() }
    }

    #[test]
    fn labels_and_display() {
        let mut frame = Frame::unknown(0x7f00_0000_1234, Some(&module("/usr/lib/libfoo.so.1", 0x7f00_0000_0000, 0x10000)));
        assert_eq!(frame.label(), "libfoo.so.1+0x1234");
        assert_eq!(frame.to_string(), "libfoo.so.1+0x1234");
        frame.function = Some("parse_config".to_string());
        frame.file = Some("/src/config.c".to_string());
        frame.line = Some(42);
        assert_eq!(frame.to_string(), "parse_config at /src/config.c:42");
        assert_eq!(Frame::unknown(0x10, None).to_string(), "0x10");
    }

    #[test]
    fn finds_the_module_holding_an_address() {
        // Unsorted, with a gap and an empty module (never matches).
        let modules = [module("/b", 0x3000, 0x1000), module("/a", 0x1000, 0x1000), module("/empty", 0x1800, 0)];
        let symbolizer = Symbolizer::with_debug_dirs(&modules, &[] as &[&str]);
        let path_at = |address| symbolizer.module_index(address).map(|index| symbolizer.modules[index].module.path.as_str());
        assert_eq!(path_at(0x0fff), None);
        assert_eq!(path_at(0x1000), Some("/a"));
        assert_eq!(path_at(0x1fff), Some("/a"));
        assert_eq!(path_at(0x2000), None);
        assert_eq!(path_at(0x3abc), Some("/b"));
        assert_eq!(path_at(0x4000), None);
    }
}
