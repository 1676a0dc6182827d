//! `memgap run --numa`: memory samples of the traced program, gathered by
//! memgap itself (not the agent) with perf_event_open from the program's
//! first instruction ([`memgap_source_numa::launch`]), and the machine's
//! topology; both appended to the trace after the run.

use std::collections::BTreeMap;

pub use memgap_source_numa::launch::{Sampling, prepare};
use memgap_trace::numa::MemorySamples;
use memgap_trace::records::Record;

/// Samples per MEMORY_SAMPLES record (about 1–2 MB encoded).
const SAMPLES_PER_RECORD: usize = 100_000;

/// Appends this machine's topology and (with `--numa`) the samples to the
/// traces of the run: each process's samples to its own trace.
pub fn write(samples: Option<Result<MemorySamples, String>>, traces: &memgap_record::traces::RunTraces, quiet: bool) {
    let top_pid = traces.top_pid;
    let topology = memgap_source_numa::topology::this_machine();
    match traces.append(top_pid, [Record::Topology(topology.to_record())]) {
        Ok(true) => {}
        Ok(false) => eprintln!("memgap: cannot add the NUMA topology: {} is not a trace this run wrote", traces.path(top_pid).display()),
        Err(error) => eprintln!("memgap: cannot add the NUMA topology: {error}"),
    }
    let batch = match samples {
        None => return,
        Some(Err(reason)) => {
            if !quiet {
                eprintln!("memgap: NUMA: no memory samples: {reason}");
            }
            return;
        }
        Some(Ok(batch)) => batch,
    };
    if !quiet {
        match batch.precise_unavailable.as_str() {
            "" => eprintln!("memgap: NUMA: {} memory-access samples ({})", batch.samples.len(), batch.source),
            reason => eprintln!(
                "memgap: NUMA: access sampling unavailable ({reason}); recorded first-touch locality from {} page-fault samples instead",
                batch.samples.len()
            ),
        }
    }
    let mut by_pid: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for sample in &batch.samples {
        by_pid.entry(sample.pid).or_default().push(*sample);
    }
    by_pid.entry(top_pid).or_default();
    for (pid, samples) in by_pid {
        let mut pieces: Vec<&[memgap_trace::numa::MemorySample]> = samples.chunks(SAMPLES_PER_RECORD).collect();
        if pieces.is_empty() {
            pieces.push(&[]);
        }
        let records = pieces.into_iter().enumerate().map(|(i, piece)| {
            Record::MemorySamples(MemorySamples {
                source: batch.source.clone(),
                precise_unavailable: batch.precise_unavailable.clone(),
                period: batch.period,
                start_ns: batch.start_ns,
                end_ns: batch.end_ns,
                // The kernel's count of lost samples is for the whole run: told once, in the top trace.
                lost: if i == 0 && pid == top_pid { batch.lost } else { 0 },
                samples: piece.to_vec(),
            })
        });
        if let Err(error) = traces.append(pid, records) {
            eprintln!("memgap: cannot add NUMA samples to {}: {error}", traces.path(pid).display());
        }
    }
}
