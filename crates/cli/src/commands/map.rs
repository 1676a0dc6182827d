//! `memgap map TRACE [--at …]`

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::output;

/// A page map of each heap mapping at one snapshot: which pages hold live
/// blocks (and how full they are), which are free but kept, which are released.
/// Given a PID, the page map of that running glibc process, its heap walked
/// from outside (as `memgap snapshot PID`).
#[derive(clap::Args)]
pub struct Args {
    /// The trace file (.mgt) written by `memgap run` or `memgap watch`, or the PID of a running process.
    #[arg(value_name = "TRACE|PID")]
    trace: PathBuf,
    #[command(flatten)]
    at: super::AtArg,
    /// Colours: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.trace.display().to_string();
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    if let Some(pid) = name.parse::<u32>().ok().filter(|_| !args.trace.exists()) {
        let process = super::snapshot::walked_ledger_of(pid, true)?;
        let Some(ledger) = process.ledger else {
            let why = process.walk_failure.unwrap_or_else(|| format!("its malloc is {}, not glibc's", process.allocator));
            bail!("process {pid} ({}): no page map without a walk of its heap: {why}", process.command);
        };
        if process.walk.is_none() {
            bail!(
                "process {pid} ({}): the {} runtime's accounting says how much of its heap is in each row, not where: no page map (its rows: memgap snapshot {pid})",
                process.command,
                process.allocator
            );
        }
        let heading = format!("memgap map — pid {pid} ({}) — its heap walked from outside\n", process.command);
        output::print(&(heading + &memgap_views::ledger::page_map(&ledger.page_maps, color)))?;
        return Ok(ExitCode::SUCCESS);
    }
    let query = format!("map {name:?} --at {} color {color}", args.at.at);
    let from_facts = |facts: &memgap_model::facts::Facts| match facts.ledger_at(args.at.at) {
        Err(error) => Some(Err(anyhow::Error::new(error).context(name.clone()))),
        Ok(kept) => kept.filter(|kept| kept.has_pages).map(|kept| Ok(render(&kept.ledger, &name, color))),
    };
    let text = super::indexed_or_from_facts(&args.trace, &query, args.at.at, true, from_facts, || text(&args, &name, color))?;
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn text(args: &Args, name: &str, color: bool) -> anyhow::Result<String> {
    let name = name.to_string();
    let Some(ledger) = memgap_model::ledger_at(&args.trace, args.at.at, true).with_context(|| name.clone())? else {
        bail!("{name}: the trace has no snapshot");
    };
    Ok(render(&ledger, &name, color))
}

fn render(ledger: &memgap_model::Ledger, name: &str, color: bool) -> String {
    let heading = format!(
        "memgap map — {name} — {}\n",
        memgap_views::format::moment(ledger.moment.as_ref(), ledger.at_seconds, ledger.snapshot_reason)
    );
    let mut text = heading + &memgap_views::ledger::page_map(&ledger.page_maps, color);
    if ledger.page_maps.is_empty() {
        text += &memgap_views::ledger::no_page_map(ledger);
    }
    text
}
