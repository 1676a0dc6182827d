//! `memgap watch`: a running program's outside ledger at an interval, into
//! a trace that `timeline`, `ledger --at` and `report` read; its triggers;
//! processes that exit while watched. Measured against `memgap snapshot
//! --json` of the same idle moment and against VmRSS from /proc.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const HEAP_ROWS: [&str; 4] = ["live", "slack", "fragmented", "retained"];
const MIB: u64 = 1 << 20;

/// tests/programs/watch_stages.c, started plainly; each `next()` runs its next stage.
struct Stages {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pid: u32,
}

impl Stages {
    fn start(exe: &Path) -> Stages {
        Stages::start_preloading(exe, None)
    }

    /// Started with `library` as its LD_PRELOAD (its malloc), or none.
    fn start_preloading(exe: &Path, library: Option<&Path>) -> Stages {
        let mut command = Command::new(exe);
        match library {
            Some(library) => command.env("LD_PRELOAD", library),
            None => command.env_remove("LD_PRELOAD"),
        };
        Stages::start_by(command)
    }

    /// Started by `command` (which runs watch_stages).
    fn start_by(mut command: Command) -> Stages {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start watch_stages");
        let stdin = child.stdin.take();
        let lines = lines_of(child.stdout.take().unwrap());
        let first = lines.recv_timeout(TIMEOUT).expect("watch_stages says its pid");
        let pid = first.strip_prefix("pid ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("printed {first:?}"));
        Stages { child, stdin, lines, pid }
    }

    /// Runs the next stage and waits until it is done.
    fn next(&mut self) -> u32 {
        writeln!(self.stdin.as_mut().unwrap()).unwrap();
        let line = self.lines.recv_timeout(TIMEOUT).expect("the stage ends");
        line.strip_prefix("stage ").and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("printed {line:?}"))
    }

    /// Closes its stdin: it exits.
    fn exit(&mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}");
    }
}

impl Drop for Stages {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines_of(pipe: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (sender, receiver) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// `memgap watch ARGS` in the background, its stdout a pipe (not a terminal).
struct Watch {
    child: Child,
    lines: Receiver<String>,
    stderr: std::thread::JoinHandle<Vec<u8>>,
    seen: Vec<String>,
}

impl Watch {
    fn start(dir: &Path, args: &[&str]) -> Watch {
        let mut child = memgap_cmd(dir, &[&["watch"], args].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memgap watch");
        let lines = lines_of(child.stdout.take().unwrap());
        let stderr = read_in_background(child.stderr.take().unwrap());
        Watch { child, lines, stderr, seen: Vec::new() }
    }

    /// Waits for `count` more lines about `pid`; returns them.
    fn lines_about(&mut self, pid: u32, count: usize) -> Vec<String> {
        let key = format!(" pid={pid} ");
        let mut found = Vec::new();
        let deadline = Instant::now() + TIMEOUT;
        while found.len() < count {
            let line = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("no line about {pid} within {TIMEOUT:?}; seen {:?}", self.seen));
            self.seen.push(line.clone());
            if line.contains(&key) {
                found.push(line);
            }
        }
        found
    }

    /// Waits for the first line about `pid` that satisfies `wanted`, within `limit`.
    fn line_where(&mut self, pid: u32, limit: Duration, wanted: impl Fn(&str) -> bool) -> Option<String> {
        let key = format!(" pid={pid} ");
        let deadline = Instant::now() + limit;
        while let Ok(line) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.seen.push(line.clone());
            if line.contains(&key) && wanted(&line) {
                return Some(line);
            }
        }
        None
    }

    /// SIGTERM, then its exit status, the lines it printed and its stderr.
    fn stop(self) -> (std::process::ExitStatus, Vec<String>, String) {
        // SAFETY: no memory precondition; the memgap watch this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.finish()
    }

    /// Waits for it to end by itself.
    fn finish(mut self) -> (std::process::ExitStatus, Vec<String>, String) {
        let status = wait_or_kill(&mut self.child, "memgap watch");
        let mut seen = std::mem::take(&mut self.seen);
        seen.extend(self.lines.try_iter());
        let stderr = text(&self.stderr.join().unwrap());
        (status, seen, stderr)
    }
}

fn snapshot_json(dir: &Path, pid: u32) -> Value {
    let out = memgap(dir, &["snapshot", &pid.to_string(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn json_of(dir: &Path, args: &[&str]) -> Value {
    let out = memgap(dir, args);
    assert!(out.status.success(), "memgap {args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("memgap {args:?}: {e}"))
}

fn u(json: &Value, key: &str) -> u64 {
    json[key].as_u64().unwrap_or_else(|| panic!("no {key} in {json}"))
}

/// Within 5 %, or 64 KiB for rows of a few pages.
fn close(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= (a.max(b) / 20).max(64 << 10)
}

fn rows_close(a: &Value, b: &Value) -> bool {
    HEAP_ROWS.iter().all(|row| close(u(a, row), u(b, row)))
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The VmRSS of `pid` in bytes, from /proc: the truth.
fn vm_rss(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmRSS")
}

/// The value of `key=` in a plain line, in bytes when it is a size.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ').find_map(|f| f.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("no {key}= in {line}"))
}

#[test]
fn the_trace_of_a_watch_shows_each_stage_with_the_rows_snapshot_measured() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start(&exe);
    let trace = dir.join("w.mgt");
    let mut watch = Watch::start(&dir, &[&program.pid.to_string(), "--interval", "200ms", "-o", arg(&trace)]);
    watch.lines_about(program.pid, 1);
    // Each stage, idle: memgap snapshot --json of it, between readings of the watch.
    let mut measured = Vec::new();
    for stage in 1..=3 {
        assert_eq!(program.next(), stage);
        watch.lines_about(program.pid, 2);
        measured.push(snapshot_json(&dir, program.pid));
        watch.lines_about(program.pid, 1);
    }
    let (status, lines, stderr) = watch.stop();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        lines.iter().all(|l| l.starts_with("seconds=") && l.contains(&format!(" pid={} comm=watch_stages ", program.pid))),
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| !l.contains('\x1b')), "escapes in plain lines: {lines:?}");
    assert_eq!(mode(&trace), 0o600);

    // The stages, in order, each with the rows snapshot measured within 5 %.
    let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
    let snapshots = timeline["snapshots"].as_array().expect("snapshots");
    assert!(snapshots.len() >= 10, "{} snapshots", snapshots.len());
    let mut at = 0;
    let mut matched = Vec::new();
    for (stage, snapshot) in measured.iter().enumerate() {
        assert_eq!(snapshot["unknown_rows"], serde_json::json!([]), "{snapshot}");
        let found = snapshots[at..]
            .iter()
            .position(|s| rows_close(&s["rows"], &snapshot["rows"]))
            .unwrap_or_else(|| panic!("stage {}: no snapshot after #{at} with rows like {}", stage + 1, snapshot["rows"]));
        at += found;
        matched.push(at);
        at += 1;
    }
    // The stages differ: growth, fragmentation, then retained pages malloc_trim would return.
    let rows = |i: usize| &snapshots[matched[i]]["rows"];
    assert!(u(rows(0), "live") > 25 * MIB, "{}", rows(0));
    assert!(u(rows(1), "fragmented") > 5 * MIB && u(rows(1), "live") < 10 * MIB, "{}", rows(1));
    assert!(u(rows(2), "retained") > 25 * MIB && u(rows(2), "live") < MIB, "{}", rows(2));
    assert!(u(&snapshots[matched[2]], "trim_would_return_bytes") > 20 * MIB);

    // ledger --at the second stage's moment shows the very rows of the timeline.
    let seconds = snapshots[matched[1]]["at_seconds"].as_f64().unwrap();
    let ledger = json_of(&dir, &["ledger", "--json", "--at", &format!("{seconds:.3}"), arg(&trace)]);
    assert_eq!(ledger["rows"], snapshots[matched[1]]["rows"]);
    let report = dir.join("w.html");
    let out = memgap(&dir, &["report", arg(&trace), "-o", arg(&report)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(&report).unwrap().contains("fragmented"));
    program.exit();
}

#[test]
fn a_process_that_exits_gets_one_line_and_the_watch_goes_on_with_the_others() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "watch_stages.c");
    let mut first = Stages::start(&exe);
    let mut second = Stages::start(&exe);
    let (a, b) = (first.pid.to_string(), second.pid.to_string());
    let mut watch = Watch::start(&dir, &[&a, &b, "--interval", "100ms", "-o", arg(&dir.join("w.mgt"))]);
    watch.lines_about(first.pid, 1);
    first.exit();
    second.next();
    // The other is still read, and grows.
    let grown = watch.line_where(second.pid, TIMEOUT, |l| field(l, "live").ends_with("MiB")).expect("the second process is still watched");
    assert!(grown.contains(" live="), "{grown}");
    second.exit();
    // With every pid gone, the watch ends by itself.
    let (status, _, stderr) = watch.finish();
    assert!(status.success(), "{status}: {stderr}");
    for pid in [first.pid, second.pid] {
        let exits: Vec<&str> = stderr.lines().filter(|l| l.contains(&format!("process {pid} ")) && l.contains("exited")).collect();
        assert_eq!(exits.len(), 1, "{stderr}");
        let trace = dir.join(format!("w.{pid}.mgt"));
        let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
        assert!(!timeline["snapshots"].as_array().unwrap().is_empty(), "{}", trace.display());
    }
}

#[test]
fn at_rss_marks_a_snapshot_as_rss_crosses_the_threshold() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start(&exe);
    let threshold = vm_rss(program.pid) + 16 * MIB;
    let trace = dir.join("w.mgt");
    // Readings every minute: only the trigger can take the snapshot in time.
    let mut watch =
        Watch::start(&dir, &[&program.pid.to_string(), "--interval", "60s", "--at-rss", &threshold.to_string(), "-o", arg(&trace)]);
    let first = watch.lines_about(program.pid, 1).remove(0);
    assert!(!first.contains("mark="), "{first}");
    let asked = Instant::now();
    program.next();
    let marked = watch.line_where(program.pid, Duration::from_secs(20), |l| l.contains("mark=")).expect("a marked snapshot");
    assert!(asked.elapsed() < Duration::from_secs(20));
    assert!(marked.contains("reached --at-rss"), "{marked}");
    let (status, _, stderr) = watch.stop();
    assert!(status.success(), "{stderr}");
    let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
    let snapshots = timeline["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 2, "the first reading and the marked one");
    let (before, after) = (u(&snapshots[0], "rss_bytes"), u(&snapshots[1], "rss_bytes"));
    assert!(before < threshold && after >= threshold, "{before} then {after}, threshold {threshold}");
    assert_eq!(snapshots[1]["snapshot_reason"], "requested");
    program.exit();
}

#[test]
fn trim_when_retained_calls_malloc_trim_where_the_forecast_says_it_returns_memory() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start(&exe);
    for _ in 1..=2 {
        program.next();
    }
    // Fragmented, with 10 MiB retained: under a 20 MiB threshold nothing is trimmed.
    let before = vm_rss(program.pid);
    let mut watch = Watch::start(
        &dir,
        &[&program.pid.to_string(), "--interval", "100ms", "--trim-when-retained", "20M", "-o", arg(&dir.join("a.mgt"))],
    );
    let lines = watch.lines_about(program.pid, 4);
    assert!(lines.iter().all(|l| !l.contains("malloc_trim")), "{lines:?}");
    assert!(vm_rss(program.pid) + 2 * MIB > before);
    program.next();
    // Everything freed below the pin: about 29 MiB retained, which the forecast says malloc_trim returns.
    let trimmed = watch.line_where(program.pid, TIMEOUT, |l| l.contains("malloc_trim")).expect("a trim");
    let after = vm_rss(program.pid);
    assert!(before > after + 20 * MIB, "VmRSS {before} before, {after} after: {trimmed}");
    // The snapshot after the trim: the retained pages are gone.
    assert!(field(&trimmed, "retained").ends_with("KiB") || field(&trimmed, "retained") == "0B", "{trimmed}");
    // Once, not at every reading.
    let more = watch.lines_about(program.pid, 3);
    assert!(more.iter().all(|l| !l.contains("malloc_trim")), "{more:?}");
    let (status, _, stderr) = watch.stop();
    assert!(status.success(), "{stderr}");
    let timeline = memgap(&dir, &["timeline", arg(&dir.join("a.mgt"))]);
    assert!(text(&timeline.stdout).contains("malloc_trim: "), "{}", text(&timeline.stdout));
    program.exit();
}

#[test]
fn cgroup_mode_watches_the_processes_of_a_cgroup() {
    let (_tmp, dir) = tempdir();
    // The cgroup2 hierarchy, wherever it is mounted (/sys/fs/cgroup/unified beside v1's controllers).
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let Some(root) = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split(' ').nth(4)?;
        right.starts_with("cgroup2 ").then(|| PathBuf::from(point))
    }) else {
        eprintln!("skipped: no cgroup2 hierarchy is mounted here: cgroup mode is not tested");
        return;
    };
    let cgroup = root.join(format!("memgap-watch-test-{}", std::process::id()));
    if let Err(error) = std::fs::create_dir(&cgroup) {
        eprintln!("skipped: cannot create a cgroup under {} ({error}): cgroup mode is not tested here", root.display());
        return;
    }
    if !cgroup.join("cgroup.procs").exists() {
        let _ = std::fs::remove_dir(&cgroup);
        eprintln!("skipped: {} is no cgroup: cgroup mode is not tested here", root.display());
        return;
    }
    struct Removed(PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            for _ in 0..50 {
                if std::fs::remove_dir(&self.0).is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let _removed = Removed(cgroup.clone());
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start(&exe);
    if let Err(error) = std::fs::write(cgroup.join("cgroup.procs"), program.pid.to_string()) {
        eprintln!("skipped: cannot move a process into {} ({error})", cgroup.display());
        return;
    }
    let limited = std::fs::write(cgroup.join("memory.max"), (256 * MIB).to_string()).is_ok();
    let mut args = vec!["--cgroup".to_string(), cgroup.display().to_string(), "--interval".into(), "200ms".into()];
    args.extend(["-o".into(), dir.join("c.mgt").display().to_string()]);
    if limited {
        // Above 4 % of 256 MiB once stage 1 holds 30 MiB.
        args.extend(["--at-cgroup-percent".into(), "8".into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut watch = Watch::start(&dir, &args);
    watch.lines_about(program.pid, 1);
    program.next();
    if limited {
        let marked = watch.line_where(program.pid, TIMEOUT, |l| l.contains("mark=")).expect("a marked snapshot");
        assert!(marked.contains("--at-cgroup-percent 8"), "{marked}");
    } else {
        eprintln!("no memory controller on {}: --at-cgroup-percent is not tested here", cgroup.display());
    }
    let (status, _, stderr) = watch.stop();
    assert!(status.success(), "{stderr}");
    let trace = dir.join(format!("c.{}.mgt", program.pid));
    let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
    assert!(!timeline["snapshots"].as_array().unwrap().is_empty());
    let _ = std::fs::write(root.join("cgroup.procs"), program.pid.to_string());
    program.exit();
}

#[test]
fn bad_input_gets_one_line() {
    let (_tmp, dir) = tempdir();
    let out = memgap(&dir, &["watch", &unused_pid().to_string(), "--interval", "100ms"]);
    assert!(assert_one_line_failure(&out).contains("no process"), "{}", text(&out.stderr));
    let taken = dir.join("taken.mgt");
    std::fs::write(&taken, b"x").unwrap();
    let out = memgap(&dir, &["watch", &std::process::id().to_string(), "-o", arg(&taken)]);
    assert!(assert_one_line_failure(&out).contains("exists"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&taken).unwrap(), b"x");
    let out = memgap(&dir, &["watch", "1", "--interval", "soon"]);
    assert!(!out.status.success());
}

#[test]
fn at_cgroup_percent_marks_a_snapshot_before_the_limit() {
    let (_tmp, dir) = tempdir();
    // A memory cgroup with a limit: v2's memory controller where enabled, else v1's.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mounts: Vec<(String, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            Some((left.split(' ').nth(4)?.to_string(), right.to_string()))
        })
        .collect();
    let v2 = mounts.iter().find(|(_, fs)| fs.starts_with("cgroup2 ")).map(|(point, _)| PathBuf::from(point));
    let v1 = mounts.iter().find(|(_, fs)| fs.starts_with("cgroup ") && fs.split([' ', ',']).any(|o| o == "memory"));
    let (parent, limit_file) = match (v2, v1) {
        (Some(root), _) if std::fs::read_to_string(root.join("cgroup.subtree_control")).is_ok_and(|c| c.contains("memory")) => {
            (root, "memory.max")
        }
        (_, Some((point, _))) => (PathBuf::from(point), "memory.limit_in_bytes"),
        _ => {
            eprintln!("skipped: no memory controller to limit a cgroup with: --at-cgroup-percent is not tested here");
            return;
        }
    };
    let cgroup = parent.join(format!("memgap-watch-limit-{}", std::process::id()));
    if std::fs::create_dir(&cgroup).is_err() || !cgroup.join("cgroup.procs").exists() {
        let _ = std::fs::remove_dir(&cgroup);
        eprintln!("skipped: cannot create a memory cgroup under {}", parent.display());
        return;
    }
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start(&exe);
    let moved = std::fs::write(cgroup.join(limit_file), (256 * MIB).to_string()).is_ok()
        && std::fs::write(cgroup.join("cgroup.procs"), program.pid.to_string()).is_ok();
    if moved {
        // 8 % of 256 MiB is 20.5 MiB: crossed when stage 1 allocates 30 MiB.
        let mut watch =
            Watch::start(&dir, &[&program.pid.to_string(), "--interval", "60s", "--at-cgroup-percent", "8", "-o", arg(&dir.join("w.mgt"))]);
        let first = watch.lines_about(program.pid, 1).remove(0);
        let percent = |line: &str| field(line, "cgroup").trim_end_matches('%').parse::<f64>().unwrap();
        assert!(percent(&first) < 8.0, "{first}");
        program.next();
        let marked = watch.line_where(program.pid, Duration::from_secs(20), |l| l.contains("mark=")).expect("a marked snapshot");
        assert!(marked.contains("--at-cgroup-percent 8") && percent(&marked) >= 8.0, "{marked}");
        let (status, _, stderr) = watch.stop();
        assert!(status.success(), "{stderr}");
    } else {
        eprintln!("skipped: cannot limit {} or move a process into it", cgroup.display());
    }
    program.exit();
    for _ in 0..50 {
        if std::fs::remove_dir(&cgroup).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn on_a_terminal_the_view_is_redrawn_in_place() {
    let (_tmp, dir) = tempdir();
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no script(1) to give memgap watch a terminal");
        return;
    }
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start(&exe);
    program.next();
    let watch =
        format!("{} watch {} --interval 100ms --duration 1s -o {}", memgap_bin().display(), program.pid, dir.join("t.mgt").display());
    let out = output_of(
        Command::new("script").args(["-qefc", &watch, "/dev/null"]).env("COLUMNS", "100").env("LINES", "40").env_remove("LD_PRELOAD"),
    );
    let screen = text(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(screen.contains(&format!("pid {} (watch_stages)  RSS ", program.pid)), "{screen}");
    assert!(screen.contains("█") && screen.contains("  live "), "{screen}");
    // Redrawn: the cursor goes back up over the previous frame.
    assert!(screen.contains("\x1b[") && screen.contains("F\x1b[J"), "{screen}");
    assert!(!screen.contains("seconds="), "plain lines on a terminal: {screen}");
    program.exit();
}

/// Builds tests/programs/go/idle_holder (no dependency, no helper package).
fn build_go_idle_holder(dir: &Path) -> PathBuf {
    let go = ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .find(|go| Command::new(go).arg("version").output().is_ok_and(|o| o.status.success()))
        .expect("the go command is needed for this test (Go is preinstalled on CI)");
    let source = dir.join("idle_holder-src");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::copy(programs_dir().join("go/idle_holder/main.go"), source.join("main.go")).unwrap();
    std::fs::write(source.join("go.mod"), "module idle_holder\n\ngo 1.19\n").unwrap();
    let exe = dir.join("idle_holder");
    let out = output_of(Command::new(go).args(["build", "-o"]).arg(&exe).arg(".").current_dir(&source).env("CGO_ENABLED", "0"));
    assert!(out.status.success(), "go build failed:\n{}", text(&out.stderr));
    exe
}

#[test]
fn the_trace_of_a_watched_go_program_holds_its_runtimes_accounting() {
    let (_tmp, dir) = tempdir();
    let exe = build_go_idle_holder(&dir);
    // Shaped unlike the snapshot tests' programs: one survivor in 16 of 100,000 per size.
    let mut program =
        Command::new(&exe).args(["-keep", "16", "-count", "100000"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(program.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let memstats: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    let pid = program.id();
    let trace = dir.join("go.mgt");
    let mut watch = Watch::start(&dir, &[&pid.to_string(), "--interval", "200ms", "-o", arg(&trace)]);
    watch.lines_about(pid, 2);
    let snapshot = snapshot_json(&dir, pid);
    watch.lines_about(pid, 1);
    let (status, lines, stderr) = watch.stop();
    drop(program.stdin.take());
    assert!(wait_or_kill(&mut program, "the Go program").success(), "the watch changed the program");
    assert!(status.success(), "{status}: {stderr}");
    assert!(lines.iter().all(|l| l.contains(" fragmented=")), "{lines:?}");

    // The watch's trace, read as a recording: the Go owner's rows, as `memgap snapshot PID` computed them.
    let ledger = json_of(&dir, &["ledger", "--json", arg(&trace)]);
    assert_eq!(snapshot["unknown_rows"], serde_json::json!([]), "{snapshot}");
    assert_eq!((ledger["allocator"].as_str(), ledger["go"]["source"].as_str()), (Some("go"), Some("process memory")), "{ledger}");
    for row in ["live", "slack", "fragmented", "retained", "lazy_free", "runtime", "other"] {
        let (watched, snapped) = (u(&ledger["rows"], row), u(&snapshot["rows"], row));
        assert!(close(watched, snapped), "{row}: watch trace {watched}, snapshot {snapped}");
    }
    // And the runtime's own MemStats: the truth both are measured against.
    let (heap_alloc, heap_inuse) = (u(&memstats, "HeapAlloc"), u(&memstats, "HeapInuse"));
    let fragmented = u(&ledger["rows"], "fragmented");
    assert!(fragmented.abs_diff(heap_inuse - heap_alloc) * 20 <= heap_inuse - heap_alloc, "{fragmented} vs {}", heap_inuse - heap_alloc);
    assert!(u(&ledger["rows"], "live").abs_diff(heap_alloc) * 20 <= heap_alloc, "{} vs {heap_alloc}", ledger["rows"]);
    let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
    let snapshots = timeline["snapshots"].as_array().unwrap();
    assert!(snapshots.len() >= 3, "{timeline}");
    assert!(snapshots.iter().all(|s| close(u(&s["rows"], "fragmented"), fragmented)), "{timeline}");
    let report = dir.join("go.html");
    let out = memgap(&dir, &["report", arg(&trace), "-o", arg(&report)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The bytes watch_stages asks malloc for in its first stage, and those it
/// still holds after its second (one block in four).
fn watch_stages_requested() -> (u64, u64) {
    let size = |i: u64| 1024 + i * 37 % 3072;
    let all: u64 = (0..12000).map(size).sum::<u64>() + 64;
    let kept: u64 = (0..12000).filter(|i| i % 4 == 0).map(size).sum::<u64>() + 64;
    (all, kept)
}

#[test]
fn a_jemalloc_process_is_watched_by_jemallocs_own_figures() {
    let library = Path::new(ALLOCATOR_DIR).join("libjemalloc.so.2");
    assert!(library.is_file(), "{} is missing (apt install libjemalloc2)", library.display());
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start_preloading(&exe, Some(&library));
    program.next();
    let trace = dir.join("je.mgt");
    let mut watch = Watch::start(&dir, &[&program.pid.to_string(), "--interval", "200ms", "-o", arg(&trace)]);
    watch.lines_about(program.pid, 2);
    let first = snapshot_json(&dir, program.pid);
    watch.lines_about(program.pid, 1);
    program.next();
    watch.lines_about(program.pid, 2);
    let second = snapshot_json(&dir, program.pid);
    watch.lines_about(program.pid, 1);
    let (status, _, stderr) = watch.stop();
    assert!(status.success(), "{status}: {stderr}");
    program.exit();

    // Each stage is in the trace with the rows jemalloc's figures gave `memgap snapshot PID`.
    let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
    let snapshots = timeline["snapshots"].as_array().expect("snapshots");
    let mut at = 0;
    let mut matched = Vec::new();
    for (stage, snapshot) in [&first, &second].into_iter().enumerate() {
        assert_eq!((snapshot["allocator"].as_str(), &snapshot["allocator_statically_linked"]), (Some("jemalloc"), &Value::Bool(false)));
        let by_jemalloc = &snapshot["allocator_rows"];
        let found = snapshots[at..]
            .iter()
            .position(|s| ["live", "fragmented", "retained"].iter().all(|row| close(u(&s["rows"], row), u(by_jemalloc, row))))
            .unwrap_or_else(|| panic!("stage {}: no snapshot after #{at} with rows like {by_jemalloc}: {timeline}", stage + 1));
        at += found;
        matched.push(at);
        at += 1;
    }
    // Against what the program asked for: jemalloc rounds each request up
    // to its size class (at most a quarter more between 1 and 4 KiB).
    let (all, kept) = watch_stages_requested();
    for (i, requested) in [all, kept].into_iter().enumerate() {
        let live = u(&snapshots[matched[i]]["rows"], "live");
        assert!(live >= requested && live <= requested + requested / 4, "stage {}: live {live}, requested {requested}", i + 1);
    }
    let seconds = snapshots[matched[0]]["at_seconds"].as_f64().unwrap();
    let ledger = json_of(&dir, &["ledger", "--json", "--at", &format!("{seconds:.3}"), arg(&trace)]);
    assert_eq!(ledger["rows"], snapshots[matched[0]]["rows"]);
    assert_eq!(ledger["allocator"], "jemalloc", "a preloaded jemalloc is not linked into the program");
    assert!(ledger["other_breakdown"]["unclassified"].as_u64().unwrap() < MIB, "{}", ledger["other_breakdown"]);
}

/// `setpriv` arguments that run a command as user nobody.
const AS_NOBODY: [&str; 4] = ["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"];

#[test]
fn all_watches_the_processes_memgap_may_read_and_skips_the_others() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, dir) = tempdir();
    // As root, memgap may read every process: the watch and its target run
    // as user nobody, to whom this test's processes are not readable (and
    // so that the watch stops no other process of the machine).
    let root = proc_status(std::process::id(), "Uid").is_some_and(|uid| uid.split_whitespace().next() == Some("0"));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = compile(&dir, "watch_stages.c");
    let out_dir = dir.join("traces");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::set_permissions(&out_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (mut target, mut watch) = if root {
        let memgap = dir.join("memgap");
        std::fs::copy(memgap_bin(), &memgap).unwrap();
        let mut target = Command::new("setpriv");
        target.args(AS_NOBODY).arg(&exe).env_remove("LD_PRELOAD");
        let mut watch = Command::new("setpriv");
        watch.args(AS_NOBODY).arg(&memgap);
        (target, watch)
    } else {
        eprintln!("not root: --all is tested with the processes of other users as those it may not read");
        let mut target = Command::new(&exe);
        target.env_remove("LD_PRELOAD");
        (target, memgap_cmd(&dir, &[]))
    };
    target.current_dir(&dir);
    let mut program = Stages::start_by(target);
    program.next();
    let pattern = out_dir.join("all.mgt");
    let out = output_of(watch.args(["watch", "--all", "--interval", "300ms", "--duration", "1.5s", "-o", arg(&pattern)]).current_dir(&dir));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}: {}", out.status, text(&out.stderr));
    // The process started here is watched, and its trace has its stage's heap.
    assert!(stdout.lines().any(|l| l.contains(&format!(" pid={} comm=watch_stages ", program.pid))), "{stdout}");
    let trace = out_dir.join(format!("all.{}.mgt", program.pid));
    let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
    let snapshots = timeline["snapshots"].as_array().unwrap();
    assert!(!snapshots.is_empty() && u(&snapshots[0]["rows"], "live") > 25 * MIB, "{timeline}");
    program.exit();
    // Those it may not read got no trace and no error: this test's own
    // process when it is root's, pid 1 when another user's.
    let unreadable: Vec<u32> = [std::process::id(), 1]
        .into_iter()
        .filter(|&pid| {
            let owner = proc_status(pid, "Uid").and_then(|uid| uid.split_whitespace().next().map(str::to_string));
            let watcher = if root {
                "65534".to_string()
            } else {
                proc_status(std::process::id(), "Uid").unwrap().split_whitespace().next().unwrap().to_string()
            };
            owner.is_some_and(|owner| owner != watcher)
        })
        .collect();
    for pid in &unreadable {
        assert!(!out_dir.join(format!("all.{pid}.mgt")).exists(), "a trace of process {pid}, not the watch's to read");
        assert!(!stdout.contains(&format!(" pid={pid} ")), "{stdout}");
    }
    if unreadable.is_empty() {
        eprintln!("every process here is this user's: skipping unreadable processes is not tested");
    }
    let traces: Vec<_> = std::fs::read_dir(&out_dir).unwrap().flatten().collect();
    assert!(traces.iter().all(|t| t.file_name().to_string_lossy().starts_with("all.")), "{traces:?}");
}

#[test]
fn summary_says_the_events_of_a_watch_are_differences_between_walks() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "watch_stages.c");
    let mut program = Stages::start(&exe);
    let trace = dir.join("w.mgt");
    let mut watch = Watch::start(&dir, &[&program.pid.to_string(), "--interval", "150ms", "-o", arg(&trace)]);
    watch.lines_about(program.pid, 1);
    program.next();
    watch.lines_about(program.pid, 2);
    program.next();
    watch.lines_about(program.pid, 2);
    let (status, _, stderr) = watch.stop();
    assert!(status.success(), "{stderr}");
    program.exit();

    let summary = summary_json(&trace);
    let walks = summary["synthesized_from_walks"].as_u64().unwrap_or_else(|| panic!("no synthesized_from_walks: {summary}"));
    let timeline = json_of(&dir, &["timeline", "--json", arg(&trace)]);
    assert_eq!(walks, timeline["snapshots"].as_array().unwrap().len() as u64, "one walk per snapshot");
    // The 12,000 blocks of stage 1 appeared between two walks; no thread of the program was seen calling.
    assert!(u(&summary, "allocations") >= 12_000 && u(&summary, "threads") == 0, "{summary}");
    let shown = text(&memgap(&dir, &["summary", arg(&trace)]).stdout);
    assert!(shown.contains("not the program's calls") && shown.contains(&format!("differences between {walks} walks")), "{shown}");
    assert!(shown.contains("allocated       not known") && !shown.contains("  calls "), "{shown}");

    // A recording of the same program: its calls, said as calls.
    let recorded = dir.join("r.mgt");
    let out = output_of(memgap_cmd(&dir, &["run", "-q", "-o", arg(&recorded), "--", arg(&exe)]).stdin(Stdio::null()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary = summary_json(&recorded);
    assert!(summary.get("synthesized_from_walks").is_none() && u(&summary, "threads") == 1, "{summary}");
    assert!(text(&memgap(&dir, &["summary", arg(&recorded)]).stdout).contains("  calls "));
}
