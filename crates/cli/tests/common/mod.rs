//! Helpers shared by the end-to-end tests: compiling test programs, running
//! memgap with a timeout, reading its JSON.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

/// No single command in these tests should take anywhere near this long; a
/// command that does is killed (with its whole process group) and the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(60);

pub const ALLOCATOR_DIR: &str = "/usr/lib/x86_64-linux-gnu";

// ---------------------------------------------------------------------------

pub fn memgap_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_memgap"))
}

pub fn programs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
}

/// A fresh temporary directory, canonicalized so paths compare equal to
/// what /proc reports.
pub fn tempdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().canonicalize().expect("canonicalize the temporary directory");
    (dir, path)
}

pub fn arg(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// Compiles `tests/programs/<source>` (.c, .cpp or .rs) into `dir` and
/// returns the executable's path.
pub fn compile(dir: &Path, source: &str) -> PathBuf {
    compile_with(dir, source, &[])
}

/// `compile` with more compiler flags (e.g. `-static`).
pub fn compile_with(dir: &Path, source: &str, flags: &[&str]) -> PathBuf {
    let src = programs_dir().join(source);
    let (stem, ext) = source.rsplit_once('.').expect("source file has an extension");
    let exe = dir.join(stem);
    let mut cmd = match ext {
        // -fno-builtin: the compiler must not elide malloc/free pairs.
        "c" => command("cc", ["-std=gnu11", "-O2", "-g", "-Wall", "-fno-builtin", "-pthread", "-ldl"]),
        "cpp" => command("c++", ["-std=c++17", "-O2", "-g", "-Wall"]),
        "rs" => command("rustc", ["-O", "--edition", "2021"]),
        _ => panic!("don't know how to compile {source}"),
    };
    cmd.args(flags).arg("-o").arg(&exe).arg(&src);
    let out = output_of(&mut cmd);
    assert!(out.status.success(), "compiling {source} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

pub fn command<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(program: &str, args: I) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}

/// Runs `program ARGS...` in `dir` without memgap.
pub fn run_plain(dir: &Path, program: &str, args: &[&str]) -> Output {
    output_of(command(program, args).current_dir(dir).env_remove("LD_PRELOAD"))
}

/// `memgap ARGS...` as a Command, run in `dir` with no LD_PRELOAD inherited
/// from the test runner.
pub fn memgap_cmd(dir: &Path, args: &[&str]) -> Command {
    if args.first() == Some(&"run") && std::env::var_os("MEMGAP_AGENT").is_none() {
        let agent = memgap_bin().with_file_name("libmemgap_agent.so");
        assert!(agent.exists(), "{} is missing: build the agent first (cargo build --release --workspace)", agent.display());
    }
    let mut cmd = command(memgap_bin().to_str().unwrap(), args);
    cmd.current_dir(dir).env_remove("LD_PRELOAD");
    cmd
}

/// Runs `memgap ARGS...` in `dir` and returns what it printed and its status.
pub fn memgap(dir: &Path, args: &[&str]) -> Output {
    output_of(&mut memgap_cmd(dir, args))
}

/// `memgap summary TRACE --json`, which must succeed, parsed.
pub fn summary_json(trace: &Path) -> Value {
    let dir = trace.parent().unwrap();
    let out = memgap(dir, &["summary", arg(trace), "--json"]);
    assert!(out.status.success(), "memgap summary {} failed ({}):\n{}", trace.display(), out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("summary --json printed invalid JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout)))
}

/// `summary["events"][kind]`; panics, showing the summary, if it is absent.
pub fn events(summary: &Value, kind: &str) -> u64 {
    summary["events"][kind].as_u64().unwrap_or_else(|| panic!("no events.{kind} in summary:\n{summary:#}"))
}

pub fn number(summary: &Value, key: &str) -> u64 {
    summary[key].as_u64().unwrap_or_else(|| panic!("no numeric {key} in summary:\n{summary:#}"))
}

/// Names of the `.mgt` files in `dir`, sorted.
pub fn traces_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".mgt"))
        .collect();
    names.sort();
    names
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Fails unless stdout, stderr and exit status of the two runs are identical.
pub fn assert_same_behaviour(plain: &Output, traced: &Output) {
    assert_eq!(text(&traced.stderr), text(&plain.stderr), "stderr differs under memgap");
    assert_eq!(text(&traced.stdout), text(&plain.stdout), "stdout differs under memgap");
    assert_eq!(traced.stdout, plain.stdout, "stdout bytes differ under memgap");
    assert_eq!(traced.stderr, plain.stderr, "stderr bytes differ under memgap");
    assert_eq!(traced.status.code(), plain.status.code(), "exit status differs under memgap");
}

/// Runs `cmd` with stdin closed, collecting stdout and stderr; kills its
/// process group and fails if it outlives TIMEOUT.
pub fn output_of(cmd: &mut Command) -> Output {
    output_within(cmd, TIMEOUT)
}

/// `output_of` with its own deadline, for the few commands (building a
/// test program's dependencies) that are slow by nature.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let stdout = read_in_background(child.stdout.take().unwrap());
    let stderr = read_in_background(child.stderr.take().unwrap());
    let status = wait_or_kill_after(&mut child, &format!("{cmd:?}"), timeout);
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

pub fn read_in_background(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Waits for a child started in its own process group.
pub fn wait_or_kill(child: &mut Child, what: &str) -> ExitStatus {
    wait_or_kill_after(child, what, TIMEOUT)
}

fn wait_or_kill_after(child: &mut Child, what: &str, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            sigkill(-(child.id() as i32));
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}; killed it");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs process `pid`, or process group `-pid`.
pub fn sigkill(pid: i32) {
    unsafe extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    const SIGKILL: i32 = 9;
    // SAFETY: kill(2) takes plain integers; std already links libc.
    unsafe { kill(pid, SIGKILL) };
}

/// Pids whose parent is `pid` (from /proc/*/stat, so it needs neither
/// CONFIG_PROC_CHILDREN nor procps).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // "pid (comm) state ppid ...": comm may contain spaces and ')'.
        let after_comm = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        if after_comm.split_whitespace().nth(1) == Some(pid.to_string().as_str()) {
            children.push(child);
        }
    }
    children
}

// ---------------------------------------------------------------------------
// Processes that keep running while memgap looks at them (attach tests).

/// A program started in the background in its own process group; it is
/// SIGKILLed (with its group) when dropped.
pub struct Background {
    pub child: Child,
    pub pid: u32,
    /// The lines it printed before `start` returned.
    pub lines: Vec<String>,
}

impl Background {
    /// Starts `cmd` (stdin closed, stderr inherited) and waits for its first
    /// `lines` lines on stdout, failing after TIMEOUT.
    pub fn start(cmd: &mut Command, lines: usize) -> Background {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        if !cmd.get_envs().any(|(key, _)| key == "LD_PRELOAD") {
            cmd.env_remove("LD_PRELOAD");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let pid = child.id();
        let stdout = child.stdout.take().unwrap();
        let (sender, receiver) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut running = Background { child, pid, lines: Vec::new() };
        while running.lines.len() < lines {
            match receiver.recv_timeout(TIMEOUT) {
                Ok(line) => running.lines.push(line),
                Err(_) => panic!("{cmd:?} printed {:?}, then nothing within {TIMEOUT:?}", running.lines),
            }
        }
        running
    }

    /// The number after `key ` in the lines it printed ("kept 1234").
    pub fn printed(&self, key: &str) -> u64 {
        let prefix = format!("{key} ");
        self.lines
            .iter()
            .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no \"{key} N\" in {:?}", self.lines))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        sigkill(-(self.pid as i32));
        let _ = self.child.wait();
    }
}

/// The value of `Key:` in /proc/PID/status.
pub fn proc_status(pid: u32, key: &str) -> Option<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| Some(line.strip_prefix(key)?.strip_prefix(':')?.trim().to_string()))
}

/// A `kB` figure of /proc/PID/status, in bytes.
pub fn proc_status_bytes(pid: u32, key: &str) -> u64 {
    let value = proc_status(pid, key).unwrap_or_else(|| panic!("no {key} for process {pid}"));
    value.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or_else(|| panic!("{key}: {value}")) * 1024
}

/// A pid no process has: one of a child that has been reaped.
pub fn unused_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("start true");
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// Fails unless `out` failed with exactly one line on stderr and nothing on
/// stdout; returns that line.
pub fn assert_one_line_failure(out: &Output) -> String {
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "succeeded: {}\n{}", text(&out.stdout), stderr);
    assert_eq!(stderr.lines().count(), 1, "not one line on stderr:\n{stderr}");
    assert!(out.stdout.is_empty(), "printed on stdout: {}", text(&out.stdout));
    stderr.trim().to_string()
}

/// VmRSS of `cmd` (run without memgap, with `env` added) over the last
/// quarter of its run: the median of samples every 10 ms, while the program
/// holds still.
pub fn holding_rss<S: AsRef<OsStr> + std::fmt::Debug>(cmd: &[S], env: &[(String, String)]) -> u64 {
    let mut command = Command::new(&cmd[0]);
    command.args(&cmd[1..]).env_remove("LD_PRELOAD").stdout(Stdio::null()).stderr(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("start the program");
    let mut samples = Vec::new();
    while child.try_wait().expect("wait for the program").is_none() {
        // A zombie has no VmRSS line.
        let status = fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
        if let Some(kib) =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        {
            samples.push(kib << 10);
        }
        thread::sleep(Duration::from_millis(10));
    }
    let mut tail = samples.split_off(samples.len() * 3 / 4);
    assert!(!tail.is_empty(), "no RSS sample of {cmd:?}");
    tail.sort_unstable();
    tail[tail.len() / 2]
}
