//! `memgap compare [--repeat N] [--metric M] [--json] [--config NAME=ENV...]...
//! [--wrap NAME=PREFIX...]... [--numa] [--remedies TRACE] -- CMD...`: runs
//! CMD under glibc's default, its remedies and the other allocators (or under
//! the remedies a trace's ledger names), and with `--numa` (by default on a
//! machine with several nodes) under the NUMA remedies with the locality of
//! each run's memory events, and compares memory and time.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use memgap_model::compare::{self, ConfigSpec, Metric, Options, Run, Stdout};
use memgap_views::format::{bytes, seconds};

use crate::{agent, configs, output};

/// Runs shorter than this get three rounds unless --repeat says otherwise.
const SHORT_RUN_SECONDS: f64 = 10.0;
const SHORT_RUN_REPEATS: usize = 3;

/// Run CMD under glibc's default, MALLOC_ARENA_MAX=2, memgap's trim remedy,
/// jemalloc, tcmalloc and mimalloc, and compare peak, steady and final RSS, wall and CPU time
///
/// No tracing: the command is measured from outside. Its stdin is
/// /dev/null; its stdout and stderr are captured, and stdout is compared
/// with the default's where the default's own runs agree with each other.
#[derive(clap::Args)]
pub struct Args {
    /// Runs per configuration; figures are medians, with their spread. Rounds
    /// are interleaved, each starting one configuration further; the default
    /// also runs first and last. [default: 3 when the default's first run
    /// takes under 10 s, else 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    repeat: Option<u64>,
    /// What the recommendation optimises: peak RSS, steady RSS, or final RSS.
    #[arg(long, value_enum, default_value_t = MetricArg::Steady)]
    metric: MetricArg,
    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,
    /// An extra configuration: NAME=VAR=VALUE, several assignments separated
    /// by spaces (quote them), e.g. `--config 'je-bg=LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=background_thread:true'`.
    /// Repeatable; repeating a NAME adds to it.
    #[arg(long = "config", value_name = "NAME=ENV")]
    configs: Vec<String>,
    /// An extra configuration that runs the command under another program:
    /// NAME=PROGRAM ARGS..., words separated by spaces (quote them), put
    /// before CMD, e.g. `--wrap 'node1=numactl --membind=1'`. Repeatable; a
    /// NAME also given to --config gets both.
    #[arg(long = "wrap", value_name = "NAME=PREFIX")]
    wraps: Vec<String>,
    /// Add the NUMA configurations (interleave: numactl --interleave=all;
    /// localalloc: numactl --localalloc; ghc-numa: GHCRTS=--numa) and sample
    /// each run's memory accesses, or first touches where the CPU cannot,
    /// for its NUMA local fraction and rate. [default: when this machine has
    /// more than one NUMA node, except with --remedies]
    #[arg(long, conflicts_with = "no_numa")]
    numa: bool,
    /// Neither NUMA configurations nor NUMA sampling, even on a machine with several nodes.
    #[arg(long)]
    no_numa: bool,
    /// Run only these configurations (comma-separated names) besides the default.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    only: Vec<String>,
    /// The configurations are the remedies the ledger of TRACE (at its RSS
    /// peak) names for the program, instead of the built-in ones.
    #[arg(long, value_name = "TRACE", conflicts_with = "only")]
    remedies: Option<PathBuf>,
    /// Steady RSS is the mean from this many seconds after start [default: over the last half of the run].
    #[arg(long, value_name = "SECONDS")]
    steady_from: Option<f64>,
    /// Final RSS is the mean over the second before this many seconds after start [default: before exit].
    #[arg(long, value_name = "SECONDS")]
    final_at: Option<f64>,
    /// List the lines of stdout that differ from the default's.
    #[arg(long)]
    show_diff: bool,
    /// Do not compare stdout at all.
    #[arg(long, conflicts_with = "output_regex")]
    ignore_output: bool,
    /// Leave text matching REGEX out of the stdout comparison (repeatable),
    /// e.g. `--output-regex 'took [0-9.]+ ms'`.
    #[arg(long, value_name = "REGEX")]
    output_regex: Vec<String>,
    /// How often the RSS of the command's process tree is sampled, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    interval_ms: u64,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum MetricArg {
    Peak,
    Steady,
    Final,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    for (flag, value) in [("--steady-from", args.steady_from), ("--final-at", args.final_at)] {
        if let Some(value) = value.filter(|v| !v.is_finite() || *v < 0.0) {
            bail!("{flag} {value}: give a number of seconds, 0 or more");
        }
    }
    let noise: Vec<regex::Regex> = args
        .output_regex
        .iter()
        .map(|pattern| regex::Regex::new(pattern).with_context(|| format!("--output-regex {pattern:?}")))
        .collect::<anyhow::Result<_>>()?;
    let user_preload = std::env::var("LD_PRELOAD").ok();
    let trim = agent::locate_trim();
    let trim = trim.as_deref().map_err(|e| format!("{e:#}"));
    let mut specs = match &args.remedies {
        Some(trace) => {
            let remedies = remedies_of_trace(trace)?;
            if remedies.is_empty() {
                bail!("{}: its ledger names no remedy to compare", trace.display());
            }
            configs::from_remedies(&remedies, trim, user_preload.as_deref())
        }
        None => configs::builtins(trim, user_preload.as_deref()),
    };
    let topology = memgap_source_numa::topology::this_machine();
    let several_nodes = topology.nodes.len() > 1;
    let only_names_numa = args.only.iter().any(|name| configs::NUMA_CONFIGS.contains(&name.as_str()));
    let numa = args.numa || (!args.no_numa && ((several_nodes && args.remedies.is_none()) || only_names_numa));
    let mut notes = Vec::new();
    if numa {
        specs.extend(configs::numa(&args.command, std::env::var("GHCRTS").ok().as_deref()));
    } else if !several_nodes && !args.no_numa && args.remedies.is_none() {
        notes.push(format!(
            "this machine has one NUMA node: the NUMA configurations ({}) and the NUMA figures are left out; --numa runs them anyway (their figures are then trivially local)",
            configs::NUMA_CONFIGS.join(", ")
        ));
    }
    specs.extend(configs::parse_user(&args.configs, &args.wraps, user_preload.as_deref())?);
    if !args.only.is_empty() {
        if let Some(unknown) = args.only.iter().find(|name| !specs.iter().any(|spec| &spec.name == *name)) {
            let names: Vec<&str> = specs.iter().map(|spec| spec.name.as_str()).collect();
            bail!("--only {unknown}: no such configuration (there are {})", names.join(", "));
        }
        let mut index = 0;
        specs.retain(|spec| {
            index += 1;
            index == 1 || args.only.contains(&spec.name)
        });
    }
    for spec in specs.iter_mut() {
        configs::check_wrapper(spec);
    }

    let setup = memgap_measure::Setup { interval: Duration::from_millis(args.interval_ms), numa: numa.then(|| topology.clone()) };
    let mut runs = match run_interleaved(&specs, &args.command, args.repeat.map(|r| r as usize), &setup) {
        Ok(runs) => runs,
        Err(error) => match error.shell_exit_code() {
            Some(code) => {
                eprintln!("memgap: {error}");
                return Ok(ExitCode::from(code));
            }
            None => return Err(error.into()),
        },
    };
    if !noise.is_empty() {
        for run in runs.iter_mut().flatten() {
            if let Stdout::Lines(lines) = &mut run.stdout {
                for line in lines.iter_mut() {
                    for pattern in &noise {
                        *line = pattern.replace_all(line, "").into_owned();
                    }
                }
            }
        }
    }
    let command = args.command.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let metric = match args.metric {
        MetricArg::Peak => Metric::Peak,
        MetricArg::Steady => Metric::Steady,
        MetricArg::Final => Metric::Final,
    };
    let options = Options {
        steady_from: args.steady_from,
        final_at: args.final_at,
        metric,
        interval_ms: args.interval_ms,
        ignore_output: args.ignore_output,
        numa_nodes: numa.then_some(topology.nodes.len()),
    };
    let mut comparison = compare::compare(command, specs, runs, options);
    comparison.notes.extend(notes);
    if !noise.is_empty() {
        comparison
            .notes
            .push(format!("text matching --output-regex was left out of the stdout comparison ({})", args.output_regex.join(", ")));
    }
    if let Some(trace) = &args.remedies {
        let note = keep_measurements(trace, &comparison);
        comparison.notes.push(note);
    }
    if args.json {
        output::print(&(memgap_views::json::to_string(&comparison) + "\n"))?;
    } else {
        output::print(&memgap_views::compare::compare(&comparison, args.show_diff))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes what each remedy did beside the trace, where the trace's ledger
/// reads it back: its verdict then never recommends one that measured
/// worse. Returns the note saying where, or why not: a failure to write
/// does not undo the comparison.
fn keep_measurements(trace: &std::path::Path, comparison: &compare::Comparison) -> String {
    let measured = compare::measured::measurements(comparison);
    let path = memgap_model::ledger::measured::path_beside(trace);
    let text = serde_json::to_string_pretty(&measured).expect("plain structs always serialize");
    match memgap_trace::files::write_replacing(&path, |file| std::io::Write::write_all(file, text.as_bytes())) {
        Ok(()) => {
            format!("what each remedy measured is kept in {}: the ledger of {} ranks its remedies by it", path.display(), trace.display())
        }
        Err(error) => format!("could not keep the measurements in {}: {error}", path.display()),
    }
}

/// The remedies the trace's ledger names at its RSS peak.
fn remedies_of_trace(trace: &std::path::Path) -> anyhow::Result<Vec<configs::Remedy>> {
    let name = trace.display().to_string();
    let Some(ledger) = memgap_model::ledger_at(trace, memgap_model::At::Peak, false).with_context(|| name.clone())? else {
        bail!("{name}: the trace has no snapshot, so no ledger and no remedies");
    };
    let json: serde_json::Value =
        serde_json::from_str(&memgap_views::json::to_string(&ledger)).context("reading the ledger's JSON back")?;
    configs::remedies_of_ledger(&json).with_context(|| name.clone())
}

/// The order of the runs: `repeat` rounds over the available
/// configurations, round r starting at the r-th; the default (index 0)
/// first and, if the rounds do not end with it, once more at the end, so
/// its own runs span the whole comparison (whatever drifts with time
/// during it shows up between them). `repeat` None: decided after the
/// default's first run.
fn run_interleaved(
    specs: &[ConfigSpec],
    command: &[OsString],
    repeat: Option<usize>,
    setup: &memgap_measure::Setup,
) -> Result<Vec<Vec<Run>>, memgap_measure::MeasureError> {
    let available: Vec<usize> = (0..specs.len()).filter(|&i| specs[i].available).collect();
    let mut runs = vec![Vec::new(); specs.len()];
    let Some(&baseline) = available.first() else { return Ok(runs) };
    let progress = std::io::stderr().is_terminal();
    let measure = |index: usize, done: usize, total: usize| -> Result<Run, memgap_measure::MeasureError> {
        let spec = &specs[index];
        let wrapped: Vec<OsString>;
        let command = if spec.wrapper.is_empty() {
            command
        } else {
            wrapped = spec.wrapper.iter().map(OsString::from).chain(command.iter().cloned()).collect();
            &wrapped
        };
        let run = memgap_measure::measure(command, &spec.env, setup)?;
        if progress {
            let peak = run.samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0).max(run.max_rss_bytes);
            eprintln!(
                "memgap: [{done}/{total}] {}: {}, peak RSS {}, exit {}",
                spec.name,
                seconds(run.wall_seconds),
                bytes(peak),
                run.exit_code
            );
        }
        Ok(run)
    };
    let first = measure(baseline, 1, 1)?;
    let repeat = repeat.unwrap_or(if first.wall_seconds < SHORT_RUN_SECONDS { SHORT_RUN_REPEATS } else { 1 });
    runs[baseline].push(first);
    let mut order: Vec<usize> = (0..repeat)
        .flat_map(|round| (0..available.len()).map(move |k| (round, k)))
        .map(|(round, k)| available[(round + k) % available.len()])
        .skip(1)
        .collect();
    if order.last() != Some(&baseline) {
        order.push(baseline);
    }
    let total = order.len() + 1;
    for (k, &index) in order.iter().enumerate() {
        let run = measure(index, k + 2, total)?;
        runs[index].push(run);
    }
    Ok(runs)
}
