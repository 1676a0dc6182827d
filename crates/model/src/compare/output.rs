//! Whether a configuration changed what the command printed, judged against
//! what the default configuration's own runs say about its output: a line
//! the default prints the same every time must come out the same; a line
//! whose numbers, hex addresses or times change between the default's runs
//! must keep its shape (the rest of the line); a line that changes more than
//! that is not compared. Output too large to keep is compared by hash.

use std::collections::HashMap;

pub use memgap_types::compare::Stdout;
use serde::Serialize;

/// Differing lines kept per configuration, for `--show-diff` and the JSON.
pub const MAX_DIFF_LINES: usize = 10;

/// One line of a configuration's stdout that the default's runs do not allow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputDiff {
    /// 1-based line number in the configuration's run; for output whose lines
    /// the default prints in varying order, the position is not meaningful.
    pub line: usize,
    /// What the default printed there (its first run), if anything.
    pub expected: Option<String>,
    /// What the configuration printed there, if anything.
    pub got: Option<String>,
}

/// How one line of a configuration's output must match the default's.
#[derive(Debug, Clone)]
pub enum LineRule {
    Exact(String),
    Shape(String),
    Any,
}

/// What the default's runs agree on.
#[derive(Debug, Clone)]
pub enum OutputModel {
    /// Output is not compared (`--ignore-output`).
    Ignored,
    /// The default's runs print the same number of lines: line by line.
    Lines { rules: Vec<LineRule>, first: Vec<String> },
    /// Their line counts differ: the shapes every run prints, with the
    /// fewest times any run printed each.
    Unordered { required: HashMap<String, usize>, known: HashMap<String, usize> },
    /// Some output was too large to keep: the hashes the default printed.
    Hashes(Vec<u64>),
}

impl OutputModel {
    /// Learns from the default's runs (stdout and its hash, per run).
    pub fn learn(runs: &[(&Stdout, u64)]) -> OutputModel {
        let mut lines: Vec<&Vec<String>> = Vec::new();
        for (stdout, _) in runs {
            match stdout {
                Stdout::Lines(l) => lines.push(l),
                Stdout::Hashed => return OutputModel::Hashes(runs.iter().map(|(_, hash)| *hash).collect()),
            }
        }
        let Some(first) = lines.first() else { return OutputModel::Hashes(Vec::new()) };
        if lines.iter().all(|l| l.len() == first.len()) {
            let rules = (0..first.len())
                .map(|i| {
                    let line = &first[i];
                    if lines.iter().all(|l| &l[i] == line) {
                        return LineRule::Exact(line.clone());
                    }
                    let wanted = shape(line);
                    if lines.iter().all(|l| shape(&l[i]) == wanted) { LineRule::Shape(wanted) } else { LineRule::Any }
                })
                .collect();
            return OutputModel::Lines { rules, first: (*first).clone() };
        }
        let counts: Vec<HashMap<String, usize>> = lines.iter().map(|l| shape_counts(l)).collect();
        let mut required = counts[0].clone();
        required.retain(|shape, count| {
            *count = counts.iter().map(|c| c.get(shape).copied().unwrap_or(0)).min().unwrap_or(0);
            *count > 0
        });
        let mut known = HashMap::new();
        for c in &counts {
            for (shape, &count) in c {
                let most = known.entry(shape.clone()).or_insert(0);
                *most = count.max(*most);
            }
        }
        OutputModel::Unordered { required, known }
    }

    /// Lines of the default's output that vary between its own runs.
    pub fn varying_lines(&self) -> usize {
        match self {
            OutputModel::Lines { rules, .. } => rules.iter().filter(|r| !matches!(r, LineRule::Exact(_))).count(),
            OutputModel::Unordered { required, known } => known.values().sum::<usize>() - required.values().sum::<usize>(),
            OutputModel::Ignored | OutputModel::Hashes(_) => 0,
        }
    }

    /// The lines of one run that the default does not allow (at most
    /// [`MAX_DIFF_LINES`] kept), and how many there are.
    pub fn check(&self, stdout: &Stdout, hash: u64) -> (usize, Vec<OutputDiff>) {
        let lines = match (self, stdout) {
            (OutputModel::Ignored, _) => return (0, Vec::new()),
            (OutputModel::Hashes(hashes), _) => return (usize::from(!hashes.contains(&hash)), Vec::new()),
            (_, Stdout::Hashed) => return (1, Vec::new()),
            (_, Stdout::Lines(lines)) => lines,
        };
        let mut diffs = Vec::new();
        let mut differing = 0;
        let mut note = |line: usize, expected: Option<&String>, got: Option<&String>| {
            differing += 1;
            if diffs.len() < MAX_DIFF_LINES {
                diffs.push(OutputDiff { line, expected: expected.cloned(), got: got.cloned() });
            }
        };
        match self {
            OutputModel::Lines { rules, first } => {
                for i in 0..rules.len().max(lines.len()) {
                    let allowed = match (rules.get(i), lines.get(i)) {
                        (Some(LineRule::Exact(wanted)), Some(line)) => wanted == line,
                        (Some(LineRule::Shape(wanted)), Some(line)) => *wanted == shape(line),
                        (Some(LineRule::Any), Some(_)) => true,
                        _ => false,
                    };
                    if !allowed {
                        note(i + 1, first.get(i), lines.get(i));
                    }
                }
            }
            OutputModel::Unordered { required, known } => {
                let counts = shape_counts(lines);
                let mut missing: Vec<(&String, usize)> = required
                    .iter()
                    .filter_map(|(shape, &want)| {
                        want.checked_sub(counts.get(shape).copied().unwrap_or(0)).filter(|&n| n > 0).map(|n| (shape, n))
                    })
                    .collect();
                missing.sort();
                for (shape, n) in missing {
                    for _ in 0..n {
                        note(0, Some(shape), None);
                    }
                }
                let mut extra_seen: HashMap<String, usize> = HashMap::new();
                for (i, line) in lines.iter().enumerate() {
                    let s = shape(line);
                    let seen = extra_seen.entry(s.clone()).or_insert(0);
                    *seen += 1;
                    if *seen > known.get(&s).copied().unwrap_or(0) {
                        note(i + 1, None, Some(line));
                    }
                }
            }
            OutputModel::Ignored | OutputModel::Hashes(_) => unreachable!(),
        }
        (differing, diffs)
    }
}

fn shape_counts(lines: &[String]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in lines {
        *counts.entry(shape(line)).or_insert(0) += 1;
    }
    counts
}

/// The line with every word that holds a digit (numbers, hex addresses,
/// times, dates, ids) replaced by `#`: what stays when those change.
pub fn shape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.bytes().any(|b| b.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in line.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Stdout {
        Stdout::Lines(text.lines().map(String::from).collect())
    }

    fn learn(outputs: &[&str]) -> OutputModel {
        let stdouts: Vec<Stdout> = outputs.iter().map(|o| lines(o)).collect();
        OutputModel::learn(&stdouts.iter().map(|s| (s, 0)).collect::<Vec<_>>())
    }

    #[test]
    fn shapes_keep_words_without_digits() {
        assert_eq!(shape("at 12:04:59.123 pid 4242 ptr 0x7ffd3a0 ok"), "at #:#:#.# pid # ptr # ok");
        assert_eq!(shape("x86_64 deadbeef"), "#_# deadbeef");
        assert_eq!(shape(""), "");
    }

    #[test]
    fn a_line_the_default_agrees_on_must_match_exactly() {
        let model = learn(&["time 1700000001\ncount 8", "time 1700000003\ncount 8"]);
        assert_eq!(model.varying_lines(), 1);
        assert_eq!(model.check(&lines("time 1700000007\ncount 8"), 0).0, 0, "the time varies by itself");
        let (differing, diffs) = model.check(&lines("time 1700000007\ncount 2"), 0);
        assert_eq!(differing, 1);
        assert_eq!(diffs, [OutputDiff { line: 2, expected: Some("count 8".into()), got: Some("count 2".into()) }]);
        // The varying line must keep its shape.
        assert_eq!(model.check(&lines("elapsed 3\ncount 8"), 0).0, 1);
        // A missing line differs.
        assert_eq!(model.check(&lines("time 1"), 0).0, 1);
    }

    #[test]
    fn a_line_that_changes_shape_in_the_default_is_not_compared() {
        let model = learn(&["id abc\nend", "id xyz\nend"]);
        assert_eq!(model.check(&lines("id anything at all\nend"), 0).0, 0);
        assert_eq!(model.check(&lines("id q\nEND"), 0).0, 1);
    }

    #[test]
    fn lines_in_varying_order_are_compared_as_a_multiset() {
        let model = learn(&["worker 1 done\nworker 2 done\ntotal 10", "worker 2 done\ntotal 10\nworker 1 done\nretry"]);
        assert!(matches!(model, OutputModel::Unordered { .. }));
        assert_eq!(model.check(&lines("total 10\nworker 7 done\nworker 9 done"), 0).0, 0);
        assert_eq!(model.check(&lines("total 10\nworker 7 done\nretry"), 0).0, 1, "a worker line is missing");
        assert_eq!(model.check(&lines("total 10\nworker 7 done\nworker 1 done\npanic"), 0).0, 1, "panic was never printed");
    }

    #[test]
    fn hashed_output_and_ignored_output() {
        let big = Stdout::Hashed;
        let model = OutputModel::learn(&[(&big, 7), (&big, 7)]);
        assert_eq!(model.check(&Stdout::Hashed, 7).0, 0);
        assert_eq!(model.check(&Stdout::Hashed, 8).0, 1);
        assert_eq!(OutputModel::Ignored.check(&lines("anything"), 1).0, 0);
    }
}
