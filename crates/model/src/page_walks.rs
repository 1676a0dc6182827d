//! Which pages of a snapshot's mappings the ledger classifies one by one,
//! and which it counts run by run or whole: the bounds that keep a corrupt
//! or hostile snapshot from making the ledger (or glibc's trim forecast)
//! allocate per page a mapping claims.

use memgap_trace::records::{Mapping, Residency, Snapshot};

/// Most pages of one mapping the ledger classifies one by one (256 GiB of
/// 4 KiB pages); a larger one is counted whole, by its smaps Rss, so that a
/// corrupt or hostile snapshot cannot make the ledger allocate per claimed page.
pub(crate) const MAX_PAGES_PER_MAPPING: u64 = 1 << 26;

/// The snapshot's page size when it is one a kernel uses; 4 KiB otherwise
/// (a corrupt trace).
pub(crate) fn plausible_page_size(page_size: u64) -> u64 {
    if page_size.is_power_of_two() && (4096..=1 << 30).contains(&page_size) { page_size } else { 4096 }
}

/// Whether `mapping` can be classified page by page: page-aligned, not
/// empty, and not larger than [`MAX_PAGES_PER_MAPPING`].
pub(crate) fn countable_by_page(mapping: &Mapping, page: u64) -> bool {
    mapping.end > mapping.start
        && mapping.start.is_multiple_of(page)
        && mapping.end.is_multiple_of(page)
        && (mapping.end - mapping.start) / page <= MAX_PAGES_PER_MAPPING
}

/// Pages of one snapshot classified one by one (shown in its page maps)
/// although its residency does not list them one by one: claimed resident
/// as a whole ([`Residency::All`], which a recorder writes for a mapping it
/// found fully resident: 16 GiB of 4 KiB pages).
pub(crate) const CLAIMED_PAGES_PER_SNAPSHOT: u64 = 1 << 22;
/// The same for pages not resident and not listed ([`Residency::None`], or
/// past a bitmap shorter than its mapping).
pub(crate) const UNLISTED_PAGES_PER_SNAPSHOT: u64 = 1 << 20;

/// How many pages of each private anonymous mapping of a snapshot are
/// classified one by one: those its bitmaps list, and for page maps
/// (`show_pages`) some more; the others are counted run by run, to the same
/// rows. `None` for mappings counted whole. So a ledger's work is bounded by
/// the residency and the blocks a trace holds, whatever sizes its mappings
/// claim; a recorder's bitmaps cover their mappings, so real snapshots show
/// every page of them.
pub(crate) struct PageWalks {
    /// By mapping index.
    pub(crate) pages: Vec<Option<u64>>,
    /// The starts of the mappings classified page by page.
    pub(crate) by_page: rustc_hash::FxHashSet<u64>,
}

impl PageWalks {
    pub(crate) fn of(snapshot: &Snapshot, page: u64, show_pages: bool) -> PageWalks {
        let (mut claimed_left, mut unlisted_left) =
            if show_pages { (CLAIMED_PAGES_PER_SNAPSHOT, UNLISTED_PAGES_PER_SNAPSHOT) } else { (0, 0) };
        let pages = snapshot
            .mappings
            .iter()
            .map(|m| {
                if !m.is_private_writable_anonymous() || !countable_by_page(m, page) {
                    return None;
                }
                let count = (m.end - m.start) / page;
                let listed = match &m.residency {
                    Residency::All => {
                        let shown = count.min(claimed_left);
                        claimed_left -= shown;
                        return Some(shown);
                    }
                    Residency::Bitmap(bits) => count.min(bits.len() as u64 * 8),
                    Residency::None | Residency::Unknown => 0,
                };
                let unlisted = (count - listed).min(unlisted_left);
                unlisted_left -= unlisted;
                Some(listed + unlisted)
            })
            .collect::<Vec<_>>();
        let by_page = snapshot.mappings.iter().zip(&pages).filter(|(_, pages)| pages.is_some()).map(|(m, _)| m.start).collect();
        PageWalks { pages, by_page }
    }

    /// Whether the snapshot's mapping starting at `start` is classified page by page.
    pub(crate) fn by_page(&self, start: u64) -> bool {
        self.by_page.contains(&start)
    }
}
