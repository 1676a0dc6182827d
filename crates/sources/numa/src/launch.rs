//! Memory samples of a command about to be started, from its first
//! instruction: `memgap run --numa` and `memgap compare`'s NUMA figures.
//!
//! The events must exist before the program's first instruction, yet
//! `Command::spawn` returns only after exec. So the child, between fork and
//! exec, sends its pid through a pipe and waits; a helper thread opens the
//! events on that pid (enabled at exec) and lets it go on, then drains the
//! ring buffers every 10 ms (the node of each sampled page is asked while
//! the process still lives) until [`Sampling::finish`].
//!
//! ```no_run
//! let mut command = std::process::Command::new("./prog");
//! let sampling = memgap_source_numa::launch::prepare(&mut command)?;
//! let mut child = command.spawn()?;
//! sampling.spawned();
//! child.wait()?;
//! let samples = sampling.finish();
//! # Ok::<(), std::io::Error>(())
//! ```

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use memgap_trace::numa::MemorySamples;

use crate::sampling::{PMU_DEVICES, Sampler, probe_precise};

/// Sampling set up for one command; see the module comment.
pub struct Sampling {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<MemorySamples, String>>,
    pid_write: i32,
}

fn pipe() -> std::io::Result<(i32, i32)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

/// The clock of the samples' times: the trace's.
use memgap_trace::clock::monotonic_ns;

/// Arranges for `command`'s child to wait, before exec, until its events
/// are open: precise memory-access events where the CPU offers them, page
/// faults otherwise.
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
        // SAFETY: `pid` is 4 writable bytes; `pid_read` is this thread's own descriptor.
        let got = unsafe { libc::read(pid_read, &mut pid as *mut i32 as *mut libc::c_void, 4) };
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(pid_read) };
        let sampler = if got == 4 {
            let cpus: Vec<u32> = online_cpus();
            Sampler::open(pid as u32, &cpus, probe_precise(Path::new(PMU_DEVICES)))
        } else {
            Err("the program did not start".to_string())
        };
        // SAFETY: our own descriptors, each closed once; the byte is a static.
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

/// The CPUs the kernel has online.
pub fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| crate::topology::parse_cpulist(&t))
        .unwrap_or_else(|| (0..std::thread::available_parallelism().map_or(1, |n| n.get() as u32)).collect())
}

impl Sampling {
    /// After spawn returned (or failed): a child that never ran pre_exec
    /// (fork failed) must not leave the helper waiting.
    pub fn spawned(&self) {
        // SAFETY: our own descriptor, closed once (`spawned` runs once).
        unsafe { libc::close(self.pid_write) };
    }

    /// After the program ended: the samples, or why there are none.
    pub fn finish(self) -> Result<MemorySamples, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_else(|_| Err("the sampling thread failed".into()))
    }
}
