//! The GHC section: the ledger by RTS layer after a settled major GC, the
//! major GCs over time, GCs per capability, the program's own `+RTS -s`
//! figures beside memgap's, and the verdict.

use std::fmt::Write;

use memgap_model::ghc::names;
use memgap_model::ghc::{GhcPoint, GhcReport};

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
            bytes(s(names::MAX_RESIDENCY_BYTES)),
            bytes(r.max_live_bytes),
            bytes(s(names::TOTAL_MEMORY_IN_USE_BYTES)),
            bytes(r.max_heap_size_bytes)
        );
    }
    if !r.inventory.is_empty() {
        let parts: Vec<String> =
            r.inventory.iter().map(|(k, v)| format!("{} {}", k.trim_end_matches("_bytes").replace('_', " "), bytes(*v as u64))).collect();
        let _ = writeln!(out, "  -Dg inventory (last): {}.", parts.join(", "));
    }
    let _ = writeln!(out);
    out.push_str(&wrap(&verdict(r), 78, "  "));
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
    for line in wrap(&verdict(r), 90, "memgap: ").lines() {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The RTS report's finding in words: pinned fragmentation (at the major GC
/// it rests on, with the -hT census nearest to it), memory slow to go back
/// (LazyFree), or neither with the last major GC's figures.
pub fn verdict(report: &GhcReport) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mib = |b: u64| b as f64 / MIB;
    let v = &report.verdict;
    let mut parts = Vec::new();
    let pinned_at = v.at_seconds.filter(|_| v.pinned_fragmentation);
    if let Some(p) = pinned_at.and_then(|at| report.timeline.iter().find(|p| p.seconds == at)) {
        let unmoved = p.unmoved_bytes.unwrap_or(0);
        let rss = p.rss_bytes.map(|r| format!(", RSS {:.1} MiB", mib(r))).unwrap_or_default();
        let census = report
            .census_at(p.seconds)
            .map(|c| {
                format!(
                    " The -hT census at {:.2} s counts {:.0}% of the heap as ARR_WORDS ({:.1} MiB): pinned blocks are counted whole.",
                    c.seconds,
                    c.share * 100.0,
                    mib(c.arr_words_bytes)
                )
            })
            .unwrap_or_default();
        parts.push(format!(
            "Pinned fragmentation: after the major GC at {:.2} s the heap is {:.1} MiB{rss} for {:.1} MiB of live data, and {:.1} MiB ({:.0}%) of that live data was not copied by the GC: it sits in pinned blocks (ByteString, pinned byte arrays) or large objects, which never move. A pinned block stays whole while any object in it lives, so dead neighbours of a few survivors count as live, and the RTS keeps free blocks in proportion to live data (-F, default 2).{census} Remedies: keep the survivors in unpinned storage (ShortByteString, Data.Text ≥ 2, unpinned byte arrays); copy the retained slices (Data.ByteString.copy) so they pack into fresh blocks; retain contiguous runs (take) rather than strided survivors (every 10th).",
            p.seconds,
            mib(p.heap_size_bytes),
            mib(p.live_bytes),
            mib(unmoved),
            unmoved as f64 * 100.0 / p.live_bytes.max(1) as f64,
        ));
    }
    if v.lazy_free {
        let (lazy, rss) = (v.lazy_free_bytes, v.lazy_free_rss_bytes);
        parts.push(format!(
            "The RTS is slow to give memory back, not holding it: up to {:.1} MiB of RSS ({:.0}% of {:.1} MiB) is megablocks returned with MADV_FREE (smaps LazyFree), which the kernel counts until it needs the memory; RSS − LazyFree = {:.1} MiB. Nothing to fix; run with +RTS --disable-delayed-os-memory-return to see RSS fall at once.",
            mib(lazy),
            lazy as f64 * 100.0 / rss.max(1) as f64,
            mib(rss),
            mib(rss.saturating_sub(lazy)),
        ));
    }
    if parts.is_empty() {
        parts.push(match &report.settled {
            Some(p) => format!(
                "No pinned fragmentation: at the last major GC ({:.2} s) {:.1} MiB live, {:.1} MiB of it unmoved (pinned or large), heap {:.1} MiB.",
                p.seconds,
                mib(p.live_bytes),
                mib(p.unmoved_bytes.unwrap_or(0)),
                mib(p.heap_size_bytes)
            ),
            None if report.timeline.is_empty() => "No GC was logged in an eventlog: only the RTS's own figures (+RTS -s, -Dg) are known.".into(),
            None => "No major GC was logged: live data is unknown.".into(),
        });
    }
    parts.join(" ")
}

/// The report as JSON, its verdict with its `text`.
pub fn report_json(report: &GhcReport) -> serde_json::Value {
    let mut json = serde_json::to_value(report).expect("model structs always serialize");
    json["verdict"]["text"] = verdict(report).into();
    json
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
            verdict: GhcVerdict { pinned_fragmentation: true, at_seconds: Some(1.5), ..GhcVerdict::default() },
            ..GhcReport::default()
        }
    }

    #[test]
    fn shows_rows_per_capability_counts_and_verdict() {
        let text = report(&sample(), "t.mgt");
        assert!(text.contains("  megablock_free            58.0 MiB   58.0%"), "{text}");
        assert!(text.contains("  lazy_free                  unknown"), "{text}");
        assert!(text.contains("cap 0 (gen 0: 2, gen 1: 1)"), "{text}");
        assert!(text.contains("  Pinned fragmentation: after the major GC at 1.50 s the heap is 90.0 MiB, RSS"), "{text}");
        assert!(text.trim_end().ends_with("(every 10th)."), "{text}");
        let verdict = verdict(&sample());
        assert!(verdict.contains("100.0 MiB for 20.0 MiB of live data, and 15.0 MiB (75%) of that live data was not copied"), "{verdict}");
        assert!(brief(&sample()).starts_with("memgap: GHC heap after the major GC at 1.50 s: live 20.0 MiB"));
    }

    #[test]
    fn the_verdict_quotes_the_census_and_names_lazy_free() {
        let mut r = sample();
        r.pinned_share =
            vec![memgap_model::ghc::PinnedShare { seconds: 1.4, arr_words_bytes: 32 << 20, total_bytes: 40 << 20, share: 0.8 }];
        let text = verdict(&r);
        assert!(text.contains("The -hT census at 1.40 s counts 80% of the heap as ARR_WORDS (32.0 MiB)"), "{text}");
        r.verdict = GhcVerdict { lazy_free: true, lazy_free_bytes: 120 << 20, lazy_free_rss_bytes: 160 << 20, ..GhcVerdict::default() };
        let text = verdict(&r);
        assert!(
            text.starts_with("The RTS is slow to give memory back") && text.contains("up to 120.0 MiB of RSS (75% of 160.0 MiB)"),
            "{text}"
        );
        assert!(text.contains("--disable-delayed-os-memory-return"), "{text}");
        r.verdict = GhcVerdict::default();
        assert!(verdict(&r).starts_with("No pinned fragmentation: at the last major GC (1.50 s) 20.0 MiB live"));
    }

    /// A snapshot's copy keeps the GC its rows come from and what the
    /// verdict quotes, whatever the number of GCs and censuses.
    #[test]
    fn a_snapshots_copy_is_small_and_says_the_same() {
        let mut r = sample();
        let gc = |i: usize| GhcPoint { seconds: i as f64 / 100.0, major: i.is_multiple_of(10), ..r.timeline[0].clone() };
        r.timeline = (0..1000).map(gc).collect();
        r.verdict.at_seconds = Some(1.5);
        r.pinned_share = (0..100)
            .map(|i| memgap_model::ghc::PinnedShare {
                seconds: i as f64 / 10.0,
                arr_words_bytes: i << 20,
                total_bytes: 100 << 20,
                share: i as f64 / 100.0,
            })
            .collect();
        assert!(verdict(&r).contains("after the major GC at 1.50 s") && verdict(&r).contains("census at 1.50 s"), "{}", verdict(&r));
        for seconds in [0.0, 0.5, 1.5, 4.0, 20.0] {
            let copy = r.as_of(seconds);
            assert!(copy.timeline.len() <= 2 && copy.pinned_share.len() <= 2, "{seconds}: {copy:?}");
            assert_eq!(copy.point_at(seconds), r.point_at(seconds), "{seconds}");
            assert_eq!(verdict(&copy), verdict(&r), "{seconds}");
            assert_eq!((copy.collections, &copy.settled, &copy.gcs_per_capability), (r.collections, &r.settled, &r.gcs_per_capability));
        }
        r.verdict.pinned_fragmentation = false;
        assert_eq!(verdict(&r.as_of(3.0)), verdict(&r));
    }

    #[test]
    fn report_json_has_the_verdicts_text() {
        let json = report_json(&sample());
        assert_eq!(json["settled"]["rows"]["megablock_free"], 58 << 20);
        assert_eq!(json["gcs_per_capability"][0]["by_generation"][1], 1);
        assert_eq!(json["verdict"]["pinned_fragmentation"], true);
        assert!(json["verdict"]["text"].as_str().unwrap().starts_with("Pinned fragmentation"));
    }
}
