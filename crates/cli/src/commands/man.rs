//! `memgap man [COMMAND] [--list]` and `memgap completions SHELL`: the
//! manual pages and shell completions generated from the command line's own
//! definition, for users who install with cargo (the Debian package ships
//! them at their standard paths).

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use anyhow::bail;

/// Print a manual page (roff): memgap(1), or memgap-COMMAND(1)
#[derive(clap::Args)]
pub struct ManArgs {
    /// A subcommand (`run`, or `memgap-run`) [default: memgap(1) itself].
    #[arg(value_name = "COMMAND", conflicts_with = "list")]
    command: Option<String>,
    /// List the names of every page, one a line.
    #[arg(long)]
    list: bool,
}

/// Print the completion script of a shell
///
/// bash: `memgap completions bash > ~/.local/share/bash-completion/completions/memgap`;
/// zsh: into a directory of `$fpath` as `_memgap`;
/// fish: `~/.config/fish/completions/memgap.fish`.
#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to print the script for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

pub fn man(args: ManArgs, mut memgap: clap::Command) -> anyhow::Result<ExitCode> {
    memgap.build();
    if args.list {
        let names: Vec<String> =
            std::iter::once("memgap".to_string()).chain(subcommands(&memgap).map(|c| format!("memgap-{}", c.get_name()))).collect();
        write_stdout(format!("{}\n", names.join("\n")).as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    let page = match args.command.as_deref() {
        None | Some("memgap") => memgap,
        Some(wanted) => {
            let name = wanted.strip_prefix("memgap-").unwrap_or(wanted);
            let Some(sub) = subcommands(&memgap).find(|c| c.get_name() == name) else {
                let known: Vec<&str> = subcommands(&memgap).map(|c| c.get_name()).collect();
                bail!("no manual page for {wanted:?}: the commands are {}", known.join(", "));
            };
            // The page's name (leaked: printed once, then the process
            // exits); its usage lines keep `memgap run`.
            sub.clone().name(format!("memgap-{name}").leak() as &str)
        }
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(page).render(&mut roff)?;
    write_stdout(&roff)?;
    Ok(ExitCode::SUCCESS)
}

pub fn completions(args: CompletionsArgs, mut memgap: clap::Command) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut memgap, "memgap", &mut script);
    write_stdout(&script)?;
    Ok(ExitCode::SUCCESS)
}

fn subcommands(memgap: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    memgap.get_subcommands().filter(|c| !c.is_hide_set() && c.get_name() != "help")
}

/// As is: not fitted to the terminal's width, and quiet on a closed pipe.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|_| stdout.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
