//! The Go runtime's metric names as METRICS records of source `go` carry
//! them: runtime/metrics names (Go 1.16+; all present in 1.19), MemStats read
//! over HTTP restated in these names, gctrace figures, and the size classes
//! memgap derives from the runtime's version.

pub const HEAP_OBJECTS: &str = "/memory/classes/heap/objects:bytes";
pub const HEAP_UNUSED: &str = "/memory/classes/heap/unused:bytes";
pub const HEAP_FREE: &str = "/memory/classes/heap/free:bytes";
pub const HEAP_RELEASED: &str = "/memory/classes/heap/released:bytes";
pub const HEAP_STACKS: &str = "/memory/classes/heap/stacks:bytes";
pub const OS_STACKS: &str = "/memory/classes/os-stacks:bytes";
pub const MSPAN_INUSE: &str = "/memory/classes/metadata/mspan/inuse:bytes";
pub const MSPAN_FREE: &str = "/memory/classes/metadata/mspan/free:bytes";
pub const MCACHE_INUSE: &str = "/memory/classes/metadata/mcache/inuse:bytes";
pub const MCACHE_FREE: &str = "/memory/classes/metadata/mcache/free:bytes";
pub const METADATA_OTHER: &str = "/memory/classes/metadata/other:bytes";
pub const PROFILING_BUCKETS: &str = "/memory/classes/profiling/buckets:bytes";
pub const OTHER: &str = "/memory/classes/other:bytes";
pub const TOTAL: &str = "/memory/classes/total:bytes";
pub const ALLOCS_BY_SIZE: &str = "/gc/heap/allocs-by-size:bytes";
pub const FREES_BY_SIZE: &str = "/gc/heap/frees-by-size:bytes";
pub const GC_CYCLES: &str = "/gc/cycles/total:gc-cycles";
pub const GOROUTINES: &str = "/sched/goroutines:goroutines";
pub const HEAP_GOAL: &str = "/gc/heap/goal:bytes";

/// Runtime memory outside the heap's object spans: stacks, metadata,
/// profiling buckets and the rest (the ledger's runtime row, as the runtime
/// counts it).
pub const RUNTIME_CLASSES: [&str; 9] =
    [HEAP_STACKS, OS_STACKS, MSPAN_INUSE, MSPAN_FREE, MCACHE_INUSE, MCACHE_FREE, METADATA_OTHER, PROFILING_BUCKETS, OTHER];

/// gctrace figures (kind `gc`), in bytes (gctrace prints whole MB).
pub const GCTRACE_HEAP_START: &str = "gctrace/heap_start:bytes";
pub const GCTRACE_HEAP_END: &str = "gctrace/heap_end:bytes";
pub const GCTRACE_LIVE: &str = "gctrace/live:bytes";
pub const GCTRACE_GOAL: &str = "gctrace/goal:bytes";
pub const GCTRACE_STACKS: &str = "gctrace/stacks:bytes";
pub const GCTRACE_GLOBALS: &str = "gctrace/globals:bytes";
pub const GCTRACE_CYCLE: &str = "gctrace/cycle";
pub const GCTRACE_SECONDS: &str = "gctrace/seconds";
pub const GCTRACE_CPU_PERCENT: &str = "gctrace/cpu:percent";
pub const GCTRACE_PROCS: &str = "gctrace/procs";
pub const GCTRACE_FORCED: &str = "gctrace/forced";

/// Per size class (kind `size_classes`, one bucket per object size): the
/// bytes of one span, and the objects it holds.
pub const SPAN_BYTES: &str = "span_bytes";
pub const OBJECTS_PER_SPAN: &str = "objects_per_span";

/// A histogram bucket's name: `name[upper bound]` (docs/trace-format.md).
pub fn bucket(name: &str, upper: f64) -> String {
    if upper.is_infinite() { format!("{name}[inf]") } else { format!("{name}[{upper}]") }
}

/// Splits `name[upper]` into the histogram's name and the bucket's upper bound.
pub fn parse_bucket(name: &str) -> Option<(&str, f64)> {
    let open = name.rfind('[')?;
    let upper = name[open + 1..].strip_suffix(']')?;
    let upper = if upper == "inf" { f64::INFINITY } else { upper.parse().ok()? };
    Some((&name[..open], upper))
}

/// `go_info{version="go1.26.8"}`: the Go version as a metric name (value 1),
/// after the Prometheus convention for labels.
pub fn version_metric(version: &str) -> String {
    format!("go_info{{version=\"{version}\"}}")
}

pub fn parse_version_metric(name: &str) -> Option<&str> {
    name.strip_prefix("go_info{version=\"")?.strip_suffix("\"}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_versions_round_trip() {
        assert_eq!(parse_bucket(&bucket(ALLOCS_BY_SIZE, 17.0)), Some((ALLOCS_BY_SIZE, 17.0)));
        assert_eq!(parse_bucket(&bucket(ALLOCS_BY_SIZE, f64::INFINITY)), Some((ALLOCS_BY_SIZE, f64::INFINITY)));
        assert_eq!(parse_bucket(HEAP_FREE), None);
        assert_eq!(parse_version_metric(&version_metric("go1.26.8-X:nogreenteagc")), Some("go1.26.8-X:nogreenteagc"));
    }
}
