//! Runtime samplers: a script that `memgap run` has an interpreter load
//! (Ruby through RUBYOPT, Node through NODE_OPTIONS…), which appends the
//! runtime's own figures to a file after garbage collections and at exit,
//! one sample per line: `<monotonic ns> <kind> <key>=<value>...`. Each
//! runtime's source crate describes its sampler with a [`Runtime`]; the
//! reader here turns any of their files into METRICS records.
//!
//! Not for: arming a command or finding the files (the CLI's run does), nor
//! what the figures mean (the model's owners do).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use memgap_trace::records::{Metrics, Record};

/// One runtime's sampler: its script, how the runtime is told to load it,
/// and how its lines read.
pub struct Runtime {
    /// The METRICS source of its records, and the first word of its files' names.
    pub source: &'static str,
    /// The script's text, and the file name it is written under.
    pub script: &'static str,
    pub script_name: &'static str,
    /// The variable naming the script's output, and its value below the
    /// run's private directory (`%p`: the pid, `%t`: the isolate or thread).
    pub out_env: &'static str,
    pub out_pattern: &'static str,
    /// The variable holding the minimum milliseconds between samples that
    /// no major collection forces.
    pub interval_env: &'static str,
    /// The variable through which the runtime loads the script, and its value
    /// from the user's own value of it and the script's path.
    pub load_env: &'static str,
    pub load_value: fn(existing: Option<&OsStr>, script: &Path) -> OsString,
    /// Words whose values are text, not figures (versions on the `meta` line).
    pub text_keys: &'static [&'static str],
    /// Whether a sample holds everything its kind ends with: a line cut by
    /// SIGKILL keeps its earlier words, which parse.
    pub is_whole: fn(kind: &str, values: &[(String, f64)]) -> bool,
    /// The NOTE naming the runtime's version, from the text words.
    pub note: fn(text: &BTreeMap<String, String>) -> Option<String>,
}

/// What one sampler file holds.
#[derive(Debug, Default, PartialEq)]
pub struct Samples {
    pub metrics: Vec<Metrics>,
    /// The text words, the last value of each (versions).
    pub text: BTreeMap<String, String>,
    /// Lines that did not parse or were not whole.
    pub skipped_lines: usize,
}

impl Runtime {
    /// Parses a sampler file; a line that does not parse is counted, not kept.
    pub fn read(&self, text: &str) -> Samples {
        let mut samples = Samples::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match self.parse_line(line, &mut samples.text) {
                Some(metrics) => samples.metrics.push(metrics),
                None => samples.skipped_lines += 1,
            }
        }
        samples
    }

    fn parse_line(&self, line: &str, text_seen: &mut BTreeMap<String, String>) -> Option<Metrics> {
        let mut words = line.split_ascii_whitespace();
        let monotonic_ns = words.next()?.parse().ok()?;
        let kind = words.next()?;
        if !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let mut values = Vec::new();
        let mut text = Vec::new();
        for word in words {
            let (name, value) = word.split_once('=')?;
            if self.text_keys.contains(&name) {
                text.push((name.to_string(), value.to_string()));
            } else {
                values.push((name.to_string(), value.parse::<f64>().ok().filter(|v| v.is_finite())?));
            }
        }
        if !(self.is_whole)(kind, &values) {
            return None;
        }
        text_seen.extend(text);
        Some(Metrics { monotonic_ns, source: self.source.into(), kind: kind.into(), values })
    }

    /// The records to add to the trace of the process that wrote `files`
    /// (one per isolate or thread): per file, a NOTE with the versions, then
    /// one METRICS per sample.
    pub fn records<'s>(&'s self, files: &'s [Samples]) -> impl Iterator<Item = Record<'static>> + 's {
        files.iter().flat_map(move |samples| {
            let note = samples
                .metrics
                .first()
                .and_then(|first| Some(Record::Note { time: first.monotonic_ns, text: (self.note)(&samples.text)? }));
            note.into_iter().chain(samples.metrics.iter().cloned().map(Record::Metrics))
        })
    }

    /// The pid in the name of one of this runtime's files (`<source>.<pid>[.<more>]`).
    pub fn pid_of_file(&self, name: &str) -> Option<u32> {
        name.strip_prefix(self.source)?.strip_prefix('.')?.split('.').next()?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNTIME: Runtime = Runtime {
        source: "demo",
        script: "",
        script_name: "s",
        out_env: "O",
        out_pattern: "demo.%p.%t",
        interval_env: "I",
        load_env: "L",
        load_value: |_, script| script.as_os_str().to_owned(),
        text_keys: &["version"],
        is_whole: |kind, values| kind == memgap_trace::vocabulary::kind::META || values.last().is_some_and(|(name, _)| name == "end"),
        note: |text| Some(format!("demo {}", text.get("version")?)),
    };

    #[test]
    fn reads_samples_and_skips_what_is_cut_or_malformed() {
        let samples = RUNTIME.read("100 meta version=1.2\n200 gc a=1 end=2\n\n300 exit a=1 en\n400 exit a=5");
        assert_eq!(samples.metrics.len(), 2);
        assert_eq!(samples.skipped_lines, 2);
        assert_eq!(samples.text.get("version").map(String::as_str), Some("1.2"));
        assert_eq!(samples.metrics[1].get("end"), Some(2.0));
        let records: Vec<_> = RUNTIME.records(std::slice::from_ref(&samples)).collect();
        assert!(matches!(&records[0], Record::Note { time: 100, text } if text == "demo 1.2"));
        assert_eq!(records.len(), 3);
    }

    #[test]
    fn rejects_what_is_not_a_sample() {
        for bad in ["x meta", "1", "1 ki/nd end=1", "1 sample end=NaN", "1 sample end", "1 gc end=inf", "1 gc a=1"] {
            assert_eq!(RUNTIME.read(bad).metrics.len(), 0, "{bad}");
        }
    }

    #[test]
    fn a_file_without_versions_gets_no_note() {
        let samples = RUNTIME.read("200 gc end=2");
        assert_eq!(RUNTIME.records(std::slice::from_ref(&samples)).count(), 1);
    }

    #[test]
    fn pids_of_file_names() {
        assert_eq!(RUNTIME.pid_of_file("demo.42.0"), Some(42));
        assert_eq!(RUNTIME.pid_of_file("demo.42"), Some(42));
        assert_eq!(RUNTIME.pid_of_file("demox.42"), None);
        assert_eq!(RUNTIME.pid_of_file("other.42"), None);
        assert_eq!(RUNTIME.pid_of_file("demo.x"), None);
    }
}
