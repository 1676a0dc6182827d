//! Where the Go runtime keeps its own accounting in a Go executable: the
//! addresses of `runtime.memstats`, `runtime.gcController`, `runtime.mheap_`,
//! `runtime.allp` and `runtime.emptymspan` from the symbol table, and the
//! offsets of the fields memgap reads from the executable's DWARF (Go writes
//! it unless built with `-ldflags=-w` or stripped). Field offsets change from
//! one Go release to the next; they are never guessed: a field the DWARF does
//! not describe makes the layout unknown.

use std::borrow::Cow;
use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol};

/// A field found by its path: offset from the start of its root, byte size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: u64,
    pub size: u64,
}

/// The DWARF types of an executable, by name: enough to walk member paths.
#[derive(Debug, Default)]
pub struct Types {
    /// Named types (structures first seen win) → their DIE's global offset.
    by_name: HashMap<String, usize>,
    dies: HashMap<usize, TypeDie>,
}

#[derive(Debug, Default, Clone)]
struct TypeDie {
    byte_size: Option<u64>,
    /// The type it refers to (typedef, array element, pointer target).
    inner: Option<usize>,
    members: Vec<(String, u64, usize)>,
    /// Arrays: the element count (subrange count or upper bound + 1).
    count: Option<u64>,
    is_array: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    NoDwarf,
    BadDwarf(String),
    Missing(String),
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::NoDwarf => f.write_str("the executable has no DWARF (built with -ldflags=-w, or stripped)"),
            LayoutError::BadDwarf(why) => write!(f, "the executable's DWARF is unreadable ({why})"),
            LayoutError::Missing(what) => write!(f, "its DWARF has no {what}: a Go runtime laid out as memgap does not know"),
        }
    }
}

/// A section's bytes, decompressed (Go compresses its DWARF with zlib).
fn section_data<'a>(elf: &object::File<'a>, name: &str) -> Result<Cow<'a, [u8]>, LayoutError> {
    let Some(section) = elf.section_by_name(name) else { return Ok(Cow::Borrowed(&[])) };
    let compressed = section.compressed_data().map_err(|e| LayoutError::BadDwarf(format!("{name}: {e}")))?;
    match compressed.format {
        object::CompressionFormat::None => Ok(Cow::Borrowed(compressed.data)),
        object::CompressionFormat::Zlib => {
            use std::io::Read;
            let mut out = Vec::with_capacity(compressed.uncompressed_size as usize);
            flate2::read::ZlibDecoder::new(compressed.data)
                .take(compressed.uncompressed_size)
                .read_to_end(&mut out)
                .map_err(|e| LayoutError::BadDwarf(format!("{name}: {e}")))?;
            Ok(Cow::Owned(out))
        }
        object::CompressionFormat::Zstandard => zstd::bulk::decompress(compressed.data, compressed.uncompressed_size as usize)
            .map(Cow::Owned)
            .map_err(|e| LayoutError::BadDwarf(format!("{name}: {e}"))),
        _ => Err(LayoutError::BadDwarf(format!("{name} is compressed in a format memgap does not read"))),
    }
}

impl Types {
    /// Every type of the executable's DWARF.
    pub fn read(elf: &object::File<'_>) -> Result<Types, LayoutError> {
        if section_data(elf, ".debug_info")?.is_empty() {
            return Err(LayoutError::NoDwarf);
        }
        // Every section gimli asks for (a unit's line program and address
        // tables are read with it), decompressed once.
        let sections = gimli::DwarfSections::load(|id: gimli::SectionId| section_data(elf, id.name()))?;
        let dwarf = sections.borrow(|section| gimli::EndianSlice::new(section, gimli::LittleEndian));
        let bad = |e: gimli::Error| LayoutError::BadDwarf(e.to_string());
        let mut types = Types::default();
        let mut units = dwarf.units();
        while let Some(header) = units.next().map_err(bad)? {
            let unit = dwarf.unit(header).map_err(bad)?;
            let Some(unit_base) = unit.header.debug_info_offset().map(|o| o.0) else { continue };
            let global = |offset: gimli::UnitOffset| unit_base + offset.0;
            let mut entries = unit.entries();
            // The type whose members or subranges follow.
            let mut parent: Option<usize> = None;
            while let Some(entry) = entries.next_dfs().map_err(bad)? {
                let tag = entry.tag();
                let offset = global(entry.offset());
                let name = || -> Option<String> {
                    let value = entry.attr_value(gimli::DW_AT_name)?;
                    let text = dwarf.attr_string(&unit, value).ok()?;
                    Some(text.to_string_lossy().into_owned())
                };
                let udata = |at| entry.attr_value(at).and_then(|v| v.udata_value());
                let reference = || match entry.attr_value(gimli::DW_AT_type)? {
                    gimli::AttributeValue::UnitRef(r) => Some(global(r)),
                    gimli::AttributeValue::DebugInfoRef(r) => Some(r.0),
                    _ => None,
                };
                match tag {
                    gimli::DW_TAG_structure_type
                    | gimli::DW_TAG_base_type
                    | gimli::DW_TAG_pointer_type
                    | gimli::DW_TAG_typedef
                    | gimli::DW_TAG_array_type => {
                        let die = TypeDie {
                            byte_size: udata(gimli::DW_AT_byte_size),
                            inner: reference(),
                            is_array: tag == gimli::DW_TAG_array_type,
                            ..TypeDie::default()
                        };
                        if let Some(name) = name() {
                            types.by_name.entry(name).or_insert(offset);
                        }
                        types.dies.insert(offset, die);
                        parent = Some(offset);
                    }
                    gimli::DW_TAG_member => {
                        if let (Some(p), Some(name), Some(member_offset), Some(member_type)) =
                            (parent, name(), udata(gimli::DW_AT_data_member_location), reference())
                            && let Some(die) = types.dies.get_mut(&p)
                        {
                            die.members.push((name, member_offset, member_type));
                        }
                    }
                    gimli::DW_TAG_subrange_type => {
                        let count = udata(gimli::DW_AT_count).or_else(|| udata(gimli::DW_AT_upper_bound).map(|u| u + 1));
                        if let Some(die) = parent.and_then(|p| types.dies.get_mut(&p)) {
                            die.count = count;
                        }
                    }
                    _ => parent = None,
                }
            }
        }
        Ok(types)
    }

    /// The size of the type at `offset`, through typedefs; arrays by count.
    fn size_of(&self, offset: usize) -> Option<u64> {
        let mut at = offset;
        for _ in 0..16 {
            let die = self.dies.get(&at)?;
            if let Some(size) = die.byte_size {
                return Some(size);
            }
            if die.is_array {
                return Some(die.count? * self.size_of(die.inner?)?);
            }
            at = die.inner?;
        }
        None
    }

    /// The type a typedef (Go writes one for a named struct type) stands for.
    fn through_typedefs(&self, mut at: usize) -> usize {
        for _ in 0..16 {
            match self.dies.get(&at) {
                Some(die) if die.members.is_empty() && !die.is_array && die.byte_size.is_none() && die.inner.is_some() => {
                    at = die.inner.unwrap_or(at);
                }
                _ => break,
            }
        }
        at
    }

    /// `path` (member names, dot-separated) inside the named type.
    pub fn field(&self, root: &str, path: &str) -> Result<Field, LayoutError> {
        let missing = || LayoutError::Missing(format!("{root}.{path}"));
        let mut at = *self.by_name.get(root).ok_or_else(|| LayoutError::Missing(root.to_string()))?;
        let mut offset = 0;
        for name in path.split('.') {
            let die = self.dies.get(&self.through_typedefs(at)).ok_or_else(missing)?;
            let &(_, member_offset, member_type) = die.members.iter().find(|(n, ..)| n == name).ok_or_else(missing)?;
            offset += member_offset;
            at = member_type;
        }
        Ok(Field { offset, size: self.size_of(at).ok_or_else(missing)? })
    }

    /// The size of the named type.
    pub fn size(&self, name: &str) -> Result<u64, LayoutError> {
        self.by_name.get(name).and_then(|&at| self.size_of(at)).ok_or_else(|| LayoutError::Missing(name.to_string()))
    }
}

/// The symbol table's data symbols by name, relocated by `base`.
pub fn data_symbols(elf: &object::File<'_>, names: &[&str], base: u64) -> HashMap<String, u64> {
    elf.symbols()
        .filter(|s| s.is_definition())
        .filter_map(|s| {
            let name = s.name().ok()?;
            names.contains(&name).then(|| (name.to_string(), s.address().wrapping_add(base)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_executable_without_dwarf_is_said_so() {
        // memgap's own test binary is Rust: it has DWARF (line tables) but
        // no Go runtime types.
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let elf = object::File::parse(&*exe).unwrap();
        match Types::read(&elf) {
            Ok(types) => assert!(matches!(types.field("runtime.mstats", "heapStats"), Err(LayoutError::Missing(_)))),
            Err(e) => assert_eq!(e, LayoutError::NoDwarf),
        }
    }
}
