#!/usr/bin/env bash
# Builds memgap, then records and summarizes examples/fragmented.c: a program
# that holds 38 MiB while the kernel charges it about 400 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet
workdir=$(mktemp -d)
cc -O2 -o "$workdir/fragmented" examples/fragmented.c
target/release/memgap run -o "$workdir/fragmented.mgt" -- "$workdir/fragmented"
echo
target/release/memgap summary "$workdir/fragmented.mgt"
echo "(trace kept at $workdir/fragmented.mgt)"
