"""Grows a dict of small lists in batches (index_store.add_batch, called from
a loop here), then drops every entry but one in SPARSE and asks memgap for a
snapshot: pymalloc's arenas stay resident for the survivors scattered
through them.

    python3 index.py BATCHES SIZE SPARSE
"""
import ctypes
import sys

import index_store


def main():
    batches, size, sparse = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    index = {}
    for batch in range(batches):
        index_store.add_batch(index, batch, size)
    for key in range(batches * size):
        if key % sparse:
            del index[key]
    snapshot = getattr(ctypes.CDLL(None), "memgap_snapshot", None)
    if snapshot is not None:
        snapshot()
    print(len(index), sum(entry[0] for entry in index.values()))


main()
