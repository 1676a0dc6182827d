//! The agent cannot harm: nothing of memgap's stays in the program but the
//! hooks and the shared buffers (no thread, no file descriptor), so programs
//! that close or reuse every descriptor, end `main` with `pthread_exit`,
//! sandbox themselves with seccomp, enter namespaces or live under tight
//! limits behave under `memgap run` exactly as they do plain. Each test
//! compares a plain run with a traced one (exit code, stdout, stderr, the
//! files the program wrote) and checks the trace reads back.

mod common;

use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// Runs tests/programs/harmless.c in `mode`, plain and traced, each in a
/// fresh directory of its own; returns (plain, traced, plain dir, traced dir).
fn both(mode: &[&str]) -> (std::process::Output, std::process::Output, tempfile::TempDir, tempfile::TempDir) {
    let (plain_tmp, plain_dir) = tempdir();
    let (traced_tmp, traced_dir) = tempdir();
    let prog = compile(&plain_dir, "harmless.c");
    let plain = run_plain(&plain_dir, arg(&prog), mode);
    let trace = traced_dir.join("t.mgt");
    let mut run = vec!["run", "--quiet", "-o", arg(&trace), "--", arg(&prog)];
    run.extend_from_slice(mode);
    let traced = memgap(&traced_dir, &run);
    (plain, traced, plain_tmp, traced_tmp)
}

/// The trace of a traced run reads back and holds the program's calls.
fn assert_recorded(dir: &Path) -> Value {
    let s = summary_json(&dir.join("t.mgt"));
    assert!(events(&s, "malloc") >= 10_000, "{s:#}");
    s
}

fn same_file(plain_dir: &Path, traced_dir: &Path, name: &str) {
    let plain = fs::read(plain_dir.join(name)).unwrap_or_else(|e| panic!("plain {name}: {e}"));
    let traced = fs::read(traced_dir.join(name)).unwrap_or_else(|e| panic!("traced {name}: {e}"));
    assert_eq!(text(&traced), text(&plain), "{name} differs under memgap");
}

#[test]
fn closefrom_then_open_and_write() {
    let (plain, traced, p, t) = both(&["closefrom"]);
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stdout));
    assert_same_behaviour(&plain, &traced);
    same_file(p.path(), t.path(), "data.log");
    assert_recorded(t.path());
}

#[test]
fn dup2_over_every_descriptor() {
    let (plain, traced, p, t) = both(&["dup2"]);
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stdout));
    assert_same_behaviour(&plain, &traced);
    same_file(p.path(), t.path(), "data.log");
    assert_recorded(t.path());
}

#[test]
fn main_ends_with_pthread_exit_while_workers_run() {
    let (plain, traced, _p, t) = both(&["pthread-exit"]);
    assert_eq!(plain.status.code(), Some(0));
    assert_eq!(traced.status.code(), Some(0), "{}", text(&traced.stderr));
    // The workers finish in any order.
    let sorted = |out: &[u8]| {
        let mut lines: Vec<String> = text(out).lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    assert_eq!(sorted(&traced.stdout), sorted(&plain.stdout));
    assert_eq!(traced.stderr, plain.stderr);
    let s = assert_recorded(t.path());
    assert!(number(&s, "threads") >= 5, "{s:#}");
}

#[test]
fn seccomp_strict_mode() {
    let (plain, traced, _p, t) = both(&["strict"]);
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stdout));
    assert_same_behaviour(&plain, &traced);
    // It ends with a raw exit: no END record, the trace reads up to its end.
    let s = summary_json(&t.path().join("t.mgt"));
    assert!(events(&s, "malloc") >= 1000, "{s:#}");
}

#[test]
fn seccomp_filter_killing_open_and_write_above_fd_2() {
    let (plain, traced, _p, t) = both(&["filter"]);
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stdout));
    assert_same_behaviour(&plain, &traced);
    let s = assert_recorded(t.path());
    assert_eq!(s["truncated"], Value::Bool(false), "{s:#}");
}

#[test]
fn unshare_of_a_user_namespace_in_the_program() {
    let (plain, traced, _p, t) = both(&["unshare"]);
    if plain.status.code() != Some(0) {
        eprintln!("skipped: unshare(CLONE_NEWUSER) fails here plain too: {}", text(&plain.stdout));
        return;
    }
    assert_same_behaviour(&plain, &traced);
    assert_recorded(t.path());
}

/// `unshare -U -r sh -c 'id -u'` and `nsenter` into a user namespace: the
/// kernel refuses both to a multithreaded process.
#[test]
fn unshare_and_nsenter_commands() {
    let (_tmp, dir) = tempdir();
    let unshare = ["-U", "-r", "sh", "-c", "id -u; echo entered"];
    let plain = run_plain(&dir, "unshare", &unshare);
    if plain.status.code() != Some(0) {
        eprintln!("skipped: unshare -U -r fails here plain too: {}", text(&plain.stderr));
        return;
    }
    let trace = dir.join("u.mgt");
    let mut run = vec!["run", "--quiet", "-o", arg(&trace), "--", "unshare"];
    run.extend_from_slice(&unshare);
    let traced = memgap(&dir, &run);
    assert_same_behaviour(&plain, &traced);
    summary_json(&trace);

    // A process in a user namespace of its own to enter.
    let mut target = Command::new("unshare").args(["-U", "-r", "sleep", "30"]).stdin(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = target.id().to_string();
    let nsenter = ["-t", &pid, "-U", "--preserve-credentials", "sh", "-c", "id -u; echo entered"];
    let plain = run_plain(&dir, "nsenter", &nsenter);
    if plain.status.code() == Some(0) {
        let trace = dir.join("n.mgt");
        let mut run = vec!["run", "--quiet", "-o", arg(&trace), "--", "nsenter"];
        run.extend_from_slice(&nsenter);
        let traced = memgap(&dir, &run);
        assert_same_behaviour(&plain, &traced);
        summary_json(&trace);
    } else {
        eprintln!("skipped nsenter: it fails here plain too: {}", text(&plain.stderr));
    }
    let _ = target.kill();
    let _ = target.wait();
}

/// A daemon that drops root for uid 65534 and lives under RLIMIT_NPROC 2: a
/// thread of memgap's in it would take the slot its own thread needs.
#[test]
fn rlimit_nproc_small() {
    let (plain, traced, _p, t) = both(&["nproc"]);
    if plain.status.code() != Some(0) {
        eprintln!("skipped: {}", text(&plain.stdout).trim());
        return;
    }
    assert_same_behaviour(&plain, &traced);
    assert_recorded(t.path());
}

/// The recorder (memgap run) killed while the program runs: the program
/// finishes unharmed (its output, its files, its exit), at most a second
/// later than it would have.
#[test]
fn recorder_sigkilled_mid_run() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "harmless.c");
    let plain = run_plain(&dir, arg(&prog), &["slow", "1.5"]);
    assert_eq!(plain.status.code(), Some(0));
    fs::remove_file(dir.join("done.txt")).unwrap();
    let trace = dir.join("t.mgt");
    let mut memgap_run = memgap_cmd(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog), "slow", "1.5"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut stdout = memgap_run.stdout.take().unwrap();
    let mut stderr = memgap_run.stderr.take().unwrap();
    let started = Instant::now();
    let program = loop {
        if let Some(pid) = children_of(memgap_run.id()).into_iter().next() {
            break pid;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the program did not start");
        std::thread::sleep(Duration::from_millis(5));
    };
    std::thread::sleep(Duration::from_millis(400));
    sigkill(memgap_run.id() as i32);
    let _ = memgap_run.wait();
    // The program now has no parent but init; its output still comes here.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    stdout.read_to_end(&mut out).unwrap();
    stderr.read_to_end(&mut err).unwrap();
    assert_eq!(text(&out), text(&plain.stdout), "stderr: {}", text(&err));
    assert_eq!(text(&err), text(&plain.stderr));
    assert_eq!(fs::read(dir.join("done.txt")).unwrap(), b"done\n");
    let _ = program;
    assert!(started.elapsed() < Duration::from_secs(6), "took {:?}", started.elapsed());
    // What the recorder wrote before it died reads back.
    let s = summary_json(&trace);
    assert!(events(&s, "malloc") > 0, "{s:#}");
}

/// A single-threaded program whose SIGALRM handler allocates while the code
/// it interrupts may be allocating: with no thread of memgap's, glibc stays
/// in its single-thread mode (no arena lock to take twice), so no run hangs.
/// Such a handler is undefined behaviour all the same: glibc's heap can be
/// caught mid-update and the program crash, plain too (measured here: 1 run
/// in 60 of a ten times longer loop). So a run may end by a signal; it must
/// end, and most end well.
#[test]
fn a_signal_handler_allocating_anywhere_never_hangs() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "signals.c");
    let plain = run_plain(&dir, arg(&prog), &["alarm-anywhere"]);
    if plain.status.code() != Some(0) {
        eprintln!("skipped: the program fails plain too ({:?})", plain.status);
        return;
    }
    let mut crashed = Vec::new();
    for run in 0..50 {
        let trace = dir.join(format!("t{run}.mgt"));
        let started = Instant::now();
        // output_of fails the test if the run outlives its timeout.
        let traced = memgap(&dir, &["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog), "alarm-anywhere"]);
        match traced.status.code() {
            Some(0) => assert_eq!(text(&traced.stdout), "pairs 300000\n", "run {run}"),
            Some(code) if code > 128 => crashed.push((run, code - 128, started.elapsed())),
            other => panic!("run {run} after {:?}: exit {other:?}: {}", started.elapsed(), text(&traced.stderr)),
        }
        let _ = fs::remove_file(&trace);
    }
    eprintln!("runs ended by a signal (glibc's heap caught mid-update): {crashed:?}");
    assert!(crashed.len() <= 3, "{crashed:?}");
}

/// A SIGALRM handler that maps and unmaps pages (system calls, safe
/// wherever it lands) interrupts the program's heap calls and memgap's
/// hooks around them: each of its calls is in the trace, or counted as
/// dropped (a handler that fires many times while its thread waits for a
/// free buffer chunk, as under load), and the replay finds every block
/// where the program left it.
#[test]
fn a_signal_handler_interrupting_a_hook_is_recorded() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "signals.c");
    let (mut interrupted, mut recorded) = (0, 0);
    for run in 0..5 {
        let trace = dir.join(format!("count{run}.mgt"));
        let traced = memgap(&dir, &["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog), "alarm-count"]);
        assert_eq!(traced.status.code(), Some(0), "{}", text(&traced.stderr));
        let printed = text(&traced.stdout);
        let counts: Vec<u64> = printed.split_whitespace().filter_map(|word| word.parse().ok()).collect();
        let [mallocs, frees, mmaps] = counts[..] else { panic!("{printed}") };
        let s = summary_json(&trace);
        assert_eq!((events(&s, "malloc"), events(&s, "free")), (mallocs, frees), "{s:#}");
        let dropped = number(&s, "dropped_events");
        assert_eq!(events(&s, "mmap") + events(&s, "munmap") + dropped, 2 * mmaps, "{printed} {s:#}");
        assert_eq!((number(&s, "untracked_frees"), number(&s, "overlapping_allocations")), (0, 0), "{s:#}");
        interrupted += mmaps;
        recorded += events(&s, "mmap");
    }
    assert!(interrupted > 0, "the handler never ran");
    assert!(recorded > 0, "no handler call was recorded");
}

/// `memgap snap PID` of a forked child snapshots that child, into its own
/// trace, not its parent.
#[test]
fn snap_of_a_forked_child_reaches_the_child() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "harmless.c");
    let trace = dir.join("t.mgt");
    let mut cmd = memgap_cmd(&dir, &["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog), "fork-child"]);
    let running = Background::start(&mut cmd, 1);
    let child: u32 =
        running.lines[0].strip_prefix("child ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("{:?}", running.lines));
    let snap = memgap(&dir, &["snap", &child.to_string()]);
    assert!(snap.status.success(), "{}", text(&snap.stderr));
    let child_trace = dir.join(format!("t.{child}.mgt"));
    assert!(text(&snap.stderr).contains(arg(&child_trace)), "{}", text(&snap.stderr));
    let mut running = running;
    let status = wait_or_kill(&mut running.child, "memgap run -- harmless fork-child");
    assert_eq!(status.code(), Some(0));
    let requested = |trace: &Path| -> usize {
        let out = memgap(&dir, &["timeline", arg(trace), "--json"]);
        let timeline: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out.stderr)));
        timeline["snapshots"].as_array().unwrap().iter().filter(|l| l["snapshot_reason"] == "requested").count()
    };
    assert_eq!(requested(&child_trace), 1);
    assert_eq!(requested(&trace), 0, "the parent was not asked");
}

/// The agent of another memgap version lays its buffers out otherwise:
/// `memgap run` names the process and records nothing of it, rather than
/// share words the two read differently (each waiting on one the other
/// never writes hung programs at exit), and the program runs as it does
/// plain.
#[test]
fn an_agent_of_another_memgap_version_is_named_and_the_program_left_alone() {
    let (_tmp, dir) = tempdir();
    let older = compile_with(&dir, "older_agent.c", &["-shared", "-fPIC"]);
    let prog = compile(&dir, "harmless.c");
    let plain = run_plain(&dir, arg(&prog), &["slow", "0.3"]);
    assert_eq!(plain.status.code(), Some(0));
    fs::remove_file(dir.join("done.txt")).unwrap();
    let trace = dir.join("t.mgt");
    let started = Instant::now();
    let traced = output_of(memgap_cmd(&dir, &["run", "-o", arg(&trace), "--", arg(&prog), "slow", "0.3"]).env("MEMGAP_AGENT", &older));
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(traced.status.code(), plain.status.code(), "{}", text(&traced.stderr));
    assert_eq!(traced.stdout, plain.stdout);
    assert_eq!(fs::read(dir.join("done.txt")).unwrap(), b"done\n");
    let said = text(&traced.stderr);
    let named: Vec<&str> = said.lines().filter(|line| line.contains("another memgap version")).collect();
    assert_eq!(named.len(), 1, "{said}");
    assert!(named[0].starts_with("memgap: not traced: process ") && named[0].contains("MEMGAP_AGENT"), "{said}");
    assert!(!said.contains("no trace was written"), "the reason is said once:\n{said}");
    assert!(!trace.exists(), "an empty trace was left");
}
