//! The facts of a trace: what the report's replay learned that later
//! questions are answered from without replaying it again. The first
//! analysis of a trace runs that replay (whatever the question) and the
//! index beside the trace keeps them (`memgap_replay::index`); with them,
//! `ledger` and `map` at any snapshot whose ledger (and page map) was
//! computed, `blame` there, and `timeline` read only the index.
//!
//! - the moments: every snapshot's time and VmRSS, the trace's end, and the
//!   gap at each snapshot, so that `--at` names the same snapshot as a replay;
//! - the ledger at every snapshot, with its page maps and what each call
//!   stack takes where the report computed them (the moment asked about,
//!   the largest gap, the peak, the end and the evenly spaced ones);
//! - blame's whole-run facts ([`StackFacts`]);
//! - the timeline's series, its malloc_trim calls and the GHC report.
//!
//! Kept as parts, each read only when asked for: a question about one
//! snapshot decodes that snapshot's ledger alone.

use serde::{Deserialize, Serialize};

use crate::blame::StackFacts;
use crate::ghc::GhcReport;
use crate::ledger::stored::{self, Kept};
use crate::ledger::{Ledger, Moment};
use crate::series::SeriesPoint;
use crate::snapshots::{At, MomentError, Scan, Timeline, gap_bytes};
use crate::trim_marks::TrimMark;

/// The index's name for the facts.
pub const QUERY: &str = "facts";

/// The facts' own layout; bytes of another are not read.
const MAGIC: &[u8; 8] = b"MGFACTS2";
/// Parts besides the ledgers: moments, stacks, timeline.
const FIXED_PARTS: usize = 3;

#[derive(Serialize, Deserialize)]
struct Moments {
    scan: Scan,
    /// The gap at each snapshot, as the largest gap is chosen by.
    gaps: Vec<u64>,
}

/// What `memgap timeline` shows besides the ledgers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimelineFacts {
    pub live_bytes: Vec<SeriesPoint>,
    pub vm_rss: Vec<SeriesPoint>,
    /// The program's malloc_trim calls that released most, at most [`crate::trim_marks::TIMELINE_MARKS`].
    pub trims: Vec<TrimMark>,
    pub trim_calls: u64,
    pub ghc: Option<GhcReport>,
}

/// The facts, from the report's replay. `gaps` is the gap of each
/// snapshot when the live heap is malloc's, else empty (the ledgers' then);
/// `computed` says, per ledger, whether its page maps and its call stacks
/// were computed.
pub(crate) fn encode(
    scan: &Scan,
    gaps: &[u64],
    ledgers: &[Ledger],
    computed: &[(bool, bool)],
    stacks: &StackFacts,
    timeline: &TimelineFacts,
) -> Facts {
    let gaps = if scan.runtime_metrics { ledgers.iter().map(gap_bytes).collect() } else { gaps.to_vec() };
    let moments = Moments { scan: scan.clone(), gaps };
    let mut parts = vec![
        serde_json::to_vec(&moments).expect("model structs always serialize"),
        serde_json::to_vec(stacks).expect("model structs always serialize"),
        serde_json::to_vec(timeline).expect("model structs always serialize"),
    ];
    parts.extend(ledgers.iter().zip(computed).map(|(ledger, &(pages, stacks))| stored::encode(ledger, pages, stacks)));
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    let mut ranges = Vec::with_capacity(parts.len());
    for part in &parts {
        bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
        ranges.push(bytes.len()..bytes.len() + part.len());
        bytes.extend_from_slice(part);
    }
    Facts { bytes, parts: ranges, moments }
}

/// Facts read back: each part decoded when asked for.
pub struct Facts {
    bytes: Vec<u8>,
    /// Where each part lies in `bytes`.
    parts: Vec<std::ops::Range<usize>>,
    moments: Moments,
}

impl Facts {
    /// The facts the report's replay wrote; `None` for any other bytes.
    pub fn decode(bytes: Vec<u8>) -> Option<Facts> {
        let rest = bytes.strip_prefix(MAGIC)?;
        let count = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let mut at = MAGIC.len() + 8;
        // Each part takes at least its length's 8 bytes.
        if count < FIXED_PARTS as u64 || count > (bytes.len() / 8) as u64 {
            return None;
        }
        let mut parts = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let len = u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
            let start = at + 8;
            let end = start.checked_add(usize::try_from(len).ok()?).filter(|&end| end <= bytes.len())?;
            parts.push(start..end);
            at = end;
        }
        if at != bytes.len() {
            return None;
        }
        let moments: Moments = serde_json::from_slice(&bytes[parts[0].clone()]).ok()?;
        if moments.scan.snapshots.len() != parts.len() - FIXED_PARTS {
            return None;
        }
        Some(Facts { bytes, parts, moments })
    }

    /// The bytes [`decode`](Self::decode) reads back, for the index.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The snapshot `at` names, as a replay would choose it.
    pub fn moment(&self, at: At) -> Result<Option<Moment>, MomentError> {
        self.moments.scan.check(at)?;
        let gaps: &[u64] = if at == At::Gap { &self.moments.gaps } else { &[] };
        Ok(self.moments.scan.moment(at, gaps))
    }

    /// The ledger at snapshot `index`, with what was computed of it.
    pub fn ledger(&self, index: usize) -> Option<Kept> {
        let part = self.parts.get(FIXED_PARTS + index)?;
        stored::decode(&self.bytes[part.clone()])
    }

    /// The ledger at the snapshot `at` names, its moment set; `Ok(None)`
    /// when the trace has no snapshot or the facts lack that ledger.
    pub fn ledger_at(&self, at: At) -> Result<Option<Kept>, MomentError> {
        let Some(moment) = self.moment(at)? else { return Ok(None) };
        Ok(self.ledger(moment.index).map(|mut kept| {
            kept.ledger.moment = Some(moment);
            kept
        }))
    }

    pub fn stacks(&self) -> Option<StackFacts> {
        serde_json::from_slice(&self.bytes[self.parts[1].clone()]).ok()
    }

    /// The timeline (the ledger at every snapshot and the series) and the rest of what it shows.
    pub fn timeline(&self) -> Option<(Timeline, TimelineFacts)> {
        let facts: TimelineFacts = serde_json::from_slice(&self.bytes[self.parts[2].clone()]).ok()?;
        let snapshots = (0..self.parts.len() - FIXED_PARTS)
            .map(|index| self.ledger(index).map(|kept| Ledger { page_maps: Vec::new(), by_stack: Vec::new(), ..kept.ledger }))
            .collect::<Option<Vec<Ledger>>>()?;
        let timeline = Timeline { snapshots, live_bytes: facts.live_bytes.clone(), vm_rss: facts.vm_rss.clone() };
        Some((timeline, facts))
    }
}
