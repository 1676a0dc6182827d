//! The Node.js source: what V8 and Node know of their memory.
//!
//! `memgap run` loads [`SAMPLER`] into every Node process it starts
//! (`NODE_OPTIONS=--require <file>`, after the user's own options); the
//! sampler appends process.memoryUsage(), v8.getHeapStatistics() and
//! v8.getHeapSpaceStatistics() to a file per isolate (pid and worker
//! threadId) after garbage collections and at exit. [`read`] turns such a
//! file into METRICS records (source `node`, the isolate in the value
//! `thread`) for the process's trace.
//!
//! Not for: deciding what the figures mean (the model's Node owner does).

use memgap_trace::records::{Metrics, Record};

/// The JavaScript file `memgap run` writes out and names in NODE_OPTIONS.
pub const SAMPLER: &str = include_str!("sampler.js");

/// The env variable naming the sampler's output (`%p`: the pid, `%t`: the
/// worker's threadId, 0 for the main thread).
pub const OUT_ENV: &str = "MEMGAP_NODE_OUT";
/// Minimum milliseconds between samples that no major GC forces.
pub const INTERVAL_ENV: &str = "MEMGAP_NODE_INTERVAL_MS";

pub const SOURCE: &str = "node";

/// What one sampler file (one isolate) holds.
#[derive(Debug, Default, PartialEq)]
pub struct Samples {
    pub metrics: Vec<Metrics>,
    /// process.versions.node (the `meta` line).
    pub version: Option<String>,
    /// process.versions.v8.
    pub v8_version: Option<String>,
    /// Lines that did not parse (a line cut by SIGKILL, say).
    pub skipped_lines: usize,
}

impl Samples {
    /// The records to append to the process's trace: a NOTE with the
    /// versions, then one METRICS per sample.
    pub fn records(&self) -> Vec<Record<'static>> {
        let mut records = Vec::with_capacity(self.metrics.len() + 1);
        if let (Some(version), Some(first)) = (&self.version, self.metrics.first()) {
            let v8 = self.v8_version.as_deref().map(|v| format!(" (V8 {v})")).unwrap_or_default();
            records.push(Record::Note { time: first.monotonic_ns, text: format!("node {version}{v8}") });
        }
        records.extend(self.metrics.iter().cloned().map(Record::Metrics));
        records
    }
}

/// Parses a sampler file: `<monotonic ns> <kind> <key>=<value>...` per line.
/// Values are numbers except the meta line's `version` and `v8`.
pub fn read(text: &str) -> Samples {
    let mut samples = Samples::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line, &mut samples) {
            Some(metrics) => samples.metrics.push(metrics),
            None => samples.skipped_lines += 1,
        }
    }
    samples
}

fn parse_line(line: &str, samples: &mut Samples) -> Option<Metrics> {
    let mut words = line.split_ascii_whitespace();
    let monotonic_ns = words.next()?.parse().ok()?;
    let kind = words.next()?;
    if !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let mut values = Vec::new();
    let (mut version, mut v8) = (None, None);
    for word in words {
        let (name, value) = word.split_once('=')?;
        match name {
            "version" => version = Some(value.to_string()),
            "v8" => v8 = Some(value.to_string()),
            _ => values.push((name.to_string(), value.parse::<f64>().ok().filter(|v| v.is_finite())?)),
        }
    }
    // A line cut short keeps its earlier words: refuse a sample without the
    // figures every sample ends with (its last space's physical size).
    if kind != "meta" && !values.last().is_some_and(|(name, _)| name.ends_with(".physical")) {
        return None;
    }
    if version.is_some() {
        samples.version = version;
    }
    if v8.is_some() {
        samples.v8_version = v8;
    }
    Some(Metrics { monotonic_ns, source: SOURCE.into(), kind: kind.into(), values })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "thread=0 rss=50000000 heap_total=8000000 heap_used=6000000 external=1000 array_buffers=500 \
                          gc_minor=3 gc_major=1 gc_ms=1.5 new_space.size=2097152 new_space.used=1000000 new_space.available=30000 new_space.physical=2097152";

    #[test]
    fn reads_sampler_lines() {
        let text = format!("100 meta thread=0 version=20.20.2 v8=11.3.244.8-node.33\n200 start {SAMPLE}\n300 major_gc {SAMPLE}\n400 exit thread=0 rss=5 heap_total=8000000 new_space.si");
        let samples = read(&text);
        assert_eq!(samples.version.as_deref(), Some("20.20.2"));
        assert_eq!(samples.v8_version.as_deref(), Some("11.3.244.8-node.33"));
        assert_eq!(samples.metrics.len(), 3);
        assert_eq!(samples.skipped_lines, 1);
        assert_eq!(samples.metrics[1].get("heap_used"), Some(6_000_000.0));
        assert_eq!(samples.metrics[2].kind, "major_gc");
        assert_eq!(samples.metrics[2].get("new_space.physical"), Some(2_097_152.0));
        let records = samples.records();
        assert!(matches!(&records[0], Record::Note { text, .. } if text == "node 20.20.2 (V8 11.3.244.8-node.33)"));
        assert_eq!(records.len(), 4);
    }

    #[test]
    fn rejects_what_is_not_a_sample() {
        for bad in ["x meta", "1", "1 ki/nd a=1", "1 sample a=NaN", "1 sample a", "1 gc heap_used=5", "1 gc a.physical=inf"] {
            assert_eq!(read(bad).metrics.len(), 0, "{bad}");
        }
    }
}
