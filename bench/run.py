#!/usr/bin/env python3
"""memgap vs heaptrack (and memray on Python workloads), side by side, in one run.

    python3 bench/run.py [--quick | --smoke] [--repeat N] [--only churn,deep] [--out DIR]

Builds the workloads in bench/workloads/, then for each workload runs plain, every
memgap variant the CLI supports and heaptrack interleaved (A B C A B C ..., after one
warm-up round), counts instructions with `perf stat`, measures each trace's size and
(Python workloads) adds memray, installed from PyPI into bench/.memray/ by pip, and
how fast each tool analyses it, and writes RATIOS to DIR/latest.md and DIR/latest.json.
No timing is asserted: the point is the comparison. See bench/README.md.
Python standard library only.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
WORKLOAD_SOURCES = BENCH_DIR / "workloads"
REPO_DIR = BENCH_DIR.parent
DEFAULT_MEMGAP = REPO_DIR / "target" / "release" / "memgap"
MIB = 1024 * 1024

# memray for the Python workloads: pip installs this version into a venv in the bench's
# own private directory (mode 0700), once; the workloads then run on that venv's python
# (the system interpreter, through the venv's symlink) under every tool.
MEMRAY_VERSION = "1.20.0"
MEMRAY_DIR = BENCH_DIR / ".memray"

# heaptrack 1.4's interpreter can grow to tens of GiB on many distinct stacks and take the
# machine with it (baseline §5.1); an address-space cap makes it die alone instead.
HEAPTRACK_MEMORY_CAP_GIB = 4

# Debian package that provides each external command.
DEBIAN_PACKAGE = {
    "gcc": "gcc",
    "heaptrack": "heaptrack",
    "heaptrack_print": "heaptrack",
    "zstd": "zstd",
    "perf": "linux-perf",
    "sqlite3": "sqlite3",
    "prlimit": "util-linux",
}

C_WORKLOADS = ["churn", "threads", "deep", "big"]

# Per size: what the workload sizes are divided by, measured rounds, perf runs, analysis runs.
# --quick keeps the suite at 2-3 minutes; its divisor goes no higher because heaptrack's fixed
# start-up (~0.15 s) would then dominate its ratios. --smoke runs every workload and tool once
# in well under a minute, to check that the suite works (the tests run it), not to measure.
SIZES = {
    "full": {"divisor": 1, "repeat": 5, "perf_runs": 3, "analysis_runs": 3},
    "quick": {"divisor": 5, "repeat": 3, "perf_runs": 1, "analysis_runs": 1},
    "smoke": {"divisor": 100, "repeat": 1, "perf_runs": 1, "analysis_runs": 1},
}


@dataclass
class Workload:
    name: str
    argv: list
    env: dict = field(default_factory=dict)
    python: bool = False  # a CPython script: Python-only tools (memray, --python-stacks) apply


@dataclass
class Tool:
    name: str  # as shown in the report: "plain", "memgap", "memgap --no-stacks", "heaptrack"
    kind: str  # "plain" | "memgap" | "heaptrack" | "memray"
    flags: list = field(default_factory=list)
    python_only: bool = False


@dataclass
class Setup:
    """What this machine offers; every missing piece becomes a note in the report."""
    memgap: Path = None
    memgap_tools: list = field(default_factory=list)
    memgap_quiet: bool = False
    heaptrack: bool = False
    memray_python: Path = None  # the venv's interpreter, with memray installed
    perf_ok: bool = False
    notes: list = field(default_factory=list)


# ---------------------------------------------------------------- setup and build

def check_environment(memgap_path):
    setup = Setup()
    missing = sorted(cmd for cmd in DEBIAN_PACKAGE if not shutil.which(cmd))
    for cmd in missing:
        setup.notes.append(f"`{cmd}` not found: sudo apt-get install {DEBIAN_PACKAGE[cmd]}")
    if "gcc" in missing:
        sys.exit("bench: gcc is needed to build the workloads: sudo apt-get install gcc")

    # heaptrack falls back to gzip without zstd, and the event count below reads zstd.
    setup.heaptrack = not {"heaptrack", "heaptrack_print", "zstd", "prlimit"} & set(missing)
    if not setup.heaptrack:
        setup.notes.append("heaptrack columns skipped (needs heaptrack, zstd and prlimit)")

    setup.perf_ok, reason = perf_counts_instructions("perf" not in missing)
    if not setup.perf_ok:
        setup.notes.append(f"instructions: n/a ({reason})")

    if not memgap_path.is_file():
        setup.notes.append(f"memgap not found at {memgap_path}: build it with `cargo build --release` "
                           "(or pass --memgap PATH); comparing plain and heaptrack only")
        return setup
    try:
        help_text = subprocess.run([str(memgap_path), "run", "--help"], capture_output=True, text=True)
    except OSError as error:
        help_text = subprocess.CompletedProcess([], 1, "", str(error))
    if help_text.returncode != 0:
        setup.notes.append(f"`memgap run --help` failed ({help_text.stderr.strip()[:200]}); memgap skipped")
        return setup
    setup.memgap = memgap_path
    setup.memgap_quiet = "--quiet" in help_text.stdout
    setup.memgap_tools = [Tool("memgap", "memgap")] + [
        Tool(f"memgap {flag}", "memgap", [flag])
        for flag in ("--no-stacks", "--trim-only") if flag in help_text.stdout]
    if "--python-stacks" in help_text.stdout:
        setup.memgap_tools.append(Tool("memgap --python-stacks=off", "memgap", ["--python-stacks=off"], python_only=True))
    agent = memgap_path.parent / "libmemgap_agent.so"
    if not agent.is_file():
        setup.notes.append(f"note: {agent} not found next to the CLI")
    return setup


def setup_memray(setup):
    """memray from PyPI in a venv of bench/.memray (made 0700), once; None (and a note) if that fails."""
    system_python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    venv = MEMRAY_DIR / "venv"
    python = venv / "bin" / "python3"

    def installed():
        if not python.exists():
            return False
        version = subprocess.run([str(python), "-m", "memray", "--version"], capture_output=True, text=True)
        return version.returncode == 0 and version.stdout.strip() == MEMRAY_VERSION

    if not installed():
        MEMRAY_DIR.mkdir(mode=0o700, exist_ok=True)
        os.chmod(MEMRAY_DIR, 0o700)
        steps = [[system_python, "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", "--quiet", f"memray=={MEMRAY_VERSION}"]]
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode != 0:
                setup.notes.append(f"memray columns skipped: `{' '.join(step[-3:])}` failed: "
                                   f"{(result.stderr or result.stdout).strip().splitlines()[-1:]}")
                return
        if not installed():
            setup.notes.append("memray columns skipped: memray did not install")
            return
    setup.memray_python = python


def perf_counts_instructions(perf_installed):
    if not perf_installed:
        return False, "perf not installed"
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
        subprocess.run(["perf", "stat", "-e", "instructions", "-x,", "-o", out.name, "--", "true"],
                       capture_output=True)
        if read_instruction_count(out.name) is not None:
            return True, ""
    if not any(Path("/sys/bus/event_source/devices", pmu).exists() for pmu in ("cpu", "cpu_core")):
        return False, "perf cannot count instructions here: the kernel exposes no hardware PMU (usual in a VM)"
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    return False, f"perf cannot count instructions: check perf_event_paranoid (now {paranoid})"


def build(build_dir, divisor, setup):
    """Compile the C workloads and the launcher, generate the sqlite script; return the workloads."""
    build_dir.mkdir(parents=True, exist_ok=True)
    flags = ["-O2", "-g", "-fno-omit-frame-pointer", "-pthread"]
    for name in C_WORKLOADS:
        compile_c(WORKLOAD_SOURCES / f"{name}.c", build_dir / name, flags)
    compile_c(BENCH_DIR / "measure.c", build_dir / "measure", ["-O2"])

    # The default sizes are those of the heaptrack baseline document; --quick and --smoke
    # divide them (threads twice as much, because heaptrack 1.4 slows it 30-80x, see the
    # baseline's §5.2).
    threads_divisor = 2 * divisor if divisor > 1 else 1
    workloads = [
        Workload("churn", [build_dir / "churn", 20_000_000 // divisor, 100_000]),
        Workload("threads", [build_dir / "threads", 20_000_000 // threads_divisor, 100_000, 4]),
        Workload("deep", [build_dir / "deep", 5_000_000 // divisor, 30, 100_000, 16]),
        Workload("big", [build_dir / "big", 200_000 // divisor, 16]),
    ]
    if shutil.which("sqlite3"):
        sql = build_dir / "inserts.sql"
        subprocess.run([sys.executable, WORKLOAD_SOURCES / "gen_sqlite.py", sql, str(300_000 // divisor)],
                       check=True)
        workloads.append(Workload("sqlite", ["sqlite3", ":memory:", f".read {sql}"]))
    else:
        setup.notes.append("sqlite workload skipped: no sqlite3")
    # The system interpreter, not a pyenv shim (a shell script that would be profiled too);
    # with memray, the same interpreter through the venv that has memray.
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    if setup.memray_python:
        python = setup.memray_python
    workloads.append(Workload("python", [python, WORKLOAD_SOURCES / "pydict.py", 500_000 // divisor, 5],
                              env={"PYTHONMALLOC": "malloc"}, python=True))
    # The default allocator: pymalloc serves the small objects, malloc the dict tables and
    # the interpreter's own blocks (what memray and memgap both see by default).
    if divisor < SIZES["smoke"]["divisor"]:
        workloads.append(Workload("python-pymalloc", [python, WORKLOAD_SOURCES / "pydict.py", 1_000_000 // divisor, 5],
                                  python=True))
    for workload in workloads:
        workload.argv = [str(arg) for arg in workload.argv]
    return workloads


def compile_c(source, binary, flags):
    result = subprocess.run(["gcc", *flags, "-o", str(binary), str(source)], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"bench: building {source.name} failed:\n{result.stderr}")


# ---------------------------------------------------------------- running

class Bench:
    def __init__(self, setup, work_dir, timeout):
        self.setup = setup
        self.work_dir = work_dir
        self.timeout = timeout
        self.measure = work_dir / "build" / "measure"
        for sub in ("traces", "logs"):
            (work_dir / sub).mkdir(exist_ok=True)

    def trace_path(self, workload, tool):
        slug = tool.name.replace(" --", "-").replace(" ", "-")
        suffix = {"memgap": ".mgt", "memray": ".bin"}.get(tool.kind, ".zst")  # heaptrack appends .zst itself
        return self.work_dir / "traces" / f"{workload.name}.{slug}{suffix}"

    def command(self, workload, tool):
        if tool.kind == "plain":
            return list(workload.argv)
        trace = self.trace_path(workload, tool)
        if tool.kind == "memgap":
            quiet = ["--quiet"] if self.setup.memgap_quiet else []
            return [str(self.setup.memgap), "run", "-o", str(trace), *quiet, *tool.flags, "--", *workload.argv]
        if tool.kind == "memray":
            return [workload.argv[0], "-m", "memray", "run", "-q", "-f", "-o", str(trace), *tool.flags, *workload.argv[1:]]
        stem = str(trace)[:-len(".zst")]
        return ["prlimit", f"--as={HEAPTRACK_MEMORY_CAP_GIB << 30}", "heaptrack", "-o", stem, *workload.argv]

    def run_measured(self, argv, env, log_path, stderr_path=None):
        """One run under the C launcher; returns wall, CPU (user+sys) and peak RSS of the tree.
        Output goes to log_path, stderr too unless stderr_path is given."""
        result_file = self.work_dir / "measure.txt"
        result_file.unlink(missing_ok=True)
        with open(log_path, "wb") as log, open(stderr_path or os.devnull, "wb") as errors:
            # Own session, so that a timeout can kill the whole tree (heaptrack has 3 processes).
            child = subprocess.Popen([str(self.measure), str(result_file), *argv], env=env,
                                     stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=errors if stderr_path else subprocess.STDOUT,
                                     start_new_session=True)
            try:
                child.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return {"error": f"timed out after {self.timeout} s"}
        if not result_file.exists():
            return {"error": f"launcher failed: {tail(log_path)}"}
        exit_code, wall, user, system, rss_kib = result_file.read_text().split()
        return {"exit_code": int(exit_code), "wall_s": float(wall), "cpu_s": float(user) + float(system),
                "peak_rss_mib": int(rss_kib) / 1024}

    def run_workload_once(self, workload, tool):
        self.trace_path(workload, tool).unlink(missing_ok=True)  # never measure a stale trace
        log = self.work_dir / "logs" / f"{workload.name}.{tool.name.replace(' ', '')}.log"
        run = self.run_measured(self.command(workload, tool), {**os.environ, **workload.env}, log)
        if "error" not in run:
            run["checksum"] = checksum_line(log)
            if run["exit_code"] != 0:
                run["error"] = f"exit code {run['exit_code']}: {tail(log)}"
        if "error" not in run and tool.kind == "memgap" and "--trim-only" not in tool.flags:
            run.update(self.recording_cpu(workload, tool))
        return run

    def recording_cpu(self, workload, tool):
        """The CPU time `memgap run` measured in the program (hooks included) and in its own recorder,
        from the trace's summary: the program's share of the run's CPU time and the recorder's."""
        argv = [str(self.setup.memgap), "summary", str(self.trace_path(workload, tool)), "--json"]
        done = subprocess.run(argv, env=dict(os.environ, MEMGAP_INDEX="off"), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=self.timeout)
        try:
            cpu = json.loads(done.stdout)["recording_cpu"]
            return {"program_cpu_s": cpu["program_seconds"], "recorder_cpu_s": cpu["recorder_seconds"]}
        except (ValueError, KeyError, TypeError):
            return {}

    def count_instructions(self, workload, tool):
        out = self.work_dir / "perf.txt"
        out.unlink(missing_ok=True)
        argv = ["perf", "stat", "-e", "instructions", "-x,", "-o", str(out), "--", *self.command(workload, tool)]
        try:
            subprocess.run(argv, env={**os.environ, **workload.env}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return None
        return read_instruction_count(out) if out.exists() else None


def read_instruction_count(perf_output):
    """Sum of the instruction counters in a `perf stat -x,` file (several on hybrid CPUs)."""
    total = None
    for line in Path(perf_output).read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and "instructions" in fields[2] and fields[0].strip().isdigit():
            total = (total or 0) + int(fields[0])
    return total


def checksum_line(log_path):
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("checksum"):
            return line.strip()
    return None


def tail(path, lines=3):
    text = Path(path).read_text(errors="replace").strip() if Path(path).exists() else ""
    return " | ".join(text.splitlines()[-lines:]) or "(no output)"


# ---------------------------------------------------------------- traces and analysis

def memgap_trace_stats(bench, workload, tool, analysis_runs):
    trace = bench.trace_path(workload, tool)
    if not trace.is_file():
        return {"error": f"no trace at {trace}"}
    argv = [str(bench.setup.memgap), "summary", str(trace), "--json"]
    log, errors = bench.work_dir / "logs" / "summary.json", bench.work_dir / "logs" / "summary.stderr"
    # Every measured analysis replays the trace: no answer from the index beside it.
    unindexed = dict(os.environ, MEMGAP_INDEX="off")
    runs = [bench.run_measured(argv, unindexed, log, errors) for _ in range(analysis_runs)]
    if any("error" in run or run["exit_code"] != 0 for run in runs):
        return {"error": f"memgap summary failed: {tail(errors)}"}
    try:
        summary = json.loads(log.read_text())
        events = sum(summary["events"].values())
    except (ValueError, KeyError, AttributeError) as error:
        return {"error": f"memgap summary printed no usable JSON ({error}): {tail(log)}"}
    stats = trace_stats(trace.stat().st_size, events, runs, "memgap summary --json")
    stats["program_peak_rss_mib"] = (summary.get("peak_rss_bytes") or 0) / MIB or None
    stats["truncated"] = summary.get("truncated")
    stats["dropped_events"] = summary.get("dropped_events")
    # The whole analysis: ledger at every snapshot, page maps, blame, the HTML file.
    html = bench.work_dir / "logs" / "report.html"
    argv = [str(bench.setup.memgap), "report", str(trace), "-o", str(html)]
    runs = [bench.run_measured(argv, unindexed, bench.work_dir / "logs" / "report.out", errors)
            for _ in range(analysis_runs)]
    if any("error" in run or run["exit_code"] != 0 for run in runs):
        return {"error": f"memgap report failed: {tail(errors)}"}
    report = trace_stats(trace.stat().st_size, events, runs, "memgap report")
    stats.update({"report_s": report["analysis_s"], "report_events_per_s": report["analysis_events_per_s"],
                  "report_peak_rss_mib": report["analysis_peak_rss_mib"], "report_bytes": html.stat().st_size})
    html.unlink()
    # The same report asked twice with the index: the first writes it, the second reads it.
    index = trace.with_name(trace.name + ".idx")
    index.unlink(missing_ok=True)
    first, second = (bench.run_measured(argv, dict(os.environ), bench.work_dir / "logs" / "report.out", errors) for _ in range(2))
    if all("error" not in run and run["exit_code"] == 0 for run in (first, second)):
        stats.update({"report_first_s": first["wall_s"], "report_second_s": second["wall_s"],
                      "report_second_peak_rss_mib": second["peak_rss_mib"]})
        # Other questions about the indexed trace, none of them asked before.
        queries = {}
        for query in SECOND_QUERIES:
            command, *options = query.split()
            run = bench.run_measured([str(bench.setup.memgap), command, str(trace), *options], dict(os.environ),
                                     bench.work_dir / "logs" / "query.out", errors)
            if "error" not in run and run["exit_code"] == 0:
                queries[query] = run["wall_s"]
        stats["second_queries_s"] = queries
    index.unlink(missing_ok=True)
    html.unlink(missing_ok=True)
    return stats


def heaptrack_trace_stats(bench, workload, tool, analysis_runs):
    trace = bench.trace_path(workload, tool)
    if not trace.is_file():
        return {"error": f"no trace at {trace}"}
    events = count_heaptrack_events(trace)
    log = bench.work_dir / "logs" / "heaptrack_print.txt"
    # The report goes to a file rather than /dev/null: it is a few KB, and it holds the RSS line.
    runs = [bench.run_measured(["heaptrack_print", "-f", str(trace)], dict(os.environ), log)
            for _ in range(analysis_runs)]
    if any("error" in run or run["exit_code"] != 0 for run in runs):
        return {"error": f"heaptrack_print failed: {tail(log)}"}
    stats = trace_stats(trace.stat().st_size, events, runs, "heaptrack_print")
    stats["program_peak_rss_mib"] = heaptrack_reported_rss_mib(log)
    return stats


def count_heaptrack_events(trace):
    """Allocations and frees: the lines starting with '+' or '-' in the decompressed trace."""
    decompress = subprocess.Popen(["zstd", "-dc", str(trace)], stdout=subprocess.PIPE)
    events, previous_byte = 0, b"\n"
    while chunk := decompress.stdout.read(1 << 22):
        # Prefixing the previous chunk's last byte catches a line start on the boundary.
        text = previous_byte + chunk
        events += text.count(b"\n+") + text.count(b"\n-")
        previous_byte = chunk[-1:]
    decompress.wait()
    return events


def heaptrack_reported_rss_mib(report):
    """The program's own peak RSS as heaptrack sampled it; heaptrack_print's units are powers of 1000."""
    for line in report.read_text(errors="replace").splitlines():
        if line.startswith("peak RSS (including heaptrack overhead):"):
            value = line.split(":", 1)[1].strip()
            number = value.rstrip("BKMGT")
            unit = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[value[len(number):].rstrip("B")]
            return float(number) * unit / MIB
    return None


def trace_stats(size, events, analysis_runs, analysis_tool):
    seconds = statistics.median(run["wall_s"] for run in analysis_runs)
    return {"trace_bytes": size, "events": events,
            "bytes_per_event": size / events if events else None,
            "analysis_tool": analysis_tool, "analysis_s": seconds,
            "analysis_cpu_s": statistics.median(run["cpu_s"] for run in analysis_runs),
            "analysis_peak_rss_mib": max(run["peak_rss_mib"] for run in analysis_runs),
            "analysis_events_per_s": events / seconds if seconds > 0 else None}


def many_threads_analysis(bench, divisor, analysis_runs):
    """The analysis of a 64-thread churn trace (memgap only: heaptrack takes hours on it): its peak
    memory, which the replay's per-thread queues could make follow the trace's length. The program
    runs niced, so that on a small machine the recorder keeps up with 64 busy threads."""
    threads_divisor = 2 * divisor if divisor > 1 else 1
    argv = ["nice", "-n", "15", str(bench.work_dir / "build" / "threads"), str(50_000_000 // threads_divisor), "100000", "64"]
    workload = Workload("threads64", argv)
    tool = Tool("memgap", "memgap")
    print(f"== threads64 (memgap only): {' '.join(argv)}", flush=True)
    run = bench.run_workload_once(workload, tool)
    if "error" in run:
        return {"argv": argv, "error": run["error"]}
    stats = memgap_trace_stats(bench, workload, tool, analysis_runs)
    bench.trace_path(workload, tool).unlink(missing_ok=True)
    return {"argv": argv, **stats}


# ---------------------------------------------------------------- one workload

def bench_workload(bench, workload, tools, repeat, perf_runs, analysis_runs):
    print(f"== {workload.name}: {' '.join(workload.argv)}", flush=True)
    tools = [tool for tool in tools if workload.python or not tool.python_only]
    results = {tool.name: {"kind": tool.kind, "runs": []} for tool in tools}
    expected_checksum = None
    for round_index in range(repeat + 1):  # round 0 is the uncounted warm-up
        for tool in tools:
            result = results[tool.name]
            if "error" in result:
                continue
            run = bench.run_workload_once(workload, tool)
            if "error" not in run:
                if tool.kind == "plain" and expected_checksum is None:
                    expected_checksum = run["checksum"]
                if run["checksum"] != expected_checksum:
                    run["error"] = f"output changed: {run['checksum']!r}, plain printed {expected_checksum!r}"
            if "error" in run:
                result["error"] = run["error"]
                print(f"   {tool.name}: FAILED: {run['error']}", flush=True)
            elif round_index > 0:
                result["runs"].append(run)
        print(f"   round {round_index or 'warm-up'} done", flush=True)
    if "error" in results["plain"]:
        return {"error": f"plain run failed: {results['plain']['error']}", "tools": results}

    for tool in tools:
        result = results[tool.name]
        if "error" in result:
            continue
        if bench.setup.perf_ok:
            counts = [bench.count_instructions(workload, tool) for _ in range(perf_runs)]
            if None not in counts:
                result["instructions_runs"] = counts
        # The trace on disk is the one from the last run above (--trim-only records none).
        if tool.kind == "memgap" and "--trim-only" not in tool.flags:
            result["trace"] = memgap_trace_stats(bench, workload, tool, analysis_runs)
        elif tool.kind == "heaptrack":
            result["trace"] = heaptrack_trace_stats(bench, workload, tool, analysis_runs)
        elif tool.kind == "memray" and bench.trace_path(workload, tool).is_file():
            result["trace"] = {"trace_bytes": bench.trace_path(workload, tool).stat().st_size}
        bench.trace_path(workload, tool).unlink(missing_ok=True)  # churn traces reach ~100 MB
    summarise(results)
    return {"argv": workload.argv, "env": workload.env, "tools": results}


def summarise(results):
    """Medians, and overhead ratios taken round by round against the plain run of the same round."""
    plain = results["plain"]
    for name, result in results.items():
        runs = result["runs"]
        if "error" in result or not runs:
            continue
        for metric in ("wall_s", "cpu_s", "peak_rss_mib"):
            result[metric] = statistics.median(run[metric] for run in runs)
        result["wall_s_range"] = [min(r["wall_s"] for r in runs), max(r["wall_s"] for r in runs)]
        if "instructions_runs" in result:
            result["instructions"] = statistics.median(result["instructions_runs"])
        if name == "plain":
            continue
        for metric in ("program_cpu_s", "recorder_cpu_s"):
            if all(metric in run for run in runs):
                result[metric] = statistics.median(run[metric] for run in runs)
        # The program's own CPU time under memgap (the recorder apart) against the plain run's CPU time.
        for metric, plain_metric, ratio_key in (("wall_s", "wall_s", "wall_ratio"), ("cpu_s", "cpu_s", "cpu_ratio"),
                                                ("program_cpu_s", "cpu_s", "program_cpu_ratio")):
            ratios = [run[metric] / base[plain_metric] for run, base in zip(runs, plain["runs"]) if metric in run and base[plain_metric] > 0]
            if ratios:
                result[ratio_key] = statistics.median(ratios)
                result[ratio_key + "_range"] = [min(ratios), max(ratios)]
        if result.get("instructions") and plain.get("instructions"):
            result["instructions_ratio"] = result["instructions"] / plain["instructions"]

    # memgap's overhead (ratio - 1) as a share of each memray variant's, by CPU time.
    for name, memray in results.items():
        if memray["kind"] != "memray" or "cpu_ratio" not in memray:
            continue
        for result in results.values():
            if result["kind"] == "memgap" and "cpu_ratio" in result and memray["cpu_ratio"] > 1:
                result.setdefault("vs_memray", {})[name] = (result["cpu_ratio"] - 1) / (memray["cpu_ratio"] - 1)

    heaptrack = results.get("heaptrack")
    if not heaptrack or "error" in heaptrack:
        return
    for result in results.values():
        if result["kind"] != "memgap" or "error" in result:
            continue
        # < 1 means memgap slows the program down less than heaptrack does.
        result["vs_heaptrack"] = {
            key: result[key] / heaptrack[key]
            for key in ("wall_ratio", "cpu_ratio", "instructions_ratio") if key in result and key in heaptrack}
        heaptrack_extra_cpu = heaptrack.get("cpu_s", 0) - plain["cpu_s"]
        if heaptrack_extra_cpu > 0 and "cpu_s" in result:
            result["vs_heaptrack"]["extra_cpu_share"] = (result["cpu_s"] - plain["cpu_s"]) / heaptrack_extra_cpu


# ---------------------------------------------------------------- targets

# Issue 11's targets, each checked on the figures of this run.
STACKS_SHARE_OF_HEAPTRACK = 1 / 3
# Issue 26's: on Python workloads, memgap's overhead at most half of memray's.
SHARE_OF_MEMRAY = 1 / 2
NO_STACKS_CHURN_RATIO = 1.3
TRIM_ONLY_RATIO = 1.02
ANALYSIS_VS_HEAPTRACK_PRINT = 10
REPLAY_EVENTS_PER_S = 50e6
# Issue 31's: a second query of an indexed trace, asked after `memgap report` wrote the index;
# the program's slowdown; the first pass against heaptrack_print; the analysis's memory.
SECOND_QUERY_S = 0.2
SECOND_QUERIES = ["ledger --at end", "ledger --at 0.1", "blame", "map --at peak", "timeline"]
STACKS_CHURN_CPU_RATIO = 1.8
FIRST_PASS_VS_HEAPTRACK_PRINT = 3
MANY_THREADS_ANALYSIS_MIB = 150


def slowdown_key(result):
    """Instructions where perf counts them (stable), else CPU time."""
    return "instructions_ratio" if "instructions_ratio" in result else "cpu_ratio"


def check_targets(report):
    rows = []

    def add(target, workload, measured, goal, met):
        rows.append({"target": target, "workload": workload, "measured": measured, "goal": goal, "met": met})

    for name, workload in report["workloads"].items():
        tools = workload.get("tools", {})
        heaptrack = tools.get("heaptrack", {})
        stacks, no_stacks = tools.get("memgap", {}), tools.get("memgap --no-stacks", {})
        trim_only = tools.get("memgap --trim-only", {})
        key = slowdown_key(stacks)
        if key in stacks and key in heaptrack:
            mine, theirs = stacks[key] - 1, heaptrack[key] - 1
            limit = theirs * STACKS_SHARE_OF_HEAPTRACK
            add("memgap (stacks) overhead ≤ ⅓ of heaptrack's", name,
                f"{mine:.2f} vs heaptrack {theirs:.2f} ({key.split('_')[0]}; wall {stacks.get('wall_ratio', 0) - 1:.2f} vs {heaptrack.get('wall_ratio', 0) - 1:.2f})",
                f"≤ {limit:.2f}", mine <= limit)
        # What the program pays is its own CPU time (the hooks); the recorder's, in memgap's process,
        # is shown beside it and in the total.
        for tool_name, result, goal in (("memgap (stacks)", stacks, STACKS_CHURN_CPU_RATIO),
                                        ("memgap --no-stacks", no_stacks, NO_STACKS_CHURN_RATIO)):
            if name != "churn" or "cpu_ratio" not in result:
                continue
            paid = result.get("program_cpu_ratio")
            add(f"{tool_name}: the program's CPU ≤ {goal:.1f}× plain on churn", name,
                (f"program {paid:.2f}× CPU, recorder {fmt(result.get('recorder_cpu_s'))} s, total {result['cpu_ratio']:.2f}×"
                 if paid is not None else f"total {result['cpu_ratio']:.2f}× CPU (the program's own not recorded)")
                + f", wall {result['wall_ratio']:.2f}×", f"≤ {goal:.2f}×", (paid if paid is not None else result["cpu_ratio"]) <= goal)
        if "wall_ratio" in trim_only:
            key = slowdown_key(trim_only)
            add("memgap --trim-only < 1.02× plain", name, f"{trim_only[key]:.3f}× ({key.split('_')[0]}), wall {trim_only['wall_ratio']:.3f}×",
                "< 1.02×", trim_only[key] < TRIM_ONLY_RATIO)
        for memray_name, memray in tools.items():
            if memray.get("kind") != "memray" or "cpu_ratio" not in memray:
                continue
            for memgap_name in ("memgap", "memgap --python-stacks=off"):
                memgap = tools.get(memgap_name, {})
                if "cpu_ratio" not in memgap:
                    continue
                mine, theirs = memgap["cpu_ratio"] - 1, memray["cpu_ratio"] - 1
                add(f"{memgap_name} overhead ≤ ½ of {memray_name}'s", name,
                    f"{mine:.2f} vs {theirs:.2f} (CPU; wall {memgap.get('wall_ratio', 0) - 1:.2f} vs {memray.get('wall_ratio', 0) - 1:.2f})",
                    f"≤ {theirs * SHARE_OF_MEMRAY:.2f}", mine <= theirs * SHARE_OF_MEMRAY)
        mine, theirs = stacks.get("trace", {}), heaptrack.get("trace", {})
        if mine.get("bytes_per_event") and theirs.get("bytes_per_event"):
            add("trace bytes/event below heaptrack's", name, f"{mine['bytes_per_event']:.2f}",
                f"< {theirs['bytes_per_event']:.2f}", mine["bytes_per_event"] < theirs["bytes_per_event"])
        if mine.get("report_events_per_s") and theirs.get("analysis_events_per_s"):
            goal = ANALYSIS_VS_HEAPTRACK_PRINT * theirs["analysis_events_per_s"]
            add("analysis (memgap report) ≥ 10× heaptrack_print's events/s", name,
                f"{fmt_count(mine['report_events_per_s'])}/s (summary {fmt_count(mine['analysis_events_per_s'])}/s)",
                f"≥ {fmt_count(goal)}/s", mine["report_events_per_s"] >= goal)
        if mine.get("report_events_per_s") and theirs.get("analysis_events_per_s"):
            goal = FIRST_PASS_VS_HEAPTRACK_PRINT * theirs["analysis_events_per_s"]
            add("first pass (memgap report, no index) ≥ 3× heaptrack_print's events/s", name,
                f"{fmt_count(mine['report_events_per_s'])}/s vs {fmt_count(theirs['analysis_events_per_s'])}/s",
                f"≥ {fmt_count(goal)}/s", mine["report_events_per_s"] >= goal)
        if mine.get("report_peak_rss_mib") and theirs.get("analysis_peak_rss_mib"):
            add("analysis memory (memgap report) ≤ heaptrack_print's", name,
                f"{mine['report_peak_rss_mib']:.1f} MiB (summary {mine['analysis_peak_rss_mib']:.1f})",
                f"≤ {theirs['analysis_peak_rss_mib']:.1f} MiB", mine["report_peak_rss_mib"] <= theirs["analysis_peak_rss_mib"])
        for query, seconds in mine.get("second_queries_s", {}).items():
            add(f"`{query}` on the indexed trace < 200 ms", name, f"{seconds * 1000:.0f} ms", "< 200 ms", seconds < SECOND_QUERY_S)
        if mine.get("report_second_s") is not None:
            add("second memgap report (indexed) < 200 ms", name,
                f"{mine['report_second_s'] * 1000:.0f} ms (first {mine['report_first_s']:.2f} s)", "< 200 ms",
                mine["report_second_s"] < SECOND_QUERY_S)
        if mine.get("analysis_events_per_s") and mine.get("events", 0) >= 1e6:
            add("replay ≥ 50 M events/s (memgap summary, one thread)", name, f"{fmt_count(mine['analysis_events_per_s'])}/s",
                "≥ 50.00 M/s", mine["analysis_events_per_s"] >= REPLAY_EVENTS_PER_S)
    many = report.get("many_threads")
    if many and "error" not in many and many.get("events"):
        truncated = " (truncated)" if many.get("truncated") else ""
        add("analysis memory with 64 threads < 150 MiB (memgap report)", "threads64",
            f"{many['report_peak_rss_mib']:.1f} MiB (summary {many['analysis_peak_rss_mib']:.1f}) "
            f"on {fmt_count(many['events'])} events{truncated}", "< 150 MiB",
            many["report_peak_rss_mib"] < MANY_THREADS_ANALYSIS_MIB)
    elif many:
        add("analysis memory with 64 threads < 150 MiB (memgap report)", "threads64",
            f"not measured: {many.get('error', 'no events')[:120]}", "< 150 MiB", False)
    return rows


# ---------------------------------------------------------------- report

def fmt(value, digits=2, suffix=""):
    if value is None:
        return "n/a"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}{suffix}"
    return f"{value:.{digits}f}{suffix}"


def fmt_ratio(result, key):
    if key not in result:
        return "n/a"
    low, high = result.get(key + "_range", [None, None])
    spread = f" ({low:.2f}–{high:.2f})" if low is not None else ""
    return f"{result[key]:.2f}×{spread}"


def fmt_size(size):
    for threshold, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if size >= threshold:
            return f"{size / threshold:.1f} {unit}"
    return f"{size} B"


def fmt_count(value):
    if value is None:
        return "n/a"
    for threshold, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= threshold:
            return f"{value / threshold:.2f} {unit}"
    return f"{value:.0f}"


def markdown_report(report):
    meta = report["meta"]
    lines = [
        "# memgap vs heaptrack",
        "",
        f"{meta['date']} · {meta['host']} · {meta['cpus']} CPUs · kernel {meta['kernel']} · "
        f"{meta['sizes']} sizes · {meta['repeat']} interleaved rounds after 1 warm-up · "
        f"{meta['perf_runs']} perf runs · repo HEAD {meta['memgap_commit']} · {meta['heaptrack_version']}",
        "",
        "Ratios are program-with-profiler ÷ plain program, taken round by round, median (min–max). "
        "Instructions are the stable figure on a noisy VM; wall time is the one users feel. "
        "Peak RSS is the largest single process (for heaptrack that is `heaptrack_interpret`); "
        "program RSS is the profiled program's own peak as the profiler reports it.",
        "",
    ]
    if meta["notes"]:
        lines += [f"- {note}" for note in meta["notes"]] + [""]
    lines += ["## Cost of profiling", "",
              "*Program CPU* is what `memgap run` measured in the program itself (its hooks included), "
              "*recorder CPU* what memgap's own process spent recording beside it; *CPU* counts both.", "",
              "| workload | tool | wall s | CPU s | program CPU s | recorder CPU s | peak RSS MiB | program RSS MiB | instructions "
              "| wall × | CPU × | program CPU × | instr × |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, workload in report["workloads"].items():
        if "error" in workload:
            lines.append(f"| {name} | — | {workload['error']} | | | | | | | | | | |")
            continue
        for tool, result in workload["tools"].items():
            if "error" in result:
                lines.append(f"| {name} | {tool} | FAILED: {result['error'][:120]} | | | | | | | | | | |")
                continue
            program_rss = result.get("trace", {}).get("program_peak_rss_mib")
            if result["kind"] == "plain":
                program_rss = result.get("peak_rss_mib")
            lines.append(
                f"| {name} | {tool} | {fmt(result.get('wall_s'))} | {fmt(result.get('cpu_s'))} | "
                f"{fmt(result.get('program_cpu_s'))} | {fmt(result.get('recorder_cpu_s'))} | "
                f"{fmt(result.get('peak_rss_mib'), 1)} | {fmt(program_rss, 1)} | {fmt_count(result.get('instructions'))} | "
                + ("— | — | — | — |" if result["kind"] == "plain" else
                   f"{fmt_ratio(result, 'wall_ratio')} | {fmt_ratio(result, 'cpu_ratio')} | {fmt_ratio(result, 'program_cpu_ratio')} | "
                   f"{fmt(result.get('instructions_ratio'), 2, '×')} |"))

    lines += ["", "## memgap ÷ heaptrack", "",
              "Slowdown of memgap divided by slowdown of heaptrack (below 1: memgap is cheaper). "
              "*Extra CPU* is the CPU time memgap adds as a share of what heaptrack adds.", "",
              "| workload | memgap variant | wall | CPU | instructions | extra CPU |", "|---|---|---|---|---|---|"]
    comparisons = [(name, tool, result["vs_heaptrack"]) for name, workload in report["workloads"].items()
                   for tool, result in workload.get("tools", {}).items() if "vs_heaptrack" in result]
    for name, tool, versus in comparisons:
        lines.append(f"| {name} | {tool} | {fmt(versus.get('wall_ratio'), 3)} | {fmt(versus.get('cpu_ratio'), 3)} | "
                     f"{fmt(versus.get('instructions_ratio'), 3)} | {fmt(100 * versus['extra_cpu_share'] if 'extra_cpu_share' in versus else None, 1, '%')} |")
    if not comparisons:
        lines.append("| — | no memgap and heaptrack pair measured | | | | |")

    memray_rows = [(name, tool, result["vs_memray"]) for name, workload in report["workloads"].items()
                   for tool, result in workload.get("tools", {}).items() if "vs_memray" in result]
    if memray_rows:
        lines += ["", "## memgap ÷ memray (Python)", "",
                  "memgap's overhead (CPU × − 1) divided by memray's: below 0.5 meets the goal of at most half.", "",
                  "| workload | memgap variant | " + " | ".join(sorted({m for _, _, v in memray_rows for m in v})) + " |",
                  "|---|---|" + "---|" * len({m for _, _, v in memray_rows for m in v})]
        for name, tool, versus in memray_rows:
            columns = sorted({m for _, _, v in memray_rows for m in v})
            lines.append(f"| {name} | {tool} | " + " | ".join(fmt(versus.get(m), 3) for m in columns) + " |")

    lines += ["", "## Traces and analysis", "",
              "Events: memgap = sum of `events` in `memgap summary --json`; heaptrack = `+`/`-` lines in the "
              "decompressed trace. Analysis: `memgap summary --json` (replay and summary) and `memgap report` "
              "(ledger at every snapshot, page maps, blame, the HTML file) vs `heaptrack_print -f`.", "",
              "| workload | tool | events | trace size | B / event | analysis s | analysis events/s | analysis peak RSS MiB | report s | report events/s | report peak RSS MiB | report again (indexed) s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, workload in report["workloads"].items():
        for tool, result in workload.get("tools", {}).items():
            trace = result.get("trace")
            if trace is None or "events" not in trace and "error" not in trace:
                continue
            if "error" in trace:
                lines.append(f"| {name} | {tool} | FAILED: {trace['error'][:120]} | | | | | |")
                continue
            truncated = " (truncated)" if trace.get("truncated") else ""
            if trace.get("dropped_events"):
                truncated += f" ({fmt_count(trace['dropped_events'])} dropped)"
            lines.append(f"| {name} | {tool} | {fmt_count(trace['events'])}{truncated} | {fmt_size(trace['trace_bytes'])} | "
                         f"{fmt(trace['bytes_per_event'], 2)} | {fmt(trace['analysis_s'], 3)} | "
                         f"{fmt_count(trace['analysis_events_per_s'])} | {fmt(trace['analysis_peak_rss_mib'], 1)} | "
                         f"{fmt(trace.get('report_s'), 3)} | {fmt_count(trace.get('report_events_per_s'))} | "
                         f"{fmt(trace.get('report_peak_rss_mib'), 1)} | {fmt(trace.get('report_second_s'), 3)} |")

    many = report.get("many_threads")
    if many and "error" not in many:
        lines += ["", "## Analysis with 64 threads (memgap only)", "",
                  f"`{' '.join(many['argv'][3:])}` (threads: pairs, live blocks, threads), niced: "
                  f"{fmt_count(many['events'])} events, trace {fmt_size(many['trace_bytes'])}; "
                  f"`memgap summary` {fmt(many['analysis_s'], 2)} s in {fmt(many['analysis_peak_rss_mib'], 1)} MiB, "
                  f"`memgap report` {fmt(many.get('report_s'), 2)} s in {fmt(many.get('report_peak_rss_mib'), 1)} MiB."]
    second = [(name, tool, trace["second_queries_s"]) for name, workload in report["workloads"].items()
              for tool, result in workload.get("tools", {}).items()
              if (trace := result.get("trace") or {}).get("second_queries_s")]
    if second:
        lines += ["", "## Second queries (after `memgap report` wrote the index)", "",
                  "| workload | tool | " + " | ".join(f"`{q}` s" for q in SECOND_QUERIES) + " |",
                  "|---|---|" + "---|" * len(SECOND_QUERIES)]
        for name, tool, queries in second:
            lines.append(f"| {name} | {tool} | " + " | ".join(fmt(queries.get(q), 3) for q in SECOND_QUERIES) + " |")

    lines += ["", "## Targets (issues 11, 26 and 31)", "",
              "Each target checked on this run's figures; slowdowns compare instructions where perf counts them, "
              "else CPU time.", "",
              "| target | workload | measured | goal | met |", "|---|---|---|---|---|"]
    for row in report.get("targets", []):
        lines.append(f"| {row['target']} | {row['workload']} | {row['measured']} | {row['goal']} | {'yes' if row['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def describe_machine(args, setup):
    def command_output(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, cwd=REPO_DIR).stdout.strip()
        except OSError:
            return ""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
        "sizes": args.sizes, "repeat": args.repeat, "perf_runs": args.perf_runs if setup.perf_ok else 0,
        "memgap": str(setup.memgap) if setup.memgap else None,
        "memgap_commit": command_output(["git", "rev-parse", "--short", "HEAD"]) or "?",
        "memgap_variants": [tool.name for tool in setup.memgap_tools],
        "heaptrack_version": command_output(["heaptrack", "--version"]) if setup.heaptrack else "heaptrack n/a",
        "heaptrack_memory_cap_gib": HEAPTRACK_MEMORY_CAP_GIB,
        "memray_version": MEMRAY_VERSION if setup.memray_python else None,
        "load_average_at_start": os.getloadavg(),
        "notes": setup.notes,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size_group = parser.add_mutually_exclusive_group()
    size_group.add_argument("--quick", action="store_true", help="smaller workloads: the suite takes ~2-3 minutes")
    size_group.add_argument("--smoke", action="store_true",
                            help="tiny workloads, one round: checks that the suite runs, measures nothing")
    parser.add_argument("--repeat", type=int, help="measured rounds per workload (default 5, quick 3, smoke 1)")
    parser.add_argument("--only", help="comma-separated workloads, e.g. churn,deep")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="where latest.md/json go")
    parser.add_argument("--memgap", type=Path, default=DEFAULT_MEMGAP, help="the memgap CLI binary")
    parser.add_argument("--perf-runs", type=int, help="perf stat runs per tool (default 3, quick and smoke 1)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds before one run is killed")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (binaries, logs)")
    parser.add_argument("--memray", action=argparse.BooleanOptionalAction, default=None,
                        help="memray on the Python workloads (default: on, except with --smoke)")
    args = parser.parse_args()
    args.sizes = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = SIZES[args.sizes]
    args.repeat = args.repeat or sizes["repeat"]
    args.perf_runs = args.perf_runs or sizes["perf_runs"]
    analysis_runs = sizes["analysis_runs"]

    setup = check_environment(args.memgap.resolve())
    if args.memray if args.memray is not None else args.sizes != "smoke":
        setup_memray(setup)
    for note in setup.notes:
        print(f"bench: {note}", file=sys.stderr)
    work_dir = Path(tempfile.mkdtemp(prefix="memgap-bench-"))
    try:
        workloads = build(work_dir / "build", sizes["divisor"], setup)
        if args.only:
            wanted = set(args.only.split(","))
            unknown = wanted - {w.name for w in workloads}
            if unknown:
                sys.exit(f"bench: unknown workload(s) {', '.join(sorted(unknown))}; "
                         f"have {', '.join(w.name for w in workloads)}")
            workloads = [w for w in workloads if w.name in wanted]
        tools = [Tool("plain", "plain")] + setup.memgap_tools + ([Tool("heaptrack", "heaptrack")] if setup.heaptrack else [])
        if setup.memray_python:
            tools += [Tool("memray", "memray", python_only=True), Tool("memray --native", "memray", ["--native"], python_only=True)]
        bench = Bench(setup, work_dir, args.timeout)
        report = {"meta": describe_machine(args, setup), "workloads": {}}
        for workload in workloads:
            report["workloads"][workload.name] = bench_workload(
                bench, workload, tools, args.repeat, args.perf_runs, analysis_runs)
        if setup.memgap and any(w.name == "threads" for w in workloads):
            report["many_threads"] = many_threads_analysis(bench, sizes["divisor"], analysis_runs)
        report["meta"]["load_average_at_end"] = os.getloadavg()
        report["targets"] = check_targets(report)
    finally:
        if args.keep:
            print(f"bench: work directory kept at {work_dir}", file=sys.stderr)
        else:
            shutil.rmtree(work_dir, ignore_errors=True)

    args.out.mkdir(parents=True, exist_ok=True)
    markdown = markdown_report(report)
    (args.out / "latest.md").write_text(markdown)
    (args.out / "latest.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print()
    print(markdown)
    print(f"bench: wrote {args.out / 'latest.md'} and {args.out / 'latest.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
