//! The verdict: the ledger's findings and figures told in a paragraph.
//! The model decides what holds the gap (`gap_owner`, `findings`,
//! `remedies`); the sentences are written here, one file per owner whose
//! verdict says more than its rows.

use memgap_model::ledger::measured::{Measured, recommendable};
use memgap_model::{Ledger, Remedy};

mod ghc;
mod go;
mod malloc;
mod node;
mod python;
mod ruby;

/// The whole verdict: the layers' headlines (a runtime over malloc), then
/// the paragraph of the owner holding most of the gap, or the core's.
pub fn of(l: &Ledger) -> String {
    let body = l.gap_owner.and_then(|owner| owner_verdict(l, owner)).unwrap_or_else(|| verdict(l));
    let headlines: Vec<String> = [ruby::headline(l), node::headline(l)].into_iter().flatten().collect();
    if headlines.is_empty() {
        return body;
    }
    // The headline gave the gap's ratio against its own layer; a second
    // ratio against the live row would contradict it.
    let body = match body.strip_prefix(opening(l).as_str()) {
        Some(rest) => format!("{}{rest}", layer_opening(l)),
        None => body,
    };
    format!("{} {body}", headlines.join(" "))
}

/// The paragraph of an owner that has one of its own.
fn owner_verdict(l: &Ledger, owner: &str) -> Option<String> {
    match owner {
        go::NAME => go::verdict(l),
        ghc::NAME => ghc::verdict(l),
        node::NAME => node::verdict(l),
        python::NAME => python::verdict(l),
        name if malloc::NAMES.contains(&name) => Some(malloc::verdict(l, name)),
        _ => None,
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 * 100.0 / whole as f64 }
}

fn mib(bytes: u64) -> String {
    memgap_model::human_bytes(bytes)
}

/// One paragraph when no owner holds the gap (it sits in `other` or in
/// thread stacks), or for an owner without a verdict of its own: the
/// dominant row besides live, and the remedies that apply.
pub fn verdict(l: &Ledger) -> String {
    // Shares are of the RSS the kernel reported, as in every table (the rows
    // add up to it); only the ratio leaves memgap's own memory out.
    let rss = l.rss_bytes.max(1);
    let r = &l.rows;
    let heap_total = r.live + r.slack + r.fragmented + r.retained + r.lazy_free;
    let mut gap_rows = program_gap_rows(l);
    gap_rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    let (dominant, bytes) = gap_rows[0];
    let opening = opening(l);
    let share = percent(bytes, rss);
    if bytes < r.live / 4 && r.live > heap_total / 2 {
        return format!("{opening} Most of it is live data: the allocator and runtime add little. Shrinking RSS means holding less.");
    }
    let body = match dominant {
        "fragmented" => format!("{share:.0}% of RSS ({}) is free space on pages that still hold live blocks: fragmentation.", mib(bytes)),
        "retained" => format!("{share:.0}% of RSS ({}) is free pages the allocator or runtime keeps.", mib(bytes)),
        "lazy_free" => format!(
            "{share:.0}% of RSS ({}) was returned with MADV_FREE and is still counted until the kernel needs the memory. Nothing to fix: it is reclaimed under pressure.",
            mib(bytes)
        ),
        "slack" => format!(
            "{share:.0}% of RSS ({}) is allocator overhead inside live blocks (headers, alignment, size-class rounding). Fewer, larger objects help.",
            mib(bytes)
        ),
        "runtime" => {
            format!("{share:.0}% of RSS ({}) is thread stacks and runtime metadata. Fewer threads or smaller stacks help.", mib(bytes))
        }
        _ => other_sentence(l, share, bytes),
    };
    let tries = remedies_sentence(l);
    format!("{opening} {body}{tries}")
}

/// The rows besides live that make the program's gap, `other` without
/// memgap's own memory.
pub fn program_gap_rows(l: &Ledger) -> [(&'static str, u64); 6] {
    let r = &l.rows;
    let other = r.other.saturating_sub(l.memgap_bytes);
    [
        ("fragmented", r.fragmented),
        ("retained", r.retained),
        ("lazy_free", r.lazy_free),
        ("slack", r.slack),
        ("other", other),
        ("runtime", r.runtime),
    ]
}

/// " (Zx)": how many times `base` `bytes` is; nothing when `base` is zero,
/// as a ratio to nothing says nothing.
fn times(bytes: u64, base: u64) -> String {
    match base {
        0 => String::new(),
        base => format!(" ({:.1}x)", bytes as f64 / base as f64),
    }
}

/// "The program holds X of live heap; the kernel charges Y of RSS (Zx)":
/// RSS less memgap's own memory, which is named apart.
pub fn opening(l: &Ledger) -> String {
    let rss = l.program_rss();
    let ratio = times(rss, l.rows.live);
    if l.memgap_bytes == 0 {
        return format!("The program holds {} of live heap; the kernel charges {} of RSS{ratio}.", mib(l.rows.live), mib(rss));
    }
    format!(
        "The program holds {} of live heap; the kernel charges {} of RSS for it{ratio}, memgap's own {} left out.",
        mib(l.rows.live),
        mib(rss),
        mib(l.memgap_bytes)
    )
}

/// The opening under a layer's headline: the live row (every owner's live
/// data, the layer's included), without a second ratio.
fn layer_opening(l: &Ledger) -> String {
    match l.memgap_bytes {
        0 => format!("Live data in all: {}.", mib(l.rows.live)),
        own => format!("Live data in all: {}; memgap's own {} is left out.", mib(l.rows.live), mib(own)),
    }
}

/// "X% of RSS is outside every heap: …" with `other`'s parts (memgap's own
/// memory is not among them: it is named apart).
pub fn other_sentence(l: &Ledger, share: f64, bytes: u64) -> String {
    format!(
        "{share:.0}% of RSS ({}) is outside the heap: code and file mappings {}, the program's own anonymous mmaps {}, static data {}, unclassified {}.",
        mib(bytes),
        mib(l.other_breakdown.file + l.other_breakdown.shmem),
        mib(l.other_breakdown.program_mmap),
        mib(l.other_breakdown.static_data),
        mib(l.other_breakdown.unclassified)
    )
}

/// " To try: …" with the ledger's remedies, best first (empty without).
pub fn remedies_sentence(l: &Ledger) -> String {
    remedies_of(&l.remedies)
}

/// " To try: …" with the best three remedies that did not measure worse,
/// and what `memgap compare --remedies` measured of them and of the others
/// (empty without remedies).
pub fn remedies_of(remedies: &[Remedy]) -> String {
    let b = memgap_model::human_bytes;
    let figure = |m: &Measured| format!("{} RSS {} → {}", m.metric, b(m.default_bytes), b(m.bytes));
    let tries: Vec<String> = remedies
        .iter()
        .filter(|r| recommendable(r))
        .take(3)
        .map(|r| match &r.measured {
            Some(m) => format!("{} (measured: {})", r.description, figure(m)),
            None => r.description.clone(),
        })
        .collect();
    let mut text = if tries.is_empty() { String::new() } else { format!(" To try: {}.", tries.join("; ")) };
    let rejected: Vec<String> = remedies
        .iter()
        .filter(|r| !recommendable(r))
        .filter_map(|r| r.measured.as_ref().map(|m| format!("{} ({}, {})", r.id, figure(m), m.outcome.name())))
        .collect();
    if !rejected.is_empty() {
        text.push_str(&format!(" Measured with memgap compare and not recommended: {}.", rejected.join("; ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use memgap_model::go::{GoLedger, GoSizeClass, GoSource};
    use memgap_model::ledger::OwnerShare;
    use memgap_model::ledger::measured::{Measured, Outcome};
    use memgap_model::ruby::RubyLayer;
    use memgap_model::{Ledger, Remedy, Rows};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn go_ledger(section: GoLedger, rows: Rows) -> Ledger {
        let mut l = Ledger { rss_bytes: rows.total(), rows, gap_owner: Some("go"), ..Ledger::default() };
        l.owners.push(OwnerShare { owner: "go", rows, released_bytes: 0, estimated: None });
        l.set_section("go", &section);
        l
    }

    #[test]
    fn a_go_verdict_names_the_sparse_class_and_what_packing_it_gives_back() {
        let class = GoSizeClass {
            size: 16,
            span_bytes: 8192,
            objects_per_span: 512,
            live_objects: 2048,
            spans_needed: 4,
            spans_estimate: 2048,
            occupancy: 2048.0 / (2048.0 * 512.0),
            unused_bytes_estimate: 16 * MIB,
            ..GoSizeClass::default()
        };
        let section = GoLedger {
            source: GoSource::RuntimeMetrics,
            exact: true,
            size_classes: vec![class],
            sparse_classes: vec![16],
            ..GoLedger::default()
        };
        let text = of(&go_ledger(section, Rows { live: MIB / 32, fragmented: 16 * MIB, ..Rows::default() }));
        assert!(text.contains("fragmentation") && text.contains("[]T instead of []*T"), "{text}");
        assert!(text.contains("16-byte objects: 2048 live in about 2048 spans of 512"), "{text}");
        // (2048 − 4) spans of 8 KiB back when packed.
        assert!(text.contains(&format!("about {} back", memgap_model::human_bytes(2044 * 8192))), "{text}");
    }

    #[test]
    fn a_go_verdict_without_the_runtimes_split_says_how_to_get_it() {
        let section =
            GoLedger { source: GoSource::Gctrace, exact: false, estimated: Some("estimated from gctrace".into()), ..GoLedger::default() };
        let text = of(&go_ledger(section, Rows { live: 2 * MIB, retained: 2 * MIB, ..Rows::default() }));
        assert!(text.contains("estimated from gctrace") && text.contains("memgap.dev/go/memgap"), "{text}");
    }

    #[test]
    fn an_owner_without_its_figures_gets_the_cores_verdict() {
        let rows = Rows { live: MIB, fragmented: 8 * MIB, ..Rows::default() };
        let l = Ledger { rss_bytes: rows.total(), rows, gap_owner: Some("go"), ..Ledger::default() };
        let text = of(&l);
        assert!(text.starts_with("The program holds 1.00 MiB of live heap") && text.contains("fragmentation"), "{text}");
    }

    #[test]
    fn the_ruby_headline_names_the_layer_that_holds_the_gap() {
        let layer = RubyLayer {
            version: "3.1.2".into(),
            object_pages: 100,
            object_pages_bytes: 100 * 16384,
            live_slots_bytes: 400 * 40,
            free_slots_bytes: 40500 * 40,
            free_slot_fraction: 40500.0 / 40900.0,
            known_bytes: MIB,
            ..RubyLayer::default()
        };
        let with_layer = |rss: u64, rows: Rows| {
            let mut l = Ledger { rss_bytes: rss, rows, ..Ledger::default() };
            l.other_breakdown.program_mmap = 3 * MIB;
            memgap_model::ruby::attach(&mut l, &layer);
            of(&l)
        };
        let text = with_layer(200 * MIB, Rows { retained: 150 * MIB, ..Rows::default() });
        assert!(text.starts_with("Ruby 3.1.2 knows of 1.00 MiB") && text.contains("malloc layer"), "{text}");
        // One ratio only: the headline's.
        assert_eq!(text.matches("x)").count(), 1, "{text}");
        assert!(text.contains("Live data in all: "), "{text}");
        let text = with_layer(4 * MIB, Rows { retained: 4096, ..Rows::default() });
        assert!(text.contains("GC.compact"), "{text}");
    }

    /// The verdict's shares are of the RSS the kernel reported, the base of
    /// the ledger's table and of `memgap run`'s ledger line; only the ratio
    /// leaves memgap's own memory out.
    #[test]
    fn the_verdicts_shares_are_of_the_rss_the_table_shows() {
        let l = Ledger {
            rss_bytes: 100 * MIB,
            memgap_bytes: 10 * MIB,
            rows: Rows { live: 5 * MIB, fragmented: 80 * MIB, other: 15 * MIB, ..Rows::default() },
            ..Ledger::default()
        };
        let text = of(&l);
        assert!(text.contains("the kernel charges 90.0 MiB of RSS for it (18.0x), memgap's own 10.0 MiB left out"), "{text}");
        assert!(text.contains(" 80% of RSS (80.0 MiB) is free space on pages that still hold live blocks"), "{text}");
    }

    /// A program whose heap memgap does not see (an allocator it cannot
    /// hook) gets no ratio to zero live bytes.
    #[test]
    fn no_live_heap_gets_no_ratio() {
        let l = Ledger { rss_bytes: 66 * MIB, rows: Rows { other: 66 * MIB, ..Rows::default() }, ..Ledger::default() };
        let text = of(&l);
        assert!(text.starts_with("The program holds 0 B of live heap; the kernel charges 66.0 MiB of RSS."), "{text}");
        assert!(!text.contains("x)"), "{text}");
        // Nor a Go program whose runtime reported nothing yet.
        let go = go_ledger(GoLedger { source: GoSource::None, ..GoLedger::default() }, Rows { retained: 66 * MIB, ..Rows::default() });
        let text = of(&go);
        assert!(text.starts_with("The Go heap holds 0 B of objects; the kernel charges 66.0 MiB of RSS."), "{text}");
        assert!(!text.contains("x)"), "{text}");
    }

    #[test]
    fn remedies_that_measured_worse_are_named_apart() {
        let measured =
            |bytes: u64, outcome: Outcome| Measured { metric: "steady".into(), default_bytes: 180 * MIB, bytes, runs: 3, outcome };
        let mut trim = Remedy::new("glibc-trim", "glibc", "trim every second", &[("LD_PRELOAD", "libmemgap_trim.so")], 110 * MIB);
        trim.measured = Some(measured(80 * MIB, Outcome::Lower));
        let mut arenas = Remedy::new("glibc-arena-max", "glibc", "fewer arenas", &[("MALLOC_ARENA_MAX", "2")], 120 * MIB);
        arenas.measured = Some(measured(190 * MIB, Outcome::Higher));
        let text = remedies_of(&[trim, arenas]);
        let (tries, rejected) = text.split_once("not recommended").unwrap();
        assert!(!tries.contains("fewer arenas") && tries.contains("trim every second (measured: steady RSS 180 MiB → 80.0 MiB)"), "{text}");
        assert!(rejected.contains("glibc-arena-max (steady RSS 180 MiB → 190 MiB, higher)"), "{text}");
        assert_eq!(remedies_of(&[]), "");
    }
}
