#!/bin/bash
# Continuous SLO-aware batching vs static batching, replaying the Azure LLM conversation trace
# (../shared/traces/azure_llm_2023_conv.csv) against `strata serve`.
# For each load (the trace's arrival gaps divided by SPEEDUP) the same requests go to a
# continuous-batching server and to a static-batching one (--static-batch 8: a fixed batch of 8
# that admits no one until all of its requests are done; a finished request gets its answer at
# once but its row goes on decoding as padding, as in a fixed-shape batch); all get the same SLOs.
# "static-shrink" is static batching whose finished rows stop computing (a stronger baseline
# than the classic one; shown for comparison, the ratios are against "static"). Modes alternate and every
# (mode, load) pair runs REPEAT times, so load from other processes hits both alike; the table
# gives the means. A third server, "shed", is continuous batching with --shed-late (a request that
# could not start within its TTFT is answered 503 instead of being served late). NOSLO=1 adds
# continuous batching without SLO admission (ablation).
# The last lines give each mode's capacity at the SLOs (the highest load at which at least ATTAIN%,
# default 90, of requests met both SLOs, as DistServe defines goodput).
# Figures on a shared machine are noisy: compare within one run only.
#   MODES="continuous shed static static-shrink" REQUESTS=200 SPEEDUPS="1.5 2 2.5 3 4 6" REPEAT=1 TTFT_MS=500 TPOT_MS=50 THREADS=1 tests/bench/serve_trace.sh
set -u
cd "$(dirname "$0")/../.."
# The default model has the stories15M shape (dim 288, 6 layers, the Llama-2 vocabulary), Q8_0,
# random weights: steps cost what a small real model's do (stories260K's cost almost nothing, so
# every policy keeps up with the trace). SERVE_MODEL=... picks another.
if [ -z "${SERVE_MODEL:-}" ]; then
    SERVE_MODEL=build/bench-models/s15m-512-q8_0.gguf
    [ -f "$SERVE_MODEL" ] || { mkdir -p build/bench-models && build/tools/synth_model \
        --shape 288,768,6,6,6,32000,512 --type q8_0 --seed 1 -o "$SERVE_MODEL" \
        --tokenizer "${STRATA_SHARED:-../shared}/models/tokenizer.bin" >/dev/null; } ||
        { echo "serve_trace: cannot make $SERVE_MODEL"; exit 1; }
fi
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_trace.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
REQUESTS=${REQUESTS:-200}
SPEEDUPS=${SPEEDUPS:-1.5 2 2.5 3 4 6}
REPEAT=${REPEAT:-1}
TTFT_MS=${TTFT_MS:-500}
TPOT_MS=${TPOT_MS:-50}
THREADS=${THREADS:-1}
STATIC_BATCH=${STATIC_BATCH:-8}
TRACE=$SHARED/traces/azure_llm_2023_conv.csv
LOADGEN=${LOADGEN:-build/tools/loadgen}
[ -x "$LOADGEN" ] || { echo "serve_trace: $LOADGEN not built (make)"; exit 1; }
serve_model || { echo "serve_trace: cannot convert the test model"; exit 1; }
echo "trace $TRACE: first $REQUESTS requests, lengths scaled to ctx 512; SLO TTFT $TTFT_MS ms," \
    "TPOT $TPOT_MS ms; $THREADS compute thread(s); $REPEAT runs per point;" \
    "$(uptime | sed 's/.*load/load/')"
modes=${MODES:-continuous shed static static-shrink}
[ "${NOSLO:-0}" = 1 ] && modes="$modes no-slo"
: >"$W/results"
for sp in $SPEEDUPS; do
    for ((rep = 1; rep <= REPEAT; rep++)); do
        for mode in $modes; do
            case $mode in
            continuous) args=(--max-batch 32 --step-tokens 256) ;;
            no-slo) args=(--max-batch 32 --step-tokens 256 --no-slo) ;;
            shed) args=(--max-batch 32 --step-tokens 256 --shed-late) ;;
            static) args=(--static-batch "$STATIC_BATCH" --static-wait-ms 50 --step-tokens 256) ;;
            static-shrink) args=(--static-batch "$STATIC_BATCH" --static-wait-ms 50 --step-tokens 256 --static-shrink) ;;
            esac
            serve_start "$mode-$sp-$rep" --threads "$THREADS" --ttft-ms "$TTFT_MS" \
                --tpot-ms "$TPOT_MS" "${args[@]}" || { echo "serve_trace: server did not start"; exit 1; }
            "$LOADGEN" --url "$SERVE_URL" --trace "$TRACE" --requests "$REQUESTS" --speedup "$sp" \
                --ttft-ms "$TTFT_MS" --tpot-ms "$TPOT_MS" --label "$mode-x$sp" \
                >"$W/out" 2>"$W/err-$sp"
            head -n1 "$W/out"
            grep '^RESULT' "$W/out" | sed "s/\$/ speedup=$sp mode=$mode/" >>"$W/results"
            serve_stop
        done
    done
done
echo "means over $REPEAT runs (goodput = output tokens/s of requests within both SLOs):"
awk -v modes="$modes" '
    { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      k = v["speedup"] SUBSEP v["mode"]; n[k]++; gp[k] += v["goodput"]; slo[k] += v["slo_pct"];
      t99[k] += v["ttft_p99_ms"]; p99[k] += v["tpot_p99_ms"]; sps[v["speedup"]] = 1 }
    END {
      nm = split(modes, m, " ")
      printf "  %-6s", "load"
      for (j = 1; j <= nm; j++) printf " | %-10s: goodput  in-SLO  TTFT p99  TPOT p99", m[j]
      printf " | vs static:"
      for (j = 1; j <= nm; j++) if (m[j] != "static") printf " %s", m[j]
      printf "\n"
      for (s in sps) order[++ns] = s + 0
      for (a = 1; a <= ns; a++) for (b = a + 1; b <= ns; b++) if (order[b] < order[a]) { t = order[a]; order[a] = order[b]; order[b] = t }
      for (a = 1; a <= ns; a++) {
        s = order[a]; printf "  x%-5s", s
        for (j = 1; j <= nm; j++) { k = s SUBSEP m[j]; c = n[k] ? n[k] : 1
          printf " | %19.1f %6.1f%% %7.0fms %7.1fms", gp[k] / c, slo[k] / c, t99[k] / c, p99[k] / c }
        ks = s SUBSEP "static"; printf " |"
        for (j = 1; j <= nm; j++) if (m[j] != "static")
          printf(" %s", (gp[ks] > 0 ? sprintf("%.2fx", gp[s SUBSEP m[j]] / gp[ks]) : "inf"))
        printf "\n"
      }
      # Capacity at the SLOs (goodput as DistServe defines it): the highest load up to which every tested load
      # kept at least ATTAIN% of its requests within both SLOs.
      printf "capacity at the SLOs (highest load with >= %d%% of requests in SLO at it and every lower load):\n", attain
      for (j = 1; j <= nm; j++) {
        best = 0
        for (a = 1; a <= ns; a++) { k = order[a] SUBSEP m[j]; if (slo[k] / (n[k] ? n[k] : 1) < attain) break; best = order[a] }
        cap[m[j]] = best
      }
      for (j = 1; j <= nm; j++) {
        best = cap[m[j]]
        printf "  %-10s %s", m[j], best ? "x" best : "below x" order[1]
        if (m[j] != "static" && cap["static"] > 0 && best > 0) printf " (%.2fx static)", best / cap["static"]
        printf "\n"
      }
    }' attain="${ATTAIN:-90}" "$W/results"
