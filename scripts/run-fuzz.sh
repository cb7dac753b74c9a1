#!/bin/bash
# Build every tests/fuzz/fuzz_*.c with clang's libFuzzer (+ASan+UBSan) and run each for
# FUZZ_SECONDS (default 10; `make fuzz` runs 300). Seeds come from tests/fuzz/corpus/<name>/,
# new inputs go to build/fuzz/corpus/<name>/. Prints one ok/not ok line per target.
set -u
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-10}
OUT=build/fuzz
mkdir -p "$OUT"
status=0
# The Makefile builds the targets (fuzz-build); this script only runs them.
make -s -j"$(nproc)" fuzz-build >"$OUT/build.log" 2>&1 || { echo "not ok - fuzz build"; tail -n 30 "$OUT/build.log"; exit 1; }
for f in tests/fuzz/fuzz_*.c; do
    [ -f "$f" ] || continue
    n=$(basename "$f" .c)
    bin="$OUT/$n"
    mkdir -p "$OUT/corpus/$n"
    seeds="tests/fuzz/corpus/$n"
    [ -d "$seeds" ] || seeds=""
    if "$bin" -max_total_time="$SECS" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
        "$OUT/corpus/$n" $seeds >"$OUT/$n.log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$n.log" | grep -o '[0-9]*$')
        echo "ok - $n (${runs:-?} inputs in ${SECS}s)"
    else
        echo "not ok - $n: crash, see $OUT/$n.log"
        grep -m5 -E 'ERROR|SUMMARY' "$OUT/$n.log"
        status=1
    fi
done
exit $status
