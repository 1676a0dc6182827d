"""Write the sqlite workload: ROWS single-row INSERTs in one transaction into a
table with a secondary index, then two aggregate queries. The first query prints
the "checksum" line that run.py compares between plain and profiled runs.

usage: python3 gen_sqlite.py OUT.sql [ROWS=300000]
"""
import random
import sys


def main():
    out_path = sys.argv[1]
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 300_000
    rng = random.Random(42)  # fixed seed: the same SQL every time
    with open(out_path, "w") as out:
        out.write("CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, amount INTEGER);\n")
        out.write("CREATE INDEX item_name ON item(name);\n")
        out.write("BEGIN;\n")
        for _ in range(rows):
            name = "item-%016x" % rng.getrandbits(64)
            out.write(f"INSERT INTO item(name, amount) VALUES('{name}', {rng.randrange(1_000_000)});\n")
        out.write("COMMIT;\n")
        out.write("SELECT 'checksum', count(*), sum(amount), min(name), max(name) FROM item;\n")
        out.write("SELECT count(*) FROM (SELECT amount % 1000 AS bucket FROM item GROUP BY bucket);\n")


if __name__ == "__main__":
    main()
