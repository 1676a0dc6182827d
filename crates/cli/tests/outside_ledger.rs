//! `memgap snapshot PID` walks a running glibc process's heap from outside:
//! its ledger agrees with the ledger of a recorded run of the same program,
//! its trim forecast with a real malloc_trim (`memgap trim PID`), and it
//! holds under threads that malloc all the time.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

const HEAP_ROWS: [&str; 4] = ["live", "slack", "fragmented", "retained"];

/// The program in `mode`, started plainly, once it says it is idle; its
/// stdin stays open until dropped.
struct Idle {
    child: std::process::Child,
    pid: u32,
}

impl Idle {
    fn start(exe: &Path, mode: &[&str], env: &[(&str, &str)]) -> Idle {
        use std::io::BufRead;
        let mut cmd = Command::new(exe);
        cmd.args(mode).env_remove("LD_PRELOAD").stdin(Stdio::piped()).stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start the program");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let pid = line.strip_prefix("idle ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("printed {line:?}"));
        Idle { child, pid }
    }

    /// Closes its stdin and returns what it printed then, and its status.
    fn finish(mut self) -> (String, std::process::ExitStatus) {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut rest).unwrap();
        let status = self.child.wait().unwrap();
        (rest, status)
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn snapshot(dir: &Path, pid: u32, env: &[(&str, &str)]) -> Value {
    let mut cmd = memgap_cmd(dir, &["snapshot", &pid.to_string(), "--json"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_of(&mut cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn u(json: &Value, key: &str) -> u64 {
    json[key].as_u64().unwrap_or_else(|| panic!("no {key} in {json}"))
}

/// The recorded ledger of `mode` at its end (the idle heap: it exits without freeing).
fn recorded(dir: &Path, exe: &Path, mode: &[&str]) -> Value {
    let trace = dir.join(format!("{}.mgt", mode.join("-")));
    let mut args = vec!["run", "-o", arg(&trace), "--", arg(exe)];
    args.extend(mode);
    let out = memgap(dir, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = memgap(dir, &["ledger", "--json", "--at", "end", arg(&trace)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn within(outside: u64, recorded: u64, percent: u64, floor: u64) -> bool {
    outside.abs_diff(recorded) <= (recorded.max(outside) * percent / 100).max(floor)
}

/// Whether this kernel sets a page's soft-dirty bit (pagemap bit 55) when
/// the page is written after /proc/PID/clear_refs was given 4 (only with
/// CONFIG_MEM_SOFT_DIRTY): tried on a page of the test's own.
fn kernel_keeps_soft_dirty_bits() -> bool {
    use std::os::unix::fs::FileExt;
    let mut page = vec![1u8; 2 * 4096];
    let at = page.as_ptr() as u64;
    let index = (at.next_multiple_of(4096) - at) as usize;
    std::hint::black_box(&mut page);
    if std::fs::write("/proc/self/clear_refs", "4").is_err() {
        return false;
    }
    page[index] = 2;
    std::hint::black_box(&mut page);
    let mut entry = [0u8; 8];
    let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
    pagemap.read_exact_at(&mut entry, (at + index as u64) / 4096 * 8).unwrap();
    u64::from_le_bytes(entry) & (1 << 55) != 0
}

/// The outside ledger of the idle program against its recorded ledger, and
/// its trim forecast against a real malloc_trim.
fn agrees_with_recording_and_trim(mode: &[&str]) {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "outside_heap.c");
    let recorded = recorded(&dir, &exe, mode);
    let idle = Idle::start(&exe, mode, &[]);
    let json = snapshot(&dir, idle.pid, &[]);
    // An idle heap is read while the program runs, the stop only checking
    // it, where the kernel keeps soft-dirty bits; else it is read stopped.
    let expected = if kernel_keeps_soft_dirty_bits() { "running, checked stopped" } else { "stopped" };
    assert_eq!(json["walk"]["read_while"], expected, "{:#}", json["walk"]);
    assert_eq!(json["unknown_rows"], serde_json::json!([]), "walk failed: {}", json["walk_failure"]);
    let rows = &json["rows"];
    let rss = u(&json, "rss_bytes");
    for row in HEAP_ROWS {
        // Rows of a few bytes (slack of an emptied heap) are held to 4 KiB.
        let (o, r) = (u(rows, row), u(&recorded["rows"], row));
        assert!(within(o, r, 5, 4096), "{mode:?} {row}: outside {o}, recorded {r}\n{rows}\n{}", recorded["rows"]);
    }
    // The recorded process also holds memgap's agent (its code, buffers, the
    // stack its hooks use): runtime and other are held to 5 % of RSS.
    let other_recorded = u(&recorded["rows"], "other") - u(&recorded, "memgap_bytes");
    assert!(within(u(rows, "other"), other_recorded, 0, rss / 20), "other: {rows} vs {}", recorded["rows"]);
    assert!(within(u(rows, "runtime"), u(&recorded["rows"], "runtime"), 0, rss / 20), "runtime: {rows}");
    let sum: u64 = HEAP_ROWS.iter().chain(&["lazy_free", "runtime", "other"]).map(|r| u(rows, r)).sum();
    assert!(sum.abs_diff(rss) <= rss / 50, "rows sum to {sum}, VmRSS {rss}");
    let forecast = u(&json, "trim_would_return_bytes");
    assert!(
        within(forecast, u(&recorded, "trim_would_return_bytes"), 5, 64 << 10),
        "forecast {forecast}, recorded {}",
        recorded["trim_would_return_bytes"]
    );
    // The real trim of the same idle process.
    let out = memgap(&dir, &["trim", &idle.pid.to_string(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let trim: Value = serde_json::from_slice(&out.stdout).unwrap();
    let returned = trim["heap_returned_bytes"].as_i64().unwrap().max(0) as u64;
    assert!(within(forecast, returned, 5, 64 << 10), "{mode:?}: forecast {forecast}, malloc_trim returned {returned}");
    let (_, status) = idle.finish();
    assert!(status.success());
}

#[test]
fn strided_frees_in_the_main_arena() {
    agrees_with_recording_and_trim(&["strided", "8"]);
}

#[test]
fn thread_arenas_with_survivors() {
    agrees_with_recording_and_trim(&["threads-survivors"]);
}

#[test]
fn thread_arenas_without_survivors() {
    agrees_with_recording_and_trim(&["threads-emptied"]);
}

#[test]
fn without_debug_info_the_heuristic_finds_main_arena() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "outside_heap.c");
    let empty = dir.join("no-debug-info");
    std::fs::create_dir(&empty).unwrap();
    let idle = Idle::start(&exe, &["threads-survivors"], &[]);
    let guessed = snapshot(&dir, idle.pid, &[("MEMGAP_DEBUG_DIR", arg(&empty))]);
    assert_eq!(guessed["walk"]["found_by"], "heuristic", "{:#}", guessed["walk_failure"]);
    assert_eq!(guessed["walk"]["arenas"], 4);
    let known = snapshot(&dir, idle.pid, &[]);
    if known["walk"]["found_by"] == "debug info" {
        for row in HEAP_ROWS {
            assert_eq!(guessed["rows"][row], known["rows"][row], "{row}");
        }
    }
}

#[test]
fn snapshots_of_threads_in_heavy_malloc() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "outside_heap.c");
    let busy = Idle::start(&exe, &["threads-heavy", "7"], &[]);
    let (mut walked, mut failures) = (0, Vec::new());
    for _ in 0..50 {
        let json = snapshot(&dir, busy.pid, &[]);
        // Never left stopped or traced, whichever way the heap was read.
        let state = proc_status(busy.pid, "State").unwrap_or_default();
        assert!(!state.starts_with('t') && !state.starts_with('T'), "left {state}");
        assert_eq!(proc_status(busy.pid, "TracerPid").as_deref(), Some("0"));
        let rss = u(&json, "rss_bytes");
        let rows = &json["rows"];
        let sum: u64 = ["heap", "lazy_free", "runtime", "other"].iter().map(|r| u(rows, r)).sum();
        assert!(sum.abs_diff(rss) <= rss / 50, "rows sum to {sum}, VmRSS {rss}: {rows}");
        match json.get("walk_failure").and_then(Value::as_str) {
            None => {
                walked += 1;
                assert_eq!(json["unknown_rows"], serde_json::json!([]));
                let split: u64 = HEAP_ROWS.iter().map(|r| u(rows, r)).sum();
                assert_eq!(split, u(rows, "heap"));
            }
            Some(why) => {
                assert!(!why.is_empty() && !why.contains('\n'), "{why:?}");
                failures.push(why.to_string());
            }
        }
    }
    let (rest, status) = busy.finish();
    assert!(status.success() && rest.contains("\nok\n"), "{rest}");
    assert!(walked >= 40, "{walked} of 50 walked; failures: {failures:?}");
    let _ = std::io::stdout().flush();
}
