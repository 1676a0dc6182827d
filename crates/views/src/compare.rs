//! Terminal view of `memgap compare`: one row per configuration, ratios to
//! the default beside each figure, differences in behaviour on top, the
//! recommendation with its confidence at the end.

use std::fmt::Write;

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, Table};
use memgap_model::compare::{Comparison, ConfigResult, Metric};

use crate::format::{bytes, seconds};

/// Lines of a failed run's stderr shown.
const STDERR_LINES: usize = 5;

/// `show_diff`: list the lines of stdout that differ from the default's.
pub fn compare(c: &Comparison, show_diff: bool) -> String {
    let mut out = String::new();
    let base_runs = c.configs.first().map_or(0, |b| b.repeats);
    let runs =
        if c.repeats == 1 { "1 run per configuration".to_string() } else { format!("{} runs per configuration, interleaved", c.repeats) };
    let runs = if base_runs > c.repeats { format!("{runs}, {base_runs} of the default (first and last)") } else { runs };
    let _ = writeln!(out, "memgap compare — {} — {runs}; stdin was {}", shell_words(&c.command), c.stdin);
    let _ = writeln!(out);
    for warning in behaviour_warnings(c, show_diff) {
        let _ = writeln!(out, "  ! {warning}");
    }
    if c.output_differs || c.exit_differs {
        let _ = writeln!(out);
    }

    let ran: Vec<&ConfigResult> = c.configs.iter().filter(|config| config.repeats > 0).collect();
    let mut table = Table::new();
    table.load_style(NOTHING);
    let spread_header = format!("{} ±", c.metric.name());
    let mut header = vec![
        "  config",
        "peak RSS",
        "",
        "steady RSS",
        "",
        "final RSS",
        "",
        "settled",
        &spread_header,
        "wall",
        "",
        "CPU",
        "",
        "exit",
        "stdout",
    ];
    let numa_basis = c.numa.as_ref().map(|numa| numa.basis.unwrap_or("none"));
    let numa_headers = numa_basis.map(|basis| [format!("{basis} local"), "NUMA rate/s".to_string()]);
    if let Some(headers) = &numa_headers {
        header.extend(headers.iter().map(String::as_str));
    }
    table.set_header(header);
    for config in &ran {
        let ratio =
            |r: Option<f64>| if config.name == c.baseline { String::new() } else { r.map_or(String::new(), |r| format!("{r:.2}×")) };
        let stdout = if config.output_differs {
            format!("DIFFERS ({} lines)", config.output_differs_lines)
        } else if config.output_varies {
            "varies".to_string()
        } else {
            "same".to_string()
        };
        let exit = config.exit_code.map_or("?".to_string(), |code| code.to_string()) + if config.exit_differs { " !" } else { "" };
        let mut row = vec![
            format!("  {}", config.name),
            config.peak_rss_bytes.map(bytes).unwrap_or_default(),
            ratio(config.peak_rss_ratio),
            config.steady_rss_bytes.map(bytes).unwrap_or_default(),
            ratio(config.steady_rss_ratio),
            config.final_rss_bytes.map(bytes).unwrap_or_default(),
            ratio(config.final_rss_ratio),
            config.settle_seconds.map(seconds).unwrap_or_default(),
            spread(config, c.metric),
            config.wall_seconds.map(seconds).unwrap_or_default(),
            ratio(config.wall_ratio),
            config.cpu_seconds.map(seconds).unwrap_or_default(),
            ratio(config.cpu_ratio),
            exit,
            stdout.to_string(),
        ];
        if numa_headers.is_some() {
            let numa = config.numa.as_ref();
            row.push(numa.and_then(|n| n.local_fraction).map_or("-".to_string(), |f| format!("{f:.2}")));
            row.push(numa.and_then(|n| n.rate_per_second).map_or("-".to_string(), rate));
        }
        table.add_row(row);
    }
    for column in (1..=13).chain(15..=16) {
        if let Some(column) = table.column_mut(column) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    out.push_str(&table.to_string());
    out.push('\n');

    for config in c.configs.iter().filter(|config| !config.available) {
        let install = config.package.as_ref().map(|p| format!(" (apt install {p})")).unwrap_or_default();
        let why = config.note.as_deref().unwrap_or("not available");
        let _ = writeln!(out, "  {}: {why}{install}", config.name);
    }
    let _ = writeln!(out);
    let window = match c.steady_from_seconds {
        Some(from) => format!("mean RSS from {from} s on"),
        None => "mean RSS over the last half of the run".to_string(),
    };
    let end = match c.final_at_seconds {
        Some(at) => format!("before {at} s"),
        None => "before exit".to_string(),
    };
    let _ = writeln!(
        out,
        "  Medians over runs; RSS of the process tree every {} ms; steady: {window}; final: mean over the last second {end} (a quarter of a shorter run); settled: from when RSS stays within 10 % (1 MiB) of final; {} ±: half the range of its runs; ×: ratio to {}.",
        c.interval_ms,
        c.metric.name(),
        c.baseline
    );
    if let Some(numa) = &c.numa
        && numa.basis.is_some()
    {
        let events = if numa.basis == Some("access") { "sampled memory accesses" } else { "first touches (page faults)" };
        let _ = writeln!(
            out,
            "  NUMA ({}): local: the share of {events} on the node of the CPU, median over runs; rate: Σ distance × {} ÷ seconds (local distance 10), median.",
            if numa.nodes == 1 { "1 node".to_string() } else { format!("{} nodes", numa.nodes) },
            if numa.basis == Some("access") { "accesses" } else { "first touches" }
        );
    }
    for config in ran.iter().filter(|config| !config.env.is_empty() || !config.wrapper.is_empty()) {
        let mut words: Vec<String> = config.env.iter().map(|(name, value)| format!("{name}={value}")).collect();
        if !config.wrapper.is_empty() {
            words.push(config.wrapper.join(" "));
            words.push("CMD".to_string());
        }
        let _ = writeln!(out, "  {}: {}", config.name, words.join(" "));
    }
    for config in &ran {
        if let Some(stderr) = &config.failure_stderr {
            let _ = writeln!(out, "  {} failed; the end of its stderr:", config.name);
            let lines: Vec<&str> = stderr.lines().collect();
            for line in &lines[lines.len().saturating_sub(STDERR_LINES)..] {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    for note in &c.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "  Recommendation: {}", c.recommendation.text);
    out
}

/// Events per second: 1234 → "1.2 k".
fn rate(per_second: f64) -> String {
    match per_second {
        r if r >= 1e9 => format!("{:.1} G", r / 1e9),
        r if r >= 1e6 => format!("{:.1} M", r / 1e6),
        r if r >= 1e3 => format!("{:.1} k", r / 1e3),
        r => format!("{r:.0}"),
    }
}

/// Half the range of a configuration's runs of `metric`, as a share of its median.
fn spread(config: &ConfigResult, metric: Metric) -> String {
    let (Some(spread), Some(median)) = (config.spread, config.metric(metric)) else { return String::new() };
    if config.repeats < 2 || median == 0 {
        return String::new();
    }
    let range = match metric {
        Metric::Peak => spread.peak_rss_bytes,
        Metric::Steady => spread.steady_rss_bytes,
        Metric::Final => spread.final_rss_bytes,
    };
    format!("{:.0} %", range.width() / 2.0 / median as f64 * 100.0)
}

/// The command as a shell would read it back: words with anything but
/// plain characters in single quotes.
fn shell_words(command: &[String]) -> String {
    let plain = |word: &str| !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "/._-=:,+@%".contains(c));
    let quote = |word: &String| if plain(word) { word.clone() } else { format!("'{}'", word.replace('\'', "'\\''")) };
    command.iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// Differences in what the command did, which make the figures compare
/// different work: shown before them, never left out.
fn behaviour_warnings(c: &Comparison, show_diff: bool) -> Vec<String> {
    let mut warnings = Vec::new();
    let output: Vec<String> = c
        .configs
        .iter()
        .filter(|config| config.output_differs)
        .map(|config| format!("{} ({} lines)", config.name, config.output_differs_lines))
        .collect();
    if !output.is_empty() {
        let where_the_default_agrees = if c.baseline_varying_lines > 0 { " where its own runs agree" } else { "" };
        let hint = if show_diff { "" } else { "; --show-diff lists the lines" };
        warnings.push(format!(
            "stdout DIFFERS from {}'s{where_the_default_agrees} under: {} — the command did something else there; figures shown anyway{hint}",
            c.baseline,
            output.join(", ")
        ));
        if show_diff {
            for config in c.configs.iter().filter(|config| config.output_differs) {
                for diff in &config.output_diff {
                    let line = if diff.line > 0 { format!("line {}", diff.line) } else { "a line".to_string() };
                    let shown = |text: &Option<String>| text.as_ref().map_or("(nothing)".to_string(), |t| format!("{t:?}"));
                    warnings.push(format!(
                        "  {} {line}: {} printed {}, {} printed {}",
                        config.name,
                        c.baseline,
                        shown(&diff.expected),
                        config.name,
                        shown(&diff.got)
                    ));
                }
                if config.output_differs_lines > config.output_diff.len() {
                    warnings.push(format!("  {}: {} more lines", config.name, config.output_differs_lines - config.output_diff.len()));
                }
            }
        }
    }
    let exits: Vec<String> = c
        .configs
        .iter()
        .filter(|config| config.exit_differs)
        .map(|config| {
            format!("{} (exit {})", config.name, config.runs.iter().map(|r| r.exit_code.to_string()).collect::<Vec<_>>().join(", "))
        })
        .collect();
    if !exits.is_empty() {
        let base_exit = c.configs.first().and_then(|b| b.runs.first()).map_or(0, |r| r.exit_code);
        warnings.push(format!("exit status DIFFERS from {}'s ({base_exit}) under: {}", c.baseline, exits.join(", ")));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_model::compare::{ConfigSpec, Options, RssSample, Run, Stdout, compare as reduce};

    fn run(rss: u64, hash: u64, exit_code: i32) -> Run {
        let samples = (0..10).map(|i| RssSample { seconds: i as f64 * 0.1, rss_bytes: rss }).collect();
        let stdout = Stdout::Lines(vec!["same".into(), "x".repeat(hash as usize)]);
        Run { samples, wall_seconds: 1.0, cpu_seconds: 0.5, max_rss_bytes: rss, exit_code, stdout_hash: hash, stdout, ..Run::default() }
    }

    fn spec(name: &str, available: bool) -> ConfigSpec {
        let package = (!available).then(|| "libjemalloc2".to_string());
        let note = (!available).then(|| "not installed".to_string());
        ConfigSpec { name: name.into(), env: vec![("MALLOC_ARENA_MAX".into(), "2".into())], wrapper: Vec::new(), package, available, note }
    }

    #[test]
    fn quotes_the_command_like_a_shell() {
        let words = ["sh", "-c", "echo $X", "it's"].map(String::from);
        assert_eq!(shell_words(&words), "sh -c 'echo $X' 'it'\\''s'");
    }

    #[test]
    fn shows_figures_ratios_differences_and_missing_allocators() {
        let c = reduce(
            vec!["./prog".into()],
            vec![spec("glibc", true), spec("arena-max-2", true), spec("jemalloc", false)],
            vec![vec![run(80 << 20, 1, 0), run(80 << 20, 1, 0)], vec![run(20 << 20, 2, 1)], vec![]],
            Options::default(),
        );
        let text = compare(&c, false);
        assert!(text.contains("stdin was /dev/null"), "{text}");
        assert!(text.contains("1 run per configuration, 2 of the default (first and last)"), "{text}");
        assert!(text.contains("! stdout DIFFERS from glibc's under: arena-max-2 (1 lines) — the command did something else there; figures shown anyway; --show-diff lists the lines"), "{text}");
        assert!(text.contains("DIFFERS (1 lines)"), "{text}");
        let shown = compare(&c, true);
        assert!(shown.contains("arena-max-2 line 2: glibc printed \"x\", arena-max-2 printed \"xx\""), "{shown}");
        assert!(text.contains("Recommendation: "), "{text}");
        assert!(text.contains("! exit status DIFFERS from glibc's (0) under: arena-max-2 (exit 1)"), "{text}");
        assert!(text.contains("20.0 MiB"), "{text}");
        assert!(text.contains("0.25×"), "{text}");
        assert!(text.contains("jemalloc: not installed (apt install libjemalloc2)"), "{text}");
    }

    #[test]
    fn numa_columns_and_the_wrapped_command() {
        use memgap_model::compare::RunLocality;
        use memgap_model::numa::{AccessLocality, DistanceCount};
        let sampled = |local: u64, remote: u64| {
            let mut r = run(10 << 20, 1, 0);
            let by_distance = vec![DistanceCount { distance: 10, events: local }, DistanceCount { distance: 21, events: remote }];
            let locality = AccessLocality {
                kind: "first-touch",
                source: "page-faults".into(),
                matrix: vec![vec![local, remote], vec![0, 0]],
                weighted_rate_per_second: Some((10 * local + 21 * remote) as f64),
                by_distance,
                local_fraction: Some(local as f64 / (local + remote) as f64),
                seconds: 1.0,
                samples: local + remote,
                ..AccessLocality::default()
            };
            r.numa = Some(Ok(RunLocality { locality, access_unavailable_reason: "no PMU".into() }));
            r
        };
        let mut interleave = spec("interleave", true);
        interleave.env.clear();
        interleave.wrapper = vec!["numactl".into(), "--interleave=all".into()];
        let options = Options { numa_nodes: Some(2), ..Options::default() };
        let c = reduce(
            vec!["./prog".into()],
            vec![spec("glibc", true), interleave],
            vec![vec![sampled(1000, 0), sampled(980, 20)], vec![sampled(500, 500)]],
            options,
        );
        let text = compare(&c, false);
        assert!(text.contains("first-touch local") && text.contains("NUMA rate/s"), "{text}");
        assert!(text.contains("0.99") && text.contains("0.50"), "{text}");
        assert!(text.contains("15.5 k"), "the interleaved rate, (10 × 500 + 21 × 500) / s: {text}");
        assert!(text.contains("interleave: numactl --interleave=all CMD"), "{text}");
        assert!(text.contains("NUMA (2 nodes): local: the share of first touches"), "{text}");
        assert!(text.contains("note: NUMA figures are first-touch locality") && text.contains("no PMU"), "{text}");
    }
}
