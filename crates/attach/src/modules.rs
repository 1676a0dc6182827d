//! Which libraries a process has mapped, and whose malloc it calls.

use std::os::unix::fs::MetadataExt;

use memgap_trace::records::Mapping;
use memmap2::Mmap;
use object::{Object, ObjectSymbol};

use crate::error::AttachError;

/// Allocators that replace glibc's malloc when loaded (preloaded or linked).
const OTHER_ALLOCATORS: [(&str, &str); 3] = [("libjemalloc", "jemalloc"), ("libtcmalloc", "tcmalloc"), ("libmimalloc", "mimalloc")];

/// The file name of a mapping's path ("libc.so.6").
pub fn file_name(mapping: &Mapping) -> &str {
    mapping.name.rsplit('/').next().unwrap_or("")
}

/// Is this glibc's libc?
pub fn is_libc(mapping: &Mapping) -> bool {
    mapping.inode != 0 && file_name(mapping) == "libc.so.6"
}

/// The library of another allocator mapped into the process, if any. Loaded
/// at all, it serves malloc: such libraries are preloaded or linked ahead of libc.
pub fn other_allocator(mappings: &[Mapping]) -> Option<(&'static str, &Mapping)> {
    mappings.iter().filter(|m| m.inode != 0).find_map(|m| {
        let name = file_name(m);
        OTHER_ALLOCATORS.iter().find(|(prefix, _)| name.starts_with(prefix)).map(|&(_, allocator)| (allocator, m))
    })
}

/// "jemalloc", "tcmalloc", "mimalloc", "glibc", or "unknown" (no libc.so.6:
/// statically linked).
pub fn allocator_of(mappings: &[Mapping]) -> &'static str {
    match other_allocator(mappings) {
        Some((allocator, _)) => allocator,
        None if mappings.iter().any(is_libc) => "glibc",
        None => "unknown",
    }
}

/// Mapped objects, other than libc, the loader and memgap's agent (which
/// forwards to the next malloc), that define `malloc` themselves: the
/// program's own allocator, or one preloaded (ASan, valgrind, hoard…).
/// Objects memgap cannot read are skipped.
pub fn other_malloc_definers(pid: u32, mappings: &[Mapping]) -> Vec<String> {
    let mut seen = Vec::new();
    let mut definers = Vec::new();
    for mapping in mappings.iter().filter(|m| m.inode != 0 && m.perms.contains('x')) {
        let name = file_name(mapping);
        if seen.contains(&mapping.inode) || is_libc(mapping) || name.starts_with("ld-linux") || name == "libmemgap_agent.so" {
            continue;
        }
        seen.push(mapping.inode);
        let Some(first) = mappings.iter().filter(|m| m.inode == mapping.inode).min_by_key(|m| m.offset) else { continue };
        let Ok(data) = open_mapped(pid, first) else { continue };
        let Ok(elf) = object::File::parse(&*data) else { continue };
        if elf.dynamic_symbols().any(|s| s.is_definition() && s.name() == Ok("malloc")) {
            definers.push(name.to_string());
        }
    }
    definers
}

/// The file behind `mapping`, mapped into memgap: through
/// /proc/PID/map_files (the very file, even deleted or in another mount
/// namespace), else /proc/PID/root, else the path as memgap sees it, each
/// checked by inode.
pub fn open_mapped(pid: u32, mapping: &Mapping) -> Result<Mmap, AttachError> {
    let path = mapping.name.trim_end_matches(" (deleted)");
    let candidates =
        [format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.start, mapping.end), format!("/proc/{pid}/root{path}"), path.to_string()];
    for candidate in &candidates {
        let Ok(file) = std::fs::File::open(candidate) else { continue };
        if file.metadata().is_ok_and(|m| m.ino() == mapping.inode) {
            // SAFETY: a library or program on disk, mapped read-only.
            if let Ok(data) = unsafe { Mmap::map(&file) } {
                return Ok(data);
            }
        }
    }
    Err(AttachError::Failed(format!("cannot read {path} as mapped by process {pid} (replaced on disk since it started?)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib(path: &str) -> Mapping {
        Mapping { name: path.into(), inode: 7, perms: "r-xp".into(), ..Mapping::default() }
    }

    #[test]
    fn names_the_allocator() {
        let libc = lib("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let jemalloc = lib("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
        assert_eq!(allocator_of(std::slice::from_ref(&libc)), "glibc");
        assert_eq!(allocator_of(&[jemalloc.clone(), libc.clone()]), "jemalloc");
        assert_eq!(allocator_of(&[lib("/usr/bin/go-program")]), "unknown");
        assert_eq!(other_allocator(&[libc, jemalloc]).map(|(a, m)| (a, file_name(m))), Some(("jemalloc", "libjemalloc.so.2")));
    }

    #[test]
    fn this_test_uses_glibcs_malloc() {
        let pid = std::process::id();
        let mappings = crate::procfs::mappings(pid).unwrap();
        assert_eq!(other_malloc_definers(pid, &mappings), Vec::<String>::new());
    }
}
