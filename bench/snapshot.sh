#!/usr/bin/env bash
# How long `memgap snapshot PID` stops a process, and what it costs memgap,
# on big idle glibc heaps (bench/workloads/heldheap.c) and on one whose
# threads keep replacing blocks under the walk. Target: the process stopped
# under 50 ms per GiB of heap. Prints, per heap, the median (min–max) over
# ROUNDS snapshots of the stop (`walk.stopped_ms`), the same per GiB, the
# wall time and peak RSS of `memgap snapshot`, and how the heap was read
# (`walk.read_while`).
# Usage: bash bench/snapshot.sh [OUT_DIR]   (ROUNDS=5 by default)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
memgap=target/release/memgap
out=${1:-$(mktemp -d)}
rounds=${ROUNDS:-5}
mkdir -p "$out"
cc -O2 -o "$out/measure" bench/measure.c
cc -O2 -pthread -I bench/workloads -o "$out/heldheap" bench/workloads/heldheap.c

# "name mib block keep_every writers"
cases=(
    "1GiB-48B 1024 48 1 0"
    "1GiB-256B-every4th 1024 256 4 0"
    "256MiB-48B 256 48 1 0"
    "256MiB-48B-2writers 256 48 1 2"
)
printf '| heap | read | stopped ms | stopped ms/GiB | snapshot wall s | memgap peak RSS MiB |\n|---|---|---|---|---|---|\n'
for case in "${cases[@]}"; do
    read -r name mib block keep writers <<<"$case"
    fifo=$out/hold.$name
    rm -f "$fifo"
    mkfifo "$fifo"
    "$out/heldheap" "$mib" "$block" "$keep" "$writers" <"$fifo" >"$out/ready.$name" &
    pid=$!
    exec 9>"$fifo"
    until grep -q ready "$out/ready.$name" 2>/dev/null; do sleep 0.2; done
    : >"$out/rounds.$name"
    for _ in $(seq "$rounds"); do
        "$out/measure" "$out/measured.txt" "$memgap" snapshot "$pid" --json >"$out/snapshot.json"
        read -r _ wall _ _ peak_kib <"$out/measured.txt"
        python3 -c 'import json,sys; w=json.load(open(sys.argv[1]))["walk"]; print(w["stopped_ms"], w["stopped_ms_per_gib"], sys.argv[2], int(sys.argv[3]) >> 10, w["read_while"].replace(" ", "_"))' \
            "$out/snapshot.json" "$wall" "$peak_kib" >>"$out/rounds.$name"
    done
    exec 9>&-
    wait "$pid"
    python3 - "$name" "$out/rounds.$name" <<'PY'
import statistics, sys
name, path = sys.argv[1], sys.argv[2]
rows = [line.split() for line in open(path) if line.strip()]
def cell(i, fmt):
    values = [float(r[i]) for r in rows]
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"
reads = sorted({r[4].replace("_", " ") for r in rows})
print(f"| {name} | {', '.join(reads)} | {cell(0, '{:.1f}')} | {cell(1, '{:.1f}')} | {cell(2, '{:.2f}')} | {cell(3, '{:.0f}')} |")
PY
done
