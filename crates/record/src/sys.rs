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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

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
