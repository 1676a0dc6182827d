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
