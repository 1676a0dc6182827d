//! Ruby programs under `memgap run`: the sampler loaded through RUBYOPT
//! gives the Ruby layer, laid over the agent's malloc layer.

mod common;

use std::path::PathBuf;

use common::*;
use serde_json::Value;

fn ruby_program(name: &str) -> PathBuf {
    programs_dir().join("ruby").join(name)
}

/// Runs `ruby PROGRAM ARGS` under memgap and returns the ledger JSON at exit.
fn ledger_at_exit(dir: &std::path::Path, trace: &str, program: &str, args: &[&str]) -> Value {
    let program = ruby_program(program);
    let mut run = vec!["run", "-q", "-o", trace, "--", "ruby", arg(&program)];
    run.extend_from_slice(args);
    let plain = run_plain(dir, "ruby", &[&[arg(&program)], args].concat());
    let traced = memgap(dir, &run);
    assert_same_behaviour(&plain, &traced);
    let out = memgap(dir, &["ledger", "--json", "--at", "end", trace]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a count: {value}"))
}

#[test]
fn threads_leave_the_gap_in_the_malloc_layer() {
    let (_tmp, dir) = tempdir();
    let l = ledger_at_exit(&dir, "threads.mgt", "threads.rb", &["0.2"]);
    let ruby = &l["ruby"];
    assert!(ruby.is_object(), "no Ruby layer: {l:#}");
    assert!(ruby["version"].as_str().is_some_and(|v| v.starts_with('3')), "{ruby:#}");
    assert_eq!(u(&ruby["slot_size"]), 40, "Ruby 3.1's RVALUE, from GC::INTERNAL_CONSTANTS: {ruby:#}");
    let known = u(&ruby["known_bytes"]);
    let rss = u(&l["rss_bytes"]);
    let retained = u(&l["rows"]["retained"]);
    // Ruby's view must match what the agent sees of its object pages.
    assert!(u(&ruby["object_pages_bytes"]) <= u(&l["other_breakdown"]["program_mmap"]) + (1 << 20), "{l:#}");
    assert!(known > 0 && known < rss / 10, "Ruby knows {known} of {rss}: {l:#}");
    let rows = l["rows"].as_object().unwrap();
    let (dominant, _) = rows.iter().filter(|(name, _)| *name != "live").max_by_key(|(_, v)| v.as_u64().unwrap()).unwrap();
    assert_eq!(dominant, "retained", "{l:#}");
    assert!(retained > 10 * known, "retained {retained} should dwarf what Ruby knows ({known}): {l:#}");
    let verdict = l["verdict"].as_str().unwrap();
    assert!(verdict.contains("malloc layer") && verdict.contains("Ruby 3"), "{verdict}");
}

#[test]
fn remedies_lower_the_steady_rss_of_a_threaded_ruby() {
    let (_tmp, dir) = tempdir();
    let program = ruby_program("threads.rb");
    let out = memgap(&dir, &["compare", "--json", "--repeat", "1", "--", "ruby", arg(&program), "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c: Value = serde_json::from_slice(&out.stdout).unwrap();
    let steady = |name: &str| {
        let config = c["configs"].as_array().unwrap().iter().find(|x| x["name"] == name).unwrap();
        config["steady_rss_bytes"].as_f64().unwrap()
    };
    let glibc = steady("glibc");
    eprintln!("steady RSS: glibc {glibc}, trim {}, arena-max-2 {}", steady("trim"), steady("arena-max-2"));
    assert!(steady("trim") < 0.7 * glibc, "{c:#}");
    assert!(steady("arena-max-2") < 0.7 * glibc, "{c:#}");
}

#[test]
fn scattered_survivors_fragment_ruby_pages_and_compaction_fixes_it() {
    let (_tmp, dir) = tempdir();
    let plain = ledger_at_exit(&dir, "burst.mgt", "burst.rb", &[]);
    let compacted = ledger_at_exit(&dir, "compact.mgt", "burst.rb", &["compact"]);
    let free = |l: &Value| u(&l["ruby"]["free_slots_bytes"]);
    let pages = |l: &Value| u(&l["ruby"]["object_pages"]);
    eprintln!("free slots: {} in {} pages, compacted {} in {} pages", free(&plain), pages(&plain), free(&compacted), pages(&compacted));
    // 400,000 strings of one slot each, 1 in 100 kept: ~15 MiB of free slots.
    assert!(free(&plain) > 10 << 20, "{plain:#}");
    assert!(plain["ruby"]["free_slot_fraction"].as_f64().unwrap() > 0.8, "{plain:#}");
    assert!(plain["verdict"].as_str().unwrap().contains("GC.compact"), "{}", plain["verdict"]);
    assert!(u(&compacted["ruby"]["compact_count"]) >= 1, "{compacted:#}");
    assert!(
        free(&compacted) < free(&plain) * 6 / 10 && pages(&compacted) < pages(&plain) * 6 / 10,
        "GC.compact should free pages: {compacted:#}"
    );
}

#[test]
fn programs_that_are_not_ruby_have_no_ruby_layer_and_ruby_output_is_untouched() {
    let (_tmp, dir) = tempdir();
    let program = compile(&dir, "exact_counts.c");
    let out = memgap(&dir, &["run", "-q", "-o", "c.mgt", "--", arg(&program)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let l: Value = serde_json::from_slice(&memgap(&dir, &["ledger", "--json", "c.mgt"]).stdout).unwrap();
    assert!(l.get("ruby").is_none(), "{l:#}");

    // A Ruby program that lists its threads, forks, and reads RUBYOPT's effect.
    let script = "puts Thread.list.size; pid = fork { puts :child; exit 3 }; Process.wait(pid); puts $?.exitstatus; warn :err";
    let plain = run_plain(&dir, "ruby", &["-e", script]);
    let traced = memgap(&dir, &["run", "-q", "-o", "e.mgt", "--", "ruby", "-e", script]);
    assert_same_behaviour(&plain, &traced);
    assert_eq!(text(&traced.stdout), "1\nchild\n3\n");
    assert!(std::fs::read_dir(&dir).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with("ruby.")));
}
