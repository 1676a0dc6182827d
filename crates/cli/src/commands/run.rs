//! `memgap run [-o TRACE] -- CMD...`: runs CMD with the agent preloaded and
//! exits as CMD did.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use memgap_trace::records::{Exit, Record, RecordingCost};
use memgap_trace::vocabulary::env;
use memgap_views::format::bytes;

use crate::agent;

mod go;
mod helpers;
mod linked_allocator;
mod numa;
mod placement;
mod python;
mod recorder;
mod samplers;
mod untraced;

use memgap_record::signals::{child_started, forward_signals};
use memgap_record::traces::trace_path;
pub(crate) use memgap_record::traces::{self, RunTraces, of_run, run_id_of};

/// Record every heap event of CMD (and of the programs it starts) into a trace.
#[derive(clap::Args)]
pub struct Args {
    /// Trace file of the top process [default: memgap-<program>.<pid>.mgt]; `%p`
    /// stands for the pid. Processes it starts write <stem>.<pid>.mgt beside it.
    #[arg(short, long, value_name = "TRACE")]
    output: Option<PathBuf>,
    /// Trace only the top process, not the programs it starts.
    #[arg(long)]
    no_follow: bool,
    /// Keep the traces of short helpers too: processes a wrapper (a pyenv
    /// shim, a launcher script) ran before it exec'd, that lived under a
    /// second with under 1 MiB allocated; by default their traces are
    /// removed after the run, and counted.
    #[arg(long)]
    keep_all_traces: bool,
    /// Print nothing of memgap's own but why recording stopped early, if it
    /// did (the program's output is never touched).
    #[arg(short, long)]
    quiet: bool,
    /// How often the agent samples RSS and collects thread buffers, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    rss_interval: u64,
    /// Seconds between periodic snapshots of page residency (0: none; snapshots
    /// are also taken at each new RSS peak, at exit and by `memgap snap`).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    snapshot_interval: f64,
    /// Record nothing: only call malloc_trim(0) from a background thread,
    /// the production remedy for glibc keeping free pages (same as
    /// LD_PRELOAD=libmemgap_trim.so; it interposes no call).
    #[arg(long)]
    trim_only: bool,
    /// With --trim-only: milliseconds between trims.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    trim_interval_ms: u64,
    /// With --trim-only: trim only when glibc holds at least this many free bytes (mallinfo2).
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    trim_threshold: u64,
    /// Record no call stacks (cheaper; blame then has one entry).
    #[arg(long)]
    no_stacks: bool,
    /// Frames kept per call stack.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=256))]
    stack_depth: u64,
    /// How stacks are unwound: dwarf (any code) or fp (frame pointers: about
    /// 4x cheaper, for programs built with -fno-omit-frame-pointer).
    #[arg(long, default_value = env::STACKS_DWARF, value_parser = [env::STACKS_DWARF, env::STACKS_FRAME_POINTERS])]
    unwind: String,
    /// Python frames in call stacks (CPython 3.11): `file.py:LINE in function`
    /// where the interpreter ran Python code; off records native frames only.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", env::PYTHON_STACKS_OFF])]
    python_stacks: String,
    /// After the run, write the HTML report beside the trace (<trace stem>.html).
    #[arg(long)]
    report: bool,
    /// Also sample memory accesses for NUMA locality (`memgap numa`): precise
    /// sampling where the CPU offers it (AMD IBS, Intel PEBS), else page
    /// faults for first-touch locality.
    #[arg(long)]
    numa: bool,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<OsString>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let program_name =
        Path::new(&args.command[0]).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "program".into());
    let pattern = output_pattern(args.output.as_deref(), &program_name)?;
    let run_id = random_run_id();
    let go_binary =
        if args.trim_only { None } else { go::resolve(&args.command[0]).and_then(|exe| memgap_source_go::buildinfo::detect(&exe)) };
    if let Some(binary) = go_binary {
        return go::run(&args, binary, &pattern, run_id);
    }
    let agent = if args.trim_only { agent::locate_trim()? } else { agent::locate()? };

    let mut preload = agent.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        // The agent first: an allocator the user preloads comes after it and
        // keeps serving the program.
        preload.push(":");
        preload.push(existing);
    }
    let mut command = std::process::Command::new(&args.command[0]);
    command.args(&args.command[1..]).env("LD_PRELOAD", preload);
    if args.trim_only {
        command.env(env::TRIM_INTERVAL_MS, args.trim_interval_ms.to_string()).env(env::TRIM_THRESHOLD, args.trim_threshold.to_string());
    }
    let areas = if args.trim_only { None } else { Some(recorder::AreaDir::create(run_id)?) };
    if let Some(areas) = &areas {
        command.env(env::AREA_DIR, areas.path()).env(env::RUN_ID, format!("{run_id:x}"));
        if args.no_follow {
            command.env(env::FOLLOW, env::FOLLOW_OFF);
        }
        let stacks = if args.no_stacks { env::STACKS_NONE } else { args.unwind.as_str() };
        command.env(env::STACKS, stacks).env(env::STACK_DEPTH, args.stack_depth.to_string());
        command.env(env::PYTHON_STACKS, &args.python_stacks);
    }

    let mut ghc = if args.trim_only { None } else { super::ghc::Recording::prepare(&mut command, &args.command, &pattern, args.quiet) };
    let samplers = if args.trim_only {
        Vec::new()
    } else {
        samplers::prepare(&mut command, (args.snapshot_interval * 1000.0).clamp(50.0, 60_000.0) as u64)
    };

    let sampling = match args.numa && !args.trim_only {
        true => Some(numa::prepare(&mut command).context("cannot prepare NUMA sampling")?),
        false => None,
    };
    // Last before the start: a name already taken stops everything here.
    let mut outputs = Vec::new();
    if args.report {
        outputs.push(super::report::default_output(&pattern));
    }
    if ghc.is_some() {
        outputs.push(pattern.with_extension("eventlog"));
    }
    if let Err(line) = traces::outputs_free(&pattern, &outputs) {
        return Ok(refuse(&line));
    }
    let reservation = match args.trim_only {
        true => None,
        false => match traces::reserve(&mut command, &pattern) {
            Ok(reservation) => Some(reservation),
            Err(line) => return Ok(refuse(&line)),
        },
    };
    forward_signals();
    let cpu_before_start = memgap_record::sys::own_cpu_ns();
    let spawned = command.spawn();
    if let Some(sampling) = &sampling {
        sampling.spawned();
    }
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => match reservation.and_then(|r| r.spawn_failed(&error, |pid| trace_path(&pattern, pid, true))) {
            Some(line) => return Ok(refuse(&line)),
            None => return Ok(spawn_failed(&args.command[0], &error)),
        },
    };
    let top_identity = reservation.and_then(traces::Reservation::started);
    child_started(child.id());
    let top_pid = child.id();
    let recording = areas.as_ref().map(|areas| {
        let settings = recorder::Settings {
            run_id,
            top_pid,
            top_identity,
            interval: std::time::Duration::from_millis(args.rss_interval),
            snapshot_interval_ns: (args.snapshot_interval.max(0.0) * 1e9) as u64,
        };
        let naming = pattern.clone();
        recorder::Recorder::start(areas.path(), settings, std::sync::Arc::new(move |pid| trace_path(&naming, pid, pid == top_pid)))
    });
    if let Some(ghc) = ghc.as_mut() {
        ghc.started(&mut child);
    }
    let (status, program_cpu_ns) = wait_for_exit(&mut child).context("waiting for the program")?;
    let (exit_code, signal) = match (status.code(), status.signal()) {
        (Some(code), _) => (code, 0),
        (None, Some(signal)) => (128 + signal, signal),
        (None, None) => (1, 0),
    };

    let Some(recording) = recording else {
        return Ok(ExitCode::from(exit_code.clamp(0, 255) as u8));
    };
    let (outcomes, untraced) = match &areas {
        Some(areas) => recording.finish(areas.path()),
        None => Default::default(),
    };
    drop(areas);
    let trace = trace_path(&pattern, top_pid, true);
    let traces = traces::RunTraces { pattern: &pattern, run_id, top_pid, top_identity };
    for outcome in outcomes.iter().filter(|o| o.given_up) {
        if !args.quiet {
            eprintln!(
                "memgap: process {} ({}) was still running when {} ended; its trace stops there",
                outcome.pid, outcome.command, program_name
            );
        }
    }
    for process in untraced.iter().filter(|_| !args.quiet) {
        eprintln!("memgap: not traced: process {} ({}) ran without memgap's agent: {}", process.pid, process.command, process.why);
    }
    samplers::finish(samplers, &traces);
    let recorded = traces.open(top_pid).is_some();
    let samples = sampling.map(numa::Sampling::finish);
    if recorded {
        numa::write(samples, &traces, args.quiet);
        let cost = program_cpu_ns.map(|program_cpu_ns| RecordingCost {
            program_cpu_ns,
            recorder_cpu_ns: memgap_record::sys::own_cpu_ns().saturating_sub(cpu_before_start),
        });
        // A full disk must not change the exit status memgap passes on.
        match traces.append(top_pid, [Record::Exit(Exit { exit_code, signal, cost })]) {
            Ok(true) => {}
            Ok(false) => {
                eprintln!("memgap: cannot add the exit status to {}: {} is not a trace this run wrote", trace.display(), trace.display())
            }
            Err(error) => eprintln!("memgap: cannot add the exit status to {}: {error}", trace.display()),
        }
    } else {
        traces.remove_empty_top();
    }
    if let Some(ghc) = ghc {
        ghc.finish(&traces, args.quiet);
    }
    let mut top_closing = None;
    let helpers = match args.keep_all_traces || !recorded {
        true => Vec::new(),
        false => helpers::leave_out(&outcomes, &traces, || {
            let closing = memgap_model::closing(&trace).ok();
            let gap = closing.as_ref().and_then(|c| c.moment.as_ref()).map_or(0, memgap_model::gap_bytes);
            top_closing = closing;
            gap
        }),
    };
    if !args.quiet {
        if !helpers.is_empty() {
            eprintln!(
                "memgap: {} short helper{} left no trace (processes that ran before a wrapper exec'd, each under a second and 1 MiB allocated; --keep-all-traces keeps them)",
                helpers.len(),
                if helpers.len() == 1 { "" } else { "s" }
            );
        }
        // A top process named untraced above has its reason said.
        if !recorded && !untraced.iter().any(|process| process.pid == top_pid) {
            say_why_unrecorded(&trace, &args.command[0]);
        }
        report(&trace, recorded, &pattern, run_id, top_closing);
    }
    if args.report && recorded {
        let html = super::report::default_output(&trace);
        match super::report::write(&trace, &html, memgap_model::At::default(), false) {
            Ok(()) if !args.quiet => eprintln!("memgap: report: {}", html.display()),
            Ok(()) => {}
            Err(error) => eprintln!("memgap: no report: {error:#}"),
        }
    }
    Ok(ExitCode::from(exit_code.clamp(0, 255) as u8))
}

/// memgap refuses to start the program: one line, exit status 1.
fn refuse(line: &str) -> ExitCode {
    eprintln!("memgap: {line}");
    ExitCode::from(1)
}

fn output_pattern(output: Option<&Path>, program_name: &str) -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let path = match output {
        Some(path) => cwd.join(path),
        None => cwd.join(format!("memgap-{}.%p.mgt", sanitize(program_name))),
    };
    Ok(path)
}

fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

/// Says in one line why CMD could not start; the exit code a shell gives
/// then (127: not found, 126: not executable).
fn spawn_failed(program: &std::ffi::OsStr, error: &std::io::Error) -> ExitCode {
    let (code, what) = match error.kind() {
        std::io::ErrorKind::NotFound => (127, "command not found".to_string()),
        std::io::ErrorKind::PermissionDenied => (126, "permission denied".to_string()),
        _ => (126, error.to_string()),
    };
    eprintln!("memgap: {}: {what}", program.to_string_lossy());
    ExitCode::from(code)
}

/// A trace's run id: random, so traces of different runs never pair up.
pub fn random_run_id() -> u64 {
    let mut bytes = [0u8; 8];
    let from_kernel = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).is_ok();
    if from_kernel {
        return u64::from_le_bytes(bytes);
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    now ^ (u64::from(std::process::id()) << 32)
}

/// Why the top process left no trace, when nothing else said it.
fn say_why_unrecorded(trace: &Path, program: &OsString) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is ours to write.
    let fsize = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } == 0 && limit.rlim_cur != libc::RLIM_INFINITY;
    if fsize && (limit.rlim_cur as usize) < memgap_trace::shared::area_bytes(2) {
        eprintln!(
            "memgap: no trace was written for {}: the file size limit (ulimit -f, {} bytes) leaves no room for the agent's buffers; the program ran untraced",
            program.to_string_lossy(),
            limit.rlim_cur
        );
    } else {
        eprintln!(
            "memgap: no trace was written for {}: the agent was not loaded (a statically linked or setuid program ignores LD_PRELOAD) or could not write {}",
            program.to_string_lossy(),
            trace.display()
        );
    }
}

fn report(trace: &Path, recorded: bool, pattern: &Path, run_id: u64, top_closing: Option<memgap_model::Closing>) {
    let others = sibling_traces(pattern, run_id, trace);
    if !recorded && others.is_empty() {
        return;
    }
    // Each process's closing, the top one's first; of a large tree, the
    // processes with the largest traces only (a replay each).
    const WEIGHED: usize = 32;
    let mut by_size: Vec<&PathBuf> = others.iter().collect();
    by_size.sort_by_key(|path| std::cmp::Reverse(std::fs::metadata(path).map_or(0, |m| m.len())));
    let unweighed = by_size.len().saturating_sub(WEIGHED);
    by_size.truncate(WEIGHED);
    let mut closings: Vec<(PathBuf, memgap_model::Closing)> = Vec::new();
    let mut top_closing = top_closing;
    for path in std::iter::once(trace).filter(|_| recorded).chain(by_size.into_iter().map(PathBuf::as_path)) {
        let known = if path == trace { top_closing.take() } else { None };
        match known.map_or_else(|| memgap_model::closing(path), Ok) {
            Ok(closing) => closings.push((path.to_path_buf(), closing)),
            Err(error) => eprintln!("memgap: {}: {error}", path.display()),
        }
    }
    let gap = |closing: &memgap_model::Closing| closing.moment.as_ref().map_or(0, memgap_model::gap_bytes);
    // The verdict is about the process with the most to explain (the top one on a tie).
    let Some(chosen) = closings.iter().enumerate().max_by_key(|(i, (_, c))| (gap(c), std::cmp::Reverse(*i))).map(|(i, _)| i) else {
        return;
    };
    let (chosen_trace, closing) = &closings[chosen];
    let s = &closing.summary;
    eprintln!(
        "memgap: {} — {} calls, peak live heap {} (malloc's, at {}), peak RSS {}, {} live at exit{}",
        chosen_trace.display(),
        memgap_views::format::count(s.total_events),
        bytes(s.peak_live_bytes),
        memgap_views::format::seconds(s.peak_live_seconds),
        bytes(s.peak_rss_bytes),
        bytes(s.live_bytes_at_end),
        if s.truncated { " (cut short)" } else { "" }
    );
    if s.dropped_events > 0 {
        eprintln!(
            "memgap: {} events were not recorded: the trace could not be written fast enough, or signal handlers interrupted memgap's hooks too often",
            memgap_views::format::count(s.dropped_events)
        );
    }
    if closings.len() > 1 {
        eprintln!(
            "memgap: {} traced processes; the verdict is about the one with the largest gap between RSS and its live heap:",
            closings.len() + unweighed
        );
        eprintln!("memgap:   {:>8} {:>10} {:>10}  command (trace)", "pid", "peak RSS", "gap");
        let mut order: Vec<usize> = (0..closings.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(gap(&closings[i].1)));
        const LISTED: usize = 8;
        for &i in order.iter().take(LISTED) {
            let (path, c) = &closings[i];
            let command = if c.summary.argv.is_empty() { c.summary.command.clone() } else { c.summary.argv.join(" ") };
            eprintln!(
                "memgap: {} {:>8} {:>10} {:>10}  {} ({})",
                if i == chosen { ">" } else { " " },
                c.summary.pid,
                bytes(c.summary.peak_rss_bytes),
                bytes(gap(c)),
                cut(&command, 60),
                path.file_name().unwrap_or_default().to_string_lossy()
            );
        }
        let unlisted = closings.len().saturating_sub(LISTED) + unweighed;
        if unlisted > 0 {
            eprintln!("memgap:   … and {unlisted} more (memgap summary TRACE for each)");
        }
    }
    if let Some(ledger) = &closing.moment {
        eprint!("{}", memgap_views::ledger::brief(ledger));
        if let Some(end) = &closing.end {
            eprint!("{}", memgap_views::ledger::end_state(end));
        }
    }
    eprintln!("memgap: details: memgap ledger|blame|map|report {}", chosen_trace.display());
}

/// `text` cut to `width` characters, an ellipsis marking the cut.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut short: String = text.chars().take(width.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// Traces of this run other than the top process's, found by run id.
fn sibling_traces(pattern: &Path, run_id: u64, top: &Path) -> Vec<PathBuf> {
    let Some(dir) = pattern.parent() else { return Vec::new() };
    traces::of_run(dir, run_id).into_iter().filter(|path| path != top).collect()
}

/// Waits for the program to exit; returns its status and, when it was
/// reaped here, the CPU time it used (with the children it waited for).
/// The recorder holds threads of the program with ptrace at snapshots (to
/// read a linked allocator's statistics), and a plain wait by any thread of
/// the tracer's process would take those stops, never seen by the
/// recorder: this one only looks (WNOWAIT) until the program has exited,
/// then reaps it.
fn wait_for_exit(child: &mut std::process::Child) -> std::io::Result<(std::process::ExitStatus, Option<u64>)> {
    loop {
        // SAFETY: waitid fills the siginfo_t we own.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: siginfo_t is plain data, valid all zero.
        let waited = unsafe { libc::waitid(libc::P_PID, child.id() as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if waited < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Ok((child.wait()?, None));
        }
        if matches!(info.si_code, libc::CLD_EXITED | libc::CLD_KILLED | libc::CLD_DUMPED) {
            return reap(child);
        }
        // A stop the recorder's ptrace is about to take: look again shortly.
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Reaps the program, which has exited, with its resource usage.
fn reap(child: &mut std::process::Child) -> std::io::Result<(std::process::ExitStatus, Option<u64>)> {
    loop {
        let mut status = 0;
        // SAFETY: rusage is plain data, valid all zero.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 fills the status and rusage we own.
        let reaped = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
        if reaped == child.id() as libc::pid_t {
            return Ok((std::process::ExitStatus::from_raw(status), Some(memgap_record::sys::cpu_ns(&usage))));
        }
        if reaped < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return Ok((child.wait()?, None));
    }
}
