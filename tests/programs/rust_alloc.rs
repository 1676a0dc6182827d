//! rust_alloc: Rust allocation churn through the system allocator (Vec,
//! String, Box, a HashMap and a boxed trait object), with output on stdout
//! and stderr and exit code 7. Compile with `rustc -O`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

trait Shape {
    fn area(&self) -> f64;
}

struct Square(f64);
struct Circle(f64);

impl Shape for Square {
    fn area(&self) -> f64 {
        self.0 * self.0
    }
}

impl Shape for Circle {
    fn area(&self) -> f64 {
        3.0 * self.0 * self.0
    }
}

/// Asks memgap for a snapshot while the data above is alive (a no-op when
/// the program runs without memgap).
fn snapshot_if_traced() {
    unsafe extern "C" {
        fn dlsym(handle: *mut std::ffi::c_void, symbol: *const std::ffi::c_char) -> *mut std::ffi::c_void;
    }
    // SAFETY: a NUL-terminated name; a null handle is RTLD_DEFAULT.
    let found = unsafe { dlsym(std::ptr::null_mut(), c"memgap_snapshot".as_ptr()) };
    if !found.is_null() {
        // SAFETY: the agent exports memgap_snapshot as `extern "C" fn()`.
        let snapshot: extern "C" fn() = unsafe { std::mem::transmute(found) };
        snapshot();
    }
}

fn main() -> ExitCode {
    let mut numbers: Vec<u64> = Vec::new();
    for i in 0..100_000u64 {
        numbers.push(i * i % 1009);
    }
    let sum: u64 = numbers.iter().sum();

    let mut text = String::new();
    for i in 0..5_000 {
        write!(text, "{i},").unwrap();
    }

    let mut counts: HashMap<String, usize> = HashMap::new();
    for word in text.split(',').filter(|w| !w.is_empty()) {
        *counts.entry(word.chars().rev().collect()).or_default() += word.len();
    }

    let shapes: Vec<Box<dyn Shape>> = (0..1_000)
        .map(|i| -> Box<dyn Shape> {
            if i % 2 == 0 { Box::new(Square(i as f64)) } else { Box::new(Circle(i as f64)) }
        })
        .collect();
    let area: f64 = shapes.iter().map(|s| s.area()).sum();

    let nested: Vec<Box<[u8]>> = (0..2_000).map(|i| vec![(i % 251) as u8; i % 300].into_boxed_slice()).collect();
    let bytes: usize = nested.iter().map(|b| b.len()).sum();

    snapshot_if_traced();

    let mut out = std::io::stdout().lock();
    writeln!(out, "sum {sum}").unwrap();
    writeln!(out, "text {} chars, {} distinct words", text.len(), counts.len()).unwrap();
    writeln!(out, "area {area:.1}").unwrap();
    writeln!(out, "bytes {bytes}").unwrap();
    eprintln!("rust_alloc: done");
    ExitCode::from(7)
}
