//! `memgap blame TRACE [--at …] [--by …] [--top N] [--json]`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use memgap_model::{At, BlameOptions, BlameOrder};

use crate::output;

/// The call sites whose surviving blocks keep mostly-empty pages resident:
/// per site, live bytes and objects, fragmentation cost (free bytes on the
/// pages its blocks occupy, shared by bytes taken), leaked bytes, scatter;
/// or, over the whole run, the sites that allocate most (--by allocated) or
/// free soonest (--by temporary).
#[derive(clap::Args)]
pub struct Args {
    /// The trace file (.mgt) written by `memgap run`.
    trace: PathBuf,
    #[command(flatten)]
    at: super::AtArg,
    /// Order by fragmentation, live or leaked bytes at the snapshot; or over
    /// the whole run by bytes allocated (freed or not), or by allocations
    /// freed within --temporary-ms (temporary).
    #[arg(long, default_value = "fragmentation", value_name = "fragmentation|live|leaked|allocated|temporary")]
    by: BlameOrder,
    /// An allocation freed within this many milliseconds is temporary.
    #[arg(long, value_name = "MS", default_value_t = memgap_model::blame::DEFAULT_TEMPORARY_MS)]
    temporary_ms: u64,
    /// How many sites (or stacks) to list.
    #[arg(long, value_name = "N", default_value_t = 20)]
    top: usize,
    /// One entry per full call stack instead of per allocation site.
    #[arg(long)]
    per_stack: bool,
    /// Skip frames whose function starts with this when finding the site
    /// (besides malloc, operator new and friends); repeatable.
    #[arg(long, value_name = "PREFIX")]
    skip: Vec<String>,
    /// Print the entries as a JSON list instead of a table.
    #[arg(long)]
    json: bool,
    /// Function names as demangled, whole (by default C++ names are
    /// shortened: `std::vector<…>::_M_realloc_insert<…>(…)`).
    #[arg(long)]
    full_names: bool,
}

pub fn options(at: At, by: BlameOrder, top: usize, per_stack: bool, skip: Vec<String>) -> BlameOptions {
    BlameOptions { at, order: by, top, per_stack, skip, temporary_ms: memgap_model::blame::DEFAULT_TEMPORARY_MS, full_names: false }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.trace.display().to_string();
    let width = output::width();
    let query = format!(
        "blame {name:?} --at {} --by {:?} --temporary-ms {} --top {} --per-stack {} --skip {:?} --json {} --full-names {} width {width:?}",
        args.at.at, args.by, args.temporary_ms, args.top, args.per_stack, args.skip, args.json, args.full_names
    );
    let trace = args.trace.clone();
    let from_facts = |facts: &memgap_model::facts::Facts| {
        let stacks = facts.stacks().filter(|stacks| stacks.temporary_ms() == args.temporary_ms)?;
        match facts.ledger_at(args.at.at) {
            Err(error) => Some(Err(anyhow::Error::new(error).context(name.clone()))),
            Ok(kept) => kept.filter(|kept| kept.has_stacks).map(|kept| {
                let options = blame_options(&args);
                let mut blame = memgap_model::blame::assemble(&stacks, kept.ledger.at_seconds, &kept.ledger, &options);
                blame.moment = kept.ledger.moment.clone();
                Ok(render(&blame, args.json, &name, width))
            }),
        }
    };
    let text = super::indexed_or_from_facts(
        &trace,
        &query,
        args.at.at,
        args.temporary_ms == memgap_model::blame::DEFAULT_TEMPORARY_MS,
        from_facts,
        || text(&args, &name, width),
    )?;
    output::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn blame_options(args: &Args) -> BlameOptions {
    BlameOptions {
        temporary_ms: args.temporary_ms,
        full_names: args.full_names,
        ..options(args.at.at, args.by, args.top, args.per_stack, args.skip.clone())
    }
}

fn text(args: &Args, name: &str, width: Option<usize>) -> anyhow::Result<String> {
    let name = name.to_string();
    let Some(blame) = memgap_model::blame(&args.trace, &blame_options(args)).with_context(|| name.clone())? else {
        bail!("{name}: the trace has no snapshot");
    };
    Ok(render(&blame, args.json, &name, width))
}

fn render(blame: &memgap_model::Blame, json: bool, name: &str, width: Option<usize>) -> String {
    if json {
        return memgap_views::json::to_string(&blame.entries) + "\n";
    }
    memgap_views::blame::blame(blame, name, width)
}
