//! Which libraries a process has mapped, and whose malloc it calls.

use memgap_trace::records::Mapping;

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
        assert_eq!(allocator_of(&[libc.clone()]), "glibc");
        assert_eq!(allocator_of(&[jemalloc.clone(), libc.clone()]), "jemalloc");
        assert_eq!(allocator_of(&[lib("/usr/bin/go-program")]), "unknown");
        assert_eq!(other_allocator(&[libc, jemalloc]).map(|(a, m)| (a, file_name(m))), Some(("jemalloc", "libjemalloc.so.2")));
    }
}
