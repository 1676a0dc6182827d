"""Builds a cache of small objects, keeps one entry in KEEP, and asks memgap
for a snapshot (memgap_snapshot, found with ctypes when the agent is loaded).
With --stats it then prints sys._debugmallocstats() to stderr: pymalloc's
own counts at the same instant, nothing allocated in between.

    python3 cache.py ENTRIES KEEP [--stats]
"""
import ctypes
import sys


class Entry:
    def __init__(self, key, value):
        self.key = key
        self.value = value


def build(entries):
    return {i: Entry("key-%07d" % i, [i, i * 0.5]) for i in range(entries)}  # the cache


def main():
    entries, keep = int(sys.argv[1]), int(sys.argv[2])
    cache = build(entries)
    for i in range(entries):
        if i % keep:
            del cache[i]
    snapshot = getattr(ctypes.CDLL(None), "memgap_snapshot", None)
    if snapshot is not None:
        snapshot()
    if "--stats" in sys.argv:
        sys._debugmallocstats()
    print(len(cache), sum(e.value[0] for e in cache.values()))


main()
