//! `memgap timeline TRACE [--json]`

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::output;

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
    let from_facts = |facts: &memgap_model::facts::Facts| {
        let (timeline, rest) = facts.timeline()?;
        Some(Ok(render(&args, &timeline, &rest.trims, rest.trim_calls, rest.ghc.as_ref(), color, width)))
    };
    let text =
        super::indexed_or_from_facts(&args.trace, &query, memgap_model::At::default(), true, from_facts, || text(&args, color, width))?;
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn text(args: &Args, color: bool, width: Option<usize>) -> anyhow::Result<String> {
    let timeline = memgap_model::timeline(&args.trace).with_context(|| args.trace.display().to_string())?;
    if args.json {
        return Ok(memgap_views::json::timeline(&timeline) + "\n");
    }
    let (trims, trim_calls) = memgap_model::trim_marks::of_trace(&args.trace, memgap_model::trim_marks::TIMELINE_MARKS)
        .with_context(|| args.trace.display().to_string())?;
    let ghc = super::ghc::of_trace(&args.trace);
    Ok(render(args, &timeline, &trims, trim_calls, ghc.as_ref(), color, width))
}

fn render(
    args: &Args,
    timeline: &memgap_model::Timeline,
    trims: &[memgap_model::TrimMark],
    trim_calls: u64,
    ghc: Option<&memgap_model::ghc::GhcReport>,
    color: bool,
    width: Option<usize>,
) -> String {
    if args.json {
        return memgap_views::json::timeline(timeline) + "\n";
    }
    let mut text = memgap_views::ledger::timeline(timeline, trims, trim_calls, width, color);
    if let Some(ghc) = ghc {
        text += &format!("\n{}", memgap_views::ghc::report(ghc, &args.trace.display().to_string()));
    }
    text
}
