//! One test per heap owner: a program that leaves its gap in that owner
//! runs under `memgap run`; the ledger at exit must add up to VmRSS within
//! 2 %, name that owner as holding the gap, keep its heap out of `other`,
//! and its first remedy, applied to the same program run plainly, must lower
//! the RSS measured from outside (VmRSS sampled while the program holds
//! still, against a plain run without the remedy).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// Seconds the C and Go programs hold still after the burst: long enough
/// for a remedy that acts each second (the trim library) to act once.
const HOLD: &str = "2";

fn u(value: &Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or_else(|| panic!("no {key} in {value:#}"))
}

/// `base` with `extra` laid over it; LD_PRELOAD lists are joined, and a
/// library memgap ships (the trim library) is found next to memgap.
fn with_remedy(base: &[(String, String)], extra: &Value) -> Vec<(String, String)> {
    let mut env = base.to_vec();
    for (key, value) in extra.as_object().expect("env is an object") {
        let mut value = value.as_str().expect("env values are strings").to_string();
        if key == "LD_PRELOAD" && !value.contains('/') {
            value = memgap_bin().with_file_name(&value).display().to_string();
        }
        match env.iter_mut().find(|(k, _)| k == key) {
            Some((_, existing)) if key == "LD_PRELOAD" => *existing = format!("{value}:{existing}"),
            Some((_, existing)) => *existing = value,
            None => env.push((key.clone(), value)),
        }
    }
    env
}

/// Records `cmd` under `env`, checks the ledger at exit for `owner`, runs
/// its first remedy, and returns the ledger.
fn check_owner(dir: &Path, name: &str, cmd: &[String], env: &[(String, String)], owner: &str) -> Value {
    let trace = dir.join(format!("{name}.mgt"));
    let mut run = memgap_cmd(dir, &["run", "-q", "-o", arg(&trace), "--"]);
    run.args(cmd);
    for (key, value) in env {
        run.env(key, value);
    }
    let out = output_of(&mut run);
    assert!(out.status.success(), "{name}: memgap run failed:\n{}", text(&out.stderr));
    let out = memgap(dir, &["ledger", arg(&trace), "--at", "end", "--json"]);
    assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    let l: Value = serde_json::from_slice(&out.stdout).unwrap();

    let rss = u(&l, "rss_bytes");
    let sum: u64 = l["rows"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert!(sum.abs_diff(rss) * 50 <= rss, "{name}: rows sum to {sum}, VmRSS {rss}: {:#}", l["rows"]);
    assert_eq!(l["gap_owner"].as_str(), Some(owner), "{name}: {:#}", l["owners"]);
    let share = l["owners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["owner"] == owner)
        .unwrap_or_else(|| panic!("{name}: no {owner} share: {:#}", l["owners"]));
    let owned: u64 = share["rows"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    // The burst's memory is the owner's: `other` keeps only what no owner
    // claims (files, memgap's buffers, the program's own small mmaps).
    let other = &l["other_breakdown"];
    let anonymous_other = u(other, "program_mmap") + u(other, "unclassified");
    assert!(anonymous_other * 20 <= rss, "{name}: other holds {anonymous_other} B of anonymous memory: {other:#}");
    assert!(owned * 2 >= rss, "{name}: the {owner} share holds {owned} of {rss} B");
    for finding in l["findings"].as_array().unwrap() {
        assert!(
            finding["kind"].is_string() && finding["owner"].is_string() && finding["bytes"].is_u64() && finding["share"].is_f64(),
            "{finding:#}"
        );
    }

    let remedies = l["remedies"].as_array().unwrap();
    let first = remedies.first().unwrap_or_else(|| panic!("{name}: no remedy: {l:#}"));
    assert_eq!(first["owner"].as_str(), Some(owner), "{name}: {first:#}");
    for remedy in remedies {
        // Only the allocator or runtime in use: never another allocator's knobs.
        let env = remedy["env"].as_object().unwrap();
        assert!(!env.values().any(|v| v.as_str().is_some_and(|v| v.contains("jemalloc") || v.contains("mimalloc"))), "{name}: {remedy:#}");
    }
    let plain = holding_rss(cmd, env);
    let remedied = holding_rss(cmd, &with_remedy(env, &first["env"]));
    eprintln!(
        "{name}: {} — RSS {} MiB plain, {} MiB with it (expected savings {} MiB)",
        first["id"],
        plain >> 20,
        remedied >> 20,
        u(first, "expected_savings_bytes") >> 20
    );
    assert!(remedied * 10 <= plain * 9, "{name}: {} did not lower RSS: {plain} B plain, {remedied} B with it", first["id"]);
    l
}

fn churn(dir: &Path, mode: &str) -> Vec<String> {
    let exe = compile(dir, "owners_churn.c");
    vec![arg(&exe).to_string(), mode.to_string(), "64".into(), HOLD.into()]
}

/// The allocator library, or None (and a line) when it is not installed.
fn allocator(file: &str) -> Option<Vec<(String, String)>> {
    let path = Path::new(ALLOCATOR_DIR).join(file);
    if !path.exists() {
        eprintln!("{} is not installed: skipped", path.display());
        return None;
    }
    Some(vec![("LD_PRELOAD".to_string(), path.display().to_string())])
}

#[test]
fn glibc_main_arena() {
    let (_tmp, dir) = tempdir();
    check_owner(&dir, "glibc-main", &churn(&dir, "main"), &[], "glibc");
}

#[test]
fn glibc_thread_arenas() {
    let (_tmp, dir) = tempdir();
    check_owner(&dir, "glibc-threads", &churn(&dir, "threads"), &[], "glibc");
}

#[test]
fn jemalloc() {
    let Some(env) = allocator("libjemalloc.so.2") else { return };
    let (_tmp, dir) = tempdir();
    check_owner(&dir, "jemalloc", &churn(&dir, "main"), &env, "jemalloc");
}

#[test]
fn tcmalloc() {
    let Some(env) = allocator("libtcmalloc_minimal.so.4") else { return };
    let (_tmp, dir) = tempdir();
    check_owner(&dir, "tcmalloc", &churn(&dir, "main"), &env, "tcmalloc");
}

#[test]
fn mimalloc() {
    let Some(env) = allocator("libmimalloc.so.2") else { return };
    let (_tmp, dir) = tempdir();
    check_owner(&dir, "mimalloc", &churn(&dir, "main"), &env, "mimalloc");
}

fn go_command() -> Option<String> {
    ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .find(|go| Command::new(go).arg("version").output().is_ok_and(|o| o.status.success()))
        .map(str::to_string)
}

/// tests/programs/go/burst, with the helper package (`-tags helper`) or without.
fn go_burst(dir: &Path, helper: bool) -> Option<PathBuf> {
    let Some(go) = go_command() else {
        eprintln!("go is not installed: skipped");
        return None;
    };
    let source = dir.join("burst-src");
    std::fs::create_dir_all(&source).unwrap();
    for file in ["main.go", "helper.go", "nohelper.go"] {
        std::fs::copy(programs_dir().join("go/burst").join(file), source.join(file)).unwrap();
    }
    let helper_package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../go/memgap").canonicalize().unwrap();
    std::fs::write(
        source.join("go.mod"),
        format!(
            "module burst\n\ngo 1.19\n\nrequire memgap.dev/go/memgap v0.0.0\n\nreplace memgap.dev/go/memgap => {}\n",
            helper_package.display()
        ),
    )
    .unwrap();
    let exe = dir.join(if helper { "burst-helper" } else { "burst" });
    let mut build = Command::new(go);
    build.args(["build", "-o"]).arg(&exe);
    if helper {
        build.args(["-tags", "helper"]);
    }
    let out = output_of(build.arg(".").current_dir(&source).env("GOFLAGS", "-mod=mod"));
    assert!(out.status.success(), "go build failed:\n{}", text(&out.stderr));
    Some(exe)
}

#[test]
fn go_with_the_helper() {
    let (_tmp, dir) = tempdir();
    let Some(exe) = go_burst(&dir, true) else { return };
    check_owner(&dir, "go-helper", &[arg(&exe).to_string(), "-hold".into(), HOLD.into()], &[], "go");
}

#[test]
fn go_without_the_helper() {
    let (_tmp, dir) = tempdir();
    let Some(exe) = go_burst(&dir, false) else { return };
    check_owner(&dir, "go-gctrace", &[arg(&exe).to_string(), "-hold".into(), HOLD.into()], &[], "go");
    let l: Value =
        serde_json::from_slice(&memgap(&dir, &["ledger", arg(&dir.join("go-gctrace.mgt")), "--at", "end", "--json"]).stdout).unwrap();
    let share = &l["owners"][0];
    assert!(share["estimated"].as_str().is_some_and(|e| e.contains("gctrace")), "{share:#}");
    // One buffer in ten of 160 MiB is kept: gctrace marks about 16 MB live.
    let live = u(&share["rows"], "live");
    assert!((12 << 20..=24 << 20).contains(&live), "live {live}");
    let summary = summary_json(&dir.join("go-gctrace.mgt"));
    assert!(u(&summary, "peak_live_bytes") >= 12 << 20, "{summary:#}");
    assert!(u(&summary, "threads") > 0, "{summary:#}");
}

#[test]
fn ghc_strip() {
    if Command::new("ghc").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("ghc is not installed: skipped");
        return;
    }
    let (_tmp, dir) = tempdir();
    let exe = dir.join("pinned");
    let out = output_of(
        Command::new("ghc")
            .args(["-O", "-rtsopts", "-eventlog", "-outputdir"])
            .arg(dir.join("o"))
            .arg("-o")
            .arg(&exe)
            .arg(programs_dir().join("ghc/pinned.hs")),
    );
    assert!(out.status.success(), "ghc failed:\n{}", text(&out.stderr));
    check_owner(&dir, "ghc", &[arg(&exe).to_string(), "strip".into(), "1000000".into()], &[], "ghc");
    let summary = summary_json(&dir.join("ghc.mgt"));
    assert_eq!(summary["runtime"]["owner"], "ghc", "{summary:#}");
    assert!(u(&summary, "peak_live_bytes") >= 64 << 20, "{summary:#}");
}

#[test]
fn ruby_over_glibc() {
    if Command::new("ruby").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("ruby is not installed: skipped");
        return;
    }
    let (_tmp, dir) = tempdir();
    let program = programs_dir().join("ruby/workers.rb");
    // Ruby's threads free most of what they built: glibc's arenas hold the
    // gap, under Ruby's own layer.
    let l = check_owner(&dir, "ruby", &["ruby".to_string(), arg(&program).to_string(), HOLD.into()], &[], "glibc");
    let ruby = &l["ruby"];
    assert!(ruby["version"].as_str().is_some_and(|v| v.starts_with('3')), "{ruby:#}");
    let share =
        l["owners"].as_array().unwrap().iter().find(|o| o["owner"] == "ruby").unwrap_or_else(|| panic!("no ruby share: {:#}", l["owners"]));
    let rows = &share["rows"];
    let owned: u64 = rows.as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    // Its object pages are Ruby's share, out of the program's mmaps in
    // `other`: live slots as live, free slots as fragmented.
    let pages = u(ruby, "object_pages_bytes");
    assert!(owned * 2 >= pages && owned <= pages, "ruby share {owned} B of {pages} B of object pages: {share:#}");
    assert!(u(rows, "live") > 0 && u(rows, "fragmented") > 0, "{share:#}");
    assert!(u(&l["other_breakdown"], "program_mmap") * 50 <= u(&l, "rss_bytes"), "{:#}", l["other_breakdown"]);
    assert!(l["verdict"].as_str().unwrap().contains("malloc layer"), "{}", l["verdict"]);
}
