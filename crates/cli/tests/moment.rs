//! One moment for every command: `run`'s closing verdict, `ledger`,
//! `blame`, `map`, `report` and `export` look at the same snapshot by
//! default (the largest gap between RSS and the live heap), say so, and
//! refuse an `--at` past the trace's end before doing anything.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

/// `gap_midway` recorded once: the trace, and the times its phases ended,
/// as the program printed them (its own clock, not memgap's).
struct Recorded {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    trace: PathBuf,
    run_stderr: String,
    phases: Vec<(String, f64)>,
}

fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let (tmp, dir) = tempdir();
        let exe = compile(&dir, "gap_midway.c");
        let trace = dir.join("t.mgt");
        let out = memgap(&dir, &["run", "-o", arg(&trace), "--", arg(&exe)]);
        assert!(out.status.success(), "memgap run failed: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.ends_with("gap_midway ok\n"), "{stdout}");
        let phases = stdout
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.split_once(" at ")?;
                Some((name.to_string(), rest.trim_end_matches(" s").parse().ok()?))
            })
            .collect();
        Recorded { _dir: tmp, dir, trace, run_stderr: text(&out.stderr), phases }
    })
}

fn phase(r: &Recorded, name: &str) -> f64 {
    r.phases.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no phase {name} in {:?}", r.phases)).1
}

fn ledger_json(r: &Recorded, extra: &[&str]) -> Value {
    let mut args = vec!["ledger", arg(&r.trace), "--json"];
    args.extend_from_slice(extra);
    let out = memgap(&r.dir, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("ledger --json is JSON")
}

fn gap(ledger: &Value) -> u64 {
    let number = |key: &str| ledger[key].as_u64().unwrap_or_else(|| panic!("no {key}"));
    number("rss_bytes") - ledger["rows"]["live"].as_u64().unwrap() - ledger["other_breakdown"]["agent"].as_u64().unwrap()
}

/// The moment's time as every text output prints it: "at 0.63 s".
fn at_text(seconds: f64) -> String {
    format!("at {seconds:.2} s")
}

#[test]
fn the_default_moment_is_the_largest_gap_not_the_peak_nor_the_end() {
    let r = recorded();
    let chosen = ledger_json(r, &[]);
    let peak = ledger_json(r, &["--at", "peak"]);
    let end = ledger_json(r, &["--at", "end"]);
    let seconds = |l: &Value| l["at_seconds"].as_f64().unwrap();
    assert_eq!(chosen["moment"]["chosen"], "gap");
    assert_eq!(chosen["moment"]["reason"], "the largest gap between RSS and the live heap");
    assert_eq!(chosen["moment"]["seconds"].as_f64(), Some(seconds(&chosen)));
    assert_eq!(peak["moment"]["chosen"], "peak");
    assert_eq!(end["moment"]["chosen"], "end");
    // Against the program's own clock: the snapshot it asked for after
    // freeing 7 of every 8 small blocks (taken 0 to 50 ms before it printed
    // the time; its clock starts a little after memgap's).
    let freed = phase(r, "gap");
    assert!((seconds(&chosen) - freed).abs() < 0.1, "the moment {} s, the program freed its blocks at {freed} s", seconds(&chosen));
    assert!(seconds(&peak) < phase(r, "peak") + 0.1 && seconds(&peak) < seconds(&chosen), "peak {} s", seconds(&peak));
    assert!(seconds(&end) > phase(r, "end") - 0.1, "end {} s", seconds(&end));
    // The program's shape, as the kernel saw it: RSS fell by the 48 MiB block
    // from the peak, and the live heap to an eighth of the small blocks.
    assert!(peak["rss_bytes"].as_u64().unwrap() > chosen["rss_bytes"].as_u64().unwrap() + (40 << 20));
    assert!(chosen["rows"]["live"].as_u64().unwrap() < 8 << 20);
    assert!(gap(&chosen) > 30 << 20, "gap {}", gap(&chosen));
    assert!(gap(&chosen) > gap(&peak) + (20 << 20) && gap(&chosen) > gap(&end) + (20 << 20));
}

#[test]
fn every_command_shows_the_same_moment_and_says_why() {
    let r = recorded();
    let seconds = ledger_json(r, &[])["moment"]["seconds"].as_f64().unwrap();
    let at = at_text(seconds);
    let why = "the largest gap between RSS and the live heap";

    // run: the closing verdict is that moment's, then one line on the end.
    let verdict_line = format!("memgap: {at}, {why}; --at peak|end|SECONDS for others");
    assert!(r.run_stderr.lines().any(|l| l == verdict_line), "run said:\n{}", r.run_stderr);
    let end_lines: Vec<&str> = r.run_stderr.lines().filter(|l| l.starts_with("memgap: at the end (")).collect();
    assert_eq!(end_lines.len(), 1, "run said:\n{}", r.run_stderr);

    // Lines as they are, not fitted to a width the environment may set.
    let first_line = |args: &[&str]| {
        let out = output_of(memgap_cmd(&r.dir, args).env_remove("COLUMNS"));
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout).lines().next().unwrap_or_default().to_string()
    };
    for command in ["ledger", "blame", "map"] {
        let line = first_line(&[command, arg(&r.trace)]);
        assert!(line.contains(&format!("{at} (")) && line.contains(why), "{command}: {line}");
    }
    let blame_entries: Value = serde_json::from_slice(&memgap(&r.dir, &["blame", arg(&r.trace), "--json"]).stdout).unwrap();
    assert!(blame_entries.is_array());

    let pprof = r.dir.join("p.pb.gz");
    let out = memgap(&r.dir, &["export", arg(&r.trace), "--pprof", arg(&pprof)]);
    assert!(out.status.success() && pprof.exists(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("{at}, {why}")), "export said: {}", text(&out.stderr));

    let html = r.dir.join("r.html");
    let out = memgap(&r.dir, &["report", arg(&r.trace), "-o", arg(&html)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    let data = report_data(&page);
    assert_eq!(data["moment"]["seconds"].as_f64(), Some(seconds));
    assert_eq!(data["moment"]["chosen"], "gap");
    let index = data["moment"]["index"].as_u64().unwrap() as usize;
    assert_eq!(data["snapshots"][index]["seconds"].as_f64(), Some(seconds));
    assert_ne!(data["moment"]["index"], data["peak"], "the report's moment is not the RSS peak");
    assert_eq!(data["blame"]["at_seconds"].as_f64(), Some(seconds));

    // --at peak moves every command the same way.
    let peak = ledger_json(r, &["--at", "peak"])["at_seconds"].as_f64().unwrap();
    let line = first_line(&["blame", arg(&r.trace), "--at", "peak"]);
    assert!(line.contains(&format!("{} (", at_text(peak))) && line.contains("the RSS peak"), "{line}");
}

/// The report's data: the JSON in its `<script id="data">` element.
fn report_data(page: &str) -> Value {
    let start = page.find("id=\"data\"").expect("the report holds its data");
    let start = start + page[start..].find('>').unwrap() + 1;
    let end = start + page[start..].find("</script>").unwrap();
    serde_json::from_str(&page[start..end]).expect("the report's data is JSON")
}

#[test]
fn a_time_past_the_end_is_refused_with_one_line_and_nothing_written() {
    let r = recorded();
    let html = r.dir.join("late.html");
    let pprof = r.dir.join("late.pb.gz");
    let commands: [&[&str]; 5] = [
        &["ledger", arg(&r.trace), "--at", "99"],
        &["blame", arg(&r.trace), "--at", "99s"],
        &["map", arg(&r.trace), "--at", "99"],
        &["report", arg(&r.trace), "--at", "99", "-o", arg(&html)],
        &["export", arg(&r.trace), "--at", "99", "--pprof", arg(&pprof)],
    ];
    for args in commands {
        let out = memgap(&r.dir, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed {}", text(&out.stdout));
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("memgap: ") && stderr.contains("--at 99 is past the end of the trace"), "{args:?}: {stderr}");
    }
    assert!(!html.exists() && !pprof.exists());
    // Within the trace, the nearest snapshot, and it says which.
    let line = text(&memgap(&r.dir, &["ledger", arg(&r.trace), "--at", "0.3"]).stdout);
    assert!(line.lines().next().unwrap().contains("the snapshot nearest to 0.3 s"), "{line}");
}

/// The default moment has the largest gap of all the snapshots, as each
/// snapshot's own ledger counts it, in a program whose threads each get a
/// buffer of memgap's (mostly address space reserved, not resident).
#[test]
fn the_default_moment_has_the_largest_gap_of_every_snapshots_ledger() {
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "owners_churn.c");
    let trace = dir.join("t.mgt");
    let out = memgap(&dir, &["run", "-q", "-o", arg(&trace), "--", arg(&exe), "threads", "16", "0.3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = |args: &[&str]| -> Value {
        let out = memgap(&dir, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let timeline = json(&["timeline", arg(&trace), "--json"]);
    let times: Vec<f64> = timeline["snapshots"].as_array().unwrap().iter().map(|s| s["at_seconds"].as_f64().unwrap()).collect();
    assert!(times.len() >= 2, "{times:?}");
    let gaps: Vec<u64> = times.iter().map(|t| gap(&json(&["ledger", arg(&trace), "--json", "--at", &t.to_string()]))).collect();
    let chosen = json(&["ledger", arg(&trace), "--json"]);
    let largest = *gaps.iter().max().unwrap();
    // memgap's static data is left out of the cheaper count the choice uses.
    assert!(
        gap(&chosen) + (256 << 10) >= largest,
        "chosen at {} s with a gap of {}; the snapshots' gaps {gaps:?} at {times:?}",
        chosen["at_seconds"],
        gap(&chosen)
    );
    assert!(largest > 1 << 20, "{gaps:?}");
}
