//! End-to-end tests: real programs, compiled from `tests/programs/` at test
//! time, run under the real agent through `memgap run`, then read back with
//! `memgap summary --json`.
//!
//! The agent must already be built next to the `memgap` binary
//! (`target/<profile>/libmemgap_agent.so`, or named by `MEMGAP_AGENT`);
//! `cargo build --release --workspace` does that. The tests need `cc`, `c++`, `rustc` and `python3` on PATH.
//! Every test works in its own temporary directory, so they run in parallel.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

// ---------------------------------------------------------------------------
// Exact event counts
// ---------------------------------------------------------------------------

#[test]
fn exact_counts_are_exact() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "exact_counts.c");
    let trace = dir.join("t.mgt");

    let out = memgap(&dir, &["run", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "exact_counts ok\n");

    let s = summary_json(&trace);
    assert_eq!(events(&s, "malloc"), 1_000_000, "{s:#}");
    assert_eq!(events(&s, "free"), 999_000, "free(NULL) must not count; {s:#}");
    assert_eq!(events(&s, "calloc"), 10, "{s:#}");
    assert_eq!(events(&s, "realloc"), 10, "{s:#}");
    for kind in ["posix_memalign", "aligned_alloc", "memalign", "valloc", "pvalloc", "reallocarray"] {
        assert_eq!(events(&s, kind), 0, "{kind}; {s:#}");
    }
    for kind in ["mmap", "munmap", "mremap", "brk", "sbrk"] {
        events(&s, kind); // present, whatever the count
    }
    // 990 x 32 untouched + 10 x 16 shrunk by realloc + 10 x 16 calloc'd.
    assert_eq!(number(&s, "live_bytes_at_end"), 32_000, "{s:#}");
    // Just before the last batch is freed: 990 kept + 10,000 blocks of 32 bytes.
    assert_eq!(number(&s, "peak_live_bytes"), 351_680, "{s:#}");
    // 1,000,000 x 32 + 10 x 16 calloc'd (+ 10 x 16 if realloc'd sizes count).
    let allocated = number(&s, "allocated_bytes");
    assert!((32_000_160..=32_000_320).contains(&allocated), "allocated_bytes {allocated}; {s:#}");
    assert!(number(&s, "peak_rss_bytes") > 0, "{s:#}");
    assert_eq!(number(&s, "threads"), 1, "{s:#}");
    assert_eq!(s["truncated"], Value::Bool(false), "{s:#}");
    assert_eq!(s["exit_code"], Value::from(0), "{s:#}");
    assert!(number(&s, "pid") > 0, "{s:#}");
    let command = s["command"].as_str().unwrap_or_else(|| panic!("no command string; {s:#}"));
    assert!(command.contains("exact_counts"), "command {command:?}");
}

/// `memgap run` keeps what recording cost: the program's CPU time (with
/// the child it waited for), which cannot be below what the program spent
/// by its own clocks, and the recorder's.
#[test]
fn the_trace_keeps_the_cpu_time_of_the_program_and_of_the_recorder() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "cpu_time.c");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog), "300"]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "cpu_time ok\n");
    let s = summary_json(&trace);
    let cpu = &s["recording_cpu"];
    let (program, recorder) = (cpu["program_seconds"].as_f64(), cpu["recorder_seconds"].as_f64());
    let (Some(program), Some(recorder)) = (program, recorder) else { panic!("no recording CPU; {s:#}") };
    // 300 ms in each process by its own clock; the rest is start-up and exit.
    assert!((0.6..1.5).contains(&program), "program CPU {program} s; {s:#}");
    assert!(recorder > 0.0 && recorder < program, "recorder CPU {recorder} s; {s:#}");
    let summary = memgap(&dir, &["summary", arg(&trace)]);
    let line = text(&summary.stdout).lines().find(|l| l.contains("recording CPU")).map(str::to_owned);
    assert!(line.as_deref().is_some_and(|l| l.contains("program (with its hooks)") && l.contains("recorder")), "{}", text(&summary.stdout));
}

/// `memgap run` writes trace format 3: every event in COMPACT_EVENTS
/// records, which decode to the summary's count, in fewer bytes than the
/// agent's records they were made from.
#[test]
fn the_recorder_writes_events_in_the_compact_encoding() {
    use memgap_trace::compact::{self, CompactState};
    use memgap_trace::records::{Record, Records};
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "churn_sites.c");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    let file = memgap_trace::TraceFile::open(&trace).expect("the trace opens");
    assert_eq!(file.header().major, memgap_trace::framing::VERSION_MAJOR);
    let (mut agent_pieces, mut decoded, mut source_bytes, mut compact_bytes) = (0, 0u64, 0u64, 0u64);
    let mut frames = Vec::new();
    file.for_each_chunk(|_, chunk| {
        for record in Records::new(chunk) {
            match record {
                Ok(Record::Events(_)) => agent_pieces += 1,
                Ok(Record::CompactEvents(piece)) => {
                    source_bytes += u64::from(piece.source_len);
                    compact_bytes += piece.records.len() as u64;
                    let (mut state, mut cursor) = (CompactState::default(), memgap_trace::varint::Cursor::new(piece.records));
                    while !cursor.is_empty() {
                        compact::decode_into(&mut state, &mut cursor, &mut frames, &mut memgap_trace::Event::default())
                            .expect("a compact record decodes");
                        decoded += 1;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    })
    .expect("the trace reads");
    let s = summary_json(&trace);
    let total: u64 = s["events"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!((agent_pieces, decoded), (0, total), "{s:#}");
    assert!(compact_bytes < source_bytes, "{compact_bytes} compact bytes from {source_bytes} of the agent's");
}

#[test]
fn eight_threads_counts_are_exact() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "threads.c");
    let trace = dir.join("t.mgt");

    let out = memgap(&dir, &["run", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("threads ok "), "stdout: {}", text(&out.stdout));

    let s = summary_json(&trace);
    assert_eq!(events(&s, "malloc"), 800_000, "{s:#}");
    assert_eq!(events(&s, "free"), 800_000, "{s:#}");
    assert_eq!(events(&s, "realloc"), 0, "{s:#}");
    // glibc's pthread_create callocs one DTV per new thread; nothing else does.
    assert!(events(&s, "calloc") <= 8, "{s:#}");
    assert!(number(&s, "threads") >= 8, "{s:#}");
    assert_eq!(s["truncated"], Value::Bool(false), "{s:#}");
    assert_eq!(s["exit_code"], Value::from(0), "{s:#}");
}

// ---------------------------------------------------------------------------
// Processes: fork, exec, default names
// ---------------------------------------------------------------------------

/// Parses fork_exec's "parent <pid> child <pid>" line.
fn fork_exec_pids(stdout: &[u8]) -> (u64, u64) {
    let line = text(stdout);
    let words: Vec<&str> = line.split_whitespace().collect();
    match words[..] {
        ["parent", parent, "child", child] => (parent.parse().unwrap(), child.parse().unwrap()),
        _ => panic!("unexpected fork_exec output {line:?}"),
    }
}

#[test]
fn fork_and_exec_give_the_child_its_own_trace() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "fork_exec.c");
    let trace = dir.join("t.mgt");

    let out = memgap(&dir, &["run", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    let (parent_pid, child_pid) = fork_exec_pids(&out.stdout);

    let child_name = format!("t.{child_pid}.mgt");
    assert_eq!(traces_in(&dir), {
        let mut expected = vec!["t.mgt".to_string(), child_name.clone()];
        expected.sort();
        expected
    });

    let parent = summary_json(&trace);
    assert_eq!(number(&parent, "pid"), parent_pid, "{parent:#}");
    assert_eq!(events(&parent, "malloc"), 110, "parent: 100 before fork + 10 after wait; {parent:#}");
    assert_eq!(events(&parent, "free"), 60, "{parent:#}");
    assert_eq!(parent["exit_code"], Value::from(0), "{parent:#}");

    // The child's trace holds its forked image and, appended, its exec'd image.
    let child = summary_json(&dir.join(&child_name));
    assert_eq!(number(&child, "pid"), child_pid, "{child:#}");
    assert_eq!(events(&child, "malloc"), 8_000, "child: 5,000 after fork + 3,000 after exec; {child:#}");
    assert_eq!(events(&child, "free"), 5_000, "{child:#}");
    assert_eq!(child["exit_code"], Value::from(0), "{child:#}");
}

#[test]
fn no_follow_traces_only_the_top_process() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "fork_exec.c");
    let trace = dir.join("t.mgt");

    let out = memgap(&dir, &["run", "--no-follow", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    fork_exec_pids(&out.stdout);
    assert_eq!(traces_in(&dir), vec!["t.mgt".to_string()]);
    let parent = summary_json(&trace);
    assert_eq!(events(&parent, "malloc"), 110, "{parent:#}");
    assert_eq!(events(&parent, "free"), 60, "{parent:#}");
}

#[test]
fn default_trace_name_is_memgap_prog_pid() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "exact_counts.c");

    let out = memgap(&dir, &["run", "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    let names = traces_in(&dir);
    assert_eq!(names.len(), 1, "expected one trace in the working directory, found {names:?}");
    let pid = names[0]
        .strip_prefix("memgap-exact_counts.")
        .and_then(|rest| rest.strip_suffix(".mgt"))
        .and_then(|pid| pid.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("trace name {:?} is not memgap-exact_counts.<pid>.mgt", names[0]));
    let s = summary_json(&dir.join(&names[0]));
    assert_eq!(number(&s, "pid"), pid, "{s:#}");
    assert_eq!(events(&s, "malloc"), 1_000_000, "{s:#}");
}

// ---------------------------------------------------------------------------
// A program killed mid-run
// ---------------------------------------------------------------------------

#[test]
fn sigkill_mid_run_leaves_a_readable_truncated_trace() {
    use std::os::unix::process::CommandExt;
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "sleeper.c");
    let trace = dir.join("t.mgt");
    let stdout_file = dir.join("sleeper.stdout");
    let stderr_file = dir.join("memgap.stderr");

    let mut memgap_run = memgap_cmd(&dir, &["run", "-o", arg(&trace), "--", arg(&prog)])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout_file).unwrap())
        .stderr(fs::File::create(&stderr_file).unwrap())
        .process_group(0)
        .spawn()
        .expect("start memgap run");
    let memgap_stderr = || fs::read_to_string(&stderr_file).unwrap_or_default();

    // Find the sleeper among memgap's children once it has really started.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sleeper = loop {
        let running = fs::read_to_string(&stdout_file).unwrap_or_default().contains("sleeper running");
        let found = children_of(memgap_run.id())
            .into_iter()
            .find(|pid| fs::read_link(format!("/proc/{pid}/exe")).ok().as_deref() == Some(prog.as_path()));
        if let (true, Some(pid)) = (running, found) {
            break pid;
        }
        if let Some(status) = memgap_run.try_wait().unwrap() {
            panic!("memgap exited early ({status}):\n{}", memgap_stderr());
        }
        if Instant::now() > deadline {
            sigkill(-(memgap_run.id() as i32));
            panic!("sleeper did not start as a child of memgap:\n{}", memgap_stderr());
        }
        thread::sleep(Duration::from_millis(20));
    };

    // Let it record for a while: ~50,000 mallocs per 0.5 s.
    thread::sleep(Duration::from_millis(500));
    sigkill(sleeper as i32);
    let status = wait_or_kill(&mut memgap_run, "memgap run -- sleeper");
    assert_eq!(status.code(), Some(137), "memgap must exit 128+9; stderr:\n{}", memgap_stderr());

    let s = summary_json(&trace);
    assert_eq!(s["truncated"], Value::Bool(true), "{s:#}");
    assert!(events(&s, "malloc") > 0, "{s:#}");
    assert_eq!(number(&s, "pid"), u64::from(sleeper), "{s:#}");
}

// ---------------------------------------------------------------------------
// The traced program behaves exactly as it does without memgap
// ---------------------------------------------------------------------------

#[test]
fn output_identity_c() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "outputs.c");
    let trace = dir.join("t.mgt");

    let plain = run_plain(&dir, arg(&prog), &["one", "two words"]);
    assert_eq!(plain.status.code(), Some(3));
    let traced = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog), "one", "two words"]);
    assert_same_behaviour(&plain, &traced);

    let s = summary_json(&trace);
    assert_eq!(s["exit_code"], Value::from(3), "{s:#}");
    assert!(events(&s, "malloc") >= 100, "{s:#}");
}

#[test]
fn output_identity_python() {
    let (_tmp, dir) = tempdir();
    let python = if Path::new("/usr/bin/python3").exists() { "/usr/bin/python3" } else { "python3" };
    let script = r#"
import sys
squares = {str(i): i * i for i in range(20000)}
words = {w: len(w) for w in ("alpha beta gamma delta " * 1000).split()}
print(len(squares), sum(squares.values()), sorted(words.items()))
print("from stderr:", squares["123"], file=sys.stderr)
sys.exit(4)
"#;
    let trace = dir.join("t.mgt");

    let plain = run_plain(&dir, python, &["-c", script]);
    assert_eq!(plain.status.code(), Some(4), "stderr:\n{}", text(&plain.stderr));
    let traced = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", python, "-c", script]);
    assert_same_behaviour(&plain, &traced);
    assert!(events(&summary_json(&trace), "malloc") > 0);
}

#[test]
fn output_identity_rust() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "rust_alloc.rs");
    let trace = dir.join("t.mgt");

    let plain = run_plain(&dir, arg(&prog), &[]);
    assert_eq!(plain.status.code(), Some(7));
    let traced = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog)]);
    assert_same_behaviour(&plain, &traced);
    assert!(events(&summary_json(&trace), "malloc") > 0);
}

#[test]
fn output_identity_ruby() {
    let (_tmp, dir) = tempdir();
    let script = r##"
threads = 4.times.map do |t|
  Thread.new { (1..5000).map { |i| "#{t}-#{i}" * (i % 7 + 1) }.select { |s| s.size > 20 }.size }
end
counts = threads.map(&:value)
puts counts.inspect, counts.sum
$stderr.puts "ruby done"
exit 6
"##;
    let trace = dir.join("t.mgt");

    let plain = run_plain(&dir, "ruby", &["-e", script]);
    assert_eq!(plain.status.code(), Some(6), "stderr:\n{}", text(&plain.stderr));
    let traced = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", "ruby", "-e", script]);
    assert_same_behaviour(&plain, &traced);
    let s = summary_json(&trace);
    assert!(events(&s, "malloc") > 1000, "{s:#}");
    assert!(number(&s, "threads") >= 5, "{s:#}");
    assert_eq!(s["exit_code"], Value::from(6), "{s:#}");
}

#[test]
fn cpp_program_runs_unchanged() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "cpp_alloc.cpp");
    let trace = dir.join("t.mgt");

    let plain = run_plain(&dir, arg(&prog), &[]);
    assert_eq!(plain.status.code(), Some(5));
    let traced = memgap(&dir, &["run", "--quiet", "-o", arg(&trace), "--", arg(&prog)]);
    assert_same_behaviour(&plain, &traced);

    let s = summary_json(&trace);
    assert!(events(&s, "malloc") > 0, "operator new goes through malloc; {s:#}");
    assert!(events(&s, "free") > 0, "{s:#}");
    assert_eq!(s["exit_code"], Value::from(5), "{s:#}");
}

#[test]
fn without_quiet_memgap_adds_only_its_own_stderr_lines() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "exact_counts.c");
    let trace = dir.join("t.mgt");

    let out = memgap(&dir, &["run", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "exact_counts ok\n", "memgap must not write to stdout");
    for line in text(&out.stderr).lines() {
        assert!(line.starts_with("memgap:"), "stderr line not from memgap: {line:?}");
    }
}

// ---------------------------------------------------------------------------
// Other allocators preloaded by the user
// ---------------------------------------------------------------------------

/// With another malloc in LD_PRELOAD, memgap must put its agent first and
/// the program must run unchanged. Allocators and the libraries they pull in
/// may allocate before main (Debian's jemalloc and tcmalloc load libstdc++,
/// whose startup mallocs its exception pool), so counts are compared against
/// a baseline run of the same binary that returns before allocating.
fn check_preloaded_allocator(name: &str) {
    let lib = Path::new(ALLOCATOR_DIR).join(name);
    if !lib.exists() {
        eprintln!("note: {} is not installed; skipping", lib.display());
        return;
    }
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "exact_counts.c");
    let traced = |trace: &str, args: &[&str]| {
        let trace = dir.join(trace);
        let mut cmd_args = vec!["run", "-o", arg(&trace), "--", arg(&prog)];
        cmd_args.extend_from_slice(args);
        let out = output_of(memgap_cmd(&dir, &cmd_args).env("LD_PRELOAD", &lib));
        assert_eq!(out.status.code(), Some(0), "{name}: stderr:\n{}", text(&out.stderr));
        (out, summary_json(&trace))
    };

    let plain = output_of(Command::new(&prog).current_dir(&dir).env("LD_PRELOAD", &lib));
    assert_eq!(text(&plain.stdout), "exact_counts ok\n", "{name} without memgap");
    let (out, full) = traced("t.mgt", &[]);
    assert_eq!(text(&out.stdout), text(&plain.stdout), "{name}");
    let (_, base) = traced("baseline.mgt", &["idle"]);

    let diff = |kind: &str| events(&full, kind) as i64 - events(&base, kind) as i64;
    let context = format!("{name}\nfull run: {full:#}\nbaseline: {base:#}");
    assert_eq!(diff("malloc"), 1_000_000, "{context}");
    assert_eq!(diff("free"), 999_000, "{context}");
    assert_eq!(diff("calloc"), 10, "{context}");
    assert_eq!(diff("realloc"), 10, "{context}");
    let live = number(&full, "live_bytes_at_end") as i64 - number(&base, "live_bytes_at_end") as i64;
    assert_eq!(live, 32_000, "{context}");
    assert_eq!(full["truncated"], Value::Bool(false), "{context}");
}

#[test]
fn preloaded_jemalloc_keeps_counts_exact() {
    check_preloaded_allocator("libjemalloc.so.2");
}

#[test]
fn preloaded_tcmalloc_keeps_counts_exact() {
    check_preloaded_allocator("libtcmalloc_minimal.so.4");
}

#[test]
fn preloaded_mimalloc_keeps_counts_exact() {
    check_preloaded_allocator("libmimalloc.so.2");
}

/// A program linked against jemalloc (as Debian's redis-server is) must keep
/// using it: the agent forwards to the next `malloc` in lookup order.
#[test]
fn program_linked_with_jemalloc_keeps_counts_exact() {
    let lib = Path::new(ALLOCATOR_DIR).join("libjemalloc.so.2");
    if !lib.exists() {
        eprintln!("note: {} is not installed; skipping", lib.display());
        return;
    }
    let (_tmp, dir) = tempdir();
    let prog = dir.join("exact_counts_jemalloc");
    let src = programs_dir().join("exact_counts.c");
    let out = output_of(&mut command("cc", ["-O2", "-fno-builtin", "-o", arg(&prog), arg(&src), arg(&lib)]));
    assert!(out.status.success(), "linking with jemalloc failed:\n{}", text(&out.stderr));
    let needed = output_of(&mut command("ldd", [arg(&prog)]));
    assert!(text(&needed.stdout).contains("libjemalloc"), "not linked with jemalloc:\n{}", text(&needed.stdout));

    let run = |trace: &str, args: &[&str]| {
        let trace = dir.join(trace);
        let mut cmd_args = vec!["run", "-o", arg(&trace), "--", arg(&prog)];
        cmd_args.extend_from_slice(args);
        let out = memgap(&dir, &cmd_args);
        assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
        summary_json(&trace)
    };
    let full = run("t.mgt", &[]);
    let base = run("baseline.mgt", &["idle"]);
    let diff = |kind: &str| events(&full, kind) - events(&base, kind);
    assert_eq!((diff("malloc"), diff("free"), diff("calloc"), diff("realloc")), (1_000_000, 999_000, 10, 10), "{full:#}");
    assert_eq!(number(&full, "live_bytes_at_end") - number(&base, "live_bytes_at_end"), 32_000, "{full:#}");
}

// ---------------------------------------------------------------------------
// Recording fails, the program does not
// ---------------------------------------------------------------------------

#[test]
fn a_trace_memgap_cannot_create_stops_the_run_before_the_program_starts() {
    let (_tmp, dir) = tempdir();
    let made = dir.join("made-by-the-program");
    let script = format!("echo ran > '{}'", made.display());
    let trace = dir.join("no-such-directory/t.mgt");
    let line = assert_one_line_failure(&memgap(&dir, &["run", "-o", arg(&trace), "--", "sh", "-c", &script]));
    assert!(line.starts_with("memgap: cannot create the trace") && line.contains("no-such-directory"), "{line}");
    assert!(!made.exists(), "the program ran");
    assert!(!made.exists(), "the program ran");
}

// ---------------------------------------------------------------------------
// Bad input and bad commands
// ---------------------------------------------------------------------------

/// CRC-32 (IEEE), as the trace header uses.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A small but real trace, from the agent.
fn real_trace(dir: &Path) -> Vec<u8> {
    let prog = compile(dir, "fork_exec.c");
    let trace = dir.join("good.mgt");
    let out = memgap(dir, &["run", "--no-follow", "--quiet", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    summary_json(&trace); // it must be good before we break it
    fs::read(&trace).unwrap()
}

#[test]
fn summary_rejects_bad_input_with_one_line() {
    let (_tmp, dir) = tempdir();
    let good = real_trace(&dir);
    const FILE_HEADER_LEN: usize = 32;
    const CHUNK_HEADER_LEN: usize = 20;
    assert!(good.len() > FILE_HEADER_LEN + CHUNK_HEADER_LEN, "the real trace has no chunk");
    assert_eq!(&good[..8], b"MEMGAPT\0");

    let flipped = {
        let mut bytes = good.clone();
        // The first chunk: magic, codec, reserved[3], raw_len, stored_len, crc, payload.
        let stored_len = u32::from_le_bytes(bytes[FILE_HEADER_LEN + 12..FILE_HEADER_LEN + 16].try_into().unwrap());
        let payload = FILE_HEADER_LEN + CHUNK_HEADER_LEN;
        assert!(
            stored_len > 0 && payload + stored_len as usize <= bytes.len(),
            "the real trace's first chunk claims {stored_len} stored bytes; the file has {}",
            bytes.len()
        );
        bytes[payload + stored_len as usize / 2] ^= 0x10;
        bytes
    };
    let newer = {
        let mut bytes = good.clone();
        bytes[8..10].copy_from_slice(&99u16.to_le_bytes());
        let crc = crc32(&bytes[..28]);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        bytes
    };
    let cases: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("missing", None),
        ("empty", Some(Vec::new())),
        ("text", Some(b"hello\nthis is not a memgap trace\n".to_vec())),
        ("truncated-header", Some(good[..20].to_vec())),
        ("flipped-byte-in-chunk", Some(flipped)),
        ("major-version-99", Some(newer)),
    ];

    for (name, contents) in cases {
        let path = dir.join(format!("{name}.mgt"));
        if let Some(contents) = contents {
            fs::write(&path, contents).unwrap();
        }
        for json in [false, true] {
            let mut args = vec!["summary", arg(&path)];
            if json {
                args.push("--json");
            }
            let out = memgap(&dir, &args);
            let stderr = text(&out.stderr);
            let what = format!("{name} (json: {json}): status {}, stderr:\n{stderr}", out.status);
            assert!(!out.status.success(), "{what}");
            assert!(out.status.code().is_some(), "killed by a signal (abort?): {what}");
            assert_eq!(stderr.lines().count(), 1, "want exactly one line: {what}");
            assert!(stderr.starts_with("memgap:"), "{what}");
            assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{what}");
        }
    }
}

#[test]
fn running_a_missing_command_exits_127() {
    let (_tmp, dir) = tempdir();
    let out = memgap(&dir, &["run", "--", "/nonexistent/cmd"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "stderr:\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "want exactly one line:\n{stderr}");
    assert!(stderr.contains("/nonexistent/cmd"), "stderr must name the command:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

// ---------------------------------------------------------------------------
// The trim remedy
// ---------------------------------------------------------------------------

#[test]
fn trim_only_returns_free_pages_and_records_nothing() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "idle_rss.c");
    let rss = |out: &std::process::Output| -> u64 { text(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("{}", text(&out.stdout))) };
    let plain = run_plain(&dir, arg(&prog), &[]);
    let trimmed = memgap(&dir, &["run", "--trim-only", "--trim-interval-ms", "100", "--", arg(&prog)]);
    assert_eq!(trimmed.status.code(), Some(0), "{}", text(&trimmed.stderr));
    assert!(text(&trimmed.stderr).is_empty(), "the trim remedy prints nothing: {}", text(&trimmed.stderr));
    assert!(traces_in(&dir).is_empty(), "no trace is written");
    assert!(rss(&trimmed) * 10 < rss(&plain) * 6, "RSS with trim {} kB, without {} kB", rss(&trimmed), rss(&plain));
    // A threshold above what glibc holds free: no trim happens. (Compared
    // with the trimmed run: how many arenas the threads spread over, and so
    // the untrimmed RSS, depends on how the machine schedules them.)
    let untouched = memgap(&dir, &["run", "--trim-only", "--trim-interval-ms", "100", "--trim-threshold", "1000000000", "--", arg(&prog)]);
    assert!(rss(&untouched) > 2 * rss(&trimmed), "RSS with a high threshold {} kB, with trims {} kB", rss(&untouched), rss(&trimmed));
}

#[test]
fn progress_bar_only_on_a_terminal() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "exact_counts.c");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "-q", "-o", arg(&trace), "--", arg(&program)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Not a terminal: nothing but the summary.
    let piped = output_of(memgap_cmd(&dir, &["summary", arg(&trace)]).env("MEMGAP_PROGRESS_AFTER_MS", "0"));
    assert!(!text(&piped.stderr).contains("reading trace"), "{}", text(&piped.stderr));
    // A terminal (script(1) gives one): the bar, shown from the first chunk
    // here, while the trace is read (not when the index beside it answers).
    let line = format!("{} summary {}", memgap_bin().display(), trace.display());
    let tty = output_of(command("script", ["-qec", &line, "/dev/null"]).env("MEMGAP_PROGRESS_AFTER_MS", "0").env("MEMGAP_INDEX", "off"));
    assert!(tty.status.success(), "{}", text(&tty.stderr));
    assert!(text(&tty.stdout).contains("memgap: reading trace"), "{}", text(&tty.stdout));
    assert!(text(&tty.stdout).contains("memgap summary"), "{}", text(&tty.stdout));
}

#[test]
fn output_fits_the_terminal_width() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "planted.c");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "-q", "-o", arg(&trace), "--", arg(&program), "strided", "8"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for width in [60usize, 100] {
        for args in [&["summary"][..], &["ledger"], &["ledger", "--mappings"], &["timeline"], &["blame"], &["map"]] {
            let mut all = args.to_vec();
            all.push(arg(&trace));
            let out = output_of(memgap_cmd(&dir, &all).env("COLUMNS", width.to_string()));
            assert!(out.status.success(), "{all:?}: {}", text(&out.stderr));
            let stdout = text(&out.stdout);
            let widest = stdout.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            assert!(widest <= width, "memgap {all:?} at {width} columns has a line of {widest}:\n{stdout}");
            // Without a width (a pipe), lines stay as they are.
        }
    }
}

// ---------------------------------------------------------------------------
// The program's own malloc_trim
// ---------------------------------------------------------------------------

/// trim_marks.c's line: VmRSS in bytes before and after its malloc_trim(0),
/// and what the call returned.
fn trim_line(out: &std::process::Output) -> (u64, u64, i64) {
    let line = text(&out.stdout);
    let fields: Vec<i64> = line.split_whitespace().map(|f| f.parse().unwrap_or_else(|_| panic!("{line}"))).collect();
    assert_eq!(fields.len(), 3, "{line}");
    (fields[0] as u64 * 1024, fields[1] as u64 * 1024, fields[2])
}

/// The METRICS records of source `malloc`, kind `trim` in a trace.
fn trim_records(trace: &Path) -> Vec<memgap_trace::records::Metrics> {
    use memgap_trace::records::{Record, Records};
    let mut found = Vec::new();
    let file = memgap_trace::TraceFile::open(trace).expect("the trace opens");
    file.for_each_chunk(|_, chunk| {
        for record in Records::new(chunk) {
            if let Ok(Record::Metrics(m)) = record
                && m.source == "malloc"
                && m.kind == "trim"
            {
                found.push(m);
            }
        }
        Ok(())
    })
    .expect("the trace reads");
    found
}

#[test]
fn a_program_s_malloc_trim_is_recorded_with_rss_before_and_after() {
    const MIB: u64 = 1 << 20;
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "trim_marks.c");
    let plain = run_plain(&dir, arg(&prog), &[]);
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stderr));
    let trace = dir.join("t.mgt");
    let traced = memgap(&dir, &["run", "-q", "-o", arg(&trace), "--", arg(&prog)]);
    assert_eq!(traced.status.code(), Some(0), "{}", text(&traced.stderr));
    let (program_before, program_after, program_returned) = trim_line(&traced);
    assert_eq!(program_returned, trim_line(&plain).2, "malloc_trim returns what it returns without memgap");
    assert_eq!(program_returned, 1, "glibc released memory");

    let trims = trim_records(&trace);
    assert_eq!(trims.len(), 1, "{trims:?}");
    let trim = &trims[0];
    let before = trim.get("rss_before:bytes").unwrap() as u64;
    let after = trim.get("rss_after:bytes").unwrap() as u64;
    eprintln!(
        "malloc_trim: VmRSS {} MiB -> {} MiB (the program read {} -> {} MiB)",
        before / MIB,
        after / MIB,
        program_before / MIB,
        program_after / MIB
    );
    assert!(before > after + 50 * MIB, "a real drop: {before} -> {after}");
    // The program's own readings, taken around the same call, agree.
    assert!(
        before.abs_diff(program_before) < 4 * MIB && after.abs_diff(program_after) < 4 * MIB,
        "agent {before} -> {after}, program {program_before} -> {program_after}"
    );
    assert_eq!((trim.get("pad"), trim.get("returned")), (Some(0.0), Some(1.0)));

    // A snapshot follows the trim and shows what it changed.
    let timeline: Value = serde_json::from_slice(&memgap(&dir, &["timeline", arg(&trace), "--json"]).stdout).unwrap();
    let timeline = timeline["snapshots"].as_array().unwrap();
    let after_trim =
        timeline.iter().find(|l| l["snapshot_reason"] == "program").unwrap_or_else(|| panic!("no snapshot after the trim: {timeline:?}"));
    assert!(after_trim["rss_bytes"].as_u64().unwrap() < before - 50 * MIB, "{after_trim}");
    let peak = timeline.iter().map(|l| l["rss_bytes"].as_u64().unwrap()).max().unwrap();
    assert!(peak > before - 10 * MIB, "the full heap was snapshotted before: peak {peak}");
    // The terminal timeline lists the call just before that snapshot.
    let table = text(&memgap(&dir, &["timeline", arg(&trace)]).stdout);
    let lines: Vec<&str> = table.lines().collect();
    let at = lines.iter().position(|l| l.contains(" malloc_trim: ")).unwrap_or_else(|| panic!("{table}"));
    assert!(
        lines[at].contains(" MiB → ")
            && lines[at + 1].trim_start().starts_with(&format!("{:.2}", after_trim["at_seconds"].as_f64().unwrap())),
        "{table}"
    );
}
