#!/bin/bash
# Build every tests/fuzz/fuzz_*.c with clang's libFuzzer (+ASan+UBSan) and run each for
# FUZZ_SECONDS (default 10; `make fuzz` runs 300). Seeds come from tests/fuzz/corpus/<name>/,
# new inputs go to build/fuzz/corpus/<name>/. Prints one ok/not ok line per target.
set -u
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-10}
OUT=build/fuzz
mkdir -p "$OUT"
DPDK_CFLAGS=$(pkg-config --cflags libdpdk 2>/dev/null)
status=0
LIB_SRC=$(find os drivers serving transport cluster -name '*.c' ! -path 'os/init/*' ! -path '*/fuzz/*' \
          ! -name main.c ! -path 'drivers/nic/*' ! -path 'drivers/rdma/*' | sort)
FLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -I. -fopenmp-simd -fsanitize=fuzzer-no-link,address,undefined -pthread"
# Compile the library once for all targets.
mkdir -p "$OUT/obj"
objs=()
for s in $LIB_SRC; do
    o="$OUT/obj/$(echo "$s" | tr / _).o"
    if [ ! -f "$o" ] || [ "$s" -nt "$o" ]; then
        clang $FLAGS -c "$s" -o "$o" 2>"$OUT/build.log" || { echo "not ok - fuzz build: $s"; cat "$OUT/build.log"; exit 1; }
    fi
    objs+=("$o")
done
# An archive, so a target pulls in only the objects it uses.
rm -f "$OUT/libfuzz.a" && ar rcs "$OUT/libfuzz.a" "${objs[@]}"
for f in tests/fuzz/fuzz_*.c; do
    [ -f "$f" ] || continue
    n=$(basename "$f" .c)
    bin="$OUT/$n"
    clang $FLAGS -fsanitize=fuzzer "$f" "$OUT/libfuzz.a" -o "$bin" -lmicrohttpd -lcjson -lsodium $(pkg-config --libs raft libuv 2>/dev/null) -ldl -lm \
        2>"$OUT/$n.build.log" || { echo "not ok - $n: build failed"; cat "$OUT/$n.build.log"; status=1; continue; }
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
