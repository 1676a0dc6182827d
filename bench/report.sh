#!/usr/bin/env bash
# Time, size and memory of the analysis of big traces:
# - churn: 20 M malloc/free pairs, about 40 M events;
# - bigheap: a 1 GiB heap (262,144 pages), then 21.4 M blocks replaced in
#   it: 50 M events on a 1 GiB heap;
# - threads: 100 M pairs over 4 threads on this machine's cores, 200 M
#   events (a 1.2 GB trace) whose writer falls behind;
# - threads64: 50 M pairs over 64 threads, about 100 M events: the replay's
#   per-thread state and merge with many threads.
# Targets: the report under 10 s and 20 MB for churn and bigheap (issue 5);
# any trace analysed in memory bounded by its live set, not its length:
# 200 M events in under 2 GiB (issue 11); the 64-thread trace under
# 150 MiB (issue 31).
# Usage: bash bench/report.sh [OUT_DIR]  (needs ~2 GB free in OUT_DIR)
# Prints the first pass (no index) and then, indexed, how long each other
# question takes once `report` has written the index.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
memgap=target/release/memgap
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cc -O2 -o "$out/measure" bench/measure.c
cc -O2 -I bench/workloads -o "$out/churn" bench/workloads/churn.c
cc -O2 -I bench/workloads -o "$out/bigheap" bench/workloads/bigheap.c
cc -O2 -pthread -I bench/workloads -o "$out/threads" bench/workloads/threads.c
# Traces already in OUT_DIR are analysed again rather than recorded anew
# with REUSE_TRACES=1; NAMES="churn threads64" picks some.
read -r -a names <<<"${NAMES:-churn bigheap threads threads64}"
record() {
    local name=$1
    shift
    if [[ ${REUSE_TRACES:-} == 1 && -s $out/$name.mgt ]]; then return; fi
    rm -f "$out/$name.mgt"
    "$memgap" run --quiet -o "$out/$name.mgt" -- "$@" >/dev/null
}
for name in "${names[@]}"; do
    case $name in
        churn) record churn "$out/churn" 20000000 100000 ;;
        bigheap) record bigheap "$out/bigheap" 1024 4 21400000 ;;
        threads) record threads "$out/threads" 100000000 100000 4 ;;
        # Niced, so that on a small machine the recorder keeps up with 64
        # busy threads (it stops recording after a second behind).
        threads64) record threads64 nice -n 15 "$out/threads" 50000000 100000 64 ;;
        *) echo "report.sh: unknown trace $name" >&2; exit 2 ;;
    esac
done

# "exit wall user sys peak_rss_kib" of one command, its output discarded.
measured() {
    "$out/measure" "$out/measured.txt" "$@" >/dev/null
    cat "$out/measured.txt"
}
for name in "${names[@]}"; do
    trace=$out/$name.mgt
    read -r events program_mib truncated < <(MEMGAP_INDEX=off "$memgap" summary "$trace" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["total_events"], s["peak_rss_bytes"] >> 20, "(truncated: " + s["truncated_reason"] + ")" if s["truncated"] else "")')
    # The first pass: every command replays the trace, no index read or written.
    read -r _ summary_s _ _ summary_kib < <(MEMGAP_INDEX=off measured "$memgap" summary "$trace" --json)
    read -r _ report_s _ _ report_kib < <(MEMGAP_INDEX=off measured "$memgap" report "$trace" -o "$out/$name.html")
    printf '%-9s %s events%s, program peak RSS %s MiB, trace %s bytes: summary %.2f s (%.1f M events/s), %d MiB; report %.2f s (%.1f M events/s), %d MiB, %s bytes\n' \
        "$name" "$events" "$truncated" "$program_mib" "$(stat -c %s "$trace")" "$summary_s" "$(echo "$events / $summary_s / 1000000" | bc -l)" \
        $((summary_kib >> 10)) "$report_s" "$(echo "$events / $report_s / 1000000" | bc -l)" $((report_kib >> 10)) "$(stat -c %s "$out/$name.html")"
    # With the index: the report writes it, then other questions read it.
    rm -f "$trace.idx"
    read -r _ indexing_s _ _ _ < <(measured "$memgap" report "$trace" -o "$out/$name.html")
    line="  indexed: report (writes the index) $(printf %.2f "$indexing_s") s;"
    for query in "report -o $out/$name.html" "summary --json" "ledger --at end" "ledger --at 0.5" "ledger --at peak --json" \
        "blame" "blame --json" "map --at peak" "timeline"; do
        read -r command options <<<"$query"
        # shellcheck disable=SC2086
        read -r _ query_s _ _ query_kib < <(measured "$memgap" "$command" "$trace" $options)
        line+=" $command ${options/$out\//} $(printf '%.0f' "$(echo "$query_s * 1000" | bc -l)") ms;"
    done
    echo "$line"
    rm -f "$trace.idx"
done
