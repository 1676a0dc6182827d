//! The heap the Rust allocator programs (rust_jemalloc, rust_mimalloc)
//! build, each under its own allocator: a table of records of mixed sizes
//! with two in three dropped (partly filled pages the allocator keeps, and
//! freed ones), and six 4 MiB blocks. Each prints what it holds and its
//! allocator's own figures, idles for the seconds given as its first
//! argument (default 0), and exits without dropping anything, so the last
//! snapshot sees the same heap.

use std::io::Write as _;
use std::time::Duration;

pub struct Heap {
    records: Vec<Vec<u8>>,
    large: Vec<Box<[u64]>>,
}

pub fn build() -> Heap {
    let mut records: Vec<Vec<u8>> = Vec::new();
    for i in 0..120_000usize {
        let size = 48 + (i * 37) % 400;
        records.push(vec![(i % 251) as u8; size]);
    }
    let mut index = 0usize;
    records.retain(|_| {
        index += 1;
        index % 3 == 0
    });
    let large: Vec<Box<[u64]>> = (0..6).map(|i| vec![i as u64; 512 * 1024].into_boxed_slice()).collect();
    Heap { records, large }
}

impl Heap {
    /// Prints "held N bytes in M records" and each of `figures` as "NAME
    /// VALUE", idles, and exits holding the heap.
    pub fn report_and_idle(self, figures: &[(&str, u64)]) -> ! {
        let idle_seconds: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(0.0);
        let held: usize = self.records.iter().map(Vec::len).sum::<usize>() + self.large.iter().map(|b| b.len() * 8).sum::<usize>();
        let mut out = std::io::stdout().lock();
        writeln!(out, "held {held} bytes in {} records", self.records.len() + self.large.len()).unwrap();
        for (name, value) in figures {
            writeln!(out, "{name} {value}").unwrap();
        }
        out.flush().unwrap();
        drop(out);
        std::thread::sleep(Duration::from_secs_f64(idle_seconds));
        // Exit holding everything: the last snapshot sees the same heap.
        std::process::exit(0);
    }
}
