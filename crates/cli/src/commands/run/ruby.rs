//! The Ruby source in `memgap run`: every Ruby process the command starts
//! loads memgap's sampler (RUBYOPT), and after the run each sampler file
//! becomes METRICS records in the trace of the process that wrote it.

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use memgap_source_ruby as source;
use memgap_trace::framing;

/// Where this run's sampler and its output live (a private temp directory).
pub struct RubySampler {
    dir: PathBuf,
}

impl RubySampler {
    /// Writes the sampler and arms `command` with it. `None` (and no change
    /// to the command) when the temp directory cannot be written: Ruby
    /// programs then get the malloc layer only.
    pub fn prepare(command: &mut Command, run_id: u64, interval_ms: u64) -> Option<RubySampler> {
        let dir = std::env::temp_dir().join(format!("memgap-{run_id:016x}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).ok()?;
        let sampler = dir.join("sampler.rb");
        if std::fs::write(&sampler, source::SAMPLER).is_err() {
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        }
        let mut rubyopt = OsString::from("-r");
        rubyopt.push(&sampler);
        if let Some(existing) = std::env::var_os("RUBYOPT").filter(|v| !v.is_empty()) {
            rubyopt.push(" ");
            rubyopt.push(existing);
        }
        command.env("RUBYOPT", rubyopt).env(source::OUT_ENV, dir.join("ruby.%p")).env(source::INTERVAL_ENV, interval_ms.to_string());
        Some(RubySampler { dir })
    }

    /// Appends what each Ruby process recorded to its trace (`trace_of(pid)`)
    /// and removes the temp directory. A process without a trace (not
    /// followed) is skipped.
    pub fn finish(self, trace_of: impl Fn(u32) -> PathBuf) {
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("ruby.")).and_then(|p| p.parse::<u32>().ok()) else { continue };
            let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
            let samples = source::read(&text);
            if samples.metrics.is_empty() {
                continue;
            }
            let trace = trace_of(pid);
            if trace.is_file() {
                let _ = append(&trace, &samples);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Appends the samples to the trace, in chunks of at most 1 MiB (a long
/// run has many).
fn append(trace: &Path, samples: &source::Samples) -> Result<(), memgap_trace::TraceError> {
    let mut raw = Vec::new();
    for record in samples.records() {
        record.encode(&mut raw);
        if raw.len() >= 1 << 20 {
            framing::append_chunk(trace, &raw)?;
            raw.clear();
        }
    }
    if !raw.is_empty() {
        framing::append_chunk(trace, &raw)?;
    }
    Ok(())
}
