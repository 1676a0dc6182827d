#!/usr/bin/env bash
# Builds memgap, then records examples/fragmented.c, a program that holds
# 38 MiB while the kernel charges it about 400 MiB, and shows why: the
# ledger (where the resident bytes sit) and blame (which call site pins them).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet
workdir=$(mktemp -d)
cc -O2 -g -o "$workdir/fragmented" examples/fragmented.c
target/release/memgap run -o "$workdir/fragmented.mgt" -- "$workdir/fragmented"
echo
target/release/memgap ledger "$workdir/fragmented.mgt"
echo
target/release/memgap blame "$workdir/fragmented.mgt" --top 3
echo
echo "(trace kept at $workdir/fragmented.mgt: try memgap map, timeline, summary on it)"
