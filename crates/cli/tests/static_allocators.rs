//! Allocators linked statically into the program: a Rust program with
//! tikv-jemallocator (tests/programs/rust_jemalloc, its own Cargo project)
//! holds a known heap; `memgap run` and `memgap snapshot PID` must name
//! jemalloc and put in `live` what jemalloc's own `stats.allocated` (printed
//! by the program) says, within 10 %, with the program's output unchanged.
//! A Rust program with the `mimalloc` crate (tests/programs/rust_mimalloc)
//! must get mimalloc named and the bytes it has committed, as its own
//! `mi_process_info` (printed by the program) says; a preloaded mimalloc
//! too, under `memgap run` and from `memgap snapshot PID`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// Builds the Rust program of tests/programs/`project` once per test
/// binary, into a target directory shared by every test run (building
/// jemalloc takes minutes; rebuilding an unchanged project, a second).
fn rust_program(project: &'static str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(&str, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, exe)) = built.iter().find(|(name, _)| *name == project) {
        return exe.clone();
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-programs");
    // Compiling jemalloc from source takes minutes on a loaded machine.
    let out = output_within(
        Command::new(env!("CARGO"))
            .args(["build", "--release", "--quiet", "--target-dir"])
            .arg(&target)
            .current_dir(programs_dir().join(project))
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR"),
        std::time::Duration::from_secs(20 * 60),
    );
    assert!(out.status.success(), "building tests/programs/{project} failed:\n{}", text(&out.stderr));
    let exe = target.join("release").join(project);
    built.push((project, exe.clone()));
    exe
}

fn rust_jemalloc() -> PathBuf {
    rust_program("rust_jemalloc")
}

fn printed(stdout: &str, key: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no \"{key} N\" in the program's output:\n{stdout}"))
}

fn assert_within_10_percent(what: &str, measured: u64, truth: u64) {
    let off = measured.abs_diff(truth) as f64 / truth.max(1) as f64;
    assert!(off <= 0.10, "{what}: {measured} against the allocator's own {truth} ({:.1} % off)", off * 100.0);
}

#[test]
fn recorded_run_names_jemalloc_and_fills_live_from_its_statistics() {
    let (_tmp, dir) = tempdir();
    let program = rust_jemalloc();
    let plain = run_plain(&dir, arg(&program), &[]);
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let trace = dir.join("je.mgt");
    let traced = output_of(memgap_cmd(&dir, &["run", "-o", arg(&trace), "--", arg(&program)]).stderr(std::process::Stdio::piped()));
    assert!(traced.status.success(), "memgap run failed: {}", text(&traced.stderr));
    // The program's output is its own: the same lines as a plain run (only
    // jemalloc's own figures vary a little from run to run).
    let shape = |out: &str| out.lines().map(|l| l.split(" stats.").next().unwrap_or("").to_string()).collect::<Vec<_>>();
    assert_eq!(shape(&text(&traced.stdout)), shape(&text(&plain.stdout)), "stdout differs under memgap");
    assert_eq!(traced.status.code(), plain.status.code());
    let plain_allocated = printed(&text(&plain.stdout), "jemalloc stats.allocated");
    let allocated = printed(&text(&traced.stdout), "jemalloc stats.allocated");
    assert_within_10_percent("jemalloc's stats.allocated under memgap", allocated, plain_allocated);

    let out = memgap(&dir, &["ledger", arg(&trace), "--at", "end", "--json"]);
    assert!(out.status.success(), "memgap ledger failed: {}", text(&out.stderr));
    let ledger: Value = serde_json::from_slice(&out.stdout).expect("ledger JSON");
    let named = ledger["allocator"].as_str().unwrap_or("");
    assert!(named.contains("jemalloc"), "allocator {named:?}");
    let share = ledger["owners"].as_array().and_then(|o| o.iter().find(|s| s["owner"] == "jemalloc")).cloned();
    let share = share.unwrap_or_else(|| panic!("no jemalloc share in {:#}", ledger["owners"]));
    assert_within_10_percent("the recorded ledger's live row", ledger["rows"]["live"].as_u64().unwrap(), allocated);
    assert_within_10_percent("jemalloc's share of live", share["rows"]["live"].as_u64().unwrap(), allocated);
    // Its figures, as jemalloc gave them, in its section.
    let section = ledger["jemalloc"]["allocated_bytes"].as_u64().unwrap_or_else(|| panic!("no jemalloc section: {ledger:#}"));
    assert_within_10_percent("jemalloc's stats.allocated at the last snapshot", section, allocated);
    let rows = &ledger["rows"];
    let sum: u64 =
        ["live", "slack", "fragmented", "retained", "lazy_free", "runtime", "other"].iter().map(|r| rows[r].as_u64().unwrap()).sum();
    let rss = ledger["rss_bytes"].as_u64().unwrap();
    assert!(sum.abs_diff(rss) * 100 <= rss, "rows add up to {sum}, RSS {rss}");
    // The human ledger says where the figures come from.
    let human = text(&memgap(&dir, &["ledger", arg(&trace), "--at", "end"]).stdout);
    assert!(human.contains("jemalloc"), "{human}");
}

#[test]
fn snapshot_of_a_running_program_names_jemalloc_and_fills_live() {
    let (_tmp, dir) = tempdir();
    let program = rust_jemalloc();
    let target = Background::start(Command::new(&program).arg("60").current_dir(&dir), 3);
    let allocated = target.printed("jemalloc stats.allocated");
    let out = memgap(&dir, &["snapshot", &target.pid.to_string(), "--json"]);
    assert!(out.status.success(), "memgap snapshot failed: {}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("snapshot JSON");
    assert_eq!(json["allocator"], "jemalloc", "{json:#}");
    assert_eq!(json["allocator_statically_linked"], true);
    let rows = &json["allocator_rows"];
    assert_within_10_percent("the outside ledger's live", rows["live"].as_u64().unwrap_or(0), allocated);
    // The program idles: jemalloc's figure is the one it printed (and for
    // the call's own small allocations).
    let asked = json["allocator_stats"]["allocated_bytes"].as_u64().unwrap_or(0);
    assert!(asked.abs_diff(allocated) * 100 <= allocated, "stats.allocated {asked} asked from outside, {allocated} printed");
    assert!(json["allocator_stats"]["arenas"].as_u64().unwrap_or(0) >= 1, "{json:#}");
    assert_eq!(json["unknown_rows"], serde_json::json!(["slack"]));
    // The process runs on, as it was: still alive, still idle.
    assert!(proc_status(target.pid, "State").is_some_and(|s| s.starts_with('S')), "{:?}", proc_status(target.pid, "State"));
    let human = text(&memgap(&dir, &["snapshot", &target.pid.to_string()]).stdout);
    assert!(human.contains("jemalloc (linked statically into the program)") && human.contains("own statistics"), "{human}");
}

/// jemalloc and tcmalloc loaded as libraries: `memgap snapshot PID` asks
/// them the same way (their `mallctl` and `MallocExtension_GetNumericProperty`
/// are in the library's dynamic symbols). tests/programs/retainer.c prints
/// the bytes it still holds; the allocator's own count must cover them,
/// plus its size-class rounding and libc's few buffers.
#[test]
fn snapshot_asks_preloaded_jemalloc_and_tcmalloc_for_their_figures() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "retainer.c");
    for (library, name) in [("libjemalloc.so.2", "jemalloc"), ("libtcmalloc_minimal.so.4", "tcmalloc")] {
        let library = Path::new(ALLOCATOR_DIR).join(library);
        if !library.exists() {
            eprintln!("{} is not installed (.ci/run installs it); skipped", library.display());
            continue;
        }
        let counter = dir.join(format!("counter-{name}"));
        let target = Background::start(command(arg(&exe), ["2", "16", arg(&counter)]).env("LD_PRELOAD", &library), 2);
        let kept = target.printed("kept");
        let out = memgap(&dir, &["snapshot", &target.pid.to_string(), "--json"]);
        assert!(out.status.success(), "memgap snapshot failed: {}", text(&out.stderr));
        let json: Value = serde_json::from_slice(&out.stdout).expect("snapshot JSON");
        assert_eq!((json["allocator"].as_str(), json["allocator_statically_linked"].as_bool()), (Some(name), Some(false)), "{json:#}");
        let allocated =
            json["allocator_stats"]["allocated_bytes"].as_u64().unwrap_or_else(|| panic!("{name}: no allocated_bytes: {json:#}"));
        assert!(allocated >= kept && allocated <= kept + kept / 2 + (1 << 20), "{name}: allocated {allocated}, the program keeps {kept}");
        assert_eq!(json["allocator_rows"]["live"].as_u64(), Some(allocated), "{name}: {json:#}");
        assert!(json["allocator_stats"]["mapped_bytes"].as_u64().unwrap_or(0) >= allocated, "{name}: {json:#}");
        // The process runs on: its counter still moves.
        let before = std::fs::read_to_string(&counter).unwrap_or_default();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_ne!(std::fs::read_to_string(&counter).unwrap_or_default(), before, "{name}: the program stopped");
    }
}

/// Debian's libmimalloc.so.2, tests/programs/mimalloc_commit.c compiled in
/// `dir`, and its counter file; None (the test skipped) when the library is
/// not installed.
fn preloaded_mimalloc_program(dir: &Path) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let library = Path::new(ALLOCATOR_DIR).join("libmimalloc.so.2");
    if !library.exists() {
        eprintln!("{} is not installed (.ci/run installs it); skipped", library.display());
        return None;
    }
    Some((library, compile(dir, "mimalloc_commit.c"), dir.join("counter")))
}

/// mimalloc preloaded (Debian's libmimalloc.so.2): a release build counts
/// only what it commits, which `memgap snapshot PID` reads through its
/// `mi_process_info` (eight arguments: two of them on the stack). The truth
/// is the program's own call of it (the figure mi_stats_print shows as
/// `committed`), made just before it idles; the rows that figure cannot
/// split stay unknown, and the process runs on.
#[test]
fn snapshot_reads_preloaded_mimallocs_committed_bytes_and_names_the_rows_it_cannot_split() {
    let (_tmp, dir) = tempdir();
    let Some((library, exe, counter)) = preloaded_mimalloc_program(&dir) else { return };
    let target = Background::start(command(arg(&exe), ["24", arg(&counter)]).env("LD_PRELOAD", &library), 2);
    let committed = target.printed("committed");
    assert!(committed >= 40 << 20, "mimalloc says it committed only {committed} bytes");
    let out = memgap(&dir, &["snapshot", &target.pid.to_string(), "--json"]);
    assert!(out.status.success(), "memgap snapshot failed: {}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("snapshot JSON");
    assert_eq!((json["allocator"].as_str(), json["allocator_statically_linked"].as_bool()), (Some("mimalloc"), Some(false)), "{json:#}");
    assert!(json["allocator_stats_error"].is_null(), "{json:#}");
    let stats = &json["allocator_stats"];
    let read = stats["mapped_bytes"].as_u64().unwrap_or_else(|| panic!("no mapped_bytes (mimalloc's committed): {json:#}"));
    // The program idles (its counter's FILE may take a page of mimalloc's).
    assert!(read.abs_diff(committed) <= committed / 100, "committed {read} read from outside, {committed} by the program");
    // Committed pages need not be resident (half of the 40 MiB block was
    // never touched): the heap the kernel charges stays below the figure.
    let heap = json["rows"]["heap"].as_u64().unwrap();
    assert!(heap > 24 << 20 && heap <= read + (2 << 20), "heap row {heap}, mimalloc committed {read}");
    // No row comes from a commit count: all four stay unknown, unsplit.
    assert!(stats["allocated_bytes"].is_null() && json.get("allocator_rows").is_none(), "{json:#}");
    assert_eq!(json["unknown_rows"], serde_json::json!(["live", "slack", "fragmented", "retained"]));
    let before = std::fs::read_to_string(&counter).unwrap_or_default();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_ne!(std::fs::read_to_string(&counter).unwrap_or_default(), before, "the program stopped");
    let human = text(&memgap(&dir, &["snapshot", &target.pid.to_string()]).stdout);
    assert!(human.contains("mimalloc's own statistics") && human.contains("committed") && human.contains("not known"), "{human}");
}

/// The program's stdout line by line, each cut before its first figure
/// (the allocator's own figures vary a little from run to run).
fn without_figures(out: &str) -> Vec<String> {
    out.lines().map(|l| l.split(|c: char| c.is_ascii_digit()).next().unwrap_or("").to_string()).collect()
}

/// Rust's `mimalloc` crate compiles mimalloc into the program: no hook sees
/// its calls. A release build counts only what it commits; `memgap run`
/// must name it, read that figure at every snapshot (mi_process_info,
/// called from outside), and say the rows it cannot split are not known.
#[test]
fn recorded_run_names_static_mimalloc_and_reads_its_committed_bytes() {
    let (_tmp, dir) = tempdir();
    let program = rust_program("rust_mimalloc");
    let plain = run_plain(&dir, arg(&program), &[]);
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let trace = dir.join("mi.mgt");
    let traced = output_of(memgap_cmd(&dir, &["run", "-o", arg(&trace), "--", arg(&program), "0.3"]).stderr(std::process::Stdio::piped()));
    assert!(traced.status.success(), "memgap run failed: {}", text(&traced.stderr));
    assert_eq!(without_figures(&text(&traced.stdout)), without_figures(&text(&plain.stdout)), "stdout differs under memgap");
    let committed = printed(&text(&traced.stdout), "mimalloc committed");
    assert_within_10_percent("mimalloc's committed bytes under memgap", committed, printed(&text(&plain.stdout), "mimalloc committed"));

    let out = memgap(&dir, &["ledger", arg(&trace), "--at", "end", "--json"]);
    assert!(out.status.success(), "memgap ledger failed: {}", text(&out.stderr));
    let ledger: Value = serde_json::from_slice(&out.stdout).expect("ledger JSON");
    assert_eq!(ledger["allocator"], "mimalloc (linked statically into the program)", "{ledger:#}");
    let read = ledger["mimalloc"]["mapped_bytes"].as_u64().unwrap_or_else(|| panic!("no mimalloc section: {ledger:#}"));
    assert_within_10_percent("mimalloc's committed bytes at the last snapshot", read, committed);
    // A commit count fills no row: its share holds none, and says so.
    let share = ledger["owners"].as_array().and_then(|o| o.iter().find(|s| s["owner"] == "mimalloc")).cloned();
    let share = share.unwrap_or_else(|| panic!("no mimalloc share in {:#}", ledger["owners"]));
    assert_eq!(share["rows"]["live"], 0, "{share:#}");
    let note = share["estimated"].as_str().unwrap_or("");
    assert!(note.contains("committed") && note.contains("live, fragmented, retained not known"), "{note}");
    let human = text(&memgap(&dir, &["ledger", arg(&trace), "--at", "end"]).stdout);
    assert!(human.contains("mimalloc (linked statically into the program)") && human.contains("not known"), "{human}");
}

/// `memgap snapshot PID` of the same program: mimalloc named, its committed
/// bytes read from outside; stripped of its symbols, it is still named (by
/// its messages) and its figures are said to be not known, with why.
#[test]
fn snapshot_names_static_mimalloc_reads_its_committed_bytes_and_says_why_not_when_stripped() {
    let (_tmp, dir) = tempdir();
    let program = rust_program("rust_mimalloc");
    let stripped = dir.join("rust_mimalloc_stripped");
    let out = output_of(Command::new("strip").arg("-o").arg(&stripped).arg(&program));
    assert!(out.status.success(), "strip failed: {}", text(&out.stderr));
    for (exe, symbols) in [(&program, true), (&stripped, false)] {
        let target = Background::start(Command::new(exe).arg("60").current_dir(&dir), 3);
        let committed = target.printed("mimalloc committed");
        let out = memgap(&dir, &["snapshot", &target.pid.to_string(), "--json"]);
        assert!(out.status.success(), "memgap snapshot failed: {}", text(&out.stderr));
        let json: Value = serde_json::from_slice(&out.stdout).expect("snapshot JSON");
        assert_eq!((json["allocator"].as_str(), json["allocator_statically_linked"].as_bool()), (Some("mimalloc"), Some(true)), "{json:#}");
        assert_eq!(json["unknown_rows"], serde_json::json!(["live", "slack", "fragmented", "retained"]));
        assert!(json.get("allocator_rows").is_none(), "{json:#}");
        if symbols {
            assert!(json["allocator_stats_error"].is_null(), "{json:#}");
            let read = json["allocator_stats"]["mapped_bytes"].as_u64().unwrap_or_else(|| panic!("no committed bytes: {json:#}"));
            // The program idles: the figure is the one it printed.
            assert!(read.abs_diff(committed) <= committed / 100, "committed {read} read from outside, {committed} printed");
        } else {
            assert!(json["allocator_stats"].is_null(), "{json:#}");
            let why = json["allocator_stats_error"].as_str().unwrap_or("");
            assert!(why.contains("stripped") && why.contains("not known"), "{json:#}");
        }
        // The process runs on, as it was: still alive, still idle.
        assert!(proc_status(target.pid, "State").is_some_and(|s| s.starts_with('S')), "{:?}", proc_status(target.pid, "State"));
    }
}

/// mimalloc preloaded under `memgap run`: the hooks give the rows, and the
/// recorder reads what mimalloc says it has committed at every snapshot,
/// checked against the program's own mi_process_info.
#[test]
fn recorded_run_reads_preloaded_mimallocs_committed_bytes() {
    let (_tmp, dir) = tempdir();
    let Some((library, exe, counter)) = preloaded_mimalloc_program(&dir) else { return };
    let trace = dir.join("mi.mgt");
    let traced = output_of(
        memgap_cmd(&dir, &["run", "-o", arg(&trace), "--", arg(&exe), "24", arg(&counter), "0.3"])
            .env("LD_PRELOAD", &library)
            .stderr(std::process::Stdio::piped()),
    );
    assert!(traced.status.success(), "memgap run failed: {}", text(&traced.stderr));
    let committed = printed(&text(&traced.stdout), "committed");
    assert!(committed >= 40 << 20, "mimalloc says it committed only {committed} bytes");
    let out = memgap(&dir, &["ledger", arg(&trace), "--at", "end", "--json"]);
    assert!(out.status.success(), "memgap ledger failed: {}", text(&out.stderr));
    let ledger: Value = serde_json::from_slice(&out.stdout).expect("ledger JSON");
    assert!(ledger["allocator"].as_str().unwrap_or("").contains("libmimalloc"), "{}", ledger["allocator"]);
    let read = ledger["mimalloc"]["mapped_bytes"].as_u64().unwrap_or_else(|| panic!("no mimalloc section: {ledger:#}"));
    assert_within_10_percent("mimalloc's committed bytes at the last snapshot", read, committed);
    // The rows still come from the hooked blocks: more than the touched
    // half of the 40 MiB block is live and resident.
    let live = ledger["rows"]["live"].as_u64().unwrap();
    assert!(live >= 24 << 20, "live {live}");
    let human = text(&memgap(&dir, &["ledger", arg(&trace), "--at", "end"]).stdout);
    assert!(human.contains("mimalloc's own count") && human.contains("committed"), "{human}");
}
