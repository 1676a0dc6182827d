//! CPython programs under `memgap run`: the agent hooks pymalloc's arena
//! allocator, the recorder reads the pools at each snapshot, and the ledger
//! gets pymalloc's layer (the `python` section and owner), checked against
//! `sys._debugmallocstats()` printed by the same script at the same instant.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

const DEBIAN_PYTHON: &str = "/usr/bin/python3";
/// pyenv's build (libpython as a shared library), where installed.
const PYENV_PYTHON: &str = "/root/.pyenv/versions/3.11.7/bin/python3";

fn script(name: &str) -> PathBuf {
    programs_dir().join("python").join(name)
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a count: {value}"))
}

/// The ledger at the snapshot the program asked for (memgap_snapshot).
fn program_snapshot(dir: &Path, trace: &str) -> Value {
    let out = memgap(dir, &["timeline", "--json", trace]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let timeline: Value = serde_json::from_slice(&out.stdout).unwrap();
    timeline["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["snapshot_reason"] == "program")
        .cloned()
        .unwrap_or_else(|| panic!("no program snapshot: {timeline:#}"))
}

/// A figure of `sys._debugmallocstats()` ("# bytes in allocated blocks = 6,859,696").
fn malloc_stat(stderr: &str, name: &str) -> u64 {
    let line = stderr.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no '{name}' in:\n{stderr}"));
    line.rsplit('=').next().unwrap().trim().replace(',', "").parse().unwrap()
}

fn rows_add_up(l: &Value) {
    let rss = u(&l["rss_bytes"]) as f64;
    let rows: u64 = l["rows"].as_object().unwrap().values().map(u).sum();
    assert!((rows as f64 - rss).abs() <= 0.02 * rss, "rows {rows} against VmRSS {rss}: {l:#}");
}

/// Runs cache.py under memgap with --stats; returns the ledger at its
/// snapshot and what `sys._debugmallocstats()` printed.
fn traced_cache(dir: &Path, trace: &str, command: &[&str]) -> (Value, String) {
    let cache = script("cache.py");
    let mut run = vec!["run", "-q", "-o", trace, "--"];
    run.extend_from_slice(command);
    run.extend_from_slice(&[arg(&cache), "200000", "20", "--stats"]);
    let out = memgap(dir, &run);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (program_snapshot(dir, trace), text(&out.stderr))
}

#[test]
fn pymalloc_layer_matches_the_interpreters_own_counts() {
    let (_tmp, dir) = tempdir();
    let cache = script("cache.py");
    // Same output, status and stderr with and without memgap.
    let plain = run_plain(&dir, DEBIAN_PYTHON, &[arg(&cache), "100000", "10"]);
    let traced = memgap(&dir, &["run", "-q", "-o", "same.mgt", "--", DEBIAN_PYTHON, arg(&cache), "100000", "10"]);
    assert_same_behaviour(&plain, &traced);

    let mut pythons = vec![DEBIAN_PYTHON];
    if Path::new(PYENV_PYTHON).exists() {
        pythons.push(PYENV_PYTHON);
    }
    for (n, python) in pythons.into_iter().enumerate() {
        let (l, stats) = traced_cache(&dir, &format!("cache{n}.mgt"), &[python]);
        let py = &l["python"];
        assert_eq!(py["allocator"], "pymalloc", "{python}: {py:#}");
        assert!(py["version"].as_str().is_some_and(|v| v.starts_with("3.11")), "{py:#}");
        let ours = u(&py["allocated_blocks_bytes"]);
        let theirs = malloc_stat(&stats, "# bytes in allocated blocks");
        eprintln!("{python}: allocated blocks {ours} (memgap) against {theirs} (sys._debugmallocstats)");
        assert!((ours as f64 - theirs as f64).abs() <= 0.05 * theirs as f64, "{python}: {ours} against {theirs}: {py:#}");
        assert_eq!(u(&py["arenas"]), malloc_stat(&stats, "# arenas allocated current"), "{py:#}");
        assert_eq!(u(&py["free_in_used_pools_bytes"]), malloc_stat(&stats, "# bytes in available blocks"), "{py:#}");
        rows_add_up(&l);
        // The arenas are pymalloc's now, not the program's own mmaps.
        let share =
            l["owners"].as_array().unwrap().iter().find(|o| o["owner"] == "python").unwrap_or_else(|| panic!("no python share: {l:#}"));
        let held: u64 = share["rows"].as_object().unwrap().values().map(u).sum();
        assert!(held as f64 >= 0.98 * u(&py["resident_bytes"]) as f64, "{share:#} {py:#}");
        assert!(u(&l["other_breakdown"]["program_mmap"]) < 1 << 20, "{:#}", l["other_breakdown"]);
        // 1 entry in 20 kept: most arena bytes are free blocks among survivors.
        assert_eq!(l["gap_owner"], "python", "{l:#}");
        assert!(u(&share["rows"]["fragmented"]) > 4 * u(&share["rows"]["live"]), "{share:#}");
        let finding = &l["findings"][0];
        assert_eq!((finding["owner"].as_str(), finding["kind"].as_str()), (Some("python"), Some("fragmented")), "{l:#}");
        // Survivors scattered over every pool: malloc would keep the same
        // pages (PYTHONMALLOC=malloc measured 94 -> 117 MiB steady RSS with
        // memgap compare), so the remedy is in the code, not the allocator.
        let remedies = l["remedies"].as_array().unwrap();
        assert_eq!(
            (remedies[0]["id"].as_str(), remedies[0]["env"].as_object().map(|e| e.len())),
            (Some("python-object-lifetimes"), Some(0)),
            "{:#}",
            l["remedies"]
        );
        let empty_pools = u(&py["empty_pool_bytes"]);
        for r in remedies.iter().filter(|r| r["env"]["PYTHONMALLOC"] == "malloc") {
            assert!(u(&r["expected_savings_bytes"]) <= empty_pools + u(&share["rows"]["retained"]), "{r:#} {py:#}");
        }
        assert!(l["verdict"].as_str().unwrap().contains("pymalloc"), "{}", l["verdict"]);
    }
}

#[test]
fn pythonmalloc_malloc_and_dev_mode_are_named() {
    let (_tmp, dir) = tempdir();
    // PYTHONMALLOC=malloc: no pymalloc layer; the objects are glibc's blocks.
    let (l, _) = traced_cache(&dir, "malloc.mgt", &["env", "PYTHONMALLOC=malloc", DEBIAN_PYTHON]);
    assert_eq!(l["python"]["allocator"], "malloc", "{:#}", l["python"]);
    assert_eq!(u(&l["python"]["arenas"]), 0);
    assert!(l["owners"].as_array().unwrap().iter().all(|o| o["owner"] != "python"), "{:#}", l["owners"]);
    let glibc = l["owners"].as_array().unwrap().iter().find(|o| o["owner"] == "glibc").unwrap();
    assert!(u(&glibc["rows"]["live"]) > 1 << 20, "{glibc:#}");
    rows_add_up(&l);
    // -X dev: the debug hooks over pymalloc, named, with their padded blocks counted.
    let (l, stats) = traced_cache(&dir, "dev.mgt", &[DEBIAN_PYTHON, "-X", "dev"]);
    let py = &l["python"];
    assert_eq!((py["allocator"].as_str(), py["allocator_name"].as_str()), (Some("debug"), Some("pymalloc_debug")), "{py:#}");
    let (ours, theirs) = (u(&py["allocated_blocks_bytes"]), malloc_stat(&stats, "# bytes in allocated blocks"));
    assert!((ours as f64 - theirs as f64).abs() <= 0.05 * theirs as f64, "{ours} against {theirs}");
    rows_add_up(&l);
}

#[test]
fn multiprocessing_children_are_traced_with_their_layer() {
    let (_tmp, dir) = tempdir();
    let children = script("children.py");
    let out = memgap(&dir, &["run", "-q", "-o", "parent.mgt", "--", DEBIAN_PYTHON, arg(&children), "fork", "spawn"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "4000\nfork 0\n4000\nspawn 0\n");
    let mut layered = 0;
    for trace in traces_in(&dir).into_iter().filter(|t| t != "parent.mgt") {
        let out = memgap(&dir, &["timeline", "--json", &trace]);
        let timeline: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let Some(l) = timeline["snapshots"].as_array().and_then(|t| t.iter().find(|l| l["snapshot_reason"] == "program")) else { continue };
        let py = &l["python"];
        assert!(py["version"].as_str().is_some_and(|v| v.starts_with("3.11")), "{trace}: {py:#}");
        assert_eq!(py["allocator"], "pymalloc", "{trace}: {py:#}");
        // 4,000 tuples and strings kept, among the pools of 200,000.
        assert!(u(&py["allocated_blocks_bytes"]) > 300 << 10, "{trace}: {py:#}");
        assert!(l["owners"].as_array().unwrap().iter().any(|o| o["owner"] == "python"), "{trace}: {:#}", l["owners"]);
        rows_add_up(l);
        // Python frames in the child's own stacks: the fork child records
        // the code objects it inherited again, into its own trace.
        let top = &blame(&dir, &trace, "allocated")[0];
        assert_eq!(place(top), "child.<locals>.<listcomp> children.py:13", "{trace}: {top:#}");
        let stack = top["stack"].as_array().unwrap();
        assert!(stack.iter().filter(|f| is_python_frame(f)).count() >= 4, "{trace}: {top:#}");
        assert!(
            !stack.iter().any(|f| f["function"].as_str().is_some_and(|f| f.starts_with("<python code"))),
            "{trace}: every code object named: {top:#}"
        );
        layered += 1;
    }
    assert_eq!(layered, 2, "a fork child and a spawned child, each with its snapshot: {:?}", traces_in(&dir));
}

/// A few survivors per arena: pymalloc keeps every arena whole (its empty
/// pools too); the ledger says so and its first remedy that needs no code
/// change, run on the same program, lowers the RSS measured from outside.
#[test]
fn empty_pools_in_live_arenas_and_the_remedy_that_returns_them() {
    let (_tmp, dir) = tempdir();
    let arenas = script("arenas.py");
    let out = memgap(&dir, &["run", "-q", "-o", "arenas.mgt", "--", DEBIAN_PYTHON, arg(&arenas), "2000000", "5000", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let l = program_snapshot(&dir, "arenas.mgt");
    rows_add_up(&l);
    let py = &l["python"];
    assert_eq!(l["gap_owner"], "python", "{l:#}");
    // 2,000,000 tuples and ints over some 190 arenas, one in 5,000 kept:
    // most of the arenas' bytes are empty pools pymalloc does not give back.
    let share = l["owners"].as_array().unwrap().iter().find(|o| o["owner"] == "python").unwrap();
    assert!(u(&py["empty_pool_bytes"]) * 2 > u(&share["rows"]["fragmented"]), "{py:#}");
    assert!(u(&py["pools_empty"]) > 5 * u(&py["pools_used"]), "{py:#}");
    let remedies = l["remedies"].as_array().unwrap();
    let first = remedies.iter().find(|r| !r["env"].as_object().unwrap().is_empty()).unwrap_or_else(|| panic!("{l:#}"));
    assert_eq!(first["id"], "python-malloc-trim", "glibc serves python3: {remedies:#?}");
    let mut env: Vec<(String, String)> = Vec::new();
    for (key, value) in first["env"].as_object().unwrap() {
        let value = value.as_str().unwrap();
        let value = if key == "LD_PRELOAD" { memgap_bin().with_file_name(value).display().to_string() } else { value.to_string() };
        env.push((key.clone(), value));
    }
    let cmd = [DEBIAN_PYTHON, arg(&arenas), "2000000", "5000", "2"];
    let plain = holding_rss(&cmd, &[]);
    let remedied = holding_rss(&cmd, &env);
    eprintln!(
        "{}: RSS {} MiB plain, {} MiB with it (expected savings {} MiB)",
        first["id"],
        plain >> 20,
        remedied >> 20,
        u(&first["expected_savings_bytes"]) >> 20
    );
    assert!(remedied * 2 <= plain, "{}: {plain} B plain, {remedied} B with it", first["id"]);
}

/// Blame's entries as JSON, ordered by `by`.
fn blame(dir: &Path, trace: &str, by: &str) -> Vec<Value> {
    let out = memgap(dir, &["blame", "--json", "--by", by, trace]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

/// "function file:line" of a frame or entry (the file's name only).
fn place(frame: &Value) -> String {
    let file = frame["file"].as_str().unwrap_or("");
    format!(
        "{} {}:{}",
        frame["function"].as_str().unwrap_or("?"),
        file.rsplit('/').next().unwrap_or(file),
        frame["line"].as_u64().unwrap_or(0)
    )
}

/// Blame's entries as JSON, in its default order.
fn blame_by_default(dir: &Path, trace: &str) -> Vec<Value> {
    let out = memgap(dir, &["blame", "--json", trace]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

/// Most of pymalloc's fragmented row (free blocks and empty pools in the
/// arenas, counted from the pool headers) is the site's, and no more than
/// the row: the site's objects filled the arenas that the survivors keep.
fn arenas_fragmentation_is_the_sites(site: &Value, l: &Value) {
    let share = l["owners"].as_array().unwrap().iter().find(|o| o["owner"] == "python").unwrap_or_else(|| panic!("{l:#}"));
    let (theirs, row) = (u(&site["fragmentation_bytes"]), u(&share["rows"]["fragmented"]));
    eprintln!("{}: fragmentation {theirs} of pymalloc's {row}", place(site));
    assert!(theirs as f64 >= 0.8 * row as f64 && theirs <= row + (64 << 10), "{theirs} of {row}: {site:#} {share:#}");
    assert!(u(&site["live_bytes"]) > u(&share["rows"]["live"]) / 2, "{site:#} {share:#}");
}

fn is_python_frame(frame: &Value) -> bool {
    frame["file"].as_str().is_some_and(|f| f.ends_with(".py") || f.starts_with("<frozen"))
}

/// Python frames in blame, flame graphs and pprof: the line of the script
/// that grew its cache (a dict comprehension), under the functions that
/// called it, in place of the interpreter's eval loop; none with
/// --python-stacks=off. The program's output and pymalloc's own counts are
/// those of a plain run.
#[test]
fn blame_names_the_python_line_that_grows_a_cache() {
    let (_tmp, dir) = tempdir();
    let cache = script("cache.py");
    let args = [arg(&cache), "200000", "20", "--stats"];
    let plain = run_plain(&dir, DEBIAN_PYTHON, &args);
    let mut run = vec!["run", "-q", "-o", "cache.mgt", "--", DEBIAN_PYTHON];
    run.extend_from_slice(&args);
    let traced = memgap(&dir, &run);
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    let (plain_stats, traced_stats) = (text(&plain.stderr), text(&traced.stderr));
    assert_eq!(malloc_stat(&traced_stats, "# arenas allocated current"), malloc_stat(&plain_stats, "# arenas allocated current"));
    let (ours, theirs) =
        (malloc_stat(&traced_stats, "# bytes in allocated blocks"), malloc_stat(&plain_stats, "# bytes in allocated blocks"));
    assert!((ours as f64 - theirs as f64).abs() <= 0.01 * theirs as f64, "{ours} traced against {theirs} plain");

    // Blame's default order, by fragmentation: the arenas the cache's
    // objects filled, kept resident by the one entry in 20 left.
    let l = program_snapshot(&dir, "cache.mgt");
    let top = &blame_by_default(&dir, "cache.mgt")[0];
    assert_eq!(place(top), "build.<locals>.<dictcomp> cache.py:19", "{top:#}");
    arenas_fragmentation_is_the_sites(top, &l);

    let entries = blame(&dir, "cache.mgt", "live");
    let top = &entries[0];
    assert_eq!(place(top), "build.<locals>.<dictcomp> cache.py:19", "{top:#}");
    assert!(top["file"].as_str().unwrap().ends_with("tests/programs/python/cache.py"), "{top:#}");
    // The dict's table: the 200,000 entries' slots, mostly deleted since.
    assert!(u(&top["live_bytes"]) > 4 << 20, "{top:#}");
    let stack: Vec<String> = top["stack"].as_array().unwrap().iter().map(place).collect();
    let python: Vec<&String> = stack.iter().filter(|p| p.contains("cache.py")).collect();
    assert_eq!(
        python,
        ["build.<locals>.<dictcomp> cache.py:19", "build cache.py:19", "main cache.py:24", "<module> cache.py:36"],
        "{stack:#?}"
    );
    // Native frames around them: what the interpreter called to grow the
    // dict above, how it was started below; its eval loop replaced.
    let first_python = stack.iter().position(|p| p.contains("cache.py")).unwrap();
    assert!(first_python > 0 && stack.iter().skip(first_python).any(|p| p.starts_with("Py_RunMain")), "{stack:#?}");
    assert!(!stack.iter().any(|p| p.starts_with("_PyEval_EvalFrameDefault")), "{stack:#?}");

    // Flame graph, folded stacks and pprof show the same frames.
    let (pprof, folded, svg) = (dir.join("cache.pb.gz"), dir.join("cache.folded"), dir.join("cache.svg"));
    let out = memgap(&dir, &["export", "cache.mgt", "--pprof", arg(&pprof), "--folded", arg(&folded)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let folded = std::fs::read_to_string(&folded).unwrap();
    assert!(folded.lines().any(|l| l.contains("<module>;main;build;build.<locals>.<dictcomp>")), "{folded}");
    let out = memgap(&dir, &["flamegraph", "cache.mgt", "-o", arg(&svg)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("build.&lt;locals&gt;.&lt;dictcomp&gt;"));
    let profile = memgap_views::export::read_pprof(&std::fs::read(&pprof).unwrap()).unwrap();
    let string = |index: i64| profile.string_table[index as usize].as_str();
    let lines: Vec<(String, String, i64)> = profile
        .location
        .iter()
        .flat_map(|location| &location.line)
        .map(|line| {
            let function = &profile.function[line.function_id as usize - 1];
            (string(function.name).to_string(), string(function.filename).rsplit('/').next().unwrap().to_string(), line.line)
        })
        .collect();
    assert!(lines.contains(&("build.<locals>.<dictcomp>".into(), "cache.py".into(), 19)), "{lines:?}");

    // Off: native frames only, the same program output.
    let mut run = vec!["run", "-q", "--python-stacks=off", "-o", "off.mgt", "--", DEBIAN_PYTHON];
    run.extend_from_slice(&args);
    let off = memgap(&dir, &run);
    assert!(off.status.success(), "{}", text(&off.stderr));
    assert_eq!(text(&off.stdout), text(&plain.stdout));
    let entries = blame(&dir, "off.mgt", "live");
    assert!(!entries.is_empty());
    for entry in &entries {
        assert!(!is_python_frame(entry) && !entry["stack"].as_array().unwrap().iter().any(is_python_frame), "{entry:#}");
    }
}

/// pymalloc-heavy and shaped differently from cache.py: a dict of small
/// lists grown a batch at a time by a function of another module, called
/// from a loop; one entry in 16 kept. Blame's default order (by
/// fragmentation) names the line whose objects filled the arenas that the
/// survivors keep resident; the rows still add up to VmRSS.
#[test]
fn blame_by_default_names_the_line_whose_objects_keep_arenas_resident() {
    let (_tmp, dir) = tempdir();
    let index = script("index.py");
    let args = [arg(&index), "50", "4000", "16"];
    let plain = run_plain(&dir, DEBIAN_PYTHON, &args);
    let mut run = vec!["run", "-q", "-o", "index.mgt", "--", DEBIAN_PYTHON];
    run.extend_from_slice(&args);
    let traced = memgap(&dir, &run);
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(text(&traced.stdout), text(&plain.stdout));
    assert_eq!(text(&traced.stdout), format!("12500 {}\n", (0..200_000u64).step_by(16).sum::<u64>()));
    let l = program_snapshot(&dir, "index.mgt");
    rows_add_up(&l);
    assert_eq!(l["gap_owner"], "python", "{l:#}");
    let entries = blame_by_default(&dir, "index.mgt");
    let top = &entries[0];
    assert_eq!(place(top), "add_batch index_store.py:7", "{top:#}");
    assert!(top["file"].as_str().unwrap().ends_with("tests/programs/python/index_store.py"), "{top:#}");
    arenas_fragmentation_is_the_sites(top, &l);
    let stack: Vec<String> = top["stack"].as_array().unwrap().iter().filter(|f| is_python_frame(f)).map(place).collect();
    assert_eq!(stack, ["add_batch index_store.py:7", "main index.py:18", "<module> index.py:28"], "{top:#}");
    // The column sums to the header's fragmented row, pymalloc's with malloc's.
    let out = memgap(&dir, &["blame", "--json", "--top", "100000", "index.mgt"]);
    let all: Vec<Value> = serde_json::from_slice::<Value>(&out.stdout).unwrap().as_array().unwrap().clone();
    let column: u64 = all.iter().map(|e| u(&e["fragmentation_bytes"])).sum();
    let row = u(&l["rows"]["fragmented"]);
    assert!((column as f64 - row as f64).abs() <= 0.02 * row as f64, "column {column} against the fragmented row {row}");
    // The page map draws the arenas as the python owner's pages (by fill,
    // mostly free: '.'), not as program mmaps ('p', other).
    let out = memgap(&dir, &["map", "--color", "never", "index.mgt"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let map = text(&out.stdout);
    let cells: String = map.lines().filter(|l| l.starts_with("  0x")).map(|l| l.split_at(17.min(l.len())).1).collect();
    let count = |c: char| cells.chars().filter(|&x| x == c).count();
    assert!(count('.') > 1000 && count('p') * 100 < count('.'), "{map}");
}

/// A differently shaped program: buffers (bytearrays, malloc'd by the
/// interpreter) made by a nested function of a class with __slots__,
/// called from two places: one site, two stacks, each with its caller.
#[test]
fn blame_names_a_nested_python_function_called_from_two_places() {
    let (_tmp, dir) = tempdir();
    let journal = script("journal.py");
    let plain = run_plain(&dir, DEBIAN_PYTHON, &[arg(&journal), "300", "200"]);
    let out = memgap(&dir, &["run", "-q", "-o", "journal.mgt", "--", DEBIAN_PYTHON, arg(&journal), "300", "200"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&plain.stdout));
    assert_eq!(text(&out.stdout), format!("500 {}\n", 300 * 65536 + 200 * 16384));
    // Over the whole run: the buffers are freed at exit, before the last snapshot.
    let entries = blame(&dir, "journal.mgt", "allocated");
    let top = &entries[0];
    assert_eq!(place(top), "Journal.record.<locals>.page journal.py:19", "{top:#}");
    assert_eq!(top["stacks"], 2, "{top:#}");
    assert_eq!(u(&top["allocations"]), 500, "{top:#}");
    assert!(u(&top["allocated_bytes"]) >= 300 * 65536 + 200 * 16384, "{top:#}");
    // The stack shown is the one allocating most: 300 buffers of 64 KiB from from_requests.
    let stack: Vec<String> = top["stack"].as_array().unwrap().iter().filter(|f| is_python_frame(f)).map(place).collect();
    assert_eq!(
        stack,
        [
            "Journal.record.<locals>.page journal.py:19",
            "Journal.record journal.py:21",
            "from_requests journal.py:26",
            "main journal.py:37",
            "<module> journal.py:42"
        ],
        "{top:#}"
    );
    let per_stack = memgap(&dir, &["blame", "--json", "--by", "allocated", "--per-stack", "journal.mgt"]);
    let per_stack: Value = serde_json::from_slice(&per_stack.stdout).unwrap();
    let callers: Vec<(String, u64)> = per_stack
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| place(e).starts_with("Journal.record.<locals>.page"))
        .map(|e| {
            (
                e["stack"].as_array().unwrap().iter().filter(|f| is_python_frame(f)).map(place).nth(2).unwrap_or_default(),
                u(&e["allocations"]),
            )
        })
        .collect();
    assert_eq!(
        callers,
        [("from_requests journal.py:26".to_string(), 300), ("from_replay journal.py:31".to_string(), 200)],
        "{per_stack:#}"
    );
}

/// Interpreters whose frame layout the agent does not read (pyenv's 3.10,
/// 3.12 and 3.13, where installed) run as plain, with native frames only.
#[test]
fn other_python_versions_run_unharmed_with_native_frames_only() {
    let (_tmp, dir) = tempdir();
    let journal = script("journal.py");
    for version in ["3.10.13", "3.12.1", "3.13.0"] {
        let python = format!("/root/.pyenv/versions/{version}/bin/python3");
        if !Path::new(&python).exists() {
            continue;
        }
        let trace = format!("journal-{version}.mgt");
        let plain = run_plain(&dir, &python, &[arg(&journal), "30", "20"]);
        let traced = memgap(&dir, &["run", "-q", "-o", &trace, "--", &python, arg(&journal), "30", "20"]);
        assert_same_behaviour(&plain, &traced);
        let entries = blame(&dir, &trace, "allocated");
        assert!(!entries.is_empty(), "{version}");
        for entry in &entries {
            assert!(
                !entry["stack"].as_array().unwrap().iter().any(|f| f["file"].as_str().is_some_and(|f| f.ends_with("journal.py"))),
                "{version}: {entry:#}"
            );
        }
    }
}
