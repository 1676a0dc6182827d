//! `memgap export TRACE --pprof FILE | --folded FILE` and `memgap flamegraph`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use memgap_model::{At, Blame, BlameOrder};
use memgap_views::export::{MainBinary, SampleType, WeightedStack};

use super::blame::options;

/// Call stacks with their fragmentation, live and leaked bytes at a
/// snapshot and what they allocated over the whole run (all of it, and the
/// temporary part), as a pprof profile (`go tool pprof`) or folded stacks.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// The trace file (.mgt) written by `memgap run`.
    trace: PathBuf,
    #[command(flatten)]
    at: super::AtArg,
    /// Write a gzipped profile.proto here.
    #[arg(long, value_name = "FILE")]
    pprof: Option<PathBuf>,
    /// Write collapsed stacks ("a;b;c bytes") here.
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// The value of the folded stacks: fragmentation, live or leaked bytes at
    /// the snapshot, or over the whole run bytes allocated or temporary.
    #[arg(long, default_value = "fragmentation", value_name = "fragmentation|live|leaked|allocated|temporary")]
    by: BlameOrder,
    /// Function names as demangled, whole (by default C++ names are
    /// shortened: `std::vector<…>::_M_realloc_insert<…>(…)`).
    #[arg(long)]
    full_names: bool,
}

/// A flame graph (SVG) of call stacks weighted by fragmentation, live or leaked bytes.
#[derive(clap::Args)]
pub struct FlamegraphArgs {
    /// The trace file (.mgt) written by `memgap run`.
    trace: PathBuf,
    /// Where to write the SVG.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    #[command(flatten)]
    at: super::AtArg,
    /// The weight of each stack: fragmentation, live or leaked bytes at the
    /// snapshot, or over the whole run bytes allocated or temporary.
    #[arg(long, default_value = "fragmentation", value_name = "fragmentation|live|leaked|allocated|temporary")]
    by: BlameOrder,
    /// Function names as demangled, whole (by default C++ names are
    /// shortened: `std::vector<…>::_M_realloc_insert<…>(…)`).
    #[arg(long)]
    full_names: bool,
}

/// The profile's sample types, in the order of [`WeightedStack::values`]
/// (the README lists them; the first is pprof's default).
pub const SAMPLE_TYPES: [(&str, &str); 8] = [
    ("fragmentation_space", "bytes"),
    ("live_space", "bytes"),
    ("live_objects", "count"),
    ("leaked_space", "bytes"),
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("temporary_objects", "count"),
    ("temporary_space", "bytes"),
];

/// The bytes `--by` weighs stacks with.
fn value_index(by: BlameOrder) -> usize {
    match by {
        BlameOrder::Fragmentation => 0,
        BlameOrder::Live => 1,
        BlameOrder::Leaked => 3,
        BlameOrder::Allocated => 5,
        BlameOrder::Temporary => 7,
    }
}

/// The stacks at the moment `at` names, from the allocation site outwards,
/// the executable, and that moment (said on stderr once the output is
/// written: export and flamegraph print nothing else).
fn weighted_stacks(
    trace: &Path,
    at: At,
    full_names: bool,
) -> anyhow::Result<(Vec<WeightedStack>, Option<MainBinary>, Option<memgap_model::Moment>)> {
    let name = trace.display().to_string();
    let Some(blame): Option<Blame> = memgap_model::blame(
        trace,
        &memgap_model::BlameOptions { full_names, ..options(at, BlameOrder::Live, usize::MAX, true, Vec::new()) },
    )
    .with_context(|| name.clone())?
    else {
        bail!("{name}: the trace has no snapshot");
    };
    let main = blame.main_module.map(|m| MainBinary { path: m.path, base: m.base, size: m.size, build_id: m.build_id });
    let stacks = blame
        .by_stack
        .into_iter()
        .map(|e| WeightedStack {
            frames: memgap_model::blame::program_frames(&e.stack).iter().map(|frame| frame.as_ref().clone()).collect(),
            values: [
                e.fragmentation_bytes,
                e.live_bytes,
                e.objects,
                e.leaked_bytes,
                e.allocations,
                e.allocated_bytes,
                e.temporary_allocations,
                e.temporary_bytes,
            ]
            .map(|value| i64::try_from(value).unwrap_or(i64::MAX))
            .to_vec(),
        })
        .collect();
    Ok((stacks, main, blame.moment))
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
    let (stacks, main, moment) = weighted_stacks(&args.trace, args.at.at, args.full_names)?;
    if let Some(path) = &args.pprof {
        let types: Vec<SampleType> = SAMPLE_TYPES.iter().map(|&(name, unit)| SampleType { name: name.into(), unit: unit.into() }).collect();
        write(path, &memgap_views::export::pprof(&stacks, &types, main.as_ref()))?;
    }
    if let Some(path) = &args.folded {
        write(path, memgap_views::export::folded(&stacks, value_index(args.by)).as_bytes())?;
    }
    say_moment(&args.trace, moment);
    Ok(ExitCode::SUCCESS)
}

pub fn flamegraph(args: FlamegraphArgs) -> anyhow::Result<ExitCode> {
    let (stacks, _, moment) = weighted_stacks(&args.trace, args.at.at, args.full_names)?;
    let title = format!(
        "memgap: {} bytes by call stack — {}",
        SAMPLE_TYPES[value_index(args.by)].0.trim_end_matches("_space"),
        args.trace.display()
    );
    let svg = memgap_views::export::flamegraph_svg(&stacks, value_index(args.by), "bytes", &title)?;
    write(&args.output, svg.as_bytes())?;
    say_moment(&args.trace, moment);
    Ok(ExitCode::SUCCESS)
}
