//! `memgap timeline`: the live heap at event resolution. A program that
//! frees most of its heap at a known moment, recorded with snapshots a
//! second apart, shows its live line falling at that moment (not at the
//! next snapshot), to the bytes the program says it kept.

mod common;

use common::*;
use serde_json::Value;

const MIB: f64 = 1048576.0;

/// `frees_at` run under memgap: its own figures (held, kept, free_begin, free_end) and the trace's timeline.
fn frees_at(dir: &std::path::Path) -> (std::collections::HashMap<String, f64>, Value, String) {
    let prog = compile(dir, "frees_at.c");
    let trace = dir.join("t.mgt");
    let out = memgap(dir, &["run", "--quiet", "--snapshot-interval", "1", "-o", arg(&trace), "--", arg(&prog), "400", "1200"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let figures =
        text(&out.stdout).lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k.to_string(), v.parse::<f64>().unwrap())).collect();
    let json = memgap(dir, &["timeline", arg(&trace), "--json"]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let table = memgap(dir, &["timeline", arg(&trace), "--color", "never"]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    (figures, serde_json::from_slice(&json.stdout).expect("timeline JSON"), text(&table.stdout))
}

#[test]
fn the_live_line_falls_when_the_program_frees() {
    let (_tmp, dir) = tempdir();
    let (program, timeline, table) = frees_at(&dir);
    let (held, kept, free_begin, free_end) = (program["held"], program["kept"], program["free_begin"], program["free_end"]);
    let live: Vec<(f64, f64)> = timeline["live_bytes"]
        .as_array()
        .expect("a live_bytes series")
        .iter()
        .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    assert!(live.len() > 20 && live.len() <= 8001, "{} points", live.len());
    assert!(live.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");

    // Against the program's own count: the high is what it held (plus libc's
    // and its pointer array's few hundred KiB), the end what it kept.
    let high = live.iter().map(|p| p.1).fold(0.0, f64::max);
    assert!(high >= held && high < held + MIB, "high {high} for {held} held");
    let end = live.last().unwrap().1;
    assert!(end >= kept && end < kept + MIB, "end {end} for {kept} kept");

    // The fall: the last point at the high and the first at the kept level.
    let last_high = live.iter().rposition(|p| p.1 >= held).unwrap();
    let fallen = last_high + live[last_high..].iter().position(|p| p.1 < kept + MIB).expect("the live line falls");
    let (fall_began, fallen_at) = (live[last_high + 1].0, live[fallen].0);
    // Times since the process began are later than the program's own (since
    // main began) by its start-up, a few ms; an event's time is when the
    // recorder's round began (a few ms earlier); the frees took under 50 ms.
    const ROUND: f64 = 0.02;
    assert!(fall_began >= free_begin - ROUND, "the live line fell at {fall_began} s, before the program freed at {free_begin} s");
    assert!(
        fallen_at >= free_end - ROUND && fallen_at < free_end + 0.3,
        "fallen at {fallen_at} s; the program freed from {free_begin} to {free_end} s"
    );
    assert!(fallen_at - fall_began < 0.1, "a sharp fall: {fall_began} s to {fallen_at} s");
    // Nothing but the live line says so until the next periodic snapshot, long after.
    let next_periodic = timeline["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["snapshot_reason"] == "periodic")
        .map(|l| l["at_seconds"].as_f64().unwrap())
        .find(|&t| t > fallen_at);
    assert!(next_periodic.is_none_or(|t| t > fallen_at + 0.3), "periodic snapshot at {next_periodic:?}, the fall at {fallen_at}");
    let exit = timeline["snapshots"].as_array().unwrap().last().unwrap();
    assert_eq!(exit["snapshot_reason"], "exit");
    assert!(exit["at_seconds"].as_f64().unwrap() > fallen_at + 1.0, "the program slept 1.2 s after freeing");

    // VmRSS, sampled: the freed 4 KiB blocks stay resident (one in sixteen kept on every page's neighbours).
    let rss: Vec<(f64, f64)> =
        timeline["vm_rss"].as_array().unwrap().iter().map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap())).collect();
    assert!(rss.iter().any(|p| p.1 >= held), "VmRSS {rss:?}");

    // The report draws the same series.
    let html = dir.join("t.html");
    let out = memgap(&dir, &["report", arg(&dir.join("t.mgt")), "-o", arg(&html)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    let data = page
        .split("<script type=\"application/json\" id=\"data\">")
        .nth(1)
        .and_then(|rest| rest.split("</script>").next())
        .expect("the report's data");
    let data: Value = serde_json::from_str(data).unwrap();
    assert_eq!(data["live_heap"], timeline["live_bytes"], "the report's live heap line and the timeline's");

    // The text form says the same.
    let line = table.lines().find(|l| l.starts_with("the live heap fell most from ")).unwrap_or_else(|| panic!("{table}"));
    let seconds: Vec<f64> = line.split(" at ").skip(1).filter_map(|part| part.split(' ').next()?.parse().ok()).collect();
    assert_eq!(seconds.len(), 2, "{line}");
    assert!(
        seconds[1] >= free_end - ROUND && seconds[1] < free_end + 0.3 && seconds[0] <= seconds[1],
        "{line}; freed from {free_begin} to {free_end} s"
    );
    let strip = table.lines().find(|l| l.trim_start().starts_with("live  ")).unwrap_or_else(|| panic!("{table}"));
    assert!(strip.contains('█') && strip.trim_end().ends_with('▁'), "{table}");
}

/// A plateau after mass frees, shorter than the snapshot interval and over
/// before the exit (the program allocates again): RSS stays where it was,
/// so no peak snapshot shows it, and the default interval (1 s) misses it.
/// The recorder sees the live heap fall and takes a snapshot on it, whose
/// rows add up to VmRSS like any other's. Periodic snapshots are off: on a
/// loaded machine one may land on the plateau first, and the fall is then
/// measured from it.
#[test]
fn a_plateau_after_mass_frees_gets_a_snapshot() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "frees_at.c");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog), "400", "300", "refill"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let program: std::collections::HashMap<String, f64> =
        text(&out.stdout).lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k.to_string(), v.parse::<f64>().unwrap())).collect();
    let (held, kept, free_begin, free_end, refilled) =
        (program["held"], program["kept"], program["free_begin"], program["free_end"], program["refilled"]);
    let json = memgap(&dir, &["timeline", arg(&trace), "--json"]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let timeline: Value = serde_json::from_slice(&json.stdout).unwrap();
    let snapshots = timeline["snapshots"].as_array().unwrap();
    let live_of = |s: &Value| s["rows"]["live"].as_f64().unwrap();
    let summary: Vec<String> =
        snapshots.iter().map(|s| format!("{} at {:.3} s: live {}", s["snapshot_reason"], s["at_seconds"], live_of(s))).collect();

    // Exactly one snapshot on the plateau, the one the fall made: the live
    // heap there is what the program says it kept (plus libc's and its
    // pointer array's few hundred KiB). Times since the process began are
    // later than the program's own by its start-up.
    let after_frees = snapshots.iter().filter(|s| s["at_seconds"].as_f64().unwrap() >= free_begin - 0.02);
    let on_plateau: Vec<&Value> = after_frees.filter(|s| live_of(s) < kept + MIB).collect();
    assert_eq!(on_plateau.len(), 1, "{summary:#?}");
    let drop = on_plateau[0];
    assert_eq!(drop["snapshot_reason"], "live drop", "{summary:#?}");
    assert!(live_of(drop) >= kept, "{summary:#?}");
    let at = drop["at_seconds"].as_f64().unwrap();
    assert!(at >= free_end - 0.02 && at <= refilled + 0.02, "at {at} s; freed by {free_end} s, refilled by {refilled} s: {summary:#?}");
    // The exit sees the heap refilled: without the fall's snapshot, none shows the plateau.
    let exit = snapshots.last().unwrap();
    assert_eq!(exit["snapshot_reason"], "exit");
    assert!(live_of(exit) >= held, "{summary:#?}");

    // Its rows add up to VmRSS, as the kernel counted it then.
    let rss = drop["rss_bytes"].as_f64().unwrap();
    let rows: f64 = drop["rows"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
    assert!((rows - rss).abs() <= rss * 0.02, "rows {rows} for VmRSS {rss}");
    assert!(drop["residual_bytes"].as_f64().unwrap().abs() <= rss * 0.02, "{drop:#}");
    // The freed blocks stay resident (a kept block on each 64 KiB): RSS did not fall.
    assert!(rss >= held, "VmRSS {rss} after freeing");
}
