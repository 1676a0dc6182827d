//! The Node.js source in `memgap run`: every Node process the command starts
//! loads memgap's sampler (NODE_OPTIONS=--require, after the user's own
//! options), each of its isolates writes a file, and after the run each file
//! becomes METRICS records in the trace of the process that wrote it.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use memgap_source_node as source;
use memgap_trace::files::{self, PrivateDir};
use memgap_trace::framing;

/// Where this run's sampler and its output live (a private temp directory).
pub struct NodeSampler {
    dir: PrivateDir,
}

impl NodeSampler {
    /// Writes the sampler and arms `command` with it. `None` (and no change
    /// to the command) when the temp directory cannot be written: Node
    /// programs then get the malloc layer only.
    pub fn prepare(command: &mut Command, interval_ms: u64) -> Option<NodeSampler> {
        let dir = PrivateDir::new_in(&std::env::temp_dir(), "memgap-node-").ok()?;
        let sampler = dir.path().join("sampler.js");
        files::create_new(&sampler).and_then(|(mut file, _)| file.write_all(source::SAMPLER.as_bytes())).ok()?;
        let options = node_options(std::env::var_os("NODE_OPTIONS").as_deref(), &sampler);
        command.env("NODE_OPTIONS", options).env(source::OUT_ENV, dir.path().join("node.%p.%t")).env(source::INTERVAL_ENV, interval_ms.to_string());
        Some(NodeSampler { dir })
    }

    /// Appends what each Node process recorded (every isolate's file) to its
    /// trace, when that is a trace of this run (a process not followed has
    /// none), and removes the temp directory.
    pub fn finish(self, traces: &super::traces::RunTraces) {
        let mut by_pid: std::collections::BTreeMap<u32, Vec<source::Samples>> = Default::default();
        for entry in std::fs::read_dir(self.dir.path()).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("node.")).and_then(|rest| rest.split('.').next()).and_then(|p| p.parse::<u32>().ok()) else { continue };
            let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
            let samples = source::read(&text);
            if !samples.metrics.is_empty() {
                by_pid.entry(pid).or_default().push(samples);
            }
        }
        for (pid, isolates) in by_pid {
            if let Some((path, mut file)) = traces.open(pid) {
                let _ = append(&mut file, &path, &isolates);
            }
        }
    }
}

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

/// Appends the isolates' samples to the trace, in chunks of at most 1 MiB
/// (a long run has many).
fn append(file: &mut std::fs::File, path: &Path, isolates: &[source::Samples]) -> Result<(), memgap_trace::TraceError> {
    let mut raw = Vec::new();
    for record in isolates.iter().flat_map(source::Samples::records) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_comes_after_the_users_options() {
        let path = Path::new("/tmp/memgap-node-x/sampler.js");
        assert_eq!(node_options(None, path), OsString::from("--require \"/tmp/memgap-node-x/sampler.js\""));
        assert_eq!(node_options(Some(OsStr::new("  ")), path), OsString::from("--require \"/tmp/memgap-node-x/sampler.js\""));
        assert_eq!(node_options(Some(OsStr::new("--max-old-space-size=64")), path), OsString::from("--max-old-space-size=64 --require \"/tmp/memgap-node-x/sampler.js\""));
        assert_eq!(node_options(None, Path::new("/tmp/a \"b\\c/sampler.js")), OsString::from("--require \"/tmp/a \\\"b\\\\c/sampler.js\""));
    }
}
