//! `memgap trim PID [--json]`: makes a running process call glibc's
//! malloc_trim(0) and measures what came back.

use std::process::ExitCode;
use std::time::Duration;

use memgap_model::TrimReport;

use crate::output;

/// Make a running process call malloc_trim(0) (injected with ptrace) and
/// measure its RSS and heap before and after. The process runs on as it was;
/// only one of its threads is held, for the length of the call.
#[derive(clap::Args)]
pub struct Args {
    /// The process (glibc's malloc, x86-64; your own, or any as root).
    pid: u32,
    /// Print the measurement as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Make the call on this thread (default: the first one found outside the allocator).
    #[arg(long)]
    thread: Option<u32>,
    /// Seconds the call may take before memgap looks at why (it gives up
    /// only when the call waits for a lock and leaving is harmless).
    #[arg(long, default_value_t = 10.0)]
    patience: f64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let before = memgap_model::outside_ledger(&memgap_attach::read_process(args.pid)?);
    let options =
        memgap_attach::TrimOptions { thread: args.thread, patience: Duration::from_secs_f64(args.patience.max(0.1)), ..Default::default() };
    let call = memgap_attach::malloc_trim(before.pid, &options)?;
    let after = memgap_model::outside_ledger(&memgap_attach::read_process(before.pid)?);
    let report = TrimReport::new(&before, &after, call);
    if args.json {
        output::print(&(memgap_views::json::to_string(&report) + "\n"))?;
    } else {
        output::print(&memgap_views::outside::trim(&report))?;
    }
    Ok(ExitCode::SUCCESS)
}
