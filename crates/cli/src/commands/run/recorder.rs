//! The recorder: everything the agent used to do inside the program, done
//! from `memgap run`'s own process. Each traced process image makes an area
//! (a file in the run's private directory, see `memgap_trace::shared`) and
//! maps it; this finds the areas, maps them too, and gives each process a
//! thread that, every round, copies out what the program's threads
//! committed, compresses it into the trace, samples RSS from
//! /proc/PID/status, answers the agent's requests and takes snapshots from
//! outside (/proc/PID/smaps, /proc/PID/pagemap, move_pages).

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memgap_attach::residency::monotonic_ns;
use memgap_trace::compact;
use memgap_trace::event::DeltaState;
use memgap_trace::framing::{self, FileHeader};
use memgap_trace::records::{Clock, CompactEventsPiece, End, EndReason, Record, Records, Residency, Rss, Snapshot, SnapshotReason, Thread};
use memgap_trace::shared::{self, Area, CHUNK_DATA, CHUNK_FREE, Header, SLOT_FREE, SLOT_LIVE};

use super::placement::Placer;
use super::untraced::{self, Untraced};

const FLUSH_BYTES: usize = 512 * 1024;
const FLUSH_INTERVAL_NS: u64 = 100_000_000;
/// Readings of a snapshot at most, while RSS moves by more than 1 % during one…
const SNAPSHOT_ATTEMPTS: usize = 3;
/// …and while the snapshot has taken less than this.
const SNAPSHOT_RETRY_BUDGET_NS: u64 = 50_000_000;
/// A program's malloc_trim gets a snapshot after it, but no sooner than this
/// after the previous snapshot, nor than ten times that snapshot's cost: a
/// program trimming in a loop must not keep the recorder snapshotting.
const TRIM_SNAPSHOT_GAP_NS: u64 = 100_000_000;
/// How often the run's directory is looked at for new areas.
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(2);
/// After the top process ended, how long processes it left running are
/// still recorded before memgap gives their traces up.
const DESCENDANTS_GRACE: Duration = Duration::from_secs(2);
/// A thread seen in the same hook for this long is no longer waited for
/// (it jumped out of a signal handler mid-hook, or is stopped): CLOCK
/// records go on as if it were in none.
const HOOK_STUCK_NS: u64 = 1_000_000_000;
/// A snapshot is taken when the live heap fell from its high since the
/// last snapshot by a quarter or more, and by at least this much…
const LIVE_DROP_MIN_BYTES: i64 = 4 << 20;
/// …once the fall stopped (the live heap fell by less than 1/64 of it in
/// the last round), or this long after it was seen, whichever comes first.
const LIVE_DROP_SETTLE_NS: u64 = 100_000_000;

/// pagemap entry bit 63: the page is present in RAM.
const PAGEMAP_PRESENT: u64 = 1 << 63;

/// The run's private directory, where the agents make their areas.
pub struct AreaDir {
    path: PathBuf,
}

impl AreaDir {
    /// A fresh directory only we may enter, in /dev/shm (memory, never
    /// written back to a disk) or else the temporary directory.
    pub fn create(run_id: u64) -> anyhow::Result<AreaDir> {
        let shm = Path::new("/dev/shm");
        let writable = |dir: &Path| {
            let c = CString::new(dir.as_os_str().as_bytes()).unwrap_or_default();
            // SAFETY: a NUL-terminated path.
            unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
        };
        let base = if shm.is_dir() && writable(shm) { shm.to_path_buf() } else { std::env::temp_dir() };
        let path = base.join(format!("memgap-{}-{run_id:016x}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        Ok(AreaDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for AreaDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// What the recorder needs to know of the run.
#[derive(Clone)]
pub struct Settings {
    pub run_id: u64,
    /// The top process, whose trace memgap made before it started.
    pub top_pid: u32,
    pub top_identity: Option<memgap_trace::files::FileIdentity>,
    pub interval: Duration,
    pub snapshot_interval_ns: u64,
}

/// A mapped area, with the descriptor that grows its backing.
struct MappedArea {
    area: Area,
    len: usize,
    file: File,
    path: PathBuf,
    pid: u32,
}

// SAFETY: the area is shared memory accessed through atomics and bounded copies.
unsafe impl Send for MappedArea {}

/// Why an area file was not mapped.
#[derive(Debug, PartialEq)]
enum Unopened {
    /// Not ready yet (the agent writes its header after creating it), or
    /// not a sound area.
    NotReady,
    /// Made for process `pid` by another memgap's agent: its magic is of the
    /// family but names another layout.
    OtherLayout(u32),
}

impl MappedArea {
    /// Maps an area file of ours.
    fn open(path: &Path) -> Result<MappedArea, Unopened> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|_| Unopened::NotReady)?;
        let meta = file.metadata().map_err(|_| Unopened::NotReady)?;
        // SAFETY: no precondition.
        if !meta.is_file() || meta.uid() != unsafe { libc::geteuid() } || (meta.len() as usize) < shared::HEADER_BYTES {
            return Err(Unopened::NotReady);
        }
        let len = meta.len() as usize;
        let base =
            // SAFETY: a new shared mapping of the area file, placed by the kernel.
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if base == libc::MAP_FAILED {
            return Err(Unopened::NotReady);
        }
        // SAFETY: `base` maps the file's `len` bytes, at least HEADER_BYTES; the
        // chunks below the capacity are read only once `area_bytes(max_chunks) <= len`
        // is checked below.
        let area = unsafe { Area::from_base(base as *mut u8) };
        let header = area.header();
        let magic = header.magic.load(Acquire);
        let max_chunks = header.max_chunks.load(Acquire);
        let ready = magic == shared::AREA_MAGIC && shared::area_bytes(max_chunks) <= len;
        if !ready {
            // Every layout begins with the magic and the pid, so another's pid reads alike.
            let other = magic.to_le_bytes().starts_with(shared::AREA_MAGIC_FAMILY) && magic != shared::AREA_MAGIC;
            let refused = if other { Unopened::OtherLayout(header.pid.load(Relaxed)) } else { Unopened::NotReady };
            // SAFETY: our own mapping, not used after this.
            unsafe { libc::munmap(base, len) };
            return Err(refused);
        }
        let pid = header.pid.load(Relaxed);
        Ok(MappedArea { area, len, file, path: path.to_path_buf(), pid })
    }

    fn header(&self) -> &Header {
        self.area.header()
    }

    /// The chunks the agent may use; never past what the file holds.
    fn capacity(&self) -> u32 {
        let header = self.header();
        header.capacity_chunks.load(Acquire).min(header.max_chunks.load(Relaxed))
    }

    /// Backs more chunks when the agent asked and few are free: up to the
    /// budget, and one more per live thread (see `Header::budget_chunks`).
    /// Whether it did.
    fn grow_if_wanted(&self) -> bool {
        let header = self.header();
        if header.wants_more.swap(0, AcqRel) == 0 {
            return false;
        }
        let capacity = self.capacity();
        let used = (header.threads_used.load(Acquire) as usize).min(shared::THREAD_SLOTS);
        let live_threads = header.slots[..used].iter().filter(|slot| slot.state.load(Relaxed) != SLOT_FREE).count() as u32;
        let limit = header.max_chunks.load(Relaxed).min(header.budget_chunks.load(Relaxed).saturating_add(live_threads));
        let free = (0..capacity).filter(|&i| self.area.chunk(i).state.load(Relaxed) == CHUNK_FREE).count() as u32;
        if capacity >= limit || free * 2 > capacity {
            return false;
        }
        let grown = (capacity * 2).min(limit);
        // SAFETY: our own descriptor; no memory is passed.
        let ok = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, shared::area_bytes(grown) as libc::off_t) } == 0;
        if ok {
            header.capacity_chunks.store(grown, Release);
        }
        ok
    }
}

impl Drop for MappedArea {
    fn drop(&mut self) {
        // SAFETY: the mapping `open` made, of `len` bytes, dropped with the last use of `area`.
        unsafe { libc::munmap(self.area.base() as *mut libc::c_void, self.len) };
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The trace path of process `pid`, as `memgap run` names it.
pub type TracePath = dyn Fn(u32) -> PathBuf + Send + Sync;

/// The running recorder: the discovery thread and one thread per process.
pub struct Recorder {
    stop: Arc<AtomicBool>,
    discovery: Option<JoinHandle<Vec<Untraced>>>,
    processes: Arc<Mutex<HashMap<u32, Tracked>>>,
}

struct Tracked {
    areas: Sender<MappedArea>,
    thread: Option<JoinHandle<Outcome>>,
    done: Arc<AtomicBool>,
    /// Set by `memgap run` to give up on a process that outlives the run.
    give_up: Arc<AtomicBool>,
}

/// How one process's recording ended.
#[derive(Debug, Default)]
pub struct Outcome {
    pub pid: u32,
    /// The parent when the process's first image started.
    pub ppid: u32,
    /// CLOCK_MONOTONIC when each image after the first started (its execs).
    pub execs_ns: Vec<u64>,
    /// CLOCK_MONOTONIC when the process was seen ending: its exit snapshot's
    /// request, made before it exits, or else when the recorder noticed.
    pub ended_ns: u64,
    pub trace: Option<PathBuf>,
    pub command: String,
    pub given_up: bool,
}

impl Recorder {
    /// Starts looking for areas in `dir`.
    pub fn start(dir: &Path, settings: Settings, trace_path: Arc<TracePath>) -> Recorder {
        let stop = Arc::new(AtomicBool::new(false));
        let processes: Arc<Mutex<HashMap<u32, Tracked>>> = Arc::default();
        let discovery = {
            let (stop, processes, dir) = (stop.clone(), processes.clone(), dir.to_path_buf());
            std::thread::Builder::new()
                .name("memgap-discovery".into())
                .spawn(move || {
                    let mut seen = std::collections::HashSet::new();
                    let mut untraced = untraced::Watch::default();
                    let mut other_versions = Vec::new();
                    loop {
                        let stopping = stop.load(Acquire);
                        discover(&dir, &mut seen, &processes, &settings, &trace_path, &mut other_versions);
                        let running: Vec<u32> =
                            processes.lock().unwrap().iter().filter(|(_, t)| !t.done.load(Acquire)).map(|(&pid, _)| pid).collect();
                        untraced.scan(&running);
                        if stopping {
                            break;
                        }
                        std::thread::sleep(DISCOVERY_INTERVAL);
                    }
                    let mut found = untraced.found();
                    found.extend(other_versions);
                    found
                })
                .ok()
        };
        Recorder { stop, discovery, processes }
    }

    /// The top process has ended (and was reaped): waits for its trace, and
    /// a while for the processes it left running; gives the rest up. Also
    /// the run's processes that ran without the agent.
    pub fn finish(mut self, dir: &Path) -> (Vec<Outcome>, Vec<Untraced>) {
        // Give discovery a moment for a child that made its area just before the end.
        std::thread::sleep(DISCOVERY_INTERVAL * 2);
        let deadline = Instant::now() + DESCENDANTS_GRACE;
        loop {
            let all_done = self.processes.lock().unwrap().values().all(|t| t.done.load(Acquire));
            if all_done || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop.store(true, Release);
        let untraced = self.discovery.take().and_then(|discovery| discovery.join().ok()).unwrap_or_default();
        let mut tracked: Vec<Tracked> = self.processes.lock().unwrap().drain().map(|(_, t)| t).collect();
        for t in &tracked {
            t.give_up.store(true, Release);
        }
        let mut outcomes: Vec<Outcome> = tracked.iter_mut().filter_map(|t| t.thread.take()?.join().ok()).collect();
        outcomes.sort_by_key(|o| o.pid);
        // Areas no recorder took (made in the last moments): their agents
        // must not wait for one.
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.filter_map(Result::ok) {
                if let Ok(area) = MappedArea::open(&entry.path()) {
                    area.header().recorder_state.store(shared::RECORDER_GONE, Release);
                }
            }
        }
        (outcomes, untraced)
    }
}

const OTHER_VERSION: &str = "it loaded the agent of another memgap version, whose buffers this memgap cannot read (check MEMGAP_AGENT)";

fn discover(
    dir: &Path,
    seen: &mut std::collections::HashSet<(PathBuf, u64)>,
    processes: &Arc<Mutex<HashMap<u32, Tracked>>>,
    settings: &Settings,
    trace_path: &Arc<TracePath>,
    other_versions: &mut Vec<Untraced>,
) {
    use std::os::unix::fs::DirEntryExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    // By path and inode: a name is reused once its area was removed.
    let candidates: Vec<(PathBuf, u64)> = entries
        .filter_map(Result::ok)
        .map(|e| (e.path(), e.ino()))
        .filter(|key| !seen.contains(key) && key.0.to_string_lossy().ends_with(shared::AREA_SUFFIX))
        .collect();
    let mut found: Vec<(MappedArea, (PathBuf, u64))> = Vec::new();
    for key in candidates {
        match MappedArea::open(&key.0) {
            Ok(area) => found.push((area, key)),
            Err(Unopened::OtherLayout(pid)) => {
                other_versions.push(Untraced { pid, command: command_of(pid), why: OTHER_VERSION });
                seen.insert(key);
            }
            Err(Unopened::NotReady) => {}
        }
    }
    // An exec'd image's area after its predecessor's.
    found.sort_by_key(|(area, _)| (area.pid, area.header().created_ns.load(Relaxed)));
    for (mapped, key) in found {
        seen.insert(key);
        let pid = mapped.pid;
        let mut processes = processes.lock().unwrap();
        if let Some(tracked) = processes.get(&pid).filter(|t| !t.done.load(Acquire)) {
            // An exec: the same process continues in a new image.
            if tracked.areas.send(mapped).is_ok() {
                continue;
            }
            return;
        }
        let (sender, receiver) = mpsc::channel();
        let done = Arc::new(AtomicBool::new(false));
        let give_up = Arc::new(AtomicBool::new(false));
        let trace = trace_path(pid);
        let (settings, thread_done, thread_give_up, names) = (settings.clone(), done.clone(), give_up.clone(), trace_path.clone());
        let thread = std::thread::Builder::new().name(format!("memgap-rec-{pid}")).spawn(move || {
            let outcome = record_process(mapped, receiver, trace, &settings, &thread_give_up, &names);
            thread_done.store(true, Release);
            outcome
        });
        match thread {
            Ok(thread) => {
                processes.insert(pid, Tracked { areas: sender, thread: Some(thread), done, give_up });
            }
            Err(error) => eprintln!("memgap: cannot record process {pid}: {error}"),
        }
    }
}

/// Records one process (all its images) until it ends; then its trace is whole.
fn record_process(
    area: MappedArea,
    more_areas: Receiver<MappedArea>,
    trace: PathBuf,
    settings: &Settings,
    give_up: &AtomicBool,
    names: &Arc<TracePath>,
) -> Outcome {
    let pid = area.pid;
    let ppid = area.header().ppid.load(Relaxed);
    let mut outcome = Outcome { pid, ppid, trace: None, command: command_of(pid), ..Outcome::default() };
    let made = (pid == settings.top_pid).then_some(settings.top_identity).flatten();
    let file = match create_trace(&trace, settings.run_id, made) {
        Ok(file) => file,
        Err(error) => {
            eprintln!("memgap: not recording: cannot create {}: {error}", trace.display());
            area.header().recorder_state.store(shared::RECORDER_GONE, Release);
            return outcome;
        }
    };
    write_trace_path(&area, &trace);
    area.header().recorder_state.store(shared::RECORDER_ATTACHED, Release);
    outcome.trace = Some(trace.clone());
    let mut process = ProcessRecorder::new(area, file, trace, settings, names.clone());
    // SAFETY: no memory is passed.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
    // SAFETY: pidfd_open succeeded, so the descriptor is new and owned by nothing else.
    let pidfd = (pidfd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) });
    let exited = || match &pidfd {
        Some(fd) => {
            let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: `poll` is one valid pollfd, ours to write.
            (unsafe { libc::poll(&mut poll, 1, 0) }) > 0
        }
        // SAFETY: signal 0 only checks that `pid` exists.
        None => (unsafe { libc::kill(pid as libc::pid_t, 0) }) != 0,
    };
    let interval_ns = settings.interval.as_nanos() as u64;
    let mut caught_up = true;
    loop {
        if caught_up {
            let wake = &process.area.header().wake.0;
            let seen = wake.load(Acquire);
            if !process.has_work() {
                futex_wait(wake, seen, interval_ns);
            }
        }
        // A new image of this process (an exec): the old one is gone.
        if let Ok(next) = more_areas.try_recv() {
            outcome.execs_ns.push(next.header().created_ns.load(Relaxed));
            process.round(true);
            process.switch_image(next);
            continue;
        }
        caught_up = process.round(false);
        process.answer_requests();
        let state = process.area.header().agent_state.load(Acquire);
        if state == shared::AGENT_FINISHED {
            process.end();
            break;
        }
        if exited() {
            // Killed, or ended without our exit hook: keep every committed
            // event; no END record, so readers say the trace was cut short.
            process.round(true);
            process.flush();
            break;
        }
        if give_up.load(Acquire) {
            process.round(true);
            process.push(&Record::Note {
                time: process.now(),
                text: "memgap run ended while this process was still running: its trace stops here".into(),
            });
            process.flush();
            process.area.header().recorder_state.store(shared::RECORDER_GONE, Release);
            outcome.given_up = true;
            break;
        }
    }
    outcome.ended_ns = process.exit_requested_ns.unwrap_or_else(monotonic_ns);
    // Said even with --quiet: the trace is not what was asked for.
    if let Some(reason) = process.stopped_reason() {
        eprintln!("memgap: {reason}");
    }
    outcome
}

fn write_trace_path(area: &MappedArea, trace: &Path) {
    let bytes = trace.as_os_str().as_bytes();
    let field = &area.header().trace_path as *const [u8; 1024] as *mut u8;
    let n = bytes.len().min(1023);
    // SAFETY: `field` is the header's 1024-byte trace_path array in our shared
    // mapping; `n` plus the NUL fit. (Written through a pointer from a shared
    // reference: the field is plain bytes in memory another process shares.)
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), field, n);
        *field.add(n) = 0;
    }
}

/// The command line of `pid`, for messages.
pub fn command_of(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let words: Vec<String> =
        cmdline.split(|&b| b == 0).filter(|w| !w.is_empty()).map(|w| String::from_utf8_lossy(w).into_owned()).collect();
    words.join(" ")
}

/// Opens the top trace memgap made before the program started (`made`: it
/// must still be that very file, empty), or creates another process's trace
/// exclusively, mode 0600, never through a symlink. An existing file is
/// never written over.
fn create_trace(path: &Path, run_id: u64, made: Option<memgap_trace::files::FileIdentity>) -> std::io::Result<File> {
    let mut file = match made {
        Some(identity) => {
            let file = memgap_trace::files::open_created(path, identity)?;
            if file.metadata()?.len() != 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it is no longer the empty file memgap made"));
            }
            file
        }
        None => memgap_trace::files::create_new(path)?.0,
    };
    file.write_all(&FileHeader::new(run_id).encode())?;
    Ok(file)
}

/// How far a round took one thread's chunks.
#[derive(Debug, PartialEq, Eq)]
enum Drained {
    /// To the end of what the thread has committed.
    CaughtUp,
    /// To a chunk the thread took during the round.
    Behind,
    /// The thread has ended and all of it was written.
    Ended,
}

/// The recorder's side of one traced thread.
#[derive(Default, Clone, Copy)]
struct SlotState {
    /// The chunk being drained, once the slot was seen live.
    head: Option<u32>,
    /// The hook the thread was last seen in (its `in_hook_since`, 0: none),
    /// and since when it has been seen in it.
    hook_seen: u64,
    hook_seen_ns: u64,
    /// The thread's count of live bytes when last read (see `ChunkHeader::live_bytes`).
    live_seen: u64,
}

struct ProcessRecorder {
    area: MappedArea,
    pid: u32,
    file: File,
    path: PathBuf,
    image: u32,
    raw: Vec<u8>,
    framed: Vec<u8>,
    encoder: framing::ChunkEncoder,
    /// The agent's delta state in each chunk of the area, by chunk index
    /// (None: the chunk's records stopped decoding).
    agent_deltas: Vec<Option<DeltaState>>,
    /// One piece re-encoded.
    compact: Vec<u8>,
    compact_state: compact::CompactState,
    last_flush_ns: u64,
    slots: Vec<SlotState>,
    records_head: Option<u32>,
    records_pending: Vec<u8>,
    status: Option<File>,
    vm_hwm: u64,
    failed: Option<String>,
    placer: Placer,
    smaps: Vec<u8>,
    pagemap_entries: Vec<u8>,
    snapshot_interval_ns: u64,
    last_snapshot_ns: u64,
    last_snapshot_cost_ns: u64,
    snapshot_peak_rss: u64,
    trims_seen: u32,
    /// The last snapshot was taken because of a trim.
    last_snapshot_after_trim: bool,
    trim_snapshot_pending: bool,
    stopped_noted: bool,
    /// The run's trace names, for a fork child's parent.
    names: Arc<TracePath>,
    /// CLOCK records not yet written, oldest first (see [`Self::write_clocks`]).
    held_clocks: VecDeque<Clock>,
    /// The time of the last CLOCK record written.
    clock_written: u64,
    /// Every event stamped below this had been committed when the last
    /// round looked, so this round has drained it.
    committed_below: u64,
    /// The live heap by the threads' counts (wrapping), its high since the
    /// last snapshot, its value at the previous round, and since when a
    /// fall worth a snapshot has been seen.
    live_bytes: u64,
    live_high: i64,
    live_last_round: i64,
    live_drop_seen_ns: Option<u64>,
    /// This round freed chunks or backed more: threads waiting for one are woken.
    chunks_released: bool,
    /// When the agent asked for its exit snapshot (the process had not exited yet).
    exit_requested_ns: Option<u64>,
    /// An allocator linked into the program, whose calls no hook sees:
    /// its own statistics are read at each snapshot (found at the first).
    linked_allocator: Option<Option<super::linked_allocator::LinkedAllocatorReader>>,
}

impl ProcessRecorder {
    fn new(area: MappedArea, file: File, path: PathBuf, settings: &Settings, names: Arc<TracePath>) -> ProcessRecorder {
        let pid = area.pid;
        let now = monotonic_ns();
        ProcessRecorder {
            status: File::open(format!("/proc/{pid}/status")).ok(),
            area,
            pid,
            file,
            path,
            image: 0,
            raw: Vec::with_capacity(FLUSH_BYTES + 128 * 1024),
            framed: Vec::new(),
            encoder: framing::ChunkEncoder::default(),
            agent_deltas: Vec::new(),
            compact: Vec::new(),
            compact_state: compact::CompactState::default(),
            last_flush_ns: now,
            slots: vec![SlotState::default(); shared::THREAD_SLOTS],
            records_head: None,
            records_pending: Vec::new(),
            vm_hwm: 0,
            failed: None,
            placer: Placer::new(pid),
            smaps: Vec::with_capacity(1 << 20),
            pagemap_entries: Vec::new(),
            snapshot_interval_ns: settings.snapshot_interval_ns,
            last_snapshot_ns: now,
            last_snapshot_cost_ns: 0,
            snapshot_peak_rss: 0,
            trims_seen: 0,
            last_snapshot_after_trim: false,
            trim_snapshot_pending: false,
            stopped_noted: false,
            names,
            held_clocks: VecDeque::new(),
            clock_written: 0,
            committed_below: 0,
            live_bytes: 0,
            live_high: 0,
            live_last_round: 0,
            live_drop_seen_ns: None,
            chunks_released: false,
            exit_requested_ns: None,
            linked_allocator: None,
        }
    }

    fn header(&self) -> &Header {
        self.area.header()
    }

    fn now(&self) -> u64 {
        self.header().clock.0.load(Acquire)
    }

    fn push(&mut self, record: &Record) {
        record.encode(&mut self.raw);
    }

    fn beat(&self) {
        self.header().heartbeat.0.fetch_add(1, Release);
    }

    /// Requests are waiting, a thread waits for chunks, or the process ended.
    fn has_work(&self) -> bool {
        let header = self.header();
        header.wants_more.load(Acquire) != 0
            || header.request_seq.load(Acquire) != header.answered.0.load(Acquire)
            || header.snap_requests.load(Acquire) != header.snap_answered.load(Acquire)
            || header.agent_state.load(Acquire) == shared::AGENT_FINISHED
    }

    /// Copies out what the threads committed before the round began (all
    /// of it in the `last` round) and samples RSS. False when a thread took
    /// chunks during the round: they are due at once, in the next round.
    fn round(&mut self, last: bool) -> bool {
        self.beat();
        self.chunks_released = self.area.grow_if_wanted();
        let area = self.area.area;
        let header = area.header();
        // The chunks taken from here on wait for the next round, except in
        // the last, which takes everything. That keeps the CLOCK promise:
        // an event stamped before the previous round began was committed
        // (one round of slack) in a chunk taken before this one began.
        let round = header.writer_round.0.fetch_add(1, AcqRel) + 1;
        let taken_before = if last { u64::MAX } else { round };
        let watermark = header.clock.0.fetch_add(1, AcqRel) + 1;
        self.drain_records();
        let mut caught_up = true;
        let used = (header.threads_used.load(Acquire) as usize).min(shared::THREAD_SLOTS);
        for index in 0..used {
            self.drain_earlier_slots_of_its_thread(index, used);
            if let Some(Drained::Behind) = self.drain_slot(index, taken_before) {
                caught_up = false;
            }
        }
        if self.chunks_released && header.chunk_waiters.load(Acquire) > 0 {
            header.chunks_freed.0.fetch_add(1, Release);
            futex_wake(&header.chunks_freed.0);
        }
        let oldest_in_hook = self.look_at_threads();
        self.held_clocks.push_back(Clock { time: watermark, monotonic_ns: monotonic_ns() });
        self.write_clocks(last);
        self.committed_below = oldest_in_hook.map_or(watermark, |oldest| oldest.min(watermark));
        let rss = self.sample_rss();
        if !last && let Some(reason) = self.snapshot_due(&rss) {
            self.snapshot(reason, rss);
        }
        if last || self.raw.len() >= FLUSH_BYTES || monotonic_ns() - self.last_flush_ns >= FLUSH_INTERVAL_NS {
            self.flush();
        }
        caught_up
    }

    /// Writes the CLOCK records readers may act on. A CLOCK record lets a
    /// reader order every event stamped before the previous one, so it is
    /// written only once every such event is in the trace: stamped below
    /// what the last round found committed (all of it in the `last` round).
    /// A thread preempted in a hook holds them back until it commits; the
    /// pairs keep the instant they were read, so times convert as before.
    fn write_clocks(&mut self, last: bool) {
        while let Some(&clock) = self.held_clocks.front() {
            if !last && self.clock_written > self.committed_below {
                break;
            }
            self.held_clocks.pop_front();
            self.push(&Record::Clock(clock));
            self.clock_written = clock.time;
        }
    }

    /// Reads each thread's newest chunk, after the drain: its count of
    /// live bytes, and whether it is in a hook. Returns the oldest time an
    /// event not yet committed may carry: the earliest `in_hook_since` (an
    /// event committed before this look was drained, or is in a chunk the
    /// next round drains). A hook seen for [`HOOK_STUCK_NS`] is left out.
    fn look_at_threads(&mut self) -> Option<u64> {
        let capacity = self.area.capacity();
        let area = self.area.area;
        let header = area.header();
        let used = (header.threads_used.load(Acquire) as usize).min(shared::THREAD_SLOTS);
        let now = monotonic_ns();
        let mut oldest: Option<u64> = None;
        for index in 0..used {
            let slot = &header.slots[index];
            let mut chunk_index = match self.slots[index].head {
                Some(head) => head,
                None => {
                    let first = slot.first_chunk.load(Relaxed);
                    if slot.state.load(Acquire) != SLOT_LIVE || first == 0 || first > capacity {
                        continue;
                    }
                    first - 1
                }
            };
            let mut since = 0;
            let mut live = 0;
            // To the newest chunk; bounded: a chain can be no longer than the area has chunks.
            for _ in 0..=capacity {
                let chunk = area.chunk(chunk_index);
                // Before `next`: a mark cleared here was set on the next chunk first.
                let mark = chunk.in_hook_since.load(Acquire);
                if since == 0 {
                    since = mark;
                }
                live = chunk.live_bytes.load(Relaxed);
                let next = chunk.next.load(Acquire);
                if next == 0 || next > capacity {
                    break;
                }
                chunk_index = next - 1;
            }
            self.count_live(index, live);
            let seen = &mut self.slots[index];
            if since == 0 {
                seen.hook_seen = 0;
                continue;
            }
            if since != seen.hook_seen {
                (seen.hook_seen, seen.hook_seen_ns) = (since, now);
            } else if now - seen.hook_seen_ns >= HOOK_STUCK_NS {
                continue;
            }
            oldest = Some(oldest.map_or(since - 1, |o| o.min(since - 1)));
        }
        oldest
    }

    /// Thread `index` counts `live` bytes now.
    fn count_live(&mut self, index: usize, live: u64) {
        let seen = &mut self.slots[index].live_seen;
        self.live_bytes = self.live_bytes.wrapping_add(live.wrapping_sub(*seen));
        *seen = live;
    }

    /// The agent's records: PROCESS (its image number set here), MODULES,
    /// NOTE, METRICS; only whole ones are passed on.
    fn drain_records(&mut self) {
        let capacity = self.area.capacity();
        let first = self.header().records_first_chunk.load(Acquire);
        let mut head = match self.records_head {
            Some(head) => head,
            None if first > 0 && first - 1 < capacity => first - 1,
            None => return,
        };
        self.records_head = Some(head);
        loop {
            let chunk = self.area.area.chunk(head);
            let next = chunk.next.load(Acquire);
            let len = (chunk.len.load(Acquire) as usize).min(CHUNK_DATA);
            let emitted = (chunk.emitted.load(Relaxed) as usize).min(len);
            // SAFETY: `head` is below the capacity; the agent wrote bytes up to `len`
            // (clamped to CHUNK_DATA) before publishing `len` with Release, and writes
            // no more of them. A program scribbling on its area can only make them
            // garbage, which the decoder takes as untrusted input.
            let data = unsafe { std::slice::from_raw_parts(self.area.area.chunk_data(head).add(emitted), len - emitted) };
            self.records_pending.extend_from_slice(data);
            chunk.emitted.store(len as u32, Relaxed);
            if next == 0 || next > capacity {
                break;
            }
            chunk.state.store(CHUNK_FREE, Release);
            self.chunks_released = true;
            head = next - 1;
            self.records_head = Some(head);
        }
        let complete = shared::complete_records_len(&self.records_pending);
        let pending = std::mem::take(&mut self.records_pending);
        for record in Records::new(&pending[..complete]) {
            match record {
                Ok(Record::Process(mut process)) => {
                    process.image = self.image;
                    self.push(&Record::Process(process));
                }
                Ok(Record::Fork(mut fork)) => {
                    // The parent's trace, by the name this run gave it;
                    // readers look for it beside this one.
                    let parent = (self.names)(fork.parent_pid);
                    fork.parent_trace = parent.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
                    self.push(&Record::Fork(fork));
                }
                Ok(record) => self.push(&record),
                Err(_) => {}
            }
        }
        self.records_pending = pending[complete..].to_vec();
    }

    /// A thread that made heap calls after its state closed goes on in a
    /// slot of its own, from its next buffer: the slots it had before are
    /// closed, and are drained to their end first, so that its buffers
    /// reach the trace in order.
    fn drain_earlier_slots_of_its_thread(&mut self, index: usize, used: usize) {
        let header = self.area.area.header();
        let Some(seq) = self.first_buffer_if_new(index) else { return };
        if seq == 0 {
            return;
        }
        let thread = header.slots[index].thread.load(Relaxed);
        let mut earlier: Vec<(u32, usize)> = (0..used)
            .filter(|&other| other != index && header.slots[other].state.load(Acquire) == SLOT_LIVE)
            .filter(|&other| header.slots[other].thread.load(Relaxed) == thread)
            .filter_map(|other| Some((self.buffer_of(other)?, other)))
            .filter(|&(other_seq, _)| other_seq < seq)
            .collect();
        earlier.sort_unstable();
        for (_, other) in earlier {
            self.drain_slot(other, u64::MAX);
        }
    }

    /// The buffer a live slot not yet drained starts with.
    fn first_buffer_if_new(&self, index: usize) -> Option<u32> {
        let slot = &self.area.area.header().slots[index];
        if self.slots[index].head.is_some() || slot.state.load(Acquire) != SLOT_LIVE {
            return None;
        }
        let first = slot.first_chunk.load(Relaxed);
        (first > 0 && first <= self.area.capacity()).then(|| self.area.area.chunk(first - 1).seq.load(Relaxed))
    }

    /// The buffer a live slot is at: the one it is drained from, or the first.
    fn buffer_of(&self, index: usize) -> Option<u32> {
        match self.slots[index].head {
            Some(head) => Some(self.area.area.chunk(head).seq.load(Relaxed)),
            None => self.first_buffer_if_new(index),
        }
    }

    /// Emits the committed bytes of one thread's chunks taken before round
    /// `taken_before`.
    fn drain_slot(&mut self, index: usize, taken_before: u64) -> Option<Drained> {
        let capacity = self.area.capacity();
        let area = self.area.area;
        let slot = &area.header().slots[index];
        let head = match self.slots[index].head {
            Some(head) => head,
            None => {
                if slot.state.load(Acquire) != SLOT_LIVE {
                    return None;
                }
                let first = slot.first_chunk.load(Relaxed);
                if first == 0 || first > capacity {
                    return None;
                }
                let (thread, tid, stack_hint) = (slot.thread.load(Relaxed), slot.tid.load(Relaxed), slot.stack_hint.load(Relaxed));
                self.push(&Record::Thread(Thread { thread, tid, stack_hint }));
                first - 1
            }
        };
        let mut head = head;
        self.slots[index].head = Some(head);
        // Bounded: a chain can be no longer than the area has chunks.
        for _ in 0..=capacity {
            let chunk = area.chunk(head);
            let next = chunk.next.load(Acquire);
            let closed = chunk.closed.load(Acquire);
            // Loaded after `next`/`closed`: final if either was set.
            let len = chunk.len.load(Acquire);
            self.emit(head, len);
            if next != 0 && next - 1 < capacity {
                chunk.state.store(CHUNK_FREE, Release);
                self.chunks_released = true;
                head = next - 1;
                self.slots[index].head = Some(head);
                if area.chunk(head).taken_in_round.load(Relaxed) >= taken_before {
                    return Some(Drained::Behind);
                }
                continue;
            }
            if closed != 0 {
                // The thread's last count, before the chunk and the slot go to others.
                self.count_live(index, chunk.live_bytes.load(Relaxed));
                self.slots[index].live_seen = 0;
                chunk.state.store(CHUNK_FREE, Release);
                self.chunks_released = true;
                self.slots[index].head = None;
                slot.state.store(SLOT_FREE, Release);
                return Some(Drained::Ended);
            }
            return Some(Drained::CaughtUp);
        }
        Some(Drained::CaughtUp)
    }

    fn emit(&mut self, index: u32, len: u32) {
        let area = self.area.area;
        let chunk = area.chunk(index);
        let len = len.min(CHUNK_DATA as u32);
        let emitted = chunk.emitted.load(Relaxed);
        if len <= emitted {
            return;
        }
        // SAFETY: as in `drain_records`: committed bytes of a chunk below the capacity.
        let bytes = unsafe { std::slice::from_raw_parts(area.chunk_data(index).add(emitted as usize), (len - emitted) as usize) };
        let (thread, tid, seq) = (chunk.thread.load(Relaxed), chunk.tid.load(Relaxed), chunk.seq.load(Relaxed));
        self.transcode(index, thread, tid, seq, emitted, bytes);
        chunk.emitted.store(len, Relaxed);
        // A thread may have filled many buffers since the last round; a
        // chunk must stay under the readers' limit (16 MiB).
        if self.raw.len() >= FLUSH_BYTES {
            self.flush();
        }
    }

    /// Re-encodes the agent's records `bytes`, at `emitted` in the
    /// buffer `seq` that chunk `index` holds, in the trace's compact
    /// encoding. The agent's delta state goes on from the chunk's last
    /// piece; after a record that does not decode (a program that wrote
    /// over its area), nothing more of the chunk is written: a reader finds
    /// the gap.
    fn transcode(&mut self, index: u32, thread: u32, tid: u32, seq: u32, emitted: u32, bytes: &[u8]) {
        let index = index as usize;
        if self.agent_deltas.len() <= index {
            self.agent_deltas.resize(index + 1, None);
        }
        if emitted == 0 {
            self.agent_deltas[index] = Some(DeltaState::default());
        }
        let Some(agent) = self.agent_deltas[index].as_mut() else { return };
        self.compact.clear();
        let taken = compact::transcode(agent, &mut self.compact_state, bytes, &mut self.compact);
        if taken < bytes.len() {
            self.agent_deltas[index] = None;
        }
        if taken > 0 {
            let piece = CompactEventsPiece { thread, tid, buffer: seq, offset: emitted, source_len: taken as u32, records: &self.compact };
            Record::CompactEvents(piece).encode(&mut self.raw);
        }
    }

    fn answer_requests(&mut self) {
        let area = self.area.area;
        let header = area.header();
        let seq = header.request_seq.load(Acquire);
        if seq != header.answered.0.load(Acquire) {
            let kind = header.request_kind.load(Acquire);
            let mut value = 0;
            match kind {
                shared::REQUEST_SNAPSHOT | shared::REQUEST_EXIT_SNAPSHOT => {
                    if kind == shared::REQUEST_EXIT_SNAPSHOT {
                        self.exit_requested_ns.get_or_insert_with(monotonic_ns);
                    }
                    self.round(false);
                    let rss = self.sample_rss();
                    let reason = if kind == shared::REQUEST_SNAPSHOT { SnapshotReason::Program } else { SnapshotReason::Exit };
                    self.snapshot(reason, rss);
                }
                shared::REQUEST_RSS => value = self.read_status().vm_rss,
                _ => {}
            }
            header.answer_value.store(value, Release);
            header.answered.0.store(seq, Release);
            futex_wake(&header.answered.0);
        }
        let snap = header.snap_requests.load(Acquire);
        if snap != header.snap_answered.load(Acquire) {
            let rss = self.sample_rss();
            self.snapshot(SnapshotReason::Requested, rss);
            header.snap_answered.store(snap, Release);
            futex_wake(&header.snap_answered);
        }
    }

    fn snapshot_due(&mut self, rss: &Rss) -> Option<SnapshotReason> {
        if rss.vm_rss * 100 > self.snapshot_peak_rss * 105 && rss.vm_rss > 0 {
            return Some(SnapshotReason::RssPeak);
        }
        // The program asked for it by trimming: the same reason as its
        // memgap_snapshot() (the trace format has no reason of its own for it).
        let since_last = monotonic_ns() - self.last_snapshot_ns;
        // Only snapshots after trims wait ten times their cost: a program
        // trimming in a loop must not keep the recorder snapshotting.
        let trims = self.header().trims.load(Acquire);
        let gap =
            if self.last_snapshot_after_trim { TRIM_SNAPSHOT_GAP_NS.max(self.last_snapshot_cost_ns * 10) } else { TRIM_SNAPSHOT_GAP_NS };
        if trims != self.trims_seen && since_last >= gap {
            self.trim_snapshot_pending = true;
            return Some(SnapshotReason::Program);
        }
        if self.live_dropped(since_last) {
            return Some(SnapshotReason::LiveDrop);
        }
        let periodic = self.snapshot_interval_ns > 0 && since_last >= self.snapshot_interval_ns;
        periodic.then_some(SnapshotReason::Periodic)
    }

    /// Whether the live heap fell enough since the last snapshot for one
    /// now: a plateau after mass frees, which RSS (kept by the allocator)
    /// does not show, would otherwise wait for the next periodic snapshot
    /// and may be gone by then. No sooner than [`TRIM_SNAPSHOT_GAP_NS`]
    /// after the last snapshot.
    fn live_dropped(&mut self, since_last: u64) -> bool {
        let live = self.live_bytes as i64;
        let previous = std::mem::replace(&mut self.live_last_round, live);
        self.live_high = self.live_high.max(live);
        let fall = self.live_high - live;
        if fall < LIVE_DROP_MIN_BYTES || fall < self.live_high / 4 {
            self.live_drop_seen_ns = None;
            return false;
        }
        let seen = *self.live_drop_seen_ns.get_or_insert_with(monotonic_ns);
        let settled = previous - live < fall / 64 || monotonic_ns() - seen >= LIVE_DROP_SETTLE_NS;
        settled && since_last >= TRIM_SNAPSHOT_GAP_NS
    }

    /// Takes a snapshot now, from outside, and writes it out at once.
    fn snapshot(&mut self, reason: SnapshotReason, rss: Rss) {
        // Any snapshot from here on shows what an earlier trim did.
        self.trims_seen = self.header().trims.load(Acquire);
        self.last_snapshot_after_trim = std::mem::take(&mut self.trim_snapshot_pending);
        let started_ns = monotonic_ns();
        // SAFETY: no precondition.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        // VmRSS is read right before and right after the pages, so the
        // rows can be checked against both; a program moving RSS by more
        // than 1 % meanwhile gets a second and third reading, and the
        // closest is kept (the ledger says how far RSS moved).
        let allocator_stats = self
            .linked_allocator
            .get_or_insert_with(|| super::linked_allocator::LinkedAllocatorReader::find(self.pid))
            .as_mut()
            .and_then(|reader| reader.read(self.pid));
        let mut best: Option<(u64, Rss, u64, Vec<memgap_trace::records::Mapping>)> = None;
        for _attempt in 0..SNAPSHOT_ATTEMPTS {
            let before = self.read_status();
            let before = if before.vm_rss > 0 { before } else { rss };
            // Events from here on are later than the snapshot; those
            // stamped before the advance, earlier.
            let time = self.header().clock.0.fetch_add(1, AcqRel);
            self.read_smaps();
            let mut mappings = memgap_trace::smaps::parse_smaps(&self.smaps);
            let pagemap = File::open(format!("/proc/{}/pagemap", self.pid)).ok();
            for mapping in mappings.iter_mut().filter(|m| m.is_private_writable_anonymous()) {
                self.beat();
                mapping.residency = match &pagemap {
                    Some(pagemap) => residency_of(pagemap, mapping.start, mapping.end, page_size, &mut self.pagemap_entries),
                    None => Residency::Unknown,
                };
            }
            let after = self.read_status().vm_rss;
            let moved = after.abs_diff(before.vm_rss);
            let better = best.as_ref().is_none_or(|(_, best_before, best_after, _)| moved < best_after.abs_diff(best_before.vm_rss));
            if better {
                best = Some((time, before, after, mappings));
            }
            let steady = moved * 100 <= after.max(1);
            if steady || monotonic_ns() - started_ns > SNAPSHOT_RETRY_BUDGET_NS {
                break;
            }
        }
        let (time, before, vm_rss_after, mappings) = best.expect("one attempt at least");
        let agent_ranges = self.agent_ranges();
        let python = super::python::census_of(self.pid, self.header(), time, &mappings, page_size);
        let snapshot = Snapshot {
            time,
            reason,
            rss: Rss { time, ..before },
            vm_rss_after,
            page_size,
            mappings,
            agent_ranges,
            cost_ns: monotonic_ns() - started_ns,
        };
        self.last_snapshot_ns = monotonic_ns();
        self.last_snapshot_cost_ns = snapshot.cost_ns;
        self.snapshot_peak_rss = self.snapshot_peak_rss.max(snapshot.rss.vm_rss);
        // A fall is measured from the live heap this snapshot saw.
        self.live_high = self.live_bytes as i64;
        self.live_drop_seen_ns = None;
        self.beat();
        let placement = self.placer.place(&snapshot);
        self.beat();
        if let Some(census) = python {
            self.push(&Record::Metrics(census.to_metrics(monotonic_ns())));
        }
        if let Some(mut stats) = allocator_stats {
            stats.snapshot_time = time;
            self.push(&Record::Metrics(stats.to_metrics(monotonic_ns())));
        }
        self.push(&Record::Snapshot(snapshot));
        self.push(&Record::Placement(placement));
        self.flush();
    }

    /// The agent's own mappings, as it published them (a consistent copy).
    fn agent_ranges(&self) -> Vec<(u64, u64)> {
        let header = self.header();
        for _ in 0..1000 {
            let before = header.ranges_seq.0.load(Acquire);
            if before % 2 == 1 {
                std::thread::yield_now();
                continue;
            }
            let len = (header.ranges_len.load(Relaxed) as usize).min(shared::AGENT_RANGES);
            let ranges: Vec<(u64, u64)> = header.ranges[..len].iter().map(|r| (r[0].load(Relaxed), r[1].load(Relaxed))).collect();
            std::sync::atomic::fence(Acquire);
            if header.ranges_seq.0.load(Relaxed) == before {
                return ranges;
            }
        }
        Vec::new()
    }

    /// /proc/PID/smaps, in pieces with a beat after each: a process of
    /// thousands of mappings takes the kernel a while, and the agent's
    /// threads waiting for chunks must see the recorder live meanwhile.
    fn read_smaps(&mut self) {
        use std::io::Read;
        self.smaps.clear();
        let Ok(mut file) = File::open(format!("/proc/{}/smaps", self.pid)) else { return };
        let mut piece = vec![0u8; 1 << 16];
        loop {
            match file.read(&mut piece) {
                Ok(0) => break,
                Ok(n) => {
                    self.smaps.extend_from_slice(&piece[..n]);
                    self.beat();
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    /// The current RSS; also recorded as an RSS sample.
    fn sample_rss(&mut self) -> Rss {
        let rss = self.read_status();
        // Zero: the process is gone (its status unreadable), not a sample.
        if rss.vm_rss > 0 {
            self.push(&Record::Rss(rss));
        }
        rss
    }

    /// VmRSS, RssAnon, RssFile and RssShmem from /proc/PID/status, and VmHWM.
    fn read_status(&mut self) -> Rss {
        let mut rss = Rss { time: self.now(), ..Rss::default() };
        let Some(status) = &self.status else { return rss };
        let mut buf = [0u8; 4096];
        let n = match status.read_at(&mut buf, 0) {
            Ok(n) => n,
            Err(_) => return rss,
        };
        for line in buf[..n].split(|&b| b == b'\n') {
            let kib = || -> u64 {
                let digits = line.iter().skip_while(|b| !b.is_ascii_digit()).take_while(|b| b.is_ascii_digit());
                digits.fold(0u64, |acc, &d| acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))).saturating_mul(1024)
            };
            match line.split(|&b| b == b':').next() {
                Some(b"VmRSS") => rss.vm_rss = kib(),
                Some(b"RssAnon") => rss.rss_anon = kib(),
                Some(b"RssFile") => rss.rss_file = kib(),
                Some(b"RssShmem") => rss.rss_shmem = kib(),
                Some(b"VmHWM") => self.vm_hwm = self.vm_hwm.max(kib()),
                _ => {}
            }
        }
        rss
    }

    fn flush(&mut self) {
        self.last_flush_ns = monotonic_ns();
        if self.raw.is_empty() {
            return;
        }
        if self.failed.is_none() {
            self.encoder.encode(&self.raw, &mut self.framed);
            if let Err(error) = self.file.write_all(&self.framed) {
                self.failed = Some(format!(
                    "recording stopped: cannot write {}: {} (the program continues; the trace keeps what was written)",
                    self.path.display(),
                    std::io::Error::from_raw_os_error(error.raw_os_error().unwrap_or(libc::EIO))
                ));
                // The agent stops at its next chunk; the program runs on.
                self.header().recorder_state.store(shared::RECORDER_GONE, Release);
            }
        }
        self.raw.clear();
    }

    /// The process exited through its exit hook: the last events, the END record.
    fn end(&mut self) {
        self.round(true);
        let area = self.area.area;
        let header = area.header();
        let exit_code = (header.has_exit_code.load(Acquire) != 0).then(|| header.exit_code.load(Relaxed));
        let end =
            End { time: self.now(), reason: EndReason::Exit, dropped_events: header.dropped.load(Relaxed), vm_hwm: self.vm_hwm, exit_code };
        self.push(&Record::End(end));
        self.flush();
    }

    /// An exec: the next image's area, and the trace goes on with it.
    fn switch_image(&mut self, next: MappedArea) {
        self.area = next;
        self.linked_allocator = None;
        self.image += 1;
        write_trace_path(&self.area, &self.path);
        self.area.header().recorder_state.store(shared::RECORDER_ATTACHED, Release);
        self.slots.iter_mut().for_each(|s| *s = SlotState::default());
        // The new image's clock and heap start again.
        (self.clock_written, self.committed_below) = (0, 0);
        (self.live_bytes, self.live_high, self.live_last_round, self.live_drop_seen_ns) = (0, 0, 0, None);
        self.records_head = None;
        self.records_pending.clear();
    }

    /// Why recording stopped early, if it did (said once by the caller).
    fn stopped_reason(&mut self) -> Option<String> {
        if let Some(failed) = self.failed.take() {
            return Some(failed);
        }
        let area = self.area.area;
        let dropped = area.header().dropped.load(Relaxed);
        if area.header().agent_state.load(Acquire) == shared::AGENT_STOPPED && !self.stopped_noted {
            self.stopped_noted = true;
            return Some(format!(
                "process {}: the recorder fell behind (the program's threads waited too long for buffers); recording stopped there ({dropped} events not recorded; the program ran on)",
                self.pid
            ));
        }
        None
    }
}

/// Residency of `[start, end)` from /proc/PID/pagemap's present bits.
fn residency_of(pagemap: &File, start: u64, end: u64, page_size: u64, entries: &mut Vec<u8>) -> Residency {
    let pages = ((end - start) / page_size) as usize;
    // In pieces: a huge reservation must not cost a huge buffer.
    const PIECE: usize = 1 << 16;
    let mut bits = vec![0u8; pages.div_ceil(8)];
    let mut resident = 0usize;
    let mut page = 0usize;
    while page < pages {
        let count = PIECE.min(pages - page);
        entries.resize(count * 8, 0);
        if pagemap.read_exact_at(entries, (start / page_size + page as u64) * 8).is_err() {
            // Unmapped meanwhile: those pages are not resident now.
            page += count;
            continue;
        }
        for (i, entry) in entries.chunks_exact(8).enumerate() {
            if u64::from_le_bytes(entry.try_into().unwrap()) & PAGEMAP_PRESENT != 0 {
                let p = page + i;
                bits[p / 8] |= 1 << (p % 8);
                resident += 1;
            }
        }
        page += count;
    }
    match resident {
        0 => Residency::None,
        n if n == pages => Residency::All,
        _ => Residency::Bitmap(bits),
    }
}

/// Shared futexes: the word is in memory the traced process maps too.
fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec { tv_sec: (timeout_ns / 1_000_000_000) as i64, tv_nsec: (timeout_ns % 1_000_000_000) as i64 };
    // SAFETY: `word` is a live atomic, `ts` a valid timespec.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts) };
}

pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live atomic.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_of_our_own_pages() {
        let page = 4096usize;
        // SAFETY: a new private anonymous mapping the kernel places: it replaces nothing.
        let mem = unsafe {
            libc::mmap(std::ptr::null_mut(), 64 * page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        } as *mut u8;
        for i in (0..64).step_by(4) {
            // SAFETY: inside the mapping just made, writable.
            unsafe { *mem.add(i * page) = 1 };
        }
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let residency = residency_of(&pagemap, mem as u64, mem as u64 + 64 * page as u64, page as u64, &mut Vec::new());
        for i in 0..64 {
            assert_eq!(residency.is_resident(i), i % 4 == 0, "page {i}");
        }
        // SAFETY: the test's own mapping, unused from here on.
        unsafe { libc::munmap(mem as *mut libc::c_void, 64 * page) };
    }

    #[test]
    fn an_area_of_another_layout_is_told_from_one_not_ready_yet() {
        let dir = tempfile::tempdir().unwrap();
        let area = |name: &str, start: &[u8]| {
            let path = dir.path().join(name);
            let mut bytes = start.to_vec();
            bytes.resize(shared::HEADER_BYTES, 0);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let refused = |path: &Path| MappedArea::open(path).err();
        let older = area("1.0.area", &[b"MGAREA01".as_slice(), &4321u32.to_le_bytes()].concat());
        assert_eq!(refused(&older), Some(Unopened::OtherLayout(4321)));
        // This layout's magic: ours, mapped.
        let ours = area("2.0.area", &[shared::AREA_MAGIC.to_le_bytes().as_slice(), &77u32.to_le_bytes()].concat());
        assert!(MappedArea::open(&ours).is_ok(), "a header of this layout is ours");
        // Not written yet, or not an area at all, or a FIFO (never waited on).
        assert_eq!(refused(&area("3.0.area", &[])), Some(Unopened::NotReady));
        assert_eq!(refused(&area("4.0.area", b"ELF\0\0\0\0\0\x01\0\0\0")), Some(Unopened::NotReady));
        assert_eq!(refused(&dir.path().join("5.0.area")), Some(Unopened::NotReady));
        let fifo = dir.path().join("6.0.area");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert_eq!(refused(&fifo), Some(Unopened::NotReady));
    }
}
