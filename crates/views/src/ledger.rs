//! Terminal views of the ledger: the table with the verdict, the page map,
//! and the timeline.

use std::fmt::Write;

use memgap_model::{Ledger, PageClass, PageMap, SeriesPoint, Timeline, TrimMark};

use crate::format::{bytes, count};
use crate::palette;

const BAR_WIDTH: usize = 30;

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 * 100.0 / whole as f64 }
}

/// Wraps `text` to `width` columns, each line indented by `indent`.
pub(crate) fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            let _ = writeln!(out, "{indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{indent}{line}");
    }
    out
}

/// The rows with bytes, share of RSS and a bar, then their sum; memgap's
/// own memory (`memgap`, part of `other`) on a line of its own under it.
pub(crate) fn rows_table(rows: &[(&str, u64)], rss: u64, memgap: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "  {:<12} {:>11} {:>7}", "row", "bytes", "% RSS");
    for &(name, value) in rows {
        let share = percent(value, rss);
        let bar = "█".repeat(((share / 100.0) * BAR_WIDTH as f64).round() as usize);
        let _ = writeln!(out, "  {name:<12} {:>11} {share:>6.1}%  {bar}", bytes(value));
        if name == "other" && memgap > 0 {
            let _ = writeln!(
                out,
                "  {:<12} {:>11} {:>6.1}%  memgap's own memory (its buffers, heap, static data and code), not the program's",
                "  of it",
                bytes(memgap),
                percent(memgap, rss)
            );
        }
    }
    let _ = writeln!(out, "  {:<12} {:>11}", "sum", bytes(rows.iter().map(|r| r.1).sum()));
    out
}

pub fn ledger(l: &Ledger, title: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "memgap ledger — {title} — {}", crate::format::moment(l.moment.as_ref(), l.at_seconds, l.snapshot_reason));
    let _ = writeln!(out);
    out.push_str(&rows_table(&l.rows.named(), l.rss_bytes, l.memgap_bytes));
    let _ = writeln!(
        out,
        "  {:<12} {:>11}   residual {} ({:.2}%)",
        "RSS (kernel)",
        bytes(l.rss_bytes),
        signed_bytes(l.residual_bytes),
        percent(l.residual_bytes.unsigned_abs(), l.rss_bytes)
    );
    if l.rss_moved_bytes.unsigned_abs() * 100 > l.rss_bytes {
        let before = (l.rss_bytes as i64 - l.rss_moved_bytes).max(0) as u64;
        let _ = writeln!(
            out,
            "  RSS moved from {} to {} while this snapshot was read: the rows are checked against both.",
            bytes(before),
            bytes(l.rss_bytes)
        );
    }
    let _ = writeln!(out);
    match l.section::<memgap_model::GoLedger>(memgap_model::go::NAME) {
        Some(go) => out.push_str(&crate::go::section(&go)),
        None => {
            let retained: u64 = l.heaps.iter().map(|h| h.retained).sum();
            let released: u64 = l.heaps.iter().map(|h| h.released).sum();
            let _ = writeln!(
                out,
                "  malloc_trim(0) would return {} of the {} the allocator retains; {} of allocator address space is already released.",
                bytes(l.trim_would_return_bytes),
                bytes(retained),
                bytes(released)
            );
        }
    }
    let o = &l.other_breakdown;
    let _ = writeln!(
        out,
        "  other: files {}, shared {}, program mmaps {}, static data {}, memgap {}, unclassified {}; runtime: stacks {}.",
        bytes(o.file),
        bytes(o.shmem),
        bytes(o.program_mmap),
        bytes(o.static_data),
        bytes(o.agent),
        bytes(o.unclassified),
        bytes(l.stacks_bytes)
    );
    let allocator = l.allocator.rsplit('/').next().unwrap_or("");
    let arenas = if l.arenas > 0 { format!(", {} arena{}", l.arenas, if l.arenas == 1 { "" } else { "s" }) } else { String::new() };
    let _ = writeln!(
        out,
        "  allocator: {}{arenas}, {} live blocks; snapshot took {:.1} ms.",
        if allocator.is_empty() { "unknown" } else { allocator },
        count(l.live_blocks),
        l.snapshot_cost_ms
    );
    if let Some(line) = hooked_mimalloc_committed(l) {
        out.push_str(&wrap(&line, 78, "  "));
    }
    if !l.heaps.is_empty() {
        let _ = writeln!(out);
        let _ =
            writeln!(out, "  {:<34} {:>10} {:>10} {:>10} {:>10} {:>10}", "heap", "live", "fragmented", "retained", "trimmable", "released");
        for h in &l.heaps {
            let name = if h.mappings > 1 { format!("{} ({})", h.name, h.mappings) } else { h.name.clone() };
            let _ = writeln!(
                out,
                "  {name:<34} {:>10} {:>10} {:>10} {:>10} {:>10}",
                bytes(h.live),
                bytes(h.fragmented),
                bytes(h.retained),
                bytes(h.trimmable),
                bytes(h.released)
            );
        }
    }
    let worst: Vec<_> = {
        let mut buckets: Vec<_> = l.fragmentation_by_size.iter().filter(|b| b.fragmented_bytes > 0).collect();
        buckets.sort_by_key(|b| std::cmp::Reverse(b.fragmented_bytes));
        buckets.into_iter().take(5).collect()
    };
    if !worst.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "  {:<20} {:>12} {:>10} {:>12}", "block size", "blocks", "live", "fragmented");
        for b in worst {
            let _ = writeln!(
                out,
                "  {:<20} {:>12} {:>10} {:>12}",
                format!("{}–{} B", b.min_size, b.max_size),
                count(b.blocks),
                bytes(b.live_bytes),
                bytes(b.fragmented_bytes)
            );
        }
    }
    if let Some(ruby) = l.section::<memgap_model::ruby::RubyLayer>(memgap_model::ruby::NAME) {
        out.push_str(&ruby_layer(&ruby));
    }
    if let Some(node) = l.section::<memgap_model::owners::node::NodeLayer>(memgap_model::owners::node::NAME) {
        out.push_str(&crate::node::section(&node));
    }
    out.push_str(&owners_table(l));
    let _ = writeln!(out);
    out.push_str(&wrap(&crate::verdict::of(l), 78, "  "));
    out.push_str(&remedies(l));
    out
}

/// What a hooked mimalloc says of itself: the bytes it has committed, the
/// one count its release builds keep, which no block gives. (Linked
/// statically, its owner note says it.)
fn hooked_mimalloc_committed(l: &Ledger) -> Option<String> {
    use memgap_model::owners::{allocator_stats::AllocatorStats, mimalloc};
    let committed = l.section::<AllocatorStats>(mimalloc::NAME)?.committed_only()?;
    if l.share(mimalloc::NAME).is_some_and(|s| s.estimated.is_some()) {
        return None;
    }
    Some(format!(
        "mimalloc's own count: {} committed (mi_process_info), resident or not; the rows come from its hooked blocks.",
        bytes(committed)
    ))
}

/// Each owner's part of the rows, when more than one owner holds memory or
/// a part is estimated.
fn owners_table(l: &Ledger) -> String {
    let mut out = String::new();
    if l.owners.len() < 2 && l.owners.iter().all(|o| o.estimated.is_none()) {
        return out;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "  {:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "owner", "live", "slack", "fragmented", "retained", "lazy_free", "runtime"
    );
    for o in &l.owners {
        let r = &o.rows;
        let _ = writeln!(
            out,
            "  {:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            o.owner,
            bytes(r.live),
            bytes(r.slack),
            bytes(r.fragmented),
            bytes(r.retained),
            bytes(r.lazy_free),
            bytes(r.runtime)
        );
    }
    for o in l.owners.iter().filter(|o| o.estimated.is_some()) {
        out.push_str(&wrap(&format!("{}: {}.", o.owner, o.estimated.as_deref().unwrap_or("")), 78, "  "));
    }
    out
}

/// The remedies, best first, with the environment to run the program with.
fn remedies(l: &Ledger) -> String {
    let mut out = String::new();
    if l.remedies.is_empty() {
        return out;
    }
    let _ = writeln!(out);
    let measured = l.remedies.iter().any(|r| r.measured.is_some());
    let _ = writeln!(out, "  remedies, best first (expected savings{}):", if measured { "; measured with memgap compare" } else { "" });
    for r in &l.remedies {
        let env: Vec<String> = r.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let how = if env.is_empty() { "a change to the program".to_string() } else { env.join(" ") };
        let _ = writeln!(out, "  {:>10}  {} [{}]", bytes(r.expected_savings_bytes), r.id, how);
        if let Some(m) = &r.measured {
            let _ = writeln!(
                out,
                "  {:>10}  measured: {} RSS {} → {} ({}, {} runs)",
                "",
                m.metric,
                bytes(m.default_bytes),
                bytes(m.bytes),
                m.outcome.name(),
                m.runs
            );
        }
    }
    out
}

/// Ruby's own view, the layer above malloc.
fn ruby_layer(r: &memgap_model::ruby::RubyLayer) -> String {
    let mut out = String::new();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "  Ruby {} layer (GC.stat at {:.2} s, {}): Ruby knows of {}",
        r.version,
        r.sampled_at_seconds,
        r.sample_kind.replace('_', " "),
        bytes(r.known_bytes)
    );
    let _ = writeln!(
        out,
        "    {:<34} {:>11}  {} pages of {}",
        "object pages (mmap)",
        bytes(r.object_pages_bytes),
        count(r.object_pages),
        bytes(r.page_size)
    );
    let _ =
        writeln!(out, "    {:<34} {:>11}  {} slots of {} B", "  live slots", bytes(r.live_slots_bytes), count(r.live_slots), r.slot_size);
    let _ = writeln!(
        out,
        "    {:<34} {:>11}  {} slots, {:.0}% of slots: Ruby-page fragmentation",
        "  free slots",
        bytes(r.free_slots_bytes),
        count(r.free_slots),
        100.0 * r.free_slot_fraction
    );
    let _ = writeln!(out, "    {:<34} {:>11}", "  page overhead", bytes(r.page_overhead_bytes));
    match r.external_bytes {
        Some(external) => {
            let _ = writeln!(
                out,
                "    {:<34} {:>11}  (memsize_of_all − live slots; in the malloc layer's live row)",
                "object data in malloc",
                bytes(external)
            );
        }
        None => {
            let _ = writeln!(out, "    {:<34} {:>11}", "object data in malloc", "unknown");
        }
    }
    let _ = writeln!(out, "    GC: {} runs, {} major, {} compactions", count(r.gc_count), count(r.major_gc_count), count(r.compact_count));
    out
}

/// A few lines for the end of `memgap run`: the rows as shares of RSS and
/// the verdict, each line prefixed `memgap: `.
pub fn brief(l: &Ledger) -> String {
    // memgap's own memory is named apart from the program's `other`.
    let mut named = l.rows.named();
    named[6].1 = named[6].1.saturating_sub(l.memgap_bytes);
    let mut rows: Vec<String> =
        named.iter().filter(|(_, v)| *v > 0).map(|(name, v)| format!("{name} {} ({:.0}%)", bytes(*v), percent(*v, l.rss_bytes))).collect();
    if l.memgap_bytes > 0 {
        rows.push(format!("and memgap's own {} ({:.0}%, not the program's)", bytes(l.memgap_bytes), percent(l.memgap_bytes, l.rss_bytes)));
    }
    let at = l.moment.as_ref().map_or_else(|| format!("at {:.2} s, ", l.at_seconds), |m| format!("{}\nmemgap: ", m.line()));
    let mut out = format!("memgap: {at}RSS {}: {}\n", bytes(l.rss_bytes), rows.join(", "));
    for line in wrap(&crate::verdict::of(l), 90, "memgap: ").lines() {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// One line on the last snapshot, after the brief of another moment: where
/// the program ended up.
pub fn end_state(end: &Ledger) -> String {
    format!(
        "memgap: at the end ({:.2} s, {} snapshot): RSS {}, live heap {}, gap {} (memgap ledger --at end)\n",
        end.at_seconds,
        end.snapshot_reason,
        bytes(end.rss_bytes),
        bytes(end.rows.live),
        bytes(memgap_model::gap_bytes(end))
    )
}

/// Every resident mapping with its resident bytes and the row or group it
/// went to (used by `memgap ledger` and `memgap snapshot`).
pub fn mappings(mappings: &[memgap_model::MappingLedger]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "  {:<33} {:<5} {:<12} {:>10} {:>10}  name", "range", "perms", "class", "resident", "lazy_free");
    for m in mappings.iter().filter(|m| m.resident_bytes > 0) {
        let range = format!("{:x}-{:x}", m.start, m.end);
        let _ = writeln!(
            out,
            "  {range:<33} {:<5} {:<12} {:>10} {:>10}  {}",
            m.perms,
            m.class,
            bytes(m.resident_bytes),
            bytes(m.lazy_free_bytes),
            m.name
        );
    }
    out
}

pub(crate) fn signed_bytes(value: i64) -> String {
    if value < 0 { format!("-{}", bytes(value.unsigned_abs())) } else { bytes(value as u64) }
}

/// Cells per line of the page map.
const MAP_COLUMNS: usize = 64;
/// Lines per mapping at most: larger mappings get several pages per cell.
const MAP_LINES: usize = 32;

/// A page map, one character per page (or per run of pages): blocks shaded by
/// how full the page is, free pages the allocator keeps, released pages.
/// Why a snapshot has no page map: no mapping held an allocator's blocks
/// that memgap follows page by page; the owners holding the memory give
/// their rows from their own figures.
pub fn no_page_map(ledger: &Ledger) -> String {
    let owners: Vec<&str> = ledger.owners.iter().filter(|share| share.rows.total() > 0).map(|share| share.owner).collect();
    let given = match owners.len() {
        0 => String::new(),
        1 => format!("; {} gives its rows from its own figures (memgap ledger)", owners[0]),
        _ => format!("; {} give their rows from their own figures (memgap ledger)", owners.join(", ")),
    };
    format!("\nNo page map at this snapshot: no mapping holds blocks of an allocator memgap follows page by page{given}.\n")
}

pub fn page_map(maps: &[PageMap], color: bool) -> String {
    let mut out = String::new();
    let legend = if color {
        format!(
            "legend: {}{} pages with live blocks, by fill (live, fragmented)   {} free, malloc_trim would return (retained)   {} free, kept (retained)   {} not resident   {} memgap   {} program mmap",
            palette::paint("█▓", palette::row("live")),
            palette::paint("▒░", palette::row("fragmented")),
            palette::paint("T", palette::row("retained")),
            palette::paint("R", palette::RETAINED_KEPT),
            "\x1b[2m·\x1b[0m",
            palette::paint("m", palette::MEMGAP),
            palette::paint("p", palette::row("other")),
        )
    } else {
        "legend: #+-. pages with live blocks, by fill   T free, malloc_trim would return   R free, retained   (space) not resident   m memgap   p program mmap".to_string()
    };
    let _ = writeln!(out, "{legend}");
    for map in maps {
        let pages = map.pages.len().max(1);
        let per_cell = pages.div_ceil(MAP_COLUMNS * MAP_LINES).max(1);
        let _ = writeln!(
            out,
            "\n{} {:#x}–{:#x}: {} pages, 1 cell = {} page{} ({})",
            map.name,
            map.start,
            map.start + map.pages.len() as u64 * map.page_size,
            count(map.pages.len() as u64),
            per_cell,
            if per_cell == 1 { "" } else { "s" },
            bytes(per_cell as u64 * map.page_size)
        );
        for (row, line) in map.pages.chunks(per_cell * MAP_COLUMNS).enumerate() {
            let address = map.start + (row * per_cell * MAP_COLUMNS) as u64 * map.page_size;
            let _ = write!(out, "  {address:#014x} ");
            for cell in line.chunks(per_cell) {
                out.push_str(&cell_text(cell, color));
            }
            out.push('\n');
        }
    }
    out
}

/// The character for a run of pages: its most common class; for pages with
/// blocks, their average fill.
fn cell_text(pages: &[PageClass], color: bool) -> String {
    let mut used = 0usize;
    let mut fill_sum = 0usize;
    let (mut trimmable, mut retained, mut absent, mut agent, mut program) = (0, 0, 0, 0, 0);
    for page in pages {
        match page {
            PageClass::Used { fill } | PageClass::Python { fill: Some(fill) } => {
                used += 1;
                fill_sum += usize::from(*fill);
            }
            PageClass::Python { fill: None } => retained += 1,
            PageClass::Free { trimmable: true } => trimmable += 1,
            PageClass::Free { trimmable: false } => retained += 1,
            PageClass::NotResident => absent += 1,
            PageClass::Agent => agent += 1,
            PageClass::ProgramMmap => program += 1,
        }
    }
    let most = [used, trimmable, retained, absent, agent, program].into_iter().max().unwrap_or(0);
    let (plain, colored) = if used == most {
        let fill = fill_sum / used.max(1);
        let shade = [(192, '#', '█'), (128, '+', '▓'), (64, '-', '▒'), (0, '.', '░')].into_iter().find(|(min, _, _)| fill >= *min).unwrap();
        // Mostly live bytes in the live colour; mostly free ones (fragmented) in the fragmented colour.
        let row = if fill >= 128 { "live" } else { "fragmented" };
        (shade.1.to_string(), palette::paint(&shade.2.to_string(), palette::row(row)))
    } else if trimmable == most {
        ("T".to_string(), palette::paint("T", palette::row("retained")))
    } else if retained == most {
        ("R".to_string(), palette::paint("R", palette::RETAINED_KEPT))
    } else if absent == most {
        (" ".to_string(), "\x1b[2m·\x1b[0m".to_string())
    } else if agent == most {
        ("m".to_string(), palette::paint("m", palette::MEMGAP))
    } else {
        ("p".to_string(), palette::paint("p", palette::row("other")))
    };
    if color { colored } else { plain }
}

/// The rows at every snapshot, one line each, with the program's malloc_trim
/// calls (`trims`, of `trim_calls` in all) between them where they happened.
/// Given a `width`, columns that are zero throughout go first, then the
/// residual, until the lines fit.
/// The timeline: the ledger rows at every snapshot (with the program's
/// malloc_trim calls between them), then the live heap and VmRSS over the
/// whole run as two strips on one scale.
pub fn timeline(t: &Timeline, trims: &[TrimMark], trim_calls: u64, width: Option<usize>, color: bool) -> String {
    let mut out = snapshot_table(&t.snapshots, trims, trim_calls, width);
    if !t.live_bytes.is_empty() || !t.vm_rss.is_empty() {
        out.push('\n');
        out.push_str(&strips(t, width.unwrap_or(80), color));
    }
    out
}

/// Levels of a strip, lowest to highest.
const STRIP_LEVELS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// The live heap and VmRSS, one column per slice of time (each column the
/// highest value in its slice, so a short spike shows), and where the live
/// heap fell the most.
fn strips(t: &Timeline, width: usize, color: bool) -> String {
    const LABEL: usize = 8;
    let columns = width.saturating_sub(LABEL + 2).clamp(20, 120);
    let end =
        t.live_bytes.iter().chain(&t.vm_rss).map(|p| p.seconds).fold(0.0, f64::max).max(t.snapshots.last().map_or(0.0, |l| l.at_seconds));
    let top = t.live_bytes.iter().chain(&t.vm_rss).map(|p| p.bytes).max().unwrap_or(0).max(1);
    let slice = if end > 0.0 { end / columns as f64 } else { 1.0 };
    let mut out = String::new();
    let _ = writeln!(out, "live heap and VmRSS from 0 to {:.2} s, one column = {}, full height = {}:", end, column_time(slice), bytes(top));
    let strip = |series: &[SeriesPoint]| -> String {
        let mut line = String::new();
        let mut next = 0;
        // The value the series holds as a column begins (it holds until its next point).
        let mut held: Option<u64> = None;
        for column in 0..columns {
            let column_end = (column + 1) as f64 * slice;
            let mut high = held;
            while let Some(p) = series.get(next).filter(|p| p.seconds < column_end || column == columns - 1) {
                high = Some(high.map_or(p.bytes, |h| h.max(p.bytes)));
                held = Some(p.bytes);
                next += 1;
            }
            let level = high.map_or(0, |v| if v == 0 { 0 } else { ((v as f64 / top as f64 * 8.0).ceil() as usize).clamp(1, 8) });
            line.push(STRIP_LEVELS[level]);
        }
        line.trim_end().to_string()
    };
    if !t.live_bytes.is_empty() {
        let line = strip(&t.live_bytes);
        let _ = writeln!(out, "{:>LABEL$}  {}", "live", if color { palette::paint(&line, palette::row("live")) } else { line });
    }
    if !t.vm_rss.is_empty() {
        let _ = writeln!(out, "{:>LABEL$}  {}", "VmRSS", strip(&t.vm_rss));
    }
    if let Some(fall) = largest_fall(&t.live_bytes) {
        let _ = writeln!(
            out,
            "the live heap fell most from {} at {:.3} s to {} at {:.3} s; VmRSS at the end: {}",
            bytes(fall.0.bytes),
            fall.0.seconds,
            bytes(fall.1.bytes),
            fall.1.seconds,
            t.vm_rss.last().map_or("unknown".to_string(), |p| bytes(p.bytes))
        );
    }
    out
}

fn column_time(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else if seconds >= 0.01 {
        format!("{:.0} ms", seconds * 1e3)
    } else {
        format!("{:.2} ms", seconds * 1e3)
    }
}

/// The largest fall of a series: from its high so far (at the time the
/// first lower point came, when the fall began) to the lowest point after
/// it; `None` when it never falls by a quarter of that high.
pub fn largest_fall(series: &[SeriesPoint]) -> Option<(SeriesPoint, SeriesPoint)> {
    let mut high: Option<SeriesPoint> = None;
    let mut fall_began = 0.0;
    let mut best: Option<(SeriesPoint, SeriesPoint)> = None;
    for &p in series {
        let Some(h) = high.filter(|h| p.bytes < h.bytes) else {
            high = Some(p);
            fall_began = f64::NAN;
            continue;
        };
        if fall_began.is_nan() {
            fall_began = p.seconds;
        }
        if best.is_none_or(|(a, b)| h.bytes - p.bytes > a.bytes - b.bytes) {
            best = Some((SeriesPoint { seconds: fall_began, bytes: h.bytes }, p));
        }
    }
    best.filter(|(a, b)| (a.bytes - b.bytes) * 4 >= a.bytes)
}

fn snapshot_table(ledgers: &[Ledger], trims: &[TrimMark], trim_calls: u64, width: Option<usize>) -> String {
    type Column = (&'static str, fn(&Ledger) -> u64);
    let mut columns: Vec<Column> = vec![
        ("RSS", |l| l.rss_bytes),
        ("live", |l| l.rows.live),
        ("slack", |l| l.rows.slack),
        ("fragmented", |l| l.rows.fragmented),
        ("retained", |l| l.rows.retained),
        ("lazy_free", |l| l.rows.lazy_free),
        ("runtime", |l| l.rows.runtime),
        ("other", |l| l.rows.other),
    ];
    // Each column as wide as its header or widest value.
    let column_width = |c: &Column| ledgers.iter().map(|l| bytes(c.1(l)).len()).chain([c.0.len()]).max().unwrap_or(0);
    let line_width =
        |columns: &[Column], residual: bool| 8 + columns.iter().map(|c| column_width(c) + 1).sum::<usize>() + if residual { 10 } else { 0 };
    let mut residual = true;
    if let Some(width) = width {
        for name in ["lazy_free", "slack", "runtime"] {
            if line_width(&columns, residual) <= width {
                break;
            }
            if let Some(i) = columns.iter().position(|c| c.0 == name).filter(|&i| ledgers.iter().all(|l| columns[i].1(l) == 0)) {
                columns.remove(i);
            }
        }
        residual = line_width(&columns, residual) <= width;
    }
    let widths: Vec<usize> = columns.iter().map(column_width).collect();
    let mut out = format!("{:>8}", "seconds");
    for ((name, _), w) in columns.iter().zip(&widths) {
        let _ = write!(out, " {name:>w$}");
    }
    out.push_str(if residual { "  residual\n" } else { "\n" });
    let shown = trims.len() as u64;
    let mut trims = trims.iter().peekable();
    let trim_line = |out: &mut String, m: &TrimMark| {
        let pad = if m.pad_bytes > 0 { format!("({})", bytes(m.pad_bytes)) } else { String::new() };
        let nothing = if m.returned { "" } else { " (returned 0: nothing released)" };
        let _ = writeln!(out, "{:>8.2} malloc_trim{pad}: {} → {}{nothing}", m.seconds, bytes(m.rss_before_bytes), bytes(m.rss_after_bytes));
    };
    for l in ledgers {
        while let Some(m) = trims.next_if(|m| m.seconds <= l.at_seconds) {
            trim_line(&mut out, m);
        }
        let _ = write!(out, "{:>8.2}", l.at_seconds);
        for ((_, value), w) in columns.iter().zip(&widths) {
            let _ = write!(out, " {:>w$}", bytes(value(l)));
        }
        if residual {
            let _ = write!(out, " {:>8.2}%", percent(l.residual_bytes.unsigned_abs(), l.rss_bytes));
        }
        out.push('\n');
    }
    for m in trims {
        trim_line(&mut out, m);
    }
    if trim_calls > shown {
        let _ = writeln!(out, "({} malloc_trim calls; the {} that released most are shown)", count(trim_calls), count(shown));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_page_map_says_who_gives_the_rows() {
        let share =
            |owner, live| memgap_model::OwnerShare { owner, rows: memgap_model::Rows { live, ..Default::default() }, ..Default::default() };
        let ledger = Ledger { owners: vec![share("glibc", 0), share("go", 4096)], ..Ledger::default() };
        assert!(no_page_map(&ledger).ends_with("page by page; go gives its rows from its own figures (memgap ledger).\n"));
        let ledger = Ledger { owners: vec![share("glibc", 1), share("go", 4096)], ..Ledger::default() };
        assert!(no_page_map(&ledger).contains("; glibc, go give their rows"));
        assert!(no_page_map(&Ledger::default()).ends_with("page by page.\n"));
    }

    #[test]
    fn cells_take_the_most_common_class() {
        let pages = [PageClass::Used { fill: 255 }, PageClass::Used { fill: 200 }, PageClass::NotResident];
        assert_eq!(cell_text(&pages, false), "#");
        assert_eq!(cell_text(&[PageClass::Free { trimmable: true }], false), "T");
        assert_eq!(cell_text(&[PageClass::Used { fill: 10 }], false), ".");
    }

    #[test]
    fn brief_is_prefixed_lines() {
        let l = Ledger { rss_bytes: 4096, rows: memgap_model::Rows { live: 4096, ..Default::default() }, ..Ledger::default() };
        assert!(crate::verdict::of(&l).contains("Most of it is live data"));
        let verdict = wrap(&crate::verdict::of(&l), 90, "memgap: ");
        assert_eq!(brief(&l), format!("memgap: at 0.00 s, RSS 4.00 KiB: live 4.00 KiB (100%)\n{verdict}"));
        let moment = memgap_model::Moment {
            index: 3,
            seconds: 2.414,
            chosen: "gap",
            reason: "the largest gap between RSS and the live heap".into(),
        };
        let l = Ledger { moment: Some(moment), ..l };
        assert_eq!(
            brief(&l),
            format!(
                "memgap: at 2.41 s, the largest gap between RSS and the live heap; --at peak|end|SECONDS for others\nmemgap: RSS 4.00 KiB: live 4.00 KiB (100%)\n{verdict}"
            )
        );
    }

    #[test]
    fn timeline_puts_trims_between_the_snapshots_around_them() {
        let at = |seconds: f64, rss_bytes: u64| Ledger { at_seconds: seconds, rss_bytes, ..Ledger::default() };
        let trim = |seconds: f64, returned: bool| TrimMark {
            seconds,
            rss_before_bytes: 412 << 20,
            rss_after_bytes: 38 << 20,
            pad_bytes: 0,
            returned,
        };
        let text = snapshot_table(&[at(1.0, 412 << 20), at(2.0, 38 << 20)], &[trim(1.5, true), trim(2.5, false)], 2, None);
        let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
        let words = |line: &str| line.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        assert_eq!(words(lines[1]), "1.00 412 MiB", "{text}");
        assert_eq!(lines[2], "1.50 malloc_trim: 412 MiB → 38.0 MiB");
        assert_eq!(words(lines[3]), "2.00 38.0 MiB", "{text}");
        assert_eq!(lines[4], "2.50 malloc_trim: 412 MiB → 38.0 MiB (returned 0: nothing released)");
        assert_eq!(lines.len(), 5, "{text}");
        let thinned = snapshot_table(&[at(1.0, 412 << 20)], &[trim(0.5, true)], 3000, None);
        assert!(thinned.ends_with("(3,000 malloc_trim calls; the 1 that released most are shown)\n"), "{thinned}");
    }

    #[test]
    fn strips_show_the_live_heap_falling_where_it_fell() {
        let point = |seconds: f64, bytes: u64| SeriesPoint { seconds, bytes };
        // 64 MiB held from 0.01 s, freed between 0.075 s and 0.1 s, a snapshot at 0.4 s.
        let live = vec![point(0.0, 0), point(0.01, 64 << 20), point(0.075, 60 << 20), point(0.1, 1 << 20), point(0.4, 1 << 20)];
        let vm_rss = vec![point(0.0, 1 << 20), point(0.05, 66 << 20), point(0.4, 66 << 20)];
        let t = Timeline { snapshots: vec![Ledger { at_seconds: 0.4, ..Ledger::default() }], live_bytes: live.clone(), vm_rss };
        let text = timeline(&t, &[], 0, Some(48), false);
        let strip = text.lines().find(|l| l.trim_start().starts_with("live  ")).unwrap_or_else(|| panic!("{text}"));
        let cells: Vec<char> = strip.trim_start().trim_start_matches("live").trim_start().chars().collect();
        // 38 columns of about 10.5 ms: full from the first to the seventh, low from the tenth.
        assert_eq!(cells[3], '█', "{text}");
        assert_eq!(cells[6], '█', "{text}");
        assert_eq!(cells[12], '▁', "{text}");
        let rss = text.lines().find(|l| l.trim_start().starts_with("VmRSS ")).unwrap();
        assert!(rss.ends_with("███"), "VmRSS stays high: {text}");
        assert!(text.contains("fell most from 64.0 MiB at 0.075 s to 1.00 MiB at 0.100 s"), "{text}");
        assert_eq!(largest_fall(&live[..3]), None, "a fall by less than a quarter");
    }

    #[test]
    fn wraps_words() {
        assert_eq!(wrap("aa bb cc", 5, "> "), "> aa bb\n> cc\n");
    }
}
