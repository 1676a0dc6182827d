//! `memgap numa TRACE [--at …] [--json]`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use memgap_model::At;
use memgap_model::numa::NumaOptions;

use crate::output;

/// NUMA: the nodes, where the live heap sits by the node of the thread that
/// allocated it (with a row for threads that ran on several nodes), call
/// sites whose bytes landed remotely, and access locality — or, where the
/// CPU cannot sample memory accesses, first-touch locality from page faults
/// (record with `memgap run --numa`).
#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    /// Which snapshot's heap: peak (highest RSS), end, or seconds since start.
    #[arg(long, default_value = "peak")]
    at: At,
    /// Allocation sites listed with remote bytes.
    #[arg(long, default_value_t = 10)]
    top: usize,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.trace.display().to_string();
    let options = NumaOptions { at: args.at, machine_topology: Some(memgap_source_numa::topology::this_machine()), top: args.top };
    let report = memgap_model::numa::numa(&args.trace, &options).with_context(|| name.clone())?;
    if args.json {
        output::print(&(memgap_views::json::to_string(&report) + "\n"))?;
    } else {
        output::print(&memgap_views::numa::numa(&report, &name))?;
    }
    Ok(ExitCode::SUCCESS)
}
