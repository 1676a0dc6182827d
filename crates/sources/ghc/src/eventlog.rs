//! The GHC RTS eventlog, a big-endian binary stream (ghc/ghc
//! `rts/include/rts/EventLogFormat.h`, `docs/users_guide/eventlog-formats.rst`):
//!
//! ```text
//! "hdrb" "hetb" { "etb\0" id:u16 size:i16 desc_len:u32 desc extra_len:u32 extra "ete\0" }* "hete" "hdre"
//! "datb" { id:u16 time_ns:u64 [size:u16 when the type's size is -1] payload }* 0xffff
//! ```
//!
//! The header gives each event type's payload size, so types this parser
//! does not know are skipped, and a known type with a longer payload than
//! expected (a newer RTS appending fields) is read for its leading fields.
//! A log cut short (the program is still running or was killed) is read up
//! to its last complete event. Every length comes from the input and is
//! checked against the bytes left before anything is sliced; nothing is
//! allocated ahead from a length field.

use std::collections::BTreeMap;

const HEADER_BEGIN: u32 = 0x6864_7262; // "hdrb"
const HET_BEGIN: u32 = 0x6865_7462; // "hetb"
const HET_END: u32 = 0x6865_7465; // "hete"
const ET_BEGIN: u32 = 0x6574_6200; // "etb\0"
const ET_END: u32 = 0x6574_6500; // "ete\0"
const HEADER_END: u32 = 0x6864_7265; // "hdre"
const DATA_BEGIN: u32 = 0x6461_7462; // "datb"
const DATA_END: u16 = 0xffff;
const VARIABLE_SIZE: i16 = -1;

/// Event type ids (ghc/ghc `rts/gen_event_types.py`).
pub mod ids {
    pub const CREATE_THREAD: u16 = 0;
    pub const GC_START: u16 = 9;
    pub const GC_END: u16 = 10;
    pub const BLOCK_MARKER: u16 = 18;
    pub const CAPSET_ASSIGN_CAP: u16 = 27;
    pub const RTS_IDENTIFIER: u16 = 29;
    pub const PROGRAM_ARGS: u16 = 30;
    pub const WALL_CLOCK_TIME: u16 = 43;
    pub const CAP_CREATE: u16 = 45;
    pub const HEAP_ALLOCATED: u16 = 49;
    pub const HEAP_SIZE: u16 = 50;
    pub const HEAP_LIVE: u16 = 51;
    pub const HEAP_INFO_GHC: u16 = 52;
    pub const GC_STATS_GHC: u16 = 53;
    pub const MEM_RETURN: u16 = 90;
    pub const BLOCKS_SIZE: u16 = 91;
    pub const HEAP_PROF_BEGIN: u16 = 160;
    pub const HEAP_PROF_COST_CENTRE: u16 = 161;
    pub const HEAP_PROF_SAMPLE_BEGIN: u16 = 162;
    pub const HEAP_PROF_SAMPLE_COST_CENTRE: u16 = 163;
    pub const HEAP_PROF_SAMPLE_STRING: u16 = 164;
    pub const HEAP_PROF_SAMPLE_END: u16 = 165;
}

/// Capability number of events written outside any capability's buffer.
pub const NO_CAPABILITY: u16 = 0xffff;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventlogError {
    #[error("not a GHC eventlog (it does not start with \"hdrb\"); build the program with -eventlog and run it with +RTS -l")]
    NotAnEventlog,
    #[error("the eventlog header is cut short or damaged at byte {0}")]
    BadHeader(usize),
}

/// One entry of the header's event-type table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventType {
    pub id: u16,
    /// Payload bytes, or `None` when each event carries its own size.
    pub size: Option<u16>,
    pub description: String,
}

/// Heap profile breakdowns (`+RTS -h…`), from `EventLogFormat.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakdown {
    CostCentre,
    Module,
    ClosureDescription,
    TypeDescription,
    Retainer,
    Biography,
    /// `-hT`: closure types (ARR_WORDS, :, …); needs no profiling build.
    ClosureType,
    InfoTable,
    Other(u32),
}

impl Breakdown {
    pub fn from_code(code: u32) -> Breakdown {
        match code {
            1 => Breakdown::CostCentre,
            2 => Breakdown::Module,
            3 => Breakdown::ClosureDescription,
            4 => Breakdown::TypeDescription,
            5 => Breakdown::Retainer,
            6 => Breakdown::Biography,
            7 => Breakdown::ClosureType,
            8 => Breakdown::InfoTable,
            other => Breakdown::Other(other),
        }
    }

    pub fn code(self) -> u32 {
        match self {
            Breakdown::CostCentre => 1,
            Breakdown::Module => 2,
            Breakdown::ClosureDescription => 3,
            Breakdown::TypeDescription => 4,
            Breakdown::Retainer => 5,
            Breakdown::Biography => 6,
            Breakdown::ClosureType => 7,
            Breakdown::InfoTable => 8,
            Breakdown::Other(code) => code,
        }
    }

    /// The `+RTS` flag that selects it.
    pub fn flag(self) -> &'static str {
        match self {
            Breakdown::CostCentre => "-hc",
            Breakdown::Module => "-hm",
            Breakdown::ClosureDescription => "-hd",
            Breakdown::TypeDescription => "-hy",
            Breakdown::Retainer => "-hr",
            Breakdown::Biography => "-hb",
            Breakdown::ClosureType => "-hT",
            Breakdown::InfoTable => "-hi",
            Breakdown::Other(_) => "-h?",
        }
    }
}

/// The events memgap reads; everything else is skipped.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    CreateThread {
        thread: u32,
    },
    CapCreate {
        cap: u16,
    },
    CapsetAssignCap {
        capset: u32,
        cap: u16,
    },
    GcStart,
    GcEnd,
    RtsIdentifier(String),
    ProgramArgs(Vec<String>),
    /// Wall-clock time at the event's timestamp: ties RTS time to the epoch.
    WallClockTime {
        seconds: u64,
        nanoseconds: u32,
    },
    /// Bytes ever allocated.
    HeapAllocated {
        bytes: u64,
    },
    /// Megablocks held × megablock size, after each GC.
    HeapSize {
        bytes: u64,
    },
    /// Live bytes, after major GCs.
    HeapLive {
        bytes: u64,
    },
    HeapInfo {
        generations: u16,
        max_heap_bytes: u64,
        alloc_area_bytes: u64,
        mblock_bytes: u64,
        block_bytes: u64,
    },
    GcStats {
        generation: u16,
        copied_bytes: u64,
        slop_bytes: u64,
        fragmentation_bytes: u64,
        par_threads: u32,
        par_max_copied: u64,
        par_total_copied: u64,
    },
    /// GHC ≥ 9.2: megablocks held, needed, and returned after a major GC.
    MemReturn {
        current_mblocks: u32,
        needed_mblocks: u32,
        returned_mblocks: u32,
    },
    /// GHC ≥ 9.2: allocated blocks × block size.
    BlocksSize {
        bytes: u64,
    },
    HeapProfBegin {
        profile: u8,
        period_ns: u64,
        breakdown: Breakdown,
    },
    HeapProfCostCentre {
        id: u32,
        label: String,
        module: String,
        source: String,
    },
    HeapProfSampleBegin {
        era: u64,
    },
    HeapProfSampleEnd {
        era: u64,
    },
    /// A census line: residency of one label (-hT closure type, -hy type…).
    HeapProfSampleString {
        profile: u8,
        residency_bytes: u64,
        label: String,
    },
    /// A census line keyed by a cost-centre stack (innermost first).
    HeapProfSampleCostCentre {
        profile: u8,
        residency_bytes: u64,
        stack: Vec<u32>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Nanoseconds since the RTS started.
    pub time_ns: u64,
    /// The capability whose buffer held the event ([`NO_CAPABILITY`] for the global one).
    pub cap: u16,
    pub kind: EventKind,
}

/// A parsed eventlog: the type table and the decoded events in time order.
#[derive(Debug, Clone, Default)]
pub struct Eventlog {
    pub types: BTreeMap<u16, EventType>,
    pub events: Vec<Event>,
    /// Events seen by type id, decoded or not.
    pub counts: BTreeMap<u16, u64>,
    /// The stream ended before its end marker: the last event read is the
    /// last complete one.
    pub truncated: bool,
    /// Bytes read up to the last complete event.
    pub complete_bytes: usize,
    /// Events whose payload was shorter than their type needs (skipped).
    pub malformed_events: u64,
}

impl Eventlog {
    pub fn has_type(&self, id: u16) -> bool {
        self.types.contains_key(&id)
    }

    pub fn rts_identifier(&self) -> Option<&str> {
        self.events.iter().find_map(|e| match &e.kind {
            EventKind::RtsIdentifier(name) => Some(name.as_str()),
            _ => None,
        })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let slice = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(slice)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_be_bytes(b.try_into().unwrap()))
    }
    fn expect(&mut self, marker: u32) -> Option<()> {
        (self.u32()? == marker).then_some(())
    }
    /// A NUL-terminated string (the NUL may be missing at the payload's end).
    fn c_string(&mut self) -> Option<String> {
        let rest = self.bytes.get(self.pos..)?;
        let len = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let text = String::from_utf8_lossy(&rest[..len]).into_owned();
        self.pos += (len + 1).min(rest.len());
        Some(text)
    }
}

/// Parses a whole eventlog held in memory.
pub fn parse(bytes: &[u8]) -> Result<Eventlog, EventlogError> {
    let mut reader = Reader { bytes, pos: 0 };
    if reader.u32() != Some(HEADER_BEGIN) {
        return Err(EventlogError::NotAnEventlog);
    }
    let types = parse_header(&mut reader).ok_or(EventlogError::BadHeader(reader.pos))?;
    let mut log = Eventlog { types, ..Eventlog::default() };
    parse_data(&mut reader, &mut log);
    // Capabilities flush their buffers independently: blocks are in file
    // order, not time order. A stable sort keeps each buffer's own order.
    log.events.sort_by_key(|e| e.time_ns);
    Ok(log)
}

fn parse_header(reader: &mut Reader<'_>) -> Option<BTreeMap<u16, EventType>> {
    reader.expect(HET_BEGIN)?;
    let mut types = BTreeMap::new();
    loop {
        match reader.u32()? {
            ET_BEGIN => {}
            HET_END => break,
            _ => return None,
        }
        let id = reader.u16()?;
        let size = reader.u16()? as i16;
        let desc_len = reader.u32()? as usize;
        let description = String::from_utf8_lossy(reader.take(desc_len)?).into_owned();
        let extra_len = reader.u32()? as usize;
        reader.take(extra_len)?;
        reader.expect(ET_END)?;
        let size = match size {
            VARIABLE_SIZE => None,
            size if size >= 0 => Some(size as u16),
            _ => return None,
        };
        types.insert(id, EventType { id, size, description });
    }
    reader.expect(HEADER_END)?;
    reader.expect(DATA_BEGIN)?;
    Some(types)
}

fn parse_data(reader: &mut Reader<'_>, log: &mut Eventlog) {
    // The capability of the block being read, and where that block ends.
    let mut block: Option<(u16, usize)> = None;
    log.complete_bytes = reader.pos;
    loop {
        let start = reader.pos;
        let Some(id) = reader.u16() else { break };
        if id == DATA_END {
            log.complete_bytes = reader.pos;
            return;
        }
        let Some(time_ns) = reader.u64() else { break };
        let Some(event_type) = log.types.get(&id) else {
            // An id missing from the header cannot be sized: nothing after it
            // can be trusted. Stop as at a cut.
            break;
        };
        let size = match event_type.size {
            Some(size) => size,
            None => match reader.u16() {
                Some(size) => size,
                None => break,
            },
        };
        let Some(payload) = reader.take(usize::from(size)) else { break };
        log.complete_bytes = reader.pos;
        *log.counts.entry(id).or_default() += 1;
        if block.is_some_and(|(_, end)| start >= end) {
            block = None;
        }
        if id == ids::BLOCK_MARKER {
            let mut fields = Reader { bytes: payload, pos: 0 };
            if let (Some(block_size), Some(_end_time), Some(cap)) = (fields.u32(), fields.u64(), fields.u16()) {
                block = Some((cap, start.saturating_add(block_size as usize)));
            }
            continue;
        }
        let cap = block.map_or(NO_CAPABILITY, |(cap, _)| cap);
        match decode(id, payload) {
            Decoded::Event(kind) => log.events.push(Event { time_ns, cap, kind }),
            Decoded::Short => log.malformed_events += 1,
            Decoded::NotRead => {}
        }
    }
    log.truncated = true;
}

enum Decoded {
    Event(EventKind),
    /// A known type whose payload is shorter than its fields.
    Short,
    NotRead,
}

fn decode(id: u16, payload: &[u8]) -> Decoded {
    let mut r = Reader { bytes: payload, pos: 0 };
    let kind = match id {
        ids::CREATE_THREAD => r.u32().map(|thread| EventKind::CreateThread { thread }),
        ids::CAP_CREATE => r.u16().map(|cap| EventKind::CapCreate { cap }),
        ids::CAPSET_ASSIGN_CAP => (|| Some(EventKind::CapsetAssignCap { capset: r.u32()?, cap: r.u16()? }))(),
        ids::GC_START => Some(EventKind::GcStart),
        ids::GC_END => Some(EventKind::GcEnd),
        ids::RTS_IDENTIFIER => (|| {
            r.u32()?;
            r.c_string().map(EventKind::RtsIdentifier)
        })(),
        ids::PROGRAM_ARGS => (|| {
            r.u32()?;
            let args = r.bytes.get(r.pos..)?;
            let args = args.strip_suffix(&[0]).unwrap_or(args);
            Some(EventKind::ProgramArgs(args.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect()))
        })(),
        ids::WALL_CLOCK_TIME => (|| {
            r.u32()?;
            Some(EventKind::WallClockTime { seconds: r.u64()?, nanoseconds: r.u32()? })
        })(),
        ids::HEAP_ALLOCATED | ids::HEAP_SIZE | ids::HEAP_LIVE | ids::BLOCKS_SIZE => (|| {
            r.u32()?;
            let bytes = r.u64()?;
            Some(match id {
                ids::HEAP_ALLOCATED => EventKind::HeapAllocated { bytes },
                ids::HEAP_SIZE => EventKind::HeapSize { bytes },
                ids::HEAP_LIVE => EventKind::HeapLive { bytes },
                _ => EventKind::BlocksSize { bytes },
            })
        })(),
        ids::HEAP_INFO_GHC => (|| {
            r.u32()?;
            Some(EventKind::HeapInfo {
                generations: r.u16()?,
                max_heap_bytes: r.u64()?,
                alloc_area_bytes: r.u64()?,
                mblock_bytes: r.u64()?,
                block_bytes: r.u64()?,
            })
        })(),
        ids::GC_STATS_GHC => (|| {
            r.u32()?;
            Some(EventKind::GcStats {
                generation: r.u16()?,
                copied_bytes: r.u64()?,
                slop_bytes: r.u64()?,
                fragmentation_bytes: r.u64()?,
                // The users guide says Word64; the RTS writes a Word32 (58-byte payload).
                par_threads: r.u32()?,
                par_max_copied: r.u64()?,
                par_total_copied: r.u64()?,
            })
        })(),
        ids::MEM_RETURN => (|| {
            r.u32()?;
            Some(EventKind::MemReturn { current_mblocks: r.u32()?, needed_mblocks: r.u32()?, returned_mblocks: r.u32()? })
        })(),
        ids::HEAP_PROF_BEGIN => {
            (|| Some(EventKind::HeapProfBegin { profile: r.u8()?, period_ns: r.u64()?, breakdown: Breakdown::from_code(r.u32()?) }))()
        }
        ids::HEAP_PROF_COST_CENTRE => {
            (|| Some(EventKind::HeapProfCostCentre { id: r.u32()?, label: r.c_string()?, module: r.c_string()?, source: r.c_string()? }))()
        }
        ids::HEAP_PROF_SAMPLE_BEGIN => r.u64().map(|era| EventKind::HeapProfSampleBegin { era }),
        ids::HEAP_PROF_SAMPLE_END => r.u64().map(|era| EventKind::HeapProfSampleEnd { era }),
        ids::HEAP_PROF_SAMPLE_STRING => {
            (|| Some(EventKind::HeapProfSampleString { profile: r.u8()?, residency_bytes: r.u64()?, label: r.c_string()? }))()
        }
        ids::HEAP_PROF_SAMPLE_COST_CENTRE => (|| {
            let profile = r.u8()?;
            let residency_bytes = r.u64()?;
            let depth = r.u8()?;
            // At most 255 entries, each read from the payload: bounded.
            let mut stack = Vec::new();
            for _ in 0..depth {
                stack.push(r.u32()?);
            }
            Some(EventKind::HeapProfSampleCostCentre { profile, residency_bytes, stack })
        })(),
        _ => return Decoded::NotRead,
    };
    match kind {
        Some(kind) => Decoded::Event(kind),
        None => Decoded::Short,
    }
}

#[cfg(test)]
pub(crate) mod build {
    //! Eventlogs written byte by byte from the documented format, for tests.

    pub struct LogBuilder {
        pub bytes: Vec<u8>,
    }

    /// (id, size or -1, description) for the types the tests use.
    pub const TYPES: &[(u16, i16, &str)] = &[
        (0, 4, "Create thread"),
        (9, 0, "Starting GC"),
        (10, 0, "Finished GC"),
        (18, 14, "Block marker"),
        (29, -1, "RTS name and version"),
        (43, 16, "Wall clock time"),
        (45, 2, "Create capability"),
        (49, 12, "Total heap mem ever allocated"),
        (50, 12, "Current heap size (number of allocated mblocks)"),
        (51, 12, "Current heap live data"),
        (52, 38, "Heap static parameters"),
        (53, 58, "GC statistics"),
        (90, 16, "The RTS attempted to return heap memory to the OS"),
        (91, 12, "Report the size of the heap in blocks"),
        (160, -1, "Start of heap profile"),
        (162, 8, "Start of heap profile sample"),
        (164, -1, "Heap profile string sample"),
        (165, 8, "End of heap profile sample"),
        (999, 6, "A type from a newer RTS"),
    ];

    impl LogBuilder {
        pub fn new() -> LogBuilder {
            LogBuilder::with_types(TYPES)
        }

        pub fn with_types(types: &[(u16, i16, &str)]) -> LogBuilder {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(b"hdrbhetb");
            for &(id, size, description) in types {
                bytes.extend_from_slice(b"etb\0");
                bytes.extend_from_slice(&id.to_be_bytes());
                bytes.extend_from_slice(&size.to_be_bytes());
                bytes.extend_from_slice(&(description.len() as u32).to_be_bytes());
                bytes.extend_from_slice(description.as_bytes());
                bytes.extend_from_slice(&0u32.to_be_bytes());
                bytes.extend_from_slice(b"ete\0");
            }
            bytes.extend_from_slice(b"hetehdredatb");
            LogBuilder { bytes }
        }

        /// A fixed-size event.
        pub fn event(&mut self, id: u16, time: u64, payload: &[u8]) -> &mut Self {
            self.bytes.extend_from_slice(&id.to_be_bytes());
            self.bytes.extend_from_slice(&time.to_be_bytes());
            self.bytes.extend_from_slice(payload);
            self
        }

        /// A variable-size event.
        pub fn var_event(&mut self, id: u16, time: u64, payload: &[u8]) -> &mut Self {
            self.bytes.extend_from_slice(&id.to_be_bytes());
            self.bytes.extend_from_slice(&time.to_be_bytes());
            self.bytes.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            self.bytes.extend_from_slice(payload);
            self
        }

        /// Capset 0 then one u64: HeapAllocated, HeapSize, HeapLive, BlocksSize.
        pub fn heap(&mut self, id: u16, time: u64, bytes: u64) -> &mut Self {
            let mut payload = 0u32.to_be_bytes().to_vec();
            payload.extend_from_slice(&bytes.to_be_bytes());
            self.event(id, time, &payload)
        }

        pub fn gc_stats(&mut self, time: u64, generation: u16, copied: u64, slop: u64, frag: u64) -> &mut Self {
            let mut p = 0u32.to_be_bytes().to_vec();
            p.extend_from_slice(&generation.to_be_bytes());
            for v in [copied, slop, frag] {
                p.extend_from_slice(&v.to_be_bytes());
            }
            p.extend_from_slice(&1u32.to_be_bytes());
            for v in [0u64, 0, 0] {
                p.extend_from_slice(&v.to_be_bytes());
            }
            assert_eq!(p.len(), 58);
            self.event(53, time, &p)
        }

        pub fn mem_return(&mut self, time: u64, current: u32, needed: u32, returned: u32) -> &mut Self {
            let mut p = 0u32.to_be_bytes().to_vec();
            for v in [current, needed, returned] {
                p.extend_from_slice(&v.to_be_bytes());
            }
            self.event(90, time, &p)
        }

        /// A block marker covering the next `events_bytes` bytes of events.
        pub fn block(&mut self, time: u64, cap: u16, events_bytes: u32) -> &mut Self {
            let mut p = (events_bytes + 2 + 8 + 14).to_be_bytes().to_vec();
            p.extend_from_slice(&time.to_be_bytes());
            p.extend_from_slice(&cap.to_be_bytes());
            self.event(18, time, &p)
        }

        pub fn sample_string(&mut self, time: u64, bytes: u64, label: &str) -> &mut Self {
            let mut p = vec![0u8];
            p.extend_from_slice(&bytes.to_be_bytes());
            p.extend_from_slice(label.as_bytes());
            p.push(0);
            self.var_event(164, time, &p)
        }

        pub fn end(&mut self) -> Vec<u8> {
            self.bytes.extend_from_slice(&0xffffu16.to_be_bytes());
            self.bytes.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::LogBuilder;
    use super::*;

    fn kinds(log: &Eventlog) -> Vec<EventKind> {
        log.events.iter().map(|e| e.kind.clone()).collect()
    }

    #[test]
    fn reads_a_ghc_9_2_gc_with_mem_return_and_blocks_size() {
        let mut b = LogBuilder::new();
        let gc_bytes = (2 + 8) * 2 + (10 + 12) * 3 + (10 + 58) + (10 + 16);
        b.block(100, 0, gc_bytes);
        b.event(9, 100, &[]);
        b.heap(49, 101, 5 << 20);
        b.gc_stats(102, 1, 4096, 128, 3 << 20);
        b.event(10, 103, &[]);
        b.heap(51, 104, 1 << 20);
        b.heap(50, 105, 8 << 20);
        b.mem_return(106, 8, 4, 2);
        let log = parse(&b.heap(91, 107, 6 << 20).end()).unwrap();
        assert!(!log.truncated);
        assert_eq!(
            kinds(&log),
            vec![
                EventKind::GcStart,
                EventKind::HeapAllocated { bytes: 5 << 20 },
                EventKind::GcStats {
                    generation: 1,
                    copied_bytes: 4096,
                    slop_bytes: 128,
                    fragmentation_bytes: 3 << 20,
                    par_threads: 1,
                    par_max_copied: 0,
                    par_total_copied: 0
                },
                EventKind::GcEnd,
                EventKind::HeapLive { bytes: 1 << 20 },
                EventKind::HeapSize { bytes: 8 << 20 },
                EventKind::MemReturn { current_mblocks: 8, needed_mblocks: 4, returned_mblocks: 2 },
                EventKind::BlocksSize { bytes: 6 << 20 },
            ]
        );
        // Inside the block: capability 0; the last event lies past the block.
        assert!(log.events[..7].iter().all(|e| e.cap == 0), "{:?}", log.events);
        assert_eq!(log.events[7].cap, NO_CAPABILITY);
        assert_eq!(log.counts[&ids::BLOCK_MARKER], 1);
    }

    #[test]
    fn skips_unknown_types_by_header_size_and_reads_variable_ones() {
        let mut b = LogBuilder::new();
        b.event(999, 1, &[1, 2, 3, 4, 5, 6]);
        b.var_event(29, 2, b"\0\0\0\0GHC-9.2.8 rts_thr\0");
        b.var_event(160, 3, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0]);
        b.event(162, 4, &7u64.to_be_bytes());
        b.sample_string(5, 4096, "ARR_WORDS");
        b.event(165, 6, &7u64.to_be_bytes());
        let log = parse(&b.end()).unwrap();
        assert_eq!(log.rts_identifier(), Some("GHC-9.2.8 rts_thr"));
        assert_eq!(
            kinds(&log)[1..],
            [
                EventKind::HeapProfBegin { profile: 0, period_ns: 0, breakdown: Breakdown::ClosureType },
                EventKind::HeapProfSampleBegin { era: 7 },
                EventKind::HeapProfSampleString { profile: 0, residency_bytes: 4096, label: "ARR_WORDS".into() },
                EventKind::HeapProfSampleEnd { era: 7 },
            ]
        );
        assert_eq!(log.counts[&999], 1);
    }

    #[test]
    fn a_longer_payload_from_a_newer_rts_keeps_its_leading_fields() {
        let mut types = build::TYPES.to_vec();
        types.retain(|t| t.0 != 50);
        types.push((50, 20, "Current heap size, with a field added later"));
        let mut b = LogBuilder::with_types(&types);
        let mut payload = 0u32.to_be_bytes().to_vec();
        payload.extend_from_slice(&(3u64 << 20).to_be_bytes());
        payload.extend_from_slice(&[9; 8]);
        b.event(50, 1, &payload);
        let log = parse(&b.heap(51, 2, 77).end()).unwrap();
        assert_eq!(kinds(&log), vec![EventKind::HeapSize { bytes: 3 << 20 }, EventKind::HeapLive { bytes: 77 }]);
    }

    #[test]
    fn a_cut_log_is_read_up_to_its_last_complete_event() {
        let mut b = LogBuilder::new();
        b.heap(50, 1, 1 << 20).heap(51, 2, 4096);
        let whole = b.end();
        let complete = whole.len() - 2;
        for cut in complete - 21..complete {
            let log = parse(&whole[..cut]).unwrap();
            assert!(log.truncated);
            let expected = if cut < complete { 1 } else { 2 };
            assert_eq!(log.events.len(), expected, "cut at {cut}");
        }
        let log = parse(&whole[..complete]).unwrap();
        assert!(log.truncated);
        assert_eq!(log.events.len(), 2);
        assert_eq!(log.complete_bytes, complete);
    }

    #[test]
    fn events_are_put_in_time_order_across_capability_blocks() {
        let mut b = LogBuilder::new();
        b.block(0, 1, 22).heap(50, 20, 2);
        b.block(0, 0, 22).heap(50, 10, 1);
        let log = parse(&b.end()).unwrap();
        let seen: Vec<(u64, u16)> = log.events.iter().map(|e| (e.time_ns, e.cap)).collect();
        assert_eq!(seen, vec![(10, 0), (20, 1)]);
    }

    #[test]
    fn a_short_payload_is_counted_not_decoded() {
        let mut types = build::TYPES.to_vec();
        types.retain(|t| t.0 != 53);
        types.push((53, 10, "GC statistics, too short"));
        let mut b = LogBuilder::with_types(&types);
        let log = parse(&b.event(53, 1, &[0; 10]).end()).unwrap();
        assert!(log.events.is_empty());
        assert_eq!(log.malformed_events, 1);
    }

    #[test]
    fn rejects_what_is_not_an_eventlog() {
        assert_eq!(parse(b"").unwrap_err(), EventlogError::NotAnEventlog);
        assert_eq!(parse(b"MEMGAPT\0").unwrap_err(), EventlogError::NotAnEventlog);
        assert!(matches!(parse(b"hdrbhetbetb\0\0").unwrap_err(), EventlogError::BadHeader(_)));
    }

    #[test]
    fn a_huge_length_field_allocates_nothing_and_fails_cleanly() {
        let mut bytes = b"hdrbhetbetb\0\0\x01\0\x04".to_vec();
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(parse(&bytes).unwrap_err(), EventlogError::BadHeader(_)));
    }

    proptest::proptest! {
        #[test]
        fn no_panic_on_any_input(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn no_panic_on_damaged_data_after_a_valid_header(tail in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut bytes = LogBuilder::new().bytes;
            bytes.extend_from_slice(&tail);
            let _ = parse(&bytes);
        }
    }
}
