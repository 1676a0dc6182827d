//! What `memgap compare --remedies TRACE` measured of each remedy: the
//! comparison judged remedy by remedy, written beside the trace for its
//! ledger to read (the file and its types are `ledger::measured`).

use crate::ledger::measured::{Measured, Outcome, RemedyMeasurements};

use super::{Comparison, ConfigResult, MEANINGFUL_SAVING, Metric, Range};

/// The remedies of a comparison made with `--remedies` (every configuration
/// but the default, which comes first), judged as `recommend` judges them.
pub fn measurements(comparison: &Comparison) -> RemedyMeasurements {
    let metric = comparison.metric;
    let mut out = RemedyMeasurements { command: comparison.command.clone(), remedies: Vec::new() };
    let Some(base) = comparison.configs.first() else { return out };
    let Some(base_value) = base.metric(metric) else { return out };
    let base_range = base.metric_range(metric).unwrap_or(Range { min: base_value as f64, max: base_value as f64 });
    let noise = (MEANINGFUL_SAVING * base_value as f64).max(base_range.width());
    for config in comparison.configs.iter().skip(1).filter(|c| c.available) {
        out.remedies.push((config.name.clone(), judge(config, metric, base_value, noise)));
    }
    out
}

fn judge(config: &ConfigResult, metric: Metric, base_value: u64, noise: f64) -> Measured {
    let value = config.metric(metric);
    let outcome = match value {
        None => Outcome::Failed,
        Some(_) if config.output_differs || config.exit_differs => Outcome::Differs,
        Some(v) if base_value as f64 - v as f64 > noise => Outcome::Lower,
        Some(v) if v as f64 - base_value as f64 > noise => Outcome::Higher,
        Some(_) => Outcome::WithinNoise,
    };
    Measured { metric: metric.name().to_string(), default_bytes: base_value, bytes: value.unwrap_or(0), runs: config.repeats, outcome }
}

#[cfg(test)]
mod tests {
    use super::super::{ConfigSpec, Options, RssSample, Run, Stdout, compare};
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Three runs holding `steady` bytes, printing `output`.
    fn runs(steady: u64, output: &str) -> Vec<Run> {
        let samples: Vec<RssSample> = (0..100).map(|i| RssSample { seconds: i as f64 / 100.0, rss_bytes: steady }).collect();
        let run = Run {
            samples,
            wall_seconds: 1.0,
            cpu_seconds: 1.0,
            max_rss_bytes: steady,
            stdout: Stdout::Lines(vec![output.to_string()]),
            stdout_hash: output.len() as u64,
            ..Run::default()
        };
        vec![run.clone(), run.clone(), run]
    }

    #[test]
    fn judged_against_the_defaults_noise() {
        let configs = [
            ("default", 100 * MIB, "ok"),
            ("glibc-trim", 20 * MIB, "ok"),
            ("glibc-arena-max", 110 * MIB, "ok"),
            ("glibc-trim-threshold", 98 * MIB, "ok"),
            ("odd", 10 * MIB, "not ok"),
        ];
        let specs = configs
            .iter()
            .map(|(name, _, _)| ConfigSpec {
                name: name.to_string(),
                env: Vec::new(),
                wrapper: Vec::new(),
                package: None,
                available: true,
                note: None,
            })
            .collect();
        let comparison = compare(
            vec!["prog".into()],
            specs,
            configs.iter().map(|&(_, steady, output)| runs(steady, output)).collect(),
            Options::default(),
        );
        let m = measurements(&comparison);
        let outcomes: Vec<(&str, Outcome)> = m.remedies.iter().map(|(id, x)| (id.as_str(), x.outcome)).collect();
        assert_eq!(
            outcomes,
            [
                ("glibc-trim", Outcome::Lower),
                ("glibc-arena-max", Outcome::Higher),
                ("glibc-trim-threshold", Outcome::WithinNoise),
                ("odd", Outcome::Differs)
            ]
        );
        assert_eq!(m.of("glibc-trim").unwrap().saved_bytes(), 80 * MIB);
        assert_eq!(m.of("glibc-arena-max").unwrap().saved_bytes(), 0);
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"within noise\""), "{text}");
        assert_eq!(serde_json::from_str::<RemedyMeasurements>(&text).unwrap(), m);
    }
}
