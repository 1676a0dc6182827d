//! Machine-readable output. The key names are a contract: scripts rely on them.

use serde::Serialize;

pub fn to_string<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("model structs always serialize")
}

/// A ledger as JSON: its fields and its verdict (written by the views,
/// not kept in the model).
#[derive(Serialize)]
pub struct LedgerJson<'a> {
    #[serde(flatten)]
    ledger: &'a memgap_model::Ledger,
    verdict: String,
}

impl<'a> LedgerJson<'a> {
    pub fn new(ledger: &'a memgap_model::Ledger) -> LedgerJson<'a> {
        LedgerJson { ledger, verdict: crate::verdict::of(ledger) }
    }
}

pub fn ledger(ledger: &memgap_model::Ledger) -> String {
    to_string(&LedgerJson::new(ledger))
}

/// `memgap timeline --json`: every snapshot's ledger with its verdict, and
/// the series.
pub fn timeline(timeline: &memgap_model::Timeline) -> String {
    #[derive(Serialize)]
    struct TimelineJson<'a> {
        snapshots: Vec<LedgerJson<'a>>,
        live_bytes: &'a [memgap_model::SeriesPoint],
        vm_rss: &'a [memgap_model::SeriesPoint],
    }
    to_string(&TimelineJson {
        snapshots: timeline.snapshots.iter().map(LedgerJson::new).collect(),
        live_bytes: &timeline.live_bytes,
        vm_rss: &timeline.vm_rss,
    })
}

/// `memgap snapshot PID --json`: the process's ledger with its verdict.
pub fn process_ledger(ledger: &memgap_model::ProcessLedger) -> String {
    #[derive(Serialize)]
    struct WithVerdict<'a> {
        #[serde(flatten)]
        ledger: &'a memgap_model::ProcessLedger,
        verdict: String,
    }
    to_string(&WithVerdict { ledger, verdict: crate::outside::verdict(ledger) })
}
