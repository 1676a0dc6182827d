//! `memgap snap PID`: a snapshot of a process started with `memgap run`,
//! now. No signal is involved: the agent's writer thread looks for a
//! `<trace>.snap` file every round and removes it once the snapshot is written.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Take a snapshot of a process being recorded by `memgap run`, now.
#[derive(clap::Args)]
pub struct Args {
    pid: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trace = trace_of(args.pid)?;
    let mut request = trace.clone().into_os_string();
    request.push(".snap");
    let request = PathBuf::from(request);
    // A new file of ours: a name planted there (or a request still pending)
    // is refused, never followed.
    match memgap_trace::files::create_new(&request) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!("cannot ask for a snapshot: {} already exists (another `memgap snap` waiting, or not memgap's file); remove it if it is stale", request.display())
        }
        Err(e) => bail!("cannot ask for a snapshot: cannot create {}: {e}", request.display()),
    }
    let deadline = Instant::now() + Duration::from_secs_f64(args.timeout.max(0.1));
    while request.exists() {
        if Instant::now() > deadline || !PathBuf::from(format!("/proc/{}", args.pid)).exists() {
            let _ = std::fs::remove_file(&request);
            bail!("process {} did not take the snapshot within {} s", args.pid, args.timeout);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("memgap: snapshot of process {} added to {}", args.pid, trace.display());
    Ok(ExitCode::SUCCESS)
}

/// The trace the agent in `pid` writes: the `.mgt` file it holds open.
fn trace_of(pid: u32) -> anyhow::Result<PathBuf> {
    let fds = PathBuf::from(format!("/proc/{pid}/fd"));
    let entries = match std::fs::read_dir(&fds) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("no process {pid}"),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!("cannot inspect process {pid}: permission denied"),
        Err(e) => return Err(e).with_context(|| format!("cannot inspect process {pid}")),
    };
    for entry in entries.flatten() {
        if let Ok(target) = std::fs::read_link(entry.path()) {
            if target.extension().is_some_and(|e| e == "mgt") {
                return Ok(target);
            }
        }
    }
    bail!("process {pid} is not being recorded by memgap (start it with `memgap run`)")
}
