//! The index beside a trace (`T.mgt.idx`): every command answers the same
//! with it, without it (`MEMGAP_INDEX=off`), with it damaged, stale or
//! replaced by a symlink; on the recorded fixtures and on a fresh recording.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/traces")
}

/// The commands whose answers are indexed, with the options that shape them.
fn queries(trace: &str, html: &str) -> Vec<Vec<String>> {
    let lists: Vec<Vec<&str>> = vec![
        vec!["summary", trace, "--json"],
        vec!["summary", trace],
        vec!["ledger", trace, "--json"],
        vec!["ledger", trace, "--json", "--at", "end"],
        vec!["ledger", trace, "--json", "--at", "peak"],
        vec!["ledger", trace, "--mappings"],
        vec!["blame", trace, "--json"],
        vec!["blame", trace, "--json", "--by", "allocated", "--per-stack"],
        vec!["blame", trace, "--json", "--by", "temporary", "--temporary-ms", "1"],
        vec!["blame", trace],
        vec!["timeline", trace, "--json"],
        vec!["timeline", trace, "--color", "never"],
        vec!["map", trace, "--color", "never"],
        vec!["report", trace, "-o", html],
    ];
    lists.into_iter().map(|l| l.into_iter().map(String::from).collect()).collect()
}

/// What each query printed (and the report it wrote), in order.
fn answers(dir: &Path, trace: &str, index: bool) -> Vec<String> {
    let html = dir.join("report.html");
    queries(trace, arg(&html))
        .iter()
        .map(|query| {
            let args: Vec<&str> = query.iter().map(String::as_str).collect();
            let mut cmd = memgap_cmd(dir, &args);
            if !index {
                cmd.env("MEMGAP_INDEX", "off");
            }
            let out = output_of(&mut cmd);
            assert!(out.status.success(), "memgap {args:?}: {}", text(&out.stderr));
            let mut answer = text(&out.stdout);
            if args[0] == "report" {
                answer += &std::fs::read_to_string(&html).unwrap();
                std::fs::remove_file(&html).unwrap();
            }
            answer
        })
        .collect()
}

fn assert_same(expected: &[String], got: &[String], what: &str) {
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        assert!(e == g, "{what}: query {i} answered differently:\n--- without index\n{e:.2000}\n--- with\n{g:.2000}");
    }
    assert_eq!(expected.len(), got.len());
}

fn index_of(trace: &Path) -> PathBuf {
    let mut name = trace.file_name().unwrap().to_os_string();
    name.push(".idx");
    trace.with_file_name(name)
}

/// A trace of each fixture copied into `dir` under `name`.
fn copy_fixture(fixture: &str, dir: &Path, name: &str) -> PathBuf {
    let trace = dir.join(name);
    std::fs::copy(fixtures_dir().join(fixture), &trace).unwrap();
    trace
}

/// Answers without the index, then with it twice; with `abuse`, also with
/// the index damaged, a symlink in its place and the trace replaced.
fn check_trace(dir: &Path, trace: &Path, other_fixture: &str, abuse: bool) {
    let name = arg(trace);
    let plain = answers(dir, name, false);
    assert!(!index_of(trace).exists(), "MEMGAP_INDEX=off writes no index");
    let first = answers(dir, name, true);
    assert_same(&plain, &first, "the first analysis");
    let index = index_of(trace);
    let meta = std::fs::symlink_metadata(&index).expect("an index beside the trace");
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777, 0o600);
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    let second = answers(dir, name, true);
    assert_same(&plain, &second, "from the index");
    // Every answer was found there: the index was not written again.
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&index).unwrap()), inode, "the second pass read the index");
    if !abuse {
        return;
    }

    // Damaged: cut short, bytes flipped, emptied.
    let good = std::fs::read(&index).unwrap();
    let mut flipped = good.clone();
    for at in [3, good.len() / 3, good.len() / 2, good.len() - 2] {
        flipped[at] ^= 0xa5;
    }
    for damaged in [good[..good.len() * 2 / 3].to_vec(), flipped, Vec::new()] {
        std::fs::write(&index, &damaged).unwrap();
        assert_same(&plain, &answers(dir, name, true), "a damaged index");
        assert_eq!(std::fs::read(&index).unwrap().len(), good.len(), "the damaged index is replaced");
    }

    // A symlink planted at the index's name: neither read nor followed.
    std::fs::remove_file(&index).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, &index).unwrap();
    assert_same(&plain, &answers(dir, name, true), "a symlink at the index");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    std::fs::remove_file(&index).unwrap();
    std::fs::remove_file(&victim).unwrap();

    // Stale: the trace replaced by another under the same name.
    answers(dir, name, true);
    let replacement = dir.join("replacement.mgt");
    std::fs::copy(fixtures_dir().join(other_fixture), &replacement).unwrap();
    std::fs::rename(&replacement, trace).unwrap();
    let other_plain = answers(dir, name, false);
    assert_ne!(other_plain, plain, "two different traces");
    assert_same(&other_plain, &answers(dir, name, true), "a stale index");
    assert_same(&other_plain, &answers(dir, name, true), "the rebuilt index");
}

#[test]
fn every_fixture_answers_the_same_with_and_without_its_index() {
    let mut fixtures: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".mgt"))
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 8, "{fixtures:?}");
    for (i, fixture) in fixtures.iter().enumerate() {
        let (_tmp, dir) = tempdir();
        let trace = copy_fixture(fixture, &dir, "t.mgt");
        // The glibc thread arenas' trace goes through every ill an index can have.
        check_trace(&dir, &trace, &fixtures[(i + 1) % fixtures.len()], fixture == "glibc-thread-arenas.mgt");
    }
}

#[test]
fn a_fresh_recording_answers_the_same_with_and_without_its_index() {
    let (_tmp, dir) = tempdir();
    let exe = compile_with(&dir, "churn_sites.c", &["-O0"]);
    let trace = dir.join("fresh.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&exe)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    check_trace(&dir, &trace, "glibc-main-arena.mgt", true);
}

#[test]
fn a_rebuilt_program_is_symbolized_again() {
    // An answer naming the program's functions holds only while the program is the same file.
    let (_tmp, dir) = tempdir();
    let exe = compile_with(&dir, "churn_sites.c", &["-O0"]);
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&exe)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let blame = |index: bool| {
        let mut cmd = memgap_cmd(&dir, &["blame", arg(&trace), "--json", "--by", "allocated"]);
        if !index {
            cmd.env("MEMGAP_INDEX", "off");
        }
        text(&output_of(&mut cmd).stdout)
    };
    let named = blame(true);
    assert_eq!(blame(true), named);
    std::fs::remove_file(&exe).unwrap();
    let unnamed = blame(false);
    assert_ne!(unnamed, named, "the program gone, its frames are module+offset");
    assert_eq!(blame(true), unnamed);
}

/// Asks `query` about `trace`, with the index or without.
fn ask(dir: &Path, query: &[String], index: bool) -> String {
    let args: Vec<&str> = query.iter().map(String::as_str).collect();
    let mut cmd = memgap_cmd(dir, &args);
    if !index {
        cmd.env("MEMGAP_INDEX", "off");
    }
    let out = output_of(&mut cmd);
    format!("{}\n{}\nstatus {:?}", text(&out.stdout), text(&out.stderr), out.status.code())
}

/// After the trace's first analysis (`memgap report`, or with `first_at`
/// a `map` at the snapshot nearest to it), questions never asked before
/// about any snapshot: the same answers as a replay's, and those the facts
/// it learned hold (every ledger, the timeline, blame and page maps where
/// it computed them, the moment asked about among them) are answered
/// without writing the index again, so without a replay.
fn check_facts(dir: &Path, trace: &Path, first_at: Option<usize>) {
    let name = arg(trace);
    let out = output_of(memgap_cmd(dir, &["timeline", name, "--json"]).env("MEMGAP_INDEX", "off"));
    let timeline: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let seconds: Vec<f64> = timeline["snapshots"].as_array().unwrap().iter().map(|s| s["at_seconds"].as_f64().unwrap()).collect();
    assert!(!seconds.is_empty());
    let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    let first = match first_at {
        Some(snapshot) => strings(&["map", name, "--at", &seconds[snapshot].to_string(), "--color", "never"]),
        None => strings(&["report", name, "-o", arg(&dir.join("r.html"))]),
    };
    let answered = ask(dir, &first, true);
    assert!(answered.ends_with("status Some(0)"), "{answered}");
    if first_at.is_some() {
        assert_eq!(answered, ask(dir, &first, false));
    }
    let index = index_of(trace);
    let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&index).unwrap());
    let written = inode();
    // From the facts whatever the snapshot: no index written.
    let mut from_facts: Vec<Vec<String>> = vec![
        strings(&["summary", name, "--json"]),
        strings(&["summary", name]),
        strings(&["timeline", name, "--color", "never"]),
        strings(&["timeline", name, "--json"]),
        strings(&["blame", name, "--by", "live", "--top", "3"]),
        strings(&["blame", name, "--json", "--at", "peak", "--per-stack"]),
        strings(&["blame", name, "--at", "end", "--by", "allocated", "--skip", "main"]),
        strings(&["map", name, "--at", "peak", "--color", "never"]),
        strings(&["map", name, "--at", "end", "--color", "never"]),
        strings(&["ledger", name, "--at", "1000"]),
    ];
    if let Some(snapshot) = first_at {
        let at = seconds[snapshot].to_string();
        from_facts.push(strings(&["blame", name, "--at", &at, "--by", "live"]));
        from_facts.push(strings(&["map", name, "--at", &at, "--color", "always"]));
    }
    for (i, at) in seconds.iter().enumerate() {
        let at = format!("{:.3}", at + if i % 2 == 0 { 0.0001 } else { -0.0001 });
        from_facts.push(strings(&["ledger", name, "--at", &at, "--json"]));
        from_facts.push(strings(&["ledger", name, "--at", &at, "--mappings"]));
    }
    for query in &from_facts {
        assert_eq!(ask(dir, query, true), ask(dir, query, false), "{query:?}");
        assert_eq!(inode(), written, "{query:?} was answered by a replay");
    }
    // The rest at every snapshot: from the facts when they hold it, else replayed; the same either way.
    for at in &seconds {
        let at = format!("{at}");
        for query in [strings(&["map", name, "--at", &at, "--color", "never"]), strings(&["blame", name, "--at", &at, "--json"])] {
            assert_eq!(ask(dir, &query, true), ask(dir, &query, false), "{query:?}");
        }
    }
}

#[test]
fn questions_after_a_report_are_answered_from_its_facts() {
    for fixture in ["glibc-thread-arenas.mgt", "python.mgt", "go.mgt", "ghc.mgt", "ruby.mgt", "node.mgt", "jemalloc.mgt"] {
        let (_tmp, dir) = tempdir();
        let trace = copy_fixture(fixture, &dir, "t.mgt");
        check_facts(&dir, &trace, None);
    }
    // More snapshots than the report keeps page maps of; the first
    // analysis a report, then a map at a snapshot between those.
    let (_tmp, dir) = tempdir();
    let exe = compile_with(&dir, "churn_sites.c", &["-O0"]);
    let trace = dir.join("fresh.mgt");
    let out = memgap(&dir, &["run", "--quiet", "--snapshot-interval", "0.01", "-o", arg(&trace), "--", arg(&exe)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    check_facts(&dir, &trace, None);
    std::fs::remove_file(index_of(&trace)).unwrap();
    check_facts(&dir, &trace, Some(7));
}
