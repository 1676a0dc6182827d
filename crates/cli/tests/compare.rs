//! `memgap compare` on real programs: the remedies for glibc's per-thread
//! arenas measured on a workload built to need them
//! (tests/programs/thread_churn.c) behind a line that changes every run,
//! differences in behaviour reported only where the default agrees with
//! itself, "within noise" where nothing helps (holds_live.c), jemalloc's
//! decay seen in final RSS (decay.c), bad input refused.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

const MIB: f64 = 1048576.0;

/// The keys of a configuration that are a contract.
const CONFIG_KEYS: [&str; 12] = [
    "name",
    "peak_rss_bytes",
    "steady_rss_bytes",
    "final_rss_bytes",
    "settle_seconds",
    "spread",
    "output_differs_lines",
    "wall_seconds",
    "cpu_seconds",
    "exit_code",
    "repeats",
    "available",
];

/// `memgap compare --json ARGS`, which must succeed, parsed.
fn compare_json(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec!["compare", "--json"];
    all.extend_from_slice(args);
    let out = memgap(dir, &all);
    assert_eq!(out.status.code(), Some(0), "memgap {all:?} failed:\n{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{}", text(&out.stdout)))
}

fn config<'a>(comparison: &'a Value, name: &str) -> &'a Value {
    comparison["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no config {name}: {comparison:#}"))
}

/// Steady RSS of each run of a configuration.
fn steady_runs(config: &Value) -> Vec<f64> {
    config["runs"].as_array().unwrap().iter().map(|run| run["steady_rss_bytes"].as_f64().unwrap()).collect()
}

fn steady(config: &Value) -> f64 {
    config["steady_rss_bytes"].as_f64().unwrap_or_else(|| panic!("no steady RSS: {config:#}"))
}

fn final_rss(config: &Value) -> f64 {
    config["final_rss_bytes"].as_f64().unwrap_or_else(|| panic!("no final RSS: {config:#}"))
}

/// thread_churn behind a line with the time and the pid, which changes
/// every run: the remedies must still be recommended.
#[test]
fn remedies_lower_the_steady_rss_of_per_thread_arenas() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "thread_churn.c");
    let script = format!("echo \"started at $(date +%T.%N), pid $$\"; exec {}", arg(&program));
    let c = compare_json(&dir, &["--", "sh", "-c", &script]);
    let summary: Vec<String> = c["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("{}: steady {:?} peak {:?} runs {:?}", c["name"], c["steady_rss_bytes"], c["peak_rss_bytes"], steady_runs(c)))
        .collect();
    eprintln!("{}\nrecommendation: {}", summary.join("\n"), c["recommendation"]);

    assert!(c["recommendation"]["text"].as_str().is_some_and(|r| !r.is_empty()), "{c:#}");
    assert_eq!(c["recommendation"]["metric"], "steady");
    assert_eq!(c["stdin"], "/dev/null");
    assert_eq!(c["baseline_varying_lines"], 1, "the start line varies between the default's own runs: {c:#}");
    assert_eq!(c["output_differs"], false, "thread_churn prints the same under every allocator, the start line aside: {c:#}");
    assert_eq!(c["exit_differs"], false, "{c:#}");
    for config in c["configs"].as_array().unwrap() {
        for key in CONFIG_KEYS {
            assert!(config.get(key).is_some(), "no {key} in {config:#}");
        }
        if config["available"] == true {
            // The default also runs first and last.
            let expected = if config["name"] == "glibc" { 3..=4 } else { 3..=3 };
            assert!(expected.contains(&config["repeats"].as_u64().unwrap()), "3 runs by default for a short command: {config:#}");
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
    // Its first malloc_trim, at 1 s, falls inside the steady window (how far
    // inside depends on how busy the machine is); the final one comes after
    // it: the final RSS is the trimmed one, far below glibc's.
    let trim_lowest = steady_runs(trim).into_iter().fold(f64::MAX, f64::min);
    assert!(final_rss(trim) <= 1.05 * trim_lowest && final_rss(trim) < 0.3 * steady(glibc), "{trim:#}");

    // A configuration that lowers RSS is named, with how sure it is.
    let recommended = c["recommended"].as_str().unwrap_or_else(|| panic!("no configuration recommended: {c:#}"));
    assert_ne!(recommended, "glibc");
    assert!(steady(config(&c, recommended)) < 0.6 * steady(glibc), "{c:#}");
    assert_eq!(c["recommendation"]["config"], recommended);
    assert!(["high", "low"].contains(&c["recommendation"]["confidence"].as_str().unwrap()), "{c:#}");
}

#[test]
fn a_program_no_remedy_helps_is_within_noise() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "holds_live.c");
    let c = compare_json(&dir, &["--only", "arena-max-2,trim", "--", arg(&program)]);
    let names: Vec<&str> =
        c["configs"].as_array().unwrap().iter().filter(|c| c["available"] == true).map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["glibc", "arena-max-2", "trim"]);
    // All hold the same 32 MiB: the kernel's figure within a few percent.
    for name in names {
        let ratio = steady(config(&c, name)) / steady(config(&c, "glibc"));
        assert!((0.95..1.05).contains(&ratio), "{name}: {ratio}: {c:#}");
    }
    assert_eq!(c["recommended"], Value::Null, "{c:#}");
    assert_eq!(c["recommendation"]["confidence"], "within noise", "{c:#}");
    assert!(c["recommendation"]["text"].as_str().unwrap().contains("within noise"), "{c:#}");
    let spread = &config(&c, "glibc")["spread"]["steady_rss_bytes"];
    assert!(spread["min"].as_f64().unwrap() <= spread["max"].as_f64().unwrap(), "{spread}");
}

/// jemalloc keeps freed pages until their decay time: 400 ms here (10 s by
/// default, which the run is too short to see).
#[test]
fn jemalloc_decay_shows_as_final_rss_under_steady() {
    let library = Path::new(ALLOCATOR_DIR).join("libjemalloc.so.2");
    assert!(library.is_file(), "{} is missing (apt install libjemalloc2)", library.display());
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "decay.c");
    let decaying = format!("je-decay=LD_PRELOAD={} MALLOC_CONF=dirty_decay_ms:400,muzzy_decay_ms:0", library.display());
    let c = compare_json(
        &dir,
        &["--repeat", "1", "--metric", "final", "--config", &decaying, "--only", "je-decay,jemalloc", "--", arg(&program)],
    );
    let decayed = config(&c, "je-decay");
    assert!(final_rss(decayed) < 0.6 * steady(decayed), "the burst freed at 0.8 s is purged by the end: {decayed:#}");
    assert!(decayed["settle_seconds"].as_f64().unwrap() > 0.8, "RSS settles only after the burst is freed: {decayed:#}");
    assert!(final_rss(decayed) < 0.5 * final_rss(config(&c, "jemalloc")), "jemalloc's default decay keeps it: {c:#}");
    assert_eq!(c["recommendation"]["metric"], "final");
    assert!(c["recommendation"]["text"].as_str().unwrap().contains("final RSS"), "{c:#}");
}

#[test]
fn allocators_are_available_exactly_when_installed() {
    let (_tmp, dir) = tempdir();
    let c = compare_json(
        &dir,
        &[
            "--repeat",
            "1",
            "--config",
            "gone=LD_PRELOAD=/nonexistent/libgone.so",
            "--config",
            "mine=MALLOC_ARENA_MAX=1 MALLOC_TOP_PAD_=0",
            "--",
            "true",
        ],
    );
    let installed = [
        ("jemalloc", "libjemalloc.so.2", "libjemalloc2"),
        ("tcmalloc", "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
        ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0"),
    ];
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

/// A line of the time, which differs in every run, then one that only
/// arena-max-2 changes: that configuration alone is flagged, on that line.
#[test]
fn different_output_and_exit_status_are_reported() {
    let (_tmp, dir) = tempdir();
    let script = "date +%s%N; echo \"arenas ${MALLOC_ARENA_MAX:-8}\"; exit ${MALLOC_ARENA_MAX:-0}";
    let c = compare_json(&dir, &["--", "sh", "-c", script]);
    assert_eq!((&c["output_differs"], &c["exit_differs"]), (&Value::Bool(true), &Value::Bool(true)), "{c:#}");
    let arena = config(&c, "arena-max-2");
    assert_eq!(
        (&arena["output_differs"], &arena["exit_differs"], &arena["exit_code"]),
        (&Value::Bool(true), &Value::Bool(true), &Value::from(2))
    );
    assert_eq!(arena["output_differs_lines"], 1, "{arena:#}");
    assert_eq!(arena["output_diff"][0], serde_json::json!({"line": 2, "expected": "arenas 8", "got": "arenas 2"}));
    for other in c["configs"].as_array().unwrap().iter().filter(|c| c["name"] != "arena-max-2" && c["available"] == true) {
        assert_eq!(other["output_differs"], false, "only the time differs there: {other:#}");
    }
    assert!(arena["steady_rss_bytes"].as_u64().is_some(), "figures are still given: {arena:#}");
    let glibc = config(&c, "glibc");
    assert_eq!((&glibc["output_differs"], &glibc["exit_code"]), (&Value::Bool(false), &Value::from(0)));
    assert!(c["recommendation"]["text"].as_str().unwrap().contains("arena-max-2"), "{c:#}");

    let out = memgap(&dir, &["compare", "--repeat", "1", "--show-diff", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("! stdout DIFFERS from glibc's where its own runs agree under: arena-max-2 (1 lines)"), "{shown}");
    assert!(shown.contains("arena-max-2 line 2: glibc printed \"arenas 8\", arena-max-2 printed \"arenas 2\""), "{shown}");
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
fn ignore_output_and_output_regex() {
    let (_tmp, dir) = tempdir();
    let script = "echo \"arenas ${MALLOC_ARENA_MAX:-8}\"";
    let c = compare_json(&dir, &["--repeat", "1", "--only", "arena-max-2", "--ignore-output", "--", "sh", "-c", script]);
    assert_eq!((&c["output_differs"], &c["output_check"]), (&Value::Bool(false), &Value::from("ignored")), "{c:#}");
    let c = compare_json(&dir, &["--repeat", "1", "--only", "arena-max-2", "--output-regex", "arenas [0-9]+", "--", "sh", "-c", script]);
    assert_eq!(c["output_differs"], false, "{c:#}");
    let c = compare_json(&dir, &["--repeat", "1", "--only", "arena-max-2", "--output-regex", "nothing", "--", "sh", "-c", script]);
    assert_eq!(c["output_differs"], true, "{c:#}");
    let out = memgap(&dir, &["compare", "--output-regex", "(", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).starts_with("memgap: --output-regex \"(\""), "{}", text(&out.stderr));
    let out = memgap(&dir, &["compare", "--only", "nosuch", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--only nosuch: no such configuration"), "{}", text(&out.stderr));
}

/// A trace whose ledger names no remedy (nothing retained: holds_live
/// frees nothing), and a file that is no trace: one line each, exit 1,
/// nothing run.
#[test]
fn remedies_of_a_trace_without_any_are_refused_in_one_line() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "holds_live.c");
    let recorded = memgap(&dir, &["run", "-q", "-o", "t.mgt", "--", arg(&program), "8", "50"]);
    assert!(recorded.status.success(), "{}", text(&recorded.stderr));
    let marker = dir.join("ran");
    let script = format!("touch {}", arg(&marker));
    for trace in ["t.mgt", "nosuch.mgt"] {
        let out = memgap(&dir, &["compare", "--remedies", trace, "--", "sh", "-c", &script]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let error = text(&out.stderr);
        assert!(error.starts_with(&format!("memgap: {trace}")) && error.lines().count() == 1, "{error}");
        assert!(!marker.exists(), "the command ran");
    }
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

/// `compare --remedies TRACE` runs the remedies the trace's ledger names
/// against the program as it is, keeps what each measured beside the trace,
/// and the trace's ledger then puts the measured ones first and recommends
/// none that did not measure lower.
#[test]
fn remedies_of_a_trace_are_measured_and_rank_the_ledgers_remedies() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "thread_churn.c");
    let recorded = memgap(&dir, &["run", "-q", "-o", "t.mgt", "--", arg(&program)]);
    assert!(recorded.status.success(), "{}", text(&recorded.stderr));
    let ledger = |dir: &Path| -> Value {
        let out = memgap(dir, &["ledger", "--json", "t.mgt"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let before = ledger(&dir);
    let offered: Vec<&Value> = before["remedies"].as_array().unwrap().iter().collect();
    assert!(offered.iter().all(|r| r.get("measured").is_none()), "{before:#}");
    let runnable: Vec<&str> =
        offered.iter().filter(|r| r["env"].as_object().is_some_and(|e| !e.is_empty())).map(|r| r["id"].as_str().unwrap()).collect();
    assert!(runnable.contains(&"glibc-trim"), "{:#}", before["remedies"]);

    let c = compare_json(&dir, &["--repeat", "2", "--remedies", "t.mgt", "--", arg(&program)]);
    let names: Vec<&str> =
        c["configs"].as_array().unwrap().iter().filter(|c| c["available"] == true).map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names[0], "default");
    assert_eq!(&names[1..], &runnable[..], "one configuration per remedy, in the ledger's order");
    let default = steady(config(&c, "default"));
    // 8 arenas keep ~64 MiB of freed strings; the trim library returns them.
    assert!(steady(config(&c, "glibc-trim")) < 0.5 * default, "{c:#}");

    let kept = dir.join("t.remedies.json");
    let mode = std::fs::metadata(&kept).unwrap_or_else(|e| panic!("{}: {e}; notes {:#}", kept.display(), c["notes"]));
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777, 0o600);

    let after = ledger(&dir);
    let remedies = after["remedies"].as_array().unwrap();
    assert_eq!(remedies.len(), offered.len(), "{after:#}");
    let mut group = 0;
    for remedy in remedies {
        let id = remedy["id"].as_str().unwrap();
        let measured = &remedy["measured"];
        let this_group = match measured["outcome"].as_str() {
            Some("lower") => 0,
            None => 1,
            Some(_) => 2,
        };
        assert!(this_group >= group, "measured-lower remedies first, then those not measured, then the others: {remedies:#?}");
        group = this_group;
        if runnable.contains(&id) {
            // What compare measured, as it measured it.
            assert_eq!(measured["bytes"].as_f64().unwrap(), steady(config(&c, id)), "{remedy:#}");
            assert_eq!(measured["default_bytes"].as_f64().unwrap(), default, "{remedy:#}");
            assert_eq!(measured["metric"], "steady");
        } else {
            assert!(measured.is_null(), "{remedy:#}");
        }
    }
    assert_eq!(remedies[0]["measured"]["outcome"], "lower", "{remedies:#?}");
    let verdict = after["verdict"].as_str().unwrap();
    let tries = verdict.split(" Measured with memgap compare and not recommended").next().unwrap();
    for remedy in remedies.iter().filter(|r| r["measured"]["outcome"].as_str().is_some_and(|o| o != "lower")) {
        assert!(
            !tries.contains(remedy["description"].as_str().unwrap()),
            "the verdict recommends {} which measured {}: {verdict}",
            remedy["id"],
            remedy["measured"]["outcome"]
        );
        assert!(verdict.contains(remedy["id"].as_str().unwrap()), "{verdict}");
    }
    assert!(tries.contains("(measured: steady RSS"), "{verdict}");
}

/// The CPUs a process may run on, as the kernel lists them.
const ALLOWED_CPUS: &str = "grep Cpus_allowed_list /proc/self/status";

/// `--wrap` runs the command under another program: taskset narrows the
/// CPUs the kernel lets it use (its own /proc status shows it), `--config`
/// adds environment to the same configuration, and a wrapper that is not
/// installed, or that cannot run `true`, is listed as unavailable with why.
#[test]
fn a_wrapping_configuration_runs_the_command_under_its_program() {
    let (_tmp, dir) = tempdir();
    let script = format!("{ALLOWED_CPUS}; echo \"tag ${{MEMGAP_TEST_TAG:-none}}\"");
    let c = compare_json(
        &dir,
        &[
            "--repeat",
            "1",
            "--only",
            "cpu0,gone,refused",
            "--wrap",
            "cpu0=taskset -c 0",
            "--config",
            "cpu0=MEMGAP_TEST_TAG=wrapped",
            "--wrap",
            "gone=memgap-no-such-wrapper --fast",
            "--wrap",
            "refused=false",
            "--show-diff",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let cpu0 = config(&c, "cpu0");
    assert_eq!(cpu0["wrapper"], serde_json::json!(["taskset", "-c", "0"]), "{cpu0:#}");
    assert_eq!(cpu0["env"]["MEMGAP_TEST_TAG"], "wrapped", "{cpu0:#}");
    assert_eq!(
        (&cpu0["available"], &cpu0["repeats"], &cpu0["exit_code"]),
        (&Value::Bool(true), &Value::from(1), &Value::from(0)),
        "{cpu0:#}"
    );
    let got: Vec<&str> = cpu0["output_diff"].as_array().unwrap().iter().filter_map(|d| d["got"].as_str()).collect();
    assert!(got.contains(&"tag wrapped"), "the configuration's environment reached the command: {cpu0:#}");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus > 1 {
        assert!(
            got.iter().any(|line| line.starts_with("Cpus_allowed_list:") && line.ends_with("\t0")),
            "taskset ran the command on CPU 0 alone: {cpu0:#}"
        );
    }
    let glibc = config(&c, "glibc");
    assert_eq!(glibc["wrapper"], serde_json::json!([]), "{glibc:#}");
    let gone = config(&c, "gone");
    assert_eq!((&gone["available"], &gone["repeats"]), (&Value::Bool(false), &Value::from(0)), "{gone:#}");
    assert_eq!(gone["note"], "memgap-no-such-wrapper: command not found", "{gone:#}");
    let refused = config(&c, "refused");
    assert_eq!(refused["available"], false, "`false true` fails: {refused:#}");
    assert!(refused["note"].as_str().unwrap().starts_with("`false /"), "{refused:#}");

    let out = memgap(&dir, &["compare", "--repeat", "1", "--only", "cpu0", "--wrap", "cpu0=taskset -c 0", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("cpu0: taskset -c 0 CMD"), "{}", text(&out.stdout));
    let bad = memgap(&dir, &["compare", "--wrap", "cpu0=", "--", "true"]);
    assert!(assert_one_line_failure(&bad).contains("--wrap cpu0: no program to run the command under"), "{}", text(&bad.stderr));
}

/// The machine's NUMA nodes, as sysfs lists them (1 without NUMA).
fn numa_nodes() -> usize {
    std::fs::read_dir("/sys/devices/system/node").map_or(1, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().strip_prefix("node").is_some_and(|n| n.parse::<u32>().is_ok()))
            .count()
            .max(1)
    })
}

/// numactl's policies wrap the command and GHC's --numa is offered only to
/// a GHC program whose RTS takes it. On one node they are left out unless
/// asked for (said in a note); asked for, they run, and every run's first
/// touches are sampled: at least one per page the program writes, all on
/// the one node, which the notes call trivially local.
#[test]
fn numa_configurations_and_their_first_touch_figures() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "numa_touch.c");
    let nodes = numa_nodes();
    let plain = compare_json(&dir, &["--repeat", "1", "--only", "arena-max-2", "--", arg(&program), "8"]);
    let names: Vec<&str> = plain["configs"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    if nodes == 1 {
        assert_eq!(names, ["glibc", "arena-max-2"], "{plain:#}");
        assert!(plain["numa"].is_null(), "{plain:#}");
        assert!(
            plain["notes"].as_array().unwrap().iter().any(|n| n
                .as_str()
                .unwrap()
                .starts_with("this machine has one NUMA node: the NUMA configurations (interleave, localalloc, ghc-numa)")),
            "{plain:#}"
        );
    }

    // numa_touch 16: 16 MiB from the main thread and 4 MiB from each of two threads, every byte written.
    let c = compare_json(&dir, &["--numa", "--repeat", "1", "--only", "interleave,localalloc,ghc-numa", "--", arg(&program), "16"]);
    let numactl = Command::new("numactl").arg("--show").output().is_ok_and(|o| o.status.success());
    let written_pages = 24 * 256;
    assert_eq!(c["numa"]["nodes"], nodes, "{:#}", c["numa"]);
    for name in ["glibc", "interleave", "localalloc"] {
        let config = config(&c, name);
        if name != "glibc" {
            assert_eq!(config["package"], "numactl", "{config:#}");
            assert_eq!(config["wrapper"][0], "numactl", "{config:#}");
            assert_eq!(config["available"], numactl, "numactl is installed: {numactl}: {config:#}");
            if !numactl {
                continue;
            }
        }
        let runs = if name == "glibc" { 2 } else { 1 }; // the default runs first and last
        assert_eq!(
            (&config["repeats"], &config["exit_code"], &config["output_differs"]),
            (&Value::from(runs), &Value::from(0), &Value::Bool(false)),
            "{config:#}"
        );
        let numa = &config["numa"];
        if c["numa"]["unavailable_reason"].is_string() {
            eprintln!("skipped the NUMA figures: {}", c["numa"]["unavailable_reason"]);
            continue;
        }
        assert!(numa["basis"] == "first-touch" || numa["basis"] == "access", "{numa:#}");
        if numa["basis"] == "first-touch" {
            // A page whose process had exited before its node was asked is unresolved, not dropped.
            let samples = numa["samples"].as_u64().unwrap();
            assert!(
                samples >= written_pages * runs,
                "every page written is a first touch: {samples} samples, {written_pages} pages per run: {numa:#}"
            );
            let placed: u64 =
                numa["matrix"].as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap()).map(|v| v.as_u64().unwrap()).sum();
            assert_eq!(placed + numa["unresolved"].as_u64().unwrap(), samples, "{numa:#}");
        }
        let per_run: Vec<u64> = config["runs"].as_array().unwrap().iter().map(|r| r["numa"]["samples"].as_u64().unwrap()).collect();
        assert_eq!(per_run.iter().sum::<u64>(), numa["samples"].as_u64().unwrap(), "{config:#}");
        assert!(numa["rate_per_second"].as_f64().is_some_and(|r| r > 0.0), "{numa:#}");
        if nodes == 1 {
            assert_eq!(numa["local_fraction"], 1.0, "{numa:#}");
            assert_eq!(numa["by_distance"], serde_json::json!([{"distance": 10, "events": numa["matrix"][0][0]}]), "{numa:#}");
        }
    }
    let ghc = config(&c, "ghc-numa");
    assert_eq!((&ghc["available"], &ghc["env"]["GHCRTS"]), (&Value::Bool(false), &Value::from("--numa")), "{ghc:#}");
    assert!(ghc["note"].as_str().unwrap().contains("is not a GHC Haskell program"), "{ghc:#}");
    if nodes == 1 {
        assert_eq!(c["numa"]["trivially_local"], true, "{:#}", c["numa"]);
        assert!(c["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("trivially local")), "{c:#}");
    }

    // Debian's GHC 9.0.2 RTS is built without NUMA support: it says so, before main.
    if Command::new("ghc").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let exe = dir.join("numa_caps");
        let out = output_of(
            Command::new("ghc")
                .args(["-O", "-threaded", "-rtsopts", "-outputdir"])
                .arg(dir.join("o"))
                .arg("-o")
                .arg(&exe)
                .arg(programs_dir().join("ghc/numa_caps.hs")),
        );
        assert!(out.status.success(), "ghc failed:\n{}", text(&out.stderr));
        let c = compare_json(&dir, &["--numa", "--repeat", "1", "--only", "ghc-numa", "--", arg(&exe), "1000"]);
        let ghc = config(&c, "ghc-numa");
        let truth = output_of(Command::new(&exe).args(["+RTS", "--numa", "-RTS", "1"]));
        let refused = text(&truth.stderr).contains("compiled without NUMA support");
        assert_eq!(ghc["available"], !refused, "the RTS's own answer to --numa: {}\n{ghc:#}", text(&truth.stderr));
        if refused {
            assert!(ghc["note"].as_str().unwrap().contains("This GHC build was compiled without NUMA support"), "{ghc:#}");
        }
    } else {
        eprintln!("ghc is not installed: the GHC part is skipped");
    }
}
