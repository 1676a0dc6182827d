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
    let text = super::indexed(&args.trace, &query(&args.trace, args.json), || {
        let summary = Summary::of_trace(&args.trace).with_context(|| args.trace.display().to_string())?;
        Ok(render(&summary, args.json))
    })?;
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The index's name for the question.
fn query(trace: &std::path::Path, json: bool) -> String {
    format!("summary {:?} --json {json}", trace.display().to_string())
}

fn render(summary: &Summary, json: bool) -> String {
    if json { memgap_views::json::to_string(summary) + "\n" } else { memgap_views::terminal::summary(summary) }
}

/// Both answers about `trace` (JSON and text), from the summary a report's
/// replay counted: kept in the index beside the facts.
pub fn answers(trace: &std::path::Path, summary: &Summary) -> Vec<(String, Vec<u8>)> {
    [true, false].into_iter().map(|json| (query(trace, json), render(summary, json).into_bytes())).collect()
}
