"""Python workload: build then drop a str->str dict of ENTRIES entries, ROUNDS times.
run.py runs it with PYTHONMALLOC=malloc so that every object goes through malloc
(under the default pymalloc a malloc profiler sees only ~1,300 arena allocations).

usage: python3 pydict.py [ENTRIES=500000] [ROUNDS=5]
"""
import sys


def main():
    entries = int(sys.argv[1]) if len(sys.argv) > 1 else 500_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    checksum = 0
    for round_index in range(rounds):
        table = {f"key-{round_index}-{i}": f"value-{i * 7919}" for i in range(entries)}
        checksum = (checksum * 31 + len(table) + sum(len(v) for v in table.values())) % (1 << 64)
        del table
    print(f"checksum {checksum:016x}")


if __name__ == "__main__":
    main()
