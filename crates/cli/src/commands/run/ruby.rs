//! The Ruby source in `memgap run`: every Ruby process the command starts
//! loads memgap's sampler (RUBYOPT), and after the run each sampler file
//! becomes METRICS records in the trace of the process that wrote it.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use memgap_source_ruby as source;
use memgap_trace::files::{self, PrivateDir};
use memgap_trace::framing;

/// Where this run's sampler and its output live (a private temp directory).
pub struct RubySampler {
    dir: PrivateDir,
}

impl RubySampler {
    /// Writes the sampler and arms `command` with it. `None` (and no change
    /// to the command) when the temp directory cannot be written: Ruby
    /// programs then get the malloc layer only.
    pub fn prepare(command: &mut Command, interval_ms: u64) -> Option<RubySampler> {
        let dir = PrivateDir::new_in(&std::env::temp_dir(), "memgap-ruby-").ok()?;
        let sampler = dir.path().join("sampler.rb");
        files::create_new(&sampler).and_then(|(mut file, _)| file.write_all(source::SAMPLER.as_bytes())).ok()?;
        let mut rubyopt = OsString::from("-r");
        rubyopt.push(&sampler);
        if let Some(existing) = std::env::var_os("RUBYOPT").filter(|v| !v.is_empty()) {
            rubyopt.push(" ");
            rubyopt.push(existing);
        }
        command.env("RUBYOPT", rubyopt).env(source::OUT_ENV, dir.path().join("ruby.%p")).env(source::INTERVAL_ENV, interval_ms.to_string());
        Some(RubySampler { dir })
    }

    /// Appends what each Ruby process recorded to its trace, when that is a
    /// trace of this run (a process not followed has none), and removes the
    /// temp directory.
    pub fn finish(self, traces: &super::traces::RunTraces) {
        for entry in std::fs::read_dir(self.dir.path()).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("ruby.")).and_then(|p| p.parse::<u32>().ok()) else { continue };
            let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
            let samples = source::read(&text);
            if samples.metrics.is_empty() {
                continue;
            }
            if let Some((path, mut file)) = traces.open(pid) {
                let _ = append(&mut file, &path, &samples);
            }
        }
    }
}

/// Appends the samples to the trace, in chunks of at most 1 MiB (a long
/// run has many).
fn append(file: &mut std::fs::File, path: &Path, samples: &source::Samples) -> Result<(), memgap_trace::TraceError> {
    let mut raw = Vec::new();
    for record in samples.records() {
        record.encode(&mut raw);
        if raw.len() >= 1 << 20 {
            framing::append_chunk_to(file, path, &raw)?;
            raw.clear();
        }
    }
    if !raw.is_empty() {
        framing::append_chunk_to(file, path, &raw)?;
    }
    Ok(())
}
