//! The Ruby source: what Ruby knows of its own memory.
//!
//! `memgap run` loads [`SAMPLER`] into every Ruby process it starts
//! (`RUBYOPT=-r<file>`); the sampler appends GC.stat and ObjectSpace figures
//! to a file per pid after garbage collections and at exit. [`read`] turns
//! that file into METRICS records (source `ruby`) for the process's trace.
//!
//! Not for: deciding what the figures mean (the model's Ruby layer does).

use memgap_trace::records::{Metrics, Record};

/// The Ruby file `memgap run` writes out and names in RUBYOPT.
pub const SAMPLER: &str = include_str!("sampler.rb");

/// The env variable naming the sampler's output (`%p`: the pid).
pub const OUT_ENV: &str = "MEMGAP_RUBY_OUT";
/// Minimum milliseconds between samples that no major GC forces.
pub const INTERVAL_ENV: &str = "MEMGAP_RUBY_INTERVAL_MS";

pub const SOURCE: &str = "ruby";

/// What one sampler file holds.
#[derive(Debug, Default, PartialEq)]
pub struct Samples {
    pub metrics: Vec<Metrics>,
    /// RUBY_VERSION of the process (the `meta` line).
    pub version: Option<String>,
    /// Lines that did not parse (a line cut by SIGKILL, say).
    pub skipped_lines: usize,
}

impl Samples {
    /// The records to append to the process's trace: a NOTE with the version,
    /// then one METRICS per sample.
    pub fn records(&self) -> Vec<Record<'static>> {
        let mut records = Vec::with_capacity(self.metrics.len() + 1);
        if let (Some(version), Some(first)) = (&self.version, self.metrics.first()) {
            records.push(Record::Note { time: first.monotonic_ns, text: format!("ruby {version}") });
        }
        records.extend(self.metrics.iter().cloned().map(Record::Metrics));
        records
    }
}

/// Parses a sampler file: `<monotonic ns> <kind> <key>=<value>...` per line.
/// Values are numbers except the meta line's `version`.
pub fn read(text: &str) -> Samples {
    let mut samples = Samples::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line) {
            Some((metrics, version)) => {
                if version.is_some() {
                    samples.version = version;
                }
                samples.metrics.push(metrics);
            }
            None => samples.skipped_lines += 1,
        }
    }
    samples
}

fn parse_line(line: &str) -> Option<(Metrics, Option<String>)> {
    let mut words = line.split_ascii_whitespace();
    let monotonic_ns = words.next()?.parse().ok()?;
    let kind = words.next()?;
    if !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let mut values = Vec::new();
    let mut version = None;
    for word in words {
        let (name, value) = word.split_once('=')?;
        if name == "version" {
            version = Some(value.to_string());
            continue;
        }
        values.push((name.to_string(), value.parse::<f64>().ok().filter(|v| v.is_finite())?));
    }
    Some((Metrics { monotonic_ns, source: SOURCE.into(), kind: kind.into(), values }, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sampler_lines() {
        let text = "100 meta version=3.1.2 rvalue_size=40 heap_page_size=16384\n\
                    200 major_gc heap_allocated_pages=53 heap_live_slots=20694 memsize_of_all=4194304\n\
                    300 exit heap_allocated_pa";
        let samples = read(text);
        assert_eq!(samples.version.as_deref(), Some("3.1.2"));
        assert_eq!(samples.metrics.len(), 2);
        assert_eq!(samples.skipped_lines, 1);
        assert_eq!(samples.metrics[0].get("rvalue_size"), Some(40.0));
        assert_eq!(samples.metrics[1].kind, "major_gc");
        assert_eq!(samples.metrics[1].get("memsize_of_all"), Some(4194304.0));
        let records = samples.records();
        assert!(matches!(&records[0], Record::Note { text, .. } if text == "ruby 3.1.2"));
        assert_eq!(records.len(), 3);
    }

    #[test]
    fn rejects_what_is_not_a_sample() {
        for bad in ["x meta", "1", "1 ki/nd a=1", "1 sample a=NaN", "1 sample a"] {
            assert_eq!(read(bad).metrics.len(), 0, "{bad}");
        }
    }
}
