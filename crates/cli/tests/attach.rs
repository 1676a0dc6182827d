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
    // glibc's heap was walked: every row is known, and the heap row is their sum.
    assert_eq!(json["unknown_rows"], serde_json::json!([]), "{:#}", json["walk_failure"]);
    let split: u64 = ["live", "slack", "fragmented", "retained"].iter().map(|r| bytes(rows, r)).sum();
    assert_eq!(split, heap, "{rows}");
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
    assert!(human.contains("its heap walked from outside") && human.contains("fragmented"), "{human}");
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

// ---------------------------------------------------------------------------
// memgap trim

/// The number after `key` in a file the program rewrites ("spins 12 errors 0").
fn figure(path: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut words = text.split_whitespace();
    while let Some(word) = words.next() {
        if word == key {
            return words.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{key} in {text:?}"));
        }
    }
    panic!("no {key} in {}: {text:?}", path.display())
}

/// Waits up to 5 s for the figure to grow past `than`.
fn grows(path: &Path, key: &str, than: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if std::fs::read_to_string(path).is_ok_and(|t| !t.trim().is_empty()) && figure(path, key) > than {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// The retainer's counter file holds just a number.
fn counter(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("counter")).unwrap_or_default().trim().parse().unwrap_or(0)
}

fn counter_grows(dir: &Path) -> bool {
    let before = counter(dir);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if counter(dir) > before {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// Sends a line to the loopback echo port and expects it back.
fn echoes(port: u64) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port as u16)) else { return false };
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    let mut reply = [0u8; 5];
    stream.write_all(b"ping\n").is_ok() && stream.read_exact(&mut reply).is_ok() && &reply == b"ping\n"
}

/// Running normally: not stopped, not traced.
fn assert_free(pid: u32) {
    let state = proc_status(pid, "State").expect("the process still exists");
    assert!(!state.starts_with('t') && !state.starts_with('T'), "process {pid} is left in state {state}");
    assert_eq!(proc_status(pid, "TracerPid").as_deref(), Some("0"), "process {pid} is still traced");
}

fn trim_json(dir: &Path, pid: u32, more: &[&str]) -> Value {
    let pid = pid.to_string();
    let mut args = vec!["trim", pid.as_str(), "--json"];
    args.extend_from_slice(more);
    let out = memgap(dir, &args);
    assert!(out.status.success(), "memgap {args:?} failed: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}): {}", text(&out.stdout)))
}

#[test]
fn trim_returns_the_retained_heap_and_the_process_runs_on() {
    let (_tmp, dir) = tempdir();
    let target = retainer(&dir, 4, 16);
    let kept = target.printed("kept");
    let heap_before = bytes(&snapshot_json(&dir, target.pid)["groups"], "heap");
    let anon_before = proc_status_bytes(target.pid, "RssAnon");
    let report = trim_json(&dir, target.pid, &[]);
    let anon_after = proc_status_bytes(target.pid, "RssAnon");
    eprintln!("trim: {report:#}\nRssAnon {anon_before} -> {anon_after}, kept {kept}, heap Rss before {heap_before}");
    assert_eq!(report["method"], "ptrace");
    assert_eq!(report["malloc_trim_returned"], 1);
    // The program holds `kept` bytes: nearly all the rest of its heap is
    // free pages glibc keeps. The kernel's own count must fall by half of that.
    let retained = heap_before - kept;
    let dropped = anon_before.saturating_sub(anon_after);
    assert!(dropped >= retained / 2, "RssAnon fell by {dropped}, retained about {retained}");
    let heap_returned = report["heap_returned_bytes"].as_i64().unwrap();
    assert!(heap_returned as u64 >= retained / 2, "{report:#}");
    assert!((report["returned_bytes"].as_i64().unwrap() as u64).abs_diff(dropped) <= dropped / 10 + MIB, "{report:#}");
    // The process runs on, unchanged.
    assert_free(target.pid);
    assert!(counter_grows(&dir), "the counter stopped");
    assert!(echoes(target.printed("port")), "the echo server stopped answering");
    // Nothing left to return the second time.
    let again = trim_json(&dir, target.pid, &[]);
    assert!(again["heap_returned_percent"].as_f64().unwrap() < 5.0, "{again:#}");
    let human = memgap(&dir, &["trim", &target.pid.to_string()]);
    assert!(human.status.success() && text(&human.stdout).contains("ptrace injection"), "{}", text(&human.stdout));
}

#[test]
fn trim_on_each_thread_leaves_its_system_call_running() {
    let (_tmp, dir) = tempdir();
    let target = retainer(&dir, 2, 4);
    let tids: Vec<String> =
        std::fs::read_dir(format!("/proc/{}/task", target.pid)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(tids.len(), 4, "main, 2 workers, echo");
    // The main thread sleeps in clock_nanosleep, the workers in nanosleep,
    // the echo thread in accept: each call must go on after ours.
    for tid in &tids {
        let report = trim_json(&dir, target.pid, &["--thread", tid]);
        assert_eq!(report["thread"].as_u64().unwrap().to_string(), *tid);
        assert_free(target.pid);
        assert!(echoes(target.printed("port")), "no echo after a call on thread {tid}");
    }
    assert!(counter_grows(&dir), "the counter stopped");
}

#[test]
fn trim_between_busy_threads_restores_their_registers() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "busy.c");
    let status = dir.join("status");
    let target = Background::start(&mut command(arg(&exe), [arg(&status)]), 2);
    let (spinner, churner) = (target.printed("spinner").to_string(), target.printed("churner").to_string());
    assert!(grows(&status, "spins", 0));
    // The spinner is always running, caught wherever it is.
    for _ in 0..20 {
        trim_json(&dir, target.pid, &["--thread", &spinner]);
    }
    // The churner is often inside malloc or free: memgap must wait for it
    // to step out (or give up saying so), never call from inside.
    for _ in 0..10 {
        let out = memgap(&dir, &["trim", &target.pid.to_string(), "--thread", &churner]);
        assert!(out.status.success() || text(&out.stderr).contains("inside glibc's allocator"), "{}", text(&out.stderr));
    }
    trim_json(&dir, target.pid, &[]);
    assert_free(target.pid);
    let (spins, churns) = (figure(&status, "spins"), figure(&status, "churns"));
    assert!(grows(&status, "spins", spins) && grows(&status, "churns", churns), "the threads stopped");
    assert_eq!(figure(&status, "errors"), 0, "a computation went wrong: registers were not restored");
    assert_eq!(figure(&status, "corrupt"), 0, "a heap block was corrupted");
}

#[test]
fn trim_refuses_jemalloc() {
    let jemalloc = Path::new(ALLOCATOR_DIR).join("libjemalloc.so.2");
    if !jemalloc.exists() {
        eprintln!("{} is not installed (apt install libjemalloc2); skipped", jemalloc.display());
        return;
    }
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "retainer.c");
    let counter = dir.join("counter");
    let target = Background::start(command(arg(&exe), ["1", "1", arg(&counter)]).env("LD_PRELOAD", &jemalloc), 2);
    let line = assert_one_line_failure(&memgap(&dir, &["trim", &target.pid.to_string()]));
    assert!(line.contains("does not use glibc's malloc") && line.contains("libjemalloc.so.2"), "{line}");
    assert_free(target.pid);
    let json = snapshot_json(&dir, target.pid);
    assert_eq!((json["allocator"].as_str(), json["arenas"].as_u64()), (Some("jemalloc"), Some(0)));
}

#[test]
fn trim_refuses_a_static_binary() {
    if !Path::new("/usr/lib/x86_64-linux-gnu/libc.a").exists() {
        eprintln!("no static libc (apt install libc6-dev); skipped");
        return;
    }
    let (_tmp, dir) = tempdir();
    let exe = compile_with(&dir, "retainer.c", &["-static"]);
    let counter = dir.join("counter");
    let target = Background::start(&mut command(arg(&exe), ["1", "1", arg(&counter)]), 2);
    let line = assert_one_line_failure(&memgap(&dir, &["trim", &target.pid.to_string()]));
    assert!(line.contains("statically linked"), "{line}");
    assert_free(target.pid);
    assert!(counter_grows(&dir));
}

#[test]
fn trim_of_no_process() {
    let (_tmp, dir) = tempdir();
    let pid = unused_pid();
    let line = assert_one_line_failure(&memgap(&dir, &["trim", &pid.to_string()]));
    assert_eq!(line, format!("memgap: no process {pid}"));
}

#[test]
fn trim_of_another_users_process_is_refused() {
    let (_tmp, dir) = tempdir();
    let target = retainer(&dir, 1, 1);
    let Some(out) = memgap_as_nobody(&dir, &["trim", &target.pid.to_string()]) else { return };
    let line = assert_one_line_failure(&out);
    assert!(line.contains("belongs to uid 0") && line.contains("uid 65534"), "{line}");
    assert_free(target.pid);
}

#[test]
fn snapshot_and_trim_in_another_pid_namespace() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "retainer.c");
    let counter = dir.join("counter");
    if proc_status(std::process::id(), "Uid").and_then(|u| u.split_whitespace().next().map(str::to_string)).as_deref() != Some("0") {
        eprintln!("not root: cannot make a PID namespace; skipped");
        return;
    }
    // unshare forks the program as pid 1 of a new PID namespace.
    let unshare = Background::start(&mut command("unshare", ["--pid", "--fork", arg(&exe), "1", "4", arg(&counter)]), 2);
    let pid = *children_of(unshare.pid).first().expect("the program under unshare");
    let namespaced = proc_status(pid, "NSpid").unwrap_or_default();
    assert_eq!(namespaced.split_whitespace().collect::<Vec<_>>(), [pid.to_string().as_str(), "1"], "NSpid");
    let json = snapshot_json(&dir, pid);
    assert_eq!(bytes(&json, "pid"), u64::from(pid));
    assert!(bytes(&json, "heap_bytes") >= 4 * MIB, "{:#}", json["rows"]);
    let report = trim_json(&dir, pid, &[]);
    assert!(report["heap_returned_bytes"].as_i64().unwrap() > 0, "{report:#}");
    assert_free(pid);
    assert!(counter_grows(&dir), "the counter stopped");
}
