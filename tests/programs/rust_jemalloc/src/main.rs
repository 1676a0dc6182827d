//! rust_jemalloc: a Rust program whose allocator is jemalloc, linked in
//! statically (tikv-jemallocator, symbols prefixed `_rjem_`), so none of its
//! heap calls reach an LD_PRELOAD hook. It builds a table of records of
//! mixed sizes, drops two in three (leaving partly filled slabs and freed
//! pages jemalloc keeps), prints jemalloc's own `stats.allocated` and
//! `stats.resident`, then idles for the seconds given (default 0) and exits
//! without dropping what it holds.

use std::io::Write as _;
use std::time::Duration;

use tikv_jemalloc_ctl::{epoch, stats};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let idle_seconds: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(0.0);
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
    epoch::advance().expect("jemalloc epoch");
    let allocated = stats::allocated::read().expect("stats.allocated");
    let resident = stats::resident::read().expect("stats.resident");
    let held: usize = records.iter().map(Vec::len).sum::<usize>() + large.iter().map(|b| b.len() * 8).sum::<usize>();
    let mut out = std::io::stdout().lock();
    writeln!(out, "held {held} bytes in {} records", records.len() + large.len()).unwrap();
    writeln!(out, "jemalloc stats.allocated {allocated}").unwrap();
    writeln!(out, "jemalloc stats.resident {resident}").unwrap();
    out.flush().unwrap();
    drop(out);
    std::thread::sleep(Duration::from_secs_f64(idle_seconds));
    // Exit holding everything: the last snapshot sees the same heap.
    std::process::exit(0);
}
