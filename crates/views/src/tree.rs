//! The report of a process tree: every traced process of one run in one
//! page. The process with the largest gap between RSS and its live heap gets
//! the whole report; every process, that one included, gets a short section
//! (command, pid, parent, peak RSS, gap, its ledger as one bar, its verdict),
//! linked to its parent's and children's sections.

use memgap_model::Closing;
use memgap_model::ledger::Rows;
use memgap_model::report::Report;
use serde::Serialize;

const PANEL: &str = include_str!("report/tree.html");
const SCRIPT: &str = include_str!("report/tree.js");

/// One traced process of the run, as its section shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TreeProcess {
    pub pid: u32,
    pub ppid: u32,
    /// The last program image's command line.
    pub command: String,
    /// The trace's file name.
    pub trace: String,
    pub peak_rss_bytes: u64,
    pub peak_live_bytes: u64,
    pub duration_seconds: f64,
    pub exit_code: Option<i32>,
    /// RSS (memgap's own memory left out) above the live heap, at `seconds`.
    pub gap_bytes: u64,
    /// The moment of the largest gap; None when the trace has no snapshot.
    pub seconds: Option<f64>,
    pub rss_bytes: Option<u64>,
    pub memgap_bytes: Option<u64>,
    pub rows: Option<Rows>,
    pub verdict: Option<String>,
    /// The page's whole report is about this process.
    pub full: bool,
}

impl TreeProcess {
    pub fn new(trace: &str, closing: &Closing, full: bool) -> TreeProcess {
        let s = &closing.summary;
        let moment = closing.moment.as_ref();
        TreeProcess {
            pid: s.pid,
            ppid: s.ppid,
            command: if s.argv.is_empty() { s.command.clone() } else { s.argv.join(" ") },
            trace: trace.to_string(),
            peak_rss_bytes: s.peak_rss_bytes,
            peak_live_bytes: s.peak_live_bytes,
            duration_seconds: s.duration_seconds,
            exit_code: s.exit_code,
            gap_bytes: moment.map_or(0, memgap_model::gap_bytes),
            seconds: moment.map(|l| l.at_seconds),
            rss_bytes: moment.map(|l| l.rss_bytes),
            memgap_bytes: moment.map(|l| l.memgap_bytes),
            rows: moment.map(|l| l.rows),
            verdict: moment.map(crate::verdict::of),
            full,
        }
    }
}

/// The whole report of `report` (the process the page is about), with a
/// section per process of the tree above it. `processes` in the order shown.
pub fn report(report: &Report, trace_name: &str, processes: &[TreeProcess]) -> String {
    let page = crate::html::report(report, trace_name);
    let data = format!(
        "<script type=\"application/json\" id=\"tree-data\">{}</script>\n<script>{SCRIPT}</script>\n",
        crate::html::script_safe_json(&processes)
    );
    // The template's own <main> comes before any data; the data goes in
    // before the last </body>, after the report's script.
    let page = page.replacen("<main>\n", &format!("<main>\n{PANEL}"), 1);
    let end = page.rfind("</body>").expect("the template ends its body");
    format!("{}{data}{}", &page[..end], &page[end..])
}
