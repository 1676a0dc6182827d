//! The Go runtime as a memgap source. Go programs do not use malloc, so the
//! agent sees nothing of their heap; this crate turns what the Go runtime says
//! about itself into [`Metrics`](memgap_trace::records::Metrics) records.
//!
//! - [`buildinfo`]: is this executable a Go program, and which Go built it.
//! - [`gctrace`]: the `GODEBUG=gctrace=1` lines on the program's stderr.
//! - [`helper`]: the lines the helper package (`go/memgap`) streams from
//!   runtime/metrics when `memgap run` is its parent.
//! - [`memstats`]: `runtime.MemStats` read over HTTP from `net/http/pprof`
//!   (`/debug/pprof/heap?debug=1`) or expvar (`/debug/vars`), restated in
//!   runtime/metrics names so the model reads one vocabulary.
//! - [`size_classes`]: the size classes and how many objects fit a span, for
//!   the Go version that built the program.
//!
//! Not for: deciding what the figures mean (the model does, in
//! `memgap_model::go`) or talking to processes (the `memgap` command does).
//!
//! ```
//! use memgap_source_go::gctrace;
//! let line = "gc 6 @0.044s 11%: 3.1+3.8+0.004 ms clock, 6.3+0/4.3/0.44+0.008 ms cpu, 64->64->8 MB, 81 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)";
//! let gc = gctrace::parse(line).unwrap();
//! assert_eq!((gc.number, gc.live_mb, gc.forced), (6, 8, true));
//! ```

pub mod buildinfo;
pub mod gctrace;
pub mod helper;
pub mod memstats;
/// The runtime's metric names, as the trace spells them.
pub use memgap_trace::vocabulary::go as names;
pub mod size_classes;

/// The `source` of every METRICS record this crate makes.
pub const SOURCE: &str = memgap_trace::vocabulary::source::GO;

use memgap_trace::records::Metrics;

/// The METRICS kinds [`version_metrics`] writes: they describe the build,
/// so a trace needs them once, not at every sample.
pub const VERSION_KINDS: [&str; 2] = [memgap_trace::vocabulary::kind::BUILD, memgap_trace::vocabulary::kind::SIZE_CLASSES];

/// What a Go version implies, as METRICS records: kind `build` (the version
/// as `go_info{version="…"}`) and, when it names a Go 1.x release, kind
/// `size_classes` (`span_bytes[SIZE]` and `objects_per_span[SIZE]` per class).
pub fn version_metrics(version: &str, monotonic_ns: u64) -> Vec<Metrics> {
    let metrics = |kind: &str, values| Metrics { monotonic_ns, source: SOURCE.into(), kind: kind.into(), values };
    let mut out = vec![metrics(VERSION_KINDS[0], vec![(names::version_metric(version), 1.0)])];
    if let Some(runtime) = size_classes::Runtime::from_version(version) {
        let mut values = Vec::new();
        for class in runtime.classes() {
            values.push((names::bucket(names::SPAN_BYTES, f64::from(class.size)), f64::from(class.span_bytes)));
            values.push((names::bucket(names::OBJECTS_PER_SPAN, f64::from(class.size)), f64::from(class.objects_per_span)));
        }
        out.push(metrics(VERSION_KINDS[1], values));
    }
    out
}
