//! `memgap exporter --listen ADDR (--pid PID…|--cgroup PATH|--all)`: the
//! outside ledger of running processes, served as Prometheus metrics on
//! `/metrics`, read afresh at every scrape; an allocator's own statistics
//! (jemalloc's mallctl, called in the process) at most once per
//! `--allocator-stats-every`, their age exported beside them.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::ArgAction;
use memgap_attach::AttachError;
use memgap_attach::cgroup::NamedCgroup;
use memgap_attach::procfs::KnownAllocatorStats;
use memgap_model::ProcessLedger;
use memgap_views::metrics::{self, Scrape};

/// Serves the outside ledger of running processes as Prometheus metrics.
///
/// What `memgap snapshot PID` shows, for each process watched, on
/// http://ADDR/metrics. Each scrape reads /proc afresh; a process that exits
/// is left out, never an error.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("processes").required(true).args(["pid", "cgroup", "all"])))]
pub struct Args {
    /// The address to listen on (port 0: a free port, printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    listen: String,
    /// The processes to watch.
    #[arg(long, value_name = "PID", num_args = 1.., action = ArgAction::Append)]
    pid: Vec<u32>,
    /// Every process in this cgroup v2 and below it (a directory under
    /// /sys/fs/cgroup, or the path /proc/PID/cgroup shows), and the cgroup's
    /// limit and headroom.
    #[arg(long, value_name = "PATH")]
    cgroup: Option<String>,
    /// Every process memgap may read.
    #[arg(long)]
    all: bool,
    /// Call into a process for its allocator's own statistics (jemalloc's
    /// mallctl, which stops one thread for the call) at most once per this
    /// many seconds; scrapes in between reuse the figures and export their
    /// age as memgap_allocator_stats_age_seconds. 0: at every scrape.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    allocator_stats_every: u64,
}

/// The allocator statistics last read of each process, by pid with the
/// process's start time (a pid reused by another process is not reused).
struct StatsCache {
    every: Duration,
    entries: Mutex<HashMap<u32, (u64, Instant, KnownAllocatorStats)>>,
}

impl StatsCache {
    /// The ledger of `pid`, its allocator's statistics reused while younger
    /// than `every`, and their age in seconds (when it has any).
    fn ledger_of(&self, pid: u32) -> Reading {
        let started = start_time(pid);
        let known = self.entries.lock().ok().and_then(|entries| {
            entries
                .get(&pid)
                .filter(|(start, at, _)| Some(*start) == started && at.elapsed() < self.every)
                .map(|(_, at, k)| (*at, k.clone()))
        });
        let (reading, read_at) = match known {
            Some((at, known)) => (memgap_attach::procfs::read_process_reusing(pid, Some(&known))?, at),
            None => {
                let reading = memgap_attach::read_process(pid)?;
                let known = KnownAllocatorStats { stats: reading.allocator_stats.clone(), error: reading.allocator_stats_error.clone() };
                let now = Instant::now();
                if let (Some(start), Ok(mut entries)) = (started, self.entries.lock()) {
                    entries.insert(pid, (start, now, known));
                }
                (reading, now)
            }
        };
        let age = reading.allocator_stats.is_some().then(|| read_at.elapsed().as_secs_f64());
        Ok((memgap_model::outside_ledger(&reading), age))
    }

    /// Forgets the processes not in `pids` (gone, or no longer selected).
    fn keep_only(&self, pids: &[u32]) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|pid, _| pids.contains(pid));
        }
    }
}

/// The start time of `pid` in clock ticks since boot (/proc/PID/stat field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command, in parentheses, may hold spaces and parentheses itself.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Which processes a scrape reads.
enum Selection {
    Pids(Vec<u32>),
    Cgroup(NamedCgroup),
    All,
}

impl Selection {
    fn processes(&self) -> Vec<u32> {
        match self {
            Selection::Pids(pids) => pids.clone(),
            Selection::Cgroup(cgroup) => cgroup.processes(),
            Selection::All => all_processes(),
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let selection = if let Some(name) = &args.cgroup {
        let cgroup = memgap_attach::cgroup::v2_named(name).map_err(|e| anyhow!(e))?;
        if cgroup.memory().is_none() {
            eprintln!(
                "memgap: cgroup {} has no memory.current (the memory controller is not enabled for it): its limit and headroom are not exported",
                cgroup.path
            );
        }
        Selection::Cgroup(cgroup)
    } else if args.all {
        Selection::All
    } else {
        for &pid in &args.pid {
            memgap_attach::procfs::status(pid)?;
        }
        Selection::Pids(args.pid.clone())
    };
    let server = tiny_http::Server::http(&args.listen).map_err(|e| anyhow!("cannot listen on {}: {e}", args.listen))?;
    let address = server.server_addr().to_ip().context("listening on a Unix socket, not an IP address")?;
    eprintln!("memgap: serving metrics on http://{address}/metrics");
    let cache = StatsCache { every: Duration::from_secs(args.allocator_stats_every), entries: Mutex::new(HashMap::new()) };
    for request in server.incoming_requests() {
        respond(request, &selection, &cache);
    }
    Ok(ExitCode::SUCCESS)
}

fn respond(request: tiny_http::Request, selection: &Selection, cache: &StatsCache) {
    use tiny_http::{Header, Method, Response};
    let path = request.url().split('?').next().unwrap_or("");
    let response = match (request.method(), path) {
        (Method::Get | Method::Head, "/metrics") => {
            let text = metrics::prometheus_text(&scrape(selection, cache));
            Response::from_string(text).with_header(Header::from_bytes("Content-Type", metrics::CONTENT_TYPE).expect("a valid header"))
        }
        (Method::Get | Method::Head, "/") => Response::from_string("memgap exporter: the metrics are at /metrics\n"),
        (Method::Get | Method::Head, _) => Response::from_string("not found: the metrics are at /metrics\n").with_status_code(404),
        _ => Response::from_string("only GET and HEAD\n").with_status_code(405),
    };
    // A scraper that hung up meanwhile is no error of ours.
    let _ = request.respond(response);
}

/// One process's ledger and the age of its allocator statistics, or why it could not be read.
type Reading = Result<(ProcessLedger, Option<f64>), AttachError>;

/// Reads every selected process once.
fn scrape(selection: &Selection, cache: &StatsCache) -> Scrape {
    let started = Instant::now();
    let mut scrape = Scrape::default();
    let pids = selection.processes();
    cache.keep_only(&pids);
    for (pid, reading) in pids.iter().zip(read_all(&pids, cache)) {
        match reading {
            // Kernel threads have no memory map of their own.
            Ok((ledger, _)) if ledger.mappings.is_empty() => {}
            Ok((ledger, _)) if scrape.processes.iter().any(|seen| seen.pid == ledger.pid) => {}
            Ok((ledger, age)) => {
                if let Some(age) = age {
                    scrape.allocator_stats_age_seconds.insert(ledger.pid, age);
                }
                scrape.processes.push(ledger)
            }
            Err(error) => *scrape.skipped.entry(skip_reason(&error, *pid)).or_default() += 1,
        }
    }
    if let Selection::Cgroup(cgroup) = selection {
        scrape.cgroup = cgroup.memory().map(memgap_model::assess_cgroup);
    }
    scrape.duration_seconds = started.elapsed().as_secs_f64();
    scrape
}

/// The ledgers of `pids`, in their order, read on every CPU: most of a
/// scrape is the kernel walking page tables for smaps and numa_maps, which
/// runs in parallel.
fn read_all(pids: &[u32], cache: &StatsCache) -> Vec<Reading> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4).min(pids.len().max(1));
    let next = AtomicUsize::new(0);
    let mut readings: Vec<(usize, Reading)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut read = Vec::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&pid) = pids.get(index) else { break read };
                        read.push((index, cache.ledger_of(pid)));
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    readings.sort_unstable_by_key(|(index, _)| *index);
    readings.into_iter().map(|(_, reading)| reading).collect()
}

/// Why `pid` could not be read: it exited (also while it was being read),
/// the kernel refused, or something else went wrong.
fn skip_reason(error: &AttachError, pid: u32) -> &'static str {
    match error {
        AttachError::NoProcess(_) | AttachError::Zombie(_) => "vanished",
        AttachError::NotPermitted { .. } => "not_permitted",
        _ if memgap_attach::procfs::status(pid).is_err() => "vanished",
        _ if memgap_attach::procfs::status(pid).is_ok_and(|s| s.state == 'Z') => "vanished",
        _ => "unreadable",
    }
}

/// The processes in /proc (not their threads).
fn all_processes() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(Path::new("/proc")) else { return Vec::new() };
    let mut pids: Vec<u32> = entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    pids.sort_unstable();
    pids
}
