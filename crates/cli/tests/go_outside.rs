//! `memgap snapshot PID` of a Go program built without memgap's helper
//! package: the runtime's own accounting read from the process's memory
//! (its DWARF says where), checked against the runtime.ReadMemStats the
//! program printed while idle; and a binary without DWARF or symbols gets
//! its heap rows as "not known", never a number.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::Value;

fn go_command() -> String {
    ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .find(|go| Command::new(go).arg("version").output().is_ok_and(|o| o.status.success()))
        .expect("the go command is needed for these tests (Go is preinstalled on CI)")
        .to_string()
}

/// Builds tests/programs/go/idle_holder (no dependency at all) with `ldflags`.
fn build(dir: &Path, name: &str, ldflags: &str) -> PathBuf {
    let source = dir.join(format!("{name}-src"));
    std::fs::create_dir_all(&source).unwrap();
    std::fs::copy(programs_dir().join("go/idle_holder/main.go"), source.join("main.go")).unwrap();
    std::fs::write(source.join("go.mod"), "module idle_holder\n\ngo 1.19\n").unwrap();
    let exe = dir.join(name);
    let out = output_of(
        Command::new(go_command())
            .args(["build", "-ldflags", ldflags, "-o"])
            .arg(&exe)
            .arg(".")
            .current_dir(&source)
            .env("CGO_ENABLED", "0"),
    );
    assert!(out.status.success(), "go build failed:\n{}", text(&out.stderr));
    exe
}

/// Starts the program; returns it and the MemStats line it printed when idle.
fn start(exe: &Path, args: &[&str]) -> (Child, Value) {
    let mut child = Command::new(exe).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (child, serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
}

fn stop(mut child: Child) {
    drop(child.stdin.take());
    let status = wait_or_kill(&mut child, "the Go program");
    assert!(status.success(), "the program was changed by the snapshot: {status}");
}

fn u(value: &Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or_else(|| panic!("no {key} in {value:#}"))
}

fn within(what: &str, memgap: u64, runtime: u64, share: f64) {
    let diff = memgap.abs_diff(runtime) as f64;
    assert!(diff <= share * runtime as f64, "{what}: memgap {memgap} vs runtime {runtime} ({:.1}% apart)", diff * 100.0 / runtime as f64);
}

fn snapshot_json(dir: &Path, pid: u32) -> Value {
    let out = memgap(dir, &["snapshot", &pid.to_string(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_go_program_without_the_helper_gets_its_runtimes_split_from_outside() {
    let (_tmp, dir) = tempdir();
    let exe = build(&dir, "idle_holder", "");
    // Sparse survivors (fragmentation) and dense ones (little of it).
    for args in [&["-keep", "64"][..], &["-keep", "3", "-count", "150000"][..]] {
        let (child, memstats) = start(&exe, args);
        let snapshot = snapshot_json(&dir, child.id());
        let text_view = memgap(&dir, &["snapshot", &child.id().to_string()]);
        let map = memgap(&dir, &["map", &child.id().to_string()]);
        stop(child);
        let line = assert_one_line_failure(&map);
        assert!(line.contains("no page map"), "{line}");

        let rows = &snapshot["rows"];
        let go = &snapshot["ledger"]["go"];
        assert_eq!((snapshot["allocator"].as_str(), go["source"].as_str()), (Some("go"), Some("process memory")), "{go:#}");
        assert_eq!(snapshot["unknown_rows"], serde_json::json!([]));
        assert!(go["version"].as_str().unwrap().starts_with("go1."));
        let (heap_alloc, heap_inuse) = (u(&memstats, "HeapAlloc"), u(&memstats, "HeapInuse"));
        // The runtime's own figures, as read from memory, are its MemStats.
        within(&format!("{args:?}: heap objects vs HeapAlloc"), u(go, "heap_objects_bytes"), heap_alloc, 0.05);
        within(&format!("{args:?}: unused vs HeapInuse − HeapAlloc"), u(go, "heap_unused_bytes"), heap_inuse - heap_alloc, 0.05);
        // The rows are the recorded ledger's split of them over the resident pages.
        within(&format!("{args:?}: fragmented vs HeapInuse − HeapAlloc"), u(rows, "fragmented"), heap_inuse - heap_alloc, 0.05);
        within(&format!("{args:?}: live vs HeapAlloc"), u(rows, "live"), heap_alloc, 0.05);
        let rss = u(&snapshot, "rss_bytes");
        assert!(snapshot["residual_bytes"].as_i64().unwrap().unsigned_abs() <= rss / 50, "{snapshot:#}");
        assert!(text(&text_view.stdout).contains("read from the process's memory"), "{}", text(&text_view.stdout));
    }
}

#[test]
fn without_dwarf_or_symbols_the_heap_rows_are_not_known() {
    let (_tmp, dir) = tempdir();
    for (name, ldflags, why) in [("no_dwarf", "-w", "no DWARF"), ("stripped", "-s -w", "no symbol table")] {
        let exe = build(&dir, name, ldflags);
        let (child, _) = start(&exe, &["-count", "20000"]);
        let snapshot = snapshot_json(&dir, child.id());
        stop(child);
        assert_eq!(snapshot["unknown_rows"], serde_json::json!(["live", "slack", "fragmented", "retained"]), "{name}");
        for row in ["live", "slack", "fragmented", "retained"] {
            assert!(snapshot["rows"].get(row).is_none(), "{name}: {row} has a number: {:#}", snapshot["rows"]);
        }
        let failure = snapshot["walk_failure"].as_str().unwrap();
        assert!(failure.contains("Go runtime's accounting is not known") && failure.contains(why), "{name}: {failure}");
        assert!(snapshot["ledger"].is_null());
    }
}
