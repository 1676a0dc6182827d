//! Terminal output: short, aligned, numbers a person can compare at a glance.

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, Table};
use memgap_model::Summary;

use crate::format::{bytes, count, seconds};

pub fn summary(s: &Summary) -> String {
    let mut out = String::new();
    out.push_str(&format!("memgap summary — pid {} — {}\n", s.pid, s.command));
    if let Some(reason) = &s.truncated_reason {
        out.push_str(&format!("  ! cut short: {reason}; showing what was recorded\n"));
    }
    let exit = match (s.exit_code, s.signal) {
        (_, Some(signal)) => format!("killed by signal {signal}"),
        (Some(code), None) => code.to_string(),
        (None, None) => "unknown".to_string(),
    };
    let mut facts = Table::new();
    facts.load_style(NOTHING);
    // A runtime with a heap of its own (Go, GHC) says what its heap holds.
    let (live_at_end, runtime_threads) = match &s.runtime {
        Some(r) => (
            format!("{} ({} heap, from {})", bytes(s.live_bytes_at_end), r.owner, r.source),
            r.threads.map(|t| format!("; {} {}", count(t.into()), r.threads_kind)).unwrap_or_default(),
        ),
        None => (format!("{} in {} blocks", bytes(s.live_bytes_at_end), count(s.live_blocks_at_end)), String::new()),
    };
    let rows: Vec<(&str, String)> = vec![
        ("duration", seconds(s.duration_seconds)),
        ("exit", exit),
        ("threads", format!("{}{runtime_threads}", count(s.threads.into()))),
        ("peak RSS", bytes(s.peak_rss_bytes)),
        ("RSS at exit", bytes(s.rss_at_end_bytes)),
        (
            "peak live heap",
            format!(
                "{} at {}{}",
                bytes(s.peak_live_bytes),
                seconds(s.peak_live_seconds),
                s.runtime.as_ref().map(|r| format!(" ({} heap)", r.owner)).unwrap_or_default()
            ),
        ),
        ("live at end", live_at_end),
        match s.synthesized_from_walks {
            // Watched from outside: no call was seen, only blocks that appeared between two walks.
            Some(_) => (
                "allocated",
                format!(
                    "not known (no calls seen); {} in {} blocks appeared between walks",
                    bytes(s.allocated_bytes),
                    count(s.allocations)
                ),
            ),
            None => ("allocated", format!("{} in {} allocations", bytes(s.allocated_bytes), count(s.allocations))),
        },
    ];
    let recording_cpu = s.recording_cpu.map(|cpu| {
        (
            "recording CPU",
            format!("{} program (with its hooks), {} memgap's recorder", seconds(cpu.program_seconds), seconds(cpu.recorder_seconds)),
        )
    });
    for (name, value) in rows.into_iter().chain(recording_cpu) {
        facts.add_row(vec![format!("  {name}"), value]);
    }
    out.push_str(&facts.to_string());
    out.push('\n');

    let mut events = Table::new();
    events.load_style(NOTHING);
    if let Some(walks) = s.synthesized_from_walks {
        out.push_str(&format!(
            "  watched from outside (memgap watch): the heap events below are not the program's calls but the\n  differences between {} walks of glibc's malloc state (blocks that appeared or went between two)\n",
            count(walks)
        ));
    }
    let what = if s.synthesized_from_walks.is_some() { "  differences" } else { "  calls" };
    events.set_header(vec![what, "count"]);
    for (kind, n) in s.events.iter().filter(|(_, n)| **n > 0) {
        events.add_row(vec![format!("  {kind}"), count(*n)]);
    }
    events.add_row(vec!["  total".to_string(), count(s.total_events)]);
    right_align(&mut events, 1);
    out.push_str(&events.to_string());
    out.push('\n');

    if !s.top_sizes.is_empty() {
        let mut sizes = Table::new();
        sizes.load_style(NOTHING);
        let what = if s.synthesized_from_walks.is_some() { "blocks" } else { "allocations" };
        sizes.set_header(vec!["  top sizes", what, "bytes"]);
        for size in &s.top_sizes {
            sizes.add_row(vec![format!("  {}", bytes(size.size)), count(size.count), bytes(size.bytes)]);
        }
        right_align(&mut sizes, 1);
        right_align(&mut sizes, 2);
        out.push_str(&sizes.to_string());
        out.push('\n');
    }
    let mut caveats = Vec::new();
    if s.dropped_events > 0 {
        caveats.push(format!(
            "{} events were dropped (the agent had no room for them: the recorder fell behind, or a signal handler allocated many times while interrupting an allocation)",
            count(s.dropped_events)
        ));
    }
    if s.untracked_frees > 0 {
        caveats.push(format!("{} frees of blocks allocated before recording began", count(s.untracked_frees)));
    }
    if s.overlapping_allocations > 0 {
        caveats.push(format!("{} allocations at a still-live address (a free was missed)", count(s.overlapping_allocations)));
    }
    caveats.extend(s.notes.iter().cloned());
    for caveat in caveats {
        out.push_str(&format!("  note: {caveat}\n"));
    }
    out
}

fn right_align(table: &mut Table, column: usize) {
    if let Some(column) = table.column_mut(column) {
        column.set_cell_alignment(CellAlignment::Right);
    }
}
