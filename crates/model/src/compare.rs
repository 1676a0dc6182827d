//! `memgap compare`: the same command run under several allocator
//! configurations, reduced to medians with their spread, ratios to the
//! default, and a recommendation that weighs memory against time and says
//! how sure it is.
//!
//! The runs are measured from outside (crate `memgap-measure`); this module
//! only computes, so every rule here is testable without running anything.

pub mod measured;
pub mod numa;
pub mod output;

use serde::Serialize;

pub use memgap_types::compare::{RssSample, Run, RunLocality, Stdout};
pub use numa::{ComparisonNuma, ConfigNuma, RunNuma};
pub use output::{OutputDiff, OutputModel};

/// Samples kept per configuration for an RSS-over-time chart.
pub const MAX_CHART_SAMPLES: usize = 200;

/// A configuration may cost this much more wall or CPU time than the
/// default, beyond the default's own spread, and still be recommended
/// without a trade-off.
const TIME_TOLERANCE: f64 = 0.10;
/// ...plus this many seconds, so the noise of a run of a few milliseconds
/// does not disqualify anything.
const TIME_SLACK_SECONDS: f64 = 0.01;
/// Fewer samples than this in a run's steady window make its steady RSS a guess.
const MIN_STEADY_SAMPLES: usize = 3;
/// A saving below this share of the default's figure is noise, whatever
/// the spread of its runs.
const MEANINGFUL_SAVING: f64 = 0.05;
/// Final RSS is the mean over this long before the end of the run (or a
/// quarter of the run, when that is shorter).
const FINAL_WINDOW_SECONDS: f64 = 1.0;
/// RSS has settled once it stays within this share of the final RSS...
const SETTLE_BAND: f64 = 0.10;
/// ...or within this many bytes of it, whichever is wider.
const SETTLE_BAND_MIN_BYTES: f64 = 1048576.0;
/// Runs per configuration for a recommendation of high confidence.
const CONFIDENT_RUNS: usize = 3;

/// One configuration: the environment it adds to the command's, and the
/// command it runs the command under (`numactl --interleave=all`).
#[derive(Debug, Clone, Serialize)]
pub struct ConfigSpec {
    pub name: String,
    /// In the order set; shown as a JSON object.
    #[serde(serialize_with = "env_as_object")]
    pub env: Vec<(String, String)>,
    /// Words put before the command (a program and its options); empty for
    /// a configuration that only sets the environment.
    pub wrapper: Vec<String>,
    /// The Debian package that provides its allocator.
    pub package: Option<String>,
    pub available: bool,
    /// Why it is not available (a missing library), or a caveat.
    pub note: Option<String>,
}

/// The RSS figure a recommendation optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    Peak,
    Steady,
    Final,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::Peak => "peak",
            Metric::Steady => "steady",
            Metric::Final => "final",
        }
    }
}

/// How sure a recommendation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Confidence {
    /// At least three runs each, and every run of the one named beats every
    /// run of the other.
    #[serde(rename = "high")]
    High,
    /// The difference exceeds the default's own spread, but runs overlap or
    /// are too few.
    #[serde(rename = "low")]
    Low,
    /// No configuration differs from the default by more than the default's
    /// own spread (or 5 %).
    #[serde(rename = "within noise")]
    WithinNoise,
    /// Nothing to compare.
    #[serde(rename = "none")]
    Unknown,
}

impl Confidence {
    pub fn name(self) -> &'static str {
        match self {
            Confidence::High => "high",
            Confidence::Low => "low",
            Confidence::WithinNoise => "within noise",
            Confidence::Unknown => "none",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// One line for a person.
    pub text: String,
    pub metric: Metric,
    pub confidence: Confidence,
    /// The configuration to use, if the recommendation names one.
    pub config: Option<String>,
}

/// How the runs are reduced.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Steady RSS is the mean from this many seconds after start; `None`: over
    /// the last half of the run.
    pub steady_from: Option<f64>,
    /// Final RSS is taken before this many seconds after start; `None`: before exit.
    pub final_at: Option<f64>,
    pub metric: Metric,
    pub interval_ms: u64,
    /// Do not compare stdout at all.
    pub ignore_output: bool,
    /// The machine's NUMA nodes, when the runs' memory was sampled.
    pub numa_nodes: Option<usize>,
}

impl Default for Options {
    fn default() -> Options {
        Options { steady_from: None, final_at: None, metric: Metric::Steady, interval_ms: 10, ignore_output: false, numa_nodes: None }
    }
}

/// One run reduced to the figures that are compared.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub peak_rss_bytes: u64,
    pub steady_rss_bytes: u64,
    /// Samples the steady RSS is the mean of.
    pub steady_samples: usize,
    pub final_rss_bytes: u64,
    /// From when on RSS stayed within 10 % (at least 1 MiB) of the final RSS.
    pub settle_seconds: Option<f64>,
    pub wall_seconds: f64,
    pub cpu_seconds: f64,
    pub exit_code: i32,
    pub stdout_hash: String,
    /// Lines of its stdout that the default's own runs do not allow.
    pub output_differs_lines: usize,
    /// Its NUMA figures, when its memory was sampled.
    pub numa: Option<RunNuma>,
}

/// The lowest and highest value over a configuration's runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

impl Range {
    fn of(values: impl Iterator<Item = f64>) -> Option<Range> {
        values.fold(None, |range: Option<Range>, v| {
            Some(range.map_or(Range { min: v, max: v }, |r| Range { min: r.min.min(v), max: r.max.max(v) }))
        })
    }

    pub fn width(&self) -> f64 {
        self.max - self.min
    }
}

/// The spread of each figure over a configuration's runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub peak_rss_bytes: Range,
    pub steady_rss_bytes: Range,
    pub final_rss_bytes: Range,
    pub wall_seconds: Range,
    pub cpu_seconds: Range,
}

/// A configuration's medians over its runs, and how it differs from the default.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigResult {
    pub name: String,
    pub available: bool,
    #[serde(serialize_with = "env_as_object")]
    pub env: Vec<(String, String)>,
    pub wrapper: Vec<String>,
    pub package: Option<String>,
    pub note: Option<String>,
    /// Runs made (0 when not available).
    pub repeats: usize,
    pub peak_rss_bytes: Option<u64>,
    pub steady_rss_bytes: Option<u64>,
    pub final_rss_bytes: Option<u64>,
    pub settle_seconds: Option<f64>,
    pub wall_seconds: Option<f64>,
    pub cpu_seconds: Option<f64>,
    /// Lowest and highest of each figure over its runs.
    pub spread: Option<Spread>,
    /// The most common exit status of its runs.
    pub exit_code: Option<i32>,
    pub peak_rss_ratio: Option<f64>,
    pub steady_rss_ratio: Option<f64>,
    pub final_rss_ratio: Option<f64>,
    pub wall_ratio: Option<f64>,
    pub cpu_ratio: Option<f64>,
    /// Some run printed lines the default's own runs do not allow.
    pub output_differs: bool,
    /// The most such lines in one run.
    pub output_differs_lines: usize,
    /// Those lines, from its first run that has any (at most 10).
    pub output_diff: Vec<OutputDiff>,
    /// Some run exited otherwise than the default's first run.
    pub exit_differs: bool,
    /// Its own runs printed different bytes (a nondeterministic command).
    pub output_varies: bool,
    pub stdout_hash: Option<String>,
    pub stdout_bytes: Option<u64>,
    /// RSS over time of the run with the median figure of the metric, at
    /// most [`MAX_CHART_SAMPLES`] points.
    pub samples: Vec<RssSample>,
    pub runs: Vec<RunFigures>,
    /// The end of stderr of its first failed run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_stderr: Option<String>,
    /// Locality of its sampled memory events (accesses or first touches),
    /// when the comparison sampled them.
    pub numa: Option<ConfigNuma>,
}

impl ConfigResult {
    /// The median of a metric.
    pub fn metric(&self, metric: Metric) -> Option<u64> {
        match metric {
            Metric::Peak => self.peak_rss_bytes,
            Metric::Steady => self.steady_rss_bytes,
            Metric::Final => self.final_rss_bytes,
        }
    }

    pub(crate) fn metric_range(&self, metric: Metric) -> Option<Range> {
        self.spread.map(|s| match metric {
            Metric::Peak => s.peak_rss_bytes,
            Metric::Steady => s.steady_rss_bytes,
            Metric::Final => s.final_rss_bytes,
        })
    }

    fn metric_ratio(&self, metric: Metric) -> Option<f64> {
        match metric {
            Metric::Peak => self.peak_rss_ratio,
            Metric::Steady => self.steady_rss_ratio,
            Metric::Final => self.final_rss_ratio,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub command: Vec<String>,
    /// What the command reads on stdin.
    pub stdin: &'static str,
    /// Runs of each configuration; the default may have one more.
    pub repeats: usize,
    pub interval_ms: u64,
    pub steady_from_seconds: Option<f64>,
    pub final_at_seconds: Option<f64>,
    pub metric: Metric,
    /// The configuration ratios are taken against.
    pub baseline: String,
    pub configs: Vec<ConfigResult>,
    /// `learned` (from the default's own runs) or `ignored`.
    pub output_check: &'static str,
    /// Lines of the default's stdout that vary between its own runs.
    pub baseline_varying_lines: usize,
    pub output_differs: bool,
    pub exit_differs: bool,
    pub recommendation: Recommendation,
    /// The configuration the recommendation names, if it names one to use.
    pub recommended: Option<String>,
    /// The NUMA sampling of the runs, when there was any.
    pub numa: Option<ComparisonNuma>,
    pub notes: Vec<String>,
}

fn env_as_object<S: serde::Serializer>(env: &[(String, String)], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(env.iter().map(|(name, value)| (name, value)))
}

/// Reduces the runs of each configuration (`runs[i]` belongs to
/// `specs[i]`; the first is the baseline) to a comparison.
pub fn compare(command: Vec<String>, specs: Vec<ConfigSpec>, runs: Vec<Vec<Run>>, options: Options) -> Comparison {
    assert_eq!(specs.len(), runs.len(), "one list of runs per configuration");
    let repeats = runs.iter().skip(1).map(Vec::len).filter(|&n| n > 0).max().unwrap_or_else(|| runs.first().map_or(0, Vec::len));
    let model = if options.ignore_output {
        OutputModel::Ignored
    } else {
        let base_runs = runs.first().map(Vec::as_slice).unwrap_or_default();
        OutputModel::learn(&base_runs.iter().map(|r| (&r.stdout, r.stdout_hash)).collect::<Vec<_>>())
    };
    let mut configs: Vec<ConfigResult> = specs.into_iter().zip(&runs).map(|(spec, runs)| reduce(spec, runs, &options, &model)).collect();
    if let Some(base) = configs.first().filter(|base| !base.runs.is_empty()).cloned() {
        for config in &mut configs {
            relate_to_baseline(config, &base);
        }
    }
    let recommendation = recommend(&configs, options.metric);
    let mut notes = Vec::new();
    let varying = model.varying_lines();
    if varying > 0 {
        notes.push(format!(
            "{varying} lines of the default's stdout vary between its own runs: they are compared by their shape (numbers, addresses and times left out), or not at all"
        ));
    }
    if options.ignore_output {
        notes.push("stdout was not compared (--ignore-output)".to_string());
    }
    let thinly_sampled = configs.iter().flat_map(|c| &c.runs).filter(|r| r.steady_samples < MIN_STEADY_SAMPLES).count();
    if thinly_sampled > 0 {
        notes.push(format!(
            "{thinly_sampled} runs had fewer than {MIN_STEADY_SAMPLES} RSS samples in the steady window (a short run, or --steady-from past its end): their steady RSS is their last sample, or their peak; a smaller --interval-ms helps"
        ));
    }
    if let Some(at) = options.final_at
        && configs.iter().flat_map(|c| &c.runs).any(|r| r.wall_seconds < at)
    {
        notes.push(format!("some runs ended before --final-at {at} s: their final RSS is taken before their exit"));
    }
    let numa_summary = options.numa_nodes.map(|nodes| {
        let sampled: Vec<&RunLocality> = runs.iter().flatten().filter_map(|r| r.numa.as_ref()?.as_ref().ok()).collect();
        let refusals: Vec<&str> = runs.iter().flatten().filter_map(|r| r.numa.as_ref()?.as_ref().err().map(String::as_str)).collect();
        let (summary, numa_notes) = numa::summarize(nodes, &sampled, &refusals);
        notes.extend(numa_notes);
        summary
    });
    Comparison {
        command,
        stdin: "/dev/null",
        repeats,
        interval_ms: options.interval_ms,
        steady_from_seconds: options.steady_from,
        final_at_seconds: options.final_at,
        metric: options.metric,
        baseline: configs.first().map(|c| c.name.clone()).unwrap_or_default(),
        output_check: if options.ignore_output { "ignored" } else { "learned" },
        baseline_varying_lines: varying,
        output_differs: configs.iter().any(|c| c.output_differs),
        exit_differs: configs.iter().any(|c| c.exit_differs),
        recommended: recommendation.config.clone(),
        recommendation,
        configs,
        numa: numa_summary,
        notes,
    }
}

fn reduce(spec: ConfigSpec, runs: &[Run], options: &Options, model: &OutputModel) -> ConfigResult {
    let mut figures: Vec<RunFigures> = runs.iter().map(|run| figures(run, options)).collect();
    let mut output_diff = Vec::new();
    for (run, figures) in runs.iter().zip(&mut figures) {
        let (differing, diffs) = model.check(&run.stdout, run.stdout_hash);
        figures.output_differs_lines = differing;
        if output_diff.is_empty() {
            output_diff = diffs;
        }
    }
    let median_of = |value: fn(&RunFigures) -> f64| (!figures.is_empty()).then(|| median(figures.iter().map(value).collect()));
    let range_of = |value: fn(&RunFigures) -> f64| Range::of(figures.iter().map(value));
    let chosen = |f: &RunFigures| match options.metric {
        Metric::Peak => f.peak_rss_bytes as f64,
        Metric::Steady => f.steady_rss_bytes as f64,
        Metric::Final => f.final_rss_bytes as f64,
    };
    let target = (!figures.is_empty()).then(|| median(figures.iter().map(chosen).collect()));
    let chart_run = target
        .and_then(|target| runs.iter().zip(&figures).min_by(|a, b| (chosen(a.1) - target).abs().total_cmp(&(chosen(b.1) - target).abs())));
    let settle: Vec<f64> = figures.iter().filter_map(|f| f.settle_seconds).collect();
    let spread = (|| {
        Some(Spread {
            peak_rss_bytes: range_of(|f| f.peak_rss_bytes as f64)?,
            steady_rss_bytes: range_of(|f| f.steady_rss_bytes as f64)?,
            final_rss_bytes: range_of(|f| f.final_rss_bytes as f64)?,
            wall_seconds: range_of(|f| f.wall_seconds)?,
            cpu_seconds: range_of(|f| f.cpu_seconds)?,
        })
    })();
    let first_failure = runs.iter().find(|r| r.exit_code != 0 && !r.stderr_tail.is_empty());
    let localities: Vec<&RunLocality> = runs.iter().filter_map(|r| r.numa.as_ref()?.as_ref().ok()).collect();
    ConfigResult {
        numa: numa::reduce(&localities),
        repeats: runs.len(),
        peak_rss_bytes: median_of(|f| f.peak_rss_bytes as f64).map(|v| v.round() as u64),
        steady_rss_bytes: median_of(|f| f.steady_rss_bytes as f64).map(|v| v.round() as u64),
        final_rss_bytes: median_of(|f| f.final_rss_bytes as f64).map(|v| v.round() as u64),
        settle_seconds: (!settle.is_empty()).then(|| median(settle)),
        wall_seconds: median_of(|f| f.wall_seconds),
        cpu_seconds: median_of(|f| f.cpu_seconds),
        spread,
        exit_code: most_common(&figures.iter().map(|f| f.exit_code).collect::<Vec<_>>()),
        peak_rss_ratio: None,
        steady_rss_ratio: None,
        final_rss_ratio: None,
        wall_ratio: None,
        cpu_ratio: None,
        output_differs: figures.iter().any(|f| f.output_differs_lines > 0),
        output_differs_lines: figures.iter().map(|f| f.output_differs_lines).max().unwrap_or(0),
        output_diff,
        exit_differs: false,
        output_varies: runs.windows(2).any(|pair| pair[0].stdout_hash != pair[1].stdout_hash || pair[0].stdout != pair[1].stdout),
        stdout_hash: figures.first().map(|f| f.stdout_hash.clone()),
        stdout_bytes: runs.first().map(|r| r.stdout_bytes),
        samples: chart_run.map(|(run, _)| downsample(&run.samples, MAX_CHART_SAMPLES)).unwrap_or_default(),
        runs: figures,
        failure_stderr: first_failure.map(|r| r.stderr_tail.clone()),
        name: spec.name,
        available: spec.available,
        env: spec.env,
        wrapper: spec.wrapper,
        package: spec.package,
        note: spec.note,
    }
}

/// Ratios to the baseline's medians; exit status against its first run.
fn relate_to_baseline(config: &mut ConfigResult, base: &ConfigResult) {
    let ratio = |value: Option<f64>, base: Option<f64>| match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    };
    let as_f64 = |v: Option<u64>| v.map(|v| v as f64);
    config.peak_rss_ratio = ratio(as_f64(config.peak_rss_bytes), as_f64(base.peak_rss_bytes));
    config.steady_rss_ratio = ratio(as_f64(config.steady_rss_bytes), as_f64(base.steady_rss_bytes));
    config.final_rss_ratio = ratio(as_f64(config.final_rss_bytes), as_f64(base.final_rss_bytes));
    config.wall_ratio = ratio(config.wall_seconds, base.wall_seconds);
    config.cpu_ratio = ratio(config.cpu_seconds, base.cpu_seconds);
    let first = &base.runs[0];
    config.exit_differs = config.runs.iter().any(|r| r.exit_code != first.exit_code);
}

/// Peak, steady and final RSS and the time to settle of one run. Peak also
/// counts the kernel's high-water mark, which sees peaks between two
/// samples. A run with no sample in the steady or final window gets its
/// last sample, or its peak.
pub fn figures(run: &Run, options: &Options) -> RunFigures {
    let sampled_peak = run.samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    let peak_rss_bytes = sampled_peak.max(run.max_rss_bytes);
    let (steady, steady_samples) = steady_rss(&run.samples, run.wall_seconds, options.steady_from);
    let last_sample = run.samples.last().map(|s| s.rss_bytes);
    let end = options.final_at.map_or(run.wall_seconds, |at| at.min(run.wall_seconds));
    let final_rss_bytes = final_rss(&run.samples, end).or(last_sample).unwrap_or(peak_rss_bytes);
    RunFigures {
        peak_rss_bytes,
        steady_rss_bytes: steady.or(last_sample).unwrap_or(peak_rss_bytes),
        steady_samples,
        final_rss_bytes,
        settle_seconds: settle_seconds(&run.samples, end, final_rss_bytes),
        wall_seconds: run.wall_seconds,
        cpu_seconds: run.cpu_seconds,
        exit_code: run.exit_code,
        stdout_hash: format!("{:016x}", run.stdout_hash),
        output_differs_lines: 0,
        numa: run.numa.as_ref().and_then(|n| n.as_ref().ok()).map(|n| RunNuma::of(&n.locality)),
    }
}

/// The mean of the samples in the steady window (`None` when it holds
/// none), and how many it holds.
pub fn steady_rss(samples: &[RssSample], wall_seconds: f64, from_seconds: Option<f64>) -> (Option<u64>, usize) {
    let from = from_seconds.unwrap_or(wall_seconds / 2.0);
    let in_window: Vec<u64> = samples.iter().filter(|s| s.seconds >= from).map(|s| s.rss_bytes).collect();
    (mean(&in_window), in_window.len())
}

/// The mean over the last second before `end` (a quarter of the run when
/// that is shorter); else the last sample before `end`.
pub fn final_rss(samples: &[RssSample], end: f64) -> Option<u64> {
    let from = end - FINAL_WINDOW_SECONDS.min(end / 4.0);
    let in_window: Vec<u64> = samples.iter().filter(|s| s.seconds >= from && s.seconds <= end).map(|s| s.rss_bytes).collect();
    mean(&in_window).or_else(|| samples.iter().rev().find(|s| s.seconds <= end).map(|s| s.rss_bytes))
}

/// The time of the first sample after which RSS stays within the settle
/// band around `final_rss` up to `end`.
pub fn settle_seconds(samples: &[RssSample], end: f64, final_rss: u64) -> Option<f64> {
    let band = (final_rss as f64 * SETTLE_BAND).max(SETTLE_BAND_MIN_BYTES);
    let considered: Vec<&RssSample> = samples.iter().filter(|s| s.seconds <= end).collect();
    let outside = considered.iter().rposition(|s| (s.rss_bytes as f64 - final_rss as f64).abs() > band);
    match outside {
        None => considered.first().map(|s| s.seconds),
        Some(i) => considered.get(i + 1).map(|s| s.seconds).or(Some(end)),
    }
}

fn mean(values: &[u64]) -> Option<u64> {
    let total: u128 = values.iter().map(|&v| u128::from(v)).sum();
    (!values.is_empty()).then(|| (total / values.len() as u128) as u64)
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

/// The configuration with the lowest `metric` among those that behave like
/// the default (same output where the default agrees with itself, same exit
/// status) and cost at most +10 % time beyond the default's own spread —
/// provided its gain exceeds the default's own spread (and 5 %); otherwise
/// "within noise", or what the memory would cost in time.
pub fn recommend(configs: &[ConfigResult], metric: Metric) -> Recommendation {
    let unknown = |text: &str| Recommendation { text: text.to_string(), metric, confidence: Confidence::Unknown, config: None };
    let Some(base) = configs.first().filter(|c| c.metric(metric).is_some()) else {
        return unknown("No recommendation: the default configuration did not run.");
    };
    let what = format!("{} RSS", metric.name());
    let value = |c: &ConfigResult| c.metric(metric).unwrap_or(u64::MAX) as f64;
    let base_value = value(base);
    let base_range = base.metric_range(metric).unwrap_or(Range { min: base_value, max: base_value });
    let noise = (MEANINGFUL_SAVING * base_value).max(base_range.width());
    let others: Vec<&ConfigResult> = configs[1..].iter().filter(|c| c.metric(metric).is_some()).collect();
    let comparable: Vec<&ConfigResult> = others.iter().copied().filter(|c| !c.output_differs && !c.exit_differs).collect();
    let excluded: Vec<&str> = others.iter().filter(|c| c.output_differs || c.exit_differs).map(|c| c.name.as_str()).collect();
    let saves = |c: &ConfigResult| base_value - value(c) > noise;
    let fast_enough = |c: &ConfigResult| {
        let spread = |pick: fn(&Spread) -> Range| base.spread.map_or(0.0, |s| pick(&s).width());
        within_tolerance(c.wall_seconds, base.wall_seconds, spread(|s| s.wall_seconds))
            && within_tolerance(c.cpu_seconds, base.cpu_seconds, spread(|s| s.cpu_seconds))
    };
    let confidence_against = |c: &ConfigResult| {
        let range = c.metric_range(metric).unwrap_or(Range { min: value(c), max: value(c) });
        if c.repeats >= CONFIDENT_RUNS && base.repeats >= CONFIDENT_RUNS && range.max < base_range.min {
            Confidence::High
        } else {
            Confidence::Low
        }
    };
    let by_value = |a: &&&ConfigResult, b: &&&ConfigResult| value(a).total_cmp(&value(b));
    let best_fast = comparable.iter().filter(|c| fast_enough(c) && saves(c)).min_by(by_value);
    let lowest = comparable.iter().filter(|c| saves(c)).min_by(by_value);
    let runs = |c: &ConfigResult| {
        format!(
            "{} runs {}–{}",
            c.repeats,
            crate::human_bytes(c.metric_range(metric).map_or(0.0, |r| r.min) as u64),
            crate::human_bytes(c.metric_range(metric).map_or(0.0, |r| r.max) as u64)
        )
    };

    let (mut text, confidence, config) = match (best_fast, lowest) {
        (Some(best), lowest) => {
            let confidence = confidence_against(best);
            let mut text = format!(
                "Use {} ({what}, {} confidence: {} against {}'s {}): {}",
                best.name,
                confidence.name(),
                runs(best),
                base.name,
                runs(base),
                cost(best, base, metric)
            );
            let clearly_lower = |l: &&&ConfigResult| l.name != best.name && value(best) - value(l) > noise;
            if let Some(lower) = lowest.filter(clearly_lower) {
                text.push_str(&format!("; {} goes lower but costs more time: {}", lower.name, cost(lower, base, metric)));
            }
            (text, confidence, Some(best.name.clone()))
        }
        (None, Some(lowest)) => (
            format!(
                "Keep {}'s default unless memory matters more than time: the lowest {what}, {}, costs more than +10 % time: {}",
                base.name,
                lowest.name,
                cost(lowest, base, metric)
            ),
            confidence_against(lowest),
            None,
        ),
        (None, None) => match comparable.iter().min_by(by_value) {
            Some(best) if base_value - value(best) > -noise => (
                format!(
                    "Keep the default ({}): within noise — no configuration's {what} is lower by more than the default's own spread ({} over {} runs) or 5 %; the lowest, {}, is {} against {}",
                    base.name,
                    crate::human_bytes(base_range.width() as u64),
                    base.repeats,
                    best.name,
                    crate::human_bytes(value(best) as u64),
                    crate::human_bytes(base_value as u64)
                ),
                Confidence::WithinNoise,
                None,
            ),
            Some(_) => {
                let clear = comparable
                    .iter()
                    .all(|c| c.repeats >= CONFIDENT_RUNS && c.metric_range(metric).is_some_and(|r| r.min > base_range.max));
                (
                    format!("Keep the default ({}): every other configuration has a higher {what}", base.name),
                    if clear && base.repeats >= CONFIDENT_RUNS { Confidence::High } else { Confidence::Low },
                    None,
                )
            }
            None => (
                format!("Keep the default ({}): no other configuration ran with the same output and exit status", base.name),
                Confidence::Unknown,
                None,
            ),
        },
    };
    if !excluded.is_empty() {
        text.push_str(&format!(" (not considered, their output or exit status differs: {})", excluded.join(", ")));
    }
    text.push('.');
    Recommendation { text, metric, confidence, config }
}

fn within_tolerance(value: Option<f64>, base: Option<f64>, base_spread: f64) -> bool {
    match (value, base) {
        (Some(v), Some(b)) => v <= b * (1.0 + TIME_TOLERANCE) + TIME_SLACK_SECONDS + base_spread,
        _ => false,
    }
}

/// "steady RSS 78.1 MiB → 29.0 MiB (-63 %), peak -56 %, final -70 %, wall +1 %, CPU -2 %"
fn cost(config: &ConfigResult, base: &ConfigResult, metric: Metric) -> String {
    let change = |ratio: Option<f64>| ratio.map_or("?".to_string(), |r| format!("{:+.0} %", (r - 1.0) * 100.0));
    let others: Vec<String> = [Metric::Peak, Metric::Steady, Metric::Final]
        .into_iter()
        .filter(|&m| m != metric)
        .map(|m| format!("{} {}", m.name(), change(config.metric_ratio(m))))
        .collect();
    format!(
        "{} RSS {} → {} ({}), {}, wall {}, CPU {}",
        metric.name(),
        crate::human_bytes(base.metric(metric).unwrap_or(0)),
        crate::human_bytes(config.metric(metric).unwrap_or(0)),
        change(config.metric_ratio(metric)),
        others.join(", "),
        change(config.wall_ratio),
        change(config.cpu_ratio)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn spec(name: &str) -> ConfigSpec {
        ConfigSpec { name: name.into(), env: Vec::new(), wrapper: Vec::new(), package: None, available: true, note: None }
    }

    /// A run whose RSS is `peak` during its first half and `steady` after,
    /// printing output number `output` (a line of that many x's).
    fn run(peak: u64, steady: u64, wall: f64, cpu: f64, output: u64) -> Run {
        let samples =
            (0..100).map(|i| RssSample { seconds: wall * i as f64 / 100.0, rss_bytes: if i < 50 { peak } else { steady } }).collect();
        let stdout = Stdout::Lines(vec!["x".repeat(output as usize)]);
        Run {
            samples,
            wall_seconds: wall,
            cpu_seconds: cpu,
            max_rss_bytes: peak,
            exit_code: 0,
            stdout_hash: output,
            stdout,
            ..Run::default()
        }
    }

    fn options() -> Options {
        Options::default()
    }

    fn compare_runs(configs: Vec<(&str, Vec<Run>)>) -> Comparison {
        compare_with(configs, options())
    }

    fn compare_with(configs: Vec<(&str, Vec<Run>)>, options: Options) -> Comparison {
        let (specs, runs) = configs.into_iter().map(|(name, runs)| (spec(name), runs)).unzip();
        compare(vec!["prog".into()], specs, runs, options)
    }

    #[test]
    fn steady_is_the_mean_of_the_last_half_or_of_the_window() {
        let r = run(100, 40, 2.0, 1.0, 0);
        assert_eq!(steady_rss(&r.samples, 2.0, None), (Some(40), 50));
        // From 0.5 s: 25 samples at 100 and 50 at 40.
        assert_eq!(steady_rss(&r.samples, 2.0, Some(0.5)), (Some((25 * 100 + 50 * 40) / 75), 75));
        // A window starting after the run: its last sample, noted.
        let late = Options { steady_from: Some(9.0), ..options() };
        assert_eq!(steady_rss(&r.samples, 2.0, Some(9.0)), (None, 0));
        assert_eq!(figures(&r, &late).steady_rss_bytes, 40);
        let (specs, runs) = (vec![spec("glibc")], vec![vec![r.clone()]]);
        assert!(compare(vec![], specs, runs, late).notes[0].contains("1 runs had fewer than 3 RSS samples"));
        // No sample at all (a run shorter than the interval): its peak.
        let unsampled = Run { samples: Vec::new(), max_rss_bytes: 7, ..r };
        assert_eq!(figures(&unsampled, &options()).steady_rss_bytes, 7);
    }

    #[test]
    fn peak_counts_the_kernel_high_water_mark() {
        let mut r = run(100, 40, 1.0, 1.0, 0);
        r.max_rss_bytes = 150;
        assert_eq!(figures(&r, &options()).peak_rss_bytes, 150);
    }

    #[test]
    fn downsampling_keeps_peaks() {
        let samples: Vec<RssSample> =
            (0..1000).map(|i| RssSample { seconds: i as f64, rss_bytes: if i == 537 { 999 } else { 1 } }).collect();
        let short = downsample(&samples, MAX_CHART_SAMPLES);
        assert!(short.len() <= MAX_CHART_SAMPLES);
        assert_eq!(short.iter().map(|s| s.rss_bytes).max(), Some(999));
        assert_eq!(downsample(&samples[..10], MAX_CHART_SAMPLES).len(), 10);
    }

    #[test]
    fn medians_and_ratios() {
        let c = compare_runs(vec![
            (
                "glibc",
                vec![run(100 * MIB, 80 * MIB, 1.0, 0.5, 1), run(100 * MIB, 90 * MIB, 1.2, 0.5, 1), run(100 * MIB, 70 * MIB, 1.1, 0.5, 1)],
            ),
            (
                "arena-max-2",
                vec![run(50 * MIB, 20 * MIB, 1.0, 0.5, 1), run(50 * MIB, 20 * MIB, 1.0, 0.5, 1), run(50 * MIB, 20 * MIB, 1.0, 0.5, 1)],
            ),
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
        assert_eq!(c.recommendation.confidence, Confidence::High, "{:?}", c.recommendation);
        assert_eq!(c.recommendation.metric, Metric::Steady);
        assert!(c.recommendation.text.starts_with("Use arena-max-2 (steady RSS, high confidence: 3 runs 20.0 MiB–20.0 MiB against glibc's 3 runs 70.0 MiB–90.0 MiB): steady RSS 80.0 MiB → 20.0 MiB (-75 %)"), "{}", c.recommendation.text);
        assert_eq!(base.spread.unwrap().steady_rss_bytes, Range { min: (70 * MIB) as f64, max: (90 * MIB) as f64 });
    }

    #[test]
    fn a_slower_config_is_a_trade_off() {
        let c = compare_runs(vec![
            ("glibc", vec![run(100 * MIB, 80 * MIB, 1.0, 1.0, 1)]),
            ("slow", vec![run(50 * MIB, 20 * MIB, 1.0, 1.5, 1)]),
        ]);
        assert_eq!(c.recommended, None);
        assert!(c.recommendation.text.contains("slow, costs more than +10 % time"), "{}", c.recommendation.text);
        assert!(c.recommendation.text.contains("CPU +50 %"), "{}", c.recommendation.text);
    }

    #[test]
    fn the_fast_one_is_recommended_and_a_lower_slow_one_mentioned() {
        let c = compare_runs(vec![
            ("glibc", vec![run(100 * MIB, 80 * MIB, 1.0, 1.0, 1)]),
            ("slow", vec![run(50 * MIB, 10 * MIB, 1.0, 2.0, 1)]),
            ("fast", vec![run(50 * MIB, 40 * MIB, 1.05, 1.05, 1)]),
        ]);
        assert_eq!(c.recommended.as_deref(), Some("fast"));
        assert!(c.recommendation.text.contains("; slow goes lower but costs more time"), "{}", c.recommendation.text);
    }

    #[test]
    fn no_saving_keeps_the_default() {
        let c = compare_runs(vec![("glibc", vec![run(100, 80, 1.0, 1.0, 1)]), ("same", vec![run(100, 79, 1.0, 1.0, 1)])]);
        assert_eq!(c.recommended, None);
        assert!(c.recommendation.text.starts_with("Keep the default (glibc)"), "{}", c.recommendation.text);
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
        assert!(
            c.recommendation.text.contains("not considered, their output or exit status differs: other-output, crashes"),
            "{}",
            c.recommendation.text
        );
    }

    #[test]
    fn unavailable_configs_have_no_figures() {
        let mut missing = spec("jemalloc");
        missing.available = false;
        let c = compare(vec!["prog".into()], vec![spec("glibc"), missing], vec![vec![run(100, 80, 1.0, 1.0, 1)], vec![]], options());
        let j = &c.configs[1];
        assert_eq!((j.repeats, j.steady_rss_bytes, j.steady_rss_ratio, j.output_differs), (0, None, None, false));
    }

    #[test]
    fn output_that_varies_in_the_default_is_compared_by_shape() {
        let printing = |line: &str, steady: u64| Run {
            stdout: Stdout::Lines(vec![line.to_string(), "done".into()]),
            ..run(100 * MIB, steady, 1.0, 1.0, 0)
        };
        let c = compare_runs(vec![
            ("glibc", vec![printing("at 10:00:01", 80 * MIB), printing("at 10:00:03", 80 * MIB)]),
            ("arena-max-2", vec![printing("at 10:00:02", 20 * MIB)]),
            (
                "other",
                vec![Run { stdout: Stdout::Lines(vec!["at 10:00:04".into(), "failed".into()]), ..run(100 * MIB, 10 * MIB, 1.0, 1.0, 0) }],
            ),
        ]);
        assert!(c.configs[0].output_varies);
        assert_eq!(c.baseline_varying_lines, 1);
        assert!(c.notes[0].contains("1 lines of the default's stdout vary"), "{:?}", c.notes);
        assert!(!c.configs[1].output_differs, "{:?}", c.configs[1]);
        assert!(c.configs[2].output_differs);
        assert_eq!(c.configs[2].output_differs_lines, 1);
        assert_eq!(c.configs[2].output_diff[0].expected.as_deref(), Some("done"));
        assert_eq!(c.recommended.as_deref(), Some("arena-max-2"), "{}", c.recommendation.text);
        let ignored = compare_with(
            vec![("glibc", vec![printing("a", 80 * MIB), printing("a", 80 * MIB)]), ("x", vec![printing("b", 80 * MIB)])],
            Options { ignore_output: true, ..options() },
        );
        assert!(!ignored.output_differs && ignored.output_check == "ignored");
    }

    #[test]
    fn gains_inside_the_defaults_own_spread_are_within_noise() {
        let c = compare_runs(vec![
            (
                "glibc",
                vec![run(100 * MIB, 100 * MIB, 1.0, 1.0, 1), run(100 * MIB, 70 * MIB, 1.0, 1.0, 1), run(100 * MIB, 90 * MIB, 1.0, 1.0, 1)],
            ),
            (
                "trim",
                vec![run(100 * MIB, 75 * MIB, 1.0, 1.0, 1), run(100 * MIB, 78 * MIB, 1.0, 1.0, 1), run(100 * MIB, 80 * MIB, 1.0, 1.0, 1)],
            ),
        ]);
        // A gain of 12 MiB against a spread of 30 MiB.
        assert_eq!(c.recommended, None);
        assert_eq!(c.recommendation.confidence, Confidence::WithinNoise);
        assert!(c.recommendation.text.starts_with("Keep the default (glibc): within noise"), "{}", c.recommendation.text);
        // The same gain with a quiet default is real, but one run each is not sure.
        let c = compare_runs(vec![
            ("glibc", vec![run(100 * MIB, 90 * MIB, 1.0, 1.0, 1), run(100 * MIB, 90 * MIB, 1.0, 1.0, 1)]),
            ("trim", vec![run(100 * MIB, 78 * MIB, 1.0, 1.0, 1)]),
        ]);
        assert_eq!(c.recommended.as_deref(), Some("trim"));
        assert_eq!(c.recommendation.confidence, Confidence::Low);
        // Everything worse by more than the noise.
        let c = compare_runs(vec![("glibc", vec![run(100, 50, 1.0, 1.0, 1); 3]), ("jemalloc", vec![run(100, 90, 1.0, 1.0, 1); 3])]);
        assert!(
            c.recommendation.text.starts_with("Keep the default (glibc): every other configuration has a higher steady RSS"),
            "{}",
            c.recommendation.text
        );
        assert_eq!(c.recommendation.confidence, Confidence::High);
    }

    #[test]
    fn a_slowdown_inside_the_defaults_own_time_spread_is_no_trade_off() {
        let c = compare_runs(vec![
            ("glibc", vec![run(100 * MIB, 80 * MIB, 1.0, 1.0, 1), run(100 * MIB, 80 * MIB, 1.5, 1.5, 1)]),
            ("trim", vec![run(100 * MIB, 20 * MIB, 1.6, 1.6, 1)]),
        ]);
        assert_eq!(c.recommended.as_deref(), Some("trim"), "{}", c.recommendation.text);
    }

    /// RSS at `high` until `drop_at` of the run, `low` after.
    fn dropping(high: u64, low: u64, drop_at: f64, wall: f64) -> Run {
        let samples = (0..=100)
            .map(|i| i as f64 * wall / 100.0)
            .map(|t| RssSample { seconds: t, rss_bytes: if t < drop_at * wall { high } else { low } })
            .collect();
        Run { samples, wall_seconds: wall, cpu_seconds: 1.0, max_rss_bytes: high, ..Run::default() }
    }

    #[test]
    fn final_rss_is_the_last_second_and_settling_is_when_it_stays_there() {
        // 4 s: 400 MiB until 2.96 s, then 50 MiB (jemalloc decaying late).
        let r = dropping(400 * MIB, 50 * MIB, 0.74, 4.0);
        let f = figures(&r, &options());
        assert_eq!(f.final_rss_bytes, 50 * MIB, "the last second is after the drop");
        assert!(f.steady_rss_bytes > 200 * MIB, "steady still holds the plateau: {f:?}");
        assert!((f.settle_seconds.unwrap() - 2.96).abs() < 0.05, "{f:?}");
        // Before --final-at 2: the plateau.
        let at = figures(&r, &Options { final_at: Some(2.0), ..options() });
        assert_eq!(at.final_rss_bytes, 400 * MIB);
        // A short run: the last quarter.
        assert_eq!(final_rss(&dropping(9, 1, 0.7, 0.4).samples, 0.4), Some(1));
        assert_eq!(final_rss(&[], 1.0), None);
    }

    #[test]
    fn the_metric_picks_what_is_optimised() {
        let configs = vec![
            ("glibc", vec![dropping(400 * MIB, 300 * MIB, 0.74, 4.0); 3]),
            // Lower steady RSS, but it stays there.
            ("arena", vec![dropping(150 * MIB, 150 * MIB, 0.74, 4.0); 3]),
            // Higher until late, then the lowest.
            ("jemalloc", vec![dropping(400 * MIB, 20 * MIB, 0.74, 4.0); 3]),
        ];
        let steady = compare_with(configs.clone(), options());
        assert_eq!(steady.recommended.as_deref(), Some("arena"), "{}", steady.recommendation.text);
        let last = compare_with(configs, Options { metric: Metric::Final, ..options() });
        assert_eq!(last.recommended.as_deref(), Some("jemalloc"), "{}", last.recommendation.text);
        assert_eq!(last.recommendation.metric, Metric::Final);
        assert!(last.recommendation.text.contains("(final RSS, high confidence"), "{}", last.recommendation.text);
        let json = serde_json::to_value(&last).unwrap();
        assert_eq!(json["recommendation"]["metric"], "final");
        assert_eq!(json["recommendation"]["confidence"], "high");
        assert_eq!(json["configs"][2]["final_rss_bytes"], 20 * MIB);
        assert!(json["configs"][2]["settle_seconds"].as_f64().is_some());
        assert_eq!(json["configs"][2]["spread"]["final_rss_bytes"]["max"], (20 * MIB) as f64);
        assert_eq!(json["configs"][2]["output_differs_lines"], 0);
    }

    #[test]
    fn most_common_exit_code() {
        assert_eq!(most_common(&[1, 0, 0]), Some(0));
        assert_eq!(most_common(&[1, 0]), Some(1));
        assert_eq!(most_common(&[]), None);
    }
}
