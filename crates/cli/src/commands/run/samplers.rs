//! The runtime samplers in `memgap run`: every Ruby or Node process the
//! command starts loads its runtime's sampler (named in RUBYOPT or
//! NODE_OPTIONS, beside the user's own options), each writes files into a
//! private temp directory, and after the run each file becomes METRICS
//! records in the trace of the process that wrote it.

use std::io::Write;
use std::process::Command;

use memgap_source_sampler::Runtime;
use memgap_trace::files::{self, PrivateDir};

/// The runtimes whose processes get a sampler.
const RUNTIMES: [&Runtime; 2] = [&memgap_source_ruby::RUNTIME, &memgap_source_node::RUNTIME];

/// One runtime's sampler for this run, and where its output lives.
pub struct Sampler {
    runtime: &'static Runtime,
    dir: PrivateDir,
}

/// Writes every runtime's sampler and arms `command` with them. A runtime
/// whose temp directory cannot be written is left out (and its variables
/// untouched): its programs then get the malloc layer only.
pub fn prepare(command: &mut Command, interval_ms: u64) -> Vec<Sampler> {
    RUNTIMES.into_iter().filter_map(|runtime| Sampler::prepare(runtime, command, interval_ms)).collect()
}

/// Appends what each sampled process recorded to its trace (see [`Sampler::finish`]).
pub fn finish(samplers: Vec<Sampler>, traces: &memgap_record::traces::RunTraces) {
    for sampler in samplers {
        sampler.finish(traces);
    }
}

impl Sampler {
    fn prepare(runtime: &'static Runtime, command: &mut Command, interval_ms: u64) -> Option<Sampler> {
        let dir = PrivateDir::new_in(&std::env::temp_dir(), &format!("memgap-{}-", runtime.source)).ok()?;
        let script = dir.path().join(runtime.script_name);
        files::create_new(&script).and_then(|(mut file, _)| file.write_all(runtime.script.as_bytes())).ok()?;
        let load = (runtime.load_value)(std::env::var_os(runtime.load_env).as_deref(), &script);
        command
            .env(runtime.load_env, load)
            .env(runtime.out_env, dir.path().join(runtime.out_pattern))
            .env(runtime.interval_env, interval_ms.to_string());
        Some(Sampler { runtime, dir })
    }

    /// Appends what each process recorded (all its files: one per isolate
    /// or thread) to its trace, when that is a trace of this run (a process
    /// not followed has none); the temp directory goes with `self`.
    fn finish(self, traces: &memgap_record::traces::RunTraces) {
        let mut by_pid: std::collections::BTreeMap<u32, Vec<memgap_source_sampler::Samples>> = Default::default();
        for entry in std::fs::read_dir(self.dir.path()).into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| self.runtime.pid_of_file(name)) else { continue };
            let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
            let samples = self.runtime.read(&text);
            if !samples.metrics.is_empty() {
                by_pid.entry(pid).or_default().push(samples);
            }
        }
        for (pid, files) in by_pid {
            if let Err(error) = traces.append(pid, self.runtime.records(&files)) {
                eprintln!("memgap: cannot add {}'s samples to {}: {error}", self.runtime.source, traces.path(pid).display());
            }
        }
    }
}
