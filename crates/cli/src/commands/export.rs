//! `memgap export TRACE --pprof FILE | --folded FILE` and `memgap flamegraph`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use memgap_model::{At, Blame, BlameOrder};
use memgap_views::export::{SampleType, WeightedStack};

use super::blame::options;

/// Call stacks with their live, fragmentation and allocated bytes at a
/// snapshot, as a pprof profile (`go tool pprof`) or folded stacks.
#[derive(clap::Args)]
pub struct ExportArgs {
    trace: PathBuf,
    #[command(flatten)]
    at: super::AtArg,
    /// Write a gzipped profile.proto here.
    #[arg(long, value_name = "FILE")]
    pprof: Option<PathBuf>,
    /// Write collapsed stacks ("a;b;c bytes") here.
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// The value of the folded stacks.
    #[arg(long, default_value = "fragmentation")]
    by: BlameOrder,
}

/// A flame graph (SVG) of call stacks weighted by fragmentation, live or leaked bytes.
#[derive(clap::Args)]
pub struct FlamegraphArgs {
    trace: PathBuf,
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    #[command(flatten)]
    at: super::AtArg,
    #[arg(long, default_value = "fragmentation")]
    by: BlameOrder,
}

const SAMPLE_TYPES: [(&str, &str); 4] = [("fragmentation_space", "bytes"), ("live_space", "bytes"), ("leaked_space", "bytes"), ("alloc_space", "bytes")];

fn value_index(by: BlameOrder) -> usize {
    match by {
        BlameOrder::Fragmentation => 0,
        BlameOrder::Live => 1,
        BlameOrder::Leaked => 2,
    }
}

/// The stacks at the moment `at` names, and that moment (said on stderr
/// once the output is written: export and flamegraph print nothing else).
fn weighted_stacks(trace: &Path, at: At) -> anyhow::Result<(Vec<WeightedStack>, Option<memgap_model::Moment>)> {
    let name = trace.display().to_string();
    let Some(blame): Option<Blame> = memgap_model::blame(trace, &options(at, BlameOrder::Live, usize::MAX, true, Vec::new())).with_context(|| name.clone())? else {
        bail!("{name}: the trace has no snapshot");
    };
    let stacks = blame
        .by_stack
        .into_iter()
        .map(|e| WeightedStack {
            frames: e.stack,
            values: vec![e.fragmentation_bytes as i64, e.live_bytes as i64, e.leaked_bytes as i64, e.allocated_bytes as i64],
        })
        .collect();
    Ok((stacks, blame.moment))
}

fn say_moment(trace: &Path, moment: Option<memgap_model::Moment>) {
    if let Some(moment) = moment {
        eprintln!("memgap: {}: {}", trace.display(), moment.line());
    }
}

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    crate::output::write_private(path, bytes)
}

pub fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    if args.pprof.is_none() && args.folded.is_none() {
        bail!("say what to write: --pprof FILE and/or --folded FILE");
    }
    let (stacks, moment) = weighted_stacks(&args.trace, args.at.at)?;
    if let Some(path) = &args.pprof {
        let types: Vec<SampleType> = SAMPLE_TYPES.iter().map(|&(name, unit)| SampleType { name: name.into(), unit: unit.into() }).collect();
        write(path, &memgap_views::export::pprof(&stacks, &types))?;
    }
    if let Some(path) = &args.folded {
        write(path, memgap_views::export::folded(&stacks, value_index(args.by)).as_bytes())?;
    }
    say_moment(&args.trace, moment);
    Ok(ExitCode::SUCCESS)
}

pub fn flamegraph(args: FlamegraphArgs) -> anyhow::Result<ExitCode> {
    let (stacks, moment) = weighted_stacks(&args.trace, args.at.at)?;
    let title = format!("memgap: {} bytes by call stack — {}", SAMPLE_TYPES[value_index(args.by)].0.trim_end_matches("_space"), args.trace.display());
    let svg = memgap_views::export::flamegraph_svg(&stacks, value_index(args.by), "bytes", &title)?;
    write(&args.output, svg.as_bytes())?;
    say_moment(&args.trace, moment);
    Ok(ExitCode::SUCCESS)
}
