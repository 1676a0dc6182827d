//! Prints the METRICS records memgap makes of an eventlog, one per line:
//! `cargo run --release -p memgap-source-ghc --example dump_eventlog -- prog.eventlog`
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: dump_eventlog FILE.eventlog");
        std::process::exit(2);
    };
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        eprintln!("dump_eventlog: {path}: {e}");
        std::process::exit(1)
    });
    let log = memgap_source_ghc::eventlog::parse(&bytes).unwrap_or_else(|e| {
        eprintln!("dump_eventlog: {path}: {e}");
        std::process::exit(1)
    });
    println!("rts {:?}, truncated {}, event counts {:?}", log.rts_identifier(), log.truncated, log.counts);
    for m in memgap_source_ghc::metrics::to_metrics(&log, |ns| ns) {
        let values: Vec<String> = m.values.iter().map(|(n, v)| format!("{n}={v}")).collect();
        println!("{:.3} {} {}", m.monotonic_ns as f64 / 1e9, m.kind, values.join(" "));
    }
}
