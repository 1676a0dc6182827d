//! The trim forecast against a real malloc_trim(0): tests/programs/trim_forecast.c
//! builds a heap, asks for a snapshot, then measures its own Rss around its
//! own malloc_trim(0). The ledger's `trim_would_return_bytes` at that
//! snapshot must match what the trim returned, within 5 % or 1 MiB.

mod common;

use common::*;
use serde_json::Value;

const MIB: f64 = 1048576.0;

struct Measured {
    /// What the program's Rss dropped by over its malloc_trim(0).
    dropped: f64,
    /// The ledger at the program's snapshot right before it.
    before: Value,
    /// The ledger at the program's snapshot right after it.
    after: Value,
    rss_after: f64,
}

fn run(args: &[&str]) -> Measured {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "trim_forecast.c");
    let trace = dir.join("t.mgt");
    let mut run = vec!["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog)];
    run.extend_from_slice(args);
    let out = memgap(&dir, &run);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let figures: Vec<f64> = stdout.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    assert_eq!(figures.len(), 2, "trim_forecast printed {stdout:?}");
    let timeline = memgap(&dir, &["timeline", arg(&trace), "--json"]);
    assert!(timeline.status.success(), "{}", text(&timeline.stderr));
    let all: Value = serde_json::from_slice(&timeline.stdout).expect("timeline JSON");
    let all = all["snapshots"].as_array().unwrap().clone();
    // The program's snapshots right before and right after its trim; memgap
    // may take one of its own between them (at the Rss after the trim).
    let mut ours: Vec<Value> = all.into_iter().filter(|l| l["snapshot_reason"] == "program").collect();
    assert!(ours.len() >= 2, "snapshots: {ours:#?}");
    let after = ours.pop().unwrap();
    let before = ours
        .into_iter()
        .rev()
        .find(|l| (l["rss_bytes"].as_f64().unwrap() - figures[0]).abs() <= (0.02 * figures[0]).max(2.0 * MIB))
        .unwrap_or_else(|| panic!("no snapshot at the Rss before the trim, {}", figures[0]));
    Measured { dropped: figures[0] - figures[1], before, after, rss_after: figures[1] }
}

fn forecast(ledger: &Value) -> f64 {
    ledger["trim_would_return_bytes"].as_f64().unwrap_or_else(|| panic!("no forecast: {ledger:#}"))
}

/// Checks the forecast against the measured drop; returns both.
fn assert_forecast_matches(args: &[&str]) -> (f64, f64) {
    let m = run(args);
    let estimate = forecast(&m.before);
    let tolerance = (0.05 * m.dropped).max(MIB);
    assert!(
        (estimate - m.dropped).abs() <= tolerance,
        "{args:?}: forecast {estimate}, malloc_trim(0) returned {}: {:#}",
        m.dropped,
        m.before["heaps"]
    );
    // Right after the trim, the next one would return nothing.
    assert!(
        forecast(&m.after) <= MIB,
        "{args:?}: after the trim (Rss {}), forecast {}: {:#}",
        m.rss_after,
        forecast(&m.after),
        m.after["heaps"]
    );
    let retained = m.before["rows"]["retained"].as_f64().unwrap();
    assert_eq!(m.before["retained_not_trimmable_bytes"].as_f64().unwrap(), retained - estimate);
    (estimate, m.dropped)
}

#[test]
fn main_arena_with_strided_frees() {
    let (_, dropped) = assert_forecast_matches(&["main-strided", "16"]);
    assert!(dropped > 30.0 * MIB, "mixed sizes leave whole free pages between every 16th block: {dropped}");
    let (_, dropped) = assert_forecast_matches(&["main-strided", "64"]);
    assert!(dropped > 60.0 * MIB, "{dropped}");
}

/// Two arenas emptied: one of fastbin-sized blocks, merged into its top by
/// malloc_trim and kept; one whose binned chunks trim returns.
#[test]
fn thread_arenas_emptied() {
    let m = run(&["thread-emptied"]);
    let estimate = forecast(&m.before);
    assert!(
        (estimate - m.dropped).abs() <= (0.05 * m.dropped).max(MIB),
        "forecast {estimate}, returned {}: {:#}",
        m.dropped,
        m.before["heaps"]
    );
    let retained = m.before["rows"]["retained"].as_f64().unwrap();
    assert!(retained - estimate > 40.0 * MIB, "the fastbin arena's top stays: retained {retained}, forecast {estimate}");
}

#[test]
fn thread_arena_half_emptied() {
    let (estimate, _) = assert_forecast_matches(&["thread-half"]);
    assert!(estimate > 10.0 * MIB, "{estimate}");
}

#[test]
fn thread_arena_survivors_near_the_top() {
    let (estimate, _) = assert_forecast_matches(&["thread-top"]);
    assert!(estimate > 30.0 * MIB, "{estimate}");
}

#[test]
fn thread_arena_survivors_near_the_start() {
    assert_forecast_matches(&["thread-start"]);
}

#[test]
fn thread_arena_of_several_heaps() {
    let (estimate, _) = assert_forecast_matches(&["thread-heaps"]);
    assert!(estimate > 100.0 * MIB, "the first heap's free tail is a binned chunk: {estimate}");
}

#[test]
fn after_the_programs_own_malloc_trim() {
    let (estimate, _) = assert_forecast_matches(&["after-trim"]);
    assert!(estimate > 5.0 * MIB, "{estimate}");
}

/// `memgap trim PID` on a traced program holding a thread arena whose free
/// space sits below its survivors: what it measures is what the ledger said.
#[test]
fn memgap_trim_agrees_with_the_forecast() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "trim_forecast.c");
    let trace = dir.join("t.mgt");
    let mut cmd = memgap_cmd(&dir, &["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog), "hold-thread-top"]);
    let mut target = Background::start(&mut cmd, 1);
    let pid = target.printed("pid");
    let out = memgap(&dir, &["trim", &pid.to_string(), "--json"]);
    assert!(out.status.success(), "memgap trim: {}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("trim JSON");
    // SAFETY: no memory precondition; the program this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = target.child.wait().expect("memgap run ends");
    assert!(status.success(), "{status:?}");
    let timeline = memgap(&dir, &["timeline", arg(&trace), "--json"]);
    let all: Value = serde_json::from_slice(&timeline.stdout).expect("timeline JSON");
    let all = all["snapshots"].as_array().unwrap();
    let before = all.iter().find(|l| l["snapshot_reason"] == "program").expect("the program's snapshot");
    let estimate = forecast(before);
    let returned = report["heap_returned_bytes"].as_f64().expect("heap_returned_bytes");
    assert!(estimate > 30.0 * MIB, "{estimate}");
    assert!((estimate - returned).abs() <= (0.05 * returned).max(MIB), "forecast {estimate}, memgap trim measured {report:#}");
}
