//! The Go runtime's own accounting of a running Go program, read from its
//! memory with process_vm_readv: no helper package, no HTTP endpoint, no
//! stop. memgap computes what `runtime.ReadMemStats` would return from the
//! same state it reads (runtime/mstats.go, readmemstats_m): the consistent
//! heap statistics (`memstats.heapStats`, all three shards summed),
//! `gcController.heapInUse/heapFree/heapReleased`, the `*_sys` counters and
//! `mheap_`'s fixed allocators. ReadMemStats first flushes every P's mcache;
//! memgap cannot, so it adds what the flush would add: the slots each cached
//! span handed out since it was cached (`allocCount −
//! allocCountBeforeCache`, counted only when a span leaves the cache).
//!
//! The running program changes these words while they are read: the whole
//! set is read until two reads in a row agree (at most [`READS`]), else the
//! last one is kept and said to be unsettled.

use std::collections::HashMap;

use memgap_source_go::memstats::MemStats;
use object::{Object, ObjectSegment, ObjectSymbol};

use crate::go_layout::{Field, LayoutError, Types, data_symbols};
use crate::remote_memory::{Memory, ProcessMemory};

/// Reads of the whole set before the last one is kept.
const READS: u32 = 6;
/// Ps whose mcaches are read at most (GOMAXPROCS is rarely above this).
const MAX_PROCS: u64 = 4096;

const MEMSTATS: &str = "runtime.memstats";
const GC_CONTROLLER: &str = "runtime.gcController";
const MHEAP: &str = "runtime.mheap_";
const ALLP: &str = "runtime.allp";
const EMPTY_SPAN: &str = "runtime.emptymspan";
/// The runtime's size-class table (Go 1.24+, then `runtime.class_to_size`).
const CLASS_SIZES: [&str; 2] = ["internal/runtime/gc.SizeClassToSize", "runtime.class_to_size"];

/// What was read from a Go program.
#[derive(Debug, Clone, Default)]
pub struct GoRuntimeReading {
    /// As the executable's build information spells it (`go1.26.8`).
    pub version: String,
    pub stats: MemStats,
    /// Reads of the whole set until two agreed.
    pub reads: u32,
    /// The last two reads still differed (the program was busy allocating).
    pub unsettled: bool,
    /// Bytes handed out from the Ps' cached spans, not yet in the counters.
    pub cached_span_bytes: u64,
}

impl GoRuntimeReading {
    /// The reading as the METRICS records a recording of the program would
    /// hold (the build's version and size classes, then MemStats restated
    /// in runtime/metrics names), stamped `monotonic_ns`.
    pub fn metrics(&self, monotonic_ns: u64) -> Vec<memgap_trace::records::Metrics> {
        let mut out = memgap_source_go::version_metrics(&self.version, monotonic_ns);
        out.push(memgap_trace::records::Metrics {
            monotonic_ns,
            source: memgap_source_go::SOURCE.into(),
            kind: memgap_trace::vocabulary::kind::PROCESS_MEMORY.into(),
            values: self.stats.to_metric_values(),
        });
        out
    }
}

/// Where everything is in one executable.
#[derive(Debug, Clone)]
struct Layout {
    memstats: u64,
    gc_controller: u64,
    mheap: u64,
    allp: u64,
    empty_span: u64,
    class_sizes: (u64, u64),
    /// `memstats.heapStats.stats`: three heapStatsDelta shards.
    shards: Field,
    shard_size: u64,
    delta: HashMap<&'static str, Field>,
    memstats_fields: HashMap<&'static str, Field>,
    controller_fields: HashMap<&'static str, Field>,
    mheap_fields: HashMap<&'static str, Field>,
    p_mcache: Field,
    mcache_alloc: Field,
    span_fields: HashMap<&'static str, Field>,
}

const DELTA_FIELDS: [&str; 12] = [
    "committed",
    "released",
    "inHeap",
    "inStacks",
    "inWorkBufs",
    "tinyAllocCount",
    "largeAlloc",
    "largeAllocCount",
    "smallAllocCount",
    "largeFree",
    "largeFreeCount",
    "smallFreeCount",
];
const MEMSTATS_FIELDS: [&str; 7] = ["stacks_sys", "mspan_sys", "mcache_sys", "buckhash_sys", "gcMiscSys", "other_sys", "numgc"];
const CONTROLLER_FIELDS: [&str; 3] = ["heapInUse", "heapFree", "heapReleased"];
const MHEAP_FIELDS: [&str; 2] = ["spanalloc.inuse", "cachealloc.inuse"];
const SPAN_FIELDS: [&str; 3] = ["allocCount", "allocCountBeforeCache", "elemsize"];

fn fields(types: &Types, root: &str, names: &[&'static str]) -> Result<HashMap<&'static str, Field>, LayoutError> {
    names.iter().map(|&name| Ok((name, types.field(root, name)?))).collect()
}

impl Layout {
    fn of(elf: &object::File<'_>, base: u64) -> Result<Layout, String> {
        let wanted = [MEMSTATS, GC_CONTROLLER, MHEAP, ALLP, EMPTY_SPAN, CLASS_SIZES[0], CLASS_SIZES[1]];
        let symbols = data_symbols(elf, &wanted, base);
        if symbols.is_empty() {
            return Err("the executable has no symbol table (stripped)".into());
        }
        let symbol = |name: &str| symbols.get(name).copied().ok_or_else(|| format!("its symbol table has no {name}"));
        let class_sizes = CLASS_SIZES
            .iter()
            .find_map(|name| {
                let address = *symbols.get(*name)?;
                let size = elf.symbols().find(|s| s.name() == Ok(*name))?.size();
                Some((address, size))
            })
            .ok_or("its symbol table has no size-class table")?;
        let types = Types::read(elf).map_err(|e| e.to_string())?;
        let layout = (|| -> Result<Layout, LayoutError> {
            Ok(Layout {
                memstats: 0,
                gc_controller: 0,
                mheap: 0,
                allp: 0,
                empty_span: 0,
                class_sizes,
                shards: types.field("runtime.mstats", "heapStats.stats")?,
                shard_size: types.size("runtime.heapStatsDelta")?,
                delta: fields(&types, "runtime.heapStatsDelta", &DELTA_FIELDS)?,
                memstats_fields: fields(&types, "runtime.mstats", &MEMSTATS_FIELDS)?,
                controller_fields: fields(&types, "runtime.gcControllerState", &CONTROLLER_FIELDS)?,
                mheap_fields: fields(&types, "runtime.mheap", &MHEAP_FIELDS)?,
                p_mcache: types.field("runtime.p", "mcache")?,
                mcache_alloc: types.field("runtime.mcache", "alloc")?,
                span_fields: fields(&types, "runtime.mspan", &SPAN_FIELDS)?,
            })
        })()
        .map_err(|e| e.to_string())?;
        Ok(Layout {
            memstats: symbol(MEMSTATS)?,
            gc_controller: symbol(GC_CONTROLLER)?,
            mheap: symbol(MHEAP)?,
            allp: symbol(ALLP)?,
            empty_span: symbol(EMPTY_SPAN)?,
            ..layout
        })
    }
}

/// Reads little-endian unsigned fields out of a buffer read from `base`.
struct Block {
    base: u64,
    bytes: Vec<u8>,
}

impl Block {
    fn read(memory: &dyn Memory, base: u64, len: u64) -> Option<Block> {
        let mut bytes = vec![0u8; usize::try_from(len).ok()?];
        memory.read(base, &mut bytes).then_some(Block { base, bytes })
    }

    /// The unsigned value of `size` bytes at `at` (an absolute address).
    fn unsigned(&self, at: u64, size: u64) -> Option<u64> {
        let start = usize::try_from(at.checked_sub(self.base)?).ok()?;
        let bytes = self.bytes.get(start..start + size as usize)?;
        let mut word = [0u8; 8];
        word[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
        Some(u64::from_le_bytes(word))
    }

    fn field(&self, root: u64, field: Field) -> Option<u64> {
        self.unsigned(root + field.offset, field.size)
    }
}

fn extent(fields: &HashMap<&'static str, Field>) -> u64 {
    fields.values().map(|f| f.offset + f.size).max().unwrap_or(0)
}

/// One read of the whole set: MemStats' fields and the cached-span bytes.
fn read_once(memory: &dyn Memory, layout: &Layout) -> Result<(MemStats, u64), String> {
    let unreadable = |what: &str| format!("cannot read the Go runtime's {what}");
    let memstats_len = (layout.shards.offset + layout.shards.size).max(extent(&layout.memstats_fields));
    let memstats = Block::read(memory, layout.memstats, memstats_len).ok_or_else(|| unreadable("memstats"))?;
    let controller =
        Block::read(memory, layout.gc_controller, extent(&layout.controller_fields)).ok_or_else(|| unreadable("gcController"))?;
    let mheap = Block::read(memory, layout.mheap, extent(&layout.mheap_fields)).ok_or_else(|| unreadable("mheap_"))?;
    let classes = Block::read(memory, layout.class_sizes.0, layout.class_sizes.1).ok_or_else(|| unreadable("size classes"))?;

    // The three shards summed, as consistentHeapStats.unsafeRead does.
    let shard_count = layout.shards.size / layout.shard_size.max(1);
    let mut sums: HashMap<&str, u64> = HashMap::new();
    let small_alloc = layout.delta["smallAllocCount"];
    let small_free = layout.delta["smallFreeCount"];
    let class_count = small_alloc.size / 8;
    let class_width = layout.class_sizes.1 / class_count.max(1);
    if class_count == 0 || small_free.size != small_alloc.size || !matches!(class_width, 1 | 2 | 4 | 8) {
        return Err("its size-class tables are laid out as memgap does not know".into());
    }
    let class_size = |class: u64| classes.unsigned(layout.class_sizes.0 + class * class_width, class_width).unwrap_or(0);
    let (mut total_alloc, mut total_free) = (0u64, 0u64);
    let mut by_size = vec![(0u64, 0u64, 0u64); class_count as usize];
    for shard in 0..shard_count {
        let root = layout.memstats + layout.shards.offset + shard * layout.shard_size;
        for name in DELTA_FIELDS.iter().filter(|n| !n.starts_with("small")) {
            let value = memstats.field(root, layout.delta[name]).ok_or_else(|| unreadable(name))?;
            let sum = sums.entry(name).or_insert(0);
            *sum = sum.wrapping_add(value);
        }
        for class in 0..class_count {
            let word = |f: Field| memstats.unsigned(root + f.offset + class * 8, 8).unwrap_or(0);
            let (allocs, frees) = (word(small_alloc), word(small_free));
            let entry = &mut by_size[class as usize];
            entry.1 = entry.1.wrapping_add(allocs);
            entry.2 = entry.2.wrapping_add(frees);
        }
    }
    for (class, entry) in by_size.iter_mut().enumerate() {
        entry.0 = class_size(class as u64);
        total_alloc = total_alloc.wrapping_add(entry.1.wrapping_mul(entry.0));
        total_free = total_free.wrapping_add(entry.2.wrapping_mul(entry.0));
    }
    total_alloc = total_alloc.wrapping_add(sums["largeAlloc"]);
    total_free = total_free.wrapping_add(sums["largeFree"]);
    let cached = cached_span_bytes(memory, layout)?;
    total_alloc = total_alloc.wrapping_add(cached);

    let ms = |name: &str| memstats.field(layout.memstats, layout.memstats_fields[name]).unwrap_or(0);
    let gc = |name: &str| controller.field(layout.gc_controller, layout.controller_fields[name]).unwrap_or(0);
    let heap = |name: &str| mheap.field(layout.mheap, layout.mheap_fields[name]).unwrap_or(0);
    let (in_use, free, released) = (gc("heapInUse"), gc("heapFree"), gc("heapReleased"));
    // The deltas are signed, summed as they come; their total is not.
    let stacks = sums["inStacks"] as i64;
    let work_bufs = sums["inWorkBufs"] as i64;
    if stacks < 0 || work_bufs < 0 || total_free > total_alloc {
        return Err("the Go runtime's counters read inconsistently".into());
    }
    let (stacks, work_bufs) = (stacks as u64, work_bufs as u64);
    let sys = ["stacks_sys", "mspan_sys", "mcache_sys", "buckhash_sys", "gcMiscSys", "other_sys"].iter().map(|n| ms(n)).sum::<u64>()
        + in_use
        + free
        + released
        + stacks
        + work_bufs;
    let heap_alloc = total_alloc - total_free;
    let mut stats = MemStats::default();
    for (name, value) in [
        ("HeapAlloc", heap_alloc),
        ("Alloc", heap_alloc),
        ("TotalAlloc", total_alloc),
        ("HeapInuse", in_use),
        ("HeapIdle", free + released),
        ("HeapReleased", released),
        ("HeapSys", in_use + free + released),
        ("Sys", sys),
        ("StackInuse", stacks),
        ("StackSys", stacks + ms("stacks_sys")),
        ("MSpanInuse", heap("spanalloc.inuse")),
        ("MSpanSys", ms("mspan_sys")),
        ("MCacheInuse", heap("cachealloc.inuse")),
        ("MCacheSys", ms("mcache_sys")),
        ("BuckHashSys", ms("buckhash_sys")),
        ("GCSys", ms("gcMiscSys") + work_bufs),
        ("OtherSys", ms("other_sys")),
        ("NumGC", ms("numgc")),
    ] {
        stats.fields.insert(name.to_string(), value);
    }
    stats.by_size = by_size.into_iter().filter(|&(size, ..)| size > 0).collect();
    Ok((stats, cached))
}

/// What flushing every P's mcache would add to the allocation counters:
/// the slots each cached span handed out since it was cached.
fn cached_span_bytes(memory: &dyn Memory, layout: &Layout) -> Result<u64, String> {
    let Some(allp) = Block::read(memory, layout.allp, 16) else { return Err("cannot read runtime.allp".into()) };
    let (array, len) = (allp.unsigned(layout.allp, 8).unwrap_or(0), allp.unsigned(layout.allp + 8, 8).unwrap_or(0));
    if len > MAX_PROCS {
        return Err(format!("runtime.allp says {len} Ps: not a state memgap trusts"));
    }
    let Some(ps) = Block::read(memory, array, len * 8) else { return Err("cannot read the Ps".into()) };
    let span_len = extent(&layout.span_fields);
    let slots = layout.mcache_alloc.size / 8;
    let mut bytes = 0u64;
    let mut seen = std::collections::HashSet::new();
    for i in 0..len {
        let p = ps.unsigned(array + i * 8, 8).unwrap_or(0);
        if p == 0 {
            continue;
        }
        let Some(mcache) = memory.word(p + layout.p_mcache.offset).filter(|&m| m != 0) else { continue };
        let Some(alloc) = Block::read(memory, mcache + layout.mcache_alloc.offset, layout.mcache_alloc.size) else { continue };
        for slot in 0..slots {
            let span = alloc.unsigned(alloc.base + slot * 8, 8).unwrap_or(0);
            if span == 0 || span == layout.empty_span || !seen.insert(span) {
                continue;
            }
            let Some(fields) = Block::read(memory, span, span_len) else { continue };
            let get = |name: &str| fields.field(span, layout.span_fields[name]).unwrap_or(0);
            let used = get("allocCount").saturating_sub(get("allocCountBeforeCache"));
            bytes = bytes.saturating_add(used.saturating_mul(get("elemsize")));
        }
    }
    Ok(bytes)
}

/// Where the executable mapped from `mapping` was loaded (0 for a
/// position-dependent one, Go's default on linux/amd64).
fn load_base(elf: &object::File<'_>, mappings: &[memgap_trace::records::Mapping], inode: u64) -> u64 {
    let Some(first) = mappings.iter().filter(|m| m.inode == inode).min_by_key(|m| m.offset) else { return 0 };
    let lowest = elf.segments().filter(|s| s.file_range().0 == 0).map(|s| s.address()).min().unwrap_or(0);
    first.start.wrapping_sub(lowest & !0xfff)
}

/// One executable as one process runs it: the pid, the file's identity
/// (device, inode, size, modification time) and where it was loaded. A
/// watch reads a process again and again; its executable's DWARF is read
/// once for all these readings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ExecutableKey {
    pid: u32,
    device: u64,
    inode: u64,
    size: u64,
    modified: (i64, i64),
    loaded_at: u64,
}

impl ExecutableKey {
    fn of(pid: u32, metadata: &std::fs::Metadata, mappings: &[memgap_trace::records::Mapping]) -> ExecutableKey {
        use std::os::unix::fs::MetadataExt;
        let inode = metadata.ino();
        let loaded_at = mappings.iter().filter(|m| m.inode == inode).map(|m| m.start).min().unwrap_or(0);
        ExecutableKey {
            pid,
            device: metadata.dev(),
            inode,
            size: metadata.len(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
            loaded_at,
        }
    }
}

/// What an executable says of its Go runtime: its version and where the
/// runtime's accounting lies (`None`: not a Go program), or why memgap
/// cannot read it.
type KnownLayout = Result<(String, Option<Layout>), String>;

static LAYOUTS: std::sync::LazyLock<std::sync::Mutex<HashMap<ExecutableKey, KnownLayout>>> = std::sync::LazyLock::new(Default::default);
const MAX_LAYOUTS: usize = 4096;

/// Reads the executable `file` (its build info, symbols and DWARF).
fn executable_layout(file: &std::fs::File, metadata: &std::fs::Metadata, mappings: &[memgap_trace::records::Mapping]) -> KnownLayout {
    // SAFETY: the process's executable, mapped read-only.
    let Ok(data) = (unsafe { memmap2::Mmap::map(file) }) else { return Ok((String::new(), None)) };
    let Some(go) = memgap_source_go::buildinfo::detect_bytes(&data) else { return Ok((String::new(), None)) };
    let elf = object::File::parse(&*data).map_err(|e| format!("the Go executable is not ELF as memgap reads it ({e})"))?;
    let inode = std::os::unix::fs::MetadataExt::ino(metadata);
    let base = if elf.kind() == object::ObjectKind::Dynamic { load_base(&elf, mappings, inode) } else { 0 };
    let layout = Layout::of(&elf, base).map_err(|why| format!("{} runtime: {why}", go.version))?;
    Ok((go.version, Some(layout)))
}

/// The Go runtime's accounting of process `pid`: `Ok(None)` when it is not
/// a Go program, `Err(why)` when it is one whose accounting memgap cannot
/// read (no symbols or DWARF, an unknown layout, unreadable memory).
pub fn read_go_runtime(pid: u32, mappings: &[memgap_trace::records::Mapping]) -> Result<Option<GoRuntimeReading>, String> {
    let exe = format!("/proc/{pid}/exe");
    let Ok(file) = std::fs::File::open(&exe) else { return Ok(None) };
    let Ok(metadata) = file.metadata() else { return Ok(None) };
    let key = ExecutableKey::of(pid, &metadata, mappings);
    let known = LAYOUTS.lock().ok().and_then(|layouts| layouts.get(&key).cloned());
    let (version, layout) = match known {
        Some(known) => known?,
        None => {
            let found = executable_layout(&file, &metadata, mappings);
            if let Ok(mut layouts) = LAYOUTS.lock() {
                // Bounded: `memgap watch --all` meets every process there is.
                if layouts.len() >= MAX_LAYOUTS {
                    layouts.clear();
                }
                layouts.insert(key, found.clone());
            }
            found?
        }
    };
    let Some(layout) = layout else { return Ok(None) };
    let memory = ProcessMemory::new(pid);
    let mut previous: Option<(MemStats, u64)> = None;
    let mut failure = String::new();
    for read in 1..=READS {
        let current = match read_once(&memory, &layout) {
            Ok(current) => current,
            Err(why) => {
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    return Err(format!("process {pid} exited while memgap read it"));
                }
                previous = None;
                failure = why;
                continue;
            }
        };
        let settled = previous.as_ref().is_some_and(|p| p.0 == current.0);
        if settled || read == READS {
            return Ok(Some(GoRuntimeReading {
                version,
                reads: read,
                unsettled: !settled,
                cached_span_bytes: current.1,
                stats: current.0,
            }));
        }
        previous = Some(current);
    }
    Err(format!("{version} runtime: {failure}"))
}
