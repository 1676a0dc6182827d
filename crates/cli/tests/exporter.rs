//! `memgap exporter`: a real Prometheus scrapes it, and what Prometheus
//! stored is checked against `memgap snapshot PID --json` and the kernel's
//! own figures; processes that exit are left out; bad input fails in one line.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A process killed (with its process group) when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        sigkill(-(self.0.id() as i32));
        let _ = self.0.wait();
    }
}

/// `memgap exporter --listen 127.0.0.1:0 ARGS…`, and the address it serves on.
fn start_exporter(dir: &Path, args: &[&str]) -> (Running, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = memgap_cmd(dir, &[&["exporter", "--listen", "127.0.0.1:0"], args].concat());
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().expect("start memgap exporter");
    let stderr = child.stderr.take().unwrap();
    let running = Running(child);
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("exporter: {line}");
            let _ = sender.send(line);
        }
    });
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let line =
            receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("memgap exporter said where it listens");
        if let Some(address) = line.strip_prefix("memgap: serving metrics on http://").and_then(|rest| rest.strip_suffix("/metrics")) {
            return (running, address.to_string());
        }
    }
}

/// GET http://ADDRESS/PATH: the status code and the body.
fn http_get(address: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap_or_else(|e| panic!("connect to {address}: {e}"));
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap_or_else(|e| panic!("read the answer of {address}{path}: {e}"));
    let response = String::from_utf8(response).expect("a UTF-8 answer");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP header: {response}"));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status: {head}"));
    (status, body.to_string())
}

/// The samples of `text` (Prometheus text format) named `name`, as
/// (labels, value); the format itself is checked by promtool and unit tests.
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = series.split_once('{').map_or((series, ""), |(m, l)| (m, l.trim_end_matches('}')));
            (metric == name).then(|| (labels.to_string(), value.parse().unwrap()))
        })
        .collect()
}

fn retainer(dir: &Path, threads: u32, mib: u32) -> Background {
    let exe = compile(dir, "retainer.c");
    let counter = dir.join(format!("counter-{threads}-{mib}"));
    Background::start(command(arg(&exe), [threads.to_string(), mib.to_string(), arg(&counter).to_string()]).current_dir(dir), 2)
}

fn snapshot_json(dir: &Path, pid: u32) -> Value {
    // The exporter never stops a process: the rows known without the heap walk.
    let out = memgap(dir, &["snapshot", &pid.to_string(), "--json", "--no-walk"]);
    assert!(out.status.success(), "memgap snapshot failed: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}): {}", text(&out.stdout)))
}

/// The rows `memgap snapshot --json` gives a value, by name.
fn snapshot_rows(json: &Value) -> Vec<(String, u64)> {
    let unknown: Vec<&str> = json["unknown_rows"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    let mut rows: Vec<(String, u64)> = json["rows"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| !unknown.contains(&name.as_str()))
        .filter_map(|(name, value)| Some((name.clone(), value.as_u64()?)))
        .collect();
    rows.sort();
    rows
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Prometheus's `/api/v1/query` for `query`: the result vector.
fn query(prometheus: &str, query: &str) -> Vec<Value> {
    let encoded: String = query
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let (status, body) = http_get(prometheus, &format!("/api/v1/query?query={encoded}"));
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("Prometheus answered {status} with no JSON ({e}): {body}"));
    assert_eq!((status, json["status"].as_str()), (200, Some("success")), "{query}: {body}");
    assert_eq!(json["data"]["resultType"], "vector", "{body}");
    json["data"]["result"].as_array().unwrap().clone()
}

fn sample_value(sample: &Value) -> f64 {
    sample["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no value: {sample}"))
}

fn within(what: &str, got: f64, expected: f64, tolerance: f64) {
    assert!((got - expected).abs() <= tolerance, "{what}: Prometheus has {got}, expected {expected} ± {tolerance}");
}

#[test]
fn prometheus_scrapes_the_ledger_of_a_running_process() {
    let prometheus_found = Command::new("prometheus").arg("--version").output().is_ok_and(|out| out.status.success());
    assert!(
        prometheus_found,
        "prometheus is not installed: this test runs a real Prometheus (`apt-get install prometheus`; .ci/run installs it)"
    );
    let (_tmp, dir) = tempdir();
    // Three arenas (main + two threads), each keeping every 64th of 12 MiB of
    // strings: a heap of about 36 MiB, nearly all of it free pages glibc keeps.
    let target = retainer(&dir, 2, 12);
    let pid = target.pid.to_string();
    let (_exporter, exporter) = start_exporter(&dir, &["--pid", &pid]);

    // The exposition itself passes Prometheus's own linter.
    let (status, exposition) = http_get(&exporter, "/metrics");
    assert_eq!(status, 200, "{exposition}");
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package)");
    promtool.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let linted = wait_output(promtool);
    assert!(linted.status.success(), "promtool check metrics:\n{}{}\n{exposition}", text(&linted.stdout), text(&linted.stderr));

    let prometheus = format!("127.0.0.1:{}", free_port());
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: memgap\n    static_configs:\n      - targets: ['{exporter}']\n"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prometheus = {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", arg(&config)))
            .arg(format!("--storage.tsdb.path={}", arg(&dir.join("data"))))
            .arg(format!("--web.listen-address={prometheus}"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        Running(cmd.spawn().expect("start prometheus"))
    };

    // Two scrapes of the exporter, as Prometheus counts them.
    let scraped = format!("count_over_time(memgap_rss_bytes{{pid=\"{pid}\"}}[5m])");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = TcpStream::connect(&prometheus).is_ok();
        let count = if ready { query(&prometheus, &scraped).first().map_or(0.0, sample_value) } else { 0.0 };
        if count >= 2.0 {
            break;
        }
        let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "Prometheus did not scrape the exporter twice within 30 s ({count} scrapes); its log:\n{log}");
        thread::sleep(Duration::from_millis(200));
    }
    let up = query(&prometheus, "up{job=\"memgap\"}");
    assert_eq!(up.iter().map(sample_value).collect::<Vec<_>>(), [1.0], "{up:?}");

    let json = snapshot_json(&dir, target.pid);
    let vm_rss = proc_status_bytes(target.pid, "VmRSS") as f64;
    let rss = json["rss_bytes"].as_u64().unwrap() as f64;
    // The process is idle: what Prometheus stored a second ago and what
    // snapshot reads now differ by the pages its idle loop touches.
    let tolerance = |expected: f64| (expected * 0.02).max(MIB as f64);

    let stored = query(&prometheus, &format!("memgap_ledger_bytes{{pid=\"{pid}\"}}"));
    let mut rows: Vec<(String, f64)> = stored.iter().map(|s| (s["metric"]["row"].as_str().unwrap().to_string(), sample_value(s))).collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let expected = snapshot_rows(&json);
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        expected.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        "the same rows as snapshot"
    );
    for ((row, got), (_, want)) in rows.iter().zip(&expected) {
        within(&format!("row {row}"), *got, *want as f64, tolerance(*want as f64));
    }
    for sample in &stored {
        assert_eq!(sample["metric"]["comm"], "retainer", "{sample}");
        assert_eq!(sample["metric"]["job"], "memgap", "{sample}");
    }
    for unknown in json["unknown_rows"].as_array().unwrap() {
        let row = unknown.as_str().unwrap();
        let found = query(&prometheus, &format!("memgap_ledger_bytes{{pid=\"{pid}\",row=\"{row}\"}}"));
        assert!(found.is_empty(), "row {row} is not known from outside, yet Prometheus has {found:?}");
    }
    let heap = rows.iter().find(|r| r.0 == "heap").expect("a heap row").1;
    assert!(heap >= 30.0 * MIB as f64, "three arenas of 12 MiB each: heap row {heap}");

    let stored_rss = sample_value(&query(&prometheus, &format!("memgap_rss_bytes{{pid=\"{pid}\"}}"))[0]);
    within("RSS against snapshot", stored_rss, rss, tolerance(rss));
    within("RSS against the kernel's VmRSS", stored_rss, vm_rss, tolerance(vm_rss));

    let arenas = sample_value(&query(&prometheus, &format!("memgap_glibc_arenas{{pid=\"{pid}\"}}"))[0]);
    assert_eq!(arenas, json["arenas"].as_f64().unwrap());
    assert_eq!(arenas, 3.0, "main arena + one per thread");
    let heaps = query(&prometheus, &format!("memgap_heap_resident_bytes{{pid=\"{pid}\"}}"));
    for heap in json["heaps"].as_array().unwrap() {
        let kind = heap["kind"].as_str().unwrap();
        let label = match kind {
            "brk heap" => "main".to_string(),
            "arena" => format!("{:#x}", heap["start"].as_u64().unwrap()),
            _ => "other".to_string(),
        };
        let stored = heaps.iter().find(|s| s["metric"]["heap"] == label.as_str()).unwrap_or_else(|| panic!("no heap {label} in {heaps:?}"));
        let want = heap["resident_bytes"].as_f64().unwrap();
        within(&format!("heap {label}"), sample_value(stored), want, tolerance(want));
    }
    let duration = query(&prometheus, "memgap_scrape_duration_seconds");
    assert!(duration.len() == 1 && (0.0..1.0).contains(&sample_value(&duration[0])), "{duration:?}");
}

/// Waits for a child whose stdin is already closed, within TIMEOUT.
fn wait_output(mut child: Child) -> std::process::Output {
    let stdout = read_in_background(child.stdout.take().unwrap());
    let stderr = read_in_background(child.stderr.take().unwrap());
    let status = wait_or_kill(&mut child, "promtool");
    std::process::Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

#[test]
fn a_process_that_exits_is_left_out_not_an_error() {
    let (_tmp, dir) = tempdir();
    let staying = retainer(&dir, 1, 2);
    let leaving = retainer(&dir, 0, 1);
    let (staying_pid, leaving_pid) = (staying.pid.to_string(), leaving.pid.to_string());
    let (_exporter, exporter) = start_exporter(&dir, &["--pid", &staying_pid, &leaving_pid]);
    let pid_label = |pid: &str| format!("pid=\"{pid}\"");

    let (status, before) = http_get(&exporter, "/metrics");
    assert_eq!(status, 200);
    let rss = samples(&before, "memgap_rss_bytes");
    assert_eq!(rss.len(), 2, "{before}");
    assert!(rss.iter().any(|(labels, _)| labels.contains(&pid_label(&leaving_pid))), "{before}");
    assert_eq!(samples(&before, "memgap_scrape_processes"), [(String::new(), 2.0)]);

    drop(leaving);
    let (status, after) = http_get(&exporter, "/metrics");
    assert_eq!(status, 200, "{after}");
    assert!(!after.contains(&pid_label(&leaving_pid)), "{after}");
    let rss = samples(&after, "memgap_rss_bytes");
    assert_eq!(rss.len(), 1, "{after}");
    let vm_rss = proc_status_bytes(staying.pid, "VmRSS") as f64;
    assert!((rss[0].1 - vm_rss).abs() <= vm_rss * 0.05, "{} vs VmRSS {vm_rss}", rss[0].1);
    assert_eq!(
        samples(&after, "memgap_scrape_skipped_processes").iter().find(|(l, _)| l.contains("vanished")).map(|s| s.1),
        Some(1.0),
        "{after}"
    );

    let (status, _) = http_get(&exporter, "/nothing");
    assert_eq!(status, 404);
}

#[test]
fn a_cgroup_and_all_processes() {
    let (_tmp, dir) = tempdir();
    let target = retainer(&dir, 1, 2);
    let pid_label = format!("pid=\"{}\"", target.pid);

    let (_all, all) = start_exporter(&dir, &["--all"]);
    let (status, text) = http_get(&all, "/metrics");
    assert_eq!(status, 200);
    assert!(samples(&text, "memgap_rss_bytes").iter().any(|(labels, _)| labels.contains(&pid_label)), "--all misses the target:\n{text}");
    assert!(samples(&text, "memgap_scrape_processes")[0].1 >= 2.0, "{text}");

    // The target runs in the test's own cgroup; --cgroup names it as
    // /proc/PID/cgroup shows it.
    let membership = std::fs::read_to_string(format!("/proc/{}/cgroup", target.pid)).unwrap();
    let Some(path) = membership.lines().find_map(|line| line.strip_prefix("0::")) else {
        // No unified hierarchy here: --cgroup must say so in one line.
        let line = assert_one_line_failure(&memgap(&dir, &["exporter", "--cgroup", "/", "--listen", "127.0.0.1:0"]));
        assert!(line.contains("cgroup v2"), "{line}");
        return;
    };
    let (_by_cgroup, by_cgroup) = start_exporter(&dir, &["--cgroup", path]);
    let (status, text) = http_get(&by_cgroup, "/metrics");
    assert_eq!(status, 200);
    assert!(
        samples(&text, "memgap_rss_bytes").iter().any(|(labels, _)| labels.contains(&pid_label)),
        "--cgroup {path} misses the target:\n{text}"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = mountinfo
        .lines()
        .find_map(|l| l.split_once(" - cgroup2 ").map(|(before, _)| before.split(' ').nth(4).unwrap().to_string()))
        .unwrap();
    let current = std::fs::read_to_string(Path::new(&mount).join(path.trim_start_matches('/')).join("memory.current"));
    let exported = samples(&text, "memgap_cgroup_memory_current_bytes");
    match current {
        Ok(current) => {
            let current: f64 = current.trim().parse().unwrap();
            assert_eq!(exported.len(), 1, "{text}");
            assert!((exported[0].1 - current).abs() <= current * 0.1, "memory.current {current}, exported {}", exported[0].1);
        }
        // No memory controller on this cgroup (the root, or a v1 host with v2 mounted beside): no figure, not a zero.
        Err(_) => assert!(exported.is_empty() && !text.contains("memgap_cgroup_memory_headroom_bytes"), "{text}"),
    }
}

#[test]
fn bad_input_fails_in_one_line() {
    let (_tmp, dir) = tempdir();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let own = std::process::id().to_string();
    let line = assert_one_line_failure(&memgap(&dir, &["exporter", "--listen", &address, "--pid", &own]));
    assert!(line.contains("cannot listen on") && line.contains(&address), "{line}");
    let line = assert_one_line_failure(&memgap(&dir, &["exporter", "--listen", "127.0.0.1:0", "--pid", &unused_pid().to_string()]));
    assert!(line.contains("no process"), "{line}");
    let line = assert_one_line_failure(&memgap(&dir, &["exporter", "--listen", "127.0.0.1:0", "--cgroup", "/no/such/cgroup"]));
    assert!(line.contains("/no/such/cgroup"), "{line}");
    let line = assert_one_line_failure(&memgap(&dir, &["exporter", "--listen", "not-an-address", "--all"]));
    assert!(line.contains("not-an-address"), "{line}");
}

/// The block of README.md's Production section that starts with `# NAME`.
fn readme_yaml(name: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let production = &readme[readme.find("\n## Production\n").expect("a Production section in README.md")..];
    let start = production
        .find(&format!("```yaml\n# {name}\n"))
        .unwrap_or_else(|| panic!("no ```yaml block for {name} in README's Production section"));
    let block = &production[start + "```yaml\n".len()..];
    block[..block.find("```").unwrap()].to_string()
}

fn promtool(dir: &Path, args: &[&str]) {
    let out = output_of(Command::new("promtool").args(args).current_dir(dir));
    assert!(out.status.success(), "promtool {args:?}:\n{}{}", text(&out.stdout), text(&out.stderr));
}

#[test]
fn the_readme_scrape_config_and_alert_rules_work() {
    let (_tmp, dir) = tempdir();
    std::fs::write(dir.join("prometheus.yml"), readme_yaml("prometheus.yml")).unwrap();
    std::fs::write(dir.join("memgap-rules.yml"), readme_yaml("memgap-rules.yml")).unwrap();
    promtool(&dir, &["check", "config", "prometheus.yml"]);
    // Series shaped like the exporter's: a process whose heap is 2 GiB of a
    // 2.2 GB RSS alerts, one whose heap is a quarter of its RSS does not; a
    // cgroup with 5 % of its limit left alerts.
    let cases = r#"
rule_files: [memgap-rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'memgap_ledger_bytes{pid="42",comm="server",row="heap"}'
        values: '2147483648x40'
      - series: 'memgap_rss_bytes{pid="42",comm="server"}'
        values: '2400000000x40'
      - series: 'memgap_ledger_bytes{pid="43",comm="cache",row="heap"}'
        values: '2147483648x40'
      - series: 'memgap_rss_bytes{pid="43",comm="cache"}'
        values: '8000000000x40'
      - series: 'memgap_cgroup_memory_headroom_bytes{cgroup="/a"}'
        values: '50000000x10'
      - series: 'memgap_cgroup_memory_max_bytes{cgroup="/a",limit_cgroup="/"}'
        values: '1000000000x10'
      - series: 'memgap_cgroup_memory_headroom_bytes{cgroup="/b"}'
        values: '500000000x10'
      - series: 'memgap_cgroup_memory_max_bytes{cgroup="/b",limit_cgroup="/b"}'
        values: '1000000000x10'
    alert_rule_test:
      - eval_time: 20m
        alertname: MemgapHeapHoldsMostOfRSS
      - eval_time: 35m
        alertname: MemgapHeapHoldsMostOfRSS
        exp_alerts:
          - exp_labels: {pid: "42", comm: server, row: heap}
            exp_annotations:
              summary: "server (pid 42): heap 2GiB; run memgap trim 42, or record it"
      - eval_time: 6m
        alertname: MemgapCgroupNearItsLimit
        exp_alerts:
          - exp_labels: {cgroup: /a}
            exp_annotations:
              summary: "/a: 47.68MiB left before the OOM killer"
"#;
    std::fs::write(dir.join("cases.yml"), cases).unwrap();
    promtool(&dir, &["test", "rules", "cases.yml"]);
}

#[test]
fn scrapes_while_processes_come_and_go_all_succeed() {
    let (_tmp, dir) = tempdir();
    let (_exporter, exporter) = start_exporter(&dir, &["--all"]);
    // A shell starting short-lived processes without pause: some are listed
    // by a scrape and gone before they are read.
    let churn = {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "while :; do sleep 0.001 & /bin/true; wait; done"]).stdin(Stdio::null()).process_group(0);
        Running(cmd.spawn().expect("start sh"))
    };
    let (mut read, mut vanished) = (Vec::new(), 0.0);
    // Until one scrape has met a process that exited between listing and
    // reading (a few per scrape on a 2-core machine).
    while vanished == 0.0 && read.len() < 40 {
        let (status, text) = http_get(&exporter, "/metrics");
        assert_eq!(status, 200, "{text}");
        assert!(text.ends_with('\n') && text.contains("# TYPE memgap_scrape_duration_seconds gauge\n"), "{text}");
        read.push(samples(&text, "memgap_scrape_processes")[0].1);
        vanished = samples(&text, "memgap_scrape_skipped_processes").iter().find(|(labels, _)| labels.contains("vanished")).unwrap().1;
    }
    drop(churn);
    assert!(read.iter().all(|&n| n >= 2.0), "processes read per scrape: {read:?}");
    assert!(vanished > 0.0, "in {} scrapes no process exited between listing and reading: the race was not exercised", read.len());
}

/// jemalloc's own statistics are called for in the process (a ptrace stop)
/// at most once per --allocator-stats-every: the scrapes in between reuse
/// them and say how old they are; with 0, every scrape calls again.
#[test]
fn jemallocs_statistics_are_read_at_most_once_per_period_and_their_age_exported() {
    let (_tmp, dir) = tempdir();
    let jemalloc = Path::new(ALLOCATOR_DIR).join("libjemalloc.so.2");
    assert!(jemalloc.is_file(), "{} is missing (apt install libjemalloc2)", jemalloc.display());
    let exe = compile(&dir, "retainer.c");
    let counter = dir.join("counter");
    let program = Background::start(command(arg(&exe), ["1", "8", arg(&counter)]).current_dir(&dir).env("LD_PRELOAD", &jemalloc), 2);
    let pid = program.pid.to_string();
    let age = |text: &str| {
        let ages = samples(text, "memgap_allocator_stats_age_seconds");
        assert_eq!(ages.len(), 1, "{text}");
        assert!(ages[0].0.contains(&format!("pid=\"{pid}\"")), "{ages:?}");
        ages[0].1
    };
    let live_row =
        |text: &str| samples(text, "memgap_allocator_rows_bytes").into_iter().find(|(l, _)| l.contains("row=\"live\"")).map(|s| s.1);

    let (_cached, cached) = start_exporter(&dir, &["--pid", &pid]);
    let (_, first) = http_get(&cached, "/metrics");
    assert!(first.contains("allocator=\"jemalloc\""), "{first}");
    let first_age = age(&first);
    assert!(first_age < 1.0, "{first}");
    let first_live = live_row(&first).expect("jemalloc's live row");
    thread::sleep(Duration::from_millis(1500));
    let (_, second) = http_get(&cached, "/metrics");
    // The figures of the first scrape, 1.5 s older.
    assert!(age(&second) >= 1.4, "{second}");
    assert_eq!(live_row(&second), Some(first_live), "{second}");
    assert!(second.contains("# TYPE memgap_allocator_stats_age_seconds gauge"), "{second}");

    let (_every, every) = start_exporter(&dir, &["--pid", &pid, "--allocator-stats-every", "0"]);
    for _ in 0..2 {
        let (_, text) = http_get(&every, "/metrics");
        assert!(age(&text) < 1.0, "{text}");
        assert!(live_row(&text).is_some(), "{text}");
    }
    // Never left stopped or traced.
    assert_eq!(proc_status(program.pid, "TracerPid").as_deref(), Some("0"));
}
