//! A forked child's heap is its parent's at the fork:
//! tests/programs/fork_heap.c builds a heap, forks, and the child frees most
//! of what it inherited (while the parent frees all of its copy), then
//! measures its Rss around its own malloc_trim(0). The child's trace must
//! know every block it frees, hold what the child says it holds, blame the
//! inherited blocks on the parent's call site, and forecast what the real
//! trim returned.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

const MIB: f64 = 1048576.0;

struct Child {
    trace: PathBuf,
    pid: u32,
    /// What the child says it holds.
    live: u64,
    /// Its Rss before and after its malloc_trim(0).
    trim: (f64, f64),
}

fn run(dir: &Path, args: &[&str]) -> Child {
    let prog = compile(dir, "fork_heap.c");
    let trace = dir.join("t.mgt");
    let mut run = vec!["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&prog)];
    run.extend_from_slice(args);
    let out = memgap(dir, &run);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let figures = |key: &str| -> Vec<f64> {
        let line = stdout.lines().find_map(|l| l.strip_prefix(key).map(str::to_string)).unwrap_or_else(|| panic!("no {key} in {stdout:?}"));
        line.split_whitespace().map(|n| n.parse().unwrap()).collect()
    };
    let pid = figures("child ")[0] as u32;
    let trim = figures("trim ");
    Child { trace: dir.join(format!("t.{pid}.mgt")), pid, live: figures("live ")[0] as u64, trim: (trim[0], trim[1]) }
}

/// The ledger at the child's snapshot right before its trim (the first the
/// program asked for).
fn before_trim(trace: &Path) -> Value {
    let out = memgap(trace.parent().unwrap(), &["timeline", arg(trace), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all: Value = serde_json::from_slice(&out.stdout).expect("timeline JSON");
    all["snapshots"].as_array().unwrap().iter().find(|l| l["snapshot_reason"] == "program").cloned().expect("the child's snapshot")
}

fn assert_child_knows_its_heap(mode: &str, keep_every: &str) {
    let (_tmp, dir) = tempdir();
    let child = run(&dir, &[mode, keep_every]);
    let summary = summary_json(&child.trace);
    assert_eq!(number(&summary, "untracked_frees"), 0, "{mode}: every inherited block the child frees is known: {summary:#}");
    assert_eq!(number(&summary, "overlapping_allocations"), 0, "{mode}: {summary:#}");
    assert!(events(&summary, "free") > 10_000, "{mode}: the child freed most of ~35,000 blocks: {summary:#}");
    // Its stdout buffer and what dlsym keeps come on top of what it counts.
    let live = number(&summary, "live_bytes_at_end");
    assert!(live >= child.live && live - child.live < 64 * 1024, "{mode}: the child holds {} bytes, its trace says {live}", child.live);
    // The parent's own frees after the fork are its own.
    assert_eq!(number(&summary_json(&dir.join("t.mgt")), "untracked_frees"), 0);

    let ledger = before_trim(&child.trace);
    let forecast = ledger["trim_would_return_bytes"].as_f64().expect("a forecast");
    let returned = child.trim.0 - child.trim.1;
    assert!(returned > 20.0 * MIB, "{mode}: the inherited heap's free pages came back: {returned}");
    assert!(
        (forecast - returned).abs() <= (0.05 * returned).max(MIB),
        "{mode}: forecast {forecast}, malloc_trim(0) in the child returned {returned}: {:#}",
        ledger["heaps"]
    );

    // The blocks it kept are blamed on where the parent allocated them.
    let out = memgap(&dir, &["blame", arg(&child.trace), "--json", "--at", "end", "--by", "live", "--top", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let blame: Value = serde_json::from_slice(&out.stdout).expect("blame JSON");
    let top = &blame[0];
    assert_eq!(top["function"], "build", "{mode}: {blame:#}");
    assert!(top["objects"].as_u64().unwrap() > 1000, "{mode}: {top:#}");
}

#[test]
fn a_child_frees_blocks_it_inherited_from_the_main_arena() {
    assert_child_knows_its_heap("main", "16");
}

/// The parent's worker built the heap in a thread arena; the child (forked
/// from the main thread) frees into its tcache and that arena's bins.
#[test]
fn a_child_frees_blocks_it_inherited_from_a_thread_arena() {
    assert_child_knows_its_heap("thread", "16");
}

/// Without the parent's trace the child's says what it cannot know.
#[test]
fn a_child_without_its_parents_trace_says_so() {
    let (_tmp, dir) = tempdir();
    let child = run(&dir, &["main", "4"]);
    std::fs::rename(dir.join("t.mgt"), dir.join("elsewhere")).unwrap();
    let summary = summary_json(&child.trace);
    let notes = summary["notes"].as_array().unwrap();
    let parent = format!("forked from process {}", summary["ppid"]);
    assert!(
        notes.iter().any(|n| n.as_str().unwrap().contains(&parent) && n.as_str().unwrap().contains("t.mgt")),
        "child {}: {notes:#?}",
        child.pid
    );
    assert!(number(&summary, "untracked_frees") > 10_000, "{summary:#}");
}

/// Descendants the agent is not in (an environment without LD_PRELOAD, a
/// static binary, an exec into one) are named, one line each with pid,
/// command and why; traced ones are not.
#[test]
fn descendants_without_the_agent_are_named_in_one_line_each() {
    let (_tmp, dir) = tempdir();
    let dynamic = compile(&dir, "pid_and_hold.c");
    std::fs::create_dir(dir.join("static")).unwrap();
    let fixed = compile_with(&dir.join("static"), "pid_and_hold.c", &["-static"]);
    let script = format!("env -u LD_PRELOAD {d}; {s}; {d}; exec env -u LD_PRELOAD {d}", d = arg(&dynamic), s = arg(&fixed));
    let out = memgap(&dir, &["run", "-o", "t.mgt", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let pids: Vec<String> = text(&out.stdout).lines().filter_map(|l| l.strip_prefix("pid ").map(str::to_string)).collect();
    assert_eq!(pids.len(), 4, "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    let named: Vec<&str> = stderr.lines().filter(|l| l.starts_with("memgap: not traced: ")).collect();
    let line_of = |pid: &str| named.iter().find(|l| l.contains(&format!("process {pid} ("))).copied();
    let env_line = line_of(&pids[0]).unwrap_or_else(|| panic!("the child without LD_PRELOAD is not named:\n{stderr}"));
    assert!(env_line.contains(arg(&dynamic)) && env_line.ends_with("its environment has no LD_PRELOAD"), "{env_line}");
    let static_line = line_of(&pids[1]).unwrap_or_else(|| panic!("the static child is not named:\n{stderr}"));
    assert!(static_line.contains(arg(&fixed)) && static_line.contains("statically linked"), "{static_line}");
    assert!(line_of(&pids[2]).is_none(), "the traced child is named:\n{stderr}");
    assert!(
        line_of(&pids[3]).is_some_and(|l| l.ends_with("its environment has no LD_PRELOAD")),
        "the shell's exec without the agent is not named:\n{stderr}"
    );
    assert_eq!(named.len(), 3, "{stderr}");
    // The traced child has its trace, with its 8 MiB.
    let traced = dir.join(format!("t.{}.mgt", pids[2]));
    assert!(number(&summary_json(&traced), "peak_live_bytes") >= 8 << 20, "{}", traced.display());
}

/// `sh -c 'PROG; echo done'`: the closing verdict is about PROG, the
/// traced process with the largest gap, and a short table names the others.
#[test]
fn a_wrapping_shell_gets_the_inner_programs_verdict() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "frees_at.c");
    let script = format!("{} 100 300; echo done", arg(&prog));
    let out = memgap(&dir, &["run", "-o", "t.mgt", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let inner: Vec<String> = traces_in(&dir).into_iter().filter(|name| name != "t.mgt").collect();
    assert_eq!(inner.len(), 1, "{inner:?}");
    let inner_trace = dir.join(&inner[0]);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with(&format!("memgap: {} — ", inner_trace.display())), "the verdict is not about the program:\n{stderr}");
    let chosen = stderr.lines().find(|l| l.starts_with("memgap: > ")).unwrap_or_else(|| panic!("no table:\n{stderr}"));
    assert!(chosen.contains(&inner[0]) && chosen.contains("frees_at 100 300"), "{chosen}");
    assert!(
        stderr.lines().any(|l| l.starts_with("memgap:   ") && l.contains("(t.mgt)") && l.contains("sh -c")),
        "the shell is listed:\n{stderr}"
    );
    assert!(stderr.contains("retained") || stderr.contains("fragmented"), "the program's gap is explained:\n{stderr}");
    assert!(stderr.trim_end().ends_with(&format!("details: memgap ledger|blame|map|report {}", inner_trace.display())), "{stderr}");
}

/// A wrapper script that runs short helpers (three programs and a
/// subshell) and then execs the program leaves one trace, the program's,
/// and says how many helpers it left out; a child of the wrapper that
/// allocates a lot keeps its trace; `--keep-all-traces` keeps them all.
#[test]
fn a_wrappers_short_helpers_leave_no_trace() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "holds_live.c");
    let holder = compile(&dir, "pid_and_hold.c");
    let helpers = "uname > /dev/null; date > /dev/null; basename /a/b > /dev/null; x=$(echo hi)";
    let helper_count = |stderr: &str| -> usize {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix("memgap: ")?.strip_suffix(" short helpers left no trace (processes that ran before a wrapper exec'd, each under a second and 1 MiB allocated; --keep-all-traces keeps them)"))
            .map_or(0, |n| n.parse().unwrap())
    };

    let script = format!("{helpers}; exec {} 16 100", arg(&program));
    let out = memgap(&dir, &["run", "-o", "t.mgt", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert_eq!(traces_in(&dir), vec!["t.mgt".to_string()], "{stderr}");
    let top = summary_json(&dir.join("t.mgt"));
    assert!(top["argv"][0].as_str().unwrap().ends_with("holds_live"), "the one trace is the program's: {top:#}");
    assert!(number(&top, "peak_live_bytes") >= 16 << 20, "{top:#}");
    let left_out = helper_count(&stderr);
    assert!(left_out >= 4, "uname, date, basename and the subshell are counted:\n{stderr}");
    assert!(stderr.lines().nth(1).unwrap_or_default().starts_with("memgap: /"), "the verdict follows:\n{stderr}");

    // The same, keeping every trace: the program's and one per helper.
    std::fs::remove_file(dir.join("t.mgt")).unwrap();
    let out = memgap(&dir, &["run", "--keep-all-traces", "-o", "t.mgt", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(helper_count(&text(&out.stderr)), 0, "{}", text(&out.stderr));
    let all = traces_in(&dir);
    assert_eq!(all.len(), left_out + 1, "{all:?}");
    let commands: Vec<String> = all.iter().map(|name| summary_json(&dir.join(name))["command"].as_str().unwrap().to_string()).collect();
    for helper in ["uname", "date", "basename /a/b"] {
        assert!(commands.iter().any(|c| c == helper), "{helper} in {commands:?}");
    }
    for name in &all {
        std::fs::remove_file(dir.join(name)).unwrap();
    }

    // A child of the wrapper that allocates 8 MiB is a program, not a helper.
    let script = format!("{helpers}; {}; exec {} 16 100", arg(&holder), arg(&program));
    let out = memgap(&dir, &["run", "-o", "t.mgt", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let pid = text(&out.stdout).lines().find_map(|l| l.strip_prefix("pid ").map(str::to_string)).expect("pid_and_hold's pid");
    assert_eq!(traces_in(&dir), vec![format!("t.{pid}.mgt"), "t.mgt".to_string()], "{}", text(&out.stderr));
}
