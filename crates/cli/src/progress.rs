//! A progress bar on stderr while a trace is replayed, for analyses that
//! take a second or more, and only when stderr is a terminal.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Shown only once a replay has run this long (MEMGAP_PROGRESS_AFTER_MS
/// changes it, for tests).
fn show_after() -> Duration {
    let ms = std::env::var(memgap_trace::vocabulary::env::PROGRESS_AFTER_MS).ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    Duration::from_millis(ms)
}

struct State {
    started: Instant,
    last: u64,
    bar: Option<ProgressBar>,
}

pub fn install() {
    if !std::io::stderr().is_terminal() {
        return;
    }
    let show_after = show_after();
    let state = Mutex::new(State { started: Instant::now(), last: 0, bar: None });
    memgap_replay::on_progress(Box::new(move |done, total| {
        let Ok(mut state) = state.lock() else { return };
        if done < state.last {
            // A new replay (some commands read the trace twice).
            state.started = Instant::now();
        }
        state.last = done;
        if done >= total {
            if let Some(bar) = state.bar.take() {
                bar.finish_and_clear();
            }
            return;
        }
        if state.bar.is_none() && state.started.elapsed() >= show_after {
            let style = ProgressStyle::with_template("memgap: reading trace {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            state.bar = Some(ProgressBar::new(total).with_style(style));
        }
        if let Some(bar) = &state.bar {
            bar.set_position(done);
        }
    }));
}
