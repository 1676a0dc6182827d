//! `memgap attach --go http://127.0.0.1:PORT [--duration S] [-o TRACE]`:
//! records a running Go service from outside into an ordinary trace. Every
//! interval it reads runtime.MemStats over HTTP (net/http/pprof's
//! `/debug/pprof/heap?debug=1`, or expvar's `/debug/vars`) and, when the
//! service runs on this machine, its VmRSS and page residency; every view
//! (ledger, timeline, report) then works on the trace.

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use memgap_attach::residency::{self, monotonic_ns};
use memgap_source_go::memstats::{self, MemStats};
use memgap_trace::TraceWriter;
use memgap_trace::records::{CLOCK_MONOTONIC_NS, Clock, End, EndReason, Metrics, Process, Record, SnapshotReason};

/// Record a running service from outside, polling what it exposes.
#[derive(clap::Args)]
pub struct Args {
    /// A Go service's HTTP address (http://HOST:PORT) serving net/http/pprof
    /// or expvar.
    #[arg(long, value_name = "URL")]
    go: String,
    /// The service's pid [default: the process listening on the URL's port, if local].
    #[arg(long)]
    pid: Option<u32>,
    /// Seconds to record [default: until interrupted].
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Milliseconds between polls.
    #[arg(long, value_name = "MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    interval: u64,
    /// Trace file [default: memgap-attach.<pid or port>.mgt].
    #[arg(short, long, value_name = "TRACE")]
    output: Option<PathBuf>,
    /// No closing summary on stderr (errors are still printed).
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let url = Url::parse(&args.go)?;
    let pid = match args.pid {
        Some(pid) => Some(pid),
        None if url.is_local() => listening_pid(url.port),
        None => None,
    };
    if let Some(duration) = args.duration.filter(|d| !(d.is_finite() && *d > 0.0)) {
        bail!("--duration {duration}: give a positive number of seconds");
    }
    let http = Http::new(&url);
    // The first read says which endpoint the service has.
    let endpoint = Endpoint::find(&http)?;
    let output = args.output.clone().unwrap_or_else(|| {
        PathBuf::from(format!("memgap-attach.{}.mgt", pid.map(|p| p.to_string()).unwrap_or_else(|| url.port.to_string())))
    });
    let mut writer =
        TraceWriter::create(&output, super::run::random_run_id()).with_context(|| format!("cannot write {}", output.display()))?;
    let start = monotonic_ns();
    let (exe, argv) = pid.map(describe).unwrap_or_else(|| (args.go.clone(), vec![args.go.clone()]));
    let mut first: Vec<Record> = vec![Record::Process(Process {
        pid: pid.unwrap_or(0),
        ppid: 0,
        clock: CLOCK_MONOTONIC_NS,
        start_time: start,
        start_monotonic_ns: start,
        start_realtime_ns: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
        // SAFETY: no precondition.
        page_size: unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64,
        cpu_count: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
        exe: exe.clone(),
        argv,
        ..Process::default()
    })];
    let note = |text: String| Record::Note { time: monotonic_ns(), text };
    first.push(note(format!("attached to {} ({})", args.go, endpoint.path())));
    match pid {
        Some(pid) => {
            if let Some(go) = memgap_source_go::buildinfo::detect(format!("/proc/{pid}/exe").as_ref()) {
                first.extend(memgap_source_go::version_metrics(&go.version, monotonic_ns()).into_iter().map(Record::Metrics));
            }
        }
        None => first.push(note("the service's pid is not known (not local, or not ours to read): no RSS or page residency".into())),
    }
    writer.write(&first)?;
    super::stop::install_handler();

    let deadline = args.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
    let mut polls = 0u64;
    let mut failures = 0u32;
    loop {
        let round = Instant::now();
        let mut records = Vec::new();
        match endpoint.read(&http) {
            Ok(stats) => {
                failures = 0;
                records.push(Record::Metrics(Metrics {
                    monotonic_ns: monotonic_ns(),
                    source: memgap_source_go::SOURCE.into(),
                    kind: memgap_trace::vocabulary::kind::MEMSTATS.into(),
                    values: stats.to_metric_values(),
                }));
                if let Some(pid) = pid {
                    if let Ok(rss) = residency::rss(pid) {
                        records.push(Record::Rss(rss));
                    }
                    if let Ok(snapshot) = residency::snapshot(pid, SnapshotReason::Periodic) {
                        records.push(Record::Snapshot(snapshot));
                    }
                }
                polls += 1;
            }
            Err(error) => {
                failures += 1;
                if failures == 3 {
                    records.push(note(format!("stopped: {error:#}")));
                    writer.write(&records)?;
                    if polls == 0 {
                        bail!("{}: {error:#}", args.go);
                    }
                    eprintln!("memgap: {}: {error:#}; stopping", args.go);
                    break;
                }
            }
        }
        let now = monotonic_ns();
        records.push(Record::Clock(Clock { time: now, monotonic_ns: now }));
        writer.write(&records)?;
        if super::stop::requested() || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let next = round + Duration::from_millis(args.interval);
        let next = deadline.map_or(next, |d| next.min(d));
        while Instant::now() < next && !super::stop::requested() {
            std::thread::sleep(next.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)));
        }
    }
    let now = monotonic_ns();
    writer.write(&[
        Record::Clock(Clock { time: now, monotonic_ns: now }),
        Record::End(End { time: now, reason: EndReason::Exit, ..End::default() }),
    ])?;
    drop(writer);
    if !args.quiet {
        eprintln!("memgap: {} — {polls} readings of {} over {:.1} s", output.display(), args.go, (now - start) as f64 / 1e9);
        eprintln!("memgap: details: memgap ledger|timeline|report {}", output.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The executable and command line of `pid`.
fn describe(pid: u32) -> (String, Vec<String>) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let argv = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
        .unwrap_or_default();
    (exe, argv)
}

/// The service's address: http://HOST:PORT (a path after it is ignored).
#[derive(Debug, Clone, PartialEq)]
struct Url {
    host: String,
    port: u16,
}

impl Url {
    fn parse(text: &str) -> anyhow::Result<Url> {
        let usage = || format!("{text}: give the service's address as http://HOST:PORT");
        let uri: ureq::http::Uri = text.parse().with_context(usage)?;
        if uri.scheme_str() != Some("http") {
            bail!("{}", usage());
        }
        let host = uri.host().map(|h| h.trim_start_matches('[').trim_end_matches(']')).filter(|h| !h.is_empty());
        let host = host.with_context(|| format!("{text}: the address needs a host"))?.to_string();
        let port = uri.port_u16().with_context(|| format!("{text}: the address needs a port (http://HOST:PORT)"))?;
        Ok(Url { host, port })
    }

    fn is_local(&self) -> bool {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map(|mut addrs| addrs.any(|a| a.ip().is_loopback() || a.ip().is_unspecified()))
            .unwrap_or(false)
    }
}

/// A response larger than this is refused: memgap's memory stays bounded
/// whatever the service sends (a busy service's heap profile is a few MiB).
const MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// GET requests to the service.
struct Http {
    agent: ureq::Agent,
    /// http://HOST:PORT, the host in brackets when it is an IPv6 address.
    base: String,
}

impl Http {
    fn new(url: &Url) -> Http {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_global(Some(Duration::from_secs(10)))
            // The status is ours to judge (a service without pprof answers 404).
            .http_status_as_error(false)
            // Straight to the service, as given, whatever HTTP_PROXY says:
            // its debug endpoints are on the machine or its network.
            .proxy(None)
            .user_agent("memgap")
            .build();
        let host = if url.host.contains(':') { format!("[{}]", url.host) } else { url.host.clone() };
        Http { agent: config.into(), base: format!("http://{host}:{}", url.port) }
    }

    /// GET `path`: the status code and the body.
    fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let mut response = self.agent.get(format!("{}{path}", self.base)).call().with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status().as_u16();
        let body = response.body_mut().with_config().limit(MAX_RESPONSE_BYTES).read_to_string().context("reading the response")?;
        Ok((status, body))
    }
}

#[derive(Debug, Clone, Copy)]
enum Endpoint {
    Pprof,
    Expvar,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Pprof => "/debug/pprof/heap?debug=1",
            Endpoint::Expvar => "/debug/vars",
        }
    }

    fn find(http: &Http) -> anyhow::Result<Endpoint> {
        let mut why = Vec::new();
        for endpoint in [Endpoint::Pprof, Endpoint::Expvar] {
            match endpoint.read(http) {
                Ok(_) => return Ok(endpoint),
                Err(error) => why.push(format!("{}: {error:#}", endpoint.path())),
            }
        }
        bail!("{} serves neither net/http/pprof nor expvar ({})", http.base, why.join("; "))
    }

    fn read(self, http: &Http) -> anyhow::Result<MemStats> {
        let (status, body) = http.get(self.path())?;
        if status != 200 {
            bail!("HTTP status {status}");
        }
        let parsed = match self {
            Endpoint::Pprof => memstats::parse_pprof_heap(&body),
            Endpoint::Expvar => memstats::parse_expvar(&body),
        };
        parsed.map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// The pid of the process with a socket listening on `port` (TCP, IPv4 or 6).
fn listening_pid(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st … inode (field 9); st 0A = LISTEN.
            let local_port = fields.get(1).and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && fields.get(3) == Some(&"0A") {
                inodes.extend(fields.get(9).and_then(|i| i.parse::<u64>().ok()));
            }
        }
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let processes = std::fs::read_dir("/proc").ok()?;
    for process in processes.flatten() {
        let Some(pid) = process.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str())) {
                return Some(pid);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        assert_eq!(Url::parse("http://127.0.0.1:6060").unwrap(), Url { host: "127.0.0.1".into(), port: 6060 });
        assert_eq!(Url::parse("http://[::1]:80/debug").unwrap(), Url { host: "::1".into(), port: 80 });
        assert!(Url::parse("https://x:1").is_err());
        assert!(Url::parse("http://localhost").is_err());
        assert!(Url::parse("http://:80").is_err());
        assert!(Url::parse("http://127.0.0.1:6060").unwrap().is_local());
    }

    /// A service on an ephemeral local port answering each request with
    /// `respond(path)`: status and body. Serves `requests` requests.
    fn serve(requests: usize, respond: fn(&str) -> (u16, String)) -> Url {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        std::thread::spawn(move || {
            for request in server.incoming_requests().take(requests) {
                let (status, body) = respond(request.url());
                let _ = request.respond(tiny_http::Response::from_string(body).with_status_code(status));
            }
        });
        Url { host: "127.0.0.1".into(), port }
    }

    #[test]
    fn finds_the_endpoint_the_service_has_and_reads_it() {
        let url = serve(3, |path| match path {
            "/debug/vars" => {
                (200, r#"{"memstats":{"HeapAlloc":1,"HeapInuse":2,"HeapIdle":3,"HeapReleased":4,"HeapSys":5,"Sys":6}}"#.into())
            }
            _ => (404, "404 page not found".into()),
        });
        let http = Http::new(&url);
        let endpoint = Endpoint::find(&http).unwrap();
        assert_eq!(endpoint.path(), "/debug/vars");
        let stats = endpoint.read(&http).unwrap();
        let values = stats.to_metric_values();
        assert!(values.iter().any(|(name, value)| name == memgap_source_go::names::TOTAL && *value == 6.0), "{values:?}");
    }

    #[test]
    fn a_service_with_neither_endpoint_says_why() {
        let url = serve(2, |_| (404, "404 page not found".into()));
        let error = format!("{:#}", Endpoint::find(&Http::new(&url)).unwrap_err());
        assert!(error.contains("serves neither") && error.contains("HTTP status 404"), "{error}");
    }

    #[test]
    fn a_response_beyond_the_limit_is_refused() {
        let url = serve(1, |_| (200, "x".repeat(MAX_RESPONSE_BYTES as usize + 1)));
        assert!(Http::new(&url).get("/debug/vars").is_err());
    }

    #[test]
    fn an_ipv6_host_is_bracketed_again() {
        assert_eq!(Http::new(&Url::parse("http://[::1]:6060").unwrap()).base, "http://[::1]:6060");
    }

    #[test]
    fn finds_our_own_listening_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listening_pid(port), Some(std::process::id()));
    }
}
