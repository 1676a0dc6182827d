//! Blame and its exports on real programs under the real agent: a planted
//! culprit (tests/programs/culprit.c), C++ with deep recursion and
//! exceptions, Rust, code without frame pointers, a stripped binary.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

/// Records `prog ARGS` (no periodic snapshots) with extra `memgap run` flags.
fn record(dir: &Path, prog: &Path, run_flags: &[&str]) -> PathBuf {
    let trace = dir.join(format!("{}.mgt", prog.file_name().unwrap().to_string_lossy()));
    let mut args = vec!["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace)];
    args.extend_from_slice(run_flags);
    args.extend_from_slice(&["--", arg(prog)]);
    let out = memgap(dir, &args);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    trace
}

fn blame(trace: &Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["blame", arg(trace), "--json", "--at", "end"];
    all.extend_from_slice(args);
    let out = memgap(trace.parent().unwrap(), &all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("blame JSON")
}

fn fragmented_row(trace: &Path) -> f64 {
    let out = memgap(trace.parent().unwrap(), &["ledger", arg(trace), "--json", "--at", "end"]);
    let ledger: Value = serde_json::from_slice(&out.stdout).unwrap();
    ledger["rows"]["fragmented"].as_f64().unwrap()
}

/// The line of `tests/programs/<file>` that holds `marker`.
fn line_of(file: &str, marker: &str) -> u64 {
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs").join(file)).unwrap();
    source.lines().position(|l| l.contains(marker)).unwrap_or_else(|| panic!("{marker} not in {file}")) as u64 + 1
}

fn function(entry: &Value) -> &str {
    entry["function"].as_str().unwrap_or("")
}

fn compile_with(dir: &Path, source: &str, name: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs").join(source);
    let compiler = if source.ends_with(".cpp") { "c++" } else { "cc" };
    let mut args: Vec<&str> = flags.to_vec();
    args.extend_from_slice(&["-o", arg(&exe), arg(&src)]);
    let out = output_of(std::process::Command::new(compiler).args(&args));
    assert!(out.status.success(), "{}", text(&out.stderr));
    exe
}

/// The planted culprit, for a binary built with `flags`: the sparse site
/// first by fragmentation with nearly all of the fragmented row, the dense
/// one first by live bytes, the temporary one nowhere.
fn check_culprit(flags: &[&str], run_flags: &[&str]) {
    let (_tmp, dir) = tempdir();
    let prog = compile_with(&dir, "culprit.c", "culprit", flags);
    let trace = record(&dir, &prog, run_flags);
    let by_fragmentation = blame(&trace, &[]);
    let sparse = &by_fragmentation[0];
    assert_eq!(function(sparse), "site_sparse", "{by_fragmentation:#?}");
    assert_eq!(sparse["line"].as_u64(), Some(line_of("culprit.c", "SITE_SPARSE")), "{sparse:#}");
    assert!(sparse["file"].as_str().unwrap().ends_with("culprit.c"), "{sparse:#}");
    // Expected: every page its survivors occupy, less the bytes they take.
    let expected = sparse["pages"].as_f64().unwrap() * 4096.0 - sparse["objects"].as_f64().unwrap() * 80.0;
    let cost = sparse["fragmentation_bytes"].as_f64().unwrap();
    assert!((cost - expected).abs() <= 0.1 * expected, "cost {cost}, expected {expected}");
    assert!(cost >= 0.9 * fragmented_row(&trace), "site_sparse should hold nearly all fragmentation");
    assert_eq!(sparse["objects"].as_u64(), Some((64 << 20) / 64 / 64));

    let by_live = blame(&trace, &["--by", "live"]);
    assert_eq!(function(&by_live[0]), "site_dense", "{by_live:#?}");
    assert_eq!(by_live[0]["line"].as_u64(), Some(line_of("culprit.c", "SITE_DENSE")));
    assert!(by_live[0]["fragmentation_bytes"].as_f64().unwrap() < 0.01 * cost);
    assert!(!by_live.iter().any(|e| function(e) == "site_temp"), "site_temp keeps nothing: {by_live:#?}");
    let leaked = blame(&trace, &["--by", "leaked"]);
    assert_eq!(function(&leaked[0]), "site_dense");
}

#[test]
fn culprit_without_frame_pointers() {
    check_culprit(&["-O2", "-g", "-fomit-frame-pointer", "-fno-builtin", "-fno-inline"], &[]);
}

#[test]
fn culprit_with_frame_pointers_and_fp_unwinding() {
    check_culprit(&["-O1", "-g", "-fno-omit-frame-pointer", "-fno-builtin", "-fno-inline"], &["--unwind", "fp"]);
}

#[test]
fn stripped_binary_gives_module_offsets() {
    let (_tmp, dir) = tempdir();
    let prog = compile_with(&dir, "culprit.c", "culprit", &["-O2", "-fno-builtin", "-fno-inline", "-s"]);
    let trace = record(&dir, &prog, &[]);
    let entries = blame(&trace, &[]);
    let top = function(&entries[0]);
    assert!(top.starts_with("culprit+0x"), "a stripped binary's site is module+offset: {entries:#?}");
}

#[test]
fn no_stacks_is_one_entry() {
    let (_tmp, dir) = tempdir();
    let prog = compile_with(&dir, "culprit.c", "culprit", &["-O2", "-fno-builtin"]);
    let trace = record(&dir, &prog, &["--no-stacks"]);
    let entries = blame(&trace, &[]);
    assert_eq!(entries.len(), 1, "{entries:#?}");
    assert_eq!(function(&entries[0]), "(no stack recorded)");
}

#[test]
fn deep_cpp_recursion_and_exceptions() {
    let (_tmp, dir) = tempdir();
    // -O0: at -O2 the compiler turns the recursion into a loop.
    let prog = compile_with(&dir, "deep.cpp", "deep", &["-O0", "-g"]);
    let plain = run_plain(&dir, arg(&prog), &[]);
    let trace = record(&dir, &prog, &["--stack-depth", "128"]);
    assert!(text(&plain.stdout).contains("caught: unwound through 20 frames"));
    let entries = blame(&trace, &["--by", "live", "--per-stack"]);
    let deepest = entries.iter().find(|e| {
        e["stack"].as_array().unwrap().iter().filter(|f| f["function"].as_str().is_some_and(|f| f.contains("descend"))).count() >= 60
    });
    let deepest = deepest.unwrap_or_else(|| panic!("no stack 60 frames down through descend: {entries:#?}"));
    assert!(deepest["live_bytes"].as_u64().unwrap() >= 1000 * 200, "{deepest:#}");
    // The site is the program's own frame, past operator new and std::string.
    let by_site = blame(&trace, &["--by", "live"]);
    assert_eq!(function(&by_site[0]), "descend", "{by_site:#?}");
}

#[test]
fn rust_functions_are_demangled() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "rust_alloc.rs");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(7));
    // The program asks for a snapshot while its data is alive (at exit Rust
    // has dropped it): the last snapshot but the exit one.
    let timeline: Value = serde_json::from_slice(&memgap(&dir, &["timeline", arg(&trace), "--json"]).stdout).unwrap();
    let at = timeline["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|l| l["snapshot_reason"] == "program")
        .expect("a program snapshot")["at_seconds"]
        .to_string();
    let out = memgap(&dir, &["blame", arg(&trace), "--json", "--at", &at, "--by", "live", "--per-stack", "--top", "1000"]);
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let frames: Vec<&str> =
        entries.iter().flat_map(|e| e["stack"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str())).collect();
    assert!(frames.iter().any(|f| f.starts_with("rust_alloc::main")), "{frames:#?}");
    assert!(!frames.iter().any(|f| f.starts_with("_ZN")), "mangled names left: {frames:#?}");
}

/// Built with debug information, a Rust program's allocations pass through
/// code inlined from the standard library (Vec, String, HashMap), whose
/// frames carry short names only (`alloc`, `from_elem`, `do_alloc`): the
/// site is still the program's own frame, in its own file.
#[test]
fn rust_sites_past_inlined_standard_library_code_are_the_programs_own() {
    for debuginfo in ["-Cdebuginfo=2", "-Cdebuginfo=line-tables-only"] {
        let (_tmp, dir) = tempdir();
        let prog = common::compile_with(&dir, "rust_alloc.rs", &[debuginfo]);
        let trace = dir.join("t.mgt");
        let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog)]);
        assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
        let timeline: Value = serde_json::from_slice(&memgap(&dir, &["timeline", arg(&trace), "--json"]).stdout).unwrap();
        let snapshots = timeline["snapshots"].as_array().unwrap();
        let program = snapshots.iter().rev().find(|l| l["snapshot_reason"] == "program").expect("a program snapshot");
        let at = program["at_seconds"].to_string();
        let out = memgap(&dir, &["blame", arg(&trace), "--json", "--at", &at, "--by", "live", "--top", "4"]);
        let sites: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert!(sites.len() >= 3, "{debuginfo}: {sites:#?}");
        for site in &sites[..3] {
            let file = site["file"].as_str().unwrap_or("");
            assert!(
                file.ends_with("rust_alloc.rs"),
                "{debuginfo}: a site outside the program, {:?} in {file:?}: {sites:#?}",
                site["function"]
            );
        }
    }
}

#[test]
fn exports_read_by_pprof_folded_and_flamegraph() {
    let (_tmp, dir) = tempdir();
    let prog = compile_with(&dir, "culprit.c", "culprit", &["-O2", "-g", "-fno-builtin", "-fno-inline"]);
    let trace = record(&dir, &prog, &[]);
    let pprof = dir.join("out.pb.gz");
    let folded = dir.join("out.folded");
    let svg = dir.join("out.svg");
    let out = memgap(&dir, &["export", arg(&trace), "--at", "end", "--pprof", arg(&pprof), "--folded", arg(&folded)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let folded_text = std::fs::read_to_string(&folded).unwrap();
    assert!(folded_text.lines().any(|l| l.contains("main;site_sparse")), "{folded_text}");
    let out = memgap(&dir, &["flamegraph", arg(&trace), "--at", "end", "-o", arg(&svg)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("site_sparse"));
    let go_installed = std::process::Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    if !go_installed {
        eprintln!("note: go is not installed; pprof output not checked with go tool pprof");
        return;
    }
    let go = output_of(std::process::Command::new("go").args(["tool", "pprof", "-top", "-sample_index=fragmentation_space", arg(&pprof)]));
    assert!(go.status.success(), "{}", text(&go.stderr));
    let top = text(&go.stdout);
    assert!(top.lines().any(|l| l.contains("site_sparse")), "{top}");
}

/// Call paths that reach malloc at the same stack depth, in a changing
/// order: the agent remembers stack walks by stack pointer, and a recalled
/// walk must be the one its own path takes. Each path allocates its own
/// size, so a stack that got another path's allocations would hold bytes
/// that are no multiple of its size.
#[test]
fn paths_that_share_a_stack_depth_keep_their_own_stacks() {
    let dir = tempfile::tempdir().unwrap();
    for (name, flags) in [("stack_paths", &["-O2", "-g"][..]), ("stack_paths_fp", &["-O2", "-g", "-fno-omit-frame-pointer"][..])] {
        let prog = compile_with(dir.path(), "stack_paths.c", name, flags);
        let trace = record(dir.path(), &prog, &[]);
        let entries = blame(&trace, &["--per-stack", "--by", "live", "--top", "100"]);
        let functions = |entry: &Value| -> Vec<String> {
            entry["stack"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str().map(String::from)).collect()
        };
        let mut paths = std::collections::BTreeSet::new();
        for entry in entries.iter().filter(|e| functions(e).iter().any(|f| f == "leaf")) {
            let stack = functions(entry);
            let path = ["path_a", "path_b", "path_c"]
                .iter()
                .position(|p| stack.iter().any(|f| f == p))
                .unwrap_or_else(|| panic!("{name}: no path in {stack:?}"));
            let size = 101 + path as u64;
            let (live, objects) = (entry["live_bytes"].as_u64().unwrap(), entry["objects"].as_u64().unwrap());
            assert_eq!(live, objects * size, "{name}: the stack {stack:?} holds blocks of another path");
            let via = stack.iter().any(|f| f == "middle");
            assert_eq!(via, stack.iter().any(|f| f == "via_a" || f == "via_b"), "{name}: {stack:?}");
            assert!(objects > 300, "{name}: {objects} blocks on {stack:?}");
            paths.insert((path, via));
        }
        assert_eq!(paths.len(), 5, "{name}: every path has its own stack: {paths:?}");
    }
}

/// What tests/programs/churn_sites.c printed it allocated at `site`: (allocations, bytes).
fn allocated_by(program_output: &str, site: &str) -> (u64, u64) {
    let line =
        program_output.lines().find(|l| l.starts_with(&format!("{site} "))).unwrap_or_else(|| panic!("no {site} in {program_output}"));
    let numbers: Vec<u64> = line.split_whitespace().skip(1).map(|n| n.parse().unwrap()).collect();
    (numbers[0], numbers[1])
}

fn entry<'a>(entries: &'a [Value], site: &str) -> Option<&'a Value> {
    entries.iter().find(|e| function(e) == site)
}

fn u64_of(entry: &Value, key: &str) -> u64 {
    entry[key].as_u64().unwrap_or_else(|| panic!("no {key} in {entry:#}"))
}

/// A site that allocates and frees tens of MiB in short-lived blocks tops
/// `--by temporary` and `--by allocated` with exactly what the program
/// allocated there, and is nowhere in the default view; the pprof profile
/// counts every allocation in alloc_objects / alloc_space, under the
/// executable's mapping, with malloc's frames dropped.
#[test]
fn a_churning_site_tops_temporary_and_allocated_and_pprof_counts_it_whole() {
    let (_tmp, dir) = tempdir();
    let prog = compile_with(&dir, "churn_sites.c", "churn_sites", &["-O0", "-g"]);
    let trace = dir.join("churn.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog), "15000"]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let churn = allocated_by(&printed, "churn_block");
    assert_eq!(churn.0, 15_000);
    assert!(churn.1 > 30 << 20, "tens of MiB churned: {printed}");
    let hold = allocated_by(&printed, "hold_block");
    let slow = allocated_by(&printed, "slow_block");

    let run_blame = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["blame", arg(&trace), "--json"];
        all.extend_from_slice(args);
        let out = memgap(&dir, &all);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("blame JSON")
    };
    let temporary = run_blame(&["--by", "temporary"]);
    let top = &temporary[0];
    assert_eq!(function(top), "churn_block", "{temporary:#?}");
    assert_eq!(top["line"].as_u64(), Some(line_of("churn_sites.c", "CHURN_SITE")));
    assert_eq!((u64_of(top, "temporary_allocations"), u64_of(top, "temporary_bytes")), churn, "{top:#}");
    assert_eq!((u64_of(top, "allocations"), u64_of(top, "allocated_bytes")), churn, "{top:#}");
    // Blocks kept 300 ms, or to the end, are not temporary.
    assert!(entry(&temporary, "slow_block").is_none() && entry(&temporary, "hold_block").is_none(), "{temporary:#?}");
    // A window long enough takes in the slow site too.
    let long_window = run_blame(&["--by", "temporary", "--temporary-ms", "5000"]);
    let slow_entry = entry(&long_window, "slow_block").expect("slow_block freed within 5 s");
    assert_eq!((u64_of(slow_entry, "temporary_allocations"), u64_of(slow_entry, "temporary_bytes")), slow);
    assert!(entry(&long_window, "hold_block").is_none(), "hold_block never frees: {long_window:#?}");

    let allocated = run_blame(&["--by", "allocated"]);
    assert_eq!(function(&allocated[0]), "churn_block", "{allocated:#?}");
    assert_eq!((u64_of(&allocated[0], "allocations"), u64_of(&allocated[0], "allocated_bytes")), churn);
    let held = entry(&allocated, "hold_block").expect("hold_block allocated");
    assert_eq!((u64_of(held, "allocations"), u64_of(held, "allocated_bytes")), hold);
    assert_eq!(u64_of(held, "temporary_allocations"), 0);
    let slow_entry = entry(&allocated, "slow_block").expect("slow_block allocated");
    assert_eq!((u64_of(slow_entry, "allocations"), u64_of(slow_entry, "allocated_bytes")), slow);
    assert_eq!(u64_of(slow_entry, "temporary_allocations"), 0);

    // The default view is about what stays resident: the churn is not there.
    let default = run_blame(&[]);
    assert!(entry(&default, "churn_block").is_none(), "{default:#?}");
    let live = run_blame(&["--by", "live"]);
    assert_eq!(function(&live[0]), "hold_block", "{live:#?}");

    let text_view = memgap(&dir, &["blame", arg(&trace), "--by", "temporary"]);
    let shown = text(&text_view.stdout);
    assert!(shown.contains(&format!("{} of them", fmt_count(churn.0))) && shown.contains("freed within 10 ms"), "{shown}");

    let pprof = dir.join("churn.pb.gz");
    let out = memgap(&dir, &["export", arg(&trace), "--pprof", arg(&pprof)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let profile = memgap_views::export::read_pprof(&std::fs::read(&pprof).unwrap()).unwrap();
    let string = |index: i64| profile.string_table[index as usize].as_str();
    let types: Vec<&str> = profile.sample_type.iter().map(|t| string(t.r#type)).collect();
    let index = |name: &str| types.iter().position(|t| *t == name).unwrap_or_else(|| panic!("no {name} in {types:?}"));
    let leaf_function = |sample: &memgap_views::export::proto::Sample| -> String {
        let location = &profile.location[sample.location_id[0] as usize - 1];
        let line = location.line.first().expect("a symbolized leaf");
        string(profile.function[line.function_id as usize - 1].name).to_string()
    };
    let churn_samples: Vec<_> = profile.sample.iter().filter(|s| leaf_function(s) == "churn_block").collect();
    assert!(!churn_samples.is_empty(), "the allocation site is the leaf, malloc's frames dropped");
    let sum = |i: usize| churn_samples.iter().map(|s| s.value[i]).sum::<i64>() as u64;
    assert_eq!((sum(index("alloc_objects")), sum(index("alloc_space"))), churn);
    assert_eq!((sum(index("temporary_objects")), sum(index("temporary_space"))), churn);
    assert_eq!(sum(index("live_space")), 0);
    for sample in &profile.sample {
        assert!(!["malloc", "free"].contains(&leaf_function(sample).as_str()), "an allocator frame is a leaf");
    }
    assert_eq!(string(profile.mapping[0].filename), arg(&prog), "the executable is the profile's main mapping");
    // The README names every sample type memgap writes.
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    for name in &types {
        assert!(readme.contains(&format!("`{name}`")), "the README does not name the sample type {name}");
    }
}

/// 1234567 → "1,234,567", as the terminal views print counts.
fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// C++ names are shortened by default wherever blame's names go (the
/// terminal, JSON, folded stacks, the flame graph, the report): cpp_alloc's
/// std::map frames run past 1,000 characters demangled, cpp_templates's
/// past 8,000. `--full-names` gives them whole.
#[test]
fn cpp_names_are_short_unless_full_names_is_asked() {
    let (_tmp, dir) = tempdir();
    let prog = compile_with(&dir, "cpp_alloc.cpp", "cpp_alloc", &["-O1", "-g"]);
    let trace = dir.join("cpp_alloc.mgt");
    let out = memgap(&dir, &["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(5), "cpp_alloc exits 5: {}", text(&out.stderr));
    let longest = |full: &[&str]| -> String {
        let entries = blame(&trace, &[&["--per-stack", "--by", "allocated"], full].concat());
        let names = entries.iter().flat_map(|e| {
            e["stack"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).map(str::to_string).collect::<Vec<_>>()
        });
        names.max_by_key(|n| n.chars().count()).unwrap_or_default()
    };
    let (short, full) = (longest(&[]), longest(&["--full-names"]));
    assert!(full.chars().count() > 1000 && full.contains("std::_Rb_tree<std::__cxx11::basic_string<char"), "{full}");
    assert!(short.chars().count() <= 160 && !short.contains(", "), "{short}");
    let sites = |full: &[&str]| -> Vec<String> {
        blame(&trace, &[&["--by", "allocated"], full].concat()).iter().map(|e| function(e).to_string()).collect()
    };
    assert!(sites(&[]).iter().any(|s| s == "vectors_and_strings"), "the program's own names stay: {:?}", sites(&[]));
    for by in ["fragmentation", "live", "leaked", "allocated", "temporary"] {
        for per_stack in [&[][..], &["--per-stack"][..]] {
            let mut args = vec!["blame", arg(&trace), "--by", by];
            args.extend_from_slice(per_stack);
            let out = memgap(&dir, &args);
            assert!(out.status.success(), "{}", text(&out.stderr));
            let table = text(&out.stdout);
            assert!(table.lines().all(|l| l.chars().count() <= 200), "a line over 200 characters (--by {by} {per_stack:?}):\n{table}");
        }
    }
    // The report shows whole stacks.
    for (flag, long) in [(None, false), (Some("--full-names"), true)] {
        let html = dir.join(format!("{long}.html"));
        let mut args = vec!["report", arg(&trace), "-o", arg(&html)];
        args.extend(flag);
        assert!(memgap(&dir, &args).status.success());
        let html = std::fs::read_to_string(&html).unwrap();
        // The data sits in the page as JSON with `<` escaped.
        assert_eq!(html.contains("std::allocator\\u003cchar\\u003e \\u003e"), long, "report names (--full-names: {long})");
        assert!(html.contains("vectors_and_strings"));
    }
    // Folded stacks and flame graphs start at the allocation site: the
    // program's own templates are what they name (cpp_templates: a member
    // template called with a lambda).
    let prog = compile_with(&dir, "cpp_templates.cpp", "cpp_templates", &["-O0", "-g"]);
    let trace = record(&dir, &prog, &[]);
    for (flag, long) in [(None, false), (Some("--full-names"), true)] {
        let folded = dir.join(format!("{long}.folded"));
        let svg = dir.join(format!("{long}.svg"));
        for mut args in [
            vec!["export", arg(&trace), "--by", "allocated", "--folded", arg(&folded)],
            vec!["flamegraph", arg(&trace), "--by", "allocated", "-o", arg(&svg)],
        ] {
            args.extend(flag);
            let out = memgap(&dir, &args);
            assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        }
        let folded = std::fs::read_to_string(&folded).unwrap();
        let (whole, short) = ("main;grow<main()::<lambda(std::size_t)> >", "main;grow<…>");
        assert!(
            folded.contains(if long { whole } else { short }) && !folded.contains(if long { short } else { whole }),
            "--full-names {long}:\n{folded}"
        );
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert_eq!(svg.contains("lambda(std::size_t)"), long, "flame graph names (--full-names: {long})");
    }
    let widest = |full: &[&str]| {
        let entries = blame(&trace, &[&["--per-stack", "--by", "allocated"], full].concat());
        entries
            .iter()
            .flat_map(|e| {
                e["stack"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).map(|f| f.chars().count()).collect::<Vec<_>>()
            })
            .max()
            .unwrap_or(0)
    };
    let (short, whole) = (widest(&[]), widest(&["--full-names"]));
    assert!(short <= 160 && whole > 5000, "the widest name: {short} characters short, {whole} whole");
}

/// Allocations made on stacks the thread does not own have their call
/// sites: fibers on a heap block and on a mapping of their own, a thread
/// whose first allocation is made in a fiber, a handler on a sigaltstack
/// (tests/programs/fibers.c). The agent walks them from a stack of its own,
/// and the canary below the smallest fiber stack stays whole.
#[test]
fn allocations_on_fibers_and_alternate_stacks_keep_their_call_sites() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "fibers.c");
    let plain = run_plain(&dir, arg(&prog), &["200"]);
    assert_eq!(text(&plain.stdout), "fibers 200 ok\n");
    let trace = dir.join("fibers.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog), "200"]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "fibers 200 ok\n");
    let folded = dir.join("allocated.folded");
    let out = memgap(&dir, &["export", arg(&trace), "--by", "allocated", "--folded", arg(&folded)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let folded = std::fs::read_to_string(&folded).unwrap();
    let bytes_under =
        |path: &str| -> u64 { folded.lines().filter(|l| l.contains(path)).filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum() };
    // Three fibers of 200 allocations, of 1000 and 2000 bytes in turn.
    assert_eq!(bytes_under("fiber_body;allocate_in_fiber"), 3 * 100 * 1000, "{folded}");
    assert_eq!(bytes_under("fiber_body;allocate_more_in_fiber"), 3 * 100 * 2000, "{folded}");
    assert_eq!(bytes_under("thread_main;allocate_on_thread_stack"), 3000, "{folded}");
    assert_eq!(bytes_under(";allocate_in_handler"), 5000, "{folded}");
}
