//! The recorded traces of tests/fixtures, for the tests that run every model over each.

use std::path::PathBuf;

/// Every fixture trace (`tests/fixtures/traces/*.mgt`), in name order.
pub(crate) fn traces() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/traces");
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "mgt"))
        .collect();
    traces.sort();
    traces
}

/// The fixture traces whose largest gap a replay seeing `seen` finds as it
/// runs, each with its scan: at least four, and Python's among them (a
/// runtime's figures that come in time).
pub(crate) fn gap_found_while_replaying(seen: crate::snapshots::GapsSeen) -> Vec<(PathBuf, crate::snapshots::Scan)> {
    let found: Vec<_> = traces()
        .into_iter()
        .map(|path| {
            let scan = crate::snapshots::scan(&path).unwrap();
            (path, scan)
        })
        .filter(|(_, scan)| scan.gap_found_while_replaying(crate::At::Gap, seen))
        .collect();
    assert!(found.len() >= 4, "only {} fixtures have several snapshots", found.len());
    assert!(
        found.iter().any(|(_, scan)| scan.runtime_metrics),
        "no fixture has several snapshots and a runtime's figures in time (Python's)"
    );
    found
}
