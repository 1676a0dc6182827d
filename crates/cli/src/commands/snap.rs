//! `memgap snap PID`: a snapshot of a process started with `memgap run`,
//! now. No signal is involved: the process's agent maps an area shared with
//! the recorder (its file is listed in /proc/PID/maps); this asks the
//! recorder through it and waits for the answer. Each process, a fork
//! child too, has its own area, so the snapshot is of exactly PID.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use memgap_trace::shared::{self, Area};

/// Take a snapshot of a process being recorded by `memgap run`, now.
#[derive(clap::Args)]
pub struct Args {
    /// The process: one `memgap run` records (a child it follows too).
    pid: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let deadline = Instant::now() + Duration::from_secs_f64(args.timeout.max(0.1));
    // A process just started may not have made its area yet.
    let path = loop {
        match area_of(args.pid) {
            Ok(path) => break path,
            Err(Missing::NotRecorded) if Instant::now() < deadline && started_recently(args.pid) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(Missing::NotRecorded) => bail!("process {} is not being recorded by memgap (start it with `memgap run`)", args.pid),
            Err(Missing::Other(error)) => return Err(error),
        }
    };
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot ask for a snapshot through {}", path.display()))?;
    // SAFETY: a new shared mapping of the area file, placed by the kernel.
    let base = unsafe {
        libc::mmap(std::ptr::null_mut(), shared::HEADER_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if base == libc::MAP_FAILED {
        bail!("cannot map {}: {}", path.display(), std::io::Error::last_os_error());
    }
    // SAFETY: `base` maps HEADER_BYTES of the file, all `header()` reads; the
    // chunks are never touched here.
    let area = unsafe { Area::from_base(base as *mut u8) };
    let header = area.header();
    if header.magic.load(Acquire) != shared::AREA_MAGIC || header.pid.load(Relaxed) != args.pid {
        bail!("process {} is not being recorded by memgap (start it with `memgap run`)", args.pid);
    }
    let mine = header.snap_requests.fetch_add(1, AcqRel).wrapping_add(1);
    header.wake.0.fetch_add(1, Release);
    // A futex shared with the recorder's process.
    // SAFETY: `wake` is a live atomic in the mapping.
    unsafe { libc::syscall(libc::SYS_futex, header.wake.0.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
    while (header.snap_answered.load(Acquire).wrapping_sub(mine) as i32) < 0 {
        if Instant::now() > deadline || !PathBuf::from(format!("/proc/{}", args.pid)).exists() {
            bail!("process {} did not take the snapshot within {} s", args.pid, args.timeout);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Read once answered: a recorder that just found the area names its trace then.
    let trace = String::from_utf8_lossy(area.trace_path()).into_owned();
    // SAFETY: our own mapping; `area` and `header` are not used after this.
    unsafe { libc::munmap(base, shared::HEADER_BYTES) };
    eprintln!("memgap: snapshot of process {} added to {trace}", args.pid);
    Ok(ExitCode::SUCCESS)
}

enum Missing {
    NotRecorded,
    Other(anyhow::Error),
}

/// Whether `pid` started less than two seconds ago (its agent may still be
/// making its area).
fn started_recently(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let Some(after_name) = stat.rsplit_once(')').map(|(_, rest)| rest) else { return false };
    // Field 22 (starttime), the 20th after the command name.
    let Some(start_ticks) = after_name.split_whitespace().nth(19).and_then(|t| t.parse::<f64>().ok()) else { return false };
    let Some(uptime) = std::fs::read_to_string("/proc/uptime").ok().and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok()) else {
        return false;
    };
    // SAFETY: no precondition.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    uptime - start_ticks / ticks < 2.0
}

/// The area file the agent in `pid` maps, from /proc/PID/maps.
fn area_of(pid: u32) -> Result<PathBuf, Missing> {
    let maps = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(maps) => maps,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Missing::Other(anyhow::anyhow!("no process {pid}"))),
        // memgap run's processes are the caller's own: one it may not read is not among them.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(Missing::Other(anyhow::anyhow!(
                "process {pid} is not being recorded by memgap (its memory map is not readable: permission denied)"
            )));
        }
        Err(e) => return Err(Missing::Other(anyhow::Error::new(e).context(format!("cannot inspect process {pid}")))),
    };
    let suffix = shared::AREA_SUFFIX;
    for line in maps.lines() {
        // The path is the sixth field and may hold spaces.
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else { continue };
        if path.ends_with(suffix) && path.contains("/memgap-") {
            return Ok(PathBuf::from(path));
        }
    }
    Err(Missing::NotRecorded)
}
