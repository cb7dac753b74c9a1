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
# One target per core at a time (each still runs SECS seconds); results print in name order.
run_one() { # run_one NAME: runs the target, leaves its ok / not ok line in $OUT/NAME.result
    local n=$1 bin="$OUT/$1" seeds="tests/fuzz/corpus/$1" runs
    mkdir -p "$OUT/corpus/$n"
    [ -d "$seeds" ] || seeds=""
    if "$bin" -max_total_time="$SECS" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
        "$OUT/corpus/$n" $seeds >"$OUT/$n.log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$n.log" | grep -o '[0-9]*$')
        echo "ok - $n (${runs:-?} inputs in ${SECS}s)" >"$OUT/$n.result"
    else
        { echo "not ok - $n: crash, see $OUT/$n.log"; grep -m5 -E 'ERROR|SUMMARY' "$OUT/$n.log"; } >"$OUT/$n.result"
    fi
}
names=()
for f in tests/fuzz/fuzz_*.c; do [ -f "$f" ] && names+=("$(basename "$f" .c)"); done
lanes=$(nproc)
for n in "${names[@]}"; do
    rm -f "$OUT/$n.result"
    while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n; done
    run_one "$n" &
done
wait
for n in "${names[@]}"; do
    if [ -f "$OUT/$n.result" ]; then cat "$OUT/$n.result"; else echo "not ok - $n: no result"; fi
    grep -q '^ok - ' "$OUT/$n.result" 2>/dev/null || status=1
done
exit $status
