//! The ledger of a running process seen from outside (`memgap snapshot PID`):
//! no agent and no live set, only what procfs says.
//!
//! Each mapping goes to one group: heap (`[heap]` and the private writable
//! anonymous mappings), stacks, files, shared memory, or other anonymous
//! memory (static data, `[vdso]`…). The rows that need no live set are then
//! filled as the recorded ledger fills them: lazy_free (smaps LazyFree),
//! runtime (stacks), other (files, shared memory, other anonymous); what is
//! left is the heap, one total: splitting it into live, slack, fragmented and
//! retained needs the live blocks, that is a recording.

use std::collections::BTreeMap;

use memgap_trace::records::{Mapping, Metrics, Snapshot};
use serde::Serialize;

pub use memgap_types::outside::{CgroupMemory, ProcfsReading, TrimCall};

use crate::ledger::{HeapKind, MappingClass, MappingLedger};
use crate::owners::allocator_stats::AllocatorStats;
use crate::owners::glibc::GLIBC_HEAP_ALIGN;

/// The rows of the recorded ledger a snapshot from outside cannot fill.
pub const UNKNOWN_ROWS: [&str; 4] = ["live", "slack", "fragmented", "retained"];

/// The rows known from outside. `heap` is live + slack + fragmented +
/// retained; those four are known when the allocator's state was walked.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct KnownRows {
    pub heap: u64,
    pub lazy_free: u64,
    pub runtime: u64,
    pub other: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slack: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragmented: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retained: Option<u64>,
}

impl KnownRows {
    pub fn total(&self) -> u64 {
        self.heap + self.lazy_free + self.runtime + self.other
    }

    pub fn named(&self) -> [(&'static str, u64); 4] {
        [("heap", self.heap), ("lazy_free", self.lazy_free), ("runtime", self.runtime), ("other", self.other)]
    }

    /// The rows to show: the heap split into its four rows when known.
    pub fn shown(&self) -> Vec<(&'static str, u64)> {
        match (self.live, self.slack, self.fragmented, self.retained) {
            (Some(live), Some(slack), Some(fragmented), Some(retained)) => vec![
                ("live", live),
                ("slack", slack),
                ("fragmented", fragmented),
                ("retained", retained),
                ("lazy_free", self.lazy_free),
                ("runtime", self.runtime),
                ("other", self.other),
            ],
            _ => self.named().to_vec(),
        }
    }
}

/// Resident bytes of each group of mappings.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Groups {
    pub heap: u64,
    pub stacks: u64,
    pub file: u64,
    pub shared: u64,
    pub anonymous_other: u64,
}

/// smaps figures summed over every mapping.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SmapsTotals {
    pub rss_bytes: u64,
    pub anonymous_bytes: u64,
    pub lazy_free_bytes: u64,
    pub swap_bytes: u64,
}

/// /proc/PID/status: VmRSS = RssAnon + RssFile + RssShmem.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct StatusRss {
    pub vm_rss_bytes: u64,
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    pub rss_shmem_bytes: u64,
}

/// One heap mapping: the brk heap, a glibc arena heap, or the other
/// anonymous mappings merged.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HeapMapping {
    pub name: String,
    /// A brk heap, an arena, or the other mappings merged.
    pub kind: HeapKind,
    pub start: u64,
    pub end: u64,
    pub mappings: u32,
    pub resident_bytes: u64,
    pub lazy_free_bytes: u64,
    pub swap_bytes: u64,
    /// The `---p` rest of a glibc heap's 64 MiB reservation.
    pub reserved_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ProcessLedger {
    pub pid: u32,
    pub command: String,
    pub threads: u32,
    pub allocator: String,
    /// VmRSS.
    pub rss_bytes: u64,
    pub rows: KnownRows,
    pub unknown_rows: Vec<&'static str>,
    /// rss_bytes − the sum of the rows (smaps and status are read apart).
    pub residual_bytes: i64,
    /// The heap group's resident bytes less its lazy-free ones: the heap row.
    pub heap_bytes: u64,
    /// glibc arenas seen in the mappings: the main one plus each 64 MiB heap.
    pub arenas: u32,
    pub heaps: Vec<HeapMapping>,
    pub groups: Groups,
    pub smaps: SmapsTotals,
    pub status: StatusRss,
    pub mappings: Vec<MappingLedger>,
    pub cgroup: Option<CgroupMemory>,
    /// Resident bytes per NUMA node.
    pub numa: BTreeMap<u32, u64>,
    /// The allocator is linked into the executable (no libc malloc serves the program).
    pub allocator_statically_linked: bool,
    /// The allocator's own figures (jemalloc's mallctl, tcmalloc's
    /// MallocExtension, mimalloc's mi_process_info), when it gives them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_stats: Option<AllocatorStats>,
    /// The heap row split by those figures: `unknown_rows` then lists only
    /// what they do not give.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_rows: Option<AllocatorRows>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_stats_error: Option<String>,
    /// What malloc_trim(0) would return now, when the heap was walked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trim_would_return_bytes: Option<u64>,
    /// How the walk of the allocator's state went, when it succeeded…
    #[serde(skip_serializing_if = "Option::is_none")]
    pub walk: Option<crate::outside_walk::WalkSummary>,
    /// …or why the heap could not be walked (one line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub walk_failure: Option<String>,
    /// The recorded ledger's model of the walked heap: rows, heaps, trim
    /// forecast, owners, findings and remedies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<Box<crate::Ledger>>,
}

/// The ledger of `reading` with the heap a walk of glibc's state found:
/// every row known, from the recorded ledger's own code.
pub fn walked_process_ledger(reading: &ProcfsReading, walk: &crate::outside_walk::WalkedHeap, pages: bool) -> ProcessLedger {
    let ledger = crate::outside_walk::walked_ledger(walk, pages);
    let mut process = with_model_ledger(outside_ledger(reading), ledger);
    process.arenas = walk.arenas.len() as u32;
    process.walk = Some(walk.summary());
    process
}

/// The ledger of `reading` with what a runtime said about itself (METRICS
/// records, e.g. the Go runtime's accounting read from its memory) laid
/// over the page residency of `snapshot` by the owners' own code: the same
/// split as a recording's ledger at a snapshot.
pub fn runtime_process_ledger(reading: &ProcfsReading, snapshot: &Snapshot, metrics: &[Metrics], pages: bool) -> ProcessLedger {
    let mut owners = crate::registry::registered();
    for m in metrics {
        owners.iter_mut().for_each(|o| o.metrics(m));
    }
    let detail = crate::accounting::Detail { pages, ..crate::accounting::Detail::default() };
    let ledger = crate::accounting::compute(&mut crate::HeapState::default(), snapshot, detail, &mut owners);
    let mut process = with_model_ledger(outside_ledger(reading), ledger);
    process.allocator = process.ledger.as_ref().map_or(process.allocator, |l| l.allocator.clone());
    process.arenas = 0;
    // glibc's trim forecast says nothing of a runtime's own heap.
    process.trim_would_return_bytes = None;
    process
}

/// Every row of `ledger` (the recorded ledger's model of the process).
fn with_model_ledger(mut process: ProcessLedger, ledger: crate::Ledger) -> ProcessLedger {
    let r = &ledger.rows;
    let heap = r.live + r.slack + r.fragmented + r.retained;
    process.rows = KnownRows {
        heap,
        lazy_free: r.lazy_free,
        runtime: r.runtime,
        other: r.other,
        live: Some(r.live),
        slack: Some(r.slack),
        fragmented: Some(r.fragmented),
        retained: Some(r.retained),
    };
    process.unknown_rows = Vec::new();
    process.heap_bytes = heap;
    process.rss_bytes = ledger.rss_bytes;
    process.residual_bytes = ledger.residual_bytes;
    process.trim_would_return_bytes = Some(ledger.trim_would_return_bytes);
    process.ledger = Some(Box::new(ledger));
    process
}

/// The heap row of a process whose allocator reports itself, split.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct AllocatorRows {
    pub live: u64,
    pub fragmented: u64,
    pub retained: u64,
    /// The allocator's metadata (in the runtime row of a recorded ledger).
    pub metadata: u64,
    /// Heap bytes its figures do not account for (the program's own mmaps, glibc's heap).
    pub unaccounted: u64,
}

/// RSS and heap before and after a malloc_trim(0), and what came back.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TrimReport {
    pub pid: u32,
    pub command: String,
    #[serde(flatten)]
    pub call: TrimCall,
    /// VmRSS.
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
    /// Resident bytes of the heap mappings (smaps Rss).
    pub heap_before_bytes: u64,
    pub heap_after_bytes: u64,
    /// The drop in VmRSS (negative if RSS grew meanwhile).
    pub returned_bytes: i64,
    pub heap_returned_bytes: i64,
    /// heap_returned_bytes ÷ heap_before_bytes, in percent.
    pub heap_returned_percent: f64,
}

impl TrimReport {
    pub fn new(before: &ProcessLedger, after: &ProcessLedger, call: TrimCall) -> TrimReport {
        let heap_returned_bytes = before.groups.heap as i64 - after.groups.heap as i64;
        TrimReport {
            pid: before.pid,
            command: before.command.clone(),
            call,
            rss_before_bytes: before.rss_bytes,
            rss_after_bytes: after.rss_bytes,
            heap_before_bytes: before.groups.heap,
            heap_after_bytes: after.groups.heap,
            returned_bytes: before.rss_bytes as i64 - after.rss_bytes as i64,
            heap_returned_bytes,
            heap_returned_percent: if before.groups.heap == 0 {
                0.0
            } else {
                heap_returned_bytes as f64 * 100.0 / before.groups.heap as f64
            },
        }
    }
}

/// The ledger of `reading`.
pub fn outside_ledger(reading: &ProcfsReading) -> ProcessLedger {
    let glibc = reading.allocator == "glibc";
    let status = &reading.status;
    let mut ledger = ProcessLedger {
        pid: reading.pid,
        command: reading.command.clone(),
        threads: reading.threads,
        allocator: reading.allocator.clone(),
        rss_bytes: status.vm_rss,
        unknown_rows: UNKNOWN_ROWS.to_vec(),
        status: StatusRss {
            vm_rss_bytes: status.vm_rss,
            rss_anon_bytes: status.rss_anon,
            rss_file_bytes: status.rss_file,
            rss_shmem_bytes: status.rss_shmem,
        },
        cgroup: reading.cgroup.clone().map(assess),
        numa: reading.numa.clone(),
        ..ProcessLedger::default()
    };
    let mut rows = KnownRows::default();
    let mut merged = HeapMapping { name: "other anonymous mappings".into(), kind: HeapKind::Mappings, ..HeapMapping::default() };
    let maps = &reading.mappings;
    for (i, mapping) in maps.iter().enumerate() {
        let (previous, next) = (i.checked_sub(1).map(|p| &maps[p]), maps.get(i + 1));
        let class = classify(mapping, previous, &reading.stack_pointers);
        let resident = mapping.rss - mapping.lazy_free.min(mapping.rss);
        let totals = &mut ledger.smaps;
        totals.rss_bytes += mapping.rss;
        totals.anonymous_bytes += mapping.anonymous;
        totals.lazy_free_bytes += mapping.lazy_free;
        totals.swap_bytes += mapping.swap;
        rows.lazy_free += mapping.lazy_free.min(mapping.rss);
        let groups = &mut ledger.groups;
        match class {
            MappingClass::Heap => {
                groups.heap += mapping.rss;
                rows.heap += resident;
                let heap = heap_mapping(mapping, next, glibc);
                if heap.kind == HeapKind::Mappings {
                    merged.mappings += 1;
                    merged.resident_bytes += heap.resident_bytes;
                    merged.lazy_free_bytes += heap.lazy_free_bytes;
                    merged.swap_bytes += heap.swap_bytes;
                } else {
                    ledger.heaps.push(heap);
                }
            }
            MappingClass::Stack => {
                groups.stacks += mapping.rss;
                rows.runtime += resident;
            }
            MappingClass::File => groups.file += mapping.rss,
            MappingClass::Shmem => groups.shared += mapping.rss,
            _ => groups.anonymous_other += mapping.rss,
        }
        if !matches!(class, MappingClass::Heap | MappingClass::Stack) {
            rows.other += resident;
        }
        ledger.mappings.push(MappingLedger { class, ..MappingLedger::of(mapping) });
    }
    if merged.mappings > 0 {
        ledger.heaps.push(merged);
    }
    ledger.rows = rows;
    ledger.heap_bytes = rows.heap;
    ledger.residual_bytes = ledger.rss_bytes as i64 - rows.total() as i64;
    ledger.arenas = if glibc { 1 + ledger.heaps.iter().filter(|h| h.kind == HeapKind::Arena).count() as u32 } else { 0 };
    split_by_allocator_stats(&mut ledger, reading);
    ledger
}

/// The heap row split by the allocator's own figures, when it gave them.
fn split_by_allocator_stats(ledger: &mut ProcessLedger, reading: &ProcfsReading) {
    ledger.allocator_statically_linked = reading.allocator_statically_linked;
    ledger.allocator_stats_error = reading.allocator_stats_error.clone();
    let Some(stats) = &reading.allocator_stats else { return };
    ledger.allocator_stats = Some(stats.clone());
    // Figures that give no live bytes (mimalloc's committed) split nothing:
    // shown beside the rows, which stay unknown.
    if !stats.knows_live() {
        return;
    }
    let split = crate::owners::allocator_stats::rows(stats, ledger.rows.heap, 0);
    let r = split.rows;
    ledger.allocator_rows = Some(AllocatorRows {
        live: r.live,
        fragmented: r.fragmented,
        retained: r.retained,
        metadata: r.runtime,
        unaccounted: split.unaccounted,
    });
    ledger.unknown_rows = stats.unknown_rows();
}

/// The group of one mapping: "heap", "stack", "file", "shmem", "static
/// data" (a `.bss`), or "other" (`[vdso]`, inaccessible reservations…).
fn classify(mapping: &Mapping, previous: Option<&Mapping>, stack_pointers: &[u64]) -> MappingClass {
    let adjacent_previous = previous.filter(|p| p.end == mapping.start);
    let holds_stack_pointer = stack_pointers.iter().any(|&sp| mapping.start <= sp && sp < mapping.end);
    // glibc puts a thread's guard pages (PROT_NONE) right below its stack.
    // A glibc heap's reservation ends on a 64 MiB boundary, so what follows
    // one is aligned and is not taken for a stack.
    let after_guard = adjacent_previous
        .is_some_and(|p| p.perms == "---p" && p.inode == 0 && p.name.is_empty() && p.end - p.start <= 1 << 20)
        && !mapping.start.is_multiple_of(GLIBC_HEAP_ALIGN);
    let writable = mapping.perms.starts_with("rw");
    if writable && (mapping.name == "[stack]" || mapping.name.starts_with("[stack:") || holds_stack_pointer) {
        return MappingClass::Stack;
    }
    if mapping.perms.ends_with('s') {
        return MappingClass::Shmem;
    }
    if mapping.inode != 0 {
        return MappingClass::File;
    }
    if !mapping.is_private_writable_anonymous() {
        return MappingClass::Other;
    }
    // The .bss of an ELF object: anonymous, right after its data segment.
    if mapping.name.is_empty() && adjacent_previous.is_some_and(|p| p.inode != 0 && p.perms.starts_with("rw")) {
        return MappingClass::StaticData;
    }
    if mapping.name.is_empty() && after_guard {
        return MappingClass::Stack;
    }
    MappingClass::Heap
}

fn heap_mapping(mapping: &Mapping, next: Option<&Mapping>, glibc: bool) -> HeapMapping {
    let reservation = next.filter(|n| n.start == mapping.end && n.perms == "---p" && n.inode == 0 && n.name.is_empty());
    let aligned = mapping.start.is_multiple_of(GLIBC_HEAP_ALIGN);
    let size = mapping.end - mapping.start;
    let (kind, name, reserved) = if mapping.name == "[heap]" {
        (HeapKind::BrkHeap, "main arena ([heap])".to_string(), 0)
    } else if glibc && aligned && (reservation.is_some() || size == GLIBC_HEAP_ALIGN) {
        let reserved = reservation.map_or(0, |r| r.end.min(mapping.start + GLIBC_HEAP_ALIGN) - r.start);
        (HeapKind::Arena, format!("arena heap @{:#x}", mapping.start), reserved)
    } else {
        (HeapKind::Mappings, String::new(), 0)
    };
    HeapMapping {
        name,
        kind,
        start: mapping.start,
        end: mapping.end,
        mappings: 1,
        resident_bytes: mapping.rss,
        lazy_free_bytes: mapping.lazy_free,
        swap_bytes: mapping.swap,
        reserved_bytes: reserved,
    }
}

/// How close the cgroup is to its limit: fills `used_percent` and `headroom_bytes`.
pub fn assess(mut cgroup: CgroupMemory) -> CgroupMemory {
    if let Some(max) = cgroup.max_bytes.filter(|&max| max > 0) {
        cgroup.used_percent = Some(cgroup.current_bytes as f64 * 100.0 / max as f64);
        cgroup.headroom_bytes = Some(max.saturating_sub(cgroup.current_bytes));
    }
    cgroup
}

#[cfg(test)]
mod tests {
    use memgap_trace::records::Rss;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn map(start: u64, end: u64, perms: &str, name: &str, inode: u64, rss: u64) -> Mapping {
        Mapping {
            start,
            end,
            perms: perms.into(),
            name: name.into(),
            inode,
            rss,
            anonymous: if inode == 0 { rss } else { 0 },
            ..Mapping::default()
        }
    }

    fn reading(mappings: Vec<Mapping>, vm_rss: u64) -> ProcfsReading {
        ProcfsReading { pid: 7, allocator: "glibc".into(), status: Rss { vm_rss, ..Rss::default() }, mappings, ..ProcfsReading::default() }
    }

    #[test]
    fn groups_mappings_and_fills_the_known_rows() {
        let arena = 0x7f00_0000_0000u64;
        let stack = 0x7f10_0000_1000u64;
        let mut heap = map(0x5555_0000_0000, 0x5555_0200_0000, "rw-p", "[heap]", 0, 20 * MIB);
        heap.lazy_free = MIB;
        let maps = vec![
            map(0x5554_0000_0000, 0x5554_0010_0000, "r-xp", "/usr/bin/prog", 12, MIB),
            map(0x5554_0010_0000, 0x5554_0010_1000, "rw-p", "/usr/bin/prog", 12, 4096),
            map(0x5554_0010_1000, 0x5554_0010_3000, "rw-p", "", 0, 8192),
            heap,
            map(arena, arena + 33 * MIB, "rw-p", "", 0, 30 * MIB),
            map(arena + 33 * MIB, arena + 64 * MIB, "---p", "", 0, 0),
            map(arena + 64 * MIB, arena + 128 * MIB, "rw-p", "", 0, 64 * MIB),
            map(stack - 4096, stack, "---p", "", 0, 0),
            map(stack, stack + 8 * MIB, "rw-p", "", 0, 64 << 10),
            map(0x7f20_0000_0000, 0x7f20_0010_0000, "rw-s", "/dev/shm/x", 99, 2 * MIB),
            map(0x7f30_0000_0000, 0x7f30_0100_0000, "rw-p", "", 0, 3 * MIB),
            map(0x7ffd_0000_0000, 0x7ffd_0002_1000, "rw-p", "[stack]", 0, 132 << 10),
            map(0x7ffd_1000_0000, 0x7ffd_1000_2000, "r-xp", "[vdso]", 0, 8192),
        ];
        let total: u64 = maps.iter().map(|m| m.rss).sum();
        let l = outside_ledger(&reading(maps, total));
        assert_eq!(
            l.mappings.iter().map(|m| m.class.as_str()).collect::<Vec<_>>(),
            ["file", "file", "static data", "heap", "heap", "other", "heap", "other", "stack", "shmem", "heap", "stack", "other"]
        );
        assert_eq!(l.groups.heap, (20 + 30 + 64 + 3) * MIB);
        assert_eq!(l.rows.heap, l.groups.heap - MIB);
        assert_eq!(l.rows.lazy_free, MIB);
        assert_eq!(l.rows.runtime, (64 << 10) + (132 << 10));
        assert_eq!(l.rows.other, MIB + 4096 + 8192 + 2 * MIB + 8192);
        assert_eq!((l.rows.total(), l.residual_bytes), (total, 0));
        assert_eq!(l.arenas, 3, "main + the 33 MiB heap with its reservation + the full 64 MiB one");
        let kinds: Vec<_> = l.heaps.iter().map(|h| (h.kind.as_str(), h.reserved_bytes)).collect();
        assert_eq!(kinds, [("brk heap", 0), ("arena", 31 * MIB), ("arena", 0), ("mappings", 0)]);
        assert_eq!(l.unknown_rows, UNKNOWN_ROWS);
    }

    #[test]
    fn a_blocked_threads_stack_pointer_marks_its_stack() {
        let maps = vec![map(0x7f30_0000_0000, 0x7f30_0080_0000, "rw-p", "", 0, MIB)];
        let mut r = reading(maps, MIB);
        assert_eq!(outside_ledger(&r).mappings[0].class, MappingClass::Heap);
        r.stack_pointers = vec![0x7f30_007f_ff00];
        let l = outside_ledger(&r);
        assert_eq!((l.mappings[0].class, l.rows.runtime, l.heap_bytes), (MappingClass::Stack, MIB, 0));
    }

    #[test]
    fn other_allocators_have_no_arenas() {
        let arena = 0x7f00_0000_0000u64;
        let maps = vec![map(arena, arena + 64 * MIB, "rw-p", "", 0, MIB)];
        let mut r = reading(maps, MIB);
        r.allocator = "jemalloc".into();
        let l = outside_ledger(&r);
        assert_eq!((l.arenas, l.heaps[0].kind), (0, HeapKind::Mappings));
    }

    #[test]
    fn committed_bytes_alone_split_no_row() {
        let maps = vec![map(0x7f00_0000_0000, 0x7f00_0200_0000, "rw-p", "", 0, 20 * MIB)];
        let mut r = reading(maps, 20 * MIB);
        r.allocator = "mimalloc".into();
        r.allocator_stats =
            Some(AllocatorStats { allocator: "mimalloc".into(), mapped_bytes: Some(32 * MIB), ..AllocatorStats::default() });
        let l = outside_ledger(&r);
        assert_eq!(l.allocator_stats.as_ref().and_then(|s| s.committed_only()), Some(32 * MIB));
        assert_eq!((l.allocator_rows, l.rows.heap), (None, 20 * MIB));
        assert_eq!(l.unknown_rows, UNKNOWN_ROWS);
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json["allocator_stats"]["mapped_bytes"], 32 * MIB);
        assert!(json.get("allocator_rows").is_none(), "{json:#}");
    }

    #[test]
    fn trim_report() {
        let ledger =
            |rss, heap| ProcessLedger { pid: 9, rss_bytes: rss, groups: Groups { heap, ..Groups::default() }, ..ProcessLedger::default() };
        let report = TrimReport::new(
            &ledger(100 * MIB, 80 * MIB),
            &ledger(40 * MIB, 20 * MIB),
            TrimCall { method: "ptrace".into(), ..TrimCall::default() },
        );
        assert_eq!((report.returned_bytes, report.heap_returned_bytes), (60 * MIB as i64, 60 * MIB as i64));
        assert_eq!(report.heap_returned_percent, 75.0);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!((json["method"].as_str(), json["malloc_trim_returned"].as_i64()), (Some("ptrace"), Some(0)));
    }

    #[test]
    fn cgroup_headroom() {
        let c = CgroupMemory { current_bytes: 750, max_bytes: Some(1000), ..CgroupMemory::default() };
        let c = assess(c);
        assert_eq!((c.used_percent, c.headroom_bytes), (Some(75.0), Some(250)));
        let unlimited = assess(CgroupMemory { current_bytes: 750, ..CgroupMemory::default() });
        assert_eq!((unlimited.used_percent, unlimited.headroom_bytes), (None, None));
    }
}
