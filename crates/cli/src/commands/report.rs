//! `memgap report TRACE [-o report.html]`: the self-contained HTML report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

/// One HTML file that works offline: verdict, timeline, page map, ledger,
/// blame and a flame graph.
#[derive(clap::Args)]
pub struct Args {
    /// The trace file (.mgt) written by `memgap run`.
    trace: PathBuf,
    /// Where to write it [default: the trace's name with .html; with
    /// --tree, with .tree.html].
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Every traced process of TRACE's run (the traces beside it with the
    /// same run id) in one page: a section per process (command, pid,
    /// parent, peak RSS, gap, ledger, verdict), and the whole report of the
    /// one with the largest gap between RSS and its live heap.
    #[arg(long)]
    tree: bool,
    #[command(flatten)]
    at: super::AtArg,
    /// Function names as demangled, whole (by default C++ names are
    /// shortened: `std::vector<…>::_M_realloc_insert<…>(…)`).
    #[arg(long)]
    full_names: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.tree {
        let output = args.output.unwrap_or_else(|| args.trace.with_extension("tree.html"));
        write_tree(&args.trace, &output, args.at.at, args.full_names)?;
        println!("{}", output.display());
        return Ok(ExitCode::SUCCESS);
    }
    let output = args.output.unwrap_or_else(|| default_output(&args.trace));
    write(&args.trace, &output, args.at.at, args.full_names)?;
    println!("{}", output.display());
    Ok(ExitCode::SUCCESS)
}

/// `t.mgt` → `t.html`.
pub fn default_output(trace: &Path) -> PathBuf {
    trace.with_extension("html")
}

/// Writes the report of `trace` to `output` (beside it first, then renamed:
/// no half-written file is left).
pub fn write(trace: &Path, output: &Path, at: memgap_model::At, full_names: bool) -> anyhow::Result<()> {
    let name = trace.display().to_string();
    let trace_name = trace.file_name().map_or(name.clone(), |n| n.to_string_lossy().into_owned());
    let query = format!("report {name:?} {trace_name:?} --at {at} --full-names {full_names}");
    // The report's replay also learns the trace's facts: kept in its index,
    // they answer later questions about any snapshot without a replay.
    let keep_facts = memgap_replay::index::enabled();
    let html = memgap_replay::index::Opened::read(trace).answer_keeping(&query, || {
        let Some((report, facts)) =
            memgap_model::report::report_and_facts(trace, at, full_names, keep_facts).with_context(|| name.clone())?
        else {
            bail!("{name}: the trace has no snapshot");
        };
        let html = memgap_views::html::report(&report, &trace_name).into_bytes();
        Ok::<_, anyhow::Error>((html, facts.map(|facts| super::learned(trace, &report, facts)).unwrap_or_default()))
    })?;
    crate::output::write_private(output, &html)
}

/// Writes the report of every traced process of `trace`'s run: the whole
/// report of the one with the largest gap (`at` chooses its moment), and a
/// section per process, the largest gap first.
pub fn write_tree(trace: &Path, output: &Path, at: memgap_model::At, full_names: bool) -> anyhow::Result<()> {
    let name = trace.display().to_string();
    let run_id = super::run::run_id_of(trace).with_context(|| format!("{name}: not a memgap trace"))?;
    let dir = trace.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut traces = super::run::of_run(dir, run_id);
    if !traces.iter().any(|t| t.file_name() == trace.file_name()) {
        traces.push(trace.to_path_buf());
    }
    let mut processes: Vec<(PathBuf, memgap_model::Closing)> = Vec::new();
    for path in traces {
        match memgap_model::closing(&path) {
            Ok(closing) => processes.push((path, closing)),
            // One unreadable trace of the tree does not hide the others.
            Err(error) => eprintln!("memgap: {}: {error}", path.display()),
        }
    }
    let gap = |c: &memgap_model::Closing| c.moment.as_ref().map_or(0, memgap_model::gap_bytes);
    // The largest gap first.
    processes.sort_by_key(|(_, c)| (std::cmp::Reverse(gap(c)), c.summary.pid));
    let Some((chosen, _)) = processes.first() else { bail!("{name}: no trace of its run could be read") };
    let chosen = chosen.clone();
    let chosen_name = chosen.display().to_string();
    let Some(report) = memgap_model::report::report_with_names(&chosen, at, full_names).with_context(|| chosen_name.clone())? else {
        bail!("{chosen_name}: the trace has no snapshot");
    };
    let file_name = |path: &Path| path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let sections: Vec<memgap_views::tree::TreeProcess> =
        processes.iter().map(|(path, closing)| memgap_views::tree::TreeProcess::new(&file_name(path), closing, *path == chosen)).collect();
    let html = memgap_views::tree::report(&report, &file_name(&chosen), &sections);
    crate::output::write_private(output, html.as_bytes())
}
