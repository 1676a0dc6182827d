//! `memgap compare`: the same command run under several allocator
//! configurations, reduced to medians, ratios to glibc's default and a
//! recommendation that weighs memory against time.
//!
//! The runs are measured from outside (crate `memgap-measure`); this module
//! only computes, so every rule here is testable without running anything.

use serde::Serialize;

/// Samples kept per configuration for an RSS-over-time chart.
pub const MAX_CHART_SAMPLES: usize = 200;

/// A configuration may cost this much more wall or CPU time than the
/// default and still be recommended without a trade-off.
const TIME_TOLERANCE: f64 = 0.10;
/// ...plus this many seconds, so the noise of a run of a few milliseconds
/// does not disqualify anything.
const TIME_SLACK_SECONDS: f64 = 0.01;
/// Fewer samples than this in a run's steady window make its steady RSS a guess.
const MIN_STEADY_SAMPLES: usize = 3;
/// A saving below this share of the default's steady RSS is noise.
const MEANINGFUL_SAVING: f64 = 0.05;

/// The process tree's RSS at one instant of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RssSample {
    pub seconds: f64,
    pub rss_bytes: u64,
}

/// What was measured of one run of the command.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub samples: Vec<RssSample>,
    pub wall_seconds: f64,
    /// User + system time of the command and the children it reaped.
    pub cpu_seconds: f64,
    /// The kernel's high-water mark (ru_maxrss) of the largest process of the
    /// tree: exact where sampling could miss a short peak.
    pub max_rss_bytes: u64,
    /// The exit status, 128+N when signal N killed the command.
    pub exit_code: i32,
    pub stdout_hash: u64,
    pub stdout_bytes: u64,
    /// The end of what the command wrote to stderr, to explain a failure.
    pub stderr_tail: String,
}

/// One configuration: the environment it adds to the command's.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigSpec {
    pub name: String,
    /// In the order set; shown as a JSON object.
    #[serde(serialize_with = "env_as_object")]
    pub env: Vec<(String, String)>,
    /// The Debian package that provides its allocator.
    pub package: Option<String>,
    pub available: bool,
    /// Why it is not available (a missing library), or a caveat.
    pub note: Option<String>,
}

/// One run reduced to the figures that are compared.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub peak_rss_bytes: u64,
    pub steady_rss_bytes: u64,
    /// Samples the steady RSS is the mean of.
    pub steady_samples: usize,
    pub wall_seconds: f64,
    pub cpu_seconds: f64,
    pub exit_code: i32,
    pub stdout_hash: String,
}

/// A configuration's medians over its runs, and how it differs from the default.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigResult {
    pub name: String,
    pub available: bool,
    #[serde(serialize_with = "env_as_object")]
    pub env: Vec<(String, String)>,
    pub package: Option<String>,
    pub note: Option<String>,
    /// Runs made (0 when not available).
    pub repeats: usize,
    pub peak_rss_bytes: Option<u64>,
    pub steady_rss_bytes: Option<u64>,
    pub wall_seconds: Option<f64>,
    pub cpu_seconds: Option<f64>,
    /// The most common exit status of its runs.
    pub exit_code: Option<i32>,
    pub peak_rss_ratio: Option<f64>,
    pub steady_rss_ratio: Option<f64>,
    pub wall_ratio: Option<f64>,
    pub cpu_ratio: Option<f64>,
    /// Some run printed something else than the default's first run.
    pub output_differs: bool,
    /// Some run exited otherwise than the default's first run.
    pub exit_differs: bool,
    /// Its own runs printed different things (a nondeterministic command).
    pub output_varies: bool,
    pub stdout_hash: Option<String>,
    pub stdout_bytes: Option<u64>,
    /// RSS over time of the run with the median steady RSS, at most
    /// [`MAX_CHART_SAMPLES`] points.
    pub samples: Vec<RssSample>,
    pub runs: Vec<RunFigures>,
    /// The end of stderr of its first failed run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_stderr: Option<String>,
}

/// How steady RSS is taken from a run's samples.
#[derive(Debug, Clone, Copy)]
pub struct SteadyWindow {
    /// From this many seconds after start; `None`: the last half of the run.
    pub from_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub command: Vec<String>,
    /// What the command reads on stdin.
    pub stdin: &'static str,
    pub repeats: usize,
    pub interval_ms: u64,
    pub steady_from_seconds: Option<f64>,
    /// The configuration ratios are taken against.
    pub baseline: String,
    pub configs: Vec<ConfigResult>,
    pub output_differs: bool,
    pub exit_differs: bool,
    pub recommendation: String,
    /// The configuration the recommendation names, if it names one to use.
    pub recommended: Option<String>,
    pub notes: Vec<String>,
}

fn env_as_object<S: serde::Serializer>(env: &[(String, String)], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(env.iter().map(|(name, value)| (name, value)))
}

/// Reduces the runs of each configuration (`runs[i]` belongs to
/// `specs[i]`; the first is the baseline) to a comparison.
pub fn compare(command: Vec<String>, specs: Vec<ConfigSpec>, runs: Vec<Vec<Run>>, window: SteadyWindow, interval_ms: u64) -> Comparison {
    assert_eq!(specs.len(), runs.len(), "one list of runs per configuration");
    let repeats = runs.iter().map(Vec::len).max().unwrap_or(0);
    let mut configs: Vec<ConfigResult> = specs.into_iter().zip(&runs).map(|(spec, runs)| reduce(spec, runs, window)).collect();
    if let Some(base) = configs.first().filter(|base| !base.runs.is_empty()).cloned() {
        for config in &mut configs {
            relate_to_baseline(config, &base);
        }
    }
    let (recommendation, recommended) = recommend(&configs);
    let mut notes = Vec::new();
    if configs.iter().any(|c| c.output_varies) {
        notes.push("stdout varies between runs of the same configuration: the command's output is not deterministic, so differences between configurations may mean nothing".to_string());
    }
    let thinly_sampled = configs.iter().flat_map(|c| &c.runs).filter(|r| r.steady_samples < MIN_STEADY_SAMPLES).count();
    if thinly_sampled > 0 {
        notes.push(format!(
            "{thinly_sampled} runs had fewer than {MIN_STEADY_SAMPLES} RSS samples in the steady window (a short run, or --steady-from past its end): their steady RSS is their last sample, or their peak; a smaller --interval-ms helps"
        ));
    }
    Comparison {
        command,
        stdin: "/dev/null",
        repeats,
        interval_ms,
        steady_from_seconds: window.from_seconds,
        baseline: configs.first().map(|c| c.name.clone()).unwrap_or_default(),
        output_differs: configs.iter().any(|c| c.output_differs),
        exit_differs: configs.iter().any(|c| c.exit_differs),
        configs,
        recommendation,
        recommended,
        notes,
    }
}

fn reduce(spec: ConfigSpec, runs: &[Run], window: SteadyWindow) -> ConfigResult {
    let figures: Vec<RunFigures> = runs.iter().map(|run| figures(run, window)).collect();
    let median_of = |value: fn(&RunFigures) -> f64| (!figures.is_empty()).then(|| median(figures.iter().map(value).collect()));
    let steady = median_of(|f| f.steady_rss_bytes as f64);
    let chart_run = steady.and_then(|target| {
        runs.iter().zip(&figures).min_by(|a, b| (a.1.steady_rss_bytes as f64 - target).abs().total_cmp(&(b.1.steady_rss_bytes as f64 - target).abs()))
    });
    let first_failure = runs.iter().find(|r| r.exit_code != 0 && !r.stderr_tail.is_empty());
    ConfigResult {
        repeats: runs.len(),
        peak_rss_bytes: median_of(|f| f.peak_rss_bytes as f64).map(|v| v.round() as u64),
        steady_rss_bytes: steady.map(|v| v.round() as u64),
        wall_seconds: median_of(|f| f.wall_seconds),
        cpu_seconds: median_of(|f| f.cpu_seconds),
        exit_code: most_common(&figures.iter().map(|f| f.exit_code).collect::<Vec<_>>()),
        peak_rss_ratio: None,
        steady_rss_ratio: None,
        wall_ratio: None,
        cpu_ratio: None,
        output_differs: false,
        exit_differs: false,
        output_varies: figures.windows(2).any(|pair| pair[0].stdout_hash != pair[1].stdout_hash),
        stdout_hash: figures.first().map(|f| f.stdout_hash.clone()),
        stdout_bytes: runs.first().map(|r| r.stdout_bytes),
        samples: chart_run.map(|(run, _)| downsample(&run.samples, MAX_CHART_SAMPLES)).unwrap_or_default(),
        runs: figures,
        failure_stderr: first_failure.map(|r| r.stderr_tail.clone()),
        name: spec.name,
        available: spec.available,
        env: spec.env,
        package: spec.package,
        note: spec.note,
    }
}

/// Ratios to the baseline's medians; output and exit status against its first run.
fn relate_to_baseline(config: &mut ConfigResult, base: &ConfigResult) {
    let ratio = |value: Option<f64>, base: Option<f64>| match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    };
    let as_f64 = |v: Option<u64>| v.map(|v| v as f64);
    config.peak_rss_ratio = ratio(as_f64(config.peak_rss_bytes), as_f64(base.peak_rss_bytes));
    config.steady_rss_ratio = ratio(as_f64(config.steady_rss_bytes), as_f64(base.steady_rss_bytes));
    config.wall_ratio = ratio(config.wall_seconds, base.wall_seconds);
    config.cpu_ratio = ratio(config.cpu_seconds, base.cpu_seconds);
    let first = &base.runs[0];
    config.output_differs = config.runs.iter().any(|r| r.stdout_hash != first.stdout_hash);
    config.exit_differs = config.runs.iter().any(|r| r.exit_code != first.exit_code);
}

/// Peak and steady RSS of one run. Peak also counts the kernel's
/// high-water mark, which sees peaks between two samples. A run with no
/// sample in the steady window gets its last sample, or its peak.
pub fn figures(run: &Run, window: SteadyWindow) -> RunFigures {
    let sampled_peak = run.samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    let peak_rss_bytes = sampled_peak.max(run.max_rss_bytes);
    let (steady, steady_samples) = steady_rss(&run.samples, run.wall_seconds, window);
    let last_sample = run.samples.last().map(|s| s.rss_bytes);
    RunFigures {
        peak_rss_bytes,
        steady_rss_bytes: steady.or(last_sample).unwrap_or(peak_rss_bytes),
        steady_samples,
        wall_seconds: run.wall_seconds,
        cpu_seconds: run.cpu_seconds,
        exit_code: run.exit_code,
        stdout_hash: format!("{:016x}", run.stdout_hash),
    }
}

/// The mean of the samples in the steady window (`None` when it holds
/// none), and how many it holds.
pub fn steady_rss(samples: &[RssSample], wall_seconds: f64, window: SteadyWindow) -> (Option<u64>, usize) {
    let from = window.from_seconds.unwrap_or(wall_seconds / 2.0);
    let in_window: Vec<u64> = samples.iter().filter(|s| s.seconds >= from).map(|s| s.rss_bytes).collect();
    let total: u128 = in_window.iter().map(|&v| u128::from(v)).sum();
    let mean = (!in_window.is_empty()).then(|| (total / in_window.len() as u128) as u64);
    (mean, in_window.len())
}

/// At most `limit` samples: each the highest of a run of consecutive ones,
/// so a chart still shows the peaks.
pub fn downsample(samples: &[RssSample], limit: usize) -> Vec<RssSample> {
    if samples.len() <= limit || limit == 0 {
        return samples.to_vec();
    }
    let per_point = samples.len().div_ceil(limit);
    samples
        .chunks(per_point)
        .map(|chunk| RssSample { seconds: chunk[0].seconds, rss_bytes: chunk.iter().map(|s| s.rss_bytes).max().unwrap_or(0) })
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) { (values[middle - 1] + values[middle]) / 2.0 } else { values[middle] }
}

/// The most frequent value; the first seen among equals.
fn most_common(values: &[i32]) -> Option<i32> {
    let mut best: Option<(i32, usize)> = None;
    for &value in values {
        let count = values.iter().filter(|&&other| other == value).count();
        if best.is_none_or(|(_, best_count)| count > best_count) {
            best = Some((value, count));
        }
    }
    best.map(|(value, _)| value)
}

/// The configuration with the lowest steady RSS among those that behave like
/// the default (same output and exit status) and cost at most +10 % time;
/// otherwise what the memory would cost in time.
pub fn recommend(configs: &[ConfigResult]) -> (String, Option<String>) {
    let Some(base) = configs.first().filter(|c| c.steady_rss_bytes.is_some()) else {
        return ("No recommendation: the default configuration did not run.".to_string(), None);
    };
    let comparable: Vec<&ConfigResult> = configs.iter().filter(|c| c.steady_rss_bytes.is_some() && !c.output_differs && !c.exit_differs).collect();
    let excluded: Vec<&str> = configs.iter().filter(|c| c.steady_rss_bytes.is_some() && (c.output_differs || c.exit_differs)).map(|c| c.name.as_str()).collect();
    let steady = |c: &ConfigResult| c.steady_rss_bytes.unwrap_or(u64::MAX);
    let saves = |c: &ConfigResult| (steady(c) as f64) < (1.0 - MEANINGFUL_SAVING) * steady(base) as f64;
    let fast_enough = |c: &ConfigResult| within_tolerance(c.wall_seconds, base.wall_seconds) && within_tolerance(c.cpu_seconds, base.cpu_seconds);

    let best_fast = comparable.iter().filter(|c| fast_enough(c) && saves(c)).min_by_key(|c| steady(c));
    let lowest = comparable.iter().filter(|c| saves(c)).min_by_key(|c| steady(c));
    let mut line = match (best_fast, lowest) {
        (Some(best), lowest) => {
            let mut line = format!("Use {}: {}", best.name, cost(best, base));
            let clearly_lower = |l: &&&ConfigResult| l.name != best.name && (steady(l) as f64) < (1.0 - MEANINGFUL_SAVING) * steady(best) as f64;
            if let Some(lower) = lowest.filter(clearly_lower) {
                line.push_str(&format!("; {} goes lower but costs more time: {}", lower.name, cost(lower, base)));
            }
            line
        }
        (None, Some(lowest)) => format!(
            "Keep {}'s default unless memory matters more than time: the lowest steady RSS, {}, costs more than +10 % time: {}",
            base.name,
            lowest.name,
            cost(lowest, base)
        ),
        (None, None) => format!("Keep the default ({}): no configuration lowers steady RSS by 5 % or more", base.name),
    };
    if !excluded.is_empty() {
        line.push_str(&format!(" (not considered, their output or exit status differs: {})", excluded.join(", ")));
    }
    line.push('.');
    (line, best_fast.map(|c| c.name.clone()))
}

fn within_tolerance(value: Option<f64>, base: Option<f64>) -> bool {
    match (value, base) {
        (Some(v), Some(b)) => v <= b * (1.0 + TIME_TOLERANCE) + TIME_SLACK_SECONDS,
        _ => false,
    }
}

/// "steady RSS 78.1 MiB → 29.0 MiB (-63 %), peak -56 %, wall +1 %, CPU -2 %"
fn cost(config: &ConfigResult, base: &ConfigResult) -> String {
    let change = |ratio: Option<f64>| ratio.map_or("?".to_string(), |r| format!("{:+.0} %", (r - 1.0) * 100.0));
    format!(
        "steady RSS {} → {} ({}), peak {}, wall {}, CPU {}",
        crate::human_bytes(base.steady_rss_bytes.unwrap_or(0)),
        crate::human_bytes(config.steady_rss_bytes.unwrap_or(0)),
        change(config.steady_rss_ratio),
        change(config.peak_rss_ratio),
        change(config.wall_ratio),
        change(config.cpu_ratio)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn spec(name: &str) -> ConfigSpec {
        ConfigSpec { name: name.into(), env: Vec::new(), package: None, available: true, note: None }
    }

    /// A run whose RSS is `peak` during its first half and `steady` after.
    fn run(peak: u64, steady: u64, wall: f64, cpu: f64, stdout_hash: u64) -> Run {
        let samples = (0..100).map(|i| RssSample { seconds: wall * i as f64 / 100.0, rss_bytes: if i < 50 { peak } else { steady } }).collect();
        Run { samples, wall_seconds: wall, cpu_seconds: cpu, max_rss_bytes: peak, exit_code: 0, stdout_hash, ..Run::default() }
    }

    fn last_half() -> SteadyWindow {
        SteadyWindow { from_seconds: None }
    }

    fn compare_runs(configs: Vec<(&str, Vec<Run>)>) -> Comparison {
        let (specs, runs) = configs.into_iter().map(|(name, runs)| (spec(name), runs)).unzip();
        compare(vec!["prog".into()], specs, runs, last_half(), 10)
    }

    #[test]
    fn steady_is_the_mean_of_the_last_half_or_of_the_window() {
        let r = run(100, 40, 2.0, 1.0, 0);
        assert_eq!(steady_rss(&r.samples, 2.0, last_half()), (Some(40), 50));
        // From 0.5 s: 25 samples at 100 and 50 at 40.
        assert_eq!(steady_rss(&r.samples, 2.0, SteadyWindow { from_seconds: Some(0.5) }), (Some((25 * 100 + 50 * 40) / 75), 75));
        // A window starting after the run: its last sample, noted.
        let late = SteadyWindow { from_seconds: Some(9.0) };
        assert_eq!(steady_rss(&r.samples, 2.0, late), (None, 0));
        assert_eq!(figures(&r, late).steady_rss_bytes, 40);
        let (specs, runs) = (vec![spec("glibc")], vec![vec![r.clone()]]);
        assert!(compare(vec![], specs, runs, late, 10).notes[0].contains("1 runs had fewer than 3 RSS samples"));
        // No sample at all (a run shorter than the interval): its peak.
        let unsampled = Run { samples: Vec::new(), max_rss_bytes: 7, ..r };
        assert_eq!(figures(&unsampled, last_half()).steady_rss_bytes, 7);
    }

    #[test]
    fn peak_counts_the_kernel_high_water_mark() {
        let mut r = run(100, 40, 1.0, 1.0, 0);
        r.max_rss_bytes = 150;
        assert_eq!(figures(&r, last_half()).peak_rss_bytes, 150);
    }

    #[test]
    fn downsampling_keeps_peaks() {
        let samples: Vec<RssSample> = (0..1000).map(|i| RssSample { seconds: i as f64, rss_bytes: if i == 537 { 999 } else { 1 } }).collect();
        let short = downsample(&samples, MAX_CHART_SAMPLES);
        assert!(short.len() <= MAX_CHART_SAMPLES);
        assert_eq!(short.iter().map(|s| s.rss_bytes).max(), Some(999));
        assert_eq!(downsample(&samples[..10], MAX_CHART_SAMPLES).len(), 10);
    }

    #[test]
    fn medians_and_ratios() {
        let c = compare_runs(vec![
            ("glibc", vec![run(100 * MIB, 80 * MIB, 1.0, 0.5, 1), run(100 * MIB, 90 * MIB, 1.2, 0.5, 1), run(100 * MIB, 70 * MIB, 1.1, 0.5, 1)]),
            ("arena-max-2", vec![run(50 * MIB, 20 * MIB, 1.0, 0.5, 1), run(50 * MIB, 20 * MIB, 1.0, 0.5, 1), run(50 * MIB, 20 * MIB, 1.0, 0.5, 1)]),
        ]);
        let base = &c.configs[0];
        assert_eq!(base.steady_rss_bytes, Some(80 * MIB));
        assert_eq!(base.wall_seconds, Some(1.1));
        assert_eq!(base.repeats, 3);
        let arena = &c.configs[1];
        assert_eq!(arena.steady_rss_ratio, Some(0.25));
        assert_eq!(arena.peak_rss_ratio, Some(0.5));
        assert!(!c.output_differs && !c.exit_differs);
        assert_eq!(c.recommended.as_deref(), Some("arena-max-2"));
        assert!(c.recommendation.starts_with("Use arena-max-2: steady RSS 80.0 MiB → 20.0 MiB (-75 %)"), "{}", c.recommendation);
    }

    #[test]
    fn a_slower_config_is_a_trade_off() {
        let c = compare_runs(vec![("glibc", vec![run(100 * MIB, 80 * MIB, 1.0, 1.0, 1)]), ("slow", vec![run(50 * MIB, 20 * MIB, 1.0, 1.5, 1)])]);
        assert_eq!(c.recommended, None);
        assert!(c.recommendation.contains("slow, costs more than +10 % time"), "{}", c.recommendation);
        assert!(c.recommendation.contains("CPU +50 %"), "{}", c.recommendation);
    }

    #[test]
    fn the_fast_one_is_recommended_and_a_lower_slow_one_mentioned() {
        let c = compare_runs(vec![
            ("glibc", vec![run(100 * MIB, 80 * MIB, 1.0, 1.0, 1)]),
            ("slow", vec![run(50 * MIB, 10 * MIB, 1.0, 2.0, 1)]),
            ("fast", vec![run(50 * MIB, 40 * MIB, 1.05, 1.05, 1)]),
        ]);
        assert_eq!(c.recommended.as_deref(), Some("fast"));
        assert!(c.recommendation.contains("; slow goes lower but costs more time"), "{}", c.recommendation);
    }

    #[test]
    fn no_saving_keeps_the_default() {
        let c = compare_runs(vec![("glibc", vec![run(100, 80, 1.0, 1.0, 1)]), ("same", vec![run(100, 79, 1.0, 1.0, 1)])]);
        assert_eq!(c.recommended, None);
        assert!(c.recommendation.starts_with("Keep the default (glibc)"), "{}", c.recommendation);
    }

    #[test]
    fn different_output_or_exit_is_flagged_and_not_recommended() {
        let mut failing = run(10, 10, 1.0, 1.0, 1);
        failing.exit_code = 134;
        failing.stderr_tail = "Aborted".into();
        let c = compare_runs(vec![
            ("glibc", vec![run(100, 80, 1.0, 1.0, 1)]),
            ("other-output", vec![run(10, 10, 1.0, 1.0, 2)]),
            ("crashes", vec![failing]),
        ]);
        assert!(c.output_differs && c.exit_differs);
        assert!(c.configs[1].output_differs && !c.configs[1].exit_differs);
        assert!(c.configs[2].exit_differs && !c.configs[2].output_differs);
        assert_eq!(c.configs[2].exit_code, Some(134));
        assert_eq!(c.configs[2].failure_stderr.as_deref(), Some("Aborted"));
        assert_eq!(c.recommended, None);
        assert!(c.recommendation.contains("not considered, their output or exit status differs: other-output, crashes"), "{}", c.recommendation);
    }

    #[test]
    fn unavailable_configs_have_no_figures() {
        let mut missing = spec("jemalloc");
        missing.available = false;
        let c = compare(vec!["prog".into()], vec![spec("glibc"), missing], vec![vec![run(100, 80, 1.0, 1.0, 1)], vec![]], last_half(), 10);
        let j = &c.configs[1];
        assert_eq!((j.repeats, j.steady_rss_bytes, j.steady_rss_ratio, j.output_differs), (0, None, None, false));
    }

    #[test]
    fn nondeterministic_output_is_noted() {
        let c = compare_runs(vec![("glibc", vec![run(100, 80, 1.0, 1.0, 1), run(100, 80, 1.0, 1.0, 2)])]);
        assert!(c.configs[0].output_varies);
        assert!(c.notes[0].contains("not deterministic"));
    }

    #[test]
    fn most_common_exit_code() {
        assert_eq!(most_common(&[1, 0, 0]), Some(0));
        assert_eq!(most_common(&[1, 0]), Some(1));
        assert_eq!(most_common(&[]), None);
    }
}
