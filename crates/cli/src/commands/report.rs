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
    /// Where to write it [default: the trace's name with .html].
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    at: super::AtArg,
    /// Function names as demangled, whole (by default C++ names are
    /// shortened: `std::vector<…>::_M_realloc_insert<…>(…)`).
    #[arg(long)]
    full_names: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
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
    let Some(report) = memgap_model::report::report_with_names(trace, at, full_names).with_context(|| name.clone())? else {
        bail!("{name}: the trace has no snapshot");
    };
    let trace_name = trace.file_name().map_or(name.clone(), |n| n.to_string_lossy().into_owned());
    let html = memgap_views::html::report(&report, &trace_name);
    crate::output::write_private(output, html.as_bytes())
}
