//! `memgap run` for a Go program: memgap records it from outside
//! ([`memgap_record::go`]); here, its arguments in and its lines out.

use std::path::Path;
use std::process::ExitCode;

use memgap_record::go::{self, GoOutcome, GoRecording};
use memgap_source_go::buildinfo::GoBinary;

use super::Args;

pub(super) use memgap_record::go::resolve;

pub(super) fn run(args: &Args, go: GoBinary, pattern: &Path, run_id: u64) -> anyhow::Result<ExitCode> {
    let recording = GoRecording {
        command: &args.command,
        rss_interval_ms: args.rss_interval,
        snapshot_interval_s: args.snapshot_interval,
        quiet: args.quiet,
    };
    let (trace_path, exit_code) = match go::record(&recording, &go, pattern, run_id)? {
        GoOutcome::Refused(line) => return Ok(super::refuse(&line)),
        GoOutcome::SpawnFailed(error) => return Ok(super::spawn_failed(&args.command[0], &error)),
        GoOutcome::Recorded { trace, exit_code } => (trace, exit_code),
    };
    if !args.quiet {
        report(&trace_path, &go);
    }
    if args.report {
        let html = crate::commands::report::default_output(&trace_path);
        match crate::commands::report::write(&trace_path, &html, memgap_model::At::default(), false) {
            Ok(()) if !args.quiet => eprintln!("memgap: report: {}", html.display()),
            Ok(()) => {}
            Err(error) => eprintln!("memgap: no report: {error:#}"),
        }
    }
    Ok(ExitCode::from(exit_code.clamp(0, 255) as u8))
}

fn report(trace: &Path, go: &GoBinary) {
    match memgap_model::closing(trace) {
        Ok(memgap_model::Closing { summary: s, moment, end }) => {
            eprintln!(
                "memgap: {} — Go program ({}), peak RSS {}{}",
                trace.display(),
                go.version,
                memgap_views::format::bytes(s.peak_rss_bytes),
                if s.truncated { " (cut short)" } else { "" }
            );
            if let Some(ledger) = moment {
                eprint!("{}", memgap_views::ledger::brief(&ledger));
            }
            if let Some(end) = end {
                eprint!("{}", memgap_views::ledger::end_state(&end));
            }
        }
        Err(error) => eprintln!("memgap: {}: {error}", trace.display()),
    }
    eprintln!("memgap: details: memgap ledger|timeline|report {}", trace.display());
}
