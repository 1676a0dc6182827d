//! A ledger as the trace's index keeps it (`memgap_replay::index`), and read
//! back: its JSON, plus what the JSON leaves out (the page maps, what each
//! call stack takes), so that a later question about the same snapshot is
//! answered without replaying the trace.
//!
//! The names the model spells as `&'static str` (owners, finding kinds,
//! remedy ids, snapshot reasons) come back through [`static_name`]: each
//! distinct name is kept once for the life of the process, and a file with
//! more distinct names than any ledger could hold is refused.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use super::{Ledger, PageClass, PageMap, StackShare};

/// More distinct names than the owners, findings, remedies and reasons of
/// every ledger could spell: the file is not one memgap wrote.
const MAX_NAMES: usize = 4096;

/// `&'static str` as the fields read back through [`static_name`] spell
/// it: serde's derive ties a field written `&'static str` to the input's
/// lifetime, which an index read into a buffer cannot outlive.
pub type Name = &'static str;

/// Pages of one page map, at most (1 TiB of 4 KiB pages): bounds what a
/// damaged file can make us allocate.
const MAX_PAGES: u64 = 1 << 28;

static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

fn intern(name: &str) -> Option<&'static str> {
    let mut names = NAMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(known) = names.iter().find(|known| **known == name) {
        return Some(known);
    }
    if names.len() >= MAX_NAMES {
        return None;
    }
    let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(kept);
    Some(kept)
}

/// A `&'static str` field read back.
pub fn static_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<&'static str, D::Error> {
    let name = String::deserialize(deserializer)?;
    intern(&name).ok_or_else(|| D::Error::custom("too many distinct names"))
}

pub fn static_name_or_none<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'static str>, D::Error> {
    match Option::<String>::deserialize(deserializer)? {
        Some(name) => intern(&name).map(Some).ok_or_else(|| D::Error::custom("too many distinct names")),
        None => Ok(None),
    }
}

/// The owners' sections, under their names.
pub fn sections<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<&'static str, serde_json::Value>, D::Error> {
    BTreeMap::<String, serde_json::Value>::deserialize(deserializer)?
        .into_iter()
        .map(|(name, value)| intern(&name).map(|name| (name, value)).ok_or_else(|| D::Error::custom("too many distinct names")))
        .collect()
}

/// A page's class in one number: the classes without a value first, then
/// `Used` and `Python` with their fill in the low byte.
fn page_code(class: PageClass) -> u16 {
    match class {
        PageClass::NotResident => 0,
        PageClass::Agent => 1,
        PageClass::ProgramMmap => 2,
        PageClass::Free { trimmable: false } => 3,
        PageClass::Free { trimmable: true } => 4,
        PageClass::Python { fill: None } => 5,
        PageClass::Used { fill } => 0x100 | u16::from(fill),
        PageClass::Python { fill: Some(fill) } => 0x200 | u16::from(fill),
    }
}

fn page_class(code: u16) -> Option<PageClass> {
    let fill = (code & 0xff) as u8;
    Some(match code >> 8 {
        0 => match code {
            0 => PageClass::NotResident,
            1 => PageClass::Agent,
            2 => PageClass::ProgramMmap,
            3 => PageClass::Free { trimmable: false },
            4 => PageClass::Free { trimmable: true },
            5 => PageClass::Python { fill: None },
            _ => return None,
        },
        1 => PageClass::Used { fill },
        2 => PageClass::Python { fill: Some(fill) },
        _ => return None,
    })
}

fn runs(pages: &[PageClass]) -> Vec<(u16, u32)> {
    let mut runs: Vec<(u16, u32)> = Vec::new();
    for &class in pages {
        let code = page_code(class);
        match runs.last_mut() {
            Some((last, count)) if *last == code && *count < u32::MAX => *count += 1,
            _ => runs.push((code, 1)),
        }
    }
    runs
}

#[derive(Serialize, Deserialize)]
struct StoredPageMap {
    name: String,
    start: u64,
    page_size: u64,
    /// Runs of pages of one class: ([`page_code`], how many).
    pages: Vec<(u16, u32)>,
    nodes: Vec<u8>,
}

/// What [`encode`] writes: the ledger's JSON leaves out its page maps and
/// call stacks, which follow in their own form.
#[derive(Serialize)]
struct StoredLedgerOut<'a> {
    ledger: &'a Ledger,
    has_pages: bool,
    page_maps: Vec<StoredPageMap>,
    has_stacks: bool,
    by_stack: &'a [StackShare],
    unowned_lazy_free_bytes: u64,
}

/// What [`decode`] reads back (the fields of [`StoredLedgerOut`]).
#[derive(Deserialize)]
struct StoredLedger {
    ledger: Ledger,
    /// Whether the page maps were computed (a heap can have none).
    has_pages: bool,
    page_maps: Vec<StoredPageMap>,
    /// Whether what each call stack takes was computed.
    has_stacks: bool,
    by_stack: Vec<StackShare>,
    unowned_lazy_free_bytes: u64,
}

/// A ledger read back from the index, with what was computed of it.
#[derive(Debug)]
pub struct Kept {
    pub ledger: Ledger,
    /// Its page maps are those of the snapshot (not left out to save room).
    pub has_pages: bool,
    /// Its `by_stack` is filled.
    pub has_stacks: bool,
}

/// The bytes the index keeps of `ledger`. The blocks listed on each page
/// (the report's hover) are left out: no answer read from the index shows them.
pub fn encode(ledger: &Ledger, has_pages: bool, has_stacks: bool) -> Vec<u8> {
    let stored = StoredLedgerOut {
        ledger,
        has_pages,
        page_maps: ledger
            .page_maps
            .iter()
            .map(|map| StoredPageMap {
                name: map.name.clone(),
                start: map.start,
                page_size: map.page_size,
                pages: runs(&map.pages),
                nodes: map.nodes.clone(),
            })
            .collect(),
        has_stacks,
        by_stack: &ledger.by_stack,
        unowned_lazy_free_bytes: ledger.unowned_lazy_free_bytes,
    };
    serde_json::to_vec(&stored).expect("model structs always serialize")
}

/// The ledger [`encode`] kept; `None` for bytes it did not write.
pub fn decode(bytes: &[u8]) -> Option<Kept> {
    let stored: StoredLedger = serde_json::from_slice(bytes).ok()?;
    let mut page_maps = Vec::with_capacity(stored.page_maps.len());
    for map in stored.page_maps {
        let count = map.pages.iter().try_fold(0u64, |count, &(_, run)| Some(count + u64::from(run)).filter(|&c| c <= MAX_PAGES))?;
        let mut pages = Vec::with_capacity(count as usize);
        for (code, run) in map.pages {
            pages.extend(std::iter::repeat_n(page_class(code)?, run as usize));
        }
        page_maps.push(PageMap { name: map.name, start: map.start, page_size: map.page_size, pages, nodes: map.nodes, objects: None });
    }
    let ledger = Ledger { page_maps, by_stack: stored.by_stack, unowned_lazy_free_bytes: stored.unowned_lazy_free_bytes, ..stored.ledger };
    Some(Kept { ledger, has_pages: stored.has_pages, has_stacks: stored.has_stacks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_class_comes_back() {
        let mut classes = vec![
            PageClass::NotResident,
            PageClass::Agent,
            PageClass::ProgramMmap,
            PageClass::Free { trimmable: false },
            PageClass::Free { trimmable: true },
            PageClass::Python { fill: None },
        ];
        for fill in 0..=255 {
            classes.push(PageClass::Used { fill });
            classes.push(PageClass::Python { fill: Some(fill) });
        }
        for class in classes {
            assert_eq!(page_class(page_code(class)), Some(class));
        }
        assert_eq!(page_class(6), None);
        assert_eq!(page_class(0x300), None);
    }

    #[test]
    fn names_are_kept_once_and_bounded() {
        let a = intern("a name read back").unwrap();
        let b = intern(&String::from("a name read back")).unwrap();
        assert!(std::ptr::eq(a, b));
    }

    /// Every ledger of every recorded fixture comes back as it was, page
    /// maps and call stacks included (less the report's per-page blocks).
    #[test]
    fn the_fixtures_ledgers_come_back_whole() {
        let mut ledgers = 0;
        for path in crate::fixtures::traces() {
            let Some(report) = crate::report::report(&path, crate::At::Gap).unwrap() else { continue };
            for mut ledger in report.snapshots {
                ledger.moment = report.blame.as_ref().and_then(|b| b.moment.clone());
                let kept = decode(&encode(&ledger, true, true)).unwrap_or_else(|| panic!("{}", path.display()));
                for map in &mut ledger.page_maps {
                    map.objects = None;
                }
                // Arc'd measurements are read again beside the trace, not kept.
                ledger.measured_remedies = None;
                assert_eq!(format!("{:?}", kept.ledger), format!("{ledger:?}"), "{}", path.display());
                assert!(kept.has_pages && kept.has_stacks);
                ledgers += 1;
            }
        }
        assert!(ledgers >= 20, "only {ledgers} ledgers in the fixtures");
    }

    #[test]
    fn foreign_bytes_are_refused() {
        assert!(decode(b"").is_none());
        assert!(decode(b"{\"ledger\": 3}").is_none());
        assert!(decode(&[0xff, 0x00, 0x7b]).is_none());
    }
}
