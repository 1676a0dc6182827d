//! `memgap run --numa`: memory samples of the traced program, gathered by
//! memgap itself (not the agent) with perf_event_open, and the machine's
//! topology; both appended to the trace after the run.
//!
//! The events must exist before the program's first instruction, yet
//! `Command::spawn` returns only after exec. So the child, between fork and
//! exec, sends its pid through a pipe and waits; a helper thread opens the
//! events on that pid (enabled at exec) and lets it go on, then drains the
//! ring buffers every 10 ms until the program ends.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use memgap_source_numa::sampling::{PMU_DEVICES, Sampler, probe_precise};
use memgap_trace::numa::MemorySamples;
use memgap_trace::records::Record;

/// Samples per MEMORY_SAMPLES record (about 1–2 MB encoded).
const SAMPLES_PER_RECORD: usize = 100_000;

pub struct Sampling {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<MemorySamples, String>>,
    pid_write: i32,
}

fn pipe() -> std::io::Result<(i32, i32)> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Arranges for `command`'s child to wait, before exec, until its events are open.
pub fn prepare(command: &mut std::process::Command) -> std::io::Result<Sampling> {
    let (pid_read, pid_write) = pipe()?;
    let (go_read, go_write) = pipe()?;
    // SAFETY: only async-signal-safe calls (getpid, write, read) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let pid = libc::getpid();
            libc::write(pid_write, &pid as *const i32 as *const libc::c_void, 4);
            let mut byte = 0u8;
            libc::read(go_read, &mut byte as *mut u8 as *mut libc::c_void, 1);
            Ok(())
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut pid = 0i32;
        let got = unsafe { libc::read(pid_read, &mut pid as *mut i32 as *mut libc::c_void, 4) };
        unsafe { libc::close(pid_read) };
        let sampler = if got == 4 {
            let cpus: Vec<u32> = online_cpus();
            Sampler::open(pid as u32, &cpus, probe_precise(Path::new(PMU_DEVICES)))
        } else {
            Err("the program did not start".to_string())
        };
        unsafe {
            libc::write(go_write, b"g".as_ptr() as *const libc::c_void, 1);
            libc::close(go_write);
            libc::close(go_read);
        }
        let mut sampler = sampler?;
        sampler.set_start(monotonic_ns());
        while !stopping.load(Ordering::Relaxed) {
            sampler.drain();
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(sampler.finish(monotonic_ns()))
    });
    Ok(Sampling { stop, thread, pid_write })
}

fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| memgap_source_numa::topology::parse_cpulist(&t))
        .unwrap_or_else(|| (0..std::thread::available_parallelism().map_or(1, |n| n.get() as u32)).collect())
}

impl Sampling {
    /// After spawn returned: a child that never ran pre_exec (fork failed)
    /// must not leave the helper waiting.
    pub fn spawned(&self) {
        unsafe { libc::close(self.pid_write) };
    }

    /// After the program ended: the samples, or why there are none.
    pub fn finish(self) -> Result<MemorySamples, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_else(|_| Err("the sampling thread failed".into()))
    }
}

/// Appends this machine's topology and (with `--numa`) the samples to the
/// traces of the run: each process's samples to its own trace.
pub fn write(samples: Option<Result<MemorySamples, String>>, traces: &super::traces::RunTraces, quiet: bool) {
    let top_pid = traces.top_pid;
    let topology = memgap_source_numa::topology::this_machine();
    let mut raw = Vec::new();
    Record::Topology(topology.to_record()).encode(&mut raw);
    if let Err(error) = traces.append(top_pid, &raw) {
        eprintln!("memgap: cannot add the NUMA topology: {error}");
    }
    let batch = match samples {
        None => return,
        Some(Err(reason)) => {
            if !quiet {
                eprintln!("memgap: NUMA: no memory samples: {reason}");
            }
            return;
        }
        Some(Ok(batch)) => batch,
    };
    if !quiet {
        match batch.precise_unavailable.as_str() {
            "" => eprintln!("memgap: NUMA: {} memory-access samples ({})", batch.samples.len(), batch.source),
            reason => eprintln!("memgap: NUMA: access sampling unavailable ({reason}); recorded first-touch locality from {} page-fault samples instead", batch.samples.len()),
        }
    }
    let mut by_pid: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for sample in &batch.samples {
        by_pid.entry(sample.pid).or_default().push(*sample);
    }
    by_pid.entry(top_pid).or_default();
    for (pid, samples) in by_pid {
        let Some((path, mut file)) = traces.open(pid) else { continue };
        let mut pieces: Vec<&[memgap_trace::numa::MemorySample]> = samples.chunks(SAMPLES_PER_RECORD).collect();
        if pieces.is_empty() {
            pieces.push(&[]);
        }
        let records = pieces.into_iter().enumerate().map(|(i, piece)| {
            Record::MemorySamples(MemorySamples {
                source: batch.source.clone(),
                precise_unavailable: batch.precise_unavailable.clone(),
                period: batch.period,
                start_ns: batch.start_ns,
                end_ns: batch.end_ns,
                // The kernel's count of lost samples is for the whole run: told once, in the top trace.
                lost: if i == 0 && pid == top_pid { batch.lost } else { 0 },
                samples: piece.to_vec(),
            })
        });
        if let Err(error) = memgap_trace::records::append_records_to(&mut file, &path, records) {
            eprintln!("memgap: cannot add NUMA samples to {}: {error}", path.display());
        }
    }
}
