//! Finding the file to read a module's symbols from, and deciding whether to
//! trust it: a file rebuilt since the trace was taken would name the wrong
//! functions with full confidence, which is worse than naming none.

use std::io;
use std::path::{Path, PathBuf};

use memgap_trace::records::Module;
use object::{Object, ObjectSegment};

/// Where blazesym looks by default, and where Debian's `-dbgsym`/`-dbg`
/// packages install `.build-id/xx/yyyy.debug` files.
pub const DEFAULT_DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

/// Why a module's frames show only module+offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Warning {
    #[error("{module}: file not found and no debug file for its build-id; its frames show module+offset only")]
    Missing { module: String },
    #[error(
        "{module}: build-id {found} differs from the recorded {recorded} (rebuilt or upgraded since the trace was taken?); \
         its frames show module+offset only"
    )]
    BuildIdMismatch { module: String, recorded: String, found: String },
    #[error("{module}: cannot read its symbols ({reason}); its frames show module+offset only")]
    Unreadable { module: String, reason: String },
}

/// A file whose symbols belong to the module, and how to turn a runtime
/// address into the virtual address the file's symbols and DWARF use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolFile {
    pub path: PathBuf,
    /// p_vaddr of the lowest PT_LOAD: the recorded base is where that
    /// segment was loaded, so `address - base + lowest_segment_address` is the
    /// file's virtual address (0 for PIE and shared libraries).
    pub lowest_segment_address: u64,
}

impl SymbolFile {
    pub fn virtual_address(&self, module: &Module, address: u64) -> u64 {
        address - module.base + self.lowest_segment_address
    }
}

/// The separate debug file named by the recorded build-id when there is one,
/// else the module's own file if it is there and its build-id matches the
/// recorded one. blazesym follows `.gnu_debuglink` from the module's file by
/// itself, but looks in build-id directories only for files that carry a
/// debuglink; looking here first also works when the module's file is gone or
/// was replaced since the trace was taken.
///
/// `Ok(None)`: the module is not a file (the vDSO, `linux-vdso.so.1`), which
/// is no reason to warn.
pub fn locate(module: &Module, debug_dirs: &[PathBuf]) -> Result<Option<SymbolFile>, Warning> {
    if !module.path.contains('/') {
        return Ok(None);
    }
    for candidate in build_id_debug_files(&module.build_id, debug_dirs) {
        if let Ok(facts) = ElfFacts::read(&candidate)
            && facts.build_id.as_deref() == Some(&module.build_id[..])
        {
            return Ok(Some(SymbolFile { path: candidate, lowest_segment_address: facts.lowest_segment_address }));
        }
    }
    check_own_file(module).map(Some)
}

fn check_own_file(module: &Module) -> Result<SymbolFile, Warning> {
    let path = Path::new(&module.path);
    let facts = ElfFacts::read(path).map_err(|error| match error.kind() {
        io::ErrorKind::NotFound => Warning::Missing { module: module.path.clone() },
        _ => Warning::Unreadable { module: module.path.clone(), reason: error.to_string() },
    })?;
    // An empty recorded build-id (a module linked without one) cannot be
    // checked; trusting the file is the best we can do.
    if !module.build_id.is_empty() && facts.build_id.as_deref() != Some(&module.build_id[..]) {
        return Err(Warning::BuildIdMismatch {
            module: module.path.clone(),
            recorded: hex(&module.build_id),
            found: facts.build_id.as_deref().map_or_else(|| "none".to_string(), hex),
        });
    }
    Ok(SymbolFile { path: path.to_path_buf(), lowest_segment_address: facts.lowest_segment_address })
}

/// `<dir>/.build-id/ab/cdef….debug`, the layout gdb and Debian use.
fn build_id_debug_files(build_id: &[u8], debug_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let Some((first, rest)) = build_id.split_first() else { return Vec::new() };
    let relative = Path::new(".build-id").join(format!("{first:02x}")).join(format!("{}.debug", hex(rest)));
    debug_dirs.iter().map(|dir| dir.join(&relative)).filter(|path| path.is_file()).collect()
}

struct ElfFacts {
    build_id: Option<Vec<u8>>,
    lowest_segment_address: u64,
}

impl ElfFacts {
    /// Reads only the headers and notes, not the whole (possibly huge) file.
    fn read(path: &Path) -> io::Result<ElfFacts> {
        // A trace names the files; a FIFO or device among them (a corrupt or
        // hostile trace) would block the open or never end.
        let cache = object::ReadCache::new(memgap_trace::files::open_regular(path)?);
        let elf = object::File::parse(&cache).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        let lowest_segment_address = elf.segments().map(|segment| segment.address()).min().unwrap_or(0);
        let build_id = elf.build_id().ok().flatten().map(<[u8]>::to_vec);
        Ok(ElfFacts { build_id, lowest_segment_address })
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_or_device_named_as_a_module_is_refused_without_opening_it() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("module.so");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
        assert!(status.success());
        for path in [fifo.to_string_lossy().into_owned(), "/dev/zero".to_string()] {
            let module = Module { path: path.clone(), base: 0x1000, size: 0x1000, build_id: Vec::new() };
            // Opening the FIFO for reading would block this test forever.
            assert!(matches!(locate(&module, &[]), Err(Warning::Unreadable { .. })), "{path}");
        }
    }
}
