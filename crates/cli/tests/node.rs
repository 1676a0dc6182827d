//! Node.js programs under `memgap run`: the sampler loaded through
//! NODE_OPTIONS gives V8's layer; its figures are checked against what the
//! program itself prints from process.memoryUsage() at the same point, and
//! the remedies the ledger names are run to see RSS go down.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

fn node_program(name: &str) -> PathBuf {
    programs_dir().join("node").join(name)
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a count: {value}"))
}

/// The JSON lines a program printed (other lines skipped).
fn printed_json(stdout: &[u8]) -> Vec<Value> {
    text(stdout).lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Runs `node PROGRAM ARGS` under memgap (`-o trace`), checks its exit
/// status and stderr are those of a plain run, and returns what it printed.
fn run_traced(dir: &Path, trace: &str, program: &str, args: &[&str]) -> Vec<Value> {
    let program = node_program(program);
    let mut run = vec!["run", "-q", "-o", trace, "--", "node", arg(&program)];
    run.extend_from_slice(args);
    let plain = run_plain(dir, "node", &[&[arg(&program)], args].concat());
    let traced = memgap(dir, &run);
    assert_eq!(traced.status.code(), plain.status.code(), "{}", text(&traced.stderr));
    assert_eq!(text(&traced.stderr), text(&plain.stderr));
    // The figures vary from run to run; the lines and their keys do not.
    let shape =
        |out: &[u8]| text(out).lines().map(|l| l.split(|c: char| c.is_ascii_digit()).next().unwrap_or("").to_string()).collect::<Vec<_>>();
    assert_eq!(shape(&traced.stdout), shape(&plain.stdout));
    printed_json(&traced.stdout)
}

/// The ledger JSON at the last snapshot before the program's `exit` event
/// (a periodic snapshot may fall while V8 tears its heap down): the program
/// idles after printing, so it is taken as the program printed.
fn ledger_while_idle(dir: &Path, trace: &str) -> Value {
    ledger_while_isolates(dir, trace, |_| true)
}

/// As [`ledger_while_idle`], at the last snapshot whose V8 figures come from
/// `isolates(count)` isolates: a program whose workers end before it exits
/// may be snapshot after they ended, with fewer.
fn ledger_while_isolates(dir: &Path, trace: &str, isolates: impl Fn(u64) -> bool) -> Value {
    let out = memgap(dir, &["timeline", "--json", trace]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let timeline: Value = serde_json::from_slice(&out.stdout).unwrap();
    for snapshot in timeline["snapshots"].as_array().unwrap().iter().rev().filter(|s| s["snapshot_reason"] != "exit") {
        let at = snapshot["at_seconds"].to_string();
        let out = memgap(dir, &["ledger", "--json", "--at", &at, trace]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let l: Value = serde_json::from_slice(&out.stdout).unwrap();
        if l["node"].is_object() && l["node"]["sample_kind"] != "exit" && isolates(u(&l["node"]["isolates"])) {
            return l;
        }
    }
    panic!("no snapshot before the program's exit with V8's figures from the isolates expected: {timeline:#}");
}

fn assert_within(what: &str, got: u64, expected: u64, share: f64, ledger: &Value) {
    let off = (got as f64 - expected as f64).abs() / (expected as f64).max(1.0);
    assert!(off <= share, "{what}: memgap says {got}, the program printed {expected} ({:.1}% off): {:#}", off * 100.0, ledger["node"]);
}

/// The node section against the program's own process.memoryUsage().
fn assert_section_matches(l: &Value, printed: &Value) {
    let node = &l["node"];
    assert!(node.is_object(), "no node section: {l:#}");
    for (key, printed_key) in [
        ("heap_total_bytes", "heapTotal"),
        ("heap_used_bytes", "heapUsed"),
        ("external_bytes", "external"),
        ("array_buffers_bytes", "arrayBuffers"),
    ] {
        assert_within(key, u(&node[key]), u(&printed[printed_key]), 0.05, l);
    }
}

/// Rows add up to VmRSS within 2 %, and V8's mappings are the node owner's,
/// not `other`: they hold what V8 says its spaces hold (`physical`, its
/// total_physical_size as the program printed it).
fn assert_v8_heap_owned(l: &Value, physical: u64) {
    let rss = u(&l["rss_bytes"]);
    let residual = l["residual_bytes"].as_i64().unwrap();
    assert!(residual.unsigned_abs() * 50 <= rss, "rows miss VmRSS by {residual} of {rss}: {l:#}");
    let node = l["owners"].as_array().unwrap().iter().find(|o| o["owner"] == "node").unwrap_or_else(|| panic!("no node owner: {l:#}"));
    let v8: u64 = node["rows"].as_object().unwrap().values().map(u).sum();
    assert!(v8 * 10 >= physical * 9 && v8 * 10 <= physical * 12, "V8's mappings hold {v8} resident, V8 says {physical}: {l:#}");
    let program_mmap = u(&l["other_breakdown"]["program_mmap"]);
    assert!(program_mmap < 2 << 20, "{program_mmap} bytes of program mmaps left in other: {:#}", l["other_breakdown"]);
    assert!(u(&l["rows"]["other"]) < rss - v8, "{l:#}");
}

#[test]
fn node_section_matches_the_programs_own_memory_usage() {
    let (_tmp, dir) = tempdir();
    let printed = run_traced(&dir, "heap.mgt", "heap.js", &["40", "1600"]);
    let l = ledger_while_idle(&dir, "heap.mgt");
    assert_section_matches(&l, &printed[0]);
    assert_v8_heap_owned(&l, u(&printed[0]["physical"]));
    let node = &l["node"];
    assert!(node["version"].as_str().is_some_and(|v| v.split('.').next().unwrap().parse::<u32>().unwrap() >= 18), "{node:#}");
    assert_eq!(u(&node["isolates"]), 1);
    let spaces = node["spaces"].as_array().unwrap();
    let old = spaces.iter().find(|s| s["name"] == "old_space").unwrap_or_else(|| panic!("{node:#}"));
    // 40 MiB of small objects, all reachable, in the old space after a full GC.
    assert!(u(&old["used"]) > 30 << 20, "{node:#}");
    assert!(u(&node["gcs"]["major"]) >= 1, "{node:#}");
    let verdict = l["verdict"].as_str().unwrap();
    assert!(verdict.contains("V8's heap holds"), "{verdict}");
}

#[test]
fn worker_threads_each_report_their_isolate() {
    let (_tmp, dir) = tempdir();
    let printed = run_traced(&dir, "workers.mgt", "workers.js", &["2", "12", "1600"]);
    // The workers end before the program does: the snapshot while all three
    // isolates idle is the last one with three.
    let l = ledger_while_isolates(&dir, "workers.mgt", |count| count == 3);
    assert_section_matches(&l, &printed[0]["sum"]);
    assert_v8_heap_owned(&l, u(&printed[0]["sum"]["physical"]));
}

#[test]
fn child_process_children_are_traced_with_their_own_node_section() {
    let (_tmp, dir) = tempdir();
    let printed = run_traced(&dir, "parent.mgt", "children.js", &["24", "1600"]);
    let traces = traces_in(&dir);
    let child =
        traces.iter().find(|t| t.starts_with("parent.") && *t != "parent.mgt").unwrap_or_else(|| panic!("no child trace: {traces:?}"));
    let l = ledger_while_idle(&dir, child);
    assert_section_matches(&l, &printed[0]);
    assert_v8_heap_owned(&l, u(&printed[0]["physical"]));
    // The parent is a Node process too, with a small heap of its own.
    let parent = ledger_while_idle(&dir, "parent.mgt");
    assert!(u(&parent["node"]["heap_used_bytes"]) < u(&l["node"]["heap_used_bytes"]) / 4, "{:#}", parent["node"]);
}

#[test]
fn buffer_churn_gets_the_glibc_finding_and_its_remedy_lowers_rss() {
    let (_tmp, dir) = tempdir();
    let printed = run_traced(&dir, "buffers.mgt", "buffers.js", &["6", "2500"]);
    let l = ledger_while_idle(&dir, "buffers.mgt");
    for (key, printed_key) in [("heap_total_bytes", "heapTotal"), ("external_bytes", "external"), ("array_buffers_bytes", "arrayBuffers")] {
        assert_within(key, u(&l["node"][key]), u(&printed[0][printed_key]), 0.05, &l);
    }
    // The sample comes after the print, once the gc entries are delivered:
    // the first delivery compiles Node's observer code (about 400 KiB of a
    // 3.5 MiB heap here; heap.js checks heapUsed within 5 % on 40 MiB).
    let used = (u(&l["node"]["heap_used_bytes"]), u(&printed[0]["heapUsed"]));
    assert!(used.0.abs_diff(used.1) < 1 << 20, "{used:?}");
    let findings = l["findings"].as_array().unwrap();
    let has = |owner: &str, kinds: &[&str]| findings.iter().any(|f| f["owner"] == owner && kinds.contains(&f["kind"].as_str().unwrap()));
    assert!(has("glibc", &["retained", "fragmented"]) && has("node", &["buffer_churn"]), "{findings:#?}");
    assert_eq!(l["gap_owner"], "glibc", "{l:#}");
    let remedies = l["remedies"].as_array().unwrap();
    let ids: Vec<&str> = remedies.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&"node-jemalloc"), "{ids:?}");
    // Node-only knobs that do not apply here are not offered.
    assert!(!ids.contains(&"node-max-old-space-size") && !ids.contains(&"node-heap-snapshots"), "{ids:?}");
    let trim = remedies.iter().find(|r| r["id"] == "glibc-trim").unwrap_or_else(|| panic!("{ids:?}"));

    // Run the program plain and with the remedy: RSS after the idle time.
    let program = node_program("buffers.js");
    let rss_after = |env: &[(&str, PathBuf)]| {
        let mut cmd = command("node", [arg(&program), "6", "2500"]);
        cmd.current_dir(&dir).env_remove("LD_PRELOAD");
        for (name, value) in env {
            cmd.env(name, value);
        }
        let out = output_of(&mut cmd);
        assert!(out.status.success(), "{}", text(&out.stderr));
        u(&printed_json(&out.stdout)[1]["rss"])
    };
    let library = trim["env"]["LD_PRELOAD"].as_str().unwrap();
    let plain = rss_after(&[]);
    let remedied = rss_after(&[("LD_PRELOAD", memgap_bin().with_file_name(library))]);
    eprintln!("buffers.js RSS after idling: plain {plain}, with {library} {remedied}");
    assert!(remedied < plain * 3 / 4, "the trim remedy left RSS at {remedied} of {plain}");
}

#[test]
fn semi_space_remedy_lowers_the_rss_of_a_program_with_a_large_young_generation() {
    let (_tmp, dir) = tempdir();
    let printed = run_traced(&dir, "semi.mgt", "heap.js", &["40", "1600"]);
    let l = ledger_while_idle(&dir, "semi.mgt");
    let semi =
        l["findings"].as_array().unwrap().iter().find(|f| f["kind"] == "semi_space").unwrap_or_else(|| panic!("{:#}", l["findings"]));
    assert!(u(&semi["bytes"]) >= 8 << 20, "{semi:#}");
    let remedy =
        l["remedies"].as_array().unwrap().iter().find(|r| r["id"] == "node-semi-space").unwrap_or_else(|| panic!("{:#}", l["remedies"]));
    let options = remedy["env"]["NODE_OPTIONS"].as_str().unwrap();
    let program = node_program("heap.js");
    let mut cmd = command("node", [arg(&program), "40", "0"]);
    cmd.current_dir(&dir).env_remove("LD_PRELOAD").env("NODE_OPTIONS", options);
    let out = output_of(&mut cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let remedied = printed_json(&out.stdout)[0].clone();
    let (plain_rss, remedied_rss) = (u(&printed[0]["rss"]), u(&remedied["rss"]));
    eprintln!(
        "heap.js RSS: under memgap {plain_rss}, plain with {options} {remedied_rss}; heapTotal {} -> {}",
        printed[0]["heapTotal"], remedied["heapTotal"]
    );
    // The plain run has no agent, so it is compared with V8's own committed heap too.
    assert!(u(&remedied["heapTotal"]) + (8 << 20) < u(&printed[0]["heapTotal"]), "{remedied} against {}", printed[0]);
    assert!(remedied_rss + (8 << 20) < plain_rss, "{remedied} against {}", printed[0]);
}

#[test]
fn node_behaves_the_same_and_other_programs_get_no_node_layer() {
    let (_tmp, dir) = tempdir();
    // Threads, handles and listeners the program can see, its exit code and
    // an uncaught error's output: the same with the sampler loaded.
    let script = "const fs = require('fs'); \
                  console.log(fs.readdirSync('/proc/self/task').length, process.getActiveResourcesInfo().join(','), process.listenerCount('SIGINT')); \
                  setTimeout(() => { console.log(process.execArgv.length); process.exitCode = 3; throw new Error('boom'); }, 50);";
    let plain = run_plain(&dir, "node", &["-e", script]);
    let traced = memgap(&dir, &["run", "-q", "-o", "e.mgt", "--", "node", "-e", script]);
    let without_stack = |out: &[u8]| text(out).lines().filter(|l| !l.trim_start().starts_with("at ")).collect::<Vec<_>>().join("\n");
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    assert_eq!(without_stack(&traced.stderr), without_stack(&plain.stderr));
    assert_eq!(traced.status.code(), plain.status.code());
    // The user's own NODE_OPTIONS still apply, before the sampler's.
    let limit = "console.log(require('v8').getHeapStatistics().heap_size_limit >> 20)";
    let mut cmd = memgap_cmd(&dir, &["run", "-q", "-o", "o.mgt", "--", "node", "-e", limit]);
    cmd.env("NODE_OPTIONS", "--max-old-space-size=100");
    let out = output_of(&mut cmd);
    let mut plain = command("node", ["-e", limit]);
    plain.env("NODE_OPTIONS", "--max-old-space-size=100");
    assert_eq!(text(&out.stdout), text(&output_of(&mut plain).stdout));
    let l: Value = serde_json::from_slice(&memgap(&dir, &["ledger", "--json", "--at", "end", "o.mgt"]).stdout).unwrap();
    assert!(l["node"].is_object(), "{l:#}");
    // A C program: no node section, no sampler files left behind.
    let program = compile(&dir, "exact_counts.c");
    let out = memgap(&dir, &["run", "-q", "-o", "c.mgt", "--", arg(&program)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let l: Value = serde_json::from_slice(&memgap(&dir, &["ledger", "--json", "c.mgt"]).stdout).unwrap();
    assert!(l.get("node").is_none(), "{l:#}");
    assert!(std::fs::read_dir(&dir).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with("node.")));
}
