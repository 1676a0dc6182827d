//! `memgap ledger TRACE [--at peak|end|SECONDS] [--json]`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::output;

/// Every resident byte at one snapshot, in one row each (live, slack,
/// fragmented, retained, lazy_free, runtime, other), with a verdict.
#[derive(clap::Args)]
pub struct Args {
    /// The trace file (.mgt) written by `memgap run`.
    trace: PathBuf,
    #[command(flatten)]
    at: super::AtArg,
    /// Print JSON (stable keys, listed in the README) instead of tables.
    #[arg(long)]
    json: bool,
    /// Also list every mapping and the row its bytes went to.
    #[arg(long)]
    mappings: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.trace.display().to_string();
    let query = format!("ledger {name:?} --at {} --json {} --mappings {}", args.at.at, args.json, args.mappings);
    let from_facts = |facts: &memgap_model::facts::Facts| match facts.ledger_at(args.at.at) {
        Err(error) => Some(Err(anyhow::Error::new(error).context(name.clone()))),
        Ok(kept) => kept.map(|kept| Ok(render(&args, &kept.ledger, &name))),
    };
    let text = super::indexed_or_from_facts(&args.trace, &query, args.at.at, true, from_facts, || text(&args, &name))?;
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn text(args: &Args, name: &str) -> anyhow::Result<String> {
    let name = name.to_string();
    let Some(ledger) = memgap_model::ledger_at(&args.trace, args.at.at, false).with_context(|| name.clone())? else {
        bail!("{name}: the trace has no snapshot (was it recorded with --snapshot-interval 0 and killed before exit?)");
    };
    Ok(render(args, &ledger, &name))
}

fn render(args: &Args, ledger: &memgap_model::Ledger, name: &str) -> String {
    // A snapshot's ledger carries the GC figures it rests on; the ledger
    // shown carries the RTS's whole report, read once from the trace.
    let ghc = ledger.sections.contains_key(memgap_model::ghc::NAME).then(|| super::ghc::of_trace(&args.trace)).flatten();
    if args.json {
        let Some(report) = &ghc else { return memgap_views::json::ledger(ledger) + "\n" };
        let mut whole = ledger.clone();
        whole.set_section(memgap_model::ghc::NAME, report);
        return memgap_views::json::ledger(&whole) + "\n";
    }
    let mut text = memgap_views::ledger::ledger(ledger, name);
    if let Some(ghc) = &ghc {
        text += &format!("\n{}", memgap_views::ghc::report(ghc, name));
    }
    if args.mappings {
        text += &format!("\n{}", memgap_views::ledger::mappings(&ledger.mappings));
    }
    text
}
