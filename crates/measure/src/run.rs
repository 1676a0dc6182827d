//! One run of a command: start it, sample its RSS until it exits, reap it.

use std::ffi::OsString;
use std::io;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use memgap_types::compare::{RssSample, Run, RunLocality, Stdout};
use memgap_types::numa::{SampleBatch, Topology, access_locality};

use crate::MeasureError;
use crate::capture::Capture;
use crate::process_tree::ProcessTree;

/// Enough of stderr to show why a run failed.
const STDERR_TAIL_BYTES: u64 = 2048;
/// Stdout up to this size is kept line by line, to compare it with the
/// default's; larger output is compared by its hash.
const STDOUT_KEPT_BYTES: u64 = 2 << 20;

/// How a command is measured.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// How often the RSS of its process tree is sampled.
    pub interval: Duration,
    /// The machine's NUMA topology, when the locality of its memory events
    /// is wanted: memory accesses where the CPU can sample them, else first
    /// touches (page faults), of the whole process tree.
    pub numa: Option<Topology>,
}

/// Runs `command` (program and arguments) with `env` added to memgap's own
/// environment and stdin from /dev/null; samples the RSS of its process
/// tree every `setup.interval` until it exits.
pub fn measure(command: &[OsString], env: &[(String, String)], setup: &Setup) -> Result<Run, MeasureError> {
    let interval = setup.interval;
    let (program, args) = command.split_first().expect("a command to run");
    let io_error = |what| move |source| MeasureError::Io { what, source };
    let mut stdout = Capture::new().map_err(io_error("cannot create a temporary file for the command's stdout"))?;
    let mut stderr = Capture::new().map_err(io_error("cannot create a temporary file for the command's stderr"))?;
    let mut process = Command::new(program);
    process
        .args(args)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(stdout.stdio().map_err(io_error("cannot pass the stdout file"))?)
        .stderr(stderr.stdio().map_err(io_error("cannot pass the stderr file"))?);

    let numa_sampling = match &setup.numa {
        Some(_) => Some(memgap_source_numa::launch::prepare(&mut process).map_err(io_error("cannot prepare NUMA sampling"))?),
        None => None,
    };
    let started = Instant::now();
    let spawned = process.spawn();
    if let Some(sampling) = &numa_sampling {
        sampling.spawned();
    }
    let child = match spawned {
        Ok(child) => child,
        Err(source) => {
            if let Some(sampling) = numa_sampling {
                let _ = sampling.finish();
            }
            return Err(spawn_error(program, source));
        }
    };
    let pid = child.id();
    let (stop, stopped) = mpsc::channel();
    let sampler = thread::spawn(move || sample_until_stopped(pid, started, interval, stopped));
    // Wait without reaping: the pid stays ours (no reuse) while the sampler
    // may still read /proc/PID.
    let waited = wait_without_reaping(pid);
    let wall_seconds = started.elapsed().as_secs_f64();
    let _ = stop.send(());
    let samples = sampler.join().expect("the RSS sampler does not panic");
    // Drained before the reap: the last samples' pages are asked while the
    // process, a zombie by now, still holds its pid.
    let numa = numa_sampling.map(|sampling| sampling.finish());
    waited.map_err(io_error("waiting for the command"))?;
    let (status, usage) = reap(pid).map_err(io_error("reaping the command"))?;
    let numa = match (numa, &setup.numa) {
        (Some(samples), Some(topology)) => Some(samples.map(|record| {
            let batch = SampleBatch::from_record(&record);
            let nowhere = |_: u64| None;
            RunLocality {
                locality: access_locality(topology, batch.kind(), &batch, &nowhere),
                access_unavailable_reason: batch.precise_unavailable.clone(),
            }
        })),
        _ => None,
    };

    let (stdout_hash, stdout_bytes) = stdout.hash().map_err(io_error("reading the command's stdout back"))?;
    let stdout_lines = stdout.lines(STDOUT_KEPT_BYTES).map_err(io_error("reading the command's stdout back"))?;
    Ok(Run {
        samples,
        wall_seconds,
        cpu_seconds: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        // ru_maxrss is in KiB on Linux.
        max_rss_bytes: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
        exit_code: exit_code(status),
        stdout_hash,
        stdout_bytes,
        stdout: stdout_lines.map_or(Stdout::Hashed, Stdout::Lines),
        stderr_tail: stderr.tail(STDERR_TAIL_BYTES).unwrap_or_default(),
        numa,
    })
}

fn spawn_error(program: &OsString, source: io::Error) -> MeasureError {
    let program = program.to_string_lossy().into_owned();
    match source.kind() {
        io::ErrorKind::NotFound => MeasureError::NotFound { program },
        io::ErrorKind::PermissionDenied => MeasureError::PermissionDenied { program },
        _ => MeasureError::Spawn { program, source },
    }
}

/// Samples on a fixed grid from `started`; ticks missed while descheduled
/// are skipped, not caught up in a burst.
fn sample_until_stopped(pid: u32, started: Instant, interval: Duration, stop: Receiver<()>) -> Vec<RssSample> {
    let mut tree = ProcessTree::new(pid);
    let mut samples = Vec::new();
    let mut next_tick = started;
    loop {
        if let Some(rss_bytes) = tree.rss_bytes() {
            samples.push(RssSample { seconds: started.elapsed().as_secs_f64(), rss_bytes });
        }
        let now = Instant::now();
        while next_tick <= now {
            next_tick += interval;
        }
        match stop.recv_timeout(next_tick - now) {
            Err(RecvTimeoutError::Timeout) => continue,
            _ => return samples,
        }
    }
}

fn wait_without_reaping(pid: u32) -> io::Result<()> {
    loop {
        // SAFETY: waitid fills the siginfo_t we own.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: siginfo_t is plain data, valid all zero.
        let result = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if result == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// wait4: the status and the resource usage of the command, including the
/// children it reaped itself.
fn reap(pid: u32) -> io::Result<(libc::c_int, libc::rusage)> {
    loop {
        let mut status = 0;
        // SAFETY: wait4 fills the status and rusage we own.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: rusage is plain data, valid all zero.
        let result = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if result == pid as libc::pid_t {
            return Ok((status, usage));
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// The shell's convention: 128+N when signal N killed the command.
fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFSIGNALED(status) { 128 + libc::WTERMSIG(status) } else { libc::WEXITSTATUS(status) }
}

fn seconds(time: libc::timeval) -> f64 {
    time.tv_sec as f64 + time.tv_usec as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, env: &[(String, String)]) -> Result<Run, MeasureError> {
        let command = ["sh".into(), "-c".into(), script.into()];
        measure(&command, env, &Setup { interval: Duration::from_millis(10), numa: None })
    }

    #[test]
    fn exit_status_output_and_env() {
        let run = sh("echo $MEMGAP_TEST_VALUE; echo oops >&2; exit 3", &[("MEMGAP_TEST_VALUE".into(), "x".into())]).unwrap();
        assert_eq!(run.exit_code, 3);
        assert_eq!(run.stdout_bytes, 2);
        assert_eq!(run.stderr_tail, "oops");
        assert_eq!(run.stdout, Stdout::Lines(vec!["x".into()]));
        let other = sh("echo y; exit 3", &[]).unwrap();
        assert_ne!(run.stdout_hash, other.stdout_hash);
    }

    #[test]
    fn killed_by_a_signal_is_128_plus_n() {
        assert_eq!(sh("kill -9 $$", &[]).unwrap().exit_code, 128 + 9);
    }

    #[test]
    fn stdin_is_empty() {
        let run = sh("cat; echo end", &[]).unwrap();
        assert_eq!(run.stdout_bytes, 4);
    }

    #[test]
    fn samples_rss_and_cpu_over_the_run() {
        // A busy loop of a few hundred milliseconds in a child of sh.
        let run = sh("i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done", &[]).unwrap();
        assert!(run.wall_seconds > 0.05, "{run:?}");
        assert!(run.samples.len() >= 3, "{} samples in {} s", run.samples.len(), run.wall_seconds);
        assert!(run.samples.iter().all(|s| s.rss_bytes > 0));
        assert!(run.cpu_seconds > 0.0, "{run:?}");
        assert!(run.max_rss_bytes > 0);
    }

    #[test]
    fn a_missing_command_is_not_found() {
        let error =
            measure(&["/nonexistent/memgap-test".into()], &[], &Setup { interval: Duration::from_millis(10), numa: None }).unwrap_err();
        assert_eq!(error.shell_exit_code(), Some(127));
        assert_eq!(error.to_string(), "/nonexistent/memgap-test: command not found");
    }

    /// A child that touches 8 MiB: its first touches are sampled, each on
    /// the node of the CPU that touched it when the machine has one node.
    #[test]
    fn samples_first_touches_of_the_process_tree() {
        let topology = memgap_source_numa::topology::this_machine();
        let nodes = topology.nodes.len();
        let setup = Setup { interval: Duration::from_millis(10), numa: Some(topology) };
        let command = ["sh".into(), "-c".into(), "x=$(head -c 8388608 /dev/zero | tr '\\0' a); echo ${#x}".into()];
        let run = measure(&command, &[], &setup).unwrap();
        assert_eq!(run.stdout, Stdout::Lines(vec!["8388608".into()]));
        let locality = match run.numa.expect("sampling was asked for") {
            Ok(sampled) => sampled.locality,
            Err(reason) => return eprintln!("skipped: {reason}"), // perf_event_open not permitted here
        };
        assert!(locality.samples > 1000, "{locality:?}");
        assert!(locality.kind == "first-touch" || locality.kind == "access", "{locality:?}");
        if nodes == 1 {
            assert_eq!(locality.local_fraction, Some(1.0), "{locality:?}");
            assert!(locality.weighted_rate_per_second.is_some_and(|rate| rate > 0.0), "{locality:?}");
        }
    }
}
