//! The few system calls the recorders share.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A pipe whose ends close on exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are open and owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// User and system CPU time of this process so far, in ns (0 when unknown).
pub fn own_cpu_ns() -> u64 {
    // SAFETY: rusage is plain data, valid all zero.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the rusage we own.
    match unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } {
        0 => cpu_ns(&usage),
        _ => 0,
    }
}

/// User and system CPU time of a resource usage, in ns.
pub fn cpu_ns(usage: &libc::rusage) -> u64 {
    let ns = |time: libc::timeval| time.tv_sec.max(0) as u64 * 1_000_000_000 + time.tv_usec.max(0) as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    #[test]
    fn own_cpu_time_grows_with_work() {
        let before = super::own_cpu_ns();
        let start = std::time::Instant::now();
        let mut sink = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(50) {
            sink = std::hint::black_box(sink.wrapping_mul(31).wrapping_add(7));
        }
        let spent = super::own_cpu_ns() - before;
        assert!(spent >= 20_000_000, "{spent} ns of CPU for 50 ms of work");
    }

    #[test]
    fn what_is_written_at_one_end_is_read_at_the_other_and_neither_survives_exec() {
        let (read, write) = super::pipe().unwrap();
        for fd in [&read, &write] {
            // SAFETY: F_GETFD only reads the flags of a descriptor we own.
            let flags = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(fd), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
        std::fs::File::from(write).write_all(b"hello").unwrap();
        let mut text = String::new();
        std::fs::File::from(read).read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello");
    }
}
