//! `memgap summary TRACE [--json]`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use memgap_model::Summary;

use crate::output;

/// Duration, calls by kind, allocated bytes, peak and final live heap,
/// peak RSS, threads and the most common sizes of one trace.
#[derive(clap::Args)]
pub struct Args {
    /// A trace written by `memgap run`.
    trace: PathBuf,
    /// Print JSON (stable keys) instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let query = format!("summary {:?} --json {}", args.trace.display().to_string(), args.json);
    let text = super::indexed(&args.trace, &query, || {
        let summary = Summary::of_trace(&args.trace).with_context(|| args.trace.display().to_string())?;
        Ok(if args.json { memgap_views::json::to_string(&summary) + "\n" } else { memgap_views::terminal::summary(&summary) })
    })?;
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}
