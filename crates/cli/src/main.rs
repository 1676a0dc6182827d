//! The `memgap` command: a thin layer that parses arguments, runs one
//! command module, and turns any error into one line on stderr.

mod agent;
mod commands;
mod configs;
mod output;
mod progress;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "memgap", version = version_line(), about = "Explains why a process's RSS is far above the memory its program thinks it holds")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Run(commands::run::Args),
    Compare(commands::compare::Args),
    Summary(commands::summary::Args),
    Ledger(commands::ledger::Args),
    Map(commands::map::Args),
    Timeline(commands::timeline::Args),
    Snap(commands::snap::Args),
    Snapshot(commands::snapshot::Args),
    Exporter(commands::exporter::Args),
    Trim(commands::trim::Args),
    Watch(commands::watch::Args),
    Attach(commands::attach::Args),
    Blame(commands::blame::Args),
    Export(commands::export::ExportArgs),
    Flamegraph(commands::export::FlamegraphArgs),
    Report(commands::report::Args),
    Numa(commands::numa::Args),
    Ghc(commands::ghc::Args),
    Man(commands::man::ManArgs),
    Completions(commands::man::CompletionsArgs),
}

/// `memgap --version`: the release, the commit it was built from, and the
/// trace format it writes.
fn version_line() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        use memgap_trace::framing::{VERSION_MAJOR, VERSION_MINOR};
        format!("{} (commit {}, trace format {VERSION_MAJOR}.{VERSION_MINOR})", env!("CARGO_PKG_VERSION"), env!("MEMGAP_COMMIT"))
    })
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    progress::install();
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Compare(args) => commands::compare::run(args),
        Command::Summary(args) => commands::summary::run(args),
        Command::Ledger(args) => commands::ledger::run(args),
        Command::Map(args) => commands::map::run(args),
        Command::Timeline(args) => commands::timeline::run(args),
        Command::Snap(args) => commands::snap::run(args),
        Command::Snapshot(args) => commands::snapshot::run(args),
        Command::Exporter(args) => commands::exporter::run(args),
        Command::Trim(args) => commands::trim::run(args),
        Command::Watch(args) => commands::watch::run(args),
        Command::Attach(args) => commands::attach::run(args),
        Command::Blame(args) => commands::blame::run(args),
        Command::Export(args) => commands::export::export(args),
        Command::Flamegraph(args) => commands::export::flamegraph(args),
        Command::Report(args) => commands::report::run(args),
        Command::Numa(args) => commands::numa::run(args),
        Command::Ghc(args) => commands::ghc::run(args),
        Command::Man(args) => commands::man::man(args, Cli::command()),
        Command::Completions(args) => commands::man::completions(args, Cli::command()),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("memgap: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The analysis builds and drops buffers the size of the traced heap at
/// every snapshot. glibc would hand each back to the kernel (a fresh mmap
/// above 32 MiB, a trim below) and fault the next one in again, so that a
/// report on a large heap spends much of its time in page faults. Keeping
/// freed memory for reuse costs no more than the largest buffer.
fn keep_freed_memory() {
    // SAFETY: tunes glibc malloc before memgap allocates much; no precondition.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command and every argument, positional ones included, says what
    /// it is in `--help` (and so in the man pages and completions).
    #[test]
    fn every_command_and_argument_has_a_help_text() {
        let mut missing = Vec::new();
        let mut command = Cli::command();
        command.build();
        collect_missing_help(&command, "memgap", &mut missing);
        assert!(missing.is_empty(), "without a help text:\n{}", missing.join("\n"));
    }

    /// The README's commands table has a row for every subcommand.
    #[test]
    fn the_readme_lists_every_command() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
        let table = &readme[readme.find("\n## Commands\n").expect("a Commands section in README.md")..];
        let missing: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|command| command.get_name().to_string())
            .filter(|name| !table.contains(&format!("| `memgap {name}")))
            .collect();
        assert!(missing.is_empty(), "README.md's commands table has no row for: {}", missing.join(", "));
    }

    fn collect_missing_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        if command.get_about().is_none() && command.get_long_about().is_none() {
            missing.push(format!("{path} (the command itself)"));
        }
        for argument in command.get_arguments() {
            let id = argument.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            if argument.get_help().is_none() && argument.get_long_help().is_none() {
                let shown = match (argument.get_long(), argument.get_short()) {
                    (Some(long), _) => format!("--{long}"),
                    (None, Some(short)) => format!("-{short}"),
                    (None, None) => format!(
                        "<{}>",
                        argument.get_value_names().and_then(|names| names.first()).map_or(id.to_uppercase(), |name| name.to_string())
                    ),
                };
                missing.push(format!("{path} {shown}"));
            }
        }
        for subcommand in command.get_subcommands() {
            if subcommand.get_name() == "help" {
                continue;
            }
            collect_missing_help(subcommand, &format!("{path} {}", subcommand.get_name()), missing);
        }
    }
}
