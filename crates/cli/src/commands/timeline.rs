//! `memgap timeline TRACE [--json]`

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::output;

/// The program's malloc_trim calls listed between the snapshot lines, at most
/// (the ones that released most): more would bury the snapshots.
const TRIM_LINES: usize = 20;

/// RSS and the ledger rows at every snapshot; the live heap after every
/// heap event and VmRSS at every sample, over the whole run.
#[derive(clap::Args)]
pub struct Args {
    /// The trace file (.mgt) written by `memgap run`.
    trace: PathBuf,
    /// One JSON object: `snapshots` (the ledger at each), `live_bytes` and
    /// `vm_rss` (`[seconds, bytes]` pairs, each bucket of time's lowest and highest).
    #[arg(long)]
    json: bool,
    /// Colours: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let width = output::width();
    let query = format!("timeline {:?} --json {} color {color} width {width:?}", args.trace.display().to_string(), args.json);
    let text = super::indexed(&args.trace, &query, || text(&args, color, width))?;
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn text(args: &Args, color: bool, width: Option<usize>) -> anyhow::Result<String> {
    let timeline = memgap_model::timeline(&args.trace).with_context(|| args.trace.display().to_string())?;
    if args.json {
        return Ok(memgap_views::json::timeline(&timeline) + "\n");
    }
    let (trims, trim_calls) =
        memgap_model::trim_marks::of_trace(&args.trace, TRIM_LINES).with_context(|| args.trace.display().to_string())?;
    let mut text = memgap_views::ledger::timeline(&timeline, &trims, trim_calls, width, color);
    if let Some(ghc) = super::ghc::of_trace(&args.trace) {
        text += &format!("\n{}", memgap_views::ghc::report(&ghc, &args.trace.display().to_string()));
    }
    Ok(text)
}
