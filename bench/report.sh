#!/usr/bin/env bash
# Time, size and memory of the analysis of big traces:
# - churn: 20 M malloc/free pairs, about 40 M events;
# - bigheap: a 1 GiB heap (262,144 pages), then 21.4 M blocks replaced in
#   it: 50 M events on a 1 GiB heap;
# - threads: 100 M pairs over 4 threads on this machine's cores, 200 M
#   events (a 1.2 GB trace) whose writer falls behind.
# Targets: the report under 10 s and 20 MB for churn and bigheap (issue 5);
# any trace analysed in memory bounded by its live set, not its length:
# 200 M events in under 2 GiB (issue 11).
# Usage: bash bench/report.sh [OUT_DIR]  (needs ~1.5 GB free in OUT_DIR)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
memgap=target/release/memgap
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cc -O2 -o "$out/measure" bench/measure.c
cc -O2 -I bench/workloads -o "$out/churn" bench/workloads/churn.c
cc -O2 -I bench/workloads -o "$out/bigheap" bench/workloads/bigheap.c
cc -O2 -pthread -I bench/workloads -o "$out/threads" bench/workloads/threads.c
"$memgap" run --quiet -o "$out/churn.mgt" -- "$out/churn" 20000000 100000 >/dev/null
"$memgap" run --quiet -o "$out/bigheap.mgt" -- "$out/bigheap" 1024 4 21400000 >/dev/null
"$memgap" run --quiet -o "$out/threads.mgt" -- "$out/threads" 100000000 100000 4 >/dev/null

# "exit wall user sys peak_rss_kib" of one command, its output discarded.
measured() {
    "$out/measure" "$out/measured.txt" "$@" >/dev/null
    cat "$out/measured.txt"
}
for name in churn bigheap threads; do
    read -r events program_mib < <("$memgap" summary "$out/$name.mgt" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["total_events"], s["peak_rss_bytes"] >> 20)')
    read -r _ summary_s _ _ summary_kib < <(measured "$memgap" summary "$out/$name.mgt" --json)
    read -r _ report_s _ _ report_kib < <(measured "$memgap" report "$out/$name.mgt" -o "$out/$name.html")
    printf '%-8s %s events, program peak RSS %s MiB, trace %s bytes: summary %.2f s, %d MiB; report %.2f s, %d MiB, %s bytes\n' \
        "$name" "$events" "$program_mib" "$(stat -c %s "$out/$name.mgt")" "$summary_s" $((summary_kib >> 10)) \
        "$report_s" $((report_kib >> 10)) "$(stat -c %s "$out/$name.html")"
done
