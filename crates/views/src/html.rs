//! The HTML report: one self-contained file that works offline.
//!
//! The page is a fixed template (src/report/) with the report's data
//! embedded as JSON in a `<script type="application/json">` element (every
//! `<` escaped, so no string from the trace can close it) and the page maps
//! as gzipped bytes in base64 (one byte per page), decoded by the browser's
//! DecompressionStream. The script reads the data with JSON.parse and puts
//! every string from the trace into the DOM with textContent. A
//! Content-Security-Policy forbids any network request.

use std::collections::BTreeMap;
use std::io::Write;

use memgap_model::ledger::NO_NODE;
use memgap_model::report::Report;
use memgap_model::{Blame, BlameEntry, Ledger, PageClass};
use serde::Serialize;
use serde_json::{Value, json};

const TEMPLATE: &str = include_str!("report/report.html");
const STYLE: &str = include_str!("report/report.css");
const SCRIPT: &str = include_str!("report/report.js");

/// Blame entries kept when there are more: the top of each order the table sorts by.
const BLAME_TOP_PER_ORDER: usize = 200;
/// Flame graph nodes below this share of the total are left out.
const FLAME_MIN_SHARE: f64 = 1.0 / 2000.0;

/// The page-map byte of a page: 0 not resident, 1 free (trim would return
/// it), 2 free (kept), 3 memgap, 4 program mmap, 5..=36 used, by fill,
/// 37..=68 a pymalloc arena's, by its fill, 69 an arena holding no block.
pub fn page_byte(class: PageClass) -> u8 {
    match class {
        PageClass::NotResident => 0,
        PageClass::Free { trimmable: true } => 1,
        PageClass::Free { trimmable: false } => 2,
        PageClass::Agent => 3,
        PageClass::ProgramMmap => 4,
        PageClass::Used { fill } => 5 + fill / 8,
        PageClass::Python { fill: Some(fill) } => 37 + fill / 8,
        PageClass::Python { fill: None } => 69,
    }
}

/// The whole report as one HTML document.
pub fn report(report: &Report, trace_name: &str) -> String {
    let mut blobs: Vec<String> = Vec::new();
    let site_of = |stack: u32| report.blame.as_ref().and_then(|b| b.site_of_stack.get(&stack)).map(String::as_str);
    let snapshots: Vec<Value> =
        report.snapshots.iter().enumerate().map(|(index, ledger)| snapshot(index, ledger, &mut blobs, &site_of)).collect();
    let data = json!({
        "trace": trace_name,
        "summary": summary(report),
        "peak": report.peak,
        "moment": {
            "index": report.moment.index,
            "seconds": report.moment.seconds,
            "chosen": report.moment.chosen,
            "reason": report.moment.reason,
            "line": report.moment.line(),
        },
        "snapshots": snapshots,
        "no_page_map": report.snapshots.get(report.moment.index).map(|ledger| crate::ledger::no_page_map(ledger).trim().to_string()),
        "rss": report.rss.iter().map(|s| [s.seconds, s.vm_rss as f64]).collect::<Vec<_>>(),
        "live_heap": report.live_heap,
        "palette": crate::palette::report_json(),
        "gc": report.gc_marks,
        "trims": report.trim_marks,
        "trim_calls": report.trim_calls,
        "blame": report.blame.as_ref().map(|b| json!({
            "at_seconds": b.at_seconds,
            "has_stacks": b.has_stacks,
            "fragmented_bytes": b.fragmented_bytes,
            "live_bytes": b.live_bytes,
            "sites": b.entries.len(),
            "entries": blame_entries(&b.entries).iter().map(|e| blame_entry(e)).collect::<Vec<_>>(),
            "warnings": b.warnings,
        })),
        "churn": report.blame.as_ref().map(churn),
        "flame": report.blame.as_ref().map(|b| flame(&b.by_stack)),
        "numa": report.numa,
        "ghc": report.ghc.as_ref().map(ghc_panel),
    });
    let mut pages = String::new();
    for (index, blob) in blobs.iter().enumerate() {
        // Base64 holds no '<': it cannot close the element.
        pages.push_str(&format!("<script type=\"application/octet-stream\" id=\"pages-{index}\">{blob}</script>\n"));
    }
    // The data goes in last: no string from the trace is searched for a placeholder.
    let go_panel = if report.snapshots.iter().any(|l| l.sections.contains_key(memgap_model::go::NAME)) { crate::go::PANEL } else { "" };
    let node_panel =
        if report.snapshots.iter().any(|l| l.sections.contains_key(memgap_model::owners::node::NAME)) { crate::node::PANEL } else { "" };
    TEMPLATE.replace("<!--GO-->", &format!("{go_panel}{node_panel}")).replace("/*STYLE*/", STYLE).replace("/*SCRIPT*/", SCRIPT).replacen(
        "<!--DATA-->",
        &format!("<script type=\"application/json\" id=\"data\">{}</script>\n{pages}", script_safe_json(&data)),
        1,
    )
}

/// The GHC panel's data: the major GCs (at most 2000, evenly spaced, the
/// last ones kept), the settled ledger, GCs per capability and the verdict.
fn ghc_panel(ghc: &memgap_model::ghc::GhcReport) -> Value {
    let majors: Vec<&memgap_model::ghc::GhcPoint> = ghc.timeline.iter().filter(|p| p.unmoved_bytes.is_some()).collect();
    let step = majors.len().div_ceil(2000).max(1);
    let points: Vec<Value> = majors
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || i + 2 >= majors.len())
        .map(|(_, p)| json!({"seconds": p.seconds, "rss": p.rss_bytes, "heap": p.heap_size_bytes, "rows": p.rows}))
        .collect();
    json!({
        "version": ghc.ghc_version,
        "collections": ghc.collections,
        "major_collections": ghc.major_collections,
        "max_live": ghc.max_live_bytes,
        "max_heap": ghc.max_heap_size_bytes,
        "points": points,
        "settled": ghc.settled,
        "caps": ghc.gcs_per_capability,
        "pinned_share": ghc.pinned_share,
        "rts_summary": ghc.rts_summary,
        "verdict": crate::ghc::verdict(ghc),
    })
}

/// JSON that cannot end a `<script>` element or open a comment in it: `<`,
/// `>` and `&` only occur inside strings, where their \u escapes mean the same.
pub fn script_safe_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("report data serializes").replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026")
}

fn summary(report: &Report) -> Value {
    let s = &report.summary;
    json!({
        "command": s.command,
        "argv": s.argv,
        "exe": s.exe,
        "pid": s.pid,
        "exit_code": s.exit_code,
        "signal": s.signal,
        "duration_seconds": s.duration_seconds,
        "total_events": s.total_events,
        "allocated_bytes": s.allocated_bytes,
        "peak_live_bytes": s.peak_live_bytes,
        "peak_live_seconds": s.peak_live_seconds,
        "peak_rss_bytes": s.peak_rss_bytes,
        "live_bytes_at_end": s.live_bytes_at_end,
        "threads": s.threads,
        "truncated": s.truncated,
        "truncated_reason": s.truncated_reason,
        "trace_bytes": s.trace_bytes,
    })
}

fn snapshot<'a>(index: usize, l: &Ledger, blobs: &mut Vec<String>, site_of: &dyn Fn(u32) -> Option<&'a str>) -> Value {
    let maps = if l.page_maps.is_empty() {
        Value::Null
    } else {
        let mut bytes = Vec::with_capacity(l.page_maps.iter().map(|m| m.pages.len()).sum());
        let mut maps = Vec::new();
        for map in &l.page_maps {
            maps.push(
                json!({"name": map.name, "start": map.start, "page_size": map.page_size, "offset": bytes.len(), "pages": map.pages.len()}),
            );
            bytes.extend(map.pages.iter().map(|&class| page_byte(class)));
        }
        blobs.push(base64(&gzip(&bytes)));
        let blob = blobs.len() - 1;
        // Each page's NUMA node, in the same order, when the agent placed them.
        let nodes_blob = if l.page_maps.iter().any(|m| !m.nodes.is_empty()) {
            let nodes: Vec<u8> =
                l.page_maps.iter().flat_map(|m| if m.nodes.is_empty() { vec![NO_NODE; m.pages.len()] } else { m.nodes.clone() }).collect();
            blobs.push(base64(&gzip(&nodes)));
            Some(blobs.len() - 1)
        } else {
            None
        };
        let objects = page_objects(l, blobs, site_of);
        json!({"blob": blob, "nodes_blob": nodes_blob, "bytes": bytes.len(), "maps": maps, "objects": objects})
    };
    json!({
        "index": index,
        "seconds": l.at_seconds,
        "reason": l.snapshot_reason,
        "rss": l.rss_bytes,
        "rows": l.rows,
        "memgap": l.memgap_bytes,
        "residual": l.residual_bytes,
        "released": l.released_bytes,
        "trim": l.trim_would_return_bytes,
        "retained_not_trimmable": l.retained_not_trimmable_bytes,
        "allocator": l.allocator,
        "arenas": l.arenas,
        "live_blocks": l.live_blocks,
        "other": l.other_breakdown,
        "heaps": l.heaps,
        "verdict": crate::verdict::of(l),
        "go": l.sections.get(memgap_model::go::NAME),
        "go_source": l.section::<memgap_model::GoLedger>(memgap_model::go::NAME).map(|g| crate::go::source_text(g.source)),
        "pagemap": maps,
        "ruby": l.sections.get(memgap_model::ruby::NAME),
        "node": l.sections.get(memgap_model::owners::node::NAME),
        "owners": l.owners,
        "gap_owner": l.gap_owner,
        "findings": l.findings,
        "remedies": l.remedies,
    })
}

/// The blocks on each page, for the page map's hover, when the ledger has
/// them (at the chosen moment): two blobs in page order over all maps, as the class
/// bytes are. `live`: each page's live bytes, u32 little-endian. `blocks`:
/// per page, varints: blocks touching it, how many are listed, then per
/// listed block its address less the page's (zigzag), its size and its
/// site's index in `sites` plus one (0: no stack).
fn page_objects<'a>(l: &Ledger, blobs: &mut Vec<String>, site_of: &dyn Fn(u32) -> Option<&'a str>) -> Value {
    if l.page_maps.iter().all(|m| m.objects.is_none()) {
        return Value::Null;
    }
    let mut live = Vec::new();
    let mut stream = Vec::new();
    let mut sites: Vec<&str> = Vec::new();
    let mut site_index: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for map in &l.page_maps {
        let Some(objects) = &map.objects else {
            live.extend(std::iter::repeat_n(0u8, 4 * map.pages.len()));
            stream.extend(std::iter::repeat_n(0u8, 2 * map.pages.len()));
            continue;
        };
        let mut listed = objects.listed.iter().peekable();
        for page in 0..map.pages.len() {
            live.extend_from_slice(&objects.live_bytes.get(page).copied().unwrap_or(0).to_le_bytes());
            put_varint(&mut stream, u64::from(objects.blocks.get(page).copied().unwrap_or(0)));
            let on_page: Vec<_> = std::iter::from_fn(|| listed.next_if(|b| b.page as usize == page)).collect();
            put_varint(&mut stream, on_page.len() as u64);
            let page_addr = map.start + page as u64 * map.page_size;
            for block in on_page {
                let delta = block.addr.wrapping_sub(page_addr) as i64;
                put_varint(&mut stream, ((delta << 1) ^ (delta >> 63)) as u64);
                put_varint(&mut stream, block.size);
                let site = site_of(block.stack).map_or(0, |label| {
                    *site_index.entry(label).or_insert_with(|| {
                        sites.push(label);
                        sites.len() as u64
                    })
                });
                put_varint(&mut stream, site);
            }
        }
    }
    blobs.push(base64(&gzip(&live)));
    let live_blob = blobs.len() - 1;
    blobs.push(base64(&gzip(&stream)));
    json!({"live_blob": live_blob, "blocks_blob": blobs.len() - 1, "sites": sites})
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// All entries when few; else the top of each order the table sorts by.
fn blame_entries(entries: &[BlameEntry]) -> Vec<&BlameEntry> {
    if entries.len() <= BLAME_TOP_PER_ORDER * 2 {
        return entries.iter().collect();
    }
    let keys: [fn(&BlameEntry) -> f64; 5] =
        [|e| e.fragmentation_bytes as f64, |e| e.live_bytes as f64, |e| e.objects as f64, |e| e.leaked_bytes as f64, |e| e.scatter];
    let mut kept = vec![false; entries.len()];
    for key in keys {
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by(|&a, &b| key(&entries[b]).total_cmp(&key(&entries[a])));
        for &i in order.iter().take(BLAME_TOP_PER_ORDER) {
            kept[i] = true;
        }
    }
    entries.iter().zip(kept).filter(|(_, k)| *k).map(|(e, _)| e).collect()
}

/// The Churn table: the sites with the most temporary allocations over
/// the whole run, beside every allocation of the run.
fn churn(b: &Blame) -> Value {
    json!({
        "allocations": b.allocations,
        "allocated_bytes": b.allocated_bytes,
        "temporary_allocations": b.temporary_allocations,
        "temporary_bytes": b.temporary_bytes,
        "temporary_ms": b.temporary_ms,
        "entries": b.churn.iter().map(|e| json!({
            "function": e.function,
            "file": e.file,
            "line": e.line,
            "module": e.module,
            "stack": e.stack.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
            "temporary": e.temporary_allocations,
            "temporary_bytes": e.temporary_bytes,
            "allocations": e.allocations,
            "allocated": e.allocated_bytes,
        })).collect::<Vec<_>>(),
    })
}

fn blame_entry(e: &BlameEntry) -> Value {
    json!({
        "function": e.function,
        "file": e.file,
        "line": e.line,
        "module": e.module,
        "stack": e.stack.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        "fragmentation": e.fragmentation_bytes,
        "live": e.live_bytes,
        "objects": e.objects,
        "leaked": e.leaked_bytes,
        "allocated": e.allocated_bytes,
        "pages": e.pages,
        "scatter": e.scatter,
        "stacks": e.stacks,
    })
}

#[derive(Default)]
struct FlameNode {
    value: u64,
    children: BTreeMap<String, FlameNode>,
}

impl FlameNode {
    fn to_json(&self, name: &str, min: u64) -> Value {
        let children: Vec<Value> =
            self.children.iter().filter(|(_, c)| c.value >= min && c.value > 0).map(|(n, c)| c.to_json(n, min)).collect();
        json!({"n": name, "v": self.value, "c": children})
    }
}

/// The icicle chart's tree, root first: fragmentation bytes by call stack
/// (live bytes when nothing is fragmented).
fn flame(by_stack: &[BlameEntry]) -> Value {
    let fragmented: u64 = by_stack.iter().map(|e| e.fragmentation_bytes).sum();
    let (measure, weight): (&str, fn(&BlameEntry) -> u64) =
        if fragmented > 0 { ("fragmentation", |e| e.fragmentation_bytes) } else { ("live", |e| e.live_bytes) };
    let mut root = FlameNode::default();
    for entry in by_stack {
        let value = weight(entry);
        if value == 0 {
            continue;
        }
        root.value += value;
        let mut node = &mut root;
        for frame in entry.stack.iter().rev() {
            node = node.children.entry(frame.label()).or_default();
            node.value += value;
        }
    }
    let min = (root.value as f64 * FLAME_MIN_SHARE) as u64;
    json!({"measure": measure, "root": root.to_json("all", min)})
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("writing to memory");
    encoder.finish().expect("writing to memory")
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16) | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8) | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn json_cannot_close_the_script() {
        let text = script_safe_json(&json!({"f": "</script><img src=x onerror=alert(1)>", "g": "<!--"}));
        assert!(!text.contains('<') && !text.contains('>'));
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["f"], "</script><img src=x onerror=alert(1)>");
    }

    #[test]
    fn page_bytes_are_distinct() {
        assert_eq!(page_byte(PageClass::Used { fill: 0 }), 5);
        assert_eq!(page_byte(PageClass::Used { fill: 255 }), 36);
        assert_eq!(page_byte(PageClass::Free { trimmable: true }), 1);
        assert_eq!(page_byte(PageClass::Python { fill: Some(0) }), 37);
        assert_eq!(page_byte(PageClass::Python { fill: Some(255) }), 68);
        assert_eq!(page_byte(PageClass::Python { fill: None }), 69);
    }
}
