"""Fills pymalloc's arenas with small objects, keeps one in KEEP (a few
pools per arena), then idles holding them: pymalloc keeps every arena
whole, as an arena goes back to the kernel only once all its pools are
empty. Asks memgap for a snapshot (memgap_snapshot, through ctypes) before
idling.

    python3 arenas.py OBJECTS KEEP SECONDS
"""
import ctypes
import sys
import time


def main():
    objects, keep, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    made = [(i, "x") for i in range(1000, 1000 + objects)]  # the objects
    kept = made[::keep]
    del made
    snapshot = getattr(ctypes.CDLL(None), "memgap_snapshot", None)
    if snapshot is not None:
        snapshot()
    time.sleep(seconds)
    print(len(kept))


main()
