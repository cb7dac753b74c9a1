#!/bin/bash
# Continuous SLO-aware batching vs static batching, replaying the Azure LLM conversation trace
# (../shared/traces/azure_llm_2023_conv.csv) against `strata serve` with the tiny model.
# For each load (the trace's arrival gaps divided by SPEEDUP) the same requests go to a
# continuous-batching server and to a static-batching one (--static-batch 8: a fixed batch that
# waits for all of its requests to finish); both get the same SLOs. Prints one line per run and a
# table of goodput ratios. Figures on a shared machine are noisy: compare within one run only.
#   REQUESTS=200 SPEEDUPS="2 4 8" TTFT_MS=500 TPOT_MS=50 THREADS=1 tests/bench/serve_trace.sh
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_trace.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
REQUESTS=${REQUESTS:-200}
SPEEDUPS=${SPEEDUPS:-2 4 8}
TTFT_MS=${TTFT_MS:-500}
TPOT_MS=${TPOT_MS:-50}
THREADS=${THREADS:-1}
STATIC_BATCH=${STATIC_BATCH:-8}
TRACE=$SHARED/traces/azure_llm_2023_conv.csv
LOADGEN=${LOADGEN:-build/tools/loadgen}
[ -x "$LOADGEN" ] || { echo "serve_trace: $LOADGEN not built (make)"; exit 1; }
serve_model || { echo "serve_trace: cannot convert the test model"; exit 1; }
echo "trace $TRACE: first $REQUESTS requests, lengths scaled to ctx 512; SLO TTFT $TTFT_MS ms, TPOT $TPOT_MS ms; $THREADS compute thread(s); load: $(uptime | sed 's/.*load/load/')"

declare -A GOOD
for sp in $SPEEDUPS; do
    for mode in continuous static; do
        if [ $mode = continuous ]; then args=(--max-batch 32 --step-tokens 256)
        else args=(--static-batch "$STATIC_BATCH" --static-wait-ms 50 --step-tokens 256); fi
        serve_start "$mode-$sp" --threads "$THREADS" --ttft-ms "$TTFT_MS" --tpot-ms "$TPOT_MS" "${args[@]}" ||
            { echo "serve_trace: server did not start"; exit 1; }
        "$LOADGEN" --url "$SERVE_URL" --trace "$TRACE" --requests "$REQUESTS" --speedup "$sp" \
            --ttft-ms "$TTFT_MS" --tpot-ms "$TPOT_MS" --label "$mode-x$sp" >"$W/$mode-$sp.out" 2>"$W/$mode-$sp.err"
        head -n1 "$W/$mode-$sp.out"
        GOOD[$mode-$sp]=$(sed -n 's/.* goodput=\([0-9.]*\).*/\1/p' "$W/$mode-$sp.out")
        serve_stop
    done
done
echo "goodput (tokens/s of requests within SLO), continuous / static:"
for sp in $SPEEDUPS; do
    c=${GOOD[continuous-$sp]:-0} s=${GOOD[static-$sp]:-0}
    awk -v sp="$sp" -v c="$c" -v s="$s" -v rate="$(sed -n 's/.*(\([0-9.]*\) req\/s).*/\1/p' "$W/continuous-$sp.err")" \
        'BEGIN { printf "  x%-3s (%6.1f req/s): continuous %8.1f  static %8.1f  ratio %s\n", sp, rate, c, s, (s > 0 ? sprintf("%.2f", c / s) : "inf") }'
done
