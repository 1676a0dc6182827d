//! Is an executable a Go program, and which Go built it: the `.go.buildinfo`
//! section every Go binary carries (debug/buildinfo's format). Since Go 1.18
//! the version string sits inline after the 32-byte header, as a
//! varint-length-prefixed string; the module info follows it.

use std::path::Path;

const MAGIC: &[u8; 14] = b"\xff Go buildinf:";
/// Header flag: the version and module strings follow the header inline (Go 1.18+).
const FLAG_INLINE: u8 = 0x2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoBinary {
    /// As `runtime.Version()` spells it: `go1.26.8`, `go1.26.8-X:nogreenteagc`,
    /// or `unknown` for a binary older than Go 1.18.
    pub version: String,
}

/// `Some` when `path` is a Go executable (ELF with a Go buildinfo blob).
pub fn detect(path: &Path) -> Option<GoBinary> {
    let file = std::fs::File::open(path).ok()?;
    // Mapped, not read: only the ELF headers and the section are touched.
    // SAFETY: a read-only private mapping of a file memgap only reads; a
    // program rewriting its own executable meanwhile is not guarded against.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    detect_bytes(&bytes)
}

pub fn detect_bytes(bytes: &[u8]) -> Option<GoBinary> {
    if !bytes.starts_with(b"\x7fELF") {
        return None;
    }
    let blob = match elf_section(bytes, ".go.buildinfo") {
        Some(section) => section,
        // No section headers at all (stripped with sstrip): search the file.
        None if section_count(bytes) == Some(0) => find_magic(bytes)?,
        None => return None,
    };
    if !blob.starts_with(MAGIC) || blob.len() < 32 {
        return None;
    }
    let version = if blob[15] & FLAG_INLINE != 0 { read_string(&blob[32..]) } else { None };
    Some(GoBinary { version: version.unwrap_or_else(|| "unknown".into()) })
}

/// The blob is 16-byte aligned wherever it lands (debug/buildinfo searches so too).
fn find_magic(bytes: &[u8]) -> Option<&[u8]> {
    (0..bytes.len().saturating_sub(MAGIC.len())).step_by(16).find(|&i| bytes[i..].starts_with(MAGIC)).map(|i| &bytes[i..])
}

fn read_string(bytes: &[u8]) -> Option<String> {
    let (mut len, mut shift, mut used) = (0usize, 0, 0);
    for &b in bytes.iter().take(10) {
        len |= usize::from(b & 0x7f) << shift;
        shift += 7;
        used += 1;
        if b & 0x80 == 0 {
            break;
        }
    }
    let text = bytes.get(used..used + len)?;
    String::from_utf8(text.to_vec()).ok().filter(|s| !s.is_empty())
}

fn section_count(bytes: &[u8]) -> Option<usize> {
    let at = if *bytes.get(4)? == 2 { 0x3c } else { 0x30 };
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?) as usize)
}

/// The bytes of the named section of a little-endian ELF file (32 or 64 bit).
fn elf_section<'a>(bytes: &'a [u8], wanted: &str) -> Option<&'a [u8]> {
    let is64 = *bytes.get(4)? == 2;
    if *bytes.get(5)? != 1 {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?) as usize);
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize);
    let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?) as usize);
    let word = |at: usize| if is64 { u64_at(at) } else { u32_at(at) };
    let (shoff, shentsize, shnum, shstrndx) = if is64 {
        (u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?)
    } else {
        (u32_at(0x20)?, u16_at(0x2e)?, u16_at(0x30)?, u16_at(0x32)?)
    };
    // Section header fields: name (u32), type (u32), flags, addr, offset, size (words).
    let header = |i: usize| shoff + i * shentsize;
    let offset_size = |i: usize| -> Option<(usize, usize)> {
        let h = header(i);
        if is64 { Some((word(h + 0x18)?, word(h + 0x20)?)) } else { Some((word(h + 0x10)?, word(h + 0x14)?)) }
    };
    let (names_at, names_len) = offset_size(shstrndx)?;
    let names = bytes.get(names_at..names_at.checked_add(names_len)?)?;
    (0..shnum).find_map(|i| {
        let name_at = u32_at(header(i))?;
        let name = names.get(name_at..)?.split(|&b| b == 0).next()?;
        if name != wanted.as_bytes() {
            return None;
        }
        let (at, len) = offset_size(i)?;
        bytes.get(at..at.checked_add(len)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_of_the_machines_go_binary() {
        // The go command is itself a Go program.
        let go = Path::new("/usr/local/go/bin/go");
        if let Some(found) =
            ["/usr/local/go/bin/go", "/usr/lib/go/bin/go"].iter().map(Path::new).find(|p| p.exists()).or(Some(go).filter(|p| p.exists()))
        {
            let binary = detect(found).expect("the go command is a Go binary");
            assert!(binary.version.starts_with("go1."), "{binary:?}");
        }
    }

    #[test]
    fn a_c_program_is_not_go() {
        assert_eq!(detect(Path::new("/bin/sh")), None);
        assert_eq!(detect_bytes(b"#!/bin/sh\necho"), None);
    }

    #[test]
    fn inline_blob_found_without_section_headers() {
        let mut elf = b"\x7fELF\x02\x01".to_vec();
        elf.resize(64, 0);
        elf.extend_from_slice(MAGIC);
        elf.extend_from_slice(&[8, FLAG_INLINE]);
        elf.resize(64 + 32, 0);
        elf.push(8);
        elf.extend_from_slice(b"go1.21.3");
        assert_eq!(detect_bytes(&elf).unwrap().version, "go1.21.3");
    }
}
