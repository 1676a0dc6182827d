//! The GHC section: the ledger by RTS layer after a settled major GC, the
//! major GCs over time, GCs per capability, the program's own `+RTS -s`
//! figures beside memgap's, and the verdict.

use std::fmt::Write;

use memgap_model::ghc::{GhcPoint, GhcReport};
use serde::Serialize;

use crate::format::{bytes, count};
use crate::ledger::{signed_bytes, wrap};

fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "—".into(), bytes)
}

fn rows(p: &GhcPoint) -> String {
    let mut out = String::new();
    let rss = p.rss_bytes.unwrap_or(0);
    let _ = writeln!(out, "  {:<22} {:>11} {:>7}", "row", "bytes", "% RSS");
    for (name, value) in p.rows.named() {
        let Some(value) = value else {
            let _ = writeln!(out, "  {name:<22} {:>11}", "unknown");
            continue;
        };
        let share = if rss > 0 { value as f64 * 100.0 / rss as f64 } else { 0.0 };
        let _ = writeln!(out, "  {name:<22} {:>11} {share:>6.1}%", signed_bytes(value));
    }
    let _ = writeln!(out, "  {:<22} {:>11}", "RSS (sampled)", opt(p.rss_bytes));
    out
}

pub fn report(r: &GhcReport, title: &str) -> String {
    let mut out = String::new();
    let version = r.ghc_version.as_deref().map(|v| format!("GHC {v}, ")).unwrap_or_default();
    let _ = writeln!(
        out,
        "GHC heap — {title} — {version}{} GCs ({} major), max live {}, max heap {}, peak RSS {}",
        count(r.collections),
        count(r.major_collections),
        bytes(r.max_live_bytes),
        bytes(r.max_heap_size_bytes),
        opt(r.peak_rss_bytes)
    );
    if let Some(p) = &r.settled {
        let _ = writeln!(out);
        let blocks = if p.blocks_size_reported { "BLOCKS_SIZE" } else { "derived from GC_STATS_GHC" };
        let _ = writeln!(out, "  after the major GC at {:.2} s (blocks {blocks}):", p.seconds);
        out.push_str(&rows(p));
    }
    let majors: Vec<&GhcPoint> = r.timeline.iter().filter(|p| p.unmoved_bytes.is_some()).collect();
    if !majors.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "seconds", "RSS", "heap", "blocks", "live", "unmoved", "lazy_free", "non_heap"
        );
        // At most 40 lines: evenly spaced major GCs, always the last ones.
        let step = majors.len().div_ceil(40).max(1);
        for (i, p) in majors.iter().enumerate() {
            if i % step != 0 && i + 2 < majors.len() {
                continue;
            }
            let _ = writeln!(
                out,
                "  {:>8.2} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                p.seconds,
                opt(p.rss_bytes),
                bytes(p.heap_size_bytes),
                bytes(p.blocks_size_bytes),
                bytes(p.live_bytes),
                opt(p.unmoved_bytes),
                opt(p.rows.lazy_free),
                p.rows.non_heap.map_or_else(|| "—".into(), signed_bytes)
            );
        }
    }
    if let Some(census) = r.census_at(r.settled.as_ref().map_or(f64::INFINITY, |p| p.seconds)) {
        let peak = r.pinned_share.iter().map(|s| s.share).fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "\n  -hT: ARR_WORDS is {:.0}% of the heap at the census of {:.2} s ({} of {}), {:.0}% at most over {} censuses.",
            census.share * 100.0,
            census.seconds,
            bytes(census.arr_words_bytes),
            bytes(census.total_bytes),
            peak * 100.0,
            r.pinned_share.len()
        );
    }
    let caps: Vec<String> = r
        .gcs_per_capability
        .iter()
        .map(|c| {
            let gens: Vec<String> = c.by_generation.iter().enumerate().map(|(g, n)| format!("gen {g}: {n}")).collect();
            format!("{} ({})", c.capability.map_or("no capability".into(), |c| format!("cap {c}")), gens.join(", "))
        })
        .collect();
    let _ = writeln!(out, "\n  GCs per capability: {}", caps.join("; "));
    if !r.rts_summary.is_empty() {
        let s = |k: &str| r.rts_summary.get(k).copied().unwrap_or(0.0) as u64;
        let _ = writeln!(
            out,
            "  +RTS -s: maximum residency {} (eventlog: {}), total memory in use {} (eventlog max heap: {}).",
            bytes(s("max_residency_bytes")),
            bytes(r.max_live_bytes),
            bytes(s("total_memory_in_use_bytes")),
            bytes(r.max_heap_size_bytes)
        );
    }
    if !r.inventory.is_empty() {
        let parts: Vec<String> =
            r.inventory.iter().map(|(k, v)| format!("{} {}", k.trim_end_matches("_bytes").replace('_', " "), bytes(*v as u64))).collect();
        let _ = writeln!(out, "  -Dg inventory (last): {}.", parts.join(", "));
    }
    let _ = writeln!(out);
    out.push_str(&wrap(&r.verdict.text, 78, "  "));
    out
}

/// A few `memgap: ` lines for the end of `memgap run`.
pub fn brief(r: &GhcReport) -> String {
    let mut out = String::new();
    if let Some(p) = &r.settled {
        let _ = writeln!(
            out,
            "memgap: GHC heap after the major GC at {:.2} s: live {}, blocks not live {}, megablock free {}, heap {}, RSS {}",
            p.seconds,
            bytes(p.live_bytes),
            signed_bytes(p.rows.heap_blocks_not_live),
            signed_bytes(p.rows.megablock_free),
            bytes(p.heap_size_bytes),
            opt(p.rss_bytes)
        );
    }
    for line in wrap(&r.verdict.text, 90, "memgap: ").lines() {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `value` as JSON with a `ghc` key added when there is a GHC report.
pub fn json_with_ghc<T: Serialize>(value: &T, ghc: Option<&GhcReport>) -> String {
    let mut json = serde_json::to_value(value).expect("model structs always serialize");
    if let (Some(ghc), Some(object)) = (ghc, json.as_object_mut()) {
        object.insert("ghc".into(), serde_json::to_value(ghc).expect("model structs always serialize"));
    }
    serde_json::to_string_pretty(&json).expect("values always serialize")
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgap_model::ghc::{CapabilityGcs, GhcRows, GhcVerdict};

    fn sample() -> GhcReport {
        let point = GhcPoint {
            seconds: 1.5,
            major: true,
            rss_bytes: Some(100 << 20),
            heap_size_bytes: 90 << 20,
            blocks_size_bytes: 30 << 20,
            live_bytes: 20 << 20,
            unmoved_bytes: Some(15 << 20),
            rows: GhcRows {
                live: 20 << 20,
                heap_blocks_not_live: 10 << 20,
                megablock_free: 58 << 20,
                block_descriptors: 2 << 20,
                lazy_free: None,
                non_heap: Some(10 << 20),
            },
            ..GhcPoint::default()
        };
        GhcReport {
            collections: 3,
            major_collections: 1,
            settled: Some(point.clone()),
            timeline: vec![point],
            gcs_per_capability: vec![CapabilityGcs { capability: Some(0), by_generation: vec![2, 1] }],
            verdict: GhcVerdict { text: "Pinned fragmentation: …".into(), ..GhcVerdict::default() },
            ..GhcReport::default()
        }
    }

    #[test]
    fn shows_rows_per_capability_counts_and_verdict() {
        let text = report(&sample(), "t.mgt");
        assert!(text.contains("  megablock_free            58.0 MiB   58.0%"), "{text}");
        assert!(text.contains("  lazy_free                  unknown"), "{text}");
        assert!(text.contains("cap 0 (gen 0: 2, gen 1: 1)"), "{text}");
        assert!(text.trim_end().ends_with("Pinned fragmentation: …"), "{text}");
        assert!(brief(&sample()).starts_with("memgap: GHC heap after the major GC at 1.50 s: live 20.0 MiB"));
    }

    #[test]
    fn json_gains_a_ghc_key_only_with_a_report() {
        #[derive(Serialize)]
        struct Plain {
            rss_bytes: u64,
        }
        let with: serde_json::Value = serde_json::from_str(&json_with_ghc(&Plain { rss_bytes: 1 }, Some(&sample()))).unwrap();
        assert_eq!(with["ghc"]["settled"]["rows"]["megablock_free"], 58 << 20);
        assert_eq!(with["ghc"]["gcs_per_capability"][0]["by_generation"][1], 1);
        let without: serde_json::Value = serde_json::from_str(&json_with_ghc(&Plain { rss_bytes: 1 }, None)).unwrap();
        assert!(without.get("ghc").is_none());
    }
}
