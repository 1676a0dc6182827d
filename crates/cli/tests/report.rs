//! The HTML report loaded in a real browser (Debian's headless chromium):
//! every panel filled once its scripts ran, canvases not blank, no console
//! message and no network request, the page honouring #snapshot= and
//! #zoom=, and a trace carrying markup in its argv staying inert.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;

/// Chromium, or None (the test is skipped) outside CI when it is not installed.
fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|name| output_of(&mut command("sh", ["-c", &format!("command -v {name}")])).status.success());
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "chromium is not installed (apt-get install -y chromium)");
        eprintln!("skipped: chromium is not installed");
    }
    found
}

/// Runs headless chromium on `url` with `extra` flags; returns (stdout, stderr).
fn browse(browser: &str, url: &str, extra: &[&str]) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--enable-logging=stderr".into(),
        "--v=0".into(),
        "--virtual-time-budget=2000".into(),
        format!("--user-data-dir={}", profile.path().display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(url.to_string());
    let out = output_of(&mut command(browser, &args));
    assert!(out.status.success(), "chromium failed:\n{}", text(&out.stderr));
    (text(&out.stdout), text(&out.stderr))
}

fn dump_dom(browser: &str, url: &str) -> String {
    let (dom, stderr) = browse(browser, url, &["--dump-dom"]);
    // Console messages (errors, CSP violations, refused loads) are logged as CONSOLE.
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "the page logged:\n{}", console.join("\n"));
    let body = &dom[dom.find("<body").expect("a body")..];
    let body_tag = &body[..body.find('>').unwrap()];
    assert!(!body_tag.contains("data-error"), "a script failed: {body_tag}");
    assert!(body_tag.contains("data-ready=\"true\""), "the scripts did not finish: {body_tag}");
    dom
}

struct Screenshot {
    width: usize,
    rgb: Vec<[u8; 3]>,
}

fn screenshot(browser: &str, url: &str, dir: &Path, name: &str) -> Screenshot {
    let png_path = dir.join(name);
    browse(browser, url, &[&format!("--screenshot={}", png_path.display()), "--window-size=1400,2400", "--hide-scrollbars"]);
    let decoder = png::Decoder::new(std::fs::File::open(&png_path).expect("chromium wrote the screenshot"));
    let mut reader = decoder.read_info().unwrap();
    let mut buffer = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buffer).unwrap();
    let channels = info.color_type.samples();
    let rgb = buffer[..info.buffer_size()].chunks(channels).map(|p| [p[0], p[1], p[2]]).collect();
    Screenshot { width: info.width as usize, rgb }
}

impl Screenshot {
    fn count(&self, wanted: impl Fn([u8; 3]) -> bool) -> usize {
        self.rgb.iter().filter(|&&p| wanted(p)).count()
    }
}

/// The colours report.js gives used pages (fill 0..=31): from the
/// fragmented row's colour (nearly empty) to the live row's (full).
fn is_used_page_colour(p: [u8; 3]) -> bool {
    let (empty, full) = (memgap_views::palette::row("fragmented").rgb, memgap_views::palette::row("live").rgb);
    (0..32).any(|fill| {
        let f = fill as f64 / 31.0;
        let colour: Vec<u8> =
            empty.iter().zip(full).map(|(&e, u)| (f64::from(e) + (f64::from(u) - f64::from(e)) * f).round() as u8).collect();
        colour.iter().zip(p).all(|(a, b)| a.abs_diff(b) <= 1)
    })
}

/// culprit.c recorded with `memgap run --report`, shared by the tests.
fn culprit_report() -> &'static (tempfile::TempDir, PathBuf, String) {
    static REPORT: OnceLock<(tempfile::TempDir, PathBuf, String)> = OnceLock::new();
    REPORT.get_or_init(|| {
        let (tmp, dir) = tempdir();
        let exe = dir.join("culprit");
        let src = programs_dir().join("culprit.c");
        let out = output_of(&mut command("cc", ["-O0", "-g", "-o", arg(&exe), arg(&src), "-ldl"]));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let trace = dir.join("culprit.mgt");
        let out = memgap(&dir, &["run", "--report", "-o", arg(&trace), "--", arg(&exe)]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let html = dir.join("culprit.html");
        assert!(text(&out.stderr).contains(&format!("memgap: report: {}", html.display())), "{}", text(&out.stderr));
        let page = std::fs::read_to_string(&html).unwrap();
        (tmp, html, page)
    })
}

#[test]
fn report_is_self_contained_and_requests_nothing() {
    let (_, _, page) = culprit_report();
    assert!(page.contains(r#"<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">"#));
    for url in ["http://", "https://", "//cdn", "src=\"http", "@import"] {
        assert!(!page.contains(url), "the report refers to {url}");
    }
    let scripts = page.matches("<script").count();
    let closes = page.matches("</script>").count();
    assert_eq!(scripts, closes, "every script element closes once");
    assert!(page.len() < 2 << 20, "{} bytes", page.len());
}

#[test]
fn every_panel_is_filled_and_drawn_in_chromium() {
    let Some(browser) = chromium() else { return };
    let (_, html, _) = culprit_report();
    let url = format!("file://{}", html.display());
    let dom = dump_dom(browser, &url);
    for panel in ["verdict", "timeline", "pagemap", "ledger", "blame", "churn", "flame"] {
        assert!(dom.contains(&format!("id=\"{panel}\" class=\"panel\" data-ready=\"true\"")), "panel {panel} is not ready");
    }
    assert!(dom.contains("fragmentation"), "the verdict names the dominant row");
    assert!(dom.contains("site_sparse") && dom.contains("site_dense"), "blame lists culprit.c's sites");
    assert!(dom.contains("their fragmentation sums to the ledger\u{2019}s fragmented row"), "malloc alone: blame covers the whole row");
    let attribute = |name: &str| -> u64 {
        let after = dom.split(&format!("{name}=\"")).nth(1).unwrap_or_else(|| panic!("no {name} in the DOM"));
        after[..after.find('"').unwrap()].parse::<f64>().unwrap() as u64
    };
    assert!(attribute("data-pages") > 1000, "the page map holds the heap's pages");
    assert!(attribute("data-rows") >= 2, "blame rows");
    assert!(attribute("data-boxes") >= 2, "flame graph boxes");
    // The timeline: the live heap line from the events, the exit snapshot's bar, the selected moment.
    assert!(attribute("data-live-points") > 50, "the live heap line's points");
    assert!(attribute("data-exit-bar-width") >= 2, "the exit snapshot's bar has a width");
    assert!(dom.contains("data-selected=\""), "the selected snapshot is marked");

    let dir = html.parent().unwrap();
    let shot = screenshot(browser, &url, dir, "whole.png");
    assert_eq!(shot.width, 1400);
    let live = shot.count(|p| p == [0x4a, 0x78, 0xc2]);
    let fragmented = shot.count(|p| p == [0xe3, 0xa1, 0x3b]);
    let used_pages = shot.count(is_used_page_colour);
    assert!(live > 5000, "the timeline's live area has {live} pixels");
    assert!(fragmented > 2000, "the timeline's fragmented area has {fragmented} pixels");
    assert!(used_pages > 20_000, "the page map has {used_pages} pixels of used pages");
}

#[test]
fn zooming_the_page_map_and_choosing_a_snapshot_change_what_is_drawn() {
    let Some(browser) = chromium() else { return };
    let (_, html, _) = culprit_report();
    let dir = html.parent().unwrap();
    let url = format!("file://{}", html.display());
    let plain = screenshot(browser, &url, dir, "plain.png");
    let zoomed = screenshot(browser, &format!("{url}#zoom=16"), dir, "zoomed.png");
    let first = screenshot(browser, &format!("{url}#snapshot=0"), dir, "first.png");
    let differing = |a: &Screenshot, b: &Screenshot| a.rgb.iter().zip(&b.rgb).filter(|(x, y)| x != y).count();
    assert!(differing(&plain, &zoomed) > 10_000, "zooming in changed {} pixels", differing(&plain, &zoomed));
    assert!(differing(&plain, &first) > 10_000, "another snapshot changed {} pixels", differing(&plain, &first));
    let dom = dump_dom(browser, &format!("{url}#zoom=16&snapshot=0"));
    assert!(dom.contains("id=\"ledger\" class=\"panel\" data-ready=\"true\" data-snapshot=\"0\""), "the ledger shows snapshot 0");
    assert_eq!(dom.matches("data-snapshot=\"0\"").count(), 2, "the ledger and the page map show snapshot 0");
}

#[test]
fn markup_in_the_trace_stays_text() {
    let Some(browser) = chromium() else { return };
    let (_tmp, dir) = tempdir();
    let exe = compile(&dir, "planted.c");
    let payload = "</script><img src=x onerror=alert(1)>";
    let trace = dir.join("xss.mgt");
    let out = memgap(&dir, &["run", "--quiet", "--snapshot-interval", "0", "-o", arg(&trace), "--", arg(&exe), "strip", payload]);
    assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    let html = dir.join("xss.html");
    let out = memgap(&dir, &["report", arg(&trace), "-o", arg(&html)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains(payload), "the payload is in the HTML unescaped");
    assert!(page.contains(r"\u003c/script\u003e\u003cimg src=x onerror=alert(1)\u003e"), "the payload is in the data, escaped");
    let dom = dump_dom(browser, &format!("file://{}", html.display()));
    assert!(!dom.contains("<img"), "an <img> element was created");
    assert!(dom.contains("&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"), "the payload is shown as text");
}

#[test]
fn a_ruby_trace_shows_the_ruby_layer_and_others_do_not() {
    let Some(browser) = chromium() else { return };
    let (_, html, _) = culprit_report();
    let dom = dump_dom(browser, &format!("file://{}", html.display()));
    assert!(dom.contains("id=\"ruby\" class=\"panel\" hidden"), "a C program has no Ruby panel");

    let (_tmp, dir) = tempdir();
    let program = programs_dir().join("ruby").join("burst.rb");
    let out = memgap(&dir, &["run", "-q", "--report", "-o", "burst.mgt", "--", "ruby", arg(&program)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dom = dump_dom(browser, &format!("file://{}", dir.join("burst.html").display()));
    assert!(dom.contains("id=\"ruby\" class=\"panel\" data-ready=\"true\""), "the Ruby panel is not ready");
    assert!(dom.contains("Ruby-page fragmentation") && dom.contains("Ruby 3"), "the Ruby panel lists the layer");
    // Blame charges malloc's blocks only: its sum is not the whole fragmented row, and says so.
    assert!(
        dom.contains("malloc\u{2019}s part of the ledger\u{2019}s fragmented row") && dom.contains("ruby\u{2019}s own heap ("),
        "the blame note names Ruby's free slots"
    );
    // Ruby's major GCs are marked on the timeline.
    let marks = dom.split("data-gc-marks=\"").nth(1).and_then(|rest| rest[..rest.find('"')?].parse::<u32>().ok());
    assert!(marks.is_some_and(|n| n >= 2), "GC marks on the timeline: {marks:?}");
}

#[test]
fn the_page_map_colours_pages_by_numa_node() {
    let Some(browser) = chromium() else { return };
    let (_, html, _) = culprit_report();
    let dir = html.parent().unwrap();
    let url = format!("file://{}", html.display());
    let dom = dump_dom(browser, &format!("{url}#colour=node"));
    assert!(dom.contains("data-colour=\"node\""), "the page map is coloured by node");
    assert!(!dom.contains("id=\"pagemap-colour-label\" hidden"), "the colour choice is offered when pages have nodes");
    // This machine has one node: every resident heap page is node 0's colour.
    let by_node = screenshot(browser, &format!("{url}#colour=node"), dir, "nodes.png");
    let node0 = by_node.count(|p| p == [66, 133, 244]);
    assert!(node0 > 1000, "{node0} pixels of node 0's colour");
    let by_class = screenshot(browser, &url, dir, "classes.png");
    assert!(by_class.count(|p| p == [66, 133, 244]) < node0 / 10, "the default colours pages by what they hold");
}

#[test]
fn a_page_lists_its_blocks_and_their_call_sites() {
    let Some(browser) = chromium() else { return };
    let (_, html, page) = culprit_report();
    // The report's own data: where the main arena starts at the report's moment.
    let json = page
        .split("<script type=\"application/json\" id=\"data\">")
        .nth(1)
        .and_then(|rest| rest.split("</script>").next())
        .expect("the data element");
    let data: serde_json::Value = serde_json::from_str(json).unwrap();
    let moment = &data["snapshots"][data["moment"]["index"].as_u64().unwrap() as usize]["pagemap"];
    let heap = moment["maps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str().unwrap().contains("[heap]"))
        .expect("the main arena's page map");
    assert!(
        moment["objects"]["sites"].as_array().unwrap().iter().any(|s| s.as_str().unwrap().starts_with("site_dense (culprit.c:")),
        "{}",
        moment["objects"]
    );
    // 4 MiB in: culprit.c's dense 256-byte blocks, about 15 to a page.
    let address = heap["start"].as_u64().unwrap() + (4 << 20);
    let dom = dump_dom(browser, &format!("file://{}#address={address:x}", html.display()));
    let detail = dom
        .split("<pre id=\"pagemap-page\" class=\"page-detail\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .expect("the page detail");
    assert!(detail.contains(&format!("0x{:x}", address)), "{detail}");
    assert!(detail.contains("live: ") && detail.contains(" blocks"), "{detail}");
    assert!(detail.matches("256 B  site_dense (culprit.c:").count() >= 4, "{detail}");
    assert!(detail.contains("more"), "a full page lists its first blocks: {detail}");
}

#[test]
fn the_program_s_malloc_trim_is_marked_on_the_timeline() {
    const MIB: u64 = 1 << 20;
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "trim_marks.c");
    let out = memgap(&dir, &["run", "-q", "--report", "-o", "trim.mgt", "--", arg(&prog)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(dir.join("trim.html")).unwrap();
    let json = page
        .split("<script type=\"application/json\" id=\"data\">")
        .nth(1)
        .and_then(|rest| rest.split("</script>").next())
        .expect("the data element");
    let data: serde_json::Value = serde_json::from_str(json).unwrap();
    let trims = data["trims"].as_array().expect("trims in the report data");
    assert_eq!((trims.len(), data["trim_calls"].as_u64()), (1, Some(1)), "{}", data["trims"]);
    let (before, after) = (trims[0]["rss_before_bytes"].as_u64().unwrap(), trims[0]["rss_after_bytes"].as_u64().unwrap());
    assert!(before > after + 50 * MIB && trims[0]["returned"] == true, "{}", trims[0]);
    let seconds = trims[0]["seconds"].as_f64().unwrap();
    let duration = data["summary"]["duration_seconds"].as_f64().unwrap();
    assert!(seconds > 0.3 && seconds < duration, "the trim at {seconds} s of {duration} s");

    let Some(browser) = chromium() else { return };
    let dom = dump_dom(browser, &format!("file://{}", dir.join("trim.html").display()));
    let marks = dom.split("data-trim-marks=\"").nth(1).and_then(|rest| rest[..rest.find('"')?].parse::<u32>().ok());
    assert_eq!(marks, Some(1), "trim marks drawn on the timeline");
    assert!(dom.contains("malloc_trim</span>"), "the legend names the marks");
    let caption = dom
        .split("<p id=\"timeline-trims\" class=\"caption\">")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .expect("the trim caption is shown");
    assert!(caption.starts_with("The program called malloc_trim: ") && caption.contains(" MiB → "), "{caption}");
    // A C program has no runtime: no GC marks beside the trim.
    assert!(dom.contains("data-gc-marks=\"0\""), "no GC marks");
    assert!(culprit_report().2.contains("\"trims\":[]"), "a program that never trims has no trim marks");
}

/// The verdict panel shows each heap owner's share of RSS and the remedies,
/// with what `memgap compare --remedies` measured of them.
#[test]
fn owners_shares_and_measured_remedies_are_shown() {
    let Some(browser) = chromium() else { return };
    let (_tmp, dir) = tempdir();
    let exe = dir.join("thread_churn");
    let out = output_of(&mut command("cc", ["-O2", "-pthread", "-o", arg(&exe), arg(&programs_dir().join("thread_churn.c"))]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = memgap(&dir, &["run", "-q", "-o", "t.mgt", "--", arg(&exe)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = memgap(&dir, &["compare", "--repeat", "1", "--remedies", "t.mgt", "--", arg(&exe)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = memgap(&dir, &["report", "t.mgt"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dom = dump_dom(browser, &format!("file://{}", dir.join("t.html").display()));
    assert!(dom.contains("id=\"owners-panel\" data-owners=\"1\""), "the owners panel is not shown");
    assert!(dom.contains("glibc (holds the gap)"), "the owner holding the gap is named");
    let remedies = dom.split("data-remedies=\"").nth(1).and_then(|rest| rest[..rest.find('"')?].parse::<u32>().ok());
    assert!(remedies.is_some_and(|n| n >= 2), "remedies listed: {remedies:?}");
    assert!(dom.contains("<b>glibc-trim</b>") && dom.contains("LD_PRELOAD=libmemgap_trim.so"), "the trim remedy and its environment");
    // thread_churn's eight arenas keep ~64 MiB that the trim library returns.
    assert!(dom.contains("class=\"measured-lower\">steady RSS"), "what compare measured");
}

#[test]
fn a_node_trace_shows_v8s_heap_spaces() {
    let Some(browser) = chromium() else { return };
    let (_, html, _) = culprit_report();
    let dom = dump_dom(browser, &format!("file://{}", html.display()));
    assert!(!dom.contains("id=\"node-panel\""), "a C program has no Node panel");

    let (_tmp, dir) = tempdir();
    let program = programs_dir().join("node").join("heap.js");
    let out = memgap(&dir, &["run", "-q", "--report", "-o", "heap.mgt", "--", "node", arg(&program), "40", "1600"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dom = dump_dom(browser, &format!("file://{}", dir.join("heap.html").display()));
    assert!(dom.contains("id=\"node-panel\" class=\"panel\" data-ready=\"true\""), "the Node panel is not ready");
    let spaces = dom.split("id=\"node-spaces\"").nth(1).expect("the spaces table");
    let spaces = &spaces[..spaces.find("</table>").unwrap()];
    assert!(spaces.contains("<td style=\"border-left: 6px solid") && spaces.contains(">old_space<"), "old space listed: {spaces}");
    assert!(dom.contains("isolate") && dom.contains("mark-compacts"), "V8's figures are shown");
}

/// tests/programs/churn_sites.c: the Churn table lists the churning site
/// first, with the allocations the program counted itself.
#[test]
fn the_churn_table_lists_the_site_that_frees_soonest() {
    let Some(browser) = chromium() else { return };
    let (_tmp, dir) = tempdir();
    let exe = dir.join("churn_sites");
    let src = programs_dir().join("churn_sites.c");
    let out = output_of(&mut command("cc", ["-O0", "-g", "-o", arg(&exe), arg(&src)]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let trace = dir.join("churn.mgt");
    let out = memgap(&dir, &["run", "--quiet", "--report", "-o", arg(&trace), "--", arg(&exe), "12000"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let churned = printed.lines().find_map(|l| l.strip_prefix("churn_block 12000 ")).expect("the program's own count").trim().to_string();
    let dom = dump_dom(browser, &format!("file://{}", dir.join("churn.html").display()));
    let panel = &dom[dom.find("<section id=\"churn\"").expect("a churn panel")..];
    let panel = &panel[..panel.find("</section>").unwrap()];
    assert!(panel.contains("class=\"panel\" data-ready=\"true\""), "{panel}");
    let rows = panel.split("data-rows=\"").nth(1).and_then(|rest| rest[..rest.find('"').unwrap()].parse::<u32>().ok()).expect("data-rows");
    assert!(rows >= 1, "{panel}");
    let body = &panel[panel.find("<tbody>").expect("rows")..];
    let first_row = &body[..body.find("</tr>").unwrap()];
    assert!(first_row.contains("<b>churn_block</b>") && first_row.contains(">12,000<"), "{first_row}");
    let mib = churned.parse::<f64>().unwrap() / (1024.0 * 1024.0);
    assert!(first_row.contains(&format!("{mib:.1} MiB")), "{churned} bytes are not in {first_row}");
    assert!(!panel.contains("hold_block"), "hold_block keeps its blocks: {panel}");
}

/// `memgap report --tree`: every traced process of a run that forks and
/// execs several programs, each named by pid and command in its own
/// section, the largest gap first and in full, parents linked to children.
#[test]
fn a_tree_report_has_a_section_per_process_and_the_largest_gap_in_full() {
    let (_tmp, dir) = tempdir();
    let holder = compile(&dir, "pid_and_hold.c");
    let freer = compile(&dir, "frees_at.c");
    let forker = compile(&dir, "fork_exec.c");
    let script = format!("echo shell $$; {}; {} 100 300 & echo frees $!; wait; {}", arg(&holder), arg(&freer), arg(&forker));
    let out = memgap(&dir, &["run", "--quiet", "-o", "t.mgt", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let pid_after = |key: &str| -> u32 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {key:?} in {stdout}"))
    };
    let (shell, holder_pid, freer_pid) = (pid_after("shell "), pid_after("pid "), pid_after("frees "));
    let forker_line = stdout.lines().find(|l| l.starts_with("parent ")).expect("fork_exec's pids");
    let words: Vec<&str> = forker_line.split_whitespace().collect();
    let (forker_pid, forked_pid): (u32, u32) = (words[1].parse().unwrap(), words[3].parse().unwrap());
    let expected = [
        (shell, "sh -c echo shell"),
        (holder_pid, "pid_and_hold"),
        (freer_pid, "frees_at 100 300"),
        (forker_pid, "fork_exec"),
        (forked_pid, "fork_exec exec-child"),
    ];

    // Any trace of the run finds the others: here a child's.
    let child_trace = dir.join(format!("t.{holder_pid}.mgt"));
    let html = dir.join("tree.html");
    let out = memgap(&dir, &["report", arg(&child_trace), "--tree", "-o", arg(&html)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    let start = page.find("id=\"tree-data\">").expect("the tree's data") + "id=\"tree-data\">".len();
    let processes: serde_json::Value = serde_json::from_str(&page[start..start + page[start..].find("</script>").unwrap()]).unwrap();
    let processes = processes.as_array().unwrap();
    assert_eq!(processes.len(), expected.len(), "{processes:#?}");
    for (pid, command) in expected {
        let p = processes.iter().find(|p| p["pid"] == pid).unwrap_or_else(|| panic!("pid {pid} ({command}) is missing: {processes:#?}"));
        assert!(p["command"].as_str().unwrap().contains(command), "{p:#}");
    }
    // frees_at's 60 MiB kept by glibc after its frees is the largest gap: first, and the whole report's.
    assert_eq!(processes[0]["pid"], freer_pid, "{processes:#?}");
    assert_eq!(processes[0]["full"], true);
    assert!(processes[0]["gap_bytes"].as_u64().unwrap() > 32 << 20, "{:#}", processes[0]);
    assert_eq!(processes.iter().filter(|p| p["full"] == true).count(), 1);
    let gaps: Vec<u64> = processes.iter().map(|p| p["gap_bytes"].as_u64().unwrap()).collect();
    assert!(gaps.windows(2).all(|w| w[0] >= w[1]), "{gaps:?}");
    let parent_of = |pid: u32| processes.iter().find(|p| p["pid"] == pid).unwrap()["ppid"].as_u64().unwrap() as u32;
    assert_eq!(parent_of(holder_pid), shell);
    assert_eq!(parent_of(forked_pid), forker_pid);

    let Some(browser) = chromium() else { return };
    let dom = dump_dom(browser, &format!("file://{}", html.display()));
    assert!(dom.contains("id=\"tree\" class=\"panel\" data-ready=\"true\""), "the tree's script did not finish");
    for (pid, command) in expected {
        let section = &dom[dom.find(&format!("id=\"process-{pid}\"")).unwrap_or_else(|| panic!("no section for {pid}"))..];
        let section = &section[..section[1..].find("class=\"tree-process\"").map_or(section.len(), |end| end + 1)];
        assert!(section.contains(&format!("pid {pid} ")) && section.contains(command), "{section}");
        assert!(dom.contains(&format!("href=\"#process-{pid}\"")), "nothing links to {pid}");
    }
    // The child's section links its parent's, the parent's its child's.
    let forked = &dom[dom.find(&format!("id=\"process-{forked_pid}\"")).unwrap()..];
    assert!(forked[..forked.find("</p>").unwrap()].contains(&format!("<a href=\"#process-{forker_pid}\">{forker_pid}</a>")), "{forked}");
    let header = &dom[dom.find("id=\"command\"").unwrap()..];
    assert!(header[..header.find("</span>").unwrap()].contains("frees_at 100 300"), "the whole report is about frees_at");
}

/// The verdict's `quoted` commands are code, not backticks; the header says
/// whose peak live heap it gives and when; a one-node machine gets no NUMA
/// panel of one-cell tables.
#[test]
fn the_verdict_shows_commands_as_code_and_one_node_has_no_numa_panel() {
    let Some(browser) = chromium() else { return };
    let (_, html, page) = culprit_report();
    assert!(page.contains("`memgap blame`"), "culprit's verdict names blame in backticks");
    let dom = dump_dom(browser, &format!("file://{}", html.display()));
    let verdict = &dom[dom.find("id=\"verdict-text\"").unwrap()..];
    let verdict = &verdict[..verdict.find("</p>").unwrap()];
    assert!(verdict.contains("<code>memgap blame</code>") && !verdict.contains('`'), "{verdict}");
    let facts = &dom[dom.find("id=\"facts\"").unwrap()..];
    assert!(facts[..facts.find("</p>").unwrap()].contains("peak live heap ") && facts.contains("(malloc’s, at "), "{}", &facts[..300]);
    let nodes = std::fs::read_dir("/sys/devices/system/node")
        .map_or(1, |d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("node")).count());
    if nodes < 2 {
        assert!(dom.contains("<section id=\"numa\" class=\"panel\" hidden=\"\">"), "a NUMA panel on a one-node machine");
    }
}
