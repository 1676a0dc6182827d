pub mod attach;
pub mod blame;
pub mod compare;
pub mod export;
pub mod exporter;
pub mod ghc;
pub mod ledger;
pub mod man;
pub mod map;
pub mod numa;
pub mod report;
pub mod run;
pub mod snap;
pub mod snapshot;
pub mod stop;
pub mod summary;
pub mod timeline;
pub mod trim;
pub mod watch;

/// The text answering `query` about `trace` (every argument that shapes it
/// written into `query`): from the trace's index when the same question was
/// answered before from the same files, else computed and saved there.
pub fn indexed(trace: &std::path::Path, query: &str, compute: impl FnOnce() -> anyhow::Result<String>) -> anyhow::Result<String> {
    let bytes = memgap_replay::index::answer(trace, query, || compute().map(String::into_bytes))?;
    Ok(String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// [`indexed`], for a question the trace's facts (kept in its index by
/// `memgap report`) can answer: `from_facts` answers from them, or says
/// `None` when they lack what it needs. An answer from the facts is not
/// saved again: it costs no replay.
pub fn indexed_or_from_facts(
    trace: &std::path::Path,
    query: &str,
    from_facts: impl FnOnce(&memgap_model::facts::Facts) -> Option<anyhow::Result<String>>,
    compute: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    if let Some(bytes) = memgap_replay::index::saved(trace, query) {
        return Ok(String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()));
    }
    let facts = memgap_replay::index::saved(trace, memgap_model::facts::QUERY).and_then(memgap_model::facts::Facts::decode);
    if let Some(answer) = facts.as_ref().and_then(from_facts) {
        return answer;
    }
    indexed(trace, query, compute)
}

/// `--at`, the same for every command that looks at one moment of a trace.
#[derive(clap::Args, Clone, Copy)]
pub struct AtArg {
    /// Which snapshot: gap (the largest gap between RSS and the live heap),
    /// peak (the highest RSS), end (the last), or seconds since start (the
    /// nearest snapshot; past the trace's end is refused).
    #[arg(long, value_name = "gap|peak|end|SECONDS", default_value_t = memgap_model::At::default())]
    pub at: memgap_model::At,
}
