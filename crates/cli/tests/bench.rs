//! The benchmark suite (`bench/run.py`) still runs end to end: every
//! workload under every tool, in its `--smoke` sizes. Nothing here is
//! timed; the suite's own checks (each profiled run prints the plain run's
//! checksum) and the event counts are what is asserted.

mod common;

use std::process::Command;

use common::{arg, memgap_bin, tempdir};
use serde_json::Value;

#[test]
fn the_benchmark_suite_runs_every_workload_under_every_tool() {
    let (_dir, out) = tempdir();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/run.py");
    let run = Command::new("python3")
        .arg(&script)
        .args(["--smoke", "--memgap", arg(&memgap_bin()), "--out", arg(&out)])
        .output()
        .expect("run python3 bench/run.py");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench/run.py --smoke failed: {}\n{stdout}\n{stderr}", run.status);
    assert!(out.join("latest.md").is_file(), "no latest.md");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("latest.json")).expect("latest.json")).expect("latest.json is JSON");
    assert_eq!(report["meta"]["sizes"], "smoke");

    let heaptrack = Command::new("heaptrack").arg("--version").output().is_ok_and(|o| o.status.success());
    let mut expected_tools = vec!["plain", "memgap", "memgap --no-stacks", "memgap --trim-only"];
    if heaptrack {
        expected_tools.push("heaptrack");
    }
    let workloads = report["workloads"].as_object().expect("workloads");
    for name in ["churn", "threads", "deep", "big", "python"] {
        assert!(workloads.contains_key(name), "workload {name} missing: {stdout}");
    }
    for (name, workload) in workloads {
        assert!(workload.get("error").is_none(), "{name}: {}", workload["error"]);
        let tools = workload["tools"].as_object().expect("tools");
        for tool in &expected_tools {
            let result = &tools[*tool];
            // A profiled run that changed the program's output or exit code is an error here.
            assert!(result.get("error").is_none(), "{name} under {tool}: {}", result["error"]);
            assert_eq!(result["runs"].as_array().map(Vec::len), Some(1), "{name} under {tool}: one measured round");
            if *tool != "plain" {
                assert!(result["cpu_ratio"].as_f64().is_some_and(|r| r > 0.0), "{name} under {tool}: no CPU ratio");
            }
            // What the program paid, apart from the recorder beside it.
            if ["memgap", "memgap --no-stacks"].contains(tool) {
                assert!(result["program_cpu_ratio"].as_f64().is_some_and(|r| r > 0.0), "{name} under {tool}: no program CPU ratio");
                assert!(result["recorder_cpu_s"].as_f64().is_some_and(|s| s >= 0.0), "{name} under {tool}: no recorder CPU");
            }
        }
        let events = |tool: &str| tools[tool]["trace"]["events"].as_u64().unwrap_or_else(|| panic!("{name} under {tool}: no event count"));
        assert!(events("memgap") > 1000, "{name}: memgap recorded {} events", events("memgap"));
        assert!(tools["memgap"]["trace"]["bytes_per_event"].as_f64().is_some_and(|b| b > 0.0));
        assert!(tools["memgap"]["trace"]["report_events_per_s"].as_f64().is_some_and(|r| r > 0.0));
        // The C workloads make the same calls every run (sqlite3 and
        // python3 vary by a few: time, hash seeds).
        if ["churn", "threads", "deep", "big"].contains(&name.as_str()) {
            assert_eq!(events("memgap"), events("memgap --no-stacks"), "{name}: recording stacks or not sees the same calls");
            if heaptrack {
                // heaptrack counts the same calls independently; it also sees the
                // couple the dynamic loader makes before memgap's first hook call.
                let (memgap, heaptrack) = (events("memgap"), events("heaptrack"));
                assert!(memgap <= heaptrack && heaptrack - memgap <= 8, "{name}: memgap {memgap} events, heaptrack {heaptrack}");
            }
        }
    }
    let targets = report["targets"].as_array().expect("targets");
    assert!(
        targets.iter().any(|t| t["target"].as_str().is_some_and(|t| t.starts_with("memgap (stacks) overhead"))),
        "no overhead target checked"
    );
    // The analysis of a 64-thread trace, and issue 31's rows, each with a figure.
    let many = &report["many_threads"];
    assert!(many.get("error").is_none(), "64-thread trace: {}", many["error"]);
    assert!(many["events"].as_u64().is_some_and(|e| e > 1000), "64-thread trace: {many}");
    assert!(many["report_peak_rss_mib"].as_f64().is_some_and(|m| m > 0.0), "64-thread trace: {many}");
    for prefix in [
        "memgap (stacks): the program's CPU",
        "memgap --no-stacks: the program's CPU",
        "first pass (memgap report",
        "analysis memory with 64 threads",
        "`blame` on the indexed trace",
        "second memgap report",
    ] {
        assert!(
            targets.iter().any(|t| t["target"].as_str().is_some_and(|t| t.starts_with(prefix)) && t["measured"].as_str().is_some()),
            "no target row {prefix:?}"
        );
    }
}
