//! Recording a Go program. A Go binary does not use malloc (and a
//! static one ignores LD_PRELOAD), so the agent is not loaded: memgap writes
//! the trace itself, from outside the program:
//! - GODEBUG=gctrace=1 is added to the user's GODEBUG, and the program's
//!   stderr goes through memgap, which takes the gctrace lines out (unless
//!   the user asked for gctrace) and passes everything else on at once. The
//!   runtime writes a gctrace line in pieces, one write(2) each, between
//!   which other threads of the program write too: the pipe is a packet
//!   pipe (O_DIRECT), so each read is one write of the program and the
//!   runtime's pieces can be told from the program's own bytes;
//! - VmRSS every `--rss-interval`, snapshots of page residency (smaps and
//!   pagemap) every `--snapshot-interval`, at each new RSS peak, when the
//!   helper package asks, and at exit (the program is held at its exit with
//!   ptrace's PTRACE_EVENT_EXIT, before its memory is gone);
//! - runtime/metrics from the helper package (`go/memgap`), when the
//!   program imports it, through a pipe named in MEMGAP_GO_METRICS (and a
//!   second pipe back: `s` asks for a sample now, before a snapshot; `k`
//!   answers the program's own snapshot request).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::Context;
use memgap_attach::residency::{self, monotonic_ns};
use memgap_source_go::buildinfo::GoBinary;
use memgap_source_go::{gctrace, helper};
use memgap_trace::TraceWriter;
use memgap_trace::records::{CLOCK_MONOTONIC_NS, Clock, End, EndReason, Exit, Metrics, Process, Record, RecordingCost, SnapshotReason};
use memgap_trace::vocabulary::{env, kind};

use crate::signals::{child_started, forward_signals};
use crate::sys::pipe;
use crate::traces::{self, trace_path};

/// A snapshot is also taken when RSS passes the last snapshot's by 5 %.
const PEAK_STEP: f64 = 1.05;
/// How long a snapshot waits for the helper's fresh figures.
const FRESH_SAMPLE_PATIENCE: Duration = Duration::from_millis(50);
/// Records are written at least this often.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

enum Message {
    Gc(gctrace::GcLine, u64),
    Helper(helper::Line, u64),
    HelperBad(helper::BadLine),
    HelperClosed,
    StderrClosed,
    /// The program is held at its exit; reply to let it go.
    ExitStop(Sender<()>),
    Exited {
        exit_code: i32,
        signal: i32,
        /// The program's CPU time (with the children it waited for), when it was reaped.
        cpu_ns: Option<u64>,
    },
    NoExitSnapshot(String),
}

/// What `memgap run` asks of a Go program's recording.
pub struct GoRecording<'a> {
    /// The program and its arguments.
    pub command: &'a [OsString],
    /// Milliseconds between VmRSS samples.
    pub rss_interval_ms: u64,
    /// Seconds between snapshots of page residency (0: only at RSS peaks, on the program's request and at exit).
    pub snapshot_interval_s: f64,
    /// Nothing on stderr (the helper's bad lines are noted in the trace either way).
    pub quiet: bool,
}

/// How a Go program's recording went.
#[derive(Debug)]
pub enum GoOutcome {
    /// memgap refused to start the program; one line for the user says why.
    Refused(String),
    /// The program could not start.
    SpawnFailed(std::io::Error),
    /// The program ran to its end and its trace is complete.
    Recorded { trace: PathBuf, exit_code: i32 },
}

/// Runs the Go program `go` (the binary of `recording.command[0]`) and writes
/// its trace, named by `pattern`, until it exits.
pub fn record(recording: &GoRecording, go: &GoBinary, pattern: &Path, run_id: u64) -> anyhow::Result<GoOutcome> {
    // memgap writes the trace itself: a place it cannot write is refused
    // before the program starts.
    let dir = pattern.parent().unwrap_or(Path::new("."));
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).context("the trace's directory")?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        anyhow::bail!("cannot write the trace in {}: {}", dir.display(), std::io::Error::last_os_error());
    }
    let user_godebug = std::env::var("GODEBUG").unwrap_or_default();
    let user_wants_gctrace = user_godebug.split(',').any(|s| s.trim().strip_prefix("gctrace=").is_some_and(|v| v != "0"));
    let godebug = match (user_godebug.is_empty(), user_wants_gctrace) {
        (true, _) => "gctrace=1".to_string(),
        (false, true) => user_godebug.clone(),
        (false, false) => format!("{user_godebug},gctrace=1"),
    };
    let (helper_read, helper_write) = pipe().context("cannot create a pipe")?;
    let (ack_read, ack_write) = pipe().context("cannot create a pipe")?;
    let child_ends = [helper_write.as_raw_fd(), ack_read.as_raw_fd()];
    let interval_ms = recording.rss_interval_ms.max(100);

    let mut command = std::process::Command::new(&recording.command[0]);
    command
        .args(&recording.command[1..])
        .env("GODEBUG", &godebug)
        .env(env::GO_METRICS, format!("{},{}", child_ends[0], child_ends[1]))
        .env(env::GO_INTERVAL_MS, interval_ms.to_string());
    let (stderr_read, stderr_write, packets) = stderr_pipe()?;
    command.stderr(Stdio::from(stderr_write));
    // The child keeps its ends of the two pipes across exec.
    // SAFETY: the closure runs in the forked child before exec and only calls
    // fcntl, which is async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            for fd in child_ends {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // A name already taken stops everything before the program starts.
    let reservation = match traces::reserve(&mut command, pattern) {
        Ok(reservation) => reservation,
        Err(line) => return Ok(GoOutcome::Refused(line)),
    };
    let start_ns = monotonic_ns();
    let start_realtime_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    forward_signals();
    let cpu_before_start = crate::sys::own_cpu_ns();
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => match reservation.spawn_failed(&error, |pid| trace_path(pattern, pid, true)) {
            Some(line) => return Ok(GoOutcome::Refused(line)),
            None => return Ok(GoOutcome::SpawnFailed(error)),
        },
    };
    let identity = reservation.started();
    drop((helper_write, ack_read));
    let pid = child.id();
    child_started(pid);

    let (sender, messages) = mpsc::channel();
    // Only the program holds the pipe's write end: its exit ends the filter.
    command.stderr(Stdio::null());
    spawn_stderr_filter(File::from(stderr_read), packets, !user_wants_gctrace, sender.clone());
    spawn_helper_reader(helper_read, sender.clone());
    spawn_waiter(pid, sender);
    // The waiter thread reaps the child with waitpid: std's Child must not.
    std::mem::forget(child);

    let trace_path = trace_path(pattern, pid, true);
    let file = identity
        .ok_or_else(|| std::io::Error::other("the program started without its trace"))
        .and_then(|identity| memgap_trace::files::open_created(&trace_path, identity))
        .with_context(|| format!("cannot write the trace {}", trace_path.display()))?;
    let mut writer =
        TraceWriter::from_created(file, &trace_path, run_id).with_context(|| format!("cannot write the trace {}", trace_path.display()))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| recording.command[0].to_string_lossy().into_owned());
    let process = Process {
        pid,
        ppid: std::process::id(),
        run_id,
        image: 0,
        clock: CLOCK_MONOTONIC_NS,
        start_time: start_ns,
        start_monotonic_ns: start_ns,
        start_realtime_ns,
        // SAFETY: no precondition.
        page_size: unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64,
        cpu_count: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
        exe,
        argv: recording.command.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
    };
    let mut recorder = Recorder {
        pid,
        writer: &mut writer,
        pending: Vec::new(),
        version: None,
        peak_snapshot_rss: 0,
        vm_hwm: 0,
        helper: false,
        deferred: VecDeque::new(),
        cpu_before_start,
    };
    recorder.pending.push(Record::Process(process));
    recorder.set_version(&go.version, "buildinfo");
    recorder.flush()?;

    let (exit_code, _signal) = recorder.record(recording, messages, ack_write)?;
    drop(recorder);
    drop(writer);
    Ok(GoOutcome::Recorded { trace: trace_path, exit_code })
}

struct Recorder<'w> {
    pid: u32,
    writer: &'w mut TraceWriter,
    pending: Vec<Record<'static>>,
    version: Option<String>,
    peak_snapshot_rss: u64,
    vm_hwm: u64,
    /// The helper package said hello: it answers `s` with a sample.
    helper: bool,
    /// Messages that came while waiting for a fresh sample.
    deferred: VecDeque<Message>,
    /// memgap's own CPU time when the program started.
    cpu_before_start: u64,
}

impl Recorder<'_> {
    fn flush(&mut self) -> anyhow::Result<()> {
        // Readers hold snapshots back until a CLOCK record passes them.
        let now = monotonic_ns();
        self.pending.push(Record::Clock(Clock { time: now, monotonic_ns: now }));
        self.writer.write(&self.pending).with_context(|| format!("cannot write the trace {}", self.writer.path().display()))?;
        self.pending.clear();
        Ok(())
    }

    fn metrics(&mut self, kind: &str, values: Vec<(String, f64)>, monotonic_ns: u64) {
        self.pending.push(Record::Metrics(Metrics { monotonic_ns, source: memgap_source_go::SOURCE.into(), kind: kind.into(), values }));
    }

    /// The Go version, and the size classes it implies (objects per span
    /// differ between versions and GCs).
    fn set_version(&mut self, version: &str, from: &str) {
        if self.version.as_deref() == Some(version) {
            return;
        }
        self.version = Some(version.to_string());
        let now = monotonic_ns();
        self.pending.push(Record::Note { time: now, text: format!("Go {version} (from the {from})") });
        self.pending.extend(memgap_source_go::version_metrics(version, now).into_iter().map(Record::Metrics));
    }

    /// Asks the helper package for runtime/metrics now, so that a snapshot
    /// taken while the heap grows is laid over current figures; waits for
    /// them a little (other messages are kept for later).
    fn fresh_sample(&mut self, messages: &Receiver<Message>, ack: &mut File) {
        if !self.helper || ack.write_all(b"s").is_err() {
            return;
        }
        let deadline = Instant::now() + FRESH_SAMPLE_PATIENCE;
        while let Ok(message) = messages.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if let Message::Helper(helper::Line::Sample(values), at) = message {
                self.metrics(kind::SAMPLE, values, at);
                return;
            }
            self.deferred.push_back(message);
        }
    }

    fn snapshot(&mut self, reason: SnapshotReason) -> anyhow::Result<()> {
        // An error: the program ended between two readings.
        if let Ok(snapshot) = residency::snapshot(self.pid, reason) {
            self.peak_snapshot_rss = self.peak_snapshot_rss.max(snapshot.vm_rss_after.max(snapshot.rss.vm_rss));
            self.pending.push(Record::Snapshot(snapshot));
        }
        self.flush()
    }

    /// Runs until the program has exited; returns its exit code and signal.
    fn record(&mut self, recording: &GoRecording, messages: Receiver<Message>, ack: OwnedFd) -> anyhow::Result<(i32, i32)> {
        let mut ack = File::from(ack);
        let rss_every = Duration::from_millis(recording.rss_interval_ms);
        let snapshot_every = (recording.snapshot_interval_s > 0.0).then(|| Duration::from_secs_f64(recording.snapshot_interval_s));
        let started = Instant::now();
        let (mut next_rss, mut next_snapshot, mut next_flush) = (started, snapshot_every.map(|d| started + d), started + FLUSH_EVERY);
        let mut exited: Option<(i32, i32, Option<u64>)> = None;
        let mut open_streams = 2;
        let mut gc_seen = false;
        let mut drain_until = None;
        loop {
            let now = Instant::now();
            if exited.is_none() {
                if now >= next_rss {
                    next_rss = now + rss_every;
                    if let Ok(rss) = residency::rss(self.pid) {
                        self.vm_hwm = self.vm_hwm.max(rss.vm_rss);
                        // The first sample is the mark the first peak must pass
                        // (it may still be memgap's own image, before the exec).
                        if self.peak_snapshot_rss == 0 {
                            self.peak_snapshot_rss = rss.vm_rss;
                        }
                        let peak = rss.vm_rss as f64 > self.peak_snapshot_rss as f64 * PEAK_STEP;
                        self.pending.push(Record::Rss(rss));
                        if peak {
                            self.fresh_sample(&messages, &mut ack);
                            self.snapshot(SnapshotReason::RssPeak)?;
                        }
                    }
                }
                if next_snapshot.is_some_and(|at| now >= at) {
                    next_snapshot = snapshot_every.map(|d| now + d);
                    self.fresh_sample(&messages, &mut ack);
                    self.snapshot(SnapshotReason::Periodic)?;
                }
            }
            if now >= next_flush {
                next_flush = now + FLUSH_EVERY;
                self.flush()?;
            }
            let wake = [Some(next_rss), next_snapshot, Some(next_flush), drain_until].into_iter().flatten().min().unwrap();
            let received = match self.deferred.pop_front() {
                Some(message) => Ok(message),
                None => messages.recv_timeout(wake.saturating_duration_since(Instant::now())),
            };
            let message = match received {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) => {
                    if drain_until.is_some_and(|at| Instant::now() >= at) {
                        break;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            match message {
                Message::Gc(gc, at) => {
                    gc_seen = true;
                    self.pending.push(Record::Metrics(gc.to_metrics(at)));
                }
                Message::Helper(helper::Line::Hello { version }, _) => {
                    self.helper = true;
                    self.set_version(&version, "helper package");
                }
                Message::Helper(helper::Line::Sample(values), at) => self.metrics(kind::SAMPLE, values, at),
                Message::Helper(helper::Line::Snapshot, _) => {
                    self.snapshot(SnapshotReason::Program)?;
                    // The program waits for this byte: it may go on now.
                    let _ = ack.write_all(b"k");
                }
                Message::HelperBad(bad) => {
                    if !recording.quiet {
                        eprintln!("memgap: {bad}");
                    }
                    self.pending.push(Record::Note { time: monotonic_ns(), text: bad.to_string() });
                }
                Message::ExitStop(reply) => {
                    if let Ok(rss) = residency::rss(self.pid) {
                        self.pending.push(Record::Rss(rss));
                    }
                    self.snapshot(SnapshotReason::Exit)?;
                    let _ = reply.send(());
                }
                Message::NoExitSnapshot(why) => {
                    self.pending.push(Record::Note { time: monotonic_ns(), text: format!("no snapshot at exit: {why}") })
                }
                Message::Exited { exit_code, signal, cpu_ns } => {
                    exited = Some((exit_code, signal, cpu_ns));
                    // Lines still in the pipes; a grandchild holding stderr open is not waited for long.
                    drain_until = Some(Instant::now() + Duration::from_secs(2));
                    if open_streams == 0 {
                        break;
                    }
                }
                Message::HelperClosed | Message::StderrClosed => {
                    open_streams -= 1;
                    if open_streams == 0 && exited.is_some() {
                        break;
                    }
                }
            }
        }
        let (exit_code, signal, program_cpu_ns) = exited.unwrap_or((1, 0, None));
        if !gc_seen {
            self.pending.push(Record::Note {
                time: monotonic_ns(),
                text: "no gctrace line was read (the program ended before its first GC, or closed stderr)".into(),
            });
        }
        self.pending.push(Record::End(End {
            time: monotonic_ns(),
            reason: EndReason::Exit,
            dropped_events: 0,
            vm_hwm: self.vm_hwm,
            exit_code: Some(exit_code),
        }));
        let recorder_cpu_ns = crate::sys::own_cpu_ns().saturating_sub(self.cpu_before_start);
        let cost = program_cpu_ns.map(|program_cpu_ns| RecordingCost { program_cpu_ns, recorder_cpu_ns });
        self.pending.push(Record::Exit(Exit { exit_code, signal, cost }));
        self.flush()?;
        Ok((exit_code, signal))
    }
}

/// The program's stderr: a packet pipe where the kernel has them (each
/// read returns one write), else a plain pipe; whether it is a packet pipe.
fn stderr_pipe() -> anyhow::Result<(OwnedFd, OwnedFd, bool)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_DIRECT) } == 0 {
        // Each write takes a page of the pipe whatever its length: the default
        // 16 pages fill at once, and the writers that waited for room (the
        // runtime's thread among them) resume in any order, mixing their
        // writes more than the program did.
        for size in [1 << 20, 256 << 10] {
            // SAFETY: our own descriptor; no memory is passed.
            if unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, size) } >= 0 {
                break;
            }
        }
        // SAFETY: pipe2 succeeded, so both descriptors are new and owned by nothing else.
        return Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]), true) });
    }
    let (read, write) = pipe().context("cannot create a pipe")?;
    Ok((read, write, false))
}

/// Passes the program's stderr on as it comes, minus the gctrace lines when
/// `strip` (they go to the recorder either way). `packets`: each read is
/// one write of the program's.
fn spawn_stderr_filter(mut stderr: File, packets: bool, strip: bool, sender: Sender<Message>) {
    std::thread::spawn(move || {
        let mut out = std::io::stderr();
        // A packet is at most PIPE_BUF bytes; a shorter read would lose the rest.
        let mut buffer = vec![0u8; 64 << 10];
        let mut filter = StderrFilter { strip, ..StderrFilter::default() };
        let mut pieces = GctracePieces { strip, ..GctracePieces::default() };
        let mut to_write = Vec::new();
        loop {
            to_write.clear();
            if let Some(deadline) = pieces.patience_ends() {
                // A held line is let go when its next piece is overdue, even if nothing else comes.
                if !readable_before(&stderr, deadline) {
                    pieces.let_go(&mut to_write);
                    let _ = out.write_all(&to_write);
                    let _ = out.flush();
                    continue;
                }
            }
            let n = match stderr.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let gc = |gc| {
                let _ = sender.send(Message::Gc(gc, monotonic_ns()));
            };
            if packets {
                pieces.feed(&buffer[..n], Instant::now(), &mut to_write, gc);
            } else {
                filter.feed(&buffer[..n], &mut to_write, gc);
            }
            let _ = out.write_all(&to_write);
            let _ = out.flush();
        }
        let _ = out.write_all(&filter.line);
        pieces.end();
        let _ = sender.send(Message::StderrClosed);
    });
}

/// Whether `file` has something to read (or its end) before `deadline`.
fn readable_before(file: &File, deadline: Instant) -> bool {
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let timeout = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: `poll` is one valid pollfd, ours to write.
        match unsafe { libc::poll(&mut poll, 1, timeout) } {
            0 if Instant::now() >= deadline => return false,
            0 => {}
            n if n > 0 => return true,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            // A poll that fails: reading decides.
            _ => return true,
        }
    }
}

/// A gctrace line as the Go runtime writes it (runtime/mgc.go prints each
/// argument with its own write(2)): its literal pieces in order, each
/// with whether a number comes before it and which may follow.
const GCTRACE_STEPS: &[(&[u8], bool, &[usize])] = &[
    (b"gc ", false, &[1]),
    (b" @", true, &[2]),
    (b"s ", true, &[3, 4]),
    (b"%: ", true, &[6]),
    (b"%", true, &[5]),
    (b": ", false, &[6]),
    (b"+", true, &[7]),
    (b"+", true, &[8]),
    (b" ms clock, ", true, &[9]),
    (b"+", true, &[10]),
    (b"/", true, &[11]),
    (b"/", true, &[12]),
    (b"+", true, &[13]),
    (b" ms cpu, ", true, &[14]),
    (b"->", true, &[15]),
    (b"->", true, &[16]),
    (b" MB, ", true, &[17]),
    (b" MB goal, ", true, &[18, 20]),
    (b" MB stacks, ", true, &[19]),
    (b" MB globals, ", true, &[20]),
    (b" P", true, &[21, 22]),
    (b" (forced)", false, &[22]),
    (b"\n", false, &[]),
];

/// Splits stderr read one write at a time: the runtime's pieces of a
/// gctrace line, from its "gc " to its newline, are held and parsed
/// together; every other write passes on at once, in its place among
/// them. A write fits the line only as its next piece, so the program's
/// own writes in between (a bare newline included) are told apart.
#[derive(Default)]
struct GctracePieces {
    strip: bool,
    /// The pieces of the gctrace line being written, if one is.
    held: Vec<Vec<u8>>,
    /// The last literal piece's step, and whether a number followed it.
    step: usize,
    number_seen: bool,
    /// When the last piece of the line came: a line whose next piece is
    /// overdue was never the runtime's and is let go.
    last_piece: Option<Instant>,
}

impl GctracePieces {
    /// The runtime writes a line's pieces back to back under its print
    /// lock, but its thread may wait for a CPU while the program's own
    /// threads write hundreds of times: patience is counted in time.
    const PATIENCE: Duration = Duration::from_secs(2);

    /// When a held line is let go if no next piece comes: the runtime's
    /// surely comes, however late.
    fn patience_ends(&self) -> Option<Instant> {
        self.last_piece.filter(|_| !self.held.is_empty() && !self.surely_runtimes()).map(|last| last + Self::PATIENCE)
    }

    fn feed(&mut self, packet: &[u8], now: Instant, out: &mut Vec<u8>, mut gc: impl FnMut(gctrace::GcLine)) {
        if self.held.is_empty() {
            // A runtime that writes the whole line at once.
            if packet.starts_with(b"gc ")
                && packet.ends_with(b"\n")
                && !packet[..packet.len() - 1].contains(&b'\n')
                && let Some(line) = gctrace::parse(&String::from_utf8_lossy(&packet[..packet.len() - 1]))
            {
                gc(line);
                if !self.strip {
                    out.extend_from_slice(packet);
                }
                return;
            }
            if packet != b"gc " {
                out.extend_from_slice(packet);
                return;
            }
            (self.step, self.number_seen) = (0, false);
        } else if !self.fits(packet) {
            if self.patience_ends().is_some_and(|end| now >= end) {
                self.let_go(out);
            }
            out.extend_from_slice(packet);
            return;
        }
        self.last_piece = Some(now);
        if !self.strip {
            // The user reads gctrace too: every write in its place, as plain.
            out.extend_from_slice(packet);
        }
        self.held.push(packet.to_vec());
        if packet == b"\n" {
            let line = self.held.concat();
            self.held.clear();
            match gctrace::parse(&String::from_utf8_lossy(&line[..line.len() - 1])) {
                Some(parsed) => gc(parsed),
                None if self.strip => out.extend_from_slice(&line),
                None => {}
            }
        }
    }

    /// Whether `packet` is the line's next piece; moves on if so.
    fn fits(&mut self, packet: &[u8]) -> bool {
        let is_number = !packet.is_empty() && packet.iter().all(|&b| b.is_ascii_digit() || b == b'.');
        let next = GCTRACE_STEPS[self.step].2;
        if is_number {
            let wanted = !self.number_seen && next.iter().any(|&step| GCTRACE_STEPS[step].1);
            self.number_seen |= wanted;
            return wanted;
        }
        match next.iter().find(|&&step| GCTRACE_STEPS[step].0 == packet && GCTRACE_STEPS[step].1 == self.number_seen) {
            Some(&step) => {
                (self.step, self.number_seen) = (step, false);
                true
            }
            None => false,
        }
    }

    /// Whether the held line is surely the runtime's: the program's own
    /// writes would have to be "gc ", digits alone and " @" in a row.
    fn surely_runtimes(&self) -> bool {
        self.held.len() >= 3
    }

    /// Gives up on a line that was not the runtime's: its pieces go out as
    /// they were, when stripped.
    fn let_go(&mut self, out: &mut Vec<u8>) {
        if self.strip {
            out.extend_from_slice(&self.held.concat());
        }
        self.held.clear();
    }

    /// At the end of stderr a line still held is the runtime's, cut off by
    /// the program's exit in the middle of a GC's line (far likelier than a
    /// program whose last write is "gc "): it goes nowhere.
    fn end(&mut self) {
        self.held.clear();
    }
}

/// Splits stderr into lines as it comes. Complete lines go out at once
/// (gctrace lines only when not stripped); a partial line is held back only
/// while it could still become a gctrace line, so a prompt without a
/// newline is not delayed.
#[derive(Default)]
struct StderrFilter {
    strip: bool,
    /// The current line, held back.
    line: Vec<u8>,
    /// Bytes of the current line were already passed on: it is not gctrace.
    passing: bool,
}

impl StderrFilter {
    fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<u8>, mut gc: impl FnMut(gctrace::GcLine)) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|&b| b == b'\n');
            let (part, rest) = match newline {
                Some(i) => (&chunk[..=i], &chunk[i + 1..]),
                None => (chunk, &[][..]),
            };
            chunk = rest;
            if self.passing {
                out.extend_from_slice(part);
            } else {
                self.line.extend_from_slice(part);
            }
            if newline.is_some() {
                if !self.passing {
                    match gctrace::parse(&String::from_utf8_lossy(&self.line[..self.line.len() - 1])) {
                        Some(line) => {
                            gc(line);
                            if !self.strip {
                                out.extend_from_slice(&self.line);
                            }
                        }
                        None => out.extend_from_slice(&self.line),
                    }
                    self.line.clear();
                }
                self.passing = false;
            } else if !self.passing && !gctrace::may_start_line(&self.line) {
                out.append(&mut self.line);
                self.passing = true;
            }
        }
    }
}

fn spawn_helper_reader(read_end: OwnedFd, sender: Sender<Message>) {
    std::thread::spawn(move || {
        let reader = BufReader::new(File::from(read_end));
        for line in reader.split(b'\n') {
            let Ok(line) = line else { break };
            let message = match helper::parse(&String::from_utf8_lossy(&line)) {
                Ok(parsed) => Message::Helper(parsed, monotonic_ns()),
                Err(bad) => Message::HelperBad(bad),
            };
            if sender.send(message).is_err() {
                return;
            }
        }
        let _ = sender.send(Message::HelperClosed);
    });
}

/// Waits for the program (it is reaped here, not by std's Child). The
/// program is seized with ptrace only to be held at its exit
/// (PTRACE_EVENT_EXIT) while the recorder snapshots its memory; the signals
/// it receives meanwhile are passed on unchanged.
fn spawn_waiter(pid: u32, sender: Sender<Message>) {
    std::thread::spawn(move || {
        let pid = pid as libc::pid_t;
        // SAFETY: no memory is passed; `pid` is the program memgap started.
        let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, libc::PTRACE_O_TRACEEXIT as libc::c_long) } == 0;
        if !seized {
            let _ = sender.send(Message::NoExitSnapshot(format!("ptrace is not permitted ({})", std::io::Error::last_os_error())));
        }
        loop {
            let mut status = 0;
            // SAFETY: rusage is plain data, valid all zero.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `status` and `usage` are ours to write.
            let got = unsafe { libc::wait4(pid, &mut status, libc::__WALL, &mut usage) };
            if got < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                let _ = sender.send(Message::Exited { exit_code: 1, signal: 0, cpu_ns: None });
                return;
            }
            let cpu_ns = Some(crate::sys::cpu_ns(&usage));
            if libc::WIFEXITED(status) {
                let _ = sender.send(Message::Exited { exit_code: libc::WEXITSTATUS(status), signal: 0, cpu_ns });
                return;
            }
            if libc::WIFSIGNALED(status) {
                let signal = libc::WTERMSIG(status);
                let _ = sender.send(Message::Exited { exit_code: 128 + signal, signal, cpu_ns });
                return;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let signal = libc::WSTOPSIG(status);
            match status >> 16 {
                libc::PTRACE_EVENT_EXIT => {
                    let (reply, replied) = mpsc::channel();
                    if sender.send(Message::ExitStop(reply)).is_ok() {
                        let _ = replied.recv_timeout(Duration::from_secs(30));
                    }
                    // SAFETY: no memory is passed.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
                }
                libc::PTRACE_EVENT_STOP => {
                    // A group stop (SIGSTOP and the like) stays a stop; other
                    // event stops just continue.
                    let request = if matches!(signal, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU) {
                        libc::PTRACE_LISTEN
                    } else {
                        libc::PTRACE_CONT
                    };
                    // SAFETY: no memory is passed.
                    unsafe { libc::ptrace(request, pid, 0, 0) };
                }
                _ => {
                    // SAFETY: no memory is passed.
                    unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, signal as libc::c_long) };
                }
            }
        }
    });
}

/// The executable `program` names: a path, or a name looked up in PATH.
pub fn resolve(program: &OsString) -> Option<std::path::PathBuf> {
    let path = Path::new(program);
    if path.components().count() > 1 {
        return Some(path.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(path)).find(|candidate| candidate.is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GC: &str = "gc 3 @0.001s 9%: 0.014+0.064+0.001 ms clock, 0.029+0/0.010/0.044+0.002 ms cpu, 12->12->12 MB, 15 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)\n";

    fn run(strip: bool, chunks: &[&str]) -> (Vec<String>, usize, String) {
        let mut filter = StderrFilter { strip, ..StderrFilter::default() };
        let (mut outputs, mut gcs) = (Vec::new(), 0);
        for chunk in chunks {
            let mut out = Vec::new();
            filter.feed(chunk.as_bytes(), &mut out, |_| gcs += 1);
            outputs.push(String::from_utf8(out).unwrap());
        }
        (outputs, gcs, String::from_utf8(filter.line).unwrap())
    }

    #[test]
    fn gctrace_lines_are_taken_out_and_the_rest_passes_in_order() {
        let (gc_start, gc_end) = GC.split_at(30);
        let (out, gcs, held) = run(true, &["hello\n", gc_start, gc_end, "Name? ", "Ann\n", "gc is fun\n", "g", "o\n"]);
        assert_eq!(out, ["hello\n", "", "", "Name? ", "Ann\n", "gc is fun\n", "", "go\n"]);
        assert_eq!((gcs, held.as_str()), (1, ""));
    }

    #[test]
    fn gctrace_lines_stay_when_the_user_asked() {
        let (out, gcs, _) = run(false, &[&format!("a\n{GC}b")]);
        assert_eq!(out, [format!("a\n{GC}b")]);
        assert_eq!(gcs, 1);
    }

    #[test]
    fn a_partial_line_that_may_be_gctrace_is_held_until_it_ends() {
        let (out, _, held) = run(true, &["gc 12 @0.5"]);
        assert_eq!((out[0].as_str(), held.as_str()), ("", "gc 12 @0.5"));
    }

    /// The pieces go1.26's runtime wrote one gctrace line in (strace).
    const GC_PIECES: &[&str] = &[
        "gc ",
        "1",
        " @",
        "0.008",
        "s ",
        "16",
        "%",
        ": ",
        "2.6",
        "+",
        "0.62",
        "+",
        "0.005",
        " ms clock, ",
        "5.2",
        "+",
        "0.008",
        "/",
        "0.84",
        "/",
        "0",
        "+",
        "0.011",
        " ms cpu, ",
        "3",
        "->",
        "4",
        "->",
        "4",
        " MB, ",
        "4",
        " MB goal, ",
        "0",
        " MB stacks, ",
        "0",
        " MB globals, ",
        "2",
        " P",
        "\n",
    ];

    fn run_packets(strip: bool, packets: &[&str]) -> (String, Vec<gctrace::GcLine>) {
        run_packets_apart(strip, packets, Duration::ZERO)
    }

    /// Each packet comes `apart` after the one before.
    fn run_packets_apart(strip: bool, packets: &[&str], apart: Duration) -> (String, Vec<gctrace::GcLine>) {
        let mut pieces = GctracePieces { strip, ..GctracePieces::default() };
        let (mut out, mut gcs) = (Vec::new(), Vec::new());
        let mut now = Instant::now();
        for packet in packets {
            pieces.feed(packet.as_bytes(), now, &mut out, |gc| gcs.push(gc));
            now += apart;
        }
        pieces.end();
        (String::from_utf8(out).unwrap(), gcs)
    }

    #[test]
    fn gctrace_pieces_are_taken_out_from_between_the_programs_own_writes() {
        // The program's writes, a bare newline and a number among them.
        let program = ["p108 ", "\n", "p109 ", "Name? ", "gc is fun\n", "12 ", "\n", "done"];
        let mut packets: Vec<&str> = Vec::new();
        for (i, piece) in GC_PIECES.iter().enumerate() {
            packets.push(piece);
            if i % 4 == 1 && i / 4 < program.len() {
                packets.push(program[i / 4]);
            }
        }
        let (out, gcs) = run_packets(true, &packets);
        assert_eq!(out, program.concat());
        assert_eq!(gcs.len(), 1);
        assert_eq!((gcs[0].number, gcs[0].heap_start_mb, gcs[0].live_mb, gcs[0].goal_mb, gcs[0].procs), (1, 3, 4, 4, 2));
    }

    #[test]
    fn gctrace_pieces_stay_in_place_when_the_user_asked() {
        let packets = [&["a "][..], &GC_PIECES[..5], &["b "], &GC_PIECES[5..]].concat();
        let (out, gcs) = run_packets(false, &packets);
        assert_eq!(out, packets.concat());
        assert_eq!(gcs.len(), 1);
    }

    #[test]
    fn a_gctrace_line_written_at_once_and_a_false_start() {
        let (out, gcs) = run_packets(true, &["x\n", GC, "gc ", "is fun\n"]);
        assert_eq!((out.as_str(), gcs.len()), ("x\nis fun\n", 1), "a lone \"gc \" still held at the end is the runtime's");
    }

    #[test]
    fn a_line_whose_runtime_thread_waits_while_the_program_writes_much_is_still_taken_out() {
        let program: Vec<String> = (0..5000).map(|i| format!("p{i} ")).collect();
        let mut packets: Vec<&str> = GC_PIECES[..20].to_vec();
        packets.extend(program.iter().map(String::as_str));
        packets.extend(&GC_PIECES[20..]);
        let (out, gcs) = run_packets_apart(true, &packets, Duration::from_micros(100));
        assert_eq!(out, program.concat());
        assert_eq!(gcs.len(), 1);
    }

    #[test]
    fn a_false_start_is_let_go_in_its_place_once_its_next_piece_is_overdue() {
        let (out, gcs) = run_packets_apart(true, &["x\n", "gc ", "is fun\n", "more\n"], GctracePieces::PATIENCE * 6 / 10);
        assert_eq!((out.as_str(), gcs.len()), ("x\nis fun\ngc more\n", 0));
        let (out, _) = run_packets_apart(true, &["gc ", "is fun\n"], GctracePieces::PATIENCE);
        assert_eq!(out, "gc is fun\n", "a piece that would not fit anyway once overdue");
    }

    #[test]
    fn the_runtimes_line_cut_off_by_the_exit_goes_nowhere() {
        let packets = [&["a "][..], &GC_PIECES[..9], &["b"]].concat();
        let (out, gcs) = run_packets_apart(true, &packets, GctracePieces::PATIENCE * 2);
        assert_eq!((out.as_str(), gcs.len()), ("a b", 0));
        let (out, _) = run_packets(true, &["a ", "gc "]);
        assert_eq!(out, "a ", "cut off after its first piece");
        let (out, _) = run_packets(false, &packets);
        assert_eq!(out, packets.concat(), "kept in place when the user asked for gctrace");
    }
}
