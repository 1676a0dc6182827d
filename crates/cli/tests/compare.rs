//! `memgap compare` on real programs: the remedies for glibc's per-thread
//! arenas measured on a workload built to need them
//! (tests/programs/thread_churn.c), differences in behaviour reported, bad
//! input refused.

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

const MIB: f64 = 1048576.0;

/// The keys of a configuration that are a contract.
const CONFIG_KEYS: [&str; 8] = ["name", "peak_rss_bytes", "steady_rss_bytes", "wall_seconds", "cpu_seconds", "exit_code", "repeats", "available"];

/// `memgap compare --json ARGS`, which must succeed, parsed.
fn compare_json(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec!["compare", "--json"];
    all.extend_from_slice(args);
    let out = memgap(dir, &all);
    assert_eq!(out.status.code(), Some(0), "memgap {all:?} failed:\n{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{}", text(&out.stdout)))
}

fn config<'a>(comparison: &'a Value, name: &str) -> &'a Value {
    comparison["configs"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no config {name}: {comparison:#}"))
}

/// Steady RSS of each run of a configuration.
fn steady_runs(config: &Value) -> Vec<f64> {
    config["runs"].as_array().unwrap().iter().map(|run| run["steady_rss_bytes"].as_f64().unwrap()).collect()
}

fn steady(config: &Value) -> f64 {
    config["steady_rss_bytes"].as_f64().unwrap_or_else(|| panic!("no steady RSS: {config:#}"))
}

#[test]
fn remedies_lower_the_steady_rss_of_per_thread_arenas() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "thread_churn.c");
    let c = compare_json(&dir, &["--repeat", "3", "--", arg(&program)]);
    let summary: Vec<String> = c["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("{}: steady {:?} peak {:?} runs {:?}", c["name"], c["steady_rss_bytes"], c["peak_rss_bytes"], steady_runs(c)))
        .collect();
    eprintln!("{}\nrecommendation: {}", summary.join("\n"), c["recommendation"]);

    assert!(c["recommendation"].as_str().is_some_and(|r| !r.is_empty()), "{c:#}");
    assert_eq!(c["stdin"], "/dev/null");
    assert_eq!(c["output_differs"], false, "thread_churn prints the same under every allocator: {c:#}");
    assert_eq!(c["exit_differs"], false, "{c:#}");
    for config in c["configs"].as_array().unwrap() {
        for key in CONFIG_KEYS {
            assert!(config.get(key).is_some(), "no {key} in {config:#}");
        }
        if config["available"] == true {
            assert_eq!(config["repeats"], 3, "{config:#}");
            assert_eq!(config["exit_code"], 0, "{config:#}");
            let samples = config["samples"].as_array().unwrap();
            assert!(!samples.is_empty() && samples.len() <= 200, "{} samples", samples.len());
            assert!(config["peak_rss_bytes"].as_f64().unwrap() >= steady(config), "{config:#}");
        }
    }

    // Each of the 8 arenas keeps the 8 MiB of strings of its thread's turns.
    let glibc = config(&c, "glibc");
    assert!(steady(glibc) >= 48.0 * MIB, "glibc's default should keep ~64 MiB of freed strings resident: {glibc:#}");
    // Two arenas shared by the 8 threads reuse each other's freed strings,
    // in every run.
    let glibc_lowest = steady_runs(glibc).into_iter().fold(f64::MAX, f64::min);
    let arena = config(&c, "arena-max-2");
    for run in steady_runs(arena) {
        assert!(run < 0.6 * glibc_lowest, "arena-max-2 steady {run} not clearly below glibc's {glibc_lowest}: {c:#}");
    }
    assert!(arena["steady_rss_ratio"].as_f64().unwrap() < 0.6, "{arena:#}");

    let trim = config(&c, "trim");
    assert_eq!(trim["available"], true, "the agent is built next to memgap: {trim:#}");
    for run in steady_runs(trim) {
        assert!(run < 0.6 * glibc_lowest, "trim steady {run} not clearly below glibc's {glibc_lowest}: {c:#}");
    }
}

#[test]
fn allocators_are_available_exactly_when_installed() {
    let (_tmp, dir) = tempdir();
    let c = compare_json(&dir, &["--config", "gone=LD_PRELOAD=/nonexistent/libgone.so", "--config", "mine=MALLOC_ARENA_MAX=1 MALLOC_TOP_PAD_=0", "--", "true"]);
    let installed = [("jemalloc", "libjemalloc.so.2", "libjemalloc2"), ("tcmalloc", "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"), ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0")];
    for (name, file, package) in installed {
        let config = config(&c, name);
        let present = Path::new(ALLOCATOR_DIR).join(file).is_file();
        assert_eq!(config["available"], present, "{config:#}");
        assert_eq!(config["package"], package, "{config:#}");
        assert_eq!(config["repeats"], if present { 1 } else { 0 }, "{config:#}");
    }
    let gone = config(&c, "gone");
    assert_eq!(gone["available"], false, "{gone:#}");
    assert_eq!(gone["repeats"], 0, "{gone:#}");
    assert!(gone["steady_rss_bytes"].is_null(), "{gone:#}");
    assert!(gone["note"].as_str().unwrap().contains("/nonexistent/libgone.so"), "{gone:#}");
    let mine = config(&c, "mine");
    assert_eq!((&mine["available"], &mine["repeats"]), (&Value::Bool(true), &Value::from(1)), "{mine:#}");
    assert_eq!(mine["env"]["MALLOC_TOP_PAD_"], "0", "{mine:#}");
}

#[test]
fn different_output_and_exit_status_are_reported() {
    let (_tmp, dir) = tempdir();
    let script = "echo $MALLOC_ARENA_MAX; exit ${MALLOC_ARENA_MAX:-0}";
    let c = compare_json(&dir, &["--", "sh", "-c", script]);
    assert_eq!((&c["output_differs"], &c["exit_differs"]), (&Value::Bool(true), &Value::Bool(true)), "{c:#}");
    let arena = config(&c, "arena-max-2");
    assert_eq!((&arena["output_differs"], &arena["exit_differs"], &arena["exit_code"]), (&Value::Bool(true), &Value::Bool(true), &Value::from(2)));
    assert!(arena["steady_rss_bytes"].as_u64().is_some(), "figures are still given: {arena:#}");
    let glibc = config(&c, "glibc");
    assert_eq!((&glibc["output_differs"], &glibc["exit_code"]), (&Value::Bool(false), &Value::from(0)));
    assert!(c["recommendation"].as_str().unwrap().contains("arena-max-2"), "{c:#}");

    let out = memgap(&dir, &["compare", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("! stdout DIFFERS from glibc's under: arena-max-2"), "{shown}");
    assert!(shown.contains("! exit status DIFFERS from glibc's (0) under: arena-max-2 (exit 2)"), "{shown}");
    assert!(shown.contains("stdin was /dev/null"), "{shown}");
}

#[test]
fn the_users_preload_comes_after_the_configurations() {
    let (_tmp, dir) = tempdir();
    let user_preload = "libc.so.6"; // harmless: already loaded
    let log = dir.join("preloads");
    let script = format!("echo \"$LD_PRELOAD\" >> {}", arg(&log));
    let out = output_of(memgap_cmd(&dir, &["compare", "--json", "--", "sh", "-c", &script]).env("LD_PRELOAD", user_preload));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let logged = std::fs::read_to_string(&log).unwrap();
    for line in logged.lines() {
        // Either inherited as is, or after the configuration's library.
        let ours = line.strip_suffix(user_preload).unwrap_or_else(|| panic!("the user's preload is not last: {logged}"));
        assert!(ours.is_empty() || (ours.starts_with('/') && ours.ends_with(':')), "{logged}");
    }
    assert!(logged.lines().any(|line| line.starts_with('/')), "some configuration preloads a library: {logged}");
}

#[test]
fn a_missing_command_is_one_line_and_127() {
    let (_tmp, dir) = tempdir();
    let out = memgap(&dir, &["compare", "--", "/nonexistent/memgap-test-program"]);
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(text(&out.stderr), "memgap: /nonexistent/memgap-test-program: command not found\n");
    assert!(out.stdout.is_empty());
}

#[test]
fn no_command_is_a_usage_error() {
    let (_tmp, dir) = tempdir();
    let out = memgap(&dir, &["compare", "--repeat", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Usage: memgap compare"), "{}", text(&out.stderr));
}
