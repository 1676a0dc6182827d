//! GHC Haskell programs: `memgap ghc EVENTLOG [--rss FILE] [--json]`, and
//! what `memgap run` does for a GHC binary ([`Recording`]): turn the
//! eventlog on through GHCRTS when the RTS takes it, and afterwards append
//! the decoded eventlog to the trace as METRICS records (source `ghc`).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};
use memgap_model::ghc::{GhcInput, report};
use memgap_source_ghc::{detect, eventlog, metrics, rts_text};
use memgap_trace::files::{self, PrivateDir};
use memgap_trace::records::{Metrics, Record, Records};
use memgap_trace::vocabulary::kind;

use super::run::RunTraces;
use crate::output;

/// The GHC ledger of an existing eventlog (`+RTS -l`): live data, blocks
/// not live, free blocks in megablocks, non-heap memory, GCs per
/// capability, and whether pinned blocks fragment the heap.
#[derive(clap::Args)]
pub struct Args {
    /// The eventlog a GHC program wrote with `+RTS -l` (a cut one is read up
    /// to its last complete event).
    eventlog: PathBuf,
    /// RSS samples of the same run: one line per sample, `SECONDS BYTES
    /// [LAZYFREE_BYTES]`, seconds since the program started (`#` starts a
    /// comment), e.g. from a loop reading VmRSS in /proc/PID/status.
    #[arg(long, value_name = "RSS-SAMPLES")]
    rss: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.eventlog.display().to_string();
    let bytes = read_eventlog(&args.eventlog).with_context(|| name.clone())?;
    let log = eventlog::parse(&bytes).with_context(|| name.clone())?;
    if log.truncated {
        eprintln!(
            "memgap: {name} is cut short after {} bytes (the program is running or was killed); reading the events before the cut",
            log.complete_bytes
        );
    }
    let mut input = GhcInput { metrics: metrics::to_metrics(&log, |ns| ns), ..GhcInput::default() };
    if let Some(path) = &args.rss {
        (input.rss, input.lazy_free) = read_rss_samples(path)?;
    }
    let Some(report) = report(&input) else {
        bail!(
            "{name}: the eventlog has no garbage collection with a heap size (run the program with +RTS -l, whose default event classes include the heap ones)"
        );
    };
    if args.json {
        output::print(&(memgap_views::json::to_string(&memgap_views::ghc::report_json(&report)) + "\n"))?;
    } else {
        output::print(&memgap_views::ghc::report(&report, &name))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// (nanoseconds, bytes) in time order.
type Series = Vec<(u64, u64)>;

/// `SECONDS BYTES [LAZYFREE_BYTES]` lines → (ns, VmRSS) and (ns, LazyFree).
fn read_rss_samples(path: &Path) -> anyhow::Result<(Series, Series)> {
    let mut text = String::new();
    files::open_regular(path).and_then(|mut file| file.read_to_string(&mut text)).with_context(|| path.display().to_string())?;
    let mut rss = Vec::new();
    let mut lazy = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let seconds = fields.first().and_then(|s| s.parse::<f64>().ok()).filter(|s| s.is_finite() && *s >= 0.0);
        let bytes = fields.get(1).and_then(|b| b.parse::<u64>().ok());
        let lazy_free = fields.get(2).map(|b| b.parse::<u64>().ok());
        match (seconds, bytes, lazy_free, fields.len()) {
            (Some(s), Some(b), None, 2) => rss.push(((s * 1e9) as u64, b)),
            (Some(s), Some(b), Some(Some(l)), 3) => {
                rss.push(((s * 1e9) as u64, b));
                lazy.push(((s * 1e9) as u64, l));
            }
            _ => bail!("{}:{}: expected `SECONDS BYTES [LAZYFREE_BYTES]`, found `{line}`", path.display(), number + 1),
        }
    }
    rss.sort_by_key(|&(t, _)| t);
    lazy.sort_by_key(|&(t, _)| t);
    Ok((rss, lazy))
}

/// The GHC side of one `memgap run`.
pub struct Recording {
    /// Where the RTS writes the eventlog: a name in a private directory of
    /// memgap's, which nobody else can plant anything in.
    eventlog: PathBuf,
    private: PrivateDir,
    /// The user asked the RTS for `-s`/`-S`/`-Dg` on stderr: memgap copies
    /// the program's stderr through unchanged and reads the figures.
    capture_stderr: bool,
    /// `-D…` in the RTS options: a debug RTS then traces to stderr, not to the eventlog.
    debug_tracing: bool,
    stderr_copy: Option<JoinHandle<Vec<u8>>>,
}

/// At most this much of the program's stderr is kept for reading the RTS
/// figures: its end, where the `-s` summary is.
const STDERR_TAIL: usize = 1 << 20;

impl Recording {
    /// For a GHC program whose RTS accepts `-l`: adds `-l -ol<path>` before
    /// the user's own GHCRTS (the user's options come later and win).
    /// Otherwise says, once, how to build it. None for other programs.
    pub fn prepare(command: &mut Command, argv: &[OsString], pattern: &Path, quiet: bool) -> Option<Recording> {
        let program = detect::resolve_command(Path::new(&argv[0]))?;
        if !detect::is_ghc_binary(&program) {
            return None;
        }
        if let detect::RtsSupport::Refused { reason } = detect::probe(&program, Duration::from_secs(10)) {
            if !quiet {
                eprintln!(
                    "memgap: {} is a GHC program whose RTS does not take -l ({reason}); for the GHC ledger rebuild it with `ghc -rtsopts -eventlog`",
                    argv[0].to_string_lossy()
                );
            }
            return None;
        }
        // The RTS splits GHCRTS at whitespace and knows no quoting: the
        // directory's path has none.
        let private = match PrivateDir::in_temp_without_spaces("memgap-ghc-") {
            Ok(private) => private,
            Err(error) => {
                if !quiet {
                    eprintln!("memgap: no GHC eventlog: cannot make a private directory for it: {error}");
                }
                return None;
            }
        };
        let _ = pattern;
        let eventlog = private.path().join("ghc.eventlog");
        let user = std::env::var("GHCRTS").unwrap_or_default();
        command.env("GHCRTS", format!("-l -ol{} {user}", eventlog.display()).trim_end());
        let args: Vec<String> = argv[1..].iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let mut options = rts_text::rts_options_in_args(&args);
        options.extend(user.split_whitespace().map(str::to_string));
        let capture_stderr = rts_text::asks_for_stderr_stats(&options);
        if capture_stderr {
            command.stderr(Stdio::piped());
        }
        let debug_tracing = options.iter().any(|o| o.starts_with("-D"));
        Some(Recording { eventlog, private, capture_stderr, debug_tracing, stderr_copy: None })
    }

    /// After spawning: copies the program's stderr to ours byte for byte,
    /// keeping its tail.
    pub fn started(&mut self, child: &mut Child) {
        if !self.capture_stderr {
            return;
        }
        let Some(mut from) = child.stderr.take() else { return };
        self.stderr_copy = Some(std::thread::spawn(move || {
            let mut tail = Vec::new();
            let mut buffer = [0u8; 8192];
            let mut to = std::io::stderr();
            loop {
                match from.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(n) => {
                        let _ = to.write_all(&buffer[..n]);
                        tail.extend_from_slice(&buffer[..n]);
                        if tail.len() > 2 * STDERR_TAIL {
                            tail.drain(..tail.len() - STDERR_TAIL);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            tail
        }));
    }

    /// After the program ended: appends the eventlog's figures to the trace
    /// and keeps the eventlog beside it as `<trace stem>.eventlog` (a new
    /// private file; the RTS's own goes with memgap's private directory).
    pub fn finish(mut self, traces: &RunTraces, quiet: bool) {
        let trace = &traces.path(traces.top_pid);
        let stderr_tail = self.stderr_copy.take().and_then(|h| h.join().ok()).unwrap_or_default();
        let say = |text: String| {
            if !quiet {
                eprintln!("memgap: {text}");
            }
        };
        if traces.open(traces.top_pid).is_none() {
            return;
        }
        let Some((start_monotonic, start_realtime)) = process_start(trace) else {
            return say(format!("{}: no PROCESS record to align the eventlog with", trace.display()));
        };
        let mut records = Vec::new();
        let mut end_ns = start_monotonic;
        match read_eventlog(&self.eventlog).map_err(|e| e.to_string()).and_then(|bytes| eventlog::parse(&bytes).map_err(|e| e.to_string()))
        {
            Ok(log) => {
                if log.truncated {
                    say(format!(
                        "the GHC eventlog is cut short after {} bytes (the program was killed?); using the events before the cut",
                        log.complete_bytes
                    ));
                }
                let zero = metrics::rts_start_monotonic(&log, start_monotonic, start_realtime);
                records = metrics::to_metrics(&log, |ns| zero.saturating_add(ns));
                end_ns = records.iter().map(|m| m.monotonic_ns).max().unwrap_or(zero);
            }
            // A debug RTS given -D flags traces to stderr instead of the eventlog.
            Err(error) if self.debug_tracing => {
                say(format!("no GHC eventlog ({error}): the RTS's -D flags send its trace to stderr instead; reading only what it printed"))
            }
            Err(error) => say(format!("no GHC eventlog at {} ({error}): did GHCRTS or +RTS set -ol elsewhere?", self.eventlog.display())),
        }
        let text = String::from_utf8_lossy(&stderr_tail);
        for (kind, values) in [(kind::RTS_SUMMARY, rts_text::parse_summary(&text)), (kind::INVENTORY, rts_text::parse_inventory(&text))] {
            if let Some(values) = values {
                records.push(Metrics { monotonic_ns: end_ns, source: metrics::SOURCE.into(), kind: kind.into(), values });
            }
        }
        if records.is_empty() {
            return;
        }
        if let Err(error) = append(traces, &records) {
            return say(format!("cannot add the GHC eventlog to {}: {error}", trace.display()));
        }
        let kept = trace.with_extension("eventlog");
        if let Ok(mut from) = files::open_regular(&self.eventlog) {
            match files::write_replacing(&kept, |to| std::io::copy(&mut from, to).map(|_| ())) {
                Ok(()) => say(format!(
                    "GHC eventlog: {} ({} GCs added to the trace)",
                    kept.display(),
                    records.iter().filter(|m| m.kind == "gc").count()
                )),
                Err(error) => say(format!(
                    "GHC eventlog not kept ({} GCs added to the trace): {error}",
                    records.iter().filter(|m| m.kind == "gc").count()
                )),
            }
        }
        drop(self.private);
        if let Some(report) = of_trace(trace).filter(|_| !quiet) {
            eprint!("{}", memgap_views::ghc::brief(&report));
        }
    }
}

/// (start_monotonic_ns, start_realtime_ns) of the trace's first image.
fn process_start(trace: &Path) -> Option<(u64, u64)> {
    let file = memgap_trace::TraceFile::open(trace).ok()?;
    let mut found = None;
    let _ = file.for_each_chunk(|_, chunk| {
        if found.is_none() {
            found = Records::new(chunk).flatten().find_map(|r| match r {
                Record::Process(p) => Some((p.start_monotonic_ns, p.start_realtime_ns)),
                _ => None,
            });
        }
        Ok(())
    });
    found
}

/// Appends records to the top trace.
fn append(traces: &RunTraces, records: &[Metrics]) -> Result<(), String> {
    match traces.append(traces.top_pid, records.iter().cloned().map(Record::Metrics))? {
        true => Ok(()),
        false => Err("not a trace this run wrote".into()),
    }
}

/// An eventlog's bytes: a regular file only (a FIFO or a device would
/// block or never end), its magic bytes checked before the rest is read.
fn read_eventlog(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = files::open_regular(path)?;
    let mut magic = [0u8; 4];
    let got = std::io::Read::read(&mut file, &mut magic)?;
    if &magic[..got] != b"hdrb" {
        let reason = eventlog::parse(&magic[..got]).err().map_or_else(|| "not a GHC eventlog".to_string(), |e| e.to_string());
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, reason));
    }
    let mut bytes = magic.to_vec();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The GHC report of a trace, for the ledger and report views; None when
/// the trace has no GHC records or cannot be read.
pub fn of_trace(trace: &Path) -> Option<memgap_model::ghc::GhcReport> {
    memgap_model::ghc::report_of_trace(trace).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_samples_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rss.txt");
        std::fs::write(&path, "# seconds bytes\n0.5 1000\n\n0.25 2000 500 # with LazyFree\n").unwrap();
        let (rss, lazy) = read_rss_samples(&path).unwrap();
        assert_eq!(rss, vec![(250_000_000, 2000), (500_000_000, 1000)]);
        assert_eq!(lazy, vec![(250_000_000, 500)]);
        std::fs::write(&path, "0.5 lots\n").unwrap();
        let error = read_rss_samples(&path).unwrap_err().to_string();
        assert!(error.ends_with("rss.txt:1: expected `SECONDS BYTES [LAZYFREE_BYTES]`, found `0.5 lots`"), "{error}");
    }
}
