//! Memory samples of a process with perf_event_open(2).
//!
//! First choice: precise memory-access sampling with the data address —
//! AMD IBS op (`/sys/bus/event_source/devices/ibs_op`) or Intel PEBS
//! mem-loads (`cpu/events/mem-loads`) — sampling address, data source and
//! CPU. Where neither exists or the kernel refuses (virtual machines rarely
//! expose a PMU), [`Sampler::open`] says why in one line and falls back to
//! the software page-fault event with the faulting address and CPU: every
//! fault of an anonymous page is its first touch, so this gives
//! *first-touch* locality, not access locality.
//!
//! One event per CPU on the process with `inherit` (its threads and children
//! are followed; the kernel refuses to mmap an inherited per-task event) and
//! `enable_on_exec`, so it can be opened between fork and exec. Times are
//! CLOCK_MONOTONIC. [`Sampler::drain`] empties the ring buffers and asks the
//! node of each sampled page at once, while it is most likely still there.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use memgap_trace::numa::{MemorySample, MemorySamples, SOURCE_IBS_OP, SOURCE_PAGE_FAULTS, SOURCE_PEBS_LOADS};

/// Where the kernel lists performance-monitoring units.
pub const PMU_DEVICES: &str = "/sys/bus/event_source/devices";

/// Ring buffer per CPU: 2^RING_PAGES_LOG2 data pages.
const RING_PAGES_LOG2: u32 = 8;
const PAGE: usize = 4096;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_PAGE_FAULTS: u64 = 2;
const SAMPLE_IP: u64 = 1 << 0;
const SAMPLE_TID: u64 = 1 << 1;
const SAMPLE_TIME: u64 = 1 << 2;
const SAMPLE_ADDR: u64 = 1 << 3;
const SAMPLE_CPU: u64 = 1 << 7;
const SAMPLE_DATA_SRC: u64 = 1 << 15;
const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_INHERIT: u64 = 1 << 1;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const FLAG_ENABLE_ON_EXEC: u64 = 1 << 12;
const FLAG_PRECISE_IP_2: u64 = 2 << 15;
const FLAG_USE_CLOCKID: u64 = 1 << 25;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const RECORD_LOST: u32 = 2;
const RECORD_SAMPLE: u32 = 9;

/// `struct perf_event_attr`, PERF_ATTR_SIZE_VER5 (112 bytes).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}

/// A precise memory-access event this CPU offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreciseEvent {
    pub source: &'static str,
    pub pmu_type: u32,
    pub config: u64,
    pub config1: u64,
    pub period: u64,
}

/// Looks for IBS op or PEBS mem-loads under `devices` (normally
/// [`PMU_DEVICES`]); the reason in one line when there is neither.
pub fn probe_precise(devices: &Path) -> Result<PreciseEvent, String> {
    let read_u32 = |p: &Path| std::fs::read_to_string(p).ok()?.trim().parse::<u32>().ok();
    if let Some(pmu_type) = read_u32(&devices.join("ibs_op/type")) {
        // IBS counts ops; its period's low 4 bits are ignored.
        return Ok(PreciseEvent { source: SOURCE_IBS_OP, pmu_type, config: 0, config1: 0, period: 0x10000 });
    }
    if let (Some(pmu_type), Ok(spec)) = (read_u32(&devices.join("cpu/type")), std::fs::read_to_string(devices.join("cpu/events/mem-loads")))
        && let Some((config, config1)) = parse_mem_loads(&spec)
    {
        return Ok(PreciseEvent { source: SOURCE_PEBS_LOADS, pmu_type, config, config1, period: 10007 });
    }
    let mut pmus: Vec<String> =
        std::fs::read_dir(devices).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
    pmus.sort();
    Err(format!(
        "no precise memory-access sampling: neither AMD IBS (ibs_op) nor Intel PEBS (cpu/events/mem-loads) under {} (PMUs here: {}; a virtual machine usually exposes no such PMU)",
        devices.display(),
        if pmus.is_empty() { "none".to_string() } else { pmus.join(", ") }
    ))
}

/// `event=0xcd,umask=0x1,ldlat=3` → (config, config1): event | umask << 8, ldlat.
pub fn parse_mem_loads(spec: &str) -> Option<(u64, u64)> {
    let (mut event, mut umask, mut ldlat) = (None, 0, 3);
    for term in spec.trim().split(',') {
        let (key, value) = term.split_once('=')?;
        let value = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok()?,
            None => value.parse().ok()?,
        };
        match key {
            "event" => event = Some(value),
            "umask" => umask = value,
            "ldlat" => ldlat = value,
            _ => {}
        }
    }
    Some((event? | umask << 8, ldlat))
}

struct Ring {
    fd: i32,
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping belongs to the ring and is only read through &mut Sampler.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the ring's own mapping and descriptor, released once, here.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
            libc::close(self.fd);
        }
    }
}

/// Open sampling events on one process, and what they gathered so far.
pub struct Sampler {
    rings: Vec<Ring>,
    batch: MemorySamples,
    data_source: bool,
}

impl Sampler {
    /// Opens an event per CPU on `pid` (enabled at its next exec): precise
    /// memory sampling if `precise` is Ok, else page faults. Err: why not even that.
    pub fn open(pid: u32, cpus: &[u32], precise: Result<PreciseEvent, String>) -> Result<Sampler, String> {
        let mut unavailable = String::new();
        if let Ok(event) = &precise {
            let attr = PerfEventAttr {
                kind: event.pmu_type,
                config: event.config,
                config1: event.config1,
                sample_period: event.period,
                sample_type: SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME | SAMPLE_ADDR | SAMPLE_CPU | SAMPLE_DATA_SRC,
                flags: FLAG_PRECISE_IP_2 | FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV,
                ..PerfEventAttr::default()
            };
            match Self::open_rings(pid, cpus, attr) {
                Ok(rings) => return Ok(Sampler::new(rings, event.source, String::new(), event.period, true)),
                Err(error) => unavailable = format!("{} sampling refused: {error}", event.source),
            }
        }
        if let Err(reason) = precise {
            unavailable = reason;
        }
        let faults = PerfEventAttr {
            kind: PERF_TYPE_SOFTWARE,
            config: PERF_COUNT_SW_PAGE_FAULTS,
            sample_period: 1,
            sample_type: SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME | SAMPLE_ADDR | SAMPLE_CPU,
            ..PerfEventAttr::default()
        };
        // Faults taken in the kernel (read(2) into a new buffer) are first
        // touches too; an unprivileged user may only see user-mode ones.
        let rings = Self::open_rings(pid, cpus, faults)
            .or_else(|_| Self::open_rings(pid, cpus, PerfEventAttr { flags: FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV, ..faults }));
        match rings {
            Ok(rings) => Ok(Sampler::new(rings, SOURCE_PAGE_FAULTS, unavailable, 1, false)),
            Err(error) => {
                Err(format!("{unavailable}; page-fault sampling refused too: {error} (kernel.perf_event_paranoid = {})", paranoid()))
            }
        }
    }

    fn new(rings: Vec<Ring>, source: &str, precise_unavailable: String, period: u64, data_source: bool) -> Sampler {
        let batch = MemorySamples { source: source.into(), precise_unavailable, period, ..MemorySamples::default() };
        Sampler { rings, batch, data_source }
    }

    fn open_rings(pid: u32, cpus: &[u32], mut attr: PerfEventAttr) -> Result<Vec<Ring>, std::io::Error> {
        attr.size = std::mem::size_of::<PerfEventAttr>() as u32;
        attr.flags |= FLAG_DISABLED | FLAG_INHERIT | FLAG_ENABLE_ON_EXEC | FLAG_USE_CLOCKID;
        attr.clockid = libc::CLOCK_MONOTONIC;
        attr.wakeup_events = 0;
        let mut rings = Vec::new();
        for &cpu in cpus {
            // SAFETY: `attr` is a valid perf_event_attr that outlives the call.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    &attr as *const PerfEventAttr,
                    pid as libc::pid_t,
                    cpu as libc::c_int,
                    -1 as libc::c_int,
                    PERF_FLAG_FD_CLOEXEC,
                )
            } as i32;
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let len = (1 + (1 << RING_PAGES_LOG2)) * PAGE;
            // SAFETY: a new shared mapping of the perf descriptor, placed by the kernel.
            let base = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
            if base == libc::MAP_FAILED {
                let error = std::io::Error::last_os_error();
                // SAFETY: our own descriptor, not yet owned by a Ring.
                unsafe { libc::close(fd) };
                return Err(error);
            }
            rings.push(Ring { fd, base: base as *mut u8, len });
        }
        Ok(rings)
    }

    /// The source in use: ibs-op, pebs-mem-loads or page-faults.
    pub fn source(&self) -> &str {
        &self.batch.source
    }

    /// Why precise access sampling is not in use (empty when it is).
    pub fn precise_unavailable(&self) -> &str {
        &self.batch.precise_unavailable
    }

    pub fn set_start(&mut self, monotonic_ns: u64) {
        self.batch.start_ns = monotonic_ns;
    }

    /// Reads every ring to its head and asks the node of the new samples' pages.
    pub fn drain(&mut self) {
        let first_new = self.batch.samples.len();
        for ring in &self.rings {
            read_ring(ring, self.data_source, &mut self.batch);
        }
        let new = &mut self.batch.samples[first_new..];
        let mut pids: Vec<u32> = new.iter().map(|s| s.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            let indexes: Vec<usize> = (0..new.len()).filter(|&i| new[i].pid == pid).collect();
            let addresses: Vec<u64> = indexes.iter().map(|&i| new[i].addr).collect();
            if let Ok(nodes) = crate::pages::nodes_of(pid, &addresses) {
                for (&i, node) in indexes.iter().zip(nodes) {
                    new[i].node = node;
                }
            }
        }
    }

    /// The samples gathered, ended now.
    pub fn finish(mut self, monotonic_ns: u64) -> MemorySamples {
        self.drain();
        self.batch.end_ns = monotonic_ns;
        std::mem::take(&mut self.batch)
    }
}

fn paranoid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

fn read_ring(ring: &Ring, data_source: bool, out: &mut MemorySamples) {
    // perf_event_mmap_page: data_head at 1024, data_tail at 1032.
    // SAFETY: the ring's first page is the kernel's perf_event_mmap_page, with
    // the 8-byte aligned data_head at 1024 and data_tail at 1032.
    let head_word = unsafe { &*(ring.base.add(1024) as *const AtomicU64) };
    // SAFETY: as above.
    let tail_word = unsafe { &*(ring.base.add(1032) as *const AtomicU64) };
    let head = head_word.load(Ordering::Acquire);
    let mut tail = tail_word.load(Ordering::Relaxed);
    let size = (1u64 << RING_PAGES_LOG2) * PAGE as u64;
    // SAFETY: the data pages follow the first page in the ring's mapping.
    let data = unsafe { std::slice::from_raw_parts(ring.base.add(PAGE), size as usize) };
    let copy = |from: u64, len: usize| -> Vec<u8> { (0..len as u64).map(|i| data[((from + i) % size) as usize]).collect() };
    while tail + 8 <= head {
        let header = copy(tail, 8);
        let kind = u32::from_le_bytes(header[0..4].try_into().unwrap());
        let len = u16::from_le_bytes(header[6..8].try_into().unwrap()) as usize;
        if len < 8 || tail + len as u64 > head {
            break;
        }
        let body = copy(tail + 8, len - 8);
        match kind {
            RECORD_SAMPLE => {
                if let Some(sample) = parse_sample(&body, data_source) {
                    out.samples.push(sample);
                }
            }
            RECORD_LOST if body.len() >= 16 => out.lost += u64::from_le_bytes(body[8..16].try_into().unwrap()),
            _ => {}
        }
        tail += len as u64;
    }
    tail_word.store(tail, Ordering::Release);
}

/// A sample with IP, TID, TIME, ADDR, CPU (and DATA_SRC), in that order.
fn parse_sample(body: &[u8], data_source: bool) -> Option<MemorySample> {
    let u64_at = |i: usize| body.get(i..i + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    let u32_at = |i: usize| body.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    Some(MemorySample {
        pid: u32_at(8)?,
        tid: u32_at(12)?,
        monotonic_ns: u64_at(16)?,
        addr: u64_at(24)?,
        cpu: u32_at(32)?,
        node: -libc::ENOENT,
        data_source: if data_source { u64_at(40)? } else { 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_is_version_5() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 112);
    }

    #[test]
    fn mem_loads_spec() {
        assert_eq!(parse_mem_loads("event=0xcd,umask=0x1,ldlat=3\n"), Some((0x1cd, 3)));
        assert_eq!(parse_mem_loads("event=0xd0,umask=0x81"), Some((0x81d0, 3)));
        assert_eq!(parse_mem_loads("umask=0x1"), None);
    }

    #[test]
    fn probes_fixture_pmus() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("software")).unwrap();
        let reason = probe_precise(dir.path()).unwrap_err();
        assert!(reason.contains("PMUs here: software"), "{reason}");
        std::fs::create_dir_all(dir.path().join("cpu/events")).unwrap();
        std::fs::write(dir.path().join("cpu/type"), "4\n").unwrap();
        std::fs::write(dir.path().join("cpu/events/mem-loads"), "event=0xcd,umask=0x1,ldlat=3\n").unwrap();
        assert_eq!(
            probe_precise(dir.path()).unwrap(),
            PreciseEvent { source: SOURCE_PEBS_LOADS, pmu_type: 4, config: 0x1cd, config1: 3, period: 10007 }
        );
        std::fs::create_dir_all(dir.path().join("ibs_op")).unwrap();
        std::fs::write(dir.path().join("ibs_op/type"), "11\n").unwrap();
        assert_eq!(probe_precise(dir.path()).unwrap().source, SOURCE_IBS_OP);
    }

    #[test]
    fn parses_a_sample_record_body() {
        let mut body = Vec::new();
        body.extend_from_slice(&0x401000u64.to_le_bytes());
        body.extend_from_slice(&7u32.to_le_bytes());
        body.extend_from_slice(&8u32.to_le_bytes());
        body.extend_from_slice(&123u64.to_le_bytes());
        body.extend_from_slice(&0x7f00_0000_1234u64.to_le_bytes());
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        let s = parse_sample(&body, false).unwrap();
        assert_eq!((s.pid, s.tid, s.monotonic_ns, s.addr, s.cpu), (7, 8, 123, 0x7f00_0000_1234, 3));
        assert!(parse_sample(&body, true).is_none()); // DATA_SRC missing
    }

    /// Page faults of a child that touches 256 fresh pages after exec are sampled with their address.
    #[test]
    fn samples_a_childs_page_faults() {
        let cpus: Vec<u32> = crate::topology::this_machine().nodes.iter().flat_map(|n| n.cpus.clone()).collect();
        let (go_read, go_write) = {
            let mut fds = [0; 2];
            // SAFETY: `fds` is room for the two descriptors.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            (fds[0], fds[1])
        };
        // SAFETY: the child only reads, execs and exits (async-signal-safe calls).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut byte = 0u8;
            // SAFETY: the child's own descriptor and static C strings; execl's list ends with null.
            unsafe {
                libc::read(go_read, &mut byte as *mut u8 as *mut libc::c_void, 1);
                let script = c"x=$(head -c 1048576 /dev/zero | tr '\\0' a); echo ${#x} >/dev/null";
                libc::execl(c"/bin/sh".as_ptr(), c"sh".as_ptr(), c"-c".as_ptr(), script.as_ptr(), std::ptr::null::<libc::c_char>());
                libc::_exit(127);
            }
        }
        let sampler = Sampler::open(pid as u32, &cpus, Err("test".into()));
        // SAFETY: our own pipe's write end; the byte is a static.
        unsafe { libc::write(go_write, b"g".as_ptr() as *const libc::c_void, 1) };
        let mut status = 0;
        // SAFETY: `status` is ours to write; `pid` is our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let sampler = match sampler {
            Ok(sampler) => sampler,
            Err(reason) => return eprintln!("skipped: {reason}"), // perf_event_open not permitted here
        };
        assert_eq!(sampler.source(), SOURCE_PAGE_FAULTS);
        assert_eq!(sampler.precise_unavailable(), "test");
        let batch = sampler.finish(0);
        eprintln!("{} samples, {} lost", batch.samples.len(), batch.lost);
        assert!(batch.samples.len() > 100, "{} samples", batch.samples.len());
        assert!(batch.samples.iter().all(|s| s.addr != 0 && cpus.contains(&s.cpu) && s.monotonic_ns > 0));
    }
}
