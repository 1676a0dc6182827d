//! NUMA figures of a comparison: per configuration, the share of the
//! sampled memory accesses (or, where the CPU offers no precise memory
//! sampling, first touches) that were on the node of the CPU, and the
//! paper's NUMA access rate, Σ distance × events ÷ seconds — the same
//! arithmetic as `memgap run --numa` ([`crate::numa::access_locality`]),
//! taken in the untraced runs.

use serde::Serialize;

use super::Range;
pub use memgap_types::compare::RunLocality;

use crate::numa::{AccessLocality, DistanceCount};

/// One run's figures, beside its RSS figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RunNuma {
    pub local_fraction: Option<f64>,
    pub rate_per_second: Option<f64>,
    pub samples: u64,
}

impl RunNuma {
    pub fn of(locality: &AccessLocality) -> RunNuma {
        RunNuma { local_fraction: locality.local_fraction, rate_per_second: locality.weighted_rate_per_second, samples: locality.samples }
    }
}

/// A configuration's NUMA figures over its runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigNuma {
    /// `access` (precise memory-access samples) or `first-touch` (page
    /// faults: the CPU that first touched each page × the page's node).
    pub basis: &'static str,
    /// The perf source: ibs-op, pebs-mem-loads or page-faults.
    pub source: String,
    /// Median over the runs of the share of events on the CPU's own node.
    pub local_fraction: Option<f64>,
    pub local_fraction_spread: Option<Range>,
    /// Median over the runs of Σ distance × events ÷ seconds.
    pub rate_per_second: Option<f64>,
    pub rate_spread: Option<Range>,
    /// Over all its runs.
    pub samples: u64,
    pub lost: u64,
    /// Samples whose page had gone before its node was asked.
    pub unresolved: u64,
    /// CPU's node × page's node, events summed over the runs.
    pub matrix: Vec<Vec<u64>>,
    pub by_distance: Vec<DistanceCount>,
}

/// The comparison's NUMA sampling as a whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComparisonNuma {
    pub nodes: usize,
    /// `access` or `first-touch`; None when no run was sampled.
    pub basis: Option<&'static str>,
    pub source: Option<String>,
    /// Why the figures are first touches, not accesses.
    pub access_unavailable_reason: Option<String>,
    /// Why no run was sampled at all (perf_event_open refused).
    pub unavailable_reason: Option<String>,
    /// One node: every page is on the node of every CPU.
    pub trivially_local: bool,
}

/// The NUMA figures of one configuration's runs (None when none was sampled).
pub fn reduce(runs: &[&RunLocality]) -> Option<ConfigNuma> {
    let first = runs.first()?;
    let values = |pick: fn(&AccessLocality) -> Option<f64>| -> Vec<f64> { runs.iter().filter_map(|r| pick(&r.locality)).collect() };
    let fractions = values(|l| l.local_fraction);
    let rates = values(|l| l.weighted_rate_per_second);
    let nodes = first.locality.matrix.len();
    let mut matrix = vec![vec![0u64; nodes]; nodes];
    let mut by_distance: Vec<DistanceCount> = Vec::new();
    for run in runs {
        for (row, sums) in run.locality.matrix.iter().zip(matrix.iter_mut()) {
            for (events, sum) in row.iter().zip(sums.iter_mut()) {
                *sum = sum.saturating_add(*events);
            }
        }
        for d in &run.locality.by_distance {
            match by_distance.iter_mut().find(|c| c.distance == d.distance) {
                Some(count) => count.events = count.events.saturating_add(d.events),
                None => by_distance.push(*d),
            }
        }
    }
    by_distance.sort_by_key(|d| d.distance);
    Some(ConfigNuma {
        basis: first.locality.kind,
        source: first.locality.source.clone(),
        local_fraction: (!fractions.is_empty()).then(|| super::median(fractions.clone())),
        local_fraction_spread: Range::of(fractions.into_iter()),
        rate_per_second: (!rates.is_empty()).then(|| super::median(rates.clone())),
        rate_spread: Range::of(rates.into_iter()),
        samples: runs.iter().map(|r| r.locality.samples).sum(),
        lost: runs.iter().map(|r| r.locality.lost).sum(),
        unresolved: runs.iter().map(|r| r.locality.unresolved).sum(),
        matrix,
        by_distance,
    })
}

/// The comparison's NUMA summary and its notes, when its runs were sampled
/// (`nodes` is Some).
pub fn summarize(nodes: usize, sampled: &[&RunLocality], refusals: &[&str]) -> (ComparisonNuma, Vec<String>) {
    let mut notes = Vec::new();
    let first = sampled.first();
    let access_unavailable_reason = first.map(|r| r.access_unavailable_reason.clone()).filter(|r| !r.is_empty());
    let summary = ComparisonNuma {
        nodes,
        basis: first.map(|r| r.locality.kind),
        source: first.map(|r| r.locality.source.clone()),
        access_unavailable_reason: access_unavailable_reason.clone(),
        unavailable_reason: first.is_none().then(|| refusals.first().map_or("no run was sampled".to_string(), |r| r.to_string())),
        trivially_local: nodes <= 1,
    };
    match (&summary.unavailable_reason, &access_unavailable_reason) {
        (Some(reason), _) => notes.push(format!("no NUMA figures: {reason}")),
        (None, Some(reason)) => notes.push(format!(
            "NUMA figures are first-touch locality (page-fault samples: the CPU that first touched each page × the node it landed on), not accesses: {reason}"
        )),
        (None, None) => {}
    }
    if summary.unavailable_reason.is_none() && !refusals.is_empty() {
        notes.push(format!("{} runs were not sampled: {}", refusals.len(), refusals[0]));
    }
    if summary.trivially_local && summary.unavailable_reason.is_none() {
        notes.push(
            "this machine has one NUMA node: every page is on the node of every CPU, so each configuration's NUMA local fraction is 1 and its rate is 10 × events ÷ s — trivially local; the NUMA configurations tell apart only on a machine with several nodes".to_string(),
        );
    }
    (summary, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(matrix: Vec<Vec<u64>>, seconds: f64) -> RunLocality {
        let (mut local, mut total, mut near, mut far) = (0, 0, 0, 0);
        for (i, row) in matrix.iter().enumerate() {
            for (j, &events) in row.iter().enumerate() {
                total += events;
                if i == j {
                    local += events;
                    near += events;
                } else {
                    far += events;
                }
            }
        }
        let by_distance = vec![DistanceCount { distance: 10, events: near }, DistanceCount { distance: 20, events: far }]
            .into_iter()
            .filter(|d| d.events > 0)
            .collect::<Vec<_>>();
        let locality = AccessLocality {
            kind: "first-touch",
            source: "page-faults".into(),
            weighted_rate_per_second: crate::numa::numa_access_rate(&by_distance, seconds),
            by_distance,
            local_fraction: (total > 0).then(|| local as f64 / total as f64),
            matrix,
            seconds,
            samples: total,
            lost: 1,
            unresolved: 2,
        };
        RunLocality { locality, access_unavailable_reason: "no PMU".into() }
    }

    #[test]
    fn medians_over_runs_and_events_summed() {
        let runs =
            [run(vec![vec![100, 0], vec![0, 0]], 1.0), run(vec![vec![50, 50], vec![0, 0]], 1.0), run(vec![vec![60, 40], vec![0, 0]], 2.0)];
        let numa = reduce(&runs.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(numa.basis, "first-touch");
        assert_eq!(numa.local_fraction, Some(0.6));
        assert_eq!(numa.local_fraction_spread, Some(Range { min: 0.5, max: 1.0 }));
        // 1000, 1500 and (600 + 800) / 2 = 700 per second.
        assert_eq!(numa.rate_per_second, Some(1000.0));
        assert_eq!(numa.matrix, vec![vec![210, 90], vec![0, 0]]);
        assert_eq!(numa.by_distance, vec![DistanceCount { distance: 10, events: 210 }, DistanceCount { distance: 20, events: 90 }]);
        assert_eq!((numa.samples, numa.lost, numa.unresolved), (300, 3, 6));
        assert_eq!(reduce(&[]), None);
    }

    #[test]
    fn one_node_is_trivially_local_and_refusals_are_told() {
        let one = run(vec![vec![10]], 1.0);
        let (summary, notes) = summarize(1, &[&one], &[]);
        assert!(summary.trivially_local && summary.basis == Some("first-touch"));
        assert!(notes.iter().any(|n| n.contains("first-touch locality") && n.contains("no PMU")), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("one NUMA node") && n.contains("trivially local")), "{notes:?}");
        let (summary, notes) = summarize(2, &[], &["page-fault sampling refused too: EACCES"]);
        assert_eq!(summary.unavailable_reason.as_deref(), Some("page-fault sampling refused too: EACCES"));
        assert_eq!(notes, ["no NUMA figures: page-fault sampling refused too: EACCES"]);
    }
}
