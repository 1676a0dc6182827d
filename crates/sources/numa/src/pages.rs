//! The node of pages of another process (or our own: pid 0), asked with
//! move_pages(2) and `nodes = NULL`, which moves nothing. Needs
//! ptrace-read access to the process (a parent has it).

/// Pages asked per call.
const BATCH: usize = 4096;

/// One status per address: its page's node, or a negative errno (-ENOENT
/// not present, -EFAULT zero page or unmapped).
pub fn nodes_of(pid: u32, addresses: &[u64]) -> std::io::Result<Vec<i32>> {
    let mut status = vec![-libc::ENOENT; addresses.len()];
    for (addresses, status) in addresses.chunks(BATCH).zip(status.chunks_mut(BATCH)) {
        let pages: Vec<u64> = addresses.iter().map(|a| a & !4095).collect();
        // SAFETY: the pointers address `pages` and the batch of `status`, both of
        // the batch's length; move_pages with no nodes only reports where pages are.
        let result = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                pid as libc::pid_t,
                pages.len(),
                pages.as_ptr(),
                std::ptr::null::<i32>(),
                status.as_mut_ptr(),
                0,
            )
        };
        if result < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_untouched_and_unmapped_pages() {
        let len = 3 * 4096;
        // SAFETY: a new private anonymous mapping the kernel places: it replaces nothing.
        let mem = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        } as *mut u8;
        // SAFETY: the first page of the mapping, writable.
        unsafe { *mem = 1 };
        // SAFETY: the third page of the test's own mapping.
        unsafe { libc::munmap(mem.add(2 * 4096) as *mut libc::c_void, 4096) };
        let base = mem as u64;
        let status = match nodes_of(std::process::id(), &[base + 10, base + 4096, base + 2 * 4096]) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return, // no NUMA in this kernel
            other => other.unwrap(),
        };
        assert!(status[0] >= 0, "{status:?}");
        assert_eq!(&status[1..], &[-libc::ENOENT, -libc::EFAULT]);
        // SAFETY: the rest of the test's own mapping.
        unsafe { libc::munmap(mem as *mut libc::c_void, 2 * 4096) };
    }
}
