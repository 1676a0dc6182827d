//! GHC Haskell programs: the field report's ByteString program (keep every
//! 10th one-byte ByteString, "strip", or the first tenth, "take") under
//! `memgap run`, judged by memgap's GHC ledger and checked against the
//! program's own `+RTS -s` figures. Skipped, with a message, where ghc is
//! not installed (CI installs it).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

/// Elements: about 190 MiB of heap at the first plateau.
const N: &str = "1000000";

fn ghc_program(dir: &Path) -> Option<PathBuf> {
    if command("ghc", ["--version"]).output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("ghc is not installed: skipping the GHC tests (apt-get install ghc)");
        return None;
    }
    let exe = dir.join("pinned");
    let out = output_of(
        command("ghc", ["-O", "-rtsopts", "-eventlog", "-outputdir"])
            .arg(dir.join("o"))
            .arg("-o")
            .arg(&exe)
            .arg(programs_dir().join("ghc/pinned.hs")),
    );
    assert!(out.status.success(), "ghc failed:\n{}", text(&out.stderr));
    Some(exe)
}

/// `+RTS -s` figure in bytes: "N bytes maximum residency" / "N MiB total memory in use".
fn rts_s(stderr: &str, what: &str) -> f64 {
    let line = stderr.lines().find(|l| l.contains(what)).unwrap_or_else(|| panic!("no `{what}` in the program's stderr:\n{stderr}"));
    let number: f64 = line.split_whitespace().next().unwrap().replace(',', "").parse().unwrap();
    if line.contains("MiB total") { number * 1024.0 * 1024.0 } else { number }
}

struct Run {
    ghc: Value,
    stdout: String,
    stderr: String,
}

fn run_variant(dir: &Path, exe: &Path, variant: &str) -> Run {
    let trace = dir.join(format!("{variant}.mgt"));
    let out = memgap(dir, &["run", "--snapshot-interval", "0.2", "-o", arg(&trace), "--", arg(exe), variant, N, "+RTS", "-s", "-RTS"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "memgap run failed:\n{stderr}");
    assert!(dir.join(format!("{variant}.eventlog")).is_file(), "the eventlog is not kept beside the trace:\n{stderr}");
    let ledger = memgap(dir, &["ledger", arg(&trace), "--json"]);
    assert!(ledger.status.success(), "{}", text(&ledger.stderr));
    let json: Value = serde_json::from_slice(&ledger.stdout).unwrap();
    Run { ghc: json["ghc"].clone(), stdout: text(&out.stdout), stderr }
}

fn bytes(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn within_5_percent(ours: f64, theirs: f64, what: &str) {
    assert!((ours - theirs).abs() <= 0.05 * theirs, "{what}: memgap {ours} vs +RTS -s {theirs}");
}

#[test]
fn strip_is_pinned_fragmentation_and_take_is_not() {
    let (_tmp, dir) = tempdir();
    let Some(exe) = ghc_program(&dir) else { return };
    let strip = run_variant(&dir, &exe, "strip");
    let take = run_variant(&dir, &exe, "take");

    for (name, run) in [("strip", &strip), ("take", &take)] {
        // The program's output is untouched: stdout as written, and the
        // -s summary the user asked for still on stderr.
        assert_eq!(run.stdout, "1st plateau\n2nd plateau\n100000\n", "{name}");
        let ghc = &run.ghc;
        assert!(ghc.is_object(), "{name}: no ghc section in the ledger JSON:\n{}", run.stderr);
        within_5_percent(bytes(&ghc["max_live_bytes"]), rts_s(&run.stderr, "bytes maximum residency"), &format!("{name} max residency"));
        within_5_percent(
            bytes(&ghc["max_heap_size_bytes"]),
            rts_s(&run.stderr, "total memory in use"),
            &format!("{name} total memory in use"),
        );
        // memgap read the same summary from the program's stderr.
        within_5_percent(bytes(&ghc["rts_summary"]["max_residency_bytes"]), rts_s(&run.stderr, "bytes maximum residency"), name);
        // The rows add up to the RSS sampled after each GC.
        for point in ghc["timeline"].as_array().unwrap() {
            let rows = &point["rows"];
            if rows["lazy_free"].is_null() || point["rss_bytes"].is_null() {
                continue;
            }
            let sum: f64 = ["live", "heap_blocks_not_live", "megablock_free", "block_descriptors", "lazy_free", "non_heap"]
                .iter()
                .map(|k| bytes(&rows[*k]))
                .sum();
            assert_eq!(sum, bytes(&point["rss_bytes"]), "{name}: {point}");
        }
        let caps = ghc["gcs_per_capability"].as_array().unwrap();
        assert_eq!(caps.len(), 1, "{name}: the non-threaded RTS has one capability: {caps:?}");
        assert!(caps[0]["by_generation"][1].as_u64().unwrap() >= 40, "{name}: {caps:?}");
    }

    let peak = |run: &Run| bytes(&run.ghc["max_heap_size_bytes"]);
    let settled = |run: &Run| run.ghc["settled"].clone();
    let (s, t) = (settled(&strip), settled(&take));
    let resident = |p: &Value| bytes(&p["rss_bytes"]) - bytes(&p["rows"]["lazy_free"]);

    // Strip: the second plateau keeps most of the heap, and RSS with it.
    assert!(bytes(&s["heap_size_bytes"]) >= 0.6 * peak(&strip), "strip: {s}");
    assert!(resident(&s) >= 0.6 * peak(&strip), "strip: {s}");
    assert!(strip.ghc["verdict"]["pinned_fragmentation"].as_bool().unwrap(), "{}", strip.ghc["verdict"]);
    assert!(strip.stderr.contains("Pinned fragmentation"), "{}", strip.stderr);
    // The HTML report carries the GHC panel and its data.
    let out = memgap(&dir, &["report", "strip.mgt", "-o", "strip.html"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(dir.join("strip.html")).unwrap();
    assert!(
        html.contains("<section id=\"ghc\"") && html.contains("\"ghc\":{") && html.contains("Pinned fragmentation"),
        "no GHC panel data in the report"
    );

    // The ledger shown holds every GC; each snapshot's ledger (here in the
    // timeline) holds only the GCs its rows and the verdict rest on.
    let gcs = strip.ghc["timeline"].as_array().unwrap().len();
    assert_eq!(gcs as u64, strip.ghc["collections"].as_u64().unwrap());
    let out = memgap(&dir, &["timeline", "strip.mgt", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let timeline: Value = serde_json::from_slice(&out.stdout).unwrap();
    let snapshots = timeline["snapshots"].as_array().unwrap();
    assert!(snapshots.len() >= 5 && gcs >= 40, "{} snapshots, {gcs} GCs", snapshots.len());
    for snapshot in snapshots {
        let points = snapshot["ghc"]["timeline"].as_array().unwrap();
        assert!((1..=2).contains(&points.len()), "{:#}", snapshot["ghc"]);
        assert_eq!(snapshot["ghc"]["settled"], strip.ghc["settled"]);
    }

    // memgap numa lists the collections per capability; without +RTS --numa
    // they are tied to no node, and it says why.
    let out = memgap(&dir, &["numa", "strip.mgt", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let numa: Value = serde_json::from_slice(&out.stdout).unwrap();
    let caps = numa["ghc_capabilities"].as_array().unwrap_or_else(|| panic!("{numa:#}"));
    assert_eq!(caps.len(), 1, "{numa:#}");
    assert!(caps[0]["node"].is_null() && caps[0]["gcs_by_generation"][1].as_u64().unwrap() >= 40, "{numa:#}");
    assert!(numa["notes"].to_string().contains("--numa"), "{numa:#}");

    // Take: the heap drops, and what RSS still shows is MADV_FREE'd (the
    // lazy_free row), not held.
    assert!(bytes(&t["heap_size_bytes"]) <= 0.4 * peak(&take), "take: {t}");
    assert!(resident(&t) <= 0.4 * peak(&take), "take: {t}");
    assert!(bytes(&t["rows"]["lazy_free"]) >= 0.5 * (peak(&take) - bytes(&t["heap_size_bytes"])), "take: {t}");
    assert!(!take.ghc["verdict"]["pinned_fragmentation"].as_bool().unwrap(), "{}", take.ghc["verdict"]);
    assert!(take.ghc["verdict"]["lazy_free"].as_bool().unwrap(), "{}", take.ghc["verdict"]);
}

/// The GHC RTS takes its options from GHCRTS split at whitespace, with no
/// quoting: a trace in a directory whose path has a space (and a quote)
/// must not break the program, and the eventlog kept beside the trace is
/// private, whatever the umask.
#[test]
fn a_directory_with_a_space_and_a_careless_umask() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, base) = tempdir();
    let dir = base.join("a dir's name");
    std::fs::create_dir(&dir).unwrap();
    let Some(exe) = ghc_program(&dir) else { return };
    let plain = run_plain(&dir, arg(&exe), &["strip", "20000"]);
    assert!(plain.status.success());
    // SAFETY: umask only changes this test process's creation mask; the
    // other tests of this file create nothing whose mode they check.
    let old = unsafe { libc::umask(0) };
    let out = memgap(&dir, &["run", "-o", "t.mgt", "--", arg(&exe), "strip", "20000"]);
    // SAFETY: restores the mask read above.
    unsafe { libc::umask(old) };
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("unexpected RTS argument"), "{stderr}");
    assert_eq!(out.stdout, plain.stdout);
    for name in ["t.mgt", "t.eventlog"] {
        let mode = std::fs::metadata(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}\n{stderr}")).permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
    }
    let ledger = memgap(&dir, &["ledger", "t.mgt", "--json"]);
    assert!(ledger.status.success(), "{}", text(&ledger.stderr));
    let json: Value = serde_json::from_slice(&ledger.stdout).unwrap();
    assert!(json["ghc"]["timeline"].as_array().is_some_and(|t| !t.is_empty()), "{}", json["ghc"]);

    // The name the eventlog would be kept under is taken: refused before
    // the program starts, and the symlink's target is untouched.
    let victim = base.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("u.eventlog")).unwrap();
    let line = assert_one_line_failure(&memgap(&dir, &["run", "-o", "u.mgt", "--", arg(&exe), "strip", "20000"]));
    assert!(line.contains("u.eventlog") && line.contains("symlink"), "{line}");
    assert!(!dir.join("u.mgt").exists());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn an_existing_eventlog_with_rss_samples() {
    let (_tmp, dir) = tempdir();
    let Some(exe) = ghc_program(&dir) else { return };
    let out = run_plain(&dir, arg(&exe), &["strip", N, "+RTS", "-l", "-olstrip.eventlog", "-RTS"]);
    assert!(out.status.success());
    std::fs::write(dir.join("rss.txt"), "# seconds bytes\n0.0 10000000\n100 200000000\n").unwrap();
    let out = memgap(&dir, &["ghc", "strip.eventlog", "--rss", "rss.txt", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["verdict"]["pinned_fragmentation"].as_bool().unwrap(), "{}", json["verdict"]);
    assert_eq!(json["ghc_version"], "9.0.2");
    let human = memgap(&dir, &["ghc", "strip.eventlog"]);
    assert!(text(&human.stdout).contains("Pinned fragmentation"), "{}", text(&human.stdout));

    // A log cut in the middle still reads, with one line saying so.
    let whole = std::fs::read(dir.join("strip.eventlog")).unwrap();
    std::fs::write(dir.join("cut.eventlog"), &whole[..whole.len() * 2 / 3]).unwrap();
    let cut = memgap(&dir, &["ghc", "cut.eventlog", "--json"]);
    assert!(cut.status.success(), "{}", text(&cut.stderr));
    assert!(text(&cut.stderr).contains("cut short"), "{}", text(&cut.stderr));

    // Not an eventlog: one line, exit 1.
    std::fs::write(dir.join("junk.eventlog"), b"hello").unwrap();
    let line = assert_one_line_failure(&memgap(&dir, &["ghc", "junk.eventlog"]));
    assert!(line.contains("not a GHC eventlog"), "{line}");
    let line = assert_one_line_failure(&memgap(&dir, &["ghc", "strip.eventlog", "--rss", "junk.eventlog"]));
    assert!(line.contains("expected `SECONDS BYTES"), "{line}");
}

#[test]
fn a_ghc_program_without_rtsopts_is_left_alone_with_advice() {
    let (_tmp, dir) = tempdir();
    if command("ghc", ["--version"]).output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("ghc is not installed: skipping");
        return;
    }
    std::fs::write(dir.join("hello.hs"), "main :: IO ()\nmain = putStrLn \"hello\"\n").unwrap();
    let out =
        output_of(command("ghc", ["-O", "-rtsopts=none", "-eventlog", "-outputdir", "o", "-o", "hello", "hello.hs"]).current_dir(&dir));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = memgap(&dir, &["run", "-o", "h.mgt", "--", "./hello"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello\n");
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("Ignoring GHCRTS"), "memgap set GHCRTS for a program that warns about it:\n{stderr}");
    assert!(stderr.contains("-rtsopts -eventlog"), "{stderr}");
    assert!(!dir.join("h.eventlog").exists());
}
