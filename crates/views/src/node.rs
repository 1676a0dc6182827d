//! Node.js's part of the views: V8's heap spaces in the terminal ledger, and
//! the report's Node panel (spaces over time beside VmRSS).

use std::fmt::Write;

use memgap_model::owners::node::NodeLayer;

use crate::format::{bytes, count};

/// The report's Node panel, put in when a snapshot has a `node` section.
pub const PANEL: &str = include_str!("report/node.html");

/// Lines for the terminal ledger, after the malloc tables.
pub fn section(n: &NodeLayer) -> String {
    let mut out = String::new();
    let _ = writeln!(out);
    let isolates = if n.isolates > 1 { format!(", {} isolates", n.isolates) } else { String::new() };
    let _ = writeln!(
        out,
        "  Node {} (V8 {}) at {:.2} s ({}{isolates}): heap total {}, used {}, external {} (array buffers {})",
        n.version,
        n.v8_version,
        n.sampled_at_seconds,
        n.sample_kind.replace('_', " "),
        bytes(n.heap_total_bytes),
        bytes(n.heap_used_bytes),
        bytes(n.external_bytes),
        bytes(n.array_buffers_bytes)
    );
    let _ = writeln!(out, "    {:<26} {:>10} {:>10} {:>10} {:>10}", "space", "size", "used", "available", "physical");
    for s in n.spaces.iter().filter(|s| s.size > 0 || s.used > 0) {
        let _ = writeln!(
            out,
            "    {:<26} {:>10} {:>10} {:>10} {:>10}",
            s.name,
            bytes(s.size),
            bytes(s.used),
            bytes(s.available),
            bytes(s.physical)
        );
    }
    let _ = writeln!(
        out,
        "    V8's mappings: {} resident in {}; external memory is in the malloc rows",
        bytes(n.v8_resident_bytes),
        count(u64::from(n.v8_mappings))
    );
    let _ = writeln!(
        out,
        "    GC: {} scavenges, {} mark-compacts, {} incremental steps, {:.1} ms",
        count(n.gcs.minor),
        count(n.gcs.major),
        count(n.gcs.incremental),
        n.gcs.total_ms
    );
    out
}
