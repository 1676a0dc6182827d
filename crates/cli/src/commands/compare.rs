//! `memgap compare [--repeat N] [--json] [--config NAME=ENV...]... -- CMD...`:
//! runs CMD under glibc's default, its remedies and the other allocators,
//! and compares memory and time.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use memgap_model::compare::{self, ConfigSpec, Run, SteadyWindow};
use memgap_views::format::{bytes, seconds};

use crate::{agent, configs, output};

/// Run CMD under glibc's default, MALLOC_ARENA_MAX=2, memgap's trim remedy,
/// jemalloc, tcmalloc and mimalloc, and compare peak and steady RSS, wall and CPU time
///
/// No tracing: the command is measured from outside. Its stdin is
/// /dev/null; its stdout and stderr are captured, and stdout is compared
/// between configurations.
#[derive(clap::Args)]
pub struct Args {
    /// Runs per configuration; figures are medians. Rounds are interleaved,
    /// each starting one configuration further, so a drift in the machine's
    /// load does not favour one configuration.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    repeat: u64,
    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,
    /// An extra configuration: NAME=VAR=VALUE, several assignments separated
    /// by spaces (quote them), e.g. `--config 'je-bg=LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=background_thread:true'`.
    /// Repeatable; repeating a NAME adds to it.
    #[arg(long = "config", value_name = "NAME=ENV")]
    configs: Vec<String>,
    /// Steady RSS is the mean from this many seconds after start [default: over the last half of the run].
    #[arg(long, value_name = "SECONDS")]
    steady_from: Option<f64>,
    /// How often the RSS of the command's process tree is sampled, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    interval_ms: u64,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<OsString>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(from) = args.steady_from.filter(|from| !from.is_finite() || *from < 0.0) {
        bail!("--steady-from {from}: give a number of seconds, 0 or more");
    }
    let user_preload = std::env::var("LD_PRELOAD").ok();
    let trim = agent::locate_trim();
    let mut specs = configs::builtins(trim.as_deref().map_err(|e| format!("{e:#}")), user_preload.as_deref());
    specs.extend(configs::parse_user(&args.configs, user_preload.as_deref())?);

    let interval = Duration::from_millis(args.interval_ms);
    let runs = match run_interleaved(&specs, &args.command, args.repeat as usize, interval) {
        Ok(runs) => runs,
        Err(error) => match error.shell_exit_code() {
            Some(code) => {
                eprintln!("memgap: {error}");
                return Ok(ExitCode::from(code));
            }
            None => return Err(error.into()),
        },
    };
    let command = args.command.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let window = SteadyWindow { from_seconds: args.steady_from };
    let comparison = compare::compare(command, specs, runs, window, args.interval_ms);
    if args.json {
        output::print(&(memgap_views::json::to_string(&comparison) + "\n"))?;
    } else {
        output::print(&memgap_views::compare::compare(&comparison))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `repeat` rounds over the available configurations, round r starting at
/// the r-th; returns the runs of each configuration in `specs`' order.
fn run_interleaved(specs: &[ConfigSpec], command: &[OsString], repeat: usize, interval: Duration) -> Result<Vec<Vec<Run>>, memgap_measure::MeasureError> {
    let available: Vec<usize> = (0..specs.len()).filter(|&i| specs[i].available).collect();
    let mut runs = vec![Vec::new(); specs.len()];
    let total = repeat * available.len();
    let progress = std::io::stderr().is_terminal();
    for round in 0..repeat {
        for k in 0..available.len() {
            let index = available[(round + k) % available.len()];
            let spec = &specs[index];
            let run = memgap_measure::measure(command, &spec.env, interval)?;
            if progress {
                let done = round * available.len() + k + 1;
                let peak = run.samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0).max(run.max_rss_bytes);
                eprintln!("memgap: [{done}/{total}] {}: {}, peak RSS {}, exit {}", spec.name, seconds(run.wall_seconds), bytes(peak), run.exit_code);
            }
            runs[index].push(run);
        }
    }
    Ok(runs)
}
