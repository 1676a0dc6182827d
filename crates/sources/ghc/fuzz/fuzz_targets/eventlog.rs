//! Any bytes into the eventlog parser and on to METRICS: no panic, no
//! allocation sized by a length field.
//!
//! cd crates/sources/ghc && cargo +nightly fuzz run eventlog -- -max_total_time=60 -rss_limit_mb=512
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(log) = memgap_source_ghc::eventlog::parse(bytes) {
        let _ = memgap_source_ghc::metrics::to_metrics(&log, |ns| ns);
    }
});
