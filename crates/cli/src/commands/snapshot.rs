//! `memgap snapshot PID [--json] [--mappings]`: the ledger rows of a running
//! process that need no recording, read from /proc/PID.

use std::process::ExitCode;

use crate::output;

/// The memory of a running process from outside, with no agent: heap,
/// stacks, files, shared memory, NUMA nodes and its cgroup's limit. A glibc
/// heap is walked (the process stopped a moment) and a Go runtime's
/// accounting read from its memory, to fill every row; `--no-walk` gives
/// only what /proc says.
#[derive(clap::Args)]
pub struct Args {
    /// The process (as root, any process, also one in a container, by its host pid).
    pid: u32,
    /// Print JSON (stable keys, listed in the README) instead of tables.
    #[arg(long)]
    json: bool,
    /// Also list every mapping and its group.
    #[arg(long)]
    mappings: bool,
    /// Do not stop the process to walk its heap: only the rows /proc gives
    /// (what `memgap exporter` publishes, which never stops a process).
    #[arg(long)]
    no_walk: bool,
}

/// The outside ledger of `pid`: what `memgap snapshot` shows, and what
/// `memgap exporter` publishes for each process it reads.
pub fn ledger_of(pid: u32) -> Result<memgap_model::ProcessLedger, memgap_attach::AttachError> {
    let reading = memgap_attach::read_process(pid)?;
    Ok(memgap_model::outside_ledger(&reading))
}

/// The outside ledger with glibc's heap walked (the process is stopped a
/// moment): every row known; today's rows, and why, when the walk fails.
pub fn walked_ledger_of(pid: u32, pages: bool) -> Result<memgap_model::ProcessLedger, memgap_attach::AttachError> {
    let reading = memgap_attach::read_process(pid)?;
    if let Some(ledger) = go_ledger_of(&reading, pages)? {
        return Ok(ledger);
    }
    if reading.allocator != "glibc" {
        return Ok(memgap_model::outside_ledger(&reading));
    }
    match memgap_attach::walk_glibc_heap(reading.pid) {
        Ok(walk) => Ok(memgap_model::walked_process_ledger(&reading, &walk, pages)),
        Err(why) => {
            let mut ledger = memgap_model::outside_ledger(&reading);
            ledger.walk_failure = Some(why.to_string());
            Ok(ledger)
        }
    }
}

/// The outside ledger of a Go program: the runtime's own accounting read
/// from its memory (no stop), laid over its page residency by the Go
/// owner of the recorded ledger. `None`: not a Go program. A Go program
/// whose accounting cannot be read gets the rows /proc gives, and why.
fn go_ledger_of(
    reading: &memgap_model::ProcfsReading,
    pages: bool,
) -> Result<Option<memgap_model::ProcessLedger>, memgap_attach::AttachError> {
    Ok(match read_go(reading, memgap_trace::records::SnapshotReason::Requested)? {
        GoOutside::NotGo => None,
        GoOutside::Read { metrics, snapshot } => Some(memgap_model::runtime_process_ledger(reading, &snapshot, &metrics, pages)),
        GoOutside::Unreadable(why) => Some(go_unreadable_ledger(reading, &why)),
    })
}

/// What reading a process as a Go program found.
pub enum GoOutside {
    NotGo,
    /// The runtime's accounting as the METRICS records a recording holds,
    /// and the page residency read just after it.
    Read {
        metrics: Vec<memgap_trace::records::Metrics>,
        snapshot: Box<memgap_trace::records::Snapshot>,
    },
    /// A Go program whose accounting memgap cannot read, and why.
    Unreadable(String),
}

/// The Go runtime's accounting of the process of `reading`, then its page
/// residency (a snapshot taken for `reason`).
pub fn read_go(
    reading: &memgap_model::ProcfsReading,
    reason: memgap_trace::records::SnapshotReason,
) -> Result<GoOutside, memgap_attach::AttachError> {
    let read_at = memgap_attach::residency::monotonic_ns();
    Ok(match memgap_attach::go_runtime::read_go_runtime(reading.pid, &reading.mappings) {
        Ok(None) => GoOutside::NotGo,
        Ok(Some(go)) => {
            let snapshot = memgap_attach::residency::snapshot(reading.pid, reason)?;
            GoOutside::Read { metrics: go.metrics(read_at), snapshot: Box::new(snapshot) }
        }
        Err(why) => GoOutside::Unreadable(why),
    })
}

/// The rows /proc gives of a Go program whose accounting cannot be read, and why.
pub fn go_unreadable_ledger(reading: &memgap_model::ProcfsReading, why: &str) -> memgap_model::ProcessLedger {
    let mut ledger = memgap_model::outside_ledger(reading);
    ledger.allocator = memgap_model::go::NAME.into();
    ledger.walk_failure = Some(format!("the Go runtime's accounting is not known: {why}"));
    ledger
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let ledger = if args.no_walk { ledger_of(args.pid)? } else { walked_ledger_of(args.pid, false)? };
    if args.json {
        output::print(&(memgap_views::json::process_ledger(&ledger) + "\n"))?;
    } else {
        output::print(&memgap_views::outside::snapshot(&ledger))?;
        if args.mappings {
            output::print(&format!("\n{}", memgap_views::ledger::mappings(&ledger.mappings)))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
