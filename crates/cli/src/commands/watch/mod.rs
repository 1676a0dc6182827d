//! `memgap watch PID… | --cgroup PATH | --all`: the outside ledger of each
//! process (what `memgap snapshot PID` computes) at an interval, written
//! into one trace per process, shown live, with triggers: a snapshot marked
//! when RSS or the memory cgroup crosses a threshold, and malloc_trim called
//! where the trim forecast says it returns memory.

mod trace;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use memgap_attach::AttachError;
use memgap_attach::cgroup::NamedCgroup;
use memgap_attach::residency::monotonic_ns;
use memgap_model::ProcessLedger;
use memgap_model::outside_walk::WalkedHeap;
use memgap_trace::records::{Metrics, Rss, SnapshotReason};

use crate::commands::snapshot::GoOutside;
use trace::{Content, ProcessTrace};

/// Watch running processes from outside: their ledger at an interval, into traces.
///
/// Each reading is what `memgap snapshot PID` computes (glibc's heap walked,
/// every thread stopped a moment; jemalloc's and tcmalloc's own figures;
/// a Go runtime's own accounting, read from its memory),
/// written into one trace per process that `memgap timeline`, `ledger --at`
/// and `report` read. On a terminal the rows are drawn as bars with an RSS
/// sparkline, redrawn in place; otherwise one line per process per reading.
/// Ctrl-C or SIGTERM ends every trace cleanly.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("processes").required(true).args(["pids", "cgroup", "all"])))]
pub struct Args {
    /// The processes to watch (the watch ends when all have exited).
    #[arg(value_name = "PID")]
    pids: Vec<u32>,
    /// Every process of this cgroup v2 and of the cgroups below it, also those
    /// started later (a directory under /sys/fs/cgroup, or the path
    /// /proc/PID/cgroup shows).
    #[arg(long, value_name = "PATH")]
    cgroup: Option<String>,
    /// Every process memgap may read, also those started later.
    #[arg(long)]
    all: bool,
    /// Time between two readings of a process: 500ms, 5s, 1m, or seconds.
    /// A reading stops a glibc process while its heap is walked; a process
    /// whose walk takes over a tenth of the interval is read less often.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = parse_duration)]
    interval: Duration,
    /// Stop after this long [default: until Ctrl-C, or until every PID has exited].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Trace file; `%p` stands for the pid. Watching more than one process,
    /// a name without `%p` gets `.PID` before its extension
    /// [default: memgap-watch-<comm>.<pid>.mgt].
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Take a snapshot at once, and mark it, when a process's RSS reaches
    /// BYTES (512M, 2GiB, or bytes); again after it fell 5 % below.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    at_rss: Option<u64>,
    /// Take a snapshot at once, and mark it, when the memory cgroup of a
    /// process reaches P percent of its limit (before the OOM killer comes).
    #[arg(long, value_name = "P", value_parser = parse_percent)]
    at_cgroup_percent: Option<f64>,
    /// Make a glibc process call malloc_trim(0) (as `memgap trim` does) when
    /// its retained row reaches BYTES and the trim forecast says it would
    /// return memory; a snapshot right after records what came back.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    trim_when_retained: Option<u64>,
}

/// How often RSS and the cgroup are looked at for the triggers between readings.
const TRIGGER_POLL: Duration = Duration::from_millis(100);
/// A walk may stop a process this share of the time at most.
const MAX_STOPPED_SHARE: u32 = 10;
/// RSS values kept per process for the sparkline.
const HISTORY: usize = 240;

enum Selection {
    Pids,
    Cgroup(NamedCgroup),
    All,
}

/// One watched process.
struct Watched {
    pid: u32,
    command: String,
    trace: ProcessTrace,
    rss_history: Vec<u64>,
    last: Option<ProcessLedger>,
    /// The last mark shown beside it (trigger, trim).
    mark: Option<String>,
    next_reading: Instant,
    above_rss: bool,
    above_cgroup: bool,
    /// What the last trim left of its forecast: the next waits until the forecast is above it.
    trim_shortfall: u64,
    /// The watch stretched its interval (its walks take long).
    stretched: bool,
    exited: bool,
}

/// Why a reading is taken, and the notes that go with it.
struct Occasion {
    reason: SnapshotReason,
    notes: Vec<String>,
    extra: Vec<Metrics>,
}

impl Occasion {
    fn periodic() -> Occasion {
        Occasion { reason: SnapshotReason::Periodic, notes: Vec::new(), extra: Vec::new() }
    }

    fn marked(note: String) -> Occasion {
        Occasion { reason: SnapshotReason::Requested, notes: vec![note], extra: Vec::new() }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.interval < Duration::from_millis(50) {
        bail!("--interval {:?}: give at least 50ms", args.interval);
    }
    let selection = if let Some(name) = &args.cgroup {
        Selection::Cgroup(memgap_attach::cgroup::v2_named(name).map_err(|e| anyhow!(e))?)
    } else if args.all {
        Selection::All
    } else {
        Selection::Pids
    };
    let several = !matches!(selection, Selection::Pids) || args.pids.len() > 1;
    let run_id = crate::commands::run::random_run_id();
    let mut watched: BTreeMap<u32, Watched> = BTreeMap::new();
    // Processes looked at once and left (exited, not readable, kernel threads): never again.
    let mut left: BTreeSet<u32> = BTreeSet::new();
    left.insert(std::process::id());
    if let Selection::Pids = selection {
        let mut pids = args.pids.clone();
        pids.dedup();
        // Every pid and every trace file checked before any is created.
        let mut paths = Vec::new();
        for &pid in &pids {
            let status = memgap_attach::procfs::status(pid)?;
            if status.state == 'Z' {
                return Err(AttachError::Zombie(pid).into());
            }
            let path = trace_path(args.output.as_deref(), pid, &status.name, several);
            if std::fs::symlink_metadata(&path).is_ok() {
                bail!("{} exists: give another -o (memgap never overwrites a trace)", path.display());
            }
            paths.push(path);
        }
        for (&pid, path) in pids.iter().zip(&paths) {
            let status = memgap_attach::procfs::status(pid)?;
            watched.insert(pid, start_watching(pid, &status.name, path, run_id)?);
        }
    }
    crate::commands::stop::install_handler();
    let terminal = std::io::stdout().is_terminal();
    let mut screen = Screen::default();
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    let mut next_discovery = started;
    let mut next_poll = started;
    let mut finished: Vec<(PathBuf, u64)> = Vec::new();
    let mut log: Vec<String> = Vec::new();
    let triggers = args.at_rss.is_some() || args.at_cgroup_percent.is_some();
    loop {
        let now = Instant::now();
        if crate::commands::stop::requested() || deadline.is_some_and(|d| now >= d) {
            break;
        }
        if now >= next_discovery && !matches!(selection, Selection::Pids) {
            next_discovery = now + args.interval;
            for pid in candidates(&selection) {
                if watched.contains_key(&pid) || left.contains(&pid) {
                    continue;
                }
                match discover(pid, args.output.as_deref(), run_id) {
                    Ok(Some(w)) => {
                        watched.insert(pid, w);
                    }
                    Ok(None) => {
                        left.insert(pid);
                    }
                    Err(error) => {
                        left.insert(pid);
                        say(terminal, &mut log, format!("process {pid} not watched: {error:#}"));
                    }
                }
            }
        }
        let mut drawn = false;
        if triggers && now >= next_poll {
            next_poll = now + TRIGGER_POLL;
            for w in watched.values_mut() {
                if w.exited {
                    continue;
                }
                if let Some(occasion) = poll_triggers(w, &args) {
                    w.next_reading = Instant::now();
                    take_reading(w, occasion, &args, terminal, &mut log, &mut drawn)?;
                }
            }
        }
        let due: Vec<u32> = watched.values().filter(|w| w.next_reading <= now).map(|w| w.pid).collect();
        for pid in due {
            let w = watched.get_mut(&pid).expect("a due process is watched");
            if w.exited {
                continue;
            }
            take_reading(w, Occasion::periodic(), &args, terminal, &mut log, &mut drawn)?;
        }
        // Processes that exited: one line each, their traces closed.
        let gone: Vec<u32> = watched.values().filter(|w| w.exited).map(|w| w.pid).collect();
        for pid in gone {
            let w = watched.remove(&pid).expect("watched");
            left.insert(pid);
            let seconds = started.elapsed().as_secs_f64();
            let snapshots = w.trace.snapshots;
            let path = w.trace.finish("the process exited while watched")?;
            say(
                terminal,
                &mut log,
                format!("process {pid} ({}) exited at {seconds:.1} s; its trace: {} ({snapshots} snapshots)", w.command, path.display()),
            );
            finished.push((path, snapshots));
            drawn = true;
            if watched.is_empty() && matches!(selection, Selection::Pids) {
                break;
            }
        }
        if watched.is_empty() && matches!(selection, Selection::Pids) {
            break;
        }
        if drawn && terminal {
            screen.draw(&watched, &log, started.elapsed().as_secs_f64(), &args)?;
        }
        let next = watched.values().map(|w| w.next_reading).min().unwrap_or(now + args.interval);
        let next = if triggers { next.min(next_poll) } else { next };
        let next = if matches!(selection, Selection::Pids) { next } else { next.min(next_discovery) };
        let next = deadline.map_or(next, |d| next.min(d));
        while Instant::now() < next && !crate::commands::stop::requested() {
            std::thread::sleep(next.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    // The last frame stays on the screen, as it was.
    if terminal {
        screen.draw(&watched, &log, seconds, &args)?;
    }
    for (_, w) in std::mem::take(&mut watched) {
        let snapshots = w.trace.snapshots;
        finished.push((w.trace.finish("the watch stopped; the process runs on")?, snapshots));
    }
    for (path, snapshots) in &finished {
        eprintln!("memgap: {} — {snapshots} snapshots over {seconds:.1} s", path.display());
    }
    if let Some((path, _)) = finished.first() {
        eprintln!("memgap: details: memgap timeline|ledger|report {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Creates the trace of a process found in a cgroup or in /proc; `None` for
/// one not to watch (a kernel thread, gone already, not ours to read).
fn discover(pid: u32, output: Option<&Path>, run_id: u64) -> anyhow::Result<Option<Watched>> {
    let Ok(status) = memgap_attach::procfs::status(pid) else { return Ok(None) };
    // Kernel threads have no memory of their own; a thread's tgid is its process.
    if status.state == 'Z' || status.tgid != pid || status.rss.vm_rss == 0 {
        return Ok(None);
    }
    if std::fs::File::open(format!("/proc/{pid}/pagemap")).is_err() {
        return Ok(None);
    }
    let path = trace_path(output, pid, &status.name, true);
    Ok(Some(start_watching(pid, &status.name, &path, run_id)?))
}

fn start_watching(pid: u32, command: &str, path: &Path, run_id: u64) -> anyhow::Result<Watched> {
    let (exe, argv) = describe(pid);
    let trace = ProcessTrace::create(path, pid, run_id, exe, argv).map_err(|e| anyhow!("cannot write {}: {e:#}", path.display()))?;
    Ok(Watched {
        pid,
        command: command.to_string(),
        trace,
        rss_history: Vec::new(),
        last: None,
        mark: None,
        next_reading: Instant::now(),
        above_rss: false,
        above_cgroup: false,
        trim_shortfall: 0,
        stretched: false,
        exited: false,
    })
}

/// Reads `w` now and writes the reading; then, if asked, trims it and
/// reads it again. A process that exited is marked for the caller.
fn take_reading(
    w: &mut Watched,
    occasion: Occasion,
    args: &Args,
    terminal: bool,
    log: &mut Vec<String>,
    drawn: &mut bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let reading = match read(w.pid, occasion.reason) {
        Ok(reading) => reading,
        Err(error) if exited(w.pid, &error) => {
            w.exited = true;
            return Ok(());
        }
        Err(error) => {
            // Unreadable this time (not permitted, a passing failure): RSS only.
            let rss = memgap_attach::residency::rss(w.pid).unwrap_or_default();
            w.trace.reading(Content::Unsplit(rss, error.to_string()), &occasion.notes, occasion.extra)?;
            w.next_reading = started + args.interval;
            return Ok(());
        }
    };
    let ledger = reading.ledger();
    match &reading {
        Reading::Walked(walk, _) => w.trace.reading(Content::Walked(walk), &occasion.notes, occasion.extra)?,
        Reading::Stats(stats, snapshot, _) => w.trace.reading(Content::Stats(stats, snapshot), &occasion.notes, occasion.extra)?,
        Reading::Runtime(metrics, snapshot, _) => w.trace.reading(Content::Runtime(metrics, snapshot), &occasion.notes, occasion.extra)?,
        Reading::Unsplit(l) => {
            let why = l.walk_failure.clone().unwrap_or_else(|| format!("{} gives no figures of its own from outside", l.allocator));
            let rss = Rss {
                time: monotonic_ns(),
                vm_rss: l.status.vm_rss_bytes,
                rss_anon: l.status.rss_anon_bytes,
                rss_file: l.status.rss_file_bytes,
                rss_shmem: l.status.rss_shmem_bytes,
            };
            w.trace.reading(Content::Unsplit(rss, why), &occasion.notes, occasion.extra)?
        }
    }
    let seconds = w.trace.seconds();
    let mark = occasion.notes.first().cloned();
    if !terminal {
        println!("{}", memgap_views::watch::line(seconds, ledger, mark.as_deref()));
        let _ = std::io::stdout().flush();
    }
    if let Some(mark) = &mark {
        w.mark = Some(mark.clone());
        if terminal {
            log.push(format!("{seconds:.1} s: pid {}: {mark}", w.pid));
        }
    }
    w.rss_history.push(ledger.rss_bytes);
    if w.rss_history.len() > HISTORY {
        w.rss_history.remove(0);
    }
    if ledger.rss_bytes >= args.at_rss.unwrap_or(u64::MAX) {
        w.above_rss = true;
    }
    let stopped = ledger.walk.as_ref().map_or(Duration::ZERO, |walk| Duration::from_secs_f64(walk.stopped_ms / 1e3));
    let interval = args.interval.max(stopped * MAX_STOPPED_SHARE);
    if interval > args.interval && !w.stretched {
        w.stretched = true;
        say(
            terminal,
            log,
            format!(
                "process {} ({}) was stopped {:.0} ms for its walk: it is read every {:.1} s, not {:.1} s",
                w.pid,
                w.command,
                stopped.as_secs_f64() * 1e3,
                interval.as_secs_f64(),
                args.interval.as_secs_f64()
            ),
        );
    }
    w.next_reading = started + interval;
    let trim = trim_due(w, ledger, args);
    w.last = Some(ledger.clone());
    *drawn = true;
    if let Some(forecast) = trim {
        trim_now(w, forecast, args, terminal, log, drawn)?;
    }
    Ok(())
}

/// The forecast, when `w` is to be trimmed after this reading.
fn trim_due(w: &Watched, l: &ProcessLedger, args: &Args) -> Option<u64> {
    let threshold = args.trim_when_retained?;
    let retained = l.rows.retained?;
    let forecast = l.trim_would_return_bytes?;
    let page = 4096;
    (retained >= threshold && forecast >= page && forecast > w.trim_shortfall).then_some(forecast)
}

/// Calls malloc_trim(0) in `w`, writes the call as the agent writes the
/// program's own (a METRICS record the timeline shows), and takes the
/// snapshot that shows what came back.
fn trim_now(w: &mut Watched, forecast: u64, args: &Args, terminal: bool, log: &mut Vec<String>, drawn: &mut bool) -> anyhow::Result<()> {
    let before = memgap_attach::procfs::status(w.pid).map(|s| s.rss.vm_rss).unwrap_or(0);
    let call = memgap_attach::malloc_trim(w.pid, &memgap_attach::TrimOptions::default());
    let after = memgap_attach::procfs::status(w.pid).map(|s| s.rss.vm_rss).unwrap_or(0);
    let note = match &call {
        Ok(call) => {
            let returned = before.saturating_sub(after);
            w.trim_shortfall = forecast.saturating_sub(returned);
            format!(
                "memgap watch called malloc_trim(0): forecast {}, RSS {} → {} ({} returned; malloc_trim returned {})",
                memgap_model::human_bytes(forecast),
                memgap_model::human_bytes(before),
                memgap_model::human_bytes(after),
                memgap_model::human_bytes(returned),
                call.returned
            )
        }
        Err(error) => {
            w.trim_shortfall = forecast;
            format!("memgap watch could not call malloc_trim(0): {error}")
        }
    };
    let mut occasion = Occasion::marked(note);
    if let Ok(call) = &call {
        occasion.extra.push(Metrics {
            monotonic_ns: monotonic_ns(),
            source: memgap_model::trim_marks::SOURCE.into(),
            kind: memgap_model::trim_marks::KIND.into(),
            values: vec![
                ("rss_before:bytes".into(), before as f64),
                ("rss_after:bytes".into(), after as f64),
                ("pad".into(), 0.0),
                ("returned".into(), f64::from(call.returned)),
            ],
        });
    }
    let next = w.next_reading;
    // The reading after a trim does not trim again.
    let saved = w.trim_shortfall;
    w.trim_shortfall = u64::MAX;
    let result = take_reading(w, occasion, args, terminal, log, drawn);
    w.trim_shortfall = saved;
    w.next_reading = next;
    result
}

/// The trigger crossed since the last look, if any: RSS from
/// /proc/PID/status and the cgroup's usage, read without stopping anything.
fn poll_triggers(w: &mut Watched, args: &Args) -> Option<Occasion> {
    let status = memgap_attach::procfs::status(w.pid).ok()?;
    let rss = status.rss.vm_rss;
    w.trace.sample(Rss { time: monotonic_ns(), ..status.rss });
    let mut notes = Vec::new();
    if let Some(limit) = args.at_rss {
        if rss >= limit && !w.above_rss {
            w.above_rss = true;
            notes.push(format!("RSS {} reached --at-rss {}", memgap_model::human_bytes(rss), memgap_model::human_bytes(limit)));
        } else if rss < limit - limit / 20 {
            w.above_rss = false;
        }
    }
    if let Some(percent) = args.at_cgroup_percent
        && let Some(cgroup) = memgap_attach::cgroup::of_process(w.pid).map(memgap_model::assess_cgroup)
        && let (Some(used), Some(max)) = (cgroup.used_percent, cgroup.max_bytes)
    {
        if used >= percent && !w.above_cgroup {
            w.above_cgroup = true;
            notes.push(format!(
                "memory cgroup {} at {used:.1}% of its limit {} (--at-cgroup-percent {percent})",
                cgroup.limit_path.as_deref().unwrap_or(&cgroup.path),
                memgap_model::human_bytes(max)
            ));
        } else if used < percent * 0.95 {
            w.above_cgroup = false;
        }
    }
    (!notes.is_empty()).then(|| Occasion { reason: SnapshotReason::Requested, notes, extra: Vec::new() })
}

/// One reading of a process.
enum Reading {
    /// glibc's heap walked: the ledger has every row.
    Walked(Box<WalkedHeap>, Box<ProcessLedger>),
    /// An allocator's own figures, and the residency read after them.
    Stats(memgap_model::owners::allocator_stats::AllocatorStats, Box<memgap_trace::records::Snapshot>, Box<ProcessLedger>),
    /// A runtime's own accounting (Go's, read from its memory) as METRICS
    /// records, and the residency read after it.
    Runtime(Vec<Metrics>, Box<memgap_trace::records::Snapshot>, Box<ProcessLedger>),
    /// The heap as one row.
    Unsplit(Box<ProcessLedger>),
}

impl Reading {
    fn ledger(&self) -> &ProcessLedger {
        match self {
            Reading::Walked(_, l) | Reading::Stats(_, _, l) | Reading::Runtime(_, _, l) | Reading::Unsplit(l) => l,
        }
    }
}

fn read(pid: u32, reason: SnapshotReason) -> Result<Reading, AttachError> {
    let reading = memgap_attach::read_process(pid)?;
    match crate::commands::snapshot::read_go(&reading, reason)? {
        GoOutside::NotGo => {}
        GoOutside::Read { metrics, snapshot } => {
            let ledger = memgap_model::runtime_process_ledger(&reading, &snapshot, &metrics, false);
            return Ok(Reading::Runtime(metrics, snapshot, Box::new(ledger)));
        }
        GoOutside::Unreadable(why) => {
            return Ok(Reading::Unsplit(Box::new(crate::commands::snapshot::go_unreadable_ledger(&reading, &why))));
        }
    }
    if reading.allocator == "glibc" {
        return Ok(match memgap_attach::walk_glibc_heap(pid) {
            Ok(mut walk) => {
                walk.snapshot.reason = reason;
                let ledger = memgap_model::walked_process_ledger(&reading, &walk, false);
                Reading::Walked(Box::new(walk), Box::new(ledger))
            }
            Err(why) => {
                let mut ledger = memgap_model::outside_ledger(&reading);
                ledger.walk_failure = Some(why.to_string());
                Reading::Unsplit(Box::new(ledger))
            }
        });
    }
    let ledger = memgap_model::outside_ledger(&reading);
    match reading.allocator_stats {
        Some(mut stats) => {
            stats.loaded_as_library = !reading.allocator_statically_linked;
            let snapshot = memgap_attach::residency::snapshot(pid, reason)?;
            Ok(Reading::Stats(stats, Box::new(snapshot), Box::new(ledger)))
        }
        None => Ok(Reading::Unsplit(Box::new(ledger))),
    }
}

/// Whether `pid` is gone (or a zombie), which makes `error` its exit.
fn exited(pid: u32, error: &AttachError) -> bool {
    matches!(error, AttachError::NoProcess(_) | AttachError::Zombie(_))
        || memgap_attach::procfs::status(pid).map_or(true, |s| s.state == 'Z' || s.state == 'X')
}

/// The processes of a cgroup or of /proc, now.
fn candidates(selection: &Selection) -> Vec<u32> {
    match selection {
        Selection::Pids => Vec::new(),
        Selection::Cgroup(cgroup) => cgroup.processes(),
        Selection::All => {
            let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
            let mut pids: Vec<u32> = entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
            pids.sort_unstable();
            pids
        }
    }
}

/// The trace of `pid`: `-o` with `%p` replaced, or with `.PID` before its
/// extension when several processes are watched; else a name of its own.
fn trace_path(output: Option<&Path>, pid: u32, command: &str, several: bool) -> PathBuf {
    let Some(output) = output else {
        let name: String = command.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
        return PathBuf::from(format!("memgap-watch-{name}.{pid}.mgt"));
    };
    let text = output.to_string_lossy();
    if text.contains("%p") {
        return PathBuf::from(text.replace("%p", &pid.to_string()));
    }
    if !several {
        return output.to_path_buf();
    }
    let file = output.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let named = match file.rsplit_once('.') {
        Some((stem, extension)) if !stem.is_empty() => format!("{stem}.{pid}.{extension}"),
        _ => format!("{file}.{pid}"),
    };
    output.with_file_name(named)
}

/// A message of the watch's own: on stderr, or in the terminal view's log.
fn say(terminal: bool, log: &mut Vec<String>, text: String) {
    if terminal {
        log.push(text);
        if log.len() > 5 {
            log.remove(0);
        }
    } else {
        eprintln!("memgap: {text}");
    }
}

/// The terminal view, redrawn in place: the lines drawn last time are
/// cleared and drawn again.
#[derive(Default)]
struct Screen {
    lines: usize,
}

impl Screen {
    fn draw(&mut self, watched: &BTreeMap<u32, Watched>, log: &[String], seconds: f64, args: &Args) -> anyhow::Result<()> {
        let (width, height) = terminal_size();
        let color = std::env::var_os("NO_COLOR").is_none();
        let mut frame = format!(
            "memgap watch — {} process{}, every {:.1} s — {seconds:.1} s — Ctrl-C ends the traces\n",
            watched.len(),
            if watched.len() == 1 { "" } else { "es" },
            args.interval.as_secs_f64()
        );
        let mut hidden = 0;
        for w in watched.values() {
            let Some(ledger) = &w.last else { continue };
            let panel = memgap_views::watch::panel(ledger, &w.rss_history, w.mark.as_deref(), width, color);
            if frame.lines().count() + panel.lines().count() + log.len() + 2 > height {
                hidden += 1;
                continue;
            }
            frame.push_str(&panel);
        }
        if hidden > 0 {
            frame.push_str(&format!("… and {hidden} more (a taller terminal shows them; their traces are written)\n"));
        }
        for line in log {
            frame.push_str(&format!("memgap: {line}\n"));
        }
        // Lines cut to the width, so that each takes one row of the screen.
        let frame: String = frame.lines().map(|l| format!("{}\n", cut(l, width))).collect();
        let mut stdout = std::io::stdout().lock();
        if self.lines > 0 {
            write!(stdout, "\x1b[{}F\x1b[J", self.lines)?;
        }
        stdout.write_all(frame.as_bytes())?;
        stdout.flush()?;
        self.lines = frame.lines().count();
        Ok(())
    }
}

/// `line` cut to `width` columns (colour escapes take none).
fn cut(line: &str, width: usize) -> String {
    let mut out = String::new();
    let mut columns = 0;
    let mut escape = false;
    for c in line.chars() {
        if c == '\x1b' {
            escape = true;
        }
        if !escape {
            if columns == width {
                break;
            }
            columns += 1;
        } else if c == 'm' {
            escape = false;
        }
        out.push(c);
    }
    if line.contains('\x1b') {
        out.push_str("\x1b[0m");
    }
    out
}

fn terminal_size() -> (usize, usize) {
    // SAFETY: winsize is plain data, valid all zero.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col >= 20 && size.ws_row >= 5 { (size.ws_col as usize, size.ws_row as usize) } else { (80, 24) }
}

/// The executable and command line of `pid`.
fn describe(pid: u32) -> (String, Vec<String>) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let argv = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
        .unwrap_or_default();
    (exe, argv)
}

/// `500ms`, `5s`, `1.5`, `2m`, `1h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let (number, unit) = match trimmed.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => trimmed.split_at(at),
        None => (trimmed, "s"),
    };
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("'{text}': give a duration such as 500ms, 5s, 2m or a number of seconds")),
    };
    let value: f64 =
        number.trim().parse().map_err(|_| format!("'{text}': give a duration such as 500ms, 5s, 2m or a number of seconds"))?;
    let seconds = value * scale;
    if !(seconds.is_finite() && seconds > 0.0 && seconds < 1e9) {
        return Err(format!("'{text}': give a positive duration"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `512M`, `2GiB`, `100k`, `4096`: K, M, G, T are powers of 1024.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let at = trimmed.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(at);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{text}': give bytes such as 512M, 2GiB or 4096")),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("'{text}': give bytes such as 512M, 2GiB or 4096"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !(1.0..1.8e19).contains(&bytes) {
        return Err(format!("'{text}': give a positive number of bytes"));
    }
    Ok(bytes as u64)
}

fn parse_percent(text: &str) -> Result<f64, String> {
    match text.trim().trim_end_matches('%').parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err(format!("'{text}': give a percentage above 0 and at most 100")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations_bytes_and_percentages() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err() && parse_duration("-1s").is_err() && parse_duration("0").is_err());
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("lots").is_err() && parse_bytes("0").is_err() && parse_bytes("3X").is_err());
        assert_eq!(parse_percent("90%"), Ok(90.0));
        assert!(parse_percent("0").is_err() && parse_percent("101").is_err());
    }

    #[test]
    fn trace_names() {
        let o = Some(Path::new("/tmp/t.mgt"));
        assert_eq!(trace_path(o, 42, "app", false), Path::new("/tmp/t.mgt"));
        assert_eq!(trace_path(o, 42, "app", true), Path::new("/tmp/t.42.mgt"));
        assert_eq!(trace_path(Some(Path::new("w-%p.mgt")), 42, "app", true), Path::new("w-42.mgt"));
        assert_eq!(trace_path(None, 42, "my app/x", false), Path::new("memgap-watch-my_app_x.42.mgt"));
    }

    #[test]
    fn lines_are_cut_to_the_width() {
        assert_eq!(cut("abcdef", 4), "abcd");
        assert_eq!(cut("\x1b[31mabcdef\x1b[0m", 3), "\x1b[31mabc\x1b[0m");
    }
}
