//! Terminal views of a running process seen from outside: `memgap snapshot
//! PID` (the rows it can know, and which need a recording) and `memgap trim
//! PID` (what malloc_trim gave back).

use std::fmt::Write;

use memgap_model::{CgroupMemory, ProcessLedger, TrimReport};

use crate::format::bytes;
use crate::ledger::wrap;

pub fn snapshot(l: &ProcessLedger) -> String {
    let mut out = String::new();
    let allocator = match l.allocator.as_str() {
        "unknown" => "no libc.so.6 (statically linked)".to_string(),
        "go" => "the Go runtime's heap".to_string(),
        name if l.allocator_statically_linked => format!("{name} (linked statically into the program)"),
        name => format!("{name} malloc"),
    };
    let threads = if l.threads == 1 { "1 thread".to_string() } else { format!("{} threads", l.threads) };
    if let Some(ledger) = &l.ledger {
        let how = if l.walk.is_some() { "its heap walked from outside" } else { "its runtime's accounting read from outside" };
        let _ = writeln!(out, "memgap snapshot — pid {} ({}) — {threads}, {allocator} — {how}, no recording", l.pid, l.command);
        // The recorded ledger's view of the same model, less its title.
        let body = crate::ledger::ledger(ledger, "");
        out.push_str(body.split_once('\n').map_or("", |(_, rest)| rest));
        let _ = writeln!(out);
        if let Some(walk) = &l.walk {
            let _ = writeln!(
                out,
                "  walk: {} arena{}, {} heap{}, {} live blocks, {} in tcaches, {} in fastbins, {} binned, {} mmapped; main_arena found by {}.",
                walk.arenas,
                if walk.arenas == 1 { "" } else { "s" },
                walk.heaps,
                if walk.heaps == 1 { "" } else { "s" },
                crate::format::count(walk.live_blocks),
                crate::format::count(walk.tcache_chunks),
                crate::format::count(walk.fastbin_chunks),
                crate::format::count(walk.binned_chunks),
                crate::format::count(walk.mmapped_chunks),
                walk.found_by
            );
            let _ = writeln!(
                out,
                "  The process was stopped {:.1} ms ({:.1} ms per GiB of heap{}). live counts the blocks' usable bytes: the sizes asked for are known only to a recording.",
                walk.stopped_ms,
                walk.stopped_ms_per_gib,
                if walk.attempts > 1 { format!(", {} tries", walk.attempts) } else { String::new() }
            );
        }
        let _ = writeln!(out, "  {}", cgroup_line(l.cgroup.as_ref()));
        return out;
    }
    let _ = writeln!(out, "memgap snapshot — pid {} ({}) — {threads}, {allocator} — from /proc, no recording", l.pid, l.command);
    let _ = writeln!(out);
    out.push_str(&crate::ledger::rows_table(&l.rows.shown(), l.rss_bytes, 0));
    let _ =
        writeln!(out, "  {:<12} {:>11}   residual {}", "RSS (kernel)", bytes(l.rss_bytes), crate::ledger::signed_bytes(l.residual_bytes));
    if let Some(a) = &l.allocator_rows {
        let _ = writeln!(out);
        let _ = writeln!(out, "  the heap row by {}'s own statistics:", l.allocator);
        let rows = [
            ("live", a.live),
            ("fragmented", a.fragmented),
            ("retained", a.retained),
            ("metadata", a.metadata),
            ("not its", a.unaccounted),
        ];
        out.push_str(&crate::ledger::rows_table(&rows, l.rss_bytes, 0));
        let _ = writeln!(out, "  {}: not known from its statistics (no per-block view without hooked calls).", l.unknown_rows.join(", "));
    } else {
        if let Some(line) = committed_line(l) {
            let _ = writeln!(out);
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(out, "  {}: not known without a recording (they make up the heap row).", l.unknown_rows.join(", "));
    }
    if let Some(why) = &l.walk_failure {
        let _ = writeln!(out, "  The heap could not be walked: {why}.");
    }
    if let Some(error) = &l.allocator_stats_error {
        let _ = writeln!(out, "  {}'s statistics could not be read: {error}", l.allocator);
    }
    let _ = writeln!(out);
    let s = &l.status;
    let _ = writeln!(
        out,
        "  status: VmRSS {} = RssAnon {} + RssFile {} + RssShmem {}",
        bytes(s.vm_rss_bytes),
        bytes(s.rss_anon_bytes),
        bytes(s.rss_file_bytes),
        bytes(s.rss_shmem_bytes)
    );
    let t = &l.smaps;
    let _ = writeln!(
        out,
        "  smaps: Rss {}, Anonymous {}, LazyFree {}, Swap {}",
        bytes(t.rss_bytes),
        bytes(t.anonymous_bytes),
        bytes(t.lazy_free_bytes),
        bytes(t.swap_bytes)
    );
    let g = &l.groups;
    let _ = writeln!(
        out,
        "  mappings: heap {}, stacks {}, files {}, shared {}, other anonymous {}",
        bytes(g.heap),
        bytes(g.stacks),
        bytes(g.file),
        bytes(g.shared),
        bytes(g.anonymous_other)
    );
    if !l.heaps.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "  {:<36} {:>10} {:>10} {:>10}", "heap", "resident", "lazy_free", "reserved");
        for h in &l.heaps {
            let name = if h.mappings > 1 { format!("{} ({})", h.name, h.mappings) } else { h.name.clone() };
            let _ = writeln!(
                out,
                "  {name:<36} {:>10} {:>10} {:>10}",
                bytes(h.resident_bytes),
                bytes(h.lazy_free_bytes),
                bytes(h.reserved_bytes)
            );
        }
        if l.arenas > 0 {
            let _ = writeln!(out, "  glibc arenas: {} (the main one plus each 64 MiB heap)", l.arenas);
        }
    }
    let _ = writeln!(out);
    if !l.numa.is_empty() {
        let nodes: Vec<String> = l.numa.iter().map(|(node, b)| format!("node {node} {}", bytes(*b))).collect();
        let _ = writeln!(out, "  NUMA: {}", nodes.join(", "));
    }
    let _ = writeln!(out, "  {}", cgroup_line(l.cgroup.as_ref()));
    let _ = writeln!(out);
    out.push_str(&wrap(&verdict(l), 78, "  "));
    out
}

/// The verdict of a running process: the recorded ledger's when its heap
/// was walked, else what is known of the heap without a recording.
pub fn verdict(l: &ProcessLedger) -> String {
    match &l.ledger {
        Some(ledger) => crate::verdict::of(ledger),
        None => heap_verdict(l),
    }
}

/// What an allocator that counts only its committed bytes (mimalloc's
/// release builds) says, beside the heap row it cannot split.
fn committed_line(l: &ProcessLedger) -> Option<String> {
    let committed = l.allocator_stats.as_ref()?.committed_only()?;
    let b = memgap_model::human_bytes;
    Some(format!(
        "{}'s own statistics: {} committed (mapped_bytes), against a heap row of {} resident. It counts no live or free \
         bytes (a release build keeps only its commit count): committed pages need not be resident, and no row comes from it.",
        l.allocator,
        b(committed),
        b(l.heap_bytes)
    ))
}

fn heap_verdict(l: &ProcessLedger) -> String {
    let rss = l.rss_bytes.max(1);
    let mut text = match &l.allocator_rows {
        Some(a) => {
            let b = memgap_model::human_bytes;
            let linked = if l.allocator_statically_linked { ", linked into the program," } else { "" };
            format!(
                "The heap takes {} of {} RSS ({:.0}%). By its own statistics, {}{linked} holds {} live, {} free on pages with live data \
                 (fragmented), {} of free pages it keeps (retained) and {} of metadata; {} of the heap is not its. Which call sites hold it \
                 needs a recording with its calls hooked.",
                b(l.heap_bytes),
                b(l.rss_bytes),
                l.heap_bytes as f64 * 100.0 / rss as f64,
                l.allocator,
                b(a.live),
                b(a.fragmented),
                b(a.retained),
                b(a.metadata),
                b(a.unaccounted)
            )
        }
        None => String::new(),
    };
    if text.is_empty() {
        text = format!(
            "The heap takes {} of {} RSS ({:.0}%). How it splits into live data, allocator slack, fragmentation and free pages the allocator keeps \
         needs a recording: `memgap run -- CMD`, then `memgap ledger`.",
            memgap_model::human_bytes(l.heap_bytes),
            memgap_model::human_bytes(l.rss_bytes),
            l.heap_bytes as f64 * 100.0 / rss as f64
        );
    }
    if l.allocator == "glibc" && l.heap_bytes > 0 {
        text.push_str(" `memgap trim PID` measures now what malloc_trim(0) gives back.");
    }
    if let Some(c) = &l.cgroup
        && let (Some(percent), Some(headroom)) = (c.used_percent, c.headroom_bytes)
    {
        text.push_str(&format!(
            " Its cgroup uses {percent:.0}% of its memory limit ({} left before the kernel reclaims file pages and then OOM-kills).",
            memgap_model::human_bytes(headroom)
        ));
    }
    text
}

pub fn trim(r: &TrimReport) -> String {
    let mut out = String::new();
    let c = &r.call;
    let tries = if c.attempts > 1 { format!(", after {} rounds over the threads", c.attempts) } else { String::new() };
    let _ = writeln!(
        out,
        "memgap trim — pid {} ({}) — malloc_trim(0) called by {} injection in thread {}{tries}: returned {} in {:.1} ms",
        r.pid,
        r.command,
        c.method,
        c.thread,
        c.returned,
        c.call_seconds * 1000.0
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "  {:<10} {:>11} {:>11} {:>11}", "", "before", "after", "returned");
    let signed = |v: i64| if v < 0 { format!("-{}", bytes(v.unsigned_abs())) } else { bytes(v as u64) };
    let _ = writeln!(
        out,
        "  {:<10} {:>11} {:>11} {:>11}",
        "VmRSS",
        bytes(r.rss_before_bytes),
        bytes(r.rss_after_bytes),
        signed(r.returned_bytes)
    );
    let _ = writeln!(
        out,
        "  {:<10} {:>11} {:>11} {:>11}  ({:.1}% of the heap)",
        "heap Rss",
        bytes(r.heap_before_bytes),
        bytes(r.heap_after_bytes),
        signed(r.heap_returned_bytes),
        r.heap_returned_percent
    );
    let _ = writeln!(out);
    let advice = if r.heap_returned_percent >= 20.0 {
        "glibc was keeping free pages the program no longer used. Trimming regularly keeps them out of RSS: `memgap run --trim-only` without code changes, or malloc_trim(0) from the program."
    } else {
        "Little came back: the heap's resident pages hold live blocks (or free space glibc cannot return). `memgap run` then `memgap ledger` shows which."
    };
    out.push_str(&wrap(advice, 78, "  "));
    out
}

fn cgroup_line(cgroup: Option<&CgroupMemory>) -> String {
    let Some(c) = cgroup else {
        return "cgroup: none with memory accounting".to_string();
    };
    let mut line = format!("cgroup v{} {}: {}", c.version, c.path, bytes(c.current_bytes));
    match (c.max_bytes, c.used_percent, c.headroom_bytes) {
        (Some(max), Some(used), Some(headroom)) => {
            let at = c.limit_path.as_deref().filter(|p| *p != c.path).map(|p| format!(" (set on {p})")).unwrap_or_default();
            let _ = write!(line, " of {}{at} ({used:.1}%), {} left before the OOM killer", bytes(max), bytes(headroom));
        }
        _ => line.push_str(", no limit"),
    }
    let parts: Vec<String> = c.stat.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} {}", bytes(*v))).collect();
    if !parts.is_empty() {
        let _ = write!(line, "; {}", parts.join(", "));
    }
    if let Some(kills) = c.oom_kills.filter(|&k| k > 0) {
        let _ = write!(line, "; {kills} OOM kill{} so far", if kills == 1 { "" } else { "s" });
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines() {
        assert_eq!(cgroup_line(None), "cgroup: none with memory accounting");
        let mut c = CgroupMemory {
            version: 2,
            path: "/app".into(),
            current_bytes: 3 << 29,
            max_bytes: Some(2 << 30),
            used_percent: Some(75.0),
            headroom_bytes: Some(1 << 29),
            ..CgroupMemory::default()
        };
        c.limit_path = Some("/".into());
        c.stat.insert("anon".into(), 1 << 30);
        c.oom_kills = Some(2);
        assert_eq!(
            cgroup_line(Some(&c)),
            "cgroup v2 /app: 1.50 GiB of 2.00 GiB (set on /) (75.0%), 512 MiB left before the OOM killer; anon 1.00 GiB; 2 OOM kills so far"
        );
        c.max_bytes = None;
        c.used_percent = None;
        c.headroom_bytes = None;
        c.stat.clear();
        c.oom_kills = None;
        assert_eq!(cgroup_line(Some(&c)), "cgroup v2 /app: 1.50 GiB, no limit");
    }
}
