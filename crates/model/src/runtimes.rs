//! Runtime layers over the ledger. A runtime's own figures (METRICS records)
//! are appended to the trace after the process ends, so they are gathered
//! during the replay and laid over each snapshot's ledger afterwards.

use memgap_trace::records::{Metrics, Process};

use crate::ledger::Ledger;
use crate::ruby;

#[derive(Debug, Default)]
pub struct RuntimeFigures {
    metrics: Vec<Metrics>,
    ruby_version: Option<String>,
    start_monotonic_ns: Option<u64>,
}

impl RuntimeFigures {
    pub fn process(&mut self, process: &Process) {
        self.start_monotonic_ns.get_or_insert(process.start_monotonic_ns);
    }

    pub fn metrics(&mut self, metrics: &Metrics) {
        self.metrics.push(metrics.clone());
    }

    pub fn note(&mut self, text: &str) {
        if let Some(version) = text.strip_prefix("ruby ") {
            self.ruby_version = Some(version.to_string());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.metrics.is_empty()
    }

    /// Adds the runtime layers to a snapshot's ledger taken at `monotonic_ns`.
    pub fn annotate(&self, ledger: &mut Ledger, monotonic_ns: u64) {
        let ruby: Vec<&Metrics> = self.metrics.iter().filter(|m| m.source == ruby::SOURCE).collect();
        if !ruby.is_empty() {
            let version = self.ruby_version.as_deref().unwrap_or("");
            if let Some(layer) = ruby::layer_at(&ruby, version, self.start_monotonic_ns.unwrap_or(0), monotonic_ns) {
                ruby::attach(ledger, layer);
            }
        }
    }
}
