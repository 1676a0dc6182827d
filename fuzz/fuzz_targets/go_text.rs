//! The Go source's parsers of text a program or a service hands memgap:
//! gctrace lines (the program's stderr), the helper's line protocol, MemStats
//! from /debug/pprof/heap?debug=1 and expvar, and Go binary detection. The
//! input is split on "\0" into those texts; the last part is also read as
//! an ELF file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memgap_source_go::{buildinfo, gctrace, helper, memstats};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0);
    let text = |part: Option<&[u8]>| String::from_utf8_lossy(part.unwrap_or_default()).into_owned();
    let (trace, lines, pprof, expvar) = (text(parts.next()), text(parts.next()), text(parts.next()), text(parts.next()));
    for line in trace.lines() {
        let _ = gctrace::may_start_line(line.as_bytes());
        let _ = gctrace::parse(line);
    }
    for line in lines.lines() {
        let _ = helper::parse(line);
    }
    let _ = memstats::parse_pprof_heap(&pprof);
    let _ = memstats::parse_expvar(&expvar);
    let _ = buildinfo::detect_bytes(parts.next().unwrap_or_default());
});
