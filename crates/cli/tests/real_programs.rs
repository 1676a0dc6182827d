//! Real programs, unharmed: programs nobody here wrote (python3's own test
//! suite, git, gcc, sqlite3, redis, …) run plain and under `memgap run`; the
//! exit codes, the outputs and the files they write must be identical, and
//! every trace must read back. Prints a table (`cargo test --release --test
//! real_programs -- --nocapture`) and writes it to target/real-programs.md.
//!
//! The programs come from Debian packages that .ci/run installs; a missing
//! one fails the suite, naming its package.

mod common;

use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{arg, compile, memgap_bin, read_in_background, sigkill, tempdir};

/// A slow program under the DWARF unwinder on a loaded 2-core machine can take
/// minutes; a hang still fails.
const TIMEOUT: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------
// The programs
// ---------------------------------------------------------------------------

struct Case {
    name: &'static str,
    /// The Debian package providing the program.
    package: &'static str,
    /// Builds the program's input in its (empty) working directory.
    setup: fn(&Path),
    /// The command; `{dir}` stands for the working directory.
    argv: Vec<String>,
    /// Compare stderr too (false where it holds timings or pids).
    stderr_deterministic: bool,
    /// Applied to stdout (and stderr) of both runs before comparing: only
    /// ever removes timings.
    normalize: fn(&str) -> String,
    /// Files the program writes, compared byte for byte after both runs.
    artifacts: &'static [&'static str],
    /// The program calls malloc (false: events may be 0).
    allocates: bool,
    /// The program starts a server that the test drives (redis).
    server: Option<fn(&Path, &mut Child) -> ServerOutput>,
}

struct ServerOutput {
    stdout: Vec<u8>,
}

fn case(name: &'static str, package: &'static str, argv: &[&str]) -> Case {
    Case {
        name,
        package,
        setup: |_| {},
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stderr_deterministic: true,
        normalize: |s| s.to_string(),
        artifacts: &[],
        allocates: true,
        server: None,
    }
}

impl Case {
    fn setup(mut self, setup: fn(&Path)) -> Case {
        self.setup = setup;
        self
    }
    fn stderr_varies(mut self) -> Case {
        self.stderr_deterministic = false;
        self
    }
    fn normalize(mut self, normalize: fn(&str) -> String) -> Case {
        self.normalize = normalize;
        self
    }
    fn artifacts(mut self, artifacts: &'static [&'static str]) -> Case {
        self.artifacts = artifacts;
        self
    }
    fn server(mut self, drive: fn(&Path, &mut Child) -> ServerOutput) -> Case {
        self.server = Some(drive);
        self
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn cases(programs: &Path) -> Vec<Case> {
    let built = |name: &str| programs.join(name).to_string_lossy().into_owned();
    vec![
        case("python3 -m test (test_list test_dict test_json)", "libpython3.11-testsuite", &["/usr/bin/python3", "-m", "test", "test_list", "test_dict", "test_json"])
            .normalize(without_python_timings),
        case("python3 script (json, re, sqlite3, threads)", "python3", &["/usr/bin/python3", "script.py"]).setup(python_script),
        Case { argv: sh("git init -q -b main repo && cd repo && cp -r ../tree . && git add -A && git commit -q -m first && echo change >> tree/a/f1.txt && git commit -qam second && git log --stat && git gc -q && git fsck && git archive --format=tar HEAD | wc -c"), ..case("git init/add/commit/log/gc/fsck", "git", &[]) }
            .setup(text_tree),
        case("sqlite3 (100k rows, index, group by)", "sqlite3", &["sqlite3", "db.sqlite", ".read work.sql"]).setup(sqlite_script).artifacts(&["db.sqlite"]),
        case("gcc -O2 (cc1, as, collect2, ld)", "gcc", &["gcc", "-O2", "-g", "-Wall", "-o", "hello", "hello.c"]).setup(c_source).artifacts(&["hello"]),
        Case { argv: sh("g++ -O1 -std=c++17 -o templates templates.cpp && ./templates"), ..case("g++ templates, then run", "g++", &[]) }.setup(cpp_source),
        case("perl (hashes, regexes, sort)", "perl", &["perl", "-e", PERL]),
        case("ruby (objects, GC, threads)", "ruby", &["ruby", "-e", RUBY]),
        case("node (objects, JSON, Map)", "nodejs", &["node", "-e", NODE]),
        Case { argv: sh("tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -czf tree.tgz tree && tar -tzvf tree.tgz && gzip -dc tree.tgz | md5sum"), ..case("tar -z (forks gzip)", "tar", &[]) }.setup(text_tree),
        case("grep -rn over a tree", "grep", &["grep", "-rn", "-E", "memgap|line 1[0-9]+", "tree"]).setup(text_tree),
        case("sort -n (1 M lines)", "coreutils", &["sort", "-n", "-r", "-o", "sorted.txt", "numbers.txt"]).setup(numbers).artifacts(&["sorted.txt"]),
        case("gawk (associative arrays)", "gawk", &["gawk", "-f", "count.awk", "numbers.txt"]).setup(numbers),
        case("sed -E over 1 M lines", "sed", &["sed", "-E", "-n", "s/^([0-9])([0-9]*)7$/\\2-\\1/p", "numbers.txt"]).setup(numbers),
        case("xz -T2 -9 (threads)", "xz-utils", &["xz", "-T2", "-6", "-k", "numbers.txt"]).setup(numbers).artifacts(&["numbers.txt.xz"]),
        case("bc -l (pi to 1500 digits)", "bc", &["bc", "-l", "pi.bc"]).setup(bc_script),
        case("find -printf over a tree", "findutils", &["find", "tree", "-type", "f", "-size", "-100k", "-printf", "%s %p\\n"]).setup(text_tree),
        case("openssl enc + dgst", "openssl", &["sh", "-c", "openssl enc -aes-256-cbc -pbkdf2 -iter 20000 -S 0011223344556677 -pass pass:memgap -in numbers.txt -out numbers.enc && openssl dgst -sha256 -sha512 numbers.enc"]).setup(numbers).artifacts(&["numbers.enc"]),
        case("make (sh, cc1, as, ld per target)", "make", &["make", "-s", "all"]).setup(makefile).artifacts(&["prog"]),
        case("diff -u (exit 1)", "diffutils", &["diff", "-u", "--label", "a", "--label", "b", "tree/a/f1.txt", "tree/b/f2.txt"]).setup(text_tree),
        case("ls of a missing file (exit 2, stderr)", "coreutils", &["ls", "-l", "tree/a", "/no/such/file"]).setup(text_tree).normalize(without_ls_times),
        case("jq (JSON reshaping)", "jq", &["jq", "-c", "group_by(.k) | map({k: .[0].k, n: length, s: (map(.v) | add)})", "data.json"]).setup(json_data),
        case("bzip2 -9", "bzip2", &["bzip2", "-9", "-k", "numbers.txt"]).setup(numbers).artifacts(&["numbers.txt.bz2"]),
        case("zstd -19 (threads)", "zstd", &["zstd", "-q", "-19", "-T2", "numbers.txt", "-o", "numbers.zst"]).setup(numbers).artifacts(&["numbers.zst"]),
        case("tclsh (lists, dicts)", "tcl", &["tclsh", "script.tcl"]).setup(tcl_script),
        Case { argv: redis_server_argv(), ..case("redis-server driven by redis-cli and redis-benchmark", "redis-server", &[]) }
            .stderr_varies()
            .server(drive_redis),
        case("C++ exceptions (nested, rethrown, across threads)", "g++", &[&built("cxx_exceptions")]),
        case("dlopen/dlclose of system libraries", "gcc", &[&built("dlopen_cycle")]),
        case("setjmp/longjmp and siglongjmp from a handler", "gcc", &[&built("setjmp_jump")]),
    ]
}

fn redis_server_argv() -> Vec<String> {
    let port = redis_port().to_string();
    ["redis-server", "--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn without_python_timings(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        // "0:00:03 load avg: 7.97 [3/3] test_json" → "[3/3] test_json"
        let line = match line.split_once(" load avg: ") {
            Some((clock, rest)) if clock.chars().all(|c| c.is_ascii_digit() || c == ':') => {
                rest.split_once(' ').map_or("", |(_, tail)| tail)
            }
            _ => line,
        };
        if line.starts_with("Total duration:") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `ls -l` prints modification times: keep the names and sizes.
fn without_ls_times(text: &str) -> String {
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() >= 9 { format!("{} {} {}", fields[0], fields[4], fields[8..].join(" ")) } else { line.to_string() }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

fn write(dir: &Path, name: &str, content: impl AsRef<[u8]>) {
    let path = dir.join(name);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn text_tree(dir: &Path) {
    for (i, sub) in ["a", "b", "c/d", "c/e/f"].iter().enumerate() {
        for file in 0..6 {
            let mut text = String::new();
            for line in 0..(200 * (file + 1)) {
                let _ = writeln!(text, "{sub} file {file} line {line}{}", if (line + i) % 37 == 0 { " memgap" } else { "" });
            }
            write(dir, &format!("tree/{sub}/f{file}.txt"), text);
        }
    }
}

fn numbers(dir: &Path) {
    let mut text = String::with_capacity(8 << 20);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..1_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let _ = writeln!(text, "{} {}", x % 10_000_000, x % 97);
    }
    write(dir, "numbers.txt", text);
    write(
        dir,
        "count.awk",
        "{ n[$2]++; s[$2] += $1 } END { PROCINFO[\"sorted_in\"] = \"@ind_num_asc\"; for (k in n) printf \"%d %d %d\\n\", k, n[k], s[k] }\n",
    );
}

fn python_script(dir: &Path) {
    write(
        dir,
        "script.py",
        r#"
import json, re, sqlite3, threading, collections
words = collections.Counter()
def work(seed):
    text = " ".join("w%d" % ((seed * 7919 + i * 104729) % 5000) for i in range(40000))
    local = collections.Counter(re.findall(r"w(\d+)", text))
    with lock:
        words.update(local)
lock = threading.Lock()
threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
for t in threads: t.start()
for t in threads: t.join()
db = sqlite3.connect(":memory:")
db.execute("create table w(k text, n int)")
db.executemany("insert into w values (?, ?)", words.items())
top = db.execute("select k, n from w order by n desc, k limit 5").fetchall()
print(json.dumps({"distinct": len(words), "top": top}, sort_keys=True))
"#,
    );
}

fn sqlite_script(dir: &Path) {
    write(
        dir,
        "work.sql",
        "create table t(id integer primary key, k int, v text);\n\
         with recursive c(i) as (select 1 union all select i + 1 from c where i < 100000)\n\
         insert into t(k, v) select (i * 7919) % 1000, printf('value-%08d', i) from c;\n\
         create index t_k on t(k);\n\
         select k, count(*), min(v), max(v) from t group by k order by count(*) desc, k limit 5;\n\
         delete from t where k % 3 = 0;\n\
         vacuum;\n\
         select count(*), sum(length(v)) from t;\n",
    );
}

fn c_source(dir: &Path) {
    write(
        dir,
        "hello.c",
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\
         struct node { struct node *next; char name[32]; };\n\
         int main(int argc, char **argv) {\n  struct node *head = NULL;\n\
           for (int i = 0; i < argc * 100; i++) { struct node *n = malloc(sizeof *n); snprintf(n->name, sizeof n->name, \"n%d\", i); n->next = head; head = n; }\n\
           int count = 0; while (head) { struct node *next = head->next; count += strlen(head->name); free(head); head = next; }\n\
           printf(\"%d\\n\", count); return 0;\n}\n",
    );
}

fn cpp_source(dir: &Path) {
    write(
        dir,
        "templates.cpp",
        "#include <algorithm>\n#include <iostream>\n#include <map>\n#include <numeric>\n#include <string>\n#include <vector>\n\
         template <typename T> T total(const std::vector<T> &v) { return std::accumulate(v.begin(), v.end(), T{}); }\n\
         int main() {\n  std::map<std::string, std::vector<long>> groups;\n\
           for (long i = 0; i < 200000; i++) groups[\"g\" + std::to_string(i % 97)].push_back(i * i % 1009);\n\
           std::vector<std::pair<long, std::string>> sums;\n  for (auto &[k, v] : groups) sums.emplace_back(total(v), k);\n\
           std::sort(sums.rbegin(), sums.rend());\n  for (int i = 0; i < 5; i++) std::cout << sums[i].second << ' ' << sums[i].first << '\\n';\n}\n",
    );
}

fn makefile(dir: &Path) {
    write(dir, "Makefile", "all: prog\n\t./prog\nprog: a.o b.o\n\t$(CC) -o $@ a.o b.o\n%.o: %.c\n\t$(CC) -O2 -c $<\n");
    write(dir, "a.c", "#include <stdio.h>\nint twice(int);\nint main(void) { printf(\"%d\\n\", twice(21)); return 0; }\n");
    write(dir, "b.c", "int twice(int x) { return 2 * x; }\n");
}

fn bc_script(dir: &Path) {
    write(dir, "pi.bc", "scale = 1500\n4 * a(1)\nquit\n");
}

fn json_data(dir: &Path) {
    let items: Vec<String> = (0..20_000).map(|i| format!("{{\"k\":\"k{}\",\"v\":{}}}", i % 13, i % 101)).collect();
    write(dir, "data.json", format!("[{}]", items.join(",")));
}

fn tcl_script(dir: &Path) {
    write(
        dir,
        "script.tcl",
        "set d [dict create]\nfor {set i 0} {$i < 100000} {incr i} { dict incr d [expr {$i % 101}] $i }\n\
         set l {}\ndict for {k v} $d { lappend l [list $k $v] }\n\
         puts [lrange [lsort -integer -decreasing -index 1 $l] 0 4]\nputs [string length [string repeat abc 100000]]\n",
    );
}

const PERL: &str = r#"
my %h; my @w;
for my $i (1..200000) { my $k = "k" . ($i * 7919 % 10007); $h{$k} .= chr(97 + $i % 26); push @w, $k if $i % 3 == 0 }
my @top = (sort { length($h{$b}) <=> length($h{$a}) || $a cmp $b } keys %h)[0..4];
my $matches = grep { /^k1\d{3}$/ } @w;
print join(",", @top), " $matches ", scalar(keys %h), "\n";
"#;

const RUBY: &str = r#"
h = Hash.new { |hash, k| hash[k] = [] }
threads = 4.times.map { |t| Thread.new { 50_000.times.map { |i| "s#{(i * 7919 + t) % 5003}" } } }
threads.map(&:value).flatten.each_with_index { |s, i| h[s] << i if i % 7 == 0 }
GC.start
puts h.size, h.max_by { |k, v| [v.size, k] }.first, h.values.map(&:size).sum
"#;

const NODE: &str = r#"
const m = new Map();
for (let i = 0; i < 300000; i++) { const k = 'k' + ((i * 7919) % 10007); m.set(k, (m.get(k) || []).concat([i % 13])); }
const out = [...m].map(([k, v]) => ({ k, n: v.length, s: v.reduce((a, b) => a + b, 0) })).sort((a, b) => b.s - a.s || (a.k < b.k ? -1 : 1));
console.log(JSON.stringify(out.slice(0, 3)), JSON.stringify(out).length);
"#;

// ---------------------------------------------------------------------------
// redis: the server runs (plain or under memgap); redis-cli drives it
// ---------------------------------------------------------------------------

fn drive_redis(dir: &Path, server: &mut Child) -> ServerOutput {
    let port = redis_port().to_string();
    let cli = |args: &[&str], stdin: Option<&Path>| {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-p", &port]).args(args).current_dir(dir).env_remove("LD_PRELOAD");
        if let Some(file) = stdin {
            cmd.stdin(fs::File::open(file).unwrap());
        }
        let out = cmd.stderr(Stdio::inherit()).output().expect("run redis-cli");
        out.stdout
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while cli(&["ping"], None) != b"PONG\n" {
        assert!(server.try_wait().unwrap().is_none(), "redis-server exited before answering");
        assert!(Instant::now() < deadline, "redis-server did not answer within 60 s");
        thread::sleep(Duration::from_millis(50));
    }
    let mut commands = String::new();
    for i in 0..20_000 {
        let _ = writeln!(commands, "SET key:{i} value-{}", "x".repeat(i % 300));
        let _ = writeln!(commands, "RPUSH list:{} {i}", i % 50);
        let _ = writeln!(commands, "HSET hash:{} field{i} {}", i % 70, i * 3);
        let _ = writeln!(commands, "ZADD zset {} member{i}", (i * 7919) % 10007);
        if i % 3 == 0 {
            let _ = writeln!(commands, "DEL key:{}", i / 2);
        }
    }
    let _ =
        writeln!(commands, "DBSIZE\nLLEN list:7\nHLEN hash:9\nZRANGE zset 0 4 WITHSCORES\nGET key:19999\nSTRLEN key:299\nSCARD nothing");
    fs::write(dir.join("commands.txt"), commands).unwrap();
    let mut answers = cli(&[], Some(&dir.join("commands.txt")));
    // Load from redis' own benchmark client (its timings are not compared).
    let benchmark = Command::new("redis-benchmark")
        .args(["-p", &port, "-q", "-n", "20000", "-P", "16", "-t", "set,get,lpush,lpop,incr,hset"])
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::null())
        .status()
        .expect("run redis-benchmark");
    assert!(benchmark.success(), "redis-benchmark failed");
    answers.extend(cli(&["SHUTDOWN", "NOSAVE"], None));
    ServerOutput { stdout: answers }
}

/// One free loopback port for the whole suite (plain and traced servers run
/// one after the other).
fn redis_port() -> u16 {
    static PORT: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *PORT.get_or_init(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port())
}

// ---------------------------------------------------------------------------
// Running one case
// ---------------------------------------------------------------------------

struct Outcome {
    exit: Option<i32>,
    signal: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    artifacts: Vec<Option<Vec<u8>>>,
    wall: Duration,
    cpu: Duration,
}

/// Runs `argv` in `work` (emptied and set up afresh), optionally prefixed by
/// `memgap run`, and collects what it did.
fn run(case: &Case, work: &Path, prefix: &[String]) -> Outcome {
    if work.exists() {
        fs::remove_dir_all(work).unwrap();
    }
    fs::create_dir_all(work).unwrap();
    (case.setup)(work);
    let argv: Vec<String> = prefix.iter().cloned().chain(case.argv.iter().map(|a| a.replace("{dir}", &work.to_string_lossy()))).collect();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(work)
        .env_remove("LD_PRELOAD")
        .env("HOME", work)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "memgap")
        .env("GIT_AUTHOR_EMAIL", "memgap@example.org")
        .env("GIT_COMMITTER_NAME", "memgap")
        .env("GIT_COMMITTER_EMAIL", "memgap@example.org")
        .env("GIT_AUTHOR_DATE", "2024-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2024-01-01T00:00:00Z")
        .env("SOURCE_DATE_EPOCH", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {argv:?}: {e}"));
    let stdout = read_in_background(child.stdout.take().unwrap());
    let stderr = read_in_background(child.stderr.take().unwrap());
    let driven = case.server.map(|drive| drive(work, &mut child));
    let (status, cpu) = wait_with_rusage(&mut child, &format!("{argv:?}"));
    let wall = started.elapsed();
    let mut stdout = stdout.join().unwrap();
    if let Some(driven) = driven {
        // The server's own log holds pids and times; what counts is what it answered.
        stdout = driven.stdout;
    }
    let artifacts = case.artifacts.iter().map(|name| fs::read(work.join(name)).ok()).collect();
    Outcome { exit: status.code(), signal: status.signal(), stdout, stderr: stderr.join().unwrap(), artifacts, wall, cpu }
}

/// Waits for `child` (in its own process group) and returns its status and
/// the CPU time (user + system) of it and the children it reaped.
fn wait_with_rusage(child: &mut Child, what: &str) -> (std::process::ExitStatus, Duration) {
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut status = 0;
        // SAFETY: rusage is plain data, valid all zero.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `usage` are ours to write.
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if reaped == pid {
            let seconds = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
            return (std::process::ExitStatus::from_raw(status), seconds(usage.ru_utime) + seconds(usage.ru_stime));
        }
        assert!(reaped == 0, "wait4 {what}: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline {
            sigkill(-pid);
            let _ = child.wait();
            panic!("{what} did not finish within {TIMEOUT:?}; killed it");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

struct Row {
    name: String,
    exit: String,
    exit_match: bool,
    output_match: bool,
    output_note: String,
    trace_valid: bool,
    trace_note: String,
    wall_ratio: f64,
    cpu_ratio: f64,
}

impl Row {
    fn ok(&self) -> bool {
        self.exit_match && self.output_match && self.trace_valid
    }
}

fn check(case: &Case, root: &Path) -> Row {
    let work = root.join("work");
    let traces = root.join(format!("traces-{}", case.name.split_whitespace().next().unwrap().replace('/', "_")));
    fs::create_dir_all(&traces).unwrap();
    let top = traces.join("t.mgt");
    let plain = run(case, &work, &[]);
    let memgap_run = [
        memgap_bin().to_string_lossy().into_owned(),
        "run".into(),
        "--quiet".into(),
        "-o".into(),
        top.to_string_lossy().into_owned(),
        "--".into(),
    ];
    let traced = run(case, &work, &memgap_run);

    let exit_match = (plain.exit, plain.signal) == (traced.exit, traced.signal);
    let mut notes = Vec::new();
    let normalize = |bytes: &[u8]| (case.normalize)(&String::from_utf8_lossy(bytes));
    let stdout_match = normalize(&plain.stdout) == normalize(&traced.stdout);
    if !stdout_match {
        notes.push(first_difference("stdout", &normalize(&plain.stdout), &normalize(&traced.stdout)));
    }
    let traced_stderr = String::from_utf8_lossy(&traced.stderr);
    let stderr_match = if case.stderr_deterministic {
        normalize(&plain.stderr) == normalize(&traced.stderr)
    } else {
        // Whatever the program says, memgap (run with --quiet) adds nothing.
        !traced_stderr.lines().any(|line| line.starts_with("memgap:"))
    };
    if !stderr_match {
        notes.push(first_difference("stderr", &normalize(&plain.stderr), &normalize(&traced.stderr)));
    }
    let mut artifacts_match = true;
    for (name, (a, b)) in case.artifacts.iter().zip(plain.artifacts.iter().zip(&traced.artifacts)) {
        if a.is_none() || a != b {
            artifacts_match = false;
            notes.push(format!("{name} {}", if a.is_none() { "missing" } else { "differs" }));
        }
    }
    let (trace_valid, trace_note) = validate_traces(&traces, &top, case.allocates);
    let ratio = |t: Duration, p: Duration| t.as_secs_f64() / p.as_secs_f64().max(1e-3);
    let exit_text = |o: &Outcome| match (o.exit, o.signal) {
        (Some(code), _) => code.to_string(),
        (_, Some(signal)) => format!("signal {signal}"),
        _ => "?".into(),
    };
    let row = Row {
        name: case.name.to_string(),
        exit: if exit_match { exit_text(&plain) } else { format!("{} vs {}", exit_text(&plain), exit_text(&traced)) },
        exit_match,
        output_match: stdout_match && stderr_match && artifacts_match,
        output_note: notes.join("; "),
        trace_valid,
        trace_note,
        wall_ratio: ratio(traced.wall, plain.wall),
        cpu_ratio: ratio(traced.cpu, plain.cpu),
    };
    if !row.ok() {
        eprintln!("--- {}: plain stderr:\n{}\n--- traced stderr:\n{}", case.name, String::from_utf8_lossy(&plain.stderr), traced_stderr);
    }
    let _ = fs::remove_dir_all(&traces);
    row
}

fn first_difference(what: &str, plain: &str, traced: &str) -> String {
    let at = plain.lines().zip(traced.lines()).position(|(a, b)| a != b).unwrap_or(plain.lines().count().min(traced.lines().count()));
    let line = |text: &str| text.lines().nth(at).unwrap_or("<end>").chars().take(80).collect::<String>();
    format!("{what} line {}: {:?} vs {:?}", at + 1, line(plain), line(traced))
}

/// Every trace the run wrote must read back (`memgap summary --json`) and be
/// complete; together they must hold events when the program allocates.
fn validate_traces(dir: &Path, top: &Path, allocates: bool) -> (bool, String) {
    if !top.is_file() {
        return (false, "no trace".into());
    }
    let mut events = 0;
    let mut count = 0;
    let mut problems = Vec::new();
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "mgt") {
            continue;
        }
        count += 1;
        let out = common::memgap(dir, &["summary", arg(&path), "--json"]);
        if !out.status.success() {
            problems.push(format!("{}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()));
            continue;
        }
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary --json prints JSON");
        events += summary["total_events"].as_u64().unwrap_or(0);
        if summary["truncated"] != serde_json::Value::Bool(false) {
            problems.push(format!("{} cut short: {}", path.file_name().unwrap().to_string_lossy(), summary["truncated_reason"]));
        }
        let dropped = summary["dropped_events"].as_u64().unwrap_or(0);
        if dropped > 0 {
            problems.push(format!("{} dropped {dropped} events", path.file_name().unwrap().to_string_lossy()));
        }
    }
    if allocates && events == 0 {
        problems.push("no events".into());
    }
    let note = format!("{count} trace{}, {} events", if count == 1 { "" } else { "s" }, events);
    if problems.is_empty() { (true, note) } else { (false, format!("{note}: {}", problems.join("; "))) }
}

// ---------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------

#[test]
fn real_programs_run_unharmed() {
    let (_tmp, root) = tempdir();
    let programs = root.join("built");
    fs::create_dir_all(&programs).unwrap();
    for source in ["cxx_exceptions.cpp", "dlopen_cycle.c", "setjmp_jump.c"] {
        compile(&programs, source);
    }
    let only = std::env::var("MEMGAP_REAL_PROGRAMS").ok();
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for case in cases(&programs) {
        if only.as_deref().is_some_and(|filter| !case.name.contains(filter)) {
            continue;
        }
        let program = if case.argv[0] == "sh" { case.argv[2].split_whitespace().next().unwrap().to_string() } else { case.argv[0].clone() };
        if !is_runnable(&program) {
            missing.push(format!("{} (apt install {})", case.name, case.package));
            continue;
        }
        let row = check(&case, &root);
        eprintln!("{}", table_line(&row));
        rows.push(row);
    }
    let table = table(&rows, &missing);
    eprintln!("\n{table}");
    let report = memgap_bin().parent().and_then(Path::parent).map(|target| target.join("real-programs.md"));
    if let Some(report) = report.filter(|_| only.is_none()) {
        let _ = fs::write(&report, &table);
    }
    assert!(missing.is_empty(), "programs missing: {missing:?}");
    let failed: Vec<&str> = rows.iter().filter(|r| !r.ok()).map(|r| r.name.as_str()).collect();
    assert!(failed.is_empty(), "harmed or badly traced under memgap: {failed:?}\n{table}");
    if only.is_none() {
        assert!(rows.len() >= 20, "only {} programs ran", rows.len());
    }
}

fn is_runnable(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

fn table_line(row: &Row) -> String {
    let mark = |ok: bool| if ok { "yes" } else { "NO" };
    let output = if row.output_note.is_empty() {
        mark(row.output_match).to_string()
    } else {
        format!("{} ({})", mark(row.output_match), row.output_note)
    };
    format!(
        "| {} | {} | {} | {} | {} ({}) | {:.2}x | {:.2}x |",
        row.name,
        row.exit,
        mark(row.exit_match),
        output,
        mark(row.trace_valid),
        row.trace_note,
        row.wall_ratio,
        row.cpu_ratio
    )
}

fn table(rows: &[Row], missing: &[String]) -> String {
    let mut out = String::from(
        "| program | exit code | exit code match | output match | trace valid | overhead (wall) | overhead (CPU) |\n|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        out.push_str(&table_line(row));
        out.push('\n');
    }
    for name in missing {
        let _ = writeln!(out, "| {name} | missing | | | | | |");
    }
    let passed = rows.iter().filter(|r| r.ok()).count();
    let _ = writeln!(out, "\n{passed} of {} programs unharmed, with a valid trace.", rows.len());
    out
}
