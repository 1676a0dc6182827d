//! `memgap run --numa` and `memgap numa` on this machine with a real
//! program (tests/programs/numa_touch.c). On a single-node machine
//! everything must be local; where the CPU offers no precise memory-access
//! sampling (virtual machines), the page-fault fallback must be taken and
//! labelled first-touch, with one page fault per page the program wrote.

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn machine_nodes() -> usize {
    std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_str().is_some_and(|n| n.strip_prefix("node").is_some_and(|i| i.parse::<u32>().is_ok())))
                .count()
        })
        .unwrap_or(0)
        .max(1)
}

fn numa_json(dir: &Path, trace: &Path) -> Value {
    let out = memgap(dir, &["numa", arg(trace), "--at", "end", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("numa JSON")
}

fn sum(matrix: &Value) -> u64 {
    matrix.as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap()).map(|v| v.as_u64().unwrap()).sum()
}

#[test]
fn a_real_program_under_run_numa() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "numa_touch.c");
    let plain = run_plain(&dir, arg(&prog), &["24"]);
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "--numa", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog), "24"]);
    // memgap's own lines go to stderr; the program's output and status stay.
    assert_eq!((out.stdout.clone(), out.status.code()), (plain.stdout.clone(), plain.status.code()), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let json = numa_json(&dir, &trace);

    for key in ["nodes", "distances", "allocation_matrix_bytes", "access_matrix", "access_unavailable_reason", "local_fraction", "hot_node"]
    {
        assert!(json.get(key).is_some(), "no key {key}: {json:#}");
    }
    assert_eq!(json["topology_source"], "trace");
    assert_eq!(json["nodes"].as_array().unwrap().len(), machine_nodes());
    assert!(json["placement_unavailable_reason"].is_null(), "{json:#}");

    // Every live block (24 MiB by main, 2 × 4 MiB by threads) placed on some node.
    let live = 24 * MIB + 8 * MIB;
    let placed = sum(&json["allocation_matrix_bytes"]);
    assert!(placed >= live && placed < live + MIB, "placed {placed} of {live} live");
    assert_eq!(json["allocation_unplaced_bytes"], 0);
    let resident: u64 = json["resident_bytes_by_node"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    assert!(resident >= live, "resident heap {resident} < live {live}");

    // The samples: precise accesses where the CPU can, else first touches, labelled as such.
    let sampled = &json["sampled"];
    if json["access_matrix"].is_null() {
        let reason = json["access_unavailable_reason"].as_str().expect("a reason when access sampling is unavailable");
        assert!(!reason.is_empty());
        assert_eq!(sampled["kind"], "first-touch");
        assert_eq!(sampled["source"], "page-faults");
        assert!(stderr.contains("access sampling unavailable") && stderr.contains("first-touch"), "{stderr}");
        // One fault per page the program wrote, at least.
        let touches = sum(&sampled["matrix"]);
        assert!(touches >= live / 4096, "{touches} first touches for {} written pages", live / 4096);
        let text = text(&memgap(&dir, &["numa", arg(&trace), "--at", "end"]).stdout);
        assert!(text.contains("first-touch locality (page faults, not accesses)"), "{text}");
    } else {
        assert_eq!(sampled["kind"], "access");
        assert!(json["numa_access_rate"].as_f64().unwrap() > 0.0);
    }

    // The HTML report carries the same facts for its NUMA panel.
    let html = dir.join("t.html");
    let out = memgap(&dir, &["report", arg(&trace), "-o", arg(&html)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<section id=\"numa\"") && page.contains("\"numa\":{") && page.contains("\"allocation_matrix_bytes\""),
        "no NUMA data in the report"
    );

    if machine_nodes() == 1 {
        assert_eq!(json["local_fraction"].as_f64(), Some(1.0));
        assert_eq!(json["allocation_remote_bytes"], 0);
        let multi_node_row = json["allocation_matrix_bytes"].as_array().unwrap().last().unwrap().as_array().unwrap();
        assert!(multi_node_row.iter().all(|v| v == 0), "no thread can run on two nodes of one");
        assert_eq!(json["hot_node"], json["nodes"][0]["id"]);
        assert_eq!(sampled["local_fraction"].as_f64(), Some(1.0));
        assert!(json["remote_by_site"].as_array().unwrap().is_empty());
    }
}

#[test]
fn a_trace_without_samples_says_how_to_get_them() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "numa_touch.c");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog), "4"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = numa_json(&dir, &trace);
    assert!(json["access_matrix"].is_null() && json["sampled"].is_null());
    assert!(json["access_unavailable_reason"].as_str().unwrap().contains("memgap run --numa"), "{json:#}");
    assert!(sum(&json["allocation_matrix_bytes"]) >= 12 * MIB);
}

#[test]
fn bad_input_is_one_line() {
    let (_tmp, dir) = tempdir();
    let line = assert_one_line_failure(&memgap(&dir, &["numa", "/no/such/trace.mgt"]));
    assert!(line.contains("/no/such/trace.mgt"), "{line}");
    std::fs::write(dir.join("junk.mgt"), b"not a trace at all, not at all").unwrap();
    assert_one_line_failure(&memgap(&dir, &["numa", arg(&dir.join("junk.mgt"))]));
}

#[test]
fn a_running_process_from_numa_maps() {
    let (_tmp, dir) = tempdir();
    let pid = std::process::id().to_string();
    let out = memgap(&dir, &["numa", "--pid", &pid, "--json"]);
    if !Path::new("/proc/self/numa_maps").exists() {
        assert_one_line_failure(&out); // a kernel without NUMA
        return;
    }
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["nodes"].as_array().unwrap().len(), machine_nodes());
    let total: u64 = json["resident_bytes_by_node"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    let rss = proc_status_bytes(std::process::id(), "VmRSS");
    assert!(total.abs_diff(rss) <= rss / 5, "numa_maps {total} vs VmRSS {rss}");
    assert!(json["mappings"].as_array().unwrap().iter().any(|m| m["kind"] == "heap" || m["kind"] == ""));
    assert_one_line_failure(&memgap(&dir, &["numa", "--pid", "999999999"]));
}

/// "Gen  0  283 colls, …" and "N bytes copied during GC" from `+RTS -s`.
fn rts_s_figures(stderr: &str) -> (Vec<u64>, u64) {
    let mut gcs = Vec::new();
    let mut copied = 0;
    for line in stderr.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"Gen") && words.get(3).is_some_and(|w| w.starts_with("colls")) {
            gcs.push(words[2].parse().unwrap());
        } else if line.contains("bytes copied during GC") {
            copied = words[0].replace(',', "").parse().unwrap();
        }
    }
    (gcs, copied)
}

/// A GHC program whose two capabilities both collect, run with `+RTS -N2
/// -qa -qg`: every capability tied to the node of the CPU it is bound to,
/// and the collections and bytes copied per node adding up to the RTS's own
/// `+RTS -s`; the report's NUMA panel carries them.
#[test]
fn ghc_collections_per_node_add_up_to_the_rts_figures() {
    if command("ghc", ["--version"]).output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("ghc is not installed: skipping the GHC NUMA test (apt-get install ghc)");
        return;
    }
    let (_tmp, dir) = tempdir();
    let exe = dir.join("numa_caps");
    let out = output_of(
        command("ghc", ["-O", "-threaded", "-rtsopts", "-eventlog", "-outputdir"])
            .arg(dir.join("o"))
            .arg("-o")
            .arg(&exe)
            .arg(programs_dir().join("ghc/numa_caps.hs")),
    );
    assert!(out.status.success(), "ghc failed:\n{}", text(&out.stderr));
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&exe), "20000", "+RTS", "-N2", "-qa", "-qg", "-s", "-RTS"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (gcs, copied) = rts_s_figures(&text(&out.stderr));
    assert!(gcs.len() >= 2 && gcs[0] > 0 && copied > 0, "no +RTS -s figures:\n{}", text(&out.stderr));
    let json = numa_json(&dir, &trace);
    assert_eq!(json["ghc_capability_node_rule"], "-qa", "{json:#}");
    let caps = json["ghc_capabilities"].as_array().unwrap();
    assert_eq!(caps.len(), 2, "both capabilities lead collections: {json:#}");
    let by_node = json["ghc_gcs_by_node"].as_array().unwrap();
    let sum_by = |key: &str, generation: usize| -> u64 {
        by_node.iter().map(|n| n[key].as_array().unwrap().get(generation).and_then(Value::as_u64).unwrap_or(0)).sum()
    };
    for (generation, &count) in gcs.iter().enumerate() {
        assert_eq!(sum_by("gcs_by_generation", generation), count, "generation {generation}: {json:#}");
    }
    let measured: u64 = (0..gcs.len()).map(|g| sum_by("copied_bytes_by_generation", g)).sum();
    assert!(measured.abs_diff(copied) <= copied / 100, "copied {measured} vs +RTS -s {copied}");
    if machine_nodes() == 1 {
        assert!(caps.iter().all(|c| c["node"] == json["nodes"][0]["id"]), "{json:#}");
    }
    let heap: u64 = json["ghc_heap_bytes_by_node"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    assert!(heap >= MIB, "the GHC heap's placement: {json:#}");
    let text_out = text(&memgap(&dir, &["numa", arg(&trace), "--at", "end"]).stdout);
    assert!(text_out.contains("nodes by +RTS -qa") && text_out.contains("GHC heap (megablocks) resident"), "{text_out}");

    let html = dir.join("t.html");
    let out = memgap(&dir, &["report", arg(&trace), "-o", arg(&html)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("id=\"numa-ghc\"") && page.contains("\"ghc_gcs_by_node\":[{"), "no GHC per-node data in the report's NUMA panel");
}
