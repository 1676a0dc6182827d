//! Reading another process's memory (process_vm_readv), behind a trait so
//! that the heap walk can be tested on memory laid out by the test.

use std::io::IoSliceMut;

use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;

/// Memory of some address space, read whole or not at all.
pub trait Memory {
    /// Fills `buffer` from `address`; false if any byte is unreadable.
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool;

    fn word(&self, address: u64) -> Option<u64> {
        let mut bytes = [0u8; 8];
        self.read(address, &mut bytes).then(|| u64::from_le_bytes(bytes))
    }
}

/// The memory of process `pid` (the ptrace access check applies).
pub struct ProcessMemory {
    pub pid: u32,
    /// Bytes read so far.
    pub read_bytes: std::cell::Cell<u64>,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> ProcessMemory {
        ProcessMemory { pid, read_bytes: std::cell::Cell::new(0) }
    }
}

impl Memory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        if buffer.is_empty() {
            return true;
        }
        let len = buffer.len();
        let remote = [RemoteIoVec { base: address as usize, len }];
        let mut local = [IoSliceMut::new(buffer)];
        let done = process_vm_readv(Pid::from_raw(self.pid as i32), &mut local, &remote).is_ok_and(|n| n == len);
        self.read_bytes.set(self.read_bytes.get() + len as u64);
        done
    }
}

/// Memory laid out by a test: regions of bytes at addresses.
#[cfg(test)]
#[derive(Default)]
pub struct FakeMemory {
    pub regions: Vec<(u64, Vec<u8>)>,
}

#[cfg(test)]
impl FakeMemory {
    pub fn put_word(&mut self, address: u64, value: u64) {
        let (start, bytes) = self.regions.iter_mut().find(|(s, b)| *s <= address && address + 8 <= *s + b.len() as u64).expect("mapped");
        let at = (address - *start) as usize;
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
}

#[cfg(test)]
impl Memory for FakeMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        let end = address + buffer.len() as u64;
        match self.regions.iter().find(|(s, b)| *s <= address && end <= *s + b.len() as u64) {
            Some((start, bytes)) => {
                let at = (address - start) as usize;
                buffer.copy_from_slice(&bytes[at..at + buffer.len()]);
                true
            }
            None => false,
        }
    }
}
