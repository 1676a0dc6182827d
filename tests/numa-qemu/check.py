"""Checks the two-node guest's `memgap numa --json` results against the
placement each scenario forces (see run.sh), and prints the result table.

    python3 check.py RESULTS    # the guest's second serial port, as run.sh saved it
"""
import json
import sys

MIB = 1 << 20


def parse(path):
    """{scenario: (status, report)} from the '=== …' framed results."""
    out, name, lines, status = {}, None, None, {}
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\r\n")
        if line.startswith("=== RTS "):
            _, _, scenario, text = line.split(" ", 3)
            RTS.setdefault(scenario, []).append(text)
        elif line.startswith("=== STATUS "):
            _, _, scenario, code = line.split(" ")
            status[scenario] = int(code)
        elif line.startswith("=== JSON "):
            name, lines = line.split(" ", 2)[2], []
        elif line.startswith("=== COMPARE "):
            name, lines = "compare", []
        elif line.startswith("=== END ") and name is not None:
            text = "\n".join(lines).strip()
            out[name] = (status.get(name), json.loads(text) if text else None)
            name = None
        elif name is not None:
            lines.append(line)
    return out


failures = []
# A GHC scenario's +RTS -s lines, by scenario.
RTS = {}
GHC_ROWS = []


def rts_figures(lines):
    """({generation: collections}, bytes copied) from +RTS -s lines."""
    gcs, copied = {}, None
    for line in lines:
        words = line.split()
        if words[0] == "Gen":
            gcs[int(words[1])] = int(words[2])
        elif "bytes copied during GC" in line:
            copied = int(words[0].replace(",", ""))
    return gcs, copied


def check_ghc(scenario, r):
    """Collections per capability and node against the RTS's own figures."""
    caps = r.get("ghc_capabilities") or []
    expect(scenario, "capabilities tied to nodes by -qa", r.get("ghc_capability_node_rule") == "-qa", r.get("ghc_capability_node_rule"))
    expect(scenario, "capability n on node n", sorted((c["capability"], c["node"]) for c in caps) == [(0, 0), (1, 1)], caps)
    by_node = {n["node"]: n for n in r.get("ghc_gcs_by_node") or []}
    expect(scenario, "collections led from both nodes", all(by_node.get(n, {}).get("gcs_by_generation", [0])[0] > 0 for n in (0, 1)), by_node)
    gcs, copied = rts_figures(RTS.get(scenario, []))
    expect(scenario, "+RTS -s figures from the program", bool(gcs) and copied is not None, RTS.get(scenario))
    for generation, count in gcs.items():
        measured = sum(n["gcs_by_generation"][generation] for n in by_node.values() if generation < len(n["gcs_by_generation"]))
        expect(scenario, f"generation {generation}'s {count} collections (+RTS -s) over the nodes", measured == count, measured)
    measured_copied = sum(sum(n["copied_bytes_by_generation"]) for n in by_node.values())
    expect(scenario, f"{copied} bytes copied (+RTS -s) over the nodes", copied is not None and abs(measured_copied - copied) <= copied * 0.01, measured_copied)
    heap = r.get("ghc_heap_bytes_by_node") or []
    expect(scenario, "the GHC heap's placement by node", len(heap) == 2 and sum(heap) > 0, heap)
    return by_node, heap


def expect(scenario, what, ok, measured):
    if not ok:
        failures.append(f"{scenario}: expected {what}, measured {measured}")


def column_share(matrix, column):
    total = sum(sum(row) for row in matrix)
    return sum(row[column] for row in matrix) / total if total else None


def check(results):
    rows = []
    for scenario in ("remote", "local", "interleave", "readers"):
        if scenario not in results:
            failures.append(f"{scenario}: no result from the guest")
            continue
        status, r = results[scenario]
        expect(scenario, "memgap run to exit 0", status == 0, status)
        if r is None:
            failures.append(f"{scenario}: memgap numa printed no JSON")
            continue
        expect(scenario, "two nodes", len(r["nodes"]) == 2, r["nodes"])
        expect(scenario, "a placement", r["placement_unavailable_reason"] is None, r["placement_unavailable_reason"])
        m = r["allocation_matrix_bytes"]
        resident = r["resident_bytes_by_node"]
        local = r["local_fraction"]
        sampled = r.get("sampled") or {}
        kind = sampled.get("kind")
        expect(scenario, "memory samples", kind in ("access", "first-touch"), kind)
        if kind == "first-touch":
            expect(scenario, "a reason for no access sampling", bool(r["access_unavailable_reason"]), r["access_unavailable_reason"])
            expect(scenario, "no access rate without access samples", r["numa_access_rate"] is None, r["numa_access_rate"])
        rate = r["numa_access_rate"] if kind == "access" else sampled.get("weighted_rate_per_second")
        if scenario == "remote":
            # 24 MiB live, allocated from node 0's CPU, bound to node 1.
            expected = "0"
            expect(scenario, "the live 24 MiB in row node 0, column node 1", m[0][1] >= 24 * MIB, m)
            expect(scenario, "nothing on node 0 (--membind=1)", m[0][0] == 0 and m[1][0] == 0 and resident[0] == 0, (m, resident))
            expect(scenario, "local_fraction 0", local == 0.0, local)
            expect(scenario, "the heap resident on node 1", resident[1] >= 24 * MIB, resident)
            expect(scenario, "hot node 1", r["hot_node"] == 1, r["hot_node"])
            expect(scenario, "samples mostly remote (node 0 CPU, node 1 page)", sampled.get("local_fraction") is not None and sampled["local_fraction"] < 0.2, sampled.get("local_fraction"))
        elif scenario == "local":
            expected = "1"
            expect(scenario, "the live 24 MiB in row node 1, column node 1", m[1][1] >= 24 * MIB, m)
            expect(scenario, "nothing on node 0 (--membind=1)", m[1][0] == 0 and m[0][0] == 0 and resident[0] == 0, (m, resident))
            expect(scenario, "local_fraction 1", local == 1.0, local)
            expect(scenario, "the heap resident on node 1", resident[1] >= 24 * MIB, resident)
            expect(scenario, "hot node 1", r["hot_node"] == 1, r["hot_node"])
            expect(scenario, "samples mostly local", sampled.get("local_fraction") is not None and sampled["local_fraction"] > 0.8, sampled.get("local_fraction"))
        elif scenario == "interleave":
            # 40 MiB live from node 0's CPU, pages alternating between the nodes.
            expected = "0.5"
            total = sum(resident)
            expect(scenario, "the live 40 MiB placed", m[0][0] + m[0][1] >= 40 * MIB, m)
            expect(scenario, "half the heap on each node", total > 0 and all(0.45 <= b / total <= 0.55 for b in resident), resident)
            expect(scenario, "local_fraction about 0.5", local is not None and 0.45 <= local <= 0.55, local)
            expect(scenario, "no node hot", r["hot_node_share"] is not None and r["hot_node_share"] <= 0.6, r["hot_node_share"])
        else:
            # 32 MiB written by the main thread on CPU 0, then read from both nodes.
            expected = "1 (allocation); node 0 takes every node's reads"
            expect(scenario, "the live 32 MiB in row node 0, column node 0", m[0][0] >= 32 * MIB, m)
            expect(scenario, "local_fraction 1", local is not None and local >= 0.99, local)
            # Node 1 holds only the node-1 reader's own anonymous pages (its
            # stack; 2.1 MiB at most in the runs so far), none of the blocks.
            expect(scenario, "the heap resident on node 0", resident[0] >= 32 * MIB and resident[1] < 4 * MIB, resident)
            expect(scenario, "hot node 0, most of it", r["hot_node"] == 0 and r["hot_node_share"] is not None and r["hot_node_share"] >= 0.8, (r["hot_node"], r["hot_node_share"]))
            if kind == "access":
                access = r["access_matrix"]
                expect(scenario, "node 0's memory taking most accesses", column_share(access, 0) >= 0.8, access)
                expect(scenario, "node 1's CPU reading node 0 remotely", access[1][0] > 0, access)
        rows.append((scenario, expected, local, r["hot_node"], r["hot_node_share"], r["hot_node_basis"], resident, kind, rate))
    for scenario in ("ghc", "ghc-membind"):
        if scenario not in results:
            continue
        status, r = results[scenario]
        expect(scenario, "memgap run to exit 0", status == 0, status)
        if r is None:
            failures.append(f"{scenario}: memgap numa printed no JSON")
            continue
        by_node, heap = check_ghc(scenario, r)
        if scenario == "ghc-membind":
            expect(scenario, "the GHC heap on node 1 only (--membind=1)", len(heap) == 2 and heap[0] == 0 and heap[1] > 0, heap)
        GHC_ROWS.append((scenario, by_node, heap))
    return rows


# numa_readers 32 2 under each configuration: (expected local fraction as
# first touches, its range). The main thread on CPU 0 writes every page
# before the readers start, so first touch puts them on node 0 — unless
# numactl interleaves them over both nodes.
COMPARE_EXPECTED = {
    "glibc": ("1 (all on the writer's node 0)", 0.9, 1.0),
    "localalloc": ("1", 0.9, 1.0),
    "interleave": ("0.5 (pages alternate between the nodes)", 0.4, 0.6),
}


def mean_distance(by_distance):
    events = sum(d["events"] for d in by_distance)
    return sum(d["distance"] * d["events"] for d in by_distance) / events if events else None


def check_compare(results):
    """memgap compare's NUMA configurations and figures against the placement."""
    if "compare" not in results:
        failures.append("compare: no result from the guest")
        return []
    status, c = results["compare"]
    expect("compare", "memgap compare to exit 0", status == 0, status)
    if c is None:
        failures.append("compare: memgap compare printed no JSON")
        return []
    numa = c.get("numa") or {}
    expect("compare", "NUMA sampling on by default with two nodes", numa.get("nodes") == 2 and not numa.get("trivially_local"), numa)
    expect("compare", "no note about one node", not any("one NUMA node" in n for n in c["notes"]), c["notes"])
    basis = numa.get("basis")
    expect("compare", "access or first-touch samples", basis in ("access", "first-touch"), numa)
    configs = {config["name"]: config for config in c["configs"]}
    # No --numa: two nodes offer them by default (--only keeps these two).
    expect("compare", "the NUMA configurations offered", {"interleave", "localalloc"} <= set(configs), sorted(configs))
    rows = []
    for name, (expected, low, high) in COMPARE_EXPECTED.items():
        config = configs.get(name)
        if config is None:
            failures.append(f"compare: no configuration {name}")
            continue
        expect(name, "to run under compare", config["available"] and config["repeats"] >= 1 and config["exit_code"] == 0, (config["available"], config["repeats"], config["exit_code"], config.get("note")))
        expect(name, "the same output as the default", not config["output_differs"], config.get("output_diff"))
        n = config.get("numa") or {}
        local = n.get("local_fraction")
        if basis == "access":
            # Each reader reads all of it: node 1's reads of node-0 pages are
            # remote under the default, half remote under interleave.
            low, high = (0.35, 0.65) if name == "interleave" else (0.4, 1.0)
        expect(name, f"a local fraction in [{low}, {high}]", local is not None and low <= local <= high, n)
        expect(name, "32 MiB of first touches (8192 pages) per run", basis != "first-touch" or n.get("samples", 0) >= 8192 * config["repeats"], n.get("samples"))
        rows.append((name, config["wrapper"], expected, local, n.get("rate_per_second"), mean_distance(n.get("by_distance") or []), n.get("samples"), config.get("wall_seconds")))
    by_name = {row[0]: row for row in rows}
    if basis == "first-touch" and "glibc" in by_name and "interleave" in by_name:
        near, spread = by_name["glibc"][5], by_name["interleave"][5]
        expect("compare", "interleave's first touches farther on average than the default's", near is not None and spread is not None and spread > near, (near, spread))
    return rows


def main():
    results = parse(sys.argv[1])
    rows = check(results)
    compare_rows = check_compare(results)
    print("| scenario | expected local fraction | measured local fraction | hot node (share, basis) | resident MiB by node | samples | weighted rate /s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for scenario, expected, local, hot, share, basis, resident, kind, rate in rows:
        local_text = "-" if local is None else f"{local:.3f}"
        share_text = "-" if share is None else f"{share:.2f}"
        rate_text = "-" if rate is None else f"{rate:,.0f}"
        mib = " / ".join(f"{b / MIB:.1f}" for b in resident)
        print(f"| {scenario} | {expected} | {local_text} | {hot} ({share_text}, {basis}) | {mib} | {kind} | {rate_text} |")
    if GHC_ROWS:
        print()
        print("| GHC scenario | node | gen 0 GCs (MiB copied) | gen 1 GCs (MiB copied) | GHC heap resident MiB |")
        print("| --- | --- | --- | --- | --- |")
        for scenario, by_node, heap in GHC_ROWS:
            for node, n in sorted(by_node.items()):
                gens = [f"{c} ({b / MIB:.1f})" for c, b in zip(n["gcs_by_generation"], n["copied_bytes_by_generation"])] + ["-", "-"]
                resident = f"{heap[node] / MIB:.1f}" if node < len(heap) else "-"
                print(f"| {scenario} | {node} | {gens[0]} | {gens[1]} | {resident} |")
    if compare_rows:
        print()
        print("| memgap compare (numa_readers 32 2) | wraps CMD in | expected local fraction | measured | NUMA rate /s | mean distance | samples | wall s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, wrapper, expected, local, rate, distance, samples, wall in compare_rows:
            local_text = "-" if local is None else f"{local:.3f}"
            rate_text = "-" if rate is None else f"{rate:,.0f}"
            distance_text = "-" if distance is None else f"{distance:.1f}"
            wall_text = "-" if wall is None else f"{wall:.2f}"
            print(f"| {name} | {' '.join(wrapper) or '-'} | {expected} | {local_text} | {rate_text} | {distance_text} | {samples} | {wall_text} |")
    if failures:
        print("numa-qemu: FAILED", file=sys.stderr)
        for failure in failures:
            print("  " + failure, file=sys.stderr)
        sys.exit(1)
    print(f"numa-qemu: ok, {len(rows) + len(GHC_ROWS) + (1 if compare_rows else 0)} scenarios match their placement")


if __name__ == "__main__":
    main()
