//! `memgap snapshot PID` and `memgap trim PID` on running processes that
//! memgap did not start: figures checked against the kernel's own, and the
//! process checked to run on unchanged.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// tests/programs/retainer.c with `threads` workers of `mib` MiB each,
/// running; its counter file is `dir/counter`.
fn retainer(dir: &Path, threads: u32, mib: u32) -> Background {
    let exe = compile(dir, "retainer.c");
    let counter = dir.join("counter");
    Background::start(command(arg(&exe), [threads.to_string(), mib.to_string(), arg(&counter).to_string()]).current_dir(dir), 2)
}

fn snapshot_json(dir: &Path, pid: u32) -> Value {
    let out = memgap(dir, &["snapshot", &pid.to_string(), "--json"]);
    assert!(out.status.success(), "memgap snapshot failed: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}): {}", text(&out.stdout)))
}

fn bytes(json: &Value, key: &str) -> u64 {
    json[key].as_u64().unwrap_or_else(|| panic!("no {key}: {json:#}"))
}

#[test]
fn snapshot_of_a_running_process() {
    let (_tmp, dir) = tempdir();
    let target = retainer(&dir, 4, 16);
    let vm_rss = proc_status_bytes(target.pid, "VmRSS");
    let json = snapshot_json(&dir, target.pid);
    for key in ["pid", "rss_bytes", "rows", "unknown_rows", "heap_bytes", "arenas", "mappings", "cgroup", "numa"] {
        assert!(json.get(key).is_some(), "no key {key}: {json:#}");
    }
    assert_eq!(bytes(&json, "pid"), u64::from(target.pid));
    let rss = bytes(&json, "rss_bytes");
    assert!(rss.abs_diff(vm_rss) <= vm_rss / 20, "rss_bytes {rss} vs VmRSS {vm_rss}");
    let rows = &json["rows"];
    let sum: u64 = ["heap", "lazy_free", "runtime", "other"].iter().map(|r| bytes(rows, r)).sum();
    assert!(sum.abs_diff(rss) <= rss / 20, "rows sum to {sum}, RSS {rss}: {rows}");
    // Five threads allocated 16 MiB each and kept 1/64 of it: nearly all
    // of that is still resident, in five glibc arenas.
    let heap = bytes(&json, "heap_bytes");
    assert!(heap >= 60 * MIB && heap <= rss, "heap_bytes {heap} of {rss}");
    assert_eq!(bytes(rows, "heap"), heap);
    assert_eq!(bytes(&json, "arenas"), 5, "{:#}", json["heaps"]);
    assert!(bytes(rows, "runtime") > 0, "thread stacks: {rows}");
    assert_eq!(json["unknown_rows"], serde_json::json!(["live", "slack", "fragmented", "retained"]));
    let classes: Vec<&str> = json["mappings"].as_array().unwrap().iter().map(|m| m["class"].as_str().unwrap()).collect();
    assert_eq!(classes.iter().filter(|c| **c == "stack").count(), 6, "main stack + 5 thread stacks: {classes:?}");
    if Path::new(&format!("/proc/{}/numa_maps", target.pid)).exists() {
        let on_nodes: u64 = json["numa"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert!(on_nodes.abs_diff(rss) <= rss / 10, "numa {} vs RSS {rss}", json["numa"]);
    }
    match &json["cgroup"] {
        Value::Null => {}
        cgroup => assert!(bytes(cgroup, "current_bytes") >= heap / 2, "{cgroup:#}"),
    }
    let human = memgap(&dir, &["snapshot", &target.pid.to_string()]);
    assert!(human.status.success(), "{}", text(&human.stderr));
    let human = text(&human.stdout);
    assert!(human.contains("needs a\n  recording") || human.contains("needs a recording"), "{human}");
}

#[test]
fn snapshot_of_no_process() {
    let (_tmp, dir) = tempdir();
    let pid = unused_pid();
    let line = assert_one_line_failure(&memgap(&dir, &["snapshot", &pid.to_string()]));
    assert_eq!(line, format!("memgap: no process {pid}"));
}

/// The memgap binary where user nobody can run it.
fn memgap_for_nobody(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.join("memgap");
    std::fs::copy(memgap_bin(), &copy).unwrap();
    copy
}

/// memgap ARGS run as user nobody (uid 65534), if this test runs as root.
fn memgap_as_nobody(dir: &Path, args: &[&str]) -> Option<std::process::Output> {
    if proc_status(std::process::id(), "Uid")?.split_whitespace().next() != Some("0") {
        eprintln!("not root: cannot run memgap as another user; skipped");
        return None;
    }
    let memgap = memgap_for_nobody(dir);
    let mut setpriv = vec!["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", arg(&memgap)];
    setpriv.extend_from_slice(args);
    Some(output_of(command("setpriv", setpriv).current_dir(dir)))
}

#[test]
fn snapshot_of_another_users_process_is_refused() {
    let (_tmp, dir) = tempdir();
    let target = retainer(&dir, 1, 1);
    let Some(out) = memgap_as_nobody(&dir, &["snapshot", &target.pid.to_string()]) else { return };
    let line = assert_one_line_failure(&out);
    assert!(line.contains("belongs to uid 0") && line.contains("uid 65534"), "{line}");
}
