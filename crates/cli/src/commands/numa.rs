//! `memgap numa TRACE [--at …] [--json]`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use memgap_model::numa::NumaOptions;

use crate::output;

/// NUMA: the nodes, where the live heap sits by the node of the thread that
/// allocated it (with a row for threads that ran on several nodes), call
/// sites whose bytes landed remotely, and access locality — or, where the
/// CPU cannot sample memory accesses, first-touch locality from page faults
/// (record with `memgap run --numa`).
#[derive(clap::Args)]
pub struct Args {
    /// The trace (or, with --pid, nothing).
    #[arg(required_unless_present = "pid")]
    trace: Option<PathBuf>,
    /// A running process instead of a trace: its resident pages per node and
    /// mapping from /proc/PID/numa_maps (no agent, no recording).
    #[arg(long, conflicts_with = "trace")]
    pid: Option<u32>,
    #[command(flatten)]
    at: super::AtArg,
    /// Allocation sites listed with remote bytes.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print JSON (stable keys, listed in the README) instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let topology = memgap_source_numa::topology::this_machine();
    if let Some(pid) = args.pid {
        return process(pid, topology, args.json);
    }
    let trace = args.trace.expect("clap requires a trace without --pid");
    let name = trace.display().to_string();
    let options = NumaOptions { at: args.at.at, machine_topology: Some(topology), top: args.top };
    let report = memgap_model::numa::numa(&trace, &options).with_context(|| name.clone())?;
    if args.json {
        output::print(&(memgap_views::json::to_string(&report) + "\n"))?;
    } else {
        output::print(&memgap_views::numa::numa(&report, &name))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `memgap numa --pid PID`: the topology and numa_maps, mapping by mapping.
fn process(pid: u32, topology: memgap_model::numa::Topology, json: bool) -> anyhow::Result<ExitCode> {
    let maps = memgap_source_numa::numa_maps::read(pid).with_context(|| format!("process {pid}: cannot read /proc/{pid}/numa_maps"))?;
    let placement = memgap_model::numa::ProcessPlacement::new(
        pid,
        topology,
        maps.into_iter().map(|m| (m.start, m.policy, m.kind, m.bytes_by_node)).collect(),
    );
    if json {
        output::print(&(memgap_views::json::to_string(&placement) + "\n"))?;
    } else {
        output::print(&memgap_views::numa::process(&placement))?;
    }
    Ok(ExitCode::SUCCESS)
}
