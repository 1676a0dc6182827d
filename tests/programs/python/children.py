"""Starts one multiprocessing child per start method given (fork, spawn);
each builds a cache of small tuples, keeps one in 50, takes a memgap
snapshot and prints how many entries it kept.

    python3 children.py fork spawn
"""
import ctypes
import multiprocessing
import sys


def child(entries):
    cache = [("value-%d" % i, float(i)) for i in range(entries)]
    kept = cache[::50]
    del cache
    snapshot = getattr(ctypes.CDLL(None), "memgap_snapshot", None)
    if snapshot is not None:
        snapshot()
    print(len(kept), flush=True)


if __name__ == "__main__":
    for method in sys.argv[1:]:
        process = multiprocessing.get_context(method).Process(target=child, args=(200000,))
        process.start()
        process.join()
        print(method, process.exitcode, flush=True)
