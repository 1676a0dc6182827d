//! Recorded traces with the answers memgap gave for them: one trace per
//! heap owner (glibc's main and thread arenas, jemalloc, tcmalloc, mimalloc,
//! Go, GHC, pymalloc, Ruby, Node) and one of trace format 1.0, in
//! tests/fixtures/traces. Each is read with `summary`, `ledger` (default
//! moment and `--at peak`: a runtime's heap may be gone by the moment
//! chosen by default, as V8's is by Node's exit) and `blame`, as JSON, and
//! compared with `<name>.expected.json` beside it, so a change in what any
//! command answers for a trace shows up as a diff to review. How each trace
//! was recorded: tests/fixtures/record-traces.sh. After a change meant to alter the
//! answers:
//!
//!     MEMGAP_UPDATE_FIXTURES=1 cargo test --release --test fixtures
//!
//! rewrites the expected files (review them with `git diff`).
//!
//! The programs these traces name are gone (recorded from a temporary
//! directory), so their frames read `module+offset` everywhere; the system
//! libraries' frames are named only where the library is the very one
//! recorded (same build-id: Debian 12's), elsewhere they read
//! `module+offset` too, and blame is then compared by its sizes alone.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/traces")
}

fn answer(dir: &Path, args: &[&str]) -> Value {
    let out = memgap(dir, args);
    assert!(out.status.success(), "memgap {args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("memgap {args:?}: not JSON: {e}"))
}

fn answers(dir: &Path, trace: &str) -> Value {
    json!({
        "summary": answer(dir, &["summary", trace, "--json"]),
        "ledger": answer(dir, &["ledger", trace, "--json"]),
        "ledger_at_peak": answer(dir, &["ledger", trace, "--json", "--at", "peak"]),
        "blame": answer(dir, &["blame", trace, "--json"]),
        "blame_by_stack": stack_sums(&answer(dir, &["blame", trace, "--json", "--per-stack", "--top", "1000000"])),
    })
}

/// Blame per call stack, summed: how many stacks, their objects, live and
/// fragmented bytes, and the ten largest fragmentations. Frames' names
/// choose the sites, not the stacks, so this stays the same on a machine
/// whose system libraries are not the recorded ones.
fn stack_sums(blame: &Value) -> Value {
    let entries = blame.as_array().map(Vec::as_slice).unwrap_or_default();
    let sum = |field: &str| entries.iter().filter_map(|e| e[field].as_u64()).sum::<u64>();
    let mut fragmentation: Vec<u64> = entries.iter().filter_map(|e| e["fragmentation_bytes"].as_u64()).collect();
    fragmentation.sort_unstable_by(|a, b| b.cmp(a));
    fragmentation.truncate(10);
    json!({
        "stacks": entries.len(),
        "objects": sum("objects"),
        "live_bytes": sum("live_bytes"),
        "fragmentation_bytes": sum("fragmentation_bytes"),
        "largest_fragmentation": fragmentation,
    })
}

/// Where two answers first differ, as a JSON path.
fn first_difference(expected: &Value, got: &Value, path: &str) -> Option<String> {
    match (expected, got) {
        (Value::Object(a), Value::Object(b)) => {
            a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))).find_map(|key| match (a.get(key), b.get(key)) {
                (Some(x), Some(y)) => first_difference(x, y, &format!("{path}.{key}")),
                (x, y) => Some(format!("{path}.{key}: expected {}, got {}", show(x), show(y))),
            })
        }
        (Value::Array(a), Value::Array(b)) => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{path}[{i}]")))
            .or_else(|| (a.len() != b.len()).then(|| format!("{path}: expected {} items, got {}", a.len(), b.len()))),
        _ => (expected != got).then(|| format!("{path}: expected {expected}, got {got}")),
    }
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".to_string(), |v| v.to_string().chars().take(200).collect())
}

/// Whether blame could name the system libraries' frames: it notes every
/// module it could not (the programs' own are gone on purpose).
fn libraries_are_the_recorded_ones(dir: &Path, trace: &str) -> bool {
    let out = memgap(dir, &["blame", trace]);
    !text(&out.stdout)
        .lines()
        .any(|line| line.trim_start().starts_with("note: /") && ["/lib/", "/lib64/", "/usr/"].iter().any(|dir| line.contains(dir)))
}

#[test]
fn every_fixture_gets_its_expected_answers() {
    let dir = fixtures_dir();
    let update = std::env::var_os("MEMGAP_UPDATE_FIXTURES").is_some();
    let mut traces: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/traces")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".mgt"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 11, "{traces:?}");
    let mut failures = Vec::new();
    for trace in &traces {
        let got = answers(&dir, trace);
        let expected_path = dir.join(trace.replace(".mgt", ".expected.json"));
        if update {
            std::fs::write(&expected_path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
            continue;
        }
        let expected: Value = match std::fs::read(&expected_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", expected_path.display())),
            Err(e) => panic!("{}: {e}; run MEMGAP_UPDATE_FIXTURES=1 cargo test --release --test fixtures", expected_path.display()),
        };
        let (mut expected, mut got) = (expected, got);
        if !libraries_are_the_recorded_ones(&dir, trace) {
            // Unnamed frames group the stacks into other sites.
            eprintln!("{trace}: this machine's system libraries are not the recorded ones; blame is compared by its stacks");
            expected["blame"] = Value::Null;
            got["blame"] = Value::Null;
        }
        if let Some(difference) = first_difference(&expected, &got, trace) {
            failures.push(difference);
        }
    }
    assert!(
        failures.is_empty(),
        "answers changed (if meant: MEMGAP_UPDATE_FIXTURES=1 cargo test --release --test fixtures, then review git diff tests/fixtures):\n{}",
        failures.join("\n")
    );
}

/// A trace of format 1.0 (before events could omit a repeated time) reads
/// as a recorded run: its events, snapshots and exit.
#[test]
fn a_format_one_trace_reads_whole() {
    let dir = fixtures_dir();
    let trace = "format-1.0-glibc.mgt";
    assert_eq!(&std::fs::read(dir.join(trace)).unwrap()[8..10], &1u16.to_le_bytes(), "the fixture is a 1.0 trace");
    let summary = answer(&dir, &["summary", trace, "--json"]);
    // owners_churn main 8: 8 MiB of 1000-byte blocks (a multiple of 512), all but one in 512 freed.
    let blocks = (8 << 20) / 1000 / 512 * 512;
    assert!(events(&summary, "malloc") >= blocks, "{summary:#}");
    assert!(events(&summary, "free") >= blocks - blocks / 512, "{summary:#}");
    let ledger = answer(&dir, &["ledger", trace, "--json", "--at", "end"]);
    assert!(ledger["rows"]["retained"].as_u64().unwrap() > 4 << 20, "{ledger:#}");
}

/// Every heap owner the model knows has a fixture in which it holds memory:
/// a share with bytes in some expected ledger (default moment or peak).
#[test]
fn every_owner_holds_memory_in_some_fixture() {
    let dir = fixtures_dir();
    let mut holding: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/fixtures/traces").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".expected.json") {
            continue;
        }
        let expected: Value = serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        for ledger in [&expected["ledger"], &expected["ledger_at_peak"]] {
            for share in ledger["owners"].as_array().into_iter().flatten() {
                let bytes: u64 = share["rows"].as_object().into_iter().flatten().filter_map(|(_, v)| v.as_u64()).sum();
                if bytes > 0 {
                    holding.push(share["owner"].as_str().unwrap_or_default().to_string());
                }
            }
        }
    }
    let missing: Vec<&str> =
        memgap_model::registry::registered().iter().map(|owner| owner.name()).filter(|name| !holding.iter().any(|h| h == name)).collect();
    assert!(missing.is_empty(), "no fixture in which these owners hold memory: {missing:?}");
}
