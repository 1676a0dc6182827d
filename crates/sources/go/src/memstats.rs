//! `runtime.MemStats` as a running service exposes it over HTTP, restated in
//! runtime/metrics names (the equivalences of runtime/metrics'
//! description.go) so the model reads one vocabulary:
//! - `net/http/pprof`: `/debug/pprof/heap?debug=1` ends with `# runtime.MemStats`
//!   and one `# Name = value` line per field (`# Stack = inuse / sys`);
//! - `expvar`: `/debug/vars` is JSON with a `memstats` object, `BySize` included.

use std::collections::BTreeMap;

use crate::names;

/// The MemStats fields memgap reads, by their Go names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemStats {
    pub fields: BTreeMap<String, u64>,
    /// Per size class (expvar only): object size, mallocs, frees.
    pub by_size: Vec<(u64, u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoMemStats(pub &'static str);

impl std::fmt::Display for NoMemStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

const NEEDED: [&str; 6] = ["HeapAlloc", "HeapInuse", "HeapIdle", "HeapReleased", "HeapSys", "Sys"];

/// The `# runtime.MemStats` trailer of `/debug/pprof/heap?debug=1`.
pub fn parse_pprof_heap(text: &str) -> Result<MemStats, NoMemStats> {
    let trailer = text
        .split_once("# runtime.MemStats")
        .ok_or(NoMemStats("the heap profile has no '# runtime.MemStats' section (not a Go net/http/pprof heap profile?)"))?
        .1;
    let mut stats = MemStats::default();
    for line in trailer.lines() {
        let Some((name, value)) = line.strip_prefix("# ").and_then(|l| l.split_once(" = ")) else { continue };
        let number = |v: &str| v.trim().parse::<u64>().ok();
        match value.split_once(" / ") {
            // `Stack = StackInuse / StackSys` and the like.
            Some((inuse, sys)) => {
                if let (Some(inuse), Some(sys)) = (number(inuse), number(sys)) {
                    stats.fields.insert(format!("{name}Inuse"), inuse);
                    stats.fields.insert(format!("{name}Sys"), sys);
                }
            }
            None => {
                if let Some(v) = number(value) {
                    stats.fields.insert(name.to_string(), v);
                }
            }
        }
    }
    stats.check()
}

/// The `memstats` object of expvar's `/debug/vars`.
pub fn parse_expvar(text: &str) -> Result<MemStats, NoMemStats> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|_| NoMemStats("/debug/vars is not JSON (not a Go expvar endpoint?)"))?;
    let memstats =
        json.get("memstats").and_then(|m| m.as_object()).ok_or(NoMemStats("/debug/vars has no 'memstats' object (is expvar imported?)"))?;
    let mut stats = MemStats::default();
    for (name, value) in memstats {
        if let Some(v) = value.as_u64() {
            stats.fields.insert(name.clone(), v);
        }
    }
    if let Some(classes) = memstats.get("BySize").and_then(|b| b.as_array()) {
        let field = |c: &serde_json::Value, k: &str| c.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        stats.by_size =
            classes.iter().map(|c| (field(c, "Size"), field(c, "Mallocs"), field(c, "Frees"))).filter(|&(size, _, _)| size > 0).collect();
    }
    stats.check()
}

impl MemStats {
    fn check(self) -> Result<MemStats, NoMemStats> {
        if NEEDED.iter().all(|n| self.fields.contains_key(*n)) {
            Ok(self)
        } else {
            Err(NoMemStats("the MemStats read lack heap fields (HeapAlloc, HeapInuse, HeapIdle, HeapReleased, HeapSys, Sys)"))
        }
    }

    fn get(&self, name: &str) -> u64 {
        self.fields.get(name).copied().unwrap_or(0)
    }

    /// The /memory/classes/* figures (and GC cycles, by-size histograms when
    /// known) these MemStats amount to.
    pub fn to_metric_values(&self) -> Vec<(String, f64)> {
        let g = |n| self.get(n);
        let mut values: Vec<(&str, u64)> = vec![
            (names::HEAP_OBJECTS, g("HeapAlloc")),
            (names::HEAP_UNUSED, g("HeapInuse").saturating_sub(g("HeapAlloc"))),
            (names::HEAP_FREE, g("HeapIdle").saturating_sub(g("HeapReleased"))),
            (names::HEAP_RELEASED, g("HeapReleased")),
            (names::HEAP_STACKS, g("StackInuse")),
            (names::OS_STACKS, g("StackSys").saturating_sub(g("StackInuse"))),
            (names::MSPAN_INUSE, g("MSpanInuse")),
            (names::MSPAN_FREE, g("MSpanSys").saturating_sub(g("MSpanInuse"))),
            (names::MCACHE_INUSE, g("MCacheInuse")),
            (names::MCACHE_FREE, g("MCacheSys").saturating_sub(g("MCacheInuse"))),
            (names::METADATA_OTHER, g("GCSys")),
            (names::PROFILING_BUCKETS, g("BuckHashSys")),
            (names::OTHER, g("OtherSys")),
            (names::TOTAL, g("Sys")),
        ];
        // Read from a process's memory, the goal is not known (the runtime computes it).
        if self.fields.contains_key("NextGC") {
            values.push((names::HEAP_GOAL, g("NextGC")));
        }
        if self.fields.contains_key("NumGC") {
            values.push((names::GC_CYCLES, g("NumGC")));
        }
        let mut out: Vec<(String, f64)> = values.into_iter().map(|(n, v)| (n.to_string(), v as f64)).collect();
        for &(size, mallocs, frees) in &self.by_size {
            // A class of `size` bytes is the bucket [previous + 1, size + 1) (runtime/metrics.go).
            out.push((names::bucket(names::ALLOCS_BY_SIZE, (size + 1) as f64), mallocs as f64));
            out.push((names::bucket(names::FREES_BY_SIZE, (size + 1) as f64), frees as f64));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of a real go1.26.8 `/debug/pprof/heap?debug=1` (PauseNs and PauseEnd shortened).
    const PPROF: &str = "heap profile: 0: 0 [0: 0] @ heap/1048576\n\n\
# runtime.MemStats\n# Alloc = 231888\n# TotalAlloc = 231888\n# Sys = 8083720\n# Lookups = 0\n# Mallocs = 739\n# Frees = 21\n# HeapAlloc = 231888\n\
# HeapSys = 3866624\n# HeapIdle = 3121152\n# HeapInuse = 745472\n# HeapReleased = 3121152\n# HeapObjects = 718\n# Stack = 327680 / 327680\n\
# MSpan = 23840 / 32640\n# MCache = 4592 / 16072\n# BuckHashSys = 1443389\n# GCSys = 1728784\n# OtherSys = 668531\n# NextGC = 4194304\n# LastGC = 0\n\
# PauseNs = [0 0 0]\n# PauseEnd = [0 0 0]\n# NumGC = 0\n# NumForcedGC = 0\n# GCCPUFraction = 0\n# DebugGC = false\n# MaxRSS = 9310208\n";

    #[test]
    fn pprof_trailer_sums_to_sys() {
        let stats = parse_pprof_heap(PPROF).unwrap();
        assert_eq!(stats.fields["StackInuse"], 327680);
        assert_eq!(stats.fields["MCacheSys"], 16072);
        let values = stats.to_metric_values();
        let get = |n: &str| values.iter().find(|(name, _)| name == n).unwrap().1;
        assert_eq!(get(names::HEAP_UNUSED), 745472.0 - 231888.0);
        assert_eq!(get(names::HEAP_FREE), 0.0);
        // The 13 classes add up to the total, as runtime/metrics promises.
        let classes: f64 =
            values.iter().filter(|(n, _)| n.starts_with("/memory/classes/") && n.as_str() != names::TOTAL).map(|(_, v)| v).sum();
        assert_eq!(classes, get(names::TOTAL));
        assert!(parse_pprof_heap("heap profile: 0: 0 [0: 0] @ heap/1048576\n").is_err());
    }

    #[test]
    fn expvar_memstats_with_by_size() {
        let text = r#"{"cmdline":["./svc"],"memstats":{"Alloc":10,"HeapAlloc":10,"HeapInuse":8192,"HeapIdle":0,"HeapReleased":0,"HeapSys":8192,"Sys":9000,"NumGC":2,
            "BySize":[{"Size":0,"Mallocs":0,"Frees":0},{"Size":8,"Mallocs":5,"Frees":1},{"Size":16,"Mallocs":7,"Frees":7}]}}"#;
        let stats = parse_expvar(text).unwrap();
        assert_eq!(stats.by_size, vec![(8, 5, 1), (16, 7, 7)]);
        let values = stats.to_metric_values();
        assert!(values.contains(&("/gc/heap/allocs-by-size:bytes[9]".into(), 5.0)));
        assert!(values.contains(&(names::GC_CYCLES.into(), 2.0)));
        assert!(parse_expvar(r#"{"cmdline":[]}"#).is_err());
        assert!(parse_expvar("<html>").is_err());
    }
}
