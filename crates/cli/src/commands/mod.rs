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
    saved_or_computed(memgap_replay::index::Opened::read(trace), query, compute)
}

fn saved_or_computed(
    index: memgap_replay::index::Opened,
    query: &str,
    compute: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    index.answer_keeping(query, || Ok((compute()?.into_bytes(), Vec::new()))).map(text)
}

/// [`indexed`], for a question the trace's facts can answer (see
/// [`memgap_model::facts`]): `from_facts` answers from them, or says `None`
/// when they lack what it needs. Facts already in the index answer without
/// a replay (and the answer is not saved again: it costs none); facts that
/// lack it leave the question to its own replay. Without facts, a question
/// they can answer (`facts_can_answer`) is the trace's first analysis: its
/// replay is the report's, which learns the facts, about the moment `at`
/// (so its page map and call stacks are among them), and they are kept in
/// the index for the next question. The answer is the same whichever way
/// it came.
pub fn indexed_or_from_facts(
    trace: &std::path::Path,
    query: &str,
    at: memgap_model::At,
    facts_can_answer: bool,
    from_facts: impl Fn(&memgap_model::facts::Facts) -> Option<anyhow::Result<String>>,
    compute: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    use memgap_model::facts::{Facts, QUERY};
    let index = memgap_replay::index::Opened::read(trace);
    if !index.in_use() || !facts_can_answer {
        return saved_or_computed(index, query, compute);
    }
    if let Some(bytes) = index.saved(query) {
        return Ok(text(bytes));
    }
    if let Some(facts) = index.saved(QUERY).and_then(Facts::decode) {
        return from_facts(&facts).unwrap_or_else(|| saved_or_computed(index, query, compute));
    }
    let bytes = index.answer_keeping(query, || {
        // A trace the report cannot replay is left to the question's own
        // replay, which says why in its own words.
        match memgap_model::report::report_and_facts(trace, at, false, true) {
            Ok(Some((report, Some(facts)))) => {
                let answer = match from_facts(&facts) {
                    Some(answer) => answer?,
                    None => compute()?,
                };
                Ok::<_, anyhow::Error>((answer.into_bytes(), learned(trace, &report, facts)))
            }
            _ => Ok((compute()?.into_bytes(), Vec::new())),
        }
    })?;
    Ok(text(bytes))
}

/// An answer's bytes as text (the index keeps bytes).
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// What a report's replay of `trace` learned, for its index: the facts
/// and the summary's answers.
pub fn learned(
    trace: &std::path::Path,
    report: &memgap_model::report::Report,
    facts: memgap_model::facts::Facts,
) -> Vec<(String, Vec<u8>)> {
    let mut answers = summary::answers(trace, &report.summary);
    answers.push((memgap_model::facts::QUERY.to_string(), facts.into_bytes()));
    answers
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
