//! The outside ledgers of running processes as Prometheus metrics (text
//! exposition format 0.0.4), for `memgap exporter`.
//!
//! Conventions followed: every family has HELP and TYPE lines, units are in
//! the names (`_bytes`, `_seconds`), counters end in `_total`, and a figure
//! memgap does not know is absent rather than zero.

use std::collections::BTreeMap;
use std::fmt::Write;

use memgap_model::{CgroupMemory, HeapKind, ProcessLedger};

/// The content type of [`prometheus_text`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why a process listed for a scrape was left out of it.
pub const SKIP_REASONS: [&str; 3] = ["vanished", "not_permitted", "unreadable"];

/// Everything one scrape found.
#[derive(Debug, Default)]
pub struct Scrape {
    pub processes: Vec<ProcessLedger>,
    /// The cgroup given with `--cgroup`, as it stood during the scrape.
    pub cgroup: Option<CgroupMemory>,
    /// Processes left out, by reason (one of [`SKIP_REASONS`]).
    pub skipped: BTreeMap<&'static str, u64>,
    pub duration_seconds: f64,
    /// How old each process's allocator statistics are, in seconds, by pid
    /// (the exporter calls into a process for them only now and then).
    pub allocator_stats_age_seconds: BTreeMap<u32, f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Integer(u64),
    Float(f64),
}

/// One metric family and its samples.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Vec<(&'static str, String)>, Value)>,
}

impl Family {
    fn gauge(name: &'static str, help: &'static str) -> Family {
        Family { name, help, kind: Kind::Gauge, samples: Vec::new() }
    }

    fn counter(name: &'static str, help: &'static str) -> Family {
        Family { name, help, kind: Kind::Counter, samples: Vec::new() }
    }

    fn add(&mut self, labels: Vec<(&'static str, String)>, value: Value) {
        self.samples.push((labels, value));
    }

    fn write(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let kind = match self.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        for (labels, value) in &self.samples {
            out.push_str(self.name);
            if !labels.is_empty() {
                let pairs: Vec<String> = labels.iter().map(|(name, value)| format!("{name}=\"{}\"", escape_label_value(value))).collect();
                let _ = write!(out, "{{{}}}", pairs.join(","));
            }
            match value {
                Value::Integer(v) => {
                    let _ = writeln!(out, " {v}");
                }
                Value::Float(v) => {
                    let _ = writeln!(out, " {v}");
                }
            }
        }
    }
}

/// A label value as the exposition format wants it: backslash, double quote
/// and line feed escaped.
pub fn escape_label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// HELP text escapes backslash and line feed only.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The rows of a process's ledger with a known value, by name.
///
/// Read through the rows' JSON form, so that the exporter publishes exactly
/// the rows `memgap snapshot PID --json` shows: a row snapshot cannot fill
/// (listed in `unknown_rows`, or null) is left out, never exported as zero.
pub fn known_rows(ledger: &ProcessLedger) -> Vec<(String, u64)> {
    let rows = serde_json::to_value(ledger.rows).unwrap_or_default();
    let Some(rows) = rows.as_object() else { return Vec::new() };
    rows.iter()
        .filter(|(name, _)| !ledger.unknown_rows.contains(&name.as_str()))
        .filter_map(|(name, value)| Some((name.clone(), value.as_u64()?)))
        .collect()
}

/// The label naming one heap mapping: `main` (the brk heap), the start
/// address of a glibc arena's heap, or `other` (the other anonymous mappings).
fn heap_label(kind: HeapKind, start: u64) -> String {
    match kind {
        HeapKind::BrkHeap => "main".to_string(),
        HeapKind::Arena => format!("{start:#x}"),
        _ => "other".to_string(),
    }
}

/// The scrape as Prometheus text.
pub fn prometheus_text(scrape: &Scrape) -> String {
    let mut info = Family::gauge(
        "memgap_process_info",
        "A process memgap read, and whose malloc it calls (glibc, jemalloc, tcmalloc, mimalloc or unknown)",
    );
    let mut rss = Family::gauge("memgap_rss_bytes", "Resident set size (VmRSS of /proc/PID/status)");
    let mut ledger_rows = Family::gauge(
        "memgap_ledger_bytes",
        "Resident bytes in each ledger row memgap knows from outside; rows it cannot know without a recording are absent",
    );
    let mut groups = Family::gauge(
        "memgap_mapping_group_resident_bytes",
        "Resident bytes (smaps Rss) of each group of mappings: heap, stacks, file, shared, anonymous_other",
    );
    let mut threads = Family::gauge("memgap_threads", "Threads of the process");
    let mut arenas =
        Family::gauge("memgap_glibc_arenas", "glibc malloc arenas seen in the memory map: the main one plus one per 64 MiB arena heap");
    let mut heaps = Family::gauge(
        "memgap_heap_resident_bytes",
        "Resident bytes (smaps Rss) of each heap mapping: main (the brk heap), a glibc arena heap by start address, other (the other anonymous mappings)",
    );
    let mut numa = Family::gauge("memgap_numa_resident_bytes", "Resident bytes on each NUMA node (numa_maps)");
    let mut allocator_rows = Family::gauge(
        "memgap_allocator_rows_bytes",
        "The heap split by the allocator's own statistics (jemalloc's stats.*, tcmalloc's properties), as old as memgap_allocator_stats_age_seconds says",
    );
    let mut allocator_age = Family::gauge(
        "memgap_allocator_stats_age_seconds",
        "How old the allocator's own statistics in this scrape are: memgap calls into the process for them at most once per --allocator-stats-every",
    );
    for l in &scrape.processes {
        let process = || vec![("pid", l.pid.to_string()), ("comm", l.command.clone())];
        info.add([process(), vec![("allocator", l.allocator.clone())]].concat(), Value::Integer(1));
        rss.add(process(), Value::Integer(l.rss_bytes));
        for (row, bytes) in known_rows(l) {
            ledger_rows.add([process(), vec![("row", row)]].concat(), Value::Integer(bytes));
        }
        let g = &l.groups;
        for (group, bytes) in
            [("heap", g.heap), ("stacks", g.stacks), ("file", g.file), ("shared", g.shared), ("anonymous_other", g.anonymous_other)]
        {
            groups.add([process(), vec![("group", group.to_string())]].concat(), Value::Integer(bytes));
        }
        threads.add(process(), Value::Integer(u64::from(l.threads)));
        if l.allocator == "glibc" {
            arenas.add(process(), Value::Integer(u64::from(l.arenas)));
        }
        for heap in &l.heaps {
            let labels = vec![("heap", heap_label(heap.kind, heap.start)), ("kind", heap.kind.as_str().to_string())];
            heaps.add([process(), labels].concat(), Value::Integer(heap.resident_bytes));
        }
        for (node, bytes) in &l.numa {
            numa.add([process(), vec![("node", node.to_string())]].concat(), Value::Integer(*bytes));
        }
        if let Some(r) = &l.allocator_rows {
            for (row, bytes) in [
                ("live", r.live),
                ("fragmented", r.fragmented),
                ("retained", r.retained),
                ("metadata", r.metadata),
                ("unaccounted", r.unaccounted),
            ] {
                allocator_rows.add([process(), vec![("row", row.to_string())]].concat(), Value::Integer(bytes));
            }
        }
        if let Some(&age) = scrape.allocator_stats_age_seconds.get(&l.pid) {
            allocator_age.add(process(), Value::Float(age));
        }
    }

    let mut cgroup_current = Family::gauge("memgap_cgroup_memory_current_bytes", "The memory cgroup's usage (memory.current)");
    let mut cgroup_max =
        Family::gauge("memgap_cgroup_memory_max_bytes", "The lowest memory.max from the cgroup up to the root; absent when unlimited");
    let mut cgroup_headroom =
        Family::gauge("memgap_cgroup_memory_headroom_bytes", "memory.max minus memory.current: how far the cgroup is from its limit");
    let mut cgroup_oom_kills =
        Family::counter("memgap_cgroup_oom_kills_total", "Processes of the cgroup the OOM killer has killed (memory.events oom_kill)");
    if let Some(cgroup) = &scrape.cgroup {
        let labels = || vec![("cgroup", cgroup.path.clone())];
        cgroup_current.add(labels(), Value::Integer(cgroup.current_bytes));
        if let Some(max) = cgroup.max_bytes {
            let limit_path = cgroup.limit_path.clone().unwrap_or_else(|| cgroup.path.clone());
            cgroup_max.add([labels(), vec![("limit_cgroup", limit_path)]].concat(), Value::Integer(max));
        }
        if let Some(headroom) = cgroup.headroom_bytes {
            cgroup_headroom.add(labels(), Value::Integer(headroom));
        }
        if let Some(kills) = cgroup.oom_kills {
            cgroup_oom_kills.add(labels(), Value::Integer(kills));
        }
    }

    let mut duration = Family::gauge("memgap_scrape_duration_seconds", "Time memgap took to read every process of this scrape");
    duration.add(Vec::new(), Value::Float(scrape.duration_seconds));
    let mut read = Family::gauge("memgap_scrape_processes", "Processes read in this scrape");
    read.add(Vec::new(), Value::Integer(scrape.processes.len() as u64));
    let mut skipped = Family::gauge(
        "memgap_scrape_skipped_processes",
        "Processes listed but left out of this scrape: vanished (exited meanwhile), not_permitted, unreadable",
    );
    for reason in SKIP_REASONS {
        skipped.add(vec![("reason", reason.to_string())], Value::Integer(scrape.skipped.get(reason).copied().unwrap_or(0)));
    }

    let mut out = String::new();
    for family in [
        info,
        rss,
        ledger_rows,
        groups,
        threads,
        arenas,
        heaps,
        numa,
        cgroup_current,
        cgroup_max,
        cgroup_headroom,
        cgroup_oom_kills,
        duration,
        read,
        skipped,
        allocator_rows,
        allocator_age,
    ] {
        family.write(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_model::{Groups, HeapMapping, KnownRows};

    /// One sample line, parsed strictly.
    #[derive(Debug, PartialEq)]
    struct Sample {
        name: String,
        labels: Vec<(String, String)>,
        value: f64,
    }

    /// A strict reader of the text format: every sample belongs to the family
    /// whose HELP and TYPE lines (in that order, once each) come right before
    /// its samples, names and label names are valid, label values are quoted
    /// with only \\, \" and \n escapes, no label repeats, no series repeats.
    fn parse(text: &str) -> Result<Vec<Sample>, String> {
        let valid_name = |name: &str, colon: bool| {
            let mut chars = name.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
        };
        if !text.ends_with('\n') {
            return Err("no final line feed".into());
        }
        let mut samples = Vec::new();
        let mut families_seen = std::collections::HashSet::new();
        let mut series_seen = std::collections::HashSet::new();
        let mut current: Option<(String, String)> = None;
        let mut pending_help: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').ok_or(format!("HELP without text: {line}"))?;
                if !valid_name(name, true) || !families_seen.insert(name.to_string()) {
                    return Err(format!("bad or repeated family {name}"));
                }
                let mut chars = help.chars();
                while let Some(c) = chars.next() {
                    if c == '\\' && !matches!(chars.next(), Some('\\' | 'n')) {
                        return Err(format!("bad escape in HELP: {line}"));
                    }
                }
                pending_help = Some(name.to_string());
                current = None;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or(format!("TYPE without type: {line}"))?;
                if pending_help.take().as_deref() != Some(name) {
                    return Err(format!("TYPE of {name} not right after its HELP"));
                }
                if !["gauge", "counter"].contains(&kind) {
                    return Err(format!("unexpected type {kind}"));
                }
                if kind == "counter" && !name.ends_with("_total") {
                    return Err(format!("counter {name} does not end in _total"));
                }
                current = Some((name.to_string(), kind.to_string()));
            } else if line.starts_with('#') || line.is_empty() {
                return Err(format!("unexpected line: {line:?}"));
            } else {
                let (family, _) = current.as_ref().ok_or(format!("sample before HELP/TYPE: {line}"))?;
                let name_end = line.find(['{', ' ']).ok_or(format!("no value: {line}"))?;
                let name = &line[..name_end];
                if name != family {
                    return Err(format!("sample {name} inside family {family}"));
                }
                let mut rest = &line[name_end..];
                let mut labels = Vec::new();
                if let Some(inner) = rest.strip_prefix('{') {
                    rest = inner;
                    loop {
                        let eq = rest.find('=').ok_or(format!("label without =: {line}"))?;
                        let label = &rest[..eq];
                        if !valid_name(label, false) || label.starts_with("__") {
                            return Err(format!("bad label name {label:?}"));
                        }
                        rest = rest[eq + 1..].strip_prefix('"').ok_or(format!("unquoted label value: {line}"))?;
                        let mut value = String::new();
                        let mut chars = rest.char_indices();
                        let end = loop {
                            match chars.next() {
                                Some((_, '\\')) => match chars.next() {
                                    Some((_, '\\')) => value.push('\\'),
                                    Some((_, '"')) => value.push('"'),
                                    Some((_, 'n')) => value.push('\n'),
                                    _ => return Err(format!("bad escape in label value: {line}")),
                                },
                                Some((i, '"')) => break i,
                                Some((_, '\n')) | None => return Err(format!("unterminated label value: {line}")),
                                Some((_, c)) => value.push(c),
                            }
                        };
                        if labels.iter().any(|(l, _): &(String, String)| l == label) {
                            return Err(format!("label {label} repeated: {line}"));
                        }
                        labels.push((label.to_string(), value));
                        rest = &rest[end + 1..];
                        if let Some(after) = rest.strip_prefix(',') {
                            rest = after;
                        } else {
                            rest = rest.strip_prefix('}').ok_or(format!("labels not closed: {line}"))?;
                            break;
                        }
                    }
                }
                let value = rest.strip_prefix(' ').ok_or(format!("no space before the value: {line}"))?;
                let value: f64 = value.parse().map_err(|_| format!("bad value {value:?}: {line}"))?;
                if !series_seen.insert((name.to_string(), labels.clone())) {
                    return Err(format!("series repeated: {line}"));
                }
                samples.push(Sample { name: name.to_string(), labels, value });
            }
        }
        if let Some(name) = pending_help {
            return Err(format!("HELP of {name} without TYPE"));
        }
        Ok(samples)
    }

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        samples
            .iter()
            .find(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.iter().any(|(l, w)| l == k && w == v)))
            .map(|s| s.value)
    }

    fn ledger(pid: u32, command: &str) -> ProcessLedger {
        ProcessLedger {
            pid,
            command: command.into(),
            threads: 3,
            allocator: "glibc".into(),
            rss_bytes: 100 << 20,
            rows: KnownRows { heap: 80 << 20, lazy_free: 0, runtime: 1 << 20, other: 19 << 20, ..KnownRows::default() },
            unknown_rows: memgap_model::UNKNOWN_ROWS.to_vec(),
            arenas: 2,
            heaps: vec![
                HeapMapping { kind: HeapKind::BrkHeap, start: 0x5555_0000_0000, resident_bytes: 30 << 20, ..HeapMapping::default() },
                HeapMapping { kind: HeapKind::Arena, start: 0x7f00_0000_0000, resident_bytes: 50 << 20, ..HeapMapping::default() },
            ],
            groups: Groups { heap: 80 << 20, stacks: 1 << 20, file: 19 << 20, shared: 0, anonymous_other: 0 },
            numa: BTreeMap::from([(0, 60 << 20), (1, 40 << 20)]),
            ..ProcessLedger::default()
        }
    }

    #[test]
    fn publishes_each_known_row_and_no_unknown_one() {
        let scrape = Scrape { processes: vec![ledger(42, "server")], duration_seconds: 0.0125, ..Scrape::default() };
        let text = prometheus_text(&scrape);
        let samples = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let process = [("pid", "42"), ("comm", "server")];
        let row = |r| value(&samples, "memgap_ledger_bytes", &[process[0], process[1], ("row", r)]);
        assert_eq!(row("heap"), Some((80 << 20) as f64));
        assert_eq!(row("lazy_free"), Some(0.0), "a known zero is published");
        assert_eq!(row("runtime"), Some((1 << 20) as f64));
        assert_eq!(row("other"), Some((19 << 20) as f64));
        for unknown in ["live", "slack", "fragmented", "retained"] {
            assert_eq!(row(unknown), None, "{unknown} is not known from outside:\n{text}");
        }
        assert_eq!(value(&samples, "memgap_rss_bytes", &process), Some((100 << 20) as f64));
        assert_eq!(value(&samples, "memgap_glibc_arenas", &process), Some(2.0));
        assert_eq!(value(&samples, "memgap_heap_resident_bytes", &[("heap", "main"), ("kind", "brk heap")]), Some((30 << 20) as f64));
        assert_eq!(
            value(&samples, "memgap_heap_resident_bytes", &[("heap", "0x7f0000000000"), ("kind", "arena")]),
            Some((50 << 20) as f64)
        );
        assert_eq!(value(&samples, "memgap_process_info", &[("allocator", "glibc")]), Some(1.0));
        assert_eq!(value(&samples, "memgap_numa_resident_bytes", &[("node", "1")]), Some((40 << 20) as f64));
        assert_eq!(value(&samples, "memgap_scrape_duration_seconds", &[]), Some(0.0125));
        assert_eq!(value(&samples, "memgap_scrape_skipped_processes", &[("reason", "vanished")]), Some(0.0));
        // No cgroup given: no cgroup family at all, not zeros.
        assert!(!text.contains("memgap_cgroup"), "{text}");
    }

    #[test]
    fn a_row_the_ledger_knows_is_published_once_it_is_known() {
        let mut l = ledger(7, "x");
        l.unknown_rows = vec!["live", "slack", "fragmented", "retained", "lazy_free"];
        let mut names: Vec<String> = known_rows(&l).into_iter().map(|(name, _)| name).collect();
        names.sort();
        assert_eq!(names, ["heap", "other", "runtime"]);
    }

    #[test]
    fn escapes_label_values_so_a_strict_reader_gets_them_back() {
        let hostile = "a\"b\\c\nd} e,f=\"g";
        let mut l = ledger(9, hostile);
        l.allocator = "jemalloc".into();
        let scrape = Scrape { processes: vec![l], ..Scrape::default() };
        let text = prometheus_text(&scrape);
        let samples = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let rss = samples.iter().find(|s| s.name == "memgap_rss_bytes").expect("an RSS sample");
        assert_eq!(rss.labels, [("pid".to_string(), "9".to_string()), ("comm".to_string(), hostile.to_string())]);
        assert_eq!(text.lines().filter(|l| l.starts_with("memgap_rss_bytes{")).count(), 1, "one line per sample:\n{text}");
        assert_eq!(value(&samples, "memgap_glibc_arenas", &[]), None, "arenas are glibc's");
        assert_eq!(escape_label_value("\\\"\n"), "\\\\\\\"\\n");
        assert_eq!(escape_help("a\\b\nc"), "a\\\\b\\nc");
    }

    #[test]
    fn cgroup_figures_with_and_without_a_limit() {
        let limited = CgroupMemory {
            version: 2,
            path: "/system.slice/app.service".into(),
            current_bytes: 700 << 20,
            max_bytes: Some(1 << 30),
            limit_path: Some("/system.slice".into()),
            oom_kills: Some(2),
            headroom_bytes: Some((1 << 30) - (700 << 20)),
            ..CgroupMemory::default()
        };
        let scrape = Scrape { cgroup: Some(limited), ..Scrape::default() };
        let text = prometheus_text(&scrape);
        let samples = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let cgroup = ("cgroup", "/system.slice/app.service");
        assert_eq!(value(&samples, "memgap_cgroup_memory_current_bytes", &[cgroup]), Some((700 << 20) as f64));
        assert_eq!(
            value(&samples, "memgap_cgroup_memory_max_bytes", &[cgroup, ("limit_cgroup", "/system.slice")]),
            Some((1u64 << 30) as f64)
        );
        assert_eq!(value(&samples, "memgap_cgroup_memory_headroom_bytes", &[cgroup]), Some((324 << 20) as f64));
        assert_eq!(value(&samples, "memgap_cgroup_oom_kills_total", &[cgroup]), Some(2.0));
        assert!(text.contains("# TYPE memgap_cgroup_oom_kills_total counter\n"), "{text}");

        let unlimited = CgroupMemory { version: 2, path: "/u".into(), current_bytes: 4096, ..CgroupMemory::default() };
        let text = prometheus_text(&Scrape { cgroup: Some(unlimited), ..Scrape::default() });
        let samples = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(value(&samples, "memgap_cgroup_memory_current_bytes", &[("cgroup", "/u")]), Some(4096.0));
        for absent in ["memgap_cgroup_memory_max_bytes", "memgap_cgroup_memory_headroom_bytes", "memgap_cgroup_oom_kills_total"] {
            assert!(!text.contains(absent), "{absent} without a limit:\n{text}");
        }
    }

    #[test]
    fn every_family_follows_the_naming_conventions() {
        let mut l = ledger(1, "init");
        let rows = l.allocator_rows.get_or_insert_with(Default::default);
        (rows.live, rows.retained) = (7, 5);
        let cgroup = CgroupMemory {
            path: "/a".into(),
            current_bytes: 1,
            max_bytes: Some(2),
            headroom_bytes: Some(1),
            oom_kills: Some(0),
            ..CgroupMemory::default()
        };
        let scrape = Scrape {
            processes: vec![l],
            cgroup: Some(cgroup),
            skipped: BTreeMap::from([("vanished", 3)]),
            duration_seconds: 0.5,
            allocator_stats_age_seconds: BTreeMap::from([(1, 1.5)]),
        };
        let text = prometheus_text(&scrape);
        let samples = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(value(&samples, "memgap_scrape_skipped_processes", &[("reason", "vanished")]), Some(3.0));
        let process = [("pid", "1"), ("comm", "init")];
        assert_eq!(value(&samples, "memgap_allocator_rows_bytes", &[process[0], process[1], ("row", "retained")]), Some(5.0));
        assert_eq!(value(&samples, "memgap_allocator_stats_age_seconds", &process), Some(1.5));
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = line.split(' ').nth(2).unwrap();
            assert!(name.starts_with("memgap_"), "{name}");
            let unit_ok =
                ["_bytes", "_seconds", "_total", "_info", "_threads", "_arenas", "_processes"].iter().any(|unit| name.ends_with(unit));
            assert!(unit_ok, "{name} does not say its unit");
        }
    }

    #[test]
    fn the_strict_reader_rejects_what_it_should() {
        for bad in [
            "memgap_x 1\n",
            "# HELP memgap_x x\nmemgap_x 1\n",
            "# HELP memgap_x x\n# TYPE memgap_x gauge\nmemgap_x{a=\"b} 1\n",
            "# HELP memgap_x x\n# TYPE memgap_x gauge\nmemgap_x{a=\"\\t\"} 1\n",
            "# HELP memgap_x x\n# TYPE memgap_x gauge\nmemgap_x{a=\"1\",a=\"2\"} 1\n",
            "# HELP memgap_x x\n# TYPE memgap_x gauge\nmemgap_x 1\nmemgap_x 2\n",
            "# HELP memgap_x x\n# TYPE memgap_x counter\nmemgap_x 1\n",
            "# HELP memgap_x x\n# TYPE memgap_x gauge\nmemgap_y 1\n",
            "# HELP memgap_x x\n# TYPE memgap_x gauge\nmemgap_x one\n",
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
