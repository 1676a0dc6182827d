//! What `memgap compare --remedies TRACE` measured of each remedy, kept
//! beside the trace (`<stem>.remedies.json`) so the trace's ledger ranks its
//! remedies by what they did, not only by what they were expected to do,
//! and its verdict never recommends one that measured worse. The
//! comparison that makes the file is `compare::measured`.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Remedy;

/// Larger files beside a trace are not ours.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// How a remedy's run compared with the program as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Lower by more than the default's own spread and 5 %.
    Lower,
    #[serde(rename = "within noise")]
    WithinNoise,
    /// Higher by more than the default's own spread and 5 %.
    Higher,
    /// Its output or exit status differs from the default's.
    Differs,
    /// It did not run, or gave no figure.
    Failed,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Lower => "lower",
            Outcome::WithinNoise => "within noise",
            Outcome::Higher => "higher",
            Outcome::Differs => "differs",
            Outcome::Failed => "failed",
        }
    }
}

/// One remedy as measured: the median of the comparison's metric under it
/// and without it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub metric: String,
    pub default_bytes: u64,
    pub bytes: u64,
    pub runs: usize,
    pub outcome: Outcome,
}

impl Measured {
    /// Bytes it saved (0 when it did not lower the metric).
    pub fn saved_bytes(&self) -> u64 {
        self.default_bytes.saturating_sub(self.bytes)
    }
}

/// The file `memgap compare --remedies` writes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RemedyMeasurements {
    pub command: Vec<String>,
    /// Remedy id → what it did.
    pub remedies: Vec<(String, Measured)>,
}

impl RemedyMeasurements {
    pub fn of(&self, id: &str) -> Option<&Measured> {
        self.remedies.iter().find(|(name, _)| name == id).map(|(_, measured)| measured)
    }
}

/// `<trace stem>.remedies.json` beside the trace.
pub fn path_beside(trace: &Path) -> PathBuf {
    let stem = trace.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "memgap".into());
    trace.with_file_name(format!("{stem}.remedies.json"))
}

/// The measurements kept beside `trace`, if a readable file of ours is there.
pub fn read_beside(trace: &Path) -> Option<RemedyMeasurements> {
    memgap_trace::files::note_consulted(&path_beside(trace));
    let file = memgap_trace::files::open_regular(&path_beside(trace)).ok()?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Puts what was measured on each remedy and orders them: those measured
/// lower first (most saved first), then those not measured (in their
/// expected order), then those that measured no gain.
pub fn rank(remedies: &mut [Remedy], measurements: &RemedyMeasurements) {
    for remedy in remedies.iter_mut() {
        remedy.measured = measurements.of(remedy.id).cloned();
    }
    let group = |r: &Remedy| match &r.measured {
        Some(m) if m.outcome == Outcome::Lower => 0,
        None => 1,
        Some(_) => 2,
    };
    remedies.sort_by(|a, b| {
        group(a).cmp(&group(b)).then_with(|| match (&a.measured, &b.measured) {
            (Some(x), Some(y)) if group(a) == 0 => y.saved_bytes().cmp(&x.saved_bytes()),
            _ => std::cmp::Ordering::Equal,
        })
    });
}

/// Whether the verdict may recommend it: not measured, or measured lower.
pub fn recommendable(remedy: &Remedy) -> bool {
    remedy.measured.as_ref().is_none_or(|m| m.outcome == Outcome::Lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn named_after_the_trace() {
        assert_eq!(path_beside(Path::new("/tmp/x/t.mgt")), Path::new("/tmp/x/t.remedies.json"));
        assert_eq!(path_beside(Path::new("run.1234.mgt")), Path::new("run.1234.remedies.json"));
    }

    #[test]
    fn remedies_that_measured_worse_rank_last() {
        let mut remedies = vec![
            Remedy::new("glibc-arena-max", "glibc", "fewer arenas", &[("MALLOC_ARENA_MAX", "2")], 120 * MIB),
            Remedy::new("glibc-trim", "glibc", "trim every second", &[("LD_PRELOAD", "libmemgap_trim.so")], 110 * MIB),
            Remedy::new("glibc-trim-threshold", "glibc", "fixed thresholds", &[("GLIBC_TUNABLES", "x")], 10 * MIB),
            Remedy::new("ruby-compact", "ruby", "GC.compact", &[], 5 * MIB),
        ];
        let measured =
            |bytes: u64, outcome: Outcome| Measured { metric: "steady".into(), default_bytes: 180 * MIB, bytes, runs: 3, outcome };
        let measurements = RemedyMeasurements {
            command: vec!["prog".into()],
            remedies: vec![
                ("glibc-arena-max".into(), measured(190 * MIB, Outcome::Higher)),
                ("glibc-trim".into(), measured(80 * MIB, Outcome::Lower)),
                ("glibc-trim-threshold".into(), measured(70 * MIB, Outcome::Lower)),
            ],
        };
        rank(&mut remedies, &measurements);
        let order: Vec<&str> = remedies.iter().map(|r| r.id).collect();
        assert_eq!(order, ["glibc-trim-threshold", "glibc-trim", "ruby-compact", "glibc-arena-max"]);
        assert!(!recommendable(&remedies[3]) && recommendable(&remedies[2]));
    }
}
