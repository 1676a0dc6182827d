#!/usr/bin/env bash
# Time and size of `memgap report` on big traces: churn (20 M malloc/free
# pairs, about 40 M events) and bigheap (a 1 GiB heap, 262,144 pages, then
# 21.4 M blocks replaced in it: 50 M events on a 1 GiB heap).
# Targets (issue 5): under 10 s and under 20 MB each.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
memgap=target/release/memgap
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cc -O2 -o "$out/churn" bench/workloads/churn.c
cc -O2 -o "$out/bigheap" bench/workloads/bigheap.c
"$memgap" run --quiet -o "$out/churn.mgt" -- "$out/churn" 20000000 100000 >/dev/null
"$memgap" run --quiet -o "$out/bigheap.mgt" -- "$out/bigheap" 1024 4 21400000 >/dev/null
for name in churn bigheap; do
    events=$("$memgap" summary "$out/$name.mgt" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["total_events"], s["peak_rss_bytes"] >> 20)')
    start=$(date +%s.%N)
    "$memgap" report "$out/$name.mgt" -o "$out/$name.html" >/dev/null
    end=$(date +%s.%N)
    printf '%-8s events %s, peak RSS %s MiB, trace %s bytes: report in %.2f s, %s bytes\n' "$name" ${events% *} ${events#* } \
        "$(stat -c %s "$out/$name.mgt")" "$(python3 -c "print($end - $start)")" "$(stat -c %s "$out/$name.html")"
done
