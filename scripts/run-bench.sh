#!/bin/bash
# Run every benchmark program (build/bench/bench_*) and every tests/bench/*.sh scenario.
# Figures are printed beside a limit or baseline measured in the same run. Never run in CI.
set -u
cd "$(dirname "$0")/.."
for b in build/bench/bench_*; do
    [ -x "$b" ] || continue
    echo "== $(basename "$b")"
    "$b" || echo "($(basename "$b") failed with status $?)"
done
for s in tests/bench/*.sh; do
    [ -f "$s" ] || continue
    echo "== $(basename "$s" .sh)"
    bash "$s" || echo "($(basename "$s") failed with status $?)"
done
