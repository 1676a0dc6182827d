//! `memgap timeline TRACE [--json]`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::output;

/// The program's malloc_trim calls listed between the snapshot lines, at most
/// (the ones that released most): more would bury the snapshots.
const TRIM_LINES: usize = 20;

/// RSS and the ledger rows at every snapshot.
#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let ledgers = memgap_model::timeline(&args.trace).with_context(|| args.trace.display().to_string())?;
    if args.json {
        output::print(&(memgap_views::json::to_string(&ledgers) + "\n"))?;
    } else {
        let (trims, trim_calls) = memgap_model::trim_marks::of_trace(&args.trace, TRIM_LINES).with_context(|| args.trace.display().to_string())?;
        output::print(&memgap_views::ledger::timeline(&ledgers, &trims, trim_calls, output::width()))?;
        if let Some(ghc) = super::ghc::of_trace(&args.trace) {
            output::print(&format!("\n{}", memgap_views::ghc::report(&ghc, &args.trace.display().to_string())))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
