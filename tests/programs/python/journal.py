"""Keeps byte buffers that a nested function makes, called from two
places: bytearrays larger than pymalloc's 512 bytes are malloc'd by the
interpreter, so each buffer is one heap block whose Python line memgap
can name.

    python3 journal.py REQUESTS REPLAYS
"""
import sys


class Journal:
    __slots__ = ("pages",)

    def __init__(self):
        self.pages = []

    def record(self, size):
        def page():
            return bytearray(size)  # the page buffer

        self.pages.append(page())


def from_requests(journal, count):
    for _ in range(count):
        journal.record(64 * 1024)


def from_replay(journal, count):
    for _ in range(count):
        journal.record(16 * 1024)


def main():
    requests, replays = int(sys.argv[1]), int(sys.argv[2])
    journal = Journal()
    from_requests(journal, requests)
    from_replay(journal, replays)
    print(len(journal.pages), sum(len(page) for page in journal.pages))


main()
