//! The Node.js source: what V8 and Node know of their memory.
//!
//! `memgap run` loads [`RUNTIME`]'s sampler into every Node process it
//! starts (`NODE_OPTIONS=--require <file>`, after the user's own options);
//! the sampler appends process.memoryUsage(), v8.getHeapStatistics() and
//! v8.getHeapSpaceStatistics() to a file per isolate (pid and worker
//! threadId) after garbage collections and at exit, which become METRICS
//! records (source `node`, the isolate in the value `thread`) in the
//! process's trace.
//!
//! Not for: deciding what the figures mean (the model's Node owner does).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use memgap_source_sampler::Runtime;
use memgap_trace::vocabulary::env;

pub const SOURCE: &str = memgap_trace::vocabulary::source::NODE;

/// Node's sampler. Its samples end with the last heap space's physical size.
pub const RUNTIME: Runtime = Runtime {
    source: SOURCE,
    script: include_str!("sampler.js"),
    script_name: "sampler.js",
    out_env: env::NODE_OUT.name(),
    out_pattern: "node.%p.%t",
    interval_env: env::NODE_INTERVAL_MS.name(),
    load_env: "NODE_OPTIONS",
    load_value: node_options,
    text_keys: &["version", "v8"],
    is_whole: |kind, values| {
        kind == memgap_trace::vocabulary::kind::META || values.last().is_some_and(|(name, _)| name.ends_with(".physical"))
    },
    note: |text| {
        let v8 = text.get("v8").map(|v| format!(" (V8 {v})")).unwrap_or_default();
        Some(format!("node {}{v8}", text.get("version")?))
    },
};

/// The user's NODE_OPTIONS, then `--require "<sampler>"` (quoted as Node's
/// parser of NODE_OPTIONS reads it: a backslash escapes the next character).
fn node_options(existing: Option<&OsStr>, sampler: &Path) -> OsString {
    let mut options = OsString::new();
    if let Some(existing) = existing.filter(|v| !v.as_bytes().iter().all(u8::is_ascii_whitespace)) {
        options.push(existing);
        options.push(" ");
    }
    let mut quoted = Vec::from(&b"--require \""[..]);
    for &byte in sampler.as_os_str().as_bytes() {
        if byte == b'"' || byte == b'\\' {
            quoted.push(b'\\');
        }
        quoted.push(byte);
    }
    quoted.push(b'"');
    options.push(OsStr::from_bytes(&quoted));
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_reads_the_variables_memgap_sets() {
        for variable in [env::NODE_OUT, env::NODE_INTERVAL_MS] {
            assert!(RUNTIME.script.contains(variable.name()), "{variable}");
        }
    }
    use memgap_trace::records::Record;

    const SAMPLE: &str = "thread=0 rss=50000000 heap_total=8000000 heap_used=6000000 external=1000 array_buffers=500 \
                          gc_minor=3 gc_major=1 gc_ms=1.5 new_space.size=2097152 new_space.used=1000000 new_space.available=30000 new_space.physical=2097152";

    #[test]
    fn reads_sampler_lines() {
        let text = format!(
            "100 meta thread=0 version=20.20.2 v8=11.3.244.8-node.33\n200 start {SAMPLE}\n300 major_gc {SAMPLE}\n400 exit thread=0 rss=5 heap_total=8000000 new_space.si"
        );
        let samples = RUNTIME.read(&text);
        assert_eq!(samples.text.get("version").map(String::as_str), Some("20.20.2"));
        assert_eq!(samples.metrics.len(), 3);
        assert_eq!(samples.skipped_lines, 1);
        assert_eq!(samples.metrics[1].get("heap_used"), Some(6_000_000.0));
        assert_eq!(samples.metrics[2].kind, memgap_trace::vocabulary::kind::MAJOR_GC);
        assert_eq!(samples.metrics[2].get("new_space.physical"), Some(2_097_152.0));
        let records: Vec<_> = RUNTIME.records(std::slice::from_ref(&samples)).collect();
        assert!(matches!(&records[0], Record::Note { text, .. } if text == "node 20.20.2 (V8 11.3.244.8-node.33)"));
        assert_eq!(records.len(), 4);
    }

    #[test]
    fn a_cut_sample_is_not_kept() {
        for bad in ["1 gc heap_used=5", "1 gc a.physical=inf", "1 gc a.physical=1 heap_used=5"] {
            assert_eq!(RUNTIME.read(bad).metrics.len(), 0, "{bad}");
        }
    }

    #[test]
    fn sampler_comes_after_the_users_options() {
        let path = Path::new("/tmp/memgap-node-x/sampler.js");
        assert_eq!(node_options(None, path), OsString::from("--require \"/tmp/memgap-node-x/sampler.js\""));
        assert_eq!(node_options(Some(OsStr::new("  ")), path), OsString::from("--require \"/tmp/memgap-node-x/sampler.js\""));
        assert_eq!(
            node_options(Some(OsStr::new("--max-old-space-size=64")), path),
            OsString::from("--max-old-space-size=64 --require \"/tmp/memgap-node-x/sampler.js\"")
        );
        assert_eq!(node_options(None, Path::new("/tmp/a \"b\\c/sampler.js")), OsString::from("--require \"/tmp/a \\\"b\\\\c/sampler.js\""));
    }
}
