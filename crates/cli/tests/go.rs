//! Go programs under `memgap run` and `memgap attach --go`: real programs
//! (tests/programs/go/) built with the machine's go, their ledger checked
//! against runtime.MemStats read inside the program at the same point.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

fn go_command() -> String {
    ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .find(|go| Command::new(go).arg("version").output().is_ok_and(|o| o.status.success()))
        .expect("the go command is needed for these tests (Go is preinstalled on CI)")
        .to_string()
}

/// Builds tests/programs/go/<name> into `dir`, with the helper package
/// (go/memgap) from this repository through a `replace` directive.
fn go_build(dir: &Path, name: &str) -> PathBuf {
    let source = dir.join(format!("{name}-src"));
    std::fs::create_dir_all(&source).unwrap();
    std::fs::copy(programs_dir().join("go").join(name).join("main.go"), source.join("main.go")).unwrap();
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../go/memgap").canonicalize().unwrap();
    std::fs::write(
        source.join("go.mod"),
        format!(
            "module {name}\n\ngo 1.19\n\nrequire memgap.dev/go/memgap v0.0.0\n\nreplace memgap.dev/go/memgap => {}\n",
            helper.display()
        ),
    )
    .unwrap();
    let exe = dir.join(name);
    let goflags = match std::env::var("GOFLAGS") {
        Ok(flags) if !flags.is_empty() => format!("{flags} -mod=mod"),
        _ => "-mod=mod".to_string(),
    };
    let out = output_of(Command::new(go_command()).args(["build", "-o"]).arg(&exe).arg(".").current_dir(&source).env("GOFLAGS", goflags));
    assert!(out.status.success(), "go build {name} failed:\n{}", text(&out.stderr));
    exe
}

/// The report's DOM after its scripts ran in headless chromium (`None`, and
/// a line, when chromium is not installed outside CI); fails on any console
/// message or script error.
fn dump_dom_in_chromium(report: &Path) -> Option<String> {
    let Some(browser) =
        ["chromium", "chromium-browser"].into_iter().find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
    else {
        assert!(std::env::var_os("CI").is_none(), "chromium is not installed (apt-get install -y chromium)");
        eprintln!("skipped the browser check: chromium is not installed");
        return None;
    };
    let profile = tempfile::tempdir().unwrap();
    let out = output_of(
        Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=2000",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("file://{}", report.display())),
    );
    assert!(out.status.success(), "chromium failed:\n{}", text(&out.stderr));
    let console: Vec<String> = text(&out.stderr).lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect();
    assert!(console.is_empty(), "the page logged:\n{}", console.join("\n"));
    let dom = text(&out.stdout);
    let body = &dom[dom.find("<body").expect("a body")..];
    assert!(!body[..body.find('>').unwrap()].contains("data-error"), "a script failed: {}", &body[..body.find('>').unwrap()]);
    Some(dom)
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    text(stdout).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

fn timeline(dir: &Path, trace: &Path) -> Vec<Value> {
    let out = memgap(dir, &["timeline", arg(trace), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["snapshots"].as_array().unwrap().clone()
}

fn u(value: &Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or_else(|| panic!("no {key} in {value:#}"))
}

fn within(what: &str, memgap: u64, runtime: u64, share: f64) {
    let diff = memgap.abs_diff(runtime) as f64;
    assert!(
        diff <= share * runtime as f64,
        "{what}: memgap {memgap} vs runtime {runtime} ({:.1}% apart)",
        diff * 100.0 / runtime.max(1) as f64
    );
}

/// Runs the fragmentation workload under memgap; returns each measured
/// point's MemStats with the ledger of the snapshot taken there, the
/// objects per span the program measured, and memgap's stderr.
fn run_fragment(dir: &Path, exe: &Path, args: &[&str]) -> (Vec<(Value, Value)>, u64, String) {
    let trace = dir.join(format!("fragment{}.mgt", args.join("").replace('-', "_")));
    let mut command = vec!["run", "-q", "-o", arg(&trace), "--", arg(exe)];
    command.extend_from_slice(args);
    let out = memgap(dir, &command);
    assert!(out.status.success(), "memgap run failed:\n{}", text(&out.stderr));
    let mut points = json_lines(&out.stdout);
    let per_span = points.pop().unwrap();
    assert_eq!(per_span["point"], "objects_per_span");
    let ledgers: Vec<Value> = timeline(dir, &trace).into_iter().filter(|l| l["snapshot_reason"] == "program").collect();
    assert_eq!(ledgers.len(), points.len(), "one program snapshot per measured point");
    (points.into_iter().zip(ledgers).collect(), u(&per_span, "16"), text(&out.stderr))
}

fn check_against_memstats(point: &Value, ledger: &Value) {
    let name = point["point"].as_str().unwrap();
    let rows = &ledger["rows"];
    let go = &ledger["go"];
    assert_eq!(go["source"], "runtime/metrics", "{name}: {go:#}");
    // Every resident byte in one row: the rows add up to VmRSS.
    let rss = u(ledger, "rss_bytes");
    assert!(
        ledger["residual_bytes"].as_i64().unwrap().unsigned_abs() <= rss / 50,
        "{name}: residual {} of {rss}",
        ledger["residual_bytes"]
    );
    let fragmented_runtime = u(point, "HeapInuse") - u(point, "HeapAlloc");
    let usage_runtime = u(point, "HeapSys") - u(point, "HeapReleased");
    let usage_memgap = u(rows, "live") + u(rows, "slack") + u(rows, "fragmented") + u(rows, "retained");
    // Figures of a few hundred KiB move by more than 5 % with the runtime's
    // own background work; the workload's are tens of MiB.
    if fragmented_runtime > 1 << 20 {
        within(&format!("{name}: fragmented vs HeapInuse − HeapAlloc"), u(rows, "fragmented"), fragmented_runtime, 0.05);
    }
    if usage_runtime > 1 << 20 {
        within(&format!("{name}: heap usage vs HeapSys − HeapReleased"), usage_memgap, usage_runtime, 0.05);
    }
}

#[test]
fn fragmentation_workload_agrees_with_memstats_at_every_step() {
    let (_tmp, dir) = tempdir();
    let exe = go_build(&dir, "fragment");
    for step in [128, 256, 512, 1024, 2048] {
        let (points, per_span, stderr) = run_fragment(&dir, &exe, &["-step", &step.to_string()]);
        let names: Vec<&str> = points.iter().map(|(p, _)| p["point"].as_str().unwrap()).collect();
        assert_eq!(names, ["start", "allocated", "kept", "more"]);
        for (point, ledger) in &points {
            check_against_memstats(point, ledger);
        }
        // The program's stderr passes through whole and in order; the
        // gctrace lines memgap asked for do not.
        assert_eq!(stderr, format!("fragment: step {step}\nfragment: done"));
        let (_, kept) = &points[2];
        let class16 = kept["go"]["size_classes"].as_array().unwrap().iter().find(|c| c["size"] == 16).expect("a 16-byte class").clone();
        assert_eq!(u(&class16, "objects_per_span"), per_span, "objects per span as this runtime measured them: {class16:#}");
        let live16 = u(&class16, "live_objects");
        let survivors = (1u64 << 20).div_ceil(step);
        assert!(live16 >= survivors && live16 < survivors + 2000, "step {step}: {live16} live 16-byte objects, {survivors} kept");
        assert!(u(&kept["go"], "gc_cycles") >= 3);
        if step == 512 {
            for (_, ledger) in &points[2..] {
                let verdict = ledger["verdict"].as_str().unwrap();
                assert!(
                    verdict.contains("fragmentation")
                        && verdict.contains("[]T instead of []*T")
                        && verdict.contains(&format!("spans of {per_span}")),
                    "{verdict}"
                );
            }
            assert_eq!(kept["go"]["sparse_classes"][0], 16);
            let occupancy = class16["occupancy"].as_f64().unwrap();
            assert!(occupancy < 0.01, "one survivor per span: {class16:#}");
        }
    }
}

#[test]
fn compacted_survivors_are_not_fragmentation() {
    let (_tmp, dir) = tempdir();
    let exe = go_build(&dir, "fragment");
    let (points, _, _) = run_fragment(&dir, &exe, &["-step", "512", "-compact"]);
    let names: Vec<&str> = points.iter().map(|(p, _)| p["point"].as_str().unwrap()).collect();
    assert_eq!(names, ["start", "allocated", "kept", "compacted", "more"]);
    for (point, ledger) in &points {
        check_against_memstats(point, ledger);
    }
    assert!(points[2].1["verdict"].as_str().unwrap().contains("fragmentation"));
    for (point, ledger) in &points[3..] {
        let verdict = ledger["verdict"].as_str().unwrap();
        assert!(!verdict.contains("fragmentation"), "{}: {verdict}", point["point"]);
        assert!(u(&ledger["rows"], "fragmented") < 2 << 20, "{}: {:#}", point["point"], ledger["rows"]);
    }
}

#[test]
fn gctrace_is_kept_when_the_user_asked_for_it_and_the_helper_is_inert_without_memgap() {
    let (_tmp, dir) = tempdir();
    let exe = go_build(&dir, "fragment");
    let trace = dir.join("t.mgt");
    let out = memgap_cmd(&dir, &["run", "-q", "-o", arg(&trace), "--", arg(&exe), "-step", "2048"])
        .env("GODEBUG", "gctrace=1,madvdontneed=1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.lines().filter(|l| l.starts_with("gc ") && l.contains(" MB goal")).count() >= 4, "{stderr}");
    let ledger: Value = serde_json::from_slice(&memgap(&dir, &["ledger", arg(&trace), "--at", "end", "--json"]).stdout).unwrap();
    assert!(u(&ledger["go"], "gc_cycles") >= 4);

    // A trace memgap cannot write: refused before the program starts.
    let line = assert_one_line_failure(&memgap(&dir, &["run", "-o", "/nonexistent/t.mgt", "--", arg(&exe)]));
    assert!(line.contains("/nonexistent"), "{line}");

    // Without memgap the import does nothing: same output shape, no pipe.
    let plain = output_of(Command::new(&exe).args(["-step", "2048"]).env_remove("MEMGAP_GO_METRICS"));
    assert!(plain.status.success());
    assert_eq!(text(&plain.stderr), "fragment: step 2048\nfragment: done");
    assert_eq!(json_lines(&plain.stdout).len(), 5);
}

/// The runtime writes each gctrace line in pieces while the program's own
/// goroutine writes partial lines: the program's stderr is byte for byte
/// its plain one, and the GCs are in the trace.
#[test]
fn stderr_written_in_pieces_during_gcs_is_the_programs_own() {
    let (_tmp, dir) = tempdir();
    let exe = go_build(&dir, "chatter");
    let plain = output_of(Command::new(&exe).env_remove("GODEBUG"));
    assert!(plain.status.success());
    assert!(text(&plain.stderr).ends_with("p5999 end-without-newline"), "{}", text(&plain.stderr));
    for run in 0..3 {
        let trace = dir.join(format!("chatter{run}.mgt"));
        let out = memgap_cmd(&dir, &["run", "-q", "-o", arg(&trace), "--", arg(&exe)]).env_remove("GODEBUG").output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(out.stderr == plain.stderr, "run {run}: stderr differs:\n{}", text(&out.stderr));
        let ledger: Value = serde_json::from_slice(&memgap(&dir, &["ledger", arg(&trace), "--at", "end", "--json"]).stdout).unwrap();
        assert!(u(&ledger["go"], "gc_cycles") >= 3, "{:#}", ledger["go"]);
    }
}

#[test]
fn without_the_helper_the_ledger_comes_from_gctrace() {
    let (_tmp, dir) = tempdir();
    let exe = go_build(&dir, "service");
    let trace = dir.join("svc.mgt");
    // The service runs until killed: memgap forwards SIGTERM to it.
    let mut child = memgap_cmd(&dir, &["run", "-q", "--snapshot-interval", "0.2", "-o", arg(&trace), "--", arg(&exe)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut port).unwrap();
    // Wait for a GC line to be recorded: the service allocates steadily.
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let out = memgap(&dir, &["ledger", arg(&trace), "--at", "end", "--json"]);
        let ledger: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if ledger["go"]["source"] == "gctrace" || std::time::Instant::now() > deadline {
            break;
        }
    }
    // SAFETY: no memory precondition; the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_or_kill(&mut child, "memgap run of the service");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "the service's own status");
    let ledger: Value = serde_json::from_slice(&memgap(&dir, &["ledger", arg(&trace), "--at", "end", "--json"]).stdout).unwrap();
    let go = &ledger["go"];
    assert_eq!((go["source"].as_str(), go["exact"].as_bool()), (Some("gctrace"), Some(false)), "{go:#}");
    assert!(u(go, "last_gc_live_bytes") > 0 && u(&ledger["rows"], "live") > 0);
    assert!(ledger["residual_bytes"].as_i64().unwrap().unsigned_abs() <= u(&ledger, "rss_bytes") / 50);
    assert!(ledger["verdict"].as_str().unwrap().contains("memgap.dev/go/memgap"));
    // What recording cost: the service's CPU time, reaped after SIGTERM, and memgap's own.
    let cpu = &summary_json(&trace)["recording_cpu"];
    let (program, recorder) = (cpu["program_seconds"].as_f64(), cpu["recorder_seconds"].as_f64());
    assert!(program.is_some_and(|s| s > 0.0) && recorder.is_some_and(|s| s > 0.0), "{cpu:#}");
}

#[test]
fn attach_records_a_live_service_timeline() {
    let (_tmp, dir) = tempdir();
    let exe = go_build(&dir, "service");
    let mut service = Command::new(&exe).stdout(Stdio::piped()).spawn().unwrap();
    let mut port = String::new();
    BufReader::new(service.stdout.take().unwrap()).read_line(&mut port).unwrap();
    let url = format!("http://127.0.0.1:{}", port.trim());
    let trace = dir.join("attach.mgt");
    let out = memgap(&dir, &["attach", "--go", &url, "--duration", "1.5", "--interval", "250", "-o", arg(&trace)]);
    service.kill().unwrap();
    service.wait().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ledgers = timeline(&dir, &trace);
    assert!(ledgers.len() >= 4, "{} snapshots", ledgers.len());
    for ledger in &ledgers {
        let go = &ledger["go"];
        assert_eq!(go["source"], "memstats");
        assert!(go["version"].as_str().unwrap().starts_with("go1."));
        assert!(u(&ledger["rows"], "live") > 0 && u(ledger, "rss_bytes") > 0);
        assert!(ledger["residual_bytes"].as_i64().unwrap().unsigned_abs() <= u(ledger, "rss_bytes") / 50, "{ledger:#}");
    }
    // Every view works on the trace.
    let report = dir.join("attach.html");
    assert!(memgap(&dir, &["report", arg(&trace), "-o", arg(&report)]).status.success());
    assert!(std::fs::read_to_string(&report).unwrap().contains("go-panel"));
    if let Some(dom) = dump_dom_in_chromium(&report) {
        assert!(dom.contains("id=\"go-panel\" class=\"panel\" data-ready=\"true\""), "the Go panel was not filled");
        assert!(dom.contains("memstats") || dom.contains("MemStats"), "the Go panel names its source");
    }
    assert!(memgap(&dir, &["summary", arg(&trace)]).status.success());

    // Nothing listening: one line, exit 1.
    let line =
        assert_one_line_failure(&memgap(&dir, &["attach", "--go", "http://127.0.0.1:1", "--duration", "1", "-o", arg(&dir.join("x.mgt"))]));
    assert!(line.contains("127.0.0.1:1"), "{line}");
}

#[test]
fn helper_package_passes_its_own_tests() {
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../go/memgap");
    for args in [&["vet", "./..."][..], &["test", "./..."][..]] {
        let out = output_of(Command::new(go_command()).args(args).current_dir(&helper).env_remove("MEMGAP_GO_METRICS"));
        assert!(out.status.success(), "go {}:\n{}{}", args.join(" "), text(&out.stdout), text(&out.stderr));
    }
}

/// A Go program whose RSS peaks in its first quarter second, long before
/// the first periodic snapshot, and ends low: a snapshot is taken as RSS grows, as
/// for malloc programs, so the ledger at the peak is at the VmRSS the
/// program read itself there, with the size classes of that instant
/// (allocs/frees-by-size sampled for the snapshot).
#[test]
fn a_snapshot_at_each_new_rss_peak_with_its_size_classes() {
    let (_tmp, dir) = tempdir();
    let exe = go_build(&dir, "peaks");
    let trace = dir.join("peaks.mgt");
    let out = memgap(&dir, &["run", "-q", "--snapshot-interval", "10", "-o", arg(&trace), "--", arg(&exe), "-hold", "0.5"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // "burst of 200000 x 512 B, VmRSS 117112 kB": the program's own reading at its peak.
    let stdout = text(&out.stdout);
    let first = stdout.lines().next().unwrap_or_default();
    let peak_kib: u64 =
        first.rsplit("VmRSS ").next().and_then(|v| v.trim_end_matches(" kB").parse().ok()).unwrap_or_else(|| panic!("{stdout}"));
    let peak = peak_kib << 10;

    let snapshots = timeline(&dir, &trace);
    let peaks = snapshots.iter().filter(|l| l["snapshot_reason"] == "rss peak").count();
    assert!(
        peaks >= 3,
        "{peaks} snapshots at RSS peaks: {:?}",
        snapshots.iter().map(|l| (&l["at_seconds"], &l["snapshot_reason"], &l["rss_bytes"])).collect::<Vec<_>>()
    );

    let out = memgap(&dir, &["ledger", "--at", "peak", "--json", arg(&trace)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let l: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(l["snapshot_reason"], "rss peak", "{l:#}");
    let rss = u(&l, "rss_bytes");
    // Snapshots come at each 5 % of growth, RSS read every 10 ms: the last
    // one before the top may be a tenth or so below it.
    assert!(rss * 10 >= peak * 8 && rss <= peak * 11 / 10, "ledger at the peak: {rss} B, the program read {peak} B there");
    eprintln!("ledger at the peak: {rss} B, the program read {peak} B there");
    let sum: u64 = l["rows"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    // Taken while RSS grows: what the heap gained between the page walk and
    // the VmRSS read after it is the residual.
    assert!(sum.abs_diff(rss) * 20 <= rss, "rows {sum} B, VmRSS {rss} B");
    // 200,000 objects of 512 B are live at the peak (and a few of the
    // runtime's own): most of them already allocated when the snapshot was
    // taken, none freed.
    let classes = l["go"]["size_classes"].as_array().unwrap_or_else(|| panic!("no size classes at the peak: {:#}", l["go"]));
    let class = classes.iter().find(|c| c["size"] == 512).unwrap_or_else(|| panic!("no 512 B class: {classes:#?}"));
    let live = u(class, "live_objects");
    eprintln!("512 B objects live at the peak snapshot: {live}");
    assert!((120_000..=201_000).contains(&live), "{class:#}");
    assert!(u(class, "live_bytes") * 10 >= u(&l["rows"], "live") * 7, "{class:#} {:#}", l["rows"]);
}
